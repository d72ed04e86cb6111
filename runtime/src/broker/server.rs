//! The broker's accept loop and connections: HTTP/1.1 (with WebSocket upgrades)
//! over TCP, or over TLS (rustls) when a certificate is configured.
//!
//! Every connection is bounded in time and the number of connections is bounded:
//!
//! - **Connection cap** (`--max-connections`; `ac7 serve` derives its default from
//!   the open-file limit, see [`default_max_connections`]): a connection over it gets
//!   a `503` JSON answer once its request has arrived (plain HTTP; over TLS it is
//!   closed) and the broker logs `connection limit reached` at most once every 10 s
//!   with the count refused.
//! - **Header timeout** (`--header-timeout`, 10 s): once a client starts a request
//!   (its first byte, or the TLS handshake), the complete head must arrive within
//!   this time.
//! - **Idle timeout** (`--idle-timeout`, 60 s): a connection with no request in
//!   progress that sends nothing for this long is closed (new connections too).
//! - **Write timeout** (`--write-timeout`, 30 s): a connection whose writes make no
//!   progress for this long (a client that stopped reading) is closed and logged.
//!   Live streams are connections too: a stalled subscriber is cut loose this way
//!   even when no new message arrives to overflow its queue.
//!
//! Errors hyper answers by itself before a request reaches the router (a malformed
//! request `400`, a URI too long `414`, headers too large `431`) carry a JSON body
//! `{"error": "..."}` and the security headers like every other answer of the API:
//! hyper writes them with an empty body, and `JsonErrors` rewrites that one response
//! on its way out. The connection cap's `503` carries the security headers too.
//!
//! **A body nobody read.** A request refused before its body was read (`401`, `429`,
//! a `413` past the size cap, …) leaves that body on the connection, in front of
//! the next request. Hyper drops whatever of it has not arrived yet by closing the
//! connection after the answer — without saying so, and a client that pipelines or
//! reuses its connection loses its next request. So an unread body is read and
//! thrown away before the answer goes out, when it is small (at most
//! [`DRAIN_MAX`]) and arrives soon (within [`DRAIN_TIMEOUT`]); otherwise (and for
//! `Expect: 100-continue`, whose body must not be invited) the answer carries
//! `Connection: close`.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch};
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;

use super::repoll::Repoll;

/// Connection limits and timeouts.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Time a client has to send a complete request head once it started one.
    pub header_timeout: Duration,
    /// Time a connection with no request in progress may stay silent.
    pub idle_timeout: Duration,
    /// Time a write may make no progress before the connection is closed.
    pub write_timeout: Duration,
    /// Open connections at most; more are refused.
    pub max_connections: usize,
}

impl Default for Limits {
    /// 10 s header, 60 s idle, 30 s write, 4096 connections.
    fn default() -> Limits {
        Limits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            max_connections: 4096,
        }
    }
}

/// Descriptors `ac7 serve` keeps free below the open-file limit when it derives its
/// connection cap: the database and its WAL files, the listener, blobs being written or
/// read, and a connection for a probe like `/healthz`.
pub const FD_HEADROOM: u64 = 64;

/// The connection cap for an open-file limit of `fds` (`None`: unlimited or unknown):
/// the smaller of `fds - FD_HEADROOM` and three quarters of `fds`, at least half of
/// `fds` (for very low limits) and 1, at most 4096.
pub fn default_max_connections(fds: Option<u64>) -> usize {
    const MAX: u64 = 4096;
    let Some(fds) = fds else {
        return MAX as usize;
    };
    let cap = fds
        .saturating_sub(FD_HEADROOM)
        .min(fds / 4 * 3)
        .max(fds / 2)
        .clamp(1, MAX);
    usize::try_from(cap).unwrap_or(1)
}

/// A PEM certificate chain and private key for HTTPS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The certificate file holds no usable certificate.
    #[error("{0} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)")]
    NoCert(PathBuf),
    /// The key file holds no usable private key.
    #[error("{0} holds no PEM private key (expected -----BEGIN PRIVATE KEY----- or an RSA/EC key)")]
    NoKey(PathBuf),
    /// rustls refused the pair.
    #[error("the TLS certificate and key cannot be used together: {0}")]
    Config(#[from] rustls::Error),
}

