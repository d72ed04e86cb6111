//! The runner's trace host with real parts. The real Claude Code (`claude -p`,
//! `@anthropic-ai/claude-code` from npm, installed once into `<target dir>/tmp/claude-npm`;
//! `$AC7_TEST_CLAUDE` points at another binary) runs under `ac7 claude-code` against a real
//! broker, with its default `https://api.anthropic.com` base URL: its traffic goes through the
//! runner's proxy, which dials a local stand-in for the Messages API served over TLS
//! (`AC7_TRACE_UPSTREAM=api.anthropic.com=127.0.0.1:PORT`; the stand-in's certificate comes from
//! a test CA the runner trusts through `AC7_CA_CERT`). The exchange must reach the member's
//! activity, live, without the API key.
//!
//! The other tests drive `ac7 run --trace` with a shell command as the agent, the proxy URL
//! read from its environment: a non-model host is tunnelled byte for byte and recorded nowhere,
//! a plain `http://` request is forwarded, an upstream with an untrusted certificate is a 502,
//! and the CA file is gone once the runner exits.

#![allow(clippy::unwrap_used)]

use crate::broker_support;
use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use broker_support::start_broker;
use common::messages_api::{self, Seen};
use common::{tempdir, within};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const API_KEY: &str = "sk-ant-api03-trace-test-dummy-key-0123456789abcdef";

/// A test CA and a TLS server config for `host` signed by it.
pub(crate) struct TestCa {
    pub(crate) pem_file: PathBuf,
    pub(crate) server: Arc<rustls::ServerConfig>,
}

pub(crate) fn test_ca(dir: &Path, host: &str) -> TestCa {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![host.to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let pem_file = dir.join("test-ca.pem");
    std::fs::write(&pem_file, ca_cert.pem()).unwrap();
    let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
    .unwrap();
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    TestCa {
        pem_file,
        server: Arc::new(server),
    }
}

/// Serves `app` over TLS on 127.0.0.1; returns the address.
pub(crate) async fn serve_tls(
    app: axum::Router,
    config: Arc<rustls::ServerConfig>,
) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

/// Names of the trace CA files in `dir`.
fn ca_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ac7-trace-"))
        .collect()
}

/// The real claude, its model traffic through the trace host: the exchange (model, usage, stop
/// reason) reaches `GET /members/builder/activity` and the live SSE stream within a second of
/// the stand-in's answer, without the API key; the CA file is gone after the runner exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_claude_exchange_is_traced_live_without_secrets() {
    let claude = common::npm::claude();
    let broker = start_broker().await;
    let dir = tempdir();
    let tmp = dir.path().join("tmp");
    let home = dir.path().join("home");
    let work = dir.path().join("work");
    for d in [&tmp, &home, &work] {
        std::fs::create_dir_all(d).unwrap();
    }
    let ca = test_ca(dir.path(), "api.anthropic.com");
    let seen: Seen = Arc::default();
    let answered = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let stamp = answered.clone();
    let app = messages_api::router(seen.clone()).layer(axum::middleware::map_response(
        move |r: axum::response::Response| {
            let stamp = stamp.clone();
            async move {
                if r.headers()
                    .get("content-type")
                    .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
                {
                    *stamp.lock().unwrap() = Some(Instant::now());
                }
                r
            }
        },
    ));
    let api = serve_tls(app, ca.server.clone()).await;

    let mut live = broker
        .sse_path("builder", "/members/builder/activity/stream", None)
        .await;
    // The live stream is read all along: when the exchange arrives, and what it says.
    let (seen_live, mut live_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(block) = live.next_block().await {
            let data: String = block
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            if let Ok(row) = serde_json::from_str::<Value>(&data)
                && row["event"]["kind"] == "llm_exchange"
            {
                let _ = seen_live.send((Instant::now(), row));
            }
        }
    });
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ac7"));
    command
        .args(["claude-code", "--url", &broker.url, "--"])
        .args([
            "-p",
            "say hello",
            "--output-format",
            "stream-json",
            "--verbose",
        ])
        .current_dir(&work)
        .env("AC7_TOKEN", broker.token("builder"))
        .env("CLAUDE_PATH", &claude)
        .env("HOME", &home)
        .env("TMPDIR", &tmp)
        .env("ANTHROPIC_API_KEY", API_KEY)
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("AC7_TRACE_UPSTREAM", format!("api.anthropic.com={api}"))
        .env("AC7_CA_CERT", &ca.pem_file)
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("HTTPS_PROXY")
        .env_remove("HTTP_PROXY")
        .env_remove("NODE_EXTRA_CA_CERTS")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let run = command.output();
    let out = within(120, "ac7 claude-code -p", run).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.contains("hello from the stand-in"),
        "claude got the stand-in's answer through the proxy:\n{stdout}\n{stderr}"
    );

    // Live: the exchange on the member's activity stream, within a second of the answer.
    let (arrived, row) = within(10, "the exchange on the live stream", live_rx.recv())
        .await
        .unwrap();
    assert_eq!(row["memberName"], "builder", "{row}");
    let answered = answered
        .lock()
        .unwrap()
        .expect("the stand-in answered a stream");
    let lag = arrived.saturating_duration_since(answered);
    assert!(
        lag < Duration::from_secs(1),
        "the exchange reached the live stream {lag:?} after the answer"
    );

    let rows = broker.get("/members/builder/activity", "builder").await;
    assert_eq!(rows.status, 200, "{}", rows.text);
    assert!(
        !rows.text.contains(API_KEY),
        "the API key is stored: {}",
        rows.text
    );
    assert!(
        !rows.text.contains("trace-test-dummy"),
        "part of the API key is stored: {}",
        rows.text
    );
    let entry = rows.json["activity"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["event"])
        .find(|e| e["kind"] == "llm_exchange" && e["entry"]["response"]["stopReason"] == "end_turn")
        .map(|e| e["entry"].clone())
        .unwrap_or_else(|| panic!("no finished exchange among {}", rows.text));
    assert!(
        entry["request"]["model"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{entry}"
    );
    assert_eq!(entry["response"]["usage"]["inputTokens"], 5, "{entry}");
    assert_eq!(entry["response"]["usage"]["outputTokens"], 5, "{entry}");

    assert!(
        ca_files(&tmp).is_empty(),
        "left behind: {:?}",
        ca_files(&tmp)
    );
}

