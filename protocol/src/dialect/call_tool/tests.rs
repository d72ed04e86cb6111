use proptest::prelude::*;

use super::*;
use crate::test_support::proptest_config;

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
    let mut c = CallToolClient::new(1024);
    assert!(
        drain(&mut c).is_empty(),
        "nothing happens before the first call"
    );
    c.request(&call("a"), 1);
    c.request(&call("b"), 2);
    assert_eq!(drain(&mut c), vec![ClientOutput::Connect]);
    c.handle_connected();
    let out = drain(&mut c);
    assert_eq!(
        out,
        vec![ClientOutput::Transmit(framed(&encode_call(&call("a"))))]
    );
    c.handle_bytes(&framed(br#"{"result":{"content":[{"type":"text","text":"A"}]}}"#)[..7]);
    assert!(drain(&mut c).is_empty());
    c.handle_bytes(&framed(br#"{"result":{"content":[{"type":"text","text":"A"}]}}"#)[7..]);
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
    c.handle_bytes(&framed(
        br#"{"error":{"message":"Unknown tool: b","type":"ToolNotFoundError"}}"#,
    ));
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
    let mut c = CallToolClient::new(1024);
    c.request(&call("a"), 1);
    c.handle_connected();
    drain(&mut c);
    c.request(&call("b"), 2);
    c.handle_closed();
    let out = drain(&mut c);
    assert_eq!(
        out[0],
        ClientOutput::Completed {
            token: 1,
            outcome: Err(CallError::ConnectionLost)
        }
    );
    assert_eq!(out[1], ClientOutput::Connect, "the queued call reconnects");
    c.handle_connected();
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
    let mut c = CallToolClient::new(1024);
    c.request(&call("a"), 1);
    c.request(&call("b"), 2);
    c.handle_connected();
    drain(&mut c);
    let mut bytes = framed(br#"{"result":{"content":[{"type":"text","text":"A"}]}}"#);
    bytes.extend(framed(
        br#"{"result":{"content":[{"type":"text","text":"stray"}]}}"#,
    ));
    c.handle_bytes(&bytes);
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
    c.handle_connected();
    assert_eq!(
        drain(&mut c),
        vec![ClientOutput::Transmit(framed(&encode_call(&call("b"))))]
    );
    c.handle_bytes(&framed(
        br#"{"result":{"content":[{"type":"text","text":"B"}]}}"#,
    ));
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
    let mut c = CallToolClient::new(128);
    c.request(&call("a"), 1);
    c.request(&call("b"), 2);
    c.handle_connected();
    drain(&mut c);
    c.handle_bytes(&(1000u32).to_be_bytes());
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
    c.handle_connected();
    drain(&mut c);
    c.handle_bytes(&framed(b"not json"));
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
    let mut c = CallToolClient::new(32);
    c.request(&call("a-very-long-tool-name"), 1);
    assert!(matches!(
        &drain(&mut c)[0],
        ClientOutput::Completed {
            token: 1,
            outcome: Err(CallError::TooLarge(_))
        }
    ));
    let mut c = CallToolClient::new(1024);
    c.request(&call("a"), 1);
    c.request(&call("b"), 2);
    drain(&mut c);
    c.handle_connect_failed("connection refused");
    let out = drain(&mut c);
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|o| matches!(
        o,
        ClientOutput::Completed {
            outcome: Err(CallError::ConnectFailed(_)),
            ..
        }
    )));
    c.request(&call("c"), 3);
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
        let mut c = CallToolClient::new(1024);
        let mut next = 0u32;
        let mut completed: Vec<u32> = Vec::new();
        let mut replied: Vec<u32> = Vec::new();
        let mut on_wire = 0;
        let mut connecting = false;
        let mut sent_order: Vec<u32> = Vec::new();
        for op in ops {
            match op {
                Op::Call => { c.request(&call("t"), next); next += 1; }
                Op::Connected if connecting => { connecting = false; c.handle_connected(); }
                Op::ConnectFailed if connecting => { connecting = false; c.handle_connect_failed("no"); }
                Op::Reply if on_wire == 1 => c.handle_bytes(&framed(br#"{"result":{"content":[]}}"#)),
                Op::BadReply if on_wire == 1 => c.handle_bytes(&framed(b"[]")),
                Op::Closed => c.handle_closed(),
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
                }
            }
            if matches!(op, Op::Closed) { on_wire = 0; }
        }
        c.shutdown();
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
    let mut c = CallToolClient::new(1024);
    c.request(&call("a"), 1);
    assert_eq!(drain(&mut c), vec![ClientOutput::Connect]);
    c.handle_closed();
    assert!(drain(&mut c).is_empty());
    c.handle_connected();
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
