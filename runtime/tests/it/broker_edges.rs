//! The broker's HTTP edges against a hostile network: keep-alive after an early refusal (a
//! body that arrives after its head was refused), security headers on the answers hyper
//! writes by itself and on the connection cap's `503`, `/healthz` at the open-file limit,
//! activity uploaded directly (redacted at the broker), the `Origin` check on cookie reads,
//! `/history` limits, and an untrusted TLS certificate named as such by the clients.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use crate::broker_support::{TestBroker, start_broker, start_with};

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ac7_runtime::broker::ratelimit::Rate;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const AC7: &str = env!("CARGO_BIN_EXE_ac7");

fn addr(b: &TestBroker) -> String {
    b.url.trim_start_matches("http://").to_owned()
}

/// One HTTP/1.1 response read off a raw connection.
#[derive(Debug)]
struct RawResponse {
    status: u16,
    /// The head, header names lower-cased.
    head: String,
    body: String,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim())
        })
    }

    fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// Reads one response (head, then a `content-length` body); `None` if the connection ended
/// (or failed) first, or nothing came within 5 s.
async fn read_response(s: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<RawResponse> {
    let read = async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.lines();
        let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        let head: String = std::iter::once(head.lines().next().unwrap_or("").to_owned())
            .chain(lines.map(|l| match l.split_once(':') {
                Some((k, v)) => format!("{}:{v}", k.to_ascii_lowercase()),
                None => l.to_owned(),
            }))
            .collect::<Vec<_>>()
            .join("\n");
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        let mut body = buf[head_end..].to_vec();
        while body.len() < len {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        Some(RawResponse {
            status,
            head,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .ok()
        .flatten()
}

/// Sends `head`, waits, sends `body`, reads the answer; then, unless that answer said
/// `Connection: close`, asks `/healthz` on the same connection, which must answer 200.
/// Returns the first answer.
async fn refused_then_reused(b: &TestBroker, head: &str, body: &[u8]) -> RawResponse {
    let mut s = TcpStream::connect(addr(b)).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The broker may have closed already (that is the bug): the write can fail.
    let _ = s.write_all(body).await;
    let first = read_response(&mut s)
        .await
        .expect("no answer to the first request");
    if first.closes() {
        return first;
    }
    let _ = s
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    let second = read_response(&mut s).await.unwrap_or_else(|| {
        panic!(
            "the broker kept the connection (no `Connection: close` on {}) but did not answer the next request on it",
            first.status
        )
    });
    assert_eq!(second.status, 200, "{second:?}");
    first
}

fn post_head(path: &str, token: &str, len: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
    )
}

#[tokio::test]
async fn early_refusals_keep_the_connection_usable_or_say_close() {
    let b = start_with(|c| {
        c.push_rate = Some(Rate {
            per_second: 1,
            burst: 1,
        })
    })
    .await;
    let body = br#"{"to":"director","body":"over the limit"}"#;
    // The bucket's one token.
    b.push("builder", json!({"to": "director", "body": "first"}))
        .await;
    let head = post_head("/push", b.token("builder"), body.len());
    let first = refused_then_reused(&b, &head, body).await;
    assert_eq!(first.status, 429, "{first:?}");
    // 401 before the body is read.
    let head = post_head("/push", "ac7_not-a-token", body.len());
    let first = refused_then_reused(&b, &head, body).await;
    assert_eq!(first.status, 401, "{first:?}");
    // 413 past the JSON cap (1 MiB) of a 2 MiB body: the rest is not worth reading, so the
    // answer says close.
    let big = 2 * 1024 * 1024;
    let (mut rx, mut tx) = TcpStream::connect(addr(&b)).await.unwrap().into_split();
    let head = post_head("/push", b.token("director"), big);
    let sending = tokio::spawn(async move {
        tx.write_all(head.as_bytes()).await.unwrap();
        // Ends when the broker closes; `tx` stays open until then.
        let _ = tx.write_all(&vec![b' '; big - 4096]).await;
        tx
    });
    let r = read_response(&mut rx).await.expect("no answer to the 413");
    assert_eq!(r.status, 413, "{r:?}");
    assert!(
        r.closes(),
        "a 413 that leaves the body unread must close: {r:?}"
    );
    drop(sending.await.unwrap());
    // A request whose body was read keeps its connection.
    let ok = br#"{"to":"builder","body":"ok"}"#;
    let head = post_head("/push", b.token("director"), ok.len());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let first = refused_then_reused(&b, &head, ok).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert!(!first.closes(), "{first:?}");
}

fn assert_security_headers(r: &RawResponse) {
    for (k, v) in [
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("x-frame-options", "DENY"),
        ("cross-origin-opener-policy", "same-origin"),
        ("cross-origin-resource-policy", "same-origin"),
    ] {
        assert_eq!(r.header(k), Some(v), "header {k}: {r:?}");
    }
    let csp = r.header("content-security-policy").unwrap_or_default();
    assert!(csp.contains("default-src 'none'"), "{r:?}");
}

#[tokio::test]
async fn answers_hyper_writes_itself_carry_the_security_headers() {
    let b = start_broker().await;
    let mut long = String::from("GET /healthz?x=");
    long.push_str(&"a".repeat(70_000));
    long.push_str(" HTTP/1.1\r\nhost: x\r\n\r\n");
    let mut many = String::from("GET /healthz HTTP/1.1\r\nhost: x\r\n");
    for i in 0..200 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("\r\n");
    for (request, status, error) in [
        (
            "NOT HTTP AT ALL\r\n\r\n".to_owned(),
            400,
            "malformed HTTP request",
        ),
        (long, 414, "request URI is too long"),
        (many, 431, "request headers are too large"),
    ] {
        let mut s = TcpStream::connect(addr(&b)).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let r = read_response(&mut s)
            .await
            .unwrap_or_else(|| panic!("no {status} answer"));
        assert_eq!(r.status, status, "{r:?}");
        assert_eq!(
            serde_json::from_str::<Value>(&r.body).unwrap(),
            json!({"error": error})
        );
        assert!(r.closes(), "{r:?}");
        assert_security_headers(&r);
    }
    // The connection cap's 503, written by the accept loop, carries them too.
    let b = start_with(|c| c.limits.max_connections = 1).await;
    let _held = TcpStream::connect(addr(&b)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut s = TcpStream::connect(addr(&b)).await.unwrap();
    let r = read_response(&mut s).await.expect("no 503 answer");
    assert_eq!(r.status, 503, "{r:?}");
    assert_security_headers(&r);
}

/// `ac7 serve` under `RLIMIT_NOFILE` = `fds` (soft and hard), logging at `info`; returns the
/// child, its URL and its stderr lines.
struct Limited {
    child: Child,
    url: String,
    stderr: mpsc::Receiver<String>,
    _dir: tempfile::TempDir,
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_limited(fds: u64, extra: &[&str]) -> Limited {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("team.json");
    std::fs::write(&cfg, crate::broker_support::TEAM).unwrap();
    let mut cmd = Command::new(AC7);
    cmd.args(["serve", "--port", "0", "--db"])
        .arg(dir.path().join("ac7.db"))
        .arg("--team-config")
        .arg(&cfg)
        .args(extra)
        .env("AC7_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe; the closure allocates nothing and only lowers
    // the child's own limit (this test process keeps its limit).
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: fds,
                rlim_max: fds,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut child = cmd.spawn().unwrap();
    let (tx, stderr) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Read to the end (a closed pipe would fail the broker's next print).
    let (url_tx, url_rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(u) = line.strip_prefix("ac7 broker listening on ") {
                let _ = url_tx.send(u.to_owned());
            }
        }
    });
    let url = url_rx.recv_timeout(Duration::from_secs(20));
    Limited {
        url: url.expect("ac7 serve did not report listening"),
        child,
        stderr,
        _dir: dir,
    }
}

/// The first JSON log line of `l` (within 5 s) whose message contains `needle`.
fn log_line(l: &Limited, needle: &str) -> Option<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        let Ok(line) = l.stderr.recv_timeout(left) else {
            break;
        };
        if let Ok(v) = serde_json::from_str::<Value>(&line)
            && v["message"].as_str().is_some_and(|m| m.contains(needle))
        {
            return Some(v);
        }
    }
    None
}

#[tokio::test]
async fn healthz_answers_when_the_open_file_limit_is_low() {
    let fds = 128;
    let served = serve_limited(fds, &[]);
    let hostport = served.url.trim_start_matches("http://").to_owned();
    // As many connections as the broker has descriptors: those past the cap are refused.
    let mut held = Vec::new();
    for _ in 0..fds {
        held.push(TcpStream::connect(&hostport).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A probe as curl or a load balancer sends it.
    let mut probe = TcpStream::connect(&hostport).await.unwrap();
    probe
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let r = read_response(&mut probe)
        .await
        .expect("/healthz did not answer at the connection cap");
    assert_eq!(r.status, 503, "{r:?}");
    let cap = log_line(&served, "connection cap")
        .expect("ac7 serve did not log its connection cap")["max_connections"]
        .as_u64()
        .unwrap();
    assert!(
        cap + 32 <= fds,
        "cap {cap} leaves no headroom under {fds} descriptors"
    );
    let body: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body["code"], "too_many_connections");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains(&format!("({cap})")),
        "{body}"
    );
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap()
        .get(format!("{}/healthz", served.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    // An explicit cap with no headroom under the limit is kept, with a warning.
    let served = serve_limited(fds, &["--max-connections", "120"]);
    let warned = log_line(&served, "no headroom").expect("no warning about the headroom");
    assert_eq!(warned["level"], "WARN", "{warned}");
    assert_eq!(warned["max_connections"], 120, "{warned}");
}

/// The corpus of secrets that redaction must remove (`<context>\t<secret>` lines).
fn secrets() -> Vec<(String, String)> {
    include_str!("../../../protocol/src/trace/secrets.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (ctx, secret) = l.split_once('\t')?;
            Some((ctx.to_owned(), secret.to_owned()))
        })
        .collect()
}

#[tokio::test]
async fn activity_uploaded_directly_is_redacted() {
    let b = start_broker().await;
    let corpus = secrets();
    let mut text = String::new();
    let mut headers = serde_json::Map::new();
    let mut query = Vec::new();
    let mut input = serde_json::Map::new();
    for (ctx, secret) in &corpus {
        if ctx == "text" {
            text.push_str(&format!("here is one: {secret} and more\n"));
        } else if let Some(h) = ctx.strip_prefix("header:") {
            headers.insert(h.to_owned(), json!(secret));
        } else if let Some(q) = ctx.strip_prefix("query:") {
            query.push(format!("{q}={secret}"));
        } else if let Some(k) = ctx.strip_prefix("json:") {
            input.insert(k.to_owned(), json!(secret));
        }
    }
    let url = format!("/v1/things?{}", query.join("&"));
    let upload = json!({"events": [
        {"kind": "llm_exchange", "ts": 1, "duration": 2, "entry": {
            "kind": "anthropic_messages", "startedAt": 1, "endedAt": 3,
            "request": {"model": "m", "maxTokens": 10, "temperature": null, "system": text,
                "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
                "tools": null},
            "response": {"stopReason": "tool_use", "stopSequence": null,
                "messages": [{"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "call", "input": input}]}],
                "usage": null, "status": 200}}},
        {"kind": "opaque_http", "ts": 2, "duration": 0, "entry": {
            "kind": "opaque_http", "startedAt": 2, "endedAt": 2, "host": "api.example.com",
            "method": "POST", "url": url, "status": 200,
            "requestHeaders": headers, "responseHeaders": headers,
            "requestBodyPreview": text, "responseBodyPreview": text}}
    ]});
    let r = b.post("/members/builder/activity", "builder", upload).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = b.get("/members/builder/activity", "builder").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json["activity"].as_array().unwrap().len(),
        2,
        "{}",
        r.text
    );
    for (ctx, secret) in &corpus {
        assert!(
            !r.text.contains(secret.as_str()),
            "{ctx} secret {secret} stored unredacted: {}",
            r.text
        );
    }
    assert!(r.text.contains("[REDACTED]"));
    // What is not a secret is kept.
    assert!(r.text.contains("here is one: "), "{}", r.text);
    assert_eq!(
        r.json["activity"][0]["event"]["entry"]["host"],
        "api.example.com"
    );
}

/// A session cookie for `member`, made in the store.
fn session(b: &TestBroker, member: &str) -> String {
    let now = ac7_runtime::broker::now_ms();
    b.broker
        .state
        .store
        .tx(|conn| {
            ac7_runtime::broker::sessions::session_create(conn, member, None, now, 3_600_000)
        })
        .unwrap()
        .0
}

async fn cookie_get(
    b: &TestBroker,
    path: &str,
    cookie: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let mut req = b.http.get(format!("{}{path}", b.url));
    if let Some(c) = cookie {
        req = req.header("cookie", format!("ac7_session={c}"));
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn cookie_reads_from_a_foreign_origin_are_refused() {
    let b = start_broker().await;
    let cookie = session(&b, "builder");
    let refused = json!({"error": "cross-origin request refused"});
    let evil = [("origin", "https://evil.example")];
    assert_eq!(
        cookie_get(&b, "/roster", Some(&cookie), &evil).await,
        (403, refused.clone())
    );
    assert_eq!(
        cookie_get(&b, "/history", Some(&cookie), &[("origin", "null")]).await,
        (403, refused.clone())
    );
    // Our own origin, or no Origin at all (a same-origin GET from a browser sends none).
    assert_eq!(
        cookie_get(&b, "/roster", Some(&cookie), &[("origin", &b.url)])
            .await
            .0,
        200
    );
    assert_eq!(cookie_get(&b, "/roster", Some(&cookie), &[]).await.0, 200);
    // A navigation from another site's link carries a Referer, not an Origin: served.
    assert_eq!(
        cookie_get(
            &b,
            "/roster",
            Some(&cookie),
            &[("referer", "https://elsewhere.example/page")]
        )
        .await
        .0,
        200
    );
    // Without a cookie nothing is read on the visitor's behalf: a foreign GET gets the usual answers.
    assert_eq!(cookie_get(&b, "/healthz", None, &evil).await.0, 200);
    assert_eq!(cookie_get(&b, "/roster", None, &evil).await.0, 401);
    // Bearer requests are never cookie requests.
    let r = b
        .http
        .get(format!("{}/roster", b.url))
        .bearer_auth(b.token("builder"))
        .header("cookie", format!("ac7_session={cookie}"))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // The live stream (SSE) with the cookie from a foreign origin.
    assert_eq!(
        cookie_get(&b, "/subscribe?name=builder", Some(&cookie), &evil)
            .await
            .0,
        403
    );
}

#[tokio::test]
async fn history_limits_that_are_not_positive_numbers_are_400() {
    let b = start_broker().await;
    for limit in ["0", "-1", "abc", "", "NaN", "inf", "0.5"] {
        let r = b.get(&format!("/history?limit={limit}"), "builder").await;
        assert_eq!(r.status, 400, "limit={limit}: {}", r.text);
        assert_eq!(
            r.json,
            json!({"error": "invalid `limit` parameter: expected a positive integer"}),
            "limit={limit}"
        );
    }
    for _ in 0..3 {
        b.push("director", json!({"body": "hello"})).await;
    }
    for (limit, n) in [("1", 1), ("2.7", 2), ("5000", 3), (" 2 ", 2)] {
        let r = b.get(&format!("/history?limit={limit}"), "builder").await;
        assert_eq!(r.status, 200, "limit={limit}: {}", r.text);
        assert_eq!(
            r.json["messages"].as_array().unwrap().len(),
            n,
            "limit={limit}"
        );
    }
}

/// A self-signed certificate for `localhost`, written to `dir`: (cert, key).
fn self_signed(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

#[tokio::test]
async fn an_untrusted_certificate_is_named_by_the_clients() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path());
    let files = ac7_runtime::broker::server::TlsFiles { cert, key };
    let b = start_with(move |c| c.tls = Some(files)).await;
    let url = format!("https://localhost:{}", b.broker.addr.port());
    let token = b.token("director").to_owned();
    // Another certificate, trusted in vain.
    let other = tempfile::tempdir().unwrap();
    let (other_ca, _) = self_signed(other.path());
    let cases: Vec<(Vec<&str>, Option<std::path::PathBuf>)> = vec![
        (vec!["roster"], None),
        (vec!["push", "--to", "builder", "--body", "x"], None),
        (vec!["run", "--", "true"], None),
        (vec!["roster"], Some(other_ca.clone())),
        (vec!["run", "--", "true"], Some(other_ca)),
    ];
    for (args, ca) in cases {
        let (url, token, cwd) = (url.clone(), token.clone(), dir.path().to_owned());
        let shown = format!("{args:?} with AC7_CA_CERT={ca:?}");
        let out = tokio::task::spawn_blocking(move || {
            let mut cmd = Command::new(AC7);
            cmd.args(&args)
                .current_dir(cwd)
                .env("AC7_URL", &url)
                .env("AC7_TOKEN", &token)
                .env_remove("AC7_CA_CERT")
                .stdin(Stdio::null());
            if let Some(ca) = &ca {
                cmd.env("AC7_CA_CERT", ca);
            }
            cmd.output().unwrap()
        })
        .await
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{shown}: {err}");
        assert!(
            err.contains("TLS certificate") && err.contains("AC7_CA_CERT"),
            "{shown}: {err}"
        );
        assert!(!err.contains("is `ac7 serve` running"), "{shown}: {err}");
    }
}
