//! `ac7 ash-bridge`: the bridge side of the Ash protocol. Listens on
//! `$ASH_BRIDGE_SOCKET`, writes `R` to stdout once listening, and serves every connection with
//! its own [`AshConnection`] (state is never shared between connections), running the agent
//! (`claude`) as a child process per query. The session map is shared by all connections.
//!
//! ```text
//!   socket read ──▶ handle_bytes / handle_closed ─────┐
//!   agent stdout ─▶ notify / respond(Answer::Query) ──┤ AshConnection (one per connection)
//!   exec result ──▶ respond(Answer::Exec) ────────────┘
//!      poll_output: Transmit -> socket, StartQuery -> spawn the agent, StopAgent -> SIGINT
//!      (SIGKILL after a grace period), ResumeSession -> look the session up in the SessionMap
//!      and respond(Answer::Resume), StartExec -> sh -c, Shutdown -> stop every child, remove
//!      the socket, exit 0
//! ```
//!
//! Commands on a connection queue and run in order, one at a time (see [`AshConnection`]);
//! `done` always carries the session id the command named.
//!
//! The agent: `claude -p --output-format stream-json --input-format stream-json --verbose
//! --permission-mode <mode>`, plus `--session-id <uuid>` for a new session or `--resume <uuid>`
//! for one claude has started: the host's session ids are mapped to claude's UUIDs by
//! [`SessionMap`], kept in the workspace so a restarted bridge resumes them.
//! `--include-partial-messages`, `--model`, `--max-turns`, `--allowedTools` and
//! `--disallowedTools` (comma-joined) come from the query's fields; its other fields are
//! accepted and not passed on. The prompt goes in on its stdin as one stream-json user message.
//! Each JSON object it prints is a `message`, unchanged. A non-zero exit is a failed turn
//! (`error`, with the end of its stderr or the result's text, then `done`), even when it printed
//! a result first. It runs in its own process group, in `$ASH_WORKSPACE_DIR` when set.
//!
//! `resume <id>` without a prompt makes the next `query` for `<id>` continue that
//! conversation: a session this bridge has started, or a claude session UUID it adopts; anything
//! else is `error` then `done`. With a `prompt` (our extension) the turn runs at once.
//!
//! Permission mode (`--permission-mode`, env `ASH_PERMISSION_MODE`): nobody can answer a
//! permission prompt in a headless turn, so by default the bridge runs claude as Ash does, with
//! `bypassPermissions`: the bridge is meant to run inside a disposable sandbox. Claude refuses
//! that mode as root (unless `IS_SANDBOX=1` is set), so as root the default is `acceptEdits`
//! (file edits are allowed, other tools need `allowedTools`).

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ac7_protocol::codec::json::RawJson;
use ac7_protocol::codec::line::{Line, LineDecoder};
use ac7_protocol::dialect::ash::Query;
use ac7_protocol::dialect::ash::bridge::{AgentFailure, Answer, AshBridgeOutput, AshConnection};
use ac7_protocol::dialect::ash::host::MAX_EVENT_BYTES;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;

use crate::dialects::ash_sessions::{SessionArgs, SessionMap};
use crate::dialects::stdio::recv_signal;
use crate::sys::unix_socket::{BindError, bind_private};

/// The socket the bridge listens on.
pub const SOCKET_ENV: &str = "ASH_BRIDGE_SOCKET";
/// The agent binary (default `claude` on `PATH`).
pub const CLAUDE_PATH_ENV: &str = "CLAUDE_PATH";
/// The agent's working directory (default: the bridge's).
pub const WORKSPACE_ENV: &str = "ASH_WORKSPACE_DIR";

/// How long an interrupted agent gets between SIGINT and SIGKILL.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// The grace this process uses: [`INTERRUPT_GRACE`], unless the hidden `--interrupt-grace-ms`
/// (for tests, so they need not wait 2 s) set another at start-up.
static GRACE: OnceLock<Duration> = OnceLock::new();

fn interrupt_grace() -> Duration {
    GRACE.get().copied().unwrap_or(INTERRUPT_GRACE)
}

/// How long shutdown waits for the connections to stop their children.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Bytes of an `exec`'s stdout and of its stderr kept (the rest is read and dropped).
pub const MAX_EXEC_OUTPUT_BYTES: usize = 1024 * 1024;

