//! The bridge's side of one Ash connection.
//!
//! A new connection gets `ready`. Then, per connection (state is never shared between
//! connections):
//! - `query` starts the agent ([`AshBridgeOutput::StartQuery`]); each agent message becomes a
//!   `message` event, then `done`. A failure is `error` then `done`. One turn at a time: a second
//!   `query` (or an `exec`) while one runs is refused with `error`, and the running turn goes on.
//! - `interrupt` stops the running turn ([`AshBridgeOutput::StopAgent`]); when the agent has
//!   stopped the turn ends with `done` and no `error`. While idle it does nothing.
//! - `resume` makes a session resumable by later queries ([`AshBridgeOutput::ResumeSession`]) and
//!   is acknowledged with `done` for that session.
//! - `exec` runs a command ([`AshBridgeOutput::StartExec`]): `exec_result`, then `done` with `""`.
//! - `shutdown` asks the application to stop ([`AshBridgeOutput::Shutdown`]).
//! - A malformed or oversized line is answered with `error`; the connection stays.

use std::collections::VecDeque;

use crate::ash::{Command, Event, Query, decode_command, event_line};
use crate::json::RawJson;
use crate::line::{Line, LineDecoder};

/// Cap on one command line (prompts may carry content blocks): 16 MiB.
pub const MAX_COMMAND_BYTES: usize = 16 * 1024 * 1024;

/// Something for the application to do for this connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AshBridgeOutput {
    /// Write this event line to the host.
    Send(Vec<u8>),
    /// Run a turn of the agent; report with `agent_message` and `agent_finished`.
    StartQuery(Query),
    /// Stop the running turn (signal the agent); it still reports `agent_finished`.
    StopAgent,
    /// Later queries for this session continue it.
    ResumeSession {
        /// The session.
        session_id: String,
    },
    /// Run a command; report with `exec_finished`.
    StartExec {
        /// The command line.
        command: String,
        /// Time limit.
        timeout_ms: u64,
    },
    /// Stop the bridge: end every turn, remove the socket, exit 0.
    Shutdown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Turn {
    Idle,
    Query {
        session_id: String,
        interrupted: bool,
    },
    Exec,
}

/// One connection's state. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct AshConnection {
    lines: LineDecoder,
    max_line_bytes: usize,
    turn: Turn,
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
        out.push_back(AshBridgeOutput::Send(event_line(&Event::Ready)));
        Self {
            lines: LineDecoder::new(max_line_bytes),
            max_line_bytes,
            turn: Turn::Idle,
            out,
        }
    }

    /// Bytes from the host.
    pub fn handle_bytes(&mut self, bytes: &[u8]) {
        let mut lines = std::mem::take(&mut self.lines);
        lines.push(bytes);
        while let Some(line) = lines.next_line() {
            self.line(line);
        }
        self.lines = lines;
    }

    /// The host went away: a running turn is stopped.
    pub fn handle_closed(&mut self) {
        self.stop_turn();
    }

    fn stop_turn(&mut self) {
        if let Turn::Query { interrupted, .. } = &mut self.turn
            && !*interrupted
        {
            *interrupted = true;
            self.out.push_back(AshBridgeOutput::StopAgent);
        }
    }

    /// One message the agent printed during the running query.
    pub fn agent_message(&mut self, data: RawJson) {
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

    /// The agent's turn ended: `Ok` with the session it reported (or `None` to keep the query's),
    /// or `Err` with why it failed.
    pub fn agent_finished(&mut self, result: Result<Option<String>, String>) {
        let Turn::Query {
            session_id,
            interrupted,
        } = std::mem::replace(&mut self.turn, Turn::Idle)
        else {
            return;
        };
        let session_id = match result {
            Ok(reported) => reported.unwrap_or(session_id),
            Err(_) if interrupted => session_id,
            Err(error) => {
                self.send(&Event::Error { error });
                session_id
            }
        };
        self.send(&Event::Done { session_id });
    }

    /// The `exec` finished.
    pub fn exec_finished(&mut self, exit_code: i64, stdout: String, stderr: String) {
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
    }

    /// The next thing to do, until `None`.
    pub fn poll_output(&mut self) -> Option<AshBridgeOutput> {
        self.out.pop_front()
    }

    /// Whether a query or exec is running.
    pub fn is_busy(&self) -> bool {
        self.turn != Turn::Idle
    }

    fn line(&mut self, line: Line<'_>) {
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
            Command::Query(query) => {
                if self.refuse_if_busy("query") {
                    return;
                }
                self.turn = Turn::Query {
                    session_id: query.session_id.clone(),
                    interrupted: false,
                };
                self.out.push_back(AshBridgeOutput::StartQuery(query));
            }
            Command::Exec {
                command,
                timeout_ms,
            } => {
                if self.refuse_if_busy("exec") {
                    return;
                }
                self.turn = Turn::Exec;
                self.out.push_back(AshBridgeOutput::StartExec {
                    command,
                    timeout_ms,
                });
            }
            Command::Resume { session_id } => {
                self.out.push_back(AshBridgeOutput::ResumeSession {
                    session_id: session_id.clone(),
                });
                self.send(&Event::Done { session_id });
            }
            Command::Interrupt => self.stop_turn(),
            Command::Shutdown => self.out.push_back(AshBridgeOutput::Shutdown),
        }
    }

    fn refuse_if_busy(&mut self, what: &str) -> bool {
        let busy = match &self.turn {
            Turn::Idle => return false,
            Turn::Query { session_id, .. } => format!("a query for session {session_id:?}"),
            Turn::Exec => "an exec".to_owned(),
        };
        self.send(&Event::Error {
            error: format!("{what} refused: {busy} is still running on this connection"),
        });
        true
    }

    fn send(&mut self, event: &Event) {
        self.out.push_back(AshBridgeOutput::Send(event_line(event)));
    }
}

impl Default for AshConnection {
    fn default() -> Self {
        Self::new()
    }
}
