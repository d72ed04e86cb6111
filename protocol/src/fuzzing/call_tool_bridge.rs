//! The oracle of the `call_tool_bridge` fuzz target: an agent, a parent and the driver against a `call_tool` bridge.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::{Input, MAX_POLLS};
use crate::codec::json::RawJson;
use crate::codec::length_prefixed;

/// The tools a fuzzed `call_tool` bridge serves: one with a required string, one strict, so both
/// schema paths (accepted, rejected) are reachable.
const CALL_TOOL_FUZZ_TOOLS: &str = r#"[
  {"name":"echo","description":"Echo","input_schema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}},
  {"name":"add","description":"Add","input_schema":{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}}
]"#;

/// What the oracle expects an agent request to be answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CtbExpect {
    /// `tools/list`: the schema file's tools.
    List,
    /// `initialize`: a result with `serverInfo`.
    Init,
    /// `ping`: `{}`.
    Empty,
    /// An error with this code.
    Error(i64),
    /// A `tools/call` refused by the schema: an `isError` result, nothing sent.
    Rejected,
    /// A `tools/call` sent (or failed) through the parent, carrying this tag in its arguments.
    Call(u64),
}

/// The oracle's view of the connection to the parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CtbLink {
    Idle,
    Connecting,
    Open,
}

/// The call timeout of the fuzzed bridge.
const CTB_CALL_TIMEOUT: Duration = Duration::from_secs(8);

/// Everything the `call_tool_bridge` oracle tracks.
struct CtbOracle {
    max_payload_bytes: usize,
    tools_list: serde_json::Value,
    /// The driver's clock: every input happens at this time.
    now: Instant,
    /// Request id (raw JSON text) → what answers it.
    expect: BTreeMap<String, CtbExpect>,
    /// Request id → responses seen.
    answered: BTreeMap<String, usize>,
    /// Requests cancelled before they were answered.
    cancelled: BTreeSet<String>,
    link: CtbLink,
    /// The call tag awaited on the wire, and its deadline.
    in_flight: Option<(u64, Instant)>,
    /// Calls cancelled while on the wire whose replies the parent still owes, oldest first:
    /// the next frames from the parent are theirs.
    late: VecDeque<u64>,
    /// Late replies the bridge reported discarded.
    discarded: usize,
    /// The last call tag sent to the parent (calls go in the agent's order).
    last_sent: Option<u64>,
    /// Reply tag → the call tag it answers (the one owed the next reply when it reached the
    /// bridge; `None`: nobody was owed one), and the result sent.
    replies: BTreeMap<u64, (Option<u64>, Option<serde_json::Value>)>,
    /// The call whose cancel the bridge is being sent.
    cancelling: Option<u64>,
    /// Call tags answered with the timeout.
    timed_out: BTreeSet<u64>,
    /// Garbage from the parent left part of a frame in the bridge's buffer: until the link
    /// drops, the oracle cannot tell where the parent's frames start, so it does not say which
    /// call a reply answers.
    garbled: bool,
    /// Reply tags sent while garbled (their frames may be cut anywhere).
    garbled_replies: BTreeSet<u64>,
    exited: bool,
}

impl CtbOracle {
    /// The tag in the arguments of a call frame: `echo {"text":"c<tag>…"}`, `add {"a":<tag>}`,
    /// anything else `{"tag":<tag>}`.
    fn call_tag(name: &str, arguments: &serde_json::Value) -> u64 {
        let tag = match name {
            "echo" => arguments["text"]
                .as_str()
                .and_then(|t| t.strip_prefix('c'))
                .and_then(|t| t.split('-').next())
                .and_then(|t| t.parse().ok()),
            "add" => arguments["a"].as_u64(),
            _ => arguments["tag"].as_u64(),
        };
        tag.unwrap_or_else(|| panic!("a call the agent never made: {name} {arguments}"))
    }

    /// The calls the next frames from the parent answer, in order: the late replies owed, then
    /// the call awaited.
    fn owed(&self) -> VecDeque<u64> {
        let mut owed = self.late.clone();
        owed.extend(self.in_flight.map(|(tag, _)| tag));
        owed
    }

