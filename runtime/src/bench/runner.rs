//! `ac7-bench runner`: the runner with a real broker and a real bridge.
//!
//! A broker child process, `ac7 run -- sleep 3600` as the runner (the agent itself idles), and
//! this process playing the agent through a bridge it spawns from the runner's socket. Measures
//! (a) `tools/call roster` round trips including the broker, N=1000 sequential; (b) roster calls
//! with 32 in flight; (c) `POST /push` → `notifications/claude/channel` read at the agent, N=500;
//! (d) the runner's and the bridge's peak RSS.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ac7_protocol::mcp;
use anyhow::{Context as _, bail};
use serde::Serialize;

use super::bridge::{Agent, Throughput};
use super::broker::{BrokerChild, client, rt};
use super::{Latency, peak_rss_kib, sibling_binary};

const ROUNDTRIPS: usize = 1_000;
const THROUGHPUT_CALLS: usize = 2_000;
const IN_FLIGHT: usize = 32;
const PUSHES: usize = 500;

/// The scenario's figures.
#[derive(Debug, Serialize)]
pub struct Report {
    scenario: &'static str,
    roster_roundtrip: Latency,
    throughput: Throughput,
    push_to_notification: Latency,
    runner_peak_rss_kib: Option<u64>,
    bridge_peak_rss_kib: Option<u64>,
}

/// The runner child; terminated (SIGTERM, forwarded to its agent) on drop.
struct RunnerChild(std::process::Child);

impl Drop for RunnerChild {
    fn drop(&mut self) {
        if let Some(pid) = i32::try_from(self.0.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let _ = self.0.wait();
    }
}

/// Runs the scenario.
pub fn run() -> anyhow::Result<Report> {
    let ac7 = sibling_binary("ac7")?;
    let broker = BrokerChild::spawn(1)?;
    let dir = std::env::temp_dir().join(format!("ac7-bench-runner-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("r.sock");
    let runner = RunnerChild(
        Command::new(&ac7)
            .args(["run", "--url", &broker.url, "--socket"])
            .arg(&socket)
            .arg("--mcp-config")
            .arg(dir.join("mcp.json"))
            .args(["--", "sleep", "3600"])
            .env("AC7_TOKEN", broker.token("m0"))
            .env("AC7_LOG", "error")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning ac7 run")?,
    );
    wait_for(&socket)?;
    let mut agent = Agent::spawn(&ac7, &socket)?;
    agent.initialize()?;

    let roster = Some(r#"{"name":"roster","arguments":{}}"#);
    let mut samples = Vec::with_capacity(ROUNDTRIPS);
    for _ in 0..ROUNDTRIPS {
        let t = Instant::now();
        agent.call(mcp::TOOLS_CALL, roster)?;
        samples.push(t.elapsed());
    }
    let roster_roundtrip = Latency::of(&mut samples).context("no samples")?;
    let throughput = agent.throughput(THROUGHPUT_CALLS, IN_FLIGHT)?;

    // Pushes go out from a runtime thread; this thread waits for each at the agent.
    let rt = rt()?;
    let http = client()?;
    let director = broker.token("director").to_owned();
    let url = format!("{}/push", broker.url);
    let mut samples = Vec::with_capacity(PUSHES);
    for i in 0..PUSHES {
        let body = format!("bench push {i}");
        let request = http
            .post(&url)
            .bearer_auth(&director)
            .json(&serde_json::json!({"to": "m0", "body": body}));
        let t = Instant::now();
        let sent = rt.spawn(async move { request.send().await.map(|r| r.status()) });
        let needle = format!("\"content\":\"{body}\"");
        loop {
            if t.elapsed() > Duration::from_secs(10) {
                bail!("push {i} never reached the agent");
            }
            let line = agent.read_line()?;
            if line.contains(mcp::CLAUDE_CHANNEL) && line.contains(&needle) {
                samples.push(t.elapsed());
                break;
            }
        }
        let status = rt.block_on(sent)??;
        if !status.is_success() {
            bail!("push {i} answered {status}");
        }
    }
    let push_to_notification = Latency::of(&mut samples).context("no samples")?;

    let runner_peak_rss_kib = peak_rss_kib(runner.0.id());
    let bridge_peak_rss_kib = agent.peak_rss_kib();
    agent.close()?;
    drop(runner);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Report {
        scenario: "runner",
        roster_roundtrip,
        throughput,
        push_to_notification,
        runner_peak_rss_kib,
        bridge_peak_rss_kib,
    })
}

fn wait_for(socket: &Path) -> anyhow::Result<()> {
    let start = Instant::now();
    while !socket.exists() {
        if start.elapsed() > Duration::from_secs(10) {
            bail!("the runner never bound {}", socket.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
