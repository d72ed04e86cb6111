//! The one event loop behind both bridge dialects (`ac7 mcp-bridge` and `--dialect call-tool`):
//! the agent's stdio on one side, a Unix socket to the parent (the runner, or a `call_tool`
//! parent) on the other, and a sans-IO session machine deciding everything.
//!
//! ```text
//!   stdin ──────────────▶ handle_agent_bytes / handle_agent_eof ─────┐
//!   connect result ─────▶ handle_connected / handle_connect_failed ───┤
//!   socket read ────────▶ handle_parent_bytes / handle_parent_closed ─┤ RelaySession
//!   SIGINT/SIGTERM ─────▶ handle_terminate ───────────────────────────┤
//!   poll_timeout elapsed ▶ handle_timeout ────────────────────────────┘
//!        poll_output: ToAgent -> stdout (blocking write + flush), then ToParent -> socket buffer,
//!                     Connect -> start connecting, Disconnect -> drop the socket,
//!                     Event -> stderr log, Exit -> flush the socket briefly and return
//! ```
//!
//! - stdout gets plain blocking writes of complete lines followed by a flush, so a slow agent
//!   applies backpressure;
//! - socket writes never block the loop (frames wait in a buffer until the socket is writable,
//!   and stdin is not read while more than `MAX_PENDING_TO_PARENT` bytes wait), so EOF and
//!   signals are handled even when the parent stopped reading; after `Exit` the last frames get
//!   `FINAL_WRITE_TIMEOUT`.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::net::UnixStream;
use tokio::signal::unix::{SignalKind, signal};

use crate::dialects::stdio::{AgentRead, AgentStdin, READ_CHUNK, recv_signal, write_stdout};
use crate::sys::append;
use crate::sys::clock::sleep_until;
use crate::sys::unix_socket::{PeerStream, SendBuf};

/// How long connecting to the parent's socket may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long teardown waits for the parent to take the bridge's last frames.
const FINAL_WRITE_TIMEOUT: Duration = Duration::from_millis(250);

/// Bytes waiting for the parent above which stdin is not read.
const MAX_PENDING_TO_PARENT: usize = 4 * 1024 * 1024;

/// What the relay asks of a bridge's session machine. Each input takes the time it happened;
/// a machine without timers ignores it.
pub(crate) trait RelaySession {
    /// What the machine reports for the log.
    type Event;
    /// Why the machine finished.
    type Exit;

    /// Bytes from the agent's stdin.
    fn handle_agent_bytes(&mut self, bytes: &[u8], now: Instant);
    /// The agent closed stdin (or stdout failed: the agent is gone).
    fn handle_agent_eof(&mut self, now: Instant);
    /// The connection asked for by [`RelayOutput::Connect`] is up.
    fn handle_connected(&mut self, now: Instant);
    /// The connection asked for by [`RelayOutput::Connect`] failed (`reason` names the socket).
    fn handle_connect_failed(&mut self, reason: &str, now: Instant);
    /// Bytes from the parent.
    fn handle_parent_bytes(&mut self, bytes: &[u8], now: Instant);
    /// The parent's socket reached EOF or failed.
    fn handle_parent_closed(&mut self, now: Instant);
    /// SIGINT or SIGTERM.
    fn handle_terminate(&mut self, now: Instant);
    /// The deadline the machine wants [`handle_timeout`](Self::handle_timeout) at, if any.
    fn poll_timeout(&self) -> Option<Instant>;
    /// The deadline from [`poll_timeout`](Self::poll_timeout) has passed.
    fn handle_timeout(&mut self, now: Instant);
    /// The next thing to do.
    fn poll_output(&mut self) -> Option<RelayOutput<Self::Event, Self::Exit>>;
    /// Logs one event.
    fn log_event(event: &Self::Event);
}

