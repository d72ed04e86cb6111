//! `ac7 mcp-bridge`: the process an agent spawns as its MCP server. It relays MCP JSON-RPC
//! between the agent (its stdin/stdout) and the runner (the Unix socket named by
//! `AC7_RUNNER_SOCKET`).
//!
//! All protocol decisions are made by [`BridgeSession`]; `Relay` (`dialects/relay.rs`) (shared with
//! the call-tool dialect) pumps the bytes: stdin and the runner's socket into the session, its
//! outputs to stdout and the socket, signals and the start-up hold's timer as inputs.
//!
//! Design notes, chosen for start-up time and memory (see `ac7-bench bridge`):
//! - a current-thread tokio runtime (no worker pool), created only after the environment check;
//! - stdin as `dialects/stdio.rs` reads it (on the runtime thread for pipes and sockets);
//! - the relay's bounded socket buffer: stdin is not read while more than 4 MiB wait for the
//!   runner, and after [`BridgeOutput::Exit`] the last frames get 250 ms.

use std::ffi::OsString;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::dialects::relay::{Relay, RelayOutput, RelaySession, connect_within_timeout};
use crate::dialects::stdio::AgentStdin;
use crate::sys::unix_socket::PeerStream;
use ac7_protocol::session::mcp_bridge::{
    BridgeConfig, BridgeEvent, BridgeOutput, BridgePeer, BridgeSession, ExitReason, ReleasedBy,
};

pub use crate::dialects::relay::CONNECT_TIMEOUT;

/// The environment variable the runner sets in the bridge's MCP server entry.
pub const RUNNER_SOCKET_ENV: &str = "AC7_RUNNER_SOCKET";

/// Set to `1` by a runner that takes the agent's stdio over from its bridge: the bridge then
/// sends its stdin and stdout to the runner (when both are pipes or sockets) and stays only as
/// the process the agent started, so a request crosses one process fewer.
pub const STDIO_HANDOFF_ENV: &str = "AC7_RUNNER_STDIO_HANDOFF";

/// How long a bridge that handed its stdio over waits, after SIGTERM/SIGINT, for the runner to
/// finish the session before it exits anyway.
const HANDOFF_STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// Environment and exit codes, shown by `ac7 mcp-bridge --help`.
pub const HELP_FOOTER: &str = "\
Environment:
  AC7_RUNNER_SOCKET  the runner's Unix socket (required; the runner sets it)
  AC7_RUNNER_STDIO_HANDOFF  1: hand stdin and stdout (pipes or sockets) to the runner, which
                     serves the agent itself while this process waits (the runner sets it)
  AC7_LOG            log filter for the JSON lines on stderr: error, warn (default), info, debug, trace
  AC7_CALL_TOOL_SOCKET  --dialect call-tool: the parent's socket when --socket is not given

Exit status: 0 when the agent closes stdin, the runner shuts down or goes away, or on SIGINT/SIGTERM
(every pending request is answered first); 1 when AC7_RUNNER_SOCKET is missing or the runner
cannot be reached, or (call-tool) when the schema file is missing, invalid or readable by group or
others, or no socket is given (one line on stderr says why).";

/// `ac7 mcp-bridge`: relay MCP between this process's stdio and the runner's socket.
///
/// Started by the agent from the MCP server entry a runner writes (`ac7 claude-code`,
/// `ac7 run -- <cmd>`); the runner passes its socket in `AC7_RUNNER_SOCKET`. Logs go to stderr
/// as JSON lines, filtered by `AC7_LOG` (default `warn`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct McpBridgeArgs {
    /// The protocol spoken with the parent: `ac7` (the runner's socket, `AC7_RUNNER_SOCKET`) or
    /// `call-tool` (length-prefixed `call_tool` requests to a parent process).
    #[arg(long, value_enum, default_value_t = Dialect::Ac7)]
    pub dialect: Dialect,
    /// call-tool: the tool-schema file the parent wrote (JSON array of
    /// `{name, description, input_schema}`, mode 0600).
    #[arg(long, value_name = "PATH")]
    pub schema_file: Option<PathBuf>,
    /// call-tool: the parent's Unix socket.
    #[arg(long, value_name = "PATH", env = crate::dialects::call_tool_bridge::CALL_TOOL_SOCKET_ENV)]
    pub socket: Option<PathBuf>,
    /// call-tool: seconds a call sent to the parent may wait for its reply; past that the agent
    /// gets an isError result naming the timeout, the connection is dropped and the next call
    /// reconnects (default 120).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub call_timeout: Option<u64>,
    /// call-tool: the call timeout in milliseconds, over --call-timeout. Hidden: for tests.
    #[arg(
        long,
        hide = true,
        value_name = "MS",
        env = crate::dialects::call_tool_bridge::CALL_TIMEOUT_MS_ENV,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub call_timeout_ms: Option<u64>,
}

