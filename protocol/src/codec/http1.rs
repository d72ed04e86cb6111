//! HTTP/1.x message framing, sans-IO: where a head ends, what its start line and headers say,
//! how long the body is and its bytes de-chunked, as RFC 9112 has it. A message body is chunked
//! (`Transfer-Encoding` ending in `chunked`), `Content-Length` long, or (a response only) runs
//! until the server closes; a response to a `1xx`, `204` or `304` has none.
//!
//! Two readers share these rules: the trace assembler (both directions of a proxied
//! connection) and [`ResponseDecoder`], which reads the answers to a client's own requests.
//! Bad input is an error with a reason, never a panic, and every buffer is capped: a head by
//! its `max_head` bytes, a chunk-size or trailer line likewise.

/// Why bytes are not an HTTP/1.x message (for the log, or the caller's error).
pub(crate) type Fail = String;

/// Headers in arrival order, names as sent.
pub type Headers = Vec<(String, String)>;

/// The first value of header `name` (case-insensitive).
pub fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    Length(u64),
    Chunked(Chunk),
    UntilClose,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chunk {
    Size,
    Data(u64),
    DataEnd,
    Trailers,
}

#[derive(Debug, Default)]
pub(crate) struct Buf {
    data: Vec<u8>,
    pos: usize,
    /// Where the search for the end of a head resumes.
    scan: usize,
}

impl Buf {
    /// Bytes read after those already held.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.data.extend_from_slice(bytes);
    }

    /// Bytes held, taken or not (what the buffer occupies).
    pub(crate) fn held(&self) -> usize {
        self.data.len()
    }

    /// The bytes not yet taken.
    pub(crate) fn rest(&self) -> &[u8] {
        &self.data[self.pos..]
    }

    pub(crate) fn consume(&mut self, n: usize) {
        self.pos += n;
        self.scan = 0;
    }

    pub(crate) fn compact(&mut self) {
        if self.pos > 0 {
            self.data.drain(..self.pos);
            self.pos = 0;
        }
    }

    pub(crate) fn take_all(&mut self) -> Vec<u8> {
        let out = self.data.split_off(self.pos);
        self.data.clear();
        self.pos = 0;
        self.scan = 0;
        out
    }
}

pub(crate) struct Head {
    pub(crate) start: Vec<String>,
    pub(crate) headers: Headers,
}

/// The length of the head at the start of `buf` (through the blank line), if complete.
pub(crate) fn head_len(buf: &mut Buf) -> Option<usize> {
    let rest = &buf.data[buf.pos..];
    // Resume a little before where the last search stopped (a line end may straddle).
    let mut i = buf.scan.saturating_sub(3);
    while let Some(nl) = memchr::memchr(b'\n', &rest[i..]) {
        let at = i + nl;
        let next = &rest[at + 1..];
        if next.starts_with(b"\n") {
            return Some(at + 2);
        }
        if next.starts_with(b"\r\n") {
            return Some(at + 3);
        }
        if next.is_empty() || next == b"\r" {
            break;
        }
        i = at + 1;
    }
    buf.scan = rest.len();
    None
}

/// [`head_len`], failing when the head is (or will be) longer than `max`.
pub(crate) fn capped_head_len(
    buf: &mut Buf,
    max: usize,
    what: &str,
) -> Result<Option<usize>, Fail> {
    match head_len(buf) {
        Some(len) if len <= max => Ok(Some(len)),
        None if buf.rest().len() <= max => Ok(None),
        _ => Err(format!("{what} head exceeds {max} bytes")),
    }
}

pub(crate) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

