//! The runner's side of the IPC socket: binds `$TMPDIR/.ac7-runner-<pid>.sock`, accepts
//! bridges, drives [`RunnerSession`], hands each request to an async application [`Handler`]
//! and sends its answer back.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ac7_runtime::runner::ipc_server::BindError> {
//! use ac7_protocol::codec::jsonrpc::{METHOD_NOT_FOUND, Outcome, RpcError};
//! use ac7_runtime::runner::ipc_server::{IpcServer, IpcServerOptions};
//!
//! let server = IpcServer::bind(IpcServerOptions::default())?;
//! let handle = server.handle(); // notify / shutdown from anywhere
//! let task = server.serve(|req: ac7_protocol::session::runner::IncomingRequest| async move {
//!     Outcome::Error(RpcError::new(METHOD_NOT_FOUND, format!("Method not found: {}", req.method)))
//! });
//! handle.notify("notifications/tools/list_changed", None);
//! task.shutdown(Some("agent-exited")).await;
//! # Ok(()) }
//! ```
//!
//! Each accepted connection is classified by its peer's credentials (`SO_PEERCRED`, see
//! [`crate::runner::peer`]) when [`IpcServerOptions::agent`] is set: a bridge the agent process started
//! is the agent's; one another process of the agent's tree started is the agent's only when that
//! process is the attached bridge's client or none is attached (else it is foreign); anything
//! else is an outsider. Foreign bridges and outsiders are served but never given events nor
//! allowed to displace the agent's bridge. Without it every connection counts as the agent's.
//!
//! One task owns the session. Each connection has a reader task (bytes into the session, through
//! a bounded channel, so a fast bridge is slowed down rather than buffered without limit) and a
//! writer task. The frames one round of the session has for a bridge go out in one write, made
//! in place when nothing is queued before them; what the socket does not take goes to the
//! writer (in order; a bridge that lets more than [`IpcServerOptions::max_backlog_bytes`] pile
//! up is treated as gone and its connection closed). The socket is watched for reading only,
//! so the bridge reading a frame does not wake the runner for nothing. An answer that
//! is ready at once (`tools/list`) is given without a task; other requests run concurrently,
//! each in its own task. A handler that panics is answered with `-32603`. Dropping the [`ServerTask`] (or
//! [`ServerTask::abort`]) stops everything at once and closes every socket without a `shutdown`
//! frame, as if the runner died. The socket file is unlinked when the server stops, in every
//! case, unless another process has replaced it meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ac7_protocol::codec::json::RawJson;
use ac7_protocol::codec::jsonrpc::{INTERNAL_ERROR, Outcome, RpcError};
use ac7_protocol::session::mcp_bridge::BridgeConfig;
use ac7_protocol::session::runner::{
    IncomingRequest, IpcConnId, Origin, RunnerConfig, RunnerEvent, RunnerOutput, RunnerSession,
};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};

use crate::runner::peer::AgentPid;
use crate::runner::stdio_handoff;
pub use crate::sys::unix_socket::{BindError, MAX_SOCKET_PATH_BYTES};
use crate::sys::unix_socket::{PeerStream, SocketFile};

/// How long [`ServerTask::shutdown`] lets writers deliver the last frames before closing.
const SHUTDOWN_FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// Bytes read per `read` call on a connection.
const READ_CHUNK: usize = 64 * 1024;

/// Chunks in flight from readers to the session task.
const INBOX_DEPTH: usize = 16;

/// Default for [`IpcServerOptions::max_backlog_bytes`].
pub const DEFAULT_MAX_BACKLOG_BYTES: usize = 64 * 1024 * 1024;

/// The answer to an MCP request, computed by the application.
pub trait Handler: Send + Sync + 'static {
    /// Answers one request. Called once per request; the futures run concurrently and may
    /// finish in any order.
    fn handle(&self, request: IncomingRequest) -> impl Future<Output = Outcome> + Send + 'static;
}

impl<F, Fut> Handler for F
where
    F: Fn(IncomingRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    fn handle(&self, request: IncomingRequest) -> impl Future<Output = Outcome> + Send + 'static {
        self(request)
    }
}