impl McpBridgeArgs {
    /// The call-tool bridge's call timeout: `--call-timeout-ms`, else `--call-timeout`, else
    /// 120 s.
    pub fn call_timeout(&self) -> Duration {
        match (self.call_timeout_ms, self.call_timeout) {
            (Some(ms), _) => Duration::from_millis(ms),
            (None, Some(secs)) => Duration::from_secs(secs),
            (None, None) => ac7_protocol::dialect::call_tool::DEFAULT_CALL_TIMEOUT,
        }
    }
}

/// Which parent the bridge talks to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Dialect {
    /// An ac7 runner.
    #[default]
    Ac7,
    /// A `call_tool` parent (length-prefixed JSON over a Unix socket).
    CallTool,
}

/// Why the bridge could not start relaying.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// `AC7_RUNNER_SOCKET` is unset or empty.
    #[error(
        "{RUNNER_SOCKET_ENV} is not set (or empty) — the bridge is started by an ac7 runner, not by hand: \
         run your agent through one (ac7 claude-code, or ac7 run -- <cmd>)"
    )]
    NoSocket,
    /// Connecting to the runner failed.
    #[error(
        "failed to connect to runner at {}: {source} (is the runner that set {RUNNER_SOCKET_ENV} still running?)",
        path.display()
    )]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The runner did not accept within [`CONNECT_TIMEOUT`].
    #[error(
        "failed to connect to runner at {}: timeout after {}ms connecting to {}",
        path.display(),
        timeout.as_millis(),
        path.display()
    )]
    ConnectTimeout {
        /// The socket path.
        path: PathBuf,
        /// The limit.
        timeout: Duration,
    },
    /// The async runtime or the stdin thread could not be started.
    #[error("could not start: {0}")]
    Start(io::Error),
}

/// Runs `ac7 mcp-bridge` and returns the process exit code: 0 after a normal teardown, 1 when it
/// could not start (the reason is printed on stderr as one line).
pub fn run(args: McpBridgeArgs) -> i32 {
    if args.dialect == Dialect::CallTool {
        let call_timeout = args.call_timeout();
        return crate::dialects::call_tool_bridge::run(args.schema_file, args.socket, call_timeout);
    }
    if args.schema_file.is_some() {
        eprintln!("ac7 mcp-bridge: --schema-file is only used with --dialect call-tool");
        return 1;
    }
    if args.call_timeout.is_some() {
        eprintln!("ac7 mcp-bridge: --call-timeout is only used with --dialect call-tool");
        return 1;
    }
    let handoff = std::env::var_os(STDIO_HANDOFF_ENV).is_some_and(|v| v == "1");
    match run_bridge(std::env::var_os(RUNNER_SOCKET_ENV), handoff) {
        Ok(reason) => {
            tracing::info!(reason = reason.label(), "bridge exiting");
            0
        }
        Err(err) => {
            eprintln!("ac7 mcp-bridge: {err}");
            1
        }
    }
}

fn run_bridge(socket: Option<OsString>, handoff: bool) -> Result<ExitReason, BridgeError> {
    let path = socket
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .ok_or(BridgeError::NoSocket)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(BridgeError::Start)?;
    runtime.block_on(async {
        let stream = connect(&path).await?;
        crate::logging::init(crate::logging::DEFAULT_LEVEL);
        tracing::debug!(path = %path.display(), "connected to runner");
        if handoff && stdio_can_be_handed_over() {
            return hand_over(stream).await.map_err(BridgeError::Start);
        }
        let mut stdin = AgentStdin::open().map_err(BridgeError::Start)?;
        let config = BridgeConfig {
            server_version: env!("CARGO_PKG_VERSION").to_owned(),
            ..BridgeConfig::default()
        };
        let reason = Relay::new(BridgeSession::new(config), path.clone(), Some(stream))
            .run(&mut stdin)
            .await;
        stdin.restore();
        Ok(reason)
    })
}

