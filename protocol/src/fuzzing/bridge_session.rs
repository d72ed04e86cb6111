//! The oracle of the `bridge_session` fuzz target: an agent and a runner against a [`BridgeSession`](crate::session::mcp_bridge::BridgeSession).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::{Input, MAX_POLLS};
use crate::codec::frame::decode_frame;
use crate::codec::jsonrpc;
use crate::codec::jsonrpc::Message;
use crate::session::mcp_bridge::{BridgeConfig, BridgeOutput, BridgePeer, BridgeSession};

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
