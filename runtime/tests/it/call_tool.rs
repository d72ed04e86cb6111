//! `ac7 mcp-bridge --dialect call-tool` between an agent and a `call_tool` parent:
//! the official MCP Python SDK against a `CallToolHost`, and a raw fake parent for replies the
//! host never sends.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions

use crate::common;

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ac7_protocol::codec::length_prefixed;
use ac7_protocol::dialect::call_tool::{ToolSchema, decode_call};
use ac7_protocol::dialect::mcp;
use ac7_runtime::dialects::call_tool_host::{CallToolHost, HostPaths, RunningHost, ToolError};
use common::{Bridge, run_python, tempdir, within};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

fn schema(name: &str, input_schema: Value) -> ToolSchema {
    ToolSchema {
        name: name.into(),
        description: format!("the {name} tool"),
        input_schema,
    }
}

/// The test tools: `echo {text}`, `add {a, b}`, `slow {i}` (20 ms), `fail` (a tool error),
/// `flagged` (an `isError` result), `hang` (reports on `hung`, never answers).
fn host(paths: HostPaths, hung: mpsc::UnboundedSender<()>) -> RunningHost {
    let object = |props: Value, required: Value| json!({"type": "object", "properties": props, "required": required});
    let mut host = CallToolHost::new();
    host.tool(
        schema(
            "echo",
            object(json!({"text": {"type": "string"}}), json!(["text"])),
        ),
        |args: Value| async move { Ok(mcp::tool_text(args["text"].as_str().unwrap_or_default())) },
    )
    .tool(
        schema(
            "add",
            object(
                json!({"a": {"type": "integer"}, "b": {"type": "integer"}}),
                json!(["a", "b"]),
            ),
        ),
        |args: Value| async move {
            let sum = args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0);
            Ok(mcp::tool_text(&sum.to_string()))
        },
    )
    .tool(
        schema(
            "slow",
            object(json!({"i": {"type": "integer"}}), json!(["i"])),
        ),
        |args: Value| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(mcp::tool_text(&format!("slow {}", args["i"])))
        },
    )
    .tool(schema("fail", json!({"type": "object"})), |_| async {
        Err(ToolError::new("ZeroDivisionError", "division by zero"))
    })
    .tool(schema("flagged", json!({"type": "object"})), |_| async {
        Ok(mcp::tool_error("flagged by the tool"))
    })
    .tool(schema("hang", json!({"type": "object"})), move |_| {
        let hung = hung.clone();
        async move {
            let _ = hung.send(());
            std::future::pending().await
        }
    });
    host.start(paths).expect("start the call_tool host")
}

fn env<'a>(running: &'a RunningHost, work: &'a Path) -> [(&'static str, &'a Path); 3] {
    [
        ("AC7_TEST_SCHEMA", running.schema_path()),
        ("AC7_TEST_SOCKET", running.socket_path()),
        ("AC7_TEST_WORK", work),
    ]
}

