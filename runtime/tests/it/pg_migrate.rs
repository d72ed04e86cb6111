//! `ac7 migrate --from FILE --to postgres://…`: a team built through a real `ac7 serve` on a
//! SQLite file is copied by the real binary into a fresh PostgreSQL database; then `ac7 serve`
//! runs on each (the file again, and the database) and both answer the same, with the old
//! tokens and the old browser session, and the PostgreSQL one takes new writes after the copied
//! rows. Also: a target that already holds a team, and a bad source, are refused with one line
//! and exit code 2, leaving the target as it was. Without a PostgreSQL server the tests skip
//! (fail under `CI=true`), as in `pg_store`.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ac7_protocol::signin::totp;
use ac7_runtime::broker::db::Store;
use ac7_runtime::broker::pg::PgPool;
use ac7_runtime::broker::store::Conn;
use ac7_runtime::params;
use serde_json::{Value, json};

use crate::broker_support::SseClient;
use crate::common::postgres::TestDb;
use crate::common::served::{self, Served};
use crate::common::{self, tempdir};

/// The team flags of the broker that builds the SQLite team.
const TEAM_FLAGS: [&str; 10] = [
    "--team-name",
    "crew",
    "--directive",
    "Ship the widget",
    "--member",
    "director:lead:admin",
    "--member",
    "builder:engineer",
    "--member",
    "reviewer:reviewer",
];

/// Every table `ac7 migrate` copies.
const TABLES: [&str; 20] = [
    "team",
    "members",
    "tokens",
    "sessions",
    "member_totp",
    "attempt_limits",
    "setup_code",
    "channels",
    "channel_members",
    "objectives",
    "objective_events",
    "message_keys",
    "messages",
    "blobs",
    "fs_entries",
    "fs_grants",
    "activity_blocks",
    "member_activity",
    "push_vapid",
    "push_subscriptions",
];

/// A running broker's HTTP API, with the members' bearer tokens.
struct Api {
    url: String,
    tokens: HashMap<String, String>,
    http: reqwest::Client,
}

/// An answer: status, JSON body (`Null` if none), raw bytes.
struct Reply {
    status: u16,
    json: Value,
    bytes: Vec<u8>,
    headers: reqwest::header::HeaderMap,
}

