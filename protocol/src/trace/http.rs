//! HTTP/1.1 exchange assembler: the bytes of one proxied connection in, whole exchanges out.
//!
//! The trace host feeds what it relays: [`HttpAssembler::handle_open`] when a connection is
//! decrypted, [`HttpAssembler::handle_client_bytes`] / [`HttpAssembler::handle_server_bytes`]
//! for each read, [`HttpAssembler::handle_server_eof`] when the server stops sending and
//! [`HttpAssembler::handle_closed`] when the connection is gone; it drains
//! [`HttpAssembler::poll_output`]. Time is epoch milliseconds, passed in.
//!
//! Framing follows RFC 9112: a request body is chunked (`Transfer-Encoding` ending in
//! `chunked`), `Content-Length` long, or empty; a response to `HEAD`, a `1xx`, `204` or `304` has
//! no body; otherwise chunked, `Content-Length`, or everything until the server closes. Interim
//! `1xx` responses (`100 Continue`) are skipped, not paired. Several exchanges may share a
//! connection, pipelined: responses pair with requests in order. After `CONNECT` answered `2xx`
//! or a `101 Switching Protocols` the connection is a raw tunnel and nothing more is parsed.
//!
//! Bad input never panics and never stalls the connection: a malformed head, an impossible
//! framing, a response without a request or a head over the cap makes the connection
//! *untraced* ([`HttpOutput::Untraced`] with the reason); the requests already sent come out
//! without their response, and the rest of the connection is only relayed. Memory is bounded:
//! heads by `max_head_bytes`, each body by `max_body_bytes` (the rest is counted and
//! [`Body::truncated`] is set), pipelining by `max_pipelined`. A host that caps the body bytes of
//! all its connections together gives each connection an allowance before feeding it
//! ([`HttpAssembler::set_body_allowance`]) and reads back what is kept
//! ([`HttpAssembler::kept_body_bytes`]); a body that meets the allowance is truncated the same
//! way, and keeps nothing more even when room comes back later (no gaps).
//!
//! **Content encoding.** With `rewrite_accept_encoding` (the trace host's setting) every request
//! head is forwarded with `Accept-Encoding: identity`, so responses arrive uncompressed and no
//! decompressor is needed for gzip, br or zstd alike; the proxy then writes client→server bytes
//! only from [`HttpOutput::Transmit`] (a request head is held until it is complete, everything
//! else passes at once, and an untraced connection passes unchanged). Bodies that are
//! content-encoded anyway are recorded as such ([`Body::encoding`]), not decoded.

use crate::EpochMs;
use crate::codec::http1::{
    Buf, Fail, Framing, capped_head_len, framing, is_token, parse_head, read_body, status_line,
};
pub use crate::codec::http1::{Headers, header};
use std::collections::{BTreeMap, VecDeque};

/// One proxied connection, named by the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProxyConnId(pub u64);

/// Caps and options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Largest request or response head (start line + headers), and the most bytes held while
    /// waiting for an upgrade answer. Default 64 KiB.
    pub max_head_bytes: usize,
    /// Most body bytes kept per message; the rest is counted. Default 32 MiB.
    pub max_body_bytes: usize,
    /// Most requests awaiting their response on one connection. Default 64.
    pub max_pipelined: usize,
    /// Forward request heads with `Accept-Encoding: identity` (see the module docs).
    pub rewrite_accept_encoding: bool,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            max_head_bytes: 64 * 1024,
            max_body_bytes: 32 * 1024 * 1024,
            max_pipelined: 64,
            rewrite_accept_encoding: false,
        }
    }
}

/// A message body as far as it was kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Body {
    /// The de-chunked bytes, at most `max_body_bytes`.
    pub bytes: Vec<u8>,
    /// Every body byte seen.
    pub len: u64,
    /// Bytes beyond the cap (per message, or the host's allowance) were dropped; once set, no
    /// later byte is kept, so `bytes` is always a prefix of the body.
    pub truncated: bool,
    /// The `Content-Encoding`, when not `identity` (the bytes are then as encoded).
    pub encoding: Option<String>,
}

