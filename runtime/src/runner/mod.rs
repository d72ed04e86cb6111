//! The runner: `ac7 claude-code` and `ac7 run -- <cmd>`. It joins one agent to the team.
//!
//! Start-up, in order (any failure: one `ac7: …` line on stderr, exit 2, nothing left behind):
//! 1. the token (`--token` / `AC7_TOKEN` / the one `ac7 connect` stored for the URL) and the broker (`--url` / `AC7_URL`, default
//!    `http://127.0.0.1:8717`); `GET /briefing`;
//! 2. the IPC socket (`$TMPDIR/.ac7-runner-<pid>.sock`, 0600; the sockets and lock files that
//!    runners which died left in `$TMPDIR` are removed first) and the request handler: `tools/list`
//!    from the briefing and the live open objectives, `tools/call` through the toolbox plans,
//!    anything else `-32601`;
//! 3. the agent's MCP config (`./.mcp.json`, or `--mcp-config`): an `ac7` entry that starts
//!    this executable as `mcp-bridge` with `AC7_RUNNER_SOCKET`, restored on every exit path;
//! 4. the live stream (forwarder) and the objectives tracker;
//! 5. the agent, in a process group of its own that dies with the runner, with the terminal
//!    ([`lifecycle`]). SIGINT/SIGTERM/SIGHUP reaching the runner go to the agent's process group,
//!    and SIGKILL follows after `--kill-grace` (default 10 s).
//!
//! Also at start-up: the files runners that died left behind are removed ([`leftovers`]), and a
//! member that is already live on the broker (another runner of it runs) is one warning naming
//! where (host and pid, from `GET /roster`).
//!
//! A revoked token (rotated, deleted, the member removed) stops the runner: the agent is told,
//! one line goes to stderr, the agent is stopped as on SIGTERM, and the runner exits
//! [`revocation::EXIT_REVOKED`] ([`revocation`]).
//!
//! Every runner kind (this one, `ac7 codex`) first raises its open-file soft limit to the hard
//! limit ([`crate::sys::rlimit`]); the agent starts with the limit the runner was given.
//!
//! When the agent exits: `ac7 claude-code` prints how to resume Claude Code's session with ac7
//! ([`resume`]), the config is restored, the bridge gets `shutdown`, the socket is removed, and
//! the runner exits with the agent's code (`128 + n` when a signal killed it), or
//! [`revocation::EXIT_REVOKED`] when it was stopped because the token was revoked.

pub mod acp;
pub mod activity;
pub(crate) mod claude_settings;
pub mod codex;
pub(crate) mod doctor;
pub mod forwarder;
pub mod ipc_server;
pub mod leftovers;
pub mod lifecycle;
pub mod logs;
pub mod mcp_config;
pub mod peer;
pub mod resume;
pub mod revocation;
pub(crate) mod stdio_handoff;
pub mod trace;
pub mod tracker;
pub(crate) mod turns;

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};

use ac7_protocol::codec::json::RawJson;
use ac7_protocol::codec::jsonrpc::{INTERNAL_ERROR, METHOD_NOT_FOUND, Outcome, RpcError};
use ac7_protocol::dialect::mcp;
use ac7_protocol::domain::objective::Objective;
use ac7_protocol::domain::toolbox::{self, Briefing, Context, Plan};
use ac7_protocol::session::mcp_bridge::BridgeConfig;
use ac7_protocol::session::runner::{BridgePolicy, IncomingRequest, RunnerConfig};
use serde_json::{Value, json};
use tokio::sync::watch;

pub use forwarder::StreamMode;

use crate::client::tokens::resolve_token_any;
use crate::client::{BriefingError, BrokerClient, DEFAULT_URL, TransportError, broker_url};
use crate::dialects::mcp_bridge::{RUNNER_SOCKET_ENV, STDIO_HANDOFF_ENV};
use crate::runner::ipc_server::{IpcServer, IpcServerOptions, RunnerHandle};

