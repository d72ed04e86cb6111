//! The host's side of an Ash bridge connection, driving [`AshHost`]: connect, wait for
//! `ready` (10 s), then run `query` / `resume` / `exec` commands one after another, streaming the
//! agent's messages to the caller.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ac7_runtime::dialects::ash_host::AshClientError> {
//! use ac7_runtime::dialects::ash_host::{AshClient, JobEvent};
//!
//! let client = AshClient::connect("/sandbox/bridge.sock").await?;
//! let mut job = client.query("Say hi", "6d1f…", false);
//! while let Some(event) = job.next().await {
//!     match event {
//!         JobEvent::Message(message) => println!("{}", message.get()),
//!         JobEvent::Done(completion) => println!("done: {:?}", completion?),
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! One task owns the connection and the machine. Each command's events go to its [`Job`]
//! through a bounded queue: a caller that stops reading slows the connection down rather than
//! letting messages pile up. [`AshClient::interrupt`] and [`AshClient::shutdown`] go out at
//! once; dropping the client closes the connection.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::time::Instant;

use ac7_protocol::codec::json::RawJson;
use ac7_protocol::dialect::ash::host::{AshHost, Completion, HostError, HostOutput, READY_TIMEOUT};
use ac7_protocol::dialect::ash::{Command, DEFAULT_EXEC_TIMEOUT_MS, Query};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

/// Events buffered per job.
const JOB_QUEUE: usize = 64;

/// Why the connection could not be used.
#[derive(Debug, thiserror::Error)]
pub enum AshClientError {
    /// The socket could not be reached.
    #[error("cannot connect to the Ash bridge at {path}: {source}")]
    Connect {
        /// The socket path.
        path: String,
        /// What the OS said.
        source: io::Error,
    },
    /// No `ready`, or the connection closed.
    #[error(transparent)]
    Host(#[from] HostError),
}

/// What a command produces, in order: messages, then one `Done`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEvent {
    /// An agent message, unchanged.
    Message(RawJson),
    /// The command finished (with the `error` that came before `done`, if any), or could not run.
    Done(Result<Completion, HostError>),
}

/// The events of one command.
#[derive(Debug)]
pub struct Job {
    events: mpsc::Receiver<JobEvent>,
}

impl Job {
    /// The next event; `None` after `Done`.
    pub async fn next(&mut self) -> Option<JobEvent> {
        self.events.recv().await
    }

    /// Collects the messages and the outcome.
    pub async fn finish(mut self) -> (Vec<RawJson>, Result<Completion, HostError>) {
        let mut messages = Vec::new();
        while let Some(event) = self.next().await {
            match event {
                JobEvent::Message(message) => messages.push(message),
                JobEvent::Done(done) => return (messages, done),
            }
        }
        (messages, Err(HostError::Closed))
    }
}

enum Request {
    Submit(Command, mpsc::Sender<JobEvent>),
    Interrupt,
    Shutdown,
}

/// A connection to an Ash bridge. See the [module docs](self).
#[derive(Debug)]
pub struct AshClient {
    requests: mpsc::UnboundedSender<Request>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Submit(command, _) => f.debug_tuple("Submit").field(command).finish(),
            Self::Interrupt => f.write_str("Interrupt"),
            Self::Shutdown => f.write_str("Shutdown"),
        }
    }
}