/// Bytes of the agent's stderr kept for the error of a failed turn.
const STDERR_TAIL_BYTES: usize = 2048;

/// Cap on one line the agent prints (it must fit in a `message` event line).
const MAX_AGENT_LINE_BYTES: usize = MAX_EVENT_BYTES - 1024;

/// Agent messages buffered between the agent's reader and the connection.
const MESSAGE_QUEUE: usize = 64;

const READ_CHUNK: usize = 64 * 1024;

/// Environment and exit codes, shown by `ac7 ash-bridge --help`.
pub const HELP_FOOTER: &str = "\
Environment:
  ASH_BRIDGE_SOCKET  the Unix socket to listen on (required; created 0600, removed at exit)
  CLAUDE_PATH        the agent binary (default: claude on PATH)
  ASH_WORKSPACE_DIR  the agent's and exec's working directory (default: the bridge's); the
                     map of host session ids to claude's is kept there, in .ac7-ash-sessions.json
                     (ASH_AGENT_DIR is not read: claude finds CLAUDE.md from its working directory)
  ASH_PERMISSION_MODE  the same as --permission-mode
  AC7_LOG            log filter for the JSON lines on stderr (default warn)

Once listening, the bridge writes the single byte R to stdout. Exit status: 0 after a shutdown
command, SIGINT or SIGTERM (every child is stopped and the socket removed first); 1 when
ASH_BRIDGE_SOCKET is missing or the socket cannot be created (one line on stderr says why).";

/// Claude's permission modes (`claude --permission-mode`).
pub const PERMISSION_MODES: [&str; 6] = [
    "acceptEdits",
    "auto",
    "bypassPermissions",
    "default",
    "dontAsk",
    "plan",
];

/// `ac7 ash-bridge`: serve the Ash bridge protocol on `$ASH_BRIDGE_SOCKET`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AshBridgeArgs {
    /// The permission mode claude runs in, passed as claude's --permission-mode. Default:
    /// bypassPermissions (as Ash: nobody can answer a permission prompt in a headless turn, and
    /// the bridge runs in a sandbox); as root, where claude refuses that unless IS_SANDBOX=1 is
    /// set, acceptEdits.
    #[arg(long, env = "ASH_PERMISSION_MODE", value_name = "MODE", value_parser = PERMISSION_MODES)]
    pub permission_mode: Option<String>,
    /// Milliseconds between SIGINT and SIGKILL for an interrupted agent (default 2000). Hidden:
    /// for tests.
    #[arg(long, hide = true, value_name = "MS")]
    pub interrupt_grace_ms: Option<u64>,
}

/// The permission mode used when none is given: `bypassPermissions`, or `acceptEdits` as root
/// without `IS_SANDBOX=1` (claude refuses to bypass permissions as root otherwise).
pub fn default_permission_mode() -> &'static str {
    let sandbox = std::env::var_os("IS_SANDBOX").is_some_and(|v| v == "1");
    if rustix::process::geteuid().is_root() && !sandbox {
        "acceptEdits"
    } else {
        "bypassPermissions"
    }
}

/// Why the bridge could not start.
#[derive(Debug, thiserror::Error)]
pub enum AshBridgeError {
    /// `ASH_BRIDGE_SOCKET` is unset or empty.
    #[error(
        "{SOCKET_ENV} is not set (or empty): set it to the socket path the Ash host will connect to"
    )]
    NoSocket,
    /// The socket could not be bound.
    #[error("cannot listen on ${SOCKET_ENV}: {0}")]
    Bind(#[from] BindError),
    /// The runtime could not start, or `R` could not be written.
    #[error("could not start: {0}")]
    Start(io::Error),
}

/// Runs `ac7 ash-bridge`; returns the exit code.
pub fn run(args: AshBridgeArgs) -> i32 {
    match run_bridge(args) {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("ac7 ash-bridge: {err}");
            1
        }
    }
}

