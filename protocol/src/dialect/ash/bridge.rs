//! The bridge's side of one Ash connection.
//!
//! A new connection gets `ready`. Then, per connection (state is never shared between
//! connections):
//! - `query`, `resume` and `exec` are queued and run in arrival order, one at a time; each ends
//!   with exactly one `done`, carrying the session id the command named (`""` for `exec`). The
//!   queue is bounded ([`MAX_QUEUED_COMMANDS`] commands and [`MAX_QUEUED_BYTES`] bytes waiting
//!   behind the running one): a command over the bound is answered `error` then `done` at once
//!   and never runs.
//! - `query` starts the agent ([`AshBridgeOutput::StartQuery`]); each agent message becomes a
//!   `message` event, then `done`. A failure is `error` then `done`.
//! - `interrupt` stops the running turn ([`AshBridgeOutput::StopAgent`]); when the agent has
//!   stopped the turn ends with `done` and no `error`. Queued commands are not touched: they run
//!   next. While idle it does nothing.
//! - `resume` resolves the session ([`AshBridgeOutput::ResumeSession`], answered with
//!   [`AshConnection::respond`] with [`Answer::Resume`]). Without a prompt it ends with `done`
//!   (or `error` then `done` if the session cannot be resumed) and the next `query` for that
//!   session continues it; with a `prompt` it goes on to run that turn on the resumed session,
//!   like a `query`.
//! - `exec` runs a command ([`AshBridgeOutput::StartExec`]): `exec_result`, then `done` with `""`.
//! - `shutdown` asks the application to stop ([`AshBridgeOutput::Shutdown`]).
//! - A malformed or oversized line is answered with `error` alone (there is no command to
//!   finish); the connection stays.

use std::collections::VecDeque;

use crate::codec::json::RawJson;
use crate::codec::line::{Line, LineDecoder};
use crate::dialect::ash::{Command, Event, Query, decode_command, event_line};

/// Cap on one command line (prompts may carry content blocks): 16 MiB.
pub const MAX_COMMAND_BYTES: usize = 16 * 1024 * 1024;

/// Commands that may wait behind the running one on a connection.
pub const MAX_QUEUED_COMMANDS: usize = 32;

/// Bytes of command lines that may wait behind the running one on a connection: 64 MiB.
pub const MAX_QUEUED_BYTES: usize = 64 * 1024 * 1024;

/// Something for the application to do for this connection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AshBridgeOutput {
    /// Write this event line to the host.
    Transmit(Vec<u8>),
    /// Run a turn of the agent; report its messages with `notify`, its end with
    /// `respond(Answer::Query(…))`.
    StartQuery(Query),
    /// Stop the running turn (signal the agent); it still ends with `respond(Answer::Query(…))`.
    StopAgent,
    /// Make later turns of this session continue it; answer with `respond(Answer::Resume(…))`.
    ResumeSession {
        /// The session.
        session_id: String,
    },
    /// Run a command; answer with `respond(Answer::Exec { … })`.
    StartExec {
        /// The command line.
        command: String,
        /// Time limit.
        timeout_ms: u64,
    },
    /// Stop the bridge: end every turn, remove the socket, exit 0.
    Shutdown,
}

/// Why the agent's turn or a `resume` failed: the text the host gets in the `error` event (a
/// non-zero exit, a signal, a session that cannot be resumed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AgentFailure(pub String);

impl From<String> for AgentFailure {
    fn from(why: String) -> Self {
        Self(why)
    }
}

impl From<&str> for AgentFailure {
    fn from(why: &str) -> Self {
        Self(why.to_owned())
    }
}

