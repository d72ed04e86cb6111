//! The real `ac7 mcp-bridge` with piped stdio, this test playing the agent byte for byte: the
//! cases an SDK cannot produce (garbage, oversized lines, string ids), start-up errors, teardown
//! triggers, and a raw runner side sending garbage.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns are test code too

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use ac7_protocol::session::runner::{BridgePolicy, DetachReason, RunnerEvent};
use common::{Bridge, ac7, start_runner, tempdir, within};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

/// Runs `ac7 mcp-bridge` with the given socket variable (`None`: unset) and stdin closed.
async fn bridge_once(socket: Option<&str>) -> (i32, String, String) {
    let mut cmd = tokio::process::Command::new(ac7());
    cmd.arg("mcp-bridge")
        .env_remove("AC7_RUNNER_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(socket) = socket {
        cmd.env("AC7_RUNNER_SOCKET", socket);
    }
    let out = within(8, "the bridge to give up", cmd.output())
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn without_the_socket_variable_it_exits_1_with_one_clear_line() {
    for socket in [None, Some("")] {
        let (code, stdout, stderr) = bridge_once(socket).await;
        assert_eq!(code, 1, "{stderr}");
        assert_eq!(stdout, "");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("ac7 mcp-bridge: AC7_RUNNER_SOCKET is not set"),
            "{stderr}"
        );
        assert!(stderr.contains("ac7 claude-code"), "{stderr}");
        assert!(stderr.contains("ac7 run -- <cmd>"), "{stderr}");
    }
}

#[tokio::test]
async fn a_socket_nobody_listens_on_fails_clearly() {
    let dir = tempdir();
    // Nothing at the path.
    let missing = dir.path().join("missing.sock");
    // A stale socket file: bound, then its listener closed.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    for path in [missing, stale] {
        let started = Instant::now();
        let (code, stdout, stderr) = bridge_once(Some(path.to_str().unwrap())).await;
        assert_eq!(code, 1, "{stderr}");
        assert_eq!(stdout, "");
        let expected = format!(
            "ac7 mcp-bridge: failed to connect to runner at {}: ",
            path.display()
        );
        assert!(stderr.starts_with(&expected), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        eprintln!("gave up after {:?}: {}", started.elapsed(), stderr.trim());
    }
}

#[tokio::test]
async fn ids_zero_and_strings_and_params_pass_through_byte_exact() {
    let dir = tempdir();
    let runner = start_runner(dir.path(), BridgePolicy::DisplaceOld);
    let mut bridge = Bridge::spawn(&runner.path);

    let init = bridge.initialize().await;
    assert_eq!(init["id"], 0);
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(init["result"]["serverInfo"]["name"], "ac7");
    assert_eq!(
        init["result"]["capabilities"],
        json!({"experimental": {"claude/channel": {}}, "tools": {"listChanged": true}})
    );

    let ping = bridge.request(json!("p-1"), "ping", Value::Null).await;
    assert_eq!(ping["result"], json!({}));

    // Odd spacing and key order survive: the runner sees the params text verbatim.
    let params = r#"{ "name":"echo", "arguments":{"b":2,"a":[1, 2]}, "_meta":{"progressToken":"tok-9","x":null} }"#;
    bridge
        .send(&format!(
            r#"{{"jsonrpc":"2.0","id":"call-α","method":"tools/call","params":{params}}}"#
        ))
        .await;
    let answer = bridge.recv().await;
    assert_eq!(answer["id"], "call-α");
    assert_eq!(answer["result"]["content"][0]["text"], params);

    bridge.close_stdin();
    let (code, rest, _) = bridge.exit().await;
    assert_eq!((code, rest.len()), (0, 0));
}

#[tokio::test]
async fn a_garbage_line_gets_parse_error_and_the_next_request_works() {
    let dir = tempdir();
    let runner = start_runner(dir.path(), BridgePolicy::DisplaceOld);
    let mut bridge = Bridge::spawn(&runner.path);
    bridge.initialize().await;

    bridge.send("this is not json {").await;
    let answer = bridge.recv().await;
    assert_eq!(answer["id"], Value::Null);
    assert_eq!(answer["error"]["code"], -32700, "{answer}");

    let list = bridge.request(json!(1), "tools/list", Value::Null).await;
    assert_eq!(list["result"]["tools"].as_array().unwrap().len(), 31);
}

