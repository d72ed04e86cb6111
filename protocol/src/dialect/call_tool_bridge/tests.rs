use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::codec::length_prefixed::{self, LpDecoder};
use crate::dialect::call_tool::{encode_reply, parse_schema_file};
use crate::test_support::snapshots;

fn tools() -> Vec<ToolSchema> {
    parse_schema_file(
        r#"[{"name":"echo","description":"Echo text back","input_schema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}},
            {"name":"add","description":"Add two integers","input_schema":{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}}]"#,
    )
    .unwrap()
}

struct Harness {
    bridge: CallToolBridge,
    transcript: String,
    /// The time every input happens at; tests move it forward.
    now: Instant,
}

impl Harness {
    fn new(max_payload_bytes: usize) -> Self {
        let config = CallToolBridgeConfig {
            max_payload_bytes,
            server_version: "1.2.3".into(),
            ..CallToolBridgeConfig::default()
        };
        Self {
            bridge: CallToolBridge::new(config, tools()),
            transcript: String::new(),
            now: Instant::now(),
        }
    }

    fn with_timeout(call_timeout: Duration) -> Self {
        let config = CallToolBridgeConfig {
            server_version: "1.2.3".into(),
            call_timeout,
            ..CallToolBridgeConfig::default()
        };
        Self {
            bridge: CallToolBridge::new(config, tools()),
            transcript: String::new(),
            now: Instant::now(),
        }
    }

    fn agent(&mut self, line: &str) -> Vec<CallToolBridgeOutput> {
        self.transcript.push_str(&format!("agent  > {line}\n"));
        self.bridge
            .handle_agent_bytes(format!("{line}\n").as_bytes(), self.now);
        self.drain()
    }

    fn parent(&mut self, reply: &Reply) -> Vec<CallToolBridgeOutput> {
        let payload = encode_reply(reply);
        self.transcript
            .push_str(&format!("parent > {}\n", String::from_utf8_lossy(&payload)));
        let mut frame = Vec::new();
        length_prefixed::encode(&payload, &mut frame, usize::MAX).unwrap();
        self.bridge.handle_parent_bytes(&frame, self.now);
        self.drain()
    }

    fn event(
        &mut self,
        label: &str,
        f: impl FnOnce(&mut CallToolBridge, Instant),
    ) -> Vec<CallToolBridgeOutput> {
        self.transcript.push_str(&format!("{label}\n"));
        f(&mut self.bridge, self.now);
        self.drain()
    }

    fn drain(&mut self) -> Vec<CallToolBridgeOutput> {
        let out: Vec<_> = std::iter::from_fn(|| self.bridge.poll_output()).collect();
        for o in &out {
            self.transcript.push_str(&match o {
                CallToolBridgeOutput::Transmit {
                    to: CallToolPeer::Agent,
                    bytes: l,
                } => {
                    format!("  to agent  < {}", String::from_utf8_lossy(l))
                }
                CallToolBridgeOutput::Transmit {
                    to: CallToolPeer::Parent,
                    bytes: f,
                } => {
                    let mut dec = LpDecoder::default();
                    dec.push(f);
                    let payload = dec.decode().unwrap().unwrap();
                    format!("  to parent < {}\n", String::from_utf8_lossy(&payload))
                }
                other => format!("  {other:?}\n"),
            });
        }
        out
    }
}

fn agent_lines(out: &[CallToolBridgeOutput]) -> Vec<Value> {
    out.iter()
        .filter_map(|o| match o {
            CallToolBridgeOutput::Transmit {
                to: CallToolPeer::Agent,
                bytes: l,
            } => Some(serde_json::from_slice(l).unwrap()),
            _ => None,
        })
        .collect()
}

fn sent(out: &[CallToolBridgeOutput]) -> usize {
    out.iter()
        .filter(|o| {
            matches!(
                o,
                CallToolBridgeOutput::Transmit {
                    to: CallToolPeer::Parent,
                    bytes: _
                }
            )
        })
        .count()
}

