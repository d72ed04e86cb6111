//! Sans-IO core of ac7: frames, codecs, request correlation, MCP JSON-RPC and the session
//! machines of the runner ⇄ bridge IPC protocol.
//!
//! Nothing here reads a clock, touches a socket or spawns a task. Every machine is a plain value
//! you feed and drain.
//!
//! # The machine contract
//!
//! Every machine in this crate speaks the same vocabulary (each type's own "Contract" paragraph
//! says which parts it has):
//!
//! - **inputs — what happened** are `handle_*` methods: bytes read (`handle_bytes`,
//!   `handle_agent_bytes`, …), a peer connected or closed (`handle_connect`, `handle_connected`,
//!   `handle_closed`, `handle_*_eof`), the outcome of I/O the machine asked the driver to do
//!   (`handle_refreshed`, `handle_history`), a timer (`handle_timeout`). They never block and
//!   never do I/O.
//! - **commands — what the application does** use three verbs: [`respond`] answers a request the
//!   machine handed to the application (`runner`'s tool calls, an Ash bridge's turn); [`notify`]
//!   emits an event towards the peer (an MCP notification, a channel event for Codex, an agent
//!   message on an Ash connection); [`request`] starts a request of the application's own (a
//!   `call_tool` call, an Ash command, a Codex JSON-RPC call). `shutdown` ends a machine.
//! - **time** is an argument, never read: a machine that keeps time (it has timers, or reports
//!   durations) takes `now` as the **last** argument of every input and command, whether it
//!   needs it today or not, so adding a timer never changes a caller. A machine that keeps no
//!   time (`call_tool`, `call_tool_bridge`, `ash::bridge`) takes none. Each kind of time has
//!   one type:
//!   - *monotonic* time is [`std::time::Instant`]: every session, dialect client and bridge, the
//!     live stream, the objectives tracker, the activity uploader and the busy reporter;
//!   - *wall-clock* time, for what is stamped on the wire or stored, is [`EpochMs`]: messages,
//!     objectives, activity events and traces (the tracer, the objective markers);
//!   - *sign-in* time is [`UnixSecs`], whole seconds, the unit TOTP steps are defined in and
//!     the attempt limiter and enrollments count in.
//! - **outputs** are one enum per machine, named `…Output` (`BridgeOutput`, `RunnerOutput`,
//!   `UploaderOutput`, `MarkerOutput`, `EnrollOutput`, …), queued inside the machine and drained
//!   with `poll_output()` until `None`, so inputs may interleave in any order; polling never
//!   changes what the machine decided. Bytes to write are always a `Transmit` variant:
//!   `Transmit(bytes)` where the machine has one peer, `Transmit { to, bytes }` where it has
//!   several, `to` naming the peer: a [`BridgePeer`], a [`CallToolPeer`], an [`IpcConnId`] (a
//!   connection on the runner's socket) or a [`ProxyConnId`] (a connection through the trace
//!   proxy). Things worth a log line are an `Event` variant (`…Event` enums) or, for the
//!   uploader, `Log`.
//! - **timers**: machines with timers offer `poll_timeout()` (when to call `handle_timeout(now)`
//!   next, `None` for never) and `handle_timeout(now)`, in the machine's clock.
//! - **decoders** (tokio-util style) are fed with `push(bytes)` and drained with `decode()` until
//!   `None`; at end of input, `decode_eof()` yields what a final unterminated line or frame held
//!   (or the framing error).
//! - **growth**: output, event and error enums that will gain variants are `#[non_exhaustive]`:
//!   a driver matches them with a last arm that logs what it does not know. Peers, wire
//!   messages and the application's answers stay exhaustive. Errors are typed (`thiserror`),
//!   never a bare `String`.
//!
//! `examples/tcp_bridge.rs` drives the runner and bridge sessions over TCP with `std::net` and
//! threads: the whole contract, timers included, outside the runtime.
//!
//! [`BridgePeer`]: session::mcp_bridge::BridgePeer
//! [`CallToolPeer`]: dialect::call_tool_bridge::CallToolPeer
//! [`IpcConnId`]: session::runner::IpcConnId
//! [`ProxyConnId`]: trace::http::ProxyConnId
//! [`respond`]: session::runner::RunnerSession::respond
//! [`notify`]: session::runner::RunnerSession::notify
//! [`request`]: dialect::call_tool::CallToolClient::request
//!
//! # The run loop
//!
//! A driver (see `ac7-runtime`) is a loop around one machine. For the bridge:
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use std::time::Instant;
//! use ac7_protocol::session::mcp_bridge::{BridgeConfig, BridgeOutput, BridgeSession, BridgePeer};
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
//!             BridgeOutput::Transmit { to: BridgePeer::Agent, bytes } => stdout.write_all(&bytes)?,
//!             BridgeOutput::Transmit { to: BridgePeer::Runner, bytes } => socket.write_all(&bytes)?,
//!             BridgeOutput::Event(event) => eprintln!("{event:?}"),
//!             BridgeOutput::Exit(_) => {
//!                 stdout.flush()?;
//!                 return Ok(());
//!             }
//!             // Outputs a later version adds (the enum is non-exhaustive).
//!             other => eprintln!("unhandled {other:?}"),
//!         }
//!     }
//! }
//! # }
//! ```
//!
//! The runner side is the same shape with [`session::runner::RunnerSession`]: report connections with
//! `handle_connect`, feed bytes with `handle_bytes(conn, …, now)`, answer each
//! [`session::runner::RunnerOutput::Request`] with `respond`, push events with `notify`, and write each
//! [`session::runner::RunnerOutput::Transmit`] to its connection (`to`).
//!
//! # Layout
//!
//! | folder | module | what it models |
//! |---|---|---|
//! | [`codec`] | [`codec::line`](mod@codec::line) | capped NDJSON line splitting with discard-until-newline (shared by every line dialect) |
//! | | [`codec::frame`] | the five IPC frame kinds, their lenient decoder and capped encoder |
//! | | [`codec::http1`] | HTTP/1.x message framing (RFC 9112), shared by the trace assembler and a client's response decoder |
//! | | [`codec::length_prefixed`] | 4-byte big-endian length framing with a 10 MiB cap checked before allocating |
//! | | [`codec::sse`] | incremental `text/event-stream` parser with a size cap |
//! | | [`codec::jsonrpc`] | JSON-RPC 2.0 messages with byte-exact ids, params and results |
//! | | [`codec::json`] | raw JSON kept byte-exact |
//! | | [`codec::base64`] | standard base64 |
//! | [`session`] | [`session::mcp_bridge`] | the ac7 MCP bridge session: agent stdio ⇄ runner socket |
//! | | [`session::runner`] | the runner session: single-bridge policy, requests out, responses and notifications in |
//! | | [`session::live`] | the runner's live stream of broker messages: reconnect, backoff, backfill |
//! | | [`session::tracker`] | the objectives tracker: 150 ms debounce, refresh, `tools/list_changed` |
//! | | [`session::pending`] | the correlation table: monotonic ids, out-of-order answers, `fail_all` |
//! | [`dialect`] | [`dialect::mcp`] | MCP method names, version negotiation, `initialize` and `CallToolResult` shapes |
//! | | [`dialect::call_tool`] | the length-prefixed `call_tool` dialect: messages, parent-side decoding, the sequential client |
//! | | [`dialect::call_tool_bridge`] | the `call_tool` bridge: MCP on stdio, validated `call_tool` calls to the parent |
//! | | [`dialect::ash`] | the Ash dialect: commands and events, the per-connection bridge and the host |
//! | | [`dialect::codex`] | the JSON-RPC client for `codex app-server` and the channel sink (turn/start vs turn/steer) |
//! | | [`dialect::acp`] | the Agent Client Protocol client: session set-up with the ac7 bridge, prompt turns, permission policy |
//! | | [`dialect::delivery`] | what turn-driven runners share: events for the sink, the bundling window, "not delivered" notices |
//! | | [`dialect::schema`] | tool input schemas as JSON Schema (Draft 2020-12), compiled once |
//! | [`domain`] | [`domain::message`] | broker messages: wire shapes, reserved `data` keys, thread routing, visibility (`matches_viewer`) |
//! | | [`domain::channel`] | how a broker message reaches an agent: self-echo, channel notification meta, Codex `<channel>` text |
//! | | [`domain::objective`] | the objective lifecycle (active ⇄ blocked → done / cancelled) and who may do what |
//! | | [`domain::permission`] | the seven leaf permissions and preset expansion |
//! | | [`domain::team`] | the team and a member's role (wire shapes shared by the broker and the runner) |
//! | | [`domain::vfs`] | shared file space paths: normalisation and traversal rejection |
//! | | [`domain::toolbox`] | the runner's tools: definitions from the briefing, validation, each tool as a plan of broker requests |
//! | [`trace`] | | activity events, the HTTP/1.1 exchange assembler, Messages / Responses decoding, redaction |
//! | [`signin`] | | TOTP, device enrollment, the sign-in rate limiter |
//!
//! # Glossary
//!
//! - **bridge**: a process an agent starts that speaks MCP (or a dialect) on one side and reaches
//!   ac7 on the other. The *MCP bridge* ([`session::mcp_bridge`], `ac7 mcp-bridge`) relays to
//!   the runner; the *call_tool bridge* ([`dialect::call_tool_bridge`]) relays to a parent
//!   process; the *Ash bridge* ([`dialect::ash::bridge`]) runs the agent for an Ash host.
//! - **host**: the process that starts or drives a bridge and answers it: the call_tool parent,
//!   the Ash host ([`dialect::ash::host`]). A host's machine that sends requests is a *client*
//!   only inside the bridge ([`dialect::call_tool::CallToolClient`] is the bridge's client of
//!   its host).
//! - **runner**: the process that owns an agent's session with the broker and serves its MCP
//!   bridges over a unix socket ([`session::runner`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod civil;
pub mod codec;

/// A wall-clock time: milliseconds since 1970-01-01T00:00:00Z (negative before it). Every
/// time stamped on the wire or stored — a message's `ts`, an objective's times, an activity
/// event's `ts`, a traced exchange's start and end — is one.
pub type EpochMs = i64;

/// A sign-in time: whole seconds since 1970-01-01T00:00:00Z, the clock of the sign-in
/// machines (TOTP steps, the attempt limiter, enrollments), whose rules count in seconds.
pub type UnixSecs = u64;
pub mod dialect;
pub mod domain;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod session;
pub mod signin;
pub mod trace;

#[cfg(test)]
pub(crate) mod test_support;