#[tokio::test]
async fn oversized_requests_are_answered_and_the_bridge_keeps_serving() {
    let dir = tempdir();
    let runner = start_runner(dir.path(), BridgePolicy::DisplaceOld);
    let mut bridge = Bridge::spawn(&runner.path);
    bridge.initialize().await;

    // Over the 1 MiB IPC frame cap: answered under its own id, never forwarded.
    let big = "y".repeat(2 << 20);
    let answer = bridge
        .request(
            json!(7),
            "tools/call",
            json!({"name": "echo", "arguments": {"big": big}}),
        )
        .await;
    assert_eq!(answer["error"]["code"], -32603, "{}", answer["error"]);
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("too large"), "{message}");

    // Over the 16 MiB line cap: discarded as it streams, answered with a null id.
    let mut huge = Vec::with_capacity(17 << 20);
    huge.extend_from_slice(br#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"x":""#);
    huge.resize(17 << 20, b'z');
    huge.extend_from_slice(b"\"}}\n");
    bridge.write(&huge).await;
    let answer = bridge.recv().await;
    assert_eq!(answer["id"], Value::Null);
    assert_eq!(answer["error"]["code"], -32600, "{answer}");

    let list = bridge.request(json!(9), "tools/list", Value::Null).await;
    assert_eq!(list["result"]["tools"].as_array().unwrap().len(), 31);
    assert_eq!(runner.script.methods(), ["tools/list"]);
}

#[tokio::test]
async fn a_result_too_large_for_a_frame_becomes_an_is_error_result() {
    let dir = tempdir();
    let runner = start_runner(dir.path(), BridgePolicy::DisplaceOld);
    let mut bridge = Bridge::spawn(&runner.path);
    bridge.initialize().await;
    let answer = bridge
        .request(
            json!(1),
            "tools/call",
            json!({"name": "huge", "arguments": {}}),
        )
        .await;
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("huge: result too large ("), "{text}");
    // Still serving.
    let answer = bridge
        .request(
            json!(2),
            "tools/call",
            json!({"name": "fail", "arguments": {}}),
        )
        .await;
    assert_eq!(answer["result"]["isError"], true);
}

#[tokio::test]
async fn stdin_eof_exits_zero_and_tells_the_runner() {
    let dir = tempdir();
    let mut runner = start_runner(dir.path(), BridgePolicy::DisplaceOld);
    let mut bridge = Bridge::spawn(&runner.path);
    bridge.initialize().await;
    bridge.close_stdin();
    let (code, rest, stderr) = bridge.exit().await;
    assert_eq!(code, 0, "{stderr}");
    assert!(rest.is_empty(), "{rest:?}");
    let detached = within(5, "the runner to see the bridge go", async {
        loop {
            if let Some(RunnerEvent::Detached { reason, .. }) = runner.events.recv().await {
                return reason;
            }
        }
    })
    .await;
    assert_eq!(
        detached,
        DetachReason::BridgeShutdown {
            reason: Some("stdio-closed".into())
        }
    );
}

/// Starts a call that the runner never answers and waits until the runner has it.
async fn pending_call(bridge: &mut Bridge, runner: &mut common::Runner) {
    bridge
        .send(r#"{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"die","arguments":{}}}"#)
        .await;
    within(5, "the runner to receive the call", runner.die_rx.recv()).await;
}

fn assert_pending_failed(rest: &[Value], why: &str) {
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert_eq!(rest[0]["id"], 41);
    assert_eq!(rest[0]["error"]["code"], -32603);
    let message = rest[0]["error"]["message"].as_str().unwrap();
    assert!(message.contains(why), "{message}");
}

#[tokio::test]
async fn runner_shutdown_answers_what_is_pending_and_exits_zero() {
    let dir = tempdir();
    let mut runner = start_runner(dir.path(), BridgePolicy::DisplaceOld);
    let mut bridge = Bridge::spawn(&runner.path);
    bridge.initialize().await;
    pending_call(&mut bridge, &mut runner).await;
    runner.handle.shutdown(Some("agent-exited"));
    let (code, rest, stderr) = bridge.exit().await;
    assert_eq!(code, 0, "{stderr}");
    assert_pending_failed(&rest, "the runner shut down (agent-exited)");
    // Stopping unlinked the socket file.
    within(5, "the runner to stop", runner.task.stopped()).await;
    assert!(!runner.path.exists());
}

#[tokio::test]
async fn sigterm_and_sigint_answer_what_is_pending_and_exit_zero() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let dir = tempdir();
        let mut runner = start_runner(dir.path(), BridgePolicy::DisplaceOld);
        let mut bridge = Bridge::spawn(&runner.path);
        bridge.initialize().await;
        pending_call(&mut bridge, &mut runner).await;
        let pid = libc::pid_t::try_from(bridge.pid()).unwrap();
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let (code, rest, stderr) = bridge.exit().await;
        assert_eq!(code, 0, "signal {signal}: {stderr}");
        assert_pending_failed(&rest, "the bridge was terminated");
    }
}

