//! `ac7 claude-code` with the real Claude Code, interactive, in a terminal: tmux (its own server
//! on a socket in the test's directory) runs the runner in a 200×50 pane, the test reads the
//! screen and types. Claude Code is `@anthropic-ai/claude-code` from npm (installed once into
//! `<target dir>/tmp/claude-npm`; `$AC7_TEST_CLAUDE` points at another binary), with a home of
//! its own (`.claude.json` says onboarding is done, the folder is trusted, the API key is
//! approved and channels are on), talking to a local stand-in for the Messages API that records
//! every request body; the broker is a real one on 127.0.0.1.
//!
//! Without tmux the test skips with a loud message, except under `CI=true` where it fails.

#![allow(clippy::unwrap_used)]

use crate::broker_support;
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use broker_support::{TestBroker, start_broker};
use common::messages_api::{self, Seen};
use common::within;
use serde_json::json;

/// Every `/v1/messages` request body the stand-in got, in order.
type Bodies = Arc<Mutex<Vec<String>>>;

/// Starts the Messages API stand-in (see [`messages_api`]), recording bodies; returns its URL.
async fn stand_in(bodies: Bodies) -> String {
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route(
            "/v1/messages",
            axum::routing::post(move |body: Bytes| {
                bodies
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&body).into_owned());
                messages_api::messages(seen.clone(), body)
            }),
        )
        .route(
            "/",
            axum::routing::any(|| async { axum::http::StatusCode::OK }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// A tmux server of the test's own, with one session.
struct Tmux {
    socket: PathBuf,
    /// Where the pane's shell writes the program's exit status.
    status: PathBuf,
}

impl Tmux {
    /// Whether tmux can run here; without it the test skips (fails under `CI=true`).
    fn available() -> bool {
        let found = Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            assert!(
                !std::env::var("CI").is_ok_and(|v| v == "true"),
                "tmux is needed for the interactive Claude Code test (Debian: tmux)"
            );
            eprintln!("SKIPPED: tmux is not installed (Debian: tmux)");
        }
        found
    }

    /// Runs `argv` in a new 200×50 session in `cwd`, its environment exactly `env` (plus `PATH`),
    /// under `sh` as a shell runs a command: a child of the pane's process, so that when it stops
    /// itself it stays stopped until continued (tmux continues a pane's own process at once).
    /// The pane stays once the program ended, so its last screen can be read.
    fn start(dir: &Path, cwd: &Path, env: &[(&str, String)], argv: &[String]) -> Self {
        let socket = dir.join("tmux.sock");
        // The shell writes the exit status down: tmux can mark the pane dead without ever
        // reaping its process (seen with 3.3a), and then has no status to give.
        let status = dir.join("exit-status");
        let script = format!(
            r#""$@"; s=$?; echo "$s" > '{}'; exit "$s""#,
            status.display()
        );
        let mut command = vec!["sh".to_owned(), "-c".to_owned(), script];
        command.extend(["sh", "env", "-i"].map(str::to_owned));
        command.push(format!(
            "PATH={}",
            std::env::var("PATH").unwrap_or_default()
        ));
        command.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        command.extend(argv.iter().cloned());
        let spawned = Command::new("tmux")
            .arg("-S")
            .arg(&socket)
            .args([
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-s",
                "t",
                "-x",
                "200",
            ])
            .args(["-y", "50", "-c"])
            .arg(cwd)
            .args(command)
            .args([";", "set-option", "-t", "t", "remain-on-exit", "on"])
            .status()
            .unwrap();
        assert!(spawned.success(), "tmux new-session");
        Self { socket, status }
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The whole screen and its scrollback, wrapped lines joined.
    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-J", "-S", "-", "-t", "t"])
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "t"];
        args.extend(keys);
        self.tmux(&args);
    }

    /// The pane's process (`sh`).
    fn pid(&self) -> u32 {
        self.tmux(&["display-message", "-p", "-t", "t", "#{pane_pid}"])
            .trim()
            .parse()
            .unwrap()
    }

    /// The program's exit status once it ended and tmux has read all it printed.
    fn exited(&self) -> Option<i32> {
        let dead = self.tmux(&["display-message", "-p", "-t", "t", "#{pane_dead}"]);
        if dead.trim() != "1" {
            return None;
        }
        std::fs::read_to_string(&self.status)
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    async fn wait_for_screen(&self, what: &str, secs: u64, text: &str) {
        let found = common::wait_until_showing(
            what,
            Duration::from_secs(secs),
            || self.screen(),
            async || self.screen().contains(text),
        );
        found.await;
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .status();
    }
}

/// The only child of process `pid` (Linux `/proc/<pid>/task/<pid>/children`).
fn child_of(pid: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

/// Claude Code's home: onboarding done, `work` trusted, the `dummy` API key approved, channels
/// on; project MCP servers (the runner's `.mcp.json`) approved in `work/.claude`.
fn claude_home(home: &Path, work: &Path) {
    let config = json!({
        "hasCompletedOnboarding": true,
        "cachedGrowthBookFeatures": {"tengu_harbor": true},
        "customApiKeyResponses": {"approved": ["dummy"], "rejected": []},
        "projects": {work.to_str().unwrap(): {
            "hasTrustDialogAccepted": true,
            "hasCompletedProjectOnboarding": true,
        }},
    });
    std::fs::write(home.join(".claude.json"), config.to_string()).unwrap();
    std::fs::create_dir_all(work.join(".claude")).unwrap();
    std::fs::write(
        work.join(".claude/settings.local.json"),
        r#"{"enableAllProjectMcpServers": true}"#,
    )
    .unwrap();
}

/// The runner's log file, once it exists.
fn runner_log(state: &Path, runner: u32) -> String {
    std::fs::read_to_string(state.join(format!("ac7/runner-{runner}.log"))).unwrap_or_default()
}

/// The last `n` lines of `text`, for failure messages.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `ac7 claude-code` in tmux with the real Claude Code; returns the terminal and the runner's
/// log directory (`XDG_STATE_HOME`).
fn start_claude_code(dir: &Path, broker: &TestBroker, api: &str) -> (Tmux, PathBuf) {
    let [home, work, tmp, state] = ["home", "work", "tmp", "state"].map(|d| {
        let path = dir.join(d);
        std::fs::create_dir_all(&path).unwrap();
        path.canonicalize().unwrap()
    });
    claude_home(&home, &work);
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    let env = [
        ("HOME", path(&home)),
        ("TMPDIR", path(&tmp)),
        ("XDG_STATE_HOME", path(&state)),
        ("TERM", "xterm-256color".to_owned()),
        ("LANG", "C.UTF-8".to_owned()),
        ("AC7_TOKEN", broker.token("builder").to_owned()),
        ("AC7_LOG", "debug".to_owned()),
        ("CLAUDE_PATH", path(&common::npm::claude())),
        ("ANTHROPIC_BASE_URL", api.to_owned()),
        ("ANTHROPIC_API_KEY", "dummy".to_owned()),
        ("CLAUDE_CODE_PROVIDER_MANAGED_BY_HOST", "1".to_owned()),
        // Not CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: it turns the channels feature off.
        ("DISABLE_AUTOUPDATER", "1".to_owned()),
    ];
    let argv = [
        common::ac7().to_owned(),
        "claude-code".to_owned(),
        "--url".to_owned(),
        broker.url.clone(),
        "--no-trace".to_owned(),
    ];
    (Tmux::start(dir, &work, &env, &argv), state)
}

/// The real Claude Code is stopped (SIGSTOP) for 500 ms right after it got the answer to its
/// first `tools/list`, with a DM queued for it since before it started: the DM still reaches it
/// (it shows up in the model request the DM starts). The runner sees its agent stopped and stops
/// itself too, as on Ctrl-Z; SIGCONT to the runner 500 ms later is the shell's `fg`: it continues
/// Claude. When Claude Code exits it prints
/// `claude --resume <id>`, and the runner's next line is `ac7 claude-code … -- --resume <id>`
/// with the same id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_queued_at_start_reaches_claude_stopped_after_its_handshake_and_the_resume_hint_keeps_ac7()
 {
    if !Tmux::available() {
        return;
    }
    let bodies: Bodies = Arc::default();
    let api = stand_in(bodies.clone()).await;
    let broker = start_broker().await;
    let dir = common::tempdir();
    let (tmux, state) = start_claude_code(dir.path(), &broker, &api);

    // Claude asks to confirm the development channels before it starts its MCP servers.
    tmux.wait_for_screen(
        "the development channels warning",
        60,
        "I am using this for local development",
    )
    .await;
    // `env` execs the runner.
    let runner = child_of(tmux.pid()).expect("the runner runs under sh");
    let body = "please review the parser change (queued at start)";
    let dm = broker
        .push("director", json!({"to": "builder", "body": body}))
        .await;
    common::wait_until(
        "the runner to take the DM from its stream",
        Duration::from_secs(10),
        async || {
            let b = broker.get("/briefing", "builder").await;
            b.json["deliveredThrough"] == dm["id"]
        },
    )
    .await;
    tmux.keys(&["Enter"]);

    // The first tools/list answered (the runner logs it), then Claude stopped for 500 ms.
    let claude = within(60, "the first tools/list answer", async {
        loop {
            let log = runner_log(&state, runner);
            if log
                .lines()
                .any(|l| l.contains("request answered") && l.contains("tools/list"))
            {
                return child_of(runner).expect("claude runs under the runner");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    let pid = |pid: u32| rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(pid(claude), rustix::process::Signal::STOP).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    rustix::process::kill_process(pid(runner), rustix::process::Signal::CONT).unwrap();

    common::wait_until_showing(
        "the DM in a model request",
        Duration::from_secs(30),
        || {
            format!(
                "screen:\n{}\nrunner log:\n{}",
                tmux.screen(),
                runner_log(&state, runner)
            )
        },
        async || bodies.lock().unwrap().iter().any(|b| b.contains(body)),
    )
    .await;

    // Once the turn the DM started is over, leave with Ctrl-D twice. Not `/exit` + Enter: on a
    // loaded machine the Enter can land while the slash-command menu still highlights another
    // command (`/clear` starts a new, empty session, and nothing is left to resume). Not Ctrl-C:
    // one that arrives after Claude has left interrupts the runner's shell. A Ctrl-D that
    // arrives late is harmless; every 10 s until the program has ended, twice again.
    tmux.wait_for_screen("the model's answer", 60, "hello from the stand-in")
        .await;
    let typed = std::cell::Cell::new(std::time::Instant::now() - Duration::from_secs(10));
    let status = common::wait_until_showing(
        "the runner to exit",
        Duration::from_secs(60),
        || {
            let log = runner_log(&state, runner);
            format!("{}\nrunner log:\n{}", tmux.screen(), last_lines(&log, 40))
        },
        async || {
            let exited = tmux.exited();
            if exited.is_none() && typed.get().elapsed() >= Duration::from_secs(10) {
                tmux.keys(&["C-d"]);
                tokio::time::sleep(Duration::from_millis(300)).await;
                tmux.keys(&["C-d"]);
                typed.set(std::time::Instant::now());
            }
            exited
        },
    )
    .await;
    let screen = tmux.screen();
    let log = last_lines(&runner_log(&state, runner), 40);
    assert_eq!(status, 0, "{screen}\nrunner log:\n{log}");
    let lines: Vec<&str> = screen
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    // Ours: the session to resume, under ac7. Claude prints its own `claude --resume <id>`
    // just before when its exit takes the usual path (leaving from the slash-command menu it
    // sometimes prints nothing); when it does, ours follows it and names the same session.
    let prefix = format!("ac7 claude-code --url {} -- --resume ", broker.url);
    let at = lines
        .iter()
        .position(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| {
            let sessions = std::fs::read_dir(dir.path().join("home/.claude/sessions"))
                .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>());
            panic!(
                "the runner's resume hint:\n{screen}\nClaude's session files now: {sessions:?}\n\
                 runner log:\n{log}"
            )
        });
    let id = &lines[at][prefix.len()..];
    assert!(uuid::Uuid::parse_str(id).is_ok(), "{screen}");
    let transcript = dir
        .path()
        .join("home/.claude/projects")
        .read_dir()
        .expect("Claude's projects folder")
        .filter_map(Result::ok)
        .any(|project| project.path().join(format!("{id}.jsonl")).is_file());
    assert!(transcript, "no transcript of session {id}:\n{screen}");
    if let Some(claude) = lines.iter().position(|l| l.starts_with("claude --resume ")) {
        assert_eq!(
            lines[claude].trim_start_matches("claude --resume "),
            id,
            "{screen}"
        );
        assert_eq!(claude + 1, at, "{screen}");
    }
}
