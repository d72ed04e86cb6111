//! The oracle of the `codex` fuzz target: a fake `codex app-server` and a runner against a [`CodexClient`](crate::dialect::codex::CodexClient).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::{Input, MAX_POLLS};
use crate::dialect::codex::CodexRequestError;

/// The oracle's model of a [`crate::dialect::codex::CodexClient`]'s phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CxPhase {
    Initializing,
    Starting,
    Running,
    Failed,
    Closed,
}

/// A request the client sent that the fake codex has not answered.
#[derive(Debug, Clone)]
struct CxSent {
    method: String,
    /// The events a `turn/start` / `turn/steer` carries.
    events: Vec<u32>,
}

/// Everything the `codex` oracle tracks.
struct CxOracle {
    phase: CxPhase,
    model: Option<String>,
    thread: Option<String>,
    status: crate::dialect::codex::ThreadStatus,
    turn: Option<String>,
    /// Client requests not answered yet, by id.
    open: BTreeMap<u64, CxSent>,
    /// Every id the client used.
    ids: BTreeSet<u64>,
    /// Events pushed: index → whom to tell.
    pushed: Vec<Option<(String, String)>>,
    delivered: Vec<u32>,
    dropped: usize,
    undelivered: BTreeSet<u32>,
    /// App request id → what codex answered (None: not yet), and responses seen.
    app: BTreeMap<u64, (Option<Result<serde_json::Value, CodexRequestError>>, usize)>,
    /// Server request id (raw) → (denied, answers seen).
    server: BTreeMap<String, (bool, usize)>,
    ready: usize,
    failed: usize,
    closed_stdin: bool,
    /// What this step may do.
    may_drop: bool,
    may_start: bool,
}