/// Loads `files` into a rustls acceptor (ring provider, TLS 1.2 and 1.3, HTTP/1.1 via ALPN).
pub fn tls_acceptor(files: &TlsFiles) -> Result<TlsAcceptor, TlsError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.clone(),
            source,
        })
    };
    let cert_pem = read(&files.cert)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCert(files.cert.clone()));
    }
    let key = PrivateKeyDer::from_pem_slice(&read(&files.key)?)
        .map_err(|_| TlsError::NoKey(files.key.clone()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Logs at most once per interval, counting what it did not log.
struct Throttled {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttled {
    const EVERY: Duration = Duration::from_secs(10);

    fn new() -> Throttled {
        Throttled {
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(n)` (n = occurrences not logged since the last line) when a line is due.
    fn due(&mut self) -> Option<u64> {
        if self.last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(Instant::now());
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then lets open
/// connections finish (at most 10 s).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let max = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let permits = Arc::new(Semaphore::new(max));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut refused_log = Throttled::new();
    let mut accept_log = Throttled::new();
    let refusal: Arc<[u8]> = over_capacity_response(max).into();
    let refusing = Arc::new(Semaphore::new(REFUSALS_IN_FLIGHT));
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    if let Some(more) = accept_log.due() {
                        tracing::error!(
                            error = %e,
                            failed_since_last_log = more,
                            "cannot accept a connection (at the open-file limit? raise `ulimit -n` or lower --max-connections)"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            if let Some(more) = refused_log.due() {
                tracing::warn!(
                    limit = max,
                    %peer,
                    refused_since_last_log = more,
                    "connection limit reached; refusing new connections (raise --max-connections if this load is expected)"
                );
            }
            if tls.is_none() {
                match Arc::clone(&refusing).try_acquire_owned() {
                    Ok(slot) => {
                        tokio::spawn(refuse(tcp, Arc::clone(&refusal), slot));
                    }
                    // A flood of refusals: answer at once, whatever the client sent so far.
                    // A fresh socket's send buffer is empty: this never blocks.
                    Err(_) => {
                        let _ = tcp.try_write(&refusal);
                    }
                }
            }
            continue;
        };
        // Live frames are small and latency matters: no Nagle delay.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let flags = Arc::new(ConnFlags::default());
        let io = Guarded::new(tcp, peer, permit, &limits, Arc::clone(&flags));
        let (app, stop, tls) = (app.clone(), stop_rx.clone(), tls.clone());
        tokio::spawn(Repoll::new(async move {
            match tls {
                None => serve_http(JsonErrors::new(io, false), app, flags, stop, peer).await,
                Some(acceptor) => match acceptor.accept(io).await {
                    Ok(stream) => {
                        serve_http(JsonErrors::new(stream, true), app, flags, stop, peer).await
                    }
                    Err(e) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                },
            }
        }));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(Duration::from_secs(10), permits.acquire_many(all)).await;
    Ok(())
}

/// Connections over the cap answered at leisure at once (each holds a descriptor for at
/// most three times [`REFUSAL_TIME`]); past that they are answered the moment they are
/// accepted.
const REFUSALS_IN_FLIGHT: usize = 16;

/// How long a refused connection may take to send its request, and then to close.
const REFUSAL_TIME: Duration = Duration::from_millis(500);

/// Answers a connection over the cap with `refusal` once its request has arrived (or
/// [`REFUSAL_TIME`] has passed), then closes it gracefully: a client that has not sent its
/// request yet when an answer arrives takes it for a broken connection (hyper's client
/// does), and closing on unread bytes would reset the connection under the answer.
async fn refuse(mut tcp: TcpStream, refusal: Arc<[u8]>, _slot: OwnedSemaphorePermit) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut scratch = [0u8; 4096];
    let _ = tokio::time::timeout(REFUSAL_TIME, tcp.readable()).await;
    while let Ok(n) = tcp.try_read(&mut scratch) {
        if n == 0 {
            break;
        }
    }
    let answered = async {
        tcp.write_all(&refusal).await?;
        tcp.shutdown().await?;
        // Read (and drop) until the client closes, so the close is a FIN, not a reset.
        while tcp.read(&mut scratch).await? > 0 {}
        Ok::<_, io::Error>(())
    };
    let _ = tokio::time::timeout(REFUSAL_TIME * 2, answered).await;
}

fn over_capacity_response(limit: usize) -> Vec<u8> {
    let body = serde_json::json!({
        "error": format!("the broker is at its connection limit ({limit}); try again later"),
        "code": "too_many_connections",
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n{}\r\n{body}",
        body.len(),
        security_header_lines(false),
    )
    .into_bytes()
}

/// The security headers of every answer ([`super::http::security::headers`]) as header lines.
fn security_header_lines(https: bool) -> String {
    super::http::security::headers(https)
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect()
}

/// What the service tells the connection's IO about the requests on it.
#[derive(Debug)]
struct ConnFlags {
    /// No request in progress: the next bytes are a request head.
    awaiting_head: AtomicBool,
    /// The connection was handed to a WebSocket: no more HTTP requests on it.
    upgraded: AtomicBool,
    /// Requests received so far (a header deadline belongs to one request).
    requests: AtomicU64,
}

impl Default for ConnFlags {
    fn default() -> ConnFlags {
        ConnFlags {
            awaiting_head: AtomicBool::new(true),
            upgraded: AtomicBool::new(false),
            requests: AtomicU64::new(0),
        }
    }
}

impl ConnFlags {
    fn idle(&self) -> bool {
        self.awaiting_head.load(Ordering::Relaxed) && !self.upgraded.load(Ordering::Relaxed)
    }
}

/// Serves HTTP on one connection; each request carries the socket peer as
/// `ConnectInfo<SocketAddr>` (the sign-in and enrollment limits key on it).
async fn serve_http<S>(
    io: S,
    app: Router,
    flags: Arc<ConnFlags>,
    mut stop: watch::Receiver<bool>,
    peer: SocketAddr,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let app = hyper_util::service::TowerToHyperService::new(app);
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        flags.requests.fetch_add(1, Ordering::Relaxed);
        flags.awaiting_head.store(false, Ordering::Relaxed);
        if req.headers().contains_key(hyper::header::UPGRADE) {
            flags.upgraded.store(true, Ordering::Relaxed);
        }
        let expects_continue = req.headers().contains_key(hyper::header::EXPECT);
        let (unread_tx, mut unread) = oneshot::channel();
        let req = req.map(|body| {
            axum::body::Body::new(Watched {
                body: Some(body),
                unread: Some(unread_tx),
            })
        });
        let flags = Arc::clone(&flags);
        let fut = hyper::service::Service::call(&app, req);
        async move {
            let mut resp = fut.await?;
            // The request is gone by now: a body it left unread comes back here.
            if let Ok(body) = unread.try_recv()
                && (expects_continue || !drain(body).await)
            {
                resp.headers_mut().insert(
                    hyper::header::CONNECTION,
                    hyper::header::HeaderValue::from_static("close"),
                );
            }
            Ok::<_, std::convert::Infallible>(resp.map(|body| EndOfResponse { body, flags }))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// A response body that marks the connection as awaiting its next request head
/// once hyper is done with it.
struct EndOfResponse {
    body: axum::body::Body,
    flags: Arc<ConnFlags>,
}

impl hyper::body::Body for EndOfResponse {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for EndOfResponse {
    fn drop(&mut self) {
        self.flags.awaiting_head.store(true, Ordering::Relaxed);
    }
}

/// The most of an unread request body that is read (and thrown away) to keep its
/// connection; a larger one closes the connection after the answer.
pub const DRAIN_MAX: u64 = 64 * 1024;

/// How long the rest of an unread request body may take to arrive before the answer
/// goes out with `Connection: close` instead.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// A request body that, dropped before its end, hands what is left of it back to the
/// connection (see the module docs).
struct Watched {
    body: Option<Incoming>,
    unread: Option<oneshot::Sender<Incoming>>,
}

impl hyper::body::Body for Watched {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>> {
        match &mut self.get_mut().body {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Incoming::is_end_stream)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| hyper::body::SizeHint::with_exact(0), Incoming::size_hint)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        // Dropping `unread` unsent tells the connection there is nothing left to read.
        if let (Some(body), Some(unread)) = (self.body.take(), self.unread.take())
            && !body.is_end_stream()
        {
            let _ = unread.send(body);
        }
    }
}

/// Reads `body` to its end and throws it away; `false` (the connection must close) when
/// it is larger than [`DRAIN_MAX`], fails, or does not end within [`DRAIN_TIMEOUT`].
async fn drain(mut body: Incoming) -> bool {
    if body.size_hint().lower() > DRAIN_MAX {
        return false;
    }
    let read = async {
        let mut seen: u64 = 0;
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            let Ok(frame) = frame else {
                return false;
            };
            if let Some(data) = frame.data_ref() {
                seen = seen.saturating_add(data.len() as u64);
                if seen > DRAIN_MAX {
                    return false;
                }
            }
        }
        true
    };
    tokio::time::timeout(DRAIN_TIMEOUT, read)
        .await
        .unwrap_or(false)
}

/// A TCP connection with the header, idle and write deadlines, holding its slot
/// of the connection cap until dropped.
struct Guarded {
    io: TcpStream,
    peer: SocketAddr,
    flags: Arc<ConnFlags>,
    _permit: OwnedSemaphorePermit,
    header_timeout: Duration,
    idle_timeout: Duration,
    write_timeout: Duration,
    last_activity: Instant,
    idle: Pin<Box<Sleep>>,
    /// The header deadline, and the request count when it was armed.
    head: Option<(Pin<Box<Sleep>>, u64)>,
    stall: Option<Pin<Box<Sleep>>>,
}

impl Guarded {
    fn new(
        io: TcpStream,
        peer: SocketAddr,
        permit: OwnedSemaphorePermit,
        limits: &Limits,
        flags: Arc<ConnFlags>,
    ) -> Guarded {
        Guarded {
            io,
            peer,
            flags,
            _permit: permit,
            header_timeout: limits.header_timeout,
            idle_timeout: limits.idle_timeout,
            write_timeout: limits.write_timeout,
            last_activity: Instant::now(),
            idle: Box::pin(tokio::time::sleep(limits.idle_timeout)),
            head: None,
            stall: None,
        }
    }

    fn closing(&self, what: &'static str, after: Duration) -> io::Error {
        // Debug: under a flood of half-open connections one line each would drown the log.
        tracing::debug!(peer = %self.peer, seconds = after.as_secs_f64(), "closing connection: {what}");
        io::Error::new(io::ErrorKind::TimedOut, what)
    }

    /// The header and idle deadlines, checked on every read.
    fn check_read(&mut self, cx: &mut Context<'_>, got_bytes: bool) -> Result<(), io::Error> {
        let now = Instant::now();
        if got_bytes {
            self.last_activity = now;
        }
        let requests = self.flags.requests.load(Ordering::Relaxed);
        if !self.flags.idle() || self.head.as_ref().is_some_and(|(_, n)| *n != requests) {
            // A request arrived since the deadline was armed: it was met.
            self.head = None;
        }
        if !self.flags.idle() {
            return Ok(());
        }
        if got_bytes && self.head.is_none() {
            self.head = Some((Box::pin(tokio::time::sleep(self.header_timeout)), requests));
        }
        if let Some((head, _)) = &mut self.head
            && head.as_mut().poll(cx).is_ready()
        {
            return Err(self.closing(
                "request head not received in time (--header-timeout)",
                self.header_timeout,
            ));
        }
        loop {
            if self.idle.as_mut().poll(cx).is_pending() {
                return Ok(());
            }
            let quiet = now.saturating_duration_since(self.last_activity);
            if quiet >= self.idle_timeout {
                return Err(self.closing("idle (--idle-timeout)", quiet));
            }
            let at = tokio::time::Instant::from_std(self.last_activity + self.idle_timeout);
            self.idle.as_mut().reset(at);
        }
    }

    /// The write deadline: `Pending` starts (or checks) it, progress clears it.
    fn check_write(
        &mut self,
        cx: &mut Context<'_>,
        res: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match res {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.stall = None;
                    self.last_activity = Instant::now();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending => {
                let timeout = self.write_timeout;
                let stall = self
                    .stall
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if stall.as_mut().poll(cx).is_ready() {
                    tracing::warn!(
                        peer = %self.peer,
                        seconds = timeout.as_secs(),
                        "closing connection: the client stopped reading (no write progress within --write-timeout)"
                    );
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "write timed out",
                    )));
                }
                Poll::Pending
            }
            other => other,
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let res = Pin::new(&mut this.io).poll_read(cx, buf);
        let got_bytes = matches!(res, Poll::Ready(Ok(()))) && buf.filled().len() > before;
        this.check_read(cx, got_bytes)?;
        res
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let res = Pin::new(&mut this.io).poll_write(cx, buf);
        this.check_write(cx, res)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let res = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.check_write(cx, res)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Gives hyper's own error answers (`400`, `414`, `431` with an empty body,
/// written before any request reached the router) a JSON body and the security
/// headers.
///
/// The router never answers these statuses with an empty body (every API error
/// has one), so a response head with one of them and `content-length: 0` is
/// hyper's; it is replaced whole by the same status with `{"error": "..."}`.
struct JsonErrors<S> {
    io: S,
    /// The connection is HTTPS (the answers carry HSTS).
    https: bool,
    /// A replacement being written, and how much of it is out; then the length
    /// to report for the original write.
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<S> JsonErrors<S> {
    fn new(io: S, https: bool) -> JsonErrors<S> {
        JsonErrors {
            io,
            https,
            pending: None,
        }
    }
}

/// Whether `buf` starts like a `4xx` response head.
fn is_client_error_head(buf: &[u8]) -> bool {
    buf.starts_with(b"HTTP/1.1 4") || buf.starts_with(b"HTTP/1.0 4")
}

/// The JSON replacement for hyper's bodyless error head `head`, if it is one.
fn json_error_response(head: &[u8], https: bool) -> Option<Vec<u8>> {
    let end = find_subslice(head, b"\r\n\r\n")? + 4;
    if end != head.len() {
        return None;
    }
    let text = std::str::from_utf8(head).ok()?;
    let (status_line, headers) = text.split_once("\r\n")?;
    let rest = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))?;
    let error = match rest.get(..3)? {
        "400" => "malformed HTTP request",
        "414" => "request URI is too long",
        "431" => "request headers are too large",
        _ => return None,
    };
    let mut kept = String::new();
    let mut empty = false;
    for line in headers.split("\r\n").filter(|l| !l.is_empty()) {
        if line.eq_ignore_ascii_case("content-length: 0") {
            empty = true;
        } else if !line.to_ascii_lowercase().starts_with("connection:") {
            kept.push_str(line);
            kept.push_str("\r\n");
        }
    }
    if !empty {
        return None;
    }
    let body = serde_json::json!({ "error": error }).to_string();
    Some(
        format!(
            "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{kept}{}\r\n{body}",
            body.len(),
            security_header_lines(https),
        )
        .into_bytes(),
    )
}

fn find_subslice(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl<S: AsyncWrite + Unpin> JsonErrors<S> {
    /// Writes out a pending replacement; `Ready(Ok(len))` once it is all out.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        while let Some((bytes, done, reported)) = &mut self.pending {
            if *done == bytes.len() {
                let reported = *reported;
                self.pending = None;
                return Poll::Ready(Ok(reported));
            }
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &bytes[*done..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *done += n;
        }
        Poll::Ready(Ok(0))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonErrors<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonErrors<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.is_none() {
            if is_client_error_head(buf)
                && let Some(replacement) = json_error_response(buf, this.https)
            {
                this.pending = Some((replacement, 0, buf.len()));
            } else {
                return Pin::new(&mut this.io).poll_write(cx, buf);
            }
        }
        this.drain(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let first = bufs.iter().find(|b| !b.is_empty());
        if this.pending.is_some() || first.is_some_and(|b| is_client_error_head(b)) {
            return Pin::new(this).poll_write(cx, first.map_or(&[][..], |b| &b[..]));
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pending.is_some() {
            ready!(this.drain(cx))?;
        }
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hyper_error_heads_get_a_json_body() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Mon, 23 Nov 2026 10:00:00 GMT\r\n\r\n";
        let out = String::from_utf8(json_error_response(head, false).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert_eq!(body, r#"{"error":"request headers are too large"}"#);
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(head.contains("content-type: application/json\r\n"));
        assert!(head.contains(&format!("content-length: {}\r\n", body.len())));
        assert!(head.contains("date: Mon, 23 Nov 2026 10:00:00 GMT"));
        assert!(head.contains("\r\nx-frame-options: DENY\r\n"), "{head}");
        assert!(!head.contains("strict-transport-security"), "{head}");
        let over_tls = String::from_utf8(
            json_error_response(
                b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n\r\n",
                true,
            )
            .unwrap(),
        )
        .unwrap();
        assert!(
            over_tls.contains("\r\nstrict-transport-security: max-age=31536000\r\n"),
            "{over_tls}"
        );
        // an API error (it has a body) and a bodyless 404 are left alone
        assert!(
            json_error_response(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n", false).is_none()
        );
        assert!(
            json_error_response(
                b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
                false
            )
            .is_none()
        );
        // a head split across writes is left alone
        assert!(
            json_error_response(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n", false)
                .is_none()
        );
    }

    #[test]
    fn the_default_connection_cap_leaves_descriptors_free() {
        assert_eq!(default_max_connections(None), 4096);
        assert_eq!(default_max_connections(Some(1_048_576)), 4096);
        assert_eq!(default_max_connections(Some(4096)), 3072);
        assert_eq!(default_max_connections(Some(1024)), 768);
        assert_eq!(default_max_connections(Some(256)), 192);
        assert_eq!(default_max_connections(Some(128)), 64);
        assert_eq!(default_max_connections(Some(64)), 32);
        assert_eq!(default_max_connections(Some(1)), 1);
    }
}
