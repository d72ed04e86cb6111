//! Oracles for fuzzing: each function interprets arbitrary bytes as input to a protocol machine
//! and panics when the machine breaks one of its promises. The `fuzz/` targets call these; the
//! crate's own tests run them on random bytes too.
//!
//! Enabled with the `fuzzing` feature (always on in this crate's tests).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::ash::{
    self,
    bridge::{AshBridgeOutput, AshConnection},
    host::{AshHost, HostOutput},
};
use crate::bridge::{BridgeConfig, BridgeOutput, BridgeSession};
use crate::frame::{Decoded, DropReason, Dropped, FrameDecoder, decode_frame, encode_frame_vec};
use crate::json::RawJson;
use crate::jsonrpc::{self, Message, Outcome};
use crate::length_prefixed::{self, LpDecoder};
use crate::mcp;
use crate::runner::{BridgePolicy, ConnId, Origin, RunnerConfig, RunnerOutput, RunnerSession};

/// More polls than this after one input means `poll_output` does not terminate.
const MAX_POLLS: usize = 100_000;

/// Reads fuzzer bytes as a stream of small decisions; zeros once exhausted.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }

    fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            usize::from(self.byte()) % n
        }
    }

    /// Up to `max` raw bytes from the input.
    fn bytes(&mut self, max: usize) -> &'a [u8] {
        let len = self.below(max + 1);
        let start = self.pos.min(self.data.len());
        let end = (start + len).min(self.data.len());
        self.pos = end;
        &self.data[start..end]
    }
}

/// `decode`: arbitrary bytes in arbitrary chunks through a [`FrameDecoder`].
///
/// Oracles: the buffer never exceeds cap + chunk (and is under the cap once drained); the
/// outcomes equal decoding the stream line by line (so each complete line yields exactly one
/// outcome, blank lines none); every decoded frame re-encodes and decodes to the same value.
pub fn decode_chunks(data: &[u8]) {
    let mut input = Input::new(data);
    let cap = 8 + usize::from(input.byte()) * 4;
    let mut seed = u32::from(input.byte()) | 1;
    let stream = &data[input.pos.min(data.len())..];

    let mut decoder = FrameDecoder::new(cap);
    let mut got = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        // xorshift picks chunk sizes from 1 to 2 * cap.
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let len = (seed as usize % (2 * cap)).clamp(1, rest.len());
        let (chunk, tail) = rest.split_at(len);
        rest = tail;
        decoder.push(chunk);
        assert!(
            decoder.buffered_len() <= cap + chunk.len(),
            "buffer exceeds cap + chunk"
        );
        let mut polls = 0;
        while let Some(decoded) = decoder.next() {
            got.push(decoded);
            polls += 1;
            assert!(polls <= MAX_POLLS);
        }
        assert!(
            decoder.buffered_len() < cap,
            "drained buffer holds less than the cap"
        );
    }
    got.extend(decoder.finish());

    let mut expected = Vec::new();
    let mut lines: Vec<&[u8]> = stream.split(|b| *b == b'\n').collect();
    let tail = lines.pop().unwrap_or_default();
    for line in lines.into_iter().chain((!tail.is_empty()).then_some(tail)) {
        if line.len() + 1 > cap {
            expected.push(Decoded::Dropped(Dropped {
                len: line.len() + 1,
                reason: DropReason::Oversized,
            }));
            continue;
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        expected.push(match decode_frame(line) {
            Ok(frame) => Decoded::Frame(frame),
            Err(reason) => Decoded::Dropped(Dropped {
                len: line.len(),
                reason,
            }),
        });
    }
    // A final unterminated oversized line reports its length without a newline.
    if !tail.is_empty()
        && tail.len() + 1 > cap
        && let Some(Decoded::Dropped(d)) = expected.last_mut()
    {
        d.len = tail.len();
    }
    assert_eq!(
        got, expected,
        "chunked decoding differs from line-by-line decoding"
    );

    for decoded in &got {
        if let Decoded::Frame(frame) = decoded {
            let bytes = encode_frame_vec(frame, usize::MAX).expect("no cap");
            assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 1);
            let again = decode_frame(&bytes[..bytes.len() - 1]).expect("re-encoded frame decodes");
            assert_eq!(&again, frame, "re-encoded frame decodes to the same value");
        }
    }
}

