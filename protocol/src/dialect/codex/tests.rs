use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::test_support::{proptest_config, snapshots};

fn config() -> CodexConfig {
    CodexConfig {
        client_name: "ac7".into(),
        client_version: "1.2.3".into(),
        cwd: "/work".into(),
        developer_instructions: "You are builder on team demo.".into(),
        model: Some("gpt-5".into()),
        bundle_window: BUNDLE_WINDOW,
    }
}

/// A scripted codex on the other end of the pipe.
struct Codex {
    client: CodexClient,
    now: Instant,
    transcript: String,
    /// Requests the client sent and codex has not answered: (id, method, params).
    requests: Vec<(u64, String, Value)>,
    closed: bool,
}

impl Codex {
    fn start() -> Self {
        Self::start_with(config())
    }

    fn start_with(config: CodexConfig) -> Self {
        let now = Instant::now();
        let mut codex = Self {
            client: CodexClient::new(config, now),
            now,
            transcript: String::new(),
            requests: Vec::new(),
            closed: false,
        };
        codex.drain();
        codex
    }

    fn drain(&mut self) -> Vec<CodexOutput> {
        let out: Vec<_> = std::iter::from_fn(|| self.client.poll_output()).collect();
        for o in &out {
            match o {
                CodexOutput::Transmit(line) => {
                    self.transcript
                        .push_str(&format!("  to codex < {}", String::from_utf8_lossy(line)));
                    let v: Value = serde_json::from_slice(line).unwrap();
                    if let (Some(id), Some(method)) = (v["id"].as_u64(), v["method"].as_str()) {
                        self.requests
                            .push((id, method.to_owned(), v["params"].clone()));
                    }
                }
                CodexOutput::CloseStdin => {
                    self.closed = true;
                    self.transcript.push_str("  close stdin\n");
                }
                other => self.transcript.push_str(&format!("  {other:?}\n")),
            }
        }
        out
    }

    fn codex_says(&mut self, line: Value) -> Vec<CodexOutput> {
        self.transcript.push_str(&format!("codex > {line}\n"));
        self.client
            .handle_bytes(format!("{line}\n").as_bytes(), self.now);
        self.drain()
    }

    /// Answers the oldest open request for `method` with `result` or an error message.
    fn answer(&mut self, method: &str, result: Result<Value, &str>) -> Vec<CodexOutput> {
        let at = self
            .requests
            .iter()
            .position(|(_, m, _)| m == method)
            .expect("no such request");
        let (id, _, _) = self.requests.remove(at);
        let line = match result {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err(message) => {
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32600, "message": message}})
            }
        };
        self.codex_says(line)
    }

    fn advance(&mut self, ms: u64) -> Vec<CodexOutput> {
        self.now += Duration::from_millis(ms);
        self.transcript.push_str(&format!("(+{ms} ms)\n"));
        self.client.handle_timeout(self.now);
        self.drain()
    }

    fn push(&mut self, text: &str) {
        self.transcript.push_str(&format!("event: {text}\n"));
        self.client.notify(text.to_owned(), self.now);
    }

    fn status(&mut self, status: &str) -> Vec<CodexOutput> {
        self.codex_says(json!({"jsonrpc": "2.0", "method": "thread/status/changed", "params": {"threadId": "th-1", "status": {"type": status}}}))
    }

    fn ready(&mut self, status: &str) {
        self.answer("initialize", Ok(json!({"userAgent": "codex"})));
        self.answer(
            "thread/start",
            Ok(json!({"thread": {"id": "th-1", "status": {"type": status}}})),
        );
    }
}

