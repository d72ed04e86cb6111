//! The runner's activity pipeline against a real broker on 127.0.0.1: uploads arrive in order,
//! survive a broker that is down for a while, and the busy flag follows LLM calls.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use crate::broker_support;

use std::time::Duration;

use ac7_protocol::trace::activity::ActivityEvent;
use ac7_runtime::broker::start;
use ac7_runtime::client::BrokerClient;
use ac7_runtime::runner::activity::{ActivityPipeline, PipelineConfig};
use broker_support::{TestBroker, start_broker};
use serde_json::Value;

fn open(ts: i64) -> ActivityEvent {
    ActivityEvent::ObjectiveOpen {
        ts,
        objective_id: format!("obj-{ts}"),
    }
}

/// The builder's stored event timestamps, oldest first.
async fn stored_ts(b: &TestBroker) -> Vec<i64> {
    let r = b
        .get("/members/builder/activity?limit=1000", "builder")
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let mut ts: Vec<i64> = r.json["activity"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["event"]["ts"].as_i64().unwrap())
        .collect();
    ts.reverse();
    ts
}

/// Polls `check` every 50 ms for up to 10 s.
async fn eventually<F: AsyncFnMut() -> bool>(what: &str, mut check: F) {
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

fn builder_busy(roster: &Value) -> Option<Value> {
    roster["connected"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "builder")
        .unwrap()
        .get("busy")
        .cloned()
}

#[tokio::test]
async fn recorded_events_arrive_in_order() {
    let b = start_broker().await;
    let client = BrokerClient::new(&b.url, b.token("builder")).unwrap();
    let (pipeline, handle) =
        ActivityPipeline::start(client, "builder".into(), PipelineConfig::default());
    // One event goes within the 500 ms linger, without a shutdown.
    handle.record(open(1));
    eventually("the first event", async || stored_ts(&b).await == [1]).await;
    // 130 more from two clones: several batches, in order, all there after shutdown.
    let other = handle.clone();
    for ts in 2..=130 {
        if ts % 2 == 0 {
            handle.record(open(ts));
        } else {
            other.record(open(ts));
        }
    }
    pipeline.shutdown().await;
    assert_eq!(stored_ts(&b).await, (1..=130).collect::<Vec<_>>());
    // After shutdown the handle drops events quietly.
    handle.record(open(999));
    assert_eq!(stored_ts(&b).await.len(), 130);
}

#[tokio::test]
async fn a_broker_down_for_a_while_still_gets_every_event() {
    let TestBroker {
        url,
        tokens,
        broker,
        http,
        dir,
        pg,
    } = start_broker().await;
    let addr = broker.addr;
    broker.shutdown().await.unwrap();
    let client = BrokerClient::new(&url, &tokens["builder"]).unwrap();
    let (pipeline, handle) =
        ActivityPipeline::start(client, "builder".into(), PipelineConfig::default());
    for ts in 1..=75 {
        handle.record(open(ts));
    }
    // Several failed uploads (connection refused) and backoffs.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let broker = start(
        broker_support::config_for(dir.path(), pg.as_ref()),
        listener,
    )
    .await
    .unwrap();
    let b = TestBroker {
        url,
        tokens,
        broker,
        http,
        dir,
        pg,
    };
    for ts in 76..=80 {
        handle.record(open(ts));
    }
    eventually("every event after the broker came back", async || {
        stored_ts(&b).await.len() >= 80
    })
    .await;
    pipeline.shutdown().await;
    assert_eq!(stored_ts(&b).await, (1..=80).collect::<Vec<_>>());
}