/// `bridge_session`: an agent and a runner doing arbitrary things to a [`BridgeSession`].
///
/// Oracles: every request the agent sends is answered at most once, and exactly once unless it
/// cancelled it; `Exit` comes once and last; every frame to the runner fits the cap and is one
/// line; every line to the agent is valid JSON-RPC; no notification reaches the agent before it
/// sent `notifications/initialized` and got a `tools/list` answer; `poll_output` terminates.
pub fn bridge_ops(data: &[u8]) {
    let mut input = Input::new(data);
    let max_frame_bytes = 256 + usize::from(input.byte()) * 8;
    let mut session = BridgeSession::new(BridgeConfig {
        max_frame_bytes,
        max_agent_line_bytes: max_frame_bytes * 2,
        server_version: "fuzz".into(),
        max_held_notifications: 1 + usize::from(input.byte() % 8),
        ..BridgeConfig::default()
    });
    let mut ready = Readiness::default();
    let mut now = Instant::now();
    let mut next_agent_id = 0u64;
    let mut sent: BTreeSet<String> = BTreeSet::new();
    let mut cancelled: BTreeSet<String> = BTreeSet::new();
    let mut answered: BTreeMap<String, usize> = BTreeMap::new();
    let mut forwarded: Vec<u64> = Vec::new();
    let mut exited = false;
    const METHODS: [&str; 5] = [
        "tools/list",
        "tools/call",
        "initialize",
        "ping",
        "resources/list",
    ];

    while !input.is_empty() && !exited {
        now += Duration::from_micros(u64::from(input.byte()));
        match input.byte() % 10 {
            0..=2 => {
                let id = next_agent_id;
                next_agent_id += 1;
                let method = METHODS[input.below(METHODS.len())];
                let pad = "p".repeat(input.below(4) * max_frame_bytes / 2);
                let (id_json, key) = if id.is_multiple_of(2) {
                    (id.to_string(), id.to_string())
                } else {
                    (format!("\"s{id}\""), format!("\"s{id}\""))
                };
                let line = format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{id_json},\"method\":\"{method}\",\"params\":{{\"name\":\"t\",\"pad\":\"{pad}\"}}}}\n"
                );
                if method == "tools/list" {
                    ready.lists.insert(key.clone());
                }
                sent.insert(key);
                let split = input.below(line.len() + 1);
                session.handle_agent_bytes(&line.as_bytes()[..split], now);
                drain_bridge(
                    &mut session,
                    max_frame_bytes,
                    &mut answered,
                    &mut forwarded,
                    &mut exited,
                    &mut ready,
                );
                session.handle_agent_bytes(&line.as_bytes()[split..], now);
            }
            3 if input.byte().is_multiple_of(2) => {
                ready.initialized = true;
                session.handle_agent_bytes(
                    b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n",
                    now,
                );
            }
            3 => {
                let mut garbage = input.bytes(40).to_vec();
                garbage.retain(|b| *b != b'\n');
                garbage.push(b'\n');
                session.handle_agent_bytes(&garbage, now);
            }
            4 => {
                let Some(key) = sent.iter().nth(input.below(sent.len().max(1))).cloned() else {
                    continue;
                };
                let line = format!(
                    "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{{\"requestId\":{key}}}}}\n"
                );
                if !answered.contains_key(&key) {
                    cancelled.insert(key);
                }
                session.handle_agent_bytes(line.as_bytes(), now);
            }
            5 | 6 => {
                let id = if forwarded.is_empty() || input.below(4) == 0 {
                    u64::from(input.byte())
                } else {
                    forwarded[input.below(forwarded.len())]
                };
                let line = match input.below(4) {
                    0 => format!("{{\"kind\":\"error\",\"message\":\"no\",\"id\":{id}}}\n"),
                    1 => format!(
                        "{{\"kind\":\"mcp_response\",\"id\":{id},\"error\":{{\"code\":-32601,\"message\":\"nf\"}}}}\n"
                    ),
                    2 => format!("{{\"kind\":\"mcp_response\",\"id\":{id}}}\n"),
                    _ => format!(
                        "{{\"kind\":\"mcp_response\",\"id\":{id},\"result\":{{\"ok\":true}}}}\n"
                    ),
                };
                session.handle_runner_bytes(line.as_bytes(), now);
            }
            7 => {
                let bytes = input.bytes(64);
                session.handle_runner_bytes(bytes, now);
            }
            8 => {
                let line = "{\"kind\":\"mcp_notification\",\"method\":\"notifications/claude/channel\",\"params\":{\"content\":\"x\",\"meta\":{}}}\n";
                session.handle_runner_bytes(line.as_bytes(), now);
            }
            _ => match input.byte() % 8 {
                0 => session.handle_agent_eof(now),
                1 => session.handle_runner_closed(now),
                2 => session.handle_runner_bytes(b"{\"kind\":\"shutdown\"}\n", now),
                3 => session.handle_terminate(now),
                _ => {
                    if let Some(due) = session.poll_timeout() {
                        assert!(
                            ready.initialized && ready.listed,
                            "grace before the handshake"
                        );
                        now = now.max(due);
                    }
                    session.handle_timeout(now);
                }
            },
        }
        drain_bridge(
            &mut session,
            max_frame_bytes,
            &mut answered,
            &mut forwarded,
            &mut exited,
            &mut ready,
        );
    }
    if !exited {
        session.handle_agent_eof(now);
        drain_bridge(
            &mut session,
            max_frame_bytes,
            &mut answered,
            &mut forwarded,
            &mut exited,
            &mut ready,
        );
    }
    assert!(exited, "the session exits");
    for (key, count) in answered.iter().filter(|(k, _)| sent.contains(*k)) {
        assert!(*count == 1, "request {key} answered {count} times");
    }
    for key in &sent {
        if !cancelled.contains(key) {
            assert!(answered.contains_key(key), "request {key} never answered");
        }
    }
}

