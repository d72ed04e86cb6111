//! `ac7 acp -- <agent command…>`: any agent that speaks the Agent Client Protocol (Gemini CLI's
//! `gemini --acp`, Claude Code's ACP adapter `claude-code-acp`, …) as a team member, driven in
//! turns over its stdio by [`AcpClient`].
//!
//! The runner core (briefing, IPC socket and tools, objectives tracker, live stream) is the same
//! as for the other runners; what differs:
//! - the bridge goes to the agent in `session/new`, as the stdio MCP server `ac7` (this
//!   executable, `mcp-bridge`, `AC7_RUNNER_SOCKET` in its environment): no file is written;
//! - the briefing prose goes in front of the first turn, as a text block of its own;
//! - events become `<channel>` texts (the same rendering and escaping as for Codex), gathered
//!   for the bundling window and sent as one `session/prompt` turn. One turn runs at a time;
//!   what arrives during a turn is delivered, bundled, when it ends (ACP cannot add input to a
//!   running turn, and cancelling it would throw its work away). A turn that fails (the agent
//!   answers an error, or it runs past `--turn-timeout` and is cancelled) is told to the senders
//!   of what it carried and recorded as a `turn_failed` activity event; the next events go as
//!   the next turn all the same. Events the agent refuses (an invalid-request answer) get the
//!   same "not delivered" DM as Codex's;
//! - the agent's permission requests are answered by `--permission`: by default ac7's own tools
//!   are allowed and every other tool is denied; `allow` allows all, `deny` denies all. File
//!   system and terminal access are not offered (the agent uses its own);
//! - the member is shown busy while a turn runs;
//! - tracing as for Claude Code: the agent gets the trace proxy and its CA in its environment
//!   (`HTTPS_PROXY`, `NODE_EXTRA_CA_CERTS`, … — Node agents follow them); `--no-trace` turns
//!   it off;
//! - the agent runs in a process group of its own that dies with the runner; its stdin and
//!   stdout are the protocol, its stderr is the runner's. SIGINT/SIGTERM end the session: the
//!   running turn is cancelled, the agent's stdin is closed, the signal goes to its group, which
//!   gets SIGKILL if it has not ended within `--kill-grace`; the runner exits 130 / 143. When
//!   the agent exits, the runner exits with its code. A revoked token is a turn telling the
//!   agent, then the same end with SIGTERM and exit [`super::revocation::EXIT_REVOKED`].
//!
//! `--doctor` starts the same set-up and checks that the agent answers `initialize` with our
//! protocol version, opens a session and starts the `ac7` MCP server, prints a report and exits
//! 0 (all good) or 1.

use std::path::PathBuf;
use std::time::Duration;

use ac7_protocol::dialect::acp::{
    AcpClient, AcpConfig, AcpEvent, AcpOutput, CANCEL_GRACE, McpServer, PermissionPolicy,
    SETUP_TIMEOUT,
};
use ac7_protocol::dialect::delivery::BUNDLE_WINDOW;
use ac7_protocol::dialect::mcp;
use ac7_protocol::session::runner::{BridgePolicy, RunnerEvent};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::turns::{Closing, End, TurnLoop, finish, read_some, turn_failed};
use super::{RunnerOpts, StartError, doctor, start_core, start_failed};
use crate::dialects::mcp_bridge::{RUNNER_SOCKET_ENV, STDIO_HANDOFF_ENV};
use crate::sys::clock::sleep_until;

/// How the agent's permission requests are answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Permission {
    /// Allow ac7's own tools, deny every other tool.
    Ac7,
    /// Allow every tool.
    Allow,
    /// Deny every tool.
    Deny,
}

/// `ac7 acp`.
#[derive(Debug, Clone, clap::Args)]
pub struct AcpArgs {
    /// Runner options.
    #[command(flatten)]
    pub opts: RunnerOpts,
    /// The session's working directory (default: the current directory).
    #[arg(long)]
    pub cwd: Option<PathBuf>,
    /// How the agent's permission requests are answered.
    #[arg(long, value_enum, default_value_t = Permission::Ac7)]
    pub permission: Permission,
    /// Seconds a turn may run before it is cancelled (and reported as failed).
    #[arg(long, value_name = "SECS", default_value_t = 1800)]
    pub turn_timeout: u64,
    /// Check the set-up (the agent starts, speaks our ACP version, opens a session and starts the
    /// ac7 MCP server) and exit.
    #[arg(long)]
    pub doctor: bool,
    /// Tracing of the agent's model API calls.
    #[command(flatten)]
    pub tracing: super::trace::TraceArgs,
    /// Milliseconds events are gathered into one turn after the first (default 200). Hidden:
    /// for tests that need a burst of pushes in one delivery on a loaded machine.
    #[arg(long, hide = true, value_name = "MS")]
    pub bundle_window_ms: Option<u64>,
    /// The agent command and its arguments (after `--`), e.g. `gemini --acp`.
    #[arg(last = true, required = true, value_name = "AGENT")]
    pub command: Vec<String>,
}