/// One thing a session asks the relay to do.
pub(crate) enum RelayOutput<E, X> {
    /// Write these bytes (complete lines) to stdout.
    ToAgent(Vec<u8>),
    /// Send these bytes to the parent.
    ToParent(Vec<u8>),
    /// Connect to the parent's socket.
    Connect,
    /// Drop the connection to the parent (and whatever still waits for it).
    Disconnect,
    /// Log this.
    Event(E),
    /// The session is over.
    Exit(X),
}

type Connecting = Pin<Box<dyn Future<Output = io::Result<PeerStream>>>>;

/// Connects to `path`; `None` when that took longer than [`CONNECT_TIMEOUT`].
pub(crate) async fn connect_within_timeout(path: &Path) -> Option<io::Result<PeerStream>> {
    let connected = tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(path)).await;
    connected
        .ok()
        .map(|result| result.and_then(PeerStream::new))
}

/// Connects to `path`, failing after [`CONNECT_TIMEOUT`].
async fn connect(path: PathBuf) -> io::Result<PeerStream> {
    connect_within_timeout(&path).await.unwrap_or_else(|| {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("timeout after {}ms", CONNECT_TIMEOUT.as_millis()),
        ))
    })
}

/// The event loop around one session; see the [module docs](self).
pub(crate) struct Relay<S: RelaySession> {
    session: S,
    /// The parent's socket path (for [`RelayOutput::Connect`]).
    path: PathBuf,
    connecting: Option<Connecting>,
    /// `None` before a connection, and once it reached EOF, failed or was dropped.
    socket: Option<PeerStream>,
    /// Frames for the parent, still to be written.
    to_parent: SendBuf,
    to_agent: Vec<u8>,
    /// Cleared once a stdout write failed (the agent is gone).
    stdout_open: bool,
}

impl<S: RelaySession> Relay<S> {
    /// A relay for `session`, already connected to `socket` or connecting to `path` when the
    /// session asks.
    pub(crate) fn new(session: S, path: PathBuf, socket: Option<PeerStream>) -> Self {
        Self {
            session,
            path,
            connecting: None,
            socket,
            to_parent: SendBuf::default(),
            to_agent: Vec::new(),
            stdout_open: true,
        }
    }

