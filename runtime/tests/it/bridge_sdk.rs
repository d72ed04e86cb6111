//! The official Python MCP SDK (pinned in `tests/python/requirements.txt`) plays the agent and
//! spawns the real `ac7 mcp-bridge`; the scripted runner-side server answers.

use crate::common;

use ac7_protocol::session::runner::{BridgePolicy, DetachReason, RunnerEvent};
use common::{run_agent, start_runner, tempdir, within};

#[tokio::test(flavor = "current_thread")]
async fn sdk_initialize_list_call_errors_concurrency_and_notifications() {
    let dir = tempdir();
    let runner = start_runner(dir.path(), BridgePolicy::DisplaceOld);
    let out = run_agent("main", &runner.path, dir.path()).await;

    assert_eq!(out["tools"], 31);
    assert_eq!(out["echo_meta"]["progressToken"], "tok-1");
    assert_eq!(out["unknown_method_code"], -32601);
    assert_eq!(out["concurrent"], 32);
    assert_eq!(out["channel"]["content"], "hello from the team");
    assert_eq!(out["list_changed"], true);
    assert_eq!(out["exit_code"], 0);

    // The SDK probed server/discover (answered -32601 by the runner, through the bridge) before
    // falling back to initialize, which the bridge answered itself.
    let methods = runner.script.methods();
    assert_eq!(
        methods.first().map(String::as_str),
        Some("server/discover"),
        "{methods:?}"
    );
    assert!(!methods.iter().any(|m| m == "initialize"), "{methods:?}");
    assert!(methods.iter().any(|m| m == "resources/list"), "{methods:?}");
    // The runner answered the 32 concurrent calls in reverse order.
    let answered = runner.script.slow_answered.lock().unwrap().clone();
    assert_eq!(answered, (0..32).rev().collect::<Vec<u64>>());
}

#[tokio::test(flavor = "current_thread")]
async fn sdk_displaced_bridge_exits_zero() {
    let dir = tempdir();
    let mut runner = start_runner(dir.path(), BridgePolicy::DisplaceOld);
    let out = run_agent("displace", &runner.path, dir.path()).await;
    assert_eq!(out["a_exit_code"], 0);
    assert_eq!(out["b_exit_code"], 0);
    assert!(out["a_after_displace"]["code"].is_i64(), "{out}");

    let mut displaced = false;
    while let Ok(event) = runner.events.try_recv() {
        displaced |= matches!(
            event,
            RunnerEvent::Detached {
                reason: DetachReason::Displaced,
                ..
            }
        );
    }
    assert!(displaced, "the runner never displaced a bridge");
}

#[tokio::test(flavor = "current_thread")]
async fn sdk_pending_call_fails_when_the_runner_dies() {
    let dir = tempdir();
    let runner = start_runner(dir.path(), BridgePolicy::DisplaceOld);
    let common::Runner {
        task,
        mut die_rx,
        path,
        ..
    } = runner;
    let agent = run_agent("runner_death", &path, dir.path());
    let killer = async move {
        within(30, "the agent to call `die`", die_rx.recv()).await;
        // Every socket closes without a shutdown frame, as when the runner process dies.
        task.abort().await;
    };
    let (out, ()) = tokio::join!(agent, killer);
    assert_eq!(out["exit_code"], 0);
    assert_eq!(out["pending_call_error"]["code"], -32603, "{out}");
    let message = out["pending_call_error"]["message"].as_str().unwrap();
    assert!(message.contains("runner closed"), "{message}");
}
