//! `ac7 codex`: Codex as a team member, driven through `codex app-server`.
//!
//! The runner core (briefing, IPC socket and tools, objectives tracker, live stream) is the same as
//! for `ac7 claude-code`; what differs:
//! - the bridge is registered in an ephemeral `CODEX_HOME` (`$XDG_CACHE_HOME/ac7/codex/ac7-codex-…`
//!   or `~/.cache/ac7/codex/…`, never under `$TMPDIR`, where codex refuses to install helpers;
//!   0700), with a 0600 `config.toml` (`[mcp_servers.ac7]` = this executable + `mcp-bridge`,
//!   tool approval `approve`, `AC7_RUNNER_SOCKET` in its env) and `auth.json` linked from
//!   `~/.codex` when present; the directory is removed on every exit path;
//! - the briefing prose goes in as `developerInstructions` of `thread/start`;
//! - events become `<channel>` texts delivered as `turn/start` (idle) or `turn/steer` (active) by
//!   [`CodexClient`];
//! - SIGINT/SIGTERM end the session: the active turn is interrupted, app-server is stopped, and the
//!   runner exits 130 / 143.
//!
//! `--doctor` starts the same set-up, checks that Codex starts the `ac7` MCP server, lists its
//! tools and can call `roster` through it, prints a report and exits 0 (all good) or 1.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ac7_protocol::channel;
use ac7_protocol::codex::{CodexClient, CodexConfig, CodexEvent, CodexOutput};
use ac7_protocol::runner::BridgePolicy;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{RunnerOpts, StartError, doctor, locate_binary, start_core, start_failed};
use crate::bridge::RUNNER_SOCKET_ENV;

/// `ac7 codex`.
#[derive(Debug, Clone, clap::Args)]
pub struct CodexArgs {
    /// Runner options.
    #[command(flatten)]
    pub opts: RunnerOpts,
    /// The Codex thread's working directory (default: the current directory).
    #[arg(long)]
    pub cwd: Option<PathBuf>,
    /// The model for the thread.
    #[arg(long)]
    pub model: Option<String>,
    /// Check the set-up (Codex starts the ac7 MCP server, lists its tools, runs `roster`) and exit.
    #[arg(long)]
    pub doctor: bool,
}

/// How long `--doctor` waits for each step.
const DOCTOR_STEP: Duration = doctor::STEP;
/// How long codex gets to exit after its stdin closes.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// Runs `ac7 codex`; returns the exit code.
pub fn codex(args: CodexArgs) -> i32 {
    let codex = match locate_codex() {
        Ok(path) => path,
        Err(e) => return start_failed(&e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return start_failed(&StartError(format!("cannot start: {e}"))),
    };
    runtime.block_on(run(args, codex))
}

fn locate_codex() -> Result<PathBuf, StartError> {
    locate_binary(
        "CODEX_PATH",
        "codex",
        "codex is not on PATH: install the OpenAI Codex CLI (npm i -g @openai/codex), or set CODEX_PATH",
    )
}

/// The ephemeral `CODEX_HOME`; removed when dropped.
struct CodexHome {
    dir: PathBuf,
}

impl Drop for CodexHome {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            eprintln!(
                "ac7 codex: warning: could not remove {}: {e}",
                self.dir.display()
            );
        }
    }
}