    fn drain(&mut self, bridge: &mut crate::dialect::call_tool_bridge::CallToolBridge) {
        use crate::dialect::call_tool::{CallError, MAX_LATE_REPLIES};
        use crate::dialect::call_tool_bridge::{
            CallToolBridgeEvent, CallToolBridgeOutput as Out, CallToolPeer,
        };
        let mut polls = 0;
        while let Some(output) = bridge.poll_output() {
            polls += 1;
            assert!(polls <= MAX_POLLS, "poll_output does not terminate");
            assert!(!self.exited, "output after Exit: {output:?}");
            match output {
                Out::Transmit {
                    to: CallToolPeer::Agent,
                    bytes,
                } => self.agent_line(&bytes),
                Out::Transmit {
                    to: CallToolPeer::Parent,
                    bytes,
                } => {
                    assert_eq!(self.link, CtbLink::Open, "a frame sent while not connected");
                    assert_eq!(self.in_flight, None, "a second call awaited on the wire");
                    assert!(
                        self.late.len() <= MAX_LATE_REPLIES,
                        "a call sent behind more than {MAX_LATE_REPLIES} late replies"
                    );
                    let prefix: [u8; 4] = bytes[..4].try_into().expect("a length prefix");
                    let len = u32::from_be_bytes(prefix) as usize;
                    assert_eq!(len + 4, bytes.len(), "one whole frame per transmit");
                    assert!(len <= self.max_payload_bytes, "a frame over the cap");
                    let call = crate::dialect::call_tool::decode_call(&bytes[4..])
                        .unwrap_or_else(|e| panic!("an undecodable call: {e:?}"));
                    let arguments: serde_json::Value =
                        call.arguments.parse().expect("arguments are JSON");
                    let tag = Self::call_tag(&call.name, &arguments);
                    assert!(
                        self.expect.values().any(|e| *e == CtbExpect::Call(tag)),
                        "a call the agent never made"
                    );
                    assert!(
                        self.last_sent.is_none_or(|last| tag > last),
                        "call {tag} sent twice or out of order"
                    );
                    self.last_sent = Some(tag);
                    self.in_flight = Some((tag, self.now + CTB_CALL_TIMEOUT));
                }
                Out::Connect => {
                    assert_eq!(self.link, CtbLink::Idle, "Connect while connected");
                    self.link = CtbLink::Connecting;
                }
                Out::Disconnect => {
                    assert_ne!(self.link, CtbLink::Idle, "Disconnect while disconnected");
                    self.link = CtbLink::Idle;
                    self.in_flight = None;
                    self.late.clear();
                    self.garbled = false;
                }
                Out::Event(CallToolBridgeEvent::Completed { error, .. }) => match error {
                    Some(CallError::TooLarge(_)) => {}
                    Some(CallError::TimedOut { after }) => {
                        assert_eq!(after, CTB_CALL_TIMEOUT);
                        let Some((tag, _)) = self.in_flight.take() else {
                            panic!("a timeout with no call awaited");
                        };
                        assert!(
                            self.timed_out.contains(&tag),
                            "call {tag} timed out without the agent being told so"
                        );
                    }
                    _ => self.in_flight = None,
                },
                Out::Event(CallToolBridgeEvent::Cancelled { on_wire, .. }) => {
                    let Some(tag) = self.cancelling.take() else {
                        panic!("a cancel for no call the agent was waiting on");
                    };
                    let awaited = self.in_flight.is_some_and(|(t, _)| t == tag);
                    assert_eq!(on_wire, awaited, "call {tag}: on the wire or not?");
                    if on_wire {
                        self.in_flight = None;
                        self.late.push_back(tag);
                    }
                }
                Out::Event(CallToolBridgeEvent::LateReplyDiscarded { .. }) => {
                    assert!(
                        self.late.pop_front().is_some(),
                        "a late reply discarded while none was owed"
                    );
                    self.discarded += 1;
                }
                Out::Event(_) => {}
                Out::Exit => self.exited = true,
            }
        }
        assert_eq!(
            bridge.is_closed(),
            self.exited,
            "is_closed disagrees with Exit"
        );
        let deadline = if self.exited {
            None
        } else {
            self.in_flight.map(|(_, deadline)| deadline)
        };
        assert_eq!(
            bridge.poll_timeout(),
            deadline,
            "the timer is not the deadline of the call awaited"
        );
    }

