//! Traced exchanges shared by the trace oracles and the trace tests: the secrets corpus, requests and responses carrying a secret, and feeding a [`Tracer`](crate::trace::Tracer) in chunks.

use super::MAX_POLLS;
use crate::trace::http::ProxyConnId;
use crate::trace::{TraceConfig, TraceOutput, Tracer};

/// The secrets corpus (`protocol/src/trace/secrets.txt`): `(context, secret)` pairs.
pub fn trace_secrets() -> Vec<(&'static str, &'static str)> {
    include_str!("../trace/secrets.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_once('\t'))
        .collect()
}

/// A request carrying `secret` in its `context` (see `secrets.txt`); `variant` picks where a
/// `text` secret goes (message text, tool input, system prompt, plain-text body).
pub fn secret_exchange(context: &str, secret: &str, variant: u8) -> Vec<u8> {
    let mut target = "/v1/messages?beta=true".to_owned();
    let mut headers = String::new();
    let text = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let body = match context.split_once(':') {
        Some(("header", name)) => {
            headers.push_str(&format!("{name}: {secret}\r\n"));
            r#"{"model":"m","messages":[]}"#.to_owned()
        }
        Some(("query", name)) => {
            target = format!("/v1/messages?{name}={secret}&beta=true");
            r#"{"model":"m","messages":[]}"#.to_owned()
        }
        Some(("json", key)) => format!(
            r#"{{"model":"m","{key}":{s},"messages":[{{"role":"user","content":[{{"type":"tool_use","id":"t","name":"n","input":{{"{key}":{s}}}}}]}}],"input":[{{"type":"function_call","call_id":"c","name":"n","arguments":{args}}}]}}"#,
            s = text(secret),
            args = text(&format!(r#"{{"{key}":{}}}"#, text(secret))),
        ),
        _ => {
            headers.push_str(&format!("x-note: see {secret} here\r\n"));
            target = format!("/v1/messages?beta=true&s={secret}");
            let said = text(&format!("my key is {secret}, keep it"));
            match variant % 4 {
                0 => format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":{said}}}],"input":{said}}}"#
                ),
                1 => format!(
                    r#"{{"model":"m","messages":[{{"role":"assistant","content":[{{"type":"tool_use","id":"t","name":"Bash","input":{{"command":{said}}}}}]}},{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t","content":{said}}}]}}]}}"#
                ),
                2 => format!(
                    r#"{{"model":"m","system":[{{"type":"text","text":{said}}}],"instructions":{said},"tools":[{{"name":"t","description":{said},"input_schema":{{}}}}],"messages":[]}}"#
                ),
                _ => format!("plain text body: {secret} end"),
            }
        }
    };
    format!(
        "POST {target} HTTP/1.1\r\nHost: api.example\r\n{headers}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A streamed response carrying `secret` in its `context`, split across two deltas for text.
pub fn secret_response(context: &str, secret: &str) -> Vec<u8> {
    let text = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut headers = String::new();
    let (first, second) = secret.split_at(secret.len() / 2);
    let mut stream = format!(
        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"content\":[],\"usage\":{{\"input_tokens\":1}}}}}}\n\n\
         data: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
         data: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":{}}}}}\n\n\
         data: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":{}}}}}\n\n\
         data: {{\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{{\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}}}\n\n\
         data: {{\"type\":\"response.output_text.delta\",\"output_index\":0,\"content_index\":0,\"delta\":{}}}\n\n\
         data: {{\"type\":\"response.output_text.delta\",\"output_index\":0,\"content_index\":0,\"delta\":{}}}\n\n",
        text(&format!("key: {first}")),
        text(&format!("{second} ok")),
        text(&format!("key: {first}")),
        text(&format!("{second} ok")),
    );
    match context.split_once(':') {
        Some(("header", name)) => headers.push_str(&format!("{name}: {secret}\r\n")),
        Some(("json", key)) => stream.push_str(&format!(
            "data: {{\"type\":\"error\",\"error\":{{\"type\":\"x\",\"message\":{m}}},\"{key}\":{s}}}\n\n",
            m = text(&format!("bad {key}={secret}")),
            s = text(secret),
        )),
        _ => {}
    }
    let mut out = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n{headers}transfer-encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for part in stream.as_bytes().chunks(50) {
        out.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// Feeds `client` then `server` to a [`Tracer`] in chunks whose sizes come from `seed` (one
/// chunk each when `seed` is 0); returns the outputs with the forwarded bytes concatenated.
pub(super) fn trace_feed(
    config: &TraceConfig,
    host: &str,
    client: &[u8],
    server: &[u8],
    seed: u32,
    max_buffered: &mut usize,
) -> (Vec<TraceOutput>, Vec<u8>) {
    let conn = ProxyConnId(7);
    let mut tracer = Tracer::new(config.clone());
    tracer.handle_open(conn, host, 0);
    let mut outputs = Vec::new();
    let mut forwarded = Vec::new();
    let mut drain = |tracer: &mut Tracer| {
        let mut polls = 0;
        while let Some(output) = tracer.poll_output() {
            polls += 1;
            assert!(polls <= MAX_POLLS, "poll_output does not terminate");
            match output {
                TraceOutput::Transmit { bytes, .. } => forwarded.extend_from_slice(&bytes),
                other => outputs.push(other),
            }
        }
    };
    let mut seed = seed;
    let mut chunks = |bytes: &'_ [u8]| -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = if seed == 0 {
                bytes.len()
            } else {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                (seed as usize % 97).clamp(1, bytes.len() - at)
            };
            out.push((at, at + len.min(bytes.len() - at)));
            at += len.min(bytes.len() - at);
        }
        out
    };
    for (a, b) in chunks(client) {
        tracer.handle_client_bytes(conn, &client[a..b], 1);
        *max_buffered = (*max_buffered).max(tracer.assembler().buffered_bytes());
        drain(&mut tracer);
    }
    for (a, b) in chunks(server) {
        tracer.handle_server_bytes(conn, &server[a..b], 2);
        *max_buffered = (*max_buffered).max(tracer.assembler().buffered_bytes());
        drain(&mut tracer);
    }
    tracer.handle_closed(conn, 3);
    drain(&mut tracer);
    assert_eq!(tracer.assembler().open_connections(), 0);
    (outputs, forwarded)
}