pub(crate) fn parse_head(bytes: &[u8]) -> Result<Head, Fail> {
    let mut lines = bytes
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let start = lines.next().unwrap_or_default();
    let start = std::str::from_utf8(start).map_err(|_| "start line is not UTF-8".to_owned())?;
    let start: Vec<String> = start.splitn(3, ' ').map(str::to_owned).collect();
    let mut headers = Vec::new();
    for line in lines {
        if line.is_empty() {
            break;
        }
        if line[0] == b' ' || line[0] == b'\t' {
            return Err("folded header line".into());
        }
        let colon = memchr::memchr(b':', line).ok_or("header line without a colon")?;
        let name = std::str::from_utf8(&line[..colon]).unwrap_or("");
        if !is_token(name) {
            return Err("invalid header name".into());
        }
        let value = String::from_utf8_lossy(&line[colon + 1..]);
        headers.push((name.to_owned(), value.trim_matches([' ', '\t']).to_owned()));
    }
    Ok(Head { start, headers })
}

pub(crate) fn framing(headers: &Headers, request: bool) -> Result<Option<Framing>, Fail> {
    let te: Vec<&str> = headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding"))
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect();
    if let Some(last) = te.last() {
        return if last.eq_ignore_ascii_case("chunked") {
            Ok(Some(Framing::Chunked(Chunk::Size)))
        } else if request {
            Err("request Transfer-Encoding does not end with chunked".into())
        } else {
            Ok(Some(Framing::UntilClose))
        };
    }
    let mut length = None;
    for (_, v) in headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
    {
        for part in v.split(',').map(str::trim) {
            if part.is_empty() || part.len() > 18 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err("invalid Content-Length".into());
            }
            let n: u64 = part.parse().map_err(|_| "invalid Content-Length")?;
            if length.is_some_and(|l| l != n) {
                return Err("conflicting Content-Length values".into());
            }
            length = Some(n);
        }
    }
    Ok(length.map(Framing::Length))
}

/// Reads body bytes per `framing`, handing each run of body data (de-chunked) to `data` and,
/// with `fwd`, every byte taken (framing included) to it: `Ok(true)` when the body is complete.
/// `max_line` caps a chunk-size or trailer line.
pub(crate) fn read_body(
    buf: &mut Buf,
    framing: &mut Framing,
    max_line: usize,
    data: &mut dyn FnMut(&[u8]),
    mut fwd: Option<&mut Vec<u8>>,
) -> Result<bool, Fail> {
    let forward = |fwd: &mut Option<&mut Vec<u8>>, bytes: &[u8]| {
        if let Some(f) = fwd {
            f.extend_from_slice(bytes);
        }
    };
    loop {
        let rest = buf.rest();
        match framing {
            Framing::Length(0) => return Ok(true),
            Framing::UntilClose => {
                data(rest);
                forward(&mut fwd, rest);
                let n = rest.len();
                buf.consume(n);
                return Ok(false);
            }
            Framing::Length(remaining) | Framing::Chunked(Chunk::Data(remaining)) => {
                if rest.is_empty() {
                    return Ok(false);
                }
                let n = (*remaining).min(rest.len() as u64) as usize;
                data(&rest[..n]);
                forward(&mut fwd, &rest[..n]);
                *remaining -= n as u64;
                buf.consume(n);
                if *framing == Framing::Chunked(Chunk::Data(0)) {
                    *framing = Framing::Chunked(Chunk::DataEnd);
                }
            }
            Framing::Chunked(Chunk::DataEnd) => {
                let n = if rest.starts_with(b"\r\n") {
                    2
                } else if rest.starts_with(b"\n") {
                    1
                } else if rest.is_empty() || rest == b"\r" {
                    return Ok(false);
                } else {
                    return Err("chunk data not followed by CRLF".into());
                };
                forward(&mut fwd, &rest[..n]);
                buf.consume(n);
                *framing = Framing::Chunked(Chunk::Size);
            }
            Framing::Chunked(state @ (Chunk::Size | Chunk::Trailers)) => {
                let Some(nl) = memchr::memchr(b'\n', rest) else {
                    if rest.len() > max_line {
                        return Err("chunk size or trailer line too long".into());
                    }
                    return Ok(false);
                };
                if nl > max_line {
                    return Err("chunk size or trailer line too long".into());
                }
                let line = &rest[..nl];
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let trailers = *state == Chunk::Trailers;
                let next = if trailers {
                    if line.is_empty() {
                        None
                    } else {
                        Some(Chunk::Trailers)
                    }
                } else {
                    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
                    let after = &line[digits..];
                    if digits == 0
                        || digits > 15
                        || !(after.is_empty()
                            || after[0] == b';'
                            || after[0] == b' '
                            || after[0] == b'\t')
                    {
                        return Err("invalid chunk size".into());
                    }
                    let size = u64::from_str_radix(
                        std::str::from_utf8(&line[..digits]).unwrap_or("0"),
                        16,
                    )
                    .map_err(|_| "invalid chunk size")?;
                    Some(if size == 0 {
                        Chunk::Trailers
                    } else {
                        Chunk::Data(size)
                    })
                };
                forward(&mut fwd, &rest[..nl + 1]);
                buf.consume(nl + 1);
                match next {
                    None => return Ok(true),
                    Some(chunk) => *framing = Framing::Chunked(chunk),
                }
            }
        }
    }
}

