//! Several brokers (replicas) on one PostgreSQL database: a message pushed on any replica
//! reaches the live streams of every replica, in log order, once; a stream that moves to
//! another replica resumes with `Last-Event-ID` without a gap or a duplicate.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::collections::HashMap;
use std::time::Duration;

use ac7_runtime::broker::bootstrap;
use ac7_runtime::broker::config::TeamConfig;
use ac7_runtime::broker::db::Store;
use ac7_runtime::broker::pg::PgConfig;
use serde_json::{Value, json};

use crate::broker_support::{self, TEAM, TestBroker};
use crate::common::postgres::TestDb;

/// `n` brokers on `db` (the team bootstrapped once), each its own [`TestBroker`].
async fn replicas(db: &TestDb, n: usize) -> Vec<TestBroker> {
    replicas_with(db, n, |_| {}).await
}

/// [`replicas`], each broker's settings changed by `tweak` first.
pub(crate) async fn replicas_with(
    db: &TestDb,
    n: usize,
    tweak: impl Fn(&mut ac7_runtime::broker::BrokerConfig),
) -> Vec<TestBroker> {
    let config: TeamConfig = serde_json::from_str(TEAM).unwrap();
    let pg = PgConfig::parse(&db.url).unwrap();
    let tokens: HashMap<String, String> = {
        let store = Store::open_postgres(pg.clone()).unwrap();
        bootstrap::bootstrap(&store, &config)
            .unwrap()
            .into_iter()
            .map(|i| (i.name, i.token))
            .collect()
    };
    let mut out = Vec::new();
    for _ in 0..n {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ac7_runtime::broker::BrokerConfig::new(dir.path().join("ac7.db"));
        cfg.postgres = Some(pg.clone());
        tweak(&mut cfg);
        let broker = broker_support::start_on(cfg, "127.0.0.1:0".parse().unwrap()).await;
        out.push(TestBroker {
            url: format!("http://{}", broker.addr),
            tokens: tokens.clone(),
            broker,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            dir,
            pg: None,
        });
    }
    out
}

