//! `ac7-bench runner`: the runner with a real broker and a real bridge.
//!
//! A broker child process and `ac7 run -- ac7 mcp-bridge` as the runner: its agent is the bridge
//! itself, whose stdin/stdout (inherited through the runner) are this process's pipes, so this
//! process plays the agent through a bridge in the agent's own process tree (a bridge it spawned
//! itself would be an outsider and get no events). Measures
//! (a) `tools/call roster` round trips including the broker, N=1000 sequential; (b) roster calls
//! with 32 in flight; (c) `POST /push` → `notifications/claude/channel` read at the agent, N=500;
//! (d) the runner's and the bridge's peak RSS.

use std::process::Command;
use std::time::{Duration, Instant};

use ac7_protocol::dialect::mcp;
use ac7_protocol::session::mcp_bridge::START_GRACE;
use anyhow::{Context as _, bail};
use serde::Serialize;

use super::bridge::{Agent, Throughput};
use super::broker::{BrokerChild, client, rt};
use super::{Latency, peak_rss_kib, sibling_binary};
use ac7_runtime::dialects::mcp_bridge::RUNNER_SOCKET_ENV;

const ROUNDTRIPS: usize = 1_000;
const THROUGHPUT_CALLS: usize = 2_000;
const IN_FLIGHT: usize = 32;
const PUSHES: usize = 500;

/// The scenario's figures.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    scenario: &'static str,
    roster_roundtrip: Latency,
    throughput: Throughput,
    push_to_notification: Latency,
    runner_peak_rss_kib: Option<u64>,
    bridge_peak_rss_kib: Option<u64>,
}

/// Runs the scenario.
pub(crate) fn run() -> anyhow::Result<Report> {
    let ac7 = sibling_binary("ac7")?;
    let broker = BrokerChild::spawn(1)?;
    let dir = std::env::temp_dir().join(format!("ac7-bench-runner-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("r.sock");
    let mut runner = Command::new(&ac7);
    runner
        .args(["run", "--url", &broker.url, "--socket"])
        .arg(&socket)
        .arg("--mcp-config")
        .arg(dir.join("mcp.json"))
        .arg("--")
        .arg(&ac7)
        .arg("mcp-bridge")
        .env(RUNNER_SOCKET_ENV, &socket)
        .env("AC7_TOKEN", broker.token("m0"))
        .env("AC7_LOG", "error");
    let mut agent = Agent::spawn_command(runner)?;
    agent.initialize()?;
    // The agent's first tools/list; the bridge relays events once the start-up grace after it
    // has passed.
    agent.call(mcp::TOOLS_LIST, None)?;
    std::thread::sleep(START_GRACE);

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

    let runner_peak_rss_kib = agent.peak_rss_kib();
    let bridge_peak_rss_kib = child_of(agent.pid()).and_then(peak_rss_kib);
    agent.close()?;
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

/// The first child of process `pid` (the runner's agent).
fn child_of(pid: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}
