use std::time::{Duration, Instant};

use super::*;
use crate::test_support::snapshots;

struct Harness {
    session: BridgeSession,
    now: Instant,
    transcript: String,
}

impl Harness {
    fn new() -> Self {
        Self::with(BridgeConfig {
            server_version: "1.2.3".into(),
            ..BridgeConfig::default()
        })
    }

    fn with(config: BridgeConfig) -> Self {
        Self {
            session: BridgeSession::new(config),
            now: Instant::now(),
            transcript: String::new(),
        }
    }

    fn tick(&mut self) {
        self.now += Duration::from_millis(1);
    }

    fn agent(&mut self, line: &str) -> Vec<BridgeOutput> {
        self.tick();
        self.transcript.push_str(&format!("agent  > {line}\n"));
        self.session
            .handle_agent_bytes(format!("{line}\n").as_bytes(), self.now);
        self.drain()
    }

    fn runner(&mut self, line: &str) -> Vec<BridgeOutput> {
        self.tick();
        self.transcript.push_str(&format!("runner > {line}\n"));
        self.session
            .handle_runner_bytes(format!("{line}\n").as_bytes(), self.now);
        self.drain()
    }

    fn agent_eof(&mut self) -> Vec<BridgeOutput> {
        self.tick();
        self.transcript.push_str("agent  > <EOF>\n");
        self.session.handle_agent_eof(self.now);
        self.drain()
    }

    fn runner_closed(&mut self) -> Vec<BridgeOutput> {
        self.tick();
        self.transcript.push_str("runner > <closed>\n");
        self.session.handle_runner_closed(self.now);
        self.drain()
    }

    fn drain(&mut self) -> Vec<BridgeOutput> {
        let mut outputs = Vec::new();
        while let Some(output) = self.session.poll_output() {
            self.transcript.push_str(&match &output {
                BridgeOutput::ToAgent(b) => format!("  to agent  < {}", String::from_utf8_lossy(b)),
                BridgeOutput::ToRunner(b) => {
                    format!("  to runner < {}", String::from_utf8_lossy(b))
                }
                BridgeOutput::Event(e) => format!("  event {}\n", redact(e)),
                BridgeOutput::Exit(r) => format!("  exit {r:?}\n"),
            });
            outputs.push(output);
        }
        outputs
    }
}

fn redact(event: &BridgeEvent) -> String {
    match event {
        BridgeEvent::Answered { id, method, ok, .. } => {
            format!("Answered {{ id: {id}, method: {method:?}, ok: {ok} }}")
        }
        other => format!("{other:?}"),
    }
}

fn to_agent(outputs: &[BridgeOutput]) -> Vec<serde_json::Value> {
    outputs
        .iter()
        .filter_map(|o| match o {
            BridgeOutput::ToAgent(b) => Some(serde_json::from_slice(b).unwrap()),
            _ => None,
        })
        .collect()
}

fn to_runner(outputs: &[BridgeOutput]) -> Vec<String> {
    outputs
        .iter()
        .filter_map(|o| match o {
            BridgeOutput::ToRunner(b) => Some(String::from_utf8(b.clone()).unwrap()),
            _ => None,
        })
        .collect()
}