impl Body {
    fn push(&mut self, bytes: &[u8], cap: usize, allowance: &mut Option<usize>) {
        self.len += bytes.len() as u64;
        if self.truncated {
            return;
        }
        let mut room = cap.saturating_sub(self.bytes.len());
        if let Some(allowed) = *allowance {
            room = room.min(allowed);
        }
        let take = room.min(bytes.len());
        self.bytes.extend_from_slice(&bytes[..take]);
        if let Some(allowed) = allowance {
            *allowed -= take;
        }
        if take < bytes.len() {
            self.truncated = true;
        }
    }
}

/// A request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    /// The method, as sent.
    pub method: String,
    /// The request target, as sent (origin form `/path?query`, or absolute form).
    pub target: String,
    /// The headers.
    pub headers: Headers,
    /// The body.
    pub body: Body,
}

/// A response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// The headers.
    pub headers: Headers,
    /// The body.
    pub body: Body,
    /// `false` when the connection ended before the response did.
    pub complete: bool,
}

/// One request with its response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// The connection.
    pub conn: ProxyConnId,
    /// The host the connection was opened to (the CONNECT host).
    pub connect_host: String,
    /// The request.
    pub request: HttpRequest,
    /// The response; `None` when the connection ended first.
    pub response: Option<HttpResponse>,
    /// When the request was fully received (epoch ms).
    pub started_at: EpochMs,
    /// When the response was complete, or the connection ended (epoch ms).
    pub ended_at: EpochMs,
}

impl Exchange {
    /// The body bytes it holds (request and response).
    pub fn body_bytes(&self) -> usize {
        self.request.body.bytes.len() + self.response.as_ref().map_or(0, |r| r.body.bytes.len())
    }

    /// The request's host: the `Host` header without a port, else the CONNECT host.
    pub fn host(&self) -> String {
        let host = header(&self.request.headers, "host").unwrap_or(&self.connect_host);
        strip_port(host).to_ascii_lowercase()
    }
}

fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((h, port)) if !h.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

