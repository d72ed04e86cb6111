//! The agent's process, from start to end: its own process group, death with the runner, signals
//! with a SIGKILL after a grace, and the terminal.
//!
//! - **Process group.** The agent (`claude`, the `ac7 run` command, `codex app-server`) starts as
//!   the leader of a process group of its own, so that a signal reaches it and everything it
//!   started (its MCP servers, the commands it runs) at once.
//! - **Dying with the runner.** The agent gets `PR_SET_PDEATHSIG` = SIGKILL: when the runner dies,
//!   even of `kill -9`, the kernel kills the agent. The signal fires when the *thread* that forked
//!   the agent ends, so the agent is forked from the runner's main thread (every runner runs one
//!   current-thread tokio runtime on it), which lives as long as the runner. A runner that dies
//!   between the fork and the `prctl` is caught by checking the parent right after it. Only the
//!   agent itself gets the signal; what it started sees its pipes close.
//! - **Signals.** SIGINT, SIGTERM and SIGHUP reaching the runner go to the agent's whole process
//!   group; the runner then gives the group `--kill-grace` (default
//!   [`DEFAULT_KILL_GRACE`]) to end — the agent and whatever of its group outlives it — and sends
//!   SIGKILL to the group when the grace is over. An agent that ignores SIGTERM cannot keep the
//!   runner alive past the grace.
//! - **The terminal.** A process group of its own is not the terminal's foreground group, and a
//!   background process that reads the terminal is stopped (SIGTTIN). So when the runner owns a
//!   terminal as the foreground group (an interactive `ac7 claude-code`), the agent's group is
//!   made the foreground group (in the child, before `exec`), and the runner takes the terminal
//!   back when the agent ends. Ctrl-C and Ctrl-Z then reach the agent's group alone; when the
//!   agent is stopped (Ctrl-Z), the runner takes the terminal back and stops itself, so the shell
//!   sees the job stopped; on `fg` it hands the terminal back and continues the agent.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::sync::OnceLock;
use std::time::Duration;

use ac7_protocol::session::live::RunnerId;
use rustix::process::{Pid, Signal};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::sys::clock::sleep_until;

use crate::client::token_watch::TokenState;

/// The time the agent's process group gets between the forwarded signal and SIGKILL.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);

/// The environment variable `--kill-grace` also reads (seconds).
pub const KILL_GRACE_ENV: &str = "AC7_KILL_GRACE";

/// The longest grace `--kill-grace` takes.
const MAX_KILL_GRACE: Duration = Duration::from_secs(3600);

/// Parses `--kill-grace`: seconds, decimals allowed (`0.5`), at most an hour.
pub fn parse_kill_grace(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("expected seconds (like 10 or 2.5), got `{text}`"))?;
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!(
            "expected a positive number of seconds, got `{text}`"
        ));
    }
    let grace = Duration::from_secs_f64(secs);
    if grace > MAX_KILL_GRACE {
        return Err(format!("at most {} seconds", MAX_KILL_GRACE.as_secs()));
    }
    Ok(grace)
}

/// Where this runner runs, as its live stream tells the broker (`X-AC7-Runner`).
pub fn this_runner() -> &'static RunnerId {
    static ID: OnceLock<RunnerId> = OnceLock::new();
    ID.get_or_init(|| RunnerId {
        host: host_name(),
        pid: Some(std::process::id()),
    })
}

/// The machine's host name (`uname -n`), `localhost` when it has none.
pub fn host_name() -> String {
    let name = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let name = name.trim();
    if name.is_empty() {
        "localhost".to_owned()
    } else {
        name.to_owned()
    }
}