#[test]
fn start_up_then_bundled_turns_and_steering() {
    let mut c = Codex::start();
    assert_eq!(c.requests[0].1, "initialize");
    assert_eq!(
        c.requests[0].2,
        json!({"clientInfo": {"name": "ac7", "version": "1.2.3"}})
    );
    // Events before the thread exists wait, in order.
    c.push("<channel from=\"alice\">\nfirst\n</channel>");
    c.advance(250);
    assert!(c.requests.iter().all(|(_, m, _)| m == "initialize"));
    c.answer("initialize", Ok(json!({})));
    assert_eq!(
        c.requests[0].2,
        json!({"cwd": "/work", "approvalPolicy": "never", "sandbox": "danger-full-access", "developerInstructions": "You are builder on team demo.", "model": "gpt-5"})
    );
    c.push("<channel from=\"bob\">\nsecond\n</channel>");
    let out = c.answer(
        "thread/start",
        Ok(json!({"thread": {"id": "th-1", "status": {"type": "idle"}}})),
    );
    assert_eq!(
        out[0],
        CodexOutput::Ready {
            thread_id: "th-1".into()
        }
    );
    let (_, method, params) = c.requests.last().unwrap().clone();
    assert_eq!(method, "turn/start");
    assert_eq!(
        params,
        json!({"threadId": "th-1", "input": [{"type": "text", "text": "<channel from=\"alice\">\nfirst\n</channel>\n<channel from=\"bob\">\nsecond\n</channel>"}]})
    );
    c.answer("turn/start", Ok(json!({"turn": {"id": "turn-1"}})));
    c.codex_says(json!({"jsonrpc": "2.0", "method": "turn/started", "params": {"threadId": "th-1", "turn": {"id": "turn-1"}}}));
    c.status("active");

    // While active: bundle within 200 ms, then steer the running turn.
    c.push("third");
    c.advance(100);
    c.push("fourth");
    assert!(
        c.requests.is_empty(),
        "the window is fixed from the first event"
    );
    c.advance(100);
    let (_, method, params) = c.requests.last().unwrap().clone();
    assert_eq!(method, "turn/steer");
    assert_eq!(params["expectedTurnId"], "turn-1");
    assert_eq!(params["input"][0]["text"], "third\nfourth");
    c.answer("turn/steer", Ok(json!({})));

    // A steer that races the end of its turn goes again when that turn is over: as turn/start
    // when idle.
    c.push("fifth");
    c.advance(200);
    c.codex_says(json!({"jsonrpc": "2.0", "method": "turn/completed", "params": {"threadId": "th-1", "turn": {"id": "turn-1"}}}));
    c.status("idle");
    assert!(
        c.requests.iter().all(|(_, m, _)| m == "turn/steer"),
        "one delivery at a time"
    );
    c.answer(
        "turn/steer",
        Err("expected active turn turn-1 but thread is idle"),
    );
    let (_, method, params) = c.requests.last().unwrap().clone();
    assert_eq!(method, "turn/start");
    assert_eq!(params["input"][0]["text"], "fifth");
    c.answer("turn/start", Ok(json!({})));

    // Approvals are denied; other server requests are unknown.
    let out = c.codex_says(json!({"jsonrpc": "2.0", "id": 77, "method": "item/commandExecution/requestApproval", "params": {}}));
    let CodexOutput::Transmit(line) = &out[0] else {
        panic!()
    };
    assert_eq!(
        serde_json::from_slice::<Value>(line).unwrap(),
        json!({"jsonrpc": "2.0", "id": 77, "result": {"decision": "deny", "action": "cancel"}})
    );
    let out =
        c.codex_says(json!({"jsonrpc": "2.0", "id": "x", "method": "account/login", "params": {}}));
    let CodexOutput::Transmit(line) = &out[0] else {
        panic!()
    };
    assert_eq!(
        serde_json::from_slice::<Value>(line).unwrap()["error"]["code"],
        -32601
    );

    // Shutdown interrupts the active turn and closes stdin.
    c.codex_says(json!({"jsonrpc": "2.0", "method": "turn/started", "params": {"threadId": "th-1", "turn": {"id": "turn-2"}}}));
    c.client.shutdown(c.now);
    c.drain();
    let (_, method, params) = c.requests.last().unwrap().clone();
    assert_eq!(
        (method.as_str(), params),
        (
            "turn/interrupt",
            json!({"threadId": "th-1", "turnId": "turn-2"})
        )
    );
    assert!(c.closed);
    snapshots(|| insta::assert_snapshot!("codex_session_transcript", c.transcript));
}

