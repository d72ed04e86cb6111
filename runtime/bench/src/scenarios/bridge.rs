//! The `bridge*` scenarios of `ac7-bench`: the real `ac7 mcp-bridge` process between this
//! process playing the agent (blocking pipes) and an in-process runner-side [`IpcServer`] on its
//! own thread answering `tools/list` with a 31-tool list of ~18 KB and `tools/call` cheaply.
//!
//! - `bridge-roundtrip`: sequential round trips, p50/p99 for `tools/list` and `tools/call`;
//! - `bridge-throughput`: `tools/call` with 32 requests in flight;
//! - `bridge-spawn`: process spawn -> `initialize` result, and stdin EOF -> exit, medians;
//! - `bridge-rss`: the bridge's peak RSS after the round-trip and throughput work;
//! - `bridge`: all of the above.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use ac7_protocol::codec::jsonrpc::{METHOD_NOT_FOUND, Outcome, RpcError};
use ac7_protocol::dialect::mcp;
use ac7_protocol::session::runner::IncomingRequest;
use anyhow::{Context, bail};
use serde::Serialize;

use super::catalogue::tools_list_result;
use super::{Latency, median, peak_rss_kib};
use ac7_runtime::dialects::mcp_bridge::RUNNER_SOCKET_ENV;
use ac7_runtime::runner::ipc_server::{Handler, IpcServer, IpcServerOptions, RunnerHandle};

/// The runner-side handler of the benchmark: the 31-tool list, a one-line `tools/call` result,
/// `-32601` for anything else.
pub(crate) fn handler() -> impl Handler {
    let tools = tools_list_result();
    move |req: IncomingRequest| {
        let outcome = match req.method.as_str() {
            mcp::TOOLS_LIST => Outcome::Result(tools.clone()),
            mcp::TOOLS_CALL => Outcome::Result(mcp::tool_text("ok")),
            other => Outcome::Error(RpcError::new(
                METHOD_NOT_FOUND,
                format!("Method not found: {other}"),
            )),
        };
        std::future::ready(outcome)
    }
}

/// What a scenario measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// Sequential round trips.
    Roundtrip,
    /// Requests in flight.
    Throughput,
    /// Spawn -> initialize, EOF -> exit.
    Spawn,
    /// Peak RSS.
    Rss,
}

/// Benchmark parameters.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The `ac7` binary.
    pub ac7: PathBuf,
    /// Sequential round trips per method.
    pub roundtrips: usize,
    /// Total calls in the throughput run.
    pub throughput_calls: usize,
    /// Requests kept in flight in the throughput run.
    pub in_flight: usize,
    /// Spawns measured.
    pub spawns: usize,
}

impl Options {
    /// The parameters: N=1000, 32 in flight, 20 spawns.
    pub(crate) fn standard(ac7: PathBuf) -> Self {
        Self {
            ac7,
            roundtrips: 1000,
            throughput_calls: 20_000,
            in_flight: 32,
            spawns: 20,
        }
    }
}

/// Sequential round-trip latencies.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Roundtrip {
    /// `tools/list` (31 tools).
    pub tools_list: Latency,
    /// Size of the `tools/list` response line the agent reads.
    pub tools_list_response_bytes: usize,
    /// `tools/call` with a one-line result.
    pub tools_call: Latency,
}

/// Throughput with several requests in flight.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Throughput {
    /// Requests kept in flight.
    pub in_flight: usize,
    /// Calls completed.
    pub calls: usize,
    /// Wall time.
    pub seconds: f64,
    /// Calls per second.
    pub calls_per_sec: f64,
}

/// Process start-up and teardown.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Spawn {
    /// Spawns measured.
    pub n: usize,
    /// Median time from spawning the process to reading the `initialize` result.
    pub spawn_to_initialize_median_ms: f64,
    /// Slowest of them.
    pub spawn_to_initialize_max_ms: f64,
    /// Median time from closing its stdin to its exit.
    pub eof_to_exit_median_ms: f64,
}

/// One scenario's output.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    /// The scenario name.
    pub scenario: String,
    /// Sequential round trips.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roundtrip: Option<Roundtrip>,
    /// Throughput.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throughput: Option<Throughput>,
    /// Start-up and teardown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spawn: Option<Spawn>,
    /// Peak RSS (`VmHWM`) of the bridge that served the round trips and the throughput run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bridge_peak_rss_kib: Option<u64>,
}

