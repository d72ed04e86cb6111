//! `ac7 serve --config FILE` (or `AC7_CONFIG`): settings from a TOML file, below the command
//! line and the environment, and mistakes in the file named with their line.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const AC7: &str = env!("CARGO_BIN_EXE_ac7");

const CONFIG: &str = "# the broker's settings\n\
db = \"from-file.db\"\n\
team-name = \"toml-team\"\n\
directive = \"Configured by a file.\"\n\
member = [\"director:lead:admin\", \"builder:engineer\"]\n\
max-file-bytes = 4096\n";

/// `ac7 serve` in `dir` with `args` and `env` (the serve variables otherwise unset), until it
/// listens; returns its stdout up to the listening line. The broker is stopped afterwards.
fn serve_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Vec<String> {
    let mut cmd = Command::new(AC7);
    cmd.arg("serve")
        .args(args)
        .current_dir(dir)
        .env("AC7_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for var in ["AC7_DB", "AC7_HOST", "AC7_PORT", "AC7_CONFIG"] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let listening = loop {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => {
                let done = line.starts_with("ac7 broker listening on ");
                lines.push(line);
                if done {
                    break true;
                }
            }
            Err(_) => break false,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(listening, "ac7 serve did not listen: {lines:?}");
    lines
}

#[test]
fn the_config_file_sits_below_flags_and_environment() {
    // The file alone: its database, team and members.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ac7.toml"), CONFIG).unwrap();
    let lines = serve_in(dir.path(), &["--config", "ac7.toml", "--port", "0"], &[]);
    assert!(
        lines
            .iter()
            .any(|l| l == "created team 'toml-team' in from-file.db"),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.trim_start().starts_with("builder ")),
        "{lines:?}"
    );
    assert!(dir.path().join("from-file.db").exists());

    // The environment wins over the file (and AC7_CONFIG names the file).
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ac7.toml"), CONFIG).unwrap();
    serve_in(
        dir.path(),
        &["--port", "0"],
        &[("AC7_CONFIG", "ac7.toml"), ("AC7_DB", "from-env.db")],
    );
    assert!(dir.path().join("from-env.db").exists());
    assert!(!dir.path().join("from-file.db").exists());

    // The command line wins over both.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ac7.toml"), CONFIG).unwrap();
    serve_in(
        dir.path(),
        &[
            "--config",
            "ac7.toml",
            "--port",
            "0",
            "--db",
            "from-flag.db",
        ],
        &[("AC7_DB", "from-env.db")],
    );
    assert!(dir.path().join("from-flag.db").exists());
    assert!(!dir.path().join("from-env.db").exists());
    assert!(!dir.path().join("from-file.db").exists());
}

#[test]
fn mistakes_in_the_config_file_name_the_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let run = |text: &str| {
        std::fs::write(dir.path().join("bad.toml"), text).unwrap();
        let out = Command::new(AC7)
            .args(["serve", "--config", "bad.toml", "--port", "0"])
            .current_dir(dir.path())
            .env_remove("AC7_DB")
            .env_remove("AC7_CONFIG")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run("port = 0\n\ncolour = \"red\"\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.starts_with("ac7: bad.toml:3: unknown key `colour`"),
        "{err}"
    );
    let (code, err) = run("db = \"x.db\"\nsync = \"sometimes\"\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.starts_with("ac7: bad.toml:2: sync: invalid value 'sometimes'"),
        "{err}"
    );
    let (code, err) = run("port = [\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.starts_with("ac7: bad.toml is not valid TOML"), "{err}");
    let (code, err) = Command::new(AC7)
        .args(["serve", "--config", "missing.toml"])
        .current_dir(dir.path())
        .output()
        .map(|o| {
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
        .unwrap();
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("cannot read the config file missing.toml"),
        "{err}"
    );
    // Nothing was created by any of them.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["bad.toml"]);
}