impl CxOracle {
    fn events_of(text: &str) -> Vec<u32> {
        text.split('\n')
            .map(|e| {
                e.strip_prefix('e')
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("an event nobody pushed: {e:?}"))
            })
            .collect()
    }

    fn drain(&mut self, client: &mut crate::dialect::codex::CodexClient) {
        use crate::dialect::codex::{CodexEvent, CodexOutput, ThreadStatus};
        let mut polls = 0;
        while let Some(output) = client.poll_output() {
            polls += 1;
            assert!(polls <= MAX_POLLS, "poll_output does not terminate");
            match output {
                CodexOutput::Transmit(line) => {
                    assert!(!self.closed_stdin, "a line for codex after CloseStdin");
                    assert_eq!(line.last(), Some(&b'\n'));
                    assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
                    let v: serde_json::Value =
                        serde_json::from_slice(&line).expect("codex gets valid JSON");
                    assert_eq!(v["jsonrpc"], "2.0");
                    if let Some(method) = v["method"].as_str() {
                        let id = v["id"].as_u64().expect("every request has a numeric id");
                        assert!(self.ids.insert(id), "request id {id} used twice");
                        let params = &v["params"];
                        let mut events = Vec::new();
                        match method {
                            "initialize" => assert_eq!(self.ids.len(), 1, "initialize first"),
                            "thread/start" => {
                                assert_eq!(self.phase, CxPhase::Starting, "thread/start early");
                                assert_eq!(params["approvalPolicy"], "never");
                                assert_eq!(params["sandbox"], "danger-full-access");
                                assert_eq!(params["model"].as_str(), self.model.as_deref());
                            }
                            "turn/start" | "turn/steer" => {
                                assert_eq!(self.phase, CxPhase::Running, "a turn before Ready");
                                assert_eq!(params["threadId"].as_str(), self.thread.as_deref());
                                assert!(
                                    !self.open.values().any(|s| !s.events.is_empty()),
                                    "two deliveries in flight"
                                );
                                if method == "turn/steer" {
                                    assert_eq!(self.status, ThreadStatus::Active);
                                    assert_eq!(
                                        params["expectedTurnId"].as_str(),
                                        self.turn.as_deref(),
                                        "steering a turn that is not the active one"
                                    );
                                } else {
                                    assert!(
                                        matches!(
                                            self.status,
                                            ThreadStatus::Idle | ThreadStatus::SystemError
                                        ),
                                        "turn/start while {:?}",
                                        self.status
                                    );
                                }
                                let text = params["input"][0]["text"].as_str().expect("text");
                                events = Self::events_of(text);
                                assert!(!events.is_empty());
                            }
                            "turn/interrupt" => {
                                assert_eq!(params["threadId"].as_str(), self.thread.as_deref());
                                assert_eq!(params["turnId"].as_str(), self.turn.as_deref());
                                assert!(self.turn.is_some(), "interrupting no turn");
                            }
                            "x/app" => {
                                assert!(self.app.contains_key(&id), "an app request not asked for");
                            }
                            other => panic!("an unexpected request: {other}"),
                        }
                        self.open.insert(
                            id,
                            CxSent {
                                method: method.to_owned(),
                                events,
                            },
                        );
                    } else {
                        let key = v["id"].to_string();
                        let Some((denied, count)) = self.server.get_mut(&key) else {
                            panic!("an answer to a request codex never sent: {v}");
                        };
                        *count += 1;
                        assert_eq!(*count, 1, "server request {key} answered twice");
                        if *denied {
                            assert_eq!(
                                v["result"],
                                serde_json::json!({"decision":"deny","action":"cancel"})
                            );
                        } else {
                            assert_eq!(v["error"]["code"], -32601);
                        }
                    }
                }
                CodexOutput::Ready { thread_id } => {
                    assert!(self.may_start && !self.closed_stdin, "Ready out of place");
                    self.ready += 1;
                    assert_eq!(self.ready, 1, "Ready twice");
                    assert_eq!(Some(thread_id.as_str()), self.thread.as_deref());
                }
                CodexOutput::Failed(_) => {
                    assert!(self.may_start && !self.closed_stdin, "Failed out of place");
                    self.failed += 1;
                    assert_eq!(self.failed + self.ready, 1, "Failed after Ready, or twice");
                }
                CodexOutput::CloseStdin => {
                    assert!(!self.closed_stdin, "CloseStdin twice");
                    self.closed_stdin = true;
                }
                CodexOutput::Response { id, outcome } => {
                    let Some((answer, count)) = self.app.get_mut(&id) else {
                        panic!("a response to request {id}, never made");
                    };
                    *count += 1;
                    assert_eq!(*count, 1, "request {id} answered twice");
                    match answer {
                        Some(answer) => assert_eq!(&outcome, answer, "the wrong answer"),
                        None => assert!(outcome.is_err(), "a result codex never sent"),
                    }
                }
                CodexOutput::Undelivered(u) => {
                    assert!(!u.msg_ids.is_empty());
                    let mut last = None;
                    for msg in &u.msg_ids {
                        let n: u32 = msg[1..].parse().expect("a pushed message id");
                        assert!(last < Some(n), "message ids out of push order");
                        last = Some(n);
                        assert_eq!(
                            self.pushed[n as usize],
                            Some((u.to.clone(), msg.clone())),
                            "told the wrong sender, or one with nobody to tell"
                        );
                        assert!(self.undelivered.insert(n), "told twice about {msg}");
                    }
                }
                CodexOutput::TurnFailed(failure) => {
                    panic!("a failed turn codex never reported: {failure:?}")
                }
                CodexOutput::Event(CodexEvent::Dropped { events, .. }) => {
                    assert!(
                        self.may_drop,
                        "events dropped without a rejection or a shutdown"
                    );
                    self.dropped += events;
                }
                CodexOutput::Event(_) => {}
            }
        }
    }

    /// Between steps: the client's view agrees with the model, server requests are answered.
    fn check(&self, client: &crate::dialect::codex::CodexClient) {
        assert_eq!(client.status(), self.status, "thread status");
        if self.phase == CxPhase::Running {
            assert_eq!(client.thread_id(), self.thread.as_deref(), "thread id");
            assert_eq!(client.active_turn(), self.turn.as_deref(), "active turn");
        }
        for (key, (_, count)) in &self.server {
            assert!(
                *count == 1 || self.closed_stdin,
                "server request {key} not answered"
            );
        }
    }

    /// The status a `{"type": …}` object names, as the module docs list them.
    fn status_of(value: &serde_json::Value) -> Option<crate::dialect::codex::ThreadStatus> {
        use crate::dialect::codex::ThreadStatus;
        Some(match value["type"].as_str()? {
            "notLoaded" => ThreadStatus::NotLoaded,
            "idle" => ThreadStatus::Idle,
            "active" => ThreadStatus::Active,
            "systemError" => ThreadStatus::SystemError,
            _ => return None,
        })
    }

    /// Codex answers request `id`: `ok` or an error with `message`. Returns the line.
    fn answer(&mut self, id: u64, ok: bool, message: &str, status: &str, tag: u64) -> String {
        let sent = self.open.remove(&id).expect("an open request");
        let error = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{{\"code\":-32000,\"message\":\"{message}\"}}}}"
        );
        if !ok {
            self.may_drop |= !sent.events.is_empty();
            match sent.method.as_str() {
                "initialize" | "thread/start" if self.phase != CxPhase::Closed => {
                    self.may_start = true;
                    self.phase = CxPhase::Failed;
                }
                "x/app" => {
                    if let Some((answer, _)) = self.app.get_mut(&id) {
                        *answer = Some(Err(CodexRequestError::Codex {
                            code: -32000,
                            message: message.to_owned(),
                        }));
                    }
                }
                _ => {}
            }
            return error;
        }
        let result = match sent.method.as_str() {
            "initialize" => {
                if self.phase != CxPhase::Closed {
                    self.phase = CxPhase::Starting;
                }
                serde_json::json!({"userAgent": "fuzz"})
            }
            "thread/start" => {
                let thread = format!("th{tag}");
                let result = if status == "noid" {
                    serde_json::json!({"thread": {"status": {"type": "idle"}}})
                } else {
                    serde_json::json!({"thread": {"id": thread, "status": {"type": status}}})
                };
                if self.phase != CxPhase::Closed {
                    self.may_start = true;
                    if status == "noid" {
                        self.phase = CxPhase::Failed;
                    } else {
                        self.phase = CxPhase::Running;
                        self.thread = Some(thread);
                        self.turn = None;
                        if let Some(s) = Self::status_of(&result["thread"]["status"]) {
                            self.status = s;
                        }
                    }
                }
                result
            }
            "x/app" => {
                let result = serde_json::json!({"tag": tag});
                if let Some((answer, _)) = self.app.get_mut(&id) {
                    *answer = Some(Ok(result.clone()));
                }
                result
            }
            _ => {
                for event in &sent.events {
                    assert!(
                        self.delivered.last().is_none_or(|last| last < event),
                        "event {event} delivered twice or out of order"
                    );
                    self.delivered.push(*event);
                }
                serde_json::json!({})
            }
        };
        format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{result}}}")
    }
}

