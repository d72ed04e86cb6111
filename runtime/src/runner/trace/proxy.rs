//! The trace host's proxy: a loopback HTTP proxy the agent's traffic goes through.
//!
//! - Listener on `127.0.0.1:0`; every connection gets an id (from 1), the key of its busy count.
//! - Every request must carry the session's secret as `Proxy-Authorization: Basic` (user `ac7`):
//!   the proxy URL given to the agent is `http://ac7:<secret>@127.0.0.1:<port>`, which Node
//!   (undici), reqwest, curl and git all turn into that header. Another local process cannot
//!   relay through the proxy (its traffic would be recorded as this member's): without the
//!   secret it gets `407`.
//! - `CONNECT host:port` (`[v6]:port` too) to a model API host ([`is_model_host`]: `anthropic.com`,
//!   `openai.com`, `openai.azure.com`, `chatgpt.com` and their subdomains, any port) or to one of
//!   the model endpoints the agent is configured with ([`ProxyConfig::endpoints`]: that host and
//!   port, whose exchanges are decoded as the endpoint's API whatever the host is called): the proxy
//!   first dials the upstream as a TLS client (SNI = the host, ALPN `http/1.1`, verified against
//!   the system and web PKI roots plus `AC7_CA_CERT`; `--unsafe-tls` skips verification). A
//!   failure before the handshake completes — refused, timed out, an untrusted certificate — is
//!   `502 Bad Gateway`. Then `200`, and the client's TLS is terminated with the host's leaf from
//!   the session CA. The plaintext goes through an [`HttpAssembler`]; client→server bytes are
//!   written only from its `Transmit` outputs (request heads leave with `Accept-Encoding:
//!   identity`). Finished exchanges are decoded (JSON and SSE bodies, redaction) on the proxy's
//!   own decode thread, never on the relay path: the bytes of the next request or response do
//!   not wait for the previous exchange's decoding. Exchanges reach the sink in the order they
//!   finished; [`TraceProxy::close`] waits for the queue to drain.
//! - `CONNECT` to any other host: a raw TCP tunnel, never parsed (the TypeScript
//!   runner decodes plaintext tunnels too).
//! - An absolute-form request (`GET http://host[:port]/path HTTP/1.1`) is forwarded to the host
//!   in origin form, without the `Proxy-*` headers and with `Connection: close` (one request per
//!   proxied connection), traced only when the host is a model API host or a configured model
//!   endpoint (the TypeScript runner's CONNECT-only proxy answers these with 400).
//! - Anything else: `400 Bad Request`; the listener stays up.
//!
//! Holding up against other local processes ([`ProxyLimits`]; docs/broker.md, "Tracing (runner)"):
//! - A connection is *unauthenticated* until its first request head is complete and carries the
//!   secret. At most `max_unauthenticated` (64) are open at once: accepting one more closes the
//!   oldest waiting one at once (oldest-first eviction, not refusal: refusing new connections
//!   would let 64 silent ones lock the agent out, while an agent's connection sends its head
//!   right after connecting and is gone from the queue long before 64 newer ones arrive). Each
//!   must authenticate within `auth_timeout` (5 s) or is closed. Authenticated connections (only
//!   the agent has the secret) are not counted, so the agent always gets through; with the
//!   runner's open-file limit raised to its hard limit, the descriptors are there for it.
//! - The body bytes kept for tracing, across every connection and the decode queue, are capped
//!   at `max_buffered_bytes` (64 MiB) besides the per-message cap: a body that would pass it is
//!   cut (`truncated` in the record) while its bytes are relayed whole. Bytes are counted from
//!   the moment they are kept until the decode thread is done with their exchange. The relay
//!   itself holds at most a 16 KiB read buffer each way and one head per connection.
//!
//! For tests, `AC7_TRACE_UPSTREAM=host=addr[,host=addr…]` dials `addr` instead of `host:port`;
//! the TLS name checked is still `host`.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use ac7_protocol::trace::activity::ActivityEvent;
use ac7_protocol::trace::activity::LlmApi;
use ac7_protocol::trace::http::{Exchange, HttpAssembler, HttpConfig, HttpOutput, ProxyConnId};
use ac7_protocol::trace::{TraceConfig, exchange_event_at};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::ca::TraceCa;
use super::endpoint::ModelEndpoint;

/// The test-only upstream override variable.
pub const UPSTREAM_ENV: &str = "AC7_TRACE_UPSTREAM";

