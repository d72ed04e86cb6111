//! `ac7 demo-agent` (hidden): the stand-in agent `ac7 quickstart` runs under `ac7 run`.
//!
//! It is a minimal MCP client, like any agent a runner wraps: it starts the `ac7` MCP server
//! from the config the runner wrote (`./.mcp.json`, entry `mcpServers.ac7` — the real
//! `ac7 mcp-bridge`), initializes, lists the tools, and answers each direct message that arrives as a
//! `notifications/claude/channel` by calling the `send` tool. So a new user sees a push reach an
//! agent and the agent's reply come back, with no model and no API key. It stops on SIGINT,
//! SIGTERM or when the bridge closes.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// `ac7 demo-agent`.
#[derive(Debug, clap::Args)]
pub struct DemoAgentArgs {
    /// The MCP config the runner wrote; its `mcpServers.ac7` entry is started as the MCP server.
    #[arg(long, default_value = ".mcp.json", value_name = "PATH")]
    pub mcp_config: PathBuf,
}

/// Runs the demo agent; returns the exit code.
pub fn run(args: DemoAgentArgs) -> i32 {
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(agent(args)));
    match result {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("ac7 demo-agent: {err:#}");
            1
        }
    }
}

/// The reply to a direct message `body` received by `me`.
pub fn reply_text(me: &str, body: &str) -> String {
    format!(
        "{me} here, the quickstart's demo agent: I got \"{body}\". A real agent (ac7 claude-code, \
         or any MCP program under ac7 run) would now get to work on it."
    )
}

async fn agent(args: DemoAgentArgs) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut int, mut term) = (
        signal(SignalKind::interrupt())?,
        signal(SignalKind::terminate())?,
    );
    let text = std::fs::read(&args.mcp_config)
        .with_context(|| format!("reading {}", args.mcp_config.display()))?;
    let config: Value = serde_json::from_slice(&text)
        .with_context(|| format!("{} is not JSON", args.mcp_config.display()))?;
    let server = config
        .pointer("/mcpServers/ac7")
        .with_context(|| format!("{} has no mcpServers.ac7 entry", args.mcp_config.display()))?;
    let command = server
        .get("command")
        .and_then(Value::as_str)
        .context("mcpServers.ac7 has no command")?;
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect()
    };
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(strings(server.get("args")))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in server
        .get("env")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        if let Some(v) = v.as_str() {
            cmd.env(k, v);
        }
    }
    let mut bridge = cmd
        .spawn()
        .with_context(|| format!("starting the MCP server {command}"))?;
    let mut stdin = bridge.stdin.take().context("no stdin")?;
    let mut lines = BufReader::new(bridge.stdout.take().context("no stdout")?).lines();

    send(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "ac7-demo-agent", "version": env!("CARGO_PKG_VERSION")},
        }}),
    )
    .await?;
    loop {
        let line = lines
            .next_line()
            .await?
            .context("the MCP server closed before answering initialize")?;
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if msg.get("id") == Some(&json!(0)) {
            if let Some(err) = msg.get("error") {
                bail!("initialize failed: {err}");
            }
            break;
        }
    }
    send(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await?;
    // Like every real agent, list the tools: the bridge relays events only after the agent's
    // first `tools/list` has been answered (its start-up hold). The answer is read below.
    send(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    )
    .await?;

    let mut next_id = 2u64;
    loop {
        let line = tokio::select! {
            line = lines.next_line() => line?,
            _ = int.recv() => break,
            _ = term.recv() => break,
        };
        let Some(line) = line else { break };
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if let Some(reply) = answer(&msg, next_id) {
            next_id += 1;
            send(&mut stdin, &reply).await?;
        } else if let Some(err) = msg.get("error") {
            eprintln!("ac7 demo-agent: request failed: {err}");
        } else if msg.pointer("/result/isError") == Some(&Value::Bool(true)) {
            eprintln!("ac7 demo-agent: tool failed: {}", msg["result"]);
        }
    }
    drop(stdin);
    if tokio::time::timeout(Duration::from_secs(5), bridge.wait())
        .await
        .is_err()
    {
        let _ = bridge.kill().await;
    }
    Ok(())
}

/// The `tools/call send` answering `msg` when it is a direct message, else `None`.
fn answer(msg: &Value, id: u64) -> Option<Value> {
    if msg.get("method").and_then(Value::as_str) != Some("notifications/claude/channel") {
        return None;
    }
    let params = msg.get("params")?;
    let meta = params.get("meta")?;
    if meta.get("thread").and_then(Value::as_str) != Some("dm") {
        return None;
    }
    let from = meta.get("from").and_then(Value::as_str)?;
    let me = meta
        .get("target")
        .and_then(Value::as_str)
        .unwrap_or("agent");
    let body = params.get("content").and_then(Value::as_str).unwrap_or("");
    Some(
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "send",
            "arguments": {"to": from, "body": reply_text(me, body)},
        }}),
    )
}

async fn send(stdin: &mut tokio::process::ChildStdin, msg: &Value) -> anyhow::Result<()> {
    let mut line = serde_json::to_vec(msg)?;
    line.push(b'\n');
    stdin
        .write_all(&line)
        .await
        .context("writing to the MCP server")?;
    stdin.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_direct_messages_only() {
        let dm = json!({"jsonrpc": "2.0", "method": "notifications/claude/channel", "params": {
            "content": "hi", "meta": {"from": "director", "thread": "dm", "target": "builder"}}});
        let call = answer(&dm, 7).expect("a reply");
        assert_eq!(call["id"], 7);
        assert_eq!(call["params"]["name"], "send");
        assert_eq!(call["params"]["arguments"]["to"], "director");
        assert_eq!(
            call["params"]["arguments"]["body"],
            reply_text("builder", "hi")
        );
        let general = json!({"method": "notifications/claude/channel", "params": {
            "content": "hi", "meta": {"from": "director", "thread": "general"}}});
        assert!(answer(&general, 1).is_none());
        assert!(answer(&json!({"id": 1, "result": {}}), 1).is_none());
    }
}
