//! `ac7-bench trace`: what the runner's trace proxy costs a model API call.
//!
//! A broker child, and `ac7 run --trace -- sh …` as the runner (its agent only writes its proxy
//! variables to a file and waits). In this process: a stand-in for the Messages API over TLS
//! (a certificate from a CA the runner trusts through `AC7_CA_CERT`; the runner dials it through
//! `AC7_TRACE_UPSTREAM`), and a client that sends `POST /v1/messages` with a 10 KB JSON body and
//! reads a 50 KB SSE response, on one keep-alive TLS connection each: straight to the stand-in,
//! and through the runner's proxy (`CONNECT api.anthropic.com:443`, TLS with the runner's leaf).
//! The two alternate request by request. Prints both latencies (p50/p99 µs), the p50 difference,
//! and the runner's peak RSS (every exchange is traced and uploaded to the broker meanwhile).

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::broker::{BrokerChild, rt};
use super::{Latency, peak_rss_kib, sibling_binary};
use ac7_runtime::runner::trace::ca::TraceCa;

const ROUNDS: usize = 400;
const WARMUP: usize = 20;
const REQUEST_BYTES: usize = 10 * 1024;
const RESPONSE_BYTES: usize = 50 * 1024;
pub(super) const HOST: &str = "api.anthropic.com";

/// The scenario's figures.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    scenario: &'static str,
    request_bytes: usize,
    response_bytes: usize,
    direct: Latency,
    via_proxy: Latency,
    proxy_adds_p50_us: f64,
    proxy_adds_p99_us: f64,
    runner_peak_rss_kib: Option<u64>,
}

