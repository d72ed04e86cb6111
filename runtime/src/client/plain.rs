//! Toolbox requests to an `http://` broker without the general HTTP client: HTTP/1.1 on
//! kept-alive TCP connections, one request at a time on each, the request written with one
//! `write` and the answer read with as few reads as it needs.
//!
//! A tool call is one small request and one small answer on loopback or a LAN; the general
//! client (connection pool task, retry layers, header maps, URL objects) cost the runner more
//! CPU per call than the rest of the call together. `https://` brokers and everything that
//! is not a toolbox request (the live stream, activity uploads) still go through it, as does
//! every request when a proxy is configured in the environment (which the general client
//! honours).
//!
//! The answer is framed as HTTP/1.1 says: `Content-Length`, `Transfer-Encoding: chunked`, or
//! up to the close of the connection. A connection goes back to the idle list only after a
//! whole answer that did not ask to close it. An idle connection the broker has closed in the
//! meantime is noticed before reuse; a request on a reused connection that could not be written
//! (the broker had closed it), or a GET, PUT or DELETE that got no byte of an answer back, is
//! sent once more on a new one. A POST or PATCH that got nothing back is not: the broker may
//! have carried it out.

use std::io;
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub(crate) use ac7_protocol::codec::http1::ResponseHead;
use ac7_protocol::codec::http1::{Response, ResponseDecoder};

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Idle connections kept per broker.
const MAX_IDLE: usize = 4;

/// The most bytes a status line and headers may take.
const MAX_HEAD: usize = 64 * 1024;

/// Bytes asked of one read (a tool's answer is rarely bigger).
const READ_SIZE: usize = 16 * 1024;

/// The environment variables through which the general client would send `http://` requests
/// to a proxy.
const PROXY_VARS: [&str; 4] = ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"];

/// Kept-alive connections to one `http://` broker.
#[derive(Debug)]
pub(crate) struct Plain {
    /// Where to connect.
    host: String,
    port: u16,
    /// The `Host` header.
    authority: String,
    /// The base URL's path, without its trailing `/`.
    prefix: String,
    idle: Mutex<Vec<Conn>>,
}

/// A kept-alive connection and the timer that bounds each exchange on it. The timer lives as
/// long as the connection: moving a registered deadline later costs the event loop nothing,
/// where a new timer per request was registered anew each time and woke the loop to look at it
/// (a write to its wake-up descriptor per call).
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
}

/// Why a request got no answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No connection could be made: nothing reached the broker.
    Connect(io::Error),
    /// The request could not be written: the connection was already closed.
    Write(io::Error),
    /// The request went out and the connection closed (or failed) before any byte of an
    /// answer: the broker may or may not have read it.
    Unanswered(io::Error),
    /// The answer broke off, or is not HTTP/1.1.
    Answer(String),
    /// No whole answer within the time given (the connection is closed).
    TimedOut(Duration),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connect(err) => write!(f, "cannot connect: {err}"),
            Self::Write(err) => write!(f, "the request could not be sent: {err}"),
            Self::Unanswered(err) => write!(f, "the request was not answered: {err}"),
            Self::Answer(why) => write!(f, "the answer broke off: {why}"),
            Self::TimedOut(limit) => write!(f, "no answer within {} s", limit.as_secs()),
        }
    }
}

/// One request: what goes on the request line and in the few headers a toolbox call needs.
pub(crate) struct Outgoing<'a> {
    pub(crate) method: &'static str,
    /// Path and query, percent-encoded (see [`Plain::target`]).
    pub(crate) target: &'a str,
    pub(crate) token: &'a str,
    /// More headers, name and value (each value [`header_safe`]).
    pub(crate) headers: &'a [(&'a str, &'a str)],
    /// The body and its `Content-Type` (`None`: no body).
    pub(crate) body: Option<(&'a [u8], &'a str)>,
}

/// An answer whose body is read as it arrives (a live stream), on a connection of its own
/// that ends with it.
#[derive(Debug)]
pub(crate) struct Streaming {
    stream: TcpStream,
    decoder: ResponseDecoder,
    buf: Vec<u8>,
}

