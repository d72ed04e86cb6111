//! Embedding the sans-IO core over a transport `ac7` itself does not use: TCP with `std::net`
//! and plain threads (the runtime uses a unix socket and tokio).
//!
//! Two machines talk over one loopback TCP connection:
//!
//! - a **runner** ([`RunnerSession`]) on a thread: it serves one tool, `echo`, answers the
//!   requests the session hands it with `respond`, and pushes one notification with `notify`;
//! - an **MCP bridge** ([`BridgeSession`]) on the main thread, whose agent is a script: it
//!   sends `initialize`, `notifications/initialized`, `tools/list` and a `tools/call`, waits
//!   for the three answers and the runner's notification, then closes its side (EOF).
//!
//! Each driver is the same loop: feed what arrived (`handle_*(…, now)`), drain `poll_output()`
//! until `None` and act on each output, then wait for input no longer than `poll_timeout()`
//! and call `handle_timeout(now)` when it passes. The bridge's one timer (the start-up hold
//! that keeps the notification until the agent is ready) is driven that way here.
//!
//! Run it with `cargo run -p ac7-protocol --example tcp_bridge`: it needs no peer, prints what
//! the agent saw and exits 0 when every answer and the notification arrived.

// An example program: printing what the agent saw is its output.
#![allow(clippy::print_stdout)]

use std::error::Error;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use ac7_protocol::codec::json::RawJson;
use ac7_protocol::codec::jsonrpc::Outcome;
use ac7_protocol::session::mcp_bridge::{BridgeConfig, BridgeOutput, BridgePeer, BridgeSession};
use ac7_protocol::session::runner::{Origin, RunnerConfig, RunnerOutput, RunnerSession};
use serde_json::{Value, json};

type BoxError = Box<dyn Error + Send + Sync>;

/// The notification the runner pushes once the bridge is connected.
const NOTIFICATION: &str = "notifications/message";

/// What the scripted agent sent, one JSON-RPC message per line.
const AGENT_SCRIPT: &str = concat!(
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"script","version":"1"}}}"#,
    "\n",
    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    "\n",
    r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    "\n",
    r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"over TCP"}}}"#,
    "\n",
);

/// What the agent received, in order: each line parsed.
#[derive(Debug, Default)]
pub(crate) struct Transcript {
    /// Every JSON-RPC message the bridge wrote to the agent.
    pub(crate) agent_saw: Vec<Value>,
}

impl Transcript {
    /// The answer to the agent's request `id`.
    pub(crate) fn answer(&self, id: u64) -> Option<&Value> {
        self.agent_saw
            .iter()
            .find(|m| m.get("id").and_then(Value::as_u64) == Some(id))
    }

    /// Whether the runner's notification reached the agent.
    pub(crate) fn got_notification(&self) -> bool {
        self.agent_saw
            .iter()
            .any(|m| m.get("method").and_then(Value::as_str) == Some(NOTIFICATION))
    }

    fn complete(&self) -> bool {
        (1..=3).all(|id| self.answer(id).is_some()) && self.got_notification()
    }
}

/// Runs both sides on a loopback port until the bridge exits; returns what the agent saw.
pub(crate) fn run() -> Result<Transcript, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let runner = thread::spawn(move || -> Result<(), BoxError> {
        let (stream, _) = listener.accept()?;
        serve_runner(stream)
    });
    let transcript = drive_bridge(TcpStream::connect(addr)?)?;
    runner
        .join()
        .map_err(|_| io::Error::other("the runner thread panicked"))??;
    Ok(transcript)
}

