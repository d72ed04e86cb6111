use std::sync::Mutex;

use ac7_protocol::trace::activity::ActivityEvent;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::*;

#[derive(Default)]
struct Recorded {
    sent: Mutex<Vec<u64>>,
    events: Mutex<Vec<(u64, ActivityEvent)>>,
}

impl TraceSink for Recorded {
    fn request_sent(&self, conn: u64) {
        self.sent.lock().unwrap().push(conn);
    }
    fn exchange(&self, conn: u64, event: ActivityEvent) {
        self.events.lock().unwrap().push((conn, event));
    }
}

/// A TLS server with a certificate from its own CA; answers one HTTP request per connection.
struct StandIn {
    addr: SocketAddr,
    ca_pem: String,
    requests: Arc<Mutex<Vec<Vec<u8>>>>,
}

async fn stand_in(host: &str, response: Vec<u8>) -> StandIn {
    let response: Arc<[u8]> = response.into();
    let ca = TraceCa::generate().unwrap();
    let config = ca.server_config(host).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    tokio::spawn(async move {
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            let response = response.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                seen.lock().unwrap().push(buf);
                let _ = tls.write_all(&response).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    StandIn {
        addr,
        ca_pem: ca.pem().to_owned(),
        requests,
    }
}

async fn proxy_for(
    overrides: &[(&str, SocketAddr)],
    roots: &[&str],
) -> (TraceProxy, Arc<TraceCa>, Arc<Recorded>) {
    proxy_with(overrides, upstream_config(roots)).await
}

fn upstream_config(roots: &[&str]) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut store = rustls::RootCertStore::empty();
    for pem in roots {
        store.add_parsable_certificates(
            rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()).map(Result::unwrap),
        );
    }
    let mut upstream = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(store)
    .with_no_client_auth();
    upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(upstream)
}

async fn proxy_with(
    overrides: &[(&str, SocketAddr)],
    upstream: Arc<rustls::ClientConfig>,
) -> (TraceProxy, Arc<TraceCa>, Arc<Recorded>) {
    proxy_limited(overrides, upstream, ProxyLimits::default()).await
}

async fn proxy_limited(
    overrides: &[(&str, SocketAddr)],
    upstream: Arc<rustls::ClientConfig>,
    limits: ProxyLimits,
) -> (TraceProxy, Arc<TraceCa>, Arc<Recorded>) {
    proxy_full(overrides, upstream, limits, Vec::new()).await
}

async fn proxy_full(
    overrides: &[(&str, SocketAddr)],
    upstream: Arc<rustls::ClientConfig>,
    limits: ProxyLimits,
    endpoints: Vec<ModelEndpoint>,
) -> (TraceProxy, Arc<TraceCa>, Arc<Recorded>) {
    let ca = Arc::new(TraceCa::generate().unwrap());
    let sink = Arc::new(Recorded::default());
    let proxy = TraceProxy::start(
        ProxyConfig {
            ca: ca.clone(),
            upstream_tls: upstream,
            upstream_override: overrides
                .iter()
                .map(|(h, a)| ((*h).to_owned(), a.to_string()))
                .collect(),
            endpoints,
            secret: "s3cret".into(),
            limits,
        },
        sink.clone(),
    )
    .await
    .unwrap();
    (proxy, ca, sink)
}

const AUTH: &str = "Proxy-Authorization: Basic YWM3OnMzY3JldA==\r\n";

async fn read_all(stream: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    out
}

async fn connect(proxy: &TraceProxy, target: &str) -> (TcpStream, String) {
    let mut tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    tcp.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{AUTH}\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if tcp.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    (tcp, String::from_utf8(head).unwrap())
}

const SSE_BODY: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\",\"model\":\"claude-test\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":11,\"output_tokens\":1}}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

fn sse() -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{SSE_BODY}",
        SSE_BODY.len()
    )
    .into_bytes()
}