fn run_bridge(args: AshBridgeArgs) -> Result<(), AshBridgeError> {
    if let Some(ms) = args.interrupt_grace_ms {
        let _ = GRACE.set(Duration::from_millis(ms));
    }
    let path = std::env::var_os(SOCKET_ENV)
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .ok_or(AshBridgeError::NoSocket)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(AshBridgeError::Start)?;
    let agent = AgentSpec {
        claude: std::env::var_os(CLAUDE_PATH_ENV)
            .filter(|s| !s.is_empty())
            .map_or_else(|| PathBuf::from("claude"), PathBuf::from),
        workspace: std::env::var_os(WORKSPACE_ENV)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        permission_mode: args
            .permission_mode
            .unwrap_or_else(|| default_permission_mode().to_owned()),
    };
    runtime.block_on(async {
        let (listener, socket) = bind_private(&path, "ash-bridge")?;
        let listener =
            tokio::net::UnixListener::from_std(listener).map_err(AshBridgeError::Start)?;
        crate::logging::init(crate::logging::DEFAULT_LEVEL);
        let mut stdout = io::stdout().lock();
        stdout
            .write_all(b"R")
            .and_then(|()| stdout.flush())
            .map_err(AshBridgeError::Start)?;
        drop(stdout);
        tracing::info!(
            path = %path.display(),
            permission_mode = %agent.permission_mode,
            "ash-bridge listening"
        );
        serve(listener, agent).await;
        drop(socket);
        Ok(())
    })
}

/// How to run the agent; shared by every connection (read-only but for the known sessions).
#[derive(Debug)]
struct AgentSpec {
    claude: PathBuf,
    workspace: Option<PathBuf>,
    permission_mode: String,
}

struct Shared {
    agent: AgentSpec,
    /// Host session id → claude session, shared by every connection.
    sessions: Mutex<SessionMap>,
    shutdown: watch::Sender<bool>,
}

async fn serve(listener: tokio::net::UnixListener, agent: AgentSpec) {
    let (shutdown, mut shutdown_rx) = watch::channel(false);
    let sessions = SessionMap::load(agent.workspace.as_deref().unwrap_or(Path::new(".")));
    let shared = Arc::new(Shared {
        agent,
        sessions: Mutex::new(sessions),
        shutdown,
    });
    let mut sigterm = signal(SignalKind::terminate()).ok();
    let mut sigint = signal(SignalKind::interrupt()).ok();
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(connection(stream, Arc::clone(&shared)));
                }
                Err(err) => {
                    tracing::warn!(error = %err, "accepting an Ash connection failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = shutdown_rx.wait_for(|stop| *stop) => {
                tracing::info!("shutdown requested");
                break;
            }
            Some(()) = recv_signal(&mut sigterm) => break,
            Some(()) = recv_signal(&mut sigint) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    shared.shutdown.send_replace(true);
    let stopped = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_TIMEOUT, stopped)
        .await
        .is_err()
    {
        tracing::warn!("connections did not stop in time; exiting anyway");
    }
}

/// What a running turn reports to its connection.
enum TurnEvent {
    Message(RawJson),
    AgentFinished(Result<(), String>),
    ExecFinished {
        exit_code: i64,
        stdout: String,
        stderr: String,
    },
}

/// How hard to stop a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stop {
    Run,
    Interrupt,
    Kill,
}