/// Runs the given parts against a fresh runner-side server.
pub(crate) fn run(scenario: &str, parts: &[Part], options: &Options) -> anyhow::Result<Report> {
    let runner = Runner::start()?;
    let mut report = Report {
        scenario: scenario.to_owned(),
        roundtrip: None,
        throughput: None,
        spawn: None,
        bridge_peak_rss_kib: None,
    };
    if parts
        .iter()
        .any(|p| matches!(p, Part::Roundtrip | Part::Throughput | Part::Rss))
    {
        let mut agent = Agent::spawn(&options.ac7, &runner.path)?;
        agent.initialize()?;
        // Warm-up: first-use allocations and page faults on both sides.
        for _ in 0..100 {
            agent.call(mcp::TOOLS_LIST, None)?;
            agent.call(mcp::TOOLS_CALL, Some(r#"{"name":"roster","arguments":{}}"#))?;
        }
        if parts.contains(&Part::Roundtrip) || parts.contains(&Part::Rss) {
            report.roundtrip = Some(agent.roundtrips(options.roundtrips)?);
        }
        if parts.contains(&Part::Throughput) || parts.contains(&Part::Rss) {
            report.throughput =
                Some(agent.throughput(options.throughput_calls, options.in_flight)?);
        }
        if parts.contains(&Part::Rss) {
            report.bridge_peak_rss_kib = peak_rss_kib(agent.child.id());
        }
        agent.close()?;
    }
    if parts.contains(&Part::Spawn) {
        report.spawn = Some(spawns(&options.ac7, &runner.path, options.spawns)?);
    }
    if !parts.contains(&Part::Roundtrip) {
        report.roundtrip = None;
    }
    if !parts.contains(&Part::Throughput) {
        report.throughput = None;
    }
    runner.stop();
    Ok(report)
}

/// The runner-side server on its own thread and runtime.
struct Runner {
    path: PathBuf,
    handle: RunnerHandle,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: TempDir,
}

impl Runner {
    fn start() -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let server = IpcServer::bind(IpcServerOptions {
            path: Some(dir.path.join("runner.sock")),
            ..IpcServerOptions::default()
        })?;
        let path = server.path().to_owned();
        let handle = server.handle();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("bench-runner".into())
            .spawn(move || {
                runtime.block_on(async move {
                    server.serve(handler()).stopped().await;
                });
            })?;
        Ok(Self {
            path,
            handle,
            thread: Some(thread),
            _dir: dir,
        })
    }

    fn stop(mut self) {
        self.handle.shutdown(Some("bench-done"));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// This process playing the agent: blocking pipes to a bridge child.
pub(super) struct Agent {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    line: String,
    next_id: u64,
}

impl Agent {
    pub(super) fn spawn(ac7: &Path, socket: &Path) -> anyhow::Result<Self> {
        let mut command = Command::new(ac7);
        command.arg("mcp-bridge").env(RUNNER_SOCKET_ENV, socket);
        Self::spawn_command(command)
    }

    /// Spawns a bridge with piped stdin/stdout.
    pub(super) fn spawn_command(mut command: Command) -> anyhow::Result<Self> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawning {:?}", command.get_program()))?;
        let stdin = child.stdin.take().context("no stdin pipe")?;
        let stdout = child.stdout.take().context("no stdout pipe")?;
        Ok(Self {
            child,
            stdin: Some(stdin),
            stdout: BufReader::with_capacity(64 * 1024, stdout),
            line: String::new(),
            next_id: 0,
        })
    }

    pub(super) fn send(&mut self, method: &str, params: Option<&str>) -> anyhow::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let line = match params {
            Some(p) => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{p}}}"#),
            None => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}"}}"#),
        };
        let stdin = self.stdin.as_mut().context("stdin already closed")?;
        stdin.write_all(line.as_bytes())?;
        stdin.write_all(b"\n")?;
        stdin.flush()?;
        Ok(id)
    }

    /// The bridge's peak RSS so far.
    /// The child's pid.
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(super) fn peak_rss_kib(&self) -> Option<u64> {
        peak_rss_kib(self.child.id())
    }

    /// Reads the next line the bridge writes (a response or a notification).
    pub(super) fn read_line(&mut self) -> anyhow::Result<&str> {
        self.line.clear();
        if self.stdout.read_line(&mut self.line)? == 0 {
            bail!("the bridge closed its stdout");
        }
        Ok(&self.line)
    }

    /// Reads one response line; checks it is a result.
    pub(super) fn receive(&mut self) -> anyhow::Result<usize> {
        self.line.clear();
        let n = self.stdout.read_line(&mut self.line)?;
        if n == 0 {
            bail!("the bridge closed its stdout");
        }
        if !self.line.contains("\"result\"") {
            bail!("unexpected answer: {}", self.line.trim_end());
        }
        Ok(n)
    }

    pub(super) fn call(&mut self, method: &str, params: Option<&str>) -> anyhow::Result<usize> {
        self.send(method, params)?;
        self.receive()
    }

    pub(super) fn initialize(&mut self) -> anyhow::Result<()> {
        self.call(
            mcp::INITIALIZE,
            Some(
                r#"{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"ac7-bench","version":"0"}}"#,
            ),
        )?;
        let stdin = self.stdin.as_mut().context("stdin already closed")?;
        stdin.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")?;
        Ok(())
    }

    fn roundtrips(&mut self, n: usize) -> anyhow::Result<Roundtrip> {
        let mut list = Vec::with_capacity(n);
        let mut call = Vec::with_capacity(n);
        let mut bytes = 0;
        for _ in 0..n {
            let t = Instant::now();
            bytes = self.call(mcp::TOOLS_LIST, None)?;
            list.push(t.elapsed());
            let t = Instant::now();
            self.call(
                mcp::TOOLS_CALL,
                Some(r#"{"name":"roster","arguments":{},"_meta":{"progressToken":1}}"#),
            )?;
            call.push(t.elapsed());
        }
        Ok(Roundtrip {
            tools_list: Latency::of(&mut list).context("no samples")?,
            tools_list_response_bytes: bytes,
            tools_call: Latency::of(&mut call).context("no samples")?,
        })
    }

    pub(super) fn throughput(
        &mut self,
        calls: usize,
        in_flight: usize,
    ) -> anyhow::Result<Throughput> {
        let params = Some(r#"{"name":"roster","arguments":{}}"#);
        let start = Instant::now();
        let mut sent = 0;
        while sent < in_flight.min(calls) {
            self.send(mcp::TOOLS_CALL, params)?;
            sent += 1;
        }
        for _ in 0..calls {
            self.receive()?;
            if sent < calls {
                self.send(mcp::TOOLS_CALL, params)?;
                sent += 1;
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        Ok(Throughput {
            in_flight,
            calls,
            seconds,
            calls_per_sec: calls as f64 / seconds,
        })
    }

    /// Closes stdin and waits for the exit; returns how long that took.
    pub(super) fn close(mut self) -> anyhow::Result<Duration> {
        let t = Instant::now();
        drop(self.stdin.take());
        let status = self.child.wait()?;
        let elapsed = t.elapsed();
        if !status.success() {
            bail!("the bridge exited with {status}");
        }
        Ok(elapsed)
    }
}

fn spawns(ac7: &Path, socket: &Path, n: usize) -> anyhow::Result<Spawn> {
    let mut start = Vec::with_capacity(n);
    let mut exit = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut agent = Agent::spawn(ac7, socket)?;
        agent.initialize()?;
        start.push(t.elapsed());
        exit.push(agent.close()?);
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(Spawn {
        n,
        spawn_to_initialize_median_ms: ms(median(&mut start).context("no samples")?),
        spawn_to_initialize_max_ms: ms(start.last().copied().unwrap_or_default()),
        eof_to_exit_median_ms: ms(median(&mut exit).context("no samples")?),
    })
}

/// A private temporary directory removed on drop.
pub(super) struct TempDir {
    pub(super) path: PathBuf,
}

impl TempDir {
    pub(super) fn new() -> std::io::Result<Self> {
        let base = std::env::temp_dir();
        for n in 0..1000u32 {
            let path = base.join(format!("ac7-bench-{}-{n}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(Self { path }),
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(err) => return Err(err),
            }
        }
        Err(std::io::Error::other("no free temporary directory name"))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_list_fixture_is_31_tools_of_about_18_kb() {
        let raw = tools_list_result();
        let value: serde_json::Value = raw.parse().unwrap();
        assert_eq!(value["tools"].as_array().unwrap().len(), 31);
        let len = raw.get().len();
        assert!((16_000..=20_000).contains(&len), "{len} bytes");
    }
}