/// `ac7 run --trace -- sh -c …` whose agent writes its proxy variables (and its open-file soft
/// limit) to a file and waits; returns the runner and the proxy URL.
struct TracedRun {
    child: tokio::process::Child,
    proxy: String,
    tmp: PathBuf,
    /// The agent's `ulimit -n`.
    agent_fd_limit: String,
    /// The session CA the agent is told to trust (`NODE_EXTRA_CA_CERTS`).
    ca_file: PathBuf,
}

/// [`traced_run_limited`] with the open-file limit this process has.
async fn traced_run(
    broker_url: &str,
    token: &str,
    dir: &Path,
    extra: &[(&str, &Path)],
) -> TracedRun {
    traced_run_limited(broker_url, token, dir, extra, None).await
}

/// [`traced_run`] with the runner started under an open-file soft limit of `soft_fd_limit`
/// (the hard limit unchanged).
async fn traced_run_limited(
    broker_url: &str,
    token: &str,
    dir: &Path,
    extra: &[(&str, &Path)],
    soft_fd_limit: Option<u64>,
) -> TracedRun {
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let env_file = dir.join("agent-env");
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ac7"));
    command
        .args(["run", "--trace", "--url", broker_url, "--mcp-config"])
        .arg(dir.join("mcp.json"))
        .args(["--", "sh", "-c"])
        .arg(format!(
            "printf '%s\\n%s\\n%s\\n%s\\n' \"$HTTPS_PROXY\" \"$NODE_EXTRA_CA_CERTS\" \"$NO_PROXY\" \"$(ulimit -n)\" > {}.part && mv {0}.part {0} && read line; exit 0",
            env_file.display()
        ))
        .env("AC7_TOKEN", token)
        .env("TMPDIR", &tmp)
        .stdin(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in extra {
        command.env(k, v);
    }
    if let Some(soft) = soft_fd_limit {
        // SAFETY: between fork and exec, two system calls (async-signal-safe) on a local struct.
        unsafe {
            command.pre_exec(move || {
                let mut limit = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                limit.rlim_cur = soft.min(limit.rlim_max);
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let child = command.spawn().unwrap();
    let text = within(20, "the agent's environment", async {
        loop {
            if let Ok(text) = std::fs::read_to_string(&env_file) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("http://ac7:"), "{text}");
    assert!(lines[1].contains("ac7-trace-"), "{text}");
    assert!(Path::new(lines[1]).exists());
    assert!(lines[2].ends_with("localhost,127.0.0.1,::1"), "{text}");
    TracedRun {
        child,
        proxy: lines[0].to_owned(),
        tmp,
        agent_fd_limit: lines[3].to_owned(),
        ca_file: PathBuf::from(lines[1]),
    }
}

impl TracedRun {
    /// The proxy's address and its `Proxy-Authorization` header line.
    fn proxy(&self) -> (String, String) {
        use base64::Engine as _;
        let rest = self.proxy.strip_prefix("http://").unwrap();
        let (creds, addr) = rest.split_once('@').unwrap();
        let auth = base64::engine::general_purpose::STANDARD.encode(creds);
        (
            addr.to_owned(),
            format!("Proxy-Authorization: Basic {auth}\r\n"),
        )
    }

    async fn exit(mut self) {
        drop(self.child.stdin.take());
        let status = within(20, "the runner to exit", self.child.wait())
            .await
            .unwrap();
        assert_eq!(status.code(), Some(0));
        assert!(
            ca_files(&self.tmp).is_empty(),
            "left behind: {:?}",
            ca_files(&self.tmp)
        );
    }
}

async fn read_to_end(stream: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    within(10, "the proxied answer", stream.read_to_end(&mut out))
        .await
        .unwrap();
    out
}

/// Through the runner's proxy: a non-model host is a byte-for-byte tunnel that leaves no
/// activity; a plain `http://` request is forwarded; an upstream whose certificate the runner
/// does not trust is a 502; the CA file is gone after the runner exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_proxy_tunnels_forwards_refuses_untrusted_and_cleans_up() {
    let broker = start_broker().await;
    let dir = tempdir();
    // A model-host stand-in whose CA the runner is NOT given.
    let untrusted = test_ca(dir.path(), "api.anthropic.com");
    let api = serve_tls(messages_api::router(Arc::default()), untrusted.server).await;
    let upstream = format!("api.anthropic.com={api}");
    let run = traced_run(
        &broker.url,
        broker.token("builder"),
        dir.path(),
        &[("AC7_TRACE_UPSTREAM", Path::new(&upstream))],
    )
    .await;
    let (addr, auth) = run.proxy();

    // A non-model host: the bytes come back exactly, in both directions.
    let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = echo.accept().await.unwrap();
        let mut buf = vec![0u8; 256];
        let n = s.read(&mut buf).await.unwrap();
        s.write_all(&buf[..n]).await.unwrap();
    });
    let mut tcp = TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(format!("CONNECT {echo_addr} HTTP/1.1\r\n{auth}\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 39];
    tcp.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200 Connection Established\r\n\r\n");
    let payload = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: sk-ant-api03-zzz\r\n\r\n\x00\x01\xfe\xff";
    tcp.write_all(payload).await.unwrap();
    assert_eq!(read_to_end(&mut tcp).await, payload);

    // A plain http:// request.
    let origin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin_addr = origin.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = origin.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = s.read(&mut buf).await.unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .await
            .unwrap();
    });
    let mut tcp = TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(
        format!("GET http://{origin_addr}/x HTTP/1.1\r\nHost: {origin_addr}\r\n{auth}\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let answer = String::from_utf8(read_to_end(&mut tcp).await).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200 OK") && answer.ends_with("ok"),
        "{answer}"
    );

    // The model host with a certificate the runner does not trust.
    let mut tcp = TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(format!("CONNECT api.anthropic.com:443 HTTP/1.1\r\n{auth}\r\n").as_bytes())
        .await
        .unwrap();
    let answer = String::from_utf8(read_to_end(&mut tcp).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");

    run.exit().await;
    // Nothing was recorded: the tunnel is never parsed, the plain request went to a non-model
    // host, and the refused connection carried no exchange.
    let rows = broker.get("/members/builder/activity", "builder").await;
    assert_eq!(rows.status, 200, "{}", rows.text);
    assert_eq!(
        rows.json["activity"],
        serde_json::json!([]),
        "{}",
        rows.text
    );
}

/// `ac7 run` traces only with `--trace` (with `--no-trace` too: a usage error); a trace
/// host that cannot start is one warning and the agent runs untraced, its environment untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracing_is_opt_in_for_run_and_a_failed_start_runs_untraced() {
    let broker = start_broker().await;
    let dir = tempdir();
    let run = |extra: &[&str], env: &[(&str, &str)]| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ac7"));
        command
            .arg("run")
            .args(extra)
            .args(["--url", &broker.url, "--mcp-config"])
            .arg(dir.path().join("mcp.json"))
            .args([
                "--",
                "sh",
                "-c",
                "printf '[%s]' \"$HTTPS_PROXY$NODE_EXTRA_CA_CERTS\"",
            ])
            .env("AC7_TOKEN", broker.token("builder"))
            .env("HTTPS_PROXY", "")
            .env_remove("NODE_EXTRA_CA_CERTS");
        for (k, v) in env {
            command.env(k, v);
        }
        command.output()
    };
    let out = within(20, "ac7 run", run(&[], &[])).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[]");
    let out = within(
        20,
        "ac7 run --trace --no-trace",
        run(&["--trace", "--no-trace"], &[]),
    )
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = within(
        20,
        "ac7 run --trace (failing)",
        run(&["--trace"], &[("AC7_TRACE_UPSTREAM", "not a mapping")]),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[]");
    assert_eq!(
        stderr.matches("trace host failed to start").count(),
        1,
        "{stderr}"
    );
}

/// Open descriptors of process `pid`.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// The open-file (soft, hard) limits of process `pid`; `u64::MAX` for unlimited.
fn fd_limits(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let value = |v: &str| v.parse().unwrap_or(u64::MAX);
    let fields: Vec<&str> = line["Max open files".len()..].split_whitespace().collect();
    (value(fields[0]), value(fields[1]))
}

/// The adversarial run's attack: another local process opens 1,100 connections to the runner's
/// proxy and sends nothing. The runner, started under a soft limit of 1,024 (as most shells give),
/// raised it, holds at most the 64 newest of those connections (closing the oldest at once), and
/// an authenticated request goes through while the attacker still holds all of them; the agent
/// got the limit the runner was started with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_cannot_stall_the_agent() {
    const SILENT: usize = 1100;
    const CAP: usize = 64;
    // This process holds the 1,100 client ends.
    ac7_runtime::sys::rlimit::raise_fd_limit();
    let broker = start_broker().await;
    let dir = tempdir();
    let run = traced_run_limited(
        &broker.url,
        broker.token("builder"),
        dir.path(),
        &[],
        Some(1024),
    )
    .await;
    let pid = run.child.id().unwrap();
    let (addr, auth) = run.proxy();
    let origin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin_addr = origin.local_addr().unwrap();
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
    let baseline = fd_count(pid);

    let mut silent = Vec::with_capacity(SILENT);
    for _ in 0..SILENT {
        silent.push(TcpStream::connect(&addr).await.unwrap());
    }
    // All of them still held on this side: the agent's request goes through.
    let mut tcp = TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(
        format!("GET http://{origin_addr}/x HTTP/1.1\r\nHost: {origin_addr}\r\n{auth}\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let answer = String::from_utf8(read_to_end(&mut tcp).await).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200 OK") && answer.ends_with("ok"),
        "{answer}"
    );
    // The runner keeps at most the newest 64 of them.
    let during = fd_count(pid);
    assert!(
        during <= baseline + CAP + 4,
        "the runner holds {during} descriptors under attack ({baseline} before)"
    );
    // The oldest were closed by the runner (evicted as newer ones came).
    for (i, stream) in silent[..SILENT - CAP - 1].iter_mut().enumerate() {
        let mut byte = [0u8; 1];
        let read = within(10, "an evicted connection to close", stream.read(&mut byte)).await;
        assert!(matches!(read, Ok(0) | Err(_)), "connection {i}: {read:?}");
    }
    let (soft, hard) = fd_limits(pid);
    assert_eq!(soft, hard, "the runner raised its open-file soft limit");
    assert_eq!(
        run.agent_fd_limit,
        1024.min(hard).to_string(),
        "the agent's limit"
    );
    drop(silent);
    run.exit().await;
}

/// Whether the roster shows `member` busy.
async fn busy(broker: &broker_support::TestBroker, member: &str) -> bool {
    let roster = broker.get("/roster", "director").await;
    roster.json["connected"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["name"] == member && m["busy"] == true)
}

/// The member's `llm_exchange` rows, once there is one.
async fn exchanges(broker: &broker_support::TestBroker, member: &str) -> Vec<Value> {
    let path = format!("/members/{member}/activity");
    common::wait_until("an llm_exchange row", Duration::from_secs(20), async || {
        let rows = broker.get(&path, member).await;
        let found: Vec<Value> = rows.json["activity"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["event"]["kind"] == "llm_exchange")
            .map(|r| r["event"]["entry"].clone())
            .collect();
        (!found.is_empty()).then_some(found)
    })
    .await
}

/// A Messages API stand-in whose answers wait until `gate` turns true.
fn held_messages_api(gate: tokio::sync::watch::Receiver<bool>) -> axum::Router {
    messages_api::router(Arc::default()).layer(axum::middleware::map_request(
        move |request: axum::extract::Request| {
            let mut gate = gate.clone();
            async move {
                let _ = gate.wait_for(|open| *open).await;
                request
            }
        },
    ))
}

/// A TLS client that trusts only the PEM file `ca`.
fn client_trusting(ca: &Path) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(
        rustls::pki_types::CertificateDer::pem_file_iter(ca)
            .unwrap()
            .map(Result::unwrap),
    );
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

const MESSAGES_BODY: &str = r#"{"model":"claude-gateway-test","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"t","input_schema":{"type":"object"}}]}"#;

/// Traces follow `ANTHROPIC_BASE_URL` to a gateway (a host that is none of the default model
/// hosts, resolved to a local TLS stand-in): the exchange through the runner's proxy is
/// decrypted, shows the member busy while it is in flight, and is recorded as an
/// `llm_exchange`. A plain `http://` gateway off loopback is traced as the proxy forwards it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_named_by_anthropic_base_url_is_traced_and_shows_busy() {
    let broker = start_broker().await;
    let dir = tempdir();
    let ca = test_ca(dir.path(), "gateway.test");
    let (open, gate) = tokio::sync::watch::channel(false);
    let app = axum::Router::new().nest("/anthropic", held_messages_api(gate));
    let gateway = serve_tls(app, ca.server.clone()).await;
    let base_url = format!("https://gateway.test:{}/anthropic", gateway.port());
    let upstream = format!("gateway.test=127.0.0.1:{}", gateway.port());
    let run = traced_run(
        &broker.url,
        broker.token("builder"),
        dir.path(),
        &[
            ("ANTHROPIC_BASE_URL", Path::new(&base_url)),
            ("AC7_TRACE_UPSTREAM", Path::new(&upstream)),
            ("AC7_CA_CERT", &ca.pem_file),
        ],
    )
    .await;
    let (addr, auth) = run.proxy();
    let mut tcp = TcpStream::connect(&addr).await.unwrap();
    let authority = format!("gateway.test:{}", gateway.port());
    tcp.write_all(format!("CONNECT {authority} HTTP/1.1\r\n{auth}\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 39];
    tcp.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200 Connection Established\r\n\r\n");
    // The agent trusts only the session CA: the proxy decrypts the gateway's traffic.
    let mut tls = client_trusting(&run.ca_file)
        .connect(
            rustls::pki_types::ServerName::try_from("gateway.test").unwrap(),
            tcp,
        )
        .await
        .expect("the proxy presents a leaf of the session CA for the gateway");
    tls.write_all(
        format!(
            "POST /anthropic/v1/messages HTTP/1.1\r\nHost: {authority}\r\nx-api-key: {API_KEY}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{MESSAGES_BODY}",
            MESSAGES_BODY.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    // The call is in flight (the gateway holds its answer): the member is busy.
    common::wait_until(
        "builder busy on the roster",
        Duration::from_secs(20),
        async || busy(&broker, "builder").await,
    )
    .await;
    open.send(true).unwrap();
    let mut answer = Vec::new();
    within(20, "the gateway's answer", tls.read_to_end(&mut answer))
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("hello from the stand-in"),
        "{answer}"
    );
    let rows = exchanges(&broker, "builder").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        rows[0]["request"]["model"], "claude-gateway-test",
        "{rows:?}"
    );
    assert_eq!(rows[0]["response"]["stopReason"], "end_turn", "{rows:?}");
    assert!(
        !format!("{rows:?}").contains("trace-test-dummy"),
        "{rows:?}"
    );
    common::wait_until("builder idle again", Duration::from_secs(20), async || {
        !busy(&broker, "builder").await
    })
    .await;
    run.exit().await;

    // A plain http:// gateway that is not on loopback goes through the proxy, which forwards
    // it and reads the exchange.
    let broker = start_broker().await;
    let dir = tempdir();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = messages_api::router(Arc::default());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let base_url = format!("http://gateway.test:{port}");
    let upstream = format!("gateway.test=127.0.0.1:{port}");
    let run = traced_run(
        &broker.url,
        broker.token("builder"),
        dir.path(),
        &[
            ("ANTHROPIC_BASE_URL", Path::new(&base_url)),
            ("AC7_TRACE_UPSTREAM", Path::new(&upstream)),
        ],
    )
    .await;
    let (addr, auth) = run.proxy();
    let mut tcp = TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(
        format!(
            "POST {base_url}/v1/messages HTTP/1.1\r\nHost: gateway.test:{port}\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\n\r\n{MESSAGES_BODY}",
            MESSAGES_BODY.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let answer = String::from_utf8(read_to_end(&mut tcp).await).unwrap();
    assert!(answer.contains("hello from the stand-in"), "{answer}");
    let rows = exchanges(&broker, "builder").await;
    assert_eq!(
        rows[0]["request"]["model"], "claude-gateway-test",
        "{rows:?}"
    );
    run.exit().await;
}

/// A model endpoint on loopback is reached without the proxy (`NO_PROXY` has the loopback
/// names): the runner says once that its exchanges cannot be traced; one that is no URL is
/// one warning too. Neither stops the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_the_proxy_cannot_see_is_one_warning() {
    let broker = start_broker().await;
    let dir = tempdir();
    let run = |base_url: &str| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ac7"));
        command
            .args(["run", "--trace", "--url", &broker.url, "--mcp-config"])
            .arg(dir.path().join("mcp.json"))
            .args(["--", "sh", "-c", "printf '[%s]' \"$ANTHROPIC_BASE_URL\""])
            .env("AC7_TOKEN", broker.token("builder"))
            .env("ANTHROPIC_BASE_URL", base_url)
            .env_remove("NO_PROXY")
            .env_remove("no_proxy");
        command.output()
    };
    let out = within(20, "ac7 run --trace", run("http://127.0.0.1:4000/llm"))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "[http://127.0.0.1:4000/llm]"
    );
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("ac7: warning:"))
        .collect();
    assert_eq!(
        warnings,
        [
            "ac7: warning: the model endpoint http://127.0.0.1:4000/llm (ANTHROPIC_BASE_URL) is reached without the trace proxy (NO_PROXY has 127.0.0.1, which the runner always adds for loopback): its exchanges cannot be traced, and the member is not shown busy while it waits for them"
        ],
        "{stderr}"
    );

    let out = within(20, "ac7 run --trace", run("gateway.test/v1"))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("ac7: warning:"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].starts_with("ac7: warning: ANTHROPIC_BASE_URL=gateway.test/v1 is not a URL")
            && warnings[0].ends_with("the agent's calls to it cannot be traced"),
        "{stderr}"
    );
}

/// The real claude with `ANTHROPIC_BASE_URL` naming a gateway, in its environment or in the
/// `env` of its user settings: its model calls go through the runner's proxy to the gateway's
/// stand-in and are traced — the member shows busy while the gateway holds its answer, and the
/// exchange is an `llm_exchange` row without the API key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_claude_through_a_gateway_is_traced() {
    real_claude_through_a_gateway(false).await;
    real_claude_through_a_gateway(true).await;
}

