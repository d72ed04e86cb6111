//! `ac7-bench e2e`: an agent's view of ac7, end to end, against floors taken in the same run.
//!
//! A broker child process, a do-nothing HTTP server child ([`super::floor`]), and the real
//! `ac7 run -- ac7-bench __e2e-agent`: the runner starts this binary as its agent, in a private
//! directory, so the runner writes `./.mcp.json` there as it does for any agent. The agent — a
//! std-only client with blocking reads and writes — reads the `ac7` server entry from that file,
//! spawns the bridge from it (command, args, env), does the MCP handshake and measures:
//!
//! - `tools/list`: sequential round trips (the runner's real tool list);
//! - `roster`: `tools/call roster` round trips (runner -> broker `GET /roster` -> back);
//! - push -> channel notification: an HTTP `POST /push` to the broker (a DM from the director)
//!   until `notifications/claude/channel` with its body is read from the bridge's stdout;
//! - `tools/list` with 32 requests in flight: calls per second;
//! - the runner's and the bridge's CPU per `tools/list` (`/proc/<pid>/stat` utime + stime in
//!   clock ticks, and the sum of `/proc/<pid>/task/*/schedstat` run time in ns, over the calls);
//! - the runner's and the bridge's peak RSS.
//!
//! The floors, measured by the same client code between the same phases (interleaved blocks):
//! a pipe echo and a Unix-socket echo ([`super::floor`]) answering the same request bytes with
//! lines of the same sizes as ac7's answers (the `tools/list` result, the `roster` result, the
//! channel notification), and an HTTP `POST` of the push's bytes to the do-nothing server. Each
//! ratio is ours (p50) over the sum of the floors' p50 that make up the same path:
//!
//! - `tools/list`: pipe echo + socket echo;
//! - `roster`: pipe echo + socket echo + HTTP POST;
//! - push -> notification: HTTP POST + socket echo + pipe echo;
//! - in flight: the pipe echo's calls per second over ours.
//!
//! Each floor is two processes passing bytes; a call through ac7 crosses three (agent, runner,
//! broker), and where the kernel puts three processes that take turns is not where it puts two.
//! So `roster` and push are also measured through do-nothing processes of the same shape
//! (`shape`, with its own `ratio_to_shape_p50` and interrupts between CPUs): for `roster`, the
//! agent's line goes through a pipe to a relay, which posts it to the do-nothing server and
//! answers a line of the roster's size once the server has answered; for push, the agent posts
//! to the do-nothing server, which writes the body to a relay holding a `GET` open, which writes
//! a line of the notification's size to the agent's pipe ([`super::floor`]'s `__relay`).
//!
//! Last, `placement` prices where the kernel puts processes: where more than one CPU is
//! allowed, the pipe echo with the agent held on one CPU and the echo on the same CPU
//! (`together`), then on another (`apart`). Half the difference of their p50 is what one wake-up
//! across CPUs costs on this machine (`wake_across_cpus_us`); with the interrupts between CPUs
//! each phase counted, it tells how much of a two-CPU figure is placement rather than work.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use ac7_protocol::dialect::mcp;
use ac7_protocol::session::mcp_bridge::START_GRACE;
use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::broker::BrokerChild;
use super::floor::{ECHO_ARG, RELAY_ARG, SERVER_ARG, content_length, find};
use super::{Latency, peak_rss_kib, sibling_binary};

/// The hidden argument that makes `ac7-bench` the agent.
pub(crate) const AGENT_ARG: &str = "__e2e-agent";

/// The broker's `host:port`, for the agent's pushes.
const ENV_BROKER: &str = "AC7_BENCH_E2E_BROKER";
/// The director's token, for the agent's pushes.
const ENV_PUSH_TOKEN: &str = "AC7_BENCH_E2E_PUSH_TOKEN";
/// The do-nothing server's `host:port`.
const ENV_FLOOR: &str = "AC7_BENCH_E2E_FLOOR";
/// The broker's pid, for its CPU use.
const ENV_BROKER_PID: &str = "AC7_BENCH_E2E_BROKER_PID";

/// `<phase>:<seconds>` (`tools_list`, `roster`, `push`, `in_flight`): before measuring, the agent
/// runs that phase alone for that long, for a profiler to attach to the runner, the bridge or
/// the broker.
const ENV_PROFILE: &str = "AC7_BENCH_E2E_PROFILE";

/// How many members the team has besides the director (default 1: the agent alone); the
/// roster's answer grows with it.
const ENV_MEMBERS: &str = "AC7_BENCH_E2E_MEMBERS";

/// Interleaved blocks: each runs every phase once, so slow moments of a shared machine spread
/// over ours and the floors alike.
const BLOCKS: usize = 4;
const LIST_PER_BLOCK: usize = 500;
const ROSTER_PER_BLOCK: usize = 250;
const PUSH_PER_BLOCK: usize = 125;
const IN_FLIGHT: usize = 32;
const IN_FLIGHT_CALLS: usize = 20_000;
const PLACEMENT_CALLS: usize = 2_000;

/// What the push shape's relay passes on (the push floor's own posts are not passed on).
const SHAPE_MARKER: &str = "e2e-shape-";

