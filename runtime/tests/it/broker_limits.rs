//! The broker under hostile or careless clients: stalled subscribers (byte cap,
//! write timeout), half-open and idle connections, the connection cap, the
//! per-member subscription cap, oversized WebSocket frames, revoked tokens, and
//! hyper's own 400/431 answers.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use crate::broker_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_support::{TestBroker, start_with};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn addr(b: &TestBroker) -> String {
    b.url.trim_start_matches("http://").to_owned()
}

/// A raw connection with a tiny receive buffer (so it stalls quickly when it stops reading).
async fn tiny_socket(b: &TestBroker) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(addr(b).parse().unwrap()).await.unwrap()
}

/// Opens `GET /subscribe` on `tcp` and reads the response head; then reads nothing more.
async fn raw_subscribe(b: &TestBroker, tcp: &mut TcpStream, who: &str) {
    let req = format!(
        "GET /subscribe?name={who} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\r\n",
        b.token(who)
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            tcp.read(&mut byte).await.unwrap(),
            1,
            "closed before the head"
        );
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
}

/// Reads until the peer closes; `None` if it is still open after `within`.
async fn read_to_close(tcp: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut all = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let read = async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(within, read).await.ok()?;
    Some(all)
}

async fn connected(b: &TestBroker, who: &str) -> u64 {
    let roster = b.get("/roster", "director").await.json;
    roster["connected"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == who)
        .unwrap()["connected"]
        .as_u64()
        .unwrap()
}

async fn healthz_answers(b: &TestBroker) {
    let r = tokio::time::timeout(Duration::from_secs(3), b.raw("GET", "/healthz", None, None))
        .await
        .expect("/healthz did not answer within 3 s");
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn a_stalled_subscriber_is_cut_at_its_byte_cap_and_resumes_by_replay() {
    let b = start_with(|c| {
        c.queue_bytes = 1024 * 1024;
        c.queue_capacity = 100_000;
    })
    .await;
    let mut stalled = tiny_socket(&b).await;
    raw_subscribe(&b, &mut stalled, "builder").await;
    let mut healthy = b.sse("reviewer", None).await;
    // 12 MB for the stalled member: more than the kernel's socket buffers and the cap together.
    let blob = "x".repeat(100_000);
    let mut sent = Vec::new();
    for i in 0..120 {
        let m = b
            .push(
                "director",
                json!({"to": "builder", "body": "big", "data": {"blob": blob}}),
            )
            .await;
        sent.push(m["id"].as_str().unwrap().to_owned());
        b.push(
            "director",
            json!({"to": "reviewer", "body": format!("tick {i}")}),
        )
        .await;
        assert_eq!(healthy.next_message().await["body"], format!("tick {i}"));
    }
    assert_eq!(
        connected(&b, "builder").await,
        0,
        "the stalled stream was dropped"
    );
    // Draining it now yields what was already on its way, then the end of the stream.
    let got = read_to_close(&mut stalled, Duration::from_secs(10))
        .await
        .expect("the broker ended the stalled stream");
    let text = String::from_utf8_lossy(&got);
    let ids: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .collect();
    assert!(ids.len() < sent.len(), "cut before the end");
    assert_eq!(
        ids[..],
        sent[..ids.len()],
        "what it got is a prefix, in order"
    );
    // It resumes with Last-Event-ID and loses nothing.
    let mut again = b.sse("builder", ids.last().copied()).await;
    for id in &sent[ids.len()..] {
        assert_eq!(again.next_message().await["id"].as_str().unwrap(), id);
    }
}

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_after_the_write_timeout() {
    let b = start_with(|c| {
        c.limits.write_timeout = Duration::from_millis(500);
        c.queue_bytes = 256 * 1024 * 1024;
    })
    .await;
    let mut stalled = tiny_socket(&b).await;
    raw_subscribe(&b, &mut stalled, "builder").await;
    let blob = "x".repeat(500_000);
    for _ in 0..24 {
        b.push(
            "director",
            json!({"to": "builder", "body": "big", "data": {"blob": blob}}),
        )
        .await;
    }
    // 12 MB is far under the byte and frame caps: only the write deadline can cut it.
    crate::common::wait_until(
        "the stalled connection to be closed",
        Duration::from_secs(5),
        async || connected(&b, "builder").await == 0,
    )
    .await;
    healthz_answers(&b).await;
}

#[tokio::test]
async fn half_open_connections_are_closed_after_the_header_timeout() {
    let b = start_with(|c| c.limits.header_timeout = Duration::from_millis(300)).await;
    let mut socks = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(addr(&b)).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ")
            .await
            .unwrap();
        socks.push(s);
    }
    // The broker still answers others while they hang.
    healthz_answers(&b).await;
    for s in &mut socks {
        let got = read_to_close(s, Duration::from_secs(5))
            .await
            .expect("a half-open connection was not closed");
        assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    }
    // A client that trickles its head byte by byte is cut too.
    let mut slow = TcpStream::connect(addr(&b)).await.unwrap();
    let trickle = async {
        for byte in b"GET /healthz HTTP/1.1\r\nhost: x\r\n".iter().cycle() {
            if slow.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), trickle)
        .await
        .expect("a trickling client was not cut");
}