async fn real_claude_through_a_gateway(in_settings: bool) {
    let claude = common::npm::claude();
    let broker = start_broker().await;
    let dir = tempdir();
    let tmp = dir.path().join("tmp");
    let home = dir.path().join("home");
    let work = dir.path().join("work");
    for d in [&tmp, &home, &work] {
        std::fs::create_dir_all(d).unwrap();
    }
    let ca = test_ca(dir.path(), "gateway.test");
    let (open, gate) = tokio::sync::watch::channel(false);
    let gateway = serve_tls(held_messages_api(gate), ca.server.clone()).await;
    let base_url = format!("https://gateway.test:{}", gateway.port());
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ac7"));
    if in_settings {
        std::fs::create_dir_all(home.join(".claude")).unwrap();
        std::fs::write(
            home.join(".claude/settings.json"),
            serde_json::json!({"env": {"ANTHROPIC_BASE_URL": base_url}}).to_string(),
        )
        .unwrap();
        command.env_remove("ANTHROPIC_BASE_URL");
    } else {
        command.env("ANTHROPIC_BASE_URL", &base_url);
    }
    command
        .args(["claude-code", "--url", &broker.url, "--"])
        .args([
            "-p",
            "say hello",
            "--output-format",
            "stream-json",
            "--verbose",
        ])
        .current_dir(&work)
        .env("AC7_TOKEN", broker.token("builder"))
        .env("CLAUDE_PATH", &claude)
        .env("HOME", &home)
        .env("TMPDIR", &tmp)
        .env("ANTHROPIC_API_KEY", API_KEY)
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env_remove("CLAUDE_CONFIG_DIR")
        .env(
            "AC7_TRACE_UPSTREAM",
            format!("gateway.test=127.0.0.1:{}", gateway.port()),
        )
        .env("AC7_CA_CERT", &ca.pem_file)
        .env_remove("HTTPS_PROXY")
        .env_remove("HTTP_PROXY")
        .env_remove("NO_PROXY")
        .env_remove("NODE_EXTRA_CA_CERTS")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let stderr = tokio::spawn(async move {
        let mut text = String::new();
        let _ = tokio::io::BufReader::new(stderr)
            .read_to_string(&mut text)
            .await;
        text
    });
    common::wait_until(
        "builder busy on the roster",
        Duration::from_secs(60),
        async || busy(&broker, "builder").await,
    )
    .await;
    open.send(true).unwrap();
    let out = within(120, "ac7 claude-code -p", child.wait_with_output())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = stderr.await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.contains("hello from the stand-in"),
        "claude got the gateway's answer through the proxy:\n{stdout}\n{stderr}"
    );
    assert!(!stderr.contains("warning"), "{stderr}");
    let rows = exchanges(&broker, "builder").await;
    assert!(
        rows.iter()
            .any(|e| e["response"]["stopReason"] == "end_turn"
                && e["request"]["model"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty())),
        "{rows:?}"
    );
    assert!(
        !format!("{rows:?}").contains("trace-test-dummy"),
        "{rows:?}"
    );
}