/// Runs the scenario: the broker, the floor server and the runner with this binary as its agent;
/// returns the agent's report.
pub(crate) fn run() -> anyhow::Result<Value> {
    let ac7 = sibling_binary("ac7")?;
    let members = match std::env::var(ENV_MEMBERS) {
        Ok(n) => n.parse().with_context(|| format!("{ENV_MEMBERS}={n}"))?,
        Err(_) => 1,
    };
    let broker = BrokerChild::spawn(members)?;
    let floor = FloorServer::spawn()?;
    let dir = super::bridge::TempDir::new()?;
    let broker_addr = broker
        .url
        .strip_prefix("http://")
        .context("broker URL")?
        .to_owned();
    let output = Command::new(&ac7)
        .current_dir(&dir.path)
        .args(["run", "--url", &broker.url, "--"])
        .arg(std::env::current_exe()?)
        .arg(AGENT_ARG)
        .env("AC7_TOKEN", broker.token("m0"))
        .env("AC7_LOG", "error")
        .env(ENV_BROKER, &broker_addr)
        .env(ENV_PUSH_TOKEN, broker.token("director"))
        .env(ENV_FLOOR, &floor.addr)
        .env(ENV_BROKER_PID, broker.pid().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .context("running ac7 run")?;
    if !output.status.success() {
        bail!("ac7 run (and its agent) exited with {}", output.status);
    }
    let text = String::from_utf8(output.stdout)?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("the agent printed no report")?;
    let mut report: Value = serde_json::from_str(line)?;
    report["broker_peak_rss_kib"] = json!(peak_rss_kib(broker.pid()));
    Ok(report)
}

/// The do-nothing HTTP server child; killed on drop.
pub(crate) struct FloorServer {
    child: Child,
    /// `host:port`.
    pub(crate) addr: String,
}

impl FloorServer {
    pub(crate) fn spawn() -> anyhow::Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .arg(SERVER_ARG)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("no stdout")?).read_line(&mut line)?;
        let Some(addr) = line.trim().strip_prefix("listening ") else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the floor server did not start: {line:?}");
        };
        Ok(Self {
            addr: addr.to_owned(),
            child,
        })
    }
}

impl Drop for FloorServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking JSON-RPC line client over any byte stream: the bridge's pipes, or an echo's.
struct Lines<W: Write, R: Read> {
    w: W,
    r: BufReader<R>,
    line: String,
    out: Vec<u8>,
    next_id: u64,
}

/// A line that is a JSON-RPC notification (as the bridge writes them).
fn is_notification(line: &str) -> bool {
    line.starts_with(r#"{"jsonrpc":"2.0","method":"#)
}

impl<W: Write, R: Read> Lines<W, R> {
    fn new(w: W, r: R) -> Self {
        Self {
            w,
            r: BufReader::with_capacity(64 * 1024, r),
            line: String::with_capacity(64 * 1024),
            out: Vec::with_capacity(256),
            next_id: 1,
        }
    }

    /// Writes one request line (one `write`).
    fn send(&mut self, method: &str, params: Option<&str>) -> anyhow::Result<()> {
        use std::io::Write as _;
        self.out.clear();
        write!(
            self.out,
            r#"{{"jsonrpc":"2.0","id":{},"method":"{method}""#,
            self.next_id
        )?;
        if let Some(p) = params {
            write!(self.out, r#","params":{p}"#)?;
        }
        self.out.extend_from_slice(b"}\n");
        self.next_id += 1;
        self.w.write_all(&self.out)?;
        Ok(())
    }

    /// The bytes of the last request line sent.
    fn last_request_len(&self) -> usize {
        self.out.len()
    }

    fn write_raw(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.w.write_all(bytes)?;
        Ok(())
    }

    /// Reads the next line.
    fn read_line(&mut self) -> anyhow::Result<&str> {
        self.line.clear();
        if self.r.read_line(&mut self.line)? == 0 {
            bail!("the peer closed its end");
        }
        Ok(&self.line)
    }

    /// Reads up to the next response (skipping notifications); its length. It must be a result.
    fn receive(&mut self) -> anyhow::Result<usize> {
        loop {
            let line = self.read_line()?;
            if is_notification(line) {
                continue;
            }
            if !line.contains("\"result\"") {
                bail!("unexpected answer: {}", line.trim_end());
            }
            return Ok(line.len());
        }
    }

    fn call(&mut self, method: &str, params: Option<&str>) -> anyhow::Result<usize> {
        self.send(method, params)?;
        self.receive()
    }

    /// `n` sequential calls, timed.
    fn round_trips(
        &mut self,
        n: usize,
        method: &str,
        params: Option<&str>,
        samples: &mut Vec<Duration>,
    ) -> anyhow::Result<()> {
        for _ in 0..n {
            let t = Instant::now();
            self.call(method, params)?;
            samples.push(t.elapsed());
        }
        Ok(())
    }

    /// `calls` calls with `in_flight` outstanding; calls per second.
    fn in_flight(
        &mut self,
        calls: usize,
        in_flight: usize,
        method: &str,
        params: Option<&str>,
    ) -> anyhow::Result<f64> {
        let start = Instant::now();
        let mut sent = 0;
        while sent < in_flight.min(calls) {
            self.send(method, params)?;
            sent += 1;
        }
        for _ in 0..calls {
            self.receive()?;
            if sent < calls {
                self.send(method, params)?;
                sent += 1;
            }
        }
        Ok(calls as f64 / start.elapsed().as_secs_f64())
    }
}

/// An echo child ([`super::floor`]) and the client end of its pipe or socket.
struct Echo<W: Write, R: Read> {
    child: Child,
    lines: Lines<W, R>,
}

impl<W: Write, R: Read> Echo<W, R> {
    /// Answers from now on are lines of `size` bytes.
    fn reply_size(&mut self, size: usize) -> anyhow::Result<()> {
        self.lines.write_raw(format!("#{size}\n").as_bytes())
    }
}

impl<W: Write, R: Read> Drop for Echo<W, R> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pipe_echo() -> anyhow::Result<Echo<ChildStdin, ChildStdout>> {
    piped_child(&[ECHO_ARG])
}

fn socket_echo(path: &std::path::Path) -> anyhow::Result<Echo<UnixStream, UnixStream>> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg(ECHO_ARG)
        .arg("--socket")
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut ready = String::new();
    BufReader::new(child.stdout.take().context("no stdout")?).read_line(&mut ready)?;
    if ready.trim() != "ready" {
        let _ = child.kill();
        bail!("the socket echo did not start: {ready:?}");
    }
    let stream = UnixStream::connect(path)?;
    Ok(Echo {
        child,
        lines: Lines::new(stream.try_clone()?, stream),
    })
}

/// A relay child ([`super::floor`]) with `args`, its stdin and stdout as the client's pipe.
fn relay(args: &[&str]) -> anyhow::Result<Echo<ChildStdin, ChildStdout>> {
    let mut all = vec![RELAY_ARG];
    all.extend_from_slice(args);
    piped_child(&all)
}

/// This binary run with `args`, its stdin and stdout as the client's pipe.
fn piped_child(args: &[&str]) -> anyhow::Result<Echo<ChildStdin, ChildStdout>> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdin = child.stdin.take().context("no stdin")?;
    let stdout = child.stdout.take().context("no stdout")?;
    Ok(Echo {
        child,
        lines: Lines::new(stdin, stdout),
    })
}