fn bodies(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn pushes_on_any_replica_reach_every_replica_in_log_order_once() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas(&db, 3).await;
    // A stream on each replica; DMs and general messages pushed on all three at once.
    let mut streams = Vec::new();
    for r in &rs {
        streams.push(r.sse("builder", None).await);
    }
    let total = 60;
    let mut tasks = Vec::new();
    for (i, r) in rs.iter().enumerate() {
        let (http, url, token) = (
            r.http.clone(),
            r.url.clone(),
            r.token("director").to_owned(),
        );
        tasks.push(tokio::spawn(async move {
            for k in 0..total / 3 {
                let body = if k % 2 == 0 {
                    json!({"to": "builder", "body": format!("dm r{i} #{k}")})
                } else {
                    json!({"body": format!("all r{i} #{k}")})
                };
                let r = http
                    .post(format!("{url}/push"))
                    .bearer_auth(&token)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // The log's order: /history pages newest first.
    let history = rs[0].get("/history?limit=1000", "builder").await.json;
    let mut sent: Vec<String> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    sent.reverse();
    assert_eq!(sent.len(), total, "{history}");
    for (i, s) in streams.iter_mut().enumerate() {
        let mut got = Vec::new();
        for _ in 0..total {
            got.push(s.next_message().await);
        }
        let got_ids: Vec<String> = got
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            got_ids,
            sent,
            "replica {i}: every message, once, in log order ({:?})",
            bodies(&got)
        );
    }
}

/// Each replica keeps its member list while the members stay the same: a change on one replica
/// shows on every replica's roster at once.
#[tokio::test]
async fn a_member_change_on_one_replica_shows_on_every_roster_at_once() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas(&db, 2).await;
    broker_support::rosters_follow_member_changes(&rs[0], &[&rs[0], &rs[1]]).await;
    broker_support::rosters_follow_member_changes(&rs[1], &[&rs[0], &rs[1]]).await;
}

#[tokio::test]
async fn a_stream_that_moves_replica_resumes_without_gap_or_duplicate() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas(&db, 2).await;
    let mut on_a = rs[0].sse("builder", None).await;
    let mut first = Vec::new();
    for k in 0..5 {
        first.push(
            rs[1]
                .push(
                    "director",
                    json!({"to": "builder", "body": format!("m{k}")}),
                )
                .await,
        );
    }
    let mut last = String::new();
    for m in &first {
        let got = on_a.next_message().await;
        assert_eq!(got["id"], m["id"]);
        last = got["id"].as_str().unwrap().to_owned();
    }
    drop(on_a);
    // While no stream is open, more messages, on both replicas.
    let mut missed = Vec::new();
    for k in 5..10 {
        let r = &rs[k % 2];
        missed.push(
            r.push(
                "director",
                json!({"to": "builder", "body": format!("m{k}")}),
            )
            .await,
        );
    }
    // Resume on the other replica: the missed ones replayed, then live.
    let mut on_b = rs[1].sse("builder", Some(&last)).await;
    for m in &missed {
        assert_eq!(on_b.next_message().await["id"], m["id"]);
    }
    let live = rs[0]
        .push("director", json!({"to": "builder", "body": "live"}))
        .await;
    assert_eq!(on_b.next_message().await["id"], live["id"]);
}

/// A channel renamed through one replica reaches the browsers on another at once: the
/// change rings every replica through the database, and each tells its own browser streams.
#[tokio::test]
async fn a_channel_change_on_one_replica_is_a_notice_to_browsers_on_every_replica() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas(&db, 2).await;
    let cookie = crate::web_auth::login(&rs[1], "builder").await;
    let mut browser = rs[1].browser_sse("builder", &cookie).await;
    // Its own stream opening is the first notice.
    assert_eq!(
        browser.next_event().await.event.as_deref(),
        Some("presence")
    );
    for (method, path, body) in [
        ("POST", "/channels", Some(json!({"slug": "plans"}))),
        ("PATCH", "/channels/plans", Some(json!({"slug": "roadmap"}))),
        ("DELETE", "/channels/roadmap", None),
    ] {
        let r = rs[0].call(method, path, "director", body).await;
        assert!(r.status < 300, "{method} {path}: {} {}", r.status, r.json);
        let ev = browser.next_event().await;
        assert_eq!(
            (ev.event.as_deref(), ev.data.as_str()),
            (Some("channels"), r#"{"type":"channels"}"#),
            "after {method} {path} on the other replica"
        );
    }
    // And a change on its own replica is heard once (through the database, as on the others).
    let r = rs[1]
        .call(
            "POST",
            "/channels",
            "director",
            Some(json!({"slug": "ops"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    assert_eq!(
        browser.next_event().await.event.as_deref(),
        Some("channels")
    );
    let m = rs[0]
        .push("director", json!({"to": "builder", "body": "after"}))
        .await;
    assert_eq!(browser.next_message().await["id"], m["id"]);
}

/// Follows `builder`'s stream on `urls[0]`; when it breaks, resumes on the next URL with
/// `Last-Event-ID`. Records every message id it receives, in order.
async fn follow(
    urls: Vec<String>,
    token: String,
    got: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    use futures_util::StreamExt;
    let http = reqwest::Client::new();
    let mut last: Option<String> = None;
    for url in urls.iter().cycle().take(8) {
        let mut req = http
            .get(format!("{url}/subscribe?name=builder"))
            .bearer_auth(&token)
            .header("accept", "text/event-stream");
        if let Some(id) = &last {
            req = req.header("last-event-id", id);
        }
        let Ok(resp) = req.send().await else {
            continue;
        };
        let mut body = resp.bytes_stream();
        let mut buf = String::new();
        while let Some(Ok(chunk)) = body.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                let id = event.lines().find_map(|l| l.strip_prefix("id: "));
                let is_message = event.lines().any(|l| l == "event: message");
                if let (Some(id), true) = (id, is_message) {
                    got.lock().unwrap().push(id.to_owned());
                    last = Some(id.to_owned());
                }
            }
        }
    }
}

#[tokio::test]
async fn a_replica_killed_mid_flood_loses_nothing_acknowledged() {
    use crate::common::served::{serve, token};
    let Some(db) = TestDb::create().await else {
        return;
    };
    let target = std::path::Path::new(&db.url);
    // The first replica creates the team; the second joins it.
    let mut a = serve(
        target,
        &[
            "--team-name",
            "replicated",
            "--directive",
            "Stay up.",
            "--member",
            "director:lead:admin",
            "--member",
            "builder:engineer",
        ],
    );
    let b = serve(target, &[]);
    assert!(b.tokens.is_empty(), "a joining replica prints no tokens");
    let (director, builder) = (
        token(&a, "director").to_owned(),
        token(&a, "builder").to_owned(),
    );
    // One stream starts on the replica that dies (and must move), one on the survivor.
    let moving = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let staying = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let followers = [
        tokio::spawn(follow(
            vec![a.url.clone(), b.url.clone()],
            builder.clone(),
            std::sync::Arc::clone(&moving),
        )),
        tokio::spawn(follow(
            vec![b.url.clone()],
            builder.clone(),
            std::sync::Arc::clone(&staying),
        )),
    ];
    tokio::time::sleep(Duration::from_millis(300)).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut acked = Vec::new();
    let mut killed = false;
    for i in 0..200 {
        if i == 100 {
            a.child.kill().unwrap();
            a.child.wait().unwrap();
            killed = true;
        }
        // Even pushes go to A while it lives; a refused push moves on to B.
        for url in [&a.url, &b.url]
            .into_iter()
            .skip(usize::from(killed || i % 2 == 1))
        {
            let sent = http
                .post(format!("{url}/push"))
                .bearer_auth(&director)
                .json(&json!({"to": "builder", "body": format!("flood {i}")}))
                .send()
                .await;
            if let Ok(r) = sent {
                assert_eq!(r.status(), 200);
                let v: Value = r.json().await.unwrap();
                acked.push(v["message"]["id"].as_str().unwrap().to_owned());
                break;
            }
        }
    }
    assert_eq!(acked.len(), 200);
    let last = acked.last().unwrap().clone();
    for (what, got) in [("moving", &moving), ("staying", &staying)] {
        crate::common::wait_until(
            &format!("the {what} stream to receive the last push"),
            Duration::from_secs(20),
            async || got.lock().unwrap().contains(&last).then_some(()),
        )
        .await;
        let got = got.lock().unwrap().clone();
        let mut seen = std::collections::HashSet::new();
        assert!(
            got.iter().all(|id| seen.insert(id)),
            "{what}: a message arrived twice"
        );
        let in_order: Vec<&String> = got.iter().filter(|id| acked.contains(id)).collect();
        assert_eq!(
            in_order,
            acked.iter().collect::<Vec<_>>(),
            "{what}: every acknowledged push, once, in order"
        );
    }
    for f in followers {
        f.abort();
    }
}

#[tokio::test]
async fn two_replicas_starting_at_once_on_an_empty_database_make_one_team() {
    use crate::common::served::serve;
    let Some(db) = TestDb::create().await else {
        return;
    };
    let flags = [
        "--team-name",
        "together",
        "--directive",
        "Start together.",
        "--member",
        "director:lead:admin",
        "--member",
        "builder:engineer",
    ];
    let starts: Vec<_> = (0..2)
        .map(|_| {
            let url = db.url.clone();
            std::thread::spawn(move || serve(std::path::Path::new(&url), &flags))
        })
        .collect();
    let served: Vec<_> = starts.into_iter().map(|t| t.join().unwrap()).collect();
    let creators: Vec<_> = served.iter().filter(|s| !s.tokens.is_empty()).collect();
    assert_eq!(creators.len(), 1, "exactly one replica created the team");
    let director = &creators[0]
        .tokens
        .iter()
        .find(|(n, _)| n == "director")
        .unwrap()
        .1;
    let http = reqwest::Client::new();
    for s in &served {
        let roster: Value = http
            .get(format!("{}/roster", s.url))
            .bearer_auth(director)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let names: Vec<&str> = roster["teammates"]
            .as_array()
            .unwrap_or_else(|| panic!("{roster}"))
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["director", "builder"], "{roster}");
    }
    let admin = ac7_runtime::broker::pg::PgPool::connect(PgConfig::parse(&db.url).unwrap())
        .await
        .unwrap();
    let migrations: i64 = admin
        .get()
        .await
        .unwrap()
        .query_one("SELECT count(*) FROM schema_migrations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        migrations,
        i64::from(ac7_runtime::broker::pg::latest_version())
    );
}

/// A TCP forwarder to the PostgreSQL server that the test can cut (every connection dropped,
/// new ones refused) and bring back on the same port: PostgreSQL going away, for one broker.
struct Cuttable {
    port: u16,
    tasks: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Cuttable {
    async fn open(port: u16) -> Cuttable {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let tasks = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let held = std::sync::Arc::clone(&tasks);
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let conn = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect("127.0.0.1:5432").await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                held.lock().unwrap().push(conn);
            }
        });
        tasks.lock().unwrap().push(accept);
        Cuttable { port, tasks }
    }

    fn cut(&self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

// Multi-threaded: the forwarder's tasks run while a broker thread waits on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_away_is_503_then_everything_resumes_and_nothing_acknowledged_is_lost() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    if !db.url.contains("@127.0.0.1:5432/") {
        eprintln!("skipped: the forwarder reaches PostgreSQL at 127.0.0.1:5432 only");
        return;
    }
    let config: TeamConfig = serde_json::from_str(TEAM).unwrap();
    let tokens: HashMap<String, String> = {
        let store = Store::open_postgres(PgConfig::parse(&db.url).unwrap()).unwrap();
        bootstrap::bootstrap(&store, &config)
            .unwrap()
            .into_iter()
            .map(|i| (i.name, i.token))
            .collect()
    };
    let proxy = Cuttable::open(0).await;
    let via_proxy = db
        .url
        .replace("@127.0.0.1:5432/", &format!("@127.0.0.1:{}/", proxy.port));
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ac7_runtime::broker::BrokerConfig::new(dir.path().join("ac7.db"));
    let mut pg = PgConfig::parse(&via_proxy).unwrap();
    pg.connect_timeout = Duration::from_secs(1);
    cfg.postgres = Some(pg);
    let broker = broker_support::start_on(cfg, "127.0.0.1:0".parse().unwrap()).await;
    let b = TestBroker {
        url: format!("http://{}", broker.addr),
        tokens,
        broker,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        dir,
        pg: None,
    };
    let mut stream = b.sse("builder", None).await;
    let mut acked = vec![
        b.push("director", json!({"to": "builder", "body": "before"}))
            .await,
    ];

    proxy.cut();
    let r = b
        .post(
            "/push",
            "director",
            json!({"to": "builder", "body": "while away"}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["code"].clone()),
        (503, json!("database_unavailable")),
        "{}",
        r.text
    );
    assert!(r.json["error"].as_str().is_some(), "{}", r.text);
    let r = b.get("/history?with=director", "builder").await;
    assert_eq!(r.status, 503, "{}", r.text);

    // PostgreSQL is back: the broker reconnects by itself.
    let _back = Cuttable::open(proxy.port).await;
    crate::common::wait_until(
        "pushes to succeed again",
        Duration::from_secs(20),
        async || {
            let r = b
                .post(
                    "/push",
                    "director",
                    json!({"to": "builder", "body": "after"}),
                )
                .await;
            (r.status == 200).then(|| r.json["message"].clone())
        },
    )
    .await;
    let history = b
        .get("/history?with=director&limit=100", "builder")
        .await
        .json;
    let mut logged: Vec<Value> = history["messages"].as_array().unwrap().clone();
    logged.reverse();
    let after = logged.last().unwrap().clone();
    acked.push(after.clone());
    // Nothing acknowledged is lost; the refused push is not in the log.
    let bodies: Vec<&str> = logged.iter().map(|m| m["body"].as_str().unwrap()).collect();
    assert_eq!(bodies.first(), Some(&"before"), "{bodies:?}");
    assert!(!bodies.contains(&"while away"), "{bodies:?}");
    // The live stream stayed open and carries on.
    assert_eq!(stream.next_message().await["id"], acked[0]["id"]);
    let mut got = stream.next_message().await;
    while got["body"] == "after" && got["id"] != after["id"] {
        got = stream.next_message().await;
    }
    assert_eq!(got["id"], after["id"]);
}

/// A client that already got a message this replica has not delivered yet (it came from a
/// replica further ahead) resumes here without getting it again.
#[tokio::test]
async fn resuming_past_what_this_replica_delivered_gets_nothing_twice() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas(&db, 2).await;
    let first = rs[0]
        .push("director", json!({"to": "builder", "body": "first"}))
        .await;
    let first_id = first["id"].as_str().unwrap().to_owned();
    // A copy of it under a new id, logged without ringing any replica's doorbell.
    let pool = db.pool().await;
    let client = pool.get().await.unwrap();
    let unannounced = "msg-unannounced";
    client
        .execute(
            "WITH head AS (UPDATE log_head SET last_seq = last_seq + 1 WHERE id = 1
                           RETURNING last_seq)
             INSERT INTO messages (seq, id, id_text, ts, to_key, from_key, thread, body, extra,
                                   audience)
             SELECT head.last_seq, NULL, $2, m.ts, m.to_key, m.from_key, m.thread, m.body,
                    m.extra, m.audience
             FROM head, messages m WHERE m.id = decode(replace($1, '-', ''), 'hex')",
            &[&first_id, &unannounced],
        )
        .await
        .unwrap();
    // The client got it elsewhere and resumes on the second replica from there.
    let mut stream = rs[1].sse("builder", Some(unannounced)).await;
    rs[0]
        .push("director", json!({"to": "builder", "body": "second"}))
        .await;
    let next = stream.next_message().await;
    assert_eq!(
        next["body"], "second",
        "the resumed-past message came again: {next}"
    );
    stream.expect_silence(300).await;
}
