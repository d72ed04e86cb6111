//! The runner-side socket server on real sockets, with raw connections playing the bridge.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns are test code too

use crate::common;

use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use ac7_protocol::codec::jsonrpc::{Outcome, RpcError};
use ac7_protocol::dialect::mcp;
use ac7_protocol::session::mcp_bridge::BridgeConfig;
use ac7_protocol::session::runner::{BridgePolicy, IncomingRequest, RunnerConfig};
use ac7_runtime::runner::ipc_server::{
    BindError, IpcServer, IpcServerOptions, MAX_SOCKET_PATH_BYTES, RunnerHandle, ServerTask,
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

impl From<UnixStream> for Peer {
    fn from(stream: UnixStream) -> Self {
        let (read, write) = stream.into_split();
        Self {
            lines: BufReader::new(read).lines(),
            write,
        }
    }
}

impl Peer {
    async fn connect(path: &Path) -> Self {
        let stream = within(5, "connecting", UnixStream::connect(path))
            .await
            .unwrap();
        Self::from(stream)
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

/// Pushes the channel event `{"content":"hi","meta":{"from":"bob"}}`.
fn push_hi_from_bob(handle: &RunnerHandle) {
    let params =
        ac7_protocol::codec::json::RawJson::from_text(r#"{"content":"hi","meta":{"from":"bob"}}"#)
            .unwrap();
    handle.notify(mcp::CLAUDE_CHANNEL, Some(params));
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
    push_hi_from_bob(&handle);
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

/// A raw bridge that hands over its stdio: the socket it holds, and the agent's ends of the two
/// pipes it handed over (the runner reads what the agent writes, and writes what it reads).
struct HandedOver {
    socket: Peer,
    agent_writes: std::io::PipeWriter,
    agent_reads: Lines<BufReader<tokio::net::unix::pipe::Receiver>>,
}

/// Connects to `path` and hands over the read end of one pipe as stdin and the write end of
/// another as stdout, as `ac7 mcp-bridge` does.
async fn hand_over(path: &Path) -> HandedOver {
    let (stdin, agent_writes) = std::io::pipe().unwrap();
    let (agent_reads, stdout) = std::io::pipe().unwrap();
    let socket = send_handoff(path, &[stdin.as_fd(), stdout.as_fd()]).await;
    let agent_reads =
        tokio::net::unix::pipe::Receiver::from_owned_fd(std::os::fd::OwnedFd::from(agent_reads))
            .unwrap();
    HandedOver {
        socket,
        agent_writes,
        agent_reads: BufReader::new(agent_reads).lines(),
    }
}

/// Connects and sends the handoff line with `fds` attached.
async fn send_handoff(path: &Path, fds: &[std::os::fd::BorrowedFd<'_>]) -> Peer {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    let stream = std::os::unix::net::UnixStream::connect(path).unwrap();
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    let line = ac7_protocol::codec::frame::STDIO_HANDOFF;
    let sent = sendmsg(
        &stream,
        &[std::io::IoSlice::new(line)],
        &mut control,
        SendFlags::empty(),
    )
    .unwrap();
    assert_eq!(sent, line.len());
    stream.set_nonblocking(true).unwrap();
    Peer::from(UnixStream::from_std(stream).unwrap())
}

impl HandedOver {
    fn send(&mut self, message: Value) {
        use std::io::Write;
        writeln!(self.agent_writes, "{message}").unwrap();
    }

    /// The next line the agent reads, or `None` once its stdout closed.
    async fn recv(&mut self) -> Option<Value> {
        let line = within(5, "a line for the agent", self.agent_reads.next_line())
            .await
            .unwrap()?;
        Some(serde_json::from_str(&line).unwrap())
    }
}

fn handoff_options(path: &Path) -> IpcServerOptions {
    IpcServerOptions {
        stdio_handoff: Some(BridgeConfig {
            start_grace: std::time::Duration::from_millis(20),
            ..BridgeConfig::default()
        }),
        ..options(path, BridgePolicy::DisplaceOld)
    }
}

/// A server at `<dir>/r.sock` with the handoff on and `tools/list_changed` queued before any
/// bridge connected (delivered once the agent is ready), serving.
fn serving_with_a_queued_notification() -> (tempfile::TempDir, RunnerHandle, ServerTask) {
    let dir = tempdir();
    let server = IpcServer::bind(handoff_options(&dir.path().join("r.sock"))).unwrap();
    let handle = server.handle();
    handle.notify(mcp::TOOLS_LIST_CHANGED, None);
    (dir, handle, serve(server))
}

fn initialize(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
}

#[tokio::test]
async fn a_bridge_that_hands_over_its_stdio_has_its_agent_served_by_the_runner() {
    let (dir, handle, task) = serving_with_a_queued_notification();
    let mut agent = hand_over(&dir.path().join("r.sock")).await;

    agent.send(initialize(0));
    let init = agent.recv().await.unwrap();
    assert_eq!(init["id"], 0);
    assert_eq!(
        init["result"]["capabilities"]["experimental"]["claude/channel"],
        json!({})
    );
    agent.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    agent.send(
        json!({"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": {"name": "roster"}}),
    );
    assert_eq!(
        agent.recv().await.unwrap(),
        json!({"jsonrpc": "2.0", "id": "a", "result": {"content": [{"type": "text", "text": "roster"}]}})
    );
    agent.send(json!({"jsonrpc": "2.0", "id": 7, "method": "resources/list"}));
    assert_eq!(
        agent.recv().await.unwrap(),
        json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32601, "message": "Method not found: resources/list"}})
    );
    agent.send(json!({"jsonrpc": "2.0", "id": 8, "method": "tools/list"}));
    assert_eq!(
        agent.recv().await.unwrap()["id"],
        8,
        "answered by the runner's handler"
    );
    // After the start-up grace, the queued notification, then a live one, in order.
    assert_eq!(
        agent.recv().await.unwrap(),
        json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    );
    push_hi_from_bob(&handle);
    assert_eq!(
        agent.recv().await.unwrap(),
        json!({"jsonrpc": "2.0", "method": "notifications/claude/channel", "params": {"content": "hi", "meta": {"from": "bob"}}})
    );
    // A malformed line is answered and dropped; the session goes on.
    agent.send(json!("not a request"));
    assert_eq!(agent.recv().await.unwrap()["error"]["code"], -32600);

    // The agent closes its end: the runner ends the session, closes the agent's stdout and
    // tells the bridge process why.
    let HandedOver {
        mut socket,
        agent_writes,
        mut agent_reads,
    } = agent;
    drop(agent_writes);
    assert_eq!(
        within(5, "the agent's stdout to close", agent_reads.next_line())
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        socket.recv().await.unwrap(),
        json!({"kind": "shutdown", "reason": "stdio-closed"})
    );
    assert_eq!(socket.recv().await, None);
    task.abort().await;
}

#[tokio::test]
async fn a_stopped_bridge_ends_its_session_and_the_stdio_is_blocking_again() {
    let dir = tempdir();
    let path = dir.path().join("r.sock");
    let server = IpcServer::bind(handoff_options(&path)).unwrap();
    // `hang` never answers: it is pending when the bridge is told to stop.
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let hanging = std::sync::Arc::clone(&started);
    let task = server.serve(move |req: IncomingRequest| {
        let hanging = std::sync::Arc::clone(&hanging);
        async move {
            if mcp::tool_call_name(req.params.as_ref()) == "hang" {
                hanging.notify_one();
                std::future::pending::<()>().await;
            }
            Outcome::Result(mcp::tool_text("ok"))
        }
    });
    // One socket as both stdin and stdout, as Node gives its children; the agent keeps a second
    // descriptor of the handed-over end to see its mode.
    let (agent_side, bridge_side) = std::os::unix::net::UnixStream::pair().unwrap();
    let kept = bridge_side.try_clone().unwrap();
    let mut socket = send_handoff(&path, &[bridge_side.as_fd(), bridge_side.as_fd()]).await;
    drop(bridge_side);
    agent_side.set_nonblocking(true).unwrap();
    let mut agent = Peer::from(UnixStream::from_std(agent_side).unwrap());
    agent.send(initialize(0)).await;
    assert_eq!(agent.recv().await.unwrap()["id"], 0);
    assert!(
        common::is_nonblocking(&kept),
        "served without blocking the runner"
    );
    agent
        .send(
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "hang"}}),
        )
        .await;
    within(5, "the call to reach the runner", started.notified()).await;
    // Nothing answers it until the bridge process is told to stop (SIGTERM, passed on).
    socket
        .send(json!({"kind": "shutdown", "reason": "terminated"}))
        .await;
    let answer = agent.recv().await.unwrap();
    assert_eq!(answer["id"], 1);
    assert!(answer.get("error").is_some(), "{answer}");
    assert_eq!(
        socket.recv().await.unwrap(),
        json!({"kind": "shutdown", "reason": "terminated"})
    );
    assert_eq!(socket.recv().await, None);
    assert!(
        !common::is_nonblocking(&kept),
        "blocking again once handed back"
    );
    // The runner closed its descriptors: with the agent's own (the bridge process's) gone too,
    // the agent reads EOF.
    drop(kept);
    assert_eq!(agent.recv().await, None, "the agent's stdout closed");
    task.abort().await;
}

