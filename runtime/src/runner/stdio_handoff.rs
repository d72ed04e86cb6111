//! The agent's stdio served by the runner itself, once its bridge handed it over.
//!
//! A bridge started with `AC7_RUNNER_STDIO_HANDOFF=1` whose stdin and stdout are pipes or
//! sockets sends [`STDIO_HANDOFF`] with both descriptors attached, first thing on its
//! connection. The runner then runs the bridge's own session machine ([`BridgeSession`]) here,
//! in its own process: the agent's requests are read from the agent's pipe, and answers and
//! notifications written to it, with no process in between. To the runner's session this is an
//! ordinary connection: the frames the bridge machine has for the runner arrive as that
//! connection's bytes, and what the runner session sends to the connection goes into the
//! machine. The bridge process stays alive as the process the agent started (the agent watches
//! it), holding the socket, and exits when this ends.
//!
//! ```text
//!   agent ──pipe──▶ read ──▶ BridgeSession ──frames──▶ inbox ──▶ RunnerSession
//!   agent ◀─pipe─── write ◀── BridgeSession ◀─frames── channel ◀── RunnerSession
//!   bridge ──socket──▶ `shutdown` (SIGTERM/SIGINT) or EOF (killed): teardown
//!   bridge ◀─socket─── `shutdown{reason}` when the session is over, then EOF
//! ```
//!
//! What the bridge process guarantees holds here too: a notification is acknowledged only once
//! its line is in the agent's pipe (what a round has for the runner waits while the agent's pipe
//! is full, and the agent's requests are not read meanwhile); every request is answered, with
//! an error at teardown; and the descriptors are put back in blocking mode before they are
//! closed. An agent that stops reading while more than the connection's backlog limit waits for
//! it is treated as gone, as a bridge would be.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ac7_protocol::codec::frame::{
    Decoded, Frame, FrameDecoder, MAX_FRAME_BYTES, STDIO_HANDOFF, Shutdown, encode_frame_vec,
};
use ac7_protocol::session::mcp_bridge::{
    BridgeConfig, BridgeOutput, BridgePeer, BridgeSession, ExitReason,
};
use ac7_protocol::session::runner::IpcConnId;
use tokio::sync::mpsc;

use crate::sys::clock::sleep_until;
use crate::sys::unix_socket::{PeerStream, SendBuf, WatchedFd};

/// Bytes read from the agent per `read` call.
const READ_CHUNK: usize = 64 * 1024;

/// How long the last lines for the agent may take at teardown.
const FINAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether a connection's first read is a stdio handoff: the line, alone, with two descriptors.
pub(crate) fn is_handoff(bytes: &[u8], fds: &[OwnedFd]) -> bool {
    bytes == STDIO_HANDOFF && fds.len() == 2
}

/// What a line on the handoff socket was, for the log: its frame kind, or `malformed`.
pub(crate) fn line_kind(decoded: &Decoded) -> &'static str {
    match decoded {
        Decoded::Frame(frame) => frame.kind().as_str(),
        Decoded::Dropped(_) => "malformed",
    }
}

/// What the served stdio gives the runner's session: a connection's bytes, or its end.
pub(crate) trait ToRunner {
    /// Frames from the bridge machine, as if read from the connection.
    fn frames(&self, bytes: Vec<u8>) -> impl Future<Output = ()> + Send;
    /// The connection ended.
    fn closed(&self) -> impl Future<Output = ()> + Send;
}

/// The agent's stdio and the bridge process's socket, handed over.
pub(crate) struct Handoff {
    /// The agent's requests (the bridge's stdin).
    pub(crate) stdin: WatchedFd,
    /// Where the agent reads answers (the bridge's stdout).
    pub(crate) stdout: WatchedFd,
    /// The socket to the bridge process.
    pub(crate) bridge: Arc<PeerStream>,
}