/// Options every runner takes.
#[derive(Debug, Clone, clap::Args)]
pub struct RunnerOpts {
    /// The broker's URL; repeat it (or list them in AC7_URL, comma-separated) for replicas of one team, tried in
    /// order when one does not answer.
    #[arg(long, env = "AC7_URL", default_value = DEFAULT_URL, value_parser = broker_url, value_delimiter = ',', action = clap::ArgAction::Append)]
    pub url: Vec<String>,
    /// This member's bearer token.
    #[arg(long, env = "AC7_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The live-stream transport: SSE, WebSocket, or SSE falling back to WebSocket.
    #[arg(long, value_enum, default_value_t = StreamMode::Auto)]
    pub stream: StreamMode,
    /// The IPC socket path (default `$TMPDIR/.ac7-runner-<pid>.sock`).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Seconds the agent's process group gets to end after the runner passed on SIGINT, SIGTERM
    /// or SIGHUP (or stopped it because its token was revoked) before it gets SIGKILL.
    #[arg(long, env = lifecycle::KILL_GRACE_ENV, value_name = "SECS", default_value = "10", value_parser = lifecycle::parse_kill_grace)]
    pub kill_grace: std::time::Duration,
    /// At start, the messages the member missed while no runner was live (after the last one
    /// the broker delivered to it) reach the agent in order, at most this many; one notice then
    /// says how many more there were and that the `recent` tool shows them.
    #[arg(long, env = "AC7_BACKFILL", value_name = "N", default_value_t = 50)]
    pub backfill: usize,
}

/// `ac7 claude-code`.
#[derive(Debug, Clone, clap::Args)]
pub struct ClaudeCodeArgs {
    /// Runner options.
    #[command(flatten)]
    pub opts: RunnerOpts,
    /// Check the set-up (claude found and its version, the broker, our MCP server starts and
    /// lists its tools) and exit: 0 all good, 1 not.
    #[arg(long)]
    pub doctor: bool,
    /// Tracing of the agent's model API calls.
    #[command(flatten)]
    pub tracing: trace::TraceArgs,
    /// Arguments for `claude` (after `--`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub claude_args: Vec<String>,
}

/// `ac7 run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Runner options.
    #[command(flatten)]
    pub opts: RunnerOpts,
    /// The MCP config file the agent reads.
    #[arg(long, default_value = ".mcp.json")]
    pub mcp_config: PathBuf,
    /// Trace the agent's model API calls (off by default for `ac7 run`; the command gets the
    /// proxy and the CA in its environment the way Node programs read them).
    #[arg(long, conflicts_with = "no_trace")]
    pub trace: bool,
    /// Tracing flags.
    #[command(flatten)]
    pub tracing: trace::TraceArgs,
    /// The agent command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// A start-up failure: printed as `ac7: <message>`, exit 2. Split by where the fault lies; each
/// message says what happened and what to do.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The user's setup: arguments, environment, a config file, a program that is not there.
    #[error("{0}")]
    Setup(String),
    /// The broker: it could not be reached, refused the token, or sent no briefing.
    #[error("{0}")]
    Broker(String),
    /// This machine: a directory, socket, process or signal handler the OS refused us.
    #[error("{0}")]
    System(String),
    /// A bug in ac7: what it wrote does not read back.
    #[error("{0}")]
    Bug(String),
}

/// Runs `ac7 claude-code`; returns the exit code.
pub fn claude_code(args: ClaudeCodeArgs) -> i32 {
    if args.doctor {
        return match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(doctor::claude_code(args.opts, locate_claude())),
            Err(e) => start_failed(&StartError::System(format!("cannot start: {e}"))),
        };
    }
    let claude = match locate_claude() {
        Ok(path) => path,
        Err(e) => return start_failed(&e),
    };
    let ClaudeCodeArgs {
        opts,
        claude_args,
        tracing,
        ..
    } = args;
    let trace = (!tracing.no_trace).then_some((trace::AgentKind::Node, tracing.unsafe_tls));
    run_runner(
        opts,
        PathBuf::from(".mcp.json"),
        trace,
        true,
        move |briefing| {
            let mut argv = vec![claude.to_string_lossy().into_owned()];
            argv.extend(claude_flags(&claude_args, &briefing.instructions));
            argv
        },
    )
}