#[test]
fn start_up_failures() {
    let mut c = Codex::start();
    let out = c.answer("initialize", Err("unsupported client"));
    assert_eq!(
        out,
        vec![CodexOutput::Failed(
            "codex initialize failed: unsupported client".into()
        )]
    );

    let mut c = Codex::start();
    c.answer("initialize", Ok(json!({})));
    let out = c.answer("thread/start", Ok(json!({})));
    assert_eq!(
        out,
        vec![CodexOutput::Failed(
            "codex thread/start failed: no thread id".into()
        )]
    );
}

#[test]
fn after_a_failed_turn_system_error_is_routed_like_idle() {
    // What codex 0.169 reports when a turn fails (the model endpoint answered 500): the turn
    // completes, the thread goes systemError, and a new turn/start is accepted.
    let mut c = Codex::start();
    c.ready("idle");
    c.push("first");
    c.advance(200);
    c.answer("turn/start", Ok(json!({"turn": {"id": "t1"}})));
    c.codex_says(json!({"jsonrpc": "2.0", "method": "turn/started", "params": {"threadId": "th-1", "turn": {"id": "t1"}}}));
    c.status("active");
    c.codex_says(json!({"jsonrpc": "2.0", "method": "error", "params": {"error": {"message": "stream error: 500"}, "willRetry": false}}));
    c.status("systemError");
    c.codex_says(json!({"jsonrpc": "2.0", "method": "turn/completed", "params": {"threadId": "th-1", "turn": {"id": "t1", "status": "failed"}}}));
    assert_eq!(c.client.status(), ThreadStatus::SystemError);
    c.push("second");
    let out = c.advance(200);
    assert!(
        !out.iter()
            .any(|o| matches!(o, CodexOutput::Event(CodexEvent::Dropped { .. }))),
        "{out:?}"
    );
    let (_, method, params) = c.requests.last().unwrap().clone();
    assert_eq!(method, "turn/start");
    assert_eq!(
        params,
        json!({"threadId": "th-1", "input": [{"type": "text", "text": "second"}]})
    );
}

fn broker_message(id: &str, from: Option<&str>, data: Value) -> crate::domain::message::Message {
    crate::domain::message::Message {
        id: id.into(),
        ts: 1_795_314_350_478,
        to: Some("builder".into()),
        from: from.map(str::to_owned),
        title: None,
        body: format!("body of {id}"),
        level: crate::domain::message::LogLevel::Info,
        data: data.as_object().unwrap().clone(),
        attachments: vec![],
    }
}