#[tokio::test]
async fn model_host_is_decrypted_traced_and_sent_identity() {
    let upstream = stand_in("api.anthropic.com", sse()).await;
    let (proxy, ca, sink) =
        proxy_for(&[("api.anthropic.com", upstream.addr)], &[&upstream.ca_pem]).await;
    let (tcp, head) = connect(&proxy, "api.anthropic.com:443").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // The client trusts only the session CA.
    let mut roots = rustls::RootCertStore::empty();
    {
        use rustls::pki_types::pem::PemObject;
        roots.add_parsable_certificates(
            rustls::pki_types::CertificateDer::pem_slice_iter(ca.pem().as_bytes())
                .map(Result::unwrap),
        );
    }
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let mut tls = connector
        .connect(ServerName::try_from("api.anthropic.com").unwrap(), tcp)
        .await
        .unwrap();
    let body =
        r#"{"model":"claude-test","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;
    tls.write_all(
        format!(
            "POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\nx-api-key: sk-ant-api03-secretsecretsecret\r\naccept-encoding: gzip, br\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut response)).await;
    assert_eq!(response, sse(), "the client gets the response unchanged");
    let forwarded = String::from_utf8(upstream.requests.lock().unwrap()[0].clone()).unwrap();
    assert!(
        forwarded
            .to_ascii_lowercase()
            .contains("accept-encoding: identity"),
        "{forwarded}"
    );
    // Exchanges are decoded off the relay path; `close` returns once every one reached the sink.
    proxy.close().await;
    let events = sink.events.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "{events:?}");
    let json = serde_json::to_value(&events[0].1).unwrap();
    assert_eq!(json["kind"], "llm_exchange", "{json}");
    let text = json.to_string();
    assert!(
        text.contains("claude-test") && text.contains("end_turn"),
        "{text}"
    );
    assert!(!text.contains("secretsecret"), "{text}");
    assert_eq!(*sink.sent.lock().unwrap(), [events[0].0]);
}

#[tokio::test]
async fn other_hosts_are_tunnelled_byte_for_byte_and_recorded_nowhere() {
    let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = echo.accept().await.unwrap();
        let mut buf = vec![0u8; 64];
        let n = s.read(&mut buf).await.unwrap();
        s.write_all(&buf[..n]).await.unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
    });
    let (proxy, _, sink) = proxy_for(&[], &[]).await;
    let (mut tcp, head) = connect(&proxy, &addr.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let sent = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff binary";
    tcp.write_all(sent).await.unwrap();
    let got = read_all(&mut tcp).await;
    assert!(got.starts_with(sent), "{got:?}");
    proxy.close().await;
    assert!(sink.events.lock().unwrap().is_empty());
    assert!(sink.sent.lock().unwrap().is_empty());
}