#[test]
fn scripted_session() {
    let mut h = Harness::new(MAX_PAYLOAD_BYTES);
    let out = h.agent(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}"#);
    assert_eq!(
        agent_lines(&out)[0]["result"]["capabilities"],
        json!({"tools": {}})
    );
    let out = h.agent(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    assert_eq!(
        agent_lines(&out)[0]["result"]["tools"][1]["inputSchema"]["required"],
        json!(["a", "b"])
    );
    assert!(
        !out.contains(&CallToolBridgeOutput::Connect),
        "tools/list never touches the socket"
    );

    // Validation happens before anything is sent.
    let out = h.agent(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":"2"}}}"#);
    assert_eq!(
        agent_lines(&out)[0]["result"],
        json!({"content":[{"type":"text","text":"Input validation error: arguments.b: want integer, but got string"}],"isError":true})
    );
    assert!(!out.contains(&CallToolBridgeOutput::Connect));

    // Three calls at once: connect lazily, then strictly one on the wire.
    let out = h.agent(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"},"_meta":{"progressToken":1}}}"#);
    assert_eq!(out, vec![CallToolBridgeOutput::Connect]);
    h.agent(r#"{"jsonrpc":"2.0","id":"four","method":"tools/call","params":{"name":"nope","arguments":{}}}"#);
    h.agent(r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"add","arguments":{"a":2,"b":3}}}"#);
    let out = h.event("(connected)", |b, now| b.handle_connected(now));
    assert_eq!(sent(&out), 1);
    let out = h.parent(&Reply::Result(
        RawJson::from_text(r#"{"content":[{"type":"text","text":"hi"}],"isError":true}"#).unwrap(),
    ));
    let lines = agent_lines(&out);
    assert_eq!(lines[0]["id"], 3);
    assert_eq!(
        lines[0]["result"]["isError"], true,
        "isError from the parent is preserved"
    );
    assert_eq!(sent(&out), 1, "the next call goes out only after the reply");
    let out = h.parent(&Reply::Error {
        message: "Unknown tool: nope".into(),
        error_type: "ToolNotFoundError".into(),
    });
    assert_eq!(
        agent_lines(&out)[0],
        json!({"jsonrpc":"2.0","id":"four","result":{"content":[{"type":"text","text":"Unknown tool: nope (type: ToolNotFoundError)"}],"isError":true}})
    );
    // The parent drops mid-call: that call fails, the next one reconnects.
    let out = h.event("(parent closed)", |b, now| b.handle_parent_closed(now));
    let lines = agent_lines(&out);
    assert_eq!(lines[0]["id"], 5);
    assert_eq!(
        lines[0]["result"]["isError"], true,
        "a result, not a JSON-RPC error"
    );
    assert_eq!(
        lines[0]["result"]["content"][0]["text"],
        "add: the parent closed the connection before replying; the call may or may not have \
         run. The next call reconnects."
    );
    let out = h.agent(r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"echo","arguments":{"text":"again"}}}"#);
    assert_eq!(out, vec![CallToolBridgeOutput::Connect]);
    h.event("(connected)", |b, now| b.handle_connected(now));
    let out = h.agent(r#"{"jsonrpc":"2.0","id":7,"method":"resources/list"}"#);
    assert_eq!(agent_lines(&out)[0]["error"]["code"], -32601);
    let out = h.event("(agent EOF)", |b, now| b.handle_agent_eof(now));
    assert_eq!(
        agent_lines(&out)[0]["id"],
        6,
        "pending calls are answered at teardown"
    );
    assert_eq!(out.last(), Some(&CallToolBridgeOutput::Exit));
    snapshots(|| insta::assert_snapshot!("call_tool_bridge_transcript", h.transcript));
}

#[test]
fn oversized_request_and_connect_failure_are_answered() {
    let mut h = Harness::new(128);
    let big = "x".repeat(200);
    let out = h.agent(&format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{big}"}}}}}}"#));
    let lines = agent_lines(&out);
    assert_eq!(lines[0]["result"]["isError"], true);
    assert!(
        lines[0]["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("request too large")
    );
    let out = h.agent(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}"#);
    assert_eq!(out, vec![CallToolBridgeOutput::Connect]);
    let out = h.event("(connect failed)", |b, now| {
        b.handle_connect_failed("No such file or directory", now)
    });
    let lines = agent_lines(&out);
    assert_eq!(lines[0]["result"]["isError"], true, "{}", lines[0]);
    assert_eq!(
        lines[0]["result"]["content"][0]["text"],
        "echo: cannot connect to the parent process (No such file or directory); the call was \
         not sent. Check that the parent is running; the next call tries to connect again."
    );
    let out = h.agent("garbage");
    assert_eq!(agent_lines(&out)[0]["error"]["code"], -32700);
}

#[test]
fn cancelled_call_is_not_answered() {
    let mut h = Harness::new(MAX_PAYLOAD_BYTES);
    h.agent(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}"#);
    h.event("(connected)", |b, now| b.handle_connected(now));
    h.agent(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#);
    let out = h.parent(&Reply::Result(mcp::tool_text("x")));
    assert!(agent_lines(&out).is_empty());
}

#[test]
fn transport_failures_and_invalid_results_are_is_error_results() {
    let mut h = Harness::new(MAX_PAYLOAD_BYTES);
    let call = |id: u32| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"x"}}}}}}"#
        )
    };
    h.agent(&call(1));
    h.event("(connected)", |b, now| b.handle_connected(now));
    for (id, result, why) in [
        (1, "{}", "the result has no \"content\" list"),
        (
            2,
            r#"{"content":"hi"}"#,
            "\"content\" is string, not a list",
        ),
        (
            3,
            r#"{"content":[]}"#,
            "\"content\" is empty; it must hold at least one content block",
        ),
        (
            4,
            r#"{"content":[{"type":"video","text":"x"}]}"#,
            "content[0] has type \"video\", which is none of text, image, audio, resource_link, resource",
        ),
        (
            5,
            r#"{"content":[{"text":"x"}]}"#,
            "content[0] has no \"type\"",
        ),
        (
            6,
            r#"{"content":[{"type":"text","text":"a"},{"type":"text","text":5}]}"#,
            "content[1] (text): \"text\" is number, not a string",
        ),
        (
            7,
            r#"{"content":[{"type":"text","text":"a"}],"isError":"yes"}"#,
            "\"isError\" is string, not a boolean",
        ),
    ] {
        if id > 1 {
            h.agent(&call(id));
        }
        let out = h.parent(&Reply::Result(RawJson::from_text(result).unwrap()));
        let lines = agent_lines(&out);
        assert_eq!(lines[0]["id"], id);
        assert_eq!(lines[0]["result"]["isError"], true, "{result}");
        assert_eq!(
            lines[0]["result"]["content"][0]["text"],
            format!(
                "echo: the parent returned an invalid tool result ({why}); a tool result needs \
                 a non-empty \"content\" list of content blocks"
            ),
            "{result}"
        );
        assert!(out.iter().any(|o| matches!(
            o,
            CallToolBridgeOutput::Event(CallToolBridgeEvent::InvalidResult { .. })
        )));
    }
    // Valid results of every content type pass through unchanged.
    let valid = r#"{"content":[{"type":"text","text":"t","annotations":{"priority":1}},{"type":"image","data":"AA==","mimeType":"image/png"},{"type":"audio","data":"AA==","mimeType":"audio/wav"},{"type":"resource_link","uri":"file:///a","name":"a"},{"type":"resource","resource":{"uri":"file:///b","text":"b"}}],"structuredContent":{"n":1},"isError":false,"_meta":{"k":1}}"#;
    h.agent(&call(8));
    let out = h.parent(&Reply::Result(RawJson::from_text(valid).unwrap()));
    assert_eq!(
        agent_lines(&out)[0]["result"],
        serde_json::from_str::<Value>(valid).unwrap()
    );

    // A reply whose declared length is over the cap: framing is lost, the connection is dropped,
    // the call is an isError result, and the next call reconnects.
    h.agent(&call(9));
    let over = ((MAX_PAYLOAD_BYTES + 1) as u32).to_be_bytes();
    let out = h.event("(parent sends an over-cap length)", |b, now| {
        b.handle_parent_bytes(&over, now)
    });
    let lines = agent_lines(&out);
    assert_eq!(lines[0]["result"]["isError"], true);
    let text = lines[0]["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("echo: protocol error from the parent (")
            && text.ends_with("the connection was dropped and the call may or may not have run. The next call reconnects."),
        "{text}"
    );
    assert!(out.contains(&CallToolBridgeOutput::Disconnect));
    let out = h.agent(&call(10));
    assert_eq!(out, vec![CallToolBridgeOutput::Connect]);
}