/// The runner's driver: one connection, answered until it closes.
fn serve_runner(mut stream: TcpStream) -> Result<(), BoxError> {
    let mut session = RunnerSession::new(RunnerConfig::default());
    let conn = session.handle_connect(Origin::Agent, Instant::now());
    // Queued until the bridge attaches, then held by the bridge until its agent is ready.
    let params = RawJson::from_value(&json!({"level": "info", "data": "hello from the runner"}))?;
    session.notify(NOTIFICATION, Some(params), Instant::now());
    let mut buf = [0u8; 16 * 1024];
    loop {
        while let Some(output) = session.poll_output() {
            match output {
                RunnerOutput::Transmit { bytes, .. } => stream.write_all(&bytes)?,
                RunnerOutput::Close { .. } => return Ok(()),
                RunnerOutput::Request(request) => {
                    let outcome = answer_tool_request(&request.method, request.params.as_ref())?;
                    session.respond(request.conn, request.id, outcome, Instant::now())?;
                }
                RunnerOutput::Event(event) => eprintln!("runner: {event:?}"),
                // Outputs added later are logged, not ignored silently.
                other => eprintln!("runner: unhandled {other:?}"),
            }
        }
        // The runner session keeps no timers: block until bytes or EOF.
        let n = stream.read(&mut buf)?;
        if n == 0 {
            session.handle_closed(conn, Instant::now());
            while session.poll_output().is_some() {}
            return Ok(());
        }
        session.handle_bytes(conn, &buf[..n], Instant::now());
    }
}

/// The application behind the runner: one tool, `echo`.
fn answer_tool_request(method: &str, params: Option<&RawJson>) -> Result<Outcome, BoxError> {
    let result = match method {
        "tools/list" => json!({"tools": [{
            "name": "echo",
            "description": "Says the text back",
            "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}
        }]}),
        "tools/call" => {
            let params: Value = match params {
                Some(p) => p.parse()?,
                None => Value::Null,
            };
            let text = params["arguments"]["text"].as_str().unwrap_or_default();
            json!({"content": [{"type": "text", "text": format!("echo: {text}")}]})
        }
        _ => json!({}),
    };
    Ok(Outcome::Result(RawJson::from_value(&result)?))
}

/// The bridge's driver: the scripted agent on one side, the TCP socket on the other.
fn drive_bridge(mut socket: TcpStream) -> Result<Transcript, BoxError> {
    let mut session = BridgeSession::new(BridgeConfig::default());
    let mut transcript = Transcript::default();
    let mut agent_open = true;
    session.handle_agent_bytes(AGENT_SCRIPT.as_bytes(), Instant::now());
    let mut buf = [0u8; 16 * 1024];
    loop {
        while let Some(output) = session.poll_output() {
            match output {
                BridgeOutput::Transmit {
                    to: BridgePeer::Agent,
                    bytes,
                } => {
                    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                        let message: Value = serde_json::from_slice(line)?;
                        println!("agent <- {message}");
                        transcript.agent_saw.push(message);
                    }
                }
                BridgeOutput::Transmit {
                    to: BridgePeer::Runner,
                    bytes,
                } => socket.write_all(&bytes)?,
                BridgeOutput::Event(event) => eprintln!("bridge: {event:?}"),
                BridgeOutput::Exit(reason) => {
                    eprintln!("bridge: exit ({reason:?})");
                    // Dropping the socket closes it: the runner sees EOF.
                    return Ok(transcript);
                }
                other => eprintln!("bridge: unhandled {other:?}"),
            }
        }
        // The agent has what it came for: it closes its side, and the bridge tears down.
        if agent_open && transcript.complete() {
            agent_open = false;
            session.handle_agent_eof(Instant::now());
            continue;
        }
        // Wait for the runner no longer than the bridge's next timer.
        let wait = session
            .poll_timeout()
            .map(|at| at.saturating_duration_since(Instant::now()));
        socket.set_read_timeout(wait.map(|w| w.max(Duration::from_millis(1))))?;
        match socket.read(&mut buf) {
            Ok(0) => session.handle_runner_closed(Instant::now()),
            Ok(n) => session.handle_runner_bytes(&buf[..n], Instant::now()),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                session.handle_timeout(Instant::now());
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn main() -> Result<(), BoxError> {
    let transcript = run()?;
    let echoed = transcript
        .answer(3)
        .and_then(|a| a["result"]["content"][0]["text"].as_str())
        .unwrap_or_default()
        .to_owned();
    if !transcript.complete() || echoed != "echo: over TCP" {
        return Err(format!("the agent did not get everything: {transcript:?}").into());
    }
    println!("ok: 3 answers and 1 notification over TCP ({echoed:?})");
    Ok(())
}
