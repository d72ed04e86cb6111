//! The oracle of the `acp` fuzz target: an [`AcpClient`] against a fake agent driven by the
//! fuzzer's bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Input, MAX_POLLS};
use crate::dialect::acp::{AcpClient, AcpConfig, AcpOutput, McpServer, PermissionPolicy};
use crate::dialect::delivery::SinkEvent;

/// What the oracle knows of the client and the fake agent.
#[derive(Default)]
struct Oracle {
    /// Requests the client sent and the agent has not answered: id → method.
    open: BTreeMap<u64, String>,
    /// Every `session/prompt` id sent, with the message ids it carried.
    prompts: BTreeMap<u64, Vec<String>>,
    /// Turns started and not ended yet.
    running: BTreeSet<u64>,
    /// Turns ended.
    ended: BTreeSet<u64>,
    /// Message ids carried by some prompt.
    carried: BTreeSet<String>,
    /// Message ids some notice was about.
    reported: BTreeSet<String>,
    session: Option<String>,
    ready: usize,
    failed: usize,
    closed: bool,
}

impl Oracle {
    fn drain(&mut self, client: &mut AcpClient, now: Instant) {
        self.check_each(client);
        self.check_timer(client, now);
    }

    /// After every input, no timer is left due.
    fn check_timer(&self, client: &AcpClient, now: Instant) {
        if let Some(at) = client.poll_timeout() {
            assert!(at > now, "a timer due now was not handled");
        }
    }

    fn check_each(&mut self, outputs: &mut impl Outputs) {
        let mut polls = 0;
        while let Some(output) = outputs.next_output() {
            polls += 1;
            assert!(polls < MAX_POLLS, "poll_output does not terminate");
            match output {
                AcpOutput::Transmit(line) => {
                    assert!(!self.closed, "written after stdin closed");
                    assert_eq!(line.last(), Some(&b'\n'), "one message per line");
                    assert_eq!(
                        line.iter().filter(|b| **b == b'\n').count(),
                        1,
                        "no raw newline inside a message"
                    );
                    let v: Value = serde_json::from_slice(&line).expect("valid JSON");
                    assert_eq!(v["jsonrpc"], "2.0");
                    if let (Some(id), Some(method)) = (v["id"].as_u64(), v["method"].as_str()) {
                        assert!(
                            self.open.insert(id, method.to_owned()).is_none(),
                            "request id {id} reused"
                        );
                        if method == "session/prompt" {
                            assert_eq!(
                                v["params"]["sessionId"].as_str(),
                                self.session.as_deref(),
                                "a prompt goes to our session"
                            );
                            let ids: Vec<String> = v["params"]["prompt"]
                                .as_array()
                                .expect("prompt blocks")
                                .iter()
                                .flat_map(|b| {
                                    b["text"]
                                        .as_str()
                                        .unwrap_or_default()
                                        .split_whitespace()
                                        .filter(|w| w.starts_with('m'))
                                        .map(str::to_owned)
                                        .collect::<Vec<_>>()
                                })
                                .collect();
                            for id in &ids {
                                assert!(self.carried.insert(id.clone()), "{id} carried twice");
                            }
                            self.prompts.insert(id, ids);
                        }
                    }
                }
                AcpOutput::Ready { session_id, .. } => {
                    self.ready += 1;
                    assert_eq!(self.ready, 1, "ready once");
                    assert_eq!(self.failed, 0, "no ready after failing");
                    self.session = Some(session_id);
                }
                AcpOutput::Failed(_) => {
                    self.failed += 1;
                    assert_eq!(self.failed, 1, "failed once");
                    assert_eq!(self.ready, 0, "start-up fails before ready only");
                }
                AcpOutput::CloseStdin => {
                    assert!(!self.closed, "stdin closed twice");
                    self.closed = true;
                }
                AcpOutput::TurnStarted { turn, events } => {
                    assert!(events > 0, "a turn carries events");
                    assert!(self.running.is_empty(), "one turn at a time");
                    assert!(self.prompts.contains_key(&turn), "a turn is a prompt sent");
                    self.running.insert(turn);
                }
                AcpOutput::TurnEnded { turn, .. } => {
                    assert!(
                        self.running.remove(&turn),
                        "turn {turn} ended but not running"
                    );
                    assert!(self.ended.insert(turn), "turn {turn} ended twice");
                    self.open.remove(&turn);
                }
                AcpOutput::TurnFailed(failure) => {
                    let turn: u64 = failure.turn_id.parse().expect("a turn number");
                    assert!(self.ended.contains(&turn), "a turn fails once ended");
                }
                AcpOutput::Undelivered(notice) => {
                    assert!(!notice.msg_ids.is_empty());
                    for id in notice.msg_ids {
                        assert!(self.reported.insert(id.clone()), "{id} reported twice");
                    }
                }
                AcpOutput::Event(_) => {}
            }
        }
    }

