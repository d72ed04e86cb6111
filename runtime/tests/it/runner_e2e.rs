//! The runner end to end: a real broker on 127.0.0.1, the real `ac7 run` process, the real bridge
//! it configures, and an agent built on the official MCP Python SDK that the runner spawns
//! (`tests/python/runner_agent.py`, which starts the bridge from `.mcp.json` as Claude Code does).

#![allow(clippy::unwrap_used)]

use crate::broker_support;
use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use broker_support::{TestBroker, start_broker};
use common::{python, within};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

pub(crate) const ORIGINAL_CONFIG: &str =
    "{\"mcpServers\": {\"other\": {\"command\": \"other-server\"}},\n  \"keep\": true}\n";

pub(crate) fn agent_script() -> PathBuf {
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
    runner_command(broker, member, dir, scenario, extra_env, stream)
        .spawn()
        .unwrap()
}

/// The command [`runner_with`] spawns.
fn runner_command(
    broker: &TestBroker,
    member: &str,
    dir: &Path,
    scenario: &str,
    extra_env: &[(&str, &str)],
    stream: &str,
) -> Command {
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
    cmd
}

async fn wait_for_file(path: &Path, what: &str) {
    common::wait_until(what, Duration::from_secs(30), async || path.exists()).await;
}

async fn exit_code(child: &mut Child, what: &str) -> i32 {
    let status = within(60, what, child.wait()).await.unwrap();
    status
        .code()
        .unwrap_or_else(|| panic!("{what}: killed by a signal: {status:?}"))
}

/// What the Python agent wrote to `result.json`.
fn result(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("result.json")).unwrap()).unwrap()
}

pub(crate) fn config_dir() -> tempfile::TempDir {
    let dir = common::tempdir();
    std::fs::write(dir.path().join(".mcp.json"), ORIGINAL_CONFIG).unwrap();
    dir
}