/// The label of the agent in notices and logs: its program's file name.
fn agent_label(program: &str) -> String {
    std::path::Path::new(program)
        .file_name()
        .map_or_else(|| program.to_owned(), |n| n.to_string_lossy().into_owned())
}

/// The agent's program: a path (which must exist) or a name on `PATH`.
fn locate_agent(program: &str) -> Result<PathBuf, StartError> {
    if program.contains('/') {
        let path = PathBuf::from(program);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(StartError::Setup(format!("{program} does not exist")))
        };
    }
    super::find_in_path(program).ok_or_else(|| {
        StartError::Setup(format!(
            "{program} is not on PATH: install the agent, or give its path (ac7 acp -- /path/to/{program} …)"
        ))
    })
}

/// Runs `ac7 acp`; returns the exit code.
pub fn acp(args: AcpArgs) -> i32 {
    let Some(program) = args.command.first() else {
        return start_failed(&StartError::Setup("no agent command given".into()));
    };
    let program = match locate_agent(program) {
        Ok(path) => path,
        Err(e) => return start_failed(&e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return start_failed(&StartError::System(format!("cannot start: {e}"))),
    };
    runtime.block_on(run(args, program))
}

/// A busy-flag key of a turn, far from the trace proxy's connection ids.
fn busy_key(turn: u64) -> u64 {
    (1 << 63) | turn
}

async fn run(args: AcpArgs, program: PathBuf) -> i32 {
    // The agent's name in notices and logs: its program's, then the one it gives itself.
    let mut label = agent_label(&args.command[0]);
    if args.doctor {
        doctor::say("acp", &format!("{label} found at {}", program.display()));
    }
    let (events_tx, mut runner_events) = mpsc::unbounded_channel::<RunnerEvent>();
    let core = match start_core(
        &args.opts,
        BridgePolicy::AllowMany,
        !args.doctor,
        args.doctor.then_some(events_tx),
    )
    .await
    {
        Ok(core) => core,
        Err(e) => return start_failed(&e),
    };
    let (exe, socket) = match core.bridge_command() {
        Ok(c) => c,
        Err(e) => return core.abandon("acp-failed", &e).await,
    };
    let cwd = match args.cwd.clone().map_or_else(std::env::current_dir, Ok) {
        Ok(cwd) => cwd,
        Err(e) => return start_failed(&StartError::System(format!("no working directory: {e}"))),
    };
    let cwd = std::path::absolute(&cwd).unwrap_or(cwd);
    let trace = if args.tracing.no_trace || args.doctor {
        None
    } else {
        let settings = super::claude_settings::ClaudeSettings::read(
            &super::claude_settings::ClaudeSettings::files(),
            std::path::Path::new(super::claude_settings::MANAGED_SETTINGS_DIR),
        );
        let endpoints = super::trace::endpoint::node_endpoints(&settings);
        core.start_trace(
            super::trace::AgentKind::Node,
            args.tracing.unsafe_tls,
            endpoints,
        )
        .await
    };
    let mut command = tokio::process::Command::new(&program);
    if let Some(trace) = &trace {
        trace.env().apply(&mut command);
    }
    command.args(&args.command[1..]).current_dir(&cwd);
    let (mut child, agent) = match super::turns::spawn_agent(&mut command, args.doctor, &core) {
        Ok(started) => started,
        Err(e) => {
            let e = StartError::Setup(format!("cannot start {}: {e}", program.display()));
            return core.abandon("acp-spawn-failed", &e).await;
        }
    };
    super::turns::banner(&core, "acp", &format!("{label} in {}", cwd.display()));
    let b = &core.briefing;

    // Live events: rendered here, delivered by the client machine.
    let (notices_tx, mut events, stop_stream) = super::turns::live_events(&core, args.opts.stream);
    let mut client = AcpClient::new(
        AcpConfig {
            client_name: "ac7".into(),
            client_version: env!("CARGO_PKG_VERSION").into(),
            cwd: cwd.to_string_lossy().into_owned(),
            mcp_servers: vec![McpServer {
                name: mcp::SERVER_NAME.into(),
                command: exe.to_string_lossy().into_owned(),
                args: vec!["mcp-bridge".into()],
                env: vec![
                    (
                        RUNNER_SOCKET_ENV.into(),
                        socket.to_string_lossy().into_owned(),
                    ),
                    (STDIO_HANDOFF_ENV.into(), "1".into()),
                ],
            }],
            briefing: b.instructions.clone(),
            permission: match args.permission {
                Permission::Ac7 => PermissionPolicy::Ac7Tools,
                Permission::Allow => PermissionPolicy::Allow,
                Permission::Deny => PermissionPolicy::Deny,
            },
            bundle_window: args
                .bundle_window_ms
                .map_or(BUNDLE_WINDOW, Duration::from_millis),
            setup_timeout: SETUP_TIMEOUT,
            turn_timeout: Duration::from_secs(args.turn_timeout),
            cancel_grace: CANCEL_GRACE,
        },
        Instant::now().into_std(),
    );
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut doctor = args.doctor.then(|| Doctor {
        deadline: Instant::now() + SETUP_TIMEOUT,
        ready: false,
        attached: false,
    });
    let mut lp = match TurnLoop::start(&core) {
        Ok(lp) => lp,
        Err(e) => return start_failed(&e),
    };
    let end = 'session: loop {
        while let Some(output) = client.poll_output() {
            match output {
                AcpOutput::Transmit(line) => {
                    if let Some(pipe) = stdin.as_mut()
                        && let Err(e) = pipe.write_all(&line).await
                    {
                        break 'session End::Failed(format!("writing to {label} failed: {e}"));
                    }
                }
                AcpOutput::Ready { session_id, agent } => {
                    if let Some(name) = agent.title.or(agent.name) {
                        label = name;
                    }
                    let who = format!(
                        "{label} {}",
                        agent.version.as_deref().unwrap_or("(no version given)")
                    );
                    tracing::info!(session_id, agent = who, "ACP session started");
                    match &mut doctor {
                        Some(d) => {
                            doctor::say(
                                "acp",
                                &format!(
                                    "{who} speaks ACP version {}",
                                    ac7_protocol::dialect::acp::PROTOCOL_VERSION
                                ),
                            );
                            doctor::say("acp", &format!("session {session_id} opened"));
                            d.ready = true;
                            d.deadline = Instant::now() + doctor::STEP;
                            if d.attached {
                                break 'session End::Doctor(d.bridge(&label));
                            }
                        }
                        None => eprintln!(
                            "ac7 acp: {who} connected — Ctrl-C to stop. Direct it with `ac7 push --to {} --body …`",
                            lp.me
                        ),
                    }
                }
                AcpOutput::Failed(reason) => {
                    if doctor.is_some() {
                        break 'session End::Doctor(doctor::failed("acp", &reason));
                    }
                    break 'session End::Failed(reason);
                }
                AcpOutput::CloseStdin => stdin = None,
                AcpOutput::TurnStarted { turn, events } => {
                    tracing::debug!(turn, events, "turn started");
                    if let Some(activity) = &lp.activity {
                        activity.llm_started(busy_key(turn));
                    }
                }
                AcpOutput::TurnEnded { turn, stop_reason } => {
                    tracing::debug!(turn, stop_reason, "turn ended");
                    if let Some(activity) = &lp.activity {
                        activity.llm_finished(busy_key(turn));
                    }
                }
                AcpOutput::Undelivered(undelivered) => lp.undelivered(&core, &label, undelivered),
                AcpOutput::TurnFailed(failure) => {
                    turn_failed(lp.activity.as_ref(), &label, failure)
                }
                AcpOutput::Event(event) => log_event(&event),
                other => tracing::warn!(?other, "acp: an output this version does not handle"),
            }
        }
        let deadline = client.poll_timeout().map(Instant::from_std);
        let doctor_deadline = doctor.as_ref().map(|d| d.deadline);
        tokio::select! {
            read = read_some(&mut stdout, &mut lp.buf) => match read {
                Some(n) => client.handle_bytes(&lp.buf[..n], Instant::now().into_std()),
                None => break End::AgentExited,
            },
            Some(event) = events.recv() => client.notify(event, Instant::now().into_std()),
            Some(event) = runner_events.recv() => {
                if let (Some(d), RunnerEvent::Attached { .. }) = (&mut doctor, event) {
                    d.attached = true;
                    if d.ready {
                        break End::Doctor(d.bridge(&label));
                    }
                }
            }
            () = sleep_until(deadline) => client.handle_timeout(Instant::now().into_std()),
            () = sleep_until(doctor_deadline) => {
                let step = if doctor.as_ref().is_some_and(|d| d.ready) {
                    format!("{label} opened a session but did not start the ac7 MCP server within {} s (some agents start no MCP server in a folder they do not trust: trust it in the agent, e.g. GEMINI_CLI_TRUST_WORKSPACE=true for Gemini CLI)", doctor::STEP.as_secs())
                } else {
                    format!("{label} did not open a session")
                };
                break End::Doctor(doctor::failed("acp", &step));
            }
            n = lp.signals.recv() => break End::Signal(n),
            () = super::lifecycle::token_revoked(lp.token.as_mut()), if lp.revoked_end.is_none() => {
                lp.revoked(&core, &notices_tx);
            }
            () = sleep_until(lp.revoked_end) => break End::Revoked,
        }
    };

    // Teardown: cancel the running turn, report what waits, close the agent's stdin.
    client.shutdown(Instant::now().into_std());
    while let Some(output) = client.poll_output() {
        match output {
            AcpOutput::Transmit(line) => {
                if let Some(pipe) = stdin.as_mut() {
                    let _ = pipe.write_all(&line).await;
                }
            }
            AcpOutput::Undelivered(undelivered) => lp.undelivered(&core, &label, undelivered),
            AcpOutput::TurnEnded { turn, .. } => {
                if let Some(activity) = &lp.activity {
                    activity.llm_finished(busy_key(turn));
                }
            }
            AcpOutput::Event(event) => log_event(&event),
            _ => {}
        }
    }
    drop(stdin);
    finish(
        end,
        &mut child,
        &agent,
        Closing {
            command: "acp",
            agent: "acp-agent",
            kill_grace: args.opts.kill_grace,
            notices: lp.notices,
            stop_stream,
            trace,
            activity: core.activity,
            server: core.server,
        },
    )
    .await
}