/// Whether stdin and stdout are each a pipe or a socket: what the runner can watch.
fn stdio_can_be_handed_over() -> bool {
    [io::stdin().as_fd(), io::stdout().as_fd()]
        .into_iter()
        .all(|fd| crate::sys::is_pipe_or_socket(fd).unwrap_or(false))
}

/// Sends stdin and stdout to the runner, then waits for the runner to end the session
/// (`shutdown` with its reason, then EOF). SIGTERM/SIGINT are passed on as `shutdown`, and the
/// runner gets [`HANDOFF_STOP_TIMEOUT`] to answer what is pending before this process exits.
async fn hand_over(stream: PeerStream) -> io::Result<ExitReason> {
    use ac7_protocol::codec::frame::{
        Decoded, Frame, FrameDecoder, MAX_FRAME_BYTES, STDIO_HANDOFF, Shutdown, encode_frame_vec,
    };
    use tokio::signal::unix::{SignalKind, signal};

    let mut sigterm = signal(SignalKind::terminate()).ok();
    let mut sigint = signal(SignalKind::interrupt()).ok();
    stream
        .send_with_fds(STDIO_HANDOFF, &[io::stdin().as_fd(), io::stdout().as_fd()])
        .await?;
    let mut frames = FrameDecoder::new(MAX_FRAME_BYTES);
    let mut buf = vec![0u8; 4096];
    let mut reason = None;
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let signalled = tokio::select! {
            read = stream.read(&mut buf) => match read {
                Ok(n) if n > 0 => {
                    frames.push(&buf[..n]);
                    while let Some(decoded) = frames.decode() {
                        match decoded {
                            Decoded::Frame(Frame::Shutdown(shutdown)) => reason = Some(shutdown.reason),
                            other => tracing::warn!(
                                line = crate::runner::stdio_handoff::line_kind(&other),
                                "unexpected line from the runner after the handoff; ignored"
                            ),
                        }
                    }
                    false
                }
                // EOF (or a failed read): after `shutdown`, the session's end; else the runner
                // died while serving the agent's stdio (the reason says so in the exit log).
                _ => {
                    return Ok(match reason {
                        Some(reason) => ExitReason::RunnerShutdown { reason },
                        None => ExitReason::RunnerClosed,
                    });
                }
            },
            Some(()) = crate::dialects::stdio::recv_signal(&mut sigterm) => true,
            Some(()) = crate::dialects::stdio::recv_signal(&mut sigint) => true,
            // Signalled, and the runner did not end the session in time.
            () = crate::sys::clock::sleep_until(deadline) => return Ok(ExitReason::Terminated),
        };
        if signalled && deadline.is_none() {
            deadline = Some(tokio::time::Instant::now() + HANDOFF_STOP_TIMEOUT);
            let frame = Frame::Shutdown(Shutdown {
                reason: Some(ExitReason::Terminated.label().to_owned()),
            });
            if let Ok(bytes) = encode_frame_vec(&frame, MAX_FRAME_BYTES)
                && stream.write_all(&bytes).await.is_err()
            {
                return Ok(ExitReason::Terminated);
            }
        }
    }
}

async fn connect(path: &Path) -> Result<PeerStream, BridgeError> {
    match connect_within_timeout(path).await {
        Some(Ok(stream)) => Ok(stream),
        Some(Err(source)) => Err(BridgeError::Connect {
            path: path.to_owned(),
            source,
        }),
        None => Err(BridgeError::ConnectTimeout {
            path: path.to_owned(),
            timeout: CONNECT_TIMEOUT,
        }),
    }
}

impl RelaySession for BridgeSession {
    type Event = BridgeEvent;
    type Exit = ExitReason;