#[tokio::test]
async fn llm_calls_mark_the_member_busy_on_the_roster() {
    let b = start_broker().await;
    let client = BrokerClient::new(&b.url, b.token("builder")).unwrap();
    let (pipeline, handle) =
        ActivityPipeline::start(client, "builder".into(), PipelineConfig::default());
    let roster = async || b.get("/roster", "director").await.json;
    assert_eq!(builder_busy(&roster().await), None);
    handle.llm_started(7);
    handle.llm_started(7);
    eventually("busy: true", async || {
        builder_busy(&roster().await) == Some(Value::Bool(true))
    })
    .await;
    handle.llm_finished(7);
    // Still one call in flight under key 7: busy stays past the idle debounce.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(builder_busy(&roster().await), Some(Value::Bool(true)));
    handle.llm_finished(7);
    eventually("busy cleared", async || {
        builder_busy(&roster().await).is_none()
    })
    .await;
    // Busy at shutdown: the final report clears it.
    handle.llm_started(8);
    eventually("busy again", async || {
        builder_busy(&roster().await) == Some(Value::Bool(true))
    })
    .await;
    pipeline.shutdown().await;
    assert_eq!(builder_busy(&roster().await), None);
}

/// `(kind, objectiveId, result)` of the builder's markers, oldest first.
async fn markers(b: &TestBroker) -> Vec<(String, String, String)> {
    let r = b
        .get("/members/builder/activity?limit=1000", "builder")
        .await;
    let mut rows: Vec<(String, String, String)> = r.json["activity"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let e = &row["event"];
            let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
            (
                text(&e["kind"]),
                text(&e["objectiveId"]),
                text(&e["result"]),
            )
        })
        .collect();
    rows.reverse();
    rows
}

async fn create(b: &TestBroker, title: &str, assignee: &str) -> String {
    let r = b
        .post(
            "/objectives",
            "director",
            serde_json::json!({"title": title, "outcome": "o", "assignee": assignee}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["id"].as_str().unwrap().to_owned()
}

fn mark(kind: &str, id: &str, result: &str) -> (String, String, String) {
    (kind.into(), id.into(), result.into())
}

#[tokio::test]
async fn objective_markers_follow_the_tracker_with_real_close_reasons() {
    let b = start_broker().await;
    let a = create(&b, "from the briefing", "builder").await;
    let theirs = create(&b, "someone else's", "reviewer").await;
    let dir = tempfile::tempdir().unwrap();
    let mut runner = tokio::process::Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["run", "--url", &b.url, "--socket"])
        .arg(dir.path().join("r.sock"))
        .args(["--", "sh", "-c", "while [ ! -e stop ]; do sleep 0.05; done"])
        .current_dir(dir.path())
        .env("AC7_TOKEN", b.token("builder"))
        .env("AC7_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    eventually("the briefing's open marker", async || {
        markers(&b).await == [mark("objective_open", &a, "")]
    })
    .await;
    let (moved, done, cancelled) = (
        create(&b, "to be reassigned", "builder").await,
        create(&b, "to be completed", "builder").await,
        create(&b, "to be cancelled", "builder").await,
    );
    eventually("three more opens", async || markers(&b).await.len() == 4).await;
    let r = b
        .post(
            &format!("/objectives/{moved}/reassign"),
            "director",
            serde_json::json!({"to": "reviewer"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = b
        .post(
            &format!("/objectives/{done}/complete"),
            "builder",
            serde_json::json!({"result": "shipped"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = b
        .post(
            &format!("/objectives/{cancelled}/cancel"),
            "director",
            serde_json::json!({}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    eventually("three closes", async || markers(&b).await.len() == 7).await;
    std::fs::write(dir.path().join("stop"), "").unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), runner.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    let all = markers(&b).await;
    let mut opens: Vec<_> = all[1..4].to_vec();
    opens.sort();
    let mut expected = vec![
        mark("objective_open", &moved, ""),
        mark("objective_open", &done, ""),
        mark("objective_open", &cancelled, ""),
    ];
    expected.sort();
    assert_eq!(opens, expected);
    let mut closes: Vec<_> = all[4..7].to_vec();
    closes.sort();
    let mut expected = vec![
        mark("objective_close", &moved, "reassigned"),
        mark("objective_close", &done, "done"),
        mark("objective_close", &cancelled, "cancelled"),
    ];
    expected.sort();
    assert_eq!(closes, expected);
    assert_eq!(all[0], mark("objective_open", &a, ""));
    assert_eq!(all[7..], [mark("objective_close", &a, "runner_shutdown")]);
    assert!(all.iter().all(|m| m.1 != theirs), "{all:?}");
}
