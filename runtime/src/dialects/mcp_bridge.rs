//! `ac7 mcp-bridge`: the process an agent spawns as its MCP server. It relays MCP JSON-RPC
//! between the agent (its stdin/stdout) and the runner (the Unix socket named by
//! `AC7_RUNNER_SOCKET`).
//!
//! All protocol decisions are made by [`BridgeSession`]; this driver only pumps bytes:
//!
//! ```text
//!   stdin ─────────────────▶ handle_agent_bytes / handle_agent_eof ─┐
//!   socket read  ──────────▶ handle_runner_bytes / handle_runner_closed ─┤ BridgeSession
//!   SIGINT/SIGTERM ────────▶ handle_terminate ───────────────────────┤
//!   poll_timeout elapsed ──▶ handle_timeout (start-up grace) ─────────┘
//!        poll_output: Transmit{Agent} -> stdout (blocking write + flush), Transmit{Runner} -> socket buffer,
//!                     Event -> stderr log, Exit -> flush and exit 0
//! ```
//!
//! Design notes, chosen for start-up time and memory (see `ac7-bench bridge`):
//! - a current-thread tokio runtime (no worker pool), created only after the environment check;
//! - stdin, when it is a pipe or a socket (what agents pass), is read on the runtime thread itself;
//!   otherwise by one small dedicated thread into a bounded channel (tokio's own stdin would go
//!   through the blocking pool), which the process does not join at exit, since it may be
//!   blocked in `read`;
//! - stdout gets plain blocking writes of complete lines followed by a flush, so a slow agent
//!   applies backpressure;
//! - socket writes never block the loop (frames wait in a buffer until the socket is writable,
//!   and stdin is not read while more than 4 MiB wait), so EOF and signals are handled even when
//!   the runner stopped reading; after [`BridgeOutput::Exit`] the last frames get 250 ms.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ac7_protocol::bridge::{
    BridgeConfig, BridgeEvent, BridgeOutput, BridgeSession, ExitReason, Peer,
};
use tokio::net::UnixStream;
use tokio::signal::unix::{SignalKind, signal};

use crate::dialects::stdio::{
    AgentRead, AgentStdin, READ_CHUNK, append, recv_signal, write_stdout,
};
use crate::unix_socket::SendBuf;

/// The environment variable the runner sets in the bridge's MCP server entry.
pub const RUNNER_SOCKET_ENV: &str = "AC7_RUNNER_SOCKET";

/// How long the bridge waits for the runner's socket to accept it.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long teardown waits for the runner to take the bridge's last frames.
const FINAL_WRITE_TIMEOUT: Duration = Duration::from_millis(250);

/// Environment and exit codes, shown by `ac7 mcp-bridge --help`.
pub const HELP_FOOTER: &str = "\
Environment:
  AC7_RUNNER_SOCKET  the runner's Unix socket (required; the runner sets it)
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
    /// `call-tool` (length-prefixed `call_tool` requests to a parent process, seed 001).
    #[arg(long, value_enum, default_value_t = Dialect::Ac7)]
    pub dialect: Dialect,
    /// call-tool: the tool-schema file the parent wrote (JSON array of
    /// `{name, description, input_schema}`, mode 0600).
    #[arg(long, value_name = "PATH")]
    pub schema_file: Option<PathBuf>,
    /// call-tool: the parent's Unix socket.
    #[arg(long, value_name = "PATH", env = crate::dialects::call_tool_bridge::CALL_TOOL_SOCKET_ENV)]
    pub socket: Option<PathBuf>,
}

/// Which parent the bridge talks to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Dialect {
    /// An ac7 runner.
    #[default]
    Ac7,
    /// A seed-001 `call_tool` parent.
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
        return crate::dialects::call_tool_bridge::run(args.schema_file, args.socket);
    }
    if args.schema_file.is_some() {
        eprintln!("ac7 mcp-bridge: --schema-file is only used with --dialect call-tool");
        return 1;
    }
    match run_bridge(std::env::var_os(RUNNER_SOCKET_ENV)) {
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

fn run_bridge(socket: Option<OsString>) -> Result<ExitReason, BridgeError> {
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
        let mut stdin = AgentStdin::open().map_err(BridgeError::Start)?;
        let config = BridgeConfig {
            server_version: env!("CARGO_PKG_VERSION").to_owned(),
            ..BridgeConfig::default()
        };
        let reason = Relay::new(BridgeSession::new(config), stream)
            .run(&mut stdin)
            .await;
        stdin.restore();
        Ok(reason)
    })
}

async fn connect(path: &Path) -> Result<UnixStream, BridgeError> {
    match tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(path)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(source)) => Err(BridgeError::Connect {
            path: path.to_owned(),
            source,
        }),
        Err(_) => Err(BridgeError::ConnectTimeout {
            path: path.to_owned(),
            timeout: CONNECT_TIMEOUT,
        }),
    }
}

/// The event loop: inputs into the session, its outputs to stdout / the socket.
///
/// Socket writes never block the loop: frames wait in `to_runner` and go out as the socket
/// becomes writable, so the agent's EOF and signals are handled even while a runner is not
/// reading. While more than [`MAX_PENDING_TO_RUNNER`] bytes wait, stdin is not read (the agent
/// is slowed down rather than buffered without limit).
struct Relay {
    session: BridgeSession,
    socket: UnixStream,
    /// Cleared once the socket reached EOF or failed.
    socket_open: bool,
    /// Cleared once a stdout write failed (the agent is gone).
    stdout_open: bool,
    to_agent: Vec<u8>,
    /// Frames for the runner, still to be written.
    to_runner: SendBuf,
}