/// Runs `ac7 run -- <cmd…>`; returns the exit code.
pub fn run_command(args: RunArgs) -> i32 {
    let RunArgs {
        opts,
        mcp_config,
        command,
        trace,
        tracing,
    } = args;
    let trace =
        (trace && !tracing.no_trace).then_some((trace::AgentKind::Node, tracing.unsafe_tls));
    run_runner(opts, mcp_config, trace, false, move |_| command)
}

/// The flags `ac7 claude-code` adds in front of the user's, unless the user passed them.
pub fn claude_flags(user: &[String], prose: &str) -> Vec<String> {
    let mut argv = Vec::new();
    if !user
        .iter()
        .any(|a| a == "--dangerously-load-development-channels")
    {
        argv.extend([
            "--dangerously-load-development-channels".to_owned(),
            "server:ac7".to_owned(),
        ]);
    }
    if !prose.is_empty() && !user.iter().any(|a| a == "--append-system-prompt") {
        argv.extend(["--append-system-prompt".to_owned(), prose.to_owned()]);
    }
    argv.extend(user.iter().cloned());
    argv
}

fn locate_claude() -> Result<PathBuf, StartError> {
    locate_binary(
        "CLAUDE_PATH",
        "claude",
        "claude (Claude Code) is not on PATH: install it (npm i -g @anthropic-ai/claude-code), or set CLAUDE_PATH",
    )
}

/// The binary named by `$<env>` (which must exist) or else `name` on `PATH`; `missing` is the
/// error when neither is found.
pub(crate) fn locate_binary(env: &str, name: &str, missing: &str) -> Result<PathBuf, StartError> {
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(StartError::Setup(format!(
                "{env}={} does not exist",
                path.display()
            )))
        };
    }
    find_in_path(name).ok_or_else(|| StartError::Setup(missing.to_owned()))
}

/// The first executable file called `name` on `PATH`.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

pub(crate) fn start_failed(error: &StartError) -> i32 {
    eprintln!("ac7: {error}");
    2
}

/// `claude`: the agent is Claude Code, whose session the runner follows to print how to resume
/// it ([`resume`]).
fn run_runner(
    opts: RunnerOpts,
    config: PathBuf,
    trace: Option<(trace::AgentKind, bool)>,
    claude: bool,
    argv: impl FnOnce(&Briefing) -> Vec<String>,
) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return start_failed(&StartError::System(format!("cannot start: {e}"))),
    };
    runtime.block_on(async move {
        match start(opts, &config, trace, claude, argv).await {
            Ok(running) => running.wait().await,
            Err(e) => start_failed(&e),
        }
    })
}

struct Running {
    child: tokio::process::Child,
    agent: lifecycle::Agent,
    grace: std::time::Duration,
    client: BrokerClient,
    me: String,
    runner: RunnerHandle,
    config: mcp_config::McpConfigGuard,
    server: ipc_server::ServerTask,
    stop_stream: watch::Sender<bool>,
    trace: Option<trace::TraceHost>,
    activity: Option<activity::Activity>,
    /// Claude Code's session, followed for the resume hint.
    session: Option<resume::SessionWatch>,
    urls: Vec<String>,
}

/// What every runner sets up before its agent starts: the briefing, the IPC socket serving the
/// tools, and the objectives tracker.
pub(crate) struct Core {
    pub(crate) client: BrokerClient,
    pub(crate) briefing: Arc<Briefing>,
    pub(crate) server: ipc_server::ServerTask,
    pub(crate) runner: RunnerHandle,
    pub(crate) tracker: tracker::TrackerHandle,
    pub(crate) socket_path: PathBuf,
    /// Set to the agent's pid once it is spawned: only bridges from its process tree get events.
    pub(crate) agent: peer::AgentPid,
    /// Activity upload, busy reports and objective markers; shut down before `server`.
    pub(crate) activity: Option<activity::Activity>,
    /// Missed messages handed to the agent at start, at most (`--backfill`).
    pub(crate) backfill: usize,
}