#[tokio::test]
async fn idle_connections_are_closed_but_live_streams_are_not() {
    let b = start_with(|c| {
        c.limits.idle_timeout = Duration::from_millis(400);
        c.keepalive = Duration::from_millis(100);
    })
    .await;
    let mut sse = b.sse("builder", None).await;
    // Never sends anything.
    let mut silent = TcpStream::connect(addr(&b)).await.unwrap();
    // One request, then silence on a keep-alive connection.
    let mut kept = TcpStream::connect(addr(&b)).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = kept.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    assert!(
        read_to_close(&mut silent, Duration::from_secs(3))
            .await
            .is_some()
    );
    assert!(
        read_to_close(&mut kept, Duration::from_secs(3))
            .await
            .is_some()
    );
    // The SSE stream has a response in progress: it is not idle.
    b.push("director", json!({"to": "builder", "body": "still here"}))
        .await;
    assert_eq!(sse.next_message().await["body"], "still here");
}

/// A `tracing` writer collecting lines in memory.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

// current_thread (the default): the broker's tasks log on this thread, into `logs`.
#[tokio::test]
async fn the_connection_cap_refuses_with_503_and_says_so_in_the_log() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let b = start_with(|c| c.limits.max_connections = 4).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(addr(&b)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut over = TcpStream::connect(addr(&b)).await.unwrap();
    let got = read_to_close(&mut over, Duration::from_secs(3))
        .await
        .unwrap();
    let text = String::from_utf8(got).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["code"], "too_many_connections");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("connection limit (4)"),
        "{body}"
    );
    assert!(
        logs.text().contains("connection limit reached"),
        "{}",
        logs.text()
    );
    // A freed slot is usable again.
    held.pop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    healthz_answers(&b).await;
}

#[tokio::test]
async fn live_subscriptions_per_member_are_capped() {
    let b = start_with(|c| c.max_subscriptions_per_member = 3).await;
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(b.sse("builder", None).await);
    }
    let r = b.get("/subscribe?name=builder", "builder").await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.json["code"], "too_many_subscriptions");
    assert_eq!(r.json["limit"], 3);
    assert!(
        r.json["error"]
            .as_str()
            .unwrap()
            .contains("3 live subscriptions")
    );
    // Other members are not affected.
    let _reviewer = b.sse("reviewer", None).await;
    // WebSocket counts too.
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://{}/subscribe?name=builder", addr(&b))
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", b.token("builder")).parse().unwrap(),
    );
    match tokio_tungstenite::connect_async(req).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 429);
        }
        other => panic!("expected 429, got {other:?}"),
    }
}

