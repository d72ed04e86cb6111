//! The runner's lifecycle as processes see it: a revoked token, signals reaching the agent's
//! process group with SIGKILL after the grace, the agent dying with a killed runner, leftovers of
//! dead runners, and a second runner for a live member. Real broker, real `ac7 run`.

#![allow(clippy::unwrap_used)]

use crate::broker_support;
use crate::common;
use crate::runner_e2e::{agent_script, assert_restored, config_dir};

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use broker_support::{TestBroker, start_broker};
use common::{python, within};
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

/// `ac7 run` for `member` in `dir` (socket `dir/r.sock`, `TMPDIR` = `tmp`), running `agent`;
/// stderr piped.
fn run(
    broker: &TestBroker,
    member: &str,
    dir: &Path,
    tmp: &Path,
    flags: &[&str],
    agent: &[&std::ffi::OsStr],
    env: &[(&str, &str)],
) -> Child {
    let mut cmd = Command::new(common::ac7());
    cmd.args(["run", "--url", &broker.url, "--socket"])
        .arg(dir.join("r.sock"))
        .args(flags)
        .arg("--")
        .args(agent)
        .current_dir(dir)
        .env("AC7_TOKEN", broker.token(member))
        .env("AC7_TEST_WORK", dir)
        .env("AC7_LOG", "warn")
        .env("TMPDIR", tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// A shell agent: `sh -c <script>`.
fn sh(script: &str) -> Vec<std::ffi::OsString> {
    vec!["sh".into(), "-c".into(), script.into()]
}

fn os(args: &[std::ffi::OsString]) -> Vec<&std::ffi::OsStr> {
    args.iter().map(std::ffi::OsString::as_os_str).collect()
}

/// Everything `child` writes to stderr, once it closes.
fn collect_stderr(child: &mut Child) -> JoinHandle<String> {
    let mut stderr = child.stderr.take().unwrap();
    tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    })
}

/// The pid an agent script wrote to `dir/<file>`.
async fn read_pid(dir: &Path, file: &str) -> u32 {
    let path = dir.join(file);
    common::wait_until(
        &format!("the agent to write {file}"),
        Duration::from_secs(30),
        async || {
            std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| t.trim().parse().ok())
        },
    )
    .await
}

/// Whether `pid` is gone: no such process, or a zombie nobody reaped yet (it runs no more).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

fn signal(child: &Child, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()).unwrap();
    rustix::process::kill_process(pid, sig).unwrap();
}

async fn exit_status(child: &mut Child, secs: u64, what: &str) -> std::process::ExitStatus {
    within(secs, what, child.wait()).await.unwrap()
}

/// A rotated token (the member's old token revoked) stops the runner: a tool call says so, the
/// agent gets a channel notice, one line on stderr names the member and the way back, the config
/// is restored, and the runner exits 77 within 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_stops_the_runner_with_exit_code_77() {
    let broker = start_broker().await;
    let dir = config_dir();
    let tmp = common::tempdir();
    let agent = [
        python().into_os_string(),
        agent_script().into_os_string(),
        "messages".into(),
    ];
    let mut child = run(
        &broker,
        "builder",
        dir.path(),
        tmp.path(),
        &[],
        &os(&agent),
        &[("AC7_TEST_EXPECT", "a message that never comes")],
    );
    let stderr = collect_stderr(&mut child);
    common::wait_until(
        "the agent to be listening",
        Duration::from_secs(30),
        async || dir.path().join("ready").exists(),
    )
    .await;
    // A bridge from outside the agent (as `claude mcp list` starts one), to call a tool with.
    let mut outsider = common::Bridge::spawn(&dir.path().join("r.sock"));
    outsider.initialize().await;

    let rotated = broker
        .post("/members/builder/rotate-token", "director", json!({}))
        .await;
    assert_eq!(rotated.status, 200, "{}", rotated.text);
    let revoked_at = Instant::now();
    let answer = outsider
        .request(
            json!(7),
            "tools/call",
            json!({"name": "roster", "arguments": {}}),
        )
        .await;
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("builder's token was revoked"), "{text}");
    assert!(
        text.contains(&format!("ac7 connect --url {}", broker.url)),
        "{text}"
    );

    let status = exit_status(&mut child, 20, "the runner to exit after the revocation").await;
    eprintln!(
        "the runner exited {:?} after the rotation",
        revoked_at.elapsed()
    );
    assert_eq!(status.code(), Some(77));
    let stderr = stderr.await.unwrap();
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("ac7: the token of member builder was revoked"))
        .collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(
        lines[0].contains(&format!("ac7 connect --url {}", broker.url))
            && lines[0].contains("ac7 member rotate-token builder")
            && lines[0].contains("code 77"),
        "{}",
        lines[0]
    );
    let received = std::fs::read_to_string(dir.path().join("received.txt")).unwrap_or_default();
    assert!(
        received.contains("builder's token was revoked"),
        "the agent was told: {received:?}"
    );
    assert_restored(dir.path());
}

