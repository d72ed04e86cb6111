//! The oracle of the `trace_http` fuzz target: client and server streams through the [`Tracer`](crate::trace::Tracer).

use super::{Input, trace_feed};
use crate::codec::http1::{Response, ResponseDecoder, ResponseHead};
use crate::trace::activity::ActivityEvent;
use crate::trace::http::HttpConfig;
use crate::trace::{TraceConfig, TraceOutput};

/// `trace_http`: arbitrary client and server streams through the [`Tracer`].
///
/// Input: a flags byte (small caps, `Accept-Encoding` rewriting, host), a chunking seed, two
/// bytes giving the client stream's length, then the client and server streams.
///
/// Oracles: splitting the streams differently never changes the events or the forwarded bytes;
/// every `RequestSent` gets exactly one event; without rewriting nothing is forwarded by the
/// tracer, and with it, an untraced or tunnelled connection's bytes pass unchanged after the
/// point of failure; buffers stay within the caps; bodies respect the body cap; events are
/// bounded in size and survive a JSON round trip.
pub fn trace_http(data: &[u8]) {
    let mut input = Input::new(data);
    let flags = input.byte();
    let seed = u32::from(input.byte()) | 1;
    let client_len = usize::from(u16::from_le_bytes([input.byte(), input.byte()]));
    let rest = &data[input.pos.min(data.len())..];
    let (client, server) = rest.split_at(client_len.min(rest.len()));
    let small = flags & 1 == 1;
    let config = TraceConfig {
        http: HttpConfig {
            max_head_bytes: if small { 96 } else { 64 * 1024 },
            max_body_bytes: if small { 64 } else { 1 << 20 },
            max_pipelined: if small { 3 } else { 64 },
            rewrite_accept_encoding: flags & 2 == 2,
        },
        preview_chars: if small { 32 } else { 4096 },
    };
    let host = [
        "api.anthropic.com:443",
        "api.openai.com:443",
        "example.com:443",
    ][usize::from(flags >> 2) % 3];
    // The decoders straight on the server bytes and on what follows its first blank line.
    let after_head = server
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(&server[..0], |i| &server[i + 4..]);
    for body in [server, after_head] {
        for response in [
            crate::trace::anthropic::response(body, 200),
            crate::trace::openai::response(body, 200),
        ] {
            serde_json::to_string(&response).expect("responses serialize");
        }
    }
    // A client's response decoder on the server bytes: the same answers however they arrive.
    let max_head = config.http.max_head_bytes;
    let step = usize::try_from(seed % 61).unwrap_or(1).max(1);
    assert_eq!(
        decode_responses(server, server.len().max(1), max_head),
        decode_responses(server, step, max_head),
        "chunking changed the decoded responses"
    );
    assert_eq!(
        stream_responses(server, step, max_head),
        decode_responses(server, step, max_head),
        "reading bodies as they arrive changed the decoded responses"
    );
    let mut buffered = 0;
    let (whole, whole_fwd) = trace_feed(&config, host, client, server, 0, &mut buffered);
    let mut buffered_split = 0;
    let (split, split_fwd) = trace_feed(&config, host, client, server, seed, &mut buffered_split);
    assert_eq!(split, whole, "chunking changed the outputs");
    assert_eq!(split_fwd, whole_fwd, "chunking changed the forwarded bytes");
    if !config.http.rewrite_accept_encoding {
        assert!(whole_fwd.is_empty(), "forwarded without rewriting");
    }
    let bound = 2 * (config.http.max_head_bytes + 97)
        + 2 * config.http.max_pipelined * config.http.max_body_bytes;
    assert!(buffered_split <= bound, "buffers exceed their caps");

    let sent = whole
        .iter()
        .filter(|o| matches!(o, TraceOutput::RequestSent { .. }))
        .count();
    let mut events = 0;
    let mut event_bytes = 0;
    for output in &whole {
        if let TraceOutput::Event { event, .. } = output {
            events += 1;
            let json = serde_json::to_string(event).expect("events serialize");
            event_bytes += json.len();
            let back: ActivityEvent = serde_json::from_str(&json).expect("events deserialize");
            assert_eq!(
                serde_json::to_string(&back).expect("serialize"),
                json,
                "events round trip"
            );
        }
    }
    assert_eq!(sent, events, "one event per request sent");
    assert!(
        event_bytes <= 16 * data.len() + 4096 * (events + 1),
        "events are out of proportion to the input"
    );
}

/// [`decode_responses`] read the streaming way: each head with `decode_head`, then its body as
/// `decode_body` hands it on.
fn stream_responses(server: &[u8], step: usize, max_head: usize) -> Vec<Result<Response, String>> {
    let mut decoder = ResponseDecoder::new(max_head);
    let mut out = Vec::new();
    let mut head: Option<ResponseHead> = None;
    let mut body = Vec::new();
    for piece in server.chunks(step) {
        decoder.push(piece);
        loop {
            if head.is_none() {
                match decoder.decode_head() {
                    Ok(Some(started)) => head = Some(started),
                    Ok(None) => break,
                    Err(why) => {
                        out.push(Err(why));
                        return out;
                    }
                }
            }
            match decoder.decode_body(&mut |bytes| body.extend_from_slice(bytes)) {
                Ok(true) => {
                    let done = head.take().expect("a head was read");
                    out.push(Ok(Response {
                        status: done.status,
                        body: std::mem::take(&mut body),
                        keep_alive: done.keep_alive,
                    }));
                }
                Ok(false) => break,
                Err(why) => {
                    out.push(Err(why));
                    return out;
                }
            }
        }
    }
    match decoder.decode_eof() {
        // A body that ran until the close: what was handed on, then what was left.
        Ok(Some(last)) => {
            body.extend_from_slice(&last.body);
            out.push(Ok(Response { body, ..last }));
        }
        Ok(None) => {}
        Err(why) => out.push(Err(why)),
    }
    out
}

/// Every response [`ResponseDecoder`] reads from `server` pushed `step` bytes at a time and then
/// closed, up to the first error.
fn decode_responses(server: &[u8], step: usize, max_head: usize) -> Vec<Result<Response, String>> {
    let mut decoder = ResponseDecoder::new(max_head);
    let mut out = Vec::new();
    for piece in server.chunks(step) {
        decoder.push(piece);
        loop {
            match decoder.decode() {
                Ok(Some(response)) => out.push(Ok(response)),
                Ok(None) => break,
                Err(why) => {
                    out.push(Err(why));
                    return out;
                }
            }
        }
        assert!(
            decoder.surplus().len() <= max_head + 2 * step,
            "the decoder holds more than a head"
        );
    }
    match decoder.decode_eof() {
        Ok(Some(response)) => out.push(Ok(response)),
        Ok(None) => {}
        Err(why) => out.push(Err(why)),
    }
    out
}