/// Largest request head the proxy reads before deciding.
const MAX_HEAD: usize = 64 * 1024;
/// How long dialling (and the TLS handshake with) an upstream may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(15);
/// How long [`TraceProxy::close`] waits for open connections to wind up.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// How long [`TraceProxy::close`] then waits for the decode queue to drain.
const DECODE_GRACE: Duration = Duration::from_secs(5);

/// Where the proxy's findings go: the activity pipeline (and a channel in tests).
pub trait TraceSink: Send + Sync + 'static {
    /// A request on connection `conn` was sent: an LLM call is in flight.
    fn request_sent(&self, conn: u64);
    /// An exchange on connection `conn` finished (one per [`TraceSink::request_sent`]).
    fn exchange(&self, conn: u64, event: ActivityEvent);
}

/// Whether `host` is a model API host whose traffic is decrypted and traced.
pub fn is_model_host(host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    [
        "anthropic.com",
        "openai.com",
        "openai.azure.com",
        "chatgpt.com",
    ]
    .iter()
    .any(|d| host == *d || host.strip_suffix(d).is_some_and(|rest| rest.ends_with('.')))
}

/// Parses `AC7_TRACE_UPSTREAM` (`host=addr[,host=addr…]`).
pub fn parse_upstream_override(text: &str) -> Result<HashMap<String, String>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((host, addr)) if !host.is_empty() && !addr.is_empty() => {
                Ok((host.to_ascii_lowercase(), addr.to_owned()))
            }
            _ => Err(format!(
                "{UPSTREAM_ENV}: expected host=address, got {pair:?}"
            )),
        })
        .collect()
}

/// What the proxy needs.
pub struct ProxyConfig {
    /// The session CA (leaves for the model hosts).
    pub ca: Arc<TraceCa>,
    /// The TLS client configuration for upstream model hosts.
    pub upstream_tls: Arc<rustls::ClientConfig>,
    /// Test-only dial overrides (`host` → `addr`).
    pub upstream_override: HashMap<String, String>,
    /// Model endpoints the agent is configured with besides the default model hosts (their
    /// host and port are traced too, as the API each speaks).
    pub endpoints: Vec<ModelEndpoint>,
    /// The secret every request must carry.
    pub secret: String,
    /// Caps against other local processes and against memory growth.
    pub limits: ProxyLimits,
}

/// The proxy's caps (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyLimits {
    /// Most connections open at once that have not sent a complete request head with the
    /// secret; one more closes the oldest of them. Default 64.
    pub max_unauthenticated: usize,
    /// How long a connection may take to send that head. Default 5 s.
    pub auth_timeout: Duration,
    /// Most body bytes kept for tracing across all connections until decoded. Default 64 MiB.
    pub max_buffered_bytes: usize,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        Self {
            max_unauthenticated: 64,
            auth_timeout: Duration::from_secs(5),
            max_buffered_bytes: 64 * 1024 * 1024,
        }
    }
}

/// The connections that have not authenticated yet, by id (oldest first).
#[derive(Debug, Default)]
struct Gate {
    /// Dropping a connection's sender closes it.
    waiting: std::sync::Mutex<BTreeMap<u64, tokio::sync::oneshot::Sender<()>>>,
}

impl Gate {
    fn waiting(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<u64, tokio::sync::oneshot::Sender<()>>> {
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts connection `id` in, first evicting the oldest waiting ones so that at most `max`
    /// wait; the receiver completes when `id` is evicted in turn.
    fn enter(&self, id: u64, max: usize) -> tokio::sync::oneshot::Receiver<()> {
        let (evict, evicted) = tokio::sync::oneshot::channel();
        let mut waiting = self.waiting();
        while waiting.len() >= max.max(1) {
            // Dropping the sender wakes the connection's task, which closes it.
            waiting.pop_first();
        }
        waiting.insert(id, evict);
        evicted
    }

    /// Connection `id` authenticated (or ended): it stops counting. `false` when it had been
    /// evicted meanwhile.
    fn leave(&self, id: u64) -> bool {
        self.waiting().remove(&id).is_some()
    }

    fn len(&self) -> usize {
        self.waiting().len()
    }
}

/// Connection `id` counts in the [`Gate`] until this is passed or dropped.
struct Waiting<'a> {
    gate: &'a Gate,
    id: u64,
}

impl Waiting<'_> {
    /// Authenticated: `false` when the connection was evicted meanwhile (it must close).
    fn pass(self) -> bool {
        let this = std::mem::ManuallyDrop::new(self);
        this.gate.leave(this.id)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.gate.leave(self.id);
    }
}

