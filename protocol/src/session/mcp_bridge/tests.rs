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

    /// Time passes until `after` from now; the session's timer fires if due.
    fn wait(&mut self, after: Duration) -> Vec<BridgeOutput> {
        self.now += after;
        self.transcript
            .push_str(&format!("(+{} ms)\n", after.as_millis()));
        self.session.handle_timeout(self.now);
        self.drain()
    }

    fn drain(&mut self) -> Vec<BridgeOutput> {
        let mut outputs = Vec::new();
        while let Some(output) = self.session.poll_output() {
            self.transcript.push_str(&match &output {
                BridgeOutput::Transmit {
                    to: BridgePeer::Agent,
                    bytes: b,
                } => format!("  to agent  < {}", String::from_utf8_lossy(b)),
                BridgeOutput::Transmit {
                    to: BridgePeer::Runner,
                    bytes: b,
                } => {
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
            BridgeOutput::Transmit {
                to: BridgePeer::Agent,
                bytes: b,
            } => Some(serde_json::from_slice(b).unwrap()),
            _ => None,
        })
        .collect()
}

fn to_runner(outputs: &[BridgeOutput]) -> Vec<String> {
    outputs
        .iter()
        .filter_map(|o| match o {
            BridgeOutput::Transmit {
                to: BridgePeer::Runner,
                bytes: b,
            } => Some(String::from_utf8(b.clone()).unwrap()),
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
    // The session's first output is its promise to acknowledge; initialize is answered locally.
    assert_eq!(
        to_runner(&out),
        vec!["{\"kind\":\"ack\",\"seq\":0}\n"],
        "initialize is answered locally"
    );

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
    // The agent is ready once the start-up grace has passed.
    h.wait(START_GRACE);
    assert!(h.session.is_delivering());
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
    let BridgeOutput::Transmit {
        to: BridgePeer::Agent,
        bytes: line,
    } = &out[0]
    else {
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
        ..BridgeConfig::default()
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

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

fn channel(n: usize) -> String {
    format!(
        r#"{{"kind":"mcp_notification","method":"notifications/claude/channel","params":{{"content":"m{n}","meta":{{}}}}}}"#
    )
}

/// The `content` of every channel notification written to the agent, in order.
fn delivered(outputs: &[BridgeOutput]) -> Vec<String> {
    to_agent(outputs)
        .iter()
        .filter(|m| m["method"] == "notifications/claude/channel")
        .map(|m| m["params"]["content"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn notifications_wait_for_the_handshake_the_first_tools_list_and_the_grace() {
    let mut h = Harness::new();
    let mut seen = Vec::new();
    // Queued events arrive the moment the bridge connects, before the agent said anything.
    seen.extend(h.runner(&channel(1)));
    seen.extend(
        h.runner(r#"{"kind":"mcp_notification","method":"notifications/tools/list_changed"}"#),
    );
    seen.extend(h.agent(INITIALIZE));
    seen.extend(h.runner(&channel(2)));
    seen.extend(h.agent(INITIALIZED));
    seen.extend(h.runner(&channel(3)));
    seen.extend(h.agent(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#));
    seen.extend(h.wait(Duration::from_secs(5)));
    assert!(
        !to_agent(&seen).iter().any(|m| m.get("method").is_some()),
        "nothing relayed before the first tools/list answer: {:?}",
        to_agent(&seen)
    );
    assert_eq!(h.session.poll_timeout(), None, "no timer before the answer");
    assert_eq!(h.session.held_notifications(), 4);

    let out = h.runner(r#"{"kind":"mcp_response","id":1,"result":{"tools":[]}}"#);
    assert_eq!(to_agent(&out).len(), 1, "only the answer: {out:?}");
    let answered_at = h.now;
    assert_eq!(h.session.poll_timeout(), Some(answered_at + START_GRACE));
    let out = h.runner(&channel(4));
    assert!(to_agent(&out).is_empty(), "still held during the grace");
    let out = h.wait(START_GRACE - Duration::from_millis(2));
    assert!(to_agent(&out).is_empty(), "not due yet");

    let out = h.wait(Duration::from_millis(1));
    let methods: Vec<_> = to_agent(&out)
        .iter()
        .map(|m| m["method"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        methods,
        [
            "notifications/claude/channel",
            "notifications/tools/list_changed",
            "notifications/claude/channel",
            "notifications/claude/channel",
            "notifications/claude/channel",
        ]
    );
    assert_eq!(
        delivered(&out),
        ["m1", "m2", "m3", "m4"],
        "in arrival order"
    );
    assert!(out.contains(&BridgeOutput::Event(BridgeEvent::Released {
        count: 5,
        by: ReleasedBy::Grace
    })));
    assert_eq!(h.session.poll_timeout(), None);
    assert!(h.session.is_delivering());

    // From now on: at once, as before.
    let out = h.runner(&channel(5));
    assert_eq!(delivered(&out), ["m5"]);
    // A later tools/list changes nothing.
    h.agent(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    h.runner(r#"{"kind":"mcp_response","id":2,"result":{"tools":[]}}"#);
    assert_eq!(delivered(&h.runner(&channel(6))), ["m6"]);
    snapshots(|| insta::assert_snapshot!("bridge_startup_hold_transcript", h.transcript));
}

#[test]
fn the_grace_starts_when_the_later_condition_is_met_and_an_error_answer_counts() {
    let mut h = Harness::new();
    h.runner(&channel(1));
    h.agent(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    h.runner(r#"{"kind":"mcp_response","id":1,"error":{"code":-32603,"message":"x"}}"#);
    assert_eq!(h.session.poll_timeout(), None, "not initialized yet");
    h.wait(Duration::from_secs(1));
    let out = h.agent(INITIALIZED);
    assert!(to_agent(&out).is_empty());
    assert_eq!(h.session.poll_timeout(), Some(h.now + START_GRACE));
    assert_eq!(delivered(&h.wait(START_GRACE)), ["m1"]);
}

const CLAUDE_INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"roots":{},"elicitation":{}},"clientInfo":{"name":"claude-code","title":"Claude Code","version":"2.1.197"}}}"#;

/// How many start-up probes (`notifications/tools/list_changed` from the bridge) are in `outputs`.
fn probes(outputs: &[BridgeOutput]) -> usize {
    to_agent(outputs)
        .iter()
        .filter(|m| m["method"] == "notifications/tools/list_changed")
        .count()
}

/// Claude Code's handshake up to the answer to its first `tools/list`; returns the outputs of
/// that answer.
fn claude_handshake(h: &mut Harness) -> Vec<BridgeOutput> {
    h.agent(CLAUDE_INITIALIZE);
    h.agent(INITIALIZED);
    h.agent(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    h.runner(r#"{"kind":"mcp_response","id":1,"result":{"tools":[]}}"#)
}

#[test]
fn claude_code_is_probed_until_it_lists_tools_again() {
    let mut h = Harness::new();
    h.runner(&channel(1));
    let out = claude_handshake(&mut h);
    assert_eq!(
        to_agent(&out).len(),
        2,
        "the answer, then the first probe: {out:?}"
    );
    assert_eq!(to_agent(&out)[0]["id"], 1);
    assert_eq!(probes(&out), 1);
    assert!(out.contains(&BridgeOutput::Event(BridgeEvent::Probed { count: 1 })));

    // Probes follow at 50, 100, 200, 400, 400 ms gaps; nothing is released meanwhile, however
    // long it takes (short of the ceiling).
    let mut gaps = Vec::new();
    let mut last = h.now;
    let mut seen = Vec::new();
    for _ in 0..6 {
        let due = h.session.poll_timeout().expect("a probe is due");
        let out = h.wait(due - h.now);
        assert_eq!(probes(&out), 1, "{out:?}");
        gaps.push((h.now - last).as_millis());
        last = h.now;
        seen.extend(out);
    }
    assert_eq!(gaps, [50, 100, 200, 400, 400, 400]);
    seen.extend(h.runner(&channel(2)));
    assert!(delivered(&seen).is_empty(), "held: {seen:?}");

    // Claude asks tools/list again: its handlers are in place.
    let out = h.agent(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    assert_eq!(delivered(&out), ["m1", "m2"]);
    assert!(out.contains(&BridgeOutput::Event(BridgeEvent::Released {
        count: 2,
        by: ReleasedBy::Probe { probes: 7 }
    })));
    assert!(
        to_runner(&out)
            .iter()
            .any(|f| f.contains(r#""method":"tools/list""#)),
        "the request is forwarded as usual: {out:?}"
    );
    assert_eq!(h.session.poll_timeout(), None, "no more probes");
    assert!(h.session.is_delivering());
    assert_eq!(delivered(&h.runner(&channel(3))), ["m3"]);
    h.runner(r#"{"kind":"mcp_response","id":2,"result":{"tools":[]}}"#);
    assert_eq!(probes(&h.wait(PROBE_CEILING)), 0, "nothing more is written");
}

#[test]
fn a_tools_list_the_agent_sent_before_any_probe_releases_nothing() {
    let mut h = Harness::new();
    h.runner(&channel(1));
    h.agent(CLAUDE_INITIALIZE);
    h.agent(INITIALIZED);
    // Two lists at once: the second was sent before any probe, so it answers none.
    h.agent(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    h.agent(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    let out = h.runner(r#"{"kind":"mcp_response","id":1,"result":{"tools":[]}}"#);
    assert_eq!(probes(&out), 1);
    let out = h.runner(r#"{"kind":"mcp_response","id":2,"result":{"tools":[]}}"#);
    assert!(delivered(&out).is_empty(), "{out:?}");
    assert!(!h.session.is_delivering());
    let out = h.agent(r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#);
    assert_eq!(delivered(&out), ["m1"]);
}

#[test]
fn a_probed_agent_that_never_answers_is_released_at_the_ceiling() {
    let mut h = Harness::with(BridgeConfig {
        probe_ceiling: Duration::from_secs(2),
        ..BridgeConfig::default()
    });
    h.runner(&channel(1));
    let mut seen = claude_handshake(&mut h);
    let start = h.now;
    while !h.session.is_delivering() {
        let due = h
            .session
            .poll_timeout()
            .expect("a timer runs until released");
        seen.extend(h.wait(due - h.now));
    }
    assert_eq!(h.now - start, Duration::from_secs(2));
    assert_eq!(delivered(&seen), ["m1"]);
    // 0, 50, 150, 350, 750, 1150, 1550, 1950 ms.
    assert_eq!(probes(&seen), 8);
    assert!(seen.contains(&BridgeOutput::Event(BridgeEvent::Released {
        count: 1,
        by: ReleasedBy::Ceiling { probes: 8 }
    })));
    assert_eq!(h.session.poll_timeout(), None);
}

#[test]
fn only_claude_code_is_probed() {
    for client in [
        r#"{"name":"claude-code-lookalike","version":"1"}"#,
        r#"{"version":"1"}"#,
    ] {
        let mut h = Harness::new();
        h.runner(&channel(1));
        let init = format!(
            r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{client}}}}}"#
        );
        let mut seen = h.agent(&init);
        seen.extend(h.agent(INITIALIZED));
        seen.extend(h.agent(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#));
        seen.extend(h.runner(r#"{"kind":"mcp_response","id":1,"result":{"tools":[]}}"#));
        assert_eq!(h.session.poll_timeout(), Some(h.now + START_GRACE));
        seen.extend(h.wait(START_GRACE));
        assert_eq!(probes(&seen), 0, "{client}");
        assert_eq!(delivered(&seen), ["m1"], "{client}");
    }
}

#[test]
fn a_full_hold_keeps_the_oldest_and_reports_the_rest() {
    let mut h = Harness::with(BridgeConfig {
        max_held_notifications: 3,
        ..BridgeConfig::default()
    });
    let mut events = Vec::new();
    for n in 1..=5 {
        events.extend(h.runner(&channel(n)));
    }
    let full: Vec<_> = events
        .iter()
        .filter(|o| matches!(o, BridgeOutput::Event(BridgeEvent::HoldFull { .. })))
        .collect();
    assert_eq!(
        full,
        [&BridgeOutput::Event(BridgeEvent::HoldFull {
            method: "notifications/claude/channel".into(),
            held: 3
        }); 2]
    );
    h.agent(INITIALIZED);
    h.agent(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    h.runner(r#"{"kind":"mcp_response","id":1,"result":{"tools":[]}}"#);
    assert_eq!(delivered(&h.wait(START_GRACE)), ["m1", "m2", "m3"]);

    // The byte bound too.
    let mut h = Harness::with(BridgeConfig {
        max_held_bytes: 2 * (channel(1).len() + 30),
        ..BridgeConfig::default()
    });
    for n in 1..=3 {
        h.runner(&channel(n));
    }
    assert_eq!(h.session.held_notifications(), 2);
}

#[test]
fn teardown_before_the_agent_is_ready_reports_what_was_held() {
    let mut h = Harness::new();
    h.runner(&channel(1));
    h.runner(&channel(2));
    let out = h.agent_eof();
    assert!(
        out.contains(&BridgeOutput::Event(BridgeEvent::HeldDiscarded {
            count: 2
        }))
    );
    assert_eq!(
        out.last(),
        Some(&BridgeOutput::Exit(ExitReason::AgentClosed))
    );
    assert_eq!(h.session.poll_timeout(), None);
}

mod hold_props {
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Notify,
        Initialized,
        ListTools,
        AnswerList,
        Wait(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Notify),
            1 => Just(Op::Initialized),
            1 => Just(Op::ListTools),
            1 => Just(Op::AnswerList),
            2 => (0u64..400).prop_map(Op::Wait),
        ]
    }

    proptest! {
        #![proptest_config(crate::test_support::proptest_config("mcp_bridge_hold"))]
        /// For any interleaving: nothing reaches the agent before it sent `initialized`, got a
        /// `tools/list` answer and the grace passed; what the cap admitted arrives exactly once,
        /// in order; what it refused is reported; once open, notifications pass at once.
        #[test]
        fn held_until_ready_in_order_and_bounded(ops in proptest::collection::vec(op(), 0..60), cap in 1usize..6) {
            let mut h = Harness::with(BridgeConfig {
                max_held_notifications: cap,
                ..BridgeConfig::default()
            });
            let (mut sent, mut next_list, mut initialized) = (0usize, 1u64, false);
            let mut lists: Vec<u64> = Vec::new();
            let mut ready_since: Option<Instant> = None;
            let mut listed_at: Option<Instant> = None;
            let (mut got, mut refused) = (Vec::new(), 0usize);
            for op in ops {
                let out = match op {
                    Op::Notify => {
                        sent += 1;
                        h.runner(&channel(sent))
                    }
                    Op::Initialized => {
                        let out = h.agent(INITIALIZED);
                        if !initialized && listed_at.is_some() {
                            ready_since.get_or_insert(h.now);
                        }
                        initialized = true;
                        out
                    }
                    Op::ListTools => {
                        let id = next_list;
                        next_list += 1;
                        lists.push(id);
                        h.agent(&format!(r#"{{"jsonrpc":"2.0","id":"l{id}","method":"tools/list"}}"#))
                    }
                    Op::AnswerList => {
                        let Some(id) = lists.pop() else { continue };
                        let out = h.runner(&format!(r#"{{"kind":"mcp_response","id":{id},"result":{{"tools":[]}}}}"#));
                        if listed_at.is_none() {
                            listed_at = Some(h.now);
                            if initialized {
                                ready_since.get_or_insert(h.now);
                            }
                        }
                        out
                    }
                    Op::Wait(ms) => h.wait(Duration::from_millis(ms)),
                };
                refused += out
                    .iter()
                    .filter(|o| matches!(o, BridgeOutput::Event(BridgeEvent::HoldFull { .. })))
                    .count();
                let now_got = delivered(&out);
                if !now_got.is_empty() {
                    let since = ready_since.expect("delivered before the handshake");
                    prop_assert!(h.now >= since + START_GRACE, "delivered during the grace");
                }
                got.extend(now_got);
            }
            // Finish the handshake and let the grace pass: everything admitted arrives (when the
            // grace is over, at the next input already).
            let mut out = h.agent(INITIALIZED);
            out.extend(h.agent(r#"{"jsonrpc":"2.0","id":"last","method":"tools/list"}"#));
            out.extend(h.runner(&format!(r#"{{"kind":"mcp_response","id":{next_list},"result":{{"tools":[]}}}}"#)));
            out.extend(h.wait(START_GRACE));
            got.extend(delivered(&out));
            prop_assert!(h.session.is_delivering());
            let expected: Vec<String> = (1..=sent).map(|n| format!("m{n}")).collect();
            // In order, without repeats, and only the refused ones missing.
            let mut it = expected.iter();
            for g in &got {
                prop_assert!(it.any(|e| e == g), "{g} out of order or repeated: {got:?}");
            }
            prop_assert_eq!(got.len() + refused, sent);
            prop_assert!(got.len() >= cap.min(sent));
            sent += 1;
            prop_assert_eq!(delivered(&h.runner(&channel(sent))), vec![format!("m{sent}")]);
        }
    }
}

mod probed_props {
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Notify,
        Initialized,
        ListTools,
        AnswerList,
        Wait(u64),
        /// Time passes to the next timer.
        Timer,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Notify),
            1 => Just(Op::Initialized),
            2 => Just(Op::ListTools),
            2 => Just(Op::AnswerList),
            2 => (0u64..300).prop_map(Op::Wait),
            2 => Just(Op::Timer),
        ]
    }

    proptest! {
        #![proptest_config(crate::test_support::proptest_config("mcp_bridge_hold"))]
        /// Claude Code, for any interleaving: nothing reaches it before a `tools/list` request
        /// that came after a probe was written, or before the ceiling; the probes stop then;
        /// everything arrives exactly once, in order.
        #[test]
        fn released_only_by_a_list_after_a_probe_or_the_ceiling(ops in proptest::collection::vec(op(), 0..80)) {
            let ceiling = Duration::from_millis(1500);
            let mut h = Harness::with(BridgeConfig {
                probe_ceiling: ceiling,
                ..BridgeConfig::default()
            });
            h.agent(CLAUDE_INITIALIZE);
            let (mut sent, mut next_list) = (0usize, 1u64);
            let mut lists: Vec<u64> = Vec::new();
            let mut probed_since: Option<Instant> = None;
            let mut relisted_after_probe = false;
            let mut released = false;
            let mut got = Vec::new();
            for op in ops {
                let mut this_is_a_relist = false;
                let out = match op {
                    Op::Notify => {
                        sent += 1;
                        h.runner(&channel(sent))
                    }
                    Op::Initialized => h.agent(INITIALIZED),
                    Op::ListTools => {
                        let id = next_list;
                        next_list += 1;
                        lists.push(id);
                        this_is_a_relist = probed_since.is_some();
                        h.agent(&format!(r#"{{"jsonrpc":"2.0","id":"l{id}","method":"tools/list"}}"#))
                    }
                    Op::AnswerList => {
                        let Some(id) = lists.pop() else { continue };
                        h.runner(&format!(r#"{{"kind":"mcp_response","id":{id},"result":{{"tools":[]}}}}"#))
                    }
                    Op::Wait(ms) => h.wait(Duration::from_millis(ms)),
                    Op::Timer => match h.session.poll_timeout() {
                        Some(due) => h.wait(due.saturating_duration_since(h.now)),
                        None => continue,
                    },
                };
                let p = probes(&out);
                if p > 0 {
                    prop_assert!(!released, "a probe after the release");
                    probed_since.get_or_insert(h.now);
                }
                relisted_after_probe |= this_is_a_relist;
                let now_got = delivered(&out);
                let released_now = out.iter().any(|o| matches!(o, BridgeOutput::Event(BridgeEvent::Released { .. })));
                if released_now {
                    let since = probed_since.expect("released before any probe");
                    prop_assert!(
                        relisted_after_probe || h.now >= since + ceiling,
                        "released without an answer to a probe, before the ceiling"
                    );
                    released = true;
                }
                if !now_got.is_empty() {
                    prop_assert!(released, "delivered while held");
                }
                got.extend(now_got);
            }
            // Finish the handshake and answer a probe: everything arrives.
            let mut out = h.agent(INITIALIZED);
            out.extend(h.agent(r#"{"jsonrpc":"2.0","id":"last","method":"tools/list"}"#));
            out.extend(h.runner(&format!(r#"{{"kind":"mcp_response","id":{next_list},"result":{{"tools":[]}}}}"#)));
            out.extend(h.agent(r#"{"jsonrpc":"2.0","id":"again","method":"tools/list"}"#));
            got.extend(delivered(&out));
            prop_assert!(h.session.is_delivering());
            let expected: Vec<String> = (1..=sent).map(|n| format!("m{n}")).collect();
            prop_assert_eq!(got, expected);
        }
    }
}
