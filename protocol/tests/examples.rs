//! The embedding examples run to completion on their own.

#[allow(dead_code)]
#[path = "../examples/tcp_bridge.rs"]
mod tcp_bridge;

/// The runner and the MCP bridge driven over loopback TCP: the agent gets its three answers
/// (the tool's text included) and the runner's notification, and both sides end.
#[test]
fn tcp_bridge_example_runs_to_completion() {
    let transcript = tcp_bridge::run().expect("the example runs");
    assert_eq!(
        transcript
            .answer(1)
            .map(|a| a["result"]["serverInfo"].is_object()),
        Some(true),
        "initialize answered by the bridge: {transcript:?}"
    );
    assert_eq!(
        transcript
            .answer(2)
            .map(|a| a["result"]["tools"][0]["name"].clone()),
        Some(serde_json::json!("echo"))
    );
    assert_eq!(
        transcript
            .answer(3)
            .and_then(|a| a["result"]["content"][0]["text"].as_str()),
        Some("echo: over TCP")
    );
    assert!(transcript.got_notification());
}