#[tokio::test]
async fn a_runner_that_shuts_down_ends_the_served_stdio_and_a_plain_bridge_still_works() {
    let (dir, _handle, task) = serving_with_a_queued_notification();
    let path = dir.path().join("r.sock");
    // A bridge that does not hand over (another implementation): frames as always, the queued
    // notification once it spoke.
    let mut plain = Peer::connect(&path).await;
    plain.send(json!({"kind": "ack", "seq": 0})).await;
    assert_eq!(
        plain.recv().await.unwrap(),
        json!({"kind": "mcp_notification", "method": "notifications/tools/list_changed", "seq": 1})
    );
    plain
        .send(json!({"kind": "mcp_request", "id": 1, "method": "tools/call", "params": {"name": "x"}}))
        .await;
    assert_eq!(
        plain.recv().await.unwrap(),
        json!({"kind": "mcp_response", "id": 1, "result": {"content": [{"type": "text", "text": "x"}]}})
    );
    // A bridge that hands over displaces it, as any new bridge of the agent does.
    let mut agent = hand_over(&path).await;
    assert_eq!(
        plain.recv().await.unwrap(),
        json!({"kind": "shutdown", "reason": "displaced-by-new-bridge"})
    );
    agent.send(initialize(0));
    assert_eq!(agent.recv().await.unwrap()["id"], 0);
    within(5, "shutdown", task.shutdown(Some("agent-exited"))).await;
    assert_eq!(agent.recv().await, None, "the agent's stdout closed");
    assert_eq!(
        agent.socket.recv().await.unwrap(),
        json!({"kind": "shutdown", "reason": "runner-shutdown"})
    );
    assert_eq!(agent.socket.recv().await, None);
}