/// Something for the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HttpOutput {
    /// Bytes to write to the server (only with `rewrite_accept_encoding`).
    Transmit {
        /// The connection.
        to: ProxyConnId,
        /// The bytes, in order.
        bytes: Vec<u8>,
    },
    /// A request was fully sent; its [`HttpOutput::Exchange`] follows later (busy tracking).
    RequestSent {
        /// The connection.
        conn: ProxyConnId,
    },
    /// A finished exchange (one per `RequestSent`, in order per connection).
    Exchange(Box<Exchange>),
    /// The connection stopped being parsed: from now on it is only relayed.
    Untraced {
        /// The connection.
        conn: ProxyConnId,
        /// Why, for the log.
        reason: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientState {
    Head,
    Body(Framing),
    /// After a `CONNECT` or an `Upgrade` request: hold bytes until the answer.
    AwaitUpgrade,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerState {
    Head,
    Body(Framing),
    Eof,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Http,
    Tunnel,
    Untraced,
}

#[derive(Debug)]
struct Pending {
    request: HttpRequest,
    request_done: bool,
    started_at: EpochMs,
    response: Option<HttpResponse>,
    response_done: bool,
    ended_at: EpochMs,
    upgrade: bool,
}

#[derive(Debug)]
struct Conn {
    host: String,
    mode: Mode,
    client: Buf,
    client_state: ClientState,
    server: Buf,
    server_state: ServerState,
    pending: VecDeque<Pending>,
    /// Body bytes this connection may still keep (`None`: only the per-message cap).
    allowance: Option<usize>,
}

/// The assembler for every traced connection.
///
/// Contract: every input takes `now` (epoch ms) last; outputs are drained from
/// [`poll_output`](Self::poll_output), bytes to forward as [`HttpOutput::Transmit`] `{ to, bytes }`.
#[derive(Debug, Default)]
pub struct HttpAssembler {
    config: HttpConfig,
    conns: BTreeMap<ProxyConnId, Conn>,
    out: VecDeque<HttpOutput>,
}

impl HttpAssembler {
    /// An assembler with these caps.
    pub fn new(config: HttpConfig) -> Self {
        Self {
            config,
            conns: BTreeMap::new(),
            out: VecDeque::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &HttpConfig {
        &self.config
    }

    /// A decrypted connection to `host` (the CONNECT host) begins. Reopening an id first
    /// closes the old connection (its waiting requests come out without a response).
    pub fn handle_open(&mut self, conn: ProxyConnId, host: &str, now: EpochMs) {
        if let Some(mut old) = self.conns.remove(&conn) {
            flush_pending(conn, &mut old, now, &mut self.out);
        }
        self.conns.insert(
            conn,
            Conn {
                host: host.to_owned(),
                mode: Mode::Http,
                client: Buf::default(),
                client_state: ClientState::Head,
                server: Buf::default(),
                server_state: ServerState::Head,
                pending: VecDeque::new(),
                allowance: None,
            },
        );
    }

    /// Bytes the client sent. Unknown connections are ignored (and, with
    /// `rewrite_accept_encoding`, forwarded unchanged).
    pub fn handle_client_bytes(&mut self, conn: ProxyConnId, bytes: &[u8], now: EpochMs) {
        let rewrite = self.config.rewrite_accept_encoding;
        let Some(c) = self.conns.get_mut(&conn) else {
            if rewrite && !bytes.is_empty() {
                self.out.push_back(HttpOutput::Transmit {
                    to: conn,
                    bytes: bytes.to_vec(),
                });
            }
            return;
        };
        let mut fwd = Vec::new();
        if c.mode != Mode::Http {
            fwd.extend_from_slice(bytes);
        } else {
            c.client.push(bytes);
            if let Err(reason) = parse_client(conn, c, &self.config, now, &mut fwd, &mut self.out) {
                untrace(conn, c, reason, now, &mut fwd, &mut self.out);
            }
            c.client.compact();
        }
        if rewrite && !fwd.is_empty() {
            self.out.push_back(HttpOutput::Transmit {
                to: conn,
                bytes: fwd,
            });
        }
    }

    /// Bytes the server sent.
    pub fn handle_server_bytes(&mut self, conn: ProxyConnId, bytes: &[u8], now: EpochMs) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.mode != Mode::Http || c.server_state == ServerState::Eof {
            return;
        }
        c.server.push(bytes);
        let mut fwd = Vec::new();
        if let Err(reason) = parse_server(conn, c, &self.config, now, &mut fwd, &mut self.out) {
            untrace(conn, c, reason, now, &mut fwd, &mut self.out);
        }
        c.server.compact();
        if self.config.rewrite_accept_encoding && !fwd.is_empty() {
            self.out.push_back(HttpOutput::Transmit {
                to: conn,
                bytes: fwd,
            });
        }
    }

    /// The server will send nothing more: a response running until close is complete.
    pub fn handle_server_eof(&mut self, conn: ProxyConnId, now: EpochMs) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.mode == Mode::Http && c.server_state == ServerState::Body(Framing::UntilClose) {
            let mut fwd = Vec::new();
            finish_response(conn, c, &self.config, now, &mut fwd, &mut self.out);
            if self.config.rewrite_accept_encoding && !fwd.is_empty() {
                self.out.push_back(HttpOutput::Transmit {
                    to: conn,
                    bytes: fwd,
                });
            }
        }
        if c.mode == Mode::Http {
            c.server_state = ServerState::Eof;
        }
    }

    /// The connection is gone: requests still waiting come out with what arrived of their
    /// response (marked incomplete) or none. Unknown ids are ignored.
    pub fn handle_closed(&mut self, conn: ProxyConnId, now: EpochMs) {
        self.handle_server_eof(conn, now);
        let Some(mut c) = self.conns.remove(&conn) else {
            return;
        };
        flush_pending(conn, &mut c, now, &mut self.out);
    }

    /// The next output.
    pub fn poll_output(&mut self) -> Option<HttpOutput> {
        self.out.pop_front()
    }

    /// How many more body bytes connection `conn` may keep, from now until the next call
    /// (`None`, the default: only `max_body_bytes` per message). A body that meets it is cut
    /// like one over `max_body_bytes` ([`Body::truncated`]). Unknown ids are ignored.
    pub fn set_body_allowance(&mut self, conn: ProxyConnId, allowance: Option<usize>) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.allowance = allowance;
        }
    }

    /// Body bytes held: those of the exchanges being assembled and of the finished ones not yet
    /// drained from [`poll_output`](Self::poll_output). They grow only by what the
    /// connections' allowances let in.
    pub fn kept_body_bytes(&self) -> usize {
        let pending: usize = self
            .conns
            .values()
            .flat_map(|c| &c.pending)
            .map(|p| {
                p.request.body.bytes.len() + p.response.as_ref().map_or(0, |r| r.body.bytes.len())
            })
            .sum();
        let finished: usize = self
            .out
            .iter()
            .map(|o| match o {
                HttpOutput::Exchange(e) => e.body_bytes(),
                _ => 0,
            })
            .sum();
        pending + finished
    }

    /// Connections being assembled.
    pub fn open_connections(&self) -> usize {
        self.conns.len()
    }

    /// Bytes held in connection buffers and bodies (for memory checks).
    pub fn buffered_bytes(&self) -> usize {
        self.conns
            .values()
            .map(|c| {
                c.client.held()
                    + c.server.held()
                    + c.pending
                        .iter()
                        .map(|p| {
                            p.request.body.bytes.len()
                                + p.response.as_ref().map_or(0, |r| r.body.bytes.len())
                        })
                        .sum::<usize>()
            })
            .sum()
    }
}