    /// Runs until the session exits; returns why.
    pub(crate) async fn run(mut self, stdin: &mut AgentStdin) -> S::Exit {
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
            let pending = self.to_parent.pending();
            let read_stdin = stdin_open && pending <= MAX_PENDING_TO_PARENT;
            let write_socket = self.socket.is_some() && pending > 0;
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
                connected = connect_result(&mut self.connecting) => {
                    self.connecting = None;
                    match connected {
                        Ok(stream) => {
                            tracing::debug!(path = %self.path.display(), "connected to the parent");
                            self.socket = Some(stream);
                            self.session.handle_connected(Instant::now());
                        }
                        Err(err) => {
                            tracing::warn!(path = %self.path.display(), error = %err, "cannot connect to the parent");
                            let reason = format!("{}: {err}", self.path.display());
                            self.session.handle_connect_failed(&reason, Instant::now());
                        }
                    }
                }
                read = read_socket(self.socket.as_ref(), &mut buf) => {
                    match read {
                        Ok(0) => self.parent_gone(None),
                        Ok(n) => self.session.handle_parent_bytes(&buf[..n], Instant::now()),
                        Err(err) => self.parent_gone(Some(err)),
                    }
                }
                ready = writable(self.socket.as_ref()), if write_socket => {
                    match ready {
                        Ok(()) => self.write_socket(),
                        Err(err) => self.parent_gone(Some(err)),
                    }
                }
                Some(()) = recv_signal(&mut sigterm) => {
                    tracing::info!("SIGTERM");
                    self.session.handle_terminate(Instant::now());
                }
                Some(()) = recv_signal(&mut sigint) => {
                    tracing::info!("SIGINT");
                    self.session.handle_terminate(Instant::now());
                }
                () = sleep_until(self.session.poll_timeout().map(Into::into)) => {
                    self.session.handle_timeout(Instant::now());
                }
            }
            if let Some(exit) = self.pump() {
                self.flush_socket().await;
                return exit;
            }
        }
    }

    /// The connection to the parent reached EOF or failed.
    fn parent_gone(&mut self, err: Option<io::Error>) {
        if let Some(err) = err {
            tracing::warn!(error = %err, "the parent socket failed");
        }
        self.socket = None;
        self.to_parent.clear();
        self.session.handle_parent_closed(Instant::now());
    }

    /// Writes what the socket takes now, without waiting.
    fn write_socket(&mut self) {
        if let Some(socket) = &self.socket
            && let Err(err) = self.to_parent.write_to(socket)
        {
            self.parent_gone(Some(err));
        }
    }

    /// Drains the session's outputs and performs them: stdout synchronously, then the socket as
    /// far as it takes bytes now. Returns the exit once the session has finished.
    ///
    /// Stdout goes first, and what a round has for the parent is sent only once that round's
    /// stdout write succeeded: an acknowledgement of a notification never reaches the parent
    /// unless its line reached the agent's pipe.
    fn pump(&mut self) -> Option<S::Exit> {
        let mut exit = None;
        loop {
            let mut any = false;
            let mut for_parent: Vec<Vec<u8>> = Vec::new();
            while let Some(output) = self.session.poll_output() {
                any = true;
                match output {
                    RelayOutput::ToAgent(bytes) => append(&mut self.to_agent, bytes),
                    RelayOutput::ToParent(bytes) => for_parent.push(bytes),
                    RelayOutput::Connect => {
                        self.connecting = Some(Box::pin(connect(self.path.clone())));
                    }
                    RelayOutput::Disconnect => {
                        self.socket = None;
                        self.connecting = None;
                        self.to_parent.clear();
                        for_parent.clear();
                    }
                    RelayOutput::Event(event) => S::log_event(&event),
                    RelayOutput::Exit(reason) => exit = Some(reason),
                }
            }
            if !any {
                return exit;
            }
            let bytes = std::mem::take(&mut self.to_agent);
            if !bytes.is_empty()
                && self.stdout_open
                && let Err(err) = write_stdout(&bytes)
            {
                tracing::warn!(error = %err, "writing to stdout failed; the agent is gone");
                self.stdout_open = false;
                // What this round had for the parent may acknowledge lines that never arrived.
                for_parent.clear();
                self.session.handle_agent_eof(Instant::now());
            }
            for frame in for_parent {
                self.to_parent.push(frame);
            }
            // A failed write feeds the session (parent closed / agent gone), which queues the
            // teardown's outputs: the next round performs them.
            if self.socket.is_some() {
                self.write_socket();
            } else {
                self.to_parent.clear();
            }
        }
    }

    /// At exit: gives the parent a short time to take the last frames (the `shutdown` frame).
    async fn flush_socket(&mut self) {
        let flushed = async {
            while self.to_parent.pending() > 0 {
                let Some(socket) = &self.socket else { return };
                match socket.writable().await {
                    Ok(()) => self.write_socket(),
                    Err(_) => return,
                }
            }
        };
        if tokio::time::timeout(FINAL_WRITE_TIMEOUT, flushed)
            .await
            .is_err()
        {
            tracing::warn!("the parent did not read the bridge's last frames");
        }
    }
}

async fn connect_result(connecting: &mut Option<Connecting>) -> io::Result<PeerStream> {
    match connecting {
        Some(fut) => fut.await,
        None => std::future::pending().await,
    }
}

async fn read_socket(socket: Option<&PeerStream>, buf: &mut [u8]) -> io::Result<usize> {
    match socket {
        Some(socket) => socket.read(buf).await,
        None => std::future::pending().await,
    }
}

async fn writable(socket: Option<&PeerStream>) -> io::Result<()> {
    match socket {
        Some(socket) => socket.writable().await,
        None => std::future::pending().await,
    }
}
