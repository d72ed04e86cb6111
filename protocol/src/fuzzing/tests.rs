//! The oracles on random and typical inputs, and the fuzz corpus replayed.

use proptest::prelude::*;

use super::*;
use crate::test_support::proptest_config;

proptest! {
    #![proptest_config(proptest_config("fuzzing"))]

    #[test]
    fn decode_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        decode_chunks(&data);
    }

    #[test]
    fn decode_oracle_holds_on_frame_like_input(
        header in proptest::collection::vec(any::<u8>(), 2),
        lines in proptest::collection::vec(
            prop_oneof![
                Just(r#"{"kind":"mcp_request","id":1,"method":"tools/list"}"#.to_owned()),
                Just(r#"{"kind":"mcp_response","id":2,"result":{}}"#.to_owned()),
                Just(r#"{"kind":"shutdown"}"#.to_owned()),
                Just(r#"{"kind":"mcp_request","id":3}"#.to_owned()),
                "[ -~]{0,40}",
            ],
            0..20,
        ),
    ) {
        let mut data = header;
        for line in lines {
            data.extend_from_slice(line.as_bytes());
            data.push(b'\n');
        }
        decode_chunks(&data);
    }

    #[test]
    fn bridge_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        bridge_ops(&data);
    }

    #[test]
    fn live_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        live_ops(&data);
    }

    #[test]
    fn runner_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        runner_ops(&data);
    }

    #[test]
    fn decode_lp_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        decode_lp(&data);
    }

    #[test]
    fn ash_bridge_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        ash_bridge_ops(&data);
    }

    #[test]
    fn ash_host_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        ash_host_ops(&data);
    }

    #[test]
    fn trace_http_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        trace_http(&data);
    }

    #[test]
    fn trace_http_oracle_holds_on_http_like_input(
        flags in any::<u8>(),
        seed in any::<u8>(),
        requests in proptest::collection::vec(prop_oneof![
            Just("GET / HTTP/1.1\r\nHost: api.anthropic.com\r\n\r\n".to_owned()),
            Just("POST /v1/messages HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}".to_owned()),
            Just("POST /v1/responses HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n".to_owned()),
            Just("GET /ws HTTP/1.1\r\nUpgrade: x\r\n\r\n".to_owned()),
            "[ -~]{0,30}",
        ], 0..5),
        responses in proptest::collection::vec(prop_oneof![
            Just("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}".to_owned()),
            Just("HTTP/1.1 100 Continue\r\n\r\n".to_owned()),
            Just("HTTP/1.1 101 Switching\r\n\r\nraw".to_owned()),
            Just("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ndata:\r\n0\r\n\r\n".to_owned()),
            Just("HTTP/1.1 204 No Content\r\n\r\n".to_owned()),
            "[ -~]{0,30}",
        ], 0..5),
    ) {
        let client = requests.concat();
        let mut data = vec![flags, seed];
        data.extend_from_slice(&(client.len() as u16).to_le_bytes());
        data.extend_from_slice(client.as_bytes());
        data.extend_from_slice(responses.concat().as_bytes());
        trace_http(&data);
    }

    #[test]
    fn trace_redact_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        trace_redact(&data);
    }

    #[test]
    fn signin_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        signin_ops(&data);
    }

    #[test]
    fn trace_upload_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        trace_upload(&data);
    }

    #[test]
    fn call_tool_bridge_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        call_tool_bridge_ops(&data);
    }

    /// The same oracle on inputs made of the steps that matter most (calls, connecting,
    /// replies, cancels, time passing), so cancels on the wire, late replies and timeouts
    /// come up in every run, not only under a coverage-guided fuzzer.
    #[test]
    fn call_tool_bridge_oracle_holds_on_scripted_input(
        cap in any::<u8>(),
        steps in proptest::collection::vec(ctb_step(), 0..60),
    ) {
        call_tool_bridge_ops(&ctb_script(cap, &steps));
    }

    #[test]
    fn codex_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        codex_ops(&data);
    }
}