/// `record_activity`: start the activity pipeline and objective markers ([`activity::Activity`]);
/// `events`: where the IPC server's events go besides the log.
pub(crate) async fn start_core(
    opts: &RunnerOpts,
    policy: BridgePolicy,
    record_activity: bool,
    events: Option<tokio::sync::mpsc::UnboundedSender<ac7_protocol::session::runner::RunnerEvent>>,
) -> Result<Core, StartError> {
    // The trace proxy's listener takes whatever local process connects: room for it besides the
    // agent's own connections (the agent gets the limit it was started with back).
    crate::sys::rlimit::raise_fd_limit();
    let token = resolve_token_any(opts.token.as_deref(), &opts.url).ok_or_else(|| {
        StartError::Setup(format!(
            "no token for {url}: pass --token, set AC7_TOKEN, or run `ac7 connect --url {url}` once (ac7 serve prints one per member when it creates the team; ac7 member rotate-token makes a new one)",
            url = opts.url.first().map_or(DEFAULT_URL, String::as_str)
        ))
    })?;
    let client = BrokerClient::with_urls(&opts.url, &token)
        .map_err(|e| StartError::Setup(e.to_string()))?
        .with_token_watch();
    let briefing = client.briefing().await.map_err(|e| {
        let mut text = format!("briefing failed against {}: {e}", opts.url.join(", "));
        if matches!(e, BriefingError::Transport(TransportError::Unreachable(_) | TransportError::Interrupted(_))) {
            text.push_str(&format!(
                "\n  hint: is `ac7 serve` running at {}? (start it, or pass --url to point elsewhere)",
                opts.url.join(", ")
            ));
        }
        StartError::Broker(text)
    })?;
    let briefing = Arc::new(briefing);
    if let Some(dir) = ipc_server::default_socket_path().parent() {
        ipc_server::remove_stale_sockets(dir);
    }
    leftovers::remove_dead_runners_files(&std::env::temp_dir(), codex::homes_dir().as_deref());
    warn_if_already_live(&client, &briefing.name).await;
    let agent = peer::AgentPid::default();
    let server = IpcServer::bind(IpcServerOptions {
        path: opts.socket.clone(),
        session: RunnerConfig {
            policy,
            ..RunnerConfig::default()
        },
        agent: Some(agent.clone()),
        events,
        stdio_handoff: Some(BridgeConfig {
            server_version: env!("CARGO_PKG_VERSION").to_owned(),
            ..BridgeConfig::default()
        }),
        ..IpcServerOptions::default()
    })
    .map_err(|e| StartError::System(format!("runner: failed to bind the IPC socket: {e}")))?;
    let socket_path = server.path().to_owned();
    let runner = server.handle();
    let open: tracker::OpenObjectives = Arc::new(Mutex::new(briefing.open_objectives.clone()));
    // Every runner kind records activity (markers now; the trace host's exchanges too).
    let activity = record_activity.then(|| {
        activity::Activity::start(
            client.clone(),
            briefing.name.clone(),
            briefing.open_objectives.clone(),
        )
    });
    let tracker = tracker::spawn(
        client.clone(),
        briefing.name.clone(),
        open.clone(),
        runner.clone(),
        activity.as_ref().map(activity::Activity::markers),
    );
    let server = server.serve(handler(
        client.clone(),
        briefing.clone(),
        open,
        tracker.clone(),
    ));
    Ok(Core {
        client,
        briefing,
        server,
        runner,
        tracker,
        socket_path,
        agent,
        activity,
        backfill: opts.backfill,
    })
}