/// A push of the same shape through do-nothing processes: a `POST /push` to the do-nothing
/// server, timed until the stream relay's line is read from its pipe.
fn shape_push(
    http: &mut Http,
    relay: &mut Lines<ChildStdin, ChildStdout>,
    body: &str,
    samples: Option<&mut Vec<Duration>>,
) -> anyhow::Result<()> {
    let t = Instant::now();
    http.send_post("/push", "-", body.as_bytes())?;
    relay.receive()?;
    if let Some(samples) = samples {
        samples.push(t.elapsed());
    }
    let status = http.read_response()?;
    if status != 200 {
        bail!("the floor server answered {status}");
    }
    Ok(())
}

/// A blocking HTTP/1.1 client on one kept-alive connection.
pub(super) struct Http {
    stream: TcpStream,
    host: String,
    buf: Vec<u8>,
    request: Vec<u8>,
}

impl Http {
    pub(super) fn connect(addr: &str) -> anyhow::Result<Self> {
        let stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Self {
            stream,
            host: addr.to_owned(),
            buf: Vec::with_capacity(16 * 1024),
            request: Vec::with_capacity(1024),
        })
    }

    /// Writes a `POST` (one `write`).
    pub(super) fn send_post(&mut self, path: &str, token: &str, body: &[u8]) -> anyhow::Result<()> {
        use std::io::Write as _;
        self.request.clear();
        write!(
            self.request,
            "POST {path} HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            self.host,
            body.len()
        )?;
        self.request.extend_from_slice(body);
        self.stream.write_all(&self.request)?;
        Ok(())
    }

    /// Reads one response with a `content-length` body; its status.
    pub(super) fn read_response(&mut self) -> anyhow::Result<u16> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buf[..end])?;
                let status: u16 = head
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .context("no status")?;
                let total = end + 4 + content_length(head);
                while self.buf.len() < total {
                    self.fill()?;
                }
                self.buf.drain(..total);
                return Ok(status);
            }
            self.fill()?;
        }
    }

    fn fill(&mut self) -> anyhow::Result<()> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 {
            bail!("the server closed the connection");
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    pub(super) fn post(&mut self, path: &str, token: &str, body: &[u8]) -> anyhow::Result<u16> {
        self.send_post(path, token, body)?;
        self.read_response()
    }
}

/// Pushes a DM to the agent's member through the broker and waits for it at the agent.
struct Pusher {
    http: Http,
    token: String,
    seq: u64,
}