/// Marks the connection untraced: the requests already sent come out, held client bytes are
/// released unchanged.
fn untrace(
    conn: ProxyConnId,
    c: &mut Conn,
    reason: String,
    now: EpochMs,
    fwd: &mut Vec<u8>,
    out: &mut VecDeque<HttpOutput>,
) {
    out.push_back(HttpOutput::Untraced { conn, reason });
    c.mode = Mode::Untraced;
    fwd.extend_from_slice(&c.client.take_all());
    c.server.take_all();
    flush_pending(conn, c, now, out);
}

fn flush_pending(conn: ProxyConnId, c: &mut Conn, now: EpochMs, out: &mut VecDeque<HttpOutput>) {
    for p in c.pending.drain(..) {
        if !p.request_done {
            continue;
        }
        let ended_at = if p.response_done {
            p.ended_at
        } else {
            now.max(p.started_at)
        };
        let response = p.response.map(|mut r| {
            r.complete = p.response_done;
            r
        });
        out.push_back(HttpOutput::Exchange(Box::new(Exchange {
            conn,
            connect_host: c.host.clone(),
            request: p.request,
            response,
            started_at: p.started_at,
            ended_at,
        })));
    }
}

/// Emits the exchanges at the front that are complete.
fn emit_done(conn: ProxyConnId, c: &mut Conn, out: &mut VecDeque<HttpOutput>) {
    while c
        .pending
        .front()
        .is_some_and(|p| p.request_done && p.response_done)
    {
        let p = c.pending.pop_front().expect("front");
        out.push_back(HttpOutput::Exchange(Box::new(Exchange {
            conn,
            connect_host: c.host.clone(),
            request: p.request,
            response: p.response,
            started_at: p.started_at,
            ended_at: p.ended_at,
        })));
    }
}

fn encoding(headers: &Headers) -> Option<String> {
    let v = header(headers, "content-encoding")?.trim();
    (!v.is_empty() && !v.eq_ignore_ascii_case("identity")).then(|| v.to_ascii_lowercase())
}

