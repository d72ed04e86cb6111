//! `--doctor`: what both agents' checks share — the report lines, the agent binary's version —
//! and the Claude Code check (`ac7 claude-code --doctor`).
//!
//! `ac7 claude-code --doctor` checks, in order, and prints one line per step on stderr:
//! 1. `claude` is found (`CLAUDE_PATH`, or `PATH`);
//! 2. it is Claude Code: `claude --version` prints `X.Y.Z (Claude Code)` (another program called
//!    `claude` fails the check);
//! 3. nothing turns its channels off — the way ac7 messages reach it as they arrive. Each thing
//!    that does is a `WARN` line, not a failure (the tools still work): see [`channel_warnings`];
//! 4. the broker answers the briefing for this token;
//! 5. our MCP server starts: this executable's `mcp-bridge`, started the way Claude Code starts it
//!    (the `.mcp.json` entry: command, args, `AC7_RUNNER_SOCKET`), answers `initialize` and lists
//!    the tools through the runner.
//!
//! Exit 0 when every step passed (warnings or not), 1 otherwise. Nothing is written to the
//! working directory.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use ac7_protocol::session::runner::BridgePolicy;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::claude_settings::{ClaudeSettings, MANAGED_SETTINGS_DIR};
use super::{RunnerOpts, StartError, start_core};
use crate::dialects::mcp_bridge::RUNNER_SOCKET_ENV;

/// How long each step may take.
pub(crate) const STEP: Duration = Duration::from_secs(20);

/// Prints one report line: `ac7 <command> --doctor: <text>`.
pub(crate) fn say(command: &str, text: &str) {
    eprintln!("ac7 {command} --doctor: {text}");
}

