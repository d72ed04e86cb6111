//! `ac7 acp` against a scripted ACP agent (`runtime/tests/python/acp_agent.py`, standard-library
//! Python: it starts the ac7 bridge `session/new` names and plays a model keyed on the prompt's
//! text) and a real broker: pushes become turns, ac7's tools work through the bridge and the
//! permission policy, a failed or hung turn is told to its sender and the next push still goes,
//! what arrives during a turn goes when it ends, a burst is delivered once each, and the edges
//! of start-up and exit.

#![allow(clippy::unwrap_used)]

use crate::broker_support;
use crate::common;
use crate::common::turns::{history, sigterm};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_support::{TestBroker, start_broker};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/acp_agent.py")
}

/// `ac7 acp` as `builder` of `broker` with the scripted agent logging to `log`.
fn session(broker: &TestBroker, work: &Path, log: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(common::ac7());
    command
        .args(["acp", "--url", &broker.url, "--no-trace"])
        .args(args)
        .arg("--")
        .arg("python3")
        .arg(script())
        .current_dir(work)
        .env("AC7_TOKEN", broker.token("builder"))
        .env("ACP_TEST_LOG", log)
        .env("AC7_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}

/// The runner's stderr, collected as it comes.
fn collect_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let sink = stderr.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let mut s = sink.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    stderr
}

/// The agent's log entries.
fn entries(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Each prompt's text blocks, in order.
fn prompts(log: &Path) -> Vec<Vec<String>> {
    entries(log)
        .iter()
        .filter_map(|e| e["prompt"].as_array())
        .map(|blocks| {
            blocks
                .iter()
                .map(|b| b.as_str().unwrap().to_owned())
                .collect()
        })
        .collect()
}

/// A push becomes a turn (the briefing in front of the first), the agent's call of ac7's `send`
/// is allowed and reaches the broker while its shell command is denied, a failed turn and a
/// hung one (cancelled after `--turn-timeout`) are told to the sender and the next push still
/// goes, pushes during a turn go together when it ends, SIGTERM ends the session with 143.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_become_turns_and_failed_turns_leave_the_member_listening() {
    let broker = start_broker().await;
    let work = common::tempdir();
    let log = work.path().join("agent.log");
    let mut child = session(&broker, work.path(), &log, &["--turn-timeout", "3"])
        .spawn()
        .unwrap();
    let stderr = collect_stderr(&mut child);
    let context = || {
        format!(
            "ac7 acp stderr:\n{}\nagent log:\n{}",
            stderr.lock().unwrap(),
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    };
    let wait = Duration::from_secs(30);
    common::wait_until_showing("the session to start", wait, context, async || {
        stderr
            .lock()
            .unwrap()
            .contains("scripted-acp 0.1.0 connected")
    })
    .await;
    // The agent started our bridge and listed its tools.
    let session_new = entries(&log)
        .into_iter()
        .find_map(|e| e.get("session_new").cloned())
        .unwrap();
    assert_eq!(
        session_new["cwd"],
        work.path().canonicalize().unwrap().to_str().unwrap()
    );
    assert!(
        session_new["tools"]["ac7"].as_u64().unwrap() > 10,
        "{session_new}"
    );

    let briefing = broker.get("/briefing", "builder").await.json["instructions"]
        .as_str()
        .unwrap()
        .to_owned();
    let dm = async |body: &str| {
        broker
            .push("director", json!({"to": "builder", "body": body}))
            .await["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let prompt_with = async |what: &str, text: &str| -> Vec<String> {
        common::wait_until_showing(what, wait, context, async || {
            prompts(&log)
                .into_iter()
                .find(|p| p.last().is_some_and(|t| t.contains(text)))
        })
        .await
    };

    // A push becomes a turn, with the briefing first.
    dm("SEND-HELLO to director").await;
    let first = prompt_with("the first turn", "SEND-HELLO").await;
    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!(first[0], briefing);
    assert!(
        first[1].starts_with("<channel ") && first[1].contains("from=\"director\""),
        "{first:?}"
    );
    common::wait_until_showing("the agent's DM in /history", wait, context, async || {
        history(&broker)
            .await
            .iter()
            .any(|m| m["from"] == "builder" && m["body"] == "hello from the scripted agent")
    })
    .await;
    common::wait_until_showing("both permission answers", wait, context, async || {
        entries(&log)
            .iter()
            .filter(|e| e.get("permission").is_some())
            .count()
            == 2
    })
    .await;
    let answers: Vec<Value> = entries(&log)
        .into_iter()
        .filter(|e| e.get("permission").is_some())
        .collect();
    assert_eq!(
        answers[0],
        json!({"permission": "mcp__ac7__send", "outcome": {"outcome": "selected", "optionId": "allow"}})
    );
    assert_eq!(
        answers[1],
        json!({"permission": "`rm -rf /tmp/x`", "outcome": {"outcome": "selected", "optionId": "reject"}})
    );

    // A failed turn: director is told, the next push still goes, without the briefing.
    let failing = dm("FAIL-TURN now").await;
    common::wait_until_showing("the turn-failed DM", wait, context, async || {
        history(&broker).await.iter().any(|m| {
            m["from"] == "builder"
                && m["title"] == "turn failed"
                && m["body"].as_str().unwrap().contains(&failing)
                && m["body"]
                    .as_str()
                    .unwrap()
                    .contains("Internal error (the scripted model failed)")
        })
    })
    .await;
    dm("after the failure").await;
    let next = prompt_with("the push after the failed turn", "after the failure").await;
    assert_eq!(
        next.len(),
        1,
        "the briefing went with a turn that succeeded"
    );

    // Pushes during a turn go together when it ends.
    dm("SLOW turn").await;
    prompt_with("the slow turn", "SLOW").await;
    dm("queued one").await;
    dm("queued two").await;
    let queued = prompt_with("the queued pushes", "queued one").await;
    assert!(queued[0].contains("queued two"), "one turn: {queued:?}");

    // A hung turn is cancelled after --turn-timeout; director is told; the member still listens.
    let hung = dm("HANG here").await;
    common::wait_until_showing("the hung turn's DM", wait, context, async || {
        history(&broker).await.iter().any(|m| {
            m["title"] == "turn failed"
                && m["body"].as_str().unwrap().contains(&hung)
                && m["body"].as_str().unwrap().contains("ran past 3 s")
        })
    })
    .await;
    dm("after the hang").await;
    prompt_with("the push after the hung turn", "after the hang").await;

    assert_eq!(sigterm(&mut child).await.code(), Some(143), "{}", context());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_40_pushes_is_delivered_once_each() {
    let broker = start_broker().await;
    let work = common::tempdir();
    let log = work.path().join("agent.log");
    let mut child = session(&broker, work.path(), &log, &[]).spawn().unwrap();
    let stderr = collect_stderr(&mut child);
    let context = || {
        format!(
            "ac7 acp stderr:\n{}\nagent log:\n{}",
            stderr.lock().unwrap(),
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    };
    common::wait_until_showing(
        "the session",
        Duration::from_secs(30),
        context,
        async || stderr.lock().unwrap().contains("connected"),
    )
    .await;
    for i in 0..40 {
        broker
            .push(
                "director",
                json!({"to": "builder", "body": format!("burst-{i}-end")}),
            )
            .await;
    }
    let count = |i: usize| {
        let needle = format!("burst-{i}-end");
        prompts(&log)
            .iter()
            .flatten()
            .map(|t| t.matches(&needle).count())
            .sum::<usize>()
    };
    common::wait_until_showing(
        "all 40 pushes",
        Duration::from_secs(60),
        context,
        async || (0..40).all(|i| count(i) >= 1),
    )
    .await;
    // Settled: nothing more arrives.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..40 {
        assert_eq!(count(i), 1, "burst-{i} delivered once\n{}", context());
    }
    assert_eq!(sigterm(&mut child).await.code(), Some(143));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_exiting_ends_the_runner_with_its_code() {
    let broker = start_broker().await;
    let work = common::tempdir();
    let log = work.path().join("agent.log");
    let mut child = session(&broker, work.path(), &log, &[])
        .env("ACP_TEST_NOISE", "1")
        .spawn()
        .unwrap();
    let stderr = collect_stderr(&mut child);
    common::wait_until("the session", Duration::from_secs(30), async || {
        stderr.lock().unwrap().contains("connected")
    })
    .await;
    broker
        .push("director", json!({"to": "builder", "body": "EXIT-7"}))
        .await;
    let status = common::within(30, "ac7 acp to exit", child.wait())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(7), "{}", stderr.lock().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_errors_are_clear() {
    let broker = start_broker().await;
    let work = common::tempdir();
    let log = work.path().join("agent.log");
    // Another protocol version.
    let out = common::within(
        30,
        "ac7 acp with a version 2 agent",
        session(&broker, work.path(), &log, &[])
            .env("ACP_TEST_VERSION", "2")
            .output(),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("ac7 acp: the agent speaks ACP version 2; ac7 speaks version 1"),
        "{stderr}"
    );
    // No such agent.
    let out = Command::new(common::ac7())
        .args([
            "acp",
            "--url",
            &broker.url,
            "--",
            "/nonexistent/agent",
            "--acp",
        ])
        .env("AC7_TOKEN", broker.token("builder"))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/agent does not exist"));
    // --doctor.
    let out = common::within(
        60,
        "ac7 acp --doctor",
        session(&broker, work.path(), &log, &["--doctor"]).output(),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("ac7 acp --doctor: scripted-acp 0.1.0 speaks ACP version 1"),
        "{stderr}"
    );
    assert!(
        stderr.contains("started the ac7 MCP server (a bridge connected)"),
        "{stderr}"
    );
}

/// What the member missed while no runner was live comes, once and in order, as the first turn
/// of the next session (one prompt); what the last session had already taken does not come
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_missed_while_away_is_the_first_turn_of_the_next_session() {
    let broker = start_broker().await;
    let start = async |work: &Path, log: &Path| {
        let mut child = session(&broker, work, log, &[]).spawn().unwrap();
        let stderr = collect_stderr(&mut child);
        common::wait_until_showing(
            "the session",
            Duration::from_secs(30),
            || stderr.lock().unwrap().clone(),
            async || stderr.lock().unwrap().contains("connected"),
        )
        .await;
        child
    };
    let first = common::tempdir();
    let first_log = first.path().join("agent.log");
    let mut child = start(first.path(), &first_log).await;
    let before = broker
        .push("director", json!({"to": "builder", "body": "before-end"}))
        .await;
    common::wait_until_showing(
        "the first turn",
        Duration::from_secs(30),
        || std::fs::read_to_string(&first_log).unwrap_or_default(),
        async || {
            prompts(&first_log)
                .iter()
                .flatten()
                .any(|t| t.contains("before-end"))
        },
    )
    .await;
    common::wait_until(
        "the broker to record the delivery",
        Duration::from_secs(10),
        async || {
            let b = broker.get("/briefing", "builder").await;
            b.json["deliveredThrough"] == before["id"]
        },
    )
    .await;
    assert_eq!(sigterm(&mut child).await.code(), Some(143));

    for body in ["away-1-end", "away-2-end"] {
        broker
            .push("director", json!({"to": "builder", "body": body}))
            .await;
    }
    let second = common::tempdir();
    let log = second.path().join("agent.log");
    let mut child = start(second.path(), &log).await;
    common::wait_until_showing(
        "the missed messages",
        Duration::from_secs(30),
        || std::fs::read_to_string(&log).unwrap_or_default(),
        async || !prompts(&log).is_empty(),
    )
    .await;
    // Settled: a second turn would have started by now.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let turns = prompts(&log);
    assert_eq!(turns.len(), 1, "one turn: {turns:?}");
    let text = turns[0].join("\n");
    let (one, two) = (text.find("away-1-end"), text.find("away-2-end"));
    assert!(
        matches!((one, two), (Some(a), Some(b)) if a < b),
        "both, in order: {text}"
    );
    assert_eq!(text.matches("away-1-end").count(), 1, "{text}");
    assert_eq!(text.matches("away-2-end").count(), 1, "{text}");
    assert!(
        !text.contains("before-end"),
        "taken before, not again: {text}"
    );
    assert_eq!(sigterm(&mut child).await.code(), Some(143));
}
