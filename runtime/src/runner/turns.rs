//! What the runners that drive their agent in turns over its stdio (`ac7 codex`, `ac7 acp`)
//! share: starting the agent and its banner, what the session loop keeps besides its client
//! machine ([`TurnLoop`]: telling a sender their message was not delivered, the signals that
//! end a session, a revoked token), recording failed turns, and the end of a session — the
//! agent's process group stopped (its signal passed on, SIGKILL after `--kill-grace`), notices
//! in flight awaited, the live stream, the trace host, the activity pipeline and the IPC server
//! closed, and the exit code.

use ac7_protocol::dialect::delivery::{SinkEvent, TurnFailure, Undelivered};
use ac7_protocol::domain::toolbox::{Body, Method, Request};
use ac7_protocol::trace::activity::ActivityEvent;
use tokio::io::AsyncReadExt;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;
use tokio::time::{Duration, Instant};

use super::{StartError, activity, ipc_server, trace};

/// How long the end of a session waits for "not delivered" DMs still in flight.
const NOTICE_GRACE: Duration = Duration::from_secs(5);

/// Why a session ended.
#[derive(Debug)]
pub(crate) enum End {
    /// The agent exited (or closed its stdout).
    AgentExited,
    /// SIGINT (2) or SIGTERM (15) reached the runner.
    Signal(i32),
    /// The agent could not be started or driven: the reason.
    Failed(String),
    /// `--doctor` is over: whether every check passed.
    Doctor(bool),
    /// The token was revoked.
    Revoked,
}

/// What a session loop keeps besides its client machine and the agent's pipes.
pub(crate) struct TurnLoop {
    /// The agent's stdout is read into this.
    pub(crate) buf: Vec<u8>,
    /// "Not delivered" DMs in flight; awaited (bounded) before the runner leaves the broker.
    pub(crate) notices: tokio::task::JoinSet<()>,
    /// The member the runner runs as.
    pub(crate) me: String,
    /// Where turns are reported (busy, failed turns), when activity is on.
    pub(crate) activity: Option<activity::ActivityHandle>,
    /// SIGINT and SIGTERM.
    pub(crate) signals: Signals,
    /// The token's state, when the broker client watches it.
    pub(crate) token: Option<watch::Receiver<crate::client::token_watch::TokenState>>,
    /// Once the token is revoked: when the session ends (the agent had the notice meanwhile).
    pub(crate) revoked_end: Option<Instant>,
}

impl TurnLoop {
    /// Everything the loop keeps, from the runner's `core`; fails only when the signal
    /// handlers cannot be installed.
    pub(crate) fn start(core: &super::Core) -> Result<TurnLoop, StartError> {
        Ok(TurnLoop {
            buf: vec![0u8; 64 * 1024],
            notices: tokio::task::JoinSet::new(),
            me: core.briefing.name.clone(),
            activity: core.activity.as_ref().map(activity::Activity::handle),
            signals: Signals::install()?,
            token: core
                .client
                .token_watch()
                .map(crate::client::token_watch::TokenWatch::subscribe),
            revoked_end: None,
        })
    }

    /// Tells, in the background, the senders of the DMs `agent` did not take.
    pub(crate) fn undelivered(&mut self, core: &super::Core, agent: &str, what: Undelivered) {
        self.notices.spawn(tell_sender(
            core.client.clone(),
            self.me.clone(),
            agent.to_owned(),
            what,
        ));
    }

    /// The token was revoked: says so on stderr and to the agent (through `agent_events`), and
    /// ends the session [`super::revocation::NOTICE_TIME`] later.
    pub(crate) fn revoked(
        &mut self,
        core: &super::Core,
        agent_events: &tokio::sync::mpsc::UnboundedSender<SinkEvent>,
    ) {
        let url = core.client.url();
        eprintln!("{}", super::revocation::revoked_line(&self.me, url));
        let notice = super::revocation::revoked_notice(&self.me, url);
        let _ = agent_events.send(SinkEvent::from_message(&notice, &self.me));
        self.revoked_end = Some(Instant::now() + super::revocation::NOTICE_TIME);
    }
}

/// SIGINT and SIGTERM, for the session loop.
pub(crate) struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    pub(crate) fn install() -> Result<Self, StartError> {
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(int), Ok(term)) => Ok(Self { int, term }),
            _ => Err(StartError::System("cannot install signal handlers".into())),
        }
    }

    /// The next signal's number.
    pub(crate) async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => 2,
            _ = self.term.recv() => 15,
        }
    }
}