/// A whole response read by [`ResponseDecoder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body, de-chunked.
    pub body: Vec<u8>,
    /// The connection may carry the next request: HTTP/1.1 without `Connection: close` (or
    /// HTTP/1.0 with `keep-alive`), and a body not delimited by the close.
    pub keep_alive: bool,
}

/// The start of a response whose body is read as it arrives ([`ResponseDecoder::decode_head`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// The status code.
    pub status: u16,
    /// The headers, in arrival order.
    pub headers: Headers,
    /// As [`Response::keep_alive`] says, once the body is complete.
    pub keep_alive: bool,
}

/// Reads one response to a request (not `HEAD`) from a connection's bytes as they arrive, the
/// codec way: [`push`](Self::push) what was read, then [`decode`](Self::decode); at the end of
/// the connection [`decode_eof`](Self::decode_eof). Interim `1xx` answers (`100 Continue`) are
/// skipped. A transfer coding other than `chunked` is refused (its body could not be used), as
/// is a switch of protocols.
#[derive(Debug)]
pub struct ResponseDecoder {
    buf: Buf,
    max_head: usize,
    /// Any byte has come.
    started: bool,
    state: Reading,
    body: Vec<u8>,
}

#[derive(Debug)]
enum Reading {
    Head,
    Body {
        status: u16,
        keep_alive: bool,
        framing: Framing,
    },
}

impl ResponseDecoder {
    /// A decoder for one response whose head may take up to `max_head` bytes.
    pub fn new(max_head: usize) -> Self {
        Self {
            buf: Buf::default(),
            max_head,
            started: false,
            state: Reading::Head,
            body: Vec::new(),
        }
    }

    /// Bytes read from the connection.
    pub fn push(&mut self, bytes: &[u8]) {
        self.started |= !bytes.is_empty();
        self.buf.push(bytes);
    }

    /// Whether any byte of a response has come (a connection that closes before one did may
    /// not have read the request at all).
    pub fn started(&self) -> bool {
        self.started
    }

    /// Bytes pushed beyond the response (which answer nothing: the connection is not to be
    /// reused when there are any).
    pub fn surplus(&self) -> &[u8] {
        self.buf.rest()
    }

    /// The response, once it is whole.
    pub fn decode(&mut self) -> Result<Option<Response>, String> {
        if matches!(self.state, Reading::Head) && self.decode_head()?.is_none() {
            return Ok(None);
        }
        // The head is read: its status and reuse, before the body's end resets the state.
        let Reading::Body {
            status, keep_alive, ..
        } = self.state
        else {
            return Ok(None);
        };
        let mut body = std::mem::take(&mut self.body);
        let done = self.decode_body(&mut |bytes| body.extend_from_slice(bytes))?;
        if !done {
            self.body = body;
            return Ok(None);
        }
        Ok(Some(Response {
            status,
            body,
            keep_alive,
        }))
    }