impl Pusher {
    /// The body of the last push.
    fn body(&self) -> String {
        format!(r#"{{"to":"m0","body":"e2e-push-{}."}}"#, self.seq)
    }

    /// One push, timed from its first byte to its notification's last; the notification line's
    /// length.
    fn once(
        &mut self,
        agent: &mut Lines<ChildStdin, ChildStdout>,
        samples: Option<&mut Vec<Duration>>,
    ) -> anyhow::Result<usize> {
        self.seq += 1;
        let marker = format!("e2e-push-{}.", self.seq);
        let body = self.body();
        let t = Instant::now();
        self.http.send_post("/push", &self.token, body.as_bytes())?;
        let len = loop {
            if t.elapsed() > Duration::from_secs(10) {
                bail!("push {} never reached the agent", self.seq);
            }
            let line = agent.read_line()?;
            if is_notification(line) && line.contains(mcp::CLAUDE_CHANNEL) && line.contains(&marker)
            {
                break line.len();
            }
        };
        if let Some(samples) = samples {
            samples.push(t.elapsed());
        }
        let status = self.http.read_response()?;
        if !(200..300).contains(&status) {
            bail!("push {} answered {status}", self.seq);
        }
        Ok(len)
    }
}

/// CPU a process used so far: (`utime + stime` in clock ticks, run time of all its threads in ns).
fn cpu(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the command: state is field 3, utime field 14, stime field 15.
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let mut ns = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let path = task.ok()?.path().join("schedstat");
        if let Some(run) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        {
            ns += run;
        }
    }
    Some((ticks, ns))
}

/// CPU used between two [`cpu`] readings, summed over phases.
#[derive(Debug, Default, Clone, Copy)]
struct CpuUse {
    ticks: u64,
    ns: u64,
}

impl CpuUse {
    fn add(&mut self, before: Option<(u64, u64)>, after: Option<(u64, u64)>) {
        if let (Some(b), Some(a)) = (before, after) {
            self.ticks += a.0.saturating_sub(b.0);
            self.ns += a.1.saturating_sub(b.1);
        }
    }

    /// Microseconds per call: from the run time, and from the clock ticks.
    fn per_call(&self, calls: usize) -> Value {
        // SAFETY: sysconf only reads a constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        json!({
            "us": self.ns as f64 / 1e3 / calls as f64,
            "us_from_clock_ticks": self.ticks as f64 * 1e6 / hz / calls as f64,
            "calls": calls,
        })
    }
}

/// The CPU of the runner, the bridge and the broker over the calls of one phase.
#[derive(Debug, Default, Clone, Copy)]
struct CpuSet {
    runner: CpuUse,
    bridge: CpuUse,
    broker: CpuUse,
}

/// The processes whose CPU is counted.
#[derive(Debug, Clone, Copy)]
struct Procs {
    runner: u32,
    bridge: u32,
    broker: Option<u32>,
}

type Snapshot = [Option<(u64, u64)>; 3];

impl Procs {
    fn snapshot(&self) -> Snapshot {
        [
            cpu(self.runner),
            cpu(self.bridge),
            self.broker.and_then(cpu),
        ]
    }
}

impl CpuSet {
    fn add(&mut self, before: Snapshot, after: Snapshot) {
        self.runner.add(before[0], after[0]);
        self.bridge.add(before[1], after[1]);
        self.broker.add(before[2], after[2]);
    }

    fn per_call(&self, calls: usize) -> Value {
        json!({
            "runner": self.runner.per_call(calls),
            "bridge": self.bridge.per_call(calls),
            "broker": self.broker.per_call(calls),
        })
    }
}

/// Interrupts sent from one CPU to another so far, all CPUs summed: function calls (a wake-up
/// queued on the CPU the woken thread runs on) and reschedules (`/proc/interrupts`: `CAL`,
/// `RES`). System-wide, so whatever else runs adds to it; `None` where the file is unreadable.
fn interrupts_across_cpus() -> Option<u64> {
    interrupts_across_cpus_in(&std::fs::read_to_string("/proc/interrupts").ok()?)
}

/// [`interrupts_across_cpus`] of the text of `/proc/interrupts`.
fn interrupts_across_cpus_in(text: &str) -> Option<u64> {
    let mut total = None;
    for line in text.lines() {
        let line = line.trim_start();
        if let Some(counts) = line
            .strip_prefix("CAL:")
            .or_else(|| line.strip_prefix("RES:"))
        {
            let sum: u64 = counts
                .split_whitespace()
                .map_while(|n| n.parse::<u64>().ok())
                .sum();
            *total.get_or_insert(0) += sum;
        }
    }
    total
}

/// Cross-CPU interrupts counted over the calls through ac7 and over the same phase's floors;
/// `None` once a reading failed.
#[derive(Debug, Clone, Copy)]
struct Crossings {
    ours: Option<u64>,
    floors: Option<u64>,
    /// `None` until calls of the same shape were counted (only `roster` and push have one).
    shape: Option<Option<u64>>,
}

impl Default for Crossings {
    fn default() -> Self {
        Crossings {
            ours: Some(0),
            floors: Some(0),
            shape: None,
        }
    }
}

impl Crossings {
    /// Runs calls through ac7, counting their interrupts.
    fn ours<T>(&mut self, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
        counted(&mut self.ours, f)
    }

    /// Runs calls through the floors, counting their interrupts.
    fn floors<T>(&mut self, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
        counted(&mut self.floors, f)
    }

    /// Runs calls through the do-nothing processes of the same shape, counting their interrupts.
    fn shape<T>(&mut self, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
        counted(self.shape.get_or_insert(Some(0)), f)
    }