/// `config.toml` registering the bridge.
pub fn config_toml(exe: &Path, socket: &Path) -> String {
    format!(
        "# Written by ac7 codex; this whole CODEX_HOME is removed when the runner exits.\n\n\
         [mcp_servers.ac7]\n\
         command = {}\n\
         args = [\"mcp-bridge\"]\n\
         enabled = true\n\
         default_tools_approval_mode = \"approve\"\n\n\
         [mcp_servers.ac7.env]\n\
         {RUNNER_SOCKET_ENV} = {}\n",
        toml_string(&exe.to_string_lossy()),
        toml_string(&socket.to_string_lossy())
    )
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn create_home(exe: &Path, socket: &Path) -> Result<CodexHome, StartError> {
    let parent = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(cache) => PathBuf::from(cache),
        None => std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".cache"))
            .ok_or_else(|| {
                StartError(
                    "neither XDG_CACHE_HOME nor HOME is set: nowhere to put CODEX_HOME".into(),
                )
            })?,
    }
    .join("ac7/codex");
    std::fs::create_dir_all(&parent)
        .map_err(|e| StartError(format!("cannot create {}: {e}", parent.display())))?;
    let mut nonce = [0u8; 6];
    getrandom::fill(&mut nonce)
        .map_err(|e| StartError(format!("no randomness for CODEX_HOME: {e}")))?;
    let name: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    let dir = parent.join(format!("ac7-codex-{name}"));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| StartError(format!("cannot create {}: {e}", dir.display())))?;
    let home = CodexHome { dir };
    let config = home.dir.join("config.toml");
    crate::fsutil::write_atomic(&config, config_toml(exe, socket).as_bytes())
        .map_err(|e| StartError(format!("cannot write {}: {e}", config.display())))?;
    if let Some(user_home) = std::env::var_os("HOME") {
        let auth = PathBuf::from(user_home).join(".codex/auth.json");
        if auth.is_file() {
            if let Err(e) = std::os::unix::fs::symlink(&auth, home.dir.join("auth.json")) {
                eprintln!("ac7 codex: warning: could not link auth.json: {e}");
            }
        } else {
            eprintln!(
                "ac7 codex: no ~/.codex/auth.json: run `codex login` first so codex can reach its model"
            );
        }
    }
    Ok(home)
}

/// Why the session ended.
enum End {
    CodexExited,
    Signal(i32),
    Failed(String),
    Doctor(bool),
}