#[test]
fn a_rejected_turn_tells_each_sender_once_and_never_the_member_itself() {
    let mut c = Codex::start();
    c.ready("idle");
    let events = [
        broker_message("m1", Some("alice"), json!({})),
        broker_message("m2", Some("bob"), json!({})),
        broker_message("m3", Some("alice"), json!({})),
        // Not told: the member's own objective event, a system notice, a notice itself.
        broker_message("m4", Some("builder"), json!({"kind": "objective"})),
        broker_message("m5", Some("ac7"), json!({})),
        broker_message("m6", Some("carol"), json!({UNDELIVERED_KEY: "x1"})),
        broker_message("m7", None, json!({})),
    ];
    for m in &events {
        let event = SinkEvent::from_message(m, "builder");
        assert_eq!(event.text, crate::domain::channel::codex_text(m));
        c.client.notify(event, c.now);
    }
    c.advance(200);
    // Codex refuses the bundle, and then every part of it: each event is dropped alone, and
    // each sender is told once, when the last part is settled.
    let mut out = Vec::new();
    let mut requests = 0;
    while c.requests.iter().any(|(_, m, _)| m == "turn/start") {
        requests += 1;
        let answered = c.answer("turn/start", Err("thread th-1 is closed"));
        out.extend(answered.into_iter().filter(|o| {
            !matches!(
                o,
                CodexOutput::Transmit(_) | CodexOutput::Event(CodexEvent::Delivering { .. })
            )
        }));
    }
    assert_eq!(requests, 13, "halving 7 events down to single ones");
    let (dropped, out): (Vec<_>, Vec<_>) = out
        .into_iter()
        .partition(|o| matches!(o, CodexOutput::Event(CodexEvent::Dropped { .. })));
    assert_eq!(
        dropped,
        vec![
            CodexOutput::Event(CodexEvent::Dropped {
                events: 1,
                reason: "thread th-1 is closed".into()
            });
            7
        ]
    );
    assert_eq!(
        out,
        vec![
            CodexOutput::Undelivered(Undelivered {
                to: "alice".into(),
                msg_ids: vec!["m1".into(), "m3".into()],
                reason: "thread th-1 is closed".into(),
                kind: NoticeKind::Refused,
            }),
            CodexOutput::Undelivered(Undelivered {
                to: "bob".into(),
                msg_ids: vec!["m2".into()],
                reason: "thread th-1 is closed".into(),
                kind: NoticeKind::Refused,
            }),
        ]
    );
    let CodexOutput::Undelivered(alice) = &out[0] else {
        panic!()
    };
    let body = alice.push_body("builder");
    assert_eq!(body["to"], "alice");
    assert_eq!(body["level"], "warning");
    assert_eq!(body["data"][UNDELIVERED_KEY], "m1, m3");
    assert_eq!(
        body["body"],
        "your messages m1, m3 were not delivered to builder: codex did not take them (thread th-1 is closed). Send them again later, or reach builder another way."
    );
    // The notice, pushed back to a codex member, would never cause a notice of its own.
    let mut notice = broker_message("n1", Some("builder"), json!({}));
    notice.data = body["data"].as_object().unwrap().clone();
    assert_eq!(SinkEvent::from_message(&notice, "alice").reply_to, None);

    // Events still waiting at shutdown are reported the same way.
    let mut c = Codex::start();
    c.client
        .notify(SinkEvent::from_message(&events[1], "builder"), c.now);
    c.client.shutdown(c.now);
    let out = c.drain();
    assert!(out.contains(&CodexOutput::Undelivered(Undelivered {
        to: "bob".into(),
        msg_ids: vec!["m2".into()],
        reason: "the session ended before codex could take it".into(),
        kind: NoticeKind::Refused,
    })));
}

fn from(sender: &str, id: &str, text: &str) -> SinkEvent {
    SinkEvent {
        text: text.into(),
        reply_to: Some((sender.into(), id.into())),
    }
}

fn dropped(out: &[CodexOutput]) -> usize {
    out.iter()
        .map(|o| match o {
            CodexOutput::Event(CodexEvent::Dropped { events, .. }) => *events,
            _ => 0,
        })
        .sum()
}

fn notices(out: &[CodexOutput]) -> Vec<Undelivered> {
    out.iter()
        .filter_map(|o| match o {
            CodexOutput::Undelivered(u) => Some(u.clone()),
            _ => None,
        })
        .collect()
}

fn turn_started(c: &mut Codex, turn: &str) -> Vec<CodexOutput> {
    c.codex_says(json!({"jsonrpc": "2.0", "method": "turn/started", "params": {"threadId": "th-1", "turn": {"id": turn}}}))
}

fn turn_completed(c: &mut Codex, turn: Value) -> Vec<CodexOutput> {
    c.codex_says(json!({"jsonrpc": "2.0", "method": "turn/completed", "params": {"threadId": "th-1", "turn": turn}}))
}