    /// The oldest open request of `method`.
    fn oldest(&self, method: &str) -> Option<u64> {
        self.open
            .iter()
            .find(|(_, m)| m.as_str() == method)
            .map(|(id, _)| *id)
    }
}

/// `acp`: an [`AcpClient`] against a fake agent that answers its requests (well, badly, late or
/// never), sends updates, permission requests, requests we did not offer, garbage and answers to
/// nothing, split at arbitrary bytes; events pushed and time passing in between; shutdown.
///
/// Oracles: nothing is written after stdin closed, every line is one JSON-RPC 2.0 message, request
/// ids are never reused; `Ready` / `Failed` at most once and never both; one turn at a time, each
/// a prompt to our session, each ended exactly once (by the end, after shutdown, none runs); each
/// event is carried by at most one prompt and reported at most once; every request of the agent
/// made before shutdown is answered at once; after every input no timer is left due; at the end
/// every event with a sender was carried by a prompt or reported to that sender.
pub fn acp_ops(data: &[u8]) {
    let mut input = Input::new(data);
    let mut now = Instant::now();
    let permission = match input.byte() % 3 {
        0 => PermissionPolicy::Allow,
        1 => PermissionPolicy::Deny,
        _ => PermissionPolicy::Ac7Tools,
    };
    let briefing = if input.byte().is_multiple_of(4) {
        ""
    } else {
        "brief"
    };
    let mut client = AcpClient::new(
        AcpConfig {
            client_name: "ac7".into(),
            client_version: "0".into(),
            cwd: "/w".into(),
            mcp_servers: vec![McpServer {
                name: "ac7".into(),
                command: "/ac7".into(),
                args: vec!["mcp-bridge".into()],
                env: vec![("AC7_RUNNER_SOCKET".into(), "/s".into())],
            }],
            briefing: briefing.into(),
            permission,
            bundle_window: Duration::from_millis(200),
            setup_timeout: Duration::from_secs(60),
            turn_timeout: Duration::from_secs(600),
            cancel_grace: Duration::from_secs(10),
        },
        now,
    );
    let mut o = Oracle::default();
    o.drain(&mut client, now);
    let mut pushed: Vec<Option<String>> = Vec::new();
    let mut agent_ids = 0u64;
    let mut steps = 0;
    while !input.is_empty() && steps < 2_000 {
        steps += 1;
        let split = input.below(96);
        let line: Option<String> = match input.byte() % 12 {
            0 | 1 => {
                let n = pushed.len();
                let reply_to = match input.byte() % 3 {
                    0 => None,
                    1 => Some(("alice".to_owned(), format!("m{n}"))),
                    _ => Some(("bob".to_owned(), format!("m{n}"))),
                };
                pushed.push(reply_to.as_ref().map(|(_, id)| id.clone()));
                client.notify(
                    SinkEvent {
                        text: format!("event m{n} <x>"),
                        reply_to,
                    },
                    now,
                );
                None
            }
            2 | 3 => {
                now += match input.byte() % 4 {
                    0 => Duration::from_secs(600),
                    1 => Duration::from_secs(10),
                    _ => Duration::from_millis(u64::from(input.byte()) * 4),
                };
                client.handle_timeout(now);
                None
            }
            4 | 5 => {
                // Answer the oldest open request of a kind.
                let pick = input.byte();
                let method = ["initialize", "session/new", "session/prompt"][usize::from(pick % 3)];
                o.oldest(method).map(|id| {
                    o.open.remove(&id);
                    let result = match (method, input.byte() % 5) {
                        (_, 0) => json!({"error": {"code": -32603, "message": "boom"}}),
                        ("initialize", 1) => json!({"result": {"protocolVersion": 2}}),
                        ("initialize", _) => json!({"result": {"protocolVersion": 1}}),
                        ("session/new", 1) => {
                            json!({"error": {"code": -32000, "message": "auth"}})
                        }
                        ("session/new", 2) => json!({"result": {}}),
                        ("session/new", _) => json!({"result": {"sessionId": "s"}}),
                        (_, 1) => json!({"error": {"code": -32602, "message": "bad"}}),
                        (_, 2) => json!({"result": {"stopReason": "refusal"}}),
                        (_, 3) => json!({"result": {"stopReason": "cancelled"}}),
                        _ => json!({"result": {"stopReason": "end_turn"}}),
                    };
                    let mut line = json!({"jsonrpc": "2.0", "id": id});
                    for (k, v) in result.as_object().expect("an object") {
                        line[k] = v.clone();
                    }
                    line.to_string()
                })
            }
            6 => {
                let session = if input.byte().is_multiple_of(4) {
                    "other"
                } else {
                    "s"
                };
                let kind = ["tool_call", "agent_message_chunk", "plan"][input.below(3)];
                Some(
                    json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session,
                        "update": {"sessionUpdate": kind, "toolCallId": format!("t{}", input.below(4)), "title": "mcp__ac7__send"}}})
                    .to_string(),
                )
            }
            7 => {
                agent_ids += 1;
                let options = match input.byte() % 3 {
                    0 => json!([]),
                    1 => json!([{"optionId": "a", "kind": "allow_once", "name": "A"}]),
                    _ => json!([{"optionId": "a", "kind": "allow_always", "name": "A"},
                                {"optionId": "r", "kind": "reject_once", "name": "R"}]),
                };
                let session = if input.byte().is_multiple_of(5) {
                    "other"
                } else {
                    "s"
                };
                let method = if input.byte().is_multiple_of(4) {
                    "fs/read_text_file"
                } else {
                    "session/request_permission"
                };
                Some(
                    json!({"jsonrpc": "2.0", "id": format!("a{agent_ids}"), "method": method,
                        "params": {"sessionId": session, "toolCall": {"toolCallId": format!("t{}", input.below(4))}, "options": options}})
                    .to_string(),
                )
            }
            8 => Some(String::from_utf8_lossy(&input.garbage_line(64)).into_owned()),
            9 => Some(
                json!({"jsonrpc": "2.0", "id": u64::from(input.byte()) + 1000, "result": {}})
                    .to_string(),
            ),
            10 => {
                // A late answer to any prompt ever sent.
                let ids: Vec<u64> = o.prompts.keys().copied().collect();
                (!ids.is_empty()).then(|| {
                    let id = ids[input.below(ids.len())];
                    json!({"jsonrpc": "2.0", "id": id, "result": {"stopReason": "end_turn"}})
                        .to_string()
                })
            }
            _ => {
                if input.byte().is_multiple_of(8) {
                    client.shutdown(now);
                }
                None
            }
        };
        if let Some(line) = line {
            let line = format!("{line}\n");
            let split = split.min(line.len());
            let asks = line.contains("\"id\":\"a");
            let closed = o.closed;
            client.handle_bytes(&line.as_bytes()[..split], now);
            o.drain(&mut client, now);
            let mut out = Vec::new();
            client.handle_bytes(&line.as_bytes()[split..], now);
            while let Some(output) = client.poll_output() {
                out.push(output);
            }
            if asks && !closed {
                let id = format!("\"id\":\"a{agent_ids}\"");
                let answers = out
                    .iter()
                    .filter(|o| {
                        matches!(o, AcpOutput::Transmit(l) if String::from_utf8_lossy(l).contains(&id))
                    })
                    .count();
                assert_eq!(
                    answers, 1,
                    "the agent's request a{agent_ids} is answered once"
                );
            }
            // The same checks on what was taken.
            o.check_each(&mut Shadow(&mut out.into_iter()));
            o.check_timer(&client, now);
        } else {
            o.drain(&mut client, now);
        }
    }
    client.shutdown(now);
    o.drain(&mut client, now);
    assert!(o.closed, "shutdown closes stdin");
    assert!(o.running.is_empty(), "every turn ended by shutdown");
    for id in pushed.into_iter().flatten() {
        assert!(
            o.carried.contains(&id) || o.reported.contains(&id),
            "{id} was neither delivered nor reported"
        );
    }
}

/// Something outputs can be polled from.
trait Outputs {
    fn next_output(&mut self) -> Option<AcpOutput>;
}

struct Shadow<'a, I: Iterator<Item = AcpOutput>>(&'a mut I);

impl<I: Iterator<Item = AcpOutput>> Outputs for Shadow<'_, I> {
    fn next_output(&mut self) -> Option<AcpOutput> {
        self.0.next()
    }
}

impl Outputs for AcpClient {
    fn next_output(&mut self) -> Option<AcpOutput> {
        self.poll_output()
    }
}