/// The body bytes kept for tracing, all connections together, against their cap.
#[derive(Debug)]
struct Budget {
    cap: usize,
    used: AtomicUsize,
    peak: AtomicUsize,
}

impl Budget {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Takes up to `want` bytes of the room left; returns how many.
    fn reserve(&self, want: usize) -> usize {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let grant = want.min(self.cap.saturating_sub(used));
            if grant == 0 {
                return 0;
            }
            match self.used.compare_exchange_weak(
                used,
                used + grant,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.peak.fetch_max(used + grant, Ordering::Relaxed);
                    return grant;
                }
                Err(now) => used = now,
            }
        }
    }

    fn release(&self, bytes: usize) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
        }
    }
}

struct Shared {
    config: ProxyConfig,
    /// `Basic base64("ac7:<secret>")`.
    authorization: String,
    sink: Arc<dyn TraceSink>,
    next_id: AtomicU64,
    decoder: Decoder,
    gate: Gate,
    budget: Arc<Budget>,
}

/// How the proxy handles a connection's destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Not a model host: relayed untouched.
    Untraced,
    /// A default model host ([`is_model_host`]).
    ModelHost,
    /// A model endpoint the agent is configured with, speaking this API.
    Endpoint(LlmApi),
}

impl Shared {
    fn route(&self, host: &str, port: u16) -> Route {
        let host = host.trim_end_matches('.');
        if is_model_host(host) {
            return Route::ModelHost;
        }
        self.config
            .endpoints
            .iter()
            .find(|e| e.host.eq_ignore_ascii_case(host) && e.port == port)
            .map_or(Route::Untraced, |e| Route::Endpoint(e.api))
    }
}

/// What the relays hand the decode thread.
enum Decode {
    /// A finished exchange of connection `.0`, with the API of the endpoint it went to (`.2`).
    Exchange(u64, Box<Exchange>, Option<LlmApi>),
    /// Every relay is done: drain and stop.
    Stop,
}

/// The sending side of the decode thread.
struct Decoder {
    queue: std::sync::mpsc::Sender<Decode>,
    budget: Arc<Budget>,
}

impl Decoder {
    /// Starts the thread; `done` fires once it has handed its last exchange to `sink`. The body
    /// bytes of each exchange are given back to `budget` once it is decoded.
    fn start(
        sink: Arc<dyn TraceSink>,
        preview_chars: usize,
        budget: Arc<Budget>,
    ) -> io::Result<(Self, tokio::sync::oneshot::Receiver<()>)> {
        let (queue, work) = std::sync::mpsc::channel();
        let (done, finished) = tokio::sync::oneshot::channel();
        let held = budget.clone();
        std::thread::Builder::new()
            .name("ac7-trace-decode".into())
            .spawn(move || {
                while let Ok(Decode::Exchange(conn, exchange, endpoint)) = work.recv() {
                    let bytes = exchange.body_bytes();
                    let event = exchange_event_at(&exchange, preview_chars, endpoint);
                    drop(exchange);
                    held.release(bytes);
                    sink.exchange(conn, event);
                }
                let _ = done.send(());
            })?;
        Ok((Self { queue, budget }, finished))
    }

    fn decode(&self, conn: u64, exchange: Box<Exchange>, endpoint: Option<LlmApi>) {
        // The thread outlives every relay (it stops on `Stop` only), so this cannot fail while
        // a relay runs; after `close` gave up waiting there is nobody left to tell.
        if let Err(std::sync::mpsc::SendError(Decode::Exchange(_, exchange, _))) =
            self.queue.send(Decode::Exchange(conn, exchange, endpoint))
        {
            self.budget.release(exchange.body_bytes());
        }
    }

    fn stop(&self) {
        let _ = self.queue.send(Decode::Stop);
    }
}

/// A running proxy.
pub struct TraceProxy {
    addr: SocketAddr,
    secret: String,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    shared: Arc<Shared>,
    decoded: tokio::sync::oneshot::Receiver<()>,
}