/// A raw runner: whatever the test writes, byte for byte.
async fn raw_runner(path: &Path) -> UnixListener {
    UnixListener::bind(path).unwrap()
}

#[tokio::test]
async fn garbage_oversized_and_unmatched_frames_from_the_runner_are_dropped() {
    let dir = tempdir();
    let path = dir.path().join("raw.sock");
    let listener = raw_runner(&path).await;
    let mut bridge = Bridge::spawn(&path);
    let (socket, _) = within(5, "the bridge to connect", listener.accept())
        .await
        .unwrap();
    let (read, mut write) = socket.into_split();
    let mut frames = BufReader::new(read).lines();
    bridge.initialize().await;

    // First on the socket: the bridge says it acknowledges the notifications it writes.
    let hello = within(5, "the bridge's first frame", frames.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(hello, r#"{"kind":"ack","seq":0}"#);
    bridge
        .send(r#"{"jsonrpc":"2.0","id":"a","method":"tools/list"}"#)
        .await;
    let frame = within(5, "the forwarded request", frames.next_line())
        .await
        .unwrap()
        .unwrap();
    let frame: Value = serde_json::from_str(&frame).unwrap();
    assert_eq!(frame["kind"], "mcp_request");
    assert_eq!(frame["method"], "tools/list");
    assert!(frame.get("params").is_none(), "{frame}");
    let id = frame["id"].as_u64().unwrap();
    // The bridge's own size (code, runtime, buffers) before any junk: the junk must not add to it.
    let before_kib = common::procfs::peak_rss_kib(bridge.pid()).unwrap();

    let mut junk: Vec<u8> = Vec::new();
    junk.extend_from_slice(b"not json at all\n");
    junk.extend_from_slice(b"[1,2,3]\n");
    junk.extend_from_slice(b"{\"kind\":\"surprise\"}\n");
    junk.extend_from_slice(b"\xff\xfe\n");
    junk.extend_from_slice(b"{\"kind\":\"mcp_response\",\"id\":999,\"result\":{}}\n");
    // 3 MiB without a newline, then the newline: discarded as it streams.
    junk.resize(junk.len() + (3 << 20), b'{');
    junk.push(b'\n');
    within(10, "writing junk to the bridge", write.write_all(&junk))
        .await
        .unwrap();
    // 48 MiB in one line: if it were buffered, the bridge's memory would show it.
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..48 {
        within(10, "writing a long line", write.write_all(&chunk))
            .await
            .unwrap();
    }
    write.write_all(b"\n").await.unwrap();
    let answer = format!("{{\"kind\":\"mcp_response\",\"id\":{id},\"result\":{{\"tools\":[]}}}}\n");
    write.write_all(answer.as_bytes()).await.unwrap();

    let answer = bridge.recv().await;
    assert_eq!(
        answer,
        json!({"jsonrpc": "2.0", "id": "a", "result": {"tools": []}})
    );
    let peak_kib = common::procfs::peak_rss_kib(bridge.pid()).unwrap();
    eprintln!(
        "bridge peak RSS before junk {before_kib} KiB, after 51 MiB of runner-side junk: {peak_kib} KiB"
    );
    // Reading in bounded chunks costs up to ~2 MiB; holding the 3 MiB line would show as more
    // than 4, the 48 MiB one as tens of MiB.
    assert!(
        peak_kib < before_kib + 4 * 1024,
        "bridge peak RSS {before_kib} -> {peak_kib} KiB: runner-side junk was buffered"
    );

    // Still serving.
    bridge
        .send(r#"{"jsonrpc":"2.0","id":"b","method":"tools/call","params":{"name":"x"}}"#)
        .await;
    let frame = within(5, "the second request", frames.next_line())
        .await
        .unwrap()
        .unwrap();
    let frame: Value = serde_json::from_str(&frame).unwrap();
    let id = frame["id"].as_u64().unwrap();
    let answer = format!(
        "{{\"kind\":\"mcp_response\",\"id\":{id},\"error\":{{\"code\":-32601,\"message\":\"nope\"}}}}\n"
    );
    write.write_all(answer.as_bytes()).await.unwrap();
    let answer = bridge.recv().await;
    assert_eq!(answer["id"], "b");
    assert_eq!(answer["error"]["code"], -32601);

    // Closing the socket ends the bridge; every dropped line was logged.
    drop(write);
    drop(frames);
    let (code, rest, stderr) = bridge.exit().await;
    assert_eq!(code, 0);
    assert!(rest.is_empty(), "{rest:?}");
    let drops = stderr
        .lines()
        .filter(|l| l.contains("dropped malformed IPC frame"))
        .count();
    assert_eq!(drops, 6, "{stderr}");
    assert!(stderr.contains("\"id\":999"), "{stderr}");
    for line in stderr.lines() {
        let _: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    }
}

/// Spawns the bridge with the given stdin, sends `lines` through `write` (if any), and returns
/// the exit code and every stdout line.
async fn bridge_with_stdin(
    socket: &Path,
    stdin: Stdio,
    write: Option<(Box<dyn std::io::Write + Send>, &'static str)>,
) -> (i32, Vec<Value>) {
    let mut child = tokio::process::Command::new(ac7())
        .arg("mcp-bridge")
        .env("AC7_RUNNER_SOCKET", socket)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    if let Some((mut writer, lines)) = write {
        writer.write_all(lines.as_bytes()).unwrap();
        // Dropping the writer is the agent's EOF.
    }
    let mut lines = BufReader::new(stdout).lines();
    let mut out = Vec::new();
    while let Some(line) = within(5, "the bridge's stdout", lines.next_line())
        .await
        .unwrap()
    {
        out.push(serde_json::from_str(&line).unwrap());
    }
    let status = within(5, "the bridge to exit", child.wait()).await.unwrap();
    (status.code().unwrap_or(-1), out)
}

const INIT_AND_PING: &str = concat!(
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05"}}"#,
    "\n",
    r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#,
    "\n",
);

fn assert_init_and_ping(code: i32, out: &[Value]) {
    assert_eq!(code, 0);
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(out[0]["result"]["protocolVersion"], "2024-11-05");
    assert_eq!(out[1], json!({"jsonrpc": "2.0", "id": 2, "result": {}}));
}

#[tokio::test]
async fn stdin_may_be_a_pipe_a_socket_or_a_file_and_blocking_mode_is_restored() {
    let dir = tempdir();
    let runner = start_runner(dir.path(), BridgePolicy::DisplaceOld);

    // A pipe (Python, Rust, most agents).
    let (reader, writer) = std::io::pipe().unwrap();
    let kept = reader.try_clone().unwrap();
    let (code, out) = bridge_with_stdin(
        &runner.path,
        Stdio::from(reader),
        Some((Box::new(writer), INIT_AND_PING)),
    )
    .await;
    assert_init_and_ping(code, &out);
    assert!(
        !common::is_nonblocking(&kept),
        "the pipe was left non-blocking"
    );

    // A socketpair (Node's child_process).
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let kept = theirs.try_clone().unwrap();
    let (code, out) = bridge_with_stdin(
        &runner.path,
        Stdio::from(std::os::fd::OwnedFd::from(theirs)),
        Some((Box::new(ours), INIT_AND_PING)),
    )
    .await;
    assert_init_and_ping(code, &out);
    assert!(
        !common::is_nonblocking(&kept),
        "the socket was left non-blocking"
    );

    // A regular file: read by the fallback thread.
    let file = dir.path().join("requests.jsonl");
    std::fs::write(&file, INIT_AND_PING).unwrap();
    let stdin = std::fs::File::open(&file).unwrap();
    let (code, out) = bridge_with_stdin(&runner.path, Stdio::from(stdin), None).await;
    assert_init_and_ping(code, &out);
}

#[tokio::test]
async fn one_socket_as_both_stdin_and_stdout_stays_blocking() {
    let dir = tempdir();
    let runner = start_runner(dir.path(), BridgePolicy::DisplaceOld);
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let kept = theirs.try_clone().unwrap();
    let stdout = theirs.try_clone().unwrap();
    let mut child = tokio::process::Command::new(ac7())
        .arg("mcp-bridge")
        .env("AC7_RUNNER_SOCKET", &runner.path)
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(stdout)))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    ours.set_nonblocking(true).unwrap();
    let ours = tokio::net::UnixStream::from_std(ours).unwrap();
    let (read, mut write) = ours.into_split();
    write.write_all(INIT_AND_PING.as_bytes()).await.unwrap();
    let mut lines = BufReader::new(read).lines();
    let mut out = Vec::new();
    for _ in 0..2 {
        let line = within(5, "an answer", lines.next_line())
            .await
            .unwrap()
            .unwrap();
        out.push(serde_json::from_str::<Value>(&line).unwrap());
        // While the bridge runs, its stdin (= stdout) is still blocking.
        assert!(
            !common::is_nonblocking(&kept),
            "stdin/stdout was made non-blocking"
        );
    }
    drop(write);
    let status = within(5, "the bridge to exit", child.wait()).await.unwrap();
    assert_init_and_ping(status.code().unwrap_or(-1), &out);
}

#[tokio::test]
async fn a_runner_that_reads_late_gets_every_request_in_order() {
    let dir = tempdir();
    let path = dir.path().join("late.sock");
    let listener = raw_runner(&path).await;
    let mut bridge = Bridge::spawn(&path);
    let (late, _) = within(5, "the bridge to connect", listener.accept())
        .await
        .unwrap();
    bridge.initialize().await;

    // 3.5 MiB of requests: more than the socket buffers hold (so the bridge's writes find the
    // socket full and wait), less than the bridge's own bound (so it takes every one).
    let mut stdin = bridge.take_stdin();
    let filler = "f".repeat(896 * 1024);
    for id in 0..4 {
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"x","arguments":{{"f":"{filler}"}}}}}}"#
        );
        within(
            10,
            "the bridge to take a request",
            stdin.write_all(format!("{line}\n").as_bytes()),
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    let mut frames = BufReader::new(late).lines();
    let mut next = async || -> Value {
        let line = within(10, "a frame from the bridge", frames.next_line())
            .await
            .unwrap()
            .unwrap();
        serde_json::from_str(&line).unwrap()
    };
    assert_eq!(next().await, json!({"kind": "ack", "seq": 0}));
    let mut ids = Vec::new();
    for _ in 0..4 {
        let frame = next().await;
        assert_eq!(frame["kind"], "mcp_request");
        assert_eq!(frame["params"]["arguments"]["f"], filler.as_str());
        ids.push(frame["id"].as_u64().unwrap());
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    drop(stdin);
    let (code, _, stderr) = bridge.exit().await;
    assert_eq!(code, 0, "{stderr}");
}

#[tokio::test]
async fn a_runner_that_stops_reading_does_not_stall_the_bridge() {
    let dir = tempdir();
    let path = dir.path().join("deaf.sock");
    let listener = raw_runner(&path).await;
    let mut bridge = Bridge::spawn(&path);
    // Accepted, never read: the socket's buffers fill up.
    let (_deaf, _) = within(5, "the bridge to connect", listener.accept())
        .await
        .unwrap();
    bridge.initialize().await;

    // ~9 MiB of requests, more than the socket buffers and the bridge's own bound hold.
    let mut stdin = bridge.take_stdin();
    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let progress = std::sync::Arc::clone(&written);
    let writer = tokio::spawn(async move {
        let filler = "f".repeat(900 * 1024);
        for id in 0..10 {
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"x","arguments":{{"f":"{filler}"}}}}}}"#
            );
            if stdin
                .write_all(format!("{line}\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
            progress.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    // The bridge takes requests until its buffer for the deaf runner is full (4 MiB), so at
    // least four are taken; then it is stuck on the runner and must still hear the signal.
    common::wait_until(
        "the bridge to take four requests",
        std::time::Duration::from_secs(10),
        async || written.load(std::sync::atomic::Ordering::SeqCst) >= 4,
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;

    // SIGTERM is still handled: every request read so far is answered, then exit 0.
    let pid = libc::pid_t::try_from(bridge.pid()).unwrap();
    // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let (code, rest, stderr) = bridge.exit().await;
    writer.abort();
    assert_eq!(code, 0, "{stderr}");
    // Every request the bridge took (at least three of the four written) is answered once.
    assert!(rest.len() >= 3, "{} answered", rest.len());
    for (id, answer) in rest.iter().enumerate() {
        assert_eq!(answer["id"], id, "{answer}");
        assert_eq!(answer["error"]["code"], -32603, "{answer}");
    }
    eprintln!("{} requests answered at teardown", rest.len());
}