/// What the agent has done towards being ready for notifications.
#[derive(Default)]
struct Readiness {
    initialized: bool,
    /// Keys of the `tools/list` requests sent.
    lists: BTreeSet<String>,
    /// Whether one of them was answered.
    listed: bool,
}

fn drain_bridge(
    session: &mut BridgeSession,
    max_frame_bytes: usize,
    answered: &mut BTreeMap<String, usize>,
    forwarded: &mut Vec<u64>,
    exited: &mut bool,
    ready: &mut Readiness,
) {
    let mut polls = 0;
    while let Some(output) = session.poll_output() {
        polls += 1;
        assert!(polls <= MAX_POLLS, "poll_output does not terminate");
        assert!(!*exited, "output after Exit: {output:?}");
        match output {
            BridgeOutput::ToAgent(line) => {
                assert_eq!(line.last(), Some(&b'\n'));
                assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
                match jsonrpc::parse_message(&line[..line.len() - 1]) {
                    Ok(Message::Response(r)) => {
                        let key = r.id.as_raw().get().to_owned();
                        ready.listed |= ready.lists.contains(&key);
                        *answered.entry(key).or_default() += 1;
                    }
                    // Garbage lines are answered under a null id (which this parser refuses).
                    Err(jsonrpc::Invalid::Request { id: None, .. })
                        if line.starts_with(b"{\"jsonrpc\":\"2.0\",\"id\":null,") => {}
                    Ok(Message::Notification(_)) => assert!(
                        ready.initialized && ready.listed,
                        "a notification reached the agent before it was ready"
                    ),
                    other => panic!(
                        "bridge wrote something that is not a response or notification: {other:?}"
                    ),
                }
            }
            BridgeOutput::ToRunner(frame) => {
                assert!(frame.len() <= max_frame_bytes, "frame over the cap");
                assert_eq!(frame.iter().filter(|b| **b == b'\n').count(), 1);
                match decode_frame(&frame[..frame.len() - 1]) {
                    Ok(crate::frame::Frame::McpRequest(req)) => forwarded.push(req.id),
                    Ok(crate::frame::Frame::Shutdown(_)) => {}
                    other => panic!("unexpected frame to the runner: {other:?}"),
                }
            }
            BridgeOutput::Event(_) => {}
            BridgeOutput::Exit(_) => *exited = true,
        }
    }
}