impl Handoff {
    /// Takes the two descriptors of a handoff (stdin, then stdout).
    pub(crate) fn take(fds: Vec<OwnedFd>, bridge: Arc<PeerStream>) -> io::Result<Self> {
        let [stdin, stdout]: [OwnedFd; 2] = fds
            .try_into()
            .map_err(|_| io::Error::other("a handoff carries exactly two descriptors"))?;
        for fd in [&stdin, &stdout] {
            if !crate::sys::is_pipe_or_socket(fd.as_fd())? {
                return Err(io::Error::other(
                    "a handed-over stdin or stdout is neither a pipe nor a socket",
                ));
            }
        }
        Ok(Self {
            stdin: WatchedFd::new(stdin)?,
            stdout: WatchedFd::new(stdout)?,
            bridge,
        })
    }
}

/// The served stdio of one connection; see the [module docs](self).
struct Served<R> {
    conn: IpcConnId,
    session: BridgeSession,
    io: Handoff,
    runner: R,
    /// Lines for the agent not yet taken by its pipe.
    to_agent: SendBuf,
    /// Frames for the runner held until `to_agent` is empty.
    held: Vec<u8>,
    stdout_open: bool,
    max_backlog_bytes: usize,
}

/// Serves the agent's stdio for connection `conn` until the bridge machine exits: `frames` are
/// what the runner session sends to the connection (closed when the runner closes it), `runner`
/// takes what the machine sends back. Then puts the descriptors back in blocking mode and tells
/// the bridge process why it ended.
pub(crate) async fn serve<R: ToRunner>(
    conn: IpcConnId,
    config: BridgeConfig,
    io: Handoff,
    mut frames: mpsc::UnboundedReceiver<Vec<u8>>,
    runner: R,
    max_backlog_bytes: usize,
) {
    tracing::info!(conn = conn.0, "the bridge handed the agent's stdio over");
    let mut served = Served {
        conn,
        session: BridgeSession::new(config),
        io,
        runner,
        to_agent: SendBuf::default(),
        held: Vec::new(),
        stdout_open: true,
        max_backlog_bytes,
    };
    let mut stdin_open = true;
    let mut frames_open = true;
    let mut bridge_open = true;
    let mut bridge_frames = FrameDecoder::new(MAX_FRAME_BYTES);
    let mut stdin_buf = vec![0u8; READ_CHUNK];
    let mut bridge_buf = vec![0u8; 4096];
    let exit = loop {
        if let Some(exit) = served.pump().await {
            break exit;
        }
        let read_stdin = stdin_open && served.held.is_empty();
        let write_stdout = served.stdout_open && served.to_agent.pending() > 0;
        tokio::select! {
            read = served.io.stdin.read(&mut stdin_buf), if read_stdin => {
                let now = Instant::now();
                match read {
                    Ok(n) if n > 0 => served.session.handle_agent_bytes(&stdin_buf[..n], now),
                    // EOF, or a failed read: the agent closed its end either way.
                    _ => {
                        stdin_open = false;
                        served.session.handle_agent_eof(now);
                    }
                }
            }
            frame = frames.recv(), if frames_open => match frame {
                Some(bytes) => served.session.handle_runner_bytes(&bytes, Instant::now()),
                None => {
                    frames_open = false;
                    served.session.handle_runner_closed(Instant::now());
                }
            },
            ready = served.io.stdout.writable(), if write_stdout => match ready {
                Ok(()) => {
                    served.write_stdout();
                }
                Err(err) => served.agent_gone(&err.to_string()),
            },
            read = served.io.bridge.read(&mut bridge_buf), if bridge_open => match read {
                Ok(n) if n > 0 => {
                    bridge_frames.push(&bridge_buf[..n]);
                    while let Some(decoded) = bridge_frames.decode() {
                        // `shutdown`: the bridge process was told to stop.
                        match decoded {
                            Decoded::Frame(Frame::Shutdown(_)) => served.session.handle_terminate(Instant::now()),
                            other => tracing::warn!(conn = conn.0, line = line_kind(&other), "unexpected line from a bridge that handed its stdio over; ignored"),
                        }
                    }
                }
                // EOF or a failed read: the bridge process is gone (killed).
                _ => {
                    bridge_open = false;
                    served.session.handle_terminate(Instant::now());
                }
            },
            () = sleep_until(served.session.poll_timeout().map(Into::into)) => {
                served.session.handle_timeout(Instant::now());
            }
        }
    };
    served.finish(exit).await;
}