/// Statuses as codex writes them, plus ones the client must ignore.
const CX_STATUSES: [&str; 6] = [
    "idle",
    "active",
    "notLoaded",
    "systemError",
    "weird",
    "noid",
];

/// `codex`: a fake `codex app-server` and a runner doing arbitrary things to a
/// [`crate::dialect::codex::CodexClient`]: channel events pushed, time passing, requests answered (with
/// results, errors, the steer-race texts), status and turn notifications, server requests,
/// answers to ids never used, garbage lines, application requests, shutdown at any point — every
/// codex line split at an arbitrary byte. Then codex goes idle and answers everything, the
/// client shuts down, and codex answers the deliveries still open and only some of the rest.
///
/// Oracles: `initialize` first, `thread/start` only after it succeeded and as the docs give it;
/// `Ready` once with the thread's id, or `Failed` once, only when start-up is answered; status,
/// thread and active turn as the notifications say; a bundle goes to the thread as `turn/start`
/// only when idle or failed and as `turn/steer` only with the active turn's id, one delivery in
/// flight; every server request answered exactly once at once (approvals denied, the rest
/// `-32601`); every application request answered exactly once with what codex said (an error at
/// shutdown); an answer to an unknown id does nothing; notify never sends by itself; events are
/// dropped only on a rejection or at shutdown; in the end every event was delivered once, in
/// push order, or dropped, and each dropped one with a sender produced one notice to that sender;
/// nothing is written after `CloseStdin`; `poll_output` terminates.
pub fn codex_ops(data: &[u8]) {
    use crate::dialect::codex::{CodexClient, CodexConfig, DENIED_REQUESTS, ThreadStatus};
    use serde_json::json;
    let mut input = Input::new(data);
    let mut now = Instant::now();
    let model = input.byte().is_multiple_of(2).then(|| "m".to_owned());
    let mut client = CodexClient::new(
        CodexConfig {
            client_name: "ac7".into(),
            client_version: "0".into(),
            cwd: "/w".into(),
            developer_instructions: "brief".into(),
            model: model.clone(),
            bundle_window: crate::dialect::codex::BUNDLE_WINDOW,
        },
        now,
    );
    let mut o = CxOracle {
        phase: CxPhase::Initializing,
        model,
        thread: None,
        status: ThreadStatus::NotLoaded,
        turn: None,
        open: BTreeMap::new(),
        ids: BTreeSet::new(),
        pushed: Vec::new(),
        delivered: Vec::new(),
        dropped: 0,
        undelivered: BTreeSet::new(),
        app: BTreeMap::new(),
        server: BTreeMap::new(),
        ready: 0,
        failed: 0,
        closed_stdin: false,
        may_drop: false,
        may_start: false,
    };
    o.drain(&mut client);
    // Feeds one codex line, split at an arbitrary byte.
    let feed = |client: &mut CodexClient, o: &mut CxOracle, line: String, split: usize, now| {
        let line = format!("{line}\n");
        let split = split.min(line.len());
        client.handle_bytes(&line.as_bytes()[..split], now);
        o.drain(client);
        client.handle_bytes(&line.as_bytes()[split..], now);
    };
    let mut steps = 0u64;
    while !input.is_empty() && steps < 2_000 {
        steps += 1;
        o.may_drop = matches!(o.phase, CxPhase::Closed | CxPhase::Failed);
        o.may_start = false;
        let split = input.below(96);
        match input.byte() % 12 {
            0 | 1 => {
                let n = o.pushed.len() as u32;
                let reply_to = match input.byte() % 3 {
                    0 => None,
                    1 => Some(("alice".to_owned(), format!("m{n}"))),
                    _ => Some(("bob".to_owned(), format!("m{n}"))),
                };
                o.pushed.push(reply_to.clone());
                client.notify(
                    crate::dialect::codex::SinkEvent {
                        text: format!("e{n}"),
                        reply_to,
                    },
                    now,
                );
                let before = o.ids.len();
                o.drain(&mut client);
                assert_eq!(o.ids.len(), before, "notify sent something by itself");
            }
            2 | 3 => {
                now += Duration::from_millis(u64::from(input.byte()) * 4);
                if client.poll_timeout().is_some_and(|at| at <= now) {
                    client.handle_timeout(now);
                }
                assert!(
                    client.poll_timeout().is_none_or(|at| at > now),
                    "a timer in the past"
                );
            }
            4 | 5 if !o.open.is_empty() => {
                let ids: Vec<u64> = o.open.keys().copied().collect();
                let id = ids[input.below(ids.len())];
                let how = input.byte();
                let message = match how % 8 {
                    0 => "no active turn",
                    1 => "expected active turn t9 but found t8",
                    2 => "turn is not steerable",
                    3 => "boom",
                    _ => "",
                };
                let status = CX_STATUSES[input.below(CX_STATUSES.len())];
                let line = o.answer(id, message.is_empty(), message, status, steps);
                feed(&mut client, &mut o, line, split, now);
            }
            6 => {
                let k = input.byte();
                let status = CX_STATUSES[input.below(CX_STATUSES.len())];
                let line = match input.byte() % 6 {
                    0 | 1 => {
                        if let Some(s) = CxOracle::status_of(&json!({"type": status})) {
                            o.status = s;
                        }
                        json!({"jsonrpc":"2.0","method":"thread/status/changed","params":{"threadId":"x","status":{"type":status}}})
                    }
                    2 => {
                        if o.phase == CxPhase::Running {
                            o.turn = Some(format!("t{k}"));
                        }
                        json!({"jsonrpc":"2.0","method":"turn/started","params":{"turn":{"id":format!("t{k}")}}})
                    }
                    3 => {
                        if o.phase == CxPhase::Running {
                            o.turn = None;
                        }
                        json!({"jsonrpc":"2.0","method":"turn/completed","params":{"turn":{"id":format!("t{k}")}}})
                    }
                    4 => {
                        if o.phase == CxPhase::Running {
                            o.thread = Some(format!("tt{k}"));
                        }
                        if let Some(s) = CxOracle::status_of(&json!({"type": status})) {
                            o.status = s;
                        }
                        json!({"jsonrpc":"2.0","method":"thread/started","params":{"thread":{"id":format!("tt{k}"),"status":{"type":status}}}})
                    }
                    _ => {
                        json!({"jsonrpc":"2.0","method":"error","params":{"error":{"message":"e"}}})
                    }
                };
                feed(&mut client, &mut o, line.to_string(), split, now);
            }
            7 => {
                let methods = [
                    DENIED_REQUESTS[input.below(DENIED_REQUESTS.len())],
                    "other/thing",
                ];
                let method = methods[input.below(2)];
                let key = if input.byte().is_multiple_of(2) {
                    format!("{}", 9000 + steps)
                } else {
                    format!("\"q{steps}\"")
                };
                o.server
                    .insert(key.clone(), (DENIED_REQUESTS.contains(&method), 0));
                let line = format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{key},\"method\":\"{method}\",\"params\":{{}}}}"
                );
                feed(&mut client, &mut o, line, split, now);
            }
            8 => {
                // An answer to an id the client is not waiting for.
                let id = match input.byte() % 4 {
                    0 => format!("{}", 100_000 + steps),
                    1 => "\"1\"".to_owned(),
                    2 => "1.5".to_owned(),
                    _ => o
                        .ids
                        .iter()
                        .find(|i| !o.open.contains_key(i))
                        .map_or("null".into(), u64::to_string),
                };
                let line = format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"thread\":{{\"id\":\"bad\"}}}}}}"
                );
                feed(&mut client, &mut o, line, split, now);
            }
            9 => {
                let mut garbage = input.garbage_line(60);
                garbage.push(b'\n');
                client.handle_bytes(&garbage, now);
            }
            10 => {
                let id = client.request("x/app", &json!({"n": steps}), now);
                o.app.insert(id, (None, 0));
            }
            11 if input.byte().is_multiple_of(4) => {
                o.may_drop = true;
                client.shutdown(now);
                o.drain(&mut client);
                o.phase = CxPhase::Closed;
                assert!(o.closed_stdin, "shutdown closes stdin");
            }
            _ => {}
        }
        o.drain(&mut client);
        o.check(&client);
    }
    // Codex settles: start-up succeeds, the thread goes idle, everything is answered.
    o.may_drop = matches!(o.phase, CxPhase::Closed | CxPhase::Failed);
    for round in 0..4096 {
        o.may_start = true;
        if o.phase == CxPhase::Running && o.status != ThreadStatus::Idle {
            o.status = ThreadStatus::Idle;
            let line = json!({"jsonrpc":"2.0","method":"thread/status/changed","params":{"status":{"type":"idle"}}});
            feed(&mut client, &mut o, line.to_string(), 0, now);
            // Going idle flushes what waits: the delivery must be seen before the loop looks
            // for open calls.
            o.drain(&mut client);
        }
        if let Some(at) = client.poll_timeout() {
            now = now.max(at);
            client.handle_timeout(now);
            o.drain(&mut client);
        }
        let Some(id) = o.open.keys().next().copied() else {
            break;
        };
        let line = o.answer(id, true, "", "idle", 10_000 + round);
        feed(&mut client, &mut o, line, 0, now);
        o.drain(&mut client);
        o.check(&client);
    }
    if matches!(o.phase, CxPhase::Running) {
        assert_eq!(client.buffered(), 0, "events wait although codex is idle");
        assert!(
            o.open.values().all(|s| s.events.is_empty()),
            "a delivery never ends"
        );
    }
    // The runner leaves.
    o.may_drop = true;
    client.shutdown(now);
    o.drain(&mut client);
    o.phase = CxPhase::Closed;
    assert!(o.closed_stdin, "shutdown closes stdin");
    // The runner stops reading codex after shutdown: codex answers the deliveries (taken, or
    // lost to the steer race) and only some of the rest; nobody may wait for the others.
    let ids: Vec<u64> = o.open.keys().copied().collect();
    for (i, id) in ids.into_iter().enumerate() {
        if o.open[&id].events.is_empty() && i % 2 == 0 {
            continue;
        }
        let line = o.answer(id, i % 3 != 1, "no active turn", "idle", 20_000);
        feed(&mut client, &mut o, line, 0, now);
    }
    let late = client.request("x/app", &json!({}), now);
    o.app.insert(late, (None, 0));
    o.drain(&mut client);
    assert_eq!(client.buffered(), 0, "events left behind after shutdown");
    for (id, (_, count)) in &o.app {
        assert_eq!(*count, 1, "application request {id} answered {count} times");
    }
    let mut seen = o.delivered.clone();
    seen.dedup();
    assert_eq!(
        seen.len(),
        o.delivered.len(),
        "an event was delivered twice"
    );
    assert_eq!(
        o.delivered.len() + o.dropped,
        o.pushed.len(),
        "an event was lost without a report (or reported and delivered)"
    );
    for (n, reply_to) in o.pushed.iter().enumerate() {
        let n = n as u32;
        let delivered = o.delivered.binary_search(&n).is_ok();
        assert_eq!(
            o.undelivered.contains(&n),
            !delivered && reply_to.is_some(),
            "event {n}: delivered {delivered}, yet its sender's notice disagrees"
        );
    }
}