#[tokio::test]
async fn an_oversized_websocket_client_frame_closes_that_socket() {
    use tokio_tungstenite::tungstenite::Message;
    let b = start_with(|_| {}).await;
    let mut bad = b.ws("builder", None).await;
    let mut good = b.ws("builder", None).await;
    // Small client frames are ignored; the socket stays.
    bad.ws.send(Message::text("hello")).await.unwrap();
    // A large one (the broker reads none) closes it without reading it whole.
    let _ = bad.ws.send(Message::text("x".repeat(1024 * 1024))).await;
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match bad.ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the socket that sent 1 MiB is still open");
    b.push("director", json!({"to": "builder", "body": "after"}))
        .await;
    assert_eq!(good.next_message().await["body"], "after");
}

#[tokio::test]
async fn rotating_a_token_closes_the_streams_opened_with_it() {
    use tokio_tungstenite::tungstenite::Message;
    let b = start_with(|_| {}).await;
    let mut sse = b.sse("builder", None).await;
    let mut ws = b.ws("builder", None).await;
    let mut other = b.sse("reviewer", None).await;
    let r = b
        .post("/members/builder/rotate-token", "builder", json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let new_token = r.json["token"].as_str().unwrap().to_owned();
    // Both streams end promptly...
    let sse_end = tokio::time::timeout(Duration::from_secs(3), async {
        while sse.next_block().await.is_some() {}
    })
    .await;
    assert!(sse_end.is_ok(), "the SSE stream outlived its token");
    let ws_end = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match ws.ws.next().await {
                None | Some(Err(_)) => return None,
                Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
                Some(Ok(_)) => {}
            }
        }
    })
    .await
    .expect("the WebSocket outlived its token");
    assert_eq!(ws_end, Some(1008));
    // ...no later DM reaches them (they are gone), others are unaffected...
    b.push(
        "director",
        json!({"to": "builder", "body": "after rotation"}),
    )
    .await;
    b.push("director", json!({"to": "reviewer", "body": "hi"}))
        .await;
    assert_eq!(other.next_message().await["body"], "hi");
    assert_eq!(connected(&b, "builder").await, 0);
    // ...the old token is refused, and the new one works.
    let r = b.get("/subscribe?name=builder", "builder").await;
    assert_eq!(r.status, 401);
    let resp = b
        .http
        .get(format!("{}/history?with=director", b.url))
        .bearer_auth(&new_token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

#[tokio::test]
async fn removing_a_member_closes_its_streams() {
    let b = start_with(|_| {}).await;
    let mut sse = b.sse("builder", None).await;
    let r = b.call("DELETE", "/members/builder", "director", None).await;
    assert_eq!(r.status, 204, "{}", r.text);
    let end = tokio::time::timeout(Duration::from_secs(3), async {
        while sse.next_block().await.is_some() {}
    })
    .await;
    assert!(end.is_ok(), "the stream outlived its member");
}

async fn raw_exchange(b: &TestBroker, request: &[u8]) -> (String, Value) {
    let mut s = TcpStream::connect(addr(b)).await.unwrap();
    s.write_all(request).await.unwrap();
    let got = read_to_close(&mut s, Duration::from_secs(5)).await.unwrap();
    let text = String::from_utf8(got).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("content-type: application/json"), "{head}");
    assert!(
        lower.contains(&format!("content-length: {}", body.len())),
        "{head}"
    );
    (head.to_owned(), serde_json::from_str(body).unwrap())
}

#[tokio::test]
async fn errors_hyper_answers_itself_carry_a_json_body() {
    let b = start_with(|_| {}).await;
    let (head, body) = raw_exchange(&b, b"NOT HTTP AT ALL\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    assert_eq!(body, json!({"error": "malformed HTTP request"}));
    let mut many = String::from("GET /healthz HTTP/1.1\r\nhost: x\r\n");
    for i in 0..200 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("\r\n");
    let (head, body) = raw_exchange(&b, many.as_bytes()).await;
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");
    assert_eq!(body, json!({"error": "request headers are too large"}));
    // The API's own 400s are untouched.
    let r = b.get("/subscribe", "builder").await;
    assert_eq!(r.json, json!({"error": "name query parameter is required"}));
}
