//! The runner session and bridge sessions together, over modelled sockets: an agent that starts
//! and drops bridges at any moment, a runner that keeps notifying, bytes that arrive in any
//! split. Every notification reaches the agent exactly once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::mcp_bridge::{BridgeConfig, BridgeOutput, BridgePeer, BridgeSession};
use super::runner::{BridgePolicy, IpcConnId, Origin, RunnerConfig, RunnerOutput, RunnerSession};
use crate::codec::json::RawJson;
use crate::codec::jsonrpc::Outcome;

/// One bridge process and its two pipes.
struct Bridge {
    conn: IpcConnId,
    session: BridgeSession,
    /// Runner → bridge bytes not read yet.
    to_bridge: Vec<u8>,
    /// Bridge → runner bytes not read yet.
    to_runner: Vec<u8>,
    /// The runner closed its end (after what is in `to_bridge`).
    runner_closed: bool,
    /// The bridge process exited (after what is in `to_runner`).
    exited: bool,
    /// The runner has seen the end of this connection.
    gone: bool,
}

#[derive(Debug, Clone)]
enum Op {
    Notify,
    Connect,
    ToBridge { which: usize, bytes: usize },
    ToRunner { which: usize, bytes: usize },
    AgentEof { which: usize },
    Tick { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Notify),
        1 => Just(Op::Connect),
        4 => (0usize..4, 1usize..400).prop_map(|(which, bytes)| Op::ToBridge { which, bytes }),
        4 => (0usize..4, 1usize..400).prop_map(|(which, bytes)| Op::ToRunner { which, bytes }),
        1 => (0usize..4).prop_map(|which| Op::AgentEof { which }),
        2 => (1u64..200).prop_map(|ms| Op::Tick { ms }),
    ]
}

struct World {
    runner: RunnerSession,
    bridges: Vec<Bridge>,
    now: Instant,
    next: u64,
    /// How many times the agent got each notification.
    received: BTreeMap<u64, usize>,
}

const TOOLS: &str = r#"{"tools":[]}"#;

impl World {
    fn new() -> World {
        World {
            runner: RunnerSession::new(RunnerConfig {
                policy: BridgePolicy::DisplaceOld,
                max_queued_notifications: 100_000,
                ..RunnerConfig::default()
            }),
            bridges: Vec::new(),
            now: Instant::now(),
            next: 0,
            received: BTreeMap::new(),
        }
    }

    fn live(&self, which: usize) -> Option<usize> {
        let live: Vec<usize> = (0..self.bridges.len())
            .filter(|i| !self.bridges[*i].gone)
            .collect();
        (!live.is_empty()).then(|| live[which % live.len()])
    }

    fn connect(&mut self) {
        let conn = self.runner.handle_connect(Origin::Agent, self.now);
        let mut session = BridgeSession::new(BridgeConfig {
            start_grace: Duration::from_millis(50),
            ..BridgeConfig::default()
        });
        // The agent's handshake, as Claude Code does it.
        for line in [
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        ] {
            session.handle_agent_bytes(format!("{line}\n").as_bytes(), self.now);
        }
        self.bridges.push(Bridge {
            conn,
            session,
            to_bridge: Vec::new(),
            to_runner: Vec::new(),
            runner_closed: false,
            exited: false,
            gone: false,
        });
        self.settle();
    }