impl Plain {
    /// For a broker at `base`: `None` unless it is `http://` with a host, and no proxy is
    /// configured in the environment.
    pub(crate) fn for_base(base: &reqwest::Url) -> Option<Self> {
        if base.scheme() != "http"
            || PROXY_VARS
                .iter()
                .any(|var| std::env::var_os(var).is_some_and(|v| !v.is_empty()))
        {
            return None;
        }
        let named = base.host_str().filter(|h| !h.is_empty())?;
        // An IPv6 address is written in brackets in a URL, not when connecting.
        let host = named
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(named)
            .to_owned();
        let port = base.port_or_known_default()?;
        let authority = match base.port() {
            Some(port) => format!("{named}:{port}"),
            None => named.to_owned(),
        };
        Some(Self {
            host,
            port,
            authority,
            prefix: base.path().trim_end_matches('/').to_owned(),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// The request target for `path` (path and query, percent-encoded) under this base: `path`
    /// as it is when it holds nothing a URL parser would change, else what `full` (the parsed
    /// URL) says.
    pub(crate) fn target(&self, path: &str, full: impl FnOnce() -> reqwest::Url) -> String {
        if path.starts_with('/') && path.bytes().all(plain_byte) && !has_dot_segment(path) {
            let mut target = String::with_capacity(self.prefix.len() + path.len());
            target.push_str(&self.prefix);
            target.push_str(path);
            return target;
        }
        let url = full();
        match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        }
    }

    /// Sends `request` and reads the whole answer, its status and body, within `timeout` (a
    /// connection that has to be made first takes from it too).
    pub(crate) async fn send(
        &self,
        request: &Outgoing<'_>,
        timeout: Duration,
    ) -> Result<(u16, Vec<u8>), Failure> {
        let deadline = tokio::time::Instant::now() + timeout;
        let bytes = encode(request, &self.authority);
        if let Some(conn) = self.reusable() {
            match exchange(conn, &bytes, deadline, timeout).await {
                Ok((answer, conn)) => return Ok(self.keep(answer, conn)),
                // The broker had closed the connection: the request never reached it; once
                // more on a new connection.
                Err(Failure::Write(_)) => {}
                // It closed the connection just as the request arrived (its idle timeout), or
                // it read the request and died: once more only if doing it twice is harmless.
                Err(Failure::Unanswered(_))
                    if matches!(request.method, "GET" | "PUT" | "DELETE") => {}
                Err(other) => return Err(other),
            }
        }
        let stream = self.connect().await?;
        let conn = Conn {
            stream,
            timer: Box::pin(tokio::time::sleep_until(deadline)),
        };
        let (answer, conn) = exchange(conn, &bytes, deadline, timeout).await?;
        Ok(self.keep(answer, conn))
    }

    /// Sends `request` on a connection of its own and reads the answer's head within
    /// `timeout`; the body is then read from the [`Streaming`] as it comes.
    pub(crate) async fn open(
        &self,
        request: &Outgoing<'_>,
        timeout: Duration,
    ) -> Result<(ResponseHead, Streaming), Failure> {
        let bytes = encode(request, &self.authority);
        let mut stream = self.connect().await?;
        let answered = async {
            stream.write_all(&bytes).await.map_err(Failure::Write)?;
            let mut decoder = ResponseDecoder::new(MAX_HEAD);
            let mut buf = Vec::with_capacity(READ_SIZE);
            let head = read_answer(&mut stream, &mut decoder, &mut buf, |decoder, bytes| {
                if bytes.is_empty() {
                    return Ok(None);
                }
                decoder.push(bytes);
                decoder.decode_head()
            })
            .await?;
            Ok((head, decoder, buf))
        };
        match tokio::time::timeout(timeout, answered).await {
            Ok(Ok((head, decoder, buf))) => Ok((
                head,
                Streaming {
                    stream,
                    decoder,
                    buf,
                },
            )),
            Ok(Err(failure)) => Err(failure),
            Err(_) => Err(Failure::TimedOut(timeout)),
        }
    }

    /// An idle connection the broker has not closed, if there is one.
    fn reusable(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(conn) = idle.pop() {
            // Nothing is due on an idle connection: anything readable (the close, or bytes
            // the broker should not have sent) retires it.
            if let Err(err) = conn.stream.try_read(&mut [0u8; 1])
                && err.kind() == io::ErrorKind::WouldBlock
            {
                return Some(conn);
            }
        }
        None
    }

    async fn connect(&self) -> Result<TcpStream, Failure> {
        let connecting = TcpStream::connect((self.host.as_str(), self.port));
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(err)) => return Err(Failure::Connect(err)),
            Err(_) => {
                return Err(Failure::Connect(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {} s", CONNECT_TIMEOUT.as_secs()),
                )));
            }
        };
        stream.set_nodelay(true).map_err(Failure::Connect)?;
        Ok(stream)
    }

    /// The answer's status and body; the connection back on the idle list if it may be reused.
    fn keep(&self, answer: Response, conn: Conn) -> (u16, Vec<u8>) {
        if answer.keep_alive {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < MAX_IDLE {
                idle.push(conn);
            }
        }
        (answer.status, answer.body)
    }
}