/// Codex ended the turn just before our steer reached it, and says so before `turn/completed`
/// reaches us: the steer is not sent again into that turn (it would fail the same way) and is
/// never dropped; it waits for the turn's end and starts the next turn, with what came meanwhile.
#[test]
fn a_steer_that_loses_the_race_waits_for_the_end_of_the_turn_and_starts_a_new_one() {
    let mut c = Codex::start();
    c.ready("active");
    turn_started(&mut c, "t1");
    c.client.notify(from("alice", "m1", "first"), c.now);
    c.advance(200);
    assert_eq!(c.requests.last().unwrap().1, "turn/steer");
    let out = c.answer("turn/steer", Err("no active turn to steer"));
    assert_eq!(dropped(&out), 0, "{out:?}");
    assert!(
        c.requests.is_empty(),
        "steered the ended turn again: {out:?}"
    );
    // The window passing, or more events, do not steer it either.
    c.client.notify(from("bob", "m2", "second"), c.now);
    let out = c.advance(200);
    assert!(c.requests.is_empty(), "{out:?}");
    assert_eq!(c.client.buffered(), 2);
    // Its end: still `active` until the status says otherwise, then a new turn with both.
    turn_completed(&mut c, json!({"id": "t1", "status": "completed"}));
    assert!(c.requests.is_empty());
    c.status("idle");
    let (_, method, params) = c.requests.last().unwrap().clone();
    assert_eq!(method, "turn/start");
    assert_eq!(params["input"][0]["text"], "first\nsecond");
    let out = c.answer("turn/start", Ok(json!({"turn": {"id": "t2"}})));
    assert!(notices(&out).is_empty());

    // A next turn that starts before the lost one's end reaches us is steered.
    turn_started(&mut c, "t2");
    c.status("active");
    c.client.notify(from("alice", "m3", "third"), c.now);
    c.advance(200);
    c.answer("turn/steer", Err("expected active turn t2 but found t3"));
    assert!(c.requests.is_empty());
    turn_started(&mut c, "t3");
    let (_, method, params) = c.requests.last().unwrap().clone();
    assert_eq!(method, "turn/steer");
    assert_eq!(params["expectedTurnId"], "t3");
    assert_eq!(params["input"][0]["text"], "third");
    let out = c.answer("turn/steer", Ok(json!({"turnId": "t3"})));
    assert_eq!(dropped(&out), 0);
    assert_eq!(c.client.buffered(), 0);
}