/// One step of a scripted `call_tool_bridge` input (see [`call_tool_bridge_ops`] for how
/// each is read).
#[derive(Debug, Clone)]
enum CtbStep {
    /// A request: kind (`% 10`), padding choice, where the line is split.
    Request(u8, u8, u8),
    /// A cancel: of any request, or of a waiting call; which one.
    Cancel(bool, u8),
    /// A connection report.
    Connect(u8),
    /// One or two reply frames: their kinds and `isError` bytes, and where they split.
    Reply(bool, [(u8, u8); 2], u8),
    /// The parent closes.
    Close,
    /// Time passes by this many quarters of the call timeout (`% 6`).
    Wait(u8),
    /// The timer fires early.
    Early,
}

fn ctb_step() -> impl Strategy<Value = CtbStep> {
    prop_oneof![
        3 => (6u8..10, any::<u8>(), any::<u8>()).prop_map(|(k, p, s)| CtbStep::Request(k, p, s)),
        1 => (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(k, p, s)| CtbStep::Request(k, p, s)),
        2 => (any::<bool>(), any::<u8>()).prop_map(|(a, i)| CtbStep::Cancel(a, i)),
        2 => (1u8..3).prop_map(CtbStep::Connect),
        1 => Just(CtbStep::Connect(0)),
        3 => (any::<bool>(), any::<[(u8, u8); 2]>(), any::<u8>())
            .prop_map(|(two, kinds, split)| CtbStep::Reply(two, kinds, split)),
        1 => Just(CtbStep::Close),
        2 => (0u8..6).prop_map(CtbStep::Wait),
        1 => Just(CtbStep::Early),
    ]
}

/// The input bytes [`call_tool_bridge_ops`] reads as these steps.
fn ctb_script(cap: u8, steps: &[CtbStep]) -> Vec<u8> {
    let mut out = vec![cap];
    for step in steps {
        match *step {
            CtbStep::Request(kind, pad, split) => {
                out.extend([0, kind]);
                if kind % 10 >= 8 {
                    out.push(pad);
                }
                out.push(split);
            }
            CtbStep::Cancel(any, pick) => out.extend([4, if any { 0 } else { 1 }, pick]),
            CtbStep::Connect(how) => out.extend([6, how]),
            CtbStep::Reply(two, kinds, split) => {
                out.extend([7, if two { 0 } else { 1 }]);
                for (kind, is_error) in &kinds[..if two { 2 } else { 1 }] {
                    out.push(*kind);
                    if kind % 7 <= 1 {
                        out.push(*is_error);
                    }
                }
                out.push(split);
            }
            CtbStep::Close => out.push(10),
            CtbStep::Wait(quarters) => out.extend([12, quarters]),
            CtbStep::Early => out.push(13),
        }
    }
    out
}

/// The committed seed corpora (`fuzz/corpus/<target>/`) hold their oracles too.
#[test]
fn oracles_hold_on_the_seed_corpora() {
    for (target, oracle) in [
        ("codex", codex_ops as fn(&[u8])),
        ("acp", acp_ops),
        ("call_tool_bridge", call_tool_bridge_ops),
    ] {
        let dir = format!("{}/../fuzz/corpus/{target}", env!("CARGO_MANIFEST_DIR"));
        let mut seeds = 0;
        for entry in std::fs::read_dir(&dir).expect("the seed corpus exists") {
            oracle(&std::fs::read(entry.expect("a readable entry").path()).expect("a seed"));
            seeds += 1;
        }
        assert!(seeds > 0, "{dir} holds no seeds");
    }
}

proptest! {
    #![proptest_config(proptest_config("fuzzing"))]

    #[test]
    fn sse_oracle_holds_raw(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        let mut data = data;
        if let Some(first) = data.first_mut() {
            *first &= !1;
        }
        sse_stream(&data);
    }

    #[test]
    fn sse_oracle_holds_encoded(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        let mut data = data;
        if let Some(first) = data.first_mut() {
            *first |= 1;
        }
        sse_stream(&data);
    }

    #[test]
    fn tracker_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        tracker_ops(&data);
    }
}

/// Raw SSE text with the usual shapes (comments, ids, multi-line data, CRLF, a BOM).
#[test]
fn sse_oracle_holds_on_typical_streams() {
    for text in [
        "\u{feff}: hi\n\nid: 1\nevent: message\ndata: {\"a\":1}\n\n",
        "data: a\r\ndata: b\r\n\r\nretry: 50\n: keepalive\n\n",
        "id: 7\ndata\n\nid\ndata: x\n\n",
    ] {
        let mut data = vec![0, 255, 3];
        data.extend_from_slice(text.as_bytes());
        sse_stream(&data);
    }
}