/// `runner_session`: bridges connecting, sending and going away, and an application answering,
/// in arbitrary order.
///
/// Oracles: a request is handed to the application at most once per (connection, id) while in
/// flight; a response frame goes only to the connection that asked; nothing is transmitted to a
/// connection after it was closed; every frame fits the cap; at most one bridge is attached
/// (unless the policy is `AllowMany`); an outsider never gets a notification;
/// `respond` never reports misuse for requests the session handed out; `poll_output` terminates.
pub fn runner_ops(data: &[u8]) {
    let mut input = Input::new(data);
    let policy = match input.byte() % 3 {
        0 => BridgePolicy::DisplaceOld,
        1 => BridgePolicy::RejectNew,
        _ => BridgePolicy::AllowMany,
    };
    let max_frame_bytes = 256 + usize::from(input.byte()) * 8;
    let mut session = RunnerSession::new(RunnerConfig {
        policy,
        max_frame_bytes,
        max_queued_notifications: 1 + input.below(8),
    });
    let mut now = Instant::now();
    let mut conns: Vec<ConnId> = Vec::new();
    let mut closed: BTreeSet<ConnId> = BTreeSet::new();
    let mut app_pending: Vec<(ConnId, u64)> = Vec::new();
    let mut outsiders: BTreeSet<ConnId> = BTreeSet::new();

    while !input.is_empty() {
        now += Duration::from_micros(u64::from(input.byte()));
        match input.byte() % 9 {
            0 => {
                let origin = if input.byte().is_multiple_of(3) {
                    Origin::Outsider
                } else {
                    Origin::Agent
                };
                let conn = session.handle_connect(origin, now);
                if origin == Origin::Outsider {
                    outsiders.insert(conn);
                }
                conns.push(conn);
            }
            1..=3 if !conns.is_empty() => {
                let conn = conns[input.below(conns.len())];
                let id = input.below(8);
                let method = if input.byte().is_multiple_of(2) {
                    "tools/list"
                } else {
                    "tools/call"
                };
                let line = format!(
                    "{{\"kind\":\"mcp_request\",\"id\":{id},\"method\":\"{method}\",\"params\":{{\"name\":\"t\"}}}}\n"
                );
                let split = input.below(line.len() + 1);
                session.handle_bytes(conn, &line.as_bytes()[..split], now);
                let mut newly_closed = Vec::new();
                drain_runner(
                    &mut session,
                    max_frame_bytes,
                    &closed,
                    &mut newly_closed,
                    &mut app_pending,
                    &outsiders,
                );
                closed.extend(newly_closed);
                session.handle_bytes(conn, &line.as_bytes()[split..], now);
            }
            4 if !conns.is_empty() => {
                let conn = conns[input.below(conns.len())];
                let bytes = input.bytes(64);
                session.handle_bytes(conn, bytes, now);
            }
            5 | 6 if !app_pending.is_empty() => {
                let (conn, id) = app_pending.remove(input.below(app_pending.len()));
                let big = input.byte().is_multiple_of(4);
                let text = if big {
                    "r".repeat(max_frame_bytes)
                } else {
                    "ok".to_owned()
                };
                let outcome = Outcome::Result(mcp::tool_text(&text));
                session
                    .respond(conn, id, outcome, now)
                    .expect("answering a request the session handed out");
            }
            7 if !conns.is_empty() => {
                let conn = conns[input.below(conns.len())];
                session.handle_closed(conn, now);
                closed.insert(conn);
            }
            8 => match input.byte() % 4 {
                0 => session.shutdown(Some("bye"), now),
                _ => session.notify(mcp::CLAUDE_CHANNEL, Some(mcp::tool_text("event")), now),
            },
            _ => {}
        }
        let mut newly_closed = Vec::new();
        drain_runner(
            &mut session,
            max_frame_bytes,
            &closed,
            &mut newly_closed,
            &mut app_pending,
            &outsiders,
        );
        closed.extend(newly_closed);
    }
}

