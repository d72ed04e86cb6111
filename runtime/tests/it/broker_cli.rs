//! The real `ac7` binary: `serve` start-up from a team config, durability across
//! `kill -9`, the operator CLI against a running broker, and offline member admin.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::served::{Served, serve, token};

use serde_json::{Value, json};

const AC7: &str = env!("CARGO_BIN_EXE_ac7");

const TEAM: &str = r#"{
  "team": {"name": "cli-team", "directive": "Test the binary."},
  "members": [
    {"name": "director", "role": {"title": "director"}, "permissions": ["admin"]},
    {"name": "builder", "role": {"title": "engineer"}}
  ]
}"#;

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn current_thread_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[tokio::test]
async fn kill_9_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ac7.db");
    let cfg = dir.path().join("team.json");
    std::fs::write(&cfg, TEAM).unwrap();

    // no team and no config: a clear error, non-zero exit
    let out = Command::new(AC7)
        .args(["serve", "--port", "0", "--db"])
        .arg(dir.path().join("empty.db"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no team yet"));

    let mut s = serve(&db, &["--team-config", cfg.to_str().unwrap()]);
    assert_eq!(s.tokens.len(), 2);
    let (director, builder) = (
        token(&s, "director").to_owned(),
        token(&s, "builder").to_owned(),
    );
    let http = client();

    // Acknowledged writes from several concurrent clients.
    let mut handles = Vec::new();
    for c in 0..4 {
        let (http, url, tok) = (http.clone(), s.url.clone(), director.clone());
        handles.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..50 {
                let r = http
                    .post(format!("{url}/push"))
                    .bearer_auth(&tok)
                    .json(&json!({"to": "builder", "body": format!("c{c} m{i}")}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 200);
                ids.push(
                    r.json::<Value>().await.unwrap()["message"]["id"]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                );
            }
            ids
        }));
    }
    let mut acked = Vec::new();
    for h in handles {
        acked.extend(h.await.unwrap());
    }
    let obj: Value = http
        .post(format!("{}/objectives", s.url))
        .bearer_auth(&director)
        .json(&json!({"title": "Survive", "outcome": "still here", "assignee": "builder"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let r = http
        .post(format!(
            "{}/fs/write?path=/builder/keep.txt&mime=text/plain",
            s.url
        ))
        .bearer_auth(&builder)
        .body("kept")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    // SIGKILL: no chance to flush anything.
    s.child.kill().unwrap();
    s.child.wait().unwrap();

    let s2 = serve(&db, &[]);
    assert!(
        s2.tokens.is_empty(),
        "tokens are printed only when the team is created"
    );
    let hist: Value = http
        .get(format!("{}/history?limit=1000", s2.url))
        .bearer_auth(&builder)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let have: std::collections::HashSet<&str> = hist["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    for id in &acked {
        assert!(
            have.contains(id.as_str()),
            "acknowledged message {id} was lost"
        );
    }
    let id = obj["id"].as_str().unwrap();
    let view: Value = http
        .get(format!("{}/objectives/{id}", s2.url))
        .bearer_auth(&builder)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["objective"]["title"], "Survive");
    assert_eq!(view["events"][0]["kind"], "assigned");
    let text = http
        .get(format!("{}/fs/read/builder/keep.txt", s2.url))
        .bearer_auth(&builder)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(text, "kept");
}

/// Runs `cmd` to the end: (exit ok, stdout, stderr).
fn output(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An offline verb (`member …`, `prune …`) against `db`.
fn offline(db: &Path, args: &[&str]) -> (bool, String, String) {
    output(Command::new(AC7).args(args).arg("--db").arg(db))
}

fn ac7(url: &str, token: &str, args: &[&str]) -> (bool, String, String) {
    output(
        Command::new(AC7)
            .args(args)
            .env("AC7_URL", url)
            .env("AC7_TOKEN", token),
    )
}

#[tokio::test]
async fn operator_cli_against_a_running_broker() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ac7.db");
    let s = serve(
        &db,
        &[
            "--team-name",
            "flags-team",
            "--directive",
            "From flags.",
            "--member",
            "director:lead:admin",
            "--member",
            "builder:engineer",
        ],
    );
    let (url, director, builder) = (
        s.url.clone(),
        token(&s, "director").to_owned(),
        token(&s, "builder").to_owned(),
    );
    let run = move |tok: &str, args: &[&str]| ac7(&url, tok, args);

    let (ok, out, err) = run(
        &director,
        &[
            "push", "--body", "hello", "--to", "builder", "--title", "t", "--level", "notice",
            "--data", "k=v",
        ],
    );
    assert!(ok, "{err}");
    assert!(
        out.starts_with("sent ") && out.contains("targets=1"),
        "{out}"
    );
    let (ok, out, _) = run(&director, &["push", "--body", "all hands", "--broadcast"]);
    assert!(ok, "{out}");
    let (ok, _, err) = run(&director, &["push", "--body", "x", "--to", "nobody"]);
    assert!(!ok);
    assert!(err.contains("no such member: nobody"), "{err}");
    // No target is a usage error (exit 2, with the usage line).
    let out = Command::new(AC7)
        .args(["push", "--body", "x"])
        .env("AC7_URL", &s.url)
        .env("AC7_TOKEN", &director)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--to <TO>|--broadcast|--channel <CHANNEL>"),
        "{err}"
    );
    // `--body -` reads the message from standard input.
    let mut child = Command::new(AC7)
        .args(["push", "--to", "builder", "--body", "-"])
        .env("AC7_URL", &s.url)
        .env("AC7_TOKEN", &director)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"from a pipe\nline two\n")
        .unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    let (ok, out, _) = run(&builder, &["history", "--json", "--limit", "1"]);
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["messages"][0]["body"], "from a pipe\nline two");
    let (ok, _, err) = run(&director, &["history", "--with", "nobody"]);
    assert!(!ok);
    assert!(err.contains("no such member: nobody"), "{err}");
    let (ok, _, err) = run(&director, &["push", "--body", "x", "--channel", "nope"]);
    assert!(!ok);
    assert!(err.contains("no such channel: nope"), "{err}");
    let (ok, _, err) = run("ac7_wrong", &["roster"]);
    assert!(!ok);
    assert!(err.contains("unknown token"), "{err}");
    assert!(
        err.contains(&format!("ac7 connect --url {}", s.url)) && err.contains("rotate-token"),
        "a refused token says what to do: {err}"
    );

    let (ok, out, _) = run(&builder, &["roster"]);
    assert!(ok);
    assert!(
        out.contains("- director [lead] offline") && out.contains("- builder [engineer] offline"),
        "{out}"
    );
    let (ok, out, _) = run(&builder, &["history"]);
    assert!(ok);
    assert!(
        out.contains("director → builder [t]: hello") && out.contains("director: all hands"),
        "{out}"
    );
    let (ok, out, _) = run(&builder, &["history", "--json", "--limit", "1"]);
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["messages"].as_array().unwrap().len(), 1);

    let (ok, out, _) = run(
        &director,
        &[
            "objectives",
            "create",
            "--title",
            "Ship",
            "--outcome",
            "shipped",
            "--assignee",
            "builder",
            "--json",
        ],
    );
    assert!(ok);
    let id = serde_json::from_str::<Value>(&out).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (ok, _, err) = run(
        &builder,
        &[
            "objectives",
            "create",
            "--title",
            "x",
            "--outcome",
            "y",
            "--assignee",
            "builder",
        ],
    );
    assert!(!ok);
    assert!(
        err.contains("requires the objectives.create permission"),
        "{err}"
    );
    let (ok, out, _) = run(&builder, &["objectives", "list"]);
    assert!(
        ok && out.contains(&id) && out.contains("[active] Ship"),
        "{out}"
    );
    let (ok, out, _) = run(
        &builder,
        &[
            "objectives",
            "update",
            &id,
            "--status",
            "blocked",
            "--reason",
            "waiting",
        ],
    );
    assert!(ok && out.contains("[blocked]"), "{out}");
    let (ok, _, _) = run(
        &builder,
        &["objectives", "update", &id, "--status", "active"],
    );
    assert!(ok);
    let (ok, _, _) = run(
        &director,
        &["objectives", "watchers", &id, "--add", "director"],
    );
    assert!(ok, "a no-op watcher change succeeds");
    let (ok, _, err) = run(
        &director,
        &["objectives", "reassign", &id, "--to", "builder"],
    );
    assert!(!ok && err.contains("already assigned"), "{err}");
    let (ok, out, _) = run(
        &builder,
        &["objectives", "complete", &id, "--result", "done it"],
    );
    assert!(ok && out.contains("[done]"), "{out}");
    let (ok, out, _) = run(&builder, &["objectives", "view", &id]);
    assert!(
        ok && out.contains("result: done it") && out.contains("completed"),
        "{out}"
    );
    let (ok, _, err) = run(&director, &["objectives", "cancel", &id]);
    assert!(!ok && err.contains("is already done"), "{err}");
}

