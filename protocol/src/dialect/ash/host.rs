//! The host's side of an Ash connection: wait for `ready`, then run commands one at a time.
//!
//! [`AshHost::request`] queues a `query`, `resume` or `exec`; they go to the bridge in order, each
//! after the previous one's `done`. `message` events reach the caller as they come; an `error`
//! is remembered and reported with the `done` that follows it (the reference host stopped reading
//! at `error` and handed the `done` to the next command). [`AshHost::interrupt`] and
//! [`AshHost::shutdown`] go out at once. If `ready` does not arrive within [`READY_TIMEOUT`], or
//! the connection closes, every waiting command fails. Submissions are tracked in the shared
//! [`Pending`] table.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::codec::json::RawJson;
use crate::codec::line::{Line, LineDecoder};
use crate::dialect::ash::{Command, Event, command_line, decode_event};
use crate::session::pending::Pending;

/// How long to wait for `ready`: 10 seconds.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Cap on one event line: 64 MiB (agent messages can be large).
pub const MAX_EVENT_BYTES: usize = 64 * 1024 * 1024;

/// Why commands could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// No `ready` within the timeout.
    #[error("the bridge did not send ready within {0:?}")]
    ReadyTimeout(Duration),
    /// The connection closed before the command finished.
    #[error("the bridge connection closed")]
    Closed,
}

/// The result of `exec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutcome {
    /// Exit code.
    pub exit_code: i64,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The session from `done` (`""` after exec).
    pub session_id: String,
    /// The `error` event that came before `done`, if any.
    pub error: Option<String>,
    /// The `exec_result`, for an exec.
    pub exec: Option<ExecOutcome>,
}

/// Something for the caller to do or know.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostOutput<T> {
    /// Write this command line to the bridge.
    Transmit(Vec<u8>),
    /// The bridge is ready.
    Ready,
    /// An agent message for the command `token`.
    Message {
        /// Whose.
        token: T,
        /// The agent's message, unchanged.
        data: RawJson,
    },
    /// A command finished, or could not run.
    Completed {
        /// Whose.
        token: T,
        /// How it ended.
        result: Result<Completion, HostError>,
    },
    /// A line from the bridge that is not a valid event (logged and skipped).
    InvalidEvent(String),
}

#[derive(Debug, Clone)]
enum State<T> {
    WaitingReady {
        deadline: Instant,
    },
    Ready {
        /// The command on the wire, until its `done`.
        running: Option<Job<T>>,
    },
    Failed(HostError),
}

#[derive(Debug, Clone)]
struct Job<T> {
    token: T,
    command: Command,
    error: Option<String>,
    exec: Option<ExecOutcome>,
}

/// The host's state. See the [module docs](self).
///
/// Contract: every input takes `now` last. The application issues commands with
/// [`request`](Self::request) (and [`interrupt`](Self::interrupt) / [`shutdown`](Self::shutdown));
/// what happened on the socket is `handle_bytes` / `handle_closed`; the `ready` deadline is
/// [`poll_timeout`](Self::poll_timeout) / [`handle_timeout`](Self::handle_timeout). Outputs are
/// drained from [`poll_output`](Self::poll_output): [`HostOutput::Transmit`], `Ready`,
/// `Message`s, one `Completed` per request, and `InvalidEvent`s for the log.
#[derive(Debug, Clone)]
pub struct AshHost<T> {
    state: State<T>,
    lines: LineDecoder,
    /// Requests waiting for the bridge to be ready or for the running one to finish.
    jobs: Pending<Job<T>>,
    out: VecDeque<HostOutput<T>>,
}

