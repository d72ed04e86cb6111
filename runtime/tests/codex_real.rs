//! `ac7 codex` against the real OpenAI Codex (`@openai/codex` from npm, installed once into
//! `<repo>/target/codex-npm` under a lock; `$AC7_TEST_CODEX` points at another codex binary).
//! `codex app-server` runs here without a login or network for what is checked: the generated
//! CODEX_HOME makes Codex start our bridge, list our tools and call `roster` through the runner
//! against a real broker (`ac7 codex --doctor`). Model turns are not exercised (they need a model
//! endpoint); the turn routing is tested in `ac7_protocol::codex`.

#![allow(clippy::unwrap_used)]

mod broker_support;
mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use broker_support::start_broker;
use tokio::process::Command;

const CODEX_VERSION: &str = "0.169.0";

fn codex() -> PathBuf {
    static CODEX: OnceLock<PathBuf> = OnceLock::new();
    CODEX
        .get_or_init(|| {
            common::npm::npm_bin(
                "AC7_TEST_CODEX",
                "@openai/codex",
                CODEX_VERSION,
                "codex-npm",
                "codex",
            )
        })
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_starts_our_bridge_lists_our_tools_and_calls_roster() {
    let broker = start_broker().await;
    let cache = common::tempdir();
    let work = common::tempdir();
    let out = common::within(
        90,
        "ac7 codex --doctor",
        Command::new(env!("CARGO_BIN_EXE_ac7"))
            .args(["codex", "--doctor", "--url", &broker.url])
            .current_dir(work.path())
            .env("AC7_TOKEN", broker.token("builder"))
            .env("CODEX_PATH", codex())
            .env("XDG_CACHE_HOME", cache.path())
            .env("AC7_LOG", "warn")
            .output(),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("the ac7 MCP server is running with 19 tools"),
        "{stderr}"
    );
    assert!(stderr.contains("roster through codex: ok"), "{stderr}");
    assert!(
        stderr.contains("- builder (you) [engineer] connected="),
        "{stderr}"
    );
    let homes: Vec<_> = std::fs::read_dir(cache.path().join("ac7/codex"))
        .unwrap()
        .collect();
    assert!(
        homes.is_empty(),
        "the ephemeral CODEX_HOME is removed: {homes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_codex_is_a_clear_start_up_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["codex", "--url", "http://127.0.0.1:9"])
        .env("AC7_TOKEN", "ac7_x")
        .env("CODEX_PATH", "/nonexistent/codex")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("CODEX_PATH=/nonexistent/codex does not exist")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_the_session_with_143_and_removes_codex_home() {
    use tokio::io::AsyncBufReadExt;
    let broker = start_broker().await;
    let cache = common::tempdir();
    let work = common::tempdir();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["codex", "--url", &broker.url])
        .current_dir(work.path())
        .env("AC7_TOKEN", broker.token("builder"))
        .env("CODEX_PATH", codex())
        .env("XDG_CACHE_HOME", cache.path())
        .env("AC7_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    common::within(60, "the codex session to start", async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if line.contains("agent connected") {
                return;
            }
        }
        panic!("ac7 codex ended before its session started");
    })
    .await;
    assert_eq!(
        std::fs::read_dir(cache.path().join("ac7/codex"))
            .unwrap()
            .count(),
        1,
        "CODEX_HOME exists while running"
    );
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = common::within(30, "ac7 codex to exit", child.wait())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(143));
    assert_eq!(
        std::fs::read_dir(cache.path().join("ac7/codex"))
            .unwrap()
            .count(),
        0,
        "CODEX_HOME removed"
    );
}