#[test]
fn offline_member_admin() {
    let (_dir, db, s) = serve_team();
    drop(s);
    let member = |args: &[&str]| offline(&db, &[&["member"], args].concat());
    let (ok, out, _) = member(&["list"]);
    assert!(ok);
    assert!(
        out.starts_with(
            "NAME      ROLE      PERMISSIONS\ndirector  director  team.manage,members.manage"
        ),
        "{out}"
    );
    let (ok, out, _) = member(&["list", "--json"]);
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["members"][1]["name"], "builder");
    assert_eq!(v["members"][1]["role"]["title"], "engineer");
    let (ok, out, _) = member(&[
        "add",
        "scout",
        "--role",
        "scout",
        "--permissions",
        "operator",
    ]);
    assert!(ok);
    let scout_token = out.trim().to_owned();
    assert!(scout_token.starts_with("ac7_") && scout_token.len() == 47);
    let (ok, _, err) = member(&["add", "scout"]);
    assert!(!ok && err.contains("already exists"), "{err}");
    let (ok, _, err) = member(&["add", "bad name"]);
    assert!(!ok && err.contains("must be"), "{err}");
    let (ok, _, _) = member(&["update", "scout", "--instructions", "look around"]);
    assert!(ok);
    let (ok, _, err) = member(&["update", "director", "--permissions", "operator"]);
    assert!(!ok && err.contains("last admin"), "{err}");
    let (ok, out, _) = member(&["rotate-token", "scout"]);
    assert!(ok);
    let rotated = out.trim().to_owned();
    assert_ne!(rotated, scout_token);

    // the rotated token works against a restarted broker; the old one does not
    let s = serve(&db, &[]);
    let rt = current_thread_rt();
    rt.block_on(async {
        let http = client();
        let r = http
            .get(format!("{}/briefing", s.url))
            .bearer_auth(&rotated)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            v["permissions"],
            json!([
                "objectives.create",
                "objectives.cancel",
                "objectives.reassign"
            ])
        );
        let r = http
            .get(format!("{}/briefing", s.url))
            .bearer_auth(&scout_token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);
    });
    drop(s);
    let (ok, _, _) = member(&["remove", "scout"]);
    assert!(ok);
    let (ok, out, _) = member(&["list"]);
    assert!(ok && !out.contains("scout"));
    let (ok, _, err) = member(&["remove", "director"]);
    assert!(!ok && err.contains("last admin"), "{err}");
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// `ac7 serve` with a team from flags; returns (exit ok, stdout, stderr).
fn serve_once(db: &Path, port: u16, extra: &[&str]) -> (bool, String, String) {
    output(
        Command::new(AC7)
            .args(["serve", "--db"])
            .arg(db)
            .args(["--port", &port.to_string()])
            .args(["--team-name", "t", "--directive", "d"])
            .args(["--member", "boss::admin"])
            .args(extra)
            .env("AC7_LOG", "warn"),
    )
}