#[tokio::test]
async fn sdk_session_against_a_call_tool_host() {
    let dir = tempdir();
    let (hung, _hung_rx) = mpsc::unbounded_channel();
    let running = host(HostPaths::in_dir(dir.path()), hung);
    let mode = std::fs::metadata(running.schema_path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "schema file mode {mode:o}");
    let mode = std::fs::metadata(running.socket_path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");

    let out = run_python("call_tool_agent.py", "main", &env(&running, dir.path())).await;
    assert_eq!(
        out["tools"],
        json!(["add", "echo", "fail", "flagged", "hang", "slow"])
    );
    assert_eq!(out["concurrent"], 8);
    // echo, add, nope, fail, flagged, 8 x slow; the invalid add never reached the parent.
    assert_eq!(running.requests(), 13);
    assert_eq!(
        running.pipelined_requests(),
        0,
        "the bridge put two requests on the wire at once"
    );

    let (schema, socket) = (
        running.schema_path().to_owned(),
        running.socket_path().to_owned(),
    );
    running.stop().await;
    assert!(!schema.exists() && !socket.exists(), "files left behind");
}

#[tokio::test]
async fn parent_restart_fails_the_call_in_flight_and_the_next_reconnects() {
    let dir = tempdir();
    let work = tempdir();
    let paths = HostPaths::in_dir(dir.path());
    let (hung, mut hung_rx) = mpsc::unbounded_channel();
    let first = host(paths.clone(), hung.clone());
    let env = [
        ("AC7_TEST_SCHEMA", paths.schema.as_path()),
        ("AC7_TEST_SOCKET", paths.socket.as_path()),
        ("AC7_TEST_WORK", work.path()),
    ];
    let agent = run_python("call_tool_agent.py", "restart", &env);
    let restart = async {
        within(30, "the hang call to reach the parent", hung_rx.recv()).await;
        first.stop().await;
        let second = host(paths.clone(), hung.clone());
        std::fs::write(work.path().join("restarted"), b"").unwrap();
        second
    };
    let (out, second) = tokio::join!(agent, restart);
    assert_eq!(
        out["in_flight_error"],
        "hang: the parent closed the connection before replying; the call may or may not have \
         run. The next call reconnects.",
        "{out}"
    );
    assert_eq!(out["after_restart"], "after");
    assert_eq!(second.requests(), 1);
}

async fn read_request(conn: &mut UnixStream) -> Option<ac7_protocol::dialect::call_tool::CallTool> {
    let mut prefix = [0u8; 4];
    conn.read_exact(&mut prefix).await.ok()?;
    let mut payload = vec![0u8; u32::from_be_bytes(prefix) as usize];
    conn.read_exact(&mut payload).await.unwrap();
    Some(decode_call(&payload).unwrap())
}

/// How the broken parent answers each tool (`echo` gets a proper answer).
const BROKEN: [(&str, &str); 9] = [
    ("empty_object", r#"{"result": {}}"#),
    ("content_not_list", r#"{"result": {"content": "hi"}}"#),
    ("content_empty", r#"{"result": {"content": []}}"#),
    (
        "bad_type",
        r#"{"result": {"content": [{"type": "video", "text": "x"}]}}"#,
    ),
    ("no_type", r#"{"result": {"content": [{"text": "x"}]}}"#),
    // Transport failures: each closes the connection.
    ("over_cap", "<over-cap length>"),
    ("reply_over_cap", "<a reply over the cap>"),
    ("not_json", "{not json"),
    ("dropped", "<close without replying>"),
];

/// A parent that breaks the protocol in the ways [`BROKEN`] lists; reports, per connection,
/// whether the bridge was the one to close it.
async fn broken_parent(
    listener: UnixListener,
    accepted: Arc<AtomicUsize>,
    done: mpsc::UnboundedSender<bool>,
) {
    loop {
        let (mut conn, _) = listener.accept().await.unwrap();
        accepted.fetch_add(1, Ordering::SeqCst);
        let done = done.clone();
        tokio::spawn(async move {
            while let Some(call) = read_request(&mut conn).await {
                let reply = BROKEN
                    .iter()
                    .find(|(name, _)| *name == call.name)
                    .map_or("", |(_, reply)| *reply);
                let mut frame = Vec::new();
                match reply {
                    "" => {
                        let args: Value = call.arguments.parse().unwrap();
                        let payload = format!(
                            r#"{{"result": {{"content": [{{"type": "text", "text": "ok {}"}}]}}}}"#,
                            args["text"].as_str().unwrap_or_default()
                        );
                        length_prefixed::encode(payload.as_bytes(), &mut frame, usize::MAX)
                            .unwrap();
                    }
                    "<close without replying>" => {
                        let _ = done.send(false);
                        return;
                    }
                    "<over-cap length>" => {
                        frame = ((length_prefixed::MAX_PAYLOAD_BYTES + 1) as u32)
                            .to_be_bytes()
                            .to_vec()
                    }
                    "<a reply over the cap>" => {
                        let text = "x".repeat(length_prefixed::MAX_PAYLOAD_BYTES);
                        let payload = format!(
                            r#"{{"result": {{"content": [{{"type": "text", "text": "{text}"}}]}}}}"#
                        );
                        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
                        frame.extend_from_slice(payload.as_bytes());
                    }
                    reply => {
                        length_prefixed::encode(reply.as_bytes(), &mut frame, usize::MAX).unwrap()
                    }
                }
                // The bridge may close while a reply over the cap is still being written.
                if conn.write_all(&frame).await.is_err() {
                    let _ = done.send(true);
                    return;
                }
            }
            let _ = done.send(true);
        });
    }
}

fn schema_file(dir: &Path, names: &[&str]) -> std::path::PathBuf {
    let tools: Vec<Value> = names
        .iter()
        .map(|name| json!({"name": name, "description": "", "input_schema": {"type": "object"}}))
        .collect();
    let path = dir.join("tools.json");
    std::fs::write(&path, serde_json::to_vec(&tools).unwrap()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// A parent that is absent, drops mid-call, sends invalid JSON, a length over the cap
/// or a reply over the cap, or a result that is not a valid MCP result: the agent (the official
/// SDK, which would raise on a JSON-RPC error or an invalid result) gets an `isError` result
/// saying what failed, and the next call reconnects.
#[tokio::test]
async fn sdk_sees_transport_failures_and_invalid_results_as_is_error_results() {
    let dir = tempdir();
    let mut names: Vec<&str> = BROKEN.iter().map(|(name, _)| *name).collect();
    names.push("echo");
    let schema_path = schema_file(dir.path(), &names);
    let socket = dir.path().join("p.sock");

    // No parent at all.
    let env = [
        ("AC7_TEST_SCHEMA", schema_path.as_path()),
        ("AC7_TEST_SOCKET", socket.as_path()),
        ("AC7_TEST_WORK", dir.path()),
    ];
    let out = run_python("call_tool_agent.py", "absent", &env).await;
    for text in out["texts"].as_array().unwrap() {
        let text = text.as_str().unwrap();
        assert!(
            text.starts_with("echo: cannot connect to the parent process (")
                && text.ends_with(
                    "); the call was not sent. Check that the parent is running; the next call \
                     tries to connect again."
                ),
            "{text}"
        );
    }

    let listener = UnixListener::bind(&socket).unwrap();
    let (closed_tx, mut closed) = mpsc::unbounded_channel();
    let accepted = Arc::new(AtomicUsize::new(0));
    let parent = tokio::spawn(broken_parent(listener, Arc::clone(&accepted), closed_tx));

    // initialize and tools/list never touch the socket; stdin EOF is a clean exit.
    let mut bridge = Bridge::spawn_with(
        &[
            OsStr::new("mcp-bridge"),
            OsStr::new("--dialect"),
            OsStr::new("call-tool"),
            OsStr::new("--schema-file"),
            schema_path.as_os_str(),
        ],
        &[("AC7_CALL_TOOL_SOCKET", &socket)],
    );
    bridge.initialize().await;
    let list = bridge.request(json!("l"), "tools/list", Value::Null).await;
    assert_eq!(
        list["result"]["tools"][0]["inputSchema"],
        json!({"type": "object"})
    );
    bridge.close_stdin();
    let (code, rest, _) = bridge.exit().await;
    assert_eq!((code, rest.len()), (0, 0));
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "the bridge connected early"
    );

    let broken = names[..names.len() - 1].join(",");
    let mut env = env.to_vec();
    env.push(("AC7_TEST_BROKEN", Path::new(&broken)));
    let out = run_python("call_tool_agent.py", "broken", &env).await;
    let invalid = |why: &str| {
        format!(
            "the parent returned an invalid tool result ({why}); a tool result needs a non-empty \
             \"content\" list of content blocks"
        )
    };
    for (name, want) in [
        (
            "empty_object",
            invalid("the result has no \"content\" list"),
        ),
        (
            "content_not_list",
            invalid("\"content\" is string, not a list"),
        ),
        (
            "content_empty",
            invalid("\"content\" is empty; it must hold at least one content block"),
        ),
        (
            "bad_type",
            invalid(
                "content[0] has type \"video\", which is none of text, image, audio, \
                 resource_link, resource",
            ),
        ),
        ("no_type", invalid("content[0] has no \"type\"")),
        (
            "dropped",
            "the parent closed the connection before replying; the call may or may not have \
             run. The next call reconnects."
                .to_owned(),
        ),
    ] {
        assert_eq!(out[name], format!("{name}: {want}"), "{out}");
    }
    for (name, why) in [
        ("over_cap", "exceeds"),
        ("reply_over_cap", "exceeds"),
        ("not_json", "not valid JSON"),
    ] {
        let text = out[name].as_str().unwrap();
        assert!(
            text.starts_with(&format!("{name}: protocol error from the parent ("))
                && text.contains(why)
                && text.ends_with(
                    "the connection was dropped and the call may or may not have run. The next \
                     call reconnects."
                ),
            "{name}: {text}"
        );
    }
    // Each transport failure cost one connection, closed by the bridge (or, `dropped`, by the
    // parent); the last one closed when the agent exited.
    let mut by_bridge = Vec::new();
    for _ in 0..5 {
        by_bridge.push(
            within(10, "a connection to close", closed.recv())
                .await
                .unwrap(),
        );
    }
    by_bridge.sort();
    assert_eq!(by_bridge, [false, true, true, true, true]);
    assert_eq!(accepted.load(Ordering::SeqCst), 5);
    parent.abort();
}

async fn refused<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> String {
    let out = within(
        10,
        "the bridge to refuse",
        tokio::process::Command::new(common::ac7())
            .args(args)
            .env_remove("AC7_CALL_TOOL_SOCKET")
            .stdin(std::process::Stdio::null())
            .output(),
    )
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty(), "nothing on stdout: {out:?}");
    String::from_utf8(out.stderr).unwrap()
}

#[tokio::test]
async fn bad_schema_files_are_refused_with_exit_1() {
    let dir = tempdir();
    let path = dir.path().join("tools.json");
    let socket = dir.path().join("p.sock");
    let args = |schema: &Path| {
        [
            OsStr::new("mcp-bridge"),
            OsStr::new("--dialect"),
            OsStr::new("call-tool"),
            OsStr::new("--schema-file"),
            schema.as_os_str(),
            OsStr::new("--socket"),
            socket.as_os_str(),
        ]
        .map(OsStr::to_owned)
    };
    std::fs::write(
        &path,
        r#"[{"name": "echo", "description": "", "input_schema": {"type": "object"}}]"#,
    )
    .unwrap();
    for mode in [0o640, 0o604] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let stderr = refused(args(&path)).await;
        assert_eq!(
            stderr.trim_end(),
            format!(
                "ac7 mcp-bridge: the tool-schema file {p} has mode {mode:04o}: it must be readable \
                 by its owner only (the parent creates it 0600; chmod 600 {p} if you wrote it yourself)",
                p = path.display()
            )
        );
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(&path, r#"{"name": "echo"}"#).unwrap();
    let stderr = refused(args(&path)).await;
    assert!(
        stderr.starts_with(&format!(
            "ac7 mcp-bridge: {} is not a valid tool-schema file: ",
            path.display()
        )),
        "{stderr}"
    );
    // A schema that is not JSON Schema, or that refers outside itself, is refused by name.
    for (schema, why) in [
        (
            r#"{"properties": {"a": {"type": "text"}}}"#,
            "/properties/a/type",
        ),
        (
            r#"{"properties": {"a": {"$ref": "https://example.com/a.json"}}}"#,
            "https://example.com/a.json is outside the schema, and nothing is fetched",
        ),
    ] {
        std::fs::write(
            &path,
            format!(r#"[{{"name": "ok", "input_schema": {{}}}}, {{"name": "echo", "input_schema": {schema}}}]"#),
        )
        .unwrap();
        let stderr = refused(args(&path)).await;
        assert!(
            stderr.starts_with(&format!(
                "ac7 mcp-bridge: {} is not a valid tool-schema file: tool \
                 'echo': input_schema is not a usable JSON Schema: ",
                path.display()
            )),
            "{stderr}"
        );
        assert!(stderr.contains(why), "{why}: {stderr}");
    }
    let missing = dir.path().join("missing.json");
    let stderr = refused(args(&missing)).await;
    assert!(
        stderr.starts_with(&format!(
            "ac7 mcp-bridge: cannot read the tool-schema file {}: ",
            missing.display()
        )),
        "{stderr}"
    );
    let stderr = refused([
        OsStr::new("mcp-bridge"),
        OsStr::new("--dialect"),
        OsStr::new("call-tool"),
        OsStr::new("--schema-file"),
        path.as_os_str(),
    ])
    .await;
    assert!(stderr.contains("AC7_CALL_TOOL_SOCKET"), "{stderr}");
}

/// Sends one raw payload and reads the reply payload (`None`: the host closed the connection).
async fn exchange(conn: &mut UnixStream, payload: &[u8]) -> Option<Value> {
    let mut frame = Vec::new();
    length_prefixed::encode(payload, &mut frame, usize::MAX).unwrap();
    conn.write_all(&frame).await.unwrap();
    read_reply(conn).await
}

async fn read_reply(conn: &mut UnixStream) -> Option<Value> {
    let mut prefix = [0u8; 4];
    within(10, "a reply from the host", conn.read_exact(&mut prefix))
        .await
        .ok()?;
    let mut payload = vec![0u8; u32::from_be_bytes(prefix) as usize];
    conn.read_exact(&mut payload).await.unwrap();
    Some(serde_json::from_slice(&payload).unwrap())
}

#[tokio::test]
async fn the_host_answers_bad_requests_and_closes_on_untrusted_bytes() {
    let dir = tempdir();
    let mut host = CallToolHost::new();
    host.tool(schema("huge", json!({"type": "object"})), |_| async {
        Ok(mcp::tool_text(
            &"x".repeat(length_prefixed::MAX_PAYLOAD_BYTES),
        ))
    })
    .tool(schema("boom", json!({"type": "object"})), |_| async {
        panic!("the tool blew up")
    })
    .tool(
        schema("echo", json!({"type": "object"})),
        |args| async move { Ok(mcp::tool_text(&args.to_string())) },
    );
    let running = host.start(HostPaths::in_dir(dir.path())).unwrap();
    let mut conn = UnixStream::connect(running.socket_path()).await.unwrap();
    let error = |message: &str, ty: &str| Some(json!({"error": {"message": message, "type": ty}}));
    for (payload, want) in [
        (
            &br#"{"method": "nope"}"#[..],
            error("Unknown method: nope", "ValueError"),
        ),
        (
            br#"{"method": "call_tool", "params": []}"#,
            error("Invalid params: expected dict", "ValueError"),
        ),
        (
            br#"{"method": "call_tool", "params": {"name": 1}}"#,
            error("Invalid tool name: expected string", "ValueError"),
        ),
        (
            br#"{"method": "call_tool", "params": {"name": "echo", "arguments": [1]}}"#,
            error("Invalid arguments: expected dict", "ValueError"),
        ),
        (
            br#"{"method": "call_tool", "params": {"name": "nope", "arguments": {}}}"#,
            error("Unknown tool: nope", "ToolNotFoundError"),
        ),
    ] {
        assert_eq!(
            exchange(&mut conn, payload).await,
            want,
            "{}",
            String::from_utf8_lossy(payload)
        );
    }
    let reply = exchange(
        &mut conn,
        br#"{"method": "call_tool", "params": {"name": "huge"}}"#,
    )
    .await
    .unwrap();
    assert_eq!(reply["error"]["type"], "IPCMessageSizeError", "{reply}");
    let reply = exchange(
        &mut conn,
        br#"{"method": "call_tool", "params": {"name": "boom"}}"#,
    )
    .await
    .unwrap();
    assert_eq!(reply["error"]["type"], "RuntimeError", "{reply}");
    // The connection survived all of that.
    let reply = exchange(
        &mut conn,
        r#"{"method": "call_tool", "params": {"name": "echo", "arguments": {"t": "é"}}}"#
            .as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(reply["result"]["content"][0]["text"], r#"{"t":"é"}"#);

    for payload in [&b"not json"[..], b"", b"[1]", b"\xff\xfe"] {
        let mut conn = UnixStream::connect(running.socket_path()).await.unwrap();
        assert_eq!(exchange(&mut conn, payload).await, None, "{payload:?}");
    }
    // An over-cap prefix closes at once, without waiting for the payload.
    let mut conn = UnixStream::connect(running.socket_path()).await.unwrap();
    let over = (length_prefixed::MAX_PAYLOAD_BYTES as u32 + 1).to_be_bytes();
    conn.write_all(&over).await.unwrap();
    assert_eq!(read_reply(&mut conn).await, None);
    assert_eq!(running.pipelined_requests(), 0);
}

/// What a [`manual_parent`] reports to the test.
enum ParentEvent {
    /// Connection `n` was accepted; its write half, for the test to answer on.
    Accepted(usize, tokio::net::unix::OwnedWriteHalf),
    /// A request read on connection `n`.
    Request(usize, ac7_protocol::dialect::call_tool::CallTool),
    /// Connection `n` reached EOF: the bridge closed it.
    Closed(usize),
}

/// A parent that answers nothing by itself: every connection and request goes to the test,
/// which writes the replies when and how it likes.
async fn manual_parent(listener: UnixListener, events: mpsc::UnboundedSender<ParentEvent>) {
    for n in 0.. {
        let (conn, _) = listener.accept().await.unwrap();
        let (mut read, write) = conn.into_split();
        let _ = events.send(ParentEvent::Accepted(n, write));
        let events = events.clone();
        tokio::spawn(async move {
            loop {
                let mut prefix = [0u8; 4];
                if read.read_exact(&mut prefix).await.is_err() {
                    let _ = events.send(ParentEvent::Closed(n));
                    return;
                }
                let mut payload = vec![0u8; u32::from_be_bytes(prefix) as usize];
                read.read_exact(&mut payload).await.unwrap();
                let _ = events.send(ParentEvent::Request(n, decode_call(&payload).unwrap()));
            }
        });
    }
}

async fn next_event(events: &mut mpsc::UnboundedReceiver<ParentEvent>, what: &str) -> ParentEvent {
    within(10, what, events.recv()).await.unwrap()
}

/// The next request the parent reads: (connection, tool, arguments).
async fn next_request(
    events: &mut mpsc::UnboundedReceiver<ParentEvent>,
    conns: &mut Vec<tokio::net::unix::OwnedWriteHalf>,
) -> (usize, String, Value) {
    loop {
        match next_event(events, "a request at the parent").await {
            ParentEvent::Accepted(n, write) => {
                assert_eq!(n, conns.len());
                conns.push(write);
            }
            ParentEvent::Request(n, call) => {
                return (n, call.name, call.arguments.parse().unwrap());
            }
            ParentEvent::Closed(n) => panic!("connection {n} closed while a request was awaited"),
        }
    }
}

fn text_frame(text: &str) -> Vec<u8> {
    let payload = json!({"result": {"content": [{"type": "text", "text": text}]}}).to_string();
    let mut frame = Vec::new();
    length_prefixed::encode(payload.as_bytes(), &mut frame, usize::MAX).unwrap();
    frame
}

fn call_line(id: u32, tool: &str, text: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": {"text": text}}})
    .to_string()
}

fn call_tool_bridge(schema: &Path, socket: &Path, timeout_ms: &str) -> Bridge {
    Bridge::spawn_with(
        &[
            OsStr::new("mcp-bridge"),
            OsStr::new("--dialect"),
            OsStr::new("call-tool"),
            OsStr::new("--schema-file"),
            schema.as_os_str(),
            OsStr::new("--socket"),
            socket.as_os_str(),
        ],
        &[("AC7_CALL_TOOL_TIMEOUT_MS", Path::new(timeout_ms))],
    )
}

/// A parent that never answers a call: after the call timeout (300 ms here, through
/// `AC7_CALL_TOOL_TIMEOUT_MS`) the agent gets an `isError` result naming the timeout, the
/// bridge drops the silent connection, and the call queued behind it goes out on a new one
/// and is answered; so is the one after.
#[tokio::test]
async fn a_parent_that_never_answers_times_out_and_the_next_call_works() {
    let dir = tempdir();
    let schema = schema_file(dir.path(), &["hang", "echo"]);
    let socket = dir.path().join("p.sock");
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let parent = tokio::spawn(manual_parent(
        UnixListener::bind(&socket).unwrap(),
        events_tx,
    ));
    let mut bridge = call_tool_bridge(&schema, &socket, "300");
    bridge.initialize().await;
    bridge.send(&call_line(1, "hang", "never")).await;
    bridge.send(&call_line(2, "echo", "queued")).await;
    let mut conns = Vec::new();
    let (conn, tool, _) = next_request(&mut events, &mut conns).await;
    assert_eq!((conn, tool.as_str()), (0, "hang"));

    let answer = bridge.recv().await;
    assert_eq!(
        answer,
        json!({"jsonrpc": "2.0", "id": 1, "result": {"isError": true, "content": [{"type": "text",
            "text": "hang: the parent did not reply within 300 ms (the bridge's call timeout); the \
                     call may or may not have run, and may still be running. The connection was \
                     dropped; the next call reconnects."}]}})
    );
    // The silent connection is closed by the bridge; the queued call comes on a new one.
    let mut closed = false;
    let (conn, tool, args) = loop {
        match next_event(&mut events, "the bridge to drop and reconnect").await {
            ParentEvent::Closed(0) => closed = true,
            ParentEvent::Accepted(n, write) => {
                assert_eq!(n, conns.len());
                conns.push(write);
            }
            ParentEvent::Request(n, call) => {
                break (n, call.name, call.arguments.parse::<Value>().unwrap());
            }
            ParentEvent::Closed(n) => panic!("connection {n} closed"),
        }
    };
    assert_eq!(
        (conn, tool.as_str(), &args["text"]),
        (1, "echo", &json!("queued"))
    );
    conns[1].write_all(&text_frame("ok queued")).await.unwrap();
    let answer = bridge.recv().await;
    assert_eq!(answer["id"], 2, "{answer}");
    assert_eq!(
        answer["result"]["content"][0]["text"], "ok queued",
        "{answer}"
    );

    bridge.send(&call_line(3, "echo", "after")).await;
    let (conn, _, args) = next_request(&mut events, &mut conns).await;
    assert_eq!((conn, &args["text"]), (1, &json!("after")));
    conns[1].write_all(&text_frame("ok after")).await.unwrap();
    let answer = bridge.recv().await;
    assert_eq!(answer["id"], 3, "{answer}");
    assert_eq!(answer["result"]["content"][0]["text"], "ok after");
    if !closed {
        assert!(
            matches!(
                next_event(&mut events, "the silent connection to close").await,
                ParentEvent::Closed(0)
            ),
            "the first connection was not closed"
        );
    }
    bridge.close_stdin();
    let (code, rest, _) = bridge.exit().await;
    assert_eq!((code, rest.len()), (0, 0), "{rest:?}");
    parent.abort();
}

/// The agent cancels the call on the wire: the bridge sends the next call at once, on the same
/// connection, while the parent still works on the cancelled one. The parent's reply to the
/// cancelled call then arrives (in one write with the next call's reply): it is discarded by
/// its frame, the next call gets its own answer, the cancelled call none, and the connection
/// stays in step for the call after.
#[tokio::test]
async fn a_cancel_frees_the_queue_and_the_late_reply_is_discarded() {
    let dir = tempdir();
    let schema = schema_file(dir.path(), &["slow", "echo"]);
    let socket = dir.path().join("p.sock");
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let parent = tokio::spawn(manual_parent(
        UnixListener::bind(&socket).unwrap(),
        events_tx,
    ));
    let mut bridge = call_tool_bridge(&schema, &socket, "60000");
    bridge.initialize().await;
    bridge.send(&call_line(1, "slow", "cancelled")).await;
    bridge.send(&call_line(2, "echo", "next")).await;
    let mut conns = Vec::new();
    let (_, tool, _) = next_request(&mut events, &mut conns).await;
    assert_eq!(tool, "slow");
    bridge
        .send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":"user"}}"#)
        .await;
    let (conn, tool, args) = next_request(&mut events, &mut conns).await;
    assert_eq!(
        (conn, tool.as_str(), &args["text"]),
        (0, "echo", &json!("next")),
        "the next call goes out at once, on the same connection"
    );
    let mut both = text_frame("late reply to the cancelled call");
    both.extend(text_frame("ok next"));
    conns[0].write_all(&both).await.unwrap();
    let answer = bridge.recv().await;
    assert_eq!(
        answer,
        json!({"jsonrpc": "2.0", "id": 2, "result": {"content": [{"type": "text", "text": "ok next"}]}})
    );

    bridge.send(&call_line(3, "echo", "after")).await;
    let (conn, _, args) = next_request(&mut events, &mut conns).await;
    assert_eq!(
        (conn, &args["text"]),
        (0, &json!("after")),
        "still one connection"
    );
    conns[0].write_all(&text_frame("ok after")).await.unwrap();
    let answer = bridge.recv().await;
    assert_eq!(answer["id"], 3, "{answer}");
    assert_eq!(answer["result"]["content"][0]["text"], "ok after");

    bridge.close_stdin();
    let (code, rest, stderr) = bridge.exit().await;
    assert_eq!(
        (code, rest.len()),
        (0, 0),
        "the cancelled call is never answered: {rest:?}"
    );
    assert!(
        stderr.contains("the parent's reply to a cancelled call discarded"),
        "{stderr}"
    );
    assert_eq!(conns.len(), 1, "no reconnect");
    parent.abort();
}

#[tokio::test]
async fn a_host_refuses_a_tool_whose_schema_is_not_json_schema() {
    let dir = tempdir();
    let paths = HostPaths::in_dir(dir.path());
    let mut host = CallToolHost::new();
    host.tool(
        schema("bad", json!({"type": "object", "required": "text"})),
        |_args: Value| async move { Ok(mcp::tool_text("")) },
    );
    let err = host.start(paths.clone()).unwrap_err().to_string();
    assert!(
        err.starts_with("tool 'bad': input_schema is not a usable JSON Schema: "),
        "{err}"
    );
    assert!(
        !paths.schema.exists() && !paths.socket.exists(),
        "nothing written"
    );
}
