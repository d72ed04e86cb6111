//! What ships with the binary: `--version` naming the commit, shell completions and manual
//! pages from the same command tree as `--help`, and output verbs that end quietly when the
//! reader of their pipe goes away.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

use crate::common::served::{serve, token};

const AC7: &str = env!("CARGO_BIN_EXE_ac7");

fn stdout_of(args: &[&str]) -> String {
    let out = Command::new(AC7).args(args).output().unwrap();
    assert!(out.status.success(), "ac7 {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `ac7 --version` is `ac7 <version> (<commit>)`: in a git checkout the commit the binary was
/// built from — HEAD, or an ancestor when commits were made since the build — else
/// `unknown commit`.
#[test]
fn version_names_the_commit() {
    let version = stdout_of(&["--version"]);
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_owned())
    };
    let prefix = format!("ac7 {} (", env!("CARGO_PKG_VERSION"));
    let named = version
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(")\n"))
        .unwrap_or_else(|| panic!("{version:?}"));
    if git(&["rev-parse", "HEAD"]).is_none() {
        assert_eq!(named, "unknown commit");
        return;
    }
    assert_eq!(named.len(), 12, "{version:?}");
    let full = git(&["rev-parse", "--verify", &format!("{named}^{{commit}}")])
        .unwrap_or_else(|| panic!("{named} is no commit of this checkout"));
    assert!(
        git(&["merge-base", "--is-ancestor", &full, "HEAD"]).is_some(),
        "{named} is not HEAD or one of its ancestors"
    );
}

#[test]
fn completions_for_three_shells_and_manual_pages() {
    for (shell, marker) in [
        ("bash", "complete -F _ac7"),
        ("zsh", "#compdef ac7"),
        ("fish", "complete -c ac7"),
    ] {
        let script = stdout_of(&["completions", shell]);
        assert!(script.contains(marker), "{shell}: {script:.200}");
        for verb in ["serve", "push", "claude-code", "completions"] {
            assert!(script.contains(verb), "{shell} completes {verb}");
        }
        assert!(
            !script.contains("demo-agent"),
            "{shell}: hidden verbs stay hidden"
        );
    }
    let page = stdout_of(&["man"]);
    assert!(page.contains(".TH ac7 1"), "{page:.300}");
    let dir = tempfile::tempdir().unwrap();
    let listed = stdout_of(&["man", "--dir", dir.path().to_str().unwrap()]);
    let push = dir.path().join("ac7-push.1");
    assert!(
        listed.lines().any(|l| l == push.to_str().unwrap()),
        "{listed}"
    );
    let text = std::fs::read_to_string(&push).unwrap();
    assert!(text.contains(".TH ac7-push 1"), "{text:.300}");
    assert!(
        text.contains("\\-\\-body"),
        "the page lists the flags: {text}"
    );
    assert!(!dir.path().join("ac7-demo-agent.1").exists());
}

/// `ac7 history --json | head -c0`: the reader is gone before the verb writes. The verb ends
/// by SIGPIPE, as `cat` does, with nothing on stderr (no panic about a failed print).
#[tokio::test]
async fn a_closed_pipe_ends_an_output_verb_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ac7.db");
    let s = serve(
        &db,
        &[
            "--team-name",
            "pipes",
            "--directive",
            "d",
            "--member",
            "director:lead:admin",
        ],
    );
    let tok = token(&s, "director").to_owned();
    let pushed = Command::new(AC7)
        .args(["push", "--body", "hello", "--broadcast"])
        .env("AC7_URL", &s.url)
        .env("AC7_TOKEN", &tok)
        .output()
        .unwrap();
    assert!(pushed.status.success(), "{pushed:?}");
    for args in [&["history", "--json"][..], &["roster"][..]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(AC7)
            .args(args)
            .env("AC7_URL", &s.url)
            .env("AC7_TOKEN", &tok)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "ac7 {args:?}: {out:?}"
        );
        assert!(
            out.stderr.is_empty(),
            "ac7 {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// `packaging/ac7.service` passes `systemd-analyze verify` without a warning (its `ExecStart`
/// pointed at this build's binary).
#[test]
fn the_systemd_unit_verifies() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: systemd-analyze is not installed, so the unit cannot be verified");
        return;
    }
    let unit = std::fs::read_to_string(repo().join("packaging/ac7.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/local/bin/ac7 serve"),
        "{unit}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ac7.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/ac7", AC7)).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
}

/// The example team config the packaging uses creates a team.
#[test]
fn the_example_team_config_creates_a_team() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ac7.db");
    let config = repo().join("packaging/team.example.json");
    let s = serve(&db, &["--team-config", config.to_str().unwrap()]);
    for member in ["director", "builder", "reviewer"] {
        assert!(token(&s, member).starts_with("ac7_"), "{member}");
    }
}

/// The Dockerfile builds a small non-root image whose broker answers `/healthz`. Needs a Docker
/// daemon that can pull the base images; skipped, saying why, without one.
#[test]
fn the_docker_image_builds_and_serves() {
    let docker = |args: &[&str]| Command::new("docker").args(args).output();
    match docker(&["info", "--format", "{{.ServerVersion}}"]) {
        Ok(out) if out.status.success() => {}
        _ => {
            eprintln!("skipped: no Docker daemon answers, so the image cannot be built");
            return;
        }
    }
    for image in ["rust:1.95-slim-bookworm", "debian:bookworm-slim"] {
        let pulled = docker(&["pull", "--quiet", image]).unwrap();
        if !pulled.status.success() {
            eprintln!(
                "skipped: the base image {image} cannot be pulled ({})",
                String::from_utf8_lossy(&pulled.stderr).trim()
            );
            return;
        }
    }
    let tag = format!("ac7-test:{}", std::process::id());
    let built = Command::new("docker")
        .args(["build", "--quiet", "-t", &tag])
        .arg(repo())
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let user = docker(&["image", "inspect", "--format", "{{.Config.User}}", &tag]).unwrap();
    assert_eq!(String::from_utf8_lossy(&user.stdout).trim(), "ac7:ac7");
    let name = format!("ac7-test-{}", std::process::id());
    let config = repo().join("packaging/team.example.json");
    let run = docker(&[
        "run",
        "-d",
        "--name",
        &name,
        "-p",
        "127.0.0.1::8717",
        "-v",
        &format!("{}:/etc/ac7/team.json:ro", config.display()),
        &tag,
    ])
    .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let port = docker(&["port", &name, "8717/tcp"]).unwrap();
    let addr = String::from_utf8_lossy(&port.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    let mut healthy = false;
    for _ in 0..100 {
        if healthz_ok(&addr) {
            healthy = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = docker(&["rm", "-f", &name]);
    let _ = docker(&["image", "rm", "-f", &tag]);
    assert!(
        healthy,
        "the container's broker never answered /healthz on {addr}"
    );
}

/// `GET /healthz` over a plain socket: whether the answer is a 200.
fn healthz_ok(addr: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut conn) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(2)));
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if conn.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}