/// `tools/call` with no `params` at all, or params without a usable name: JSON-RPC `-32602`
/// saying what the request needs.
#[test]
fn tools_call_without_params_is_invalid_params() {
    let mut h = Harness::new(MAX_PAYLOAD_BYTES);
    let out = h.agent(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#);
    assert_eq!(
        agent_lines(&out)[0],
        json!({"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":
            "tools/call needs params {\"name\": <tool name>, \"arguments\": {…}}; the request has no params"}})
    );
    let out =
        h.agent(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"arguments":{}}}"#);
    assert_eq!(
        agent_lines(&out)[0]["error"],
        json!({"code":-32602,"message":"tools/call needs params.name (a string): it is missing"})
    );
    let out = h.agent(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":7}}"#);
    assert_eq!(
        agent_lines(&out)[0]["error"],
        json!({"code":-32602,"message":"tools/call needs params.name (a string): it is a number"})
    );
    let out = h.agent(r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":[1]}"#);
    assert_eq!(
        agent_lines(&out)[0]["error"],
        json!({"code":-32602,"message":
            "tools/call needs params {\"name\": <tool name>, \"arguments\": {…}}; params is an array"})
    );
    assert!(
        !out.contains(&CallToolBridgeOutput::Connect),
        "nothing goes to the parent"
    );
}

fn echo_call(id: u32, text: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{text}"}}}}}}"#
    )
}

