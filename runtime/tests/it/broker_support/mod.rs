//! Shared helpers for the broker integration tests: a real broker on 127.0.0.1
//! (random port) with a three-member team, an HTTP helper, SSE and WebSocket clients.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use ac7_runtime::broker::config::TeamConfig;
use ac7_runtime::broker::db::{Store, StoreError, SyncMode};
use ac7_runtime::broker::{BrokerConfig, RunningBroker, StartError, bootstrap, start};
use futures_util::StreamExt;
use serde_json::{Value, json};

pub const TEAM: &str = r#"{
  "team": {"name": "peer-team", "directive": "Exercise the broker.", "context": "Tests."},
  "members": [
    {"name": "director", "role": {"title": "director", "description": "Leads the team."}, "permissions": ["admin"]},
    {"name": "builder", "role": {"title": "engineer", "description": "Builds things."}},
    {"name": "reviewer", "role": {"title": "reviewer", "description": "Reviews things."}}
  ]
}"#;

pub struct TestBroker {
    pub url: String,
    pub tokens: HashMap<String, String>,
    pub broker: RunningBroker,
    pub http: reqwest::Client,
    pub dir: tempfile::TempDir,
    /// The PostgreSQL database behind the broker, when the suite runs on PostgreSQL (dropped
    /// after the broker).
    pub pg: Option<crate::common::postgres::TestDb>,
}

/// The database the broker tests run on: SQLite, or PostgreSQL with `AC7_TEST_BACKEND=postgres`
/// (the same tests, each on a fresh database of the server of `AC7_TEST_POSTGRES`).
pub fn on_postgres() -> bool {
    std::env::var("AC7_TEST_BACKEND").is_ok_and(|v| v == "postgres")
}

/// For a test of something only the SQLite store has (its blob directory, its one write
/// lock): `true`, after saying so, when the suite runs on PostgreSQL.
pub fn sqlite_only(what: &str) -> bool {
    let skip = on_postgres();
    if skip {
        eprintln!("skipped on PostgreSQL: {what} is the SQLite store's");
    }
    skip
}

pub async fn start_broker() -> TestBroker {
    start_with(|_| {}).await
}

/// The default broker settings for the test database in `dir` (SQLite) or `pg`.
pub fn config_for(dir: &Path, pg: Option<&crate::common::postgres::TestDb>) -> BrokerConfig {
    let mut cfg = BrokerConfig::new(dir.join("ac7.db"));
    cfg.postgres = pg.map(|db| ac7_runtime::broker::pg::PgConfig::parse(&db.url).unwrap());
    cfg
}

pub async fn start_with(tweak: impl FnOnce(&mut BrokerConfig)) -> TestBroker {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ac7.db");
    let config: TeamConfig = serde_json::from_str(TEAM).unwrap();
    let mut cfg = BrokerConfig::new(db.clone());
    let pg = if on_postgres() {
        let Some(test_db) = crate::common::postgres::TestDb::create().await else {
            panic!("AC7_TEST_BACKEND=postgres, but the PostgreSQL test server is not available");
        };
        cfg.postgres = Some(ac7_runtime::broker::pg::PgConfig::parse(&test_db.url).unwrap());
        Some(test_db)
    } else {
        None
    };
    let issued = {
        let store = match &cfg.postgres {
            Some(pg) => Store::open_postgres(pg.clone()).unwrap(),
            None => open_store(&db),
        };
        bootstrap::bootstrap(&store, &config).unwrap()
    };
    tweak(&mut cfg);
    let broker = start_on(cfg, "127.0.0.1:0".parse().unwrap()).await;
    TestBroker {
        url: format!("http://{}", broker.addr),
        tokens: issued.into_iter().map(|i| (i.name, i.token)).collect(),
        broker,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        dir,
        pg,
    }
}

/// Why opening a database can find it busy although nothing uses it any more: every test shares
/// this process, and a child process another test spawns while a store is open inherits the
/// descriptor holding the store's lock until it `exec`s (close-on-exec then drops it), so the lock
/// can outlive the store by a few milliseconds. A real second broker is a second process and
/// stays refused; here we retry, bounded.
const LOCK_RELEASE: Duration = Duration::from_secs(5);