    /// Per call through ac7, per call of the floors (each a pipe and a socket round trip) and,
    /// where measured, per call of the same shape.
    fn per_call(&self, calls: usize) -> Value {
        let (Some(ours), Some(floors)) = (self.ours, self.floors) else {
            return Value::Null;
        };
        let mut out = json!({
            "ours": ours as f64 / calls as f64,
            "floors": floors as f64 / calls as f64,
        });
        if let Some(shape) = self.shape {
            out["shape"] = shape.map_or(Value::Null, |n| json!(n as f64 / calls as f64));
        }
        out
    }
}

/// Runs `f`, adding the cross-CPU interrupts it took to `total`.
fn counted<T>(total: &mut Option<u64>, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let before = interrupts_across_cpus();
    let out = f()?;
    let took = before
        .zip(interrupts_across_cpus())
        .map(|(b, a)| a.saturating_sub(b));
    *total = total.zip(took).map(|(t, n)| t + n);
    Ok(out)
}

/// The two echo floors, a pipe and a Unix socket.
struct EchoFloors {
    pipe: Echo<ChildStdin, ChildStdout>,
    sock: Echo<UnixStream, UnixStream>,
}

impl EchoFloors {
    /// Makes both answer every call with `size` bytes.
    fn reply_size(&mut self, size: usize) -> anyhow::Result<()> {
        self.pipe.reply_size(size)?;
        self.sock.reply_size(size)
    }

    /// One phase's floors: `n` calls answered with `size` bytes through the pipe, then through
    /// the socket, timed into `pipe` and `sock`, their interrupts counted into `crossings`.
    fn phase(
        &mut self,
        size: usize,
        n: usize,
        (method, params): (&str, Option<&str>),
        pipe: &mut Vec<Duration>,
        sock: &mut Vec<Duration>,
        crossings: &mut Crossings,
    ) -> anyhow::Result<()> {
        self.reply_size(size)?;
        crossings.floors(|| {
            self.pipe.lines.round_trips(n, method, params, pipe)?;
            self.sock.lines.round_trips(n, method, params, sock)
        })
    }
}

fn p50(l: &Latency) -> f64 {
    l.p50_us
}

fn latency(samples: &mut [Duration]) -> anyhow::Result<Latency> {
    Latency::of(samples).context("no samples")
}