impl Streaming {
    /// Hands the body bytes that arrive next to `data` (de-chunked), waiting for some when none
    /// are held: `Ok(true)` once some were handed on, `Ok(false)` when the body ended (or the
    /// connection closed at the end of a body that runs until the close), `Err` when the
    /// connection failed or closed in the middle of the body.
    pub(crate) async fn next(
        &mut self,
        data: &mut (dyn FnMut(&[u8]) + Send),
    ) -> Result<bool, String> {
        loop {
            let mut some = false;
            let done = self.decoder.decode_body(&mut |bytes| {
                some |= !bytes.is_empty();
                data(bytes);
            })?;
            if some {
                return Ok(true);
            }
            if done {
                return Ok(false);
            }
            self.buf.clear();
            let n = self
                .stream
                .read_buf(&mut self.buf)
                .await
                .map_err(|e| e.to_string())?;
            if n == 0 {
                // Everything held was handed on above: the close ends a body that runs until
                // it, and breaks off any other.
                self.decoder.decode_eof()?;
                return Ok(false);
            }
            self.decoder.push(&self.buf[..n]);
        }
    }

    /// The rest of the body as text (of a refusal, say), at most `max` bytes of it; what
    /// came if the connection fails meanwhile.
    pub(crate) async fn text(mut self, max: usize) -> String {
        let mut body = Vec::new();
        while body.len() < max {
            match self
                .next(&mut |bytes| body.extend_from_slice(&bytes[..bytes.len().min(max)]))
                .await
            {
                Ok(true) => {}
                Ok(false) | Err(_) => break,
            }
        }
        body.truncate(max);
        String::from_utf8_lossy(&body).into_owned()
    }
}

/// Whether `value` may go into a header as it is (no line breaks or other control bytes).
pub(crate) fn header_safe(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
}

/// A byte a request target may hold as it is: what a URL parser leaves alone in a path and a
/// query (unreserved, sub-delimiters, `:@/?` and escapes).
fn plain_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&b)
}

/// Whether the path part holds a `.` or `..` segment (which a URL parser would resolve).
fn has_dot_segment(target: &str) -> bool {
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    path.split('/')
        .any(|segment| segment == "." || segment == "..")
}