#[tokio::test]
async fn plain_http_requests_are_forwarded_in_origin_form() {
    let origin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = origin.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = origin.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.unwrap();
        let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
            .await
            .unwrap();
    });
    let (proxy, _, sink) = proxy_for(&[], &[]).await;
    let mut tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    tcp.write_all(
        format!("GET http://{addr}/path?q=1 HTTP/1.1\r\nHost: {addr}\r\n{AUTH}Proxy-Connection: keep-alive\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let got = String::from_utf8(read_all(&mut tcp).await).unwrap();
    assert!(
        got.starts_with("HTTP/1.1 200 OK") && got.ends_with("hello"),
        "{got}"
    );
    let forwarded = rx.await.unwrap();
    assert!(
        forwarded.starts_with("GET /path?q=1 HTTP/1.1\r\n"),
        "{forwarded}"
    );
    assert!(
        !forwarded.to_ascii_lowercase().contains("proxy-"),
        "{forwarded}"
    );
    proxy.close().await;
    assert!(sink.events.lock().unwrap().is_empty());
}

#[tokio::test]
async fn untrusted_upstream_is_a_502_and_bad_requests_a_400() {
    // The stand-in's CA is not among the proxy's roots.
    let upstream = stand_in("api.anthropic.com", sse()).await;
    let (proxy, _, sink) = proxy_for(&[("api.anthropic.com", upstream.addr)], &[]).await;
    let (_, head) = connect(&proxy, "api.anthropic.com:443").await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    for bad in [
        "GARBAGE\r\n\r\n".to_owned(),
        format!("CONNECT nohostport HTTP/1.1\r\n{AUTH}\r\n"),
        format!("GET /relative HTTP/1.1\r\n{AUTH}\r\n"),
    ] {
        let mut tcp = TcpStream::connect(proxy.addr()).await.unwrap();
        tcp.write_all(bad.as_bytes()).await.unwrap();
        let got = String::from_utf8(read_all(&mut tcp).await).unwrap();
        assert!(got.starts_with("HTTP/1.1 400"), "{bad:?} → {got}");
    }
    // Without the secret: 407, and nothing is dialled.
    let mut tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    tcp.write_all(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let got = String::from_utf8(read_all(&mut tcp).await).unwrap();
    assert!(got.starts_with("HTTP/1.1 407"), "{got}");
    assert!(sink.events.lock().unwrap().is_empty());
    proxy.close().await;
}

#[test]
fn model_hosts_and_targets() {
    assert!(is_model_host("api.anthropic.com"));
    assert!(is_model_host("ANTHROPIC.COM."));
    assert!(is_model_host("x.openai.azure.com") && is_model_host("chatgpt.com"));
    assert!(!is_model_host("evilanthropic.com") && !is_model_host("anthropic.com.evil.io"));
    assert_eq!(split_authority("[::1]:443"), Some(("::1".into(), 443)));
    assert_eq!(
        split_authority("Api.X.com:8443"),
        Some(("api.x.com".into(), 8443))
    );
    assert_eq!(split_authority("x.com:0"), None);
    assert_eq!(split_authority("::1:443"), None);
    assert_eq!(
        split_absolute("http://h.io/a?b"),
        Some(("h.io".into(), 80, "/a?b".into()))
    );
    assert_eq!(
        split_absolute("HTTP://h.io:81?x"),
        Some(("h.io".into(), 81, "/?x".into()))
    );
    assert_eq!(split_absolute("https://h.io/"), None);
    assert_eq!(
        parse_upstream_override("api.anthropic.com=127.0.0.1:9, x=y").unwrap()["x"],
        "y"
    );
    assert!(parse_upstream_override("nonsense").is_err());
}

#[tokio::test]
async fn unsafe_tls_accepts_an_untrusted_upstream() {
    let upstream = stand_in("api.anthropic.com", sse()).await;
    let (proxy, _, _) = proxy_with(
        &[("api.anthropic.com", upstream.addr)],
        upstream_tls(true, None).unwrap(),
    )
    .await;
    let (_, head) = connect(&proxy, "api.anthropic.com:443").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    proxy.close().await;
}

#[tokio::test]
async fn plain_http_to_a_model_host_is_traced() {
    let origin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = origin.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = origin.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = s.read(&mut buf).await.unwrap();
        s.write_all(&sse()).await.unwrap();
    });
    let (proxy, _, sink) = proxy_for(&[("api.anthropic.com", addr)], &[]).await;
    let mut tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    let body = r#"{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}"#;
    tcp.write_all(
        format!(
            "POST http://api.anthropic.com/v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\n{AUTH}content-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let got = read_all(&mut tcp).await;
    assert_eq!(got, sse());
    proxy.close().await;
    let events = sink.events.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        serde_json::to_value(&events[0].1).unwrap()["kind"],
        "llm_exchange"
    );
}

/// A TLS client that trusts only the session CA `ca`.
fn agent_tls(ca: &TraceCa) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(
        rustls::pki_types::CertificateDer::pem_slice_iter(ca.pem().as_bytes()).map(Result::unwrap),
    );
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(client))
}

/// A plain HTTP origin answering every request `200 ok`; returns its address.
async fn ok_origin() -> SocketAddr {
    let origin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = origin.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = origin.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
            });
        }
    });
    addr
}

/// A plain `http://` request through the proxy with the secret; returns the answer.
async fn authenticated_get(proxy: &TraceProxy, origin: SocketAddr) -> String {
    let mut tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    tcp.write_all(
        format!("GET http://{origin}/x HTTP/1.1\r\nHost: {origin}\r\n{AUTH}\r\n").as_bytes(),
    )
    .await
    .unwrap();
    String::from_utf8(read_all(&mut tcp).await).unwrap()
}

