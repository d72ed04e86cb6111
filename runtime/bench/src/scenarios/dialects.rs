//! The dialect scenarios of `ac7-bench`:
//!
//! - `call-tool`: `tools/call` round trips through `ac7 mcp-bridge --dialect call-tool` to an
//!   in-process [`CallToolHost`] with a trivial tool, sequential, p50/p99;
//! - `ash-spawn`: `ac7 ash-bridge` spawn -> `R` on stdout, median;
//! - `ash-query`: `query` -> `done` through `ac7 ash-bridge` with an instant stand-in agent (a
//!   `/bin/sh` script printing one result line), p50/p99; this includes spawning and reaping
//!   the stand-in.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ac7_protocol::dialect::call_tool::ToolSchema;
use ac7_protocol::dialect::mcp;
use anyhow::{Context, bail};
use serde::Serialize;

use super::bridge::{Agent, TempDir};
use super::{Latency, median};
use ac7_runtime::dialects::ash_bridge::{CLAUDE_PATH_ENV, SOCKET_ENV, WORKSPACE_ENV};
use ac7_runtime::dialects::call_tool_host::{CallToolHost, HostPaths};

/// `call-tool` results.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CallToolReport {
    /// The scenario name.
    pub scenario: &'static str,
    /// Sequential `tools/call` round trips (agent -> bridge -> parent -> bridge -> agent).
    pub tools_call: Latency,
}

/// Runs `n` sequential calls (after 100 warm-up calls).
pub(crate) fn call_tool(ac7: &Path, n: usize) -> anyhow::Result<CallToolReport> {
    let dir = TempDir::new()?;
    let paths = HostPaths::in_dir(&dir.path);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let host_paths = paths.clone();
    let thread = std::thread::Builder::new()
        .name("bench-call-tool-host".into())
        .spawn(move || {
            runtime.block_on(async move {
                let mut host = CallToolHost::new();
                host.tool(
                    ToolSchema {
                        name: "noop".into(),
                        description: "Answers ok.".into(),
                        input_schema: serde_json::json!({"type": "object"}),
                    },
                    |_| std::future::ready(Ok(mcp::tool_text("ok"))),
                );
                match host.start(host_paths) {
                    Ok(running) => {
                        let _ = ready_tx.send(Ok(()));
                        let _ = stop_rx.await;
                        running.stop().await;
                    }
                    Err(err) => {
                        let _ = ready_tx.send(Err(err));
                    }
                }
            });
        })?;
    ready_rx.recv().context("the host thread died")??;
    let mut command = Command::new(ac7);
    command
        .args(["mcp-bridge", "--dialect", "call-tool", "--schema-file"])
        .arg(&paths.schema)
        .arg("--socket")
        .arg(&paths.socket);
    let mut agent = Agent::spawn_command(command)?;
    agent.initialize()?;
    let params = Some(r#"{"name":"noop","arguments":{}}"#);
    for _ in 0..100 {
        agent.call(mcp::TOOLS_CALL, params)?;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        agent.call(mcp::TOOLS_CALL, params)?;
        samples.push(t.elapsed());
    }
    agent.close()?;
    let _ = stop_tx.send(());
    let _ = thread.join();
    Ok(CallToolReport {
        scenario: "call-tool",
        tools_call: Latency::of(&mut samples).context("no samples")?,
    })
}

/// `ash-spawn` results.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AshSpawnReport {
    /// The scenario name.
    pub scenario: &'static str,
    /// Spawns measured.
    pub n: usize,
    /// Median time from spawning `ac7 ash-bridge` to reading its `R`.
    pub spawn_to_ready_median_ms: f64,
    /// Slowest of them.
    pub spawn_to_ready_max_ms: f64,
}