/// Opens the store at `db` (see [`LOCK_RELEASE`]; blocks the thread while it waits, usable from
/// sync tests and helpers).
pub fn open_store(db: &Path) -> Store {
    let deadline = std::time::Instant::now() + LOCK_RELEASE;
    loop {
        match Store::open(db, SyncMode::Normal) {
            Ok(store) => return store,
            Err(StoreError::Busy(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(other) => panic!("cannot open {}: {other}", db.display()),
        }
    }
}

/// Starts a broker with `cfg` listening on `addr` (see [`LOCK_RELEASE`]).
pub async fn start_on(cfg: BrokerConfig, addr: SocketAddr) -> RunningBroker {
    crate::common::wait_until("the broker to start", LOCK_RELEASE, async || {
        let listener = tokio::net::TcpListener::bind(addr).await.ok()?;
        match start(cfg.clone(), listener).await {
            Ok(broker) => Some(broker),
            Err(StartError::Store(StoreError::Busy(_))) => None,
            Err(other) => panic!("the broker did not start: {other}"),
        }
    })
    .await
}

pub struct Resp {
    pub status: u16,
    pub json: Value,
    pub text: String,
    pub headers: reqwest::header::HeaderMap,
}

impl TestBroker {
    pub fn token(&self, who: &str) -> &str {
        &self.tokens[who]
    }

    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        who: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> Resp {
        let mut req = self
            .http
            .request(method.parse().unwrap(), format!("{}{path}", self.url));
        if let Some(w) = who {
            req = req.bearer_auth(self.token(w));
        }
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Resp {
            status,
            json,
            text,
            headers,
        }
    }

    pub async fn call(&self, method: &str, path: &str, who: &str, body: Option<Value>) -> Resp {
        self.raw(
            method,
            path,
            Some(who),
            body.map(|b| serde_json::to_vec(&b).unwrap()),
        )
        .await
    }

    pub async fn get(&self, path: &str, who: &str) -> Resp {
        self.call("GET", path, who, None).await
    }

    pub async fn post(&self, path: &str, who: &str, body: Value) -> Resp {
        self.call("POST", path, who, Some(body)).await
    }

    /// Pushes and asserts 200; returns the stored message.
    pub async fn push(&self, who: &str, body: Value) -> Value {
        let r = self.post("/push", who, body).await;
        assert_eq!(r.status, 200, "push failed: {}", r.text);
        r.json["message"].clone()
    }

    pub async fn write_file(
        &self,
        who: &str,
        path: &str,
        mime: &str,
        bytes: &[u8],
        collide: Option<&str>,
    ) -> Resp {
        let mut q = vec![("path", path.to_owned()), ("mime", mime.to_owned())];
        if let Some(c) = collide {
            q.push(("collide", c.to_owned()));
        }
        let resp = self
            .http
            .post(format!("{}/fs/write", self.url))
            .bearer_auth(self.token(who))
            .query(&q)
            .body(bytes.to_vec())
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        Resp {
            status,
            json: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
            headers,
        }
    }

    pub async fn sse(&self, who: &str, last_event_id: Option<&str>) -> SseClient {
        self.sse_path(who, &format!("/subscribe?name={who}"), last_event_id)
            .await
    }

    /// `who`'s live stream as the web app opens it: signed in with the browser session
    /// `cookie` (an `ac7_session` id), no bearer token.
    pub async fn browser_sse(&self, who: &str, cookie: &str) -> SseClient {
        let resp = self
            .http
            .get(format!("{}/subscribe?name={who}", self.url))
            .header("cookie", format!("ac7_session={cookie}"))
            .header("accept", "text/event-stream")
            .timeout(Duration::from_secs(3600))
            .send()
            .await
            .unwrap();
        if resp.status() != 200 {
            panic!("{}: {}", resp.status(), resp.text().await.unwrap());
        }
        SseClient::from_response(resp)
    }

    /// An SSE stream of any path (e.g. `/members/x/activity/stream`) as `who`.
    pub async fn sse_path(&self, who: &str, path: &str, last_event_id: Option<&str>) -> SseClient {
        let mut req = self
            .http
            .get(format!("{}{path}", self.url))
            .bearer_auth(self.token(who))
            .header("accept", "text/event-stream")
            .timeout(Duration::from_secs(3600));
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        SseClient {
            stream: Box::pin(resp.bytes_stream()),
            buf: String::new(),
        }
    }

    pub async fn ws(&self, who: &str, last_event_id: Option<&str>) -> WsClient {
        self.ws_with(who, "", last_event_id).await
    }

    /// A WebSocket subscription with `lastEventId` in the query (as browsers must).
    pub async fn ws_query(&self, who: &str, last_event_id: &str) -> WsClient {
        self.ws_with(who, &format!("&lastEventId={last_event_id}"), None)
            .await
    }

    async fn ws_with(&self, who: &str, query: &str, last_event_id: Option<&str>) -> WsClient {
        self.ws_path(who, &format!("/subscribe?name={who}{query}"), last_event_id)
            .await
    }

    /// A WebSocket on any path as `who`.
    pub async fn ws_path(&self, who: &str, path: &str, last_event_id: Option<&str>) -> WsClient {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let url = format!("{}{path}", self.url.replace("http://", "ws://"));
        let mut req = url.into_client_request().unwrap();
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {}", self.token(who)).parse().unwrap(),
        );
        if let Some(id) = last_event_id {
            req.headers_mut()
                .insert("last-event-id", id.parse().unwrap());
        }
        let (ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
        WsClient { ws }
    }
}

/// One SSE event as received.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

type ByteStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<axum::body::Bytes>> + Send>>;

pub struct SseClient {
    stream: ByteStream,
    buf: String,
}

impl SseClient {
    /// Reads the SSE stream of a response the caller sent itself (e.g. with a cookie).
    pub fn from_response(resp: reqwest::Response) -> SseClient {
        SseClient {
            stream: Box::pin(resp.bytes_stream()),
            buf: String::new(),
        }
    }

    /// The next event (skipping keepalive comments); panics after 5 s.
    pub async fn next_event(&mut self) -> SseEvent {
        tokio::time::timeout(Duration::from_secs(5), self.next_inner())
            .await
            .expect("no SSE event within 5 s")
    }

    /// The next raw block (events and comments), or None at end of stream.
    pub async fn next_block(&mut self) -> Option<String> {
        loop {
            if let Some(i) = self.buf.find("\n\n") {
                let block = self.buf[..i].to_owned();
                self.buf.drain(..i + 2);
                return Some(block);
            }
            match self.stream.next().await {
                Some(Ok(chunk)) => self.buf.push_str(&String::from_utf8_lossy(&chunk)),
                _ => return None,
            }
        }
    }

    async fn next_inner(&mut self) -> SseEvent {
        loop {
            let block = self.next_block().await.expect("SSE stream ended");
            let mut ev = SseEvent {
                id: None,
                event: None,
                data: String::new(),
            };
            let mut any = false;
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    ev.id = Some(v.trim_start().to_owned());
                    any = true;
                } else if let Some(v) = line.strip_prefix("event:") {
                    ev.event = Some(v.trim_start().to_owned());
                } else if let Some(v) = line.strip_prefix("data:") {
                    ev.data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    any = true;
                }
            }
            if any {
                return ev;
            }
        }
    }

    pub async fn next_message(&mut self) -> Value {
        let ev = self.next_event().await;
        assert_eq!(ev.event.as_deref(), Some("message"));
        let v: Value = serde_json::from_str(&ev.data).unwrap();
        assert_eq!(ev.id.as_deref(), v["id"].as_str());
        v
    }

    /// Asserts nothing arrives within `ms`.
    pub async fn expect_silence(&mut self, ms: u64) {
        let r = tokio::time::timeout(Duration::from_millis(ms), self.next_inner()).await;
        assert!(r.is_err(), "unexpected event: {:?}", r.ok());
    }
}