#[test]
fn a_failed_start_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ac7.db");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let (ok, out, err) = serve_once(&db, port, &[]);
    assert!(!ok);
    assert!(err.contains("cannot listen on"), "{err}");
    assert!(!out.contains("ac7_"), "no token may be printed: {out}");
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "a failed start created files"
    );

    // a bad member flag: refused before anything is created
    let (ok, _, err) = serve_once(&db, 0, &["--member", "bad name"]);
    assert!(!ok && err.contains("must be"), "{err}");
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    drop(taken);
}

#[test]
fn files_are_private_and_an_open_data_dir_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, db, s) = serve_team();
    let rt = current_thread_rt();
    rt.block_on(async {
        let r = client()
            .post(format!("{}/push", s.url))
            .bearer_auth(token(&s, "director"))
            .json(&json!({"body": "hello"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    });
    for suffix in ["", "-wal", "-shm"] {
        let p = dir.path().join(format!("ac7.db{suffix}"));
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{} is not private", p.display());
        }
    }
    assert!(dir.path().join("ac7.db-wal").exists());
    assert_eq!(mode(&dir.path().join("ac7.db-blobs")), 0o700);
    drop(s);

    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new(AC7)
        .args(["serve", "--port", "0", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("writable by other users") && err.contains("chmod go-w"),
        "{err}"
    );
}

/// `ac7 serve` on a new database in a temporary directory, with the team `TEAM`.
fn serve_team() -> (tempfile::TempDir, std::path::PathBuf, Served) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ac7.db");
    let cfg = dir.path().join("team.json");
    std::fs::write(&cfg, TEAM).unwrap();
    let s = serve(&db, &["--team-config", cfg.to_str().unwrap()]);
    (dir, db, s)
}

/// The first start prints what to do next with the real URL and the new tokens; a restart on
/// the same database does not.
#[test]
fn first_start_prints_next_steps() {
    let (_dir, db, s) = serve_team();
    let mut text = String::new();
    while let Ok(line) = s.lines.recv_timeout(Duration::from_secs(5)) {
        text.push_str(&line);
        text.push('\n');
        if line.contains("ac7 history") {
            break;
        }
    }
    let (url, director, builder) = (&s.url, token(&s, "director"), token(&s, "builder"));
    for expected in [
        format!("AC7_URL={url} AC7_TOKEN={builder} ac7 claude-code"),
        format!("AC7_URL={url} AC7_TOKEN={builder} ac7 run -- <agent command>"),
        format!("AC7_URL={url} AC7_TOKEN={director} ac7 push --to builder --body \"hello\""),
        format!("AC7_URL={url} AC7_TOKEN={director} ac7 history --with builder"),
    ] {
        assert!(text.contains(&expected), "missing {expected:?} in:\n{text}");
    }
    drop(s);
    let s = serve(&db, &[]);
    assert!(
        s.lines.recv_timeout(Duration::from_millis(500)).is_err(),
        "a restart printed more than the listening line"
    );
}

/// A validation error shows the broker's details, not just "invalid objective payload".
#[test]
fn validation_errors_show_the_brokers_details() {
    let (_dir, _db, s) = serve_team();
    let args = [
        "objectives",
        "create",
        "--title",
        "",
        "--outcome",
        "done",
        "--assignee",
        "builder",
    ];
    let (ok, _, err) = ac7(&s.url, token(&s, "director"), &args);
    assert!(!ok);
    assert!(err.contains("invalid objective payload"), "{err}");
    assert!(
        err.contains("title: Too small: expected string to have >=1 characters"),
        "{err}"
    );
}

#[test]
fn offline_member_names_are_checked() {
    let (_dir, db, s) = serve_team();
    drop(s);
    for (name, want) in [
        (".", "reserved"),
        ("..", "reserved"),
        ("ac7", "reserved"),
        ("Director", "already exists"),
    ] {
        let (ok, _, err) = offline(&db, &["member", "add", name]);
        assert!(!ok && err.contains(want), "{name}: {err}");
        assert!(!err.contains("corrupt"), "{err}");
    }
}

/// Moves the messages whose body contains `marker` `days` days into the past.
fn age_messages(db: &Path, marker: &str, days: i64) {
    let store = crate::broker_support::open_store(db);
    store.with(|c| {
        let n = c
            .execute(
                "UPDATE messages SET ts = ts - ?1 WHERE body LIKE ?2",
                rusqlite::params![days * 86_400_000, format!("%{marker}%")],
            )
            .unwrap();
        assert!(n > 0);
    });
}

#[test]
fn prune_and_retain_days_delete_only_old_messages() {
    let (_dir, db, s) = serve_team();
    let rt = current_thread_rt();
    let bodies = |s: &Served| -> Vec<String> {
        rt.block_on(async {
            let v: Value = client()
                .get(format!("{}/history?limit=100", s.url))
                .bearer_auth(token(s, "builder"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["body"].as_str().unwrap().to_owned())
                .collect()
        })
    };
    let director = token(&s, "director").to_owned();
    rt.block_on(async {
        for body in ["old-one", "old-two", "middle", "fresh"] {
            let r = client()
                .post(format!("{}/push", s.url))
                .bearer_auth(&director)
                .json(&json!({"body": body}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 200);
        }
    });
    let tokens = s.tokens.clone();
    drop(s);
    age_messages(&db, "old-", 40);
    age_messages(&db, "middle", 20);

    let prune = |args: &[&str]| offline(&db, &[&["prune"], args].concat());
    let (ok, _, err) = prune(&["--older-than-days", "0"]);
    assert!(!ok, "0 days is refused: {err}");
    let (ok, out, err) = prune(&["--older-than-days", "30"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("pruned 2 rows (messages and activity) older than 30 days"),
        "{out}"
    );

    let mut s = serve(&db, &["--retain-days", "10"]);
    s.tokens = tokens;
    // pruned at start: only the fresh message is left
    let mut left = bodies(&s);
    for _ in 0..100 {
        if left == ["fresh"] {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        left = bodies(&s);
    }
    assert_eq!(left, ["fresh"]);
    // the team, members and tokens are untouched
    rt.block_on(async {
        let r = client()
            .get(format!("{}/briefing", s.url))
            .bearer_auth(&director)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    });
}

/// A malformed `--url` / `AC7_URL` is reported as such, for operator verbs and runners alike.
#[test]
fn a_bad_url_says_so() {
    for args in [
        &["roster"][..],
        &["push", "--to", "x", "--body", "hi"],
        &["run", "--", "true"],
    ] {
        for url in ["localhost:8717", "ftp://127.0.0.1:8717", "nonsense"] {
            let (ok, _, err) = ac7(url, "ac7_x", args);
            assert!(!ok, "{args:?} {url}");
            assert!(
                err.contains(&format!("invalid broker URL '{url}'")),
                "{args:?} {url}: {err}"
            );
            assert!(!err.contains("is `ac7 serve` running"), "{err}");
        }
    }
}

/// `ac7 push --agent NAME` and `-a NAME` are `--to NAME` (what TypeScript ac7 users type).
#[test]
fn push_agent_is_an_alias_of_to() {
    let (_dir, _db, s) = serve_team();
    let director = token(&s, "director");
    for flag in ["--agent", "-a", "--to"] {
        let body = format!("via {flag}");
        let (ok, _, err) = ac7(
            &s.url,
            director,
            &["push", flag, "builder", "--body", &body],
        );
        assert!(ok, "{flag}: {err}");
    }
    let (ok, out, err) = ac7(
        &s.url,
        token(&s, "builder"),
        &["history", "--with", "director"],
    );
    assert!(ok, "{err}");
    for flag in ["--agent", "-a", "--to"] {
        assert!(
            out.contains(&format!("director → builder: via {flag}")),
            "{out}"
        );
    }
    let (ok, _, err) = ac7(
        &s.url,
        director,
        &["push", "--agent", "builder", "--broadcast", "--body", "x"],
    );
    assert!(!ok && err.contains("cannot be used with"), "{err}");
}

/// A lost token is recoverable while the team runs: `member rotate-token` with an admin's
/// token goes through the broker; without one, the refusal says how.
#[test]
fn rotate_token_while_the_broker_runs() {
    let (_dir, db, s) = serve_team();
    let old = token(&s, "builder").to_owned();
    let rotate = |token: Option<&str>| {
        let mut cmd = Command::new(AC7);
        cmd.args(["member", "rotate-token", "builder", "--db"])
            .arg(&db)
            .args(["--url", &s.url])
            .env_remove("AC7_TOKEN");
        if let Some(t) = token {
            cmd.args(["--token", t]);
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, _, err) = rotate(None);
    assert!(!ok, "offline rotation while the broker holds the database");
    assert!(err.contains("pass an admin's token"), "{err}");
    // A member may rotate its own token (and then the old one is gone).
    let (ok, _, err) = rotate(Some(&old));
    assert!(ok, "a member may rotate its own token: {err}");
    let (ok, _, err) = rotate(Some(&old));
    assert!(
        !ok && err.contains("401"),
        "the old token is revoked: {err}"
    );
    let (ok, new, err) = rotate(Some(token(&s, "director")));
    assert!(ok, "{err}");
    assert!(new.starts_with("ac7_") && new != old, "{new}");
    let briefing = |t: &str| ac7(&s.url, t, &["roster"]).0;
    assert!(briefing(&new));
    assert!(!briefing(&old));
}

/// Logs are human-readable on a terminal and JSON lines otherwise.
#[test]
fn logs_are_text_on_a_terminal_and_json_otherwise() {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    // `AC7_LOG` that does not parse: every verb warns about it at start-up.
    let cmd = || {
        let mut cmd = Command::new(AC7);
        cmd.args(["roster", "--url", "http://127.0.0.1:9", "--token", "ac7_x"])
            .env("AC7_LOG", "ac7=[")
            .stdout(Stdio::null());
        cmd
    };
    let piped = cmd().output().unwrap();
    let piped = String::from_utf8_lossy(&piped.stderr).into_owned();
    let first = piped.lines().next().unwrap_or_default();
    let json: Value = serde_json::from_str(first).unwrap_or_else(|_| panic!("not JSON: {piped}"));
    assert_eq!(json["level"], "WARN", "{piped}");

    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two new descriptors into the pointers; the rest are null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: both descriptors are fresh and owned by nobody else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let status = cmd().stderr(slave).status().unwrap();
    assert!(!status.success());
    let mut tty = Vec::new();
    let mut master = std::fs::File::from(master);
    let mut buf = [0u8; 4096];
    // The child has exited: read what it wrote until the pty reports EOF/EIO.
    while let Ok(n) = master.read(&mut buf) {
        if n == 0 {
            break;
        }
        tty.extend_from_slice(&buf[..n]);
    }
    let tty = String::from_utf8_lossy(&tty);
    let first = tty.lines().next().unwrap_or_default();
    assert!(first.contains("WARN"), "{tty}");
    assert!(first.contains("AC7_LOG is not a valid log filter"), "{tty}");
    assert!(
        !first.trim_start().starts_with('{'),
        "JSON on a terminal: {tty}"
    );
}

/// An `llm_exchange` as the runner uploads it.
fn llm_exchange(ts: u64, input: u64, output: u64) -> Value {
    json!({"kind": "llm_exchange", "ts": ts, "duration": 1500, "entry": {
        "kind": "anthropic_messages", "startedAt": ts, "endedAt": ts + 1500,
        "request": {"model": "claude-opus-4", "maxTokens": 1024, "temperature": null, "system": null,
                    "messages": [], "tools": null},
        "response": {"stopReason": "end_turn", "stopSequence": null, "messages": [], "status": 200,
                     "usage": {"inputTokens": input, "outputTokens": output,
                               "cacheCreationInputTokens": 3, "cacheReadInputTokens": 7}}}})
}

#[test]
fn activity_and_usage_verbs() {
    let (_dir, _db, s) = serve_team();
    let (director, builder) = (
        token(&s, "director").to_owned(),
        token(&s, "builder").to_owned(),
    );
    let now = u64::try_from(ac7_runtime::sys::clock::now_ms()).unwrap();
    let (old, t1, t2) = (now - 3 * 86_400_000, now - 60_000, now - 30_000);
    let (ok, out, err) = ac7(
        &s.url,
        &director,
        &[
            "objectives",
            "create",
            "--json",
            "--title",
            "T",
            "--outcome",
            "O",
            "--assignee",
            "builder",
        ],
    );
    assert!(ok, "{err}");
    let obj: Value = serde_json::from_str(&out).unwrap();
    let obj = obj["id"].as_str().unwrap().to_owned();
    let events = json!({"events": [
        llm_exchange(old, 1000, 1000),
        {"kind": "objective_open", "ts": t1 - 1, "objectiveId": obj},
        llm_exchange(t1, 100, 10),
        {"kind": "objective_close", "ts": t1 + 1, "objectiveId": obj, "result": "done"},
        llm_exchange(t2, 20, 2),
    ]});
    let rt = current_thread_rt();
    let upload = |body: &Value| {
        rt.block_on(async {
            client()
                .post(format!("{}/members/builder/activity", s.url))
                .bearer_auth(&builder)
                .json(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    assert_eq!(upload(&events), 201);
    let run = |tok: &str, args: &[&str]| ac7(&s.url, tok, args);

    let (ok, out, err) = run(&director, &["activity", "builder"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[1].ends_with("  claude-opus-4  in 100 out 10 cache 3w/7r  end_turn  1500 ms"),
        "{out}"
    );
    let (ok, out, err) = run(&director, &["activity", "builder", "--objective", &obj]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains("in 100 out 10"), "{out}");
    // A member without activity.read cannot read someone else's.
    let (ok, _, err) = run(&builder, &["activity", "director"]);
    assert!(!ok);
    assert!(err.contains("activity.read"), "{err}");

    let (ok, out, err) = run(&director, &["usage", "--since", "1d", "--json"]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["members"]["builder"]["inputTokens"], 120);
    assert_eq!(v["members"]["builder"]["outputTokens"], 12);
    assert_eq!(v["members"]["builder"]["exchanges"], 2);
    assert_eq!(v["members"]["director"]["exchanges"], 0);
    assert_eq!(v["objectives"][&obj]["inputTokens"], 100);
    assert_eq!(v["objectives"][&obj]["cacheReadInputTokens"], 7);
    let (ok, out, err) = run(&director, &["usage"]);
    assert!(ok, "{err}");
    assert!(out.contains("by member") && out.contains(&obj), "{out}");
    let builder_line = out.lines().find(|l| l.starts_with("builder")).unwrap();
    assert!(builder_line.contains("1120"), "all time: {out}");
    let (ok, _, err) = run(&director, &["usage", "--since", "yesterday"]);
    assert!(!ok);
    assert!(err.contains("neither epoch ms nor an age"), "{err}");

    // --follow prints new exchanges as they arrive.
    let mut child = Command::new(AC7)
        .args(["activity", "builder", "--follow", "--limit", "1"])
        .env("AC7_URL", &s.url)
        .env("AC7_TOKEN", &director)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().contains("in 20 out 2"));
    assert_eq!(upload(&json!({"events": [llm_exchange(now, 5, 6)]})), 201);
    let next = lines.next().unwrap().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(next.contains("in 5 out 6"), "{next}");
}

/// `ac7 member remove` and `ac7 member add` of the same name, offline: the new member inherits
/// none of the old one's DMs or activity, and the rest of the team keeps its side
/// (`broker_identity` has the same over HTTP).
#[test]
fn offline_remove_then_add_starts_a_new_member() {
    let (_dir, db, s) = serve_team();
    let builder = token(&s, "builder").to_owned();
    drop(s);
    let member = |args: &[&str]| offline(&db, &[&["member"], args].concat());
    let (ok, out, err) = member(&["add", "carol"]);
    assert!(ok, "{err}");
    let old = out.trim().to_owned();
    let rt = current_thread_rt();
    let s = serve(&db, &[]);
    let send = |url: &str, tok: &str, path: &str, body: Value| {
        let (url, tok, path) = (url.to_owned(), tok.to_owned(), path.to_owned());
        async move {
            let r = client()
                .post(format!("{url}{path}"))
                .bearer_auth(tok)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{path}: {}", r.status());
            r.json::<Value>().await.unwrap()
        }
    };
    let get = |url: &str, tok: &str, path: &str| {
        let (url, tok, path) = (url.to_owned(), tok.to_owned(), path.to_owned());
        async move {
            let r = client()
                .get(format!("{url}{path}"))
                .bearer_auth(tok)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 200, "{path}");
            r.json::<Value>().await.unwrap()
        }
    };
    let bodies = |v: &Value| -> Vec<String> {
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["body"].as_str().unwrap().to_owned())
            .collect()
    };
    let activity =
        json!({"events": [{"kind": "objective_open", "ts": 1000, "objectiveId": "obj-1"}]});
    rt.block_on(async {
        send(
            &s.url,
            &builder,
            "/push",
            json!({"to": "carol", "body": "to old carol"}),
        )
        .await;
        send(
            &s.url,
            &old,
            "/push",
            json!({"to": "builder", "body": "from old carol"}),
        )
        .await;
        send(&s.url, &old, "/members/carol/activity", activity.clone()).await;
    });
    drop(s);
    let (ok, out, err) = member(&["remove", "carol"]);
    assert!(ok && out.contains("removed carol"), "{out}{err}");
    let (ok, out, err) = member(&["add", "carol"]);
    assert!(ok, "{err}");
    let new = out.trim().to_owned();
    let s = serve(&db, &[]);
    rt.block_on(async {
        let h = get(&s.url, &new, "/history").await;
        assert_eq!(bodies(&h), Vec::<String>::new(), "{h}");
        let a = get(&s.url, &new, "/members/carol/activity").await;
        assert_eq!(a, json!({"activity": []}));
        let h = get(&s.url, &builder, "/history?with=carol").await;
        assert_eq!(bodies(&h), vec!["from old carol", "to old carol"]);
        // The new carol's own rows are hers.
        send(&s.url, &new, "/members/carol/activity", activity).await;
        let a = get(&s.url, &new, "/members/carol/activity").await;
        assert_eq!(a["activity"].as_array().unwrap().len(), 1, "{a}");
    });
}

/// [`serve_team`] with the director's broadcast `kept` in its log; the director's token last.
fn serve_team_with_a_broadcast() -> (tempfile::TempDir, std::path::PathBuf, Served, String) {
    let (dir, db, s) = serve_team();
    let director = token(&s, "director").to_owned();
    let (ok, _, err) = ac7(
        &s.url,
        &director,
        &["push", "--body", "kept", "--broadcast"],
    );
    assert!(ok, "{err}");
    (dir, db, s, director)
}

/// SIGTERM is a clean shutdown: the WAL is checkpointed into the database and SQLite's
/// `-wal` file is gone (its index never had a `-shm` file), so the database is one file that
/// holds everything.
#[test]
fn a_clean_shutdown_leaves_one_database_file() {
    let (dir, db, mut s, director) = serve_team_with_a_broadcast();
    let wal = dir.path().join("ac7.db-wal");
    let shm = dir.path().join("ac7.db-shm");
    assert!(wal.exists(), "WAL mode while serving");
    let pid = rustix::process::Pid::from_child(&s.child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!wal.exists(), "no -wal file after a clean shutdown");
    assert!(!shm.exists(), "no -shm file after a clean shutdown");
    // The one file holds the message: a broker started on it alone serves it.
    drop(s);
    let again = serve(&db, &[]);
    let (ok, out, err) = ac7(&again.url, &director, &["history"]);
    assert!(ok, "{err}");
    assert!(out.contains("director: kept"), "{out}");
}

/// While the broker runs, its database is its alone: the WAL index is in its memory (no `-shm`
/// file) and another process (the test, through SQLite) is refused. `ac7 backup` takes a
/// consistent copy through the broker with an admin's token, written whole (0600) or not at
/// all, and leaves nothing on the broker's disk.
#[test]
fn the_running_brokers_database_is_its_own_and_ac7_backup_copies_it() {
    let (dir, db, s, director) = serve_team_with_a_broadcast();
    // The broker's read connections have taken and left their locks.
    let (ok, out, err) = ac7(&s.url, &director, &["history"]);
    assert!(ok && out.contains("director: kept"), "{out}{err}");
    assert!(!dir.path().join("ac7.db-shm").exists());
    let outside = rusqlite::Connection::open(&db).unwrap();
    let refused = outside
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get::<_, i64>(0))
        .unwrap_err();
    assert!(refused.to_string().contains("locked"), "{refused}");
    drop(outside);

    let copy = dir.path().join("copy.db");
    let backup = |token: &str, to: &Path| ac7(&s.url, token, &["backup", to.to_str().unwrap()]);
    let (ok, out, err) = backup(&director, &copy);
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("wrote the team's database to {}", copy.display())),
        "{out}"
    );
    assert_eq!(mode(&copy), 0o600);
    let bodies: Vec<String> = rusqlite::Connection::open(&copy)
        .unwrap()
        .prepare("SELECT body FROM messages")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(bodies.iter().any(|b| b == "kept"), "{bodies:?}");
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("backup") || n.ends_with(".partial"))
        .collect();
    assert_eq!(left, Vec::<String>::new());
    // An existing file is never overwritten; a member without members.manage gets nothing.
    let (ok, _, err) = backup(&director, &copy);
    assert!(!ok && err.contains("exists: name a new file"), "{err}");
    let other = dir.path().join("other.db");
    let (ok, _, err) = backup(token(&s, "builder"), &other);
    assert!(!ok && err.contains("members.manage"), "{err}");
    assert!(!other.exists() && !dir.path().join("other.db.partial").exists());
}

/// Start-up errors say what to do, once: a data directory that does not exist is named with
/// the command that creates it; a team config that is not the expected JSON names the shape
/// expected, never a Rust type, and no text is repeated.
#[test]
fn start_up_errors_say_what_to_do_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("not/yet");
    let (ok, _, err) = output(
        Command::new(AC7)
            .args(["serve", "--db"])
            .arg(missing.join("ac7.db"))
            .args(["--team-name", "t", "--directive", "d", "--member", "a"])
            .env("AC7_LOG", "warn"),
    );
    assert!(!ok);
    assert_eq!(
        err.trim_end(),
        format!(
            "ac7: the data directory {d} does not exist: create it first (`mkdir -m 700 -p {d}`), \
             or pass a --db in an existing directory",
            d = missing.display()
        )
    );
    let config = dir.path().join("team.json");
    for (text, expected) in [
        (
            r#"{"team": {"name": "t", "directive": "d"}, "members": [{"name": "a", "role": "x"}]}"#,
            r#"invalid type: string "x", expected an object {"title": …, "description": …}"#,
        ),
        (
            r#"{"team": {"name": "t", "directive": "d"}, "members": [{"name": "a", "role": {"title": "x"}, "permissions": "admin"}]}"#,
            r#"invalid type: string "admin", expected a list […]"#,
        ),
        (
            r#"{"team": {"name": "t"}, "members": []}"#,
            "missing field `directive`",
        ),
    ] {
        std::fs::write(&config, text).unwrap();
        let (ok, _, err) = output(
            Command::new(AC7)
                .args(["serve", "--db"])
                .arg(dir.path().join("ac7.db"))
                .arg("--team-config")
                .arg(&config)
                .env("AC7_LOG", "warn"),
        );
        assert!(!ok, "{text}");
        let line = err.trim_end();
        assert!(
            line.starts_with(&format!(
                "ac7: team config {} is not valid: {expected} at line 1 column ",
                config.display()
            )),
            "{line}"
        );
        assert_eq!(line.matches(expected).count(), 1, "said once: {line}");
        for rust in ["struct", "sequence", "TeamSection", "MemberSection"] {
            assert!(!line.contains(rust), "no Rust names: {line}");
        }
    }
}

/// `ac7 whoami` names the token's member, role, team and permissions; `ac7 logout` forgets a
/// stored token (and only that URL's), leaving the folder's mode as it was.
#[test]
fn whoami_and_logout() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, _db, s) = serve_team();
    let builder = token(&s, "builder").to_owned();
    let (ok, out, err) = ac7(&s.url, &builder, &["whoami"]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        format!(
            "builder (engineer) on team cli-team at {}\npermissions: none\n",
            s.url
        )
    );
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
    let auth = shared.join("auth.json");
    let entry =
        |url: &str| json!({"url": url, "token": builder, "member": "builder", "savedAt": 1});
    std::fs::write(
        &auth,
        json!({"schema": 1, "entries": [entry(&s.url), entry("http://other:1")]}).to_string(),
    )
    .unwrap();
    // The stored token serves a verb without AC7_TOKEN.
    let whoami = |url: &str| {
        output(
            Command::new(AC7)
                .arg("whoami")
                .env("AC7_URL", url)
                .env_remove("AC7_TOKEN")
                .env("AC7_AUTH_FILE", &auth),
        )
    };
    assert!(whoami(&s.url).0);
    let (ok, out, err) = output(
        Command::new(AC7)
            .arg("logout")
            .env("AC7_URL", &s.url)
            .env("AC7_AUTH_FILE", &auth),
    );
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("forgot the token for {}", s.url)),
        "{out}"
    );
    let (ok, _, err) = whoami(&s.url);
    assert!(!ok, "the token is forgotten");
    assert!(err.contains("ac7 connect"), "{err}");
    let left: Value = serde_json::from_str(&std::fs::read_to_string(&auth).unwrap()).unwrap();
    assert_eq!(left["entries"].as_array().unwrap().len(), 1);
    assert_eq!(left["entries"][0]["url"], "http://other:1");
    assert_eq!(mode(&shared), 0o755, "the folder keeps its mode");
    assert_eq!(mode(&auth), 0o600);
}

