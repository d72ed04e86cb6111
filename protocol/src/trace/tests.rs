use proptest::prelude::*;
use serde_json::{Value, json};

use super::activity::*;
use super::http::*;
use super::*;
use crate::test_support::{proptest_config, snapshots};

const C: ProxyConnId = ProxyConnId(1);

fn run(config: HttpConfig, steps: &[(&str, &[u8])]) -> (Vec<HttpOutput>, HttpAssembler) {
    let mut a = HttpAssembler::new(config);
    a.handle_open(C, "api.example.com:443", 0);
    let mut out = Vec::new();
    for (i, (side, bytes)) in steps.iter().enumerate() {
        let now = 1000 + i as i64;
        match *side {
            "c" => a.handle_client_bytes(C, bytes, now),
            "s" => a.handle_server_bytes(C, bytes, now),
            "eof" => a.handle_server_eof(C, now),
            "close" => a.handle_closed(C, now),
            other => panic!("{other}"),
        }
        out.extend(std::iter::from_fn(|| a.poll_output()));
    }
    (out, a)
}

fn exchanges(out: &[HttpOutput]) -> Vec<&Exchange> {
    out.iter()
        .filter_map(|o| match o {
            HttpOutput::Exchange(e) => Some(&**e),
            _ => None,
        })
        .collect()
}

fn rewriting() -> HttpConfig {
    HttpConfig {
        rewrite_accept_encoding: true,
        ..HttpConfig::default()
    }
}