/// SIGTERM goes to the agent's whole process group; an agent (and its child) ignoring it get
/// SIGKILL when the grace (`AC7_KILL_GRACE`, as `--kill-grace`) is over, and the runner exits
/// 137 instead of waiting for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_ignores_sigterm_is_killed_after_the_grace() {
    let broker = start_broker().await;
    let dir = config_dir();
    let tmp = common::tempdir();
    let agent = sh(
        "trap '' TERM; sleep 1000 & echo $! > child.pid; echo $$ > agent.pid; while :; do wait; done",
    );
    let mut child = run(
        &broker,
        "builder",
        dir.path(),
        tmp.path(),
        &[],
        &os(&agent),
        &[("AC7_KILL_GRACE", "2")],
    );
    let agent_pid = read_pid(dir.path(), "agent.pid").await;
    let child_pid = read_pid(dir.path(), "child.pid").await;
    signal(&child, rustix::process::Signal::TERM);
    let sent = Instant::now();
    let status = exit_status(&mut child, 15, "the runner to exit after the grace").await;
    eprintln!("the runner exited {:?} after SIGTERM", sent.elapsed());
    assert_eq!(status.code(), Some(128 + 9), "the agent died of SIGKILL");
    assert!(gone(agent_pid), "the agent is gone");
    common::wait_until(
        "the agent's child to be gone",
        Duration::from_secs(5),
        async || gone(child_pid),
    )
    .await;
    assert_restored(dir.path());
}

/// SIGINT and SIGTERM reach every process of the agent's group, not just the agent; what of the
/// group outlives the agent gets SIGKILL at the end of the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_reach_the_agents_whole_process_group() {
    let broker = start_broker().await;
    let tmp = common::tempdir();
    // SIGTERM: the agent's child dies of it with the agent (the grace is long: no SIGKILL).
    let dir = config_dir();
    let agent = sh("sleep 1000 & echo $! > child.pid; echo $$ > agent.pid; wait");
    let mut child = run(
        &broker,
        "builder",
        dir.path(),
        tmp.path(),
        &[],
        &os(&agent),
        &[("AC7_KILL_GRACE", "60")],
    );
    let child_pid = read_pid(dir.path(), "child.pid").await;
    read_pid(dir.path(), "agent.pid").await;
    signal(&child, rustix::process::Signal::TERM);
    let status = exit_status(&mut child, 30, "the runner to exit after SIGTERM").await;
    assert_eq!(status.code(), Some(128 + 15), "the agent died of SIGTERM");
    common::wait_until(
        "the agent's child to die of SIGTERM",
        Duration::from_secs(5),
        async || gone(child_pid),
    )
    .await;
    assert_restored(dir.path());

    // SIGINT: a non-interactive shell's background job ignores it, so it outlives the agent
    // and gets SIGKILL when the grace is over; the runner exits with the agent's 130 after that.
    let dir = config_dir();
    let agent = sh("sleep 1000 & echo $! > child.pid; echo $$ > agent.pid; wait");
    let mut child = run(
        &broker,
        "builder",
        dir.path(),
        tmp.path(),
        &["--kill-grace", "1"],
        &os(&agent),
        &[],
    );
    let child_pid = read_pid(dir.path(), "child.pid").await;
    read_pid(dir.path(), "agent.pid").await;
    signal(&child, rustix::process::Signal::INT);
    let status = exit_status(&mut child, 30, "the runner to exit after SIGINT").await;
    assert_eq!(status.code(), Some(128 + 2), "the agent died of SIGINT");
    assert!(
        gone(child_pid),
        "the straggler was killed before the runner left"
    );
    assert_restored(dir.path());
}

/// The agent dies with the runner even when the runner is killed with SIGKILL (nothing of the
/// runner runs then): the kernel kills it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_dies_with_a_runner_killed_by_sigkill() {
    let broker = start_broker().await;
    let dir = config_dir();
    let tmp = common::tempdir();
    let agent = sh("trap '' TERM HUP INT; echo $$ > agent.pid; while :; do sleep 1; done");
    let mut child = run(
        &broker,
        "builder",
        dir.path(),
        tmp.path(),
        &[],
        &os(&agent),
        &[],
    );
    let agent_pid = read_pid(dir.path(), "agent.pid").await;
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    common::wait_until(
        "the agent to die with its runner",
        Duration::from_secs(5),
        async || gone(agent_pid),
    )
    .await;
}