impl std::fmt::Debug for TraceProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceProxy")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl TraceProxy {
    /// Binds `127.0.0.1:0` and starts serving.
    pub async fn start(config: ProxyConfig, sink: Arc<dyn TraceSink>) -> io::Result<Self> {
        use base64::Engine as _;
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let secret = config.secret.clone();
        let authorization = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("ac7:{secret}"))
        );
        let budget = Arc::new(Budget::new(config.limits.max_buffered_bytes));
        let (decoder, decoded) = Decoder::start(
            sink.clone(),
            TraceConfig::default().preview_chars,
            budget.clone(),
        )?;
        let shared = Arc::new(Shared {
            config,
            authorization,
            sink,
            next_id: AtomicU64::new(1),
            decoder,
            gate: Gate::default(),
            budget,
        });
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, shared.clone(), stopped));
        Ok(Self {
            addr,
            secret,
            stop,
            task,
            shared,
            decoded,
        })
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy URL for the agent, with the credentials.
    pub fn url(&self) -> String {
        format!("http://ac7:{}@{}", self.secret, self.addr)
    }

    /// Connections open now that have not authenticated (at most
    /// [`ProxyLimits::max_unauthenticated`]).
    pub fn unauthenticated(&self) -> usize {
        self.shared.gate.len()
    }

    /// Body bytes kept for tracing now, all connections and the decode queue together (at most
    /// [`ProxyLimits::max_buffered_bytes`]).
    pub fn buffered_bytes(&self) -> usize {
        self.shared.budget.used.load(Ordering::Relaxed)
    }

    /// The most [`TraceProxy::buffered_bytes`] has been (counting the room taken for a read
    /// before what it kept is settled).
    pub fn peak_buffered_bytes(&self) -> usize {
        self.shared.budget.peak.load(Ordering::Relaxed)
    }

    /// Stops listening; open connections end (their unfinished requests are reported
    /// request-only) within a second, and every finished exchange reaches the sink before this
    /// returns (within 5 s more).
    pub async fn close(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.shared.decoder.stop();
        if tokio::time::timeout(DECODE_GRACE, self.decoded)
            .await
            .is_err()
        {
            tracing::warn!("trace proxy: exchanges still decoding at exit were not recorded");
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
                    let evicted = shared.gate.enter(id, shared.config.limits.max_unauthenticated);
                    conns.spawn(serve(shared.clone(), id, stream, stopped.clone(), evicted));
                }
                Err(e) => {
                    tracing::warn!("trace proxy: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = stopped.changed() => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    conns.abort_all();
}

/// The first request head of a connection.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    method: String,
    target: String,
    version: String,
    headers: Vec<(String, String)>,
}

fn parse_head(bytes: &[u8]) -> Option<Head> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut lines = text.split("\r\n");
    let mut start = lines.next()?.split(' ');
    let (method, target, version) = (start.next()?, start.next()?, start.next()?);
    if start.next().is_some()
        || method.is_empty()
        || target.is_empty()
        || !matches!(version, "HTTP/1.1" | "HTTP/1.0")
    {
        return None;
    }
    let mut headers = Vec::new();
    for line in lines.take_while(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':')?;
        if name.is_empty() || name.contains(char::is_whitespace) {
            return None;
        }
        headers.push((name.to_owned(), value.trim().to_owned()));
    }
    Some(Head {
        method: method.to_owned(),
        target: target.to_owned(),
        version: version.to_owned(),
        headers,
    })
}

/// `host:port` or `[v6]:port` → (host without brackets, port).
fn split_authority(authority: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, port) = rest.split_once("]:")?;
        host.parse::<std::net::Ipv6Addr>().ok()?;
        (host, port)
    } else {
        let (host, port) = authority.rsplit_once(':')?;
        if host.contains(':') {
            return None;
        }
        (host, port)
    };
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    (!host.is_empty()).then(|| (host.to_ascii_lowercase(), port))
}

/// `http://authority/path?q` → (host, port, origin-form target).
fn split_absolute(target: &str) -> Option<(String, u16, String)> {
    let rest = target
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("http://"))
        .map(|_| &target[7..])?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let authority = authority.rsplit('@').next()?;
    let (host, port) = match split_authority(authority) {
        Some(hp) => hp,
        None if !authority.contains(':') && !authority.is_empty() => {
            (authority.to_ascii_lowercase(), 80)
        }
        None => {
            let v6 = authority.strip_prefix('[')?.strip_suffix(']')?;
            v6.parse::<std::net::Ipv6Addr>().ok()?;
            (v6.to_owned(), 80)
        }
    };
    let path = match path {
        "" => "/".to_owned(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_owned(),
    };
    Some((host, port, path))
}