pub struct WsClient {
    pub ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl WsClient {
    pub async fn next_message(&mut self) -> Value {
        use tokio_tungstenite::tungstenite::Message;
        let fut = async {
            loop {
                match self.ws.next().await.expect("socket ended").unwrap() {
                    Message::Text(t) => return serde_json::from_str::<Value>(t.as_str()).unwrap(),
                    Message::Ping(_) | Message::Pong(_) => {}
                    other => panic!("unexpected frame {other:?}"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), fut)
            .await
            .expect("no WS frame within 5 s")
    }
}

/// Redacts ids and times for snapshots.
pub fn redact(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let red = match k.as_str() {
                        "id" | "objectiveId" | "objective_id" | "channelId" | "ts"
                        | "createdAt" | "updatedAt" | "lastSeen" | "joinedAt" | "completedAt"
                        | "archivedAt"
                            if !v.is_null() && v.as_str() != Some("general") =>
                        {
                            json!(format!("[{k}]"))
                        }
                        "thread"
                            if v.as_str().is_some_and(|t| {
                                t.starts_with("obj:")
                                    || (t.starts_with("chan:") && t != "chan:general")
                            }) =>
                        {
                            json!("[thread]")
                        }
                        "token" if v.is_string() => json!("[token]"),
                        _ => redact(v),
                    };
                    (k.clone(), red)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(redact).collect()),
        Value::String(s) if s.starts_with("[objective ") => {
            // lifecycle bodies carry the objective id on their first line
            let mut lines = s.lines();
            let first = lines.next().unwrap_or("");
            let head = first.rsplit_once(' ').map_or(first, |(h, _)| h);
            let rest: Vec<&str> = lines.collect();
            json!(
                std::iter::once(format!("{head} [id]"))
                    .chain(rest.into_iter().map(str::to_owned))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        }
        other => other.clone(),
    }
}

/// Asserts a JSON snapshot stored in the top-level `snapshots/` directory as
/// `<test file>__<name>.snap` (the file's module name, without the `it::` of the one test binary).
#[macro_export]
macro_rules! snap {
    ($name:expr, $value:expr) => {
        let __value = $value;
        let __name = format!("{}__{}", $crate::broker_support::file_module(module_path!()), $name);
        insta::with_settings!({
            snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots"),
            prepend_module_to_snapshot => false,
        }, {
            insta::assert_json_snapshot!(__name.as_str(), $crate::broker_support::redact(&__value));
        });
    };
}

/// The test file's module in `module_path` (`it::broker_http::inner` → `broker_http`).
pub fn file_module(module_path: &str) -> &str {
    module_path.split("::").nth(1).unwrap_or(module_path)
}

/// Whom a [`Case`]'s request is sent as.
pub enum As {
    /// A member's bearer token.
    Member(&'static str),
    /// A browser session cookie (`ac7_session`).
    Cookie(String),
    /// No credentials.
    Nobody,
}

/// One row of a request table: a request and the answer it must get, run by
/// [`TestBroker::check`]. Built with [`req`] (or [`anon`]) and the `answers*` methods.
pub struct Case {
    pub method: &'static str,
    pub path: String,
    pub who: As,
    pub origin: Option<String>,
    pub body: Option<Value>,
    pub status: u16,
    /// A JSON pointer into the answer (`""` for all of it) and what it must hold; `None`
    /// checks the status alone.
    pub json: Option<(&'static str, Value)>,
}

/// A request as member `who`, with no body yet and no expectation (set one with `answers*`).
pub fn req(method: &'static str, path: impl Into<String>, who: &'static str) -> Case {
    Case {
        method,
        path: path.into(),
        who: As::Member(who),
        origin: None,
        body: None,
        status: 0,
        json: None,
    }
}

/// A request without credentials.
pub fn anon(method: &'static str, path: impl Into<String>) -> Case {
    Case {
        who: As::Nobody,
        ..req(method, path, "")
    }
}

impl Case {
    /// Sends `body` as JSON.
    pub fn body(mut self, body: Value) -> Case {
        self.body = Some(body);
        self
    }

    /// Sends the session cookie `cookie` instead of a bearer token.
    pub fn cookie(mut self, cookie: &str) -> Case {
        self.who = As::Cookie(cookie.to_owned());
        self
    }

    /// Sends an `Origin` header.
    pub fn origin(mut self, origin: &str) -> Case {
        self.origin = Some(origin.to_owned());
        self
    }

    /// Must answer `status`.
    pub fn answers(mut self, status: u16) -> Case {
        self.status = status;
        self
    }

    /// Must answer `status` with exactly `json`.
    pub fn answers_json(self, status: u16, json: Value) -> Case {
        self.answers_at(status, "", json)
    }

    /// Must answer `status` with `json` at `pointer` of the answer (missing reads as null).
    pub fn answers_at(mut self, status: u16, pointer: &'static str, json: Value) -> Case {
        self.status = status;
        self.json = Some((pointer, json));
        self
    }

    fn label(&self, row: usize) -> String {
        let who = match &self.who {
            As::Member(m) => format!("as {m}"),
            As::Cookie(_) => "with the cookie".to_owned(),
            As::Nobody => "without credentials".to_owned(),
        };
        let origin = self
            .origin
            .as_deref()
            .map(|o| format!(" from {o}"))
            .unwrap_or_default();
        format!("row {row}: {} {} {who}{origin}", self.method, self.path)
    }
}

impl TestBroker {
    /// Sends each case's request in order and asserts its status and, when the case names
    /// one, its JSON; returns the answers (for what the test does next).
    pub async fn check(&self, cases: Vec<Case>) -> Vec<Resp> {
        let mut answers = Vec::with_capacity(cases.len());
        for (row, case) in cases.into_iter().enumerate() {
            let label = case.label(row);
            assert!(case.status != 0, "{label}: the case expects no status");
            let mut req = self.http.request(
                case.method.parse().unwrap(),
                format!("{}{}", self.url, case.path),
            );
            match &case.who {
                As::Member(m) => req = req.bearer_auth(self.token(m)),
                As::Cookie(c) => req = req.header("cookie", format!("ac7_session={c}")),
                As::Nobody => {}
            }
            if let Some(o) = &case.origin {
                req = req.header("origin", o);
            }
            if let Some(b) = &case.body {
                req = req.json(b);
            }
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let text = resp.text().await.unwrap();
            let json = serde_json::from_str(&text).unwrap_or(Value::Null);
            assert_eq!(status, case.status, "{label}: {text}");
            if let Some((pointer, want)) = &case.json {
                let got = json.pointer(pointer).unwrap_or(&Value::Null);
                assert_eq!(got, want, "{label}");
            }
            answers.push(Resp {
                status,
                json,
                text,
                headers,
            });
        }
        answers
    }
}

/// A self-signed certificate for `localhost`, written as PEM files a broker serves TLS with.
pub struct Pki {
    _dir: tempfile::TempDir,
    /// The certificate, PEM (what a client trusts).
    pub cert_pem: String,
    /// The certificate and key files.
    pub files: ac7_runtime::broker::server::TlsFiles,
}

/// Makes a [`Pki`].
pub fn self_signed() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert_pem = certified.cert.pem();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, &cert_pem).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    Pki {
        _dir: dir,
        cert_pem,
        files: ac7_runtime::broker::server::TlsFiles { cert, key },
    }
}

/// Each teammate on `b`'s roster as `name [title] permissions…`, as `who` reads it.
pub async fn roster_lines(b: &TestBroker, who: &str) -> Vec<String> {
    let r = b.get("/roster", who).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["teammates"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", r.text))
        .iter()
        .map(|t| {
            let perms: Vec<&str> = t["permissions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap())
                .collect();
            format!(
                "{} [{}] {}",
                t["name"].as_str().unwrap(),
                t["role"]["title"].as_str().unwrap(),
                perms.join(",")
            )
            .trim_end()
            .to_owned()
        })
        .collect()
}

/// Adds, changes and removes a member through `change`, reading every roster of `readers`
/// after each step (and once before, so that whatever a roster keeps is warm): each shows the
/// step at once.
pub async fn rosters_follow_member_changes(change: &TestBroker, readers: &[&TestBroker]) {
    let team = [
        "director [director] team.manage,members.manage,objectives.create,objectives.cancel,\
         objectives.reassign,objectives.watch,activity.read",
        "builder [engineer]",
        "reviewer [reviewer]",
    ];
    let steps = [
        (None, None),
        (
            Some(
                req("POST", "/members", "director")
                    .body(json!({"name": "scout", "role": {"title": "scout"}, "permissions": []}))
                    .answers(200),
            ),
            Some("scout [scout]"),
        ),
        (
            Some(
                req("PATCH", "/members/scout", "director")
                    .body(json!({"role": {"title": "pathfinder"}}))
                    .answers(200),
            ),
            Some("scout [pathfinder]"),
        ),
        (
            Some(
                req("PATCH", "/members/scout", "director")
                    .body(json!({"permissions": ["objectives.create"]}))
                    .answers(200),
            ),
            Some("scout [pathfinder] objectives.create"),
        ),
        (
            Some(req("DELETE", "/members/scout", "director").answers(204)),
            None,
        ),
    ];
    for (row, (step, extra)) in steps.into_iter().enumerate() {
        if let Some(case) = step {
            change.check(vec![case]).await;
        }
        let expect: Vec<String> = team
            .iter()
            .copied()
            .chain(extra)
            .map(str::to_owned)
            .collect();
        for b in readers {
            assert_eq!(roster_lines(b, "builder").await, expect, "after step {row}");
        }
    }
}
