//! `ac7-bench acp`: push -> prompt at an ACP agent, through `ac7 acp`.
//!
//! A broker child process and the real `ac7 acp -- ac7-bench __acp-agent`: the runner starts
//! this binary as its ACP agent, a std-only one with blocking reads and writes that answers
//! `initialize` and `session/new` (no MCP server started), then measures, one push at a time:
//! an HTTP `POST /push` to the broker (a DM from the director) until the `session/prompt`
//! carrying its body is read on its stdin (it answers `end_turn` at once and pushes the next).
//!
//! Two runs: with the runner's default bundling window (200 ms: what a member sees) and with a
//! window of 0 (what the runner itself adds).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::broker::BrokerChild;
use super::e2e::Http;
use super::{Latency, sibling_binary};

/// The hidden argument that makes `ac7-bench` the ACP agent.
pub(crate) const AGENT_ARG: &str = "__acp-agent";

/// The broker's `host:port`, for the agent's pushes.
const ENV_BROKER: &str = "AC7_BENCH_ACP_BROKER";
/// The director's token, for the agent's pushes.
const ENV_PUSH_TOKEN: &str = "AC7_BENCH_ACP_PUSH_TOKEN";
/// How many pushes the agent times.
const ENV_PUSHES: &str = "AC7_BENCH_ACP_PUSHES";

/// Runs the scenario; returns both runs' reports.
pub(crate) fn run() -> anyhow::Result<Value> {
    let ac7 = sibling_binary("ac7")?;
    let broker = BrokerChild::spawn(1)?;
    let addr = broker
        .url
        .strip_prefix("http://")
        .context("broker URL")?
        .to_owned();
    let mut report = json!({});
    for (key, window, pushes) in [("window_200ms", None, 50), ("window_0ms", Some("0"), 300)] {
        let mut command = Command::new(&ac7);
        command.args(["acp", "--url", &broker.url, "--no-trace"]);
        if let Some(ms) = window {
            command.args(["--bundle-window-ms", ms]);
        }
        let output = command
            .arg("--")
            .arg(std::env::current_exe()?)
            .arg(AGENT_ARG)
            .env("AC7_TOKEN", broker.token("m0"))
            .env("AC7_LOG", "error")
            .env(ENV_BROKER, &addr)
            .env(ENV_PUSH_TOKEN, broker.token("director"))
            .env(ENV_PUSHES, pushes.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .context("running ac7 acp")?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let line = stderr
            .lines()
            .rev()
            .find(|l| l.starts_with("ac7-bench-acp "))
            .with_context(|| {
                format!("the agent printed no report ({}):\n{stderr}", output.status)
            })?;
        report[key] = serde_json::from_str(line.trim_start_matches("ac7-bench-acp "))?;
    }
    Ok(report)
}

/// The agent: answers the handshake, then times pushes to prompts; its report goes to stderr
/// (stdout is the protocol) as one `ac7-bench-acp {…}` line; then it exits, ending the runner.
pub(crate) fn agent_main() -> anyhow::Result<i32> {
    let broker = std::env::var(ENV_BROKER).context(ENV_BROKER)?;
    let token = std::env::var(ENV_PUSH_TOKEN).context(ENV_PUSH_TOKEN)?;
    let pushes: usize = std::env::var(ENV_PUSHES)
        .context(ENV_PUSHES)?
        .parse()
        .context(ENV_PUSHES)?;
    let mut stdin = BufReader::new(std::io::stdin().lock());
    let mut stdout = std::io::stdout().lock();
    let mut line = String::new();
    let mut read = |line: &mut String| -> anyhow::Result<Value> {
        line.clear();
        if stdin.read_line(line)? == 0 {
            bail!("the runner closed the agent's stdin");
        }
        Ok(serde_json::from_str(line)?)
    };
    let mut answer = |id: &Value, result: Value| -> anyhow::Result<()> {
        let mut out = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "result": result}))?;
        out.push(b'\n');
        stdout.write_all(&out)?;
        stdout.flush()?;
        Ok(())
    };
    // The handshake.
    let init = read(&mut line)?;
    answer(
        &init["id"],
        json!({"protocolVersion": 1, "agentInfo": {"name": "ac7-bench", "version": "0"}}),
    )?;
    let new = read(&mut line)?;
    answer(&new["id"], json!({"sessionId": "bench"}))?;
    let mut http = Http::connect(&broker)?;
    let mut samples = Vec::with_capacity(pushes);
    // One push first, not timed: the runner's first turn also carries the briefing.
    for seq in 0..=pushes {
        let marker = format!("acp-bench-{seq}.");
        let body = json!({"to": "m0", "body": marker}).to_string();
        let t = Instant::now();
        http.send_post("/push", &token, body.as_bytes())?;
        let elapsed = loop {
            let message = read(&mut line)?;
            if message["method"] == "session/prompt" {
                let found = line.contains(&marker);
                let elapsed = t.elapsed();
                answer(&message["id"], json!({"stopReason": "end_turn"}))?;
                if found {
                    break elapsed;
                }
            }
        };
        if http.read_response()? != 200 {
            bail!("the push was refused");
        }
        if seq > 0 {
            samples.push(elapsed);
        }
        // Apart, so that each push is a turn of its own.
        std::thread::sleep(Duration::from_millis(5));
    }
    let report = json!({
        "push_to_prompt": Latency::of(&mut samples),
    });
    eprintln!("ac7-bench-acp {report}");
    Ok(0)
}