#[test]
fn relays_requests_responses_and_notifications() {
    let mut h = Harness::new();
    let out = h.agent(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#);
    let init = &to_agent(&out)[0];
    assert_eq!(init["id"], 0);
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(init["result"]["serverInfo"]["version"], "1.2.3");
    assert!(to_runner(&out).is_empty(), "initialize is answered locally");

    h.agent(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    let out = h.agent(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    assert_eq!(
        to_runner(&out),
        vec!["{\"kind\":\"mcp_request\",\"id\":1,\"method\":\"tools/list\"}\n"]
    );
    let out = h.agent(r#"{"jsonrpc":"2.0","id":"call-a","method":"tools/call","params":{"name":"roster","arguments":{},"_meta":{"progressToken":"tok"}}}"#);
    assert_eq!(
        to_runner(&out),
        vec![
            "{\"kind\":\"mcp_request\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"roster\",\"arguments\":{},\"_meta\":{\"progressToken\":\"tok\"}}}\n"
        ]
    );
    h.agent(r#"{"jsonrpc":"2.0","id":7,"method":"resources/list"}"#);
    let out = h.agent(r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#);
    assert_eq!(
        to_agent(&out),
        vec![serde_json::json!({"jsonrpc":"2.0","id":8,"result":{}})]
    );

    // Answers arrive out of order and are matched by the bridge's ids.
    let out = h.runner(r#"{"kind":"mcp_response","id":2,"result":{"content":[{"type":"text","text":"team demo roster:"}]}}"#);
    assert_eq!(to_agent(&out)[0]["id"], "call-a");
    let out = h.runner(r#"{"kind":"mcp_response","id":3,"error":{"code":-32601,"message":"method not found: resources/list"}}"#);
    assert_eq!(
        to_agent(&out),
        vec![
            serde_json::json!({"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"method not found: resources/list"}})
        ]
    );
    let out = h.runner(r#"{"kind":"mcp_response","id":1,"result":{"tools":[]}}"#);
    assert_eq!(to_agent(&out)[0]["id"], 1);
    let out = h.runner(r#"{"kind":"mcp_notification","method":"notifications/claude/channel","params":{"content":"hi","meta":{"from":"alice"}}}"#);
    assert_eq!(
        to_agent(&out),
        vec![
            serde_json::json!({"jsonrpc":"2.0","method":"notifications/claude/channel","params":{"content":"hi","meta":{"from":"alice"}}})
        ]
    );
    let out =
        h.runner(r#"{"kind":"mcp_notification","method":"notifications/tools/list_changed"}"#);
    assert_eq!(
        to_agent(&out),
        vec![serde_json::json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"})]
    );
    assert_eq!(h.session.pending_len(), 0);

    let out = h.agent_eof();
    assert_eq!(
        to_runner(&out),
        vec!["{\"kind\":\"shutdown\",\"reason\":\"stdio-closed\"}\n"]
    );
    assert_eq!(
        out.last(),
        Some(&BridgeOutput::Exit(ExitReason::AgentClosed))
    );
    assert!(
        h.agent(r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#)
            .is_empty(),
        "closed: input ignored"
    );
    snapshots(|| insta::assert_snapshot!("bridge_relay_transcript", h.transcript));
}

#[test]
fn responses_pass_the_result_through_byte_exact() {
    let mut h = Harness::new();
    h.agent(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#);
    let result = r#"{"content":[{"type":"text","text":"é \u00e9 \"q\" 1.50"}],"structuredContent":{"n":1e3}}"#;
    let out = h.runner(&format!(
        r#"{{"kind":"mcp_response","id":1,"result":{result}}}"#
    ));
    let BridgeOutput::ToAgent(line) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(
        String::from_utf8(line.clone()).unwrap(),
        format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{result}}}\n")
    );
}

#[test]
fn bad_input_gets_answers_and_the_session_goes_on() {
    let mut h = Harness::with(BridgeConfig {
        max_frame_bytes: 256,
        max_agent_line_bytes: 1024,
        server_version: "1.2.3".into(),
    });
    let out = h.agent("{not json");
    assert_eq!(to_agent(&out)[0]["error"]["code"], -32700);
    assert_eq!(to_agent(&out)[0]["id"], serde_json::Value::Null);
    let out = h.agent(r#"{"jsonrpc":"2.0","id":4,"method":7}"#);
    assert_eq!(to_agent(&out)[0]["error"]["code"], -32600);
    assert_eq!(to_agent(&out)[0]["id"], 4);
    // Too large for a frame, small enough to read: answered under its id, never sent.
    let big = "x".repeat(400);
    let out = h.agent(&format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"{big}"}}}}"#
    ));
    assert!(to_runner(&out).is_empty());
    assert_eq!(to_agent(&out)[0]["id"], 5);
    assert_eq!(to_agent(&out)[0]["error"]["code"], -32603);
    // Too large to read at all: answered under a null id.
    let huge = "y".repeat(2000);
    let out = h.agent(&format!(
        r#"{{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{{"name":"{huge}"}}}}"#
    ));
    assert_eq!(to_agent(&out)[0]["error"]["code"], -32600);
    assert_eq!(to_agent(&out)[0]["id"], serde_json::Value::Null);
    // Still serving.
    let out = h.agent(r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#);
    assert_eq!(to_runner(&out).len(), 1);

    // Garbage, unmatched and unexpected frames from the runner are dropped.
    assert!(to_agent(&h.runner("garbage")).is_empty());
    assert!(to_agent(&h.runner(r#"{"kind":"mcp_response","id":99,"result":{}}"#)).is_empty());
    assert!(to_agent(&h.runner(r#"{"kind":"mcp_request","id":1,"method":"x"}"#)).is_empty());
    assert!(to_agent(&h.runner(r#"{"kind":"error","message":"connection-level"}"#)).is_empty());
    assert_eq!(h.session.pending_len(), 1);
    // A malformed response for a pending id fails that request instead of leaving it waiting.
    let out = h.runner(r#"{"kind":"mcp_response","id":1}"#);
    assert_eq!(to_agent(&out)[0]["id"], 7);
    assert_eq!(to_agent(&out)[0]["error"]["code"], -32603);
    assert_eq!(h.session.pending_len(), 0);
    snapshots(|| insta::assert_snapshot!("bridge_bad_input_transcript", h.transcript));
}

#[test]
fn error_frame_with_id_fails_that_request() {
    let mut h = Harness::new();
    h.agent(r#"{"jsonrpc":"2.0","id":"a","method":"tools/list"}"#);
    h.agent(r#"{"jsonrpc":"2.0","id":"b","method":"tools/list"}"#);
    let out = h.runner(r#"{"kind":"error","message":"invalid mcp_request frame","id":2}"#);
    assert_eq!(
        to_agent(&out),
        vec![
            serde_json::json!({"jsonrpc":"2.0","id":"b","error":{"code":-32603,"message":"invalid mcp_request frame"}})
        ]
    );
    assert_eq!(h.session.pending_len(), 1);
}

#[test]
fn cancelled_request_is_forgotten_and_its_late_answer_dropped() {
    let mut h = Harness::new();
    h.agent(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"slow"}}"#);
    let out = h.agent(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3,"reason":"user"}}"#);
    assert_eq!(
        out,
        vec![BridgeOutput::Event(BridgeEvent::Cancelled { id: 1 })]
    );
    let out = h.runner(r#"{"kind":"mcp_response","id":1,"result":{}}"#);
    assert_eq!(
        out,
        vec![BridgeOutput::Event(BridgeEvent::Unmatched { id: 1 })]
    );
}

#[test]
fn every_pending_request_is_answered_when_the_runner_goes_away() {
    for (end, exit) in [
        ("closed", ExitReason::RunnerClosed),
        (
            "shutdown",
            ExitReason::RunnerShutdown {
                reason: Some("displaced-by-new-bridge".into()),
            },
        ),
    ] {
        let mut h = Harness::new();
        for id in 1..=3 {
            h.agent(&format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#
            ));
        }
        h.runner(r#"{"kind":"mcp_response","id":2,"result":{"tools":[]}}"#);
        let out = match end {
            "closed" => h.runner_closed(),
            _ => h.runner(r#"{"kind":"shutdown","reason":"displaced-by-new-bridge"}"#),
        };
        let answers = to_agent(&out);
        let ids: Vec<_> = answers.iter().map(|a| a["id"].clone()).collect();
        assert_eq!(ids, vec![serde_json::json!(1), serde_json::json!(3)]);
        assert!(answers.iter().all(|a| a["error"]["code"] == -32603));
        assert!(
            to_runner(&out).is_empty(),
            "no shutdown frame to a runner that is gone"
        );
        assert_eq!(out.last(), Some(&BridgeOutput::Exit(exit)));
        if end == "shutdown" {
            snapshots(|| {
                insta::assert_snapshot!("bridge_runner_shutdown_transcript", h.transcript)
            });
        }
    }
}

#[test]
fn terminate_answers_pending_and_says_goodbye() {
    let mut h = Harness::new();
    h.agent(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    h.session.handle_terminate(h.now);
    let out = h.drain();
    assert_eq!(to_agent(&out).len(), 1);
    assert_eq!(
        to_runner(&out),
        vec!["{\"kind\":\"shutdown\",\"reason\":\"terminated\"}\n"]
    );
    assert_eq!(
        out.last(),
        Some(&BridgeOutput::Exit(ExitReason::Terminated))
    );
    h.session.handle_terminate(h.now);
    assert!(h.drain().is_empty(), "teardown happens once");
}

#[test]
fn frames_split_across_reads_and_crlf() {
    let mut h = Harness::new();
    h.agent(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    let frame = "{\"kind\":\"mcp_response\",\"id\":1,\"result\":{\"t\":\"ü\"}}\r\n".as_bytes();
    for b in frame {
        h.session
            .handle_runner_bytes(std::slice::from_ref(b), h.now);
    }
    let out = h.drain();
    assert_eq!(to_agent(&out)[0]["result"]["t"], "ü");
}