/// A runner start removes the trace CA and bundle files and the Codex homes that dead runners
/// left, and leaves a live runner's (and anything not named as ac7 names them) alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_start_removes_dead_runners_leftovers() {
    let broker = start_broker().await;
    let dir = config_dir();
    let tmp = common::tempdir();
    let cache = common::tempdir();
    let homes = cache.path().join("ac7/codex");
    std::fs::create_dir_all(&homes).unwrap();
    let dead = 999_999_999u32; // above pid_max: never running
    let live = std::process::id();
    let dead_files = [
        tmp.path().join(format!("ac7-trace-ca-{dead}-0a1b2c3d.pem")),
        tmp.path()
            .join(format!("ac7-trace-bundle-{dead}-0a1b2c3d.pem")),
    ];
    let kept_files = [
        tmp.path().join(format!("ac7-trace-ca-{live}-0a1b2c3d.pem")),
        tmp.path()
            .join(format!("ac7-trace-bundle-{live}-0a1b2c3d.pem")),
        tmp.path().join(format!("ac7-trace-ca-{dead}-mine.pem")),
    ];
    for file in dead_files.iter().chain(&kept_files) {
        std::fs::write(file, "-----BEGIN CERTIFICATE-----\n").unwrap();
    }
    let dead_home = homes.join(format!("ac7-codex-{dead}-0123456789ab"));
    let live_home = homes.join(format!("ac7-codex-{live}-0123456789ab"));
    for home in [&dead_home, &live_home] {
        std::fs::create_dir(home).unwrap();
        std::fs::write(home.join("config.toml"), "# ac7\n").unwrap();
    }

    let mut child = run(
        &broker,
        "builder",
        dir.path(),
        tmp.path(),
        &[],
        &[std::ffi::OsStr::new("true")],
        &[("XDG_CACHE_HOME", cache.path().to_str().unwrap())],
    );
    let stderr = collect_stderr(&mut child);
    let status = exit_status(&mut child, 30, "the runner").await;
    assert_eq!(status.code(), Some(0), "{}", stderr.await.unwrap());
    for file in &dead_files {
        assert!(!file.exists(), "{} is removed", file.display());
    }
    for file in &kept_files {
        assert!(file.exists(), "{} is kept", file.display());
    }
    assert!(
        !dead_home.exists(),
        "the dead runner's Codex home is removed"
    );
    assert!(
        live_home.join("config.toml").exists(),
        "a live runner's Codex home is kept"
    );
}

/// A second runner for a member whose first runner is live warns, naming the first's host and
/// pid (the roster shows where each live stream runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_runner_warns_where_the_first_runs() {
    let broker = start_broker().await;
    let tmp = common::tempdir();
    let first_dir = config_dir();
    let agent = sh("touch ready; while [ ! -e stop ]; do sleep 0.1; done");
    let mut first = run(
        &broker,
        "builder",
        first_dir.path(),
        tmp.path(),
        &[],
        &os(&agent),
        &[],
    );
    let first_pid = first.id().unwrap();
    let host = ac7_runtime::runner::lifecycle::host_name();
    common::wait_until(
        "the first runner's live stream on the roster",
        Duration::from_secs(30),
        async || {
            let roster = broker.get("/roster", "director").await;
            let entry = roster.json["connected"]
                .as_array()
                .and_then(|all| all.iter().find(|p| p["name"] == "builder"))
                .cloned()?;
            (entry["connected"] == 1).then_some(entry)
        },
    )
    .await;
    let roster = broker.get("/roster", "director").await;
    let entry = roster.json["connected"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "builder")
        .unwrap()
        .clone();
    assert_eq!(
        entry["runners"],
        json!([{"host": host, "pid": first_pid}]),
        "{entry}"
    );

    let second_dir = config_dir();
    let mut second = run(
        &broker,
        "builder",
        second_dir.path(),
        tmp.path(),
        &[],
        &[std::ffi::OsStr::new("true")],
        &[],
    );
    let stderr = collect_stderr(&mut second);
    let status = exit_status(&mut second, 30, "the second runner").await;
    let stderr = stderr.await.unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    let warning = stderr
        .lines()
        .find(|l| l.starts_with("ac7: warning: member builder is already live"))
        .unwrap_or_else(|| panic!("no warning: {stderr}"));
    assert!(
        warning.contains(&format!("a runner on host {host} (pid {first_pid})")),
        "{warning}"
    );

    std::fs::write(first_dir.path().join("stop"), "").unwrap();
    let status = exit_status(&mut first, 30, "the first runner").await;
    assert_eq!(status.code(), Some(0));
}

/// With a terminal (an interactive `ac7 claude-code`), the agent's own process group is made
/// the terminal's foreground group, so the agent reads the terminal instead of being stopped by
/// SIGTTIN. Runs the runner under a pty (`script`), typing a line for the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_terminal_the_agent_reads_it() {
    use tokio::io::AsyncWriteExt;
    let broker = start_broker().await;
    let dir = config_dir();
    let state = common::tempdir();
    let command = format!(
        "{} run --url {} -- sh -c 'read line; echo \"agent read: $line\"'",
        common::ac7(),
        broker.url
    );
    let mut child = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .current_dir(dir.path())
        .env("AC7_TOKEN", broker.token("builder"))
        .env("XDG_STATE_HOME", state.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"typed by hand\n").await.unwrap();
    stdin.flush().await.unwrap();
    // stdin stays open until the end: at its EOF `script` would end the session.
    let out = within(30, "the runner under a pty", child.wait_with_output())
        .await
        .unwrap();
    drop(stdin);
    let screen = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{screen}");
    assert!(screen.contains("agent read: typed by hand"), "{screen}");
    assert_restored(dir.path());
}