/// Spawns the bridge `n` times; each is shut down with a `shutdown` command.
pub(crate) fn ash_spawn(ac7: &Path, n: usize) -> anyhow::Result<AshSpawnReport> {
    let dir = TempDir::new()?;
    let agent = instant_agent(&dir.path)?;
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let socket = dir.path.join(format!("b{i}.sock"));
        let t = Instant::now();
        let bridge = AshBridgeProcess::spawn(ac7, &socket, &agent)?;
        samples.push(t.elapsed());
        bridge.shutdown()?;
    }
    let max = samples.iter().max().copied().unwrap_or_default();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(AshSpawnReport {
        scenario: "ash-spawn",
        n,
        spawn_to_ready_median_ms: ms(median(&mut samples).context("no samples")?),
        spawn_to_ready_max_ms: ms(max),
    })
}

/// `ash-query` results.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AshQueryReport {
    /// The scenario name.
    pub scenario: &'static str,
    /// `query` -> `done`, through the bridge (including spawning and reaping the stand-in).
    pub query_to_done: Latency,
}

/// Runs `n` queries on one connection (after 10 warm-up queries).
pub(crate) fn ash_query(ac7: &Path, n: usize) -> anyhow::Result<AshQueryReport> {
    let dir = TempDir::new()?;
    let agent = instant_agent(&dir.path)?;
    let socket = dir.path.join("b.sock");
    let bridge = AshBridgeProcess::spawn(ac7, &socket, &agent)?;
    let stream = UnixStream::connect(&socket)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if !line.contains("\"ready\"") {
        bail!("expected ready, got {line:?}");
    }
    let query = b"{\"cmd\":\"query\",\"prompt\":\"hi\",\"sessionId\":\"s\"}\n";
    let mut run = |samples: &mut Vec<Duration>| -> anyhow::Result<()> {
        let t = Instant::now();
        writer.write_all(query)?;
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                bail!("the bridge closed the connection");
            }
            if line.starts_with("{\"ev\":\"done\"") {
                break;
            }
            if line.starts_with("{\"ev\":\"error\"") {
                bail!("the query failed: {line}");
            }
        }
        samples.push(t.elapsed());
        Ok(())
    };
    let mut warmup = Vec::new();
    for _ in 0..10 {
        run(&mut warmup)?;
    }
    let mut through_bridge = Vec::with_capacity(n);
    for _ in 0..n {
        run(&mut through_bridge)?;
    }
    bridge.shutdown()?;
    Ok(AshQueryReport {
        scenario: "ash-query",
        query_to_done: Latency::of(&mut through_bridge).context("no samples")?,
    })
}

/// A stand-in agent that answers at once: reads the prompt line, prints one result line.
fn instant_agent(dir: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("instant-claude");
    std::fs::write(
        &path,
        "#!/bin/sh\nread -r line\necho '{\"type\":\"result\",\"subtype\":\"success\",\"session_id\":\"s\"}'\n",
    )?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

struct AshBridgeProcess {
    child: Child,
    socket: PathBuf,
}

impl AshBridgeProcess {
    /// Spawns `ac7 ash-bridge` and returns once it wrote `R`.
    fn spawn(ac7: &Path, socket: &Path, agent: &Path) -> anyhow::Result<Self> {
        let mut child = Command::new(ac7)
            .arg("ash-bridge")
            .env(SOCKET_ENV, socket)
            .env(CLAUDE_PATH_ENV, agent)
            // The bridge keeps its session map in the workspace: the temporary directory.
            .env(WORKSPACE_ENV, socket.parent().unwrap_or(Path::new(".")))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawning {}", ac7.display()))?;
        let mut r = [0u8; 1];
        child
            .stdout
            .as_mut()
            .context("no stdout pipe")?
            .read_exact(&mut r)?;
        if &r != b"R" {
            bail!("expected R, got {r:?}");
        }
        Ok(Self {
            child,
            socket: socket.to_owned(),
        })
    }

    /// Sends `shutdown` on a fresh connection and waits for the exit.
    fn shutdown(mut self) -> anyhow::Result<()> {
        let mut stream = UnixStream::connect(&self.socket)?;
        stream.write_all(b"{\"cmd\":\"shutdown\"}\n")?;
        let status = self.child.wait()?;
        if !status.success() {
            bail!("ash-bridge exited with {status}");
        }
        Ok(())
    }
}