/// The request head with every `Accept-Encoding` set to `identity` (one added if none).
fn rewrite_head(head: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len() + 32);
    let mut seen = false;
    let mut lines = head.split_inclusive(|b| *b == b'\n').peekable();
    while let Some(line) = lines.next() {
        let bare = line
            .strip_suffix(b"\n")
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
            .unwrap_or(line);
        if bare.is_empty() && lines.peek().is_none() {
            if !seen {
                out.extend_from_slice(b"Accept-Encoding: identity\r\n");
            }
            out.extend_from_slice(line);
            break;
        }
        let name_end = memchr::memchr(b':', bare);
        if let Some(colon) = name_end
            && bare[..colon].eq_ignore_ascii_case(b"accept-encoding")
        {
            seen = true;
            out.extend_from_slice(&bare[..colon]);
            out.extend_from_slice(b": identity\r\n");
            continue;
        }
        out.extend_from_slice(line);
    }
    out
}

fn parse_client(
    conn: ProxyConnId,
    c: &mut Conn,
    config: &HttpConfig,
    now: EpochMs,
    fwd: &mut Vec<u8>,
    out: &mut VecDeque<HttpOutput>,
) -> Result<(), Fail> {
    loop {
        match c.client_state {
            ClientState::AwaitUpgrade => {
                if c.client.rest().len() > config.max_head_bytes {
                    return Err("client sent too much before the upgrade answer".into());
                }
                return Ok(());
            }
            ClientState::Head => {
                // Blank lines before a request are allowed (RFC 9112 §2.2).
                let blanks = c
                    .client
                    .rest()
                    .iter()
                    .take_while(|b| **b == b'\r' || **b == b'\n')
                    .count();
                if blanks > 0 {
                    fwd.extend_from_slice(&c.client.rest()[..blanks]);
                    c.client.consume(blanks);
                }
                if c.client.rest().is_empty() {
                    return Ok(());
                }
                let Some(len) = capped_head_len(&mut c.client, config.max_head_bytes, "request")?
                else {
                    return Ok(());
                };
                let raw = &c.client.rest()[..len];
                let head = parse_head(raw)?;
                let [method, target, version] = head.start.as_slice() else {
                    return Err("malformed request line".into());
                };
                if !is_token(method) || target.is_empty() || target.contains(' ') {
                    return Err("malformed request line".into());
                }
                if !version.starts_with("HTTP/1.") {
                    return Err(format!("not HTTP/1.x: {:.20}", version));
                }
                if c.pending.len() >= config.max_pipelined {
                    return Err(format!(
                        "more than {} requests awaiting responses",
                        config.max_pipelined
                    ));
                }
                let framing = framing(&head.headers, true)?.unwrap_or(Framing::Length(0));
                if config.rewrite_accept_encoding {
                    fwd.extend_from_slice(&rewrite_head(raw));
                } else {
                    fwd.extend_from_slice(raw);
                }
                c.client.consume(len);
                let upgrade = method.eq_ignore_ascii_case("CONNECT")
                    || header(&head.headers, "upgrade").is_some();
                let body = Body {
                    encoding: encoding(&head.headers),
                    ..Body::default()
                };
                c.pending.push_back(Pending {
                    request: HttpRequest {
                        method: method.clone(),
                        target: target.clone(),
                        headers: head.headers,
                        body,
                    },
                    request_done: false,
                    started_at: now,
                    response: None,
                    response_done: false,
                    ended_at: now,
                    upgrade,
                });
                c.client_state = ClientState::Body(framing);
            }
            ClientState::Body(mut framing) => {
                let p = c
                    .pending
                    .back_mut()
                    .ok_or("request body without a request")?;
                let (body, allowance) = (&mut p.request.body, &mut c.allowance);
                let done = read_body(
                    &mut c.client,
                    &mut framing,
                    config.max_head_bytes,
                    &mut |bytes| body.push(bytes, config.max_body_bytes, allowance),
                    Some(fwd),
                )?;
                c.client_state = ClientState::Body(framing);
                if !done {
                    return Ok(());
                }
                p.request_done = true;
                p.started_at = now;
                let upgrade = p.upgrade && !p.response_done;
                c.client_state = if upgrade {
                    ClientState::AwaitUpgrade
                } else {
                    ClientState::Head
                };
                out.push_back(HttpOutput::RequestSent { conn });
                emit_done(conn, c, out);
            }
        }
    }
}