fn drain_runner(
    session: &mut RunnerSession,
    max_frame_bytes: usize,
    closed: &BTreeSet<ConnId>,
    newly_closed: &mut Vec<ConnId>,
    app_pending: &mut Vec<(ConnId, u64)>,
    outsiders: &BTreeSet<ConnId>,
) {
    let mut polls = 0;
    let mut asked_here: BTreeMap<ConnId, BTreeSet<u64>> = BTreeMap::new();
    for (conn, id) in app_pending.iter() {
        asked_here.entry(*conn).or_default().insert(*id);
    }
    while let Some(output) = session.poll_output() {
        polls += 1;
        assert!(polls <= MAX_POLLS, "poll_output does not terminate");
        match output {
            RunnerOutput::Transmit { conn, bytes } => {
                assert!(
                    !closed.contains(&conn) && !newly_closed.contains(&conn),
                    "transmit to a closed connection"
                );
                for line in bytes.split_inclusive(|b| *b == b'\n') {
                    assert!(line.len() <= max_frame_bytes, "frame over the cap");
                    assert_eq!(line.last(), Some(&b'\n'));
                    let frame = decode_frame(&line[..line.len() - 1])
                        .expect("the runner writes valid frames");
                    assert!(
                        !(outsiders.contains(&conn)
                            && matches!(frame, crate::frame::Frame::McpNotification(_))),
                        "a notification went to an outsider"
                    );
                }
            }
            RunnerOutput::Close { conn } => newly_closed.push(conn),
            RunnerOutput::Request(req) => {
                let ids = asked_here.entry(req.conn).or_default();
                assert!(
                    ids.insert(req.id),
                    "request handed out twice while in flight"
                );
                app_pending.push((req.conn, req.id));
            }
            RunnerOutput::Event(_) => {}
        }
        assert!(
            session
                .attached()
                .is_none_or(|c| !newly_closed.contains(&c))
        );
    }
}