/// Reads until the end of the first head; returns (head, bytes after it).
async fn read_head(client: &mut TcpStream) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = memchr::memmem::find(&buf[from..], b"\r\n\r\n") {
            let end = from + i + 4;
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "head too large"));
        }
    }
}

async fn reply(client: &mut TcpStream, status: &str, extra: &str) {
    let _ = client
        .write_all(
            format!("HTTP/1.1 {status}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
    let _ = client.shutdown().await;
}

/// Reads the first request head and checks the secret; `None` once the client got its 4xx.
async fn admit(shared: &Shared, client: &mut TcpStream) -> Option<(Head, Vec<u8>)> {
    let (head, rest) = match read_head(client).await {
        Ok(read) => read,
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            reply(client, "431 Request Header Fields Too Large", "").await;
            return None;
        }
        Err(_) => return None,
    };
    let Some(head) = parse_head(&head) else {
        reply(client, "400 Bad Request", "").await;
        return None;
    };
    let authorized = head
        .headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("proxy-authorization") && *v == shared.authorization);
    if !authorized {
        reply(
            client,
            "407 Proxy Authentication Required",
            "Proxy-Authenticate: Basic realm=\"ac7 trace\"\r\n",
        )
        .await;
        return None;
    }
    Some((head, rest))
}

async fn serve(
    shared: Arc<Shared>,
    id: u64,
    mut client: TcpStream,
    stopped: watch::Receiver<bool>,
    evicted: tokio::sync::oneshot::Receiver<()>,
) {
    let waiting = Waiting {
        gate: &shared.gate,
        id,
    };
    // Unauthenticated: closed when evicted, or when the head has not come in time.
    let admitted = tokio::select! {
        admitted = tokio::time::timeout(
            shared.config.limits.auth_timeout,
            admit(&shared, &mut client),
        ) => admitted.ok().flatten(),
        _ = evicted => None,
    };
    let Some((head, rest)) = admitted else {
        return;
    };
    if !waiting.pass() {
        return;
    }
    if head.method.eq_ignore_ascii_case("CONNECT") {
        let Some((host, port)) = split_authority(&head.target) else {
            return reply(&mut client, "400 Bad Request", "").await;
        };
        match shared.route(&host, port) {
            Route::Untraced => tunnel(&shared, client, &host, port, rest).await,
            Route::ModelHost => mitm(&shared, id, client, &host, port, rest, None, stopped).await,
            Route::Endpoint(api) => {
                mitm(&shared, id, client, &host, port, rest, Some(api), stopped).await;
            }
        }
        return;
    }
    let Some((host, port, path)) = split_absolute(&head.target) else {
        return reply(&mut client, "400 Bad Request", "").await;
    };
    let Ok(upstream) = dial(&shared, &host, port).await else {
        return reply(&mut client, "502 Bad Gateway", "").await;
    };
    let mut forwarded = format!("{} {path} {}\r\n", head.method, head.version);
    for (name, value) in &head.headers {
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("proxy-") || lower == "connection" || lower == "keep-alive" {
            continue;
        }
        forwarded.push_str(&format!("{name}: {value}\r\n"));
    }
    forwarded.push_str("Connection: close\r\n\r\n");
    let mut first = forwarded.into_bytes();
    first.extend_from_slice(&rest);
    match shared.route(&host, port) {
        Route::Untraced => relay_raw(client, upstream, &first).await,
        Route::ModelHost => {
            relay_traced(&shared, id, &host, None, client, upstream, first, stopped).await;
        }
        Route::Endpoint(api) => {
            relay_traced(
                &shared,
                id,
                &host,
                Some(api),
                client,
                upstream,
                first,
                stopped,
            )
            .await;
        }
    }
}

