//! `ac7 ash-bridge` (the Ash dialect's bridge) running the real Claude Code CLI
//! (`@anthropic-ai/claude-code` from npm, installed once into `<target dir>/tmp/claude-npm` under
//! a lock; `$AC7_TEST_CLAUDE` points at another claude binary) against a local stand-in for the
//! Anthropic Messages API
//! (`ANTHROPIC_BASE_URL=http://127.0.0.1:PORT`, `ANTHROPIC_API_KEY=dummy`). The stand-in answers
//! `POST /v1/messages` with a streamed SSE message (`message_start`, `content_block_start`,
//! `content_block_delta`, `content_block_stop`, `message_delta`, `message_stop`) whose text is
//! `hello from the stand-in`, or with a 400 error when the last text the user sent contains
//! `please fail`; `HEAD /` (claude's connectivity probe) gets 200 and anything else 404.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ac7_protocol::dialect::ash::Command;
use ac7_runtime::dialects::ash_host::AshClient;
use common::ash::spawn_ash_bridge;
use common::messages_api::{self, Seen};
use common::{tempdir, within};
use serde_json::{Value, json};

/// Starts the Messages API stand-in; returns its base URL.
async fn stand_in(seen: Seen) -> String {
    let app = messages_api::router(seen);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

struct Bridge {
    child: tokio::process::Child,
    socket: PathBuf,
}

impl Bridge {
    async fn start(dir: &Path, api: &str) -> Self {
        let socket = dir.join("bridge.sock");
        let workspace = dir.join("ws");
        let home = dir.join("home");
        for d in [&workspace, &home] {
            std::fs::create_dir_all(d).unwrap();
        }
        let child = spawn_ash_bridge(|command| {
            command
                .env("ASH_BRIDGE_SOCKET", &socket)
                .env("ASH_WORKSPACE_DIR", &workspace)
                .env("CLAUDE_PATH", common::npm::claude())
                // claude keeps its sessions under $HOME/.claude: one per test, kept across
                // restarts.
                .env("HOME", &home)
                .env("ANTHROPIC_BASE_URL", api)
                .env("ANTHROPIC_API_KEY", "dummy")
                .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
        })
        .await;
        Self { child, socket }
    }

    async fn client(&self) -> AshClient {
        within(10, "ready", AshClient::connect(&self.socket))
            .await
            .unwrap()
    }

    async fn stop(mut self, client: AshClient) {
        client.shutdown();
        let status = within(20, "the bridge to exit", self.child.wait())
            .await
            .unwrap();
        assert_eq!(status.code(), Some(0));
    }
}

fn parse(messages: &[ac7_protocol::codec::json::RawJson]) -> Vec<Value> {
    messages.iter().map(|m| m.parse().unwrap()).collect()
}

/// The Ash dialect with the real claude: any host session id works (claude wants UUIDs), a session
/// continues across turns and across a bridge restart (no "already in use"), a failed turn that
/// printed a result is `error` then `done`, `done` names the host's session, and claude runs in
/// the bridge's permission mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_claude_sessions_failures_and_restart() {
    let seen: Seen = Arc::default();
    let api = stand_in(seen.clone()).await;
    let dir = tempdir();
    let bridge = Bridge::start(dir.path(), &api).await;
    let client = bridge.client().await;

    let turn = |prompt: &str| client.query(prompt, "chat one", false).finish();
    let (messages, completion) = within(90, "the first turn", turn("hi")).await;
    let completion = completion.unwrap();
    let messages = parse(&messages);
    assert_eq!(
        (completion.session_id.as_str(), &completion.error),
        ("chat one", &None),
        "{messages:?}"
    );
    let init = &messages[0];
    assert_eq!(
        (&init["type"], &init["subtype"]),
        (&json!("system"), &json!("init"))
    );
    let mode = if rustix::process::geteuid().is_root() {
        "acceptEdits"
    } else {
        "bypassPermissions"
    };
    assert_eq!(init["permissionMode"], mode);
    let agent_session = init["session_id"].as_str().unwrap().to_owned();
    assert!(uuid::Uuid::parse_str(&agent_session).is_ok());
    let result = messages.last().unwrap();
    assert_eq!(result["type"], "result");
    assert_eq!(result["result"], "hello from the stand-in");

    // The second turn continues the conversation.
    let (messages, completion) = within(90, "the second turn", turn("again")).await;
    assert_eq!(completion.unwrap().error, None);
    assert_eq!(parse(&messages)[0]["session_id"], agent_session.as_str());

    // A failed turn: claude prints an error result and exits 1.
    let (messages, completion) = within(90, "the failing turn", turn("please fail")).await;
    let completion = completion.unwrap();
    let result = parse(&messages).pop().unwrap();
    assert_eq!(
        (&result["type"], &result["is_error"]),
        (&json!("result"), &json!(true))
    );
    assert_eq!(completion.session_id, "chat one");
    let error = completion.error.expect("error before done");
    assert!(
        error.starts_with("the agent exited with exit status: 1")
            && error.contains("the stand-in refuses this prompt"),
        "{error}"
    );
    bridge.stop(client).await;

    // A restarted bridge with the same workspace resumes the session.
    let bridge = Bridge::start(dir.path(), &api).await;
    let client = bridge.client().await;
    let (_, completion) = within(
        30,
        "resume",
        client
            .submit(Command::Resume {
                session_id: "chat one".into(),
                turn: None,
            })
            .finish(),
    )
    .await;
    assert_eq!(completion.unwrap().error, None);
    let (messages, completion) = within(
        90,
        "the turn after the restart",
        client
            .query("after the restart", "chat one", false)
            .finish(),
    )
    .await;
    let completion = completion.unwrap();
    assert_eq!(
        (completion.session_id.as_str(), completion.error),
        ("chat one", None),
        "{:?}",
        parse(&messages)
    );
    assert_eq!(parse(&messages)[0]["session_id"], agent_session.as_str());
    bridge.stop(client).await;

    // Each turn sent the conversation so far (a fresh session sends only the new prompt): it
    // was resumed every time. The failed turn's prompt is merged into the next one.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(
        seen[1] > seen[0] && seen[2] > seen[1] && seen[3] >= seen[2],
        "{seen:?}"
    );
}