    /// The status and headers of the response, once its head is whole (interim `1xx` answers
    /// skipped); its body then comes through [`decode_body`](Self::decode_body) as it arrives,
    /// for an answer that does not end (an event stream). `Ok(None)`: more bytes are needed.
    pub fn decode_head(&mut self) -> Result<Option<ResponseHead>, String> {
        if !matches!(self.state, Reading::Head) {
            return Err("the head was already read".into());
        }
        loop {
            let rest = self.buf.rest();
            let prefix = rest.len().min(5);
            if rest[..prefix] != b"HTTP/"[..prefix] {
                return Err("not an HTTP/1.x answer".into());
            }
            let Some(len) = capped_head_len(&mut self.buf, self.max_head, "response")? else {
                return Ok(None);
            };
            let head = parse_head(&self.buf.rest()[..len])?;
            self.buf.consume(len);
            let (status, http11) = status_line(&head.start)?;
            if status == 101 {
                return Err("the server switched protocols".into());
            }
            if (100..200).contains(&status) {
                continue;
            }
            let framing = if matches!(status, 204 | 304) {
                Framing::Length(0)
            } else {
                match framing(&head.headers, false)? {
                    // What a `Transfer-Encoding` not ending in `chunked` frames.
                    Some(Framing::UntilClose) => {
                        return Err(format!(
                            "a transfer coding this client cannot undo: {}",
                            header(&head.headers, "transfer-encoding").unwrap_or_default()
                        ));
                    }
                    Some(framing) => framing,
                    None => Framing::UntilClose,
                }
            };
            // A body delimited by the close ends only at the close, never kept alive.
            let keep_alive = keep_alive(&head.headers, http11);
            self.state = Reading::Body {
                status,
                keep_alive,
                framing,
            };
            return Ok(Some(ResponseHead {
                status,
                headers: head.headers,
                keep_alive: keep_alive && framing != Framing::UntilClose,
            }));
        }
    }

    /// After [`decode_head`](Self::decode_head): hands the body bytes pushed so far to `data`,
    /// de-chunked, and says whether the body is complete (the decoder is then ready for the
    /// next response on the connection). A body that runs until the close is never complete
    /// here: the close ends it.
    pub fn decode_body(&mut self, data: &mut dyn FnMut(&[u8])) -> Result<bool, String> {
        let Reading::Body { framing, .. } = &mut self.state else {
            return Err("no response in progress".into());
        };
        let done = read_body(&mut self.buf, framing, self.max_head, data, None)?;
        if done {
            self.state = Reading::Head;
        } else {
            self.buf.compact();
        }
        Ok(done)
    }

    /// The connection closed: the response if it ran until the close, an error if it broke
    /// off, `Ok(None)` if no byte of one came.
    pub fn decode_eof(&mut self) -> Result<Option<Response>, String> {
        if let Some(response) = self.decode()? {
            return Ok(Some(response));
        }
        match &self.state {
            Reading::Body {
                status,
                framing: Framing::UntilClose,
                ..
            } => Ok(Some(Response {
                status: *status,
                body: std::mem::take(&mut self.body),
                keep_alive: false,
            })),
            _ if !self.started => Ok(None),
            _ => Err("the connection closed before the end of the answer".into()),
        }
    }
}

/// The status code of a status line (`HTTP/1.x NNN reason`) and whether it is HTTP/1.1 or later.
pub(crate) fn status_line(start: &[String]) -> Result<(u16, bool), Fail> {
    match start {
        [version, code, ..]
            if version.starts_with("HTTP/1.")
                && code.len() == 3
                && code.bytes().all(|b| b.is_ascii_digit()) =>
        {
            let status = code.parse::<u16>().map_err(|_| "bad status")?;
            Ok((status, version != "HTTP/1.0"))
        }
        _ => Err("malformed status line".into()),
    }
}

/// Whether the `Connection` headers leave the connection open.
fn keep_alive(headers: &Headers, http11: bool) -> bool {
    let mut open = http11;
    for option in headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim)
    {
        if option.eq_ignore_ascii_case("close") {
            return false;
        }
        if option.eq_ignore_ascii_case("keep-alive") {
            open = true;
        }
    }
    open
}