pub(crate) fn assert_restored(dir: &Path) {
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
    let out = result(dir.path());

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
    insta::with_settings!({snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots"), prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!("runner_e2e__runner_session_tool_calls", texts.join("\n"));
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
async fn the_runner_serves_the_agents_stdio_itself_once_the_bridge_hands_it_over() {
    let broker = start_broker().await;
    let dir = config_dir();
    let mut child = runner(&broker, "builder", dir.path(), "stopped", &[]);
    assert_eq!(exit_code(&mut child, "the runner").await, 0);
    let out = result(dir.path());
    // The bridge process is stopped (SIGSTOP) while these are asked and answered.
    assert!(
        out["tools_while_stopped"].as_u64().unwrap() > 10,
        "tools/list answered: {out}"
    );
    assert!(
        out["roster_while_stopped"]
            .as_str()
            .unwrap()
            .contains("- builder (you) [engineer]"),
        "roster answered: {out}"
    );
    // Each request answered once; after SIGTERM the agent's stdout closes and the bridge
    // exits 0.
    assert_eq!(out["answers"], json!([0, 1, 2, 3, 4]), "{out}");
    assert_eq!(
        out["exit"], 0,
        "the bridge's exit code after SIGTERM: {out}"
    );
    assert_restored(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_whose_runner_is_killed_while_serving_its_stdio_exits() {
    let broker = start_broker().await;
    let dir = config_dir();
    let mut child = runner(&broker, "builder", dir.path(), "orphan", &[]);
    wait_for_file(&dir.path().join("ready"), "the agent's handshake").await;
    let bridge = std::fs::read_to_string(dir.path().join("bridge.pid")).unwrap();
    let stat = Path::new("/proc").join(bridge.trim()).join("stat");
    assert!(stat.exists(), "the bridge runs");
    child.start_kill().unwrap(); // SIGKILL: the runner dies holding the agent's stdio
    child.wait().await.unwrap();
    // The agent dies with the runner; the bridge it started, waiting on the runner's socket,
    // must not outlive them.
    common::wait_until("the bridge to exit", Duration::from_secs(10), async || {
        std::fs::read_to_string(&stat).map_or(true, |stat| {
            stat.rsplit(") ")
                .next()
                .is_some_and(|rest| rest.starts_with('Z'))
        })
    })
    .await;
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

    // A config in a folder that does not exist: the error names the config and its folder.
    let missing = dir.path().join("no-such-folder");
    let config = missing.join("agent.json");
    let out = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["run", "--url", &broker.url, "--mcp-config"])
        .arg(&config)
        .args(["--", "true"])
        .current_dir(dir.path())
        .env("AC7_TOKEN", broker.token("builder"))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "ac7: cannot write the MCP config {}: its folder {} does not exist",
            config.display(),
            missing.display()
        ),
        "{stderr}"
    );
    assert!(!missing.exists());
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
    common::wait_until_showing(
        &format!("the agent to receive {body:?}"),
        Duration::from_secs(30),
        || format!("received.txt: {:?}", std::fs::read_to_string(&path)),
        async || {
            std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .any(|l| l == body)
        },
    )
    .await;
}

/// Logs a message from `from` to the general channel straight into the database at `db`
/// (no broker running on it).
fn log_offline(db: &Path, from: &str, body: &str) {
    let store = broker_support::open_store(db);
    store.with(|conn| {
        ac7_runtime::broker::publish::log(
            &ac7_runtime::broker::store::Conn::sqlite(conn),
            ac7_runtime::broker::publish::Draft {
                to: None,
                from: from.into(),
                title: None,
                body: body.into(),
                level: Default::default(),
                data: Default::default(),
                attachments: vec![],
            },
            &ac7_protocol::domain::message::Audience::Everyone,
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
    broker.broker =
        broker_support::start_on(ac7_runtime::broker::BrokerConfig::new(db), addr).await;
    broker
}

/// Fast reconnects for tests: the first delay 20 ms instead of 1 s.
const FAST_RECONNECT: (&str, &str) = ("AC7_RECONNECT_BASE_MS", "20");

/// `ac7 run` for builder with the agent waiting for `bodies`; returns once it listens.
async fn messages_runner(broker: &TestBroker, dir: &Path, bodies: &[&str], stream: &str) -> Child {
    messages_runner_logging(broker, dir, bodies, stream, None).await
}

/// [`messages_runner`], its logs at `info` in the file `log` when given.
async fn messages_runner_logging(
    broker: &TestBroker,
    dir: &Path,
    bodies: &[&str],
    stream: &str,
    log: Option<&Path>,
) -> Child {
    let expect = bodies.join(",");
    let mut cmd = runner_command(
        broker,
        "builder",
        dir,
        "messages",
        &[("AC7_TEST_EXPECT", &expect), FAST_RECONNECT],
        stream,
    );
    if let Some(log) = log {
        cmd.env("AC7_LOG", "info")
            .stderr(std::fs::File::create(log).unwrap());
    }
    let child = cmd.spawn().unwrap();
    wait_for_file(&dir.join("ready"), "the agent to be listening").await;
    child
}

/// The runner exits 0 once the agent had `bodies`, each exactly once, in this order.
async fn assert_received_once_in_order(child: &mut Child, dir: &Path, bodies: &[&str], what: &str) {
    assert_eq!(exit_code(child, "the runner to exit").await, 0, "{what}");
    let out = result(dir);
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
        let log = dir.path().join("runner.log");
        let mut child =
            messages_runner_logging(&broker, dir.path(), &bodies, stream, Some(&log)).await;
        let zero = broker.push("director", json!({"body": "zero"})).await;
        wait_received(dir.path(), "zero").await;
        // A backup taken now has "zero" but not what follows.
        let backup = broker.dir.path().join("backup.db");
        broker.broker.state.store.with(|conn| {
            conn.execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
                .unwrap()
        });
        let before = broker.push("director", json!({"body": "before"})).await;
        wait_received(dir.path(), "before").await;

        // The broker comes back on the backup: the runner's last id ("before") is unknown there.
        let broker = restart_broker(broker, backup, |db| {
            log_offline(db, "director", "while-down")
        })
        .await;
        broker.push("director", json!({"body": "after"})).await;

        assert_received_once_in_order(&mut child, dir.path(), &bodies, stream).await;

        // The runner said so at info: the reset (of the id it sent), then the backfill (from
        // the message before the last one it had, and how many it brought).
        let logged: Vec<Value> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let info = |words: &str| {
            logged
                .iter()
                .find(|l| {
                    l["level"] == "INFO" && l["message"].as_str().is_some_and(|m| m.contains(words))
                })
                .unwrap_or_else(|| panic!("{stream}: no INFO line with {words:?} in {logged:?}"))
                .clone()
        };
        let reset = info("reset the live stream");
        assert_eq!(reset["last_event_id"], before["id"], "{stream}: {reset}");
        let backfill = info("backfilled the live stream");
        assert_eq!(
            backfill["from"],
            format!("after_id={}", zero["id"].as_str().unwrap()),
            "{stream}: {backfill}"
        );
        // "while-down" came only from /history; "after" may have come either way.
        assert!(
            backfill["delivered"]
                .as_u64()
                .is_some_and(|n| (1..=2).contains(&n)),
            "{stream}: {backfill}"
        );
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

/// A stand-in for Claude Code's session files: `$HOME/.claude/sessions/<pid>.json` names the
/// live session and `$HOME/.claude/projects/-w/<id>.jsonl` is its transcript. It starts session
/// `$FIRST` and talks in it, then switches to `$SECOND` (as `/clear` does) and talks in it only
/// when `$TALK` is set; it prints Claude Code's hint and exits 3.
const FAKE_CLAUDE_SESSIONS: &str = r#"#!/bin/sh
c="$HOME/.claude"
mkdir -p "$c/sessions" "$c/projects/-w"
session() {
  printf '{"type":"mode","sessionId":"%s"}\n' "$1" > "$c/projects/-w/$1.jsonl"
  [ -n "$2" ] && printf '{"type":"user","message":{"role":"user","content":"hi"}}\n' >> "$c/projects/-w/$1.jsonl"
  printf '{"pid":%s,"sessionId":"%s","cwd":"%s"}' "$$" "$1" "$PWD" > "$c/sessions/$$.json"
}
session "$FIRST" talk
session "$SECOND" "$TALK"
printf 'Resume this session with:\nclaude --resume %s\n' "$SECOND"
exit 3
"#;

/// After Claude Code exits, `ac7 claude-code` prints how to resume its session with ac7 — the
/// session it was in last, once it has a conversation (as Claude's own hint) — and passes the
/// exit code on; `ac7 run` prints no such line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_prints_how_to_resume_the_last_session_with_ac7() {
    let broker = start_broker().await;
    let dir = config_dir();
    let fake = dir.path().join("fake-claude");
    std::fs::write(&fake, FAKE_CLAUDE_SESSIONS).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (first, second) = (
        "11111111-2222-3333-4444-555555555555",
        "7d9d5680-fbe0-4810-88bb-f3506407ba97",
    );
    let run = |verb: &'static str, talk: &'static str| {
        let home = dir.path().join(format!("home-{verb}-{}", talk.len()));
        std::fs::create_dir_all(&home).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_ac7"));
        command.args([verb, "--url", &broker.url]);
        if verb == "run" {
            command.arg("--").arg(&fake);
        }
        command
            .current_dir(dir.path())
            .env("AC7_TOKEN", broker.token("builder"))
            .env("CLAUDE_PATH", &fake)
            .env("HOME", home)
            .env_remove("CLAUDE_CONFIG_DIR")
            .env("FIRST", first)
            .env("SECOND", second)
            .env("TALK", talk)
            .stdin(Stdio::null())
            .output()
    };
    let out = run("claude-code", "yes").await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let hint = format!("ac7 claude-code --url {} -- --resume {second}", broker.url);
    assert_eq!(stderr.lines().filter(|l| *l == hint).count(), 1, "{stderr}");
    assert!(!stderr.contains(first), "{stderr}");

    // The last session has no conversation: nothing to resume, no line.
    let out = run("claude-code", "").await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(!stderr.contains("--resume"), "{stderr}");

    let out = run("run", "yes").await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(!stderr.contains("--resume"), "{stderr}");
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
    let out = result(dir.path());
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
    insta::with_settings!({snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots"), prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!("runner_e2e__runner_admin_tool_calls", texts.join("\n"));
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

/// An event queued while the agent starts reaches it only after the agent's
/// handshake (`initialized` sent, first `tools/list` answered) — and does reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_queued_before_the_agent_attaches_waits_for_its_handshake() {
    let broker = start_broker().await;
    let dir = config_dir();
    let mut child = runner(&broker, "builder", dir.path(), "early", &[]);
    wait_for_file(&dir.path().join("waiting"), "the agent to start").await;
    broker
        .push("director", json!({"to": "builder", "body": "early"}))
        .await;
    // Let the runner take it from the stream and queue it (no bridge is attached yet).
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(dir.path().join("go"), "go").unwrap();

    assert_eq!(exit_code(&mut child, "the runner to exit").await, 0);
    let out = result(dir.path());
    let log = out["log"].as_array().unwrap();
    let position = |pred: &dyn Fn(&Value) -> bool| log.iter().position(pred);
    let initialized_sent =
        position(&|e| e["dir"] == "out" && e["msg"]["method"] == "notifications/initialized")
            .unwrap();
    let listed = position(&|e| e["dir"] == "in" && e["msg"]["id"] == 1).unwrap();
    let event =
        position(&|e| e["dir"] == "in" && e["msg"]["method"] == "notifications/claude/channel")
            .unwrap_or_else(|| panic!("the early event never arrived: {log:#?}"));
    assert_eq!(log[event]["msg"]["params"]["content"], "early");
    assert!(
        event > listed && event > initialized_sent,
        "the event came before the handshake finished: {log:#?}"
    );
    assert!(
        log[listed]["msg"]["result"]["tools"].is_array(),
        "{:?}",
        log[listed]
    );
    assert_restored(dir.path());
}

/// An agent that starts listening late after its handshake, as Claude Code does (here 700 ms
/// after the answer to its first `tools/list`, dropping what comes earlier; the real one took up
/// to ~0.6 s on a loaded machine): the DM queued before it attached reaches it once it listens,
/// and not before (when it would be dropped), and so does one pushed later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_listens_late_gets_the_queued_event_once_it_listens() {
    let broker = start_broker().await;
    let dir = config_dir();
    let mut child = runner(
        &broker,
        "builder",
        dir.path(),
        "late",
        &[("AC7_TEST_EXPECT", "early,later")],
    );
    wait_for_file(&dir.path().join("waiting"), "the agent to start").await;
    let early = broker
        .push("director", json!({"to": "builder", "body": "early"}))
        .await;
    wait_cursor(&broker, "builder", early["id"].as_str().unwrap()).await;
    std::fs::write(dir.path().join("go"), "go").unwrap();
    wait_for_file(&dir.path().join("ready"), "the agent to listen").await;
    broker
        .push("director", json!({"to": "builder", "body": "later"}))
        .await;

    assert_eq!(exit_code(&mut child, "the runner to exit").await, 0);
    let out = result(dir.path());
    assert_eq!(
        out["dropped"],
        json!([]),
        "written before it listened: {out}"
    );
    assert_eq!(out["received"], json!(["early", "later"]), "{out}");
    assert!(
        out["relists"].as_u64().unwrap() >= 1,
        "it answered a probe: {out}"
    );
    assert_restored(dir.path());
}

/// A bridge started by a process outside the agent's tree (here: this test, as
/// `claude mcp list` would from another terminal) is served, but the agent's bridge stays
/// attached and keeps receiving pushes, and the outsider never gets an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outsider_bridge_is_served_and_displaces_nothing() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let broker = start_broker().await;
    let dir = config_dir();
    let mut child = messages_runner(
        &broker,
        dir.path(),
        &["before", "with-outsider", "after-outsider"],
        "auto",
    )
    .await;
    broker
        .push("director", json!({"to": "builder", "body": "before"}))
        .await;

    let mut outsider = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .arg("mcp-bridge")
        .env("AC7_RUNNER_SOCKET", dir.path().join("r.sock"))
        .env("AC7_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = outsider.stdin.take().unwrap();
    let mut stdout = BufReader::new(outsider.stdout.take().unwrap());
    let mut seen = Vec::new();
    for line in [
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"health-check","version":"0"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"roster","arguments":{}}}"#,
    ] {
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
    }
    stdin.flush().await.unwrap();
    let mut answers = BTreeMap::new();
    within(20, "the outsider's answers", async {
        while answers.len() < 3 {
            let mut line = String::new();
            assert_ne!(
                stdout.read_line(&mut line).await.unwrap(),
                0,
                "outsider closed"
            );
            let msg: Value = serde_json::from_str(&line).unwrap();
            match msg["id"].as_u64() {
                Some(id) => {
                    answers.insert(id, msg);
                }
                None => seen.push(msg),
            }
        }
    })
    .await;
    assert!(
        answers[&1]["result"]["tools"].as_array().unwrap().len() > 10,
        "{:?}",
        answers[&1]
    );
    let roster = answers[&2]["result"]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(roster.contains("builder"), "{roster}");

    // The agent's bridge is still the one getting events, while the outsider stays connected.
    broker
        .push(
            "director",
            json!({"to": "builder", "body": "with-outsider"}),
        )
        .await;
    broker
        .push("director", json!({"body": "after-outsider"}))
        .await;
    assert_eq!(
        exit_code(&mut child, "the runner (the agent got every push)").await,
        0
    );
    // The runner shut down: the outsider's bridge was told so and exited; it saw no event.
    let mut rest = String::new();
    within(
        20,
        "the outsider to finish",
        stdout.read_to_string(&mut rest),
    )
    .await
    .unwrap();
    for line in rest.lines().filter(|l| !l.trim().is_empty()) {
        seen.push(serde_json::from_str(line).unwrap());
    }
    assert!(
        seen.iter()
            .all(|m| m["method"] != "notifications/claude/channel"),
        "an outsider got an event: {seen:?}"
    );
    let out = result(dir.path());
    assert_eq!(
        out["received"],
        json!(["after-outsider", "before", "with-outsider"])
    );
    assert_restored(dir.path());
}

/// A new bridge from inside the agent's own tree still displaces the old one (one bridge at a
/// time, the newest), and the new one gets the events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_bridge_from_the_agent_displaces_the_first() {
    let broker = start_broker().await;
    let dir = config_dir();
    let mut child = runner(
        &broker,
        "builder",
        dir.path(),
        "displace",
        &[("AC7_TEST_EXPECT", "to-the-second")],
    );
    wait_for_file(&dir.path().join("ready"), "the second bridge to attach").await;
    broker
        .push(
            "director",
            json!({"to": "builder", "body": "to-the-second"}),
        )
        .await;
    assert_eq!(exit_code(&mut child, "the runner to exit").await, 0);
    let out = result(dir.path());
    assert_eq!(
        out["first_answers"],
        json!([0, 1]),
        "the first bridge was served"
    );
    assert_eq!(out["first_rest"], "", "the first bridge got no events");
    assert_eq!(out["first_exit"], 0, "the displaced bridge exited cleanly");
    assert_eq!(out["received"], json!(["to-the-second"]));
    assert_restored(dir.path());
}

/// A process the agent runs that starts a bridge of its own — `claude mcp list` run through
/// the agent's shell tool checks its servers' health that way — is served (it lists the tools),
/// but the agent's bridge stays attached and gets every DM, before and after; the runner's log
/// says what it did with the other bridge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_a_child_of_the_agent_starts_is_served_and_displaces_nothing() {
    let broker = start_broker().await;
    let dir = config_dir();
    let bodies = ["before-check", "after-check-1", "after-check-2"];
    let child = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["run", "--url", &broker.url, "--socket"])
        .arg(dir.path().join("r.sock"))
        .arg("--")
        .arg(python())
        .arg(agent_script())
        .arg("foreign")
        .current_dir(dir.path())
        .env("AC7_TOKEN", broker.token("builder"))
        .env("AC7_TEST_WORK", dir.path())
        .env("AC7_TEST_EXPECT", bodies.join(","))
        .env("AC7_LOG", "info")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_for_file(&dir.path().join("ready"), "the agent to listen").await;
    broker
        .push("director", json!({"to": "builder", "body": bodies[0]}))
        .await;
    wait_for_file(&dir.path().join("checked"), "the health check to end").await;
    broker
        .push("director", json!({"to": "builder", "body": bodies[1]}))
        .await;
    broker.push("director", json!({"body": bodies[2]})).await;

    let out = within(60, "the runner to exit", child.wait_with_output())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let result = result(dir.path());
    assert_eq!(result["received"], json!(bodies), "{result}\n{stderr}");
    assert_eq!(result["check_exit"], 0, "{result}");
    assert_eq!(result["roster_ok"], true, "{result}");
    let check: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("check.json")).unwrap())
            .unwrap();
    assert!(check["tools"].as_u64().unwrap() > 10, "{check}");
    let foreign = stderr
        .lines()
        .find(|l| l.contains("a bridge started by another process in the agent's tree"))
        .unwrap_or_else(|| panic!("the runner logs the other bridge:\n{stderr}"));
    assert!(foreign.contains("served, gets no events"), "{foreign}");
    assert!(
        !stderr.contains("displaced"),
        "the agent's bridge was displaced:\n{stderr}"
    );
    assert_restored(dir.path());
}