/// Whether the proxy closed `stream` within `wait` (end of stream, or a reset).
async fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(wait, stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Connections that never authenticate cannot lock the agent out: past `max_unauthenticated`
/// the oldest are closed at once (long before their timeout), the count stays at the cap, and an
/// authenticated request gets through while the newest silent ones are still open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_capped_oldest_first_and_the_agent_gets_through() {
    const SILENT: usize = 300;
    const CAP: usize = 64;
    let origin = ok_origin().await;
    let limits = ProxyLimits {
        max_unauthenticated: CAP,
        // Long: every close seen below is an eviction, not a timeout.
        auth_timeout: Duration::from_secs(120),
        ..ProxyLimits::default()
    };
    let (proxy, _, _) = proxy_limited(&[], upstream_config(&[]), limits).await;
    let mut silent = Vec::with_capacity(SILENT);
    for _ in 0..SILENT {
        silent.push(TcpStream::connect(proxy.addr()).await.unwrap());
    }
    let (oldest, newest) = silent.split_at_mut(SILENT - CAP);
    for (i, stream) in oldest.iter_mut().enumerate() {
        assert!(
            closed_within(stream, Duration::from_secs(10)).await,
            "silent connection {i} is still open"
        );
    }
    // Connection k is evicted when k + CAP is accepted: all of them were, the newest CAP wait.
    assert_eq!(proxy.unauthenticated(), CAP);
    let answer = authenticated_get(&proxy, origin).await;
    assert!(
        answer.starts_with("HTTP/1.1 200 OK") && answer.ends_with("ok"),
        "{answer}"
    );
    // The agent's connection took the oldest waiting one's place; the rest are still open.
    for (i, stream) in newest.iter_mut().enumerate().skip(1) {
        assert!(
            !closed_within(stream, Duration::from_millis(20)).await,
            "recent silent connection {i} was closed"
        );
    }
    assert_eq!(proxy.unauthenticated(), CAP - 1);
    proxy.close().await;
}

