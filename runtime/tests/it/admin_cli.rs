//! The real `ac7` binary's administration verbs through a running broker (`member`, `team`,
//! `presets`, `channels`, `enroll`), and the errors that say what to do: the wrong scheme, a
//! server that is not a broker, an unknown member, a live stream the broker does not serve,
//! a runner without a token.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::served::{Served, serve, token};

const AC7: &str = env!("CARGO_BIN_EXE_ac7");

const TEAM: &str = r#"{
  "team": {"name": "admin-team", "directive": "Test the admin verbs."},
  "members": [
    {"name": "director", "role": {"title": "director"}, "permissions": ["admin"]},
    {"name": "builder", "role": {"title": "engineer", "description": "Ships code."}}
  ]
}"#;

/// A broker with a director (admin) and a builder, in a fresh folder; also the path of an
/// auth file nobody wrote, so no token stored on this machine is used.
fn broker() -> (tempfile::TempDir, Served, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("team.json");
    std::fs::write(&cfg, TEAM).unwrap();
    let s = serve(
        &dir.path().join("ac7.db"),
        &["--team-config", cfg.to_str().unwrap()],
    );
    let auth = dir.path().join("no-auth.json");
    (dir, s, auth)
}

/// `ac7 <args>` with `AC7_URL`/`AC7_TOKEN` set (no token when `token` is empty), in `cwd`:
/// (exit ok, stdout, stderr).
fn ac7_in(
    cwd: &Path,
    auth: &Path,
    url: &str,
    token: &str,
    args: &[&str],
) -> (bool, String, String) {
    let mut cmd = Command::new(AC7);
    cmd.args(args)
        .current_dir(cwd)
        .env("AC7_URL", url)
        .env("AC7_AUTH_FILE", auth)
        .env_remove("AC7_DB")
        .env_remove("AC7_CA_CERT")
        .stdin(Stdio::null());
    if token.is_empty() {
        cmd.env_remove("AC7_TOKEN");
    } else {
        cmd.env("AC7_TOKEN", token);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json_of(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[test]
fn member_verbs_work_through_the_running_broker() {
    let (dir, s, auth) = broker();
    let (director, builder) = (token(&s, "director"), token(&s, "builder"));
    let run = |tok: &str, args: &[&str]| ac7_in(dir.path(), &auth, &s.url, tok, args);

    let (ok, out, err) = run(director, &["member", "list"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["NAME", "ROLE", "PERMISSIONS"]
    );
    assert!(
        lines[1].starts_with("director  director  team.manage,members.manage"),
        "{out}"
    );
    assert!(lines[2].starts_with("builder   engineer  -"), "{out}");
    let (ok, out, _) = run(director, &["member", "list", "--json"]);
    assert!(ok);
    let v = json_of(&out);
    assert_eq!(v["members"][1]["role"]["description"], "Ships code.");

    let (ok, out, err) = run(
        director,
        &[
            "member",
            "add",
            "scout",
            "--role",
            "scout",
            "--permissions",
            "operator",
        ],
    );
    assert!(ok, "{err}");
    let scout = out.trim().to_owned();
    assert!(scout.starts_with("ac7_"), "{out}");
    let (ok, out, err) = run(&scout, &["whoami"]);
    assert!(
        ok && out.starts_with("scout (scout) on team admin-team"),
        "{out}{err}"
    );
    let (ok, _, err) = run(director, &["member", "add", "scout"]);
    assert!(!ok && err.contains("already exists"), "{err}");

    // A member without members.manage is told it needs an admin's token.
    let (ok, _, err) = run(builder, &["member", "add", "intruder"]);
    assert!(!ok);
    assert!(
        err.contains("403") && err.contains("members.manage"),
        "{err}"
    );
    assert!(err.contains("admin's token"), "{err}");

    // --description alone keeps the role's title (the broker replaces the whole role).
    let (ok, out, err) = run(
        director,
        &[
            "member",
            "update",
            "scout",
            "--description",
            "Looks around.",
        ],
    );
    assert!(ok && out.trim() == "updated scout", "{out}{err}");
    let (_, out, _) = run(director, &["member", "list", "--json"]);
    let scout_row = json_of(&out)["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "scout")
        .cloned()
        .unwrap();
    assert_eq!(
        scout_row["role"],
        json!({"title": "scout", "description": "Looks around."})
    );
    let (ok, _, err) = run(director, &["member", "update", "scout"]);
    assert!(!ok && err.contains("nothing to update"), "{err}");
    for args in [
        &["member", "update", "nobody", "--instructions", "x"][..],
        &["member", "remove", "nobody"],
        &["member", "rotate-token", "nobody"],
    ] {
        let (ok, _, err) = run(director, args);
        assert!(
            !ok && err.contains("no such member: nobody"),
            "{args:?}: {err}"
        );
    }

    let (ok, out, err) = run(director, &["member", "remove", "scout", "--json"]);
    assert!(ok, "{err}");
    assert_eq!(json_of(&out), json!({"removed": "scout"}));
    let (ok, _, err) = run(&scout, &["whoami"]);
    assert!(
        !ok && err.contains("401"),
        "the removed member's token is refused: {err}"
    );
    let (ok, _, err) = run(director, &["member", "remove", "director"]);
    assert!(!ok && err.contains("last admin"), "{err}");

    // A member rotates its own token.
    let (ok, out, err) = run(builder, &["member", "rotate-token", "builder"]);
    assert!(ok, "{err}");
    let rotated = out.trim().to_owned();
    assert!(rotated.starts_with("ac7_") && rotated != builder);
    assert!(run(&rotated, &["whoami"]).0);

    // A member's tokens, and one of them revoked (a lost device's): the others keep working.
    let (ok, second, err) = run(director, &["member", "rotate-token", "builder"]);
    assert!(ok, "{err}");
    let second = second.trim().to_owned();
    let (ok, out, err) = run(&second, &["member", "tokens", "builder"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["ID", "ORIGIN", "LABEL", "CREATED", "LAST", "USED"],
        "{out}"
    );
    assert_eq!(lines.len(), 2, "rotation left one token: {out}");
    assert!(
        lines[1].contains(" rotate ") && lines[1].contains(" UTC"),
        "{out}"
    );
    let (ok, out, err) = run(director, &["member", "tokens", "builder", "--json"]);
    assert!(ok, "{err}");
    let tokens = json_of(&out)["tokens"].as_array().cloned().unwrap();
    assert_eq!(tokens.len(), 1, "{out}");
    let id = tokens[0]["id"].as_str().unwrap().to_owned();
    let (ok, _, err) = run(&second, &["member", "tokens", "director"]);
    assert!(!ok && err.contains("403"), "another member's tokens: {err}");
    let (ok, _, err) = run(director, &["member", "tokens", "nobody"]);
    assert!(!ok && err.contains("no such member: nobody"), "{err}");
    let (ok, _, err) = run(
        director,
        &["member", "revoke-token", "builder", "no-such-id"],
    );
    assert!(!ok && err.contains("no such token"), "{err}");
    let (ok, out, err) = run(director, &["member", "revoke-token", "builder", &id]);
    assert!(
        ok && out.trim() == format!("revoked builder's token {id}"),
        "{out}{err}"
    );
    let (ok, _, err) = run(&second, &["whoami"]);
    assert!(
        !ok && err.contains("401"),
        "the revoked token is refused: {err}"
    );
    assert!(
        run(director, &["whoami"]).0,
        "other members' tokens keep working"
    );

    // The token `ac7 connect` stored serves the verb without AC7_TOKEN or --db.
    let stored = dir.path().join("auth.json");
    std::fs::write(
        &stored,
        json!({"schema": 1, "entries": [{"url": s.url, "token": director, "member": "director", "savedAt": 1}]})
            .to_string(),
    )
    .unwrap();
    let (ok, out, err) = ac7_in(dir.path(), &stored, &s.url, "", &["member", "list"]);
    assert!(ok && out.starts_with("NAME"), "{out}{err}");

    // No token anywhere and no database file: say both ways out.
    let elsewhere = tempfile::tempdir().unwrap();
    let (ok, _, err) = ac7_in(elsewhere.path(), &auth, &s.url, "", &["member", "list"]);
    assert!(!ok);
    assert!(
        err.contains(&format!("ac7 connect --url {}", s.url)) && err.contains("--db FILE"),
        "{err}"
    );
}

#[test]
fn team_presets_channels_and_enroll_verbs() {
    let (dir, s, auth) = broker();
    let (director, builder) = (token(&s, "director"), token(&s, "builder"));
    let run = |tok: &str, args: &[&str]| ac7_in(dir.path(), &auth, &s.url, tok, args);

    // team get|set
    let (ok, out, err) = run(builder, &["team", "get"]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "name:      admin-team\ndirective: Test the admin verbs.\ncontext:   -\n"
    );
    let (ok, out, err) = run(
        director,
        &["team", "set", "--directive", "Ship it.", "--json"],
    );
    assert!(ok, "{err}");
    assert_eq!(json_of(&out)["team"]["directive"], "Ship it.");
    let (ok, _, err) = run(builder, &["team", "set", "--context", "x"]);
    assert!(
        !ok && err.contains("team.manage") && err.contains("admin's token"),
        "{err}"
    );
    let (ok, _, err) = run(director, &["team", "set"]);
    assert!(!ok && err.contains("nothing to set"), "{err}");

    // presets
    let (ok, out, err) = run(builder, &["presets"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("PRESET  "), "{out}");
    assert!(out.contains("\nadmin   "), "{out}");
    let (ok, out, err) = run(
        director,
        &[
            "presets",
            "set",
            "readers",
            "--permissions",
            "activity.read",
        ],
    );
    assert!(
        ok && out.trim() == "preset readers: activity.read",
        "{out}{err}"
    );
    let (ok, out, _) = run(builder, &["presets", "list", "--json"]);
    assert!(ok);
    assert_eq!(
        json_of(&out)["presets"]["readers"],
        json!(["activity.read"])
    );
    let (ok, _, err) = run(
        director,
        &["presets", "set", "bad", "--permissions", "no.such"],
    );
    assert!(!ok && err.contains("no.such"), "{err}");
    assert!(run(director, &["presets", "delete", "readers"]).0);
    let (ok, _, err) = run(director, &["presets", "delete", "readers"]);
    assert!(!ok && err.contains("no such preset: readers"), "{err}");

    // channels
    let (ok, out, err) = run(builder, &["channels", "create", "frontend"]);
    assert!(ok && out.trim() == "created #frontend", "{out}{err}");
    let (ok, out, err) = run(director, &["channels", "list"]);
    assert!(ok, "{err}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["SLUG", "MEMBERS", "YOU", "CREATED-BY", "CREATED"]);
    assert_eq!(rows[1][..4], ["frontend", "1", "-", "builder"]);
    assert_eq!(rows[2][..3], ["general", "2", "member"]);
    let (ok, out, err) = run(
        builder,
        &["channels", "members", "frontend", "--add", "director"],
    );
    assert!(ok, "{err}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["MEMBER", "ROLE", "JOINED"]);
    assert_eq!(rows[1][..2], ["builder", "admin"]);
    assert_eq!(rows[2][..2], ["director", "member"]);
    let (ok, _, err) = run(director, &["channels", "archive", "frontend"]);
    assert!(
        !ok && err.contains("403"),
        "only the channel's admins archive it: {err}"
    );
    let (ok, out, err) = run(builder, &["channels", "archive", "frontend", "--json"]);
    assert!(ok, "{err}");
    assert!(json_of(&out)["archivedAt"].is_i64(), "{out}");
    let (ok, out, _) = run(builder, &["channels", "list"]);
    assert!(ok && !out.contains("frontend"), "{out}");
    let (ok, _, err) = run(builder, &["channels", "members", "nope"]);
    assert!(!ok && err.contains("no such channel: nope"), "{err}");
    let (ok, out, _) = run(builder, &["channels", "members", "general"]);
    assert!(ok && out.contains("every member"), "{out}");

    // enroll list|approve|reject, against devices that asked as `ac7 connect` does.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let ask = |label: &str| -> Value {
        rt.block_on(async {
            http.post(format!("{}/enroll", s.url))
                .json(&json!({"labelHint": label}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap()
        })
    };
    let poll = |device: &Value| -> Value {
        rt.block_on(async {
            http.post(format!("{}/enroll/poll", s.url))
                .json(&json!({"deviceCode": device["deviceCode"]}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap()
        })
    };
    let (laptop, phone, tablet) = (ask("laptop"), ask("phone"), ask("tablet"));
    let code = |d: &Value| d["userCode"].as_str().unwrap().to_owned();
    let (ok, out, err) = run(director, &["enroll", "list"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("CODE"), "{out}");
    for (device, label) in [(&laptop, "laptop"), (&phone, "phone"), (&tablet, "tablet")] {
        assert!(out.contains(&format!("{}  {label}", code(device))), "{out}");
    }
    let (ok, _, err) = run(builder, &["enroll", "list"]);
    assert!(!ok && err.contains("admin's token"), "{err}");

    let (ok, out, err) = run(
        director,
        &["enroll", "approve", &code(&laptop), "--member", "builder"],
    );
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!(
            "approved {}: the device is builder",
            code(&laptop)
        )),
        "{out}"
    );
    let granted = poll(&laptop);
    let device_token = granted["token"].as_str().unwrap();
    let (ok, out, _) = run(device_token, &["whoami"]);
    assert!(ok && out.starts_with("builder "), "{out}");

    let (ok, out, err) = run(
        director,
        &["enroll", "reject", &code(&phone), "--reason", "not mine"],
    );
    assert!(
        ok && out.trim() == format!("rejected {}", code(&phone)),
        "{out}{err}"
    );
    assert_eq!(poll(&phone)["error"], "access_denied");

    let (ok, _, err) = run(
        director,
        &[
            "enroll",
            "approve",
            &code(&tablet),
            "--member",
            "helper",
            "--new",
            "--role",
            "helper",
            "--permissions",
            "operator",
            "--json",
        ],
    );
    assert!(ok, "{err}");
    let granted = poll(&tablet);
    let (ok, out, _) = run(granted["token"].as_str().unwrap(), &["whoami"]);
    assert!(ok && out.starts_with("helper (helper)"), "{out}");
    let (ok, _, err) = run(
        director,
        &["enroll", "approve", "ABCD-EFGH", "--member", "builder"],
    );
    assert!(!ok && err.contains("404"), "{err}");
    let (ok, out, _) = run(director, &["enroll", "list"]);
    assert!(ok && out.trim() == "(no devices waiting)", "{out}");
}

/// A one-thread HTTP server that answers every request with the same HTML page.
fn not_a_broker() -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { break };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let page = "<html><body>It works!</body></html>";
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    url
}

#[test]
fn errors_say_what_to_do() {
    let (dir, s, auth) = broker();
    let director = token(&s, "director");
    let run = |url: &str, tok: &str, args: &[&str]| ac7_in(dir.path(), &auth, url, tok, args);

    // https:// against a broker that serves plain HTTP.
    let https = s.url.replacen("http://", "https://", 1);
    let (ok, _, err) = run(&https, director, &["roster"]);
    assert!(!ok);
    assert!(
        err.contains("serves plain HTTP, not HTTPS") && err.contains(&format!("--url {}", s.url)),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // A URL that answers HTTP but is no broker.
    let web = not_a_broker();
    let (ok, _, err) = run(&web, director, &["roster"]);
    assert!(!ok);
    assert!(
        err.contains(&format!("{web} answers HTTP but is not an ac7 broker")),
        "{err}"
    );
    assert!(
        err.contains("It works!") && err.contains("AC7_URL"),
        "{err}"
    );

    // An unknown member's activity.
    let (ok, _, err) = run(&s.url, director, &["activity", "nobody"]);
    assert!(!ok && err.contains("no such member: nobody"), "{err}");
    let (ok, out, err) = run(&s.url, director, &["activity", "builder"]);
    assert!(ok && out.trim() == "(no exchanges)", "{out}{err}");

    // A runner without a token names the command that gets one (no terminal: no question).
    for runner in [&["run", "--", "true"][..], &["claude-code"], &["codex"]] {
        let (ok, _, err) = run(&s.url, "", runner);
        assert!(!ok, "{runner:?}");
        if err.contains("not on PATH") {
            continue; // the agent is not installed here: the runner stops before the broker
        }
        assert!(
            err.contains(&format!("ac7 connect --url {}", s.url)),
            "{runner:?}: {err}"
        );
        assert!(
            !err.contains("[Y/n]"),
            "no question without a terminal: {err}"
        );
    }
}

/// A broker stand-in whose activity stream answers JSON to an SSE request, and (with
/// `websocket`) serves the stream as a WebSocket that sends one row and closes.
async fn stream_stand_in(websocket: bool) -> String {
    use axum::extract::ws::{Message, WebSocketUpgrade};
    use axum::extract::{FromRequestParts, Request};
    use axum::routing::get;
    let row = json!({"id": 7, "memberName": "builder", "event": {"kind": "objective_open", "ts": 1, "objectiveId": "obj-1"}});
    let app = axum::Router::new()
        .route("/healthz", get(|| async { axum::Json(json!({"status": "ok", "version": "0"})) }))
        .route(
            "/members/{name}/activity",
            get(|| async { axum::Json(json!({"activity": [{"id": 1, "memberName": "builder", "event": {"kind": "objective_close", "ts": 1, "objectiveId": "obj-0"}}]})) }),
        )
        .route(
            "/members/{name}/activity/stream",
            get(move |req: Request| {
                let row = row.clone();
                async move {
                let (mut parts, _) = req.into_parts();
                match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
                    Ok(ws) if websocket => ws.on_upgrade(move |mut socket| async move {
                        let _ = socket.send(Message::Text(row.to_string().into())).await;
                        let _ = socket.send(Message::Close(None)).await;
                    }),
                    _ => axum::response::IntoResponse::into_response(axum::Json(
                        json!({"note": "no live stream here"}),
                    )),
                }
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_follow_falls_back_to_a_websocket_or_says_there_is_no_stream() {
    let auth = tempfile::tempdir().unwrap();
    let follow = |url: String| {
        let auth = auth.path().join("none.json");
        tokio::task::spawn_blocking(move || {
            ac7_in(
                Path::new("/"),
                &auth,
                &url,
                "ac7_any",
                &["activity", "builder", "--follow", "--json"],
            )
        })
    };
    let (ok, out, err) = follow(stream_stand_in(true).await).await.unwrap();
    assert!(ok, "{err}");
    assert!(
        out.lines()
            .any(|l| l.contains("\"id\":7") && l.contains("objective_open")),
        "the row sent over the WebSocket is printed: {out}"
    );
    let (ok, _, err) = follow(stream_stand_in(false).await).await.unwrap();
    assert!(!ok);
    assert!(err.contains("does not stream builder's activity"), "{err}");
    assert!(err.contains("application/json"), "{err}");
    assert!(err.contains("without --follow"), "{err}");
}

/// On a terminal, a runner without a token asks whether to run `ac7 connect`; answered yes, it
/// connects (an admin approves the code) and the agent then starts with the stored token.
#[test]
fn a_runner_without_a_token_offers_ac7_connect_on_a_terminal() {
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};
    let (dir, s, _) = broker();
    let director = token(&s, "director");
    let auth = dir.path().join("auth.json");
    // `script` gives the runner a terminal (stdin, stdout and stderr on one pseudo-terminal).
    let mut child = Command::new("script")
        .args(["-qec", &format!("{AC7} run -- true"), "/dev/null"])
        .current_dir(dir.path())
        .env("AC7_URL", &s.url)
        .env("AC7_AUTH_FILE", &auth)
        .env("XDG_STATE_HOME", dir.path())
        .env_remove("AC7_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seen = Arc::new(Mutex::new(String::new()));
    let mut stdout = child.stdout.take().unwrap();
    let sink = Arc::clone(&seen);
    std::thread::spawn(move || {
        let mut buf = [0u8; 1024];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let wait_for = |what: &str| -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let text = seen.lock().unwrap().clone();
            if text.contains(what) {
                return text;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {what:?} in: {text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let asked = wait_for("[Y/n]");
    assert!(
        asked.contains(&format!("ac7 connect --url {}", s.url)),
        "{asked}"
    );
    child.stdin.as_mut().unwrap().write_all(b"y\n").unwrap();
    let shown = wait_for("code:   ");
    let code: String = shown
        .split("code:   ")
        .nth(1)
        .unwrap()
        .chars()
        .take(9)
        .collect();
    let (ok, _, err) = ac7_in(
        dir.path(),
        &dir.path().join("none.json"),
        &s.url,
        director,
        &["enroll", "approve", &code, "--member", "builder"],
    );
    assert!(ok, "{code}: {err}");
    wait_for("approved: this device is now builder");
    let status = child.wait().unwrap();
    let text = seen.lock().unwrap().clone();
    assert!(status.success(), "the agent ran with the new token: {text}");
    let stored: Value = serde_json::from_str(&std::fs::read_to_string(&auth).unwrap()).unwrap();
    assert_eq!(stored["entries"][0]["member"], "builder");
}