/// The request's bytes: the request line, `Host`, the bearer token, `X-AC7-Protocol: 1`, the
/// body's type and length, and the body.
fn encode(request: &Outgoing<'_>, authority: &str) -> Vec<u8> {
    let body = request.body.map_or(&[][..], |(bytes, _)| bytes);
    let mut out = Vec::with_capacity(160 + request.target.len() + request.token.len() + body.len());
    for part in [
        request.method,
        " ",
        request.target,
        " HTTP/1.1\r\nhost: ",
        authority,
        "\r\nauthorization: Bearer ",
        request.token,
        "\r\nx-ac7-protocol: 1\r\n",
    ] {
        out.extend_from_slice(part.as_bytes());
    }
    for (name, value) in request.headers {
        for part in [name, ": ", value, "\r\n"] {
            out.extend_from_slice(part.as_bytes());
        }
    }
    if let Some((_, content_type)) = request.body {
        out.extend_from_slice(b"content-type: ");
        out.extend_from_slice(content_type.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if request.body.is_some() || !matches!(request.method, "GET" | "DELETE") {
        out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// Writes `request` on the connection and reads the answer, giving up at `deadline` (which
/// is `timeout` after the request started).
async fn exchange(
    mut conn: Conn,
    request: &[u8],
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<(Response, Conn), Failure> {
    conn.timer.as_mut().reset(deadline);
    let Conn { stream, timer } = &mut conn;
    let answered = tokio::select! {
        biased;
        answered = talk(stream, request) => answered?,
        () = timer.as_mut() => return Err(Failure::TimedOut(timeout)),
    };
    Ok((answered, conn))
}

/// Writes `request` on `stream` and reads the answer.
async fn talk(stream: &mut TcpStream, request: &[u8]) -> Result<Response, Failure> {
    stream.write_all(request).await.map_err(Failure::Write)?;
    let mut decoder = ResponseDecoder::new(MAX_HEAD);
    let mut buf = Vec::with_capacity(READ_SIZE);
    read_answer(stream, &mut decoder, &mut buf, feed).await
}

/// Reads from `stream` until `step` makes something of what came (each read's bytes, an empty
/// slice at the close): a failure, or the close, before any byte of an answer is `Unanswered`
/// (the broker may not have read the request), after it `Answer`.
async fn read_answer<T>(
    stream: &mut TcpStream,
    decoder: &mut ResponseDecoder,
    buf: &mut Vec<u8>,
    mut step: impl FnMut(&mut ResponseDecoder, &[u8]) -> Result<Option<T>, String>,
) -> Result<T, Failure> {
    loop {
        buf.clear();
        let n = match stream.read_buf(buf).await {
            Ok(n) => n,
            Err(err) if decoder.started() => return Err(Failure::Answer(err.to_string())),
            Err(err) => return Err(Failure::Unanswered(err)),
        };
        if let Some(answer) = step(decoder, &buf[..n]).map_err(Failure::Answer)? {
            return Ok(answer);
        }
        if n == 0 {
            let closed = "the connection closed before an answer";
            return Err(if decoder.started() {
                Failure::Answer(closed.into())
            } else {
                Failure::Unanswered(io::Error::new(io::ErrorKind::UnexpectedEof, closed))
            });
        }
    }
}

/// Hands `bytes` (empty: the connection closed) to `decoder`; the answer once it is whole,
/// kept alive only if nothing came after it (bytes after an answer would answer nothing).
fn feed(decoder: &mut ResponseDecoder, bytes: &[u8]) -> Result<Option<Response>, String> {
    let response = if bytes.is_empty() {
        decoder.decode_eof()?
    } else {
        decoder.push(bytes);
        decoder.decode()?
    };
    Ok(response.map(|response| Response {
        keep_alive: response.keep_alive && decoder.surplus().is_empty(),
        ..response
    }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{MAX_HEAD, Outgoing, Plain, encode, feed};
    use ac7_protocol::codec::http1::{Response, ResponseDecoder};

    /// A limit no test reaches.
    const LONG: std::time::Duration = std::time::Duration::from_secs(30);

    /// Feeds `wire` to a fresh decoder in pieces of `step` bytes, then the close if `eof`; the
    /// answer and what was left after it.
    fn decode_in_steps(
        wire: &[u8],
        step: usize,
        eof: bool,
    ) -> Result<Option<(Response, Vec<u8>)>, String> {
        let mut decoder = ResponseDecoder::new(MAX_HEAD);
        let closed: &[u8] = &[];
        let pieces = wire.chunks(step).chain(eof.then_some(closed));
        for piece in pieces {
            if let Some(answer) = feed(&mut decoder, piece)? {
                return Ok(Some((answer, decoder.surplus().to_vec())));
            }
        }
        Ok(None)
    }

    fn answer(status: u16, body: &[u8], reusable: bool) -> Response {
        Response {
            status,
            body: body.to_vec(),
            keep_alive: reusable,
        }
    }

    #[test]
    fn every_framing_reads_the_same_answer_however_the_bytes_arrive() {
        let cases: [(&[u8], bool, Response); 7] = [
            (
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"a\":\"b c\"}",
                false,
                answer(200, b"{\"a\":\"b c\"}", true),
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nExpires: never\r\n\r\n",
                false,
                answer(200, b"Wikipedia in\r\n\r\nchunks.", true),
            ),
            (
                b"HTTP/1.1 404 Not Found\r\nconnection: close\r\ncontent-length: 3\r\n\r\nno\n",
                false,
                answer(404, b"no\n", false),
            ),
            (
                b"HTTP/1.1 200 OK\r\n\r\nuntil the end",
                true,
                answer(200, b"until the end", false),
            ),
            (
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}",
                false,
                answer(201, b"{}", true),
            ),
            (
                b"HTTP/1.1 204 No Content\r\n\r\n",
                false,
                answer(204, b"", true),
            ),
            (
                b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
                false,
                answer(200, b"ok", false),
            ),
        ];
        for (wire, eof, expected) in cases {
            for step in 1..=wire.len() {
                let (got, rest) = decode_in_steps(wire, step, eof)
                    .unwrap()
                    .unwrap_or_else(|| panic!("no answer at step {step}: {wire:?}"));
                assert_eq!(got, expected, "step {step}");
                assert!(rest.is_empty());
            }
        }
    }

    #[test]
    fn an_answer_cut_short_is_not_an_answer() {
        for wire in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort"[..],
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nabc",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-le",
        ] {
            assert_eq!(decode_in_steps(wire, 3, false).unwrap(), None, "{wire:?}");
            let err = decode_in_steps(wire, 3, true).unwrap_err();
            assert!(err.contains("closed before the end"), "{err} for {wire:?}");
        }
    }

    #[test]
    fn what_is_not_http_is_refused_with_a_reason() {
        for (wire, why) in [
            (
                &b"SSH-2.0-OpenSSH_9.6\r\n\r\n"[..],
                "not an HTTP/1.x answer",
            ),
            // Refused at once, not after waiting for the end of a head.
            (b"SSH-2.0-OpenSSH_9.6\r\n", "not an HTTP/1.x answer"),
            (b"HTTP/1.1 2000 OK\r\n\r\n", "malformed status line"),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: ten\r\n\r\n",
                "invalid Content-Length",
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
                "conflicting Content-Length",
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
                "transfer coding this client cannot undo: gzip",
            ),
            (
                b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n",
                "switched protocols",
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
                "invalid chunk size",
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nab\r\n",
                "chunk data not followed by CRLF",
            ),
        ] {
            let err = decode_in_steps(wire, wire.len(), false).unwrap_err();
            assert!(err.contains(why), "{err} for {wire:?}");
        }
    }

    #[test]
    fn bytes_after_an_answer_retire_the_connection() {
        let wire = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n";
        let (got, rest) = decode_in_steps(wire, wire.len(), false).unwrap().unwrap();
        assert_eq!(got, answer(200, b"ok", false));
        assert_eq!(rest, b"HTTP/1.1 200 OK\r\n");
    }

    #[test]
    fn a_request_carries_its_token_protocol_and_body() {
        let request = Outgoing {
            method: "POST",
            target: "/ac7/push",
            token: "ac7_t",
            headers: &[],
            body: Some((b"{\"body\":\"hi\"}", "application/json")),
        };
        assert_eq!(
            String::from_utf8(encode(&request, "127.0.0.1:8717")).unwrap(),
            "POST /ac7/push HTTP/1.1\r\nhost: 127.0.0.1:8717\r\nauthorization: Bearer ac7_t\r\n\
             x-ac7-protocol: 1\r\ncontent-type: application/json\r\ncontent-length: 13\r\n\r\n\
             {\"body\":\"hi\"}"
        );
        let get = Outgoing {
            method: "GET",
            target: "/roster",
            token: "t",
            headers: &[],
            body: None,
        };
        assert_eq!(
            String::from_utf8(encode(&get, "localhost")).unwrap(),
            "GET /roster HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer t\r\nx-ac7-protocol: 1\r\n\r\n"
        );
        let post = Outgoing {
            method: "POST",
            body: None,
            ..get
        };
        assert!(
            String::from_utf8(encode(&post, "localhost"))
                .unwrap()
                .ends_with("x-ac7-protocol: 1\r\ncontent-length: 0\r\n\r\n")
        );
    }

    #[test]
    fn more_headers_follow_the_token_and_protocol() {
        let request = Outgoing {
            method: "GET",
            target: "/subscribe?name=ann",
            token: "t",
            headers: &[("accept", "text/event-stream"), ("last-event-id", "7")],
            body: None,
        };
        assert_eq!(
            String::from_utf8(encode(&request, "localhost")).unwrap(),
            "GET /subscribe?name=ann HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer t\r\n\
             x-ac7-protocol: 1\r\naccept: text/event-stream\r\nlast-event-id: 7\r\n\r\n"
        );
    }

    /// A request's head as a test server reads it (up to the blank line; requests here have no
    /// body); `None` when the connection ends first.
    pub(crate) async fn read_request_head(stream: &mut tokio::net::TcpStream) -> Option<String> {
        use tokio::io::AsyncReadExt;
        let mut buf = Vec::new();
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut chunk = [0u8; 1024];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
            }
        }
        Some(String::from_utf8_lossy(&buf).into_owned())
    }

    /// A server on 127.0.0.1 that reads one request and writes `pieces` with a pause before
    /// each, then closes; the request's head, once read.
    async fn piecewise_server(
        pieces: Vec<&'static [u8]>,
    ) -> (reqwest::Url, tokio::sync::oneshot::Receiver<String>) {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url =
            reqwest::Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let Some(head) = read_request_head(&mut stream).await else {
                return;
            };
            let _ = tx.send(head);
            for piece in pieces {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                if stream.write_all(piece).await.is_err() {
                    return;
                }
            }
        });
        (url, rx)
    }

    /// Reads `streaming` to its end: each piece handed on, and how it ended.
    async fn read_out(streaming: &mut super::Streaming) -> (Vec<Vec<u8>>, Result<bool, String>) {
        let mut pieces = Vec::new();
        loop {
            let mut piece = Vec::new();
            match streaming.next(&mut |b| piece.extend_from_slice(b)).await {
                Ok(true) => pieces.push(piece),
                other => return (pieces, other),
            }
        }
    }

    #[tokio::test]
    async fn an_event_stream_is_handed_on_event_by_event_until_its_last_chunk() {
        let (url, request) = piecewise_server(vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n",
            b"transfer-encoding: chunked\r\n\r\n9\r\n: hello\n\n\r\n",
            b"13\r\nevent: m\ndata: {}\n\n\r\n",
            b"0\r\n\r\n",
        ])
        .await;
        let plain = Plain::for_base(&url).unwrap();
        let opening = Outgoing {
            headers: &[("accept", "text/event-stream")],
            ..get("/subscribe?name=ann")
        };
        let (head, mut streaming) = plain
            .open(&opening, std::time::Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(
            ac7_protocol::codec::http1::header(&head.headers, "content-type"),
            Some("text/event-stream")
        );
        let sent = request.await.unwrap();
        assert!(
            sent.starts_with("GET /subscribe?name=ann HTTP/1.1\r\n"),
            "{sent}"
        );
        assert!(sent.contains("\r\naccept: text/event-stream\r\n"), "{sent}");
        let (pieces, end) = read_out(&mut streaming).await;
        assert_eq!(
            pieces,
            [&b": hello\n\n"[..], b"event: m\ndata: {}\n\n"],
            "each event as it came"
        );
        assert_eq!(end, Ok(false), "the last chunk ends the body");
    }

    #[tokio::test]
    async fn a_stream_cut_off_mid_chunk_is_an_error_and_a_refusal_reads_as_text() {
        let (url, _) = piecewise_server(vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
            b"20\r\nevent: m\n",
        ])
        .await;
        let plain = Plain::for_base(&url).unwrap();
        let timeout = std::time::Duration::from_secs(5);
        let (_, mut streaming) = plain.open(&get("/subscribe"), timeout).await.unwrap();
        let (pieces, end) = read_out(&mut streaming).await;
        assert_eq!(pieces, [b"event: m\n"]);
        assert!(end.unwrap_err().contains("closed before the end"));

        let (url, _) = piecewise_server(vec![
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 10\r\n\r\nno ",
            b"stream\n",
        ])
        .await;
        let plain = Plain::for_base(&url).unwrap();
        let (head, streaming) = plain.open(&get("/subscribe"), timeout).await.unwrap();
        assert_eq!(head.status, 404);
        assert_eq!(streaming.text(4096).await, "no stream\n");

        // A head cut off by the close, and no head in time: the open fails, saying which.
        let (url, _) = piecewise_server(vec![b"HTTP/1.1 200 OK\r\n"]).await;
        let plain = Plain::for_base(&url).unwrap();
        match plain.open(&get("/subscribe"), timeout).await {
            Err(super::Failure::Answer(why)) => {
                assert!(why.contains("closed before an answer"), "{why}")
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("a head without its end"),
        }
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = reqwest::Url::parse(&format!("http://{}", silent.local_addr().unwrap())).unwrap();
        let plain = Plain::for_base(&url).unwrap();
        let short = std::time::Duration::from_millis(200);
        let request = get("/subscribe");
        let (opened, accepted) = tokio::join!(plain.open(&request, short), silent.accept());
        let _held = accepted.unwrap();
        match opened {
            Err(super::Failure::TimedOut(limit)) => assert_eq!(limit, short),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("an answer from a silent server"),
        }
    }

    #[test]
    fn line_breaks_and_control_bytes_are_not_header_safe() {
        assert!(super::header_safe(
            "ac7_0123-abc.DEF text/plain; charset=utf-8\t"
        ));
        for bad in ["a\r\nx-evil: 1", "a\nb", "nul\0", "caf\u{e9}", "del\u{7f}"] {
            assert!(!super::header_safe(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_target_is_what_parsing_the_whole_url_gives() {
        for base in [
            "http://127.0.0.1:8717",
            "http://localhost",
            "http://example.org/ac7/",
            "http://[::1]:9000/team/a",
        ] {
            let parsed_base = reqwest::Url::parse(base).unwrap();
            let plain = Plain::for_base(&parsed_base).unwrap();
            for path in [
                "/roster",
                "/history?with=bob&limit=50",
                "/fs/read/home/ann/a%20b.txt",
                "/objectives?assignee=ann%2Bco&status=active",
                "/fs/read/d\u{e9}j\u{e0}/caf\u{e9} 1.txt",
                "/history?q=a b&x=\u{e9}",
                "/fs/read/a/../b",
                "/fs/read/a/./b?x=../y",
                "/fs/read/{x}\"<>`",
            ] {
                let joined = format!("{}{path}", base.trim_end_matches('/'));
                let url = reqwest::Url::parse(&joined).unwrap();
                let expected = match url.query() {
                    Some(q) => format!("{}?{q}", url.path()),
                    None => url.path().to_owned(),
                };
                let got = plain.target(path, || super::super::broker::join(&parsed_base, path));
                assert_eq!(got, expected, "{base} + {path}");
            }
        }
        assert!(Plain::for_base(&reqwest::Url::parse("https://example.org").unwrap()).is_none());
    }

    /// A server on 127.0.0.1 that answers every request with its connection's number and the
    /// request's number on it, and closes each connection after `per_connection` answers
    /// (without saying so; with `read_one_more`, after reading one more request and not
    /// answering it); the requests it read, as `(connection, request line)`.
    async fn numbering_server(
        per_connection: usize,
        read_one_more: bool,
    ) -> (
        reqwest::Url,
        std::sync::Arc<std::sync::Mutex<Vec<(usize, String)>>>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url =
            reqwest::Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = std::sync::Arc::clone(&seen);
        tokio::spawn(async move {
            for conn in 0.. {
                let (mut stream, _) = listener.accept().await.unwrap();
                let log = std::sync::Arc::clone(&log);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let reads = per_connection.saturating_add(usize::from(read_one_more));
                    for n in 0..reads {
                        let end = loop {
                            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break end + 4;
                            }
                            let mut chunk = [0u8; 1024];
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(k) => buf.extend_from_slice(&chunk[..k]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end);
                        let line = head.lines().next().unwrap_or_default().to_owned();
                        log.lock().unwrap().push((conn, line));
                        if n == per_connection {
                            return;
                        }
                        let body = format!("{conn}/{n}");
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        stream.write_all(answer.as_bytes()).await.unwrap();
                    }
                });
            }
        });
        (url, seen)
    }

    fn get(target: &str) -> Outgoing<'_> {
        Outgoing {
            method: "GET",
            target,
            token: "t",
            headers: &[],
            body: None,
        }
    }

    #[tokio::test]
    async fn an_answer_that_does_not_come_in_time_fails_and_its_connection_goes() {
        use tokio::io::AsyncWriteExt;
        // The first connection answers one request and then holds the next unanswered; the
        // others answer each request.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url =
            reqwest::Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        tokio::spawn(async move {
            for conn in 0.. {
                let (mut stream, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    for n in 0.. {
                        if read_request_head(&mut stream).await.is_none() {
                            return;
                        }
                        if conn == 0 && n == 1 {
                            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
                        }
                        let body = format!("{conn}/{n}");
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        stream.write_all(answer.as_bytes()).await.unwrap();
                    }
                });
            }
        });
        let plain = Plain::for_base(&url).unwrap();
        let short = std::time::Duration::from_millis(300);
        assert_eq!(
            plain.send(&get("/a"), short).await.unwrap(),
            (200, b"0/0".to_vec())
        );
        // On the kept connection (its timer moved on from the first request): no answer.
        let started = std::time::Instant::now();
        match plain.send(&get("/b"), short).await {
            Err(super::Failure::TimedOut(limit)) => assert_eq!(limit, short),
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() >= short);
        // The silent connection was dropped: the next request opens a new one.
        assert_eq!(
            plain.send(&get("/c"), short).await.unwrap(),
            (200, b"1/0".to_vec())
        );
        // Its timer, reused, still bounds nothing that answers in time.
        tokio::time::sleep(short * 2).await;
        assert_eq!(
            plain.send(&get("/d"), short).await.unwrap(),
            (200, b"1/1".to_vec())
        );
    }

    #[tokio::test]
    async fn one_kept_connection_carries_request_after_request() {
        let (url, seen) = numbering_server(usize::MAX, false).await;
        let plain = Plain::for_base(&url).unwrap();
        for n in 0..5 {
            let (status, body) = plain.send(&get("/roster"), LONG).await.unwrap();
            assert_eq!((status, body), (200, format!("0/{n}").into_bytes()));
        }
        assert_eq!(seen.lock().unwrap().len(), 5);
    }

    #[tokio::test]
    async fn a_connection_the_broker_closed_is_replaced_and_no_request_is_lost_or_doubled() {
        let (url, seen) = numbering_server(1, false).await;
        let plain = Plain::for_base(&url).unwrap();
        for n in 0..4 {
            // Once without giving the runtime a turn in between (the close may not have been
            // noticed when the next request goes out), once after it.
            if n % 2 == 1 {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            let target = format!("/history?n={n}");
            let (status, body) = plain.send(&get(&target), LONG).await.unwrap();
            assert_eq!((status, body), (200, format!("{n}/0").into_bytes()));
        }
        let seen = seen.lock().unwrap().clone();
        let lines: Vec<_> = seen.iter().map(|(_, line)| line.as_str()).collect();
        assert_eq!(
            lines,
            (0..4)
                .map(|n| format!("GET /history?n={n} HTTP/1.1"))
                .collect::<Vec<_>>()
        );
    }

    #[tokio::test]
    async fn a_post_that_got_no_answer_is_not_sent_twice_but_a_get_is() {
        for method in ["POST", "GET"] {
            let (url, seen) = numbering_server(1, true).await;
            let plain = Plain::for_base(&url).unwrap();
            let request = Outgoing {
                method,
                target: "/push",
                token: "t",
                headers: &[],
                body: None,
            };
            assert_eq!(
                plain.send(&request, LONG).await.unwrap(),
                (200, b"0/0".to_vec())
            );
            // On the kept connection, the server reads the request and closes without answering.
            let second = plain.send(&request, LONG).await;
            let connections: Vec<usize> = seen.lock().unwrap().iter().map(|(c, _)| *c).collect();
            if method == "POST" {
                assert!(
                    matches!(second, Err(super::Failure::Unanswered(_))),
                    "{second:?}"
                );
                assert_eq!(connections, [0, 0]);
            } else {
                assert_eq!(second.unwrap(), (200, b"1/0".to_vec()));
                assert_eq!(connections, [0, 0, 1]);
            }
        }
    }

    #[tokio::test]
    async fn nothing_listening_is_a_refused_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url =
            reqwest::Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        drop(listener);
        let plain = Plain::for_base(&url).unwrap();
        assert!(matches!(
            plain.send(&get("/roster"), LONG).await,
            Err(super::Failure::Connect(_))
        ));
    }
}
