//! The oracle of the `runner_session` fuzz target: bridges and an application against a [`RunnerSession`](crate::session::runner::RunnerSession).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::{Input, MAX_POLLS};
use crate::codec::frame::decode_frame;
use crate::codec::jsonrpc::Outcome;
use crate::dialect::mcp;
use crate::session::runner::{
    BridgePolicy, IpcConnId, Origin, RunnerConfig, RunnerOutput, RunnerSession,
};

/// `runner_session`: bridges connecting, sending and going away, and an application answering,
/// in arbitrary order.
///
/// Oracles: a request is handed to the application at most once per (connection, id) while in
/// flight; a response frame goes only to the connection that asked; nothing is transmitted to a
/// connection after it was closed; every frame fits the cap; at most one bridge is attached
/// (unless the policy is `AllowMany`); an outsider or a foreign bridge never gets a notification;
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
    let mut conns: Vec<IpcConnId> = Vec::new();
    let mut closed: BTreeSet<IpcConnId> = BTreeSet::new();
    let mut app_pending: Vec<(IpcConnId, u64)> = Vec::new();
    let mut outsiders: BTreeSet<IpcConnId> = BTreeSet::new();

    while !input.is_empty() {
        now += Duration::from_micros(u64::from(input.byte()));
        match input.byte() % 9 {
            0 => {
                let origin = match input.byte() % 6 {
                    0 | 1 => Origin::Outsider,
                    2..=4 => Origin::Agent,
                    _ => Origin::Client(1 + u32::from(input.byte() % 3)),
                };
                let foreign = session.foreign_count();
                let conn = session.handle_connect(origin, now);
                if origin == Origin::Outsider || session.foreign_count() > foreign {
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
    closed: &BTreeSet<IpcConnId>,
    newly_closed: &mut Vec<IpcConnId>,
    app_pending: &mut Vec<(IpcConnId, u64)>,
    outsiders: &BTreeSet<IpcConnId>,
) {
    let mut polls = 0;
    let mut asked_here: BTreeMap<IpcConnId, BTreeSet<u64>> = BTreeMap::new();
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