    fn agent_line(&mut self, bytes: &[u8]) {
        assert_eq!(
            bytes.last(),
            Some(&b'\n'),
            "an agent line ends with a newline"
        );
        assert_eq!(
            bytes.iter().filter(|b| **b == b'\n').count(),
            1,
            "one line per transmit"
        );
        let line: serde_json::Value =
            serde_json::from_slice(bytes).expect("the agent gets valid JSON");
        assert_eq!(line["jsonrpc"], "2.0");
        let id = &line["id"];
        if id.is_null() {
            assert!(
                line["error"].is_object(),
                "a null id only on an error: {line}"
            );
            return;
        }
        let key = id.to_string();
        let Some(expect) = self.expect.get(&key).copied() else {
            panic!("a response to a request never sent: {line}");
        };
        assert!(
            !self.cancelled.contains(&key),
            "a cancelled request was answered"
        );
        let count = self.answered.entry(key.clone()).or_default();
        *count += 1;
        assert_eq!(*count, 1, "request {key} answered twice");
        let result = &line["result"];
        match expect {
            CtbExpect::List => assert_eq!(result, &self.tools_list),
            CtbExpect::Init => assert!(result["serverInfo"].is_object(), "{line}"),
            CtbExpect::Empty => assert_eq!(result, &serde_json::json!({})),
            CtbExpect::Error(code) => assert_eq!(line["error"]["code"], code, "{line}"),
            CtbExpect::Rejected | CtbExpect::Call(_) => {
                assert!(
                    result.is_object(),
                    "a tool failure is a result, not an error: {line}"
                );
                let raw = RawJson::from_value(result).expect("JSON");
                crate::dialect::call_tool::validate_tool_result(&raw).unwrap_or_else(|e| {
                    panic!("the agent got an invalid tool result ({e}): {line}")
                });
                let text = result["content"][0]["text"].as_str().unwrap_or_default();
                if expect == CtbExpect::Rejected {
                    assert_eq!(result["isError"], true);
                    assert!(text.starts_with("Input validation error"), "{text}");
                }
                let CtbExpect::Call(tag) = expect else {
                    return;
                };
                if text.contains(": the parent did not reply within ") {
                    assert_eq!(result["isError"], true);
                    let Some((awaited, deadline)) = self.in_flight else {
                        panic!("call {tag} timed out while nothing was awaited");
                    };
                    assert_eq!(
                        awaited, tag,
                        "call {tag} answered with the timeout of {awaited}"
                    );
                    assert!(self.now >= deadline, "call {tag} timed out early");
                    self.timed_out.insert(tag);
                }
                // A reply tag in the answer: the reply must be the one owed to this call when it
                // reached the bridge, and a valid result is passed through unchanged.
                let reply = text
                    .strip_prefix('r')
                    .or_else(|| text.strip_prefix('m'))
                    .and_then(|t| t.split(' ').next())
                    .and_then(|t| t.parse::<u64>().ok());
                if let Some(reply) = reply
                    && !self.garbled_replies.contains(&reply)
                {
                    let (owed_to, sent) = &self.replies[&reply];
                    assert_eq!(
                        *owed_to,
                        Some(tag),
                        "call {tag} got reply {reply}, which answers {owed_to:?}"
                    );
                    if let Some(sent) = sent {
                        assert_eq!(result, sent, "a valid result is passed through unchanged");
                    }
                }
            }
        }
    }
}

/// Whether length-prefixed `bytes`, read from a frame boundary, stop inside a frame (its
/// prefix or its payload).
fn ends_inside_a_frame(mut bytes: &[u8]) -> bool {
    loop {
        let Some((prefix, rest)) = bytes.split_first_chunk::<4>() else {
            return !bytes.is_empty();
        };
        let len = u32::from_be_bytes(*prefix) as usize;
        if rest.len() < len {
            return true;
        }
        bytes = &rest[len..];
    }
}