pub(super) fn request() -> Vec<u8> {
    let filler = "x".repeat(REQUEST_BYTES - 120);
    let body = format!(
        r#"{{"model":"claude-bench","max_tokens":64,"stream":true,"messages":[{{"role":"user","content":"{filler}"}}]}}"#
    );
    format!(
        "POST /v1/messages HTTP/1.1\r\nHost: {HOST}\r\nx-api-key: sk-ant-api03-bench\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn response() -> Vec<u8> {
    let mut body = String::from(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"claude-bench\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":2500,\"output_tokens\":1}}}\n\n",
    );
    let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lorem ipsum dolor sit amet consectetur\"}}\n\n";
    while body.len() + delta.len() < RESPONSE_BYTES - 200 {
        body.push_str(delta);
    }
    body.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":900}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Reads one HTTP message with a `content-length` body; `None` at end of stream.
pub(super) async fn read_message<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> Option<usize> {
    buf.clear();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if let Some(end) = memchr::memmem::find(buf, b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).ok()?;
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            let total = end + 4 + len;
            while buf.len() < total {
                let n = stream.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Some(total);
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn stand_in(config: Arc<rustls::ServerConfig>) -> anyhow::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let answer: Arc<[u8]> = response().into();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tcp.set_nodelay(true);
            let (acceptor, answer) = (acceptor.clone(), answer.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                while read_message(&mut tls, &mut buf).await.is_some() {
                    if tls.write_all(&answer).await.is_err() || tls.flush().await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(addr)
}

pub(super) fn client_config(ca_pem: &[u8]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert?)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

pub(super) async fn tls_over<S: AsyncRead + AsyncWrite + Unpin>(
    tcp: S,
    config: Arc<rustls::ClientConfig>,
) -> anyhow::Result<tokio_rustls::client::TlsStream<S>> {
    let name = rustls::pki_types::ServerName::try_from(HOST)?;
    Ok(tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?)
}

async fn round_trip<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    request: &[u8],
    buf: &mut Vec<u8>,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    stream.write_all(request).await?;
    stream.flush().await?;
    let n = read_message(stream, buf)
        .await
        .context("the connection closed mid-response")?;
    let elapsed = t.elapsed();
    if n < RESPONSE_BYTES - 200 || !buf.starts_with(b"HTTP/1.1 200") {
        bail!("short or failed response ({n} bytes)");
    }
    Ok(elapsed)
}

/// Runs the scenario.
pub(crate) fn run() -> anyhow::Result<Report> {
    let ac7 = sibling_binary("ac7")?;
    let broker = BrokerChild::spawn(1)?;
    let dir = std::env::temp_dir().join(format!("ac7-bench-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run_in(&ac7, &broker, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// `ac7 run --trace -- sh …` whose agent writes its proxy variables to a file and waits for a
/// line on its stdin.
pub(super) struct TracedRunner {
    pub(super) child: std::process::Child,
    /// `http://ac7:<secret>@127.0.0.1:<port>`.
    pub(super) proxy_url: String,
    /// The runner's session CA (PEM).
    pub(super) ca: Vec<u8>,
}

impl TracedRunner {
    /// Starts the runner against `broker` as `m0`, its model host dialled at `api` (a stand-in
    /// whose CA is in `upstream_pem`); `command` is adjusted first (e.g. its limits).
    pub(super) fn spawn(
        ac7: &Path,
        broker: &BrokerChild,
        dir: &Path,
        api: std::net::SocketAddr,
        upstream_pem: &Path,
        adjust: impl FnOnce(&mut Command),
    ) -> anyhow::Result<Self> {
        let env_file = dir.join("agent-env");
        let mut command = Command::new(ac7);
        command
            .args(["run", "--trace", "--url", &broker.url, "--mcp-config"])
            .arg(dir.join("mcp.json"))
            .args(["--", "sh", "-c"])
            .arg(format!(
                "printf '%s\\n%s\\n' \"$HTTPS_PROXY\" \"$NODE_EXTRA_CA_CERTS\" > {0}.part && mv {0}.part {0} && read line; exit 0",
                env_file.display()
            ))
            .env("AC7_TOKEN", broker.token("m0"))
            .env("AC7_LOG", "error")
            .env("AC7_CA_CERT", upstream_pem)
            .env("AC7_TRACE_UPSTREAM", format!("{HOST}={api}"))
            .stdin(Stdio::piped());
        adjust(&mut command);
        let mut child = command.spawn()?;
        let started = Instant::now();
        let env = loop {
            if let Ok(text) = std::fs::read_to_string(&env_file) {
                break text;
            }
            if started.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                bail!("the runner's agent never started");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut lines = env.lines();
        let proxy_url = lines.next().unwrap_or_default().to_owned();
        let ca = match std::fs::read(lines.next().unwrap_or_default()) {
            Ok(ca) => ca,
            Err(e) => {
                let _ = child.kill();
                return Err(e).context("the runner's CA file (is tracing on?)");
            }
        };
        Ok(Self {
            child,
            proxy_url,
            ca,
        })
    }

    /// The proxy's address and the `Proxy-Authorization` value.
    pub(super) fn proxy(&self) -> anyhow::Result<(String, String)> {
        use base64::Engine as _;
        let (creds, addr) = self
            .proxy_url
            .strip_prefix("http://")
            .and_then(|r| r.split_once('@'))
            .context("no proxy URL in the agent's environment")?;
        let auth = base64::engine::general_purpose::STANDARD.encode(creds);
        Ok((addr.to_owned(), format!("Basic {auth}")))
    }

    /// Lets the agent exit, then waits for the runner.
    pub(super) fn finish(mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// Opens a `CONNECT` tunnel to the model host through the proxy at `addr`.
pub(super) async fn connect_tunnel(addr: &str, auth: &str) -> anyhow::Result<TcpStream> {
    let mut tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    tcp.write_all(
        format!(
            "CONNECT {HOST}:443 HTTP/1.1\r\nHost: {HOST}:443\r\nProxy-Authorization: {auth}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if tcp.read(&mut byte).await? == 0 {
            bail!("the proxy closed the CONNECT");
        }
        head.push(byte[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        bail!("CONNECT answered {}", String::from_utf8_lossy(&head));
    }
    Ok(tcp)
}

fn run_in(ac7: &Path, broker: &BrokerChild, dir: &Path) -> anyhow::Result<Report> {
    let rt = rt()?;
    let upstream_ca = TraceCa::generate()?;
    let upstream_pem = dir.join("upstream-ca.pem");
    std::fs::File::create(&upstream_pem)?.write_all(upstream_ca.pem().as_bytes())?;
    let api = rt.block_on(stand_in(upstream_ca.server_config(HOST)?))?;
    let runner = TracedRunner::spawn(ac7, broker, dir, api, &upstream_pem, |_| {})?;
    let measured = rt.block_on(measure(api, &runner, &upstream_ca));
    let runner_peak_rss_kib = peak_rss_kib(runner.child.id());
    runner.finish();
    let (mut direct, mut via_proxy) = measured?;
    let direct = Latency::of(&mut direct).context("no samples")?;
    let via_proxy = Latency::of(&mut via_proxy).context("no samples")?;
    Ok(Report {
        scenario: "trace",
        request_bytes: REQUEST_BYTES,
        response_bytes: RESPONSE_BYTES,
        proxy_adds_p50_us: via_proxy.p50_us - direct.p50_us,
        proxy_adds_p99_us: via_proxy.p99_us - direct.p99_us,
        direct,
        via_proxy,
        runner_peak_rss_kib,
    })
}

async fn measure(
    api: std::net::SocketAddr,
    runner: &TracedRunner,
    upstream_ca: &TraceCa,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let (proxy_addr, auth) = runner.proxy()?;

    let tcp = TcpStream::connect(api).await?;
    tcp.set_nodelay(true)?;
    let mut direct = tls_over(tcp, client_config(upstream_ca.pem().as_bytes())?).await?;

    let tcp = connect_tunnel(&proxy_addr, &auth).await?;
    let mut proxied = tls_over(tcp, client_config(&runner.ca)?).await?;

    let request = request();
    let mut buf = Vec::new();
    let (mut a, mut b) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
    for i in 0..WARMUP + ROUNDS {
        let d = round_trip(&mut direct, &request, &mut buf).await?;
        let p = round_trip(&mut proxied, &request, &mut buf).await?;
        if i >= WARMUP {
            a.push(d);
            b.push(p);
        }
    }
    Ok((a, b))
}
