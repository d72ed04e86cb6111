//! The runner end to end: a real broker on 127.0.0.1, the real `ac7 run` process, the real bridge
//! it configures, and an agent built on the official MCP Python SDK that the runner spawns
//! (`tests/python/runner_agent.py`, which starts the bridge from `.mcp.json` as Claude Code does).

#![allow(clippy::unwrap_used)]

mod broker_support;
mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use broker_support::{TestBroker, start_broker};
use common::{python, within};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

const ORIGINAL_CONFIG: &str =
    "{\"mcpServers\": {\"other\": {\"command\": \"other-server\"}},\n  \"keep\": true}\n";

fn agent_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/runner_agent.py")
}

/// `ac7 run` in `dir` for `member`, with the Python agent running `scenario`.
fn runner(
    broker: &TestBroker,
    member: &str,
    dir: &Path,
    scenario: &str,
    extra_env: &[(&str, &str)],
) -> Child {
    runner_with(broker, member, dir, scenario, extra_env, "auto")
}

/// The same with `--stream <stream>`.
fn runner_with(
    broker: &TestBroker,
    member: &str,
    dir: &Path,
    scenario: &str,
    extra_env: &[(&str, &str)],
    stream: &str,
) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ac7"));
    cmd.args(["run", "--url", &broker.url, "--stream", stream, "--socket"])
        .arg(dir.join("r.sock"))
        .arg("--")
        .arg(python())
        .arg(agent_script())
        .arg(scenario)
        .current_dir(dir)
        .env("AC7_TOKEN", broker.token(member))
        .env("AC7_TEST_WORK", dir)
        .env("AC7_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

async fn wait_for_file(path: &Path, what: &str) {
    within(30, what, async {
        while !path.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

async fn exit_code(child: &mut Child, what: &str) -> i32 {
    let status = within(60, what, child.wait()).await.unwrap();
    status
        .code()
        .unwrap_or_else(|| panic!("{what}: killed by a signal: {status:?}"))
}

fn config_dir() -> tempfile::TempDir {
    let dir = common::tempdir();
    std::fs::write(dir.path().join(".mcp.json"), ORIGINAL_CONFIG).unwrap();
    dir
}

fn assert_restored(dir: &Path) {
    assert_eq!(
        std::fs::read_to_string(dir.join(".mcp.json")).unwrap(),
        ORIGINAL_CONFIG
    );
    assert!(
        !dir.join("..mcp.json.ac7-backup.json").exists(),
        "the backup record is gone"
    );
    assert!(!dir.join("r.sock").exists(), "the socket is removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_tools_pushes_objectives_and_self_echo() {
    let broker = start_broker().await;
    let dir = config_dir();
    let mut child = runner(&broker, "builder", dir.path(), "session", &[]);
    wait_for_file(
        &dir.path().join("ready"),
        "the agent to finish its tool calls",
    )
    .await;

    // While it runs, the config holds both entries.
    let merged: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(".mcp.json")).unwrap())
            .unwrap();
    assert_eq!(
        merged["mcpServers"]["other"],
        json!({"command": "other-server"})
    );
    assert_eq!(merged["mcpServers"]["ac7"]["args"], json!(["mcp-bridge"]));
    assert_eq!(merged["keep"], true);

    broker
        .push(
            "director",
            json!({"to": "builder", "body": "please rebase"}),
        )
        .await;
    broker
        .push("director", json!({"body": "standup in 5"}))
        .await;
    let created = broker
        .post(
            "/objectives",
            "director",
            json!({"title": "Ship feature Y", "outcome": "Y merged", "assignee": "builder"}),
        )
        .await;
    assert_eq!(created.status, 200, "{}", created.text);

    assert_eq!(exit_code(&mut child, "the runner to exit").await, 0);
    assert_restored(dir.path());
    let out: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("result.json")).unwrap())
            .unwrap();

    let tools = out["tools"].as_array().unwrap();
    assert_eq!(
        tools.len(),
        19,
        "a plain member sees no authority or admin tools: {tools:?}"
    );
    assert_eq!(out["dm"]["content"], "please rebase");
    assert_eq!(out["dm"]["meta"]["from"], "director");
    assert_eq!(out["dm"]["meta"]["target"], "builder");
    assert_eq!(out["general"]["content"], "standup in 5");
    assert_eq!(out["assigned"]["meta"]["kind"], "objective");
    assert!(
        out["assigned"]["meta"]["thread"]
            .as_str()
            .unwrap()
            .starts_with("obj:")
    );
    assert!(
        out["assigned"]["meta"]["ts"]
            .as_str()
            .unwrap()
            .ends_with(" UTC")
    );
    assert_eq!(
        out["objectives_list_mentions_it"], true,
        "tools/list after list_changed shows the objective"
    );
    assert_eq!(
        out["completed_from"], "builder",
        "objective events from self are delivered"
    );
    assert_eq!(out["self_echoes"], json!([]), "chat from self is not");

    let calls = out["calls"].as_array().unwrap();
    let texts: Vec<String> = calls
        .iter()
        .map(|c| {
            let text = redact_text(c["text"].as_str().unwrap());
            let args = redact_text(&c["args"].to_string());
            format!(
                "{} {args} -> {}{}",
                c["tool"].as_str().unwrap(),
                if c["isError"] == true {
                    "isError: "
                } else {
                    ""
                },
                text
            )
        })
        .collect();
    insta::with_settings!({snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots"), prepend_module_to_snapshot => true}, {
        insta::assert_snapshot!("runner_session_tool_calls", texts.join("\n"));
    });
}

/// Ids and times vary run to run: uuids, objective ids (`obj-…`), `MM/DD/YY` and `HH:MM:SS`.
fn redact_text(text: &str) -> String {
    let b = text.as_bytes();
    let shape = |at: usize, pattern: &str| {
        b.len() >= at + pattern.len()
            && pattern.bytes().zip(&b[at..]).all(|(p, c)| match p {
                b'x' => c.is_ascii_hexdigit(),
                b'9' => c.is_ascii_digit(),
                other => other == *c,
            })
    };
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        let boundary = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        if boundary && shape(i, "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx") {
            out.push_str("<uuid>");
            i += 36;
        } else if boundary && text[i..].starts_with("obj-") {
            let mut end = i + 4;
            while end < b.len()
                && (b[end].is_ascii_alphanumeric()
                    || (b[end] == b'-' && b.get(end + 1).is_some_and(u8::is_ascii_alphanumeric)))
            {
                end += 1;
            }
            out.push_str("<objective>");
            i = end;
        } else if boundary && shape(i, "99/99/99") {
            out.push_str("<date>");
            i += 8;
        } else if boundary && shape(i, "99:99:99") {
            out.push_str("<time>");
            i += 8;
        } else {
            let c = text[i..].chars().next().unwrap_or_default();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_is_restored_after_an_agent_crash_and_after_sigterm() {
    let broker = start_broker().await;

    let dir = config_dir();
    let mut child = runner(&broker, "builder", dir.path(), "exit:3", &[]);
    assert_eq!(
        exit_code(&mut child, "the runner after an agent crash").await,
        3,
        "the agent's code"
    );
    assert_restored(dir.path());

    let dir = config_dir();
    let mut child = runner(&broker, "builder", dir.path(), "hang", &[]);
    wait_for_file(&dir.path().join("ready"), "the agent to start").await;
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert_eq!(
        exit_code(&mut child, "the runner after SIGTERM").await,
        128 + 15,
        "forwarded to the agent, which died of it"
    );
    assert_restored(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_left_by_a_killed_runner_is_restored_by_the_next() {
    let broker = start_broker().await;
    let dir = config_dir();
    let mut child = runner(&broker, "builder", dir.path(), "hang", &[]);
    wait_for_file(&dir.path().join("ready"), "the agent to start").await;
    child.start_kill().unwrap(); // SIGKILL: nothing runs on the way out
    child.wait().await.unwrap();
    // Kill the orphaned agent too (it hangs until killed).
    let _ = std::process::Command::new("pkill")
        .args(["-f", &format!("{} hang", agent_script().display())])
        .status();
    assert_ne!(
        std::fs::read_to_string(dir.path().join(".mcp.json")).unwrap(),
        ORIGINAL_CONFIG
    );

    let mut child = runner(&broker, "builder", dir.path(), "exit:0", &[]);
    assert_eq!(exit_code(&mut child, "the next runner").await, 0);
    assert_restored(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_errors_exit_2_and_touch_nothing() {
    let broker = start_broker().await;
    let dir = config_dir();
    let out = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["run", "--url", "http://127.0.0.1:9", "--", "true"])
        .current_dir(dir.path())
        .env("AC7_TOKEN", "ac7_x")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("ac7: briefing failed against http://127.0.0.1:9"),
        "{stderr}"
    );
    assert!(stderr.contains("hint: is `ac7 serve` running"), "{stderr}");

    let out = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["run", "--url", &broker.url, "--", "true"])
        .current_dir(dir.path())
        .env("AC7_TOKEN", "ac7_wrong")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    std::fs::write(dir.path().join(".mcp.json"), "[not an object]").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["run", "--url", &broker.url, "--", "true"])
        .current_dir(dir.path())
        .env("AC7_TOKEN", broker.token("builder"))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to modify"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".mcp.json")).unwrap(),
        "[not an object]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_when_the_broker_restarts() {
    restart_mid_session("sse").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_when_the_broker_restarts_over_websocket() {
    restart_mid_session("ws").await;
}

/// Waits until the agent's `received.txt` lists `body`.
async fn wait_received(dir: &Path, body: &str) {
    let path = dir.join("received.txt");
    within(30, &format!("the agent to receive {body:?}"), async {
        loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().any(|l| l == body) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// Logs a message from `from` to the general channel straight into the database at `db`
/// (no broker running on it).
fn log_offline(db: &Path, from: &str, body: &str) {
    let store = ac7_runtime::broker::db::Store::open(db, ac7_runtime::broker::db::SyncMode::Normal)
        .unwrap();
    store.with(|conn| {
        ac7_runtime::broker::publish::log(
            conn,
            ac7_runtime::broker::publish::Draft {
                to: None,
                from: from.into(),
                title: None,
                body: body.into(),
                level: Default::default(),
                data: Default::default(),
                attachments: vec![],
            },
            ac7_runtime::broker::now_ms(),
        )
        .unwrap();
    });
}

/// Stops the broker and starts another on the same port with the database at `db`, after
/// `between` ran on the database.
async fn restart_broker(
    mut broker: TestBroker,
    db: PathBuf,
    between: impl FnOnce(&Path),
) -> TestBroker {
    let addr = broker.broker.addr;
    broker.broker.shutdown().await.unwrap();
    between(&db);
    let listener = within(10, "the port to be free again", async {
        loop {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => return l,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await;
    broker.broker =
        ac7_runtime::broker::start(ac7_runtime::broker::BrokerConfig::new(db), listener)
            .await
            .unwrap();
    broker
}

/// Fast reconnects for tests: the first delay 20 ms instead of 1 s.
const FAST_RECONNECT: (&str, &str) = ("AC7_RECONNECT_BASE_MS", "20");

/// `ac7 run` for builder with the agent waiting for `bodies`; returns once it listens.
async fn messages_runner(broker: &TestBroker, dir: &Path, bodies: &[&str], stream: &str) -> Child {
    let expect = bodies.join(",");
    let child = runner_with(
        broker,
        "builder",
        dir,
        "messages",
        &[("AC7_TEST_EXPECT", &expect), FAST_RECONNECT],
        stream,
    );
    wait_for_file(&dir.join("ready"), "the agent to be listening").await;
    child
}

/// The runner exits 0 once the agent had `bodies`, each exactly once, in this order.
async fn assert_received_once_in_order(child: &mut Child, dir: &Path, bodies: &[&str], what: &str) {
    assert_eq!(exit_code(child, "the runner to exit").await, 0, "{what}");
    let out: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("result.json")).unwrap()).unwrap();
    let received = out["received"].as_array().unwrap();
    for body in bodies {
        assert_eq!(
            received.iter().filter(|b| b == body).count(),
            1,
            "{what}: {body} exactly once: {received:?}"
        );
    }
    let order = std::fs::read_to_string(dir.join("received.txt")).unwrap();
    let expected: String = bodies.iter().map(|b| format!("{b}\n")).collect();
    assert_eq!(order, expected, "{what}: in order");
}

async fn restart_mid_session(stream: &str) {
    let broker = start_broker().await;
    let dir = config_dir();
    let bodies = ["before", "during-restart", "after"];
    let mut child = messages_runner(&broker, dir.path(), &bodies, stream).await;
    broker.push("director", json!({"body": "before"})).await;
    wait_received(dir.path(), "before").await;

    // Restart the broker on the same port and database; logged while it is down, so it can
    // only come through the replay.
    let db = broker.dir.path().join("ac7.db");
    let broker = restart_broker(broker, db, |db| {
        log_offline(db, "director", "during-restart")
    })
    .await;
    broker.push("director", json!({"body": "after"})).await;

    assert_received_once_in_order(&mut child, dir.path(), &bodies, stream).await;
    assert_restored(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restored_from_a_backup_resets_and_the_runner_backfills() {
    for stream in ["sse", "ws"] {
        let broker = start_broker().await;
        let dir = config_dir();
        let bodies = ["zero", "before", "while-down", "after"];
        let mut child = messages_runner(&broker, dir.path(), &bodies, stream).await;
        broker.push("director", json!({"body": "zero"})).await;
        wait_received(dir.path(), "zero").await;
        // A backup taken now has "zero" but not what follows.
        let backup = broker.dir.path().join("backup.db");
        broker.broker.state.store.with(|conn| {
            conn.execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
                .unwrap()
        });
        broker.push("director", json!({"body": "before"})).await;
        wait_received(dir.path(), "before").await;

        // The broker comes back on the backup: the runner's last id ("before") is unknown there.
        let broker = restart_broker(broker, backup, |db| {
            log_offline(db, "director", "while-down")
        })
        .await;
        broker.push("director", json!({"body": "after"})).await;

        assert_received_once_in_order(&mut child, dir.path(), &bodies, stream).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_injects_its_flags_and_runs_claude_from_claude_path() {
    let broker = start_broker().await;
    let dir = config_dir();
    // A stand-in for claude: records its arguments and the ac7 entry it was given, exits 7.
    let fake = dir.path().join("fake-claude");
    std::fs::write(
        &fake,
        "#!/bin/sh\nprintf '%s\\n' \"$@\" > argv.txt\ncp .mcp.json seen-config.json\nexit 7\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["claude-code", "--url", &broker.url, "--", "--model", "opus"])
        .current_dir(dir.path())
        .env("AC7_TOKEN", broker.token("builder"))
        .env("CLAUDE_PATH", &fake)
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let argv = std::fs::read_to_string(dir.path().join("argv.txt")).unwrap();
    let argv: Vec<&str> = argv.lines().collect();
    assert_eq!(
        argv[..2],
        ["--dangerously-load-development-channels", "server:ac7"]
    );
    assert_eq!(argv[2], "--append-system-prompt");
    assert!(
        argv[3].contains("builder"),
        "the briefing prose: {}",
        argv[3]
    );
    assert_eq!(argv[argv.len() - 2..], ["--model", "opus"]);
    let seen: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("seen-config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        seen["mcpServers"]["ac7"]["command"],
        env!("CARGO_BIN_EXE_ac7")
    );
    assert!(seen["mcpServers"]["ac7"]["env"]["AC7_RUNNER_SOCKET"].is_string());
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".mcp.json")).unwrap(),
        ORIGINAL_CONFIG
    );

    let out = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["claude-code", "--url", &broker.url])
        .current_dir(dir.path())
        .env("AC7_TOKEN", broker.token("builder"))
        .env("CLAUDE_PATH", dir.path().join("missing"))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("CLAUDE_PATH="));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_sees_and_uses_the_authority_and_admin_tools() {
    let broker = start_broker().await;
    let created = broker
        .post("/channels", "director", json!({"slug": "ops"}))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let calls = json!([
        ["objectives_create", {"title": "Ship feature Y", "outcome": "Y merged", "assignee": "builder", "watchers": ["reviewer"], "body": "see spec"}],
        ["objectives_watchers", {"id": "$last_objective", "remove": ["reviewer"]}],
        ["objectives_update", {"id": "$last_objective", "status": "blocked", "blockReason": "waiting on CI"}],
        ["objectives_reassign", {"id": "$last_objective", "to": "reviewer", "note": "swap"}],
        ["objectives_view", {"id": "$last_objective"}],
        ["objectives_cancel", {"id": "$last_objective", "reason": "descoped"}],
        ["objectives_list", {"status": "cancelled"}],
        ["channels_post", {"channel": "ops", "body": "deploying", "title": "heads up"}],
        ["recent", {"channel": "ops"}],
        ["recent", {"with": "builder"}],
        ["fs_mkdir", {"path": "/director/plans", "recursive": true}],
        ["fs_write", {"path": "/director/plans/a.txt", "mimeType": "text/plain", "text": "alpha"}],
        ["fs_write", {"path": "/director/plans/a.txt", "mimeType": "text/plain", "text": "beta", "collide": "suffix"}],
        ["fs_mv", {"from": "/director/plans/a-1.txt", "to": "/director/plans/b.txt"}],
        ["broadcast", {"body": "plan attached", "attachments": ["/director/plans/b.txt"]}],
        ["fs_ls", {"path": "/director/plans"}],
        ["fs_rm", {"path": "/director/plans", "recursive": true}],
        ["fs_shared", {}],
        ["team_get", {}],
        ["team_update", {"context": "Testing the runner."}],
        ["presets_set", {"name": "scouting", "permissions": ["objectives.watch"]}],
        ["presets_list", {}],
        ["members_add", {"name": "scout", "title": "scout", "permissions": ["scouting"]}],
        ["members_update", {"name": "scout", "instructions": "look around"}],
        ["presets_delete", {"name": "scouting"}],
        ["members_remove", {"name": "scout"}]
    ]);
    let dir = config_dir();
    let calls = calls.to_string();
    let mut child = runner(
        &broker,
        "director",
        dir.path(),
        "calls",
        &[("AC7_TEST_CALLS", &calls)],
    );
    assert_eq!(exit_code(&mut child, "the runner to exit").await, 0);
    assert_restored(dir.path());
    let out: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("result.json")).unwrap())
            .unwrap();
    assert_eq!(
        out["tools"].as_array().unwrap().len(),
        31,
        "an admin sees every tool"
    );
    let texts: Vec<String> = out["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let args = redact_text(&c["args"].to_string());
            let text = redact_text(c["text"].as_str().unwrap());
            let text = redact_token(&text);
            format!(
                "{} {args} -> {}{}",
                c["tool"].as_str().unwrap(),
                if c["isError"] == true {
                    "isError: "
                } else {
                    ""
                },
                text
            )
        })
        .collect();
    for (call, text) in out["calls"].as_array().unwrap().iter().zip(&texts) {
        assert_eq!(call["isError"], false, "{text}");
    }
    insta::with_settings!({snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots"), prepend_module_to_snapshot => true}, {
        insta::assert_snapshot!("runner_admin_tool_calls", texts.join("\n"));
    });
}

fn redact_token(text: &str) -> String {
    text.split_inclusive(char::is_whitespace)
        .map(|w| {
            if w.trim_start().starts_with("ac7_") && w.trim().len() == 47 {
                w.replace(w.trim(), "ac7_<token>")
            } else {
                w.to_owned()
            }
        })
        .collect()
}