/// Warns on stderr when `me` already has live streams on the broker (another runner of the
/// member, most often), naming where they run as far as the roster says. Quiet when the roster
/// cannot be read: the warning is a courtesy.
async fn warn_if_already_live(client: &BrokerClient, me: &str) {
    let request = toolbox::Request {
        method: toolbox::Method::Get,
        path: "/roster".into(),
        body: toolbox::Body::Empty,
    };
    let roster = match client.execute(&request).await {
        Ok(response) if response.status == 200 => {
            serde_json::from_slice::<Value>(&response.body).unwrap_or_default()
        }
        Ok(response) => {
            tracing::debug!(status = response.status, "cannot read the roster");
            return;
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the roster");
            return;
        }
    };
    let Some(entry) = roster["connected"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["name"] == me))
    else {
        return;
    };
    let live = entry["connected"].as_u64().unwrap_or(0);
    if live > 0 {
        let runners: Vec<ac7_protocol::session::live::RunnerId> =
            serde_json::from_value(entry["runners"].clone()).unwrap_or_default();
        eprintln!(
            "{}",
            already_live_warning(me, live, &runners, &lifecycle::host_name())
        );
    }
}

/// The warning for a member with `live` live streams, `runners` of which said where they run;
/// `here` is this machine's host name.
fn already_live_warning(
    me: &str,
    live: u64,
    runners: &[ac7_protocol::session::live::RunnerId],
    here: &str,
) -> String {
    let mut places: Vec<String> = runners
        .iter()
        .map(|r| {
            let mut place = format!("a runner on host {}", r.host);
            if let Some(pid) = r.pid {
                place.push_str(&format!(" (pid {pid}"));
                if r.host == here && !lifecycle::pid_alive(pid) {
                    place.push_str(", no longer running: the broker drops its stream soon");
                }
                place.push(')');
            }
            place
        })
        .collect();
    let unnamed = live.saturating_sub(runners.len() as u64);
    if unnamed > 0 {
        places.push(format!(
            "{unnamed} stream{} that did not say where {} (a browser, or an older runner)",
            if unnamed == 1 { "" } else { "s" },
            if unnamed == 1 { "it runs" } else { "they run" }
        ));
    }
    format!(
        "ac7: warning: member {me} is already live on the broker: {}. Every runner of a member gets the same messages and each agent acts on them; stop the other one unless you mean to run both.",
        places.join("; ")
    )
}

impl Core {
    /// Gives up starting: ends the session server with `reason` and prints `error`; answers
    /// the exit code ([`start_failed`]).
    pub(crate) async fn abandon(self, reason: &str, error: &StartError) -> i32 {
        self.server.shutdown(Some(reason)).await;
        start_failed(error)
    }

    /// How the agent starts the bridge: this executable, `mcp-bridge`, `AC7_RUNNER_SOCKET`.
    pub(crate) fn bridge_command(&self) -> Result<(PathBuf, PathBuf), StartError> {
        let exe = std::env::current_exe()
            .map_err(|e| StartError::System(format!("cannot find this executable: {e}")))?;
        Ok((exe, self.socket_path.clone()))
    }

    /// Starts the trace host for the agent (see [`trace`]), its exchanges going to the activity
    /// pipeline; `None` without one, or after a warning when it cannot start.
    pub(crate) async fn start_trace(
        &self,
        kind: trace::AgentKind,
        unsafe_tls: bool,
        endpoints: Vec<trace::ModelEndpoint>,
    ) -> Option<trace::TraceHost> {
        let activity = self.activity.as_ref()?.handle();
        trace::TraceHost::start_or_warn(kind, unsafe_tls, activity, endpoints).await
    }