/// A runner removes the sockets and lock files dead runners left in `$TMPDIR`,
/// and leaves a live runner's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_removes_what_dead_runners_left_in_tmpdir() {
    let broker = start_broker().await;
    let dir = config_dir();
    let tmp = common::tempdir();
    let dead = 999_999_999u32; // above pid_max: never alive
    let live = std::process::id();
    let _dead =
        std::os::unix::net::UnixListener::bind(tmp.path().join(format!(".ac7-runner-{dead}.sock")))
            .unwrap();
    std::fs::write(tmp.path().join(format!(".ac7-runner-{dead}.sock.lock")), "").unwrap();
    let _live =
        std::os::unix::net::UnixListener::bind(tmp.path().join(format!(".ac7-runner-{live}.sock")))
            .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["run", "--url", &broker.url, "--", "true"])
        .current_dir(dir.path())
        .env("AC7_TOKEN", broker.token("builder"))
        .env("TMPDIR", tmp.path())
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, [format!(".ac7-runner-{live}.sock")], "{left:?}");
}

/// `ac7 claude-code --doctor` finds claude, reports its version, and checks
/// that our MCP server starts and lists its tools. Uses the real Claude Code when
/// `AC7_TEST_CLAUDE` names it, else a stand-in on `CLAUDE_PATH` (only `--version` is run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_doctor_checks_claude_and_our_server() {
    let broker = start_broker().await;
    let dir = config_dir();
    let (claude, version) = match std::env::var_os("AC7_TEST_CLAUDE").filter(|p| !p.is_empty()) {
        Some(path) => (PathBuf::from(path), None),
        None => {
            let fake = dir.path().join("fake-claude");
            std::fs::write(
                &fake,
                "#!/bin/sh\n[ \"$1\" = --version ] && echo '2.1.197 (Claude Code)' && exit 0\nexit 9\n",
            )
            .unwrap();
            std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            (fake, Some("2.1.197 (Claude Code)"))
        }
    };
    let home = common::tempdir();
    let doctor_with = |claude: &Path, env: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ac7"));
        command
            .args(["claude-code", "--doctor", "--url", &broker.url])
            .current_dir(dir.path())
            .env("AC7_TOKEN", broker.token("builder"))
            .env("CLAUDE_PATH", claude)
            .env("HOME", home.path())
            .env_remove("CLAUDE_CONFIG_DIR");
        for name in [
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
            "DISABLE_TELEMETRY",
            "DO_NOT_TRACK",
            "DISABLE_GROWTHBOOK",
            "CLAUDE_CODE_USE_BEDROCK",
            "CLAUDE_CODE_USE_VERTEX",
        ] {
            command.env_remove(name);
        }
        for (k, v) in env {
            command.env(k, v);
        }
        command.output()
    };
    let doctor = |claude: &Path| doctor_with(claude, &[]);
    let out = within(60, "ac7 claude-code --doctor", doctor(&claude))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("ac7 claude-code --doctor: nothing turns claude's channels off\n"),
        "{stderr}"
    );
    assert!(!stderr.contains("WARN"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "ac7 claude-code --doctor: claude found at {}",
            claude.display()
        )),
        "{stderr}"
    );
    let version_line = stderr
        .lines()
        .find(|l| l.starts_with("ac7 claude-code --doctor: claude version "))
        .unwrap_or_else(|| panic!("{stderr}"));
    if let Some(version) = version {
        assert!(version_line.ends_with(version), "{version_line}");
    }
    assert!(
        stderr.contains("ac7 claude-code --doctor: the ac7 MCP server starts and lists 19 tools"),
        "{stderr}"
    );
    assert!(stderr.contains("roster, "), "{stderr}");
    assert!(stderr.trim_end().ends_with("all good"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".mcp.json")).unwrap(),
        ORIGINAL_CONFIG,
        "the doctor writes nothing"
    );

    // A claude that cannot say its version fails the check.
    let broken = dir.path().join("broken-claude");
    std::fs::write(&broken, "#!/bin/sh\nexit 3\n").unwrap();
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = within(60, "a failing doctor", doctor(&broken))
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("FAILED: "),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Another program called claude is not Claude Code: one FAILED line, and the checks stop.
    let fake = |name: &str, version: &str| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!("#!/bin/sh\n[ \"$1\" = --version ] && echo '{version}' && exit 0\nexit 9\n"),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        path
    };
    let other = fake("other-claude", "claude 0.4.2 (a chat bot)");
    let out = within(60, "the doctor on another claude", doctor(&other))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines[1],
        format!(
            "ac7 claude-code --doctor: FAILED: {} is not Claude Code: `claude --version` printed \"claude 0.4.2 (a chat bot)\", where Claude Code prints \"X.Y.Z (Claude Code)\" (install it: npm i -g @anthropic-ai/claude-code, or point CLAUDE_PATH at it)",
            other.display()
        ),
        "{stderr}"
    );
    assert_eq!(lines.len(), 2, "{stderr}");

    // What turns channels off is a WARN line each; the doctor still passes.
    let claude_code = fake("claude-code", "2.1.197 (Claude Code)");
    let out = within(
        60,
        "the doctor without nonessential traffic",
        doctor_with(
            &claude_code,
            &[("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")],
        ),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let warns: Vec<&str> = stderr.lines().filter(|l| l.contains(": WARN: ")).collect();
    assert_eq!(
        warns,
        [
            "ac7 claude-code --doctor: WARN: CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 (in the environment) turns off Claude Code's feature flags, and channels with them: ac7 messages do not reach claude as they arrive (its tools still work); unset it for ac7 claude-code"
        ],
        "{stderr}"
    );
    assert!(
        stderr.contains("the ac7 MCP server starts and lists 19 tools"),
        "{stderr}"
    );
    assert!(
        stderr
            .trim_end()
            .ends_with("ac7 claude-code --doctor: works, with 1 warning (above)"),
        "{stderr}"
    );

    // A too-old claude, a third-party provider, and a variable set in claude's settings.
    let old = fake("old-claude", "2.1.79 (Claude Code)");
    let settings = home.path().join(".claude/settings.json");
    std::fs::create_dir_all(settings.parent().unwrap()).unwrap();
    std::fs::write(&settings, r#"{"env": {"DISABLE_TELEMETRY": "1"}}"#).unwrap();
    let out = within(
        60,
        "the doctor with three warnings",
        doctor_with(&old, &[("CLAUDE_CODE_USE_BEDROCK", "true")]),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let warns: Vec<&str> = stderr.lines().filter(|l| l.contains(": WARN: ")).collect();
    assert_eq!(warns.len(), 3, "{stderr}");
    assert!(
        warns[0]
            .contains("claude 2.1.79 is older than 2.1.80, the first Claude Code with channels"),
        "{stderr}"
    );
    assert!(
        warns[1].contains("CLAUDE_CODE_USE_BEDROCK=true (in the environment) makes claude use a third-party provider"),
        "{stderr}"
    );
    assert!(
        warns[2].contains(&format!(
            "DISABLE_TELEMETRY=1 (in {}) turns off Claude Code's feature flags",
            settings.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr
            .trim_end()
            .ends_with("works, with 3 warnings (above)"),
        "{stderr}"
    );
}

/// When the agent owns a terminal, the runner's logs go to a 0600 file under
/// `$XDG_STATE_HOME/ac7/` whose path is printed once before the agent starts — never to the
/// terminal the agent draws on. Runs the runner under a pty (`script`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_terminal_the_runner_logs_to_a_private_file() {
    use std::os::unix::fs::PermissionsExt;
    let broker = start_broker().await;
    let dir = config_dir();
    let state = common::tempdir();
    let command = format!(
        "{} run --url {} -- sh -c 'echo agent-ran'",
        env!("CARGO_BIN_EXE_ac7"),
        broker.url
    );
    let out = within(
        30,
        "the runner under a pty",
        Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .current_dir(dir.path())
            .env("AC7_TOKEN", broker.token("builder"))
            .env("AC7_LOG", "trace")
            .env("XDG_STATE_HOME", state.path())
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{screen}");
    assert!(
        !screen.contains("\"timestamp\""),
        "log lines on the agent's terminal: {screen}"
    );
    let announce = screen
        .lines()
        .position(|l| l.starts_with("ac7: runner logs: "))
        .unwrap_or_else(|| panic!("no log path printed: {screen}"));
    let lines: Vec<&str> = screen.lines().collect();
    assert_eq!(
        lines.iter().filter(|l| l.contains("runner logs")).count(),
        1,
        "printed once"
    );
    let ran = lines.iter().position(|l| l.trim() == "agent-ran").unwrap();
    assert!(announce < ran, "printed before the agent starts: {screen}");
    let path = PathBuf::from(lines[announce]["ac7: runner logs: ".len()..].trim());
    assert_eq!(path.parent().unwrap(), state.path().join("ac7"));
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let log = std::fs::read_to_string(&path).unwrap();
    assert!(!log.is_empty());
    for line in log.lines() {
        let entry: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(entry["timestamp"].is_string(), "{line}");
    }
}

/// A runner logs at `warn` unless `AC7_LOG` says otherwise (no `bridge attached`
/// info line); without a terminal its logs stay on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_logs_at_warn_by_default() {
    let broker = start_broker().await;
    let dir = config_dir();
    let socket = dir.path().join("r.sock");
    let run = |log: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ac7"));
        // The agent is a bridge that attaches and leaves at once (its stdin is empty).
        cmd.args(["run", "--url", &broker.url, "--socket"])
            .arg(&socket)
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_ac7"))
            .arg("mcp-bridge")
            .current_dir(dir.path())
            .env("AC7_TOKEN", broker.token("builder"))
            .env("AC7_RUNNER_SOCKET", &socket)
            .env_remove("AC7_LOG")
            .stdin(Stdio::null());
        if let Some(log) = log {
            cmd.env("AC7_LOG", log);
        }
        cmd.output()
    };
    let out = within(30, "the runner", run(Some("info"))).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("bridge attached"), "AC7_LOG=info: {stderr}");
    assert!(
        !stderr.contains("runner logs:"),
        "no terminal, no file: {stderr}"
    );

    let out = within(30, "the runner", run(None)).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("\"INFO\""), "default is warn: {stderr}");
}