/// `decode_lp`: arbitrary bytes in arbitrary chunks through an [`LpDecoder`].
///
/// Oracles: chunked decoding yields the same payloads and the same fatal error as decoding the
/// whole stream at once; nothing comes out after a fatal error; each payload re-encodes to exactly
/// the bytes it came from; a drained decoder holds at most one partial frame.
pub fn decode_lp(data: &[u8]) {
    let mut input = Input::new(data);
    let max = usize::from(input.byte()) * 2;
    let mut seed = u32::from(input.byte()) | 1;
    let stream = &data[input.pos.min(data.len())..];

    let run = |chunks: &mut dyn FnMut() -> Option<usize>| {
        let mut decoder = LpDecoder::new(max);
        let mut payloads = Vec::new();
        let mut rest = stream;
        let mut failure = None;
        while failure.is_none() && !rest.is_empty() {
            let len = chunks().unwrap_or(rest.len()).clamp(1, rest.len());
            let (chunk, tail) = rest.split_at(len);
            rest = tail;
            decoder.push(chunk);
            loop {
                match decoder.next() {
                    Ok(Some(payload)) => payloads.push(payload),
                    Ok(None) => {
                        assert!(
                            decoder.buffered_len() < 4 + max,
                            "more than one partial frame held"
                        );
                        break;
                    }
                    Err(error) => {
                        failure = Some(error);
                        break;
                    }
                }
            }
        }
        if failure.is_none() {
            failure = decoder.finish().err();
        }
        (payloads, failure)
    };
    let whole = run(&mut || None);
    let chunked = run(&mut || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        Some(seed as usize % (2 * max + 8))
    });
    assert_eq!(whole, chunked, "chunking changed the outcome");
    let mut reencoded = Vec::new();
    for payload in &whole.0 {
        length_prefixed::encode(payload, &mut reencoded, max).expect("a decoded payload fits");
    }
    assert_eq!(
        &stream[..reencoded.len()],
        &reencoded[..],
        "payloads re-encode to their bytes"
    );
}

/// `ash_bridge`: a host and an agent doing arbitrary things to an [`AshConnection`].
///
/// Oracles: `ready` comes first; every line sent is a valid event; at most one turn runs; every
/// turn the bridge starts ends with exactly one `done` once the agent (or exec) finishes; no
/// `message` goes out while no query runs; `poll_output` terminates.
pub fn ash_bridge_ops(data: &[u8]) {
    let mut input = Input::new(data);
    let mut conn = AshConnection::with_max_line(64 + usize::from(input.byte()) * 4);
    let mut running: Option<&'static str> = None;
    let mut dones_expected = 0usize;
    let mut dones = 0usize;
    let mut first = true;
    const COMMANDS: [&str; 7] = [
        r#"{"cmd":"query","prompt":"p","sessionId":"s"}"#,
        r#"{"cmd":"query","prompt":[{"type":"text","text":"p"}],"sessionId":"t","model":"m"}"#,
        r#"{"cmd":"exec","command":"true","timeout":10}"#,
        r#"{"cmd":"resume","sessionId":"r"}"#,
        r#"{"cmd":"interrupt"}"#,
        r#"{"cmd":"query","sessionId":"s"}"#,
        r#"{"cmd":"shutdown"}"#,
    ];
    loop {
        let mut polls = 0;
        while let Some(output) = conn.poll_output() {
            polls += 1;
            assert!(polls <= MAX_POLLS, "poll_output does not terminate");
            match output {
                AshBridgeOutput::Send(line) => {
                    let event = ash::decode_event(&line[..line.len() - 1]).expect("valid event");
                    assert_eq!(first, event == ash::Event::Ready, "ready comes first, once");
                    first = false;
                    match event {
                        ash::Event::Done { .. } => dones += 1,
                        ash::Event::Message { .. } => {
                            assert_eq!(running, Some("query"), "message outside a query")
                        }
                        _ => {}
                    }
                }
                AshBridgeOutput::StartQuery(_) => {
                    assert!(running.is_none(), "two turns at once");
                    running = Some("query");
                }
                AshBridgeOutput::StartExec { .. } => {
                    assert!(running.is_none(), "two turns at once");
                    running = Some("exec");
                }
                AshBridgeOutput::ResumeSession { .. } => dones_expected += 1,
                AshBridgeOutput::StopAgent | AshBridgeOutput::Shutdown => {}
            }
        }
        if input.is_empty() {
            break;
        }
        match input.byte() % 8 {
            0..=2 => {
                let mut line = COMMANDS[input.below(COMMANDS.len())].as_bytes().to_vec();
                line.push(b'\n');
                let split = input.below(line.len() + 1);
                conn.handle_bytes(&line[..split]);
                conn.handle_bytes(&line[split..]);
            }
            3 => conn.handle_bytes(input.bytes(80)),
            4 => conn.agent_message(RawJson::from_text("{}").expect("valid JSON")),
            5 if running == Some("query") => {
                running = None;
                dones_expected += 1;
                conn.agent_finished(if input.byte().is_multiple_of(2) {
                    Ok(None)
                } else {
                    Err("x".into())
                });
            }
            6 if running == Some("exec") => {
                running = None;
                dones_expected += 1;
                conn.exec_finished(0, String::new(), String::new());
            }
            _ => conn.handle_closed(),
        }
    }
    assert_eq!(
        dones, dones_expected,
        "each finished turn ends with exactly one done"
    );
}