fn parse_server(
    conn: ProxyConnId,
    c: &mut Conn,
    config: &HttpConfig,
    now: EpochMs,
    fwd: &mut Vec<u8>,
    out: &mut VecDeque<HttpOutput>,
) -> Result<(), Fail> {
    loop {
        if c.mode != Mode::Http {
            return Ok(());
        }
        match c.server_state {
            ServerState::Eof => return Ok(()),
            ServerState::Head => {
                if c.server.rest().is_empty() {
                    return Ok(());
                }
                let Some(len) = capped_head_len(&mut c.server, config.max_head_bytes, "response")?
                else {
                    return Ok(());
                };
                let head = parse_head(&c.server.rest()[..len])?;
                c.server.consume(len);
                let (status, _) = status_line(&head.start)?;
                let Some(p) = c.pending.iter_mut().find(|p| !p.response_done) else {
                    return Err("response without a request".into());
                };
                if (100..200).contains(&status) && status != 101 {
                    continue;
                }
                let connect = p.request.method.eq_ignore_ascii_case("CONNECT");
                let tunnel = status == 101 || (connect && (200..300).contains(&status));
                let no_body = tunnel
                    || p.request.method.eq_ignore_ascii_case("HEAD")
                    || status == 204
                    || status == 304;
                let framing = if no_body {
                    Framing::Length(0)
                } else {
                    framing(&head.headers, false)?.unwrap_or(Framing::UntilClose)
                };
                let body = Body {
                    encoding: encoding(&head.headers),
                    ..Body::default()
                };
                p.response = Some(HttpResponse {
                    status,
                    headers: head.headers,
                    body,
                    complete: false,
                });
                c.server_state = ServerState::Body(framing);
                if tunnel {
                    c.server_state = ServerState::Head;
                    finish_response(conn, c, config, now, fwd, out);
                    c.mode = Mode::Tunnel;
                    fwd.extend_from_slice(&c.client.take_all());
                    c.server.take_all();
                    return Ok(());
                }
            }
            ServerState::Body(mut framing) => {
                let p = c
                    .pending
                    .iter_mut()
                    .find(|p| !p.response_done)
                    .ok_or("response body without a request")?;
                let body = &mut p.response.as_mut().ok_or("body without a head")?.body;
                let allowance = &mut c.allowance;
                let done = read_body(
                    &mut c.server,
                    &mut framing,
                    config.max_head_bytes,
                    &mut |bytes| body.push(bytes, config.max_body_bytes, allowance),
                    None,
                )?;
                c.server_state = ServerState::Body(framing);
                if !done {
                    return Ok(());
                }
                finish_response(conn, c, config, now, fwd, out);
            }
        }
    }
}

/// The response in progress is complete: pair it, emit what is done, and let a client waiting
/// for an upgrade answer go on.
fn finish_response(
    conn: ProxyConnId,
    c: &mut Conn,
    config: &HttpConfig,
    now: EpochMs,
    fwd: &mut Vec<u8>,
    out: &mut VecDeque<HttpOutput>,
) {
    if c.server_state != ServerState::Eof {
        c.server_state = ServerState::Head;
    }
    let Some(p) = c.pending.iter_mut().find(|p| !p.response_done) else {
        return;
    };
    p.response_done = true;
    p.ended_at = now;
    if let Some(r) = &mut p.response {
        r.complete = true;
    }
    let upgraded = p.response.as_ref().is_some_and(|r| {
        r.status == 101
            || (p.request.method.eq_ignore_ascii_case("CONNECT") && (200..300).contains(&r.status))
    });
    let was_waiting = p.upgrade && p.request_done;
    emit_done(conn, c, out);
    if was_waiting && !upgraded && c.client_state == ClientState::AwaitUpgrade {
        c.client_state = ClientState::Head;
        if let Err(reason) = parse_client(conn, c, config, now, fwd, out) {
            untrace(conn, c, reason, now, fwd, out);
        }
    }
}