/// An agent that closes its bridge and starts a new one every 400 ms (as Claude Code does on
/// `/mcp` reconnect) while a flood of DMs arrives: each reaches it exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_swapping_its_bridge_every_400_ms_under_a_flood_gets_each_dm_once() {
    let broker = start_broker().await;
    let dir = config_dir();
    let bodies: Vec<String> = (0..600).map(|i| format!("flood-{i}")).collect();
    let expect = bodies.join(",");
    let mut child = runner(
        &broker,
        "builder",
        dir.path(),
        "swap",
        &[("AC7_TEST_EXPECT", &expect)],
    );
    wait_for_file(
        &dir.path().join("ready"),
        "the agent to start its first bridge",
    )
    .await;
    // About 150 a second for 4 s: every bridge boundary falls inside the flood.
    for chunk in bodies.chunks(15) {
        for body in chunk {
            let r = broker
                .post("/push", "director", json!({"to": "builder", "body": body}))
                .await;
            assert_eq!(r.status, 200, "{}", r.text);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(exit_code(&mut child, "the runner to exit").await, 0);
    let out = result(dir.path());
    let received: Vec<&str> = out["received"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let bridges = out["bridges"].as_u64().unwrap();
    assert!(
        bridges >= 5,
        "only {bridges} bridges: the flood outran the swaps"
    );
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &received {
        *counts.entry(r).or_default() += 1;
    }
    let lost: Vec<&String> = bodies
        .iter()
        .filter(|b| !counts.contains_key(b.as_str()))
        .collect();
    let doubled: Vec<(&&str, &usize)> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        lost.is_empty() && doubled.is_empty(),
        "over {bridges} bridges: lost {lost:?}, more than once {doubled:?}"
    );
}

/// Waits until the broker's durable cursor for `member` is at message `id`.
async fn wait_cursor(broker: &TestBroker, member: &str, id: &str) {
    common::wait_until(
        "the broker to record the last delivery",
        Duration::from_secs(10),
        async || {
            let b = broker.get("/briefing", member).await;
            (b.json["deliveredThrough"] == id).then_some(())
        },
    )
    .await;
}

/// A runner that starts gets what its member missed while no runner was live, in order, once;
/// past `--backfill` one notice says how many more there were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_starts_gets_what_was_missed_while_away() {
    let broker = start_broker().await;
    let dir = config_dir();
    let mut child = messages_runner(&broker, dir.path(), &["before"], "auto").await;
    let before = broker
        .push("director", json!({"to": "builder", "body": "before"}))
        .await;
    assert_received_once_in_order(&mut child, dir.path(), &["before"], "first run").await;
    wait_cursor(&broker, "builder", before["id"].as_str().unwrap()).await;

    // Away: three DMs and a general post, nothing running for builder.
    for body in ["away-1", "away-2"] {
        broker
            .push("director", json!({"to": "builder", "body": body}))
            .await;
    }
    broker.push("reviewer", json!({"body": "away-3"})).await;
    let dir2 = config_dir();
    let mut child =
        messages_runner(&broker, dir2.path(), &["away-1", "away-2", "away-3"], "sse").await;
    assert_received_once_in_order(
        &mut child,
        dir2.path(),
        &["away-1", "away-2", "away-3"],
        "what was missed, once, in order, and not what was delivered before",
    )
    .await;

    // Past the cap: the oldest two, then one notice counting the rest.
    let through = broker.get("/briefing", "builder").await.json["deliveredThrough"].clone();
    assert!(
        through.is_string(),
        "the second run moved the cursor: {through}"
    );
    common::wait_until(
        "the cursor to reach away-3",
        Duration::from_secs(10),
        async || {
            let b = broker.get("/briefing", "builder").await;
            let h = broker.get("/history?limit=1", "builder").await;
            (b.json["deliveredThrough"] == h.json["messages"][0]["id"]).then_some(())
        },
    )
    .await;
    for i in 0..5 {
        broker
            .push(
                "director",
                json!({"to": "builder", "body": format!("later-{i}")}),
            )
            .await;
    }
    let notice =
        "3 more messages reached you while no runner was live; call `recent` to read them.";
    let dir3 = config_dir();
    let expect = ["later-0", "later-1", notice];
    let mut child = runner(
        &broker,
        "builder",
        dir3.path(),
        "messages",
        &[
            ("AC7_TEST_EXPECT", &expect.join(",")),
            ("AC7_BACKFILL", "2"),
        ],
    );
    wait_for_file(&dir3.path().join("ready"), "the agent to be listening").await;
    assert_received_once_in_order(&mut child, dir3.path(), &expect, "capped").await;
}

