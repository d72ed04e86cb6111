//! Shared support for the bridge integration tests: a scripted runner-side server, the real
//! `ac7 mcp-bridge` with piped stdio, the Python venv with the official MCP SDK, and bounded
//! waits (a hung test fails with a message, it never waits forever).
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)] // test support, shared by several test binaries

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ac7_protocol::codec::json::RawJson;
use ac7_protocol::codec::jsonrpc::{METHOD_NOT_FOUND, Outcome, RpcError};
use ac7_protocol::dialect::mcp;
use ac7_protocol::session::runner::{BridgePolicy, IncomingRequest, RunnerConfig, RunnerEvent};
use ac7_runtime::runner::ipc_server::{IpcServer, IpcServerOptions, RunnerHandle, ServerTask};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, watch};

pub mod ash;
pub mod messages_api;
pub mod npm;
pub mod postgres;
pub mod served;
pub mod turns;

pub use ac7_test_support::{catalogue, procfs, webdriver};

/// The `ac7` binary under test.
pub fn ac7() -> &'static str {
    env!("CARGO_BIN_EXE_ac7")
}

/// Awaits `fut` for at most `secs` seconds; panics naming `what` otherwise.
pub async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), fut).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {secs} s waiting for {what}"),
    }
}

/// Polls `check` every 20 ms until it returns `Some(value)` (or `true`), for at most `timeout`;
/// panics naming `what` otherwise. The one way a test waits for a condition it cannot await.
pub async fn wait_until<T: Ready>(
    what: &str,
    timeout: Duration,
    check: impl AsyncFnMut() -> T,
) -> T::Value {
    wait_until_showing(what, timeout, String::new, check).await
}

