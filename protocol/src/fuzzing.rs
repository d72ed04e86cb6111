//! Oracles for fuzzing: each function interprets arbitrary bytes as input to a protocol machine
//! and panics when the machine breaks one of its promises. The `fuzz/` targets call these; the
//! crate's own tests run them on random bytes too.
//!
//! Enabled with the `fuzzing` feature (always on in this crate's tests).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use crate::codec::frame::{
    Decoded, DropReason, Dropped, FrameDecoder, decode_frame, encode_frame_vec,
};
use crate::codec::json::RawJson;
use crate::codec::jsonrpc::{self, Message, Outcome};
use crate::codec::length_prefixed::{self, LpDecoder};
use crate::dialect::ash::{
    self,
    bridge::{Answer, AshBridgeOutput, AshConnection},
    host::{AshHost, HostOutput},
};
use crate::dialect::mcp;
use crate::session::mcp_bridge::{BridgeConfig, BridgeOutput, BridgeSession, Peer as BridgePeer};
use crate::session::runner::{
    BridgePolicy, ConnId, Origin, RunnerConfig, RunnerOutput, RunnerSession,
};
use crate::trace::activity::{ActivityEvent, ActivityUpload};
use crate::trace::http::{ConnId as TraceConn, HttpConfig};
use crate::trace::redact::{TRUNCATED_MARK, preview, redact_text};
use crate::trace::uploader::{UploadResult, Uploader, UploaderConfig, UploaderLog};
use crate::trace::{TraceConfig, TraceOutput, Tracer};

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

    /// Up to `max` raw bytes as one unterminated line without quotes: garbage that can never
    /// be a JSON object with keys, so never a message an oracle would have to follow.
    fn garbage_line(&mut self, max: usize) -> Vec<u8> {
        self.bytes(max)
            .iter()
            .map(|b| if *b == b'"' { b'\'' } else { *b })
            .filter(|b| *b != b'\n')
            .collect()
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
        while let Some(decoded) = decoder.decode() {
            got.push(decoded);
            polls += 1;
            assert!(polls <= MAX_POLLS);
        }
        assert!(
            decoder.buffered_len() < cap,
            "drained buffer holds less than the cap"
        );
    }
    got.extend(decoder.decode_eof());

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
            BridgeOutput::Transmit {
                to: BridgePeer::Agent,
                bytes: line,
            } => {
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
            BridgeOutput::Transmit {
                to: BridgePeer::Runner,
                bytes: frame,
            } => {
                assert!(frame.len() <= max_frame_bytes, "frame over the cap");
                assert_eq!(frame.iter().filter(|b| **b == b'\n').count(), 1);
                match decode_frame(&frame[..frame.len() - 1]) {
                    Ok(crate::codec::frame::Frame::McpRequest(req)) => forwarded.push(req.id),
                    Ok(
                        crate::codec::frame::Frame::Shutdown(_)
                        | crate::codec::frame::Frame::Ack(_),
                    ) => {}
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
            RunnerOutput::Transmit { to: conn, bytes } => {
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
                            && matches!(frame, crate::codec::frame::Frame::McpNotification(_))),
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
                match decoder.decode() {
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
            failure = decoder.decode_eof().err();
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
/// Oracles: `ready` comes first; every line sent is a valid event; at most one command runs; no
/// `message` goes out while no query runs; every `query`, `resume` and `exec` the connection
/// reads (decoded again by the oracle from the same bytes) ends with exactly one `done` naming
/// the session that command named (`""` for exec) once the turns finish, whether it ran or was
/// refused by the bounded queue, unless the host went away; `poll_output` terminates.
pub fn ash_bridge_ops(data: &[u8]) {
    let mut input = Input::new(data);
    let max_line = 64 + usize::from(input.byte()) * 4;
    let mut conn = AshConnection::with_max_line(max_line);
    let mut shadow = crate::codec::line::LineDecoder::new(max_line);
    let mut expected: Vec<String> = Vec::new();
    let mut dones: Vec<String> = Vec::new();
    let mut running: Option<&'static str> = None;
    let mut closed = false;
    let mut first = true;
    const COMMANDS: [&str; 8] = [
        r#"{"cmd":"query","prompt":"p","sessionId":"s"}"#,
        r#"{"cmd":"query","prompt":[{"type":"text","text":"p"}],"sessionId":"t","model":"m"}"#,
        r#"{"cmd":"exec","command":"true","timeout":10}"#,
        r#"{"cmd":"resume","sessionId":"r"}"#,
        r#"{"cmd":"resume","prompt":"p","sessionId":"u"}"#,
        r#"{"cmd":"interrupt"}"#,
        r#"{"cmd":"query","sessionId":"s"}"#,
        r#"{"cmd":"shutdown"}"#,
    ];
    let mut feed = |conn: &mut AshConnection, bytes: &[u8], expected: &mut Vec<String>| {
        conn.handle_bytes(bytes);
        shadow.push(bytes);
        while let Some(line) = shadow.decode() {
            if let crate::codec::line::Line::Complete(line) = line {
                match ash::decode_command(line) {
                    Ok(ash::Command::Query(q)) => expected.push(q.session_id),
                    Ok(ash::Command::Resume { session_id, .. }) => expected.push(session_id),
                    Ok(ash::Command::Exec { .. }) => expected.push(String::new()),
                    _ => {}
                }
            }
        }
    };
    let mut drain = |conn: &mut AshConnection, running: &mut Option<&'static str>| {
        let mut polls = 0;
        while let Some(output) = conn.poll_output() {
            polls += 1;
            assert!(polls <= MAX_POLLS, "poll_output does not terminate");
            match output {
                AshBridgeOutput::Transmit(line) => {
                    let event = ash::decode_event(&line[..line.len() - 1]).expect("valid event");
                    assert_eq!(first, event == ash::Event::Ready, "ready comes first, once");
                    first = false;
                    match event {
                        ash::Event::Done { session_id } => dones.push(session_id),
                        ash::Event::Message { .. } => {
                            assert_eq!(*running, Some("query"), "message outside a query")
                        }
                        _ => {}
                    }
                }
                AshBridgeOutput::StartQuery(_) => {
                    assert!(running.is_none(), "two turns at once");
                    *running = Some("query");
                }
                AshBridgeOutput::StartExec { .. } => {
                    assert!(running.is_none(), "two turns at once");
                    *running = Some("exec");
                }
                AshBridgeOutput::ResumeSession { .. } => {
                    assert!(running.is_none(), "two turns at once");
                    *running = Some("resume");
                }
                AshBridgeOutput::StopAgent | AshBridgeOutput::Shutdown => {}
            }
        }
    };
    loop {
        drain(&mut conn, &mut running);
        if input.is_empty() {
            break;
        }
        match input.byte() % 8 {
            0..=2 => {
                let mut line = COMMANDS[input.below(COMMANDS.len())].as_bytes().to_vec();
                line.push(b'\n');
                let split = input.below(line.len() + 1);
                feed(&mut conn, &line[..split], &mut expected);
                feed(&mut conn, &line[split..], &mut expected);
            }
            3 => {
                let bytes = input.bytes(80);
                feed(&mut conn, bytes, &mut expected);
            }
            4 => conn.notify(RawJson::from_text("{}").expect("valid JSON")),
            5 if running == Some("query") => {
                running = None;
                conn.respond(Answer::Query(if input.byte().is_multiple_of(2) {
                    Ok(())
                } else {
                    Err("x".into())
                }));
            }
            5 if running == Some("resume") => {
                running = None;
                conn.respond(Answer::Resume(if input.byte().is_multiple_of(2) {
                    Ok(())
                } else {
                    Err("x".into())
                }));
            }
            6 if running == Some("exec") => {
                running = None;
                conn.respond(Answer::Exec {
                    exit_code: 0,
                    stdout: String::new(),
                    stderr: String::new(),
                });
            }
            _ => {
                closed = true;
                conn.handle_closed();
            }
        }
    }
    if closed {
        return;
    }
    // Finish whatever runs until the queue is empty.
    while let Some(kind) = running.take() {
        match kind {
            "query" => conn.respond(Answer::Query(Ok(()))),
            "resume" => conn.respond(Answer::Resume(Ok(()))),
            _ => conn.respond(Answer::Exec {
                exit_code: 0,
                stdout: String::new(),
                stderr: String::new(),
            }),
        }
        drain(&mut conn, &mut running);
    }
    assert!(
        !conn.is_busy() && conn.queued() == 0,
        "a command was left behind"
    );
    expected.sort();
    dones.sort();
    assert_eq!(
        dones, expected,
        "each command ends with exactly one done for its session"
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
                HostOutput::Transmit(line) => {
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
                        turn: None,
                    },
                    1 => ash::Command::Exec {
                        command: "c".into(),
                        timeout_ms: 1,
                    },
                    _ => ash::Command::Interrupt,
                };
                if !matches!(command, ash::Command::Interrupt) {
                    submitted += 1;
                    host.request(command, submitted, now);
                } else {
                    host.request(command, 0, now);
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

/// The secrets corpus (`protocol/src/trace/secrets.txt`): `(context, secret)` pairs.
pub fn trace_secrets() -> Vec<(&'static str, &'static str)> {
    include_str!("trace/secrets.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_once('\t'))
        .collect()
}

/// A request carrying `secret` in its `context` (see `secrets.txt`); `variant` picks where a
/// `text` secret goes (message text, tool input, system prompt, plain-text body).
pub fn secret_exchange(context: &str, secret: &str, variant: u8) -> Vec<u8> {
    let mut target = "/v1/messages?beta=true".to_owned();
    let mut headers = String::new();
    let text = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let body = match context.split_once(':') {
        Some(("header", name)) => {
            headers.push_str(&format!("{name}: {secret}\r\n"));
            r#"{"model":"m","messages":[]}"#.to_owned()
        }
        Some(("query", name)) => {
            target = format!("/v1/messages?{name}={secret}&beta=true");
            r#"{"model":"m","messages":[]}"#.to_owned()
        }
        Some(("json", key)) => format!(
            r#"{{"model":"m","{key}":{s},"messages":[{{"role":"user","content":[{{"type":"tool_use","id":"t","name":"n","input":{{"{key}":{s}}}}}]}}],"input":[{{"type":"function_call","call_id":"c","name":"n","arguments":{args}}}]}}"#,
            s = text(secret),
            args = text(&format!(r#"{{"{key}":{}}}"#, text(secret))),
        ),
        _ => {
            headers.push_str(&format!("x-note: see {secret} here\r\n"));
            target = format!("/v1/messages?beta=true&s={secret}");
            let said = text(&format!("my key is {secret}, keep it"));
            match variant % 4 {
                0 => format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":{said}}}],"input":{said}}}"#
                ),
                1 => format!(
                    r#"{{"model":"m","messages":[{{"role":"assistant","content":[{{"type":"tool_use","id":"t","name":"Bash","input":{{"command":{said}}}}}]}},{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t","content":{said}}}]}}]}}"#
                ),
                2 => format!(
                    r#"{{"model":"m","system":[{{"type":"text","text":{said}}}],"instructions":{said},"tools":[{{"name":"t","description":{said},"input_schema":{{}}}}],"messages":[]}}"#
                ),
                _ => format!("plain text body: {secret} end"),
            }
        }
    };
    format!(
        "POST {target} HTTP/1.1\r\nHost: api.example\r\n{headers}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A streamed response carrying `secret` in its `context`, split across two deltas for text.
pub fn secret_response(context: &str, secret: &str) -> Vec<u8> {
    let text = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut headers = String::new();
    let (first, second) = secret.split_at(secret.len() / 2);
    let mut stream = format!(
        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"content\":[],\"usage\":{{\"input_tokens\":1}}}}}}\n\n\
         data: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
         data: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":{}}}}}\n\n\
         data: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":{}}}}}\n\n\
         data: {{\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{{\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}}}\n\n\
         data: {{\"type\":\"response.output_text.delta\",\"output_index\":0,\"content_index\":0,\"delta\":{}}}\n\n\
         data: {{\"type\":\"response.output_text.delta\",\"output_index\":0,\"content_index\":0,\"delta\":{}}}\n\n",
        text(&format!("key: {first}")),
        text(&format!("{second} ok")),
        text(&format!("key: {first}")),
        text(&format!("{second} ok")),
    );
    match context.split_once(':') {
        Some(("header", name)) => headers.push_str(&format!("{name}: {secret}\r\n")),
        Some(("json", key)) => stream.push_str(&format!(
            "data: {{\"type\":\"error\",\"error\":{{\"type\":\"x\",\"message\":{m}}},\"{key}\":{s}}}\n\n",
            m = text(&format!("bad {key}={secret}")),
            s = text(secret),
        )),
        _ => {}
    }
    let mut out = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n{headers}transfer-encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for part in stream.as_bytes().chunks(50) {
        out.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// Feeds `client` then `server` to a [`Tracer`] in chunks whose sizes come from `seed` (one
/// chunk each when `seed` is 0); returns the outputs with the forwarded bytes concatenated.
fn trace_feed(
    config: &TraceConfig,
    host: &str,
    client: &[u8],
    server: &[u8],
    seed: u32,
    max_buffered: &mut usize,
) -> (Vec<TraceOutput>, Vec<u8>) {
    let conn = TraceConn(7);
    let mut tracer = Tracer::new(config.clone());
    tracer.handle_open(conn, host, 0);
    let mut outputs = Vec::new();
    let mut forwarded = Vec::new();
    let mut drain = |tracer: &mut Tracer| {
        let mut polls = 0;
        while let Some(output) = tracer.poll_output() {
            polls += 1;
            assert!(polls <= MAX_POLLS, "poll_output does not terminate");
            match output {
                TraceOutput::Transmit { bytes, .. } => forwarded.extend_from_slice(&bytes),
                other => outputs.push(other),
            }
        }
    };
    let mut seed = seed;
    let mut chunks = |bytes: &'_ [u8]| -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = if seed == 0 {
                bytes.len()
            } else {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                (seed as usize % 97).clamp(1, bytes.len() - at)
            };
            out.push((at, at + len.min(bytes.len() - at)));
            at += len.min(bytes.len() - at);
        }
        out
    };
    for (a, b) in chunks(client) {
        tracer.handle_client_bytes(conn, &client[a..b], 1);
        *max_buffered = (*max_buffered).max(tracer.assembler().buffered_bytes());
        drain(&mut tracer);
    }
    for (a, b) in chunks(server) {
        tracer.handle_server_bytes(conn, &server[a..b], 2);
        *max_buffered = (*max_buffered).max(tracer.assembler().buffered_bytes());
        drain(&mut tracer);
    }
    tracer.handle_closed(conn, 3);
    drain(&mut tracer);
    assert_eq!(tracer.assembler().open_connections(), 0);
    (outputs, forwarded)
}

/// `trace_http`: arbitrary client and server streams through the [`Tracer`].
///
/// Input: a flags byte (small caps, `Accept-Encoding` rewriting, host), a chunking seed, two
/// bytes giving the client stream's length, then the client and server streams.
///
/// Oracles: splitting the streams differently never changes the events or the forwarded bytes;
/// every `RequestSent` gets exactly one event; without rewriting nothing is forwarded by the
/// tracer, and with it, an untraced or tunnelled connection's bytes pass unchanged after the
/// point of failure; buffers stay within the caps; bodies respect the body cap; events are
/// bounded in size and survive a JSON round trip.
pub fn trace_http(data: &[u8]) {
    let mut input = Input::new(data);
    let flags = input.byte();
    let seed = u32::from(input.byte()) | 1;
    let client_len = usize::from(u16::from_le_bytes([input.byte(), input.byte()]));
    let rest = &data[input.pos.min(data.len())..];
    let (client, server) = rest.split_at(client_len.min(rest.len()));
    let small = flags & 1 == 1;
    let config = TraceConfig {
        http: HttpConfig {
            max_head_bytes: if small { 96 } else { 64 * 1024 },
            max_body_bytes: if small { 64 } else { 1 << 20 },
            max_pipelined: if small { 3 } else { 64 },
            rewrite_accept_encoding: flags & 2 == 2,
        },
        preview_chars: if small { 32 } else { 4096 },
    };
    let host = [
        "api.anthropic.com:443",
        "api.openai.com:443",
        "example.com:443",
    ][usize::from(flags >> 2) % 3];
    // The decoders straight on the server bytes and on what follows its first blank line.
    let after_head = server
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(&server[..0], |i| &server[i + 4..]);
    for body in [server, after_head] {
        for response in [
            crate::trace::anthropic::response(body, 200),
            crate::trace::openai::response(body, 200),
        ] {
            serde_json::to_string(&response).expect("responses serialize");
        }
    }
    let mut buffered = 0;
    let (whole, whole_fwd) = trace_feed(&config, host, client, server, 0, &mut buffered);
    let mut buffered_split = 0;
    let (split, split_fwd) = trace_feed(&config, host, client, server, seed, &mut buffered_split);
    assert_eq!(split, whole, "chunking changed the outputs");
    assert_eq!(split_fwd, whole_fwd, "chunking changed the forwarded bytes");
    if !config.http.rewrite_accept_encoding {
        assert!(whole_fwd.is_empty(), "forwarded without rewriting");
    }
    let bound = 2 * (config.http.max_head_bytes + 97)
        + 2 * config.http.max_pipelined * config.http.max_body_bytes;
    assert!(buffered_split <= bound, "buffers exceed their caps");

    let sent = whole
        .iter()
        .filter(|o| matches!(o, TraceOutput::RequestSent { .. }))
        .count();
    let mut events = 0;
    let mut event_bytes = 0;
    for output in &whole {
        if let TraceOutput::Event { event, .. } = output {
            events += 1;
            let json = serde_json::to_string(event).expect("events serialize");
            event_bytes += json.len();
            let back: ActivityEvent = serde_json::from_str(&json).expect("events deserialize");
            assert_eq!(
                serde_json::to_string(&back).expect("serialize"),
                json,
                "events round trip"
            );
        }
    }
    assert_eq!(sent, events, "one event per request sent");
    assert!(
        event_bytes <= 16 * data.len() + 4096 * (events + 1),
        "events are out of proportion to the input"
    );
}

/// `trace_redact`: a secret from the corpus in an exchange with arbitrary text around it.
///
/// Oracles: no corpus secret survives in any event whatever the host, the placement and the
/// chunking; [`redact_text`] is idempotent on arbitrary text and previews respect their cap.
pub fn trace_redact(data: &[u8]) {
    let mut input = Input::new(data);
    let corpus = trace_secrets();
    let (context, secret) = corpus[input.below(corpus.len())];
    let variant = input.byte();
    let host = ["api.anthropic.com", "api.openai.com", "example.com"][input.below(3)];
    let seed = u32::from(input.byte()) | 1;
    let noise = String::from_utf8_lossy(input.bytes(200)).into_owned();
    // Arbitrary text alone: redaction is idempotent and previews are capped.
    let once = redact_text(&noise).into_owned();
    assert_eq!(redact_text(&once), once, "redaction is idempotent");
    let cap = 1 + usize::from(variant % 64);
    assert!(preview(&noise, cap).chars().count() <= cap + TRUNCATED_MARK.chars().count());

    // The secret with noise around it (separated by a space, as text around a key is).
    let noisy = format!(
        "{} {secret} {}",
        noise.replace(['\r', '\n'], " "),
        noise.len()
    );
    let client = secret_exchange(context, secret, variant);
    let server = secret_response(context, secret);
    let client = if context == "text" {
        // Put the noise in the first message too.
        String::from_utf8_lossy(&client)
            .replace(
                "my key is ",
                &format!("{} my key is ", noisy.replace('"', "'").replace('\\', "/")),
            )
            .into_bytes()
    } else {
        client
    };
    let client = fix_content_length(&client);
    let config = TraceConfig::default();
    let mut buffered = 0;
    let (outputs, _) = trace_feed(&config, host, &client, &server, seed, &mut buffered);
    for output in &outputs {
        if let TraceOutput::Event { event, .. } = output {
            let json = serde_json::to_string(event).expect("serializes");
            assert!(!json.contains(secret), "{context} secret survived: {json}");
        }
    }
}

/// Rewrites the `content-length` of a request built by [`secret_exchange`] after an edit.
fn fix_content_length(request: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(request);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return request.to_vec();
    };
    let head: Vec<String> = head
        .split("\r\n")
        .map(|l| {
            if l.starts_with("content-length:") {
                format!("content-length: {}", body.len())
            } else {
                l.to_owned()
            }
        })
        .collect();
    format!("{}\r\n\r\n{body}", head.join("\r\n")).into_bytes()
}

/// One step of the live-stream world: what the broker, the network and the clock do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveStep {
    /// A message is logged (and sent to an open subscription).
    Push,
    /// The clock moves `ms` forward (timers due fire).
    Tick(u16),
    /// The pending connect succeeds (replay or reset, then live).
    Accept,
    /// The pending connect fails.
    Refuse,
    /// Up to `n` frames the broker sent reach the machine.
    Feed(u8),
    /// A keepalive reaches the machine.
    Keepalive,
    /// The connection breaks.
    Drop,
    /// The pending `/history` request is answered.
    Answer,
    /// The pending `/history` request fails.
    FailFetch,
    /// The broker restarts on the same database.
    Restart,
    /// The broker comes back on a backup holding the first `keep` percent of its log.
    Restore(u8),
    /// The broker comes back on a fresh database.
    Fresh,
}

/// A stored message of the simulated broker. `serial` grows across every database.
#[derive(Debug, Clone)]
struct SimMessage {
    serial: u64,
    message: crate::domain::message::Message,
}

/// The live-stream machine in a simulated world (one member who sees everything), checking
/// after every step that no message was delivered twice or out of order, and
/// [`LiveSim::settle`] that everything in the broker's log reached the agent.
#[derive(Debug)]
pub struct LiveSim {
    machine: crate::session::live::LiveStream,
    now: Instant,
    ms: i64,
    log: Vec<SimMessage>,
    next_serial: u64,
    /// What the broker sent on the open connection, not yet read.
    inbound: Option<VecDeque<crate::session::live::LiveFrame>>,
    connect_pending: Option<Option<String>>,
    fetch_pending: Option<crate::session::live::HistoryQuery>,
    delivered: Vec<u64>,
    delivered_ids: BTreeSet<String>,
    serial_of: BTreeMap<String, u64>,
    /// The last serial logged before the first subscription (a runner starts live: what came
    /// before it is history, not stream).
    before_first: Option<u64>,
}

impl LiveSim {
    /// A world with small pages and hold limits so that paging and overflow happen.
    pub fn new(seed: u64) -> Self {
        let now = Instant::now();
        let config = crate::session::live::LiveConfig {
            page: 3,
            max_held: 5,
            remembered_ids: 100_000,
            seed,
            ..crate::session::live::LiveConfig::default()
        };
        let mut sim = Self {
            machine: crate::session::live::LiveStream::new(config, now),
            now,
            ms: 1_000_000,
            log: Vec::new(),
            next_serial: 0,
            inbound: None,
            connect_pending: None,
            fetch_pending: None,
            delivered: Vec::new(),
            delivered_ids: BTreeSet::new(),
            serial_of: BTreeMap::new(),
            before_first: None,
        };
        sim.drain();
        sim
    }

    /// Applies one step, then checks the delivery promises.
    pub fn step(&mut self, step: &LiveStep) {
        match step {
            LiveStep::Push => {
                self.next_serial += 1;
                let serial = self.next_serial;
                let message = crate::domain::message::Message {
                    id: format!("m{serial}"),
                    ts: self.ms,
                    to: None,
                    from: Some("director".into()),
                    title: None,
                    body: format!("body {serial}"),
                    level: crate::domain::message::LogLevel::default(),
                    data: serde_json::Map::new(),
                    attachments: Vec::new(),
                };
                self.serial_of.insert(message.id.clone(), serial);
                if let Some(inbound) = &mut self.inbound {
                    inbound.push_back(crate::session::live::LiveFrame::Message(message.clone()));
                }
                self.log.push(SimMessage { serial, message });
            }
            LiveStep::Tick(ms) => {
                let d = Duration::from_millis(u64::from(*ms) * 50);
                self.now += d;
                self.ms += i64::from(*ms) / 8;
                if self.machine.poll_timeout().is_some_and(|at| at <= self.now) {
                    self.machine.handle_timeout(self.now);
                }
            }
            LiveStep::Accept => {
                if let Some(last) = self.connect_pending.take() {
                    let mut inbound = VecDeque::new();
                    if let Some(id) = last {
                        match self.log.iter().position(|m| m.message.id == id) {
                            Some(at) => inbound.extend(self.log[at + 1..].iter().map(|m| {
                                crate::session::live::LiveFrame::Message(m.message.clone())
                            })),
                            None => inbound.push_back(crate::session::live::LiveFrame::Reset(
                                crate::session::live::Reset::unknown_id(&id),
                            )),
                        }
                    }
                    self.inbound = Some(inbound);
                    self.before_first.get_or_insert(self.next_serial);
                    self.machine.handle_connected(true, Some(self.ms), self.now);
                }
            }
            LiveStep::Refuse => {
                if self.connect_pending.take().is_some() {
                    self.machine.handle_closed("refused", self.now);
                }
            }
            LiveStep::Feed(n) => {
                for _ in 0..=*n {
                    let Some(frame) = self.inbound.as_mut().and_then(|i| i.pop_front()) else {
                        break;
                    };
                    self.machine.handle_frame(frame, self.now);
                    self.drain();
                }
            }
            LiveStep::Keepalive => {
                if self.inbound.is_some() {
                    self.machine
                        .handle_frame(crate::session::live::LiveFrame::Alive, self.now);
                }
            }
            LiveStep::Drop => self.disconnect(),
            LiveStep::Answer => {
                if let Some(query) = self.fetch_pending.take() {
                    match self.history(&query) {
                        Some(messages) => self.machine.handle_history(query.id, messages, self.now),
                        None => self.machine.handle_history_failed(
                            query.id,
                            "400 unknown after_id",
                            self.now,
                        ),
                    }
                }
            }
            LiveStep::FailFetch => {
                if let Some(query) = self.fetch_pending.take() {
                    self.machine
                        .handle_history_failed(query.id, "503", self.now);
                }
            }
            LiveStep::Restart => self.disconnect(),
            LiveStep::Restore(keep) => {
                self.disconnect();
                let keep = self.log.len() * usize::from(*keep % 101) / 100;
                self.log.truncate(keep);
            }
            LiveStep::Fresh => {
                self.disconnect();
                self.log.clear();
            }
        }
        self.drain();
    }

    fn disconnect(&mut self) {
        self.fetch_pending = None;
        if self.connect_pending.take().is_some() || self.inbound.take().is_some() {
            self.machine.handle_closed("connection lost", self.now);
        }
    }

    /// `GET /history` against the current log (`None`: an `after_id` it does not have).
    fn history(
        &self,
        q: &crate::session::live::HistoryQuery,
    ) -> Option<Vec<crate::domain::message::Message>> {
        let log = self.log.iter().map(|m| &m.message);
        let page: Vec<_> = if let Some(id) = &q.after_id {
            let at = self.log.iter().position(|m| &m.message.id == id)?;
            log.skip(at + 1).take(q.limit).cloned().collect()
        } else if let Some(after) = q.after_ts {
            log.filter(|m| m.ts > after)
                .take(q.limit)
                .cloned()
                .collect()
        } else {
            let before = q.before_ts.unwrap_or(i64::MAX);
            log.rev()
                .filter(|m| m.ts < before)
                .take(q.limit)
                .cloned()
                .collect()
        };
        Some(page)
    }

    /// Collects the machine's outputs and checks each delivery.
    fn drain(&mut self) {
        let mut polls = 0;
        while let Some(output) = self.machine.poll_output() {
            polls += 1;
            assert!(polls < MAX_POLLS, "poll_output does not terminate");
            match output {
                crate::session::live::LiveOutput::Connect { last_event_id } => {
                    assert!(self.inbound.is_none(), "connect while connected");
                    self.connect_pending = Some(last_event_id);
                }
                crate::session::live::LiveOutput::Disconnect { .. } => {
                    self.inbound = None;
                    self.connect_pending = None;
                    self.fetch_pending = None;
                }
                crate::session::live::LiveOutput::Fetch(query) => {
                    assert!(self.inbound.is_some(), "a fetch while not connected");
                    self.fetch_pending = Some(query);
                }
                crate::session::live::LiveOutput::Backoff { delay, .. } => {
                    assert!(
                        delay <= Duration::from_secs(36),
                        "backoff {delay:?} over 30 s + 20 %"
                    );
                    assert!(
                        delay >= Duration::from_millis(800),
                        "backoff {delay:?} under 1 s - 20 %"
                    );
                    self.inbound = None;
                    self.connect_pending = None;
                    self.fetch_pending = None;
                }
                crate::session::live::LiveOutput::Deliver(message) => {
                    let serial = self.serial_of[&message.id];
                    assert!(
                        self.delivered_ids.insert(message.id.clone()),
                        "{} delivered twice",
                        message.id
                    );
                    // Messages logged before the first subscription are history, not stream:
                    // a backfill after a reset may bring one that shares the millisecond of the
                    // last delivered message (ms cannot order them). Only the order of the
                    // stream is promised.
                    if self.before_first.is_some_and(|first| serial > first) {
                        if let Some(last) = self.delivered.last() {
                            assert!(
                                serial > *last,
                                "{serial} delivered after {last}: out of order"
                            );
                        }
                        self.delivered.push(serial);
                    }
                }
            }
        }
    }

    /// Lets the world run without faults until the machine is connected and idle, then checks
    /// that every message in the broker's log reached the agent.
    pub fn settle(&mut self) {
        for _ in 0..10_000 {
            if self.connect_pending.is_some() {
                self.step(&LiveStep::Accept);
            } else if self.fetch_pending.is_some() {
                self.step(&LiveStep::Answer);
            } else if self.inbound.as_ref().is_some_and(|i| !i.is_empty()) {
                self.step(&LiveStep::Feed(255));
            } else if self.inbound.is_some() && !self.machine.is_backfilling() {
                let before_first = self.before_first.unwrap_or(0);
                for m in self.log.iter().filter(|m| m.serial > before_first) {
                    assert!(
                        self.delivered_ids.contains(&m.message.id),
                        "{} is in the log but never reached the agent",
                        m.message.id
                    );
                }
                return;
            } else if let Some(at) = self.machine.poll_timeout() {
                self.now = self.now.max(at);
                self.machine.handle_timeout(self.now);
                self.drain();
            } else {
                panic!("stuck: nothing pending and no timer");
            }
        }
        panic!("the live stream never settled");
    }
}

/// `live_stream`: fuzzer bytes as a sequence of [`LiveStep`]s for a [`LiveSim`], then
/// [`LiveSim::settle`].
///
/// Oracles: no message is delivered twice or out of the broker's order, across any sequence of
/// disconnects, replays, resets, backfills and database swaps; backoff stays within 1 s - 20 %
/// and 30 s + 20 %; after the faults stop, everything in the broker's log is delivered.
pub fn live_ops(data: &[u8]) {
    let mut input = Input::new(data);
    let seed = u64::from(input.byte());
    let mut sim = LiveSim::new(seed);
    let mut steps = 0;
    while !input.is_empty() && steps < 2_000 {
        steps += 1;
        let step = match input.below(14) {
            0..=2 => LiveStep::Push,
            3 => LiveStep::Tick(u16::from(input.byte()) * 8),
            4 => LiveStep::Accept,
            5 => LiveStep::Refuse,
            6 | 7 => LiveStep::Feed(input.byte() % 8),
            8 => LiveStep::Keepalive,
            9 => LiveStep::Drop,
            10 => LiveStep::Answer,
            11 => LiveStep::FailFetch,
            12 => match input.below(3) {
                0 => LiveStep::Restart,
                1 => LiveStep::Restore(input.byte()),
                _ => LiveStep::Fresh,
            },
            _ => LiveStep::Tick(u16::from(input.byte())),
        };
        sim.step(&step);
    }
    sim.settle();
}

/// Sign-in pieces under arbitrary input: base32 text, TOTP codes and a sequence of enrollment
/// operations. Format: byte 0 splits the rest into a text part (`data[1..1 + byte0]`, fed to
/// [`crate::signin::totp::base32_decode`] and as a code to `verify`) and an op part, read in
/// 3-byte ops `[kind, a, b]` on an [`crate::signin::enroll::EnrollStore`].
///
/// Oracles: nothing panics; a decodable base32 text re-encodes to a text decoding to the same
/// bytes; an accepted TOTP step is after the last one; every approved grant leaves the store
/// exactly once (handed to the device or revoked), never from an expired enrollment; user codes
/// stay unique among live enrollments and no address holds more than its bound.
pub fn signin_ops(data: &[u8]) {
    use crate::domain::permission::PermissionSet;
    use crate::signin::enroll::{EnrollConfig, EnrollEvent, EnrollStore, PollOutcome};
    use crate::signin::totp;

    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let (text, ops) = rest.split_at(usize::from(split).min(rest.len()));
    let text = String::from_utf8_lossy(text);
    if let Ok(bytes) = totp::base32_decode(&text) {
        assert_eq!(
            totp::base32_decode(&totp::base32_encode(&bytes)).as_deref(),
            Ok(&bytes[..])
        );
        if let Ok(step) = totp::verify(&bytes, &text, 1_700_000_000, Some(56_666_666)) {
            assert!(step > 56_666_666);
        }
    }

    let config = EnrollConfig::default();
    let mut store: EnrollStore<u32> = EnrollStore::new(config);
    let mut now = 1_700_000_000u64;
    // (device code, user code, expires_at) of every creation, newest last.
    let mut created: Vec<(String, String, u64)> = Vec::new();
    let mut approved: BTreeSet<u32> = BTreeSet::new();
    let mut left: Vec<u32> = Vec::new();
    let mut next_grant = 0u32;
    let mut next_device = 0u8;
    let live_expiry = |created: &[(String, String, u64)],
                       pick: &dyn Fn(&(String, String, u64)) -> bool| {
        created.iter().rev().find(|c| pick(c)).map(|c| c.2)
    };
    for op in ops.chunks_exact(3) {
        let (kind, a, b) = (op[0] % 6, op[1], op[2]);
        let pick = created.get(usize::from(a) % created.len().max(1)).cloned();
        match (kind, pick) {
            (0, _) => {
                next_device = next_device.wrapping_add(1);
                let address = format!("10.0.0.{}", b % 4);
                if let Ok(c) = store.create(&[next_device; 32], &[a % 8; 8], &address, "l", now) {
                    created.push((c.device_code, c.user_code, c.expires_at));
                }
            }
            (1, Some((device, _, _))) => {
                if let PollOutcome::Approved { grant, .. } = store.poll(&device, now) {
                    let exp = live_expiry(&created, &|c| c.0 == device);
                    assert!(
                        exp.is_some_and(|e| now < e),
                        "grant handed over after expiry"
                    );
                    left.push(grant);
                }
            }
            (2, Some((_, user, _))) => {
                next_grant += 1;
                let perms = if b % 8 == 0 {
                    PermissionSet::default()
                } else {
                    PermissionSet::all()
                };
                if store.approve(&user, perms, "m", next_grant, now).is_ok() {
                    assert!(b % 8 != 0, "approved without members.manage");
                    let exp = live_expiry(&created, &|c| c.1 == user);
                    assert!(exp.is_some_and(|e| now < e), "approved after expiry");
                    approved.insert(next_grant);
                }
            }
            (3, Some((_, user, _))) => {
                let _ = store.deny(&user, PermissionSet::all(), "no", now);
            }
            (4, _) => now += u64::from(a) * u64::from(b % 8),
            _ => store.handle_timeout(now),
        }
        while let Some(EnrollEvent::Revoke { grant, .. }) = store.poll_output() {
            left.push(grant);
        }
        let pending = store.pending(now);
        let codes: BTreeSet<&String> = pending.iter().map(|p| &p.user_code).collect();
        assert_eq!(codes.len(), pending.len(), "duplicate user code");
        for addr in 0..4 {
            let address = format!("10.0.0.{addr}");
            let held = pending.iter().filter(|p| p.address == address).count();
            assert!(held <= config.max_pending_per_address);
        }
    }
    store.handle_timeout(u64::MAX);
    while let Some(EnrollEvent::Revoke { grant, .. }) = store.poll_output() {
        left.push(grant);
    }
    let unique: BTreeSet<u32> = left.iter().copied().collect();
    assert_eq!(unique.len(), left.len(), "a grant left twice");
    assert_eq!(unique, approved, "an approved grant never left");
}

/// An [`Uploader`] with small caps, a clock, and an account of every event it was given.
pub struct UploadSim {
    up: Uploader,
    config: UploaderConfig,
    now: Instant,
    next_ts: u64,
    /// Timestamps of accepted events, in order.
    accepted: Vec<u64>,
    delivered: Vec<u64>,
    /// The batch on the wire: id and its event timestamps.
    flying: Option<(u64, Vec<u64>)>,
    evicted: usize,
    rejected: usize,
    dropped: usize,
    closed: bool,
}

impl UploadSim {
    /// Caps: 20 events / 2000 bytes queued, batches of 5 events / 600 bytes, 500 ms linger,
    /// backoff 200 ms to 3.2 s, 5 s close deadline.
    pub fn new(seed: u64) -> Self {
        let config = UploaderConfig {
            max_events: 20,
            max_bytes: 2000,
            batch_events: 5,
            batch_bytes: 600,
            linger: Duration::from_millis(500),
            backoff_start: Duration::from_millis(200),
            backoff_max: Duration::from_millis(3200),
            close_deadline: Duration::from_secs(5),
            seed,
        };
        Self {
            up: Uploader::new(config.clone()),
            config,
            now: Instant::now(),
            next_ts: 1,
            accepted: Vec::new(),
            delivered: Vec::new(),
            flying: None,
            evicted: 0,
            rejected: 0,
            dropped: 0,
            closed: false,
        }
    }

    /// Queues an event whose id has `pad` extra characters.
    pub fn enqueue(&mut self, pad: usize) {
        let ts = self.next_ts;
        self.next_ts += 1;
        let event = ActivityEvent::ObjectiveOpen {
            ts,
            objective_id: format!("o{ts}{}", "x".repeat(pad)),
        };
        let size = serde_json::to_string(&event).map_or(0, |j| j.len());
        let before = self.logs_refused();
        self.up.enqueue(&event, self.now);
        let refused = self.logs_refused() > before;
        assert_eq!(
            refused,
            self.closed || size > self.config.max_bytes,
            "only a closed uploader or an event over the whole cap refuses"
        );
        if !refused {
            self.accepted.push(ts);
        }
        self.step();
    }

    fn logs_refused(&mut self) -> usize {
        let mut refused = 0;
        while let Some(log) = self.up.poll_log() {
            match log {
                UploaderLog::Refused { .. } | UploaderLog::Closed => refused += 1,
                UploaderLog::Evicted { events } => self.evicted += events,
                UploaderLog::Rejected { events, .. } => self.rejected += events,
                UploaderLog::DroppedAtClose { events } => self.dropped += events,
                UploaderLog::Retrying { delay, .. } => assert!(
                    delay >= self.config.backoff_start * 4 / 5
                        && delay <= self.config.backoff_max * 6 / 5,
                    "backoff {delay:?} out of range"
                ),
            }
        }
        refused
    }

    /// Time passes by `ms`, firing timers on the way.
    pub fn advance(&mut self, ms: u64) {
        self.advance_to(self.now + Duration::from_millis(ms));
    }

    fn advance_to(&mut self, target: Instant) {
        while let Some(at) = self.up.poll_timeout() {
            if at > target {
                break;
            }
            self.now = self.now.max(at);
            self.up.handle_timeout(self.now);
            self.step();
            if self.flying.is_some() && self.up.poll_timeout() == Some(at) {
                break;
            }
        }
        self.now = target;
        self.up.handle_timeout(self.now);
        self.step();
    }

    /// The batch on the wire ends with `result`.
    pub fn answer(&mut self, result: UploadResult) {
        let Some((id, events)) = self.flying.take() else {
            return;
        };
        let ok = matches!(result, UploadResult::Status(200..=299));
        self.up.handle_result(id, result, self.now);
        if ok {
            self.delivered.extend(events);
        }
        self.step();
    }

    /// `close`.
    pub fn close(&mut self) {
        self.closed = true;
        self.up.close(self.now);
        self.step();
    }

    /// Sends what is due and checks the caps and the books.
    fn step(&mut self) {
        if self.flying.is_none()
            && let Some(batch) = self.up.poll_transmit(self.now)
        {
            let upload = ActivityUpload::parse(&batch.body).expect("a batch is a valid upload");
            assert_eq!(upload.events.len(), batch.events);
            assert!(batch.events >= 1 && batch.events <= self.config.batch_events);
            let json_bytes = batch.body.len() - 13 - (batch.events - 1);
            assert!(
                batch.events == 1 || json_bytes <= self.config.batch_bytes,
                "batch of {json_bytes} bytes"
            );
            let ts: Vec<u64> = upload.events.iter().map(ActivityEvent::ts).collect();
            assert!(ts.windows(2).all(|w| w[0] < w[1]), "reordered batch {ts:?}");
            if let (Some(first), Some(last)) = (ts.first(), self.delivered.last()) {
                assert!(first > last, "batch {ts:?} after delivered {last}");
            }
            self.flying = Some((batch.id, ts));
        }
        self.logs_refused();
        assert!(self.up.queued_events() <= self.config.max_events);
        assert!(self.up.queued_bytes() <= self.config.max_bytes);
        let flying = self.flying.as_ref().map_or(0, |(_, e)| e.len());
        assert_eq!(
            self.up.in_flight_events(),
            if self.up.is_done() { 0 } else { flying }
        );
        if self.up.is_done() {
            self.flying = None;
        }
        let in_flight = self.up.in_flight_events();
        assert_eq!(
            self.delivered.len()
                + self.evicted
                + self.rejected
                + self.dropped
                + self.up.queued_events()
                + in_flight,
            self.accepted.len(),
            "an event went missing"
        );
        if self.evicted + self.rejected + self.dropped == 0 {
            assert_eq!(
                self.delivered[..],
                self.accepted[..self.delivered.len()],
                "delivered out of order"
            );
        }
        if self.up.in_flight_events() == 0 && self.up.queued_events() > 0 && !self.up.is_done() {
            let at = self.up.poll_timeout().expect("queued events with no timer");
            let longest = self.config.linger.max(self.config.backoff_max * 6 / 5);
            assert!(at <= self.now + longest, "next upload too far away");
        }
    }

    /// Closes (if still open) and answers every upload with 200 until the uploader is done.
    pub fn settle(&mut self) {
        let fresh_close = !self.closed;
        self.close();
        for _ in 0..10_000 {
            if self.up.is_done() {
                if fresh_close {
                    assert_eq!(self.dropped, 0, "a healthy broker got everything at close");
                }
                assert_eq!(
                    self.delivered.len() + self.evicted + self.rejected + self.dropped,
                    self.accepted.len()
                );
                return;
            }
            if self.flying.is_some() {
                self.answer(UploadResult::Status(200));
            } else if let Some(at) = self.up.poll_timeout() {
                self.advance_to(at.max(self.now));
            } else {
                panic!("closing uploader with nothing to do");
            }
        }
        panic!("the uploader never finished: {:?}", self.up);
    }
}

/// `trace_upload`: fuzzer bytes as enqueues (of assorted sizes, some over the whole cap),
/// clock steps, upload results (200, 500, 429, 400, network error) and a close, on an
/// [`UploadSim`]; then [`UploadSim::settle`].
///
/// Oracles: the queue caps hold after every step; batches respect their caps and carry events
/// in order; every accepted event is delivered, evicted, rejected with its batch or dropped at
/// the close deadline — never lost otherwise; with no eviction, rejection or drop, the
/// delivered events are exactly the accepted ones in order; a queue never waits without a
/// timer; closing with a healthy broker delivers everything.
pub fn trace_upload(data: &[u8]) {
    let mut input = Input::new(data);
    let mut sim = UploadSim::new(u64::from(input.byte()));
    let mut steps = 0;
    while !input.is_empty() && steps < 2_000 {
        steps += 1;
        match input.below(16) {
            0..=4 => {
                let pad = usize::from(input.byte());
                sim.enqueue(if pad == 255 { 2100 } else { pad * 2 });
            }
            5 | 6 => sim.advance(u64::from(input.byte()) * 20),
            7..=9 => sim.answer(UploadResult::Status(200)),
            10 => sim.answer(UploadResult::Status(500)),
            11 => sim.answer(UploadResult::Status(429)),
            12 => sim.answer(UploadResult::Status(400)),
            13 => sim.answer(UploadResult::Network("refused".into())),
            14 => sim.advance(u64::from(input.byte())),
            _ => {
                if input.below(8) == 0 {
                    sim.close();
                }
            }
        }
    }
    sim.settle();
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
}

/// Splits `stream` into chunks whose sizes follow a small generator seeded by `seed` (1 to 64
/// bytes, so chunk borders fall inside `\r\n`, inside UTF-8 sequences and inside fields).
fn chunked(stream: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut state = u32::from(seed) | 1;
    let mut chunks = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let size = ((state >> 16) as usize % 64 + 1).min(rest.len());
        let (chunk, tail) = rest.split_at(size);
        chunks.push(chunk);
        rest = tail;
    }
    chunks
}

/// Everything an [`SseParser`] yields for `chunks`, then its last event id and retry.
fn sse_parse(
    cap: usize,
    chunks: &[&[u8]],
) -> (Vec<crate::codec::sse::SseItem>, Option<String>, Option<u64>) {
    let mut parser = crate::codec::sse::SseParser::new(cap);
    let mut items = Vec::new();
    for chunk in chunks {
        parser.push(chunk);
        while let Some(item) = parser.decode() {
            items.push(item);
            assert!(items.len() <= MAX_POLLS, "next() does not terminate");
        }
    }
    (
        items,
        parser.last_event_id().map(str::to_owned),
        parser.retry_ms(),
    )
}

/// Printable ASCII for a field value built from fuzzer bytes (no line ends, no NUL).
fn printable(bytes: &[u8]) -> String {
    bytes.iter().map(|b| char::from(b' ' + b % 95)).collect()
}

/// `sse`: fuzzer bytes through an [`crate::codec::sse::SseParser`]. Byte 0 picks the mode. Even: the
/// rest is a raw stream (byte 1 the cap: `16 + 4 * byte1`; byte 2 the chunking). Odd: the rest
/// describes events (name, data lines, id, comments, `\n` or `\r\n` line ends) that are
/// encoded as `text/event-stream` and parsed under a cap they never reach.
///
/// Oracles: raw — the items, last event id and retry are the same however the stream is
/// chunked; no event's data exceeds the cap; ids hold no NUL; there are no more dispatches (events
/// and oversized drops) than line ends. Encoded — exactly the encoded events come out, in order,
/// with the id in force, whole or chunked.
pub fn sse_stream(data: &[u8]) {
    let mut input = Input::new(data);
    if input.byte().is_multiple_of(2) {
        let cap = 16 + 4 * usize::from(input.byte());
        let seed = input.byte();
        let stream = &data[data.len().min(3)..];
        let whole = sse_parse(cap, &[stream]);
        let parts = sse_parse(cap, &chunked(stream, seed));
        assert_eq!(whole, parts, "chunking changed what the parser saw");
        let line_ends = stream.iter().filter(|b| **b == b'\n').count();
        assert!(whole.0.len() <= line_ends, "more items than line ends");
        for item in &whole.0 {
            if let crate::codec::sse::SseItem::Event(event) = item {
                assert!(event.data.len() <= cap, "event data over the cap");
                assert!(!event.event.is_empty());
                assert!(event.id.as_ref().is_none_or(|id| !id.contains('\0')));
            }
        }
        return;
    }
    let mut stream = String::new();
    let mut expected = Vec::new();
    let mut id: Option<String> = None;
    let seed = input.byte();
    let mut events = 0;
    while !input.is_empty() && events < 64 {
        events += 1;
        let eol = if input.byte().is_multiple_of(2) {
            "\n"
        } else {
            "\r\n"
        };
        let flags = input.byte();
        if flags & 1 != 0 {
            stream.push_str(&format!(":{}{eol}", printable(input.bytes(8))));
        }
        let name = printable(input.bytes(8));
        if flags & 2 != 0 {
            stream.push_str(&format!("event: {name}{eol}"));
        }
        if flags & 4 != 0 {
            let value = printable(input.bytes(8));
            stream.push_str(&format!("id: {value}{eol}"));
            id = (!value.is_empty()).then_some(value);
        }
        let lines: Vec<String> = (0..input.below(4))
            .map(|_| printable(input.bytes(16)))
            .collect();
        for line in &lines {
            stream.push_str(&format!("data: {line}{eol}"));
        }
        stream.push_str(eol);
        if !lines.is_empty() {
            expected.push(crate::codec::sse::SseItem::Event(
                crate::codec::sse::SseEvent {
                    event: if flags & 2 != 0 && !name.is_empty() {
                        name
                    } else {
                        "message".to_owned()
                    },
                    data: lines.join("\n"),
                    id: id.clone(),
                },
            ));
        }
    }
    let cap = crate::codec::sse::DEFAULT_MAX_EVENT_BYTES;
    let whole = sse_parse(cap, &[stream.as_bytes()]);
    assert_eq!(whole.0, expected, "stream:\n{stream}");
    assert_eq!(whole.1, id);
    let parts = sse_parse(cap, &chunked(stream.as_bytes(), seed));
    assert_eq!(parts, whole, "chunking changed what the parser saw");
}

/// `tracker`: fuzzer bytes as 2-byte operations `[kind, arg]` on an
/// [`crate::session::tracker::ObjectivesTracker`] over a "true" open set that changes only together with
/// a trigger (as objective events do): trigger (maybe changing the truth), time passing
/// (`arg` ms), the refresh in flight answered with the truth as it was when that refresh started,
/// or failed. Then the tracker settles: time runs to every timer and every refresh is answered.
///
/// Oracles: one refresh in flight at a time; a refresh starts only once [`crate::session::tracker::DEBOUNCE`]
/// passed since the last trigger (or right after the previous refresh, when a timer fired during
/// it); `ListChanged` exactly when an answered set differs from the one known before; a timer is
/// never left in the past; after settling nothing is pending, and unless a refresh failed since
/// the last trigger the tracker knows the true set (no change was missed).
pub fn tracker_ops(data: &[u8]) {
    use crate::session::tracker::{DEBOUNCE, ObjectivesTracker, TrackerOutput};
    let mut input = Input::new(data);
    let start = Instant::now();
    let mut now = start;
    let mut truth: Vec<u8> = Vec::new();
    let mut tracker: ObjectivesTracker<u8> = ObjectivesTracker::new(truth.clone());
    let mut in_flight = false;
    // What the refresh in flight read: the truth when it started (a fetch sees the state of
    // its time; a change after that needs the next refresh).
    let mut read = truth.clone();
    let mut last_trigger: Option<Instant> = None;
    // A timer fired while a refresh was in flight: the next refresh may start without a wait.
    let mut owed = false;
    // A refresh failed since the last trigger (a failed refresh keeps the old set, by design).
    let mut failed = false;
    let drain = |tracker: &mut ObjectivesTracker<u8>,
                 in_flight: &mut bool,
                 read: &mut Vec<u8>,
                 truth: &[u8],
                 owed: &mut bool,
                 last_trigger: Option<Instant>,
                 now: Instant,
                 before: &[u8]| {
        let mut polls = 0;
        while let Some(out) = tracker.poll_output() {
            polls += 1;
            assert!(polls <= MAX_POLLS, "poll_output does not terminate");
            match out {
                TrackerOutput::Refresh => {
                    assert!(!*in_flight, "a second refresh while one is in flight");
                    let waited = last_trigger.is_some_and(|t| now >= t + DEBOUNCE);
                    assert!(waited || *owed, "a refresh before the debounce");
                    *owed = false;
                    *in_flight = true;
                    *read = truth.to_vec();
                }
                TrackerOutput::ListChanged => {
                    assert_ne!(tracker.open(), before, "ListChanged without a change");
                }
            }
        }
    };
    let mut steps = 0;
    while !input.is_empty() && steps < 2_000 {
        steps += 1;
        let (kind, arg) = (input.below(5), input.byte());
        let before = tracker.open().to_vec();
        match kind {
            0 => {
                if arg % 2 == 1 {
                    truth = (0..arg % 5).collect();
                }
                tracker.handle_trigger(now);
                last_trigger = Some(now);
                failed = false;
            }
            1 | 2 => {
                now += Duration::from_millis(u64::from(arg));
                if tracker.poll_timeout().is_some_and(|at| at <= now) {
                    if in_flight {
                        owed = true;
                    }
                    tracker.handle_timeout(now);
                }
            }
            3 if in_flight => {
                in_flight = false;
                tracker.handle_refreshed(Some(read.clone()), now);
                assert_eq!(tracker.open(), read);
                let changed = before != read;
                let mut saw_change = false;
                let mut polls = 0;
                while let Some(out) = tracker.poll_output() {
                    polls += 1;
                    assert!(polls <= MAX_POLLS, "poll_output does not terminate");
                    match out {
                        TrackerOutput::ListChanged => saw_change = true,
                        TrackerOutput::Refresh => {
                            assert!(owed, "a refresh after a refresh nobody asked for");
                            owed = false;
                            in_flight = true;
                            read = truth.clone();
                        }
                    }
                }
                assert_eq!(
                    saw_change, changed,
                    "ListChanged must say whether the set changed"
                );
                continue;
            }
            4 if in_flight => {
                in_flight = false;
                failed = true;
                tracker.handle_refreshed(None, now);
                assert_eq!(tracker.open(), before, "a failed refresh changed the set");
            }
            _ => {}
        }
        drain(
            &mut tracker,
            &mut in_flight,
            &mut read,
            &truth,
            &mut owed,
            last_trigger,
            now,
            &before,
        );
        assert!(
            tracker.poll_timeout().is_none_or(|at| at > now),
            "a timer left in the past"
        );
    }
    // Settle: run every timer, answer every refresh with the truth.
    for _ in 0..16 {
        let before = tracker.open().to_vec();
        if in_flight {
            in_flight = false;
            tracker.handle_refreshed(Some(read.clone()), now);
        } else if let Some(at) = tracker.poll_timeout() {
            now = now.max(at);
            tracker.handle_timeout(now);
        } else {
            break;
        }
        let mut polls = 0;
        while let Some(out) = tracker.poll_output() {
            polls += 1;
            assert!(polls <= MAX_POLLS, "poll_output does not terminate");
            match out {
                TrackerOutput::Refresh => {
                    assert!(!in_flight, "a second refresh while one is in flight");
                    in_flight = true;
                    read = truth.clone();
                }
                TrackerOutput::ListChanged => assert_ne!(tracker.open(), before),
            }
        }
    }
    assert!(
        !in_flight && tracker.poll_timeout().is_none(),
        "the tracker never settled"
    );
    // The truth changes only with a trigger, and every trigger is followed by a refresh that
    // starts after it: unless one failed since, the last answer is the truth.
    if !failed {
        assert_eq!(tracker.open(), truth, "a change was missed");
    }
}

#[cfg(test)]
mod sse_tracker_oracle_tests {
    use proptest::prelude::*;

    use super::*;
    use crate::test_support::proptest_config;

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
}

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
            CallToolBridgeEvent, CallToolBridgeOutput as Out, Peer,
        };
        let mut polls = 0;
        while let Some(output) = bridge.poll_output() {
            polls += 1;
            assert!(polls <= MAX_POLLS, "poll_output does not terminate");
            assert!(!self.exited, "output after Exit: {output:?}");
            match output {
                Out::Transmit {
                    to: Peer::Agent,
                    bytes,
                } => self.agent_line(&bytes),
                Out::Transmit {
                    to: Peer::Parent,
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
                if let Some(reply) = reply {
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
/// arriving after the next call went out is indistinguishable from that call's answer), a reply
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
                }
            }
            10 if o.link == CtbLink::Open => {
                bridge.handle_parent_closed(o.now);
                o.link = CtbLink::Idle;
                o.in_flight = None;
                o.late.clear();
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
    app: BTreeMap<u64, (Option<Result<serde_json::Value, String>>, usize)>,
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
                        *answer = Some(Err(message.to_owned()));
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