/// Where and how to serve.
#[derive(Debug, Clone)]
pub struct IpcServerOptions {
    /// The socket path; `None` means [`default_socket_path`].
    pub path: Option<PathBuf>,
    /// Frame cap, queue bound and single-bridge policy (displace-old by default, reject-new for
    /// tests).
    pub session: RunnerConfig,
    /// Receives a copy of every [`RunnerEvent`] (they are also logged).
    pub events: Option<mpsc::UnboundedSender<RunnerEvent>>,
    /// Bytes that may wait to be written to one connection. A bridge that stops reading until
    /// more than this is queued for it is treated as gone: its connection is closed.
    pub max_backlog_bytes: usize,
    /// The agent whose bridges get the events: connections from outside its process tree (and
    /// every connection before its pid is set) are outsiders. `None`: every connection is the
    /// agent's.
    pub agent: Option<AgentPid>,
    /// Take the agent's stdio from bridges that hand it over (the line
    /// [`STDIO_HANDOFF`](ac7_protocol::codec::frame::STDIO_HANDOFF) with the bridge's stdin and
    /// stdout attached), and serve it in this process with a bridge session of this
    /// configuration. Then nothing is written to a connection before its first bytes
    /// arrived (a bridge speaks first: the handoff, or `ack{seq:0}`). `None`: every connection
    /// is a plain frame link, written from the start.
    pub stdio_handoff: Option<BridgeConfig>,
}

impl Default for IpcServerOptions {
    fn default() -> Self {
        Self {
            path: None,
            session: RunnerConfig::default(),
            events: None,
            max_backlog_bytes: DEFAULT_MAX_BACKLOG_BYTES,
            agent: None,
            stdio_handoff: None,
        }
    }
}

/// `$TMPDIR/.ac7-runner-<pid>.sock` for this process (`/tmp` when `TMPDIR` is unset or empty).
pub fn default_socket_path() -> PathBuf {
    socket_path_in(
        std::env::var_os("TMPDIR").map(PathBuf::from),
        std::process::id(),
    )
}

/// `<dir>/.ac7-runner-<pid>.sock`, with `dir` defaulting to `/tmp` and its repeated or trailing
/// slashes removed (so there is never a `//`).
pub fn socket_path_in(dir: Option<PathBuf>, pid: u32) -> PathBuf {
    let dir = dir
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    let dir: PathBuf = dir.components().collect();
    dir.join(format!(".ac7-runner-{pid}.sock"))
}

/// Removes `.ac7-runner-<pid>.sock` and `.ac7-runner-<pid>.sock.lock` files in `dir` left by
/// runners that died without cleaning up (`kill -9`, a crash): the pid is not running, the file
/// is ours (same uid) and of the expected type (a socket, a regular file), and nobody holds the
/// lock. Files of live runners, of other users, and anything else are left alone. Returns how
/// many files were removed.
pub fn remove_stale_sockets(dir: &Path) -> usize {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let me = rustix::process::geteuid().as_raw();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix(".ac7-runner-") else {
            continue;
        };
        let (pid, is_lock) = match rest.strip_suffix(".sock.lock") {
            Some(pid) => (pid, true),
            None => match rest.strip_suffix(".sock") {
                Some(pid) => (pid, false),
                None => continue,
            },
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let right_type = if is_lock {
            meta.file_type().is_file()
        } else {
            meta.file_type().is_socket()
        };
        if !right_type || meta.uid() != me {
            continue;
        }
        let lock = if is_lock {
            path.clone()
        } else {
            dir.join(format!("{name}.lock"))
        };
        if lock_is_held(&lock) {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(path = %path.display(), pid, "removed a dead runner's leftover");
                removed += 1;
            }
            Err(err) => {
                tracing::debug!(path = %path.display(), error = %err, "cannot remove a dead runner's leftover");
            }
        }
    }
    removed
}