    /// Starts the live stream; every message goes to `sink`. Send `true` to stop it.
    pub(crate) fn start_stream(
        &self,
        mode: StreamMode,
        sink: forwarder::Sink,
    ) -> watch::Sender<bool> {
        let (stop, stopped) = watch::channel(false);
        let b = &self.briefing;
        let resume =
            (b.delivered_through.is_some() || b.delivered_nothing).then(|| forwarder::Resume {
                after_id: b.delivered_through.clone(),
                cap: self.backfill,
            });
        let forwarder = forwarder::Forwarder::new(
            self.client.clone(),
            self.briefing.name.clone(),
            mode,
            sink,
            resume,
        );
        tokio::spawn(forwarder.run(stopped));
        stop
    }
}

async fn start(
    opts: RunnerOpts,
    config_path: &Path,
    trace: Option<(trace::AgentKind, bool)>,
    claude: bool,
    argv: impl FnOnce(&Briefing) -> Vec<String>,
) -> Result<Running, StartError> {
    let core = start_core(&opts, BridgePolicy::DisplaceOld, true, None).await?;
    let (exe, socket) = core.bridge_command()?;
    let entry = json!({
        "command": exe.to_string_lossy(),
        "args": ["mcp-bridge"],
        "env": {
            RUNNER_SOCKET_ENV: socket.to_string_lossy(),
            STDIO_HANDOFF_ENV: "1",
        },
    });
    let config = match mcp_config::install(config_path, mcp::SERVER_NAME, entry) {
        Ok(guard) => guard,
        Err(e) => {
            if let Some(activity) = core.activity {
                activity.shutdown().await;
            }
            core.server.shutdown(Some("mcp-config-failed")).await;
            return Err(match e {
                mcp_config::ConfigError::NotAnObject { .. }
                | mcp_config::ConfigError::NoFolder { .. }
                | mcp_config::ConfigError::InUse { .. } => StartError::Setup(e.to_string()),
                mcp_config::ConfigError::Io { .. } => StartError::System(e.to_string()),
            });
        }
    };
    let b = &core.briefing;
    eprintln!(
        "ac7: {} ({}) on team {} — MCP config {}",
        b.name,
        b.role.title,
        b.team.name,
        config.path().display()
    );
    logs::announce();
    let sink = delivery(b.name.clone(), core.runner.clone(), core.tracker.clone());
    let stop_stream = core.start_stream(opts.stream, sink);

    let argv = argv(&core.briefing);
    let Some((program, args)) = argv.split_first() else {
        return Err(StartError::Setup("no agent command given".into()));
    };
    let trace = match trace {
        Some((kind, unsafe_tls)) => {
            let settings = claude_settings::ClaudeSettings::read(
                &claude_settings::ClaudeSettings::files(),
                Path::new(claude_settings::MANAGED_SETTINGS_DIR),
            );
            let endpoints = trace::endpoint::node_endpoints(&settings);
            core.start_trace(kind, unsafe_tls, endpoints).await
        }
        None => None,
    };
    let mut command = tokio::process::Command::new(program);
    if let Some(trace) = &trace {
        trace.env().apply(&mut command);
    }
    crate::sys::rlimit::restore_fd_limit_in_child(&mut command);
    let terminal = lifecycle::prepare(&mut command, true);
    let child = command
        .args(args)
        .kill_on_drop(false)
        .spawn()
        .map_err(|e| StartError::Setup(format!("cannot start {program}: {e}")))?;
    // Set before the runtime can accept the bridge the agent is about to start.
    if let Some(pid) = child.id() {
        core.agent.set(pid);
    }
    let session = child
        .id()
        .filter(|_| claude)
        .zip(resume::claude_config_dir())
        .map(|(pid, config)| resume::SessionWatch::start(config, pid));
    Ok(Running {
        agent: lifecycle::Agent::new(&child, terminal),
        child,
        grace: opts.kill_grace,
        client: core.client.clone(),
        me: core.briefing.name.clone(),
        runner: core.runner.clone(),
        config,
        server: core.server,
        stop_stream,
        trace,
        activity: core.activity,
        session,
        urls: opts.url.clone(),
    })
}