/// A bundle codex refuses is halved until each refused part is one event: the others are
/// delivered, in order, before anything newer, and only the refused event's sender is told.
#[test]
fn a_refused_bundle_is_split_and_only_the_refused_event_is_reported() {
    let mut c = Codex::start();
    c.ready("idle");
    let events = [
        from("alice", "m1", "short one"),
        from("bob", "m2", "HUGE"),
        from("alice", "m3", "short two"),
        from("carol", "m4", "short three"),
        from("bob", "m5", "short four"),
    ];
    for event in events {
        c.client.notify(event, c.now);
    }
    c.advance(200);
    let mut delivered = Vec::new();
    let mut out = Vec::new();
    let mut turn = 0;
    let mut newer = false;
    while let Some(at) = c.requests.iter().position(|(_, m, _)| m == "turn/start") {
        let text = c.requests[at].2["input"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        if text.contains("HUGE") {
            out.extend(c.answer(
                "turn/start",
                Err("Input exceeds the maximum length of 1048576 characters."),
            ));
        } else {
            turn += 1;
            delivered.push(text);
            out.extend(c.answer(
                "turn/start",
                Ok(json!({"turn": {"id": format!("t{turn}")}})),
            ));
            turn_completed(
                &mut c,
                json!({"id": format!("t{turn}"), "status": "completed"}),
            );
        }
        if turn == 1 && !newer {
            // Newer events wait behind the parts of the refused bundle.
            c.client.notify(from("carol", "m6", "newer"), c.now);
            newer = true;
        }
        out.extend(c.advance(200));
    }
    assert_eq!(
        delivered.join("\n"),
        "short one\nshort two\nshort three\nshort four\nnewer"
    );
    assert_eq!(dropped(&out), 1);
    assert_eq!(
        notices(&out),
        vec![Undelivered {
            to: "bob".into(),
            msg_ids: vec!["m2".into()],
            reason: "Input exceeds the maximum length of 1048576 characters.".into(),
            kind: NoticeKind::Refused,
        }]
    );
    assert_eq!(c.client.buffered(), 0);
}

/// A turn that codex reports failed: its reason is reported with the messages it carried (those
/// it started with and those steered into it), each of their senders is told once, the member
/// itself and system notices never; a turn that completes is not; the next event starts a turn.
#[test]
fn a_failed_turn_is_reported_to_each_sender_it_carried() {
    let mut c = Codex::start();
    c.ready("idle");
    c.client.notify(from("alice", "m1", "one"), c.now);
    c.client.notify(
        SinkEvent::from_message(&broker_message("m2", Some("builder"), json!({})), "builder"),
        c.now,
    );
    c.advance(200);
    c.answer(
        "turn/start",
        Ok(json!({"turn": {"id": "t1", "status": "inProgress"}})),
    );
    turn_started(&mut c, "t1");
    c.status("active");
    c.client.notify(from("bob", "m3", "two"), c.now);
    c.client.notify(from("alice", "m4", "three"), c.now);
    c.advance(200);
    c.answer("turn/steer", Ok(json!({"turnId": "t1"})));
    c.codex_says(json!({"jsonrpc": "2.0", "method": "error", "params": {"threadId": "th-1", "turnId": "t1", "error": {"message": "stream disconnected: retrying"}, "willRetry": true}}));
    c.codex_says(json!({"jsonrpc": "2.0", "method": "error", "params": {"threadId": "th-1", "turnId": "t1", "error": {"message": "unexpected status 500 Internal Server Error"}, "willRetry": false}}));
    c.status("systemError");
    let out = turn_completed(&mut c, json!({"id": "t1", "status": "failed"}));
    let reason = "unexpected status 500 Internal Server Error";
    assert_eq!(
        out,
        vec![
            CodexOutput::TurnFailed(TurnFailure {
                turn_id: "t1".into(),
                reason: reason.into(),
                msg_ids: vec!["m1".into(), "m3".into(), "m4".into()],
            }),
            CodexOutput::Undelivered(Undelivered {
                to: "alice".into(),
                msg_ids: vec!["m1".into(), "m4".into()],
                reason: reason.into(),
                kind: NoticeKind::TurnFailed,
            }),
            CodexOutput::Undelivered(Undelivered {
                to: "bob".into(),
                msg_ids: vec!["m3".into()],
                reason: reason.into(),
                kind: NoticeKind::TurnFailed,
            }),
        ]
    );
    let body = notices(&out)[1].push_body("builder");
    assert_eq!(body["title"], "turn failed");
    assert_eq!(body["level"], "warning");
    assert_eq!(body["data"][UNDELIVERED_KEY], "m3");
    assert_eq!(
        body["body"],
        "your message m3 reached builder, but the codex turn carrying it failed (unexpected status 500 Internal Server Error), so builder may not have acted on it. Send it again later, or reach builder another way."
    );

    // Not deaf: the next event starts a turn; the turn's own error wins over the notification's;
    // a failure reported before the answer to turn/start is reported when the answer comes.
    c.client.notify(from("carol", "m5", "four"), c.now);
    c.advance(200);
    assert_eq!(c.requests.last().unwrap().1, "turn/start");
    let out = turn_completed(
        &mut c,
        json!({"id": "t2", "status": "failed", "error": {"message": "timeout waiting for the model"}}),
    );
    assert_eq!(notices(&out), vec![]);
    let out = c.answer("turn/start", Ok(json!({"turn": {"id": "t2"}})));
    assert_eq!(
        notices(&out),
        vec![Undelivered {
            to: "carol".into(),
            msg_ids: vec!["m5".into()],
            reason: "timeout waiting for the model".into(),
            kind: NoticeKind::TurnFailed,
        }]
    );

    // A turn that completes tells nobody.
    c.status("idle");
    c.client.notify(from("dave", "m6", "five"), c.now);
    c.advance(200);
    c.answer("turn/start", Ok(json!({"turn": {"id": "t3"}})));
    let out = turn_completed(&mut c, json!({"id": "t3", "status": "completed"}));
    assert!(
        !out.iter()
            .any(|o| matches!(o, CodexOutput::TurnFailed(_) | CodexOutput::Undelivered(_))),
        "{out:?}"
    );
}

#[test]
fn active_without_a_known_turn_waits_for_turn_started() {
    let mut c = Codex::start();
    c.ready("active");
    c.push("hold");
    c.advance(200);
    assert!(c.requests.is_empty());
    c.codex_says(json!({"jsonrpc": "2.0", "method": "turn/started", "params": {"threadId": "th-1", "turn": {"id": "t9"}}}));
    let (_, method, params) = c.requests.last().unwrap().clone();
    assert_eq!(method, "turn/steer");
    assert_eq!(params["expectedTurnId"], "t9");
}

#[derive(Debug, Clone)]
enum Op {
    Push,
    Advance(u64),
    Status(&'static str),
    TurnStarted,
    TurnCompleted,
    AnswerOk,
    AnswerRace,
}

proptest! {
    #![proptest_config(proptest_config("codex_sink"))]

    /// Every event is delivered at most once and in push order, and any event not delivered was
    /// reported as dropped: nothing is sent twice or lost silently across idle/active flips.
    #[test]
    fn events_are_delivered_once_in_order(ops in proptest::collection::vec(prop_oneof![
        4 => Just(Op::Push),
        3 => (0u64..300).prop_map(Op::Advance),
        2 => prop_oneof![Just("idle"), Just("active"), Just("notLoaded"), Just("systemError")].prop_map(Op::Status),
        1 => Just(Op::TurnStarted),
        1 => Just(Op::TurnCompleted),
        3 => Just(Op::AnswerOk),
        2 => Just(Op::AnswerRace),
    ], 0..80)) {
        let mut c = Codex::start();
        c.ready("idle");
        let mut pushed = 0u32;
        let mut turn = 0u32;
        let mut delivered: Vec<String> = Vec::new();
        let mut dropped = 0usize;
        let count = |out: &[CodexOutput], dropped: &mut usize| {
            for o in out {
                if let CodexOutput::Event(CodexEvent::Dropped { events, .. }) = o {
                    *dropped += events;
                }
            }
        };
        for op in ops {
            let out = match op {
                Op::Push => { c.push(&format!("e{pushed}")); pushed += 1; Vec::new() }
                Op::Advance(ms) => c.advance(ms),
                Op::Status(s) => c.status(s),
                Op::TurnStarted => { turn += 1; c.codex_says(json!({"jsonrpc":"2.0","method":"turn/started","params":{"turn":{"id":format!("t{turn}")}}})) }
                Op::TurnCompleted => c.codex_says(json!({"jsonrpc":"2.0","method":"turn/completed","params":{}})),
                Op::AnswerOk | Op::AnswerRace => {
                    let Some(at) = c.requests.iter().position(|(_, m, _)| m.starts_with("turn/")) else { continue };
                    let (_, method, params) = c.requests[at].clone();
                    let race = matches!(op, Op::AnswerRace) && method == "turn/steer";
                    if !race && method != "turn/interrupt" {
                        delivered.extend(params["input"][0]["text"].as_str().unwrap().split('\n').map(str::to_owned));
                    }
                    c.answer(&method, if race { Err("no active turn") } else { Ok(json!({})) })
                }
            };
            count(&out, &mut dropped);
        }
        // Wind down: let codex go idle and answer everything until the buffer is empty.
        let out = c.status("idle");
        count(&out, &mut dropped);
        for _ in 0..200 {
            let out = c.advance(200);
            count(&out, &mut dropped);
            let Some(at) = c.requests.iter().position(|(_, m, _)| m.starts_with("turn/")) else { break };
            let (_, method, params) = c.requests[at].clone();
            delivered.extend(params["input"][0]["text"].as_str().unwrap().split('\n').map(str::to_owned));
            let out = c.answer(&method, Ok(json!({})));
            count(&out, &mut dropped);
        }
        prop_assert_eq!(c.client.buffered(), 0);
        let expected: Vec<String> = (0..pushed).map(|i| format!("e{i}")).collect();
        let mut seen = delivered.clone();
        seen.sort();
        seen.dedup();
        prop_assert_eq!(seen.len(), delivered.len(), "an event was delivered twice");
        let order: Vec<u32> = delivered.iter().map(|e| e[1..].parse().unwrap()).collect();
        prop_assert!(order.windows(2).all(|w| w[0] < w[1]), "out of order: {:?}", order);
        prop_assert_eq!(delivered.len() + dropped, expected.len(), "an event was lost without a report");
    }
}

#[test]
fn other_requests_are_answered_through_response() {
    let mut c = Codex::start();
    c.ready("idle");
    let id = c.client.request("mcpServerStatus/list", &json!({}), c.now);
    c.drain();
    let out = c.answer(
        "mcpServerStatus/list",
        Ok(json!({"data": [{"name": "ac7"}]})),
    );
    assert_eq!(
        out,
        vec![CodexOutput::Response {
            id,
            outcome: Ok(json!({"data": [{"name": "ac7"}]}))
        }]
    );
    let id = c
        .client
        .request("mcpServer/tool/call", &json!({"server": "ac7"}), c.now);
    c.drain();
    let out = c.answer("mcpServer/tool/call", Err("no such server"));
    assert_eq!(
        out,
        vec![CodexOutput::Response {
            id,
            outcome: Err(CodexRequestError::Codex {
                code: -32600,
                message: "no such server".into()
            })
        }]
    );
}

fn transmits(out: &[CodexOutput]) -> usize {
    out.iter()
        .filter(|o| matches!(o, CodexOutput::Transmit(_)))
        .count()
}

/// Found by the `codex` fuzz oracle: after `shutdown` (stdin closed, codex no longer read)
/// nothing is written to codex, and no application request is left waiting for an answer.
#[test]
fn after_shutdown_nothing_is_written_and_no_request_waits() {
    let mut c = Codex::start();
    c.ready("idle");
    let id = c.client.request("mcpServerStatus/list", &json!({}), c.now);
    c.drain();
    c.client.shutdown(c.now);
    let out = c.drain();
    assert!(c.closed);
    let ended = Err(CodexRequestError::SessionEnded);
    assert!(
        out.contains(&CodexOutput::Response {
            id,
            outcome: ended.clone()
        }),
        "the pending request is answered at shutdown: {out:?}"
    );
    let out = c.codex_says(json!({"jsonrpc": "2.0", "id": 7, "method": "item/fileChange/requestApproval", "params": {}}));
    assert_eq!(
        transmits(&out),
        0,
        "answered a server request after CloseStdin"
    );
    let late = c.client.request("mcpServerStatus/list", &json!({}), c.now);
    assert_eq!(
        c.drain(),
        vec![CodexOutput::Response {
            id: late,
            outcome: ended
        }]
    );
}

/// Found by the `codex` fuzz oracle: a start-up answer that arrives after `shutdown` does not
/// start the thread (no `thread/start`, no `Ready`).
#[test]
fn start_up_answered_after_shutdown_starts_nothing() {
    let mut c = Codex::start();
    c.client.shutdown(c.now);
    c.drain();
    let out = c.answer("initialize", Ok(json!({"userAgent": "codex"})));
    assert_eq!(out, vec![], "nothing happens after shutdown");
    assert_eq!(c.client.thread_id(), None);
}

/// Found by the `codex` fuzz oracle: a steer that loses the race with the end of its turn after
/// `shutdown` cannot be retried; its events are reported as dropped, not kept forever.
#[test]
fn a_steer_lost_after_shutdown_is_reported_not_kept() {
    let mut c = Codex::start();
    c.ready("active");
    c.codex_says(
        json!({"jsonrpc": "2.0", "method": "turn/started", "params": {"turn": {"id": "t1"}}}),
    );
    c.push("late news");
    c.advance(200);
    assert_eq!(c.requests.last().unwrap().1, "turn/steer");
    c.client.shutdown(c.now);
    c.drain();
    let out = c.answer("turn/steer", Err("no active turn"));
    assert!(
        out.iter()
            .any(|o| matches!(o, CodexOutput::Event(CodexEvent::Dropped { events: 1, .. }))),
        "{out:?}"
    );
    assert_eq!(transmits(&out), 0);
    assert_eq!(c.client.buffered(), 0, "an event kept after shutdown");
}

#[test]
fn the_bundle_window_is_the_configured_one() {
    let mut c = Codex::start_with(CodexConfig {
        bundle_window: Duration::from_millis(1500),
        ..config()
    });
    c.ready("idle");
    c.push("first");
    assert_eq!(
        c.client.poll_timeout(),
        Some(c.now + Duration::from_millis(1500))
    );
    c.advance(1000);
    c.push("second");
    c.advance(499);
    assert!(
        !c.requests.iter().any(|(_, m, _)| m == "turn/start"),
        "nothing before the window closes"
    );
    c.advance(1);
    let (_, method, params) = c.requests.last().unwrap().clone();
    assert_eq!(method, "turn/start");
    assert_eq!(params["input"][0]["text"], "first\nsecond");
}