/// [`wait_until`], and on time-out the panic message also shows `context()` (a log, a listing).
pub async fn wait_until_showing<T: Ready>(
    what: &str,
    timeout: Duration,
    context: impl FnOnce() -> String,
    mut check: impl AsyncFnMut() -> T,
) -> T::Value {
    let poll = async {
        loop {
            if let Some(value) = check().await.ready() {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    match tokio::time::timeout(timeout, poll).await {
        Ok(value) => value,
        Err(_) => panic!(
            "timed out after {timeout:?} waiting for {what}\n{}",
            context()
        ),
    }
}

/// What a [`wait_until`] check returns: `bool` (done or not) or `Option<T>` (done with a value).
pub trait Ready {
    type Value;
    fn ready(self) -> Option<Self::Value>;
}

impl Ready for bool {
    type Value = ();
    fn ready(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Ready for Option<T> {
    type Value = T;
    fn ready(self) -> Option<T> {
        self
    }
}

/// A fresh temporary directory (short path: Unix socket paths are limited to 107 bytes).
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ac7t")
        .tempdir_in("/tmp")
        .expect("create a temporary directory")
}

/// What the scripted runner saw and how it behaves.
#[derive(Debug)]
pub struct Script {
    /// Every method the runner was asked, in arrival order.
    pub methods: Mutex<Vec<String>>,
    /// The `i` of each `slow` call, in the order they were answered.
    pub slow_answered: Mutex<Vec<u64>>,
    slow: watch::Sender<SlowState>,
    /// Receives one message per `die` call.
    pub die_tx: mpsc::UnboundedSender<()>,
}

#[derive(Debug, Default, Clone, Copy)]
struct SlowState {
    arrived: u64,
    /// The `i` allowed to answer next (counting down).
    next: Option<u64>,
}

impl Script {
    /// Methods seen so far.
    pub fn methods(&self) -> Vec<String> {
        self.methods.lock().unwrap().clone()
    }
}

/// The runner-side server with the scripted handler.
pub struct Runner {
    pub task: ServerTask,
    pub handle: RunnerHandle,
    pub script: Arc<Script>,
    pub path: PathBuf,
    pub die_rx: mpsc::UnboundedReceiver<()>,
    pub events: mpsc::UnboundedReceiver<RunnerEvent>,
}

/// Starts the scripted runner at `<dir>/r.sock` on the current runtime.
///
/// - `tools/list` -> the 31-tool catalogue of the benchmark;
/// - `tools/call`: `echo` -> text = the call's params verbatim (so `_meta` can be checked);
///   `fail` -> an `isError` result; `slow {i, n}` -> waits until all `n` arrived, then answers in
///   reverse order of `i`; `notify` -> sends `notifications/claude/channel` and
///   `notifications/tools/list_changed`, then answers; `die` -> reports on `die_rx` and never
///   answers; `huge` -> a 2 MiB text;
/// - anything else -> `-32601`.
pub fn start_runner(dir: &Path, policy: BridgePolicy) -> Runner {
    let (events_tx, events) = mpsc::unbounded_channel();
    let server = IpcServer::bind(IpcServerOptions {
        path: Some(dir.join("r.sock")),
        session: RunnerConfig {
            policy,
            ..RunnerConfig::default()
        },
        events: Some(events_tx),
        ..IpcServerOptions::default()
    })
    .expect("bind the runner socket");
    let path = server.path().to_owned();
    let handle = server.handle();
    let (die_tx, die_rx) = mpsc::unbounded_channel();
    let script = Arc::new(Script {
        methods: Mutex::new(Vec::new()),
        slow_answered: Mutex::new(Vec::new()),
        slow: watch::Sender::new(SlowState::default()),
        die_tx,
    });
    let state = Arc::clone(&script);
    let notifier = handle.clone();
    let task = server.serve(move |req: IncomingRequest| {
        let state = Arc::clone(&state);
        let notifier = notifier.clone();
        async move { scripted(&state, &notifier, req).await }
    });
    Runner {
        task,
        handle,
        script,
        path,
        die_rx,
        events,
    }
}

async fn scripted(state: &Script, notifier: &RunnerHandle, req: IncomingRequest) -> Outcome {
    state.methods.lock().unwrap().push(req.method.clone());
    match req.method.as_str() {
        mcp::TOOLS_LIST => Outcome::Result(catalogue::tools_list_result()),
        mcp::TOOLS_CALL => {
            let raw = req
                .params
                .as_ref()
                .map(|p| p.get().to_owned())
                .unwrap_or_default();
            let params: Value = serde_json::from_str(&raw).unwrap_or(Value::Null);
            let args = &params["arguments"];
            match params["name"].as_str().unwrap_or_default() {
                "echo" => Outcome::Result(mcp::tool_text(&raw)),
                "fail" => Outcome::Result(mcp::tool_error("fail: this tool always fails")),
                "slow" => {
                    let i = args["i"].as_u64().unwrap_or_default();
                    let n = args["n"].as_u64().unwrap_or(1);
                    slow(state, i, n).await;
                    Outcome::Result(mcp::tool_text(&format!("slow {i}")))
                }
                "notify" => {
                    let params = json!({
                        "content": "hello from the team",
                        "meta": {"from": "alice", "thread": "dm", "level": "info", "ts_ms": "1776263025000"}
                    });
                    notifier.notify(
                        mcp::CLAUDE_CHANNEL,
                        Some(RawJson::from_value(&params).unwrap()),
                    );
                    notifier.notify(mcp::TOOLS_LIST_CHANGED, None);
                    Outcome::Result(mcp::tool_text("sent"))
                }
                "die" => {
                    let _ = state.die_tx.send(());
                    std::future::pending().await
                }
                "huge" => Outcome::Result(mcp::tool_text(&"x".repeat(2 << 20))),
                other => Outcome::Result(mcp::tool_error(&format!("unknown tool {other}"))),
            }
        }
        other => Outcome::Error(RpcError::new(
            METHOD_NOT_FOUND,
            format!("Method not found: {other}"),
        )),
    }
}

/// Waits until all `n` slow calls arrived, then lets them answer from `n-1` down to 0.
async fn slow(state: &Script, i: u64, n: u64) {
    let mut rx = state.slow.subscribe();
    state.slow.send_modify(|s| {
        s.arrived += 1;
        if s.arrived == n {
            s.next = Some(n - 1);
        }
    });
    let _ = rx.wait_for(|s| s.next == Some(i)).await;
    state.slow_answered.lock().unwrap().push(i);
    state.slow.send_modify(|s| s.next = i.checked_sub(1));
}

/// The real `ac7 mcp-bridge` with piped stdio; this test plays the agent.
pub struct Bridge {
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Bridge {
    /// Spawns the bridge pointed at `socket`, logging at `AC7_LOG=debug` to a captured stderr.
    pub fn spawn(socket: &Path) -> Self {
        Self::spawn_with(&["mcp-bridge".as_ref()], &[("AC7_RUNNER_SOCKET", socket)])
    }

    /// Spawns `ac7 <args>` with `env` set, logging at `AC7_LOG=debug` to a captured stderr.
    pub fn spawn_with(args: &[&std::ffi::OsStr], env: &[(&str, &Path)]) -> Self {
        let mut command = Command::new(ac7());
        command.args(args);
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command
            .env("AC7_LOG", "debug")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn ac7 mcp-bridge");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("the bridge is running")
    }

    /// Writes raw bytes to the bridge's stdin.
    pub async fn write(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        within(10, "writing to the bridge's stdin", async {
            stdin.write_all(bytes).await.unwrap();
            stdin.flush().await.unwrap();
        })
        .await;
    }

    /// Writes one line (a newline is appended).
    pub async fn send(&mut self, line: &str) {
        self.write(format!("{line}\n").as_bytes()).await;
    }

    /// Reads the next line from stdout and parses it; every stdout line must be JSON-RPC.
    pub async fn recv(&mut self) -> Value {
        let mut line = String::new();
        let n = within(
            10,
            "a line from the bridge's stdout",
            self.stdout.read_line(&mut line),
        )
        .await
        .unwrap();
        assert!(n > 0, "the bridge closed its stdout");
        let value: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line:?}"));
        assert_eq!(value["jsonrpc"], "2.0", "not JSON-RPC: {line}");
        value
    }

    /// Sends a request and returns the answer (which must carry the same id).
    pub async fn request(&mut self, id: Value, method: &str, params: Value) -> Value {
        let mut req = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if !params.is_null() {
            req["params"] = params;
        }
        self.send(&req.to_string()).await;
        let answer = self.recv().await;
        assert_eq!(
            answer["id"], req["id"],
            "answer to another request: {answer}"
        );
        answer
    }

    /// The MCP handshake.
    pub async fn initialize(&mut self) -> Value {
        let answer = self
            .request(
                json!(0),
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
            )
            .await;
        self.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await;
        answer
    }

    /// Takes the bridge's stdin, to write without waiting for the bridge to read.
    pub fn take_stdin(&mut self) -> ChildStdin {
        self.stdin.take().expect("stdin is open")
    }

    /// Closes stdin (EOF for the bridge).
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Waits (bounded) for the exit; returns the exit code and everything left on stdout.
    pub async fn exit(mut self) -> (i32, Vec<Value>, String) {
        let status = within(5, "the bridge to exit", self.child.wait())
            .await
            .unwrap();
        let mut rest = Vec::new();
        let mut line = String::new();
        while within(
            5,
            "the bridge's stdout to close",
            self.stdout.read_line(&mut line),
        )
        .await
        .unwrap()
            > 0
        {
            rest.push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}")));
            line.clear();
        }
        let mut stderr = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            use tokio::io::AsyncReadExt;
            within(5, "the bridge's stderr", err.read_to_string(&mut stderr))
                .await
                .unwrap();
        }
        (status.code().unwrap_or(-1), rest, stderr)
    }
}

/// The Python interpreter of the venv with the pinned `mcp` SDK: `$AC7_TEST_PYTHON`, else
/// `<repo>/.venv/bin/python`, created (once, under a lock) when missing or out of date.
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(find_or_create_python).clone()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn find_or_create_python() -> PathBuf {
    if let Some(python) = std::env::var_os("AC7_TEST_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(python);
    }
    let repo = repo();
    let venv = repo.join(".venv");
    let python = venv.join("bin/python");
    let requirements = repo.join("runtime/tests/python/requirements.txt");
    let wanted = std::fs::read_to_string(&requirements).expect("read requirements.txt");
    // The marker records which requirements the venv was built from.
    let marker = venv.join(".ac7-requirements");
    let ready =
        || python.exists() && std::fs::read_to_string(&marker).ok().as_deref() == Some(&wanted);
    if ready() {
        return python;
    }
    let lock = std::fs::File::create(repo.join(".venv.lock")).expect("create .venv.lock");
    lock.lock().expect("lock .venv.lock");
    if !ready() {
        if !python.exists() {
            run_setup(
                std::process::Command::new("python3")
                    .args(["-m", "venv"])
                    .arg(&venv),
            );
        }
        run_setup(
            std::process::Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "-r",
                ])
                .arg(&requirements),
        );
        std::fs::write(&marker, &wanted).expect("write the venv marker");
    }
    python
}