async fn dial(shared: &Shared, host: &str, port: u16) -> io::Result<TcpStream> {
    let addr = match shared.config.upstream_override.get(host) {
        Some(addr) => addr.clone(),
        None if host.contains(':') => format!("[{host}]:{port}"),
        None => format!("{host}:{port}"),
    };
    let stream = tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

async fn tunnel(shared: &Shared, mut client: TcpStream, host: &str, port: u16, rest: Vec<u8>) {
    match dial(shared, host, port).await {
        Ok(upstream) => {
            if client
                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await
                .is_ok()
            {
                relay_raw(client, upstream, &rest).await;
            }
        }
        Err(e) => {
            tracing::debug!("trace proxy: {host}:{port}: {e}");
            reply(&mut client, "502 Bad Gateway", "").await;
        }
    }
}

async fn relay_raw(mut client: TcpStream, mut upstream: TcpStream, first: &[u8]) {
    if upstream.write_all(first).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

#[allow(clippy::too_many_arguments)]
async fn mitm(
    shared: &Shared,
    id: u64,
    mut client: TcpStream,
    host: &str,
    port: u16,
    rest: Vec<u8>,
    endpoint: Option<LlmApi>,
    stopped: watch::Receiver<bool>,
) {
    let upstream = async {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let tcp = dial(shared, host, port).await?;
        let connector = tokio_rustls::TlsConnector::from(shared.config.upstream_tls.clone());
        tokio::time::timeout(DIAL_TIMEOUT, connector.connect(name, tcp))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
    };
    let leaf = match shared.config.ca.server_config(host) {
        Ok(leaf) => leaf,
        Err(e) => {
            tracing::warn!("trace proxy: {e}");
            return reply(&mut client, "502 Bad Gateway", "").await;
        }
    };
    let upstream = match upstream.await {
        Ok(upstream) => upstream,
        Err(e) => {
            tracing::warn!("trace proxy: upstream {host}:{port} failed: {e}");
            return reply(&mut client, "502 Bad Gateway", "").await;
        }
    };
    if client
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(leaf);
    let client = Prefixed {
        rest,
        at: 0,
        inner: client,
    };
    let client = match tokio::time::timeout(DIAL_TIMEOUT, acceptor.accept(client)).await {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => {
            tracing::debug!("trace proxy: client TLS for {host} failed: {e}");
            return;
        }
        Err(_) => return,
    };
    relay_traced(
        shared,
        id,
        host,
        endpoint,
        client,
        upstream,
        Vec::new(),
        stopped,
    )
    .await;
}

/// Relays one decrypted connection through an [`HttpAssembler`]; `endpoint` is the API of the
/// configured model endpoint it goes to, if it is one.
#[allow(clippy::too_many_arguments)]
async fn relay_traced<C, S>(
    shared: &Shared,
    id: u64,
    host: &str,
    endpoint: Option<LlmApi>,
    client: C,
    server: S,
    first: Vec<u8>,
    mut stopped: watch::Receiver<bool>,
) where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let conn = ProxyConnId(id);
    let mut tracer = Traced {
        assembler: HttpAssembler::new(HttpConfig {
            rewrite_accept_encoding: true,
            ..HttpConfig::default()
        }),
        conn,
        endpoint,
        budget: &shared.budget,
        held: 0,
    };
    let now = crate::sys::clock::now_ms;
    tracer.assembler.handle_open(conn, host, now());
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut sr, mut sw) = tokio::io::split(server);
    if !first.is_empty() {
        tracer.feed(first.len(), |a, c| a.handle_client_bytes(c, &first, now()));
        if drain(&mut tracer, shared, Some(&mut sw)).await.is_err() {
            tracer.feed(0, |a, c| a.handle_closed(c, now()));
            let _ = drain(&mut tracer, shared, None::<&mut S>).await;
            return;
        }
    }
    let mut cbuf = vec![0u8; 16 * 1024];
    let mut sbuf = vec![0u8; 16 * 1024];
    let mut client_open = true;
    loop {
        tokio::select! {
            read = cr.read(&mut cbuf), if client_open => match read {
                Ok(0) | Err(_) => {
                    client_open = false;
                    let _ = sw.shutdown().await;
                }
                Ok(n) => {
                    tracer.feed(n, |a, c| a.handle_client_bytes(c, &cbuf[..n], now()));
                    if drain(&mut tracer, shared, Some(&mut sw)).await.is_err() {
                        break;
                    }
                }
            },
            read = sr.read(&mut sbuf) => match read {
                Ok(0) | Err(_) => {
                    tracer.feed(0, |a, c| a.handle_server_eof(c, now()));
                    let _ = drain(&mut tracer, shared, Some(&mut sw)).await;
                    let _ = cw.shutdown().await;
                    break;
                }
                Ok(n) => {
                    tracer.feed(n, |a, c| a.handle_server_bytes(c, &sbuf[..n], now()));
                    let written = async {
                        cw.write_all(&sbuf[..n]).await?;
                        cw.flush().await
                    };
                    if written.await.is_err() {
                        break;
                    }
                    if drain(&mut tracer, shared, Some(&mut sw)).await.is_err() {
                        break;
                    }
                }
            },
            _ = stopped.changed() => break,
        }
    }
    tracer.feed(0, |a, c| a.handle_closed(c, now()));
    let _ = drain(&mut tracer, shared, None::<&mut tokio::io::WriteHalf<S>>).await;
}

