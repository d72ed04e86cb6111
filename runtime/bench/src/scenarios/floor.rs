//! The floors the end-to-end scenarios measure against, in the same run: processes that move the
//! same bytes as ac7 does and do nothing else.
//!
//! - `ac7-bench __echo [--socket PATH]`: a std-only, blocking line echo on its stdin/stdout (a
//!   pipe, like the agent's pipe to its bridge) or on the one connection it accepts on a Unix
//!   socket (like the bridge's socket to its runner). Each line in is answered by one JSON-RPC
//!   result line of the current reply size; a line starting with `#` sets that size (no answer).
//!   All answers to the lines one read returned go out in one write, as the bridge writes them.
//! - `ac7-bench __floor-server`: a minimal multi-threaded tokio HTTP/1.1 server (the broker's
//!   runtime kind) on a free loopback port, printing `listening <addr>`. A `POST` is answered
//!   `200` with a small JSON body after its body was read; the body of a `POST /push` also goes
//!   to every held connection as `data: <body>\n\n`. A `GET` is answered with `200` headers and
//!   held open to receive those writes. No parsing beyond the request head, no storage, no
//!   encoding.
//! - `ac7-bench __relay http ADDR SIZE` and `__relay stream ADDR SIZE MARKER`: a std-only,
//!   blocking process between the agent's pipe and that server, doing nothing but passing bytes
//!   on, so that a call's path has the same processes and hops as through ac7 (agent, runner,
//!   broker). `http`: each line read on stdin is sent as the body of a `POST /floor` on one
//!   kept-alive connection; once the answer is read, a JSON-RPC result line of `SIZE` bytes goes to
//!   stdout. `stream`: holds a `GET` open, prints `ready` once its headers are in, then writes a
//!   line of `SIZE` bytes to stdout for each event that contains `MARKER`.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The hidden argument of the echo.
pub(crate) const ECHO_ARG: &str = "__echo";
/// The hidden argument of the do-nothing HTTP and fan-out server.
pub(crate) const SERVER_ARG: &str = "__floor-server";
/// The hidden argument of the relay.
pub(crate) const RELAY_ARG: &str = "__relay";

/// Runs the echo (`args`: empty for stdin/stdout, or `--socket PATH`).
pub(crate) fn echo_main(args: &[String]) -> anyhow::Result<i32> {
    match args {
        [] => {
            let stdin = std::io::stdin().lock();
            // Unbuffered: each answer batch is one write(2), as a relay writes.
            let stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
            serve(stdin, stdout)?;
        }
        [flag, path] if flag == "--socket" => {
            let path = PathBuf::from(path);
            let listener = UnixListener::bind(&path)?;
            // Tell the parent it may connect now.
            let mut out = std::io::stdout().lock();
            out.write_all(b"ready\n")?;
            out.flush()?;
            drop(out);
            let (stream, _) = listener.accept()?;
            let _ = std::fs::remove_file(&path);
            serve(stream.try_clone()?, stream)?;
        }
        _ => anyhow::bail!("usage: ac7-bench {ECHO_ARG} [--socket PATH]"),
    }
    Ok(0)
}

/// The echo loop: until EOF.
fn serve(input: impl Read, mut output: impl Write) -> anyhow::Result<()> {
    let mut input = BufReader::with_capacity(64 * 1024, input);
    let mut reply = reply_line(64);
    let mut line = Vec::new();
    let mut out = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        if let Some(size) = line.strip_prefix(b"#") {
            let size: usize = std::str::from_utf8(size)?.trim().parse()?;
            reply = reply_line(size);
        } else {
            out.extend_from_slice(&reply);
        }
        // Answer everything read so far in one write once no complete line is left.
        if !input.buffer().contains(&b'\n') && !out.is_empty() {
            output.write_all(&out)?;
            out.clear();
        }
    }
}

/// A JSON-RPC result line of exactly `size` bytes (newline included; at least the minimum).
pub(crate) fn reply_line(size: usize) -> Vec<u8> {
    let head = br#"{"jsonrpc":"2.0","id":0,"result":""#;
    let tail = b"\"}\n";
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut line = Vec::with_capacity(head.len() + pad + tail.len());
    line.extend_from_slice(head);
    line.resize(head.len() + pad, b'x');
    line.extend_from_slice(tail);
    line
}

/// Runs the relay (`args`: `http ADDR SIZE` or `stream ADDR SIZE MARKER`) until its stdin or
/// its connection closes.
pub(crate) fn relay_main(args: &[String]) -> anyhow::Result<i32> {
    // Unbuffered: each line out is one write(2).
    let mut stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    match args {
        [mode, addr, size] if mode == "http" => {
            let reply = reply_line(size.parse()?);
            let mut http = super::e2e::Http::connect(addr)?;
            let mut stdin = BufReader::with_capacity(64 * 1024, std::io::stdin().lock());
            let mut line = Vec::new();
            loop {
                line.clear();
                if stdin.read_until(b'\n', &mut line)? == 0 {
                    return Ok(0);
                }
                let body = line.strip_suffix(b"\n").unwrap_or(&line);
                let status = http.post("/floor", "-", body)?;
                anyhow::ensure!(status == 200, "the floor server answered {status}");
                stdout.write_all(&reply)?;
            }
        }
        [mode, addr, size, marker] if mode == "stream" => {
            let mut stream = std::net::TcpStream::connect(addr)?;
            stream.set_nodelay(true)?;
            stream.write_all(format!("GET /stream HTTP/1.1\r\nhost: {addr}\r\n\r\n").as_bytes())?;
            pass_events(
                stream,
                marker.as_bytes(),
                &reply_line(size.parse()?),
                stdout,
            )?;
            Ok(0)
        }
        _ => anyhow::bail!(
            "usage: ac7-bench {RELAY_ARG} http ADDR SIZE | {RELAY_ARG} stream ADDR SIZE MARKER"
        ),
    }
}