/// A connection that does not send a complete head with the secret within `auth_timeout` is
/// closed, silent or trickling; the count goes back to zero.
#[tokio::test]
async fn unauthenticated_connections_time_out() {
    let limits = ProxyLimits {
        auth_timeout: Duration::from_millis(300),
        ..ProxyLimits::default()
    };
    let (proxy, _, _) = proxy_limited(&[], upstream_config(&[]), limits).await;
    let mut waiting = Vec::new();
    for _ in 0..10 {
        waiting.push(TcpStream::connect(proxy.addr()).await.unwrap());
    }
    let mut trickle = TcpStream::connect(proxy.addr()).await.unwrap();
    trickle
        .write_all(b"CONNECT api.anthropic.com:443 HTTP/1.1\r\n")
        .await
        .unwrap();
    waiting.push(trickle);
    for stream in &mut waiting {
        assert!(closed_within(stream, Duration::from_secs(10)).await);
    }
    // The gate forgets each one as its task ends, just after the close.
    tokio::time::timeout(Duration::from_secs(5), async {
        while proxy.unauthenticated() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the timed-out connections stopped counting");
    let origin = ok_origin().await;
    assert!(authenticated_get(&proxy, origin).await.ends_with("ok"));
    proxy.close().await;
}

/// Many concurrent large responses: each reaches the client whole, while the body bytes kept
/// for tracing, all exchanges together, never pass `max_buffered_bytes`; the bodies that met the
/// cap are recorded `truncated`, and everything is given back once decoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn total_buffered_bytes_are_capped_and_responses_relayed_whole() {
    const CLIENTS: usize = 8;
    const BODY: usize = 3 * 1024 * 1024 / 2;
    const CAP: usize = 1024 * 1024;
    let mut response =
        format!("HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {BODY}\r\n\r\n")
            .into_bytes();
    response.extend((0..BODY).map(|i| (i % 251) as u8));
    let upstream = stand_in("api.anthropic.com", response.clone()).await;
    let limits = ProxyLimits {
        max_buffered_bytes: CAP,
        ..ProxyLimits::default()
    };
    let (proxy, ca, sink) = proxy_limited(
        &[("api.anthropic.com", upstream.addr)],
        upstream_config(&[&upstream.ca_pem]),
        limits,
    )
    .await;
    let proxy = Arc::new(proxy);
    let connector = agent_tls(&ca);
    let mut clients = JoinSet::new();
    for _ in 0..CLIENTS {
        let (proxy, connector) = (proxy.clone(), connector.clone());
        clients.spawn(async move {
            let (tcp, head) = connect(&proxy, "api.anthropic.com:443").await;
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            let mut tls = connector
                .connect(ServerName::try_from("api.anthropic.com").unwrap(), tcp)
                .await
                .unwrap();
            tls.write_all(b"GET /v1/models HTTP/1.1\r\nHost: api.anthropic.com\r\n\r\n")
                .await
                .unwrap();
            let mut got = Vec::new();
            tokio::time::timeout(Duration::from_secs(60), tls.read_to_end(&mut got))
                .await
                .expect("the response in time")
                .unwrap();
            got
        });
    }
    while let Some(got) = clients.join_next().await {
        let got = got.unwrap();
        assert!(
            got == response,
            "a response of {} bytes came back altered",
            got.len()
        );
    }
    tokio::time::timeout(Duration::from_secs(30), async {
        while sink.events.lock().unwrap().len() < CLIENTS {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("every exchange decoded");
    let peak = proxy.peak_buffered_bytes();
    assert!(peak <= CAP && peak > 0, "peak {peak}, cap {CAP}");
    assert_eq!(proxy.buffered_bytes(), 0);
    for (_, event) in sink.events.lock().unwrap().iter() {
        let json = serde_json::to_value(event).unwrap();
        assert_eq!(json["kind"], "opaque_http", "{json}");
        // Each body alone is over the total cap: each was cut, none interrupted.
        assert_eq!(
            json["entry"]["truncated"],
            serde_json::json!(["response_body"]),
            "{json}"
        );
        assert_eq!(json["entry"]["status"], 200);
    }
    Arc::into_inner(proxy).unwrap().close().await;
}

/// A model endpoint the agent is configured with (a gateway host and port): over `https://`
/// its exchanges are decrypted and decoded as the API it speaks there, under a path prefix;
/// plain `http://` ones are read as they are forwarded. The same host on another port is not
/// the endpoint: its tunnel is never decrypted.
#[tokio::test]
async fn a_configured_model_endpoint_is_traced_as_its_api() {
    let gateway = |url: &str| {
        ModelEndpoint::parse("ANTHROPIC_BASE_URL", url, LlmApi::AnthropicMessages).unwrap()
    };
    let upstream = stand_in("gw.example", sse()).await;
    let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain_addr = plain.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = plain.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = s.read(&mut buf).await.unwrap();
        s.write_all(&sse()).await.unwrap();
    });
    let (proxy, ca, sink) = proxy_full(
        &[("gw.example", upstream.addr), ("plain.example", plain_addr)],
        upstream_config(&[&upstream.ca_pem]),
        ProxyLimits::default(),
        vec![
            gateway("https://gw.example:8443/anthropic"),
            gateway("http://plain.example:8080"),
        ],
    )
    .await;
    let body = r#"{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}"#;

    let (tcp, head) = connect(&proxy, "gw.example:8443").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut tls = agent_tls(&ca)
        .connect(ServerName::try_from("gw.example").unwrap(), tcp)
        .await
        .expect("the agent trusts the session CA's leaf for the endpoint");
    tls.write_all(
        format!(
            "POST /anthropic/v1/messages HTTP/1.1\r\nHost: gw.example:8443\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut response)).await;
    assert_eq!(response, sse());

    let mut tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    tcp.write_all(
        format!(
            "POST http://plain.example:8080/v1/messages HTTP/1.1\r\nHost: plain.example:8080\r\n{AUTH}content-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(read_all(&mut tcp).await, sse());

    // Another port of the gateway's host: a tunnel, its bytes untouched.
    let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = echo.accept().await.unwrap();
        let mut buf = vec![0u8; 256];
        let n = s.read(&mut buf).await.unwrap();
        s.write_all(&buf[..n]).await.unwrap();
    });
    let (tunnelled, _, _) = proxy_full(
        &[("gw.example", echo_addr)],
        upstream_config(&[]),
        ProxyLimits::default(),
        vec![gateway("https://gw.example:8443")],
    )
    .await;
    let (mut tcp, head) = connect(&tunnelled, "gw.example:443").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tcp.write_all(b"\x16\x03\x01 not parsed").await.unwrap();
    let mut echoed = [0u8; 14];
    tcp.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"\x16\x03\x01 not parsed");
    tunnelled.close().await;

    proxy.close().await;
    let events = sink.events.lock().unwrap().clone();
    assert_eq!(events.len(), 2, "{events:?}");
    for (_, event) in &events {
        let json = serde_json::to_value(event).unwrap();
        assert_eq!(json["kind"], "llm_exchange", "{json}");
        assert!(json.to_string().contains("end_turn"), "{json}");
    }
    assert_eq!(sink.sent.lock().unwrap().len(), 2);
}