/// Prints a warning: something works, but not as it should.
pub(crate) fn warn(command: &str, text: &str) {
    say(command, &format!("WARN: {text}"));
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
    let version = match version(&claude).await {
        Ok(v) => match claude_code_version(&v) {
            Some(version) => {
                say(CMD, &format!("claude version {v}"));
                version
            }
            None => {
                return i32::from(!failed(
                    CMD,
                    &format!(
                        "{} is not Claude Code: `claude --version` printed {v:?}, where Claude Code prints \"X.Y.Z (Claude Code)\" (install it: npm i -g @anthropic-ai/claude-code, or point CLAUDE_PATH at it)",
                        claude.display()
                    ),
                ));
            }
        },
        Err(e) => return i32::from(!failed(CMD, &e)),
    };
    let settings = ClaudeSettings::read(&ClaudeSettings::files(), Path::new(MANAGED_SETTINGS_DIR));
    let warnings = channel_warnings(version, &|name| std::env::var(name).ok(), &settings);
    for warning in &warnings {
        warn(CMD, warning);
    }
    if warnings.is_empty() {
        say(CMD, "nothing turns claude's channels off");
    }
    let core = match start_core(&opts, BridgePolicy::DisplaceOld, false, None).await {
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
    let verdict = match (ok, warnings.len()) {
        (false, _) => "problems found".to_owned(),
        (true, 0) => "all good".to_owned(),
        (true, 1) => "works, with 1 warning (above)".to_owned(),
        (true, n) => format!("works, with {n} warnings (above)"),
    };
    say(CMD, &verdict);
    i32::from(!ok)
}

/// The first Claude Code version with channels.
const CHANNELS_SINCE: (u32, u32, u32) = (2, 1, 80);

/// The version in `claude --version`'s `X.Y.Z (Claude Code)`; `None` for anything else.
pub(crate) fn claude_code_version(line: &str) -> Option<(u32, u32, u32)> {
    let version = line.trim().strip_suffix("(Claude Code)")?.trim_end();
    let mut parts = version.split('.');
    let mut next = || parts.next()?.parse::<u32>().ok();
    let parsed = (next()?, next()?, next()?);
    parts.next().is_none().then_some(parsed)
}

/// What turns the channels of Claude Code `version` off, as Claude Code decides it (checked
/// against `@anthropic-ai/claude-code` 2.1.197): `env` is the runner's environment, which claude
/// inherits; `settings` adds the variables its settings files set. Empty when nothing does.
///
/// - a version before 2.1.80, which has no channels;
/// - a third-party provider: `CLAUDE_CODE_USE_BEDROCK`, `_VERTEX`, `_FOUNDRY`, `_ANTHROPIC_AWS`
///   or `_MANTLE` set to `1`/`true`/`yes`/`on`;
/// - anything that turns off Claude Code's feature flags, whose `tengu_harbor` flag gates
///   channels (off when the flags cannot be had): `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC` or
///   `DISABLE_TELEMETRY` set to anything, `DO_NOT_TRACK` or `DISABLE_GROWTHBOOK` set to
///   `1`/`true`/`yes`/`on`;
/// - managed settings without `"channelsEnabled": true` (any managed settings file turns
///   channels off for the organisation unless it says so).
pub(crate) fn channel_warnings(
    version: (u32, u32, u32),
    env: &dyn Fn(&str) -> Option<String>,
    settings: &ClaudeSettings,
) -> Vec<String> {
    let truthy =
        |v: &str| ["1", "true", "yes", "on"].contains(&v.trim().to_ascii_lowercase().as_str());
    // Where `name` is set, and to what: the environment, then each settings file.
    let set = |name: &str| -> Vec<(String, String)> {
        let mut found = Vec::new();
        if let Some(value) = env(name).filter(|v| !v.is_empty()) {
            found.push(("in the environment".to_owned(), value));
        }
        for (path, vars) in &settings.env {
            match vars.get(name) {
                Some(Value::String(v)) if !v.is_empty() => {
                    found.push((format!("in {}", path.display()), v.clone()));
                }
                Some(Value::Bool(true)) => {
                    found.push((format!("in {}", path.display()), "true".into()))
                }
                Some(Value::Number(n)) => {
                    found.push((format!("in {}", path.display()), n.to_string()));
                }
                _ => {}
            }
        }
        found
    };
    let mut warnings = Vec::new();
    if version < CHANNELS_SINCE {
        let (a, b, c) = CHANNELS_SINCE;
        warnings.push(format!(
            "claude {}.{}.{} is older than {a}.{b}.{c}, the first Claude Code with channels: it does not take ac7 messages as they arrive (update it: npm i -g @anthropic-ai/claude-code)",
            version.0, version.1, version.2
        ));
    }
    for name in [
        "CLAUDE_CODE_USE_BEDROCK",
        "CLAUDE_CODE_USE_VERTEX",
        "CLAUDE_CODE_USE_FOUNDRY",
        "CLAUDE_CODE_USE_ANTHROPIC_AWS",
        "CLAUDE_CODE_USE_MANTLE",
    ] {
        for (place, value) in set(name) {
            if truthy(&value) {
                warnings.push(format!(
                    "{name}={value} ({place}) makes claude use a third-party provider, where Claude Code has no channels: ac7 messages do not reach it as they arrive (its tools still work)"
                ));
            }
        }
    }
    for (name, any_value) in [
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", true),
        ("DISABLE_TELEMETRY", true),
        ("DO_NOT_TRACK", false),
        ("DISABLE_GROWTHBOOK", false),
    ] {
        for (place, value) in set(name) {
            if any_value || truthy(&value) {
                warnings.push(format!(
                    "{name}={value} ({place}) turns off Claude Code's feature flags, and channels with them: ac7 messages do not reach claude as they arrive (its tools still work); unset it for ac7 claude-code"
                ));
            }
        }
    }
    if !settings.managed.is_empty() && settings.channels_enabled != Some(Value::Bool(true)) {
        let files: Vec<String> = settings
            .managed
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        warnings.push(format!(
            "managed settings ({}) do not set \"channelsEnabled\": true, so Claude Code turns channels off: ac7 messages do not reach claude as they arrive (an administrator can set it)",
            files.join(", ")
        ));
    }
    warnings
}

/// Starts `exe mcp-bridge` as the agent would, does the MCP handshake and returns the tool names.
async fn list_tools(
    exe: &Path,
    socket: &Path,
    agent: &crate::runner::peer::AgentPid,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_claude_codes_version_line_is_claude_code() {
        assert_eq!(
            claude_code_version("2.1.197 (Claude Code)"),
            Some((2, 1, 197))
        );
        assert_eq!(
            claude_code_version(" 10.0.3 (Claude Code)\n"),
            Some((10, 0, 3))
        );
        for other in [
            "2.1.197",
            "claude 0.4.2 (a chat bot)",
            "2.1 (Claude Code)",
            "2.1.197.1 (Claude Code)",
            "v2.1.197 (Claude Code)",
            "",
        ] {
            assert_eq!(claude_code_version(other), None, "{other}");
        }
    }

    fn warnings(env: &[(&str, &str)], settings: &ClaudeSettings) -> Vec<String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let lookup = move |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        channel_warnings((2, 1, 197), &lookup, settings)
    }

    #[test]
    fn what_turns_channels_off_is_named_and_what_does_not_is_not() {
        let none = ClaudeSettings::default();
        assert!(warnings(&[], &none).is_empty());
        // Set to anything, these two turn the feature flags off; the others need a true value.
        for (name, value) in [
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "0"),
            ("DISABLE_TELEMETRY", "false"),
            ("DO_NOT_TRACK", "1"),
            ("DISABLE_GROWTHBOOK", "yes"),
            ("CLAUDE_CODE_USE_VERTEX", "ON"),
            ("CLAUDE_CODE_USE_MANTLE", "true"),
        ] {
            let w = warnings(&[(name, value)], &none);
            assert_eq!(w.len(), 1, "{name}={value}: {w:?}");
            assert!(
                w[0].starts_with(&format!("{name}={value} (in the environment)")),
                "{w:?}"
            );
        }
        for (name, value) in [
            ("DO_NOT_TRACK", "0"),
            ("DISABLE_GROWTHBOOK", "false"),
            ("CLAUDE_CODE_USE_BEDROCK", "0"),
            ("DISABLE_TELEMETRY", ""),
        ] {
            assert!(
                warnings(&[(name, value)], &none).is_empty(),
                "{name}={value}"
            );
        }
        assert_eq!(
            channel_warnings((2, 1, 79), &|_| None, &none).len(),
            1,
            "too old"
        );
        assert!(channel_warnings((2, 1, 80), &|_| None, &none).is_empty());
    }

    #[test]
    fn settings_env_blocks_and_managed_settings_count() {
        let dir = tempfile::tempdir().unwrap();
        let managed = dir.path().join("managed");
        std::fs::create_dir_all(managed.join("managed-settings.d")).unwrap();
        let user = dir.path().join("settings.json");
        std::fs::write(
            &user,
            r#"{"env": {"DO_NOT_TRACK": "0", "DISABLE_GROWTHBOOK": true}}"#,
        )
        .unwrap();
        let files = [user.clone(), dir.path().join("missing.json")];
        // No managed settings; the user's file turns the feature flags off.
        let w = warnings(&[], &ClaudeSettings::read(&files, &managed));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with(&format!("DISABLE_GROWTHBOOK=true (in {})", user.display())),
            "{w:?}"
        );
        std::fs::write(&user, "not json").unwrap();
        std::fs::write(
            managed.join("managed-settings.json"),
            r#"{"env": {"DISABLE_TELEMETRY": 1}}"#,
        )
        .unwrap();
        let settings = ClaudeSettings::read(&files, &managed);
        let w = warnings(&[], &settings);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].starts_with(&format!(
                "DISABLE_TELEMETRY=1 (in {})",
                managed.join("managed-settings.json").display()
            )),
            "{w:?}"
        );
        assert!(
            w[1].starts_with("managed settings (") && w[1].contains("channelsEnabled"),
            "{w:?}"
        );
        // A drop-in file read after it can turn channels on for the organisation.
        std::fs::write(
            managed.join("managed-settings.d/10-channels.json"),
            r#"{"channelsEnabled": true}"#,
        )
        .unwrap();
        std::fs::write(
            managed.join("managed-settings.d/.hidden.json"),
            r#"{"channelsEnabled": false}"#,
        )
        .unwrap();
        let w = warnings(&[], &ClaudeSettings::read(&files, &managed));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("DISABLE_TELEMETRY=1"), "{w:?}");
        std::fs::write(
            managed.join("managed-settings.d/20-off.json"),
            r#"{"channelsEnabled": false}"#,
        )
        .unwrap();
        assert_eq!(
            warnings(&[], &ClaudeSettings::read(&files, &managed)).len(),
            2
        );
    }
}