async fn run(args: CodexArgs, codex: PathBuf) -> i32 {
    if args.doctor {
        doctor::say("codex", &format!("codex found at {}", codex.display()));
        match doctor::version(&codex).await {
            Ok(v) => doctor::say("codex", &format!("codex version {v}")),
            Err(e) => return i32::from(!doctor::failed("codex", &e)),
        }
    }
    // Codex runs more than one instance of an MCP server (one per thread, more for status
    // listing): every bridge stays attached.
    let core = match start_core(&args.opts, BridgePolicy::AllowMany).await {
        Ok(core) => core,
        Err(e) => return start_failed(&e),
    };
    let (exe, socket) = match core.bridge_command() {
        Ok(c) => c,
        Err(e) => {
            core.server.shutdown(Some("codex-home-failed")).await;
            return start_failed(&e);
        }
    };
    let home = match create_home(&exe, &socket) {
        Ok(home) => home,
        Err(e) => {
            core.server.shutdown(Some("codex-home-failed")).await;
            return start_failed(&e);
        }
    };
    let cwd = match args.cwd.clone().map_or_else(std::env::current_dir, Ok) {
        Ok(cwd) => cwd,
        Err(e) => return start_failed(&StartError(format!("no working directory: {e}"))),
    };
    let mut child = match tokio::process::Command::new(&codex)
        .arg("app-server")
        .env("CODEX_HOME", &home.dir)
        .current_dir(&cwd)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(if args.doctor {
            std::process::Stdio::null()
        } else {
            std::process::Stdio::inherit()
        })
        .kill_on_drop(true)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            core.server.shutdown(Some("codex-spawn-failed")).await;
            return start_failed(&StartError(format!(
                "cannot start {} app-server: {e}",
                codex.display()
            )));
        }
    };
    // Codex's own bridges (it may start several) are those in its process tree.
    if let Some(pid) = child.id() {
        core.agent.set(pid);
    }
    let b = &core.briefing;
    eprintln!(
        "ac7 codex: {} ({}) on team {} — cwd {}",
        b.name,
        b.role.title,
        b.team.name,
        cwd.display()
    );

    // Live events: rendered here, delivered by the client machine.
    let (events_tx, mut events) = mpsc::unbounded_channel::<String>();
    let (me, tracker) = (b.name.clone(), core.tracker.clone());
    let stop_stream = core.start_stream(
        args.opts.stream,
        Box::new(move |message| {
            if channel::is_objective_event(&message) {
                tracker.trigger();
            }
            if !channel::suppress_self_echo(&message, &me) {
                let _ = events_tx.send(channel::codex_text(&message));
            }
        }),
    );

    let mut client = CodexClient::new(
        CodexConfig {
            client_name: "ac7".into(),
            client_version: env!("CARGO_PKG_VERSION").into(),
            cwd: cwd.to_string_lossy().into_owned(),
            developer_instructions: b.instructions.clone(),
            model: args.model.clone(),
        },
        Instant::now().into_std(),
    );
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut doctor = args.doctor.then(Doctor::default);
    let mut buf = vec![0u8; 64 * 1024];
    use tokio::signal::unix::{SignalKind, signal};
    let (mut int, mut term) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        _ => return start_failed(&StartError("cannot install signal handlers".into())),
    };
    let end = 'session: loop {
        // Act on everything the machine wants, then wait for the next input.
        while let Some(output) = client.poll_output() {
            match output {
                CodexOutput::Send(line) => {
                    if let Some(pipe) = stdin.as_mut()
                        && let Err(e) = pipe.write_all(&line).await
                    {
                        break 'session End::Failed(format!("writing to codex failed: {e}"));
                    }
                }
                CodexOutput::Ready { thread_id } => {
                    tracing::info!(thread_id, "codex thread started");
                    match &mut doctor {
                        Some(d) => d.ready(&mut client, &thread_id),
                        None => eprintln!(
                            "ac7 codex: agent connected — Ctrl-C to stop. Direct it with `ac7 push --to {} --body …`",
                            core.briefing.name
                        ),
                    }
                }
                CodexOutput::Failed(reason) => break 'session End::Failed(reason),
                CodexOutput::CloseStdin => stdin = None,
                CodexOutput::Response { id, outcome } => {
                    if let Some(d) = &mut doctor
                        && let Some(ok) = d.response(&mut client, id, outcome)
                    {
                        break 'session End::Doctor(ok);
                    }
                }
                CodexOutput::Event(event) => log_event(&event),
            }
        }
        let deadline = client.poll_timeout().map(Instant::from_std);
        let doctor_deadline = doctor.as_ref().map(|d| d.deadline);
        tokio::select! {
            read = read_some(&mut stdout, &mut buf) => match read {
                Some(n) => client.handle_bytes(&buf[..n], Instant::now().into_std()),
                None => break End::CodexExited,
            },
            Some(text) = events.recv() => client.push_event(text, Instant::now().into_std()),
            () = sleep_until(deadline) => client.handle_timeout(Instant::now().into_std()),
            () = sleep_until(doctor_deadline) => break End::Doctor(doctor.as_mut().is_some_and(|d| d.timed_out())),
            _ = int.recv() => break End::Signal(2),
            _ = term.recv() => break End::Signal(15),
        }
    };

    // Teardown: flush what can be delivered, interrupt the turn, close codex's stdin, wait.
    client.shutdown(Instant::now().into_std());
    while let Some(output) = client.poll_output() {
        if let (CodexOutput::Send(line), Some(pipe)) = (&output, stdin.as_mut()) {
            let _ = pipe.write_all(line).await;
        }
    }
    drop(stdin);
    let status = match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            let _ = child.start_kill();
            child.wait().await
        }
    };
    drop(home);
    let _ = stop_stream.send(true);
    let (code, reason) = match &end {
        End::Signal(n) => (128 + n, format!("signal-{n}")),
        End::Failed(reason) => {
            eprintln!("ac7 codex: {reason}");
            (2, "codex-failed".to_owned())
        }
        End::Doctor(ok) => (i32::from(!ok), "doctor".to_owned()),
        End::CodexExited => {
            let code = super::exit_code(status);
            (code, format!("codex-exited-{code}"))
        }
    };
    core.server.shutdown(Some(&reason)).await;
    code
}