    fn handle_agent_bytes(&mut self, bytes: &[u8], now: Instant) {
        BridgeSession::handle_agent_bytes(self, bytes, now);
    }
    fn handle_agent_eof(&mut self, now: Instant) {
        BridgeSession::handle_agent_eof(self, now);
    }
    // The runner's socket is connected before the relay starts; the session never asks again.
    fn handle_connected(&mut self, _now: Instant) {}
    fn handle_connect_failed(&mut self, _reason: &str, now: Instant) {
        self.handle_runner_closed(now);
    }
    fn handle_parent_bytes(&mut self, bytes: &[u8], now: Instant) {
        self.handle_runner_bytes(bytes, now);
    }
    fn handle_parent_closed(&mut self, now: Instant) {
        self.handle_runner_closed(now);
    }
    fn handle_terminate(&mut self, now: Instant) {
        BridgeSession::handle_terminate(self, now);
    }
    fn poll_timeout(&self) -> Option<Instant> {
        BridgeSession::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Instant) {
        BridgeSession::handle_timeout(self, now);
    }
    fn poll_output(&mut self) -> Option<RelayOutput<BridgeEvent, ExitReason>> {
        loop {
            return Some(match BridgeSession::poll_output(self)? {
                BridgeOutput::Transmit {
                    to: BridgePeer::Agent,
                    bytes,
                } => RelayOutput::ToAgent(bytes),
                BridgeOutput::Transmit {
                    to: BridgePeer::Runner,
                    bytes,
                } => RelayOutput::ToParent(bytes),
                BridgeOutput::Event(event) => RelayOutput::Event(event),
                BridgeOutput::Exit(reason) => RelayOutput::Exit(reason),
                other => {
                    tracing::warn!(?other, "mcp-bridge: an output this version does not handle");
                    continue;
                }
            });
        }
    }
    fn log_event(event: &BridgeEvent) {
        log_event(event);
    }
}

pub(crate) fn log_event(event: &BridgeEvent) {
    match event {
        BridgeEvent::AgentLineInvalid { len, code, detail } => {
            tracing::warn!(
                len,
                code,
                detail,
                "invalid line from the agent answered with an error"
            );
        }
        BridgeEvent::Forwarded { id, method } => {
            tracing::debug!(id, method, "request forwarded to the runner");
        }
        BridgeEvent::Answered {
            id,
            method,
            elapsed,
            ok,
        } => {
            let elapsed_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
            tracing::debug!(id, method, elapsed_us, ok, "request answered");
        }
        BridgeEvent::RequestTooLarge { method, len, max } => {
            tracing::warn!(
                method,
                len,
                max,
                "request too large for an IPC frame; answered with an error"
            );
        }
        BridgeEvent::Cancelled { id } => tracing::debug!(id, "request cancelled by the agent"),
        BridgeEvent::AgentNotificationIgnored { method } => {
            tracing::debug!(method, "notification from the agent ignored");
        }
        BridgeEvent::AgentResponseIgnored => tracing::debug!("response from the agent ignored"),
        BridgeEvent::FrameDropped(dropped) => {
            tracing::warn!(len = dropped.len, reason = %dropped.reason, "dropped malformed IPC frame");
        }
        BridgeEvent::Unmatched { id } => {
            tracing::warn!(id, "response for an id that is not pending dropped");
        }
        BridgeEvent::UnexpectedFrame { kind } => {
            tracing::warn!(
                kind = kind.as_str(),
                "unexpected frame kind from the runner ignored"
            );
        }
        BridgeEvent::RunnerError { message, id } => {
            tracing::warn!(message, id, "error frame from the runner");
        }
        BridgeEvent::Probed { count } => {
            tracing::debug!(
                count,
                "start-up probe (tools/list_changed) written: is the agent listening yet?"
            );
        }
        BridgeEvent::Released { count, by } => match by {
            ReleasedBy::Probe { probes } => tracing::info!(
                count,
                probes,
                "the agent is ready (it answered a start-up probe); held notifications relayed"
            ),
            ReleasedBy::Ceiling { probes } => tracing::warn!(
                count,
                probes,
                "the agent never answered a start-up probe; held notifications relayed anyway"
            ),
            ReleasedBy::Grace => tracing::debug!(
                count,
                "the agent is ready (start-up grace over); held notifications relayed"
            ),
        },
        BridgeEvent::HoldFull { method, held } => {
            tracing::warn!(
                method,
                held,
                "notification not kept: the start-up hold is full (the agent has not finished its handshake)"
            );
        }
        BridgeEvent::HeldDiscarded { count } => {
            tracing::warn!(
                count,
                "notifications held for start-up not delivered: the bridge closed before the agent was ready"
            );
        }
        other => tracing::debug!(?other, "bridge event"),
    }
}