/// `--doctor`: waiting for the session and for the agent's bridge (in either order).
struct Doctor {
    deadline: Instant,
    /// The session is open.
    ready: bool,
    /// A bridge the agent started connected.
    attached: bool,
}

impl Doctor {
    /// Both are there: the last check passed.
    fn bridge(&self, label: &str) -> bool {
        doctor::say(
            "acp",
            &format!("{label} started the ac7 MCP server (a bridge connected)"),
        );
        true
    }
}

fn log_event(event: &AcpEvent) {
    match event {
        AcpEvent::Dropped { events, reason } => {
            tracing::warn!(events, reason, "events not delivered to the agent");
        }
        AcpEvent::Unparseable { len, detail } => {
            tracing::warn!(len, detail, "unreadable line from the agent");
        }
        AcpEvent::Unexpected(what) => tracing::warn!(what, "unexpected message from the agent"),
        AcpEvent::Unmatched(id) => tracing::warn!(id, "an answer from the agent to no request"),
        AcpEvent::UnknownRequest(method) => {
            tracing::info!(method, "refused a request the agent was not offered");
        }
        AcpEvent::Permission {
            title,
            allowed,
            option,
        } => tracing::info!(title, allowed, option, "answered a permission request"),
        AcpEvent::Cancelling { turn } => {
            tracing::warn!(turn, "a turn ran past --turn-timeout: cancelling it");
        }
        AcpEvent::Update(kind) => tracing::debug!(kind, "session update"),
        other => tracing::debug!(?other, "acp event"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_is_a_path_or_a_name_on_path() {
        assert_eq!(agent_label("/opt/bin/gemini"), "gemini");
        assert_eq!(agent_label("claude-code-acp"), "claude-code-acp");
        let e = locate_agent("/nonexistent/agent").unwrap_err().to_string();
        assert_eq!(e, "/nonexistent/agent does not exist");
        let e = locate_agent("no-such-agent-anywhere")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("no-such-agent-anywhere is not on PATH"),
            "{e}"
        );
        assert!(locate_agent("sh").is_ok());
        assert_ne!(busy_key(1), 1);
    }
}