/// Bytes waiting for the runner above which stdin is not read.
const MAX_PENDING_TO_RUNNER: usize = 4 * 1024 * 1024;

impl Relay {
    fn new(session: BridgeSession, socket: UnixStream) -> Self {
        Self {
            session,
            socket,
            socket_open: true,
            stdout_open: true,
            to_agent: Vec::new(),
            to_runner: SendBuf::default(),
        }
    }

    fn pending_to_runner(&self) -> usize {
        self.to_runner.pending()
    }

    async fn run(mut self, stdin: &mut AgentStdin) -> ExitReason {
        // Installing the handlers replaces the default "terminate" action, so a signal always
        // goes through the session's teardown. If they cannot be installed the defaults stay.
        let mut sigterm = signal(SignalKind::terminate())
            .inspect_err(|err| tracing::warn!(error = %err, "cannot handle SIGTERM"))
            .ok();
        let mut sigint = signal(SignalKind::interrupt())
            .inspect_err(|err| tracing::warn!(error = %err, "cannot handle SIGINT"))
            .ok();
        let mut stdin_open = true;
        let mut stdin_buf = vec![0u8; READ_CHUNK];
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            let read_stdin = stdin_open && self.pending_to_runner() <= MAX_PENDING_TO_RUNNER;
            let write_socket = self.socket_open && self.pending_to_runner() > 0;
            tokio::select! {
                input = stdin.read(&mut stdin_buf), if read_stdin => {
                    let now = Instant::now();
                    match input {
                        AgentRead::Data(n) => self.session.handle_agent_bytes(&stdin_buf[..n], now),
                        AgentRead::Failed(err) => {
                            tracing::warn!(error = %err, "reading stdin failed; treating it as closed");
                            stdin_open = false;
                            self.session.handle_agent_eof(now);
                        }
                        AgentRead::Eof => {
                            stdin_open = false;
                            self.session.handle_agent_eof(now);
                        }
                    }
                }
                ready = self.socket.readable(), if self.socket_open => {
                    match ready.and_then(|()| self.socket.try_read(&mut buf)) {
                        Ok(0) => self.runner_gone(None),
                        Ok(n) => self.session.handle_runner_bytes(&buf[..n], Instant::now()),
                        Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                        Err(err) => self.runner_gone(Some(err)),
                    }
                }
                ready = self.socket.writable(), if write_socket => {
                    if let Err(err) = ready {
                        self.runner_gone(Some(err));
                    }
                    self.write_socket();
                }
                Some(()) = recv_signal(&mut sigterm) => {
                    tracing::info!("SIGTERM");
                    self.session.handle_terminate(Instant::now());
                }
                Some(()) = recv_signal(&mut sigint) => {
                    tracing::info!("SIGINT");
                    self.session.handle_terminate(Instant::now());
                }
                () = sleep_until(self.session.poll_timeout()) => {
                    self.session.handle_timeout(Instant::now());
                }
            }
            if let Some(reason) = self.pump() {
                self.flush_socket().await;
                return reason;
            }
        }
    }

    /// The socket reached EOF or failed.
    fn runner_gone(&mut self, err: Option<io::Error>) {
        if let Some(err) = err {
            tracing::warn!(error = %err, "the runner socket failed");
        }
        self.socket_open = false;
        self.session.handle_runner_closed(Instant::now());
    }

    /// Writes what the socket takes now, without waiting.
    fn write_socket(&mut self) {
        if self.socket_open
            && let Err(err) = self.to_runner.write_to(&self.socket)
        {
            self.runner_gone(Some(err));
        }
    }

    /// Drains the session's outputs and performs them: stdout synchronously, the socket as far as
    /// it takes bytes now. Returns the exit reason once the session has torn down.
    fn pump(&mut self) -> Option<ExitReason> {
        let mut exit = None;
        loop {
            let mut any = false;
            while let Some(output) = self.session.poll_output() {
                any = true;
                match output {
                    BridgeOutput::Transmit {
                        to: Peer::Agent,
                        bytes,
                    } => append(&mut self.to_agent, bytes),
                    BridgeOutput::Transmit {
                        to: Peer::Runner,
                        bytes,
                    } => self.to_runner.push(bytes),
                    BridgeOutput::Event(event) => log_event(&event),
                    BridgeOutput::Exit(reason) => exit = Some(reason),
                }
            }
            if !any {
                return exit;
            }
            // A failed write feeds the session (runner closed / agent gone), which queues the
            // teardown's outputs: the next round performs them.
            if self.socket_open {
                self.write_socket();
            } else {
                self.to_runner.clear();
            }
            let bytes = std::mem::take(&mut self.to_agent);
            if !bytes.is_empty()
                && self.stdout_open
                && let Err(err) = write_stdout(&bytes)
            {
                tracing::warn!(error = %err, "writing to stdout failed; the agent is gone");
                self.stdout_open = false;
                self.session.handle_agent_eof(Instant::now());
            }
        }
    }

    /// At exit: gives the runner a short time to take the last frames (the `shutdown` frame).
    async fn flush_socket(&mut self) {
        let flushed = async {
            while self.socket_open && self.pending_to_runner() > 0 {
                match self.socket.writable().await {
                    Ok(()) => self.write_socket(),
                    Err(_) => return,
                }
            }
        };
        if tokio::time::timeout(FINAL_WRITE_TIMEOUT, flushed)
            .await
            .is_err()
        {
            tracing::warn!("the runner did not read the bridge's last frames");
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

fn log_event(event: &BridgeEvent) {
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
        BridgeEvent::Released { count } => {
            tracing::debug!(count, "the agent is ready; held notifications relayed");
        }
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
    }
}