/// The text roster shows who is connected and who is busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_text_roster_shows_busy() {
    let (_dir, _db, s) = serve_team();
    let builder = token(&s, "builder").to_owned();
    let http = client();
    let stream = http
        .get(format!("{}/subscribe?name=builder", s.url))
        .bearer_auth(&builder)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status().as_u16(), 200);
    let busy = http
        .post(format!("{}/presence/busy", s.url))
        .bearer_auth(&builder)
        .json(&json!({"busy": true}))
        .send()
        .await
        .unwrap();
    assert!(busy.status().is_success(), "{busy:?}");
    let (url, director) = (s.url.clone(), token(&s, "director").to_owned());
    let (ok, out, err) = tokio::task::spawn_blocking(move || ac7(&url, &director, &["roster"]))
        .await
        .unwrap();
    assert!(ok, "{err}");
    assert!(
        out.contains("- builder [engineer] connected=1 busy"),
        "{out}"
    );
    assert!(out.contains("- director [director] offline"), "{out}");
    drop(stream);
}

/// Offline, `member tokens` lists a member's tokens and `member revoke-token` revokes one.
#[test]
fn offline_member_tokens_and_revoke_token() {
    let (_dir, db, s) = serve_team();
    let builder = token(&s, "builder").to_owned();
    drop(s);
    let (ok, out, err) = offline(&db, &["member", "tokens", "builder", "--json"]);
    assert!(ok, "{err}");
    let tokens = serde_json::from_str::<Value>(&out).unwrap()["tokens"]
        .as_array()
        .cloned()
        .unwrap();
    assert_eq!(tokens.len(), 1, "{out}");
    assert_eq!(tokens[0]["origin"], "bootstrap", "{out}");
    let id = tokens[0]["id"].as_str().unwrap().to_owned();
    let (ok, out, err) = offline(&db, &["member", "tokens", "builder"]);
    assert!(
        ok && out.starts_with("ID") && out.contains(&id),
        "{out}{err}"
    );
    let (ok, _, err) = offline(&db, &["member", "tokens", "nobody"]);
    assert!(!ok && err.contains("no such member: nobody"), "{err}");
    let (ok, _, err) = offline(&db, &["member", "revoke-token", "builder", "nope"]);
    assert!(!ok && err.contains("no such token"), "{err}");
    let (ok, out, err) = offline(&db, &["member", "revoke-token", "builder", &id]);
    assert!(
        ok && out.trim() == format!("revoked builder's token {id}"),
        "{out}{err}"
    );
    let s = serve(&db, &[]);
    let (ok, _, err) = ac7(&s.url, &builder, &["whoami"]);
    assert!(!ok && err.contains("401"), "{err}");
}