/// The application's answer to a request of [`AshBridgeOutput`], passed to
/// [`AshConnection::respond`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The agent's turn ([`AshBridgeOutput::StartQuery`]) ended: `Ok`, or `Err` with why it
    /// failed (a non-zero exit, even after a result). `done` carries the session the command
    /// named.
    Query(Result<(), AgentFailure>),
    /// The session of the running `resume` ([`AshBridgeOutput::ResumeSession`]) was resolved
    /// (`Err`: why it cannot be resumed).
    Resume(Result<(), AgentFailure>),
    /// The `exec` ([`AshBridgeOutput::StartExec`]) finished.
    Exec {
        /// Its exit code.
        exit_code: i64,
        /// What it printed on stdout.
        stdout: String,
        /// What it printed on stderr.
        stderr: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Turn {
    Idle,
    Query {
        session_id: String,
        interrupted: bool,
    },
    Resume {
        session_id: String,
        turn: Option<Query>,
        interrupted: bool,
    },
    Exec,
}

/// One connection's state. See the [module docs](self).
///
/// Contract: a timeless machine (no `now`). What happened on the socket is `handle_bytes` /
/// `handle_closed`; the application reports the running turn's messages with
/// [`notify`](Self::notify) and answers each request ([`AshBridgeOutput::StartQuery`],
/// `ResumeSession`, `StartExec`) with [`respond`](Self::respond). Outputs are drained from
/// [`poll_output`](Self::poll_output): [`AshBridgeOutput::Transmit`] and the requests.
#[derive(Debug, Clone)]
pub struct AshConnection {
    lines: LineDecoder,
    max_line_bytes: usize,
    turn: Turn,
    /// Waiting commands, with the length of the line each came in.
    queue: VecDeque<(Command, usize)>,
    queued_bytes: usize,
    out: VecDeque<AshBridgeOutput>,
}

impl AshConnection {
    /// A connection just accepted: `ready` is its first output.
    pub fn new() -> Self {
        Self::with_max_line(MAX_COMMAND_BYTES)
    }

    /// The same with another cap on a command line.
    pub fn with_max_line(max_line_bytes: usize) -> Self {
        let mut out = VecDeque::new();
        out.push_back(AshBridgeOutput::Transmit(event_line(&Event::Ready)));
        Self {
            lines: LineDecoder::new(max_line_bytes),
            max_line_bytes,
            turn: Turn::Idle,
            queue: VecDeque::new(),
            queued_bytes: 0,
            out,
        }
    }

    /// Bytes from the host.
    pub fn handle_bytes(&mut self, bytes: &[u8]) {
        let mut lines = std::mem::take(&mut self.lines);
        lines.push(bytes);
        while let Some(line) = lines.decode() {
            self.line(line);
        }
        self.lines = lines;
    }

    /// The host went away: a running turn is stopped, queued commands are dropped.
    pub fn handle_closed(&mut self) {
        self.queue.clear();
        self.queued_bytes = 0;
        self.stop_turn();
    }

    fn stop_turn(&mut self) {
        match &mut self.turn {
            Turn::Query { interrupted, .. } if !*interrupted => {
                *interrupted = true;
                self.out.push_back(AshBridgeOutput::StopAgent);
            }
            // Not started yet: the turn it would run is skipped.
            Turn::Resume { interrupted, .. } => *interrupted = true,
            Turn::Idle | Turn::Query { .. } | Turn::Exec => {}
        }
    }

    /// One message the agent printed during the running query.
    pub fn notify(&mut self, data: RawJson) {
        if matches!(
            self.turn,
            Turn::Query {
                interrupted: false,
                ..
            }
        ) {
            self.send(&Event::Message { data });
        }
    }

    /// The application's answer to the running request; one that does not match it (e.g. a late
    /// answer after the connection closed) is ignored.
    pub fn respond(&mut self, answer: Answer) {
        match answer {
            Answer::Query(result) => self.query_finished(result),
            Answer::Resume(result) => self.resume_finished(result),
            Answer::Exec {
                exit_code,
                stdout,
                stderr,
            } => self.exec_finished(exit_code, stdout, stderr),
        }
    }

    fn query_finished(&mut self, result: Result<(), AgentFailure>) {
        let Turn::Query {
            session_id,
            interrupted,
        } = std::mem::replace(&mut self.turn, Turn::Idle)
        else {
            return;
        };
        if let Err(AgentFailure(error)) = result
            && !interrupted
        {
            self.send(&Event::Error { error });
        }
        self.send(&Event::Done { session_id });
        self.pump();
    }

    fn resume_finished(&mut self, result: Result<(), AgentFailure>) {
        let Turn::Resume {
            session_id,
            turn,
            interrupted,
        } = std::mem::replace(&mut self.turn, Turn::Idle)
        else {
            return;
        };
        match (result, turn) {
            (Ok(()), Some(query)) if !interrupted => self.start_query(query),
            (Ok(()), _) => {
                self.send(&Event::Done { session_id });
                self.pump();
            }
            (Err(AgentFailure(error)), _) => {
                self.send(&Event::Error { error });
                self.send(&Event::Done { session_id });
                self.pump();
            }
        }
    }

    fn exec_finished(&mut self, exit_code: i64, stdout: String, stderr: String) {
        if self.turn != Turn::Exec {
            return;
        }
        self.turn = Turn::Idle;
        self.send(&Event::ExecResult {
            exit_code,
            stdout,
            stderr,
        });
        self.send(&Event::Done {
            session_id: String::new(),
        });
        self.pump();
    }

    /// The next thing to do, until `None`.
    pub fn poll_output(&mut self) -> Option<AshBridgeOutput> {
        self.out.pop_front()
    }

    /// Commands waiting behind the running one.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Whether a command is running.
    pub fn is_busy(&self) -> bool {
        self.turn != Turn::Idle
    }

    fn line(&mut self, line: Line<'_>) {
        let len = match &line {
            Line::Complete(bytes) => bytes.len(),
            Line::Oversized { len } => *len,
        };
        let command = match line {
            Line::Oversized { len } => {
                let max = self.max_line_bytes;
                return self.send(&Event::Error {
                    error: format!("command of {len} bytes exceeds the {max}-byte limit"),
                });
            }
            Line::Complete(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => return,
            Line::Complete(bytes) => match decode_command(bytes) {
                Ok(command) => command,
                Err(invalid) => {
                    return self.send(&Event::Error {
                        error: format!("invalid command: {invalid}"),
                    });
                }
            },
        };
        match command {
            Command::Interrupt => self.stop_turn(),
            Command::Shutdown => self.out.push_back(AshBridgeOutput::Shutdown),
            Command::Query(_) | Command::Resume { .. } | Command::Exec { .. } => {
                let full = if self.queue.len() >= MAX_QUEUED_COMMANDS {
                    Some(format!("{MAX_QUEUED_COMMANDS} commands are"))
                } else if self.queued_bytes + len > MAX_QUEUED_BYTES {
                    Some(format!("{} bytes of commands are", self.queued_bytes))
                } else {
                    None
                };
                if let Some(full) = full {
                    let session_id = match &command {
                        Command::Query(q) => q.session_id.clone(),
                        Command::Resume { session_id, .. } => session_id.clone(),
                        _ => String::new(),
                    };
                    self.send(&Event::Error {
                        error: format!(
                            "command refused: {full} already waiting on this connection; wait \
                             for a done before sending more"
                        ),
                    });
                    self.send(&Event::Done { session_id });
                    return;
                }
                self.queue.push_back((command, len));
                self.queued_bytes += len;
                self.pump();
            }
        }
    }

    /// Starts the next queued command if nothing runs.
    fn pump(&mut self) {
        if self.turn != Turn::Idle {
            return;
        }
        let Some((command, len)) = self.queue.pop_front() else {
            return;
        };
        self.queued_bytes -= len;
        match command {
            Command::Query(query) => self.start_query(query),
            Command::Resume { session_id, turn } => {
                self.turn = Turn::Resume {
                    session_id: session_id.clone(),
                    turn,
                    interrupted: false,
                };
                self.out
                    .push_back(AshBridgeOutput::ResumeSession { session_id });
            }
            Command::Exec {
                command,
                timeout_ms,
            } => {
                self.turn = Turn::Exec;
                self.out.push_back(AshBridgeOutput::StartExec {
                    command,
                    timeout_ms,
                });
            }
            Command::Interrupt | Command::Shutdown => {}
        }
    }

    fn start_query(&mut self, query: Query) {
        self.turn = Turn::Query {
            session_id: query.session_id.clone(),
            interrupted: false,
        };
        self.out.push_back(AshBridgeOutput::StartQuery(query));
    }

    fn send(&mut self, event: &Event) {
        self.out
            .push_back(AshBridgeOutput::Transmit(event_line(event)));
    }
}

impl Default for AshConnection {
    fn default() -> Self {
        Self::new()
    }
}