impl<R: ToRunner> Served<R> {
    /// Drains the machine's outputs: lines for the agent into its pipe as far as it takes them,
    /// then frames for the runner, unless lines still wait (then they wait too). Returns the
    /// exit once the machine has finished.
    async fn pump(&mut self) -> Option<ExitReason> {
        let mut exit = None;
        loop {
            let mut any = false;
            let mut for_runner = Vec::new();
            while let Some(output) = self.session.poll_output() {
                any = true;
                match output {
                    BridgeOutput::Transmit {
                        to: BridgePeer::Agent,
                        bytes,
                    } => self.to_agent.push(bytes),
                    BridgeOutput::Transmit {
                        to: BridgePeer::Runner,
                        bytes,
                    } => crate::sys::append(&mut for_runner, bytes),
                    BridgeOutput::Event(event) => crate::dialects::mcp_bridge::log_event(&event),
                    BridgeOutput::Exit(reason) => exit = Some(reason),
                    other => tracing::warn!(
                        ?other,
                        "stdio handoff: an output this version does not handle"
                    ),
                }
            }
            if !any {
                // The agent's pipe may have taken the last lines since the last round.
                self.release().await;
                return exit;
            }
            if !self.write_stdout() {
                // What this round had for the runner may acknowledge lines that never arrived.
                for_runner.clear();
            }
            crate::sys::append(&mut self.held, for_runner);
            self.release().await;
        }
    }

    /// Writes what the agent's pipe takes now; a failed write means the agent is gone. Returns
    /// false when the agent went away with this write.
    fn write_stdout(&mut self) -> bool {
        if !self.stdout_open {
            self.to_agent.clear();
            return true;
        }
        if let Err(err) = self.to_agent.write_to(&self.io.stdout) {
            self.agent_gone(&err.to_string());
            return false;
        }
        if self.to_agent.pending() > self.max_backlog_bytes {
            let why = format!(
                "it stopped reading: {} bytes wait for it (at most {})",
                self.to_agent.pending(),
                self.max_backlog_bytes
            );
            self.agent_gone(&why);
            return false;
        }
        true
    }

    /// Writing to the agent failed (`why`): what waits for it, and what would acknowledge it,
    /// is dropped, and the machine tears down as for the agent's EOF.
    fn agent_gone(&mut self, why: &str) {
        tracing::warn!(conn = self.conn.0, why, "the agent is gone");
        self.stdout_open = false;
        self.to_agent.clear();
        self.held.clear();
        self.session.handle_agent_eof(Instant::now());
    }

    /// Gives the runner what is held, once every line before it is in the agent's pipe.
    async fn release(&mut self) {
        if self.to_agent.pending() == 0 && !self.held.is_empty() {
            let frames = std::mem::take(&mut self.held);
            self.runner.frames(frames).await;
        }
    }

    /// After the machine's exit: the last lines get [`FINAL_WRITE_TIMEOUT`], the last frames go
    /// to the runner, the connection ends, the descriptors are put back in blocking mode, and the
    /// bridge process gets `shutdown` with the reason.
    async fn finish(mut self, exit: ExitReason) {
        let flushed = async {
            while self.stdout_open && self.to_agent.pending() > 0 {
                match self.io.stdout.writable().await {
                    Ok(()) => {
                        self.write_stdout();
                    }
                    Err(err) => self.agent_gone(&err.to_string()),
                }
            }
        };
        if tokio::time::timeout(FINAL_WRITE_TIMEOUT, flushed)
            .await
            .is_err()
        {
            self.agent_gone("it did not read its last lines in time");
        }
        self.release().await;
        self.runner.closed().await;
        tracing::info!(
            conn = self.conn.0,
            reason = exit.label(),
            "the agent's stdio is served no more"
        );
        let Self { io, .. } = self;
        io.stdin.into_blocking();
        io.stdout.into_blocking();
        let frame = Frame::Shutdown(Shutdown {
            reason: Some(exit.label().to_owned()),
        });
        if let Ok(bytes) = encode_frame_vec(&frame, MAX_FRAME_BYTES) {
            let told = tokio::time::timeout(FINAL_WRITE_TIMEOUT, io.bridge.write_all(&bytes));
            let _ = told.await;
        }
        let _ = io.bridge.shutdown_write();
    }
}