/// Whether someone holds the lock on `path` (a missing file is not held).
fn lock_is_held(path: &Path) -> bool {
    match std::fs::File::open(path) {
        Ok(file) => matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

/// A bound socket, not yet serving. See the [module docs](self).
#[derive(Debug)]
pub struct IpcServer {
    listener: std::os::unix::net::UnixListener,
    socket: SocketFile,
    options: IpcServerOptions,
    control_tx: mpsc::UnboundedSender<Control>,
    control_rx: mpsc::UnboundedReceiver<Control>,
}

/// Sends notifications to the attached bridge and shuts the server down. Cheap to clone; calls
/// after the server stopped are ignored.
#[derive(Debug, Clone)]
pub struct RunnerHandle {
    control: mpsc::UnboundedSender<Control>,
}

/// The running server. Dropping it stops the server abruptly, like [`ServerTask::abort`].
#[derive(Debug)]
pub struct ServerTask {
    handle: RunnerHandle,
    task: tokio::task::JoinHandle<()>,
    path: PathBuf,
}

#[derive(Debug)]
enum Control {
    Notify {
        method: String,
        params: Option<RawJson>,
    },
    Shutdown {
        reason: Option<String>,
    },
}

impl IpcServer {
    /// Binds the socket with mode 0600. Does not need a runtime; serving does.
    ///
    /// Race-free (see [`crate::sys::unix_socket`]): the socket never exists at its final path with
    /// wider permissions; a stale socket is replaced; a live runner's makes binding fail with
    /// [`BindError::InUse`] (the probe connects once, which that runner sees as a bridge that
    /// connected and left); anything that is not a socket is left alone
    /// ([`BindError::NotASocket`]).
    pub fn bind(options: IpcServerOptions) -> Result<Self, BindError> {
        let path = options.path.clone().unwrap_or_else(default_socket_path);
        let (listener, socket) = crate::sys::unix_socket::bind_private(&path, "runner")?;
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        Ok(Self {
            listener,
            socket,
            options,
            control_tx,
            control_rx,
        })
    }

    /// The socket path (what `AC7_RUNNER_SOCKET` should say).
    pub fn path(&self) -> &Path {
        &self.socket.path
    }

    /// A handle for notifications and shutdown; usable before [`serve`](Self::serve) (what it
    /// sends is processed once serving starts).
    pub fn handle(&self) -> RunnerHandle {
        RunnerHandle {
            control: self.control_tx.clone(),
        }
    }

    /// Starts serving on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn serve<H: Handler>(self, handler: H) -> ServerTask {
        let handle = self.handle();
        let path = self.socket.path.clone();
        let listener = match tokio::net::UnixListener::from_std(self.listener) {
            Ok(listener) => Some(listener),
            Err(err) => {
                tracing::error!(error = %err, "cannot register the runner socket; not accepting");
                None
            }
        };
        let (inbox_tx, inbox_rx) = mpsc::channel(INBOX_DEPTH);
        let driver = Driver {
            session: RunnerSession::new(self.options.session.clone()),
            listener,
            handler: Arc::new(handler),
            inbox_tx,
            inbox_rx,
            control: self.control_rx,
            conns: BTreeMap::new(),
            io_tasks: JoinSet::new(),
            requests: JoinSet::new(),
            request_ids: HashMap::new(),
            events: self.options.events,
            max_backlog_bytes: self.options.max_backlog_bytes,
            agent: self.options.agent,
            stdio_handoff: self.options.stdio_handoff.map(Arc::new),
            _socket: self.socket,
        };
        let task = tokio::spawn(driver.run());
        ServerTask { handle, task, path }
    }
}

impl RunnerHandle {
    /// Sends an MCP notification to the attached bridge (queued, bounded, until one attaches).
    pub fn notify(&self, method: &str, params: Option<RawJson>) {
        let _ = self.control.send(Control::Notify {
            method: method.to_owned(),
            params,
        });
    }

    /// Ends the session: the attached bridge gets `shutdown{reason}` and is closed, the socket is
    /// unlinked and the server stops.
    pub fn shutdown(&self, reason: Option<&str>) {
        let _ = self.control.send(Control::Shutdown {
            reason: reason.map(str::to_owned),
        });
    }
}

impl ServerTask {
    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A handle for notifications and shutdown.
    pub fn handle(&self) -> RunnerHandle {
        self.handle.clone()
    }

    /// Shuts down gracefully (see [`RunnerHandle::shutdown`]) and waits until the server stopped.
    pub async fn shutdown(mut self, reason: Option<&str>) {
        self.handle.shutdown(reason);
        let _ = (&mut self.task).await;
    }

    /// Waits until the server stopped (after a [`RunnerHandle::shutdown`] from elsewhere).
    pub async fn stopped(mut self) {
        let _ = (&mut self.task).await;
    }

    /// Stops at once: every connection closes without a `shutdown` frame (what a bridge sees
    /// when its runner dies), pending requests are abandoned, the socket file is unlinked.
    pub async fn abort(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for ServerTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

enum ConnInput {
    Bytes(IpcConnId, Vec<u8>),
    Closed(IpcConnId),
    /// The connection's bridge handed the agent's stdio over: what the session sends to the
    /// connection goes to the served stdio through this sender.
    Stdio(IpcConnId, mpsc::UnboundedSender<Vec<u8>>),
}

struct Conn {
    link: Link,
    /// The read loop (which serves the agent's stdio after a handoff).
    reader: AbortHandle,
    /// Frames for the connection kept until its first bytes arrived (with a stdio handoff on).
    held: Option<Vec<u8>>,
}

/// Where the frames for a connection go.
enum Link {
    /// The connection's socket.
    Socket {
        stream: Arc<PeerStream>,
        writer: mpsc::UnboundedSender<Vec<u8>>,
        /// Bytes queued for the writer and not yet written.
        backlog: Arc<AtomicUsize>,
        write_task: AbortHandle,
    },
    /// The agent's stdio served in this process.
    Stdio(mpsc::UnboundedSender<Vec<u8>>),
}

/// The task that owns the session.
struct Driver<H> {
    session: RunnerSession,
    listener: Option<tokio::net::UnixListener>,
    handler: Arc<H>,
    inbox_tx: mpsc::Sender<ConnInput>,
    inbox_rx: mpsc::Receiver<ConnInput>,
    control: mpsc::UnboundedReceiver<Control>,
    conns: BTreeMap<IpcConnId, Conn>,
    /// Readers and writers of every connection: dropped (so aborted) with the driver.
    io_tasks: JoinSet<()>,
    requests: JoinSet<Outcome>,
    request_ids: HashMap<tokio::task::Id, (IpcConnId, u64)>,
    events: Option<mpsc::UnboundedSender<RunnerEvent>>,
    max_backlog_bytes: usize,
    agent: Option<AgentPid>,
    stdio_handoff: Option<Arc<BridgeConfig>>,
    /// Unlinked when the driver ends, however it ends.
    _socket: SocketFile,
}

impl<H: Handler> Driver<H> {
    async fn run(mut self) {
        loop {
            tokio::select! {
                accepted = accept(self.listener.as_ref()) => match accepted {
                    Ok(stream) => self.connect(stream),
                    Err(err) => {
                        tracing::warn!(error = %err, "accepting a bridge connection failed");
                        // Typically EMFILE: give the system a moment instead of spinning.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
                Some(input) = self.inbox_rx.recv() => self.input(input),
                control = self.control.recv() => match control {
                    Some(Control::Notify { method, params }) => {
                        self.session.notify(&method, params, Instant::now());
                    }
                    Some(Control::Shutdown { reason }) => {
                        self.session.shutdown(reason.as_deref(), Instant::now());
                        self.pump();
                        break;
                    }
                    // Unreachable while the ServerTask (which holds a handle) exists.
                    None => break,
                },
                Some(done) = self.requests.join_next_with_id(), if !self.requests.is_empty() => {
                    self.answer(done);
                }
                Some(_) = self.io_tasks.join_next(), if !self.io_tasks.is_empty() => {}
            }
            self.pump();
        }
        self.finish().await;
    }

    fn input(&mut self, input: ConnInput) {
        let now = Instant::now();
        match input {
            ConnInput::Bytes(conn, bytes) => {
                self.release(conn);
                self.session.handle_bytes(conn, &bytes, now);
            }
            ConnInput::Closed(conn) => {
                self.session.handle_closed(conn, now);
                self.conns.remove(&conn);
            }
            ConnInput::Stdio(conn, frames) => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    if let Link::Socket { write_task, .. } = &c.link {
                        // Nothing was written to the socket yet: frames were held.
                        write_task.abort();
                    }
                    c.link = Link::Stdio(frames);
                }
                self.release(conn);
            }
        }
    }

    /// The connection's first bytes arrived: what was held for it goes out.
    fn release(&mut self, conn: IpcConnId) {
        if let Some(held) = self.conns.get_mut(&conn).and_then(|c| c.held.take())
            && !held.is_empty()
        {
            self.transmit(vec![(conn, held)]);
        }
    }

    /// After shutdown: stop accepting and abandon running requests, then give the writers (and
    /// the served stdio, which gets `shutdown` like a bridge) a bounded time to deliver the last
    /// frames.
    async fn finish(mut self) {
        self.listener = None;
        self.requests.abort_all();
        for (_, conn) in std::mem::take(&mut self.conns) {
            if matches!(conn.link, Link::Socket { .. }) {
                conn.reader.abort();
            }
        }
        let drained = async {
            loop {
                tokio::select! {
                    done = self.io_tasks.join_next() => if done.is_none() { return },
                    // The served stdio reports its end; nobody listens any more.
                    _ = self.inbox_rx.recv() => {}
                }
            }
        };
        if tokio::time::timeout(SHUTDOWN_FLUSH_TIMEOUT, drained)
            .await
            .is_err()
        {
            tracing::warn!("a bridge did not take its last frames in time; closing anyway");
        }
    }

    fn connect(&mut self, stream: UnixStream) {
        let origin = match &self.agent {
            None => Origin::Agent,
            Some(agent) => {
                let peer = stream
                    .peer_cred()
                    .ok()
                    .and_then(|cred| cred.pid())
                    .and_then(|pid| u32::try_from(pid).ok());
                let origin = agent.classify(peer);
                if origin == Origin::Outsider {
                    tracing::info!(
                        peer,
                        agent = agent.get(),
                        "a bridge from outside the agent's process tree connected: served, gets no events"
                    );
                }
                origin
            }
        };
        let stream = match PeerStream::new(stream) {
            Ok(stream) => Arc::new(stream),
            Err(err) => {
                tracing::warn!(error = %err, "cannot watch a bridge connection; closing it");
                return;
            }
        };
        let conn = self.session.handle_connect(origin, Instant::now());
        let (writer, queue) = mpsc::unbounded_channel();
        let backlog = Arc::new(AtomicUsize::new(0));
        let write_task =
            self.io_tasks
                .spawn(write_loop(Arc::clone(&stream), queue, Arc::clone(&backlog)));
        let handoff = self.stdio_handoff.clone().map(|config| Accept {
            config,
            max_backlog_bytes: self.max_backlog_bytes,
        });
        let held = handoff.is_some().then(Vec::new);
        let reader = self.io_tasks.spawn(read_loop(
            conn,
            Arc::clone(&stream),
            self.inbox_tx.clone(),
            handoff,
        ));
        self.conns.insert(
            conn,
            Conn {
                link: Link::Socket {
                    stream,
                    writer,
                    backlog,
                    write_task,
                },
                reader,
                held,
            },
        );
    }

    fn answer(&mut self, done: Result<(tokio::task::Id, Outcome), tokio::task::JoinError>) {
        let (task, outcome) = match done {
            Ok((task, outcome)) => (task, outcome),
            Err(err) if err.is_panic() => (err.id(), handler_panicked()),
            Err(err) => {
                self.request_ids.remove(&err.id());
                return;
            }
        };
        let Some(key) = self.request_ids.remove(&task) else {
            return;
        };
        self.respond(key, outcome);
    }

    fn respond(&mut self, (conn, id): (IpcConnId, u64), outcome: Outcome) {
        if let Err(misuse) = self.session.respond(conn, id, outcome, Instant::now()) {
            tracing::error!(error = %misuse, "bug: response rejected by the runner session");
        }
    }

    /// Starts answering `request`. An answer that is ready at once (`tools/list`, from its
    /// cache) is given here, without a task and the two hand-overs one costs; the rest run as
    /// tasks of their own. A handler that panics is answered with an internal error either way.
    fn start(&mut self, request: IncomingRequest) {
        let key = (request.conn, request.id);
        let mut handling = Box::pin(self.handler.handle(request));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            handling.as_mut().poll(&mut cx)
        }));
        match first {
            Ok(std::task::Poll::Ready(outcome)) => self.respond(key, outcome),
            Ok(std::task::Poll::Pending) => {
                let task = self.requests.spawn(handling);
                self.request_ids.insert(task.id(), key);
            }
            Err(_panic) => self.respond(key, handler_panicked()),
        }
    }

    fn pump(&mut self) {
        loop {
            // What one round has for a connection goes out in one write.
            let mut outgoing: Vec<(IpcConnId, Vec<u8>)> = Vec::new();
            while let Some(output) = self.session.poll_output() {
                self.perform(output, &mut outgoing);
            }
            if outgoing.is_empty() {
                return;
            }
            // Writing may close a connection, which gives the session more to say.
            self.transmit(outgoing);
        }
    }

    /// Writes each connection's bytes: what the socket takes now when nothing is queued before
    /// them, the rest through the connection's writer. A bridge whose backlog passes the limit
    /// has stopped reading: its connection is closed.
    fn transmit(&mut self, outgoing: Vec<(IpcConnId, Vec<u8>)>) {
        for (conn, mut bytes) in outgoing {
            let Some(c) = self.conns.get_mut(&conn) else {
                continue;
            };
            if let Some(held) = &mut c.held {
                crate::sys::append(held, bytes);
                continue;
            }
            let (stream, writer, backlog) = match &c.link {
                // The served stdio bounds what waits for the agent itself.
                Link::Stdio(frames) => {
                    let _ = frames.send(bytes);
                    continue;
                }
                Link::Socket {
                    stream,
                    writer,
                    backlog,
                    ..
                } => (stream, writer, backlog),
            };
            if backlog.load(Ordering::Acquire) == 0 {
                match stream.try_write(&bytes) {
                    Ok(n) if n == bytes.len() => continue,
                    Ok(n) => drop(bytes.drain(..n)),
                    // The writer meets a real failure again and ends the connection.
                    Err(_) => {}
                }
            }
            let queued = backlog.fetch_add(bytes.len(), Ordering::Relaxed) + bytes.len();
            if queued <= self.max_backlog_bytes {
                let _ = writer.send(bytes);
            } else if let Some(c) = self.conns.remove(&conn) {
                tracing::warn!(
                    conn = conn.0,
                    queued,
                    max = self.max_backlog_bytes,
                    "the bridge stopped reading; closing its connection"
                );
                c.reader.abort();
                if let Link::Socket { write_task, .. } = &c.link {
                    write_task.abort();
                }
                self.session.handle_closed(conn, Instant::now());
            }
        }
    }

    /// Does one thing the session asks; frames for the bridges are collected in `outgoing`.
    fn perform(&mut self, output: RunnerOutput, outgoing: &mut Vec<(IpcConnId, Vec<u8>)>) {
        match output {
            RunnerOutput::Transmit { to, bytes } => match outgoing.last_mut() {
                Some((conn, queued)) if *conn == to => queued.extend_from_slice(&bytes),
                _ => outgoing.push((to, bytes)),
            },
            RunnerOutput::Close { conn } => {
                // What was said before the close goes first; the writer delivers what is
                // queued, then shuts the socket down.
                self.transmit(std::mem::take(outgoing));
                // Closed before it spoke: what was held for it goes out first.
                self.release(conn);
                // A served stdio reads the end of its frames (the sender dropped here) and
                // tears down by itself.
                if let Some(c) = self.conns.remove(&conn)
                    && matches!(c.link, Link::Socket { .. })
                {
                    c.reader.abort();
                }
            }
            RunnerOutput::Request(request) => self.start(request),
            RunnerOutput::Event(event) => {
                log_event(&event);
                if let Some(events) = &self.events {
                    let _ = events.send(event);
                }
            }
            other => tracing::warn!(
                ?other,
                "runner session: an output this version does not handle"
            ),
        }
    }
}

