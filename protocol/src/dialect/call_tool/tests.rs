use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::test_support::proptest_config;

const TIMEOUT: Duration = Duration::from_secs(120);

fn raw(text: &str) -> RawJson {
    RawJson::from_text(text).unwrap()
}

fn call(name: &str) -> CallTool {
    CallTool {
        name: name.into(),
        arguments: raw(r#"{"text":"hello é"}"#),
    }
}

fn framed(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    length_prefixed::encode(payload, &mut out, usize::MAX).unwrap();
    out
}

fn drain<T>(c: &mut CallToolClient<T>) -> Vec<ClientOutput<T>> {
    std::iter::from_fn(|| c.poll_output()).collect()
}

#[test]
fn wire_shapes() {
    assert_eq!(
        String::from_utf8(encode_call(&call("echo"))).unwrap(),
        r#"{"method":"call_tool","params":{"name":"echo","arguments":{"text":"hello é"}}}"#
    );
    assert_eq!(
        String::from_utf8(encode_reply(&Reply::Error {
            message: "Unknown tool: nope".into(),
            error_type: TOOL_NOT_FOUND.into()
        }))
        .unwrap(),
        r#"{"error":{"message":"Unknown tool: nope","type":"ToolNotFoundError"}}"#
    );
    // The reference's spaced, ASCII-escaped form decodes the same.
    let reference = br#"{"method": "call_tool", "params": {"name": "echo", "arguments": {"text": "hello \u00e9"}}}"#;
    let decoded = decode_call(reference).unwrap();
    assert_eq!(decoded.name, "echo");
    assert_eq!(
        decoded.arguments.parse::<Value>().unwrap(),
        serde_json::json!({"text": "hello é"})
    );
    assert_eq!(
        decode_reply(br#"{"result": {"content": [{"type": "text", "text": "hello \u00e9"}]}}"#),
        Ok(Reply::Result(raw(
            r#"{"content": [{"type": "text", "text": "hello \u00e9"}]}"#
        ))),
        "results pass verbatim"
    );
}

#[test]
fn parent_side_rejections_and_fatal_payloads() {
    let rejected = |p: &[u8]| match decode_call(p) {
        Err(BadRequest::Reject(Reply::Error {
            message,
            error_type,
        })) => {
            assert_eq!(error_type, VALUE_ERROR);
            message
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(
        rejected(br#"{"method":"list_tools"}"#),
        "Unknown method: list_tools"
    );
    assert_eq!(
        rejected(br#"{"method":"call_tool","params":[1]}"#),
        "Invalid params: expected dict"
    );
    assert_eq!(
        rejected(br#"{"method":"call_tool","params":{"name":3}}"#),
        "Invalid tool name: expected string"
    );
    assert_eq!(
        rejected(br#"{"method":"call_tool","params":{"name":"x","arguments":"y"}}"#),
        "Invalid arguments: expected dict"
    );
    assert_eq!(
        decode_call(br#"{"method":"call_tool","params":{"name":"x"}}"#)
            .unwrap()
            .arguments,
        raw("{}")
    );
    let fatal = |p: &[u8]| match decode_call(p) {
        Err(BadRequest::Fatal(f)) => f,
        other => panic!("{other:?}"),
    };
    assert_eq!(fatal(b""), Fatal::Empty);
    assert_eq!(fatal(b"\xff"), Fatal::InvalidUtf8);
    assert!(matches!(fatal(b"{"), Fatal::InvalidJson(_)));
    assert_eq!(fatal(b"[]"), Fatal::NotAnObject);
    assert!(decode_reply(br#"{"result":{},"error":{"message":"m","type":"T"}}"#).is_err());
    assert!(decode_reply(br#"{"error":{"message":"m"}}"#).is_err());
    assert!(decode_reply(br#"{}"#).is_err());
}

#[test]
fn schema_file() {
    let tools = parse_schema_file(r#"[{"name":"echo","description":"Echo","input_schema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}}]"#).unwrap();
    assert_eq!(
        tools_list_result(&tools).parse::<Value>().unwrap(),
        serde_json::json!({"tools":[{"name":"echo","description":"Echo","inputSchema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}}]})
    );
    assert!(parse_schema_file("{}").is_err());
    assert!(
        parse_schema_file(r#"[{"name":"a","input_schema":{}},{"name":"a","input_schema":{}}]"#)
            .is_err()
    );
    assert!(parse_schema_file(r#"[{"name":"a","input_schema":3}]"#).is_err());
}

#[test]
fn lazy_connect_then_strictly_one_on_the_wire() {
    let mut c = CallToolClient::new(1024, TIMEOUT);
    let now = Instant::now();
    assert!(
        drain(&mut c).is_empty(),
        "nothing happens before the first call"
    );
    c.request(&call("a"), 1, now);
    c.request(&call("b"), 2, now);
    assert_eq!(drain(&mut c), vec![ClientOutput::Connect]);
    c.handle_connected(now);
    let out = drain(&mut c);
    assert_eq!(
        out,
        vec![ClientOutput::Transmit(framed(&encode_call(&call("a"))))]
    );
    c.handle_bytes(
        &framed(br#"{"result":{"content":[{"type":"text","text":"A"}]}}"#)[..7],
        now,
    );
    assert!(drain(&mut c).is_empty());
    c.handle_bytes(
        &framed(br#"{"result":{"content":[{"type":"text","text":"A"}]}}"#)[7..],
        now,
    );
    let out = drain(&mut c);
    assert!(matches!(
        &out[0],
        ClientOutput::Completed {
            token: 1,
            outcome: Ok(Reply::Result(_))
        }
    ));
    assert_eq!(
        out[1],
        ClientOutput::Transmit(framed(&encode_call(&call("b"))))
    );
    c.handle_bytes(
        &framed(br#"{"error":{"message":"Unknown tool: b","type":"ToolNotFoundError"}}"#),
        now,
    );
    assert_eq!(
        drain(&mut c),
        vec![ClientOutput::Completed {
            token: 2,
            outcome: Ok(Reply::Error {
                message: "Unknown tool: b".into(),
                error_type: TOOL_NOT_FOUND.into()
            })
        }]
    );
}

#[test]
fn parent_drop_fails_the_call_in_flight_and_the_next_call_reconnects() {
    let mut c = CallToolClient::new(1024, TIMEOUT);
    let now = Instant::now();
    c.request(&call("a"), 1, now);
    c.handle_connected(now);
    drain(&mut c);
    c.request(&call("b"), 2, now);
    c.handle_closed(now);
    let out = drain(&mut c);
    assert_eq!(
        out[0],
        ClientOutput::Completed {
            token: 1,
            outcome: Err(CallError::ConnectionLost)
        }
    );
    assert_eq!(out[1], ClientOutput::Connect, "the queued call reconnects");
    c.handle_connected(now);
    assert_eq!(
        drain(&mut c),
        vec![ClientOutput::Transmit(framed(&encode_call(&call("b"))))]
    );
}

/// Found by the `call_tool_bridge` fuzz oracle: bytes that arrive together with a reply were sent
/// before the parent saw the next request, so they cannot answer it. They broke the protocol:
/// the link drops and the next call goes out on a fresh connection with its own answer.
#[test]
fn bytes_after_a_reply_never_answer_the_next_call() {
    let mut c = CallToolClient::new(1024, TIMEOUT);
    let now = Instant::now();
    c.request(&call("a"), 1, now);
    c.request(&call("b"), 2, now);
    c.handle_connected(now);
    drain(&mut c);
    let mut bytes = framed(br#"{"result":{"content":[{"type":"text","text":"A"}]}}"#);
    bytes.extend(framed(
        br#"{"result":{"content":[{"type":"text","text":"stray"}]}}"#,
    ));
    c.handle_bytes(&bytes, now);
    let out = drain(&mut c);
    assert_eq!(
        out,
        vec![
            ClientOutput::Completed {
                token: 1,
                outcome: Ok(Reply::Result(raw(
                    r#"{"content":[{"type":"text","text":"A"}]}"#
                )))
            },
            ClientOutput::Disconnect,
            ClientOutput::Connect,
        ],
        "the stray reply answers nobody; call b waits for a new connection"
    );
    c.handle_connected(now);
    assert_eq!(
        drain(&mut c),
        vec![ClientOutput::Transmit(framed(&encode_call(&call("b"))))]
    );
    c.handle_bytes(
        &framed(br#"{"result":{"content":[{"type":"text","text":"B"}]}}"#),
        now,
    );
    assert_eq!(
        drain(&mut c),
        vec![ClientOutput::Completed {
            token: 2,
            outcome: Ok(Reply::Result(raw(
                r#"{"content":[{"type":"text","text":"B"}]}"#
            )))
        }]
    );
}

#[test]
fn broken_replies_drop_the_link_and_fail_only_the_call_in_flight() {
    let mut c = CallToolClient::new(128, TIMEOUT);
    let now = Instant::now();
    c.request(&call("a"), 1, now);
    c.request(&call("b"), 2, now);
    c.handle_connected(now);
    drain(&mut c);
    c.handle_bytes(&(1000u32).to_be_bytes(), now);
    let out = drain(&mut c);
    assert!(matches!(
        &out[0],
        ClientOutput::Completed {
            token: 1,
            outcome: Err(CallError::Protocol(Fatal::Framing(LpError::TooLarge {
                len: 1000,
                max: 128
            })))
        }
    ));
    assert_eq!(out[1..], [ClientOutput::Disconnect, ClientOutput::Connect]);
    c.handle_connected(now);
    drain(&mut c);
    c.handle_bytes(&framed(b"not json"), now);
    let out = drain(&mut c);
    assert!(matches!(
        &out[0],
        ClientOutput::Completed {
            token: 2,
            outcome: Err(CallError::Protocol(Fatal::InvalidJson(_)))
        }
    ));
    assert_eq!(out[1], ClientOutput::Disconnect);
    assert_eq!(c.pending_len(), 0);
}

#[test]
fn too_large_request_and_connect_failure() {
    let mut c = CallToolClient::new(32, TIMEOUT);
    let now = Instant::now();
    c.request(&call("a-very-long-tool-name"), 1, now);
    assert!(matches!(
        &drain(&mut c)[0],
        ClientOutput::Completed {
            token: 1,
            outcome: Err(CallError::TooLarge(_))
        }
    ));
    let mut c = CallToolClient::new(1024, TIMEOUT);
    let now = Instant::now();
    c.request(&call("a"), 1, now);
    c.request(&call("b"), 2, now);
    drain(&mut c);
    c.handle_connect_failed("connection refused", now);
    let out = drain(&mut c);
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|o| matches!(
        o,
        ClientOutput::Completed {
            outcome: Err(CallError::ConnectFailed(_)),
            ..
        }
    )));
    c.request(&call("c"), 3, now);
    assert_eq!(
        drain(&mut c),
        vec![ClientOutput::Connect],
        "a later call tries again"
    );
}

#[derive(Debug, Clone)]
enum Op {
    Call,
    Connected,
    ConnectFailed,
    Reply,
    BadReply,
    Closed,
}

proptest! {
    #![proptest_config(proptest_config("call_tool_client"))]

    /// Whatever happens, every call completes exactly once, replies complete calls in the order
    /// they were made, and at most one request is ever on the wire.
    #[test]
    fn sequential_and_exactly_once(ops in proptest::collection::vec(prop_oneof![
        3 => Just(Op::Call), 2 => Just(Op::Connected), 1 => Just(Op::ConnectFailed),
        3 => Just(Op::Reply), 1 => Just(Op::BadReply), 1 => Just(Op::Closed),
    ], 0..60)) {
        let mut c = CallToolClient::new(1024, TIMEOUT);
        let now = Instant::now();
        let mut next = 0u32;
        let mut completed: Vec<u32> = Vec::new();
        let mut replied: Vec<u32> = Vec::new();
        let mut on_wire = 0;
        let mut connecting = false;
        let mut sent_order: Vec<u32> = Vec::new();
        for op in ops {
            match op {
                Op::Call => { c.request(&call("t"), next, now); next += 1; }
                Op::Connected if connecting => { connecting = false; c.handle_connected(now); }
                Op::ConnectFailed if connecting => { connecting = false; c.handle_connect_failed("no", now); }
                Op::Reply if on_wire == 1 => c.handle_bytes(&framed(br#"{"result":{"content":[]}}"#), now),
                Op::BadReply if on_wire == 1 => c.handle_bytes(&framed(b"[]"), now),
                Op::Closed => c.handle_closed(now),
                _ => {}
            }
            for o in drain(&mut c) {
                match o {
                    ClientOutput::Connect => { prop_assert!(!connecting); connecting = true; on_wire = 0; }
                    ClientOutput::Disconnect => on_wire = 0,
                    ClientOutput::Transmit(_) => { on_wire += 1; prop_assert!(on_wire <= 1, "two requests on the wire"); sent_order.push(next); }
                    ClientOutput::Completed { token, outcome } => {
                        prop_assert!(!completed.contains(&token), "completed twice");
                        if outcome.is_ok() { replied.push(token); on_wire = 0; }
                        if matches!(outcome, Err(CallError::ConnectionLost | CallError::Protocol(_))) { on_wire = 0; }
                        completed.push(token);
                    }
                    ClientOutput::LateReplyDiscarded { .. } => prop_assert!(false, "a late reply with no call cancelled"),
                }
            }
            if matches!(op, Op::Closed) { on_wire = 0; }
        }
        c.shutdown(now);
        for o in drain(&mut c) {
            if let ClientOutput::Completed { token, .. } = o {
                prop_assert!(!completed.contains(&token), "completed twice");
                completed.push(token);
            }
        }
        completed.sort_unstable();
        prop_assert_eq!(completed, (0..next).collect::<Vec<_>>());
        prop_assert!(replied.windows(2).all(|w| w[0] < w[1]), "replies in call order");
    }
}

/// Found by proptest: a close reported while the connection is still being made must not start
/// a second connection attempt.
#[test]
fn closed_while_connecting_is_ignored() {
    let mut c = CallToolClient::new(1024, TIMEOUT);
    let now = Instant::now();
    c.request(&call("a"), 1, now);
    assert_eq!(drain(&mut c), vec![ClientOutput::Connect]);
    c.handle_closed(now);
    assert!(drain(&mut c).is_empty());
    c.handle_connected(now);
    assert_eq!(drain(&mut c).len(), 1, "the call goes out once connected");
}

#[test]
fn tool_results_are_validated_like_an_mcp_client_would() {
    let check =
        |text: &str| validate_tool_result(&RawJson::from_text(text).unwrap()).map_err(|e| e.0);
    assert_eq!(
        check(r#"{"content":[{"type":"text","text":"ok"}]}"#),
        Ok(())
    );
    assert_eq!(
        check(
            r#"{"content":[{"type":"resource","resource":{"uri":"u","blob":"AA=="}}],"_meta":null,"extra":1}"#
        ),
        Ok(())
    );
    for (text, why) in [
        ("[]", "the result is not a JSON object"),
        (r#"{"content":null}"#, "\"content\" is null, not a list"),
        (r#"{"content":[1]}"#, "content[0] is number, not an object"),
        (
            r#"{"content":[{"type":1}]}"#,
            "content[0] has type 1, which is none of text, image, audio, resource_link, resource",
        ),
        (
            r#"{"content":[{"type":"image","data":"AA=="}]}"#,
            "content[0] (image) has no \"mimeType\"",
        ),
        (
            r#"{"content":[{"type":"resource_link","uri":"u"}]}"#,
            "content[0] (resource_link) has no \"name\"",
        ),
        (
            r#"{"content":[{"type":"resource","resource":"u"}]}"#,
            "content[0] (resource): \"resource\" is string, not an object",
        ),
        (
            r#"{"content":[{"type":"resource","resource":{"uri":"u"}}]}"#,
            "content[0].resource has neither a \"text\" nor a \"blob\" string",
        ),
        (
            r#"{"content":[{"type":"resource","resource":{"text":"t"}}]}"#,
            "content[0].resource has no \"uri\" string",
        ),
        (
            r#"{"content":[{"type":"text","text":"a"}],"_meta":[]}"#,
            "\"_meta\" is array, not an object",
        ),
    ] {
        assert_eq!(check(text), Err(why.to_owned()), "{text}");
    }
}

/// Error texts are read by people and agents who never saw this crate's source: serde's
/// defaults for a mistyped object ("expected struct WireError") name Rust types. Each text here
/// names the JSON the peer sent instead.
#[test]
fn error_texts_name_json_not_rust_types() {
    let rust_words = [
        "struct",
        "WireError",
        "ToolSchema",
        "Value",
        "Vec",
        "BTreeMap",
        "RawValue",
    ];
    let texts = [
        decode_reply(br#"{"error":"boom"}"#)
            .unwrap_err()
            .to_string(),
        decode_reply(br#"{"error":{"message":1,"type":"T"}}"#)
            .unwrap_err()
            .to_string(),
        decode_reply(br#"{"error":[1]}"#).unwrap_err().to_string(),
        parse_schema_file(r#"["echo"]"#).unwrap_err().to_string(),
        parse_schema_file(r#"[{"name":1,"input_schema":{}}]"#)
            .unwrap_err()
            .to_string(),
        parse_schema_file(r#"{"tools":[]}"#)
            .unwrap_err()
            .to_string(),
        validate_tool_result(&raw(r#"{"content":[{"type":"resource","resource":[1]}]}"#))
            .unwrap_err()
            .to_string(),
    ];
    for text in &texts {
        for word in rust_words {
            assert!(!text.contains(word), "{text:?} names {word}");
        }
    }
    assert_eq!(
        texts[0],
        "unexpected reply: \"error\" must be an object {\"message\": <string>, \"type\": <string>}, \
         not a string"
    );
    assert_eq!(
        texts[3],
        "invalid tool-schema file: tool 0 is a string, not an object {\"name\", \"description\", \
         \"input_schema\"}"
    );
}

fn tagged_reply(tag: &str) -> Vec<u8> {
    framed(format!(r#"{{"result":{{"content":[{{"type":"text","text":"{tag}"}}]}}}}"#).as_bytes())
}

#[test]
fn a_call_the_parent_never_answers_times_out_and_the_next_call_reconnects() {
    let timeout = Duration::from_secs(10);
    let mut c = CallToolClient::new(1024, timeout);
    let t0 = Instant::now();
    assert_eq!(c.poll_timeout(), None, "no timer before a call is sent");
    c.request(&call("a"), 1, t0);
    c.request(&call("b"), 2, t0);
    assert_eq!(drain(&mut c), vec![ClientOutput::Connect]);
    assert_eq!(c.poll_timeout(), None, "connecting is the driver's to time");
    let sent = t0 + Duration::from_secs(3);
    c.handle_connected(sent);
    drain(&mut c);
    assert_eq!(
        c.poll_timeout(),
        Some(sent + timeout),
        "the deadline runs from the send"
    );
    c.handle_timeout(sent + timeout - Duration::from_millis(1));
    assert!(drain(&mut c).is_empty(), "an early timer changes nothing");
    c.handle_timeout(sent + timeout);
    assert_eq!(
        drain(&mut c),
        vec![
            ClientOutput::Completed {
                token: 1,
                outcome: Err(CallError::TimedOut { after: timeout })
            },
            ClientOutput::Disconnect,
            ClientOutput::Connect,
        ],
        "the silent connection is dropped; the queued call gets a fresh one"
    );
    assert_eq!(c.poll_timeout(), None);
    let resent = sent + timeout + Duration::from_secs(1);
    c.handle_connected(resent);
    assert_eq!(
        drain(&mut c),
        vec![ClientOutput::Transmit(framed(&encode_call(&call("b"))))]
    );
    assert_eq!(c.poll_timeout(), Some(resent + timeout));
    c.handle_bytes(&tagged_reply("B"), resent);
    assert!(matches!(
        &drain(&mut c)[..],
        [ClientOutput::Completed {
            token: 2,
            outcome: Ok(_)
        }]
    ));
    assert_eq!(c.poll_timeout(), None, "nothing awaited, no timer");
    assert_eq!(
        CallError::TimedOut { after: timeout }.to_string(),
        "no reply from the parent within 10 s"
    );
}

#[test]
fn durations_read_as_people_write_them() {
    for (d, text) in [
        (Duration::from_secs(120), "120 s"),
        (Duration::from_millis(1500), "1.5 s"),
        (Duration::from_millis(1005), "1.005 s"),
        (Duration::from_millis(250), "250 ms"),
    ] {
        assert_eq!(seconds(d), text);
    }
}

/// The agent cancels the call on the wire: the next call goes out at once on the same
/// connection, and the reply the parent still owes the cancelled call is skipped by its length
/// prefix, unparsed (here it is not even JSON), never taken as the next call's answer.
#[test]
fn cancel_on_the_wire_frees_the_queue_and_the_late_reply_is_discarded_by_its_frame() {
    let mut c = CallToolClient::new(1024, TIMEOUT);
    let now = Instant::now();
    c.request(&call("a"), 1, now);
    c.request(&call("b"), 2, now);
    c.request(&call("c"), 3, now);
    c.handle_connected(now);
    drain(&mut c);
    assert_eq!(c.cancel(|t| *t == 1, now), Some((1, Cancelled::OnWire)));
    assert_eq!(
        drain(&mut c),
        vec![ClientOutput::Transmit(framed(&encode_call(&call("b"))))],
        "the queue moves on at once"
    );
    assert_eq!(c.late_replies(), 1);
    assert_eq!(c.cancel(|t| *t == 1, now), None, "cancelled once");
    // The late reply, split across reads, then b's reply in the same read as its tail.
    let late = framed(b"not JSON: nobody reads it");
    c.handle_bytes(&late[..6], now);
    assert!(drain(&mut c).is_empty());
    let mut rest = late[6..].to_vec();
    rest.extend(tagged_reply("B"));
    c.handle_bytes(&rest, now);
    assert_eq!(
        drain(&mut c),
        vec![
            ClientOutput::LateReplyDiscarded {
                len: "not JSON: nobody reads it".len()
            },
            ClientOutput::Completed {
                token: 2,
                outcome: Ok(Reply::Result(raw(
                    r#"{"content":[{"type":"text","text":"B"}]}"#
                )))
            },
            ClientOutput::Transmit(framed(&encode_call(&call("c")))),
        ]
    );
    assert_eq!(c.late_replies(), 0);
    // A cancel with nothing behind it: the late reply is still discarded, and bytes behind it
    // answer nothing (nothing was asked since).
    assert_eq!(c.cancel(|t| *t == 3, now), Some((3, Cancelled::OnWire)));
    assert!(drain(&mut c).is_empty());
    assert_eq!(c.poll_timeout(), None, "nothing awaited");
    let mut bytes = tagged_reply("C");
    bytes.extend(tagged_reply("stray"));
    c.handle_bytes(&bytes, now);
    let out = drain(&mut c);
    assert_eq!(out[1], ClientOutput::Disconnect, "{out:?}");
    assert!(matches!(out[0], ClientOutput::LateReplyDiscarded { .. }));
    assert_eq!(out.len(), 2);
}

#[test]
fn cancel_of_a_queued_call_removes_it() {
    let mut c = CallToolClient::new(1024, TIMEOUT);
    let now = Instant::now();
    c.request(&call("a"), 1, now);
    c.request(&call("b"), 2, now);
    c.request(&call("c"), 3, now);
    assert_eq!(c.cancel(|t| *t == 1, now), Some((1, Cancelled::Queued)));
    c.handle_connected(now);
    assert_eq!(
        drain(&mut c),
        vec![
            ClientOutput::Connect,
            ClientOutput::Transmit(framed(&encode_call(&call("b"))))
        ],
        "a, cancelled while connecting, is never sent"
    );
    assert_eq!(c.cancel(|t| *t == 3, now), Some((3, Cancelled::Queued)));
    assert_eq!(c.late_replies(), 0);
    c.handle_bytes(&tagged_reply("B"), now);
    assert!(matches!(
        &drain(&mut c)[..],
        [ClientOutput::Completed {
            token: 2,
            outcome: Ok(_)
        }]
    ));
    assert_eq!(c.pending_len(), 0, "c is gone, never sent");
    assert_eq!(
        c.cancel(|t| *t == 2, now),
        None,
        "answered calls are not cancelled"
    );
}

/// A parent that owes more late replies than the cap is dropped instead: the calls behind
/// them get a fresh connection.
#[test]
fn too_many_late_replies_drop_the_link() {
    let mut c = CallToolClient::new(1024, TIMEOUT);
    let now = Instant::now();
    c.request(&call("t"), 0, now);
    c.handle_connected(now);
    drain(&mut c);
    for token in 0..MAX_LATE_REPLIES {
        c.request(&call("t"), token + 1, now);
        assert_eq!(
            c.cancel(|t| *t == token, now),
            Some((token, Cancelled::OnWire))
        );
        assert!(matches!(&drain(&mut c)[..], [ClientOutput::Transmit(_)]));
    }
    assert_eq!(c.late_replies(), MAX_LATE_REPLIES);
    c.request(&call("t"), 100, now);
    assert_eq!(
        c.cancel(|t| *t == MAX_LATE_REPLIES, now),
        Some((MAX_LATE_REPLIES, Cancelled::OnWire))
    );
    assert_eq!(
        drain(&mut c),
        vec![ClientOutput::Disconnect, ClientOutput::Connect]
    );
    c.handle_connected(now);
    assert_eq!(
        drain(&mut c).len(),
        1,
        "call 100 goes out on the new connection"
    );
    assert_eq!(c.late_replies(), 0);
}

#[derive(Debug, Clone)]
enum CancelOp {
    Call,
    Connected,
    ConnectFailed,
    /// The parent answers the oldest request it has not answered, with that request's tag.
    Reply,
    Closed,
    /// Cancel the call with this index among those still pending.
    Cancel(usize),
    /// Time passes by this many seconds; the driver fires the timer when due.
    Wait(u64),
}

proptest! {
    #![proptest_config(proptest_config("call_tool_client_cancel"))]

    /// A sequential parent (answering its requests in order, each reply naming the request)
    /// against cancels and timeouts: every call completes exactly once or is cancelled (never
    /// both), a reply only ever completes the call it answers, one call at most is awaited, a
    /// timeout only comes at its deadline, and the timer is always that deadline.
    #[test]
    fn cancels_and_timeouts_never_mismatch_a_reply(ops in proptest::collection::vec(prop_oneof![
        3 => Just(CancelOp::Call), 2 => Just(CancelOp::Connected), 1 => Just(CancelOp::ConnectFailed),
        3 => Just(CancelOp::Reply), 1 => Just(CancelOp::Closed),
        2 => (0usize..4).prop_map(CancelOp::Cancel), 1 => (0u64..8).prop_map(CancelOp::Wait),
    ], 0..80)) {
        let timeout = Duration::from_secs(5);
        let mut c = CallToolClient::new(1024, timeout);
        let mut now = Instant::now();
        let mut next = 0u32;
        let mut pending: Vec<u32> = Vec::new();
        let mut completed = BTreeSet::new();
        let mut cancelled = BTreeSet::new();
        // The parent's side of the connection: tags of requests read and not yet answered.
        let mut parent: VecDeque<u32> = VecDeque::new();
        let mut connecting = false;
        let mut awaited: Option<(u32, Instant)> = None;
        for op in ops {
            match op {
                CancelOp::Call => {
                    c.request(&call(&format!("t{next}")), next, now);
                    pending.push(next);
                    next += 1;
                }
                CancelOp::Connected if connecting => { connecting = false; c.handle_connected(now); }
                CancelOp::ConnectFailed if connecting => { connecting = false; c.handle_connect_failed("no", now); }
                CancelOp::Reply => {
                    if let Some(tag) = parent.pop_front() {
                        c.handle_bytes(&tagged_reply(&format!("t{tag}")), now);
                    }
                }
                CancelOp::Closed => { parent.clear(); awaited = None; c.handle_closed(now); }
                CancelOp::Cancel(i) if !pending.is_empty() => {
                    let tag = pending.remove(i % pending.len());
                    let (token, _) = c.cancel(|t| *t == tag, now).expect("a pending call");
                    prop_assert_eq!(token, tag);
                    if awaited.is_some_and(|(t, _)| t == tag) { awaited = None; }
                    cancelled.insert(tag);
                }
                CancelOp::Wait(secs) => {
                    now += Duration::from_secs(secs);
                    if c.poll_timeout().is_some_and(|due| due <= now) { c.handle_timeout(now); }
                }
                _ => {}
            }
            for o in drain(&mut c) {
                match o {
                    ClientOutput::Connect => { prop_assert!(!connecting); connecting = true; }
                    ClientOutput::Disconnect => { parent.clear(); awaited = None; }
                    ClientOutput::Transmit(frame) => {
                        prop_assert!(awaited.is_none(), "two calls awaited");
                        let call = decode_call(&frame[4..]).expect("a call");
                        let tag: u32 = call.name[1..].parse().expect("a tag");
                        prop_assert!(pending.contains(&tag), "call {} sent, not pending", tag);
                        parent.push_back(tag);
                        awaited = Some((tag, now + timeout));
                    }
                    ClientOutput::Completed { token, outcome } => {
                        prop_assert!(completed.insert(token), "completed twice");
                        prop_assert!(!cancelled.contains(&token), "completed after its cancel");
                        pending.retain(|t| *t != token);
                        match outcome {
                            Ok(Reply::Result(result)) => {
                                let text = result.parse::<Value>().expect("JSON")["content"][0]["text"].clone();
                                prop_assert_eq!(text, Value::String(format!("t{token}")), "the wrong reply");
                                prop_assert_eq!(awaited.map(|(t, _)| t), Some(token));
                            }
                            Err(CallError::TimedOut { after }) => {
                                prop_assert_eq!(after, timeout);
                                let (t, due) = awaited.expect("a timeout with nothing awaited");
                                prop_assert_eq!(t, token);
                                prop_assert!(now >= due, "timed out early");
                            }
                            _ => {}
                        }
                        if awaited.is_some_and(|(t, _)| t == token) { awaited = None; }
                    }
                    ClientOutput::LateReplyDiscarded { .. } => {}
                }
            }
            prop_assert_eq!(c.poll_timeout(), awaited.map(|(_, due)| due), "the timer");
            prop_assert!(c.late_replies() <= MAX_LATE_REPLIES);
        }
        c.shutdown(now);
        for o in drain(&mut c) {
            if let ClientOutput::Completed { token, .. } = o {
                prop_assert!(completed.insert(token), "completed twice");
            }
        }
        prop_assert!(completed.is_disjoint(&cancelled));
        let all: BTreeSet<u32> = completed.union(&cancelled).copied().collect();
        prop_assert_eq!(all, (0..next).collect::<BTreeSet<_>>());
    }
}