/// The agent: everything above, from inside the runner's agent slot. Prints the report on
/// stdout (the runner's).
#[allow(clippy::print_stdout)]
pub(crate) fn agent_main() -> anyhow::Result<i32> {
    let config: Value = serde_json::from_slice(
        &std::fs::read(".mcp.json").context("reading the .mcp.json the runner wrote")?,
    )?;
    let entry = &config["mcpServers"][mcp::SERVER_NAME];
    let program = entry["command"].as_str().context("no command")?;
    let mut bridge = Command::new(program);
    for arg in entry["args"].as_array().into_iter().flatten() {
        bridge.arg(arg.as_str().context("an argument")?);
    }
    for (k, v) in entry["env"].as_object().into_iter().flatten() {
        bridge.env(k, v.as_str().context("an env value")?);
    }
    let mut child = bridge
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("spawning the bridge")?;
    let bridge_pid = child.id();
    let runner_pid = std::os::unix::process::parent_id();
    let procs = Procs {
        runner: runner_pid,
        bridge: bridge_pid,
        broker: std::env::var(ENV_BROKER_PID)
            .ok()
            .and_then(|p| p.parse().ok()),
    };
    let mut agent = Lines::new(
        child.stdin.take().context("no stdin")?,
        child.stdout.take().context("no stdout")?,
    );
    let broker = std::env::var(ENV_BROKER).context(ENV_BROKER)?;
    let push_token = std::env::var(ENV_PUSH_TOKEN).context(ENV_PUSH_TOKEN)?;
    let floor_addr = std::env::var(ENV_FLOOR).context(ENV_FLOOR)?;

    agent.call(
        mcp::INITIALIZE,
        Some(
            r#"{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"ac7-bench-e2e","version":"0"}}"#,
        ),
    )?;
    agent.write_raw(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")?;
    agent.call(mcp::TOOLS_LIST, None)?;
    // Channel notifications flow once the bridge's start-up grace has passed.
    std::thread::sleep(START_GRACE + Duration::from_millis(100));

    let roster = Some(r#"{"name":"roster","arguments":{}}"#);
    let mut push = Pusher {
        http: Http::connect(&broker)?,
        token: push_token.clone(),
        seq: 0,
    };
    let mut floor_http = Http::connect(&floor_addr)?;
    // Warm-up, and the sizes the floors answer with.
    let mut list_bytes = 0;
    for _ in 0..200 {
        list_bytes = agent.call(mcp::TOOLS_LIST, None)?;
    }
    let list_request_bytes = agent.last_request_len();
    let mut roster_bytes = 0;
    for _ in 0..100 {
        roster_bytes = agent.call(mcp::TOOLS_CALL, roster)?;
    }
    let roster_request_bytes = agent.last_request_len();
    let mut notification_bytes = 0;
    for _ in 0..20 {
        notification_bytes = push.once(&mut agent, None)?;
    }
    let floor_body = push.body();

    // For profilers: one phase alone for a while, before the measurements.
    if let Ok(spec) = std::env::var(ENV_PROFILE) {
        let (phase, secs) = spec.split_once(':').context(ENV_PROFILE)?;
        let until = Instant::now() + Duration::from_secs(secs.parse()?);
        while Instant::now() < until {
            match phase {
                "tools_list" => drop(agent.call(mcp::TOOLS_LIST, None)?),
                "roster" => drop(agent.call(mcp::TOOLS_CALL, roster)?),
                "push" => drop(push.once(&mut agent, None)?),
                "in_flight" => drop(agent.in_flight(1000, IN_FLIGHT, mcp::TOOLS_LIST, None)?),
                other => bail!("{ENV_PROFILE}: unknown phase {other}"),
            }
        }
    }

    let dir = super::bridge::TempDir::new()?;
    let mut echo = EchoFloors {
        pipe: pipe_echo()?,
        sock: socket_echo(&dir.path.join("echo.sock"))?,
    };
    let mut roster_shape = relay(&["http", &floor_addr, &roster_bytes.to_string()])?;
    let mut push_shape = relay(&[
        "stream",
        &floor_addr,
        &notification_bytes.to_string(),
        SHAPE_MARKER,
    ])?;
    if push_shape.lines.read_line()?.trim_end() != "ready" {
        bail!("the stream relay did not start");
    }
    let shape_body = floor_body.replacen("e2e-push-", SHAPE_MARKER, 1);
    for _ in 0..200 {
        for floor in [
            &mut echo.pipe.lines as &mut dyn Warm,
            &mut echo.sock.lines,
            &mut roster_shape.lines,
        ] {
            floor.warm()?;
        }
        floor_http.post("/floor", &push_token, floor_body.as_bytes())?;
        shape_push(&mut floor_http, &mut push_shape.lines, &shape_body, None)?;
    }

    let (mut list, mut list_pipe, mut list_sock) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ros, mut ros_pipe, mut ros_sock) = (Vec::new(), Vec::new(), Vec::new());
    let (mut pushes, mut note_pipe, mut note_sock) = (Vec::new(), Vec::new(), Vec::new());
    let mut http = Vec::new();
    let (mut ros_shape, mut push_shape_samples) = (Vec::new(), Vec::new());
    let (mut list_cpu, mut ros_cpu, mut push_cpu) =
        (CpuSet::default(), CpuSet::default(), CpuSet::default());
    let (mut list_x, mut ros_x, mut push_x) = (
        Crossings::default(),
        Crossings::default(),
        Crossings::default(),
    );
    for _ in 0..BLOCKS {
        let before = procs.snapshot();
        list_x.ours(|| agent.round_trips(LIST_PER_BLOCK, mcp::TOOLS_LIST, None, &mut list))?;
        list_cpu.add(before, procs.snapshot());
        echo.phase(
            list_bytes,
            LIST_PER_BLOCK,
            (mcp::TOOLS_LIST, None),
            &mut list_pipe,
            &mut list_sock,
            &mut list_x,
        )?;

        let before = procs.snapshot();
        ros_x.ours(|| agent.round_trips(ROSTER_PER_BLOCK, mcp::TOOLS_CALL, roster, &mut ros))?;
        ros_cpu.add(before, procs.snapshot());
        echo.phase(
            roster_bytes,
            ROSTER_PER_BLOCK,
            (mcp::TOOLS_CALL, roster),
            &mut ros_pipe,
            &mut ros_sock,
            &mut ros_x,
        )?;
        for _ in 0..ROSTER_PER_BLOCK {
            let t = Instant::now();
            let status = floor_http.post("/floor", &push_token, floor_body.as_bytes())?;
            http.push(t.elapsed());
            if status != 200 {
                bail!("the floor server answered {status}");
            }
        }
        ros_x.shape(|| {
            roster_shape.lines.round_trips(
                ROSTER_PER_BLOCK,
                mcp::TOOLS_CALL,
                roster,
                &mut ros_shape,
            )
        })?;

        let before = procs.snapshot();
        push_x.ours(|| {
            for _ in 0..PUSH_PER_BLOCK {
                push.once(&mut agent, Some(&mut pushes))?;
            }
            Ok(())
        })?;
        push_cpu.add(before, procs.snapshot());
        echo.phase(
            notification_bytes,
            PUSH_PER_BLOCK,
            (mcp::TOOLS_LIST, None),
            &mut note_pipe,
            &mut note_sock,
            &mut push_x,
        )?;
        push_x.shape(|| {
            for _ in 0..PUSH_PER_BLOCK {
                shape_push(
                    &mut floor_http,
                    &mut push_shape.lines,
                    &shape_body,
                    Some(&mut push_shape_samples),
                )?;
            }
            Ok(())
        })?;
    }

    // In flight.
    let before = procs.snapshot();
    let ours_per_sec = agent.in_flight(IN_FLIGHT_CALLS, IN_FLIGHT, mcp::TOOLS_LIST, None)?;
    let mut in_flight_cpu = CpuSet::default();
    in_flight_cpu.add(before, procs.snapshot());
    echo.reply_size(list_bytes)?;
    let pipe_per_sec =
        echo.pipe
            .lines
            .in_flight(IN_FLIGHT_CALLS, IN_FLIGHT, mcp::TOOLS_LIST, None)?;
    let sock_per_sec =
        echo.sock
            .lines
            .in_flight(IN_FLIGHT_CALLS, IN_FLIGHT, mcp::TOOLS_LIST, None)?;

    // Last, so that holding processes on CPUs disturbs nothing measured above.
    let placement = placement(&mut echo.pipe, list_bytes)?;

    let runner_peak_rss_kib = peak_rss_kib(runner_pid);
    let bridge_peak_rss_kib = peak_rss_kib(bridge_pid);
    drop(agent);
    let status = child.wait()?;
    if !status.success() {
        bail!("the bridge exited with {status}");
    }

    let (list, list_pipe, list_sock) = (
        latency(&mut list)?,
        latency(&mut list_pipe)?,
        latency(&mut list_sock)?,
    );
    let (ros, ros_pipe, ros_sock, http) = (
        latency(&mut ros)?,
        latency(&mut ros_pipe)?,
        latency(&mut ros_sock)?,
        latency(&mut http)?,
    );
    let (pushes, note_pipe, note_sock) = (
        latency(&mut pushes)?,
        latency(&mut note_pipe)?,
        latency(&mut note_sock)?,
    );
    let (ros_shape, push_shape) = (latency(&mut ros_shape)?, latency(&mut push_shape_samples)?);
    let list_floor = p50(&list_pipe) + p50(&list_sock);
    let ros_floor = p50(&ros_pipe) + p50(&ros_sock) + p50(&http);
    let push_floor = p50(&http) + p50(&note_sock) + p50(&note_pipe);
    let calls = BLOCKS * LIST_PER_BLOCK;
    let report = json!({
        "scenario": "e2e",
        "tools_list": {
            "latency": list,
            "request_bytes": list_request_bytes,
            "response_bytes": list_bytes,
            "floor": {"pipe_echo": list_pipe, "socket_echo": list_sock, "sum_p50_us": list_floor},
            "ratio_p50": p50(&list) / list_floor,
        },
        "roster": {
            "latency": ros,
            "request_bytes": roster_request_bytes,
            "response_bytes": roster_bytes,
            "floor": {"pipe_echo": ros_pipe, "socket_echo": ros_sock, "http_post": http, "sum_p50_us": ros_floor},
            "ratio_p50": p50(&ros) / ros_floor,
            "shape": {"latency": ros_shape, "path": "agent -pipe-> relay -HTTP POST-> do-nothing server, and back"},
            "ratio_to_shape_p50": p50(&ros) / p50(&ros_shape),
        },
        "push_to_notification": {
            "latency": pushes,
            "notification_bytes": notification_bytes,
            "floor": {"http_post": http, "socket_echo": note_sock, "pipe_echo": note_pipe, "sum_p50_us": push_floor},
            "ratio_p50": p50(&pushes) / push_floor,
            "shape": {"latency": push_shape, "path": "agent -HTTP POST-> do-nothing server -held GET-> relay -pipe-> agent"},
            "ratio_to_shape_p50": p50(&pushes) / p50(&push_shape),
        },
        "tools_list_in_flight": {
            "in_flight": IN_FLIGHT,
            "calls": IN_FLIGHT_CALLS,
            "calls_per_sec": ours_per_sec.round(),
            "floor_pipe_echo_calls_per_sec": pipe_per_sec.round(),
            "floor_socket_echo_calls_per_sec": sock_per_sec.round(),
            "ratio_floor_over_ours": pipe_per_sec / ours_per_sec,
        },
        "runner_cpu_per_tools_list": {
            "sequential": list_cpu.runner.per_call(calls),
            "in_flight": in_flight_cpu.runner.per_call(IN_FLIGHT_CALLS),
        },
        "cpu_per_call": {
            "tools_list": list_cpu.per_call(calls),
            "roster": ros_cpu.per_call(BLOCKS * ROSTER_PER_BLOCK),
            "push_to_notification": push_cpu.per_call(BLOCKS * PUSH_PER_BLOCK),
            "tools_list_in_flight": in_flight_cpu.per_call(IN_FLIGHT_CALLS),
        },
        "interrupts_across_cpus_per_call": {
            "tools_list": list_x.per_call(calls),
            "roster": ros_x.per_call(BLOCKS * ROSTER_PER_BLOCK),
            "push_to_notification": push_x.per_call(BLOCKS * PUSH_PER_BLOCK),
        },
        "placement": placement,
        "runner_peak_rss_kib": runner_peak_rss_kib,
        "bridge_peak_rss_kib": bridge_peak_rss_kib,
    });
    println!("{report}");
    Ok(0)
}

/// The CPUs a thread or process may run on (`0`: the calling thread); `None` if unreadable.
fn allowed_cpus(pid: libc::pid_t) -> Option<Vec<usize>> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set; the kernel writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live cpu_set_t of the size passed.
    let got = unsafe { libc::sched_getaffinity(pid, size_of::<libc::cpu_set_t>(), &mut set) };
    if got != 0 {
        return None;
    }
    let bits = 8 * size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads the set within its size (`cpu` < its bits).
    Some(
        (0..bits)
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
            .collect(),
    )
}

