use proptest::prelude::*;

use super::*;
use crate::test_support::{proptest_config, snapshots};

fn raw(text: &str) -> RawJson {
    RawJson::from_text(text).unwrap()
}

fn examples() -> Vec<Frame> {
    vec![
        Frame::McpRequest(McpRequest {
            id: 1,
            method: "tools/list".into(),
            params: None,
        }),
        Frame::McpRequest(McpRequest {
            id: 2,
            method: "tools/call".into(),
            params: Some(raw(
                r#"{"name":"roster","arguments":{},"_meta":{"progressToken":7}}"#,
            )),
        }),
        Frame::McpResponse(McpResponse {
            id: 2,
            outcome: Outcome::Result(raw(
                r#"{"content":[{"type":"text","text":"team demo roster:\n- builder (you)"}]}"#,
            )),
        }),
        Frame::McpResponse(McpResponse {
            id: 3,
            outcome: Outcome::Error(RpcError {
                code: -32601,
                message: "method not found: resources/list".into(),
                data: Some(raw(r#"{"method":"resources/list"}"#)),
            }),
        }),
        Frame::McpNotification(McpNotification {
            method: "notifications/claude/channel".into(),
            params: Some(raw(
                r#"{"content":"hi","meta":{"from":"alice","thread":"dm"}}"#,
            )),
            seq: Some(7),
        }),
        Frame::McpNotification(McpNotification {
            method: "notifications/tools/list_changed".into(),
            params: None,
            seq: None,
        }),
        Frame::Ack(Ack { seq: 0 }),
        Frame::Ack(Ack { seq: 7 }),
        Frame::Shutdown(Shutdown {
            reason: Some("displaced-by-new-bridge".into()),
        }),
        Frame::Shutdown(Shutdown { reason: None }),
        Frame::Error(ErrorFrame {
            message: "runner already attached".into(),
            id: None,
        }),
        Frame::Error(ErrorFrame {
            message: "invalid mcp_request frame: missing \"method\"".into(),
            id: Some(4),
        }),
    ]
}

#[test]
fn wire_form_of_each_kind() {
    let mut wire = String::new();
    for frame in examples() {
        let bytes = encode_frame_vec(&frame, MAX_FRAME_BYTES).unwrap();
        let line = String::from_utf8(bytes).unwrap();
        assert_eq!(line.matches('\n').count(), 1);
        assert!(line.ends_with('\n'));
        assert_eq!(decode_frame(line.trim_end().as_bytes()), Ok(frame));
        wire.push_str(&line);
    }
    snapshots(|| insta::assert_snapshot!("frame_wire_form", wire));
}

#[test]
fn seed_examples_decode() {
    let cases: [(&[u8], FrameKind); 5] = [
        (
            br#"{"kind":"mcp_request","id":1,"method":"tools/list","params":{}}"#,
            FrameKind::McpRequest,
        ),
        (
            br#"{"kind":"mcp_response","id":1,"result":{"tools":[]}}"#,
            FrameKind::McpResponse,
        ),
        (
            br#"{"kind":"mcp_notification","method":"notifications/tools/list_changed"}"#,
            FrameKind::McpNotification,
        ),
        (br#"{"kind":"shutdown"}"#, FrameKind::Shutdown),
        (
            br#"{"kind":"error","message":"frame too large"}"#,
            FrameKind::Error,
        ),
    ];
    for (line, kind) in cases {
        assert_eq!(decode_frame(line).map(|f| f.kind()), Ok(kind));
    }
    // Escaped kind names and unknown extra fields are fine.
    assert_eq!(
        decode_frame(br#"{"x":[1],"kind":"shut\u0064own","reason":null}"#),
        Ok(Frame::Shutdown(Shutdown { reason: None }))
    );
}

#[test]
fn malformed_lines_are_classified() {
    let reason = |line: &[u8]| decode_frame(line).unwrap_err();
    assert_eq!(reason(b"\xc3("), DropReason::InvalidUtf8 { valid_up_to: 0 });
    assert!(matches!(
        reason(b"{\"kind\":"),
        DropReason::InvalidJson { .. }
    ));
    assert!(matches!(reason(b"nope"), DropReason::InvalidJson { .. }));
    assert_eq!(reason(b"[1,2]"), DropReason::NotAnObject);
    assert_eq!(reason(b"\"mcp_request\""), DropReason::NotAnObject);
    assert_eq!(reason(b"{}"), DropReason::MissingKind);
    assert_eq!(reason(br#"{"kind":5}"#), DropReason::MissingKind);
    assert_eq!(
        reason(br#"{"kind":"hello"}"#),
        DropReason::UnknownKind {
            kind: "hello".into()
        }
    );
    let fields = |line: &[u8]| match reason(line) {
        DropReason::InvalidFields { kind, id, .. } => (kind, id),
        other => panic!("expected InvalidFields, got {other:?}"),
    };
    assert_eq!(
        fields(br#"{"kind":"mcp_request","id":5}"#),
        (FrameKind::McpRequest, Some(5))
    );
    assert_eq!(
        fields(br#"{"kind":"mcp_request","id":5,"method":1}"#),
        (FrameKind::McpRequest, Some(5))
    );
    assert_eq!(
        fields(br#"{"kind":"mcp_request","id":"5","method":"x"}"#),
        (FrameKind::McpRequest, None)
    );
    assert_eq!(
        fields(br#"{"kind":"mcp_request","id":-1,"method":"x"}"#),
        (FrameKind::McpRequest, None)
    );
    assert_eq!(
        fields(br#"{"kind":"mcp_request","method":"x"}"#),
        (FrameKind::McpRequest, None)
    );
    assert_eq!(
        fields(br#"{"kind":"mcp_response","id":6}"#),
        (FrameKind::McpResponse, Some(6))
    );
    assert_eq!(
        fields(br#"{"kind":"mcp_response","id":6,"result":{},"error":{"code":1,"message":"m"}}"#),
        (FrameKind::McpResponse, Some(6))
    );
    assert_eq!(
        fields(br#"{"kind":"mcp_response","id":6,"error":{"code":"x","message":"m"}}"#),
        (FrameKind::McpResponse, Some(6))
    );
    assert_eq!(
        fields(br#"{"kind":"mcp_notification"}"#),
        (FrameKind::McpNotification, None)
    );
    assert_eq!(
        fields(br#"{"kind":"shutdown","reason":3}"#),
        (FrameKind::Shutdown, None)
    );
    assert_eq!(
        fields(br#"{"kind":"error","id":8}"#),
        (FrameKind::Error, Some(8))
    );
    assert_eq!(
        fields(br#"{"kind":"error","message":"m","id":1.5}"#),
        (FrameKind::Error, None)
    );
}

#[test]
fn response_null_fields() {
    // A null result is a result; a null error beside a result is ignored.
    assert_eq!(
        decode_frame(br#"{"kind":"mcp_response","id":1,"result":null}"#),
        Ok(Frame::McpResponse(McpResponse {
            id: 1,
            outcome: Outcome::Result(raw("null"))
        }))
    );
    assert_eq!(
        decode_frame(br#"{"kind":"mcp_response","id":1,"result":{},"error":null}"#),
        Ok(Frame::McpResponse(McpResponse {
            id: 1,
            outcome: Outcome::Result(raw("{}"))
        }))
    );
    assert_eq!(
        decode_frame(br#"{"kind":"mcp_response","id":1,"result":null,"error":{"code":-32603,"message":"boom"}}"#),
        Ok(Frame::McpResponse(McpResponse {
            id: 1,
            outcome: Outcome::Error(RpcError::new(-32603, "boom"))
        }))
    );
}

/// A notification whose encoded form is exactly `len` bytes, newline included.
fn notification_of_len(len: usize) -> Frame {
    let skeleton = r#"{"kind":"mcp_notification","method":"m","params":{"p":""}}"#.len() + 1;
    Frame::McpNotification(McpNotification {
        method: "m".into(),
        params: Some(raw(&format!(r#"{{"p":"{}"}}"#, "x".repeat(len - skeleton)))),
        seq: None,
    })
}

#[test]
fn encoder_and_decoder_agree_at_cap_minus_one_cap_and_cap_plus_one() {
    let cap = 4096;
    for len in [cap - 1, cap, cap + 1] {
        let frame = notification_of_len(len);
        let mut out = b"prefix".to_vec();
        let encoded = encode_frame(&frame, &mut out, cap);
        if len <= cap {
            assert_eq!(encoded, Ok(len));
            assert_eq!(out.len(), 6 + len);
        } else {
            assert_eq!(encoded, Err(FrameTooLarge { len, max: cap }));
            assert_eq!(
                out, b"prefix",
                "a refused frame leaves the buffer untouched"
            );
        }
        let bytes = encode_frame_vec(&frame, usize::MAX).unwrap();
        assert_eq!(bytes.len(), len);
        let mut dec = FrameDecoder::new(cap);
        dec.push(&bytes);
        let expected = if len <= cap {
            Decoded::Frame(frame)
        } else {
            Decoded::Dropped(Dropped {
                len,
                reason: DropReason::Oversized,
            })
        };
        assert_eq!(dec.decode(), Some(expected));
        assert_eq!(dec.decode(), None);
    }
}

#[test]
fn raw_line_breaks_never_reach_the_wire() {
    let frame = Frame::McpResponse(McpResponse {
        id: 9,
        outcome: Outcome::Result(raw("{\n  \"text\": \"two\\nlines\"\n}")),
    });
    let bytes = encode_frame_vec(&frame, MAX_FRAME_BYTES).unwrap();
    assert_eq!(
        bytes,
        b"{\"kind\":\"mcp_response\",\"id\":9,\"result\":{\"text\":\"two\\nlines\"}}\n"
    );
}

#[test]
fn decoder_skips_blank_lines_and_keeps_going_after_garbage() {
    let mut dec = FrameDecoder::new(MAX_FRAME_BYTES);
    dec.push(b"\n  \r\n{oops\n{\"kind\":\"shutdown\"}\r\n");
    assert!(matches!(
        dec.decode(),
        Some(Decoded::Dropped(Dropped {
            len: 5,
            reason: DropReason::InvalidJson { .. }
        }))
    ));
    assert_eq!(
        dec.decode(),
        Some(Decoded::Frame(Frame::Shutdown(Shutdown::default())))
    );
    assert_eq!(dec.decode(), None);
    dec.push(b"{\"kind\":\"shutdown\"}");
    assert_eq!(dec.decode(), None);
    assert_eq!(
        dec.decode_eof(),
        Some(Decoded::Frame(Frame::Shutdown(Shutdown::default())))
    );
}

// ---- property tests ----

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<String>().prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            proptest::collection::btree_map(any::<String>(), inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn raw_object() -> impl Strategy<Value = RawJson> {
    proptest::collection::btree_map("[a-z_]{1,8}", json_value(), 0..4).prop_map(|m| {
        RawJson::from_value(&m.into_iter().collect::<serde_json::Map<_, _>>()).unwrap()
    })
}

fn raw_any() -> impl Strategy<Value = RawJson> {
    json_value().prop_map(|v| RawJson::from_value(&v).unwrap())
}

pub(crate) fn arb_frame() -> impl Strategy<Value = Frame> {
    let outcome = prop_oneof![
        raw_any().prop_map(Outcome::Result),
        (
            any::<i64>(),
            any::<String>(),
            proptest::option::of(
                raw_any().prop_filter("data null reads as absent", |d| !d.is_null())
            )
        )
            .prop_map(|(code, message, data)| Outcome::Error(RpcError {
                code,
                message,
                data
            })),
    ];
    prop_oneof![
        (
            any::<u64>(),
            any::<String>(),
            proptest::option::of(raw_object())
        )
            .prop_map(|(id, method, params)| Frame::McpRequest(McpRequest {
                id,
                method,
                params
            })),
        (any::<u64>(), outcome)
            .prop_map(|(id, outcome)| Frame::McpResponse(McpResponse { id, outcome })),
        (
            any::<String>(),
            proptest::option::of(raw_object()),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(method, params, seq)| {
                Frame::McpNotification(McpNotification {
                    method,
                    params,
                    seq,
                })
            }),
        any::<u64>().prop_map(|seq| Frame::Ack(Ack { seq })),
        proptest::option::of(any::<String>())
            .prop_map(|reason| Frame::Shutdown(Shutdown { reason })),
        (any::<String>(), proptest::option::of(any::<u64>()))
            .prop_map(|(message, id)| Frame::Error(ErrorFrame { message, id })),
    ]
}

/// A line of the stream: a frame or some garbage that is not one.
#[derive(Debug, Clone)]
enum Piece {
    Frame(Frame),
    Garbage(Vec<u8>),
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        4 => arb_frame().prop_map(Piece::Frame),
        1 => proptest::collection::vec(any::<u8>().prop_filter("no newline", |b| *b != b'\n'), 0..64)
            .prop_map(Piece::Garbage),
        1 => (300usize..700).prop_map(|n| Piece::Garbage(vec![b'{'; n])),
    ]
}

fn decode_all(chunks: &[&[u8]], cap: usize) -> Vec<Decoded> {
    let mut dec = FrameDecoder::new(cap);
    let mut out = Vec::new();
    for chunk in chunks {
        dec.push(chunk);
        while let Some(d) = dec.decode() {
            out.push(d);
        }
        assert!(dec.buffered_len() < cap);
    }
    out.extend(dec.decode_eof());
    out
}

proptest! {
    #![proptest_config(proptest_config("frame"))]

    #[test]
    fn encode_then_decode_round_trips(frame in arb_frame()) {
        let bytes = encode_frame_vec(&frame, usize::MAX).unwrap();
        prop_assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 1);
        prop_assert_eq!(decode_frame(&bytes[..bytes.len() - 1]), Ok(frame));
    }

    #[test]
    fn chunking_never_changes_the_outcomes(
        pieces in proptest::collection::vec(piece(), 0..12),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..16),
    ) {
        let cap = 512;
        let mut stream = Vec::new();
        for piece in &pieces {
            match piece {
                Piece::Frame(frame) => stream.extend(encode_frame_vec(frame, usize::MAX).unwrap()),
                Piece::Garbage(bytes) => {
                    stream.extend_from_slice(bytes);
                    stream.push(b'\n');
                }
            }
        }
        let whole = decode_all(&[&stream], cap);
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
        points.sort_unstable();
        let mut chunks = Vec::new();
        let mut last = 0;
        for p in points {
            chunks.push(&stream[last..p]);
            last = p;
        }
        chunks.push(&stream[last..]);
        prop_assert_eq!(&decode_all(&chunks, cap), &whole);
        // Every frame that fits comes out intact, in order.
        let expected: Vec<&Frame> = pieces.iter().filter_map(|p| match p {
            Piece::Frame(f) if encode_frame_vec(f, cap).is_ok() => Some(f),
            _ => None,
        }).collect();
        let got: Vec<&Frame> = whole.iter().filter_map(|d| match d {
            Decoded::Frame(f) => Some(f),
            Decoded::Dropped(_) => None,
        }).collect();
        prop_assert_eq!(got, expected);
    }
}

#[test]
fn bare_carriage_returns_inside_values_are_removed_on_decode() {
    // Legal JSON whitespace, but a line break to Node's readline: decoded values never keep it,
    // so decoding then encoding is stable and byte-exact.
    let line = b"{\"kind\":\"mcp_notification\",\"method\":\"m\",\"params\":{\"a\":\"x\\r\",\r\"b\":[1,\r2]}}";
    let frame = decode_frame(line).unwrap();
    let Frame::McpNotification(n) = &frame else {
        panic!("{frame:?}")
    };
    assert_eq!(n.params.as_ref().unwrap().get(), r#"{"a":"x\r","b":[1,2]}"#);
    let bytes = encode_frame_vec(&frame, MAX_FRAME_BYTES).unwrap();
    assert_eq!(decode_frame(&bytes[..bytes.len() - 1]), Ok(frame));
}