/// A gateway whose certificate comes from a private CA the agent is told to trust
/// (`NODE_EXTRA_CA_CERTS`, no `AC7_CA_CERT`): the proxy trusts that CA too, so the gateway's
/// exchanges are traced; and the agent keeps trusting it, for the hosts the proxy only tunnels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_with_a_private_ca_the_agent_trusts_is_traced() {
    let broker = start_broker().await;
    let dir = tempdir();
    let ca = test_ca(dir.path(), "gateway.test");
    let gateway = serve_tls(messages_api::router(Arc::default()), ca.server.clone()).await;
    let base_url = format!("https://gateway.test:{}", gateway.port());
    let upstream = format!("gateway.test=127.0.0.1:{}", gateway.port());
    let run = traced_run(
        &broker.url,
        broker.token("builder"),
        dir.path(),
        &[
            ("ANTHROPIC_BASE_URL", Path::new(&base_url)),
            ("AC7_TRACE_UPSTREAM", Path::new(&upstream)),
            ("NODE_EXTRA_CA_CERTS", &ca.pem_file),
        ],
    )
    .await;
    let trusted = std::fs::read_to_string(&run.ca_file).unwrap();
    let private = std::fs::read_to_string(&ca.pem_file).unwrap();
    assert!(trusted.contains(private.trim()), "{trusted}");
    let (addr, auth) = run.proxy();
    let mut tcp = TcpStream::connect(&addr).await.unwrap();
    let authority = format!("gateway.test:{}", gateway.port());
    tcp.write_all(format!("CONNECT {authority} HTTP/1.1\r\n{auth}\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = String::new();
    while !head.ends_with("\r\n\r\n") {
        let mut byte = [0u8; 1];
        if tcp.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(char::from(byte[0]));
    }
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "the proxy trusts the gateway: {head}"
    );
    let mut tls = client_trusting(&run.ca_file)
        .connect(
            rustls::pki_types::ServerName::try_from("gateway.test").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    tls.write_all(
        format!(
            "POST /v1/messages HTTP/1.1\r\nHost: {authority}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{MESSAGES_BODY}",
            MESSAGES_BODY.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    within(20, "the gateway's answer", tls.read_to_end(&mut answer))
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&answer).contains("hello from the stand-in"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let rows = exchanges(&broker, "builder").await;
    assert_eq!(
        rows[0]["request"]["model"], "claude-gateway-test",
        "{rows:?}"
    );
    run.exit().await;
}