fn run_setup(cmd: &mut std::process::Command) {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run {cmd:?}: {e} (python3 is needed for the MCP SDK tests, or set AC7_TEST_PYTHON)")
    });
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `runtime/tests/python/agent.py <scenario>` (the official MCP SDK as the agent, spawning
/// the real bridge pointed at `socket`), bounded to 60 s. Returns the JSON object it printed last.
pub async fn run_agent(scenario: &str, socket: &Path, work: &Path) -> Value {
    run_python(
        "agent.py",
        scenario,
        &[("AC7_TEST_SOCKET", socket), ("AC7_TEST_WORK", work)],
    )
    .await
}

/// Runs `runtime/tests/python/<script> <scenario>` with `AC7_BIN` and `env` set, bounded to 60 s.
/// Returns the JSON object it printed last.
pub async fn run_python(script: &str, scenario: &str, env: &[(&str, &Path)]) -> Value {
    let path = repo().join("runtime/tests/python").join(script);
    let mut command = Command::new(python());
    command.arg(path).arg(scenario).env("AC7_BIN", ac7());
    for (key, value) in env {
        command.env(key, value);
    }
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the Python agent");
    let out = within(
        60,
        &format!("the Python agent ({script} {scenario})"),
        child.wait_with_output(),
    )
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} {scenario} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    eprintln!("{script} {scenario}: {last}");
    serde_json::from_str(last).unwrap_or_else(|e| {
        panic!("{script} {scenario} printed no JSON ({e}):\n{stdout}\n{stderr}")
    })
}

/// Whether `O_NONBLOCK` is set on the open file description behind `fd`.
pub fn is_nonblocking(fd: &impl std::os::fd::AsRawFd) -> bool {
    // SAFETY: F_GETFL on a valid, open descriptor only reads its flags.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    assert!(flags >= 0, "fcntl failed");
    flags & libc::O_NONBLOCK != 0
}
