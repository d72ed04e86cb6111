//! Sans-IO core of ac7: frames, codecs, request correlation, MCP JSON-RPC and the session
//! machines of the runner ⇄ bridge IPC protocol.
//!
//! Nothing here reads a clock, touches a socket or spawns a task. Every machine is a plain value
//! you feed and drain:
//!
//! - **inputs** are `handle_*` methods (bytes read, a peer connected or closed, an answer from the
//!   application). They never block and never do I/O. Time is an argument (`now: Instant`).
//! - **outputs** come out of `poll_output()`, drained until `None`: bytes to write (tagged with
//!   where they go), requests for the application, events worth logging, connections to close.
//!   Every output is queued inside the machine, so inputs may interleave in any order.
//! - machines with timers also offer `poll_timeout()` / `handle_timeout(now)` (the objectives
//!   [`tracker`]); the bridge and runner sessions have none (a request waits for its answer or
//!   for teardown).
//!
//! # The run loop
//!
//! A driver (see `ac7-runtime`) is a loop around one machine. For the bridge:
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use std::time::Instant;
//! use ac7_protocol::bridge::{BridgeConfig, BridgeOutput, BridgeSession};
//!
//! # fn drive(mut stdin: impl Read, mut stdout: impl Write, mut socket: impl Read + Write) -> std::io::Result<()> {
//! let mut session = BridgeSession::new(BridgeConfig::default());
//! let mut buf = [0u8; 64 * 1024];
//! loop {
//!     // 1. Feed whatever arrived (here: stdin; a real driver waits on stdin and the socket).
//!     let n = stdin.read(&mut buf)?;
//!     if n == 0 {
//!         session.handle_agent_eof(Instant::now());
//!     } else {
//!         session.handle_agent_bytes(&buf[..n], Instant::now());
//!     }
//!     // 2. Drain every output and act on it, in order.
//!     while let Some(output) = session.poll_output() {
//!         match output {
//!             BridgeOutput::ToAgent(line) => stdout.write_all(&line)?,
//!             BridgeOutput::ToRunner(frame) => socket.write_all(&frame)?,
//!             BridgeOutput::Event(event) => eprintln!("{event:?}"),
//!             BridgeOutput::Exit(_) => {
//!                 stdout.flush()?;
//!                 return Ok(());
//!             }
//!         }
//!     }
//! }
//! # }
//! ```
//!
//! The runner side is the same shape with [`runner::RunnerSession`]: report connections with
//! `handle_connect`, feed bytes with `handle_bytes(conn, …)`, answer each
//! [`runner::RunnerOutput::Request`] with `respond`, push events with `notify`, and write each
//! [`runner::RunnerOutput::Transmit`] to its connection.
//!
//! # Modules
//!
//! | module | what it models |
//! |---|---|
//! | [`line`] | capped NDJSON line splitting with discard-until-newline (shared by every line dialect) |
//! | [`frame`] | the five IPC frame kinds, their lenient decoder and capped encoder |
//! | [`length_prefixed`] | 4-byte big-endian length framing with a 10 MiB cap checked before allocating |
//! | [`pending`] | the correlation table: monotonic ids, out-of-order answers, `fail_all` |
//! | [`jsonrpc`] | JSON-RPC 2.0 messages with byte-exact ids, params and results |
//! | [`mcp`] | MCP method names, version negotiation, `initialize` and `CallToolResult` shapes |
//! | [`bridge`] | the bridge session: agent stdio ⇄ runner socket |
//! | [`runner`] | the runner session: single-bridge policy, requests out, responses and notifications in |
//! | [`sse`] | incremental `text/event-stream` parser with a size cap |
//! | [`channel`] | how a broker message reaches an agent: self-echo, channel notification meta, Codex `<channel>` text |
//! | [`toolbox`] | the runner's tools: definitions from the briefing, validation, each tool as a plan of broker requests |
//! | [`tracker`] | the objectives tracker: 150 ms debounce, refresh, `tools/list_changed` |
//! | [`json`] | raw JSON kept byte-exact |
//! | [`message`] | broker messages: wire shapes, reserved `data` keys, thread routing, visibility (`matches_viewer`) |
//! | [`objective`] | the objective lifecycle (active ⇄ blocked → done / cancelled) and who may do what |
//! | [`permission`] | the seven leaf permissions and preset expansion |
//! | [`team`] | the team and a member's role (wire shapes shared by the broker and the runner) |
//! | [`vfs`] | shared file space paths: normalisation and traversal rejection |
//! | [`call_tool`] | the seed 001 dialect: messages, parent-side decoding, the sequential client |
//! | [`call_tool_bridge`] | the seed 001 bridge: MCP on stdio, validated `call_tool` calls to the parent |
//! | [`ash`] | the seed 003 dialect: commands and events, the per-connection bridge and the host |
//! | [`codex`] | the JSON-RPC client for `codex app-server` and the channel sink (turn/start vs turn/steer) |
//! | [`schema`] | the JSON Schema subset tool input schemas use |
//! | [`trace`] | activity events, the HTTP/1.1 exchange assembler, Messages / Responses decoding, redaction |
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod ash;
pub mod base64;
pub mod bridge;
pub mod call_tool;
pub mod call_tool_bridge;
pub mod channel;
pub mod civil;
pub mod codex;
pub mod frame;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod json;
pub mod jsonrpc;
pub mod length_prefixed;
pub mod line;
pub mod live;
pub mod mcp;
mod mcp_face;
pub mod message;
pub mod objective;
pub mod pending;
pub mod permission;
pub mod runner;
pub mod schema;
pub mod signin;
pub mod sse;
pub mod team;
pub mod toolbox;
pub mod trace;
pub mod tracker;
pub mod vfs;

#[cfg(test)]
pub(crate) mod test_support;
