//! The runner-side socket server on real sockets, with raw connections playing the bridge.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns are test code too

use crate::common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use ac7_protocol::codec::jsonrpc::{Outcome, RpcError};
use ac7_protocol::dialect::mcp;
use ac7_protocol::session::runner::{BridgePolicy, IncomingRequest, RunnerConfig};
use ac7_runtime::runner::ipc_server::{
    BindError, IpcServer, IpcServerOptions, MAX_SOCKET_PATH_BYTES, ServerTask,
};
use common::{tempdir, within};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

fn options(path: &Path, policy: BridgePolicy) -> IpcServerOptions {
    IpcServerOptions {
        path: Some(path.to_owned()),
        session: RunnerConfig {
            policy,
            ..RunnerConfig::default()
        },
        ..IpcServerOptions::default()
    }
}

/// Answers `tools/call` with the tool name; panics for the tool `panic` at once and for
/// `panic-later` after waiting once; -32601 otherwise.
fn serve(server: IpcServer) -> ServerTask {
    server.serve(|req: IncomingRequest| async move {
        match req.method.as_str() {
            mcp::TOOLS_CALL => {
                let name = mcp::tool_call_name(req.params.as_ref());
                if name == "panic-later" {
                    tokio::task::yield_now().await;
                }
                assert!(!name.starts_with("panic"), "the handler panics on request");
                Outcome::Result(mcp::tool_text(&name))
            }
            other => Outcome::Error(RpcError::new(-32601, format!("Method not found: {other}"))),
        }
    })
}

struct Peer {
    lines: Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

impl Peer {
    async fn connect(path: &Path) -> Self {
        let stream = within(5, "connecting", UnixStream::connect(path))
            .await
            .unwrap();
        let (read, write) = stream.into_split();
        Self {
            lines: BufReader::new(read).lines(),
            write,
        }
    }

    async fn send(&mut self, frame: Value) {
        let line = format!("{frame}\n");
        self.write.write_all(line.as_bytes()).await.unwrap();
    }