impl AshClient {
    /// Connects and waits (up to 10 s) for `ready`.
    pub async fn connect(path: impl AsRef<Path>) -> Result<Self, AshClientError> {
        let path = path.as_ref();
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| AshClientError::Connect {
                path: path.display().to_string(),
                source,
            })?;
        let (mut read, write) = stream.into_split();
        let mut host = AshHost::new(Instant::now());
        let mut buf = vec![0u8; 64 * 1024];
        while !host.is_ready() {
            let deadline = host.poll_timeout().map(tokio::time::Instant::from_std);
            let read = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, read.read(&mut buf)).await,
                None => Ok(read.read(&mut buf).await),
            };
            match read {
                Err(_) => {
                    host.handle_timeout(Instant::now());
                    if !host.is_ready() && host.poll_timeout().is_none() {
                        return Err(HostError::ReadyTimeout(READY_TIMEOUT).into());
                    }
                }
                Ok(Ok(0) | Err(_)) => return Err(HostError::Closed.into()),
                Ok(Ok(n)) => host.handle_bytes(&buf[..n], Instant::now()),
            }
            while let Some(output) = host.poll_output() {
                if let HostOutput::InvalidEvent(detail) = output {
                    tracing::warn!(detail, "invalid event from the Ash bridge skipped");
                }
            }
        }
        let (requests, inbox) = mpsc::unbounded_channel();
        let task = tokio::spawn(drive(host, read, write, inbox));
        Ok(Self { requests, task })
    }

    /// Runs a command (`query`, `resume` or `exec`) after those submitted before it.
    pub fn submit(&self, command: Command) -> Job {
        let (tx, events) = mpsc::channel(JOB_QUEUE);
        if let Err(mpsc::error::SendError(Request::Submit(_, tx))) =
            self.requests.send(Request::Submit(command, tx))
        {
            let _ = tx.try_send(JobEvent::Done(Err(HostError::Closed)));
        }
        Job { events }
    }

    /// A `query` with a text prompt.
    pub fn query(&self, prompt: &str, session_id: &str, include_partial_messages: bool) -> Job {
        self.submit(Command::Query(Query {
            prompt: RawJson::from_value(prompt).expect("a string serializes"),
            session_id: session_id.to_owned(),
            include_partial_messages,
            options: BTreeMap::new(),
        }))
    }

    /// An `exec` with the default timeout.
    pub fn exec(&self, command: &str) -> Job {
        self.submit(Command::Exec {
            command: command.to_owned(),
            timeout_ms: DEFAULT_EXEC_TIMEOUT_MS,
        })
    }

    /// Interrupts the running command (it ends with `done`).
    pub fn interrupt(&self) {
        let _ = self.requests.send(Request::Interrupt);
    }

    /// Asks the bridge to shut down.
    pub fn shutdown(&self) {
        let _ = self.requests.send(Request::Shutdown);
    }
}

impl Drop for AshClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn drive(
    mut host: AshHost<u64>,
    mut read: OwnedReadHalf,
    mut write: OwnedWriteHalf,
    mut inbox: mpsc::UnboundedReceiver<Request>,
) {
    let mut jobs: BTreeMap<u64, mpsc::Sender<JobEvent>> = BTreeMap::new();
    let mut next_token = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    let mut open = true;
    let mut inbox_open = true;
    loop {
        while let Some(output) = host.poll_output() {
            match output {
                HostOutput::Transmit(line) => {
                    if open && write.write_all(&line).await.is_err() {
                        open = false;
                        host.handle_closed(Instant::now());
                    }
                }
                HostOutput::Ready => {}
                HostOutput::Message { token, data } => {
                    if let Some(job) = jobs.get(&token) {
                        let _ = job.send(JobEvent::Message(data)).await;
                    }
                }
                HostOutput::Completed { token, result } => {
                    if let Some(job) = jobs.remove(&token) {
                        let _ = job.send(JobEvent::Done(result)).await;
                    }
                }
                HostOutput::InvalidEvent(detail) => {
                    tracing::warn!(detail, "invalid event from the Ash bridge skipped");
                }
                other => tracing::warn!(?other, "ash host: an output this version does not handle"),
            }
        }
        if !open && !inbox_open {
            return;
        }
        tokio::select! {
            read = read.read(&mut buf), if open => match read {
                Ok(0) | Err(_) => {
                    open = false;
                    host.handle_closed(Instant::now());
                }
                Ok(n) => host.handle_bytes(&buf[..n], Instant::now()),
            },
            request = inbox.recv(), if inbox_open => match request {
                Some(Request::Submit(command, tx)) => {
                    let token = next_token;
                    next_token += 1;
                    jobs.insert(token, tx);
                    host.request(command, token, Instant::now());
                }
                Some(Request::Interrupt) => host.interrupt(Instant::now()),
                Some(Request::Shutdown) => host.shutdown(Instant::now()),
                None => inbox_open = false,
            },
        }
    }
}
