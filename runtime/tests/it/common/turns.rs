//! What the tests of the runners that drive their agent in turns (`ac7 acp`, `ac7 codex`)
//! share: the director's view of its DMs with builder, and ending a session with SIGTERM.

use serde_json::Value;
use tokio::process::Child;

use crate::broker_support::TestBroker;

/// The director's DM thread with builder, newest first.
pub async fn history(broker: &TestBroker) -> Vec<Value> {
    broker.get("/history?with=builder", "director").await.json["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Sends SIGTERM to the runner `child` and waits (bounded) for it to exit.
pub async fn sigterm(child: &mut Child) -> std::process::ExitStatus {
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    super::within(30, "the runner to exit after SIGTERM", child.wait())
        .await
        .unwrap()
}