fn text_reply(text: &str) -> Reply {
    Reply::Result(mcp::tool_text(text))
}

/// A parent that never answers: at the deadline the agent gets an `isError` result naming the
/// timeout, the silent connection is dropped, and the next call goes out on a new one.
#[test]
fn a_parent_that_never_answers_times_out() {
    let mut h = Harness::with_timeout(Duration::from_secs(30));
    h.agent(&echo_call(1, "lost"));
    h.agent(&echo_call(2, "queued"));
    let t0 = h.now;
    let out = h.event("(connected)", |b, now| b.handle_connected(now));
    assert_eq!(sent(&out), 1);
    assert_eq!(h.bridge.poll_timeout(), Some(t0 + Duration::from_secs(30)));
    h.now += Duration::from_secs(29);
    let out = h.event("(29 s later: the timer fires early)", |b, now| {
        b.handle_timeout(now)
    });
    assert!(out.is_empty(), "{out:?}");
    h.now += Duration::from_secs(1);
    let out = h.event("(30 s: the deadline)", |b, now| b.handle_timeout(now));
    let lines = agent_lines(&out);
    assert_eq!(
        lines[0],
        json!({"jsonrpc":"2.0","id":1,"result":{"isError":true,"content":[{"type":"text","text":
            "echo: the parent did not reply within 30 s (the bridge's call timeout); the call may \
             or may not have run, and may still be running. The connection was dropped; the next \
             call reconnects."}]}})
    );
    let disconnect = out
        .iter()
        .position(|o| *o == CallToolBridgeOutput::Disconnect);
    let connect = out.iter().position(|o| *o == CallToolBridgeOutput::Connect);
    assert!(
        disconnect.is_some() && disconnect < connect,
        "dropped, then reconnected for the queued call: {out:?}"
    );
    assert!(out.iter().any(|o| matches!(
        o,
        CallToolBridgeOutput::Event(CallToolBridgeEvent::Completed {
            error: Some(CallError::TimedOut { .. }),
            ..
        })
    )));
    let out = h.event("(connected)", |b, now| b.handle_connected(now));
    assert_eq!(sent(&out), 1, "the queued call goes out");
    let out = h.parent(&text_reply("queued"));
    assert_eq!(
        agent_lines(&out)[0],
        json!({"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"queued"}]}})
    );
    assert_eq!(h.bridge.poll_timeout(), None);
    snapshots(|| insta::assert_snapshot!("call_tool_bridge_timeout_transcript", h.transcript));
}

/// Cancelling the call on the wire frees the queue at once; the parent's reply to the
/// cancelled call is discarded when it comes and never answers the next call. Cancelling a
/// queued call removes it: it is never sent. Neither is answered.
#[test]
fn cancel_frees_the_queue_and_the_late_reply_is_discarded() {
    let mut h = Harness::new(MAX_PAYLOAD_BYTES);
    h.agent(&echo_call(1, "one"));
    h.agent(&echo_call(2, "two"));
    h.agent(&echo_call(3, "three"));
    h.event("(connected)", |b, now| b.handle_connected(now));
    let out = h.agent(
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2,"reason":"queued"}}"#,
    );
    assert_eq!(sent(&out), 0, "cancelling a queued call sends nothing");
    let out = h.agent(
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":"on the wire"}}"#,
    );
    assert!(
        agent_lines(&out).is_empty(),
        "a cancelled call is not answered"
    );
    assert_eq!(sent(&out), 1, "the queue moves on at once");
    assert!(out.contains(&CallToolBridgeOutput::Event(
        CallToolBridgeEvent::Cancelled {
            tool: "echo".into(),
            on_wire: true
        }
    )));
    let out = h.parent(&text_reply("one (late)"));
    assert!(
        agent_lines(&out).is_empty(),
        "the late reply answers nobody"
    );
    assert!(out.iter().any(|o| matches!(
        o,
        CallToolBridgeOutput::Event(CallToolBridgeEvent::LateReplyDiscarded { .. })
    )));
    assert!(!out.contains(&CallToolBridgeOutput::Disconnect));
    let out = h.parent(&text_reply("three"));
    assert_eq!(
        agent_lines(&out),
        vec![json!({"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"three"}]}})]
    );
    let out = h.event("(agent EOF)", |b, now| b.handle_agent_eof(now));
    assert!(agent_lines(&out).is_empty(), "nothing left to answer");
    snapshots(|| insta::assert_snapshot!("call_tool_bridge_cancel_transcript", h.transcript));
}