fn handler_panicked() -> Outcome {
    Outcome::Error(RpcError::new(
        INTERNAL_ERROR,
        "internal error: the request handler panicked",
    ))
}

async fn accept(listener: Option<&tokio::net::UnixListener>) -> io::Result<UnixStream> {
    match listener {
        Some(listener) => listener.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

/// How a connection's first read may take the agent's stdio over.
struct Accept {
    config: Arc<BridgeConfig>,
    max_backlog_bytes: usize,
}

/// The served stdio's way into the session: the connection's inbox.
struct Inbox {
    conn: IpcConnId,
    inbox: mpsc::Sender<ConnInput>,
}

impl stdio_handoff::ToRunner for Inbox {
    async fn frames(&self, bytes: Vec<u8>) {
        let _ = self.inbox.send(ConnInput::Bytes(self.conn, bytes)).await;
    }
    async fn closed(&self) {
        let _ = self.inbox.send(ConnInput::Closed(self.conn)).await;
    }
}

/// Reads a connection into the inbox. With `handoff`, the first read takes descriptors too: a
/// stdio handoff turns this task into the server of the agent's stdio.
async fn read_loop(
    conn: IpcConnId,
    read: Arc<PeerStream>,
    inbox: mpsc::Sender<ConnInput>,
    handoff: Option<Accept>,
) {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut first = None;
    if let Some(accept) = handoff {
        match read.read_with_fds(&mut buf, 2).await {
            Ok((n, fds)) if stdio_handoff::is_handoff(&buf[..n], &fds) => {
                match stdio_handoff::Handoff::take(fds, Arc::clone(&read)) {
                    Ok(io) => {
                        let (frames_tx, frames) = mpsc::unbounded_channel();
                        if inbox.send(ConnInput::Stdio(conn, frames_tx)).await.is_err() {
                            return;
                        }
                        let config = BridgeConfig::clone(&accept.config);
                        let runner = Inbox { conn, inbox };
                        stdio_handoff::serve(
                            conn,
                            config,
                            io,
                            frames,
                            runner,
                            accept.max_backlog_bytes,
                        )
                        .await;
                    }
                    Err(err) => {
                        tracing::warn!(conn = conn.0, error = %err, "cannot serve the agent's stdio a bridge handed over; closing its connection");
                        let _ = inbox.send(ConnInput::Closed(conn)).await;
                    }
                }
                return;
            }
            Ok((n, fds)) => {
                if !fds.is_empty() {
                    tracing::warn!(
                        conn = conn.0,
                        count = fds.len(),
                        "descriptors sent without a stdio handoff; closed"
                    );
                }
                first = Some(Ok(n));
            }
            Err(err) => first = Some(Err(err)),
        }
    }
    loop {
        let got = match first.take() {
            Some(got) => got,
            None => read.read(&mut buf).await,
        };
        let input = match got {
            Ok(0) => ConnInput::Closed(conn),
            Ok(n) => ConnInput::Bytes(conn, buf[..n].to_vec()),
            Err(err) => {
                tracing::debug!(conn = conn.0, error = %err, "reading a bridge connection failed");
                ConnInput::Closed(conn)
            }
        };
        let closed = matches!(input, ConnInput::Closed(_));
        if inbox.send(input).await.is_err() || closed {
            return;
        }
    }
}

async fn write_loop(
    write: Arc<PeerStream>,
    mut queue: mpsc::UnboundedReceiver<Vec<u8>>,
    backlog: Arc<AtomicUsize>,
) {
    while let Some(bytes) = queue.recv().await {
        if let Err(err) = write.write_all(&bytes).await {
            tracing::debug!(error = %err, "writing to a bridge connection failed");
            return;
        }
        backlog.fetch_sub(bytes.len(), Ordering::Release);
    }
    let _ = write.shutdown_write();
}

fn log_event(event: &RunnerEvent) {
    match event {
        RunnerEvent::Attached { conn, delivered } => {
            tracing::info!(conn = conn.0, delivered, "bridge attached");
        }
        RunnerEvent::Detached {
            conn,
            reason,
            abandoned,
        } => tracing::info!(conn = conn.0, ?reason, abandoned, "bridge detached"),
        RunnerEvent::Rejected { conn } => tracing::warn!(conn = conn.0, "bridge refused"),
        RunnerEvent::OutsiderConnected { conn } => {
            tracing::info!(conn = conn.0, "outsider connected");
        }
        RunnerEvent::OutsiderLeft { conn, abandoned } => {
            tracing::info!(conn = conn.0, abandoned, "outsider left");
        }
        RunnerEvent::ForeignConnected {
            conn,
            client,
            attached,
        } => {
            let command = std::fs::read_to_string(format!("/proc/{client}/comm"))
                .map(|c| c.trim().to_owned())
                .unwrap_or_default();
            tracing::info!(
                conn = conn.0,
                client,
                command,
                attached = attached.0,
                "a bridge started by another process in the agent's tree (not the agent's MCP client; `claude mcp list` run by the agent starts one) connected: served, gets no events; the agent's bridge stays attached"
            );
        }
        RunnerEvent::ForeignLeft { conn, abandoned } => {
            tracing::info!(conn = conn.0, abandoned, "foreign bridge left");
        }
        RunnerEvent::FrameDropped { conn, dropped } => tracing::warn!(
            conn = conn.0,
            len = dropped.len,
            reason = %dropped.reason,
            "dropped malformed IPC frame"
        ),
        RunnerEvent::UnexpectedFrame { conn, kind } => tracing::warn!(
            conn = conn.0,
            kind = kind.as_str(),
            "unexpected frame kind from the bridge ignored"
        ),
        RunnerEvent::BridgeError { conn, message, id } => {
            tracing::warn!(conn = conn.0, message, id, "error frame from the bridge");
        }
        RunnerEvent::DuplicateRequest { conn, id } => {
            tracing::warn!(conn = conn.0, id, "duplicate request id refused");
        }
        RunnerEvent::Responded {
            conn,
            id,
            method,
            elapsed,
        } => {
            let elapsed_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
            tracing::debug!(conn = conn.0, id, method, elapsed_us, "request answered");
        }
        RunnerEvent::ResponseDropped { conn, id } => {
            tracing::debug!(conn = conn.0, id, "answer for a departed bridge dropped");
        }
        RunnerEvent::ResultTooLarge { conn, id, len, max } => tracing::warn!(
            conn = conn.0,
            id,
            len,
            max,
            "result too large for an IPC frame; replaced by an error"
        ),
        RunnerEvent::NotificationTooLarge { method, len, max } => {
            tracing::warn!(
                method,
                len,
                max,
                "notification too large for an IPC frame; dropped"
            );
        }
        RunnerEvent::NotificationsDropped { count } => {
            tracing::warn!(count, "notifications dropped (no bridge attached)");
        }
        RunnerEvent::Redelivered { from, to, count } => match to {
            Some(to) => tracing::info!(
                from = from.0,
                to = to.0,
                count,
                "notifications the old bridge never wrote handed to the new one"
            ),
            None => tracing::info!(
                from = from.0,
                count,
                "notifications the old bridge never wrote queued for the next one"
            ),
        },
        other => tracing::debug!(?other, "runner session event"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_of_dead_runners_are_removed_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // Above the kernel's pid_max (4194304): never a live process.
        let dead = 999_999_999u32;
        let live = std::os::unix::process::parent_id();
        let bind = |name: String| std::os::unix::net::UnixListener::bind(d.join(name)).unwrap();
        let _dead_sock = bind(format!(".ac7-runner-{dead}.sock"));
        std::fs::write(d.join(format!(".ac7-runner-{dead}.sock.lock")), b"").unwrap();
        let _live_sock = bind(format!(".ac7-runner-{live}.sock"));
        std::fs::write(d.join(format!(".ac7-runner-{live}.sock.lock")), b"").unwrap();
        // Not ours to touch: not a socket, another name, a dead pid whose lock someone holds.
        std::fs::write(d.join(".ac7-runner-999999998.sock"), b"file").unwrap();
        std::fs::write(d.join(".ac7-runner-x.sock"), b"").unwrap();
        let _held_sock = bind(".ac7-runner-999999997.sock".into());
        let held = std::fs::File::create(d.join(".ac7-runner-999999997.sock.lock")).unwrap();
        held.lock().unwrap();

        assert_eq!(remove_stale_sockets(d), 2);
        let mut left: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut expected = vec![
            format!(".ac7-runner-{live}.sock"),
            format!(".ac7-runner-{live}.sock.lock"),
            ".ac7-runner-999999997.sock".to_owned(),
            ".ac7-runner-999999997.sock.lock".to_owned(),
            ".ac7-runner-999999998.sock".to_owned(),
            ".ac7-runner-x.sock".to_owned(),
        ];
        expected.sort();
        assert_eq!(left, expected);
    }

    #[test]
    fn default_path_has_no_doubled_slash() {
        assert_eq!(
            socket_path_in(Some("/tmp/".into()), 42),
            PathBuf::from("/tmp/.ac7-runner-42.sock")
        );
        assert_eq!(
            socket_path_in(Some("/var//tmp//".into()), 7),
            PathBuf::from("/var/tmp/.ac7-runner-7.sock")
        );
        assert_eq!(
            socket_path_in(None, 1),
            PathBuf::from("/tmp/.ac7-runner-1.sock")
        );
        assert_eq!(
            socket_path_in(Some("".into()), 1),
            PathBuf::from("/tmp/.ac7-runner-1.sock")
        );
        let path = socket_path_in(Some("/tmp//".into()), 9);
        assert!(!path.to_string_lossy().contains("//"), "{}", path.display());
    }
}
