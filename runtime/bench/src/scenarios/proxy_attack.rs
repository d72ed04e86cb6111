//! `ac7-bench proxy-attack`: the runner's trace proxy against another local process, the two
//! attacks of an adversarial run. The runner (`ac7 run --trace -- sh …`, as in `trace`) starts
//! under an open-file soft limit of 1,024 (what most shells give); its model host is a stand-in
//! over TLS in this process.
//!
//! 1. **Silent connections.** 1,100 connections to the proxy that send nothing, held open by
//!    this process. Reported: the runner's soft limit, its open descriptors before and (the most
//!    sampled) while they are held, a fresh model call (CONNECT, TLS, a 10 KB request, a 50 KB
//!    SSE response) before and while they are held, how many of them the runner had closed by
//!    then, and 6 s later (the auth timeout is 5 s).
//! 2. **Large responses.** 16 concurrent model calls whose SSE responses are 50 MB each: every
//!    client checks it got its response whole; the runner's RSS is sampled every 20 ms.
//!
//! Run it with another `ac7` next to a copy of `ac7-bench` to measure that build.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::broker::{BrokerChild, rt};
use super::trace::{
    HOST, TracedRunner, client_config, connect_tunnel, read_message, request, tls_over,
};
use super::{peak_rss_kib, rss_kib, sibling_binary};
use ac7_runtime::runner::trace::ca::TraceCa;

const SOFT_LIMIT: u64 = 1024;
const SILENT: usize = 1100;
const LARGE_CLIENTS: usize = 16;
const LARGE_BYTES: usize = 50 * 1000 * 1000;
const SMALL_BYTES: usize = 50 * 1024;
/// How long one model call may take before the scenario gives up on it.
const CALL_LIMIT: Duration = Duration::from_secs(120);

/// The scenario's figures.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    scenario: &'static str,
    runner_started_with_fd_soft_limit: u64,
    runner_fd_soft_limit: Option<u64>,
    silent_connections: usize,
    runner_fds_idle: usize,
    runner_fds_max_under_silent: usize,
    call_ms_idle: f64,
    call_ms_under_silent: f64,
    silent_closed_by_runner_after_the_call: usize,
    silent_closed_by_runner_after_6s: usize,
    runner_fds_after_6s: usize,
    large_clients: usize,
    large_response_bytes: usize,
    large_responses_whole: usize,
    large_seconds: f64,
    runner_rss_kib_before_large: Option<u64>,
    runner_rss_kib_max_during_large: u64,
    runner_peak_rss_kib: Option<u64>,
    runner_rss_kib_2s_after_large: Option<u64>,
}