/// Holds a thread or process (`0`: the calling thread) to `cpus`.
fn hold_on(pid: libc::pid_t, cpus: &[usize]) -> anyhow::Result<()> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: CPU_SET writes within the set (the cpus came from `allowed_cpus`).
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a live cpu_set_t of the size passed.
    if unsafe { libc::sched_setaffinity(pid, size_of::<libc::cpu_set_t>(), &set) } != 0 {
        bail!("sched_setaffinity: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The pipe echo with the agent held on one CPU and the echo on the same CPU, then on another;
/// `{"cpus": 1}` alone where one CPU is allowed. Both are let go again after.
fn placement(echo: &mut Echo<ChildStdin, ChildStdout>, size: usize) -> anyhow::Result<Value> {
    let mine = allowed_cpus(0).context("the CPUs this agent may use")?;
    let (Some(&here), Some(&there)) = (mine.first(), mine.get(1)) else {
        return Ok(json!({"cpus": mine.len()}));
    };
    let echo_pid = libc::pid_t::try_from(echo.child.id())?;
    let theirs = allowed_cpus(echo_pid).context("the CPUs the echo may use")?;
    echo.reply_size(size)?;
    let measured = (|| {
        let mut out = Vec::new();
        for echo_on in [here, there] {
            hold_on(0, &[here])?;
            hold_on(echo_pid, &[echo_on])?;
            for _ in 0..200 {
                echo.lines.warm()?;
            }
            let mut samples = Vec::with_capacity(PLACEMENT_CALLS);
            let mut crossings = Some(0);
            counted(&mut crossings, || {
                echo.lines
                    .round_trips(PLACEMENT_CALLS, mcp::TOOLS_LIST, None, &mut samples)
            })?;
            out.push((latency(&mut samples)?, crossings));
        }
        anyhow::Ok(out)
    })();
    hold_on(0, &mine)?;
    hold_on(echo_pid, &theirs)?;
    let mut measured = measured?.into_iter();
    let (Some((together, x_together)), Some((apart, x_apart))) = (measured.next(), measured.next())
    else {
        bail!("placement: two measurements expected");
    };
    let per_call =
        |x: Option<u64>| x.map_or(Value::Null, |n| json!(n as f64 / PLACEMENT_CALLS as f64));
    Ok(json!({
        "cpus": mine.len(),
        "pipe_echo_together": together,
        "pipe_echo_apart": apart,
        "interrupts_across_cpus_per_call": {"together": per_call(x_together), "apart": per_call(x_apart)},
        "wake_across_cpus_us": (p50(&apart) - p50(&together)) / 2.0,
    }))
}

/// One warm-up round trip on an echo.
trait Warm {
    fn warm(&mut self) -> anyhow::Result<()>;
}

impl<W: Write, R: Read> Warm for Lines<W, R> {
    fn warm(&mut self) -> anyhow::Result<()> {
        self.call(mcp::TOOLS_LIST, None).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_are_told_from_responses() {
        assert!(is_notification(
            r#"{"jsonrpc":"2.0","method":"notifications/claude/channel","params":{}}"#
        ));
        assert!(!is_notification(r#"{"jsonrpc":"2.0","id":3,"result":{}}"#));
    }

    #[test]
    fn interrupts_across_cpus_sum_function_calls_and_reschedules_of_every_cpu() {
        let text = "           CPU0       CPU1\n  \
             0:         36          0   IO-APIC   2-edge      timer\n\
             NMI:          0          0   Non-maskable interrupts\n\
             RES:       9563       9279   Rescheduling interrupts\n\
             CAL:    1158249    1059413   Function call interrupts\n\
             TLB:         12         40   TLB shootdowns\n";
        assert_eq!(
            interrupts_across_cpus_in(text),
            Some(9563 + 9279 + 1158249 + 1059413)
        );
        assert_eq!(interrupts_across_cpus_in("NMI: 0 0 Non-maskable\n"), None);
    }

    #[test]
    fn the_shapes_interrupts_are_reported_only_where_measured_even_when_none() {
        let mut x = Crossings::default();
        assert!(x.per_call(10).get("shape").is_none());
        x.shape = Some(Some(0));
        assert_eq!(x.per_call(10)["shape"], json!(0.0));
        x.shape = Some(Some(5));
        assert_eq!(x.per_call(10)["shape"], json!(0.5));
        x.shape = Some(None);
        assert_eq!(x.per_call(10)["shape"], Value::Null);
    }

    #[test]
    fn a_thread_held_on_one_cpu_is_allowed_that_cpu_alone_until_let_go() {
        std::thread::spawn(|| {
            let all = allowed_cpus(0).unwrap();
            assert!(!all.is_empty());
            let last = *all.last().unwrap();
            hold_on(0, &[last]).unwrap();
            assert_eq!(allowed_cpus(0).unwrap(), vec![last]);
            hold_on(0, &all).unwrap();
            assert_eq!(allowed_cpus(0).unwrap(), all);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn own_cpu_is_readable() {
        let (ticks, ns) = cpu(std::process::id()).unwrap();
        assert!(ns > 0, "{ticks} {ns}");
    }
}