    /// Routes every output until nothing moves.
    fn settle(&mut self) {
        loop {
            let mut moved = false;
            while let Some(o) = self.runner.poll_output() {
                moved = true;
                match o {
                    RunnerOutput::Transmit { to, bytes } => {
                        if let Some(b) = self.bridges.iter_mut().find(|b| b.conn == to) {
                            assert!(!b.runner_closed, "bytes after close");
                            b.to_bridge.extend_from_slice(&bytes);
                        }
                    }
                    RunnerOutput::Close { conn } => {
                        if let Some(b) = self.bridges.iter_mut().find(|b| b.conn == conn) {
                            b.runner_closed = true;
                        }
                    }
                    RunnerOutput::Request(req) => {
                        let outcome = Outcome::Result(
                            RawJson::from_text(TOOLS).unwrap_or_else(|_| unreachable!()),
                        );
                        let _ = self.runner.respond(req.conn, req.id, outcome, self.now);
                    }
                    RunnerOutput::Event(_) => {}
                }
            }
            for b in &mut self.bridges {
                while let Some(o) = b.session.poll_output() {
                    moved = true;
                    match o {
                        BridgeOutput::Transmit {
                            to: BridgePeer::Agent,
                            bytes,
                        } => {
                            let v: serde_json::Value =
                                serde_json::from_slice(&bytes).unwrap_or_default();
                            if let Some(n) = v["params"]["n"].as_u64() {
                                *self.received.entry(n).or_default() += 1;
                            }
                        }
                        BridgeOutput::Transmit {
                            to: BridgePeer::Runner,
                            bytes,
                        } => {
                            if !b.exited {
                                b.to_runner.extend_from_slice(&bytes);
                            }
                        }
                        BridgeOutput::Exit(_) => b.exited = true,
                        BridgeOutput::Event(_) => {}
                    }
                }
            }
            // Ends the sockets whose bytes were all read.
            for i in 0..self.bridges.len() {
                let b = &mut self.bridges[i];
                if b.exited && b.to_runner.is_empty() && !b.gone {
                    b.gone = true;
                    let conn = b.conn;
                    self.runner.handle_closed(conn, self.now);
                    moved = true;
                } else if b.runner_closed && b.to_bridge.is_empty() && !b.exited {
                    b.session.handle_runner_closed(self.now);
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Notify => {
                let params = format!(r#"{{"n":{}}}"#, self.next);
                self.next += 1;
                let raw = RawJson::from_text(&params).unwrap_or_else(|_| unreachable!());
                self.runner
                    .notify("notifications/claude/channel", Some(raw), self.now);
            }
            Op::Connect => self.connect(),
            Op::ToBridge { which, bytes } => {
                if let Some(i) = self.live(which) {
                    let b = &mut self.bridges[i];
                    let n = bytes.min(b.to_bridge.len());
                    let chunk: Vec<u8> = b.to_bridge.drain(..n).collect();
                    if !b.exited {
                        b.session.handle_runner_bytes(&chunk, self.now);
                    }
                }
            }
            Op::ToRunner { which, bytes } => {
                if let Some(i) = self.live(which) {
                    let b = &mut self.bridges[i];
                    let n = bytes.min(b.to_runner.len());
                    let chunk: Vec<u8> = b.to_runner.drain(..n).collect();
                    let conn = b.conn;
                    self.runner.handle_bytes(conn, &chunk, self.now);
                }
            }
            Op::AgentEof { which } => {
                if let Some(i) = self.live(which) {
                    self.bridges[i].session.handle_agent_eof(self.now);
                }
            }
            Op::Tick { ms } => {
                self.now += Duration::from_millis(ms);
                for b in &mut self.bridges {
                    if b.session.poll_timeout().is_some_and(|t| t <= self.now) {
                        b.session.handle_timeout(self.now);
                    }
                }
            }
        }
        self.settle();
    }

    /// Lets everything in flight arrive, with one bridge left to take what is still owed.
    fn quiesce(&mut self) {
        for _ in 0..200 {
            if self.runner.attached().is_none() {
                self.connect();
            }
            for i in 0..self.bridges.len() {
                let b = &mut self.bridges[i];
                let chunk = std::mem::take(&mut b.to_bridge);
                if !b.exited && !chunk.is_empty() {
                    b.session.handle_runner_bytes(&chunk, self.now);
                }
                let back = std::mem::take(&mut self.bridges[i].to_runner);
                if !back.is_empty() {
                    let conn = self.bridges[i].conn;
                    self.runner.handle_bytes(conn, &back, self.now);
                }
            }
            self.apply(Op::Tick { ms: 100 });
        }
    }
}

proptest! {
    #![proptest_config(crate::test_support::proptest_config("handover"))]

    /// Bridges come and go under a stream of notifications, bytes arriving in any split: once
    /// things settle every notification was written to the agent exactly once.
    #[test]
    fn every_notification_reaches_the_agent_exactly_once(ops in prop::collection::vec(op(), 1..120)) {
        let mut w = World::new();
        w.connect();
        for op in ops {
            w.apply(op);
        }
        w.quiesce();
        for n in 0..w.next {
            prop_assert_eq!(w.received.get(&n).copied().unwrap_or(0), 1, "notification {} (of {})", n, w.next);
        }
    }
}