/// Whether process `pid` exists on this machine.
pub fn pid_alive(pid: u32) -> bool {
    pid == std::process::id() || std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// One of the runner's standard descriptors, a terminal whose foreground process group is the
/// runner's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terminal(RawFd);

impl Terminal {
    /// The first of stdin, stdout and stderr that is a terminal the runner's process group
    /// holds in the foreground; `None` when the runner owns no terminal.
    pub(crate) fn owned() -> Option<Self> {
        let me = rustix::process::getpgrp();
        [0, 1, 2].into_iter().map(Terminal).find(|t| {
            t.with_fd(|fd| {
                rustix::termios::isatty(fd) && rustix::termios::tcgetpgrp(fd).is_ok_and(|p| p == me)
            })
        })
    }

    fn with_fd<R>(self, f: impl FnOnce(BorrowedFd<'_>) -> R) -> R {
        match self.0 {
            0 => f(io::stdin().as_fd()),
            1 => f(io::stdout().as_fd()),
            _ => f(io::stderr().as_fd()),
        }
    }

    /// Makes `group` the terminal's foreground process group, from any process group of its
    /// session (SIGTTOU blocked meanwhile, as shells do).
    fn give_to(self, group: Pid) {
        with_ttou_blocked(|| {
            if let Err(e) = self.with_fd(|fd| rustix::termios::tcsetpgrp(fd, group)) {
                tracing::debug!(error = %e, "cannot hand the terminal over");
            }
        });
    }
}

/// Runs `f` with SIGTTOU blocked in this thread.
fn with_ttou_blocked(f: impl FnOnce()) {
    // SAFETY: sigset_t is plain data that sigemptyset initialises; pthread_sigmask only changes
    // this thread's mask, and the old mask is put back.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

/// Sets up `command` as the module docs say: a process group of its own, SIGKILL when the
/// runner dies, and, with `hand_terminal`, the terminal when the runner owns one (not for an
/// agent that never reads it, such as `codex app-server`: the runner keeps Ctrl-C then). Spawn
/// it from the runner's main thread. Returns the terminal handed over, for [`Agent::new`].
pub(crate) fn prepare(
    command: &mut tokio::process::Command,
    hand_terminal: bool,
) -> Option<Terminal> {
    let terminal = if hand_terminal {
        Terminal::owned()
    } else {
        None
    };
    command.process_group(0);
    let parent = rustix::process::getpid();
    let tty = terminal.map(|t| t.0);
    // SAFETY: the closure runs in the child between fork and exec (after std's setpgid for
    // `process_group(0)`). It only makes system calls that are async-signal-safe (prctl,
    // getppid, pthread_sigmask, tcsetpgrp, getpid), allocates nothing (errors are raw OS
    // errors) and takes no lock.
    unsafe {
        command.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            // The runner died before the prctl took effect: nobody will kill us; do not start.
            if rustix::process::getppid() != Some(parent) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            if let Some(fd) = tty {
                let mut block: libc::sigset_t = std::mem::zeroed();
                let mut old: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut block);
                libc::sigaddset(&mut block, libc::SIGTTOU);
                libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
                libc::tcsetpgrp(fd, libc::getpid());
                libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            }
            Ok(())
        });
    }
    terminal
}

/// The agent's process group, once spawned.
#[derive(Debug)]
pub(crate) struct Agent {
    /// The agent's pid, which is also its process group's id.
    pid: Option<Pid>,
    terminal: Option<Terminal>,
}

impl Agent {
    /// The group of the agent `child` started with [`prepare`].
    pub(crate) fn new(child: &tokio::process::Child, terminal: Option<Terminal>) -> Self {
        Self {
            pid: child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .and_then(Pid::from_raw),
            terminal,
        }
    }

    /// Sends `signal` to the whole group.
    pub(crate) fn signal(&self, signal: Signal) {
        if let Some(pid) = self.pid
            && let Err(e) = rustix::process::kill_process_group(pid, signal)
            && e != rustix::io::Errno::SRCH
        {
            tracing::warn!(error = %e, ?signal, "cannot signal the agent's process group");
        }
    }

    /// Whether any process of the group is left.
    pub(crate) fn group_alive(&self) -> bool {
        self.pid.is_some_and(|pid| {
            !matches!(
                rustix::process::test_kill_process_group(pid),
                Err(rustix::io::Errno::SRCH)
            )
        })
    }

    /// Waits until the group is empty or `deadline` passes; then SIGKILLs what is left.
    pub(crate) async fn reap_group(&self, deadline: Instant) {
        while self.group_alive() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if self.group_alive() {
            tracing::warn!("the agent's process group outlived the grace: SIGKILL");
            self.signal(Signal::KILL);
        }
    }

    /// Takes the terminal back from the agent, if it was handed over.
    pub(crate) fn reclaim_terminal(&self) {
        if let Some(terminal) = self.terminal {
            terminal.give_to(rustix::process::getpgrp());
        }
    }

    /// After a SIGCHLD: when the agent was stopped (Ctrl-Z on the terminal it holds), take the
    /// terminal back and stop the runner too; once continued (`fg`), hand the terminal back and
    /// continue the agent's group.
    fn follow_stop(&self) {
        let (Some(pid), Some(terminal)) = (self.pid, self.terminal) else {
            return;
        };
        let stopped = rustix::process::waitid(
            rustix::process::WaitId::Pid(pid),
            rustix::process::WaitIdOptions::STOPPED | rustix::process::WaitIdOptions::NOHANG,
        );
        if !matches!(stopped, Ok(Some(status)) if status.stopped()) {
            return;
        }
        let me = rustix::process::getpgrp();
        let holds = |group: Pid| {
            terminal.with_fd(|fd| rustix::termios::tcgetpgrp(fd).is_ok_and(|p| p == group))
        };
        // Only from the agent: after a `bg` the shell holds the terminal, and keeps it.
        if holds(pid) {
            terminal.give_to(me);
        }
        let _ = rustix::process::kill_process(rustix::process::getpid(), Signal::STOP);
        // Continued: in the foreground (`fg`) the terminal goes back to the agent; in the
        // background (`bg`) the shell keeps it.
        if holds(me) {
            terminal.give_to(pid);
        }
        self.signal(Signal::CONT);
    }
}