/// A member whose runner never ran gets, at its first start, what was sent to it since it
/// joined (the DM that gave it its first task), and nothing from before it joined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_starts_for_the_first_time_gets_what_came_since_its_member_joined() {
    let mut broker = start_broker().await;
    // Members made with the team, on an empty log: everything they may see is theirs.
    broker
        .push("director", json!({"to": "builder", "body": "first task"}))
        .await;
    broker.push("reviewer", json!({"body": "hello all"})).await;
    let dir = config_dir();
    let expect = ["first task", "hello all"];
    let mut child = runner(
        &broker,
        "builder",
        dir.path(),
        "messages",
        &[("AC7_TEST_EXPECT", &expect.join(","))],
    );
    assert_received_once_in_order(&mut child, dir.path(), &expect, "team member, empty log").await;

    // A member added later: what was logged before it joined stays out.
    let r = broker
        .post(
            "/members",
            "director",
            json!({"name": "scout", "role": {"title": "scout"}, "permissions": []}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let token = r.json["token"].as_str().unwrap().to_owned();
    broker.tokens.insert("scout".into(), token);
    broker
        .push("director", json!({"to": "scout", "body": "scout task"}))
        .await;
    broker
        .push("reviewer", json!({"body": "welcome scout"}))
        .await;
    let dir = config_dir();
    let expect = ["scout task", "welcome scout"];
    let mut child = runner(
        &broker,
        "scout",
        dir.path(),
        "messages",
        &[("AC7_TEST_EXPECT", &expect.join(","))],
    );
    assert_received_once_in_order(&mut child, dir.path(), &expect, "member added later").await;
}

/// A runner whose live stream is a WebSocket reaches a broker with a private certificate over
/// `wss://` when `AC7_CA_CERT` names it, as its HTTPS calls do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_stream_trusts_the_broker_certificate_named_by_ac7_ca_cert() {
    let pki = broker_support::self_signed();
    let (cert, files) = (pki.files.cert.clone(), pki.files.clone());
    let broker = broker_support::start_with(move |c| c.tls = Some(files)).await;
    let https = format!("https://localhost:{}", broker.broker.addr.port());
    let dir = config_dir();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["run", "--url", &https, "--stream", "ws", "--socket"])
        .arg(dir.path().join("r.sock"))
        .arg("--")
        .arg(python())
        .arg(agent_script())
        .arg("messages")
        .current_dir(dir.path())
        .env("AC7_TOKEN", broker.token("builder"))
        .env("AC7_CA_CERT", &cert)
        .env("AC7_TEST_WORK", dir.path())
        .env("AC7_TEST_EXPECT", "over wss")
        .env("AC7_LOG", "warn")
        .env(FAST_RECONNECT.0, FAST_RECONNECT.1)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_for_file(&dir.path().join("ready"), "the agent to be listening").await;
    let trusting = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(pki.cert_pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    let roster = async || -> Value {
        trusting
            .get(format!("{https}/roster"))
            .bearer_auth(broker.token("director"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    };
    common::wait_until(
        "builder's stream to be live",
        Duration::from_secs(30),
        async || {
            roster().await["connected"]
                .as_array()
                .is_some_and(|c| c.iter().any(|p| p["name"] == "builder"))
        },
    )
    .await;
    let pushed = trusting
        .post(format!("{https}/push"))
        .bearer_auth(broker.token("director"))
        .json(&json!({"to": "builder", "body": "over wss"}))
        .send()
        .await
        .unwrap();
    assert_eq!(pushed.status().as_u16(), 200);
    assert_received_once_in_order(&mut child, dir.path(), &["over wss"], "wss").await;
}

/// The example agent shipped in `examples/echo_agent.py` runs under `ac7 run` as written in its
/// usage line and answers a direct message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_echo_agent_answers_a_direct_message() {
    let broker = start_broker().await;
    let dir = config_dir();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/echo_agent.py");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["run", "--socket"])
        .arg(dir.path().join("r.sock"))
        .arg("--")
        .arg(python())
        .arg(&example)
        .current_dir(dir.path())
        .env("AC7_URL", &broker.url)
        .env("AC7_TOKEN", broker.token("builder"))
        .env("AC7_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let up = within(40, "the echo agent to start", async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with("echo agent up, ") {
                return line;
            }
        }
        panic!("the echo agent's output ended before it was up")
    })
    .await;
    assert!(up.ends_with(" tools"), "{up}");
    broker
        .push("director", json!({"to": "builder", "body": "ping 42"}))
        .await;
    let seen = std::cell::RefCell::new(Value::Null);
    common::wait_until_showing(
        "the echo agent's reply",
        Duration::from_secs(40),
        || format!("history: {}", seen.borrow()),
        async || {
            let page = broker.get("/history?with=builder", "director").await.json;
            let found = page["messages"].as_array().is_some_and(|msgs| {
                msgs.iter().any(|m| {
                    m["from"] == "builder" && m["to"] == "director" && m["body"] == "echo: ping 42"
                })
            });
            *seen.borrow_mut() = page;
            found
        },
    )
    .await;
    child.start_kill().unwrap();
    let _ = child.wait().await;
}
