use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::dialect::delivery::UNDELIVERED_KEY;
use crate::test_support::{proptest_config, snapshots};

fn config() -> AcpConfig {
    AcpConfig {
        client_name: "ac7".into(),
        client_version: "1.2.3".into(),
        cwd: "/work".into(),
        mcp_servers: vec![McpServer {
            name: "ac7".into(),
            command: "/usr/bin/ac7".into(),
            args: vec!["mcp-bridge".into()],
            env: vec![("AC7_RUNNER_SOCKET".into(), "/tmp/.ac7-runner-1.sock".into())],
        }],
        briefing: "You are builder on team demo.".into(),
        permission: PermissionPolicy::Ac7Tools,
        bundle_window: Duration::from_millis(200),
        setup_timeout: Duration::from_secs(60),
        turn_timeout: Duration::from_secs(600),
        cancel_grace: Duration::from_secs(10),
    }
}

/// A scripted agent on the other end of the pipes.
struct Agent {
    client: AcpClient,
    now: Instant,
    transcript: String,
    /// Requests the client sent and the agent has not answered: (id, method, params).
    requests: Vec<(u64, String, Value)>,
    /// Everything written to the agent, parsed.
    sent: Vec<Value>,
    closed: bool,
}

impl Agent {
    fn start() -> Self {
        Self::start_with(config())
    }

    fn start_with(config: AcpConfig) -> Self {
        let now = Instant::now();
        let mut agent = Self {
            client: AcpClient::new(config, now),
            now,
            transcript: String::new(),
            requests: Vec::new(),
            sent: Vec::new(),
            closed: false,
        };
        agent.drain();
        agent
    }

    fn drain(&mut self) -> Vec<AcpOutput> {
        let out: Vec<_> = std::iter::from_fn(|| self.client.poll_output()).collect();
        for o in &out {
            match o {
                AcpOutput::Transmit(line) => {
                    assert!(!self.closed, "nothing is written after stdin closed");
                    assert!(line.ends_with(b"\n"), "one message per line");
                    self.transcript
                        .push_str(&format!("  to agent < {}", String::from_utf8_lossy(line)));
                    let v: Value = serde_json::from_slice(line).unwrap();
                    if let (Some(id), Some(method)) = (v["id"].as_u64(), v["method"].as_str()) {
                        self.requests
                            .push((id, method.to_owned(), v["params"].clone()));
                    }
                    self.sent.push(v);
                }
                AcpOutput::CloseStdin => {
                    self.closed = true;
                    self.transcript.push_str("  close stdin\n");
                }
                other => self.transcript.push_str(&format!("  {other:?}\n")),
            }
        }
        out
    }

    fn says(&mut self, line: Value) -> Vec<AcpOutput> {
        self.says_raw(&line.to_string())
    }

    fn says_raw(&mut self, line: &str) -> Vec<AcpOutput> {
        self.transcript.push_str(&format!("agent > {line}\n"));
        self.client
            .handle_bytes(format!("{line}\n").as_bytes(), self.now);
        self.drain()
    }

    /// The oldest open request for `method`: (id, params).
    fn open(&self, method: &str) -> Option<(u64, Value)> {
        self.requests
            .iter()
            .find(|(_, m, _)| m == method)
            .map(|(id, _, p)| (*id, p.clone()))
    }

    /// Answers the oldest open request for `method` with `result` or an error.
    fn answer(&mut self, method: &str, result: Result<Value, (i64, &str)>) -> Vec<AcpOutput> {
        let at = self
            .requests
            .iter()
            .position(|(_, m, _)| m == method)
            .unwrap_or_else(|| panic!("no open {method}"));
        let (id, _, _) = self.requests.remove(at);
        let line = match result {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err((code, message)) => {
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
            }
        };
        self.says(line)
    }

    fn advance(&mut self, ms: u64) -> Vec<AcpOutput> {
        self.now += Duration::from_millis(ms);
        self.transcript.push_str(&format!("(+{ms} ms)\n"));
        self.client.handle_timeout(self.now);
        self.drain()
    }