/// The bytes forwarded to the server, concatenated.
fn forwarded(out: &[HttpOutput]) -> Vec<u8> {
    out.iter()
        .filter_map(|o| match o {
            HttpOutput::Transmit { bytes, .. } => Some(bytes.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn untraced(out: &[HttpOutput]) -> Vec<&str> {
    out.iter()
        .filter_map(|o| match o {
            HttpOutput::Untraced { reason, .. } => Some(reason.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn content_length_and_chunked_bodies_with_keep_alive() {
    let (out, a) = run(
        HttpConfig::default(),
        &[
            (
                "c",
                b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhel",
            ),
            ("c", b"lo"),
            (
                "s",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3;ext=1\r\nabc\r\n",
            ),
            ("s", b"2\r\nde\r\n0\r\nTrailer: x\r\n\r\n"),
            ("c", b"GET /b HTTP/1.1\r\nHost: h\r\n\r\n"),
            (
                "s",
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno",
            ),
        ],
    );
    let ex = exchanges(&out);
    assert_eq!(ex.len(), 2);
    assert_eq!(ex[0].request.body.bytes, b"hello");
    assert_eq!(
        ex[0].started_at, 1001,
        "the chunk that completed the request"
    );
    let r = ex[0].response.as_ref().expect("response");
    assert_eq!(
        (r.status, r.body.bytes.as_slice(), r.complete),
        (200, &b"abcde"[..], true)
    );
    assert_eq!(ex[0].ended_at, 1003);
    assert_eq!(ex[1].request.target, "/b");
    assert_eq!(ex[1].response.as_ref().map(|r| r.status), Some(404));
    assert!(untraced(&out).is_empty());
    assert_eq!(a.buffered_bytes(), 0);
    assert_eq!(
        out.iter()
            .filter(|o| matches!(o, HttpOutput::RequestSent { .. }))
            .count(),
        2
    );
}

#[test]
fn pipelined_requests_pair_in_order_and_no_body_rules() {
    let (out, _) = run(
        HttpConfig::default(),
        &[
            (
                "c",
                b"HEAD /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\n\r\nGET /3 HTTP/1.1\r\n\r\nPOST /4 HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            ),
            (
                "s",
                b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nHTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 304 Not Modified\r\nContent-Length: 3\r\n\r\n",
            ),
            ("s", b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil "),
            ("s", b"close"),
            ("eof", b""),
        ],
    );
    let ex = exchanges(&out);
    let got: Vec<_> = ex
        .iter()
        .map(|e| {
            let r = e.response.as_ref().expect("response");
            (
                e.request.target.as_str(),
                r.status,
                String::from_utf8_lossy(&r.body.bytes).into_owned(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("/1", 200, String::new()),
            ("/2", 204, String::new()),
            ("/3", 304, String::new()),
            ("/4", 200, "until close".to_owned()),
        ],
        "the 100 Continue is skipped, not paired"
    );
}

#[test]
fn close_flushes_waiting_requests_and_interrupted_responses() {
    let (out, a) = run(
        HttpConfig::default(),
        &[
            ("c", b"GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\n\r\n"),
            ("s", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\npart"),
            ("close", b""),
        ],
    );
    let ex = exchanges(&out);
    assert_eq!(ex.len(), 2);
    let r = ex[0].response.as_ref().expect("partial response kept");
    assert!(!r.complete);
    assert_eq!(r.body.bytes, b"part");
    assert!(ex[1].response.is_none());
    assert_eq!(ex[1].ended_at, 1002);
    assert_eq!(a.open_connections(), 0);
}

#[test]
fn tunnels_are_never_parsed() {
    let config = rewriting();
    let upgrade = b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
    let (out, _) = run(
        config.clone(),
        &[
            ("c", upgrade),
            ("c", b"\x81\x05hello not http"),
            (
                "s",
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x02hi",
            ),
            ("c", b"more frames"),
            ("s", b"garbage that is not HTTP\r\n\r\n"),
        ],
    );
    let ex = exchanges(&out);
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0].response.as_ref().map(|r| r.status), Some(101));
    assert!(untraced(&out).is_empty());
    let forwarded = forwarded(&out);
    let mut expected = upgrade.to_vec();
    expected.splice(
        expected.len() - 2..expected.len() - 2,
        b"Accept-Encoding: identity\r\n".iter().copied(),
    );
    expected.extend_from_slice(b"\x81\x05hello not httpmore frames");
    assert_eq!(
        forwarded, expected,
        "held bytes released at the 101, in order"
    );

    // An upgrade refused: the held request is parsed after all.
    let (out, _) = run(
        HttpConfig::default(),
        &[
            ("c", upgrade),
            ("c", b"GET /next HTTP/1.1\r\n\r\n"),
            (
                "s",
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
            ),
            ("s", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
        ],
    );
    let targets: Vec<_> = exchanges(&out)
        .iter()
        .map(|e| e.request.target.clone())
        .collect();
    assert_eq!(targets, ["/ws", "/next"]);

    // CONNECT answered 200 inside a decrypted connection.
    let (out, _) = run(
        HttpConfig::default(),
        &[
            ("c", b"CONNECT inner:443 HTTP/1.1\r\n\r\n\x16\x03\x01"),
            (
                "s",
                b"HTTP/1.1 200 Connection Established\r\n\r\n\x16\x03\x03",
            ),
            ("c", b"GET / HTTP/1.1\r\n\r\n"),
        ],
    );
    assert_eq!(exchanges(&out).len(), 1);
    assert!(untraced(&out).is_empty());
}

#[test]
fn malformed_input_untraces_the_connection() {
    for (client, server, reason) in [
        (&b"GARBAGE\r\n\r\n"[..], &b""[..], "malformed request line"),
        (b"GET / HTTP/2.0\r\n\r\n", b"", "not HTTP/1.x"),
        (
            b"GET / HTTP/1.1\r\n folded\r\n\r\n",
            b"",
            "folded header line",
        ),
        (
            b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"",
            "invalid Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"",
            "conflicting",
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"",
            "does not end with chunked",
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"",
            "invalid chunk size",
        ),
        (
            b"",
            b"HTTP/1.1 200 OK\r\n\r\n",
            "response without a request",
        ),
        (
            b"GET / HTTP/1.1\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            "malformed status line",
        ),
        (
            b"GET / HTTP/1.1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 200 OK\r\n\r\n",
            "response without a request",
        ),
    ] {
        let config = rewriting();
        let (out, _) = run(
            config,
            &[
                ("c", client),
                ("s", server),
                ("c", b"after"),
                ("close", b""),
            ],
        );
        let reasons = untraced(&out);
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert!(reasons[0].contains(reason), "{} vs {reason}", reasons[0]);
        // Every request that was sent comes out exactly once.
        let sent = out
            .iter()
            .filter(|o| matches!(o, HttpOutput::RequestSent { .. }))
            .count();
        assert_eq!(sent, exchanges(&out).len());
        // The client's bytes still reach the server, in order, unchanged after the failure.
        let forwarded = forwarded(&out);
        assert!(forwarded.ends_with(b"after"));
    }
}

#[test]
fn caps_bound_memory_and_mark_truncation() {
    let config = HttpConfig {
        max_head_bytes: 64,
        max_body_bytes: 10,
        ..HttpConfig::default()
    };
    let (out, a) = run(
        config.clone(),
        &[
            ("c", b"POST / HTTP/1.1\r\nContent-Length: 25\r\n\r\n0123456789"),
            ("c", b"0123456789abcde"),
            ("s", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n14\r\n01234567890123456789\r\n0\r\n\r\n"),
        ],
    );
    let ex = exchanges(&out);
    assert_eq!(ex[0].request.body.bytes, b"0123456789");
    assert_eq!(
        (ex[0].request.body.len, ex[0].request.body.truncated),
        (25, true)
    );
    let r = ex[0].response.as_ref().expect("response");
    assert_eq!((r.body.len, r.body.truncated), (20, true));
    assert_eq!(a.buffered_bytes(), 0);

    let (out, a) = run(
        config,
        &[("c", b"GET / HTTP/1.1\r\nX: "), ("c", &[b'a'; 100])],
    );
    assert_eq!(untraced(&out), ["request head exceeds 64 bytes"]);
    assert_eq!(a.buffered_bytes(), 0);
}

/// The host's allowance (its share of a total cap) cuts a body like the per-message cap: what is
/// kept is a prefix, nothing is kept after the cut even when room comes back, the bytes still
/// pass, and `kept_body_bytes` counts exactly what is held until it is drained.
#[test]
fn body_allowance_truncates_and_keeps_a_prefix() {
    let mut a = HttpAssembler::new(rewriting());
    a.handle_open(C, "api.example.com", 0);
    a.set_body_allowance(C, Some(4));
    a.handle_client_bytes(
        C,
        b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456",
        1,
    );
    assert_eq!(a.kept_body_bytes(), 4);
    // Room again: the body stays cut (no gap), the rest is only counted.
    a.set_body_allowance(C, Some(100));
    a.handle_client_bytes(C, b"789", 2);
    assert_eq!(a.kept_body_bytes(), 4);
    a.set_body_allowance(C, Some(3));
    a.handle_server_bytes(C, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", 3);
    assert_eq!(a.kept_body_bytes(), 6);
    a.set_body_allowance(C, Some(1));
    a.handle_server_bytes(C, b"cde", 4);
    // Finished but not drained: still held.
    assert_eq!(a.kept_body_bytes(), 7);
    let out: Vec<_> = std::iter::from_fn(|| a.poll_output()).collect();
    assert_eq!(
        forwarded(&out),
        b"POST / HTTP/1.1\r\nContent-Length: 10\r\nAccept-Encoding: identity\r\n\r\n0123456789"
    );
    let ex = exchanges(&out);
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0].body_bytes(), 7);
    let body = &ex[0].request.body;
    assert_eq!(
        (&body.bytes[..], body.len, body.truncated),
        (&b"0123"[..], 10, true)
    );
    let r = &ex[0].response.as_ref().expect("response").body;
    assert_eq!((&r.bytes[..], r.len, r.truncated), (&b"abc"[..], 5, true));
    assert_eq!(a.kept_body_bytes(), 0);
    // Without an allowance, only the per-message cap applies.
    a.set_body_allowance(C, None);
    a.handle_client_bytes(C, b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyz", 5);
    assert_eq!(a.kept_body_bytes(), 3);
}

#[test]
fn accept_encoding_is_rewritten_to_identity() {
    let config = rewriting();
    let (out, _) = run(
        config,
        &[
            ("c", b"POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\naccept-encoding: gzip, br\r\nContent-Length: 2\r\n\r\n{}"),
            ("c", b"GET / HTTP/1.1\r\n\r\n"),
        ],
    );
    let forwarded = forwarded(&out);
    assert_eq!(
        String::from_utf8_lossy(&forwarded),
        "POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\naccept-encoding: identity\r\nContent-Length: 2\r\n\r\n{}GET / HTTP/1.1\r\nAccept-Encoding: identity\r\n\r\n"
    );
}

// ---- decoding -------------------------------------------------------------------------------

const ANTHROPIC_REQUEST: &str = r#"{"model":"claude-sonnet-4-5","max_tokens":32000,"temperature":1,
 "system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}},{"type":"text","text":"Objective obj-7 is open."}],
 "messages":[{"role":"user","content":"list files; my key is sk-ant-api03-ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"},
  {"role":"assistant","content":[{"type":"thinking","thinking":"plan","signature":"sig"},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}]},
  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"a.txt\nb.txt","is_error":false},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},{"type":"document","source":{}}]}],
 "tools":[{"name":"Bash","description":"Run a command","input_schema":{"type":"object","properties":{"command":{"type":"string"}}}},{"type":"web_search_20250305","name":"web_search"}],
 "stream":true}"#;

const ANTHROPIC_STREAM: &str = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":2000,\"output_tokens\":1}}}\r\n\r\n\
event: ping\r\ndata: {\"type\":\"ping\"}\r\n\r\n\
event: content_block_start\r\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\r\n\r\n\
event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"The user wants \"}}\r\n\r\n\
event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"a listing.\"}}\r\n\r\n\
event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"EqQB\"}}\r\n\r\n\
event: content_block_stop\r\ndata: {\"type\":\"content_block_stop\",\"index\":0}\r\n\r\n\
event: content_block_start\r\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\r\n\r\n\
event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Listing now\"}}\r\n\r\n\
event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\" with sk-ant-api03-\"}}\r\n\r\n\
event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"SPLITACROSSDELTAS0123456789.\"}}\r\n\r\n\
event: content_block_stop\r\ndata: {\"type\":\"content_block_stop\",\"index\":1}\r\n\r\n\
event: content_block_start\r\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_2\",\"name\":\"Bash\",\"input\":{}}}\r\n\r\n\
event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"comm\"}}\r\n\r\n\
event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"and\\\": \\\"ls -la\\\"}\"}}\r\n\r\n\
event: content_block_stop\r\ndata: {\"type\":\"content_block_stop\",\"index\":2}\r\n\r\n\
event: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":87}}\r\n\r\n\
event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n";

fn chunked(body: &str, piece: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for part in body.as_bytes().chunks(piece) {
        out.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fn request_bytes(host: &str, path: &str, body: &str, extra: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nx-api-key: sk-ant-api03-HEADERSECRET0123456789abcdef\r\nauthorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.abc\r\n{extra}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn streamed_response(stream: &str) -> Vec<u8> {
    let mut r =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec();
    r.extend(chunked(stream, 97));
    r
}

/// Feeds one exchange (client bytes, then server bytes, in `piece`-sized reads) and returns
/// the events as JSON.
fn trace_events(host: &str, client: &[u8], server: &[u8], piece: usize) -> Vec<Value> {
    let mut t = Tracer::new(TraceConfig::default());
    t.handle_open(C, &format!("{host}:443"), 0);
    let mut now = 1_700_000_000_000;
    for part in client.chunks(piece) {
        now += 1;
        t.handle_client_bytes(C, part, now);
    }
    now += 1000;
    for part in server.chunks(piece) {
        now += 1;
        t.handle_server_bytes(C, part, now);
    }
    t.handle_closed(C, now + 5);
    std::iter::from_fn(|| t.poll_output())
        .filter_map(|o| match o {
            TraceOutput::Event { event, .. } => Some(serde_json::to_value(*event).expect("json")),
            _ => None,
        })
        .collect()
}

#[test]
fn anthropic_streamed_exchange_snapshot() {
    let client = request_bytes(
        "api.anthropic.com",
        "/v1/messages?beta=true",
        ANTHROPIC_REQUEST,
        "",
    );
    let server = streamed_response(ANTHROPIC_STREAM);
    let events = trace_events("api.anthropic.com", &client, &server, 4096);
    assert_eq!(events.len(), 1);
    let text = events[0].to_string();
    assert!(!text.contains("sk-ant-api03-"), "{text}");
    assert!(
        !text.contains("SPLITACROSS"),
        "a key split across deltas is redacted too"
    );
    // Any read size gives the same record (timestamps aside).
    let small = trace_events("api.anthropic.com", &client, &server, 7);
    let strip = |mut v: Value| {
        for key in ["ts", "duration"] {
            v[key] = Value::Null;
        }
        for key in ["startedAt", "endedAt"] {
            v["entry"][key] = Value::Null;
        }
        v
    };
    assert_eq!(strip(small[0].clone()), strip(events[0].clone()));
    let event: ActivityEvent = serde_json::from_value(events[0].clone()).expect("round trips");
    let ActivityEvent::LlmExchange { entry, .. } = &event else {
        panic!("an llm_exchange: {event:?}");
    };
    assert!(
        entry.request.context_text().contains("obj-7"),
        "array system kept"
    );
    snapshots(|| insta::assert_json_snapshot!("anthropic_streamed_exchange", events[0]));
}

#[test]
fn anthropic_plain_json_and_errors() {
    let client = request_bytes(
        "api.anthropic.com",
        "/v1/messages",
        r#"{"model":"m","system":"s","messages":[{"role":"user","content":"hi"}]}"#,
        "",
    );
    let body = r#"{"id":"msg","type":"message","role":"assistant","content":[{"type":"text","text":"hello"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":4,"cache_read_input_tokens":0}}"#;
    let server = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let events = trace_events("api.anthropic.com", &client, server.as_bytes(), 50);
    assert_eq!(
        events[0]["entry"]["response"],
        json!({"stopReason": "end_turn", "stopSequence": null,
            "messages": [{"role": "assistant", "content": [{"type": "text", "text": "hello"}]}],
            "usage": {"inputTokens": 3, "outputTokens": 4, "cacheCreationInputTokens": null, "cacheReadInputTokens": 0},
            "status": 200})
    );
    assert_eq!(events[0]["entry"]["request"]["system"], json!("s"));

    let body = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    let server = format!(
        "HTTP/1.1 529 Overloaded\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let events = trace_events("api.anthropic.com", &client, server.as_bytes(), 50);
    assert_eq!(
        events[0]["entry"]["response"]["error"],
        json!("overloaded_error: Overloaded")
    );
    assert_eq!(events[0]["entry"]["response"]["status"], json!(529));

    // An error event mid-stream is kept (the TypeScript runner drops it).
    let stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"content\":[],\"usage\":{\"input_tokens\":1}}}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"boom\"}}\n\n";
    let events = trace_events("api.anthropic.com", &client, &streamed_response(stream), 50);
    assert_eq!(events[0]["entry"]["response"]["stopReason"], json!("error"));
    assert_eq!(
        events[0]["entry"]["response"]["error"],
        json!("api_error: boom")
    );

    // `count_tokens` and other hosts are opaque.
    let client = request_bytes("api.anthropic.com", "/v1/messages/count_tokens", "{}", "");
    let events = trace_events(
        "api.anthropic.com",
        &client,
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}",
        50,
    );
    assert_eq!(events[0]["kind"], json!("opaque_http"));
    assert_eq!(
        events[0]["entry"]["requestHeaders"]["x-api-key"],
        json!("[REDACTED]")
    );
}

const RESPONSES_REQUEST: &str = r#"{"model":"gpt-5-codex","instructions":"You are Codex.","stream":true,"max_output_tokens":4096,
 "input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"sandbox: workspace-write"}]},
  {"type":"message","role":"user","content":[{"type":"input_text","text":"run the tests, token=tok_abcdef0123456789"}]},
  {"type":"reasoning","summary":[{"type":"summary_text","text":"Run cargo test."}],"encrypted_content":"gAAAA"},
  {"type":"function_call","call_id":"call_1","name":"shell","arguments":"{\"command\":[\"cargo\",\"test\"]}"},
  {"type":"function_call_output","call_id":"call_1","output":"ok: 12 passed"}],
 "tools":[{"type":"function","name":"shell","description":"Runs a command","parameters":{"type":"object"}},{"type":"web_search"}]}"#;

const RESPONSES_STREAM: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n\
event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"id\":\"rs_1\",\"type\":\"reasoning\",\"summary\":[]}}\n\n\
event: response.reasoning_summary_text.delta\ndata: {\"type\":\"response.reasoning_summary_text.delta\",\"output_index\":0,\"summary_index\":0,\"delta\":\"Tests pass.\"}\n\n\
event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":1,\"item\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}\n\n\
event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":1,\"content_index\":0,\"delta\":\"All 12 tests \"}\n\n\
event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":1,\"content_index\":0,\"delta\":\"passed.\"}\n\n\
event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":2,\"item\":{\"id\":\"fc_1\",\"type\":\"function_call\",\"call_id\":\"call_2\",\"name\":\"shell\",\"arguments\":\"\"}}\n\n\
event: response.function_call_arguments.delta\ndata: {\"type\":\"response.function_call_arguments.delta\",\"output_index\":2,\"delta\":\"{\\\"command\\\":[\\\"git\\\",\"}\n\n\
event: response.function_call_arguments.delta\ndata: {\"type\":\"response.function_call_arguments.delta\",\"output_index\":2,\"delta\":\"\\\"status\\\"]}\"}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[],\"usage\":{\"input_tokens\":5000,\"input_tokens_details\":{\"cached_tokens\":4096},\"output_tokens\":120,\"output_tokens_details\":{\"reasoning_tokens\":64},\"total_tokens\":5120}}}\n\n";

#[test]
fn responses_streamed_exchange_snapshot() {
    let client = request_bytes("api.openai.com", "/v1/responses", RESPONSES_REQUEST, "");
    let server = streamed_response(RESPONSES_STREAM);
    let events = trace_events("api.openai.com", &client, &server, 4096);
    assert_eq!(events.len(), 1);
    let text = events[0].to_string();
    assert!(!text.contains("tok_abcdef"), "{text}");
    let small = trace_events("api.openai.com", &client, &server, 5);
    assert_eq!(
        small[0]["entry"]["response"],
        events[0]["entry"]["response"]
    );
    snapshots(|| insta::assert_json_snapshot!("responses_streamed_exchange", events[0]));
}

#[test]
fn responses_plain_json_incomplete_and_failed() {
    let client = request_bytes(
        "chatgpt.com",
        "/backend-api/codex/responses",
        r#"{"model":"m","input":"hi"}"#,
        "",
    );
    for (body, stop, error) in [
        (
            r#"{"object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"par"}]}],"usage":{"input_tokens":10,"output_tokens":5}}"#,
            json!("max_tokens"),
            Value::Null,
        ),
        (
            r#"{"object":"response","status":"failed","error":{"code":"server_error","message":"oops"},"output":[]}"#,
            json!("error"),
            json!("server_error: oops"),
        ),
        (
            r#"{"error":{"message":"Incorrect API key provided: sk-proj-ABCDEFGHIJKLMNOPQRSTUV0123","type":"invalid_request_error","code":"invalid_api_key"}}"#,
            json!("error"),
            json!("invalid_api_key: Incorrect API key provided: [REDACTED]"),
        ),
    ] {
        let server = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let events = trace_events("chatgpt.com", &client, server.as_bytes(), 64);
        let response = &events[0]["entry"]["response"];
        assert_eq!(response["stopReason"], stop, "{body}");
        assert_eq!(response.get("error").cloned().unwrap_or(Value::Null), error);
        assert_eq!(events[0]["entry"]["api"], json!("openai_responses"));
    }
}

#[test]
fn opaque_exchanges_are_redacted_and_capped() {
    let body = format!(
        "{{\"refresh_token\":\"rt_secret_value\",\"note\":\"{}\"}}",
        "x".repeat(5000)
    );
    let client = format!(
        "POST /oauth/token?client_secret=cs_1234&x=1 HTTP/1.1\r\nHost: auth.openai.com\r\nCookie: a=b\r\nX-Trace: one\r\nx-trace: two\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let reply = r#"{"access_token":"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.sig","id_token":"idt","expires_in":3600}"#;
    let server = format!(
        "HTTP/1.1 200 OK\r\nSet-Cookie: s=1\r\ncontent-length: {}\r\n\r\n{reply}",
        reply.len()
    );
    let events = trace_events("auth.openai.com", client.as_bytes(), server.as_bytes(), 333);
    let entry = &events[0]["entry"];
    assert_eq!(
        entry["url"],
        json!("/oauth/token?client_secret=[REDACTED]&x=1")
    );
    assert_eq!(entry["requestHeaders"]["cookie"], json!("[REDACTED]"));
    assert_eq!(entry["requestHeaders"]["x-trace"], json!("one, two"));
    assert_eq!(entry["responseHeaders"]["set-cookie"], json!("[REDACTED]"));
    let preview = entry["requestBodyPreview"].as_str().expect("preview");
    assert!(
        preview.starts_with("{\"note\":\"xxx")
            || preview.contains("\"refresh_token\":\"[REDACTED]\"")
    );
    assert!(preview.ends_with("…[truncated]"));
    assert_eq!(
        preview.chars().count(),
        4096 + "…[truncated]".chars().count()
    );
    assert_eq!(
        entry["responseBodyPreview"],
        json!(r#"{"access_token":"[REDACTED]","id_token":"[REDACTED]","expires_in":3600}"#)
    );
    assert!(!events[0].to_string().contains("rt_secret_value"));
}

// ---- secrets corpus -------------------------------------------------------------------------

/// `(context, secret)` pairs from `secrets.txt`.
pub(crate) fn secrets() -> Vec<(&'static str, &'static str)> {
    include_str!("secrets.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_once('\t').expect("context<TAB>secret"))
        .collect()
}

#[test]
fn no_secret_from_the_corpus_survives() {
    let corpus = secrets();
    assert!(corpus.len() >= 25);
    for (context, secret) in &corpus {
        let client = crate::fuzzing::secret_exchange(context, secret, 0);
        for host in ["api.anthropic.com", "api.openai.com", "example.com"] {
            let server = crate::fuzzing::secret_response(context, secret);
            let events = trace_events(host, &client, &server, 61);
            assert_eq!(events.len(), 1);
            let text = events[0].to_string();
            assert!(
                !text.contains(secret),
                "{context} {secret} survived in {text}"
            );
        }
    }
}

proptest! {
    #![proptest_config(proptest_config("trace"))]

    /// Any split of the same streams gives the same events; a model of the exchanges says which.
    #[test]
    fn chunking_never_changes_the_exchanges(
        script in proptest::collection::vec((0..4u8, "[a-z]{0,8}", proptest::collection::vec("[ -~]{0,40}", 0..4), 100..600u16), 1..5),
        client_cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..16),
        server_cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..16),
        allowances in proptest::collection::vec(proptest::option::of(0..64usize), 1..34),
    ) {
        let mut client = Vec::new();
        let mut server = Vec::new();
        let mut expected = Vec::new();
        for (shape, path, parts, status) in &script {
            let status = if (100..200).contains(status) { 200 } else { *status };
            let body: String = parts.concat();
            match shape {
                0 => client.extend(format!("POST /{path} HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len()).bytes()),
                1 => {
                    client.extend(format!("POST /{path} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").bytes());
                    for p in parts.iter().filter(|p| !p.is_empty()) {
                        client.extend(format!("{:X}\r\n{p}\r\n", p.len()).bytes());
                    }
                    client.extend(b"0\r\n\r\n");
                }
                _ => client.extend(format!("GET /{path} HTTP/1.1\r\n\r\n").bytes()),
            }
            let response_body = if status == 204 || status == 304 { String::new() } else { body.chars().rev().collect() };
            if *shape == 3 {
                let status = if status == 204 || status == 304 { 200 } else { status };
                server.extend(format!("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 {status} X\r\nTransfer-Encoding: chunked\r\n\r\n").bytes());
                for p in parts.iter().filter(|p| !p.is_empty()) {
                    let p: String = p.chars().rev().collect();
                    server.extend(format!("{:x};e=1\r\n{p}\r\n", p.len()).bytes());
                }
                let response_body: String = parts.iter().map(|p| p.chars().rev().collect::<String>()).collect();
                server.extend(b"0\r\nT: 1\r\n\r\n");
                expected.push((format!("/{path}"), if *shape <= 1 { body.clone() } else { String::new() }, status, response_body));
                continue;
            }
            server.extend(format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{response_body}", response_body.len()).bytes());
            expected.push((format!("/{path}"), if *shape <= 1 { body.clone() } else { String::new() }, status, response_body));
        }
        let feed = |client_cuts: &[prop::sample::Index], server_cuts: &[prop::sample::Index]| {
            let mut a = HttpAssembler::new(HttpConfig::default());
            a.handle_open(C, "h", 0);
            for part in split(&client, client_cuts) {
                a.handle_client_bytes(C, part, 1);
            }
            for part in split(&server, server_cuts) {
                a.handle_server_bytes(C, part, 2);
            }
            a.handle_closed(C, 3);
            std::iter::from_fn(|| a.poll_output()).collect::<Vec<_>>()
        };
        let whole = feed(&[], &[]);
        prop_assert_eq!(&feed(&client_cuts, &server_cuts), &whole);
        let got: Vec<_> = exchanges(&whole).iter().map(|e| {
            let r = e.response.as_ref().expect("response");
            (e.request.target.clone(), String::from_utf8_lossy(&e.request.body.bytes).into_owned(), r.status, String::from_utf8_lossy(&r.body.bytes).into_owned())
        }).collect();
        prop_assert_eq!(got, expected);
        prop_assert!(untraced(&whole).is_empty());

        // The same split under allowances (a host's total cap): the bodies kept grow by at most
        // the allowance of each input, each is a prefix of the whole body, marked truncated
        // when cut, and nothing else changes.
        let mut a = HttpAssembler::new(HttpConfig::default());
        a.handle_open(C, "h", 0);
        let mut allowance = allowances.iter().cycle();
        let mut limited = Vec::new();
        let mut held = 0;
        let inputs = split(&client, &client_cuts).into_iter().map(|p| (true, p))
            .chain(split(&server, &server_cuts).into_iter().map(|p| (false, p)));
        for (from_client, part) in inputs {
            let allowed = *allowance.next().expect("cycle");
            a.set_body_allowance(C, allowed);
            if from_client {
                a.handle_client_bytes(C, part, 1);
            } else {
                a.handle_server_bytes(C, part, 2);
            }
            let now = a.kept_body_bytes();
            if let Some(allowed) = allowed {
                prop_assert!(now <= held + allowed, "{} > {} + {}", now, held, allowed);
            }
            limited.extend(std::iter::from_fn(|| a.poll_output()));
            held = a.kept_body_bytes();
        }
        a.handle_closed(C, 3);
        limited.extend(std::iter::from_fn(|| a.poll_output()));
        prop_assert_eq!(a.kept_body_bytes(), 0);
        prop_assert_eq!(limited.len(), whole.len());
        let cut_ok = |cut: &Body, full: &Body| {
            full.bytes.starts_with(&cut.bytes)
                && cut.len == full.len
                && cut.truncated == (cut.bytes.len() < full.bytes.len())
        };
        for (cut, full) in limited.iter().zip(&whole) {
            match (cut, full) {
                (HttpOutput::Exchange(cut), HttpOutput::Exchange(full)) => {
                    prop_assert!(cut_ok(&cut.request.body, &full.request.body), "{:?} vs {:?}", cut.request.body, full.request.body);
                    let (rc, rf) = (cut.response.as_ref().expect("response"), full.response.as_ref().expect("response"));
                    prop_assert!(cut_ok(&rc.body, &rf.body), "{:?} vs {:?}", rc.body, rf.body);
                    prop_assert_eq!((&cut.request.target, rc.status), (&full.request.target, rf.status));
                }
                (cut, full) => prop_assert_eq!(cut, full),
            }
        }
    }

    /// Secrets from the corpus never survive, wherever they sit in an exchange and however the
    /// stream is split.
    #[test]
    fn corpus_secrets_never_survive(
        pick in any::<prop::sample::Index>(),
        variant in 0..4u8,
        host in 0..3usize,
        piece in 1..200usize,
    ) {
        let corpus = secrets();
        let (context, secret) = corpus[pick.index(corpus.len())];
        let client = crate::fuzzing::secret_exchange(context, secret, variant);
        let server = crate::fuzzing::secret_response(context, secret);
        let host = ["api.anthropic.com", "api.openai.com", "example.com"][host];
        let events = trace_events(host, &client, &server, piece);
        prop_assert_eq!(events.len(), 1);
        let text = events[0].to_string();
        prop_assert!(!text.contains(secret), "{} survived in {}", secret, text);
    }
}

fn split<'a>(bytes: &'a [u8], cuts: &[prop::sample::Index]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
    points.sort_unstable();
    let mut out = Vec::new();
    let mut last = 0;
    for p in points {
        out.push(&bytes[last..p]);
        last = p;
    }
    out.push(&bytes[last..]);
    out
}

/// Hostile streams: items that are not objects, huge part indices.
#[test]
fn responses_streams_with_odd_items_do_not_panic_or_grow() {
    let stream = "data: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":\"not an object\"}\n\n\
data: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"content_index\":0,\"delta\":\"a\"}\n\n\
data: {\"type\":\"response.function_call_arguments.delta\",\"output_index\":0,\"delta\":\"b\"}\n\n\
data: {\"type\":\"response.output_item.added\",\"output_index\":1,\"item\":{\"type\":\"message\",\"role\":\"assistant\",\"content\":[7]}}\n\n\
data: {\"type\":\"response.output_text.delta\",\"output_index\":1,\"content_index\":0,\"delta\":\"c\"}\n\n\
data: {\"type\":\"response.output_text.delta\",\"output_index\":1,\"content_index\":1000000000000,\"delta\":\"d\"}\n\n\
data: {\"type\":\"response.reasoning_summary_text.delta\",\"output_index\":1,\"summary_index\":1000000000000,\"delta\":\"e\"}\n\n";
    let response = openai::response(stream.as_bytes(), 200).expect("a response");
    assert_eq!(response.messages.len(), 1);
    // The string item is skipped; the number part stays as it was (no delta lands on it).
    assert_eq!(
        response.messages[0].content,
        vec![Block::Unknown { raw: json!(7) }],
        "{response:?}"
    );
}

#[test]
fn reopening_a_connection_flushes_the_old_one() {
    let mut a = HttpAssembler::new(HttpConfig::default());
    a.handle_open(C, "h", 0);
    a.handle_client_bytes(C, b"GET / HTTP/1.1\r\n\r\n", 5);
    a.handle_open(C, "h2", 9);
    let out: Vec<_> = std::iter::from_fn(|| a.poll_output()).collect();
    let ex = exchanges(&out);
    assert_eq!(ex.len(), 1, "every RequestSent gets its exchange");
    assert!(ex[0].response.is_none());
    assert_eq!(
        ex[0].ended_at, 9,
        "the exchange ended when the connection was reopened"
    );
}

#[test]
fn a_configured_endpoint_speaks_its_api_under_any_prefix() {
    use LlmApi::{AnthropicMessages, OpenaiResponses};
    assert_eq!(
        endpoint_api("POST", "/v1/messages", AnthropicMessages),
        Some(AnthropicMessages)
    );
    assert_eq!(
        endpoint_api(
            "post",
            "/anthropic/v1/messages?beta=true",
            AnthropicMessages
        ),
        Some(AnthropicMessages)
    );
    assert_eq!(
        endpoint_api("POST", "http://gw:8080/llm/v1/messages", AnthropicMessages),
        Some(AnthropicMessages)
    );
    assert_eq!(
        endpoint_api("POST", "/v1/messages/count_tokens", AnthropicMessages),
        None
    );
    assert_eq!(endpoint_api("GET", "/v1/messages", AnthropicMessages), None);
    assert_eq!(
        endpoint_api("POST", "/openai/v1/responses", OpenaiResponses),
        Some(OpenaiResponses)
    );
    assert_eq!(
        endpoint_api("POST", "/v1/chat/completions", OpenaiResponses),
        None
    );
    // Off a configured endpoint the host decides, as before.
    assert_eq!(llm_api("POST", "gw.example", "/v1/messages"), None);
}