/// `ash_host`: a bridge sending arbitrary events to an [`AshHost`] while commands are submitted.
///
/// Oracles: nothing is sent before `ready`; at most one command is on the wire; every submission
/// completes at most once, and all of them once the connection closes; `poll_output` terminates.
pub fn ash_host_ops(data: &[u8]) {
    let mut input = Input::new(data);
    let start = Instant::now();
    let mut now = start;
    let mut host = AshHost::new(now);
    let mut submitted = 0u32;
    let mut completed = BTreeSet::new();
    let mut on_wire = 0u32;
    let mut ready = false;
    const EVENTS: [&str; 7] = [
        r#"{"ev":"ready"}"#,
        r#"{"ev":"message","data":{"type":"assistant"}}"#,
        r#"{"ev":"error","error":"e"}"#,
        r#"{"ev":"done","sessionId":"s"}"#,
        r#"{"ev":"exec_result","exitCode":1,"stdout":"","stderr":"x"}"#,
        r#"{"ev":"done"}"#,
        r#"{"cmd":"query"}"#,
    ];
    loop {
        let mut polls = 0;
        while let Some(output) = host.poll_output() {
            polls += 1;
            assert!(polls <= MAX_POLLS, "poll_output does not terminate");
            match output {
                HostOutput::Send(line) => {
                    assert!(ready, "sent before ready");
                    match ash::decode_command(&line[..line.len() - 1]).expect("valid command") {
                        ash::Command::Interrupt | ash::Command::Shutdown => {}
                        _ => {
                            on_wire += 1;
                            assert!(on_wire <= 1, "two commands on the wire");
                        }
                    }
                }
                HostOutput::Ready => ready = true,
                HostOutput::Completed { token, result } => {
                    assert!(completed.insert(token), "completed twice");
                    if result.is_ok() {
                        on_wire = 0;
                    }
                }
                HostOutput::Message { .. } | HostOutput::InvalidEvent(_) => {}
            }
        }
        if input.is_empty() {
            break;
        }
        match input.byte() % 6 {
            0 | 1 => {
                let command = match input.byte() % 3 {
                    0 => ash::Command::Resume {
                        session_id: "s".into(),
                    },
                    1 => ash::Command::Exec {
                        command: "c".into(),
                        timeout_ms: 1,
                    },
                    _ => ash::Command::Interrupt,
                };
                if !matches!(command, ash::Command::Interrupt) {
                    submitted += 1;
                    host.submit(command, submitted);
                } else {
                    host.submit(command, 0);
                }
            }
            2 | 3 => {
                let mut line = EVENTS[input.below(EVENTS.len())].as_bytes().to_vec();
                line.push(b'\n');
                host.handle_bytes(&line, now);
            }
            4 => host.handle_bytes(input.bytes(40), now),
            _ => {
                now += Duration::from_secs(u64::from(input.byte() % 12));
                host.handle_timeout(now);
            }
        }
    }
    host.handle_closed(now);
    while let Some(output) = host.poll_output() {
        if let HostOutput::Completed { token, .. } = output {
            assert!(completed.insert(token), "completed twice");
        }
    }
    assert_eq!(
        completed.len() as u32,
        submitted,
        "every submission completes"
    );
}

#[cfg(test)]
mod tests {
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
    }
}