async fn connection(stream: UnixStream, shared: Arc<Shared>) {
    let mut conn = AshConnection::new();
    let (mut read, mut write) = stream.into_split();
    let mut shutdown = shared.shutdown.subscribe();
    let (events_tx, mut events) = mpsc::channel(MESSAGE_QUEUE);
    let (stop, _) = watch::channel(Stop::Run);
    let mut turn: Option<tokio::task::JoinHandle<()>> = None;
    let mut open = true;
    let mut writable = true;
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        while let Some(output) = conn.poll_output() {
            match output {
                AshBridgeOutput::Transmit(line) => {
                    if writable && let Err(err) = write.write_all(&line).await {
                        tracing::debug!(error = %err, "writing to an Ash connection failed");
                        writable = false;
                    }
                }
                AshBridgeOutput::StartQuery(query) => {
                    stop.send_replace(Stop::Run);
                    let session = lock(&shared.sessions).for_turn(&query.session_id);
                    let command = agent_command(&shared.agent, &query, &session);
                    turn = Some(tokio::spawn(run_agent(
                        command,
                        query,
                        Arc::clone(&shared),
                        events_tx.clone(),
                        stop.subscribe(),
                    )));
                }
                AshBridgeOutput::StopAgent => {
                    stop.send_if_modified(|s| {
                        let before = *s;
                        *s = (*s).max(Stop::Interrupt);
                        *s != before
                    });
                }
                AshBridgeOutput::ResumeSession { session_id } => {
                    let resumed = lock(&shared.sessions).resume(&session_id);
                    conn.respond(Answer::Resume(resumed.map_err(AgentFailure::from)));
                }
                AshBridgeOutput::StartExec {
                    command,
                    timeout_ms,
                } => {
                    stop.send_replace(Stop::Run);
                    turn = Some(tokio::spawn(run_exec(
                        command,
                        shared.agent.workspace.clone(),
                        Duration::from_millis(timeout_ms),
                        events_tx.clone(),
                        stop.subscribe(),
                    )));
                }
                AshBridgeOutput::Shutdown => {
                    shared.shutdown.send_replace(true);
                }
                other => {
                    tracing::warn!(?other, "ash bridge: an output this version does not handle")
                }
            }
        }
        if !open && !conn.is_busy() {
            return;
        }
        tokio::select! {
            read = read.read(&mut buf), if open => match read {
                Ok(0) | Err(_) => {
                    open = false;
                    conn.handle_closed();
                }
                Ok(n) => conn.handle_bytes(&buf[..n]),
            },
            Some(event) = events.recv() => match event {
                TurnEvent::Message(data) => conn.notify(data),
                TurnEvent::AgentFinished(result) => {
                    turn = None;
                    conn.respond(Answer::Query(result.map_err(AgentFailure::from)));
                }
                TurnEvent::ExecFinished { exit_code, stdout, stderr } => {
                    turn = None;
                    conn.respond(Answer::Exec { exit_code, stdout, stderr });
                }
            },
            _ = async { shutdown.wait_for(|stop| *stop).await.map(|_| ()) } => {
                stop.send_replace(Stop::Kill);
                if let Some(turn) = turn.take() {
                    // The turn reports into `events`, which nobody reads any more: drop it so a
                    // full queue cannot hold the child's reaping up.
                    drop(events);
                    let _ = turn.await;
                }
                return;
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn agent_command(agent: &AgentSpec, query: &Query, session: &SessionArgs) -> Command {
    let mut command = Command::new(&agent.claude);
    command.args([
        "-p",
        "--output-format",
        "stream-json",
        "--input-format",
        "stream-json",
        "--verbose",
        "--permission-mode",
        &agent.permission_mode,
        session.flag,
        &session.agent_session,
    ]);
    if query.include_partial_messages {
        command.arg("--include-partial-messages");
    }
    // The query's agent options that have a CLI flag; a value of the wrong type is ignored.
    fn option<'a, T: Deserialize<'a>>(query: &'a Query, key: &str) -> Option<T> {
        query.options.get(key).and_then(|raw| raw.parse().ok())
    }
    if let Some(model) = option::<String>(query, "model") {
        command.args(["--model", &model]);
    }
    if let Some(turns) = option::<u64>(query, "maxTurns") {
        command.args(["--max-turns", &turns.to_string()]);
    }
    for (key, flag) in [
        ("allowedTools", "--allowedTools"),
        ("disallowedTools", "--disallowedTools"),
    ] {
        if let Some(tools) = option::<Vec<String>>(query, key) {
            command.args([flag, &tools.join(",")]);
        }
    }
    if let Some(dir) = &agent.workspace {
        command.current_dir(dir);
    }
    command
}

/// The stream-json user message carrying the prompt (a string or content blocks).
fn user_message(prompt: &RawJson) -> Vec<u8> {
    let mut line = br#"{"type":"user","message":{"role":"user","content":"#.to_vec();
    line.extend_from_slice(prompt.get().as_bytes());
    line.extend_from_slice(b"}}\n");
    line
}

/// A child in its own process group, signalled as a group.
fn spawn_group(mut command: Command) -> io::Result<(Child, Option<rustix::process::Pid>)> {
    command
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command.spawn()?;
    let group = child
        .id()
        .and_then(|id| rustix::process::Pid::from_raw(id as i32));
    Ok((child, group))
}

fn signal_group(group: Option<rustix::process::Pid>, signal: rustix::process::Signal) {
    if let Some(group) = group
        && let Err(err) = rustix::process::kill_process_group(group, signal)
    {
        tracing::debug!(error = %err, "signalling the child's process group failed");
    }
}

/// Follows `stop`: SIGINT on `Interrupt`, then SIGKILL after the grace (see [`GRACE`]; or at once on
/// `Kill`). Never returns.
async fn enforce_stop(group: Option<rustix::process::Pid>, mut stop: watch::Receiver<Stop>) {
    use rustix::process::Signal;
    if stop.wait_for(|s| *s >= Stop::Interrupt).await.is_err() {
        return std::future::pending().await;
    }
    if *stop.borrow() == Stop::Interrupt {
        signal_group(group, Signal::INT);
        let _ = tokio::time::timeout(interrupt_grace(), stop.wait_for(|s| *s == Stop::Kill)).await;
    }
    signal_group(group, Signal::KILL);
    std::future::pending().await
}

#[derive(Deserialize)]
struct Peek {
    #[serde(rename = "type")]
    kind: Option<String>,
    subtype: Option<String>,
    session_id: Option<String>,
    result: Option<serde_json::Value>,
}

async fn run_agent(
    command: Command,
    query: Query,
    shared: Arc<Shared>,
    events: mpsc::Sender<TurnEvent>,
    stop: watch::Receiver<Stop>,
) {
    let program = shared.agent.claude.display().to_string();
    let result = match spawn_group(command) {
        Ok((child, group)) => {
            let (finished, seen) = agent_turn(child, group, &query, &events, stop).await;
            // Once the agent has named the session (its init message does), it exists and can
            // be resumed, however the turn ended.
            let mut sessions = lock(&shared.sessions);
            match seen.filter(|s| !s.is_empty()) {
                Some(agent_session) => sessions.started(&query.session_id, &agent_session),
                None => sessions.unnamed(&query.session_id),
            }
            finished
        }
        Err(err) => {
            lock(&shared.sessions).unnamed(&query.session_id);
            Err(format!("cannot start the agent ({program}): {err}"))
        }
    };
    let _ = events.send(TurnEvent::AgentFinished(result)).await;
}

async fn agent_turn(
    mut child: Child,
    group: Option<rustix::process::Pid>,
    query: &Query,
    events: &mpsc::Sender<TurnEvent>,
    stop: watch::Receiver<Stop>,
) -> (Result<(), String>, Option<String>) {
    if let Some(mut stdin) = child.stdin.take() {
        let message = user_message(&query.prompt);
        tokio::spawn(async move {
            let _ = stdin.write_all(&message).await;
        });
    }
    let stderr = child.stderr.take().map(|e| tokio::spawn(read_tail(e)));
    let mut stdout = child.stdout.take();
    let enforcer = enforce_stop(group, stop);
    tokio::pin!(enforcer);
    let mut lines = LineDecoder::new(MAX_AGENT_LINE_BYTES);
    let mut buf = vec![0u8; READ_CHUNK];
    let mut result_text = None;
    let mut seen = None;
    while let Some(out) = stdout.as_mut() {
        let n = tokio::select! {
            read = out.read(&mut buf) => read.unwrap_or(0),
            () = &mut enforcer => 0,
        };
        if n == 0 {
            stdout = None;
            lines.push(b"\n");
        } else {
            lines.push(&buf[..n]);
        }
        while let Some(line) = lines.decode() {
            let bytes = match line {
                Line::Complete(bytes) => bytes,
                Line::Oversized { len } => {
                    tracing::warn!(len, "agent line over the cap dropped");
                    continue;
                }
            };
            let Some(raw) = std::str::from_utf8(bytes)
                .ok()
                .map(str::trim)
                .filter(|t| t.starts_with('{'))
                .and_then(|t| RawJson::from_text(t).ok())
            else {
                if !bytes.iter().all(u8::is_ascii_whitespace) {
                    tracing::debug!(len = bytes.len(), "non-JSON line from the agent skipped");
                }
                continue;
            };
            if let Ok(peek) = raw.parse::<Peek>() {
                if peek.kind.as_deref() == Some("result") {
                    result_text = match peek.result {
                        Some(serde_json::Value::String(text)) if !text.is_empty() => Some(text),
                        _ => peek.subtype,
                    };
                }
                // The first session named (the init message's) is the conversation's.
                seen = seen.or(peek.session_id);
            }
            if events.send(TurnEvent::Message(raw)).await.is_err() {
                break;
            }
        }
    }
    let status: io::Result<ExitStatus> = tokio::select! {
        status = child.wait() => status,
        () = &mut enforcer => child.wait().await,
    };
    let tail = match stderr {
        Some(task) => task.await.unwrap_or_default(),
        None => String::new(),
    };
    let result = match status {
        Ok(status) if status.success() => Ok(()),
        // A failed turn, even when the agent printed a result first (claude does, with
        // `is_error`, when the API fails).
        Ok(status) => {
            let why = match tail.trim() {
                "" => result_text.unwrap_or_default(),
                tail => tail.to_owned(),
            };
            Err(if why.is_empty() {
                format!("the agent exited with {status}")
            } else {
                format!("the agent exited with {status}: {why}")
            })
        }
        Err(err) => Err(format!("waiting for the agent failed: {err}")),
    };
    (result, seen)
}

/// Reads a pipe to its end, keeping the last [`STDERR_TAIL_BYTES`].
async fn read_tail(mut pipe: impl AsyncRead + Unpin) -> String {
    let mut tail = Vec::new();
    let mut buf = vec![0u8; 4096];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > STDERR_TAIL_BYTES {
            tail.drain(..tail.len() - STDERR_TAIL_BYTES);
        }
    }
    String::from_utf8_lossy(&tail).into_owned()
}

/// Reads a pipe to its end, keeping the first [`MAX_EXEC_OUTPUT_BYTES`].
async fn read_head(mut pipe: impl AsyncRead + Unpin) -> String {
    let mut head = Vec::new();
    let mut buf = vec![0u8; READ_CHUNK];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = MAX_EXEC_OUTPUT_BYTES - head.len();
        head.extend_from_slice(&buf[..n.min(room)]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

async fn run_exec(
    command: String,
    workspace: Option<PathBuf>,
    timeout: Duration,
    events: mpsc::Sender<TurnEvent>,
    stop: watch::Receiver<Stop>,
) {
    let mut sh = Command::new("sh");
    sh.arg("-c").arg(&command);
    if let Some(dir) = workspace {
        sh.current_dir(dir);
    }
    let event = match spawn_group(sh) {
        Err(err) => TurnEvent::ExecFinished {
            exit_code: -1,
            stdout: String::new(),
            stderr: format!("cannot run sh: {err}"),
        },
        Ok((mut child, group)) => {
            drop(child.stdin.take());
            let stdout = child.stdout.take().map(|p| tokio::spawn(read_head(p)));
            let stderr = child.stderr.take().map(|p| tokio::spawn(read_head(p)));
            let (killer_tx, killer_rx) = oneshot::channel::<()>();
            // The timeout (or a shutdown) kills the whole group, which also closes the pipes.
            let killer = tokio::spawn(async move {
                let enforcer = enforce_stop(group, stop);
                tokio::select! {
                    () = tokio::time::sleep(timeout) => {
                        signal_group(group, rustix::process::Signal::KILL);
                        true
                    }
                    () = enforcer => false,
                    _ = killer_rx => false,
                }
            });
            let status = child.wait().await;
            // Whatever `sh` left behind in its group would keep the pipes open.
            signal_group(group, rustix::process::Signal::KILL);
            let timed_out = if killer.is_finished() {
                killer.await.unwrap_or(false)
            } else {
                let _ = killer_tx.send(());
                killer.await.unwrap_or(false)
            };
            let join = |task: Option<tokio::task::JoinHandle<String>>| async move {
                match task {
                    Some(task) => task.await.unwrap_or_default(),
                    None => String::new(),
                }
            };
            let (stdout, mut stderr) = (join(stdout).await, join(stderr).await);
            if timed_out {
                stderr.push_str(&format!(
                    "\nac7 ash-bridge: exec timed out after {} ms and was killed",
                    timeout.as_millis()
                ));
            }
            let exit_code = match status {
                Ok(status) if !timed_out => status.code().map_or(-1, i64::from),
                _ => -1,
            };
            TurnEvent::ExecFinished {
                exit_code,
                stdout,
                stderr,
            }
        }
    };
    let _ = events.send(event).await;
}