    /// The next frame, or `None` at EOF.
    async fn recv(&mut self) -> Option<Value> {
        let line = within(5, "a frame from the runner", self.lines.next_line())
            .await
            .unwrap()?;
        Some(serde_json::from_str(&line).unwrap())
    }
}

#[tokio::test]
async fn the_socket_is_0600_and_unlinked_on_shutdown() {
    let dir = tempdir();
    let path = dir.path().join("r.sock");
    let server = IpcServer::bind(options(&path, BridgePolicy::DisplaceOld)).unwrap();
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // Next to it only its lock file: the private staging directory is gone.
    let mut entries: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert_eq!(entries, ["r.sock", "r.sock.lock"]);

    let task = serve(server);
    let mut peer = Peer::connect(&path).await;
    peer.send(json!({"kind": "mcp_request", "id": 1, "method": "tools/call", "params": {"name": "roster"}}))
        .await;
    assert_eq!(
        peer.recv().await.unwrap(),
        json!({"kind": "mcp_response", "id": 1, "result": {"content": [{"type": "text", "text": "roster"}]}})
    );
    within(5, "shutdown", task.shutdown(Some("agent-exited"))).await;
    assert_eq!(
        peer.recv().await.unwrap(),
        json!({"kind": "shutdown", "reason": "agent-exited"})
    );
    assert_eq!(peer.recv().await, None);
    assert!(!path.exists());
    assert!(
        !dir.path().join("r.sock.lock").exists(),
        "the lock file goes with the socket"
    );
}

#[tokio::test]
async fn a_refused_second_runner_does_not_disturb_the_first_ones_bridge() {
    let dir = tempdir();
    let path = dir.path().join("r.sock");
    let task = serve(IpcServer::bind(options(&path, BridgePolicy::DisplaceOld)).unwrap());
    let mut bridge = Peer::connect(&path).await;
    bridge
        .send(json!({"kind": "mcp_request", "id": 1, "method": "tools/call", "params": {"name": "a"}}))
        .await;
    assert_eq!(bridge.recv().await.unwrap()["id"], 1);
    // Refused by the lock: no probe connection reaches the live runner, so nothing is displaced.
    let err = IpcServer::bind(options(&path, BridgePolicy::DisplaceOld)).unwrap_err();
    assert!(matches!(err, BindError::InUse { .. }), "{err:?}");
    bridge
        .send(json!({"kind": "mcp_request", "id": 2, "method": "tools/call", "params": {"name": "b"}}))
        .await;
    let answer = bridge.recv().await.unwrap();
    assert_eq!(
        answer["kind"], "mcp_response",
        "still attached, not displaced: {answer}"
    );
    assert_eq!(answer["id"], 2);
    within(5, "shutdown", task.shutdown(None)).await;
}

#[tokio::test]
async fn a_second_runner_on_the_same_path_is_refused() {
    let dir = tempdir();
    let path = dir.path().join("r.sock");
    let task = serve(IpcServer::bind(options(&path, BridgePolicy::DisplaceOld)).unwrap());
    let err = IpcServer::bind(options(&path, BridgePolicy::DisplaceOld)).unwrap_err();
    assert!(matches!(err, BindError::InUse { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "another runner is already listening on {}: stop it, or use another socket path",
            path.display()
        )
    );
    // The first one still serves.
    let mut peer = Peer::connect(&path).await;
    peer.send(json!({"kind": "mcp_request", "id": 1, "method": "resources/list"}))
        .await;
    let answer = peer.recv().await.unwrap();
    assert_eq!(answer["error"]["code"], -32601, "{answer}");
    task.abort().await;
    // Aborting (a dying runner) still unlinks the socket.
    assert!(!path.exists());
}

#[tokio::test]
async fn a_stale_socket_is_replaced_but_other_files_are_not() {
    let dir = tempdir();
    let path = dir.path().join("r.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let server = IpcServer::bind(options(&path, BridgePolicy::DisplaceOld)).unwrap();
    let task = serve(server);
    let mut peer = Peer::connect(&path).await;
    peer.send(
        json!({"kind": "mcp_request", "id": 3, "method": "tools/call", "params": {"name": "x"}}),
    )
    .await;
    assert_eq!(peer.recv().await.unwrap()["id"], 3);
    task.abort().await;

    let file = dir.path().join("file.sock");
    std::fs::write(&file, "precious").unwrap();
    let err = IpcServer::bind(options(&file, BridgePolicy::DisplaceOld)).unwrap_err();
    assert!(matches!(err, BindError::NotASocket { .. }), "{err:?}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "precious");
}

#[tokio::test]
async fn a_path_too_long_for_a_socket_is_refused_clearly() {
    let long = Path::new("/tmp").join("d".repeat(MAX_SOCKET_PATH_BYTES));
    let err = IpcServer::bind(options(&long, BridgePolicy::DisplaceOld)).unwrap_err();
    assert!(matches!(err, BindError::PathTooLong { .. }), "{err:?}");
    assert!(err.to_string().contains("more than the 107"), "{err}");
}

#[tokio::test]
async fn displace_old_shuts_the_old_bridge_down() {
    let dir = tempdir();
    let path = dir.path().join("r.sock");
    let task = serve(IpcServer::bind(options(&path, BridgePolicy::DisplaceOld)).unwrap());
    let mut old = Peer::connect(&path).await;
    old.send(
        json!({"kind": "mcp_request", "id": 1, "method": "tools/call", "params": {"name": "a"}}),
    )
    .await;
    assert_eq!(old.recv().await.unwrap()["id"], 1);
    let mut new = Peer::connect(&path).await;
    assert_eq!(
        old.recv().await.unwrap(),
        json!({"kind": "shutdown", "reason": "displaced-by-new-bridge"})
    );
    // The displaced bridge is read until it goes (a bridge leaves on `shutdown`).
    drop(old);
    new.send(
        json!({"kind": "mcp_request", "id": 1, "method": "tools/call", "params": {"name": "b"}}),
    )
    .await;
    assert_eq!(
        new.recv().await.unwrap()["result"]["content"][0]["text"],
        "b"
    );
    task.abort().await;
}

#[tokio::test]
async fn reject_new_refuses_the_second_bridge() {
    let dir = tempdir();
    let path = dir.path().join("r.sock");
    let task = serve(IpcServer::bind(options(&path, BridgePolicy::RejectNew)).unwrap());
    let mut first = Peer::connect(&path).await;
    first
        .send(json!({"kind": "mcp_request", "id": 1, "method": "tools/call", "params": {"name": "a"}}))
        .await;
    assert_eq!(first.recv().await.unwrap()["id"], 1);
    let mut second = Peer::connect(&path).await;
    assert_eq!(
        second.recv().await.unwrap(),
        json!({"kind": "error", "message": "runner already attached"})
    );
    assert_eq!(second.recv().await, None);
    first
        .send(json!({"kind": "mcp_request", "id": 2, "method": "tools/call", "params": {"name": "b"}}))
        .await;
    assert_eq!(first.recv().await.unwrap()["id"], 2);
    task.abort().await;
}

#[tokio::test]
async fn a_panicking_handler_answers_internal_error() {
    let dir = tempdir();
    let path = dir.path().join("r.sock");
    let task = serve(IpcServer::bind(options(&path, BridgePolicy::DisplaceOld)).unwrap());
    let mut peer = Peer::connect(&path).await;
    // A handler that panics before its first wait, and one that panics after it.
    for (id, tool) in [(4, "panic"), (5, "panic-later")] {
        peer.send(json!({"kind": "mcp_request", "id": id, "method": "tools/call", "params": {"name": tool}}))
            .await;
        let answer = peer.recv().await.unwrap();
        assert_eq!(answer["id"], id);
        assert_eq!(answer["error"]["code"], -32603, "{answer}");
    }
    // And keeps serving.
    peer.send(
        json!({"kind": "mcp_request", "id": 6, "method": "tools/call", "params": {"name": "ok"}}),
    )
    .await;
    assert_eq!(peer.recv().await.unwrap()["id"], 6);
    task.abort().await;
}

#[tokio::test]
async fn notifications_wait_for_a_bridge_then_go_to_it() {
    let dir = tempdir();
    let path = dir.path().join("r.sock");
    let server = IpcServer::bind(options(&path, BridgePolicy::DisplaceOld)).unwrap();
    let handle = server.handle();
    handle.notify(mcp::TOOLS_LIST_CHANGED, None);
    let task = serve(server);
    let mut peer = Peer::connect(&path).await;
    assert_eq!(
        peer.recv().await.unwrap(),
        json!({"kind": "mcp_notification", "method": "notifications/tools/list_changed", "seq": 1})
    );
    let params =
        ac7_protocol::codec::json::RawJson::from_text(r#"{"content":"hi","meta":{"from":"bob"}}"#)
            .unwrap();
    handle.notify(mcp::CLAUDE_CHANNEL, Some(params));
    assert_eq!(
        peer.recv().await.unwrap(),
        json!({"kind": "mcp_notification", "method": "notifications/claude/channel", "params": {"content": "hi", "meta": {"from": "bob"}}, "seq": 2})
    );
    task.abort().await;
}

#[tokio::test]
async fn a_bridge_that_reads_late_gets_every_notification_in_order() {
    let dir = tempdir();
    let path = dir.path().join("r.sock");
    let server = IpcServer::bind(options(&path, BridgePolicy::DisplaceOld)).unwrap();
    let handle = server.handle();
    let task = serve(server);
    let mut late = Peer::connect(&path).await;
    // 2 MiB of notifications: far more than the socket buffers hold, so the runner's writes
    // find the socket full and have to wait until the bridge reads again.
    let content = "n".repeat(16 * 1024);
    for _ in 0..128 {
        let params = ac7_protocol::codec::json::RawJson::from_value(
            &json!({"content": content, "meta": {}}),
        )
        .unwrap();
        handle.notify(mcp::CLAUDE_CHANNEL, Some(params));
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for seq in 1..=128u64 {
        let frame = late.recv().await.unwrap();
        assert_eq!(frame["seq"], seq);
        assert_eq!(frame["params"]["content"], content.as_str());
    }
    // Still served both ways afterwards.
    late.send(json!({"kind": "mcp_request", "id": 7, "method": "tools/call", "params": {"name": "roster"}}))
        .await;
    let answer = late.recv().await.unwrap();
    assert_eq!(answer["kind"], "mcp_response", "{answer}");
    assert_eq!(answer["id"], 7, "{answer}");
    task.abort().await;
}

#[tokio::test]
async fn a_bridge_that_stops_reading_is_dropped_once_its_backlog_is_full() {
    let dir = tempdir();
    let path = dir.path().join("r.sock");
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let server = IpcServer::bind(IpcServerOptions {
        max_backlog_bytes: 256 * 1024,
        events: Some(events_tx),
        ..options(&path, BridgePolicy::DisplaceOld)
    })
    .unwrap();
    let handle = server.handle();
    let task = serve(server);
    // Connected, never reading.
    let mut deaf = Peer::connect(&path).await;
    let content = "n".repeat(10 * 1024);
    for _ in 0..2000 {
        let params = ac7_protocol::codec::json::RawJson::from_value(
            &json!({"content": content, "meta": {}}),
        )
        .unwrap();
        handle.notify(mcp::CLAUDE_CHANNEL, Some(params));
    }
    let reason = within(10, "the runner to drop the deaf bridge", async {
        loop {
            if let Some(ac7_protocol::session::runner::RunnerEvent::Detached { reason, .. }) =
                events.recv().await
            {
                return reason;
            }
        }
    })
    .await;
    assert_eq!(reason, ac7_protocol::session::runner::DetachReason::Closed);
    // What reaches the peer is bounded by the socket buffers and the backlog, then EOF.
    let mut received = 0usize;
    while let Some(frame) = deaf.recv().await {
        assert_eq!(frame["method"], "notifications/claude/channel");
        received += 1;
    }
    assert!(received < 2000, "all {received} notifications were queued");
    task.abort().await;
}