/// The stream relay's loop, until `stream` ends: skips the response head, writes `ready`, then
/// writes `reply` to `out` for each event (up to a blank line) that contains `marker`.
fn pass_events(
    mut stream: impl Read,
    marker: &[u8],
    reply: &[u8],
    mut out: impl Write,
) -> anyhow::Result<()> {
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut head_done = false;
    loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if !head_done {
            let Some(end) = find(&buf, b"\r\n\r\n") else {
                continue;
            };
            buf.drain(..end + 4);
            head_done = true;
            out.write_all(b"ready\n")?;
        }
        while let Some(end) = find(&buf, b"\n\n") {
            if find(&buf[..end], marker).is_some() {
                out.write_all(reply)?;
            }
            buf.drain(..end + 2);
        }
    }
}

/// Runs the do-nothing server until killed.
#[allow(clippy::print_stdout)]
pub(crate) fn server_main() -> anyhow::Result<i32> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("listening {}", listener.local_addr()?);
        let (fanout, _) = tokio::sync::broadcast::channel::<axum::body::Bytes>(1024);
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            tokio::spawn(connection(stream, fanout.clone()));
        }
    })
}

async fn connection(
    mut stream: tokio::net::TcpStream,
    fanout: tokio::sync::broadcast::Sender<axum::body::Bytes>,
) -> anyhow::Result<()> {
    let mut buf = Vec::with_capacity(8 * 1024);
    loop {
        let Some((head_len, content_length, is_get, fans_out)) =
            read_head(&mut stream, &mut buf).await?
        else {
            return Ok(());
        };
        if is_get {
            buf.clear();
            let mut rx = fanout.subscribe();
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
                .await?;
            loop {
                match rx.recv().await {
                    Ok(bytes) => stream.write_all(&bytes).await?,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return Ok(()),
                }
            }
        }
        while buf.len() < head_len + content_length {
            if stream.read_buf(&mut buf).await? == 0 {
                return Ok(());
            }
        }
        if fans_out {
            let body = &buf[head_len..head_len + content_length];
            let mut event = Vec::with_capacity(body.len() + 8);
            event.extend_from_slice(b"data: ");
            event.extend_from_slice(body);
            event.extend_from_slice(b"\n\n");
            let _ = fanout.send(axum::body::Bytes::from(event));
        }
        stream
            .write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}",
            )
            .await?;
        buf.drain(..head_len + content_length);
    }
}

/// Reads a request head into `buf`: its length, its `content-length`, whether it is a GET and
/// whether it is a `POST /push`; `None` at EOF.
async fn read_head(
    stream: &mut tokio::net::TcpStream,
    buf: &mut Vec<u8>,
) -> anyhow::Result<Option<(usize, usize, bool, bool)>> {
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).context("request head")?;
            return Ok(Some((
                end + 4,
                content_length(head),
                head.starts_with("GET "),
                head.starts_with("POST /push "),
            )));
        }
        if stream.read_buf(buf).await? == 0 {
            return Ok(None);
        }
    }
}

/// The first position of `needle` in `haystack`.
pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

/// The `content-length` of an HTTP head (0 when absent).
pub(crate) fn content_length(head: &str) -> usize {
    head.split("\r\n")
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_lines_have_the_asked_size_and_are_json() {
        for size in [64, 300, 8_000] {
            let line = reply_line(size);
            assert_eq!(line.len(), size);
            let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
            assert!(v["result"].is_string());
        }
    }

    #[test]
    fn echo_answers_each_line_and_takes_sizes() {
        let input = b"#100\n{\"a\":1}\n{\"a\":2}\n#70\nx\n".to_vec();
        let mut out = Vec::new();
        serve(&input[..], &mut out).unwrap();
        assert_eq!(out.len(), 100 + 100 + 70);
    }

    #[test]
    fn the_stream_relay_passes_on_only_marked_events() {
        let input = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n\
            data: {\"body\":\"e2e-shape-1.\"}\n\ndata: {\"body\":\"e2e-push-1.\"}\n\n\
            data: {\"body\":\"e2e-shape-2.\"}\n\ndata: {\"body\":\"e2e-sh";
        let mut out = Vec::new();
        pass_events(&input[..], b"e2e-shape-", &reply_line(80), &mut out).unwrap();
        assert_eq!(out.len(), "ready\n".len() + 2 * 80);
        assert!(out.starts_with(b"ready\n"));
    }

    #[test]
    fn content_length_is_read_case_insensitively() {
        assert_eq!(
            content_length("POST / HTTP/1.1\r\nContent-Length: 42\r\nHost: x"),
            42
        );
        assert_eq!(content_length("GET / HTTP/1.1\r\nHost: x"), 0);
    }
}