/// An SSE response of at least `bytes` body bytes, with `content-length`.
fn sse_response(bytes: usize) -> Vec<u8> {
    let mut body = String::from(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"claude-bench\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":2500,\"output_tokens\":1}}}\n\n",
    );
    let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lorem ipsum dolor sit amet consectetur\"}}\n\n";
    body.reserve(bytes + 256);
    while body.len() + delta.len() < bytes.saturating_sub(200) {
        body.push_str(delta);
    }
    body.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":900}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

fn fd_soft_limit(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Samples `measure` every 20 ms on a thread until dropped; keeps the largest value.
struct Sampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(measure: impl Fn() -> u64 + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicU64::new(0));
        let (done, top) = (stop.clone(), max.clone());
        let thread = std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                top.fetch_max(measure(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Self {
            stop,
            max,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.max.load(Ordering::Relaxed)
    }
}

/// One model call through the proxy on a fresh connection; returns its time and the response's
/// length (head and body), which is read and counted, not kept.
async fn model_call(
    addr: &str,
    auth: &str,
    runner_ca: &[u8],
    request: &[u8],
) -> anyhow::Result<(Duration, usize, Vec<u8>)> {
    let started = Instant::now();
    let tcp = connect_tunnel(addr, auth).await?;
    let mut tls = tls_over(tcp, client_config(runner_ca)?).await?;
    tls.write_all(request).await?;
    tls.flush().await?;
    let mut head = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let (end, len) = loop {
        let n = tls.read(&mut chunk).await?;
        if n == 0 {
            bail!("the connection closed before the response head");
        }
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = memchr::memmem::find(&head, b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
            let len: usize = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .context("no content-length")?;
            break (end + 4, len);
        }
    };
    let mut got = head.len() - end;
    let mut tail = head[end..].to_vec();
    while got < len {
        let n = tls.read(&mut chunk).await?;
        if n == 0 {
            bail!("the response stopped after {got} of {len} body bytes");
        }
        got += n;
        tail.extend_from_slice(&chunk[..n]);
        let keep = tail.len().saturating_sub(64);
        tail.drain(..keep);
    }
    Ok((started.elapsed(), end + got, tail))
}

/// Whether the runner closed `stream` (end of stream or reset), waiting at most 1 ms.
async fn closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_millis(1), stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Runs the scenario.
pub(crate) fn run() -> anyhow::Result<Report> {
    let ac7 = sibling_binary("ac7")?;
    // This process holds the 1,100 client ends.
    ac7_runtime::sys::rlimit::raise_fd_limit();
    let broker = BrokerChild::spawn(1)?;
    let dir = std::env::temp_dir().join(format!("ac7-bench-proxy-attack-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run_in(&ac7, &broker, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Starts `command` under an open-file soft limit of at most [`SOFT_LIMIT`].
fn limit_fds(command: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: between fork and exec, two system calls (async-signal-safe) on a local struct.
    unsafe {
        command.pre_exec(|| {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                limit.rlim_cur = limit.rlim_max.min(SOFT_LIMIT);
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            }
            Ok(())
        });
    }
}

/// The model API stand-in over TLS: a request whose target contains `large` gets `large`, any
/// other `small`.
async fn stand_in(
    config: Arc<rustls::ServerConfig>,
    small: Arc<[u8]>,
    large: Arc<[u8]>,
) -> anyhow::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tcp.set_nodelay(true);
            let (acceptor, small, large) = (acceptor.clone(), small.clone(), large.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                while read_message(&mut tls, &mut buf).await.is_some() {
                    let line_end = memchr::memchr(b'\n', &buf).unwrap_or(buf.len());
                    let answer = if memchr::memmem::find(&buf[..line_end], b"large").is_some() {
                        &large
                    } else {
                        &small
                    };
                    if tls.write_all(answer).await.is_err() || tls.flush().await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(addr)
}

fn run_in(ac7: &Path, broker: &BrokerChild, dir: &Path) -> anyhow::Result<Report> {
    use std::io::Write as _;
    let rt = rt()?;
    let upstream_ca = TraceCa::generate()?;
    let upstream_pem = dir.join("upstream-ca.pem");
    std::fs::File::create(&upstream_pem)?.write_all(upstream_ca.pem().as_bytes())?;
    let large = sse_response(LARGE_BYTES);
    let large_tail = large[large.len() - 64..].to_vec();
    let large_len = large.len();
    let api = rt.block_on(stand_in(
        upstream_ca.server_config(HOST)?,
        sse_response(SMALL_BYTES).into(),
        large.into(),
    ))?;
    let runner = TracedRunner::spawn(ac7, broker, dir, api, &upstream_pem, limit_fds)?;
    let result = rt.block_on(attack(&runner, large_len, &large_tail));
    runner.finish();
    result
}

async fn attack(
    runner: &TracedRunner,
    large_len: usize,
    large_tail: &[u8],
) -> anyhow::Result<Report> {
    let pid = runner.child.id();
    let (addr, auth) = runner.proxy()?;
    let small = request();
    let mut large = small.clone();
    let at = memchr::memmem::find(&large, b" HTTP/1.1").context("request line")?;
    large.splice(at..at, b"?large".iter().copied());

    // 1. Silent connections.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let runner_fds_idle = fd_count(pid);
    let mut idle = Vec::new();
    for _ in 0..5 {
        let (took, _, _) = model_call(&addr, &auth, &runner.ca, &small).await?;
        idle.push(took);
    }
    idle.sort_unstable();
    let fds = Sampler::start(move || fd_count(pid) as u64);
    let mut silent = Vec::with_capacity(SILENT);
    for _ in 0..SILENT {
        silent.push(TcpStream::connect(&addr).await?);
    }
    let opened = Instant::now();
    let (under_silent, _, _) =
        tokio::time::timeout(CALL_LIMIT, model_call(&addr, &auth, &runner.ca, &small))
            .await
            .context("the model call under attack did not finish in 120 s")??;
    let mut closed_after_call = 0;
    for stream in &mut silent {
        closed_after_call += usize::from(closed(stream).await);
    }
    let runner_fds_max_under_silent = fds.finish() as usize;
    tokio::time::sleep(Duration::from_secs(6).saturating_sub(opened.elapsed())).await;
    let mut closed_after_6s = 0;
    for stream in &mut silent {
        closed_after_6s += usize::from(closed(stream).await);
    }
    let runner_fds_after_6s = fd_count(pid);
    drop(silent);

    // 2. Large responses.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let runner_rss_kib_before_large = rss_kib(pid);
    let rss = Sampler::start(move || rss_kib(pid).unwrap_or(0));
    let started = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..LARGE_CLIENTS {
        let (addr, auth, ca, large) =
            (addr.clone(), auth.clone(), runner.ca.clone(), large.clone());
        calls.spawn(async move {
            tokio::time::timeout(CALL_LIMIT, model_call(&addr, &auth, &ca, &large)).await
        });
    }
    let mut whole = 0;
    while let Some(call) = calls.join_next().await {
        if let Ok(Ok(Ok((_, len, tail)))) = call
            && len == large_len
            && tail == large_tail
        {
            whole += 1;
        }
    }
    let large_seconds = started.elapsed().as_secs_f64();
    let runner_rss_kib_max_during_large = rss.finish();
    let runner_peak_rss_kib = peak_rss_kib(pid);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let runner_rss_kib_2s_after_large = rss_kib(pid);

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(Report {
        scenario: "proxy-attack",
        runner_started_with_fd_soft_limit: SOFT_LIMIT,
        runner_fd_soft_limit: fd_soft_limit(pid),
        silent_connections: SILENT,
        runner_fds_idle,
        runner_fds_max_under_silent,
        call_ms_idle: ms(idle[idle.len() / 2]),
        call_ms_under_silent: ms(under_silent),
        silent_closed_by_runner_after_the_call: closed_after_call,
        silent_closed_by_runner_after_6s: closed_after_6s,
        runner_fds_after_6s,
        large_clients: LARGE_CLIENTS,
        large_response_bytes: large_len,
        large_responses_whole: whole,
        large_seconds,
        runner_rss_kib_before_large,
        runner_rss_kib_max_during_large,
        runner_peak_rss_kib,
        runner_rss_kib_2s_after_large,
    })
}