impl Api {
    fn new(served: &Served, tokens: &HashMap<String, String>) -> Api {
        Api {
            url: served.url.clone(),
            tokens: tokens.clone(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(20))
                .build()
                .unwrap(),
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Reply {
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.unwrap().to_vec();
        Reply {
            status,
            json: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            bytes,
            headers,
        }
    }

    fn request(&self, method: &str, path: &str, who: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method.parse().unwrap(), format!("{}{path}", self.url))
            .bearer_auth(&self.tokens[who])
    }

    async fn get(&self, path: &str, who: &str) -> Reply {
        self.send(self.request("GET", path, who)).await
    }

    /// A JSON request that must succeed; its answer.
    async fn ok(&self, method: &str, path: &str, who: &str, body: Value) -> Value {
        let r = self.send(self.request(method, path, who).json(&body)).await;
        assert!(
            (200..300).contains(&r.status),
            "{method} {path} as {who}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.bytes)
        );
        r.json
    }

    async fn push(&self, who: &str, body: Value) -> Value {
        self.ok("POST", "/push", who, body).await["message"].clone()
    }

    async fn write_file(&self, who: &str, path: &str, mime: &str, bytes: &[u8]) {
        let r = self
            .send(
                self.request("POST", "/fs/write", who)
                    .query(&[("path", path), ("mime", mime)])
                    .body(bytes.to_vec()),
            )
            .await;
        assert_eq!(r.status, 200, "write {path}: {}", r.json);
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The TOTP code of `secret`, `skew` steps from now.
fn code(secret: &str, skew: i64) -> String {
    let key = totp::base32_decode(secret).unwrap();
    let at = now_secs().saturating_add_signed(skew * totp::PERIOD as i64);
    totp::code_at(&key, at, totp::DIGITS)
}

/// `n` bytes that do not repeat in any useful way (a content larger than a chunk must arrive
/// in order, not just in size).
fn noise(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Stops a served broker as an operator does (SIGTERM) and waits for it to exit.
fn stop(mut served: Served) {
    let pid = i32::try_from(served.child.id()).unwrap();
    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(15);
    while served.child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "ac7 serve did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ac7 migrate --from from --to to`: (exit code, stdout, stderr without log lines).
fn migrate(from: &Path, to: &str) -> (Option<i32>, String, String) {
    let out = Command::new(common::ac7())
        .arg("migrate")
        .arg("--from")
        .arg(from)
        .args(["--to", to])
        .env("AC7_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| !l.starts_with('{'))
        .collect::<Vec<_>>()
        .join("\n");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

/// Rows per copied table of the PostgreSQL database, and its public tables.
async fn pg_state(pool: &PgPool) -> (Vec<(String, i64)>, Vec<String>) {
    let client = pool.get().await.unwrap();
    let tables: Vec<String> = client
        .query(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut counts = Vec::new();
    if tables.iter().any(|t| t == "team") {
        for t in TABLES {
            // The keys copied; audiences (JSON lists) are keys PostgreSQL adds.
            let only = if t == "message_keys" {
                " WHERE key NOT LIKE '[%'"
            } else {
                ""
            };
            let n: i64 = client
                .query_one(&format!("SELECT COUNT(*) FROM {t}{only}"), &[])
                .await
                .unwrap()
                .get(0);
            counts.push((t.to_owned(), n));
        }
    }
    (counts, tables)
}

/// Removes what differs between two brokers by nature, not by data: in the roster, the live
/// presence of each process (`connected`: stream counts, and the `createdAt`/`lastSeen` times
/// the process's hub keeps in memory), and in token lists `lastUsedAt` (each broker records the
/// uses it served).
fn normalise(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "lastUsedAt")
                .map(|(k, v)| {
                    let v = if k == "connected" && v.is_array() {
                        Value::Array(
                            v.as_array()
                                .unwrap()
                                .iter()
                                .map(|p| json!({"name": p["name"], "role": p["role"]}))
                                .collect(),
                        )
                    } else {
                        normalise(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(normalise).collect()),
        other => other.clone(),
    }
}

/// Asks both brokers `GET path` as `who` and asserts the same status and (normalised) body;
/// returns the body.
async fn same(sqlite: &Api, pg: &Api, path: &str, who: &str) -> Value {
    let a = sqlite.get(path, who).await;
    let b = pg.get(path, who).await;
    assert_eq!(a.status, 200, "{path} as {who} on SQLite: {}", a.json);
    assert_eq!(
        (b.status, normalise(&b.json)),
        (a.status, normalise(&a.json)),
        "{path} as {who}: PostgreSQL (left) and SQLite (right) differ"
    );
    a.json
}

/// The members' tokens printed by the broker that created the team.
fn tokens_of(served: &Served) -> HashMap<String, String> {
    served.tokens.iter().cloned().collect()
}

#[tokio::test]
async fn a_team_moved_to_postgres_answers_as_it_did_on_sqlite() {
    let started = Instant::now();
    let Some(pg_db) = TestDb::create().await else {
        return;
    };
    let dir = tempdir();
    let file = dir.path().join("team.db");

    // --- a team with some history, on SQLite ---
    let first = served::serve(&file, &TEAM_FLAGS);
    let tokens = tokens_of(&first);
    let api = Api::new(&first, &tokens);
    api.push("director", json!({"body": "hello team"})).await;
    let dm = api
        .push(
            "director",
            json!({"to": "builder", "body": "please build the widget", "title": "task"}),
        )
        .await;
    api.push("builder", json!({"to": "director", "body": "on it"}))
        .await;
    api.push(
        "reviewer",
        json!({"to": "builder", "body": "ping me when ready"}),
    )
    .await;
    // A member added and removed: its id stays used, and the next member gets the one after.
    api.ok(
        "POST",
        "/members",
        "director",
        json!({"name": "temp", "role": {"title": "temp", "description": ""}, "permissions": []}),
    )
    .await;
    let r = api
        .send(api.request("DELETE", "/members/temp", "director"))
        .await;
    assert_eq!(r.status, 204, "{}", r.json);
    // A browser's Web Push subscription (and the team's key, made at start).
    api.ok(
        "POST",
        "/push/subscriptions",
        "reviewer",
        json!({"endpoint": "https://push.example/send/1", "keys": {
            "p256dh": "BLO_sodevuxtHTHq2-JxC4KlvR3cYNI_EUfpO1J2p3wt1d3dtr216q1CxeEmO9TKilQ3EjW5gw_z_jtLR9SDz7I",
            "auth": "AAECAwQFBgcICQoLDA0ODw"}}),
    )
    .await;
    // A channel with two members and posts.
    let chan = api
        .ok("POST", "/channels", "builder", json!({"slug": "dev"}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    api.ok(
        "POST",
        "/channels/dev/members",
        "builder",
        json!({"member": "reviewer"}),
    )
    .await;
    let thread = json!({"thread": format!("chan:{chan}")});
    api.push("builder", json!({"body": "dev: started", "data": thread}))
        .await;
    api.push("reviewer", json!({"body": "dev: watching", "data": thread}))
        .await;
    // Objectives: one through its whole lifecycle, one left open.
    let widget = api
        .ok(
            "POST",
            "/objectives",
            "director",
            json!({"title": "Build the widget", "outcome": "It builds", "body": "Details",
                   "assignee": "builder", "watchers": ["reviewer"]}),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let widget_path = format!("/objectives/{widget}");
    api.ok(
        "PATCH",
        &widget_path,
        "builder",
        json!({"status": "blocked", "blockReason": "waiting on keys"}),
    )
    .await;
    api.ok(
        "PATCH",
        &widget_path,
        "builder",
        json!({"status": "active"}),
    )
    .await;
    api.ok(
        "POST",
        &format!("{widget_path}/discuss"),
        "reviewer",
        json!({"body": "looks good so far"}),
    )
    .await;
    api.ok(
        "POST",
        &format!("{widget_path}/complete"),
        "builder",
        json!({"result": "Built; tests pass."}),
    )
    .await;
    let docs = api
        .ok(
            "POST",
            "/objectives",
            "director",
            json!({"title": "Write the docs", "outcome": "Docs exist", "assignee": "reviewer"}),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Files: text, a content shared by two entries, an empty one, one over a chunk (256 KiB).
    let big = noise(700_001);
    let files: Vec<(&str, &str, &str, Vec<u8>)> = vec![
        (
            "builder",
            "/builder/notes.txt",
            "text/plain",
            b"widget notes\n".to_vec(),
        ),
        (
            "builder",
            "/builder/copy/notes.txt",
            "text/plain",
            b"widget notes\n".to_vec(),
        ),
        ("builder", "/builder/empty.txt", "text/plain", Vec::new()),
        (
            "builder",
            "/builder/big.bin",
            "application/octet-stream",
            big.clone(),
        ),
        (
            "director",
            "/director/plan.md",
            "text/markdown",
            b"# Plan\n".to_vec(),
        ),
    ];
    for (who, path, mime, bytes) in &files {
        api.write_file(who, path, mime, bytes).await;
    }
    // An attachment grants the DM's recipient read access.
    api.push(
        "builder",
        json!({"to": "reviewer", "body": "see the notes", "attachments": [
            {"path": "/builder/notes.txt", "name": "notes.txt", "size": 13, "mimeType": "text/plain"}]}),
    )
    .await;
    // Activity.
    let activity = json!({"events": [
        {"kind": "objective_open", "ts": 1000, "objectiveId": widget},
        {"kind": "opaque_http", "ts": 2000, "duration": 5, "entry": {
            "kind": "opaque_http", "startedAt": 2000, "endedAt": 2005, "host": "example.com",
            "method": "GET", "url": "/x", "status": 200, "requestHeaders": {},
            "responseHeaders": {}, "requestBodyPreview": null, "responseBodyPreview": "ok"}},
        {"kind": "objective_close", "ts": 3000, "objectiveId": widget, "result": "done"}
    ]});
    // Model exchanges, whose shared parts are blocks.
    let mut activity = activity;
    let exchanges = crate::broker_activity::session(4, "builder");
    activity["events"]
        .as_array_mut()
        .unwrap()
        .extend(exchanges[..3].iter().cloned());
    api.ok("POST", "/members/builder/activity", "builder", activity)
        .await;
    api.ok(
        "POST",
        "/members/reviewer/activity",
        "reviewer",
        json!({"events": [{"kind": "objective_open", "ts": 1500, "objectiveId": docs}]}),
    )
    .await;
    // A browser session: TOTP enrolled and confirmed, then a sign-in.
    let secret = api
        .ok(
            "POST",
            "/members/director/enroll-totp",
            "director",
            json!({}),
        )
        .await["totpSecret"]
        .as_str()
        .unwrap()
        .to_owned();
    api.ok(
        "POST",
        "/members/director/enroll-totp/confirm",
        "director",
        json!({"code": code(&secret, 0)}),
    )
    .await;
    let signed_in = api
        .send(
            api.http
                .post(format!("{}/session/totp", api.url))
                .json(&json!({"code": code(&secret, 1), "member": "director"})),
        )
        .await;
    assert_eq!(signed_in.status, 200, "{}", signed_in.json);
    // A wrong code: the sign-in limiter keeps a failure.
    let good = code(&secret, 0);
    let wrong = format!(
        "{:06}",
        (good.parse::<u32>().unwrap() + 500_000) % 1_000_000
    );
    let refused = api
        .send(
            api.http
                .post(format!("{}/session/totp", api.url))
                .json(&json!({"code": wrong, "member": "director"})),
        )
        .await;
    assert_eq!(refused.status, 401, "{}", refused.json);
    let cookie = signed_in.headers["set-cookie"]
        .to_str()
        .unwrap()
        .strip_prefix("ac7_session=")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();

    // --- while the broker runs, the file is refused and PostgreSQL is not touched ---
    let (code_busy, _, stderr) = migrate(&file, &pg_db.url);
    assert_eq!(code_busy, Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("is in use by another process"), "{stderr}");
    let pool = pg_db.pool().await;
    assert_eq!(pg_state(&pool).await.1, Vec::<String>::new());
    stop(first);

    // --- the copy ---
    let (status, stdout, stderr) = migrate(&file, &pg_db.url);
    assert_eq!(status, Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.starts_with("copied team 'crew' from "), "{stdout}");
    let summary: HashMap<String, i64> = stdout
        .lines()
        .filter_map(|l| {
            let (name, n) = l.trim().rsplit_once(' ')?;
            Some((name.trim().to_owned(), n.parse().ok()?))
        })
        .collect();
    // Every table: as many rows on PostgreSQL as in the file, and as the summary says; the
    // counters continue where SQLite's stopped.
    let (pg_counts, _) = pg_state(&pool).await;
    let (sqlite_counts, content_bytes, counters) = {
        // Read-only and without the broker's lock, which the broker started below takes.
        let conn = rusqlite::Connection::open_with_flags(
            &file,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap();
        let c = Conn::sqlite(&conn);
        let one = |sql: &str, arg: &str| -> i64 {
            let args = if arg.is_empty() {
                params![]
            } else {
                params![arg]
            };
            c.query_row(sql, args, |r| r.get::<i64>(0))
                .unwrap()
                .unwrap_or(0)
        };
        let counts: Vec<(String, i64)> = TABLES
            .iter()
            .map(|t| (t.to_string(), one(&format!("SELECT COUNT(*) FROM {t}"), "")))
            .collect();
        let bytes = one("SELECT COALESCE(SUM(size), 0) FROM blobs", "");
        let mut counters: HashMap<&str, i64> = ["members", "objective_events", "member_activity"]
            .into_iter()
            .map(|t| (t, one("SELECT seq FROM sqlite_sequence WHERE name = ?1", t)))
            .collect();
        // The log's numbers: the newest row's, or the mark pruning left above it.
        counters.insert(
            "messages",
            one(
                "SELECT MAX(seq, COALESCE((SELECT MAX(seq) FROM messages), 0))
                 FROM messages_mark WHERE id = 1",
                "",
            ),
        );
        (counts, bytes, counters)
    };
    assert_eq!(pg_counts, sqlite_counts);
    let held = |t: &str| sqlite_counts.iter().find(|(n, _)| n == t).unwrap().1;
    assert!(held("attempt_limits") > 0 && held("sessions") > 0 && held("member_totp") > 0);
    for (t, n) in &sqlite_counts {
        assert_eq!(summary.get(t.as_str()), Some(n), "summary of {t}: {stdout}");
    }
    assert_eq!(summary.get("content bytes"), Some(&content_bytes));
    assert_eq!(
        content_bytes,
        files.iter().map(|f| f.3.len() as i64).sum::<i64>() - 13,
        "one content is shared by two entries"
    );
    assert_eq!(counters["members"], 4, "temp took id 4");
    {
        let client = pool.get().await.unwrap();
        let head: i64 = client
            .query_one("SELECT last_seq FROM log_head", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(head, counters["messages"]);
        // The big file is three chunks, in order.
        let hash: String = client
            .query_one(
                "SELECT hash FROM fs_entries WHERE path = '/builder/big.bin'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let chunks: Vec<(i32, i32)> = client
            .query(
                "SELECT idx, length(data) FROM blob_chunks WHERE hash = $1 ORDER BY idx",
                &[&hash],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(chunks, [(0, 262_144), (1, 262_144), (2, 175_713)]);
        // The audience of each message, as the push path gives it: NULL where the route
        // implies it (general: everyone; a DM: its two parties), a thread its members
        // (objective threads include the admin).
        let rows = client
            .query(
                "SELECT hk.key, tk.key, fk.key, ak.key FROM messages m
                 LEFT JOIN message_keys hk ON hk.id = abs(m.thread)
                 LEFT JOIN message_keys tk ON tk.id = m.to_key
                 LEFT JOIN message_keys fk ON fk.id = m.from_key
                 LEFT JOIN message_keys ak ON ak.id = m.audience
                 ORDER BY m.seq",
                &[],
            )
            .await
            .unwrap();
        let chan_thread = format!("chan:{chan}");
        let widget_thread = format!("obj:{widget}");
        let docs_thread = format!("obj:{docs}");
        for r in &rows {
            let (thread, to, from, audience): (
                Option<String>,
                Option<String>,
                String,
                Option<String>,
            ) = (r.get(0), r.get(1), r.get(2), r.get(3));
            let expected = match (thread.as_deref(), to) {
                (_, Some(_)) | (Some("chan:general"), None) => None,
                (Some(t), None) if t == chan_thread => Some(r#"["builder","reviewer"]"#.to_owned()),
                (Some(t), None) if t == widget_thread => {
                    Some(r#"["builder","director","reviewer"]"#.to_owned())
                }
                (Some(t), None) if t == docs_thread => {
                    Some(r#"["director","reviewer"]"#.to_owned())
                }
                other => panic!("a message nobody pushed: {other:?}"),
            };
            assert_eq!(audience, expected, "{thread:?} from {from}");
        }
        assert_eq!(rows.len() as i64, summary["messages"]);
    }

    // --- both brokers, side by side ---
    let on_pg = served::serve(Path::new(&pg_db.url), &[]);
    let on_file = served::serve(&file, &[]);
    let pg = Api::new(&on_pg, &tokens);
    let sqlite = Api::new(&on_file, &tokens);
    let members = ["director", "builder", "reviewer"];
    for who in members {
        for path in [
            "/history",
            "/history?limit=3",
            "/briefing",
            "/roster",
            "/objectives",
            "/channels",
            "/fs/ls?path=/",
            "/fs/shared",
            "/session",
        ] {
            same(&sqlite, &pg, path, who).await;
        }
        same(&sqlite, &pg, &format!("/fs/ls?path=/{who}"), who).await;
        same(&sqlite, &pg, &format!("/members/{who}/activity"), who).await;
    }
    // The same VAPID key: browsers' subscriptions stay valid.
    same(&sqlite, &pg, "/push/vapid-public-key", "director").await;
    let all = same(&sqlite, &pg, "/history?limit=1000", "director").await;
    let ids: Vec<&str> = all["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(ids.len() >= 10, "{ids:?}");
    for (path, who) in [
        ("/history?with=builder".to_owned(), "director"),
        ("/history?with=director".to_owned(), "builder"),
        ("/history?with=reviewer".to_owned(), "builder"),
        ("/history?channel=dev".to_owned(), "reviewer"),
        ("/history?channel=general".to_owned(), "builder"),
        (
            format!("/history?after_id={}", ids[ids.len() - 3]),
            "builder",
        ),
        (
            format!("/history?after_id={}&limit=2", ids[ids.len() - 2]),
            "director",
        ),
        (format!("/history?before_id={}", ids[2]), "reviewer"),
        (
            format!("/history?after_id={}", dm["id"].as_str().unwrap()),
            "builder",
        ),
        (widget_path.clone(), "director"),
        (widget_path.clone(), "reviewer"),
        (format!("/objectives/{docs}"), "reviewer"),
        (format!("{widget_path}/activity"), "director"),
        ("/channels/dev".to_owned(), "builder"),
        ("/fs/all".to_owned(), "director"),
        ("/fs/ls?path=/builder/copy".to_owned(), "builder"),
        ("/fs/stat?path=/builder/big.bin".to_owned(), "builder"),
        ("/members".to_owned(), "director"),
        ("/members/director/tokens".to_owned(), "director"),
        ("/members/builder/activity".to_owned(), "director"),
        ("/members/builder/activity?limit=2".to_owned(), "builder"),
        ("/team".to_owned(), "director"),
    ] {
        same(&sqlite, &pg, &path, who).await;
    }
    // File contents, byte for byte (and the grant: reviewer reads builder's notes).
    for (who, path, mime, bytes) in files.iter().map(|(w, p, m, b)| (*w, *p, *m, b)).chain([(
        "reviewer",
        "/builder/notes.txt",
        "text/plain",
        &files[0].3,
    )]) {
        let a = sqlite.get(&format!("/fs/read{path}"), who).await;
        let b = pg.get(&format!("/fs/read{path}"), who).await;
        assert_eq!((a.status, b.status), (200, 200), "{path} as {who}");
        assert!(a.bytes == *bytes, "{path} on SQLite");
        assert!(
            b.bytes == *bytes,
            "{path} on PostgreSQL: {} bytes",
            b.bytes.len()
        );
        assert_eq!(
            a.headers["content-type"], b.headers["content-type"],
            "{path}"
        );
        assert!(
            b.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with(mime),
            "{path}"
        );
    }
    // The browser session signed in on SQLite is signed in on PostgreSQL.
    for api in [&sqlite, &pg] {
        let r = api
            .send(
                api.http
                    .get(format!("{}/session", api.url))
                    .header("cookie", format!("ac7_session={cookie}")),
            )
            .await;
        assert_eq!(
            (r.status, r.json["member"].clone()),
            (200, json!("director"))
        );
    }
    stop(on_file);

    // --- PostgreSQL carries on after the copied rows ---
    let mut stream = SseClient::from_response(
        pg.request("GET", "/subscribe?name=builder", "builder")
            .send()
            .await
            .unwrap(),
    );
    let newest = pg.get("/history?limit=1", "builder").await.json["messages"][0]["id"].clone();
    let fresh = pg
        .push(
            "director",
            json!({"to": "builder", "body": "after the move"}),
        )
        .await;
    assert_eq!(stream.next_message().await["id"], fresh["id"]);
    let history = pg.get("/history?limit=2", "builder").await.json;
    assert_eq!(history["messages"][0]["id"], fresh["id"]);
    assert_eq!(history["messages"][1]["id"], newest);
    pg.ok(
        "POST",
        "/members",
        "director",
        json!({"name": "newbie", "role": {"title": "new", "description": ""}, "permissions": []}),
    )
    .await;
    pg.ok(
        "PATCH",
        &format!("/objectives/{docs}"),
        "reviewer",
        json!({"status": "blocked", "blockReason": "needs the widget"}),
    )
    .await;
    pg.ok(
        "POST",
        "/members/builder/activity",
        "builder",
        json!({"events": [{"kind": "objective_open", "ts": 5000, "objectiveId": docs}]}),
    )
    .await;
    // The next exchange of the copied session: new blocks after the copied ones.
    pg.ok(
        "POST",
        "/members/builder/activity",
        "builder",
        json!({"events": [crate::broker_activity::session(4, "builder")[3].clone()]}),
    )
    .await;
    let row = &pg
        .get("/members/builder/activity?limit=1", "builder")
        .await
        .json["activity"][0];
    assert_eq!(
        row["event"],
        crate::broker_activity::session(4, "builder")[3]
    );
    let client = pool.get().await.unwrap();
    let next = |sql: &'static str| {
        let client = &client;
        async move { client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    assert_eq!(
        next("SELECT seq FROM members WHERE name = 'newbie'").await,
        counters["members"] + 1
    );
    assert_eq!(
        next("SELECT MAX(seq) FROM messages").await,
        counters["messages"] + 2,
        "the DM, then the lifecycle message of the update"
    );
    assert_eq!(
        next("SELECT MAX(seq) FROM objective_events").await,
        counters["objective_events"] + 1
    );
    assert_eq!(
        next("SELECT MAX(id) FROM member_activity").await,
        counters["member_activity"] + 2,
        "the marker, then the exchange"
    );
    drop(on_pg);
    eprintln!("pg_migrate: the round trip took {:?}", started.elapsed());
}

#[tokio::test]
async fn a_target_that_holds_a_team_is_refused_and_left_as_it_was() {
    let Some(pg_db) = TestDb::create().await else {
        return;
    };
    // Replicas already made a team there.
    let replica = served::serve(
        Path::new(&pg_db.url),
        &[
            "--team-name",
            "live",
            "--directive",
            "d",
            "--member",
            "boss:lead:admin",
        ],
    );
    let live = Api::new(&replica, &tokens_of(&replica));
    live.push("boss", json!({"body": "already running"})).await;
    drop(replica);
    let dir = tempdir();
    let file = dir.path().join("team.db");
    stop(served::serve(&file, &TEAM_FLAGS));
    let pool = pg_db.pool().await;
    let before = pg_state(&pool).await;
    let (status, stdout, stderr) = migrate(&file, &pg_db.url);
    assert_eq!(status, Some(2), "stdout: {stdout}\nstderr: {stderr}");
    assert_eq!(stdout, "");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("ac7: ")
            && stderr.contains("is not empty")
            && stderr.contains("team 'live' with 1 members and 1 messages"),
        "{stderr}"
    );
    assert!(!stderr.contains("crew"), "{stderr}");
    assert_eq!(pg_state(&pool).await, before);
}

#[tokio::test]
async fn a_bad_source_fails_cleanly_before_touching_postgres() {
    let Some(pg_db) = TestDb::create().await else {
        return;
    };
    let dir = tempdir();
    let garbage = dir.path().join("garbage.db");
    std::fs::write(
        &garbage,
        b"this is not a database at all, just some bytes".repeat(200),
    )
    .unwrap();
    // A SQLite database of something else.
    let foreign = dir.path().join("foreign.db");
    rusqlite::Connection::open(&foreign)
        .unwrap()
        .execute_batch("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        .unwrap();
    // An ac7 database before any team was put in it: the broker's schema, no rows.
    let teamless = dir.path().join("teamless.db");
    let schema = Store::open_in_memory()
        .unwrap()
        .view(|c| {
            c.query(
                "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'",
                params![],
                |r| r.get::<String>(0),
            )
        })
        .unwrap();
    rusqlite::Connection::open(&teamless)
        .unwrap()
        .execute_batch(&schema.join(";\n"))
        .unwrap();
    // One written before member incarnations, never opened by this ac7 since.
    let old = dir.path().join("old.db");
    let conn = rusqlite::Connection::open(&old).unwrap();
    conn.execute_batch(&schema.join(";\n")).unwrap();
    conn.execute_batch("ALTER TABLE members DROP COLUMN since_seq")
        .unwrap();
    drop(conn);
    let cases = [
        (dir.path().join("missing.db"), "no SQLite database at"),
        (dir.path().to_owned(), "no SQLite database at"),
        (garbage, "is not an ac7 database: file is not a database"),
        (foreign, "is not an ac7 database: it has no team table"),
        (teamless, "has no team: there is nothing to migrate"),
        (
            old,
            "was written by an older ac7 (it has no column members.since_seq): run `ac7 member list --db",
        ),
    ];
    let pool = pg_db.pool().await;
    for (from, says) in cases {
        let (status, stdout, stderr) = migrate(&from, &pg_db.url);
        assert_eq!(status, Some(2), "{}: {stderr}", from.display());
        assert_eq!(stdout, "");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("ac7: ") && stderr.contains(says),
            "{}: {stderr}",
            from.display()
        );
    }
    // Nothing was created in the target.
    assert_eq!(pg_state(&pool).await, (Vec::new(), Vec::new()));
    // A bad URL is refused the same way.
    let (status, _, stderr) = migrate(&dir.path().join("x.db"), "mysql://nope");
    assert_eq!(status, Some(2));
    assert!(stderr.starts_with("ac7: bad PostgreSQL URL"), "{stderr}");
}