impl Running {
    async fn wait(mut self) -> i32 {
        let (client, me, runner) = (self.client.clone(), self.me.clone(), self.runner.clone());
        let ended = lifecycle::Supervisor {
            child: &mut self.child,
            agent: &self.agent,
            grace: self.grace,
            token: self
                .client
                .token_watch()
                .map(crate::client::token_watch::TokenWatch::subscribe),
        }
        .run(|| {
            eprintln!("{}", revocation::revoked_line(&me, client.url()));
            let notice = revocation::revoked_notice(&me, client.url());
            runner.notify(
                mcp::CLAUDE_CHANNEL,
                Some(ac7_protocol::domain::channel::claude_channel_params(
                    &notice,
                )),
            );
        })
        .await;
        let code = match ended {
            Ok(ended) if ended.revoked => revocation::EXIT_REVOKED,
            Ok(ended) => exit_code(ended.status),
            Err(e) => {
                // No signal handlers: the agent runs on unsupervised; wait for it.
                eprintln!("ac7: cannot watch for signals ({e}); waiting for the agent");
                exit_code(self.child.wait().await)
            }
        };
        // Right under Claude Code's own resume hint.
        if let Some(id) = self.session.take().and_then(resume::SessionWatch::finish) {
            eprintln!("{}", resume::hint(&self.urls, &id));
        }
        if let Err(e) = self.config.restore() {
            eprintln!("ac7: warning: {e}");
        }
        let _ = self.stop_stream.send(true);
        // The proxy first: its unfinished exchanges reach the pipeline before it drains.
        if let Some(trace) = self.trace {
            trace.close().await;
        }
        if let Some(activity) = self.activity {
            activity.shutdown().await;
        }
        self.server
            .shutdown(Some(&format!("agent-exited-{code}")))
            .await;
        code
    }
}

pub(crate) fn exit_code(status: std::io::Result<ExitStatus>) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(status) => status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(1),
        Err(e) => {
            eprintln!("ac7: lost track of the agent: {e}");
            1
        }
    }
}

/// Each live message the agent gets (see [`forwarder::agent_sink`]) becomes a
/// `notifications/claude/channel`.
fn delivery(me: String, runner: RunnerHandle, tracker: tracker::TrackerHandle) -> forwarder::Sink {
    forwarder::agent_sink(me, tracker, move |message| {
        runner.notify(
            mcp::CLAUDE_CHANNEL,
            Some(ac7_protocol::domain::channel::claude_channel_params(
                message,
            )),
        );
    })
}

/// The MCP request handler: tools from the toolbox, run against the broker.
fn handler(
    client: BrokerClient,
    briefing: Arc<Briefing>,
    open: tracker::OpenObjectives,
    tracker: tracker::TrackerHandle,
) -> impl Fn(IncomingRequest) -> std::pin::Pin<Box<dyn Future<Output = Outcome> + Send>>
+ Send
+ Sync
+ 'static {
    let tools = ToolsCache::default();
    move |request: IncomingRequest| {
        let ctx = Context {
            briefing: briefing.clone(),
            now_ms: crate::sys::clock::now_ms(),
        };
        if request.method == mcp::TOOLS_LIST {
            let outcome = match tools.answer(&ctx, &open) {
                Ok(raw) => Outcome::Result(raw),
                Err(e) => Outcome::Error(RpcError::new(INTERNAL_ERROR, e.to_string())),
            };
            return Box::pin(std::future::ready(outcome));
        }
        let client = client.clone();
        let tracker = tracker.clone();
        Box::pin(async move {
            match request.method.as_str() {
                mcp::TOOLS_CALL => {
                    let params: Value = request
                        .params
                        .as_ref()
                        .and_then(|p| p.parse().ok())
                        .unwrap_or(Value::Null);
                    let name = params["name"].as_str().unwrap_or_default().to_owned();
                    let text = run_plan(
                        &client,
                        &ctx.briefing.name,
                        toolbox::plan(&ctx, &name, &params["arguments"]),
                    )
                    .await;
                    if text.objectives_changed {
                        tracker.trigger();
                    }
                    Outcome::Result(text.to_result())
                }
                other => Outcome::Error(RpcError::new(
                    METHOD_NOT_FOUND,
                    format!("method not found: {other}"),
                )),
            }
        })
    }
}