#[cfg(test)]
mod tests {
    use super::{ResponseDecoder, header};

    /// Reads `wire` pushed `step` bytes at a time with `decode_head` and then `decode_body`:
    /// the status, the `content-type`, the body handed on, whether the body completed, and
    /// how many calls handed on some bytes.
    fn stream(wire: &[u8], step: usize) -> (u16, Option<String>, Vec<u8>, bool, usize) {
        let mut decoder = ResponseDecoder::new(1024);
        let mut head = None;
        let mut body = Vec::new();
        let mut handed = 0;
        for piece in wire.chunks(step) {
            decoder.push(piece);
            if head.is_none() {
                head = decoder.decode_head().unwrap();
                if head.is_none() {
                    continue;
                }
            }
            let before = body.len();
            if decoder
                .decode_body(&mut |b| body.extend_from_slice(b))
                .unwrap()
            {
                let head = head.unwrap();
                let kind = header(&head.headers, "content-type").map(str::to_owned);
                return (head.status, kind, body, true, handed + 1);
            }
            handed += usize::from(body.len() > before);
        }
        let head = head.expect("a head");
        let kind = header(&head.headers, "content-type").map(str::to_owned);
        (head.status, kind, body, false, handed)
    }

    #[test]
    fn a_chunked_event_stream_comes_out_piece_by_piece_however_the_bytes_arrive() {
        let wire = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
            9\r\n: hello\n\n\r\n13\r\nevent: m\ndata: {}\n\n\r\n";
        for step in 1..=wire.len() {
            let (status, kind, body, done, handed) = stream(wire, step);
            assert_eq!(status, 200);
            assert_eq!(kind.as_deref(), Some("text/event-stream"));
            assert_eq!(body, b": hello\n\nevent: m\ndata: {}\n\n", "step {step}");
            assert!(!done, "an open stream has not ended");
            if step == 1 {
                // Each data byte is handed on the moment it arrives.
                assert_eq!(handed, body.len());
            }
        }
        // The last chunk ends it.
        let mut ended = wire.to_vec();
        ended.extend_from_slice(b"0\r\n\r\n");
        for step in [1, 7, ended.len()] {
            let (_, _, body, done, _) = stream(&ended, step);
            assert!(done, "step {step}");
            assert_eq!(body, b": hello\n\nevent: m\ndata: {}\n\n");
        }
    }

    #[test]
    fn streaming_reads_every_framing_as_the_whole_answer_does() {
        for wire in [
            &b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\n\r\nno stream"[..],
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4;x=y\r\nWiki\r\n5\r\npedia\r\n0\r\nA: b\r\n\r\n",
        ] {
            let mut whole = ResponseDecoder::new(1024);
            whole.push(wire);
            let answer = whole.decode().unwrap().unwrap();
            for step in 1..=wire.len() {
                let (status, _, body, done, _) = stream(wire, step);
                assert_eq!((status, body.as_slice(), done), (answer.status, &answer.body[..], true));
            }
        }
    }

    #[test]
    fn a_body_is_read_only_after_its_head_and_a_head_only_once() {
        let mut decoder = ResponseDecoder::new(1024);
        assert!(decoder.decode_body(&mut |_| {}).is_err());
        decoder.push(b"HTTP/1.1 200 OK\r\n\r\nuntil the close");
        let head = decoder.decode_head().unwrap().unwrap();
        assert!(!head.keep_alive, "a body delimited by the close");
        assert!(decoder.decode_head().is_err());
        let mut body = Vec::new();
        assert!(
            !decoder
                .decode_body(&mut |b| body.extend_from_slice(b))
                .unwrap()
        );
        assert_eq!(body, b"until the close");
        let mut refused = ResponseDecoder::new(1024);
        refused.push(b"SSH-2.0-OpenSSH_9.6\r\n");
        assert_eq!(refused.decode_head().unwrap_err(), "not an HTTP/1.x answer");
    }
}
