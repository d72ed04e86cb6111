use std::sync::Mutex;

use ac7_protocol::trace::activity::ActivityEvent;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
            secret: "s3cret".into(),
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
        upstream_tls(true).unwrap(),
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