async fn read_some(
    stdout: &mut Option<tokio::process::ChildStdout>,
    buf: &mut [u8],
) -> Option<usize> {
    match stdout {
        Some(out) => match out.read(buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn log_event(event: &CodexEvent) {
    match event {
        CodexEvent::Dropped { events, reason } => {
            tracing::warn!(events, reason, "events not delivered to codex")
        }
        CodexEvent::CodexError(error) => tracing::warn!(error, "codex reported an error"),
        CodexEvent::Unparseable { len } => tracing::warn!(len, "unreadable line from codex"),
        other => tracing::debug!(?other, "codex"),
    }
}

/// `--doctor`: the checks, one request at a time.
struct Doctor {
    deadline: Instant,
    thread: String,
    step: Step,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    WaitingForThread,
    Listing(u64),
    Calling(u64),
}

impl Default for Doctor {
    fn default() -> Self {
        Self {
            deadline: Instant::now() + DOCTOR_STEP,
            thread: String::new(),
            step: Step::WaitingForThread,
        }
    }
}

impl Doctor {
    fn ready(&mut self, client: &mut CodexClient, thread_id: &str) {
        doctor::say(
            "codex",
            &format!("codex app-server started thread {thread_id}"),
        );
        self.thread = thread_id.to_owned();
        self.list(client);
    }

    fn list(&mut self, client: &mut CodexClient) {
        self.step = Step::Listing(client.request("mcpServerStatus/list", &json!({})));
    }

    /// Handles an answer; `Some(ok)` when the checks are over.
    fn response(
        &mut self,
        client: &mut CodexClient,
        id: u64,
        outcome: Result<Value, String>,
    ) -> Option<bool> {
        match (self.step, outcome) {
            (Step::Listing(want), Ok(result)) if want == id => {
                let server = result["data"]
                    .as_array()
                    .and_then(|d| d.iter().find(|s| s["name"] == "ac7"));
                let tools = server
                    .and_then(|s| s["tools"].as_object())
                    .map_or(0, serde_json::Map::len);
                if tools == 0 {
                    // Not started yet: ask again.
                    self.list(client);
                    return None;
                }
                doctor::say(
                    "codex",
                    &format!("the ac7 MCP server is running with {tools} tools"),
                );
                let params = json!({"threadId": self.thread, "server": "ac7", "tool": "roster", "arguments": {}});
                self.step = Step::Calling(client.request("mcpServer/tool/call", &params));
                None
            }
            (Step::Calling(want), Ok(result)) if want == id => {
                let text = result["content"][0]["text"].as_str().unwrap_or_default();
                let ok = result["isError"] != true && text.contains("roster");
                doctor::say(
                    "codex",
                    &format!("roster through codex: {}", if ok { "ok" } else { "FAILED" }),
                );
                eprintln!("{text}");
                Some(ok)
            }
            (_, Err(error)) => Some(doctor::failed("codex", &error)),
            _ => None,
        }
    }

    fn timed_out(&self) -> bool {
        doctor::failed(
            "codex",
            &format!("no answer from codex at step {:?}", self.step),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_toml_registers_the_bridge_with_escaped_strings() {
        let toml = config_toml(
            Path::new("/opt/a \"b\"/ac7"),
            Path::new("/tmp/.ac7-runner-1.sock"),
        );
        assert!(toml.contains("[mcp_servers.ac7]\ncommand = \"/opt/a \\\"b\\\"/ac7\"\nargs = [\"mcp-bridge\"]\nenabled = true\ndefault_tools_approval_mode = \"approve\"\n"));
        assert!(
            toml.contains(
                "[mcp_servers.ac7.env]\nAC7_RUNNER_SOCKET = \"/tmp/.ac7-runner-1.sock\"\n"
            )
        );
        assert_eq!(toml_string("a\\b\n\u{1}"), "\"a\\\\b\\n\\u0001\"");
    }
}