/// `call_tool_bridge`: an agent, a parent process and the driver doing arbitrary things to a
/// [`crate::dialect::call_tool_bridge::CallToolBridge`]: requests of every kind (split at arbitrary
/// bytes), cancellations (of queued calls, of the call on the wire, of answered ones), garbage
/// lines; connection attempts succeeding or failing; replies (some owed to cancelled calls, some
/// not JSON at all), unsolicited replies, invalid results and raw garbage from the parent; the
/// parent closing; time passing, with the driver's timer firing when due and sometimes early;
/// agent EOF or a signal. Calls and replies carry tags so the oracle can tell them apart.
///
/// Oracles: every agent request is answered exactly once (a cancelled one never), all of them by
/// the time of `Exit`, with the answer its method gets (`tools/list` the schema file's tools,
/// `-32601` for unknown methods, `-32602` without a name); every `tools/call` answer is a valid
/// `CallToolResult`, never a JSON-RPC error; a call times out only once its deadline (the time
/// it was sent plus the call timeout) has passed, and its answer names the timeout; the timer
/// asked for is always the deadline of the call awaited; a parent reply answers only the call
/// owed the next reply when its last byte reached the bridge (the calls cancelled on the wire
/// first, then the call awaited; two replies in one read beyond that drop the link; a second one
/// arriving after the next call went out is indistinguishable from that call's answer; after
/// garbage from the parent left part of a frame buffered, which call a reply reaches is not
/// checked until the link drops, since frames can no longer be told apart), a reply
/// owed to a cancelled call is discarded whatever it holds and reaches nobody, and a valid
/// result reaches the agent unchanged; lines to the agent are single-line JSON; frames to the
/// parent are whole length-prefixed `call_tool` requests under the cap, sent only while
/// connected, one awaited at a time, each call at most once and in the agent's order;
/// `Connect` only while disconnected, `Disconnect` only while connected or connecting;
/// connection reports the driver cannot have made and timers fired early change nothing;
/// `Exit` once and last, after it `is_closed` holds and every input is ignored; `poll_output`
/// terminates.
pub fn call_tool_bridge_ops(data: &[u8]) {
    use crate::dialect::call_tool::{Reply, encode_reply, parse_schema_file, tools_list_result};
    use crate::dialect::call_tool_bridge::{CallToolBridge, CallToolBridgeConfig};
    use serde_json::json;
    let mut input = Input::new(data);
    let max_payload_bytes = 64 + usize::from(input.byte()) * 4;
    let tools = parse_schema_file(CALL_TOOL_FUZZ_TOOLS).expect("valid tools");
    let tools_list = tools_list_result(&tools).parse().expect("JSON");
    let mut bridge = CallToolBridge::new(
        CallToolBridgeConfig {
            max_payload_bytes,
            max_agent_line_bytes: 8192,
            server_name: "fuzz".into(),
            server_version: "0".into(),
            call_timeout: CTB_CALL_TIMEOUT,
        },
        tools,
    );
    let mut o = CtbOracle {
        max_payload_bytes,
        tools_list,
        now: Instant::now(),
        expect: BTreeMap::new(),
        answered: BTreeMap::new(),
        cancelled: BTreeSet::new(),
        link: CtbLink::Idle,
        in_flight: None,
        late: VecDeque::new(),
        discarded: 0,
        last_sent: None,
        replies: BTreeMap::new(),
        cancelling: None,
        timed_out: BTreeSet::new(),
        garbled: false,
        garbled_replies: BTreeSet::new(),
        exited: false,
    };
    o.drain(&mut bridge);
    let mut next = 0u64;
    let mut steps = 0;
    while !input.is_empty() && !o.exited && steps < 2_000 {
        steps += 1;
        next += 1;
        let n = next;
        match input.byte() % 14 {
            0..=3 => {
                let key = if n.is_multiple_of(2) {
                    n.to_string()
                } else {
                    format!("\"s{n}\"")
                };
                let (method, params, expect) = match input.byte() % 10 {
                    0 => ("tools/list", json!({}), CtbExpect::List),
                    1 => (
                        "initialize",
                        json!({"protocolVersion":"2025-06-18"}),
                        CtbExpect::Init,
                    ),
                    2 => ("ping", json!({}), CtbExpect::Empty),
                    3 => ("resources/list", json!({}), CtbExpect::Error(-32601)),
                    4 => (
                        "tools/call",
                        json!({"arguments":{}}),
                        CtbExpect::Error(-32602),
                    ),
                    5 => (
                        "tools/call",
                        json!({"name":"echo","arguments":{"text":n}}),
                        CtbExpect::Rejected,
                    ),
                    6 => (
                        "tools/call",
                        json!({"name":"add","arguments":{"a":n,"b":2}}),
                        CtbExpect::Call(n),
                    ),
                    7 => (
                        "tools/call",
                        json!({"name":"nope","arguments":{"tag":n}}),
                        CtbExpect::Call(n),
                    ),
                    _ => {
                        let pad = "p".repeat(input.below(3) * max_payload_bytes / 2);
                        let text = if pad.is_empty() {
                            format!("c{n}")
                        } else {
                            format!("c{n}-{pad}")
                        };
                        (
                            "tools/call",
                            json!({"name":"echo","arguments":{"text":text}}),
                            CtbExpect::Call(n),
                        )
                    }
                };
                o.expect.insert(key.clone(), expect);
                let line = format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{key},\"method\":\"{method}\",\"params\":{params}}}\n"
                );
                let split = input.below(line.len() + 1);
                bridge.handle_agent_bytes(&line.as_bytes()[..split], o.now);
                o.drain(&mut bridge);
                bridge.handle_agent_bytes(&line.as_bytes()[split..], o.now);
            }
            4 => {
                // Mostly the call awaited or a queued one; sometimes anything the agent sent.
                let any = input.byte().is_multiple_of(4);
                let pick = input.byte();
                let waiting: Vec<&String> = o
                    .expect
                    .iter()
                    .filter(|(key, e)| {
                        matches!(e, CtbExpect::Call(_)) && !o.answered.contains_key(*key)
                    })
                    .map(|(key, _)| key)
                    .collect();
                let keys: Vec<&String> = if !waiting.is_empty() && !any {
                    waiting
                } else {
                    o.expect.keys().collect()
                };
                if keys.is_empty() {
                    continue;
                }
                let key = keys[usize::from(pick) % keys.len()].clone();
                if !o.answered.contains_key(&key) && !o.cancelled.contains(&key) {
                    o.cancelled.insert(key.clone());
                    if let Some(CtbExpect::Call(tag)) = o.expect.get(&key) {
                        o.cancelling = Some(*tag);
                    }
                }
                let line = format!(
                    "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{{\"requestId\":{key},\"reason\":\"x\"}}}}\n"
                );
                bridge.handle_agent_bytes(line.as_bytes(), o.now);
                o.drain(&mut bridge);
                assert_eq!(
                    o.cancelling, None,
                    "a waiting call cancelled without a trace"
                );
            }
            5 => {
                // Garbage that can never name a request id, one line.
                let mut garbage = input.garbage_line(60);
                if garbage.is_empty() {
                    garbage.extend_from_slice(
                        b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}",
                    );
                }
                garbage.push(b'\n');
                bridge.handle_agent_bytes(&garbage, o.now);
            }
            6 => match (o.link, input.byte() % 3) {
                (CtbLink::Connecting, 0) => {
                    bridge.handle_connect_failed("refused", o.now);
                    o.link = CtbLink::Idle;
                }
                (CtbLink::Connecting, _) => {
                    bridge.handle_connected(o.now);
                    o.link = CtbLink::Open;
                }
                (_, spurious) => {
                    // A report the driver cannot make in this state changes nothing.
                    match spurious {
                        0 => bridge.handle_connected(o.now),
                        1 => bridge.handle_connect_failed("late", o.now),
                        _ if o.link == CtbLink::Idle => bridge.handle_parent_closed(o.now),
                        _ => bridge.handle_connected(o.now),
                    }
                    assert_eq!(
                        bridge.poll_output(),
                        None,
                        "a report out of place did something"
                    );
                }
            },
            7 | 8 => {
                // The bytes of a step are read whatever the state, so an input means the same
                // steps in any state.
                let mut bytes = Vec::new();
                // (reply tag, the valid result sent, where the frame ends in `bytes`)
                let mut frames_sent = Vec::new();
                let frames = if input.byte().is_multiple_of(4) { 2 } else { 1 };
                for i in 0..frames {
                    let rt = n * 2 + i;
                    let (payload, sent) = match input.byte() % 7 {
                        0 | 1 => {
                            let result = json!({"content":[{"type":"text","text":format!("r{rt}")}],"isError":input.byte().is_multiple_of(4)});
                            let raw = RawJson::from_value(&result).expect("JSON");
                            (encode_reply(&Reply::Result(raw)), Some(result))
                        }
                        2 => (
                            encode_reply(&Reply::Error {
                                message: format!("m{rt}"),
                                error_type: "ToolError".into(),
                            }),
                            None,
                        ),
                        3 => (br#"{"result":{}}"#.to_vec(), None),
                        4 => (br#"{"result":{"content":[{"type":"text"}]}}"#.to_vec(), None),
                        5 => (
                            format!(
                                r#"{{"result":{{"content":[{{"type":"text","text":"r{rt}"}}],"isError":"no"}}}}"#
                            )
                            .into_bytes(),
                            None,
                        ),
                        // Not JSON: a protocol error, unless a cancelled call is owed it.
                        _ => (format!("late r{rt} \"").into_bytes(), None),
                    };
                    length_prefixed::encode(&payload, &mut bytes, usize::MAX).expect("no cap");
                    frames_sent.push((rt, sent, bytes.len()));
                }
                // A reply belongs to the call owed the next reply when its last byte reaches the
                // bridge: a frame that arrives whole after the next call went out is, for all the
                // bridge can tell, that call's answer (the stream carries no timing).
                let split = input.below(bytes.len() + 1);
                if o.link != CtbLink::Open {
                    continue;
                }
                if o.garbled {
                    // Whatever these bytes complete, every reply is still answered at most once
                    // and every request once (checked as ever); which call a reply reaches is
                    // not the oracle's to say.
                    o.garbled_replies
                        .extend(frames_sent.iter().map(|(rt, _, _)| *rt));
                    bridge.handle_parent_bytes(&bytes[..split], o.now);
                    o.drain(&mut bridge);
                    if o.link == CtbLink::Open {
                        bridge.handle_parent_bytes(&bytes[split..], o.now);
                        o.drain(&mut bridge);
                    }
                    continue;
                }
                let mut owed = o.owed();
                let late_before = o.late.len();
                let discarded_before = o.discarded;
                let mut whole = 0;
                for (rt, sent, end) in &frames_sent {
                    if *end <= split {
                        whole += 1;
                        o.replies.insert(*rt, (owed.pop_front(), sent.clone()));
                    }
                }
                bridge.handle_parent_bytes(&bytes[..split], o.now);
                o.drain(&mut bridge);
                // Owed replies come first and are discarded unread, whatever they hold.
                assert_eq!(
                    o.discarded - discarded_before,
                    whole.min(late_before),
                    "late replies not discarded by their frames"
                );
                if o.link == CtbLink::Open {
                    let mut owed = o.owed();
                    for (rt, sent, end) in frames_sent {
                        if end > split {
                            o.replies.insert(rt, (owed.pop_front(), sent));
                        }
                    }
                    bridge.handle_parent_bytes(&bytes[split..], o.now);
                }
            }
            9 => {
                let garbage = input.bytes(24);
                if o.link == CtbLink::Open {
                    bridge.handle_parent_bytes(garbage, o.now);
                    o.drain(&mut bridge);
                    // Part of a frame left in the bridge's buffer (the link still up) puts the
                    // parent's next frames out of the oracle's reckoning.
                    if o.link == CtbLink::Open && ends_inside_a_frame(garbage) {
                        o.garbled = true;
                    }
                }
            }
            10 if o.link == CtbLink::Open => {
                bridge.handle_parent_closed(o.now);
                o.link = CtbLink::Idle;
                o.in_flight = None;
                o.late.clear();
                o.garbled = false;
            }
            11 => {
                if input.byte().is_multiple_of(2) {
                    bridge.handle_agent_eof(o.now);
                } else {
                    bridge.handle_terminate(o.now);
                }
            }
            12 => {
                // Time passes; the driver fires the timer once it is due.
                o.now += CTB_CALL_TIMEOUT / 4 * u32::from(input.byte() % 6);
                if bridge.poll_timeout().is_some_and(|due| due <= o.now) {
                    bridge.handle_timeout(o.now);
                }
            }
            // A timer firing before it is due (or with none asked for) changes nothing.
            13 if bridge.poll_timeout().is_none_or(|due| o.now < due) => {
                bridge.handle_timeout(o.now);
                assert_eq!(bridge.poll_output(), None, "an early timer did something");
            }
            _ => {}
        }
        o.drain(&mut bridge);
    }
    if !o.exited {
        bridge.handle_agent_eof(o.now);
        o.drain(&mut bridge);
    }
    assert!(o.exited, "agent EOF ends the session");
    for (key, _) in o.expect.iter() {
        let count = o.answered.get(key).copied().unwrap_or(0);
        if o.cancelled.contains(key) {
            assert_eq!(count, 0, "cancelled request {key} answered");
        } else {
            assert_eq!(count, 1, "request {key} answered {count} times");
        }
    }
    // Closed for good: every input is ignored.
    bridge.handle_agent_bytes(
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n",
        o.now,
    );
    bridge.handle_agent_eof(o.now);
    bridge.handle_terminate(o.now);
    bridge.handle_connected(o.now);
    bridge.handle_connect_failed("x", o.now);
    bridge.handle_parent_bytes(b"\0\0\0\x02{}", o.now);
    bridge.handle_parent_closed(o.now);
    bridge.handle_timeout(o.now + CTB_CALL_TIMEOUT * 2);
    assert!(bridge.is_closed());
    assert_eq!(bridge.poll_timeout(), None, "a timer after Exit");
    assert_eq!(bridge.poll_output(), None, "output after Exit");
}