/// The `tools/list` answer, encoded once and kept while the open objectives it was made from
/// (the only part of it that changes while the runner runs) stay the same.
#[derive(Debug, Default)]
struct ToolsCache {
    kept: Mutex<Option<(Vec<Objective>, RawJson)>>,
}

impl ToolsCache {
    /// The answer for the open objectives now: the kept one when they are the ones it was made
    /// from, else a new one (kept in its place).
    fn answer(
        &self,
        ctx: &Context,
        open: &tracker::OpenObjectives,
    ) -> Result<RawJson, serde_json::Error> {
        let open = open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut kept = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((made_from, answer)) = kept.as_ref()
            && *made_from == *open
        {
            return Ok(answer.clone());
        }
        let answer = RawJson::from_value(&toolbox::tool_list(ctx, &open))?;
        *kept = Some((open.clone(), answer.clone()));
        Ok(answer)
    }
}

/// Performs a plan's requests until it is done. A request that fails before any HTTP status
/// ends the tool with that error; a 401 that the token watch confirms as a revoked token ends it
/// with [`revocation::revoked_text`].
async fn run_plan(client: &BrokerClient, me: &str, mut plan: Plan) -> toolbox::ToolText {
    loop {
        match plan {
            Plan::Done(text) => return text,
            Plan::Request(request, next) => match client.execute(&request).await {
                Ok(response) if response.status == 401 && revoked(client).await => {
                    return toolbox::ToolText {
                        text: revocation::revoked_text(me, client.url()),
                        is_error: true,
                        objectives_changed: false,
                    };
                }
                Ok(response) => plan = next(response),
                Err(e) => {
                    return toolbox::ToolText {
                        text: format!("broker unreachable at {}: {e}", client.url()),
                        is_error: true,
                        objectives_changed: false,
                    };
                }
            },
        }
    }
}

/// After a 401: whether the client's token watch confirms the token was revoked.
async fn revoked(client: &BrokerClient) -> bool {
    match client.token_watch() {
        Some(watch) => watch.confirm(client).await,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_already_live_warning_says_where() {
        use ac7_protocol::session::live::RunnerId;
        let there = RunnerId {
            host: "box-a".into(),
            pid: Some(4242),
        };
        let text = already_live_warning("builder", 1, std::slice::from_ref(&there), "box-b");
        assert_eq!(
            text,
            "ac7: warning: member builder is already live on the broker: a runner on host box-a (pid 4242). Every runner of a member gets the same messages and each agent acts on them; stop the other one unless you mean to run both."
        );
        let gone = RunnerId {
            host: "box-b".into(),
            pid: Some(999_999_999),
        };
        let text = already_live_warning("builder", 3, &[there, gone], "box-b");
        assert!(
            text.contains("a runner on host box-b (pid 999999999, no longer running: the broker drops its stream soon)"),
            "{text}"
        );
        assert!(
            text.contains(
                "; 1 stream that did not say where it runs (a browser, or an older runner)."
            ),
            "{text}"
        );
    }

    #[test]
    fn claude_flags_are_added_unless_given() {
        let user = vec!["--model".to_owned(), "opus".to_owned()];
        assert_eq!(
            claude_flags(&user, "be brief"),
            [
                "--dangerously-load-development-channels",
                "server:ac7",
                "--append-system-prompt",
                "be brief",
                "--model",
                "opus"
            ]
        );
        let user = vec![
            "--append-system-prompt".to_owned(),
            "mine".to_owned(),
            "--dangerously-load-development-channels".to_owned(),
            "server:x".to_owned(),
        ];
        assert_eq!(claude_flags(&user, "be brief"), user);
        assert_eq!(
            claude_flags(&[], ""),
            ["--dangerously-load-development-channels", "server:ac7"]
        );
    }
}
