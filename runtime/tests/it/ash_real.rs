//! `ac7 ash-bridge` (seed 003) running the real Claude Code CLI (`@anthropic-ai/claude-code`
//! from npm, installed once into `<target dir>/tmp/claude-npm` under a lock; `$AC7_TEST_CLAUDE`
//! points at another claude binary) against a local stand-in for the Anthropic Messages API
//! (`ANTHROPIC_BASE_URL=http://127.0.0.1:PORT`, `ANTHROPIC_API_KEY=dummy`). The stand-in answers
//! `POST /v1/messages` with a streamed SSE message (`message_start`, `content_block_start`,
//! `content_block_delta`, `content_block_stop`, `message_delta`, `message_stop`) whose text is
//! `hello from the stand-in`, or with a 400 error when the last text the user sent contains
//! `please fail`; `HEAD /` (claude's connectivity probe) gets 200 and anything else 404.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use ac7_protocol::ash::Command;
use ac7_runtime::ash_client::AshClient;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use common::ash::spawn_ash_bridge;
use common::{tempdir, within};
use serde_json::{Value, json};

const CLAUDE_VERSION: &str = "2.1.197";

fn claude() -> PathBuf {
    static CLAUDE: OnceLock<PathBuf> = OnceLock::new();
    CLAUDE
        .get_or_init(|| {
            common::npm::npm_bin(
                "AC7_TEST_CLAUDE",
                "@anthropic-ai/claude-code",
                CLAUDE_VERSION,
                "claude-npm",
                "claude",
            )
        })
        .clone()
}

/// What the stand-in saw: per `/v1/messages` request with tools (a turn of the agent), the
/// number of messages in the conversation it carried.
type Seen = Arc<Mutex<Vec<usize>>>;

fn sse(model: &str) -> String {
    let events = [
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_standin", "type": "message",
                "role": "assistant", "model": model, "content": [], "stop_reason": null,
                "stop_sequence": null, "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "hello from the stand-in"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn",
                "stop_sequence": null}, "usage": {"output_tokens": 5}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect()
}

async fn messages(seen: Seen, body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or_default();
    // The text the user sent last (claude merges a failed turn's prompt with the next one).
    let content = request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .map(|m| m["content"].clone())
        .unwrap_or_default();
    let last = match &content {
        Value::Array(blocks) => blocks
            .iter()
            .rev()
            .find_map(|b| b["text"].as_str())
            .unwrap_or_default()
            .to_owned(),
        other => other.as_str().unwrap_or_default().to_owned(),
    };
    if request["tools"].as_array().is_some_and(|t| !t.is_empty()) {
        seen.lock()
            .unwrap()
            .push(request["messages"].as_array().map_or(0, Vec::len));
    }
    if last.contains("please fail") {
        let error = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "the stand-in refuses this prompt"}});
        return (StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    }
    let model = request["model"].as_str().unwrap_or("claude-stand-in");
    if request["stream"] == true {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
        (headers, sse(model)).into_response()
    } else {
        axum::Json(
            json!({"id": "msg_standin", "type": "message", "role": "assistant",
            "model": model, "content": [{"type": "text", "text": "hello from the stand-in"}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 5, "output_tokens": 5}}),
        )
        .into_response()
    }
}

/// Starts the Messages API stand-in; returns its base URL.
async fn stand_in(seen: Seen) -> String {
    let app = axum::Router::new()
        .route(
            "/v1/messages",
            axum::routing::post(move |body: Bytes| messages(seen.clone(), body)),
        )
        .route("/", axum::routing::any(|| async { StatusCode::OK }))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                axum::Json(json!({"type": "error", "error": {"type": "not_found_error",
                    "message": "not served by the stand-in"}})),
            )
        });
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
                .env("CLAUDE_PATH", claude())
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

fn parse(messages: &[ac7_protocol::json::RawJson]) -> Vec<Value> {
    messages.iter().map(|m| m.parse().unwrap()).collect()
}

/// Seed 003 with the real claude: any host session id works (claude wants UUIDs), a session
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