impl<T: Clone> AshHost<T> {
    /// A host that has just connected at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            state: State::WaitingReady {
                deadline: now + READY_TIMEOUT,
            },
            lines: LineDecoder::new(MAX_EVENT_BYTES),
            jobs: Pending::new(),
            out: VecDeque::new(),
        }
    }

    /// Queues a `query`, `resume` or `exec` (an `interrupt` or `shutdown` is sent at once).
    pub fn request(&mut self, command: Command, token: T, now: Instant) {
        match command {
            Command::Interrupt => return self.interrupt(now),
            Command::Shutdown => return self.shutdown(now),
            Command::Query(_) | Command::Resume { .. } | Command::Exec { .. } => {}
        }
        if let State::Failed(error) = &self.state {
            let error = error.clone();
            self.out.push_back(HostOutput::Completed {
                token,
                result: Err(error),
            });
            return;
        }
        self.jobs.insert(Job {
            token,
            command,
            error: None,
            exec: None,
        });
        self.pump();
    }

    /// Interrupts the running command.
    pub fn interrupt(&mut self, _now: Instant) {
        if self.is_ready() {
            self.out
                .push_back(HostOutput::Transmit(command_line(&Command::Interrupt)));
        }
    }

    /// Asks the bridge to shut down.
    pub fn shutdown(&mut self, _now: Instant) {
        if self.is_ready() {
            self.out
                .push_back(HostOutput::Transmit(command_line(&Command::Shutdown)));
        }
    }

    /// Bytes from the bridge.
    pub fn handle_bytes(&mut self, bytes: &[u8], _now: Instant) {
        if matches!(self.state, State::Failed(_)) {
            return;
        }
        let mut lines = std::mem::take(&mut self.lines);
        lines.push(bytes);
        while let Some(line) = lines.decode() {
            match line {
                Line::Oversized { len } => self.out.push_back(HostOutput::InvalidEvent(format!(
                    "event of {len} bytes exceeds the limit"
                ))),
                Line::Complete(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => {}
                Line::Complete(bytes) => match decode_event(bytes) {
                    Ok(event) => self.event(event),
                    Err(invalid) => self.out.push_back(HostOutput::InvalidEvent(invalid.0)),
                },
            }
        }
        self.lines = lines;
    }

    /// The connection closed: everything waiting fails.
    pub fn handle_closed(&mut self, _now: Instant) {
        self.fail(HostError::Closed);
    }

    /// When `handle_timeout` is next due (while waiting for `ready`).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::WaitingReady { deadline } => Some(deadline),
            State::Ready { .. } | State::Failed(_) => None,
        }
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let State::WaitingReady { deadline } = self.state
            && now >= deadline
        {
            self.fail(HostError::ReadyTimeout(READY_TIMEOUT));
        }
    }

    /// The next thing to do, until `None`.
    pub fn poll_output(&mut self) -> Option<HostOutput<T>> {
        self.out.pop_front()
    }

    /// Whether `ready` has arrived (and nothing failed).
    pub fn is_ready(&self) -> bool {
        matches!(self.state, State::Ready { .. })
    }

    fn event(&mut self, event: Event) {
        if let Event::Ready = event {
            if matches!(self.state, State::WaitingReady { .. }) {
                self.state = State::Ready { running: None };
                self.out.push_back(HostOutput::Ready);
                self.pump();
            }
            return;
        }
        // Only a ready host has a running job; it is put back unless this event ends it.
        let running = match &mut self.state {
            State::Ready { running } => running.take(),
            State::WaitingReady { .. } | State::Failed(_) => None,
        };
        let Some(mut job) = running else {
            self.out.push_back(HostOutput::InvalidEvent(format!(
                "{event:?} while no command runs"
            )));
            return;
        };
        match event {
            Event::Done { session_id } => {
                self.out.push_back(HostOutput::Completed {
                    token: job.token,
                    result: Ok(Completion {
                        session_id,
                        error: job.error,
                        exec: job.exec,
                    }),
                });
                self.pump();
                return;
            }
            Event::Ready => {}
            Event::Message { data } => {
                let token = job.token.clone();
                self.out.push_back(HostOutput::Message { token, data });
            }
            Event::Error { error } => job.error = Some(error),
            Event::ExecResult {
                exit_code,
                stdout,
                stderr,
            } => {
                job.exec = Some(ExecOutcome {
                    exit_code,
                    stdout,
                    stderr,
                });
            }
        }
        self.state = State::Ready { running: Some(job) };
    }

    fn pump(&mut self) {
        let State::Ready { running: None } = self.state else {
            return;
        };
        let Some(id) = self.jobs.ids().next() else {
            return;
        };
        let Ok(job) = self.jobs.take(id) else {
            return;
        };
        let line = command_line(&job.command);
        self.state = State::Ready { running: Some(job) };
        self.out.push_back(HostOutput::Transmit(line));
    }

    fn fail(&mut self, error: HostError) {
        let previous = std::mem::replace(&mut self.state, State::Failed(error.clone()));
        let running = match previous {
            State::Failed(error) => {
                self.state = State::Failed(error);
                return;
            }
            State::Ready { running } => running,
            State::WaitingReady { .. } => None,
        };
        let waiting = self.jobs.fail_all().into_iter().map(|(_, job)| job);
        for job in running.into_iter().chain(waiting) {
            self.out.push_back(HostOutput::Completed {
                token: job.token,
                result: Err(error.clone()),
            });
        }
    }
}