/// How the agent's run ended.
#[derive(Debug)]
pub(crate) struct Ended {
    /// The agent's exit status.
    pub(crate) status: io::Result<std::process::ExitStatus>,
    /// The run was ended because the token was revoked.
    pub(crate) revoked: bool,
}

/// Waits for the agent while passing signals on to its group (see the module docs), and stops it
/// when the token is revoked.
pub(crate) struct Supervisor<'a> {
    pub(crate) child: &'a mut tokio::process::Child,
    pub(crate) agent: &'a Agent,
    pub(crate) grace: Duration,
    /// The token watch's state, if the runner has one.
    pub(crate) token: Option<watch::Receiver<TokenState>>,
}

impl Supervisor<'_> {
    /// Runs until the agent exited (and its group is gone, or was killed, when it was being
    /// stopped). `on_revoked` runs once when the token is revoked: tell the agent; it is stopped
    /// [`super::revocation::NOTICE_TIME`] later as if the runner got SIGTERM.
    pub(crate) async fn run(self, mut on_revoked: impl FnMut()) -> io::Result<Ended> {
        use tokio::signal::unix::{SignalKind, signal};
        let Self {
            child,
            agent,
            grace,
            mut token,
        } = self;
        let (mut int, mut term, mut hup, mut chld) = (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
            signal(SignalKind::child())?,
        );
        // When the group gets SIGKILL (set by the first signal passed on).
        let mut kill_at: Option<Instant> = None;
        let mut killed = false;
        // When the group gets SIGTERM after a revocation.
        let mut term_at: Option<Instant> = None;
        let mut revoked = false;
        loop {
            let mut pass_on = None;
            tokio::select! {
                status = child.wait() => {
                    if let Some(deadline) = kill_at.filter(|_| !killed) {
                        agent.reap_group(deadline).await;
                    }
                    agent.reclaim_terminal();
                    return Ok(Ended { status, revoked });
                }
                _ = int.recv() => pass_on = Some(Signal::INT),
                _ = term.recv() => pass_on = Some(Signal::TERM),
                _ = hup.recv() => pass_on = Some(Signal::HUP),
                _ = chld.recv() => agent.follow_stop(),
                () = sleep_until(kill_at.filter(|_| !killed)) => {
                    tracing::warn!(grace_ms = grace.as_millis() as u64, "the agent did not end within the grace: SIGKILL to its process group");
                    agent.signal(Signal::KILL);
                    killed = true;
                }
                () = sleep_until(term_at) => {
                    term_at = None;
                    pass_on = Some(Signal::TERM);
                }
                () = token_revoked(token.as_mut()), if !revoked => {
                    revoked = true;
                    on_revoked();
                    term_at = Some(Instant::now() + super::revocation::NOTICE_TIME);
                }
            }
            if let Some(signal) = pass_on {
                agent.signal(signal);
                if kill_at.is_none() {
                    kill_at = Some(Instant::now() + grace);
                }
            }
        }
    }
}

/// Resolves once the watch says the token is revoked; never without a watch.
pub(crate) async fn token_revoked(token: Option<&mut watch::Receiver<TokenState>>) {
    match token {
        Some(rx) => {
            if rx.wait_for(|s| *s == TokenState::Revoked).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn kill_grace_takes_seconds() {
        assert_eq!(parse_kill_grace("10").unwrap(), Duration::from_secs(10));
        assert_eq!(
            parse_kill_grace("0.25").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(parse_kill_grace("0").unwrap(), Duration::ZERO);
        assert!(parse_kill_grace("-1").is_err());
        assert!(parse_kill_grace("ten").is_err());
        assert!(parse_kill_grace("NaN").is_err());
        assert!(parse_kill_grace("7200").is_err());
    }

    #[test]
    fn the_runner_names_its_host_and_pid() {
        let me = this_runner();
        assert_eq!(me.pid, Some(std::process::id()));
        assert!(!me.host.is_empty());
        assert_eq!(RunnerId::parse(&me.to_header()).as_ref(), Some(me));
    }
}