/// One traced connection's assembler, the body bytes it keeps counted in the proxy's [`Budget`].
struct Traced<'a> {
    assembler: HttpAssembler,
    conn: ProxyConnId,
    /// The API of the configured model endpoint the connection goes to, if it is one.
    endpoint: Option<LlmApi>,
    budget: &'a Budget,
    /// Body bytes the assembler holds, all counted in `budget`.
    held: usize,
}

impl Traced<'_> {
    /// Runs `input` (at most `len` new body bytes) with the room the budget has for them.
    fn feed(&mut self, len: usize, input: impl FnOnce(&mut HttpAssembler, ProxyConnId)) {
        let grant = self.budget.reserve(len);
        self.assembler.set_body_allowance(self.conn, Some(grant));
        input(&mut self.assembler, self.conn);
        self.assembler.set_body_allowance(self.conn, Some(0));
        // The bodies grew by at most `grant`; they shrink when a request is dropped unsent.
        let held = self.assembler.kept_body_bytes();
        debug_assert!(
            held <= self.held + grant,
            "{held} > {} + {grant}",
            self.held
        );
        self.budget
            .release((self.held + grant).saturating_sub(held));
        self.held = held;
    }

    /// The next output; a finished exchange's bytes stay counted until the decode thread is done.
    fn poll_output(&mut self) -> Option<HttpOutput> {
        let output = self.assembler.poll_output()?;
        if let HttpOutput::Exchange(exchange) = &output {
            self.held -= exchange.body_bytes();
        }
        Some(output)
    }
}

impl Drop for Traced<'_> {
    fn drop(&mut self) {
        self.budget.release(self.held);
    }
}

/// Hands the assembler's outputs on: bytes to the server, requests to the sink, finished
/// exchanges to the decode thread.
async fn drain<W: AsyncWrite + Unpin>(
    tracer: &mut Traced<'_>,
    shared: &Shared,
    mut server: Option<&mut W>,
) -> io::Result<()> {
    let mut wrote = false;
    while let Some(output) = tracer.poll_output() {
        match output {
            HttpOutput::Transmit { bytes, .. } => {
                if let Some(server) = server.as_deref_mut() {
                    server.write_all(&bytes).await?;
                    wrote = true;
                }
            }
            HttpOutput::RequestSent { conn } => shared.sink.request_sent(conn.0),
            HttpOutput::Exchange(exchange) => {
                shared
                    .decoder
                    .decode(exchange.conn.0, exchange, tracer.endpoint);
            }
            HttpOutput::Untraced { conn, reason } => {
                tracing::debug!("trace proxy: connection {} untraced: {reason}", conn.0);
            }
            other => tracing::warn!(
                ?other,
                "trace: an assembler output this version does not handle"
            ),
        }
    }
    if wrote && let Some(server) = server {
        server.flush().await?;
    }
    Ok(())
}

/// A stream that first yields bytes already read from it.
struct Prefixed<T> {
    rest: Vec<u8>,
    at: usize,
    inner: T,
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.at < self.rest.len() {
            let n = (self.rest.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.rest[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The TLS client configuration for upstream model hosts: the system roots (the first bundle
/// found at the usual places, or `$SSL_CERT_FILE`), the web PKI roots, `agent_ca` (the PEM of
/// the CA file the agent was told to trust besides its roots, if any) and `AC7_CA_CERT`; with
/// `unsafe_tls`, no verification at all.
pub fn upstream_tls(
    unsafe_tls: bool,
    agent_ca: Option<&[u8]>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    use crate::sys::tls_client::{self, AnyCertificate};
    let (provider, builder) = tls_client::client_config();
    let mut config = if unsafe_tls {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth()
    } else {
        let mut roots = tls_client::web_pki_roots();
        if let Some(pem) = super::env::system_bundle() {
            tls_client::add_pem(&mut roots, &pem);
        }
        if let Some(pem) = agent_ca {
            tls_client::add_pem(&mut roots, pem);
        }
        let extra = tls_client::extra_root_ders().map_err(|e| e.to_string())?;
        roots.add_parsable_certificates(extra);
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests;