/// Reads what the agent wrote; `None` at its end (or with no pipe).
pub(crate) async fn read_some(
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

/// DMs the sender of events the agent (called `agent` in the text) did not take, as member `me`.
async fn tell_sender(
    broker: crate::client::BrokerClient,
    me: String,
    agent: String,
    undelivered: Undelivered,
) {
    let request = Request {
        method: Method::Post,
        path: "/push".into(),
        body: Body::Json(undelivered.push_body_for(&me, &agent)),
    };
    match broker.execute(&request).await {
        Ok(response) if response.status < 300 => {
            tracing::info!(to = undelivered.to, msg_ids = ?undelivered.msg_ids, "told the sender their message was not delivered");
        }
        Ok(response) => tracing::warn!(
            to = undelivered.to,
            status = response.status,
            body = %String::from_utf8_lossy(&response.body),
            "could not tell the sender their message was not delivered"
        ),
        Err(e) => {
            tracing::warn!(to = undelivered.to, error = %e, "could not tell the sender their message was not delivered")
        }
    }
}

/// Logs a failed turn of `agent` and records it as a `turn_failed` activity event.
pub(crate) fn turn_failed(
    activity: Option<&activity::ActivityHandle>,
    agent: &str,
    failure: TurnFailure,
) {
    tracing::warn!(
        turn_id = failure.turn_id,
        reason = failure.reason,
        msg_ids = ?failure.msg_ids,
        "a {agent} turn failed"
    );
    if let Some(activity) = activity {
        activity.record(ActivityEvent::TurnFailed {
            ts: crate::sys::clock::now_ms(),
            turn_id: failure.turn_id,
            reason: failure.reason,
            msg_ids: failure.msg_ids,
        });
    }
}

/// What a session closes when it ends, besides its agent.
pub(crate) struct Closing {
    /// The command, for the line a failure prints (`ac7 <command>: <reason>`).
    pub(crate) command: &'static str,
    /// The agent's name in the shutdown reason (`<agent>-exited-<code>`, `<agent>-failed`).
    pub(crate) agent: &'static str,
    pub(crate) kill_grace: Duration,
    pub(crate) notices: tokio::task::JoinSet<()>,
    pub(crate) stop_stream: watch::Sender<bool>,
    pub(crate) trace: Option<trace::TraceHost>,
    pub(crate) activity: Option<activity::Activity>,
    pub(crate) server: ipc_server::ServerTask,
}

/// Ends the session: the agent's group gets the signal that ended it (SIGTERM after a
/// revocation; nothing else after any other end: its stdin closing is its cue), SIGKILL when
/// the grace is over; then everything in `closing` is closed. Returns the exit code: `128 + n`
/// for signal `n`, 2 for a failure, 0/1 for `--doctor`, [`super::revocation::EXIT_REVOKED`], or
/// the agent's own.
pub(crate) async fn finish(
    end: End,
    child: &mut tokio::process::Child,
    agent: &super::lifecycle::Agent,
    mut closing: Closing,
) -> i32 {
    let deadline = Instant::now() + closing.kill_grace;
    match &end {
        End::Signal(n) => agent.signal(
            rustix::process::Signal::from_named_raw(*n).unwrap_or(rustix::process::Signal::TERM),
        ),
        End::Revoked => agent.signal(rustix::process::Signal::TERM),
        _ => {}
    }
    let status = match tokio::time::timeout_at(deadline, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            tracing::warn!(
                agent = closing.agent,
                "the agent did not end within the grace: SIGKILL to its process group"
            );
            agent.signal(rustix::process::Signal::KILL);
            child.wait().await
        }
    };
    agent.reap_group(deadline).await;
    let notices = std::mem::take(&mut closing.notices);
    let _ = tokio::time::timeout(NOTICE_GRACE, notices.join_all()).await;
    let _ = closing.stop_stream.send(true);
    let name = closing.agent;
    let (code, reason) = match &end {
        End::Signal(n) => (128 + n, format!("signal-{n}")),
        End::Failed(reason) => {
            eprintln!("ac7 {}: {reason}", closing.command);
            (2, format!("{name}-failed"))
        }
        End::Doctor(ok) => (i32::from(!ok), "doctor".to_owned()),
        End::Revoked => (super::revocation::EXIT_REVOKED, "token-revoked".to_owned()),
        End::AgentExited => {
            let code = super::exit_code(status);
            (code, format!("{name}-exited-{code}"))
        }
    };
    // The proxy first: its unfinished exchanges reach the pipeline before it drains.
    if let Some(trace) = closing.trace {
        trace.close().await;
    }
    if let Some(activity) = closing.activity {
        activity.shutdown().await;
    }
    closing.server.shutdown(Some(&reason)).await;
    code
}

/// Starts the agent a turn-driven runner drives over its stdio: stdin and stdout piped, stderr
/// the runner's (none under `--doctor`), its process group ready to be signalled, and its pid
/// registered so that the bridges its process tree starts are its own.
pub(crate) fn spawn_agent(
    command: &mut tokio::process::Command,
    doctor: bool,
    core: &super::Core,
) -> std::io::Result<(tokio::process::Child, super::lifecycle::Agent)> {
    crate::sys::rlimit::restore_fd_limit_in_child(command);
    super::lifecycle::prepare(command, false);
    let child = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(if doctor {
            std::process::Stdio::null()
        } else {
            std::process::Stdio::inherit()
        })
        .kill_on_drop(true)
        .spawn()?;
    if let Some(pid) = child.id() {
        core.agent.set(pid);
    }
    let agent = super::lifecycle::Agent::new(&child, None);
    Ok((child, agent))
}

/// Prints the runner's banner once its agent started: `ac7 <dialect>: <name> (<role>) on
/// team <team> — <place>`.
pub(crate) fn banner(core: &super::Core, dialect: &str, place: &str) {
    let b = &core.briefing;
    eprintln!(
        "ac7 {dialect}: {} ({}) on team {} — {place}",
        b.name, b.role.title, b.team.name
    );
}

/// The member's live events as the client machine takes them: the stream started in `mode`,
/// each message rendered for the agent. Returns a sender for notices the session adds, the
/// events, and the stream's stop switch.
pub(crate) fn live_events(
    core: &super::Core,
    mode: super::StreamMode,
) -> (
    tokio::sync::mpsc::UnboundedSender<SinkEvent>,
    tokio::sync::mpsc::UnboundedReceiver<SinkEvent>,
    watch::Sender<bool>,
) {
    let (tx, events) = tokio::sync::mpsc::unbounded_channel::<SinkEvent>();
    let notices = tx.clone();
    let (me, tracker) = (core.briefing.name.clone(), core.tracker.clone());
    let stop = core.start_stream(
        mode,
        super::forwarder::agent_sink(me.clone(), tracker, move |message| {
            let _ = tx.send(SinkEvent::from_message(message, &me));
        }),
    );
    (notices, events, stop)
}