    fn push(&mut self, id: &str, from: &str, text: &str) {
        self.transcript
            .push_str(&format!("event {id} from {from}: {text}\n"));
        self.client.notify(
            SinkEvent {
                text: text.to_owned(),
                reply_to: Some((from.to_owned(), id.to_owned())),
            },
            self.now,
        );
    }

    fn ready(&mut self) -> Vec<AcpOutput> {
        self.answer(
            "initialize",
            Ok(json!({"protocolVersion": 1, "agentCapabilities": {},
                      "agentInfo": {"name": "scripted", "version": "0.1.0"}})),
        );
        self.answer("session/new", Ok(json!({"sessionId": "s-1"})))
    }

    fn update(&mut self, update: Value) -> Vec<AcpOutput> {
        self.says(json!({"jsonrpc": "2.0", "method": "session/update",
                         "params": {"sessionId": "s-1", "update": update}}))
    }

    fn shutdown(&mut self) -> Vec<AcpOutput> {
        self.transcript.push_str("shutdown\n");
        self.client.shutdown(self.now);
        self.drain()
    }
}

fn prompt_texts(params: &Value) -> Vec<String> {
    params["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["text"].as_str().unwrap().to_owned())
        .collect()
}

fn undelivered(out: &[AcpOutput]) -> Vec<Undelivered> {
    out.iter()
        .filter_map(|o| match o {
            AcpOutput::Undelivered(u) => Some(u.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn start_up_asks_for_no_fs_or_terminal_and_registers_the_bridge() {
    let mut agent = Agent::start();
    let (_, init) = agent.open("initialize").unwrap();
    assert_eq!(init["protocolVersion"], 1);
    assert_eq!(
        init["clientCapabilities"],
        json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false})
    );
    assert_eq!(
        init["clientInfo"],
        json!({"name": "ac7", "version": "1.2.3"})
    );
    assert!(
        agent.open("session/new").is_none(),
        "session/new waits for initialize"
    );
    agent.answer(
        "initialize",
        Ok(json!({"protocolVersion": 1, "agentInfo": {"name": "scripted", "version": "0.1.0"}})),
    );
    let (_, new) = agent.open("session/new").unwrap();
    assert_eq!(
        new,
        json!({"cwd": "/work", "mcpServers": [{"name": "ac7", "command": "/usr/bin/ac7",
            "args": ["mcp-bridge"], "env": [{"name": "AC7_RUNNER_SOCKET", "value": "/tmp/.ac7-runner-1.sock"}]}]})
    );
    let out = agent.answer("session/new", Ok(json!({"sessionId": "s-1"})));
    assert!(out.contains(&AcpOutput::Ready {
        session_id: "s-1".into(),
        agent: AgentInfo {
            name: Some("scripted".into()),
            title: None,
            version: Some("0.1.0".into())
        }
    }));
    assert_eq!(agent.client.session_id(), Some("s-1"));
}

#[test]
fn another_protocol_version_a_login_or_silence_fail_the_start() {
    let mut agent = Agent::start();
    let out = agent.answer("initialize", Ok(json!({"protocolVersion": 2})));
    assert!(out.contains(&AcpOutput::Failed(
        "the agent speaks ACP version 2; ac7 speaks version 1".into()
    )));

    let mut agent = Agent::start();
    let out = agent.answer("initialize", Ok(json!({"agentCapabilities": {}})));
    assert!(
        matches!(&out[..], [AcpOutput::Failed(why)] if why.contains("no protocolVersion")),
        "{out:?}"
    );

    let mut agent = Agent::start();
    agent.answer("initialize", Ok(json!({"protocolVersion": 1})));
    let out = agent.answer("session/new", Err((-32000, "Authentication required")));
    assert!(
        matches!(&out[..], [AcpOutput::Failed(why)] if why.starts_with("the agent wants a login first (Authentication required)")),
        "{out:?}"
    );

    let mut agent = Agent::start();
    agent.push("m1", "alice", "hi");
    assert!(agent.advance(59_000).is_empty());
    let out = agent.advance(1_000);
    assert!(
        out.contains(&AcpOutput::Failed(
            "the agent did not answer initialize within 60 s".into()
        )),
        "{out:?}"
    );
    // The event waiting for the session is reported, the late answer is for no request.
    assert_eq!(undelivered(&out).len(), 1);
    assert_eq!(undelivered(&out)[0].kind, NoticeKind::Refused);
    let out = agent.answer("initialize", Ok(json!({"protocolVersion": 1})));
    assert_eq!(out, [AcpOutput::Event(AcpEvent::Unmatched("1".into()))]);
    assert!(agent.open("session/new").is_none());
    assert_eq!(agent.client.poll_timeout(), None);
}

/// A whole session: start-up, a bundle with the briefing, updates, permission requests, an
/// event that waits for the turn's end, a failed turn, the next turn, shutdown.
#[test]
fn a_whole_session_transcript() {
    let mut agent = Agent::start();
    agent.push("m1", "alice", "<channel from=\"alice\">\nfirst\n</channel>");
    agent.ready();
    assert!(agent.open("session/prompt").is_none(), "the window is open");
    agent.advance(100);
    agent.push("m2", "bob", "<channel from=\"bob\">\nsecond\n</channel>");
    agent.advance(100);
    let (turn1, prompt) = agent.open("session/prompt").unwrap();
    assert_eq!(
        prompt_texts(&prompt),
        [
            "You are builder on team demo.",
            "<channel from=\"alice\">\nfirst\n</channel>\n<channel from=\"bob\">\nsecond\n</channel>"
        ]
    );
    agent.update(json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "on it"}}));
    agent.update(json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "mcp__ac7__send", "kind": "other", "status": "pending"}));
    // An ac7 tool is allowed (allow_once preferred), another is denied.
    let out = agent.says(
        json!({"jsonrpc": "2.0", "id": "p1", "method": "session/request_permission",
        "params": {"sessionId": "s-1", "toolCall": {"toolCallId": "t1"},
                   "options": [{"optionId": "always", "name": "Always", "kind": "allow_always"},
                               {"optionId": "once", "name": "Allow", "kind": "allow_once"},
                               {"optionId": "no", "name": "Reject", "kind": "reject_once"}]}}),
    );
    assert!(out.contains(&AcpOutput::Event(AcpEvent::Permission {
        title: "mcp__ac7__send".into(),
        allowed: true,
        option: Some("once".into())
    })));
    assert_eq!(
        agent.sent.last().unwrap(),
        &json!({"jsonrpc": "2.0", "id": "p1", "result": {"outcome": {"outcome": "selected", "optionId": "once"}}})
    );
    agent.says(
        json!({"jsonrpc": "2.0", "id": 77, "method": "session/request_permission",
        "params": {"sessionId": "s-1", "toolCall": {"toolCallId": "t2", "title": "`rm -rf /`"},
                   "options": [{"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                               {"optionId": "never", "name": "Never", "kind": "reject_always"}]}}),
    );
    assert_eq!(
        agent.sent.last().unwrap()["result"],
        json!({"outcome": {"outcome": "selected", "optionId": "never"}})
    );
    // An event during the turn waits for its end.
    agent.push("m3", "alice", "<channel from=\"alice\">\nthird\n</channel>");
    agent.advance(300);
    assert_eq!(
        agent
            .requests
            .iter()
            .filter(|(_, m, _)| m == "session/prompt")
            .count(),
        1
    );
    let out = agent.answer("session/prompt", Ok(json!({"stopReason": "end_turn"})));
    assert!(out.contains(&AcpOutput::TurnEnded {
        turn: turn1,
        stop_reason: Some("end_turn".into())
    }));
    let (turn2, prompt) = agent.open("session/prompt").unwrap();
    assert_eq!(
        prompt_texts(&prompt),
        ["<channel from=\"alice\">\nthird\n</channel>"],
        "the briefing went with a turn that succeeded"
    );
    // This turn fails: alice is told, the next event still goes.
    let out = agent.answer("session/prompt", Err((-32603, "Internal error")));
    assert!(out.contains(&AcpOutput::TurnFailed(TurnFailure {
        turn_id: turn2.to_string(),
        reason: "Internal error".into(),
        msg_ids: vec!["m3".into()]
    })));
    assert_eq!(
        undelivered(&out),
        [Undelivered {
            to: "alice".into(),
            msg_ids: vec!["m3".into()],
            reason: "Internal error".into(),
            kind: NoticeKind::TurnFailed
        }]
    );
    agent.push("m4", "bob", "<channel from=\"bob\">\nfourth\n</channel>");
    agent.advance(200);
    assert!(
        agent.open("session/prompt").is_some(),
        "not deaf after a failed turn"
    );
    // Shutdown: the turn is cancelled, what waits is reported, stdin closes.
    agent.push("m5", "carol", "<channel from=\"carol\">\nfifth\n</channel>");
    let out = agent.shutdown();
    assert_eq!(
        agent.sent.last().unwrap(),
        &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s-1"}})
    );
    assert_eq!(undelivered(&out)[0].to, "carol");
    assert_eq!(out.last(), Some(&AcpOutput::CloseStdin));
    // Nothing more is written.
    agent.says(
        json!({"jsonrpc": "2.0", "id": 9, "method": "session/request_permission", "params": {}}),
    );
    agent.push("m6", "dave", "late");
    agent.advance(1_000);
    snapshots(|| insta::assert_snapshot!(agent.transcript));
}

#[test]
fn a_turn_that_never_ends_is_cancelled_then_given_up_and_the_next_goes() {
    let mut agent = Agent::start();
    agent.ready();
    agent.push("m1", "alice", "one");
    agent.advance(200);
    let (turn, _) = agent.open("session/prompt").unwrap();
    assert_eq!(
        agent.client.poll_timeout(),
        Some(agent.now + Duration::from_secs(600))
    );
    agent.push("m2", "bob", "two");
    agent.advance(200);
    let out = agent.advance(600_000);
    assert!(
        out.contains(&AcpOutput::Event(AcpEvent::Cancelling { turn })),
        "{out:?}"
    );
    assert_eq!(agent.sent.last().unwrap()["method"], "session/cancel");
    let out = agent.advance(10_000);
    let failed = out.iter().find_map(|o| match o {
        AcpOutput::TurnFailed(f) => Some(f.clone()),
        _ => None,
    });
    assert_eq!(failed.unwrap().msg_ids, ["m1"]);
    assert_eq!(undelivered(&out)[0].to, "alice");
    // The waiting event goes as the next turn, with the briefing again.
    let prompts: Vec<_> = agent
        .requests
        .iter()
        .filter(|(_, m, _)| m == "session/prompt")
        .collect();
    assert_eq!(prompts.len(), 2);
    assert_eq!(
        prompt_texts(&prompts[1].2),
        ["You are builder on team demo.", "two"]
    );
    // The late answer of the given-up turn is for no request.
    let line = json!({"jsonrpc": "2.0", "id": turn, "result": {"stopReason": "cancelled"}});
    let out = agent.says(line);
    assert_eq!(
        out,
        [AcpOutput::Event(AcpEvent::Unmatched(turn.to_string()))]
    );
}

#[test]
fn a_cancelled_turn_that_answers_is_a_failed_turn() {
    let mut agent = Agent::start();
    agent.ready();
    agent.push("m1", "alice", "one");
    agent.advance(200);
    agent.advance(600_000);
    let out = agent.answer("session/prompt", Ok(json!({"stopReason": "cancelled"})));
    assert!(
        out.iter()
            .any(|o| matches!(o, AcpOutput::TurnFailed(f) if f.reason.contains("ran past 600 s"))),
        "{out:?}"
    );
    assert_eq!(agent.client.poll_timeout(), None);
}

#[test]
fn a_refused_prompt_tells_each_sender_it_was_not_delivered() {
    let mut agent = Agent::start();
    agent.ready();
    agent.push("m1", "alice", "one");
    agent.push("m2", "bob", "two");
    agent.push("m3", "alice", "three");
    agent.client.notify("a system notice".to_owned(), agent.now);
    agent.advance(200);
    let out = agent.answer("session/prompt", Err((-32602, "Invalid params")));
    assert_eq!(
        undelivered(&out),
        [
            Undelivered {
                to: "alice".into(),
                msg_ids: vec!["m1".into(), "m3".into()],
                reason: "Invalid params".into(),
                kind: NoticeKind::Refused
            },
            Undelivered {
                to: "bob".into(),
                msg_ids: vec!["m2".into()],
                reason: "Invalid params".into(),
                kind: NoticeKind::Refused
            }
        ]
    );
    let body = undelivered(&out)[0].push_body_for("builder", "gemini");
    assert_eq!(
        body["body"],
        "your messages m1, m3 were not delivered to builder: gemini did not take them (Invalid params). Send them again later, or reach builder another way."
    );
    assert_eq!(body["data"][UNDELIVERED_KEY], "m1, m3");
    assert!(out.iter().any(|o| matches!(o, AcpOutput::TurnEnded { .. })));
    assert!(!out.iter().any(|o| matches!(o, AcpOutput::TurnFailed(_))));
}

#[test]
fn a_refusal_fails_the_turn_and_keeps_the_briefing_for_the_next() {
    let mut agent = Agent::start();
    agent.ready();
    agent.push("m1", "alice", "one");
    agent.advance(200);
    let out = agent.answer("session/prompt", Ok(json!({"stopReason": "refusal"})));
    assert!(out.iter().any(
        |o| matches!(o, AcpOutput::TurnFailed(f) if f.reason == "the agent refused to go on")
    ));
    agent.push("m2", "alice", "two");
    agent.advance(200);
    let (_, prompt) = agent.open("session/prompt").unwrap();
    assert_eq!(prompt_texts(&prompt)[0], "You are builder on team demo.");
}

#[test]
fn malformed_and_unexpected_messages_are_dropped_reported_or_answered() {
    let mut agent = Agent::start();
    agent.ready();
    let out = agent.says_raw("this is not json");
    assert!(
        matches!(
            &out[..],
            [AcpOutput::Event(AcpEvent::Unparseable { len: 16, .. })]
        ),
        "{out:?}"
    );
    // A malformed request with an id is answered.
    let out = agent.says_raw(r#"{"jsonrpc":"2.0","id":5,"method":7}"#);
    assert_eq!(agent.sent.last().unwrap()["id"], 5);
    assert_eq!(agent.sent.last().unwrap()["error"]["code"], -32600);
    assert_eq!(out.len(), 2);
    // Requests we did not offer capabilities for.
    agent.says(json!({"jsonrpc": "2.0", "id": 6, "method": "fs/read_text_file", "params": {"sessionId": "s-1", "path": "/etc/passwd"}}));
    assert_eq!(agent.sent.last().unwrap()["error"]["code"], -32601);
    agent.says(json!({"jsonrpc": "2.0", "id": 7, "method": "terminal/create", "params": {}}));
    assert_eq!(agent.sent.last().unwrap()["error"]["code"], -32601);
    // A permission request without options, or for another session.
    agent.says(json!({"jsonrpc": "2.0", "id": 8, "method": "session/request_permission", "params": {"sessionId": "s-1", "toolCall": {}}}));
    assert_eq!(agent.sent.last().unwrap()["error"]["code"], -32602);
    agent.says(json!({"jsonrpc": "2.0", "id": 9, "method": "session/request_permission", "params": {"sessionId": "s-2", "toolCall": {}, "options": []}}));
    assert_eq!(agent.sent.last().unwrap()["error"]["code"], -32602);
    let written = agent.sent.len();
    // Notifications that are not ours, answers to nothing.
    let out = agent.says(json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s-2", "update": {"sessionUpdate": "plan"}}}));
    assert!(
        matches!(&out[..], [AcpOutput::Event(AcpEvent::Unexpected(_))]),
        "{out:?}"
    );
    let out = agent.says(json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s-1", "update": 3}}));
    assert!(
        matches!(&out[..], [AcpOutput::Event(AcpEvent::Unexpected(_))]),
        "{out:?}"
    );
    let out = agent.says(json!({"jsonrpc": "2.0", "method": "whatever/else"}));
    assert_eq!(
        out,
        [AcpOutput::Event(AcpEvent::Unexpected(
            "whatever/else".into()
        ))]
    );
    let out = agent.says(json!({"jsonrpc": "2.0", "id": 4242, "result": {}}));
    assert_eq!(out, [AcpOutput::Event(AcpEvent::Unmatched("4242".into()))]);
    let out = agent.says(json!({"jsonrpc": "2.0", "id": "x", "result": {}}));
    assert_eq!(out, [AcpOutput::Event(AcpEvent::Unmatched("\"x\"".into()))]);
    assert_eq!(
        agent.sent.len(),
        written,
        "notifications and answers are never answered"
    );
    // The session still works.
    agent.push("m1", "alice", "still here");
    agent.advance(200);
    assert!(agent.open("session/prompt").is_some());
}

#[test]
fn the_permission_policy_decides_and_falls_back_to_cancelled() {
    let ask = |policy: PermissionPolicy, title: &str, options: Value| {
        let mut agent = Agent::start_with(AcpConfig {
            permission: policy,
            ..config()
        });
        agent.ready();
        agent.says(json!({"jsonrpc": "2.0", "id": 1, "method": "session/request_permission",
            "params": {"sessionId": "s-1", "toolCall": {"toolCallId": "t", "title": title}, "options": options}}));
        agent.sent.last().unwrap()["result"]["outcome"].clone()
    };
    let both = json!([{"optionId": "a", "kind": "allow_always", "name": "A"},
                      {"optionId": "r", "kind": "reject_always", "name": "R"}]);
    let selected = |id: &str| json!({"outcome": "selected", "optionId": id});
    assert_eq!(
        ask(PermissionPolicy::Allow, "Edit `x`", both.clone()),
        selected("a")
    );
    assert_eq!(
        ask(PermissionPolicy::Deny, "mcp__ac7__send", both.clone()),
        selected("r")
    );
    assert_eq!(
        ask(
            PermissionPolicy::Ac7Tools,
            "send (ac7 MCP Server)",
            both.clone()
        ),
        selected("a")
    );
    assert_eq!(
        ask(PermissionPolicy::Ac7Tools, "mcp__other__send", both.clone()),
        selected("r")
    );
    let allow_only = json!([{"optionId": "a", "kind": "allow_once", "name": "A"}]);
    assert_eq!(
        ask(PermissionPolicy::Deny, "x", allow_only),
        json!({"outcome": "cancelled"})
    );
    assert!(is_ac7_tool("mcp__ac7__objectives_list"));
    assert!(!is_ac7_tool("mcp__ac77__send"));
    assert!(!is_ac7_tool("send (ac7x MCP Server)"));
}

#[test]
fn an_event_without_a_session_waits_and_a_stopped_client_refuses_at_once() {
    let mut agent = Agent::start();
    agent.push("m1", "alice", "early");
    agent.advance(500);
    assert!(agent.open("session/prompt").is_none());
    assert_eq!(agent.client.buffered(), 1);
    agent.ready();
    let (_, prompt) = agent.open("session/prompt").unwrap();
    assert_eq!(prompt_texts(&prompt)[1], "early");
    agent.shutdown();
    agent.push("m2", "bob", "too late");
    let out = agent.drain();
    assert_eq!(undelivered(&out)[0].reason, "the agent is not running");
}

proptest! {
    #![proptest_config(proptest_config("acp_client"))]

    /// The oracle of the fuzz target: every turn ends once, every event is delivered by a turn
    /// that went well or reported to its sender, nothing is written after stdin closed.
    #[test]
    fn acp_oracle_holds(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        crate::fuzzing::acp_ops(&data);
    }
}
