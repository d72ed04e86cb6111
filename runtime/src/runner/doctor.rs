//! `--doctor`: what both agents' checks share — the report lines, the agent binary's version —
//! and the Claude Code check (`ac7 claude-code --doctor`).
//!
//! `ac7 claude-code --doctor` checks, in order, and prints one line per step on stderr:
//! 1. `claude` is found (`CLAUDE_PATH`, or `PATH`);
//! 2. its version (`claude --version`);
//! 3. the broker answers the briefing for this token;
//! 4. our MCP server starts: this executable's `mcp-bridge`, started the way Claude Code starts it
//!    (the `.mcp.json` entry: command, args, `AC7_RUNNER_SOCKET`), answers `initialize` and lists
//!    the tools through the runner.
//!
//! Exit 0 when every step passed, 1 otherwise. Nothing is written to the working directory.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use ac7_protocol::session::runner::BridgePolicy;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::{RunnerOpts, StartError, start_core};
use crate::dialects::mcp_bridge::RUNNER_SOCKET_ENV;

/// How long each step may take.
pub(crate) const STEP: Duration = Duration::from_secs(20);

/// Prints one report line: `ac7 <command> --doctor: <text>`.
pub(crate) fn say(command: &str, text: &str) {
    eprintln!("ac7 {command} --doctor: {text}");
}

/// Prints a failed step and returns `false`.
pub(crate) fn failed(command: &str, text: &str) -> bool {
    say(command, &format!("FAILED: {text}"));
    false
}

/// `<binary> --version`, first line, within [`STEP`].
pub(crate) async fn version(binary: &Path) -> Result<String, String> {
    let run = tokio::process::Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(STEP, run)
        .await
        .map_err(|_| format!("{} --version did not answer", binary.display()))?
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or_default().trim().to_owned();
    if !out.status.success() || line.is_empty() {
        return Err(format!(
            "{} --version failed ({}): {}",
            binary.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(line)
}

/// `ac7 claude-code --doctor`; returns the exit code.
pub(crate) async fn claude_code(
    opts: RunnerOpts,
    claude: Result<std::path::PathBuf, StartError>,
) -> i32 {
    const CMD: &str = "claude-code";
    let claude = match claude {
        Ok(path) => {
            say(CMD, &format!("claude found at {}", path.display()));
            path
        }
        Err(e) => return i32::from(!failed(CMD, &e.to_string())),
    };
    match version(&claude).await {
        Ok(v) => say(CMD, &format!("claude version {v}")),
        Err(e) => return i32::from(!failed(CMD, &e)),
    }
    let core = match start_core(&opts, BridgePolicy::DisplaceOld, false).await {
        Ok(core) => core,
        Err(e) => return i32::from(!failed(CMD, &e.to_string())),
    };
    say(
        CMD,
        &format!(
            "broker {}: briefing for {} ({}) on team {}",
            opts.url.join(", "),
            core.briefing.name,
            core.briefing.role.title,
            core.briefing.team.name
        ),
    );
    let ok = match core.bridge_command() {
        Ok((exe, socket)) => match list_tools(&exe, &socket, &core.agent).await {
            Ok(tools) => {
                say(
                    CMD,
                    &format!("the ac7 MCP server starts and lists {} tools", tools.len()),
                );
                say(CMD, &format!("tools: {}", tools.join(", ")));
                true
            }
            Err(e) => failed(CMD, &format!("the ac7 MCP server: {e}")),
        },
        Err(e) => failed(CMD, &e.to_string()),
    };
    core.server.shutdown(Some("doctor")).await;
    say(CMD, if ok { "all good" } else { "problems found" });
    i32::from(!ok)
}

/// Starts `exe mcp-bridge` as the agent would, does the MCP handshake and returns the tool names.
async fn list_tools(
    exe: &Path,
    socket: &Path,
    agent: &crate::peer::AgentPid,
) -> Result<Vec<String>, String> {
    let mut child = tokio::process::Command::new(exe)
        .arg("mcp-bridge")
        .env(RUNNER_SOCKET_ENV, socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {} mcp-bridge: {e}", exe.display()))?;
    // The doctor plays the agent: the bridge it starts is the agent's.
    if let Some(pid) = child.id() {
        agent.set(pid);
    }
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("no pipes to the bridge".into());
    };
    let mut stdout = BufReader::new(stdout).lines();
    let mut ask = async |id: u64, method: &str, params: Value| -> Result<Value, String> {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(|e| format!("writing to the bridge: {e}"))?;
        let answer = async {
            loop {
                let Some(line) = stdout.next_line().await.map_err(|e| e.to_string())? else {
                    return Err("the bridge exited".to_owned());
                };
                let msg: Value = serde_json::from_str(&line)
                    .map_err(|e| format!("the bridge wrote something that is not JSON: {e}"))?;
                if msg["id"] == id {
                    return match msg.get("error") {
                        Some(error) => Err(format!("{method} failed: {error}")),
                        None => Ok(msg["result"].clone()),
                    };
                }
            }
        };
        tokio::time::timeout(STEP, answer)
            .await
            .map_err(|_| format!("no answer to {method} within {} s", STEP.as_secs()))?
    };
    let init = ask(
        0,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "ac7-doctor", "version": env!("CARGO_PKG_VERSION")}}),
    )
    .await?;
    if init["capabilities"]["experimental"]["claude/channel"].is_null() {
        return Err(format!("initialize does not offer claude/channel: {init}"));
    }
    let listed = ask(1, "tools/list", json!({})).await?;
    let tools: Vec<String> = listed["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if tools.is_empty() {
        return Err(format!("tools/list returned no tools: {listed}"));
    }
    drop(stdin);
    if tokio::time::timeout(STEP, child.wait()).await.is_err() {
        let _ = child.start_kill();
    }
    Ok(tools)
}
