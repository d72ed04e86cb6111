//! The bridge session: the agent's MCP stdio on one side, the runner's IPC socket on the other.
//!
//! ```text
//!   agent ──stdin──▶ handle_agent_bytes ─┐      ┌─ Transmit { to: Runner } ─▶ socket
//!                                        ├─ BridgeSession ┤
//!   runner ─socket─▶ handle_runner_bytes ┘      └─ Transmit { to: Agent } ───▶ stdout
//! ```
//!
//! What the bridge does:
//! - answers `initialize` (capabilities `experimental: {"claude/channel": {}}` and
//!   `tools: {listChanged: true}`, the client's protocol version when supported) and `ping` itself;
//! - forwards every other request as an `mcp_request` under its own monotonic id and answers the
//!   agent under the agent's original id with the runner's result or error, code included;
//! - relays `mcp_notification` frames as JSON-RPC notifications — from start-up until the agent
//!   is ready (`notifications/initialized` sent, first `tools/list` answered, then Claude Code
//!   asking `tools/list` again after a `notifications/tools/list_changed` probe, or
//!   [`START_GRACE`] for other clients) they are held, in order and bounded (see [`startup`]);
//! - acknowledges each numbered notification (`ack{seq}`) once it is written to the agent, and
//!   says so first thing on the socket (`ack{seq:0}`); a notification it never wrote (held at
//!   teardown, refused by a full hold, or unread when it closed) stays unacknowledged, and the
//!   runner gives it to the next bridge;
//! - drops a pending request when the agent sends `notifications/cancelled` for it;
//! - answers a request whose frame would exceed the cap with `-32603` without sending it, and a
//!   malformed agent line with `-32700` / `-32600`;
//! - tears down once, on the agent's EOF, the runner's `shutdown`, the socket closing, or a
//!   signal: every pending request is answered with an error, a `shutdown` frame goes to the runner
//!   when the socket is still usable, and [`BridgeOutput::Exit`] is the last output.
//!
//! Every request the agent sends gets exactly one answer, except one it cancelled itself.
//! A request waits for its answer or for teardown. The one timer is the start-up hold's (its
//! grace, probes and ceiling: [`BridgeSession::poll_timeout`] /
//! [`BridgeSession::handle_timeout`]).

pub mod startup;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::codec::frame::{
    Ack, Decoded, DropReason, Dropped, Frame, FrameDecoder, FrameKind, MAX_FRAME_BYTES, McpRequest,
    Shutdown, encode_frame,
};
use crate::codec::json::RawJson;
use crate::codec::jsonrpc::{self, INTERNAL_ERROR, Id, Outcome, RpcError};
use crate::codec::line::{Line, LineDecoder};
use crate::dialect::mcp;
use crate::dialect::mcp_face::{AgentLine, McpFace, error_line};
use crate::session::pending::Pending;
use startup::{Due, Offer, StartupHold, Timing};
pub use startup::{
    MAX_HELD_BYTES, MAX_HELD_NOTIFICATIONS, PROBE_CEILING, PROBE_INTERVAL, PROBE_MAX_INTERVAL,
    ReleasedBy, START_GRACE,
};

/// Limits and identity of a bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeConfig {
    /// Cap on an IPC frame, newline included (both directions).
    pub max_frame_bytes: usize,
    /// Cap on one line from the agent. Larger than the frame cap so that a too-large request can
    /// still be read and answered under its own id.
    pub max_agent_line_bytes: usize,
    /// `serverInfo.version` in the `initialize` result.
    pub server_version: String,
    /// How long notifications stay held after the handshake of an agent that is not probed
    /// ([`START_GRACE`]).
    pub start_grace: Duration,
    /// The gap after the first start-up probe ([`PROBE_INTERVAL`]); later gaps double.
    pub probe_interval: Duration,
    /// The longest gap between two start-up probes ([`PROBE_MAX_INTERVAL`]).
    pub probe_max_interval: Duration,
    /// How long a probed agent may take to answer before the hold opens anyway
    /// ([`PROBE_CEILING`]).
    pub probe_ceiling: Duration,
    /// Notifications held at most before the agent is ready ([`MAX_HELD_NOTIFICATIONS`]).
    pub max_held_notifications: usize,
    /// Bytes of notifications held at most before the agent is ready ([`MAX_HELD_BYTES`]).
    pub max_held_bytes: usize,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        Self {
            max_frame_bytes: MAX_FRAME_BYTES,
            max_agent_line_bytes: 16 * MAX_FRAME_BYTES,
            server_version: "0.0.0-dev".into(),
            start_grace: START_GRACE,
            probe_interval: PROBE_INTERVAL,
            probe_max_interval: PROBE_MAX_INTERVAL,
            probe_ceiling: PROBE_CEILING,
            max_held_notifications: MAX_HELD_NOTIFICATIONS,
            max_held_bytes: MAX_HELD_BYTES,
        }
    }
}

/// The bridge's two peers: where a [`BridgeOutput::Transmit`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BridgePeer {
    /// The agent, on the bridge's stdout: one JSON-RPC line (newline included).
    Agent,
    /// The runner, on the IPC socket: one encoded frame.
    Runner,
}

/// Something for the driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BridgeOutput {
    /// Write these bytes to a peer, in order.
    Transmit {
        /// Where the bytes go.
        to: BridgePeer,
        /// One line for the agent, or one frame for the runner.
        bytes: Vec<u8>,
    },
    /// Something worth logging.
    Event(BridgeEvent),
    /// Teardown is complete: flush what was written and exit 0. Always the last output.
    Exit(ExitReason),
}

/// Why the bridge exits.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExitReason {
    /// The agent closed the bridge's stdin.
    AgentClosed,
    /// The runner sent `shutdown`.
    RunnerShutdown {
        /// The reason it gave.
        reason: Option<String>,
    },
    /// The runner's socket closed.
    RunnerClosed,
    /// The bridge was told to stop (SIGINT/SIGTERM).
    Terminated,
}

impl ExitReason {
    /// A short machine-friendly label (`stdio-closed`, `runner-shutdown`, ...).
    pub fn label(&self) -> &'static str {
        match self {
            Self::AgentClosed => "stdio-closed",
            Self::RunnerShutdown { .. } => "runner-shutdown",
            Self::RunnerClosed => "runner-socket-closed",
            Self::Terminated => "terminated",
        }
    }
}

/// Things worth logging; none needs an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BridgeEvent {
    /// A line from the agent was not JSON-RPC; it was answered with an error.
    AgentLineInvalid {
        /// Line length in bytes.
        len: usize,
        /// The error code sent.
        code: i64,
        /// What was wrong.
        detail: String,
    },
    /// A request was forwarded to the runner.
    Forwarded {
        /// Bridge correlation id.
        id: u64,
        /// MCP method.
        method: String,
    },
    /// A forwarded request was answered (by the runner, or with an error at teardown).
    Answered {
        /// Bridge correlation id.
        id: u64,
        /// MCP method.
        method: String,
        /// Time since it was forwarded.
        elapsed: Duration,
        /// Whether the answer was a result (not an error).
        ok: bool,
    },
    /// A request was not sent: its frame would exceed the cap.
    RequestTooLarge {
        /// MCP method.
        method: String,
        /// Encoded frame length.
        len: usize,
        /// The cap.
        max: usize,
    },
    /// The agent cancelled a forwarded request; its late answer will be dropped.
    Cancelled {
        /// Bridge correlation id.
        id: u64,
    },
    /// A notification from the agent that the bridge does not act on.
    AgentNotificationIgnored {
        /// Its method.
        method: String,
    },
    /// A JSON-RPC response from the agent (the bridge never asks the agent anything).
    AgentResponseIgnored,
    /// A line from the runner was dropped.
    FrameDropped(Dropped),
    /// A response or error frame for an id that is not pending.
    Unmatched {
        /// The id.
        id: u64,
    },
    /// A frame the runner should not send to a bridge.
    UnexpectedFrame {
        /// Its kind.
        kind: FrameKind,
    },
    /// An `error` frame from the runner.
    RunnerError {
        /// Its message.
        message: String,
        /// Its id, if any.
        id: Option<u64>,
    },
    /// A start-up probe (`notifications/tools/list_changed`) was written to the agent.
    Probed {
        /// Probes written so far.
        count: u32,
    },
    /// The agent is ready: the notifications held since start-up were relayed.
    Released {
        /// How many.
        count: usize,
        /// What ended the hold.
        by: ReleasedBy,
    },
    /// A notification arrived while the start-up hold was full: it was not kept (the older ones
    /// are).
    HoldFull {
        /// Its method.
        method: String,
        /// Notifications held.
        held: usize,
    },
    /// The bridge tore down before the agent was ready: the held notifications were not
    /// delivered.
    HeldDiscarded {
        /// How many.
        count: usize,
    },
}

#[derive(Debug, Clone)]
struct Forwarded {
    agent_id: Id,
    method: String,
    since: Instant,
}

#[derive(Debug, Clone)]
enum State {
    Relaying,
    Closed,
}

/// The bridge's protocol state. See the [module docs](self).
///
/// Contract: every input is `handle_*(…, now)` — agent bytes / EOF, runner bytes / close,
/// `handle_terminate`, `handle_timeout` (the start-up grace; [`poll_timeout`](Self::poll_timeout)
/// says when). Outputs are drained from [`poll_output`](Self::poll_output):
/// [`BridgeOutput::Transmit`] `{ to: BridgePeer::Agent | BridgePeer::Runner, bytes }`, `Event`s for the log,
/// and `Exit` last.
#[derive(Debug, Clone)]
pub struct BridgeSession {
    config: BridgeConfig,
    face: McpFace,
    state: State,
    agent: LineDecoder,
    runner: FrameDecoder,
    pending: Pending<Forwarded>,
    hold: StartupHold,
    /// The `seq` of each held notification that carried one, in order.
    held_seqs: Vec<u64>,
    out: VecDeque<BridgeOutput>,
}

impl BridgeSession {
    /// A session that has just connected to the runner.
    pub fn new(config: BridgeConfig) -> Self {
        let mut session = Self {
            agent: LineDecoder::new(config.max_agent_line_bytes),
            runner: FrameDecoder::new(config.max_frame_bytes),
            face: McpFace {
                server_name: mcp::SERVER_NAME.to_owned(),
                server_version: config.server_version.clone(),
                capabilities: mcp::AC7_CAPABILITIES.to_owned(),
                max_line_bytes: config.max_agent_line_bytes,
            },
            hold: StartupHold::new(
                Timing {
                    grace: config.start_grace,
                    probe_interval: config.probe_interval,
                    probe_max_interval: config.probe_max_interval,
                    probe_ceiling: config.probe_ceiling,
                },
                config.max_held_notifications,
                config.max_held_bytes,
            ),
            config,
            state: State::Relaying,
            pending: Pending::new(),
            held_seqs: Vec::new(),
            out: VecDeque::new(),
        };
        // First thing on the socket: this bridge acknowledges the notifications it writes, so
        // the runner can hand those it never wrote to the next bridge.
        session.ack([0]);
        session
    }

    /// Bytes read from the agent (stdin).
    pub fn handle_agent_bytes(&mut self, bytes: &[u8], now: Instant) {
        if self.is_closed() {
            return;
        }
        // Taken out for the loop so lines can be handled in place, without copying them.
        let mut agent = std::mem::take(&mut self.agent);
        agent.push(bytes);
        while let Some(line) = agent.decode() {
            self.agent_line(line, now);
        }
        self.agent = agent;
    }

    /// The agent closed stdin: answer what is pending, send `shutdown`, exit.
    pub fn handle_agent_eof(&mut self, now: Instant) {
        if self.is_closed() {
            return;
        }
        let mut agent = std::mem::take(&mut self.agent);
        if let Some(line) = agent.decode_eof() {
            self.agent_line(line, now);
        }
        self.close(ExitReason::AgentClosed, now);
    }

    /// Bytes read from the runner's socket.
    pub fn handle_runner_bytes(&mut self, bytes: &[u8], now: Instant) {
        if self.is_closed() {
            return;
        }
        self.runner.push(bytes);
        while let Some(decoded) = self.runner.decode() {
            self.runner_decoded(decoded, now);
            if self.is_closed() {
                return;
            }
        }
    }

    /// The runner's socket reached EOF or failed: answer what is pending, exit.
    pub fn handle_runner_closed(&mut self, now: Instant) {
        if self.is_closed() {
            return;
        }
        if let Some(decoded) = self.runner.decode_eof() {
            self.runner_decoded(decoded, now);
        }
        self.close(ExitReason::RunnerClosed, now);
    }

    /// SIGINT/SIGTERM: the same teardown as the agent going away.
    pub fn handle_terminate(&mut self, now: Instant) {
        self.close(ExitReason::Terminated, now);
    }

    /// The next thing to do, until `None`.
    pub fn poll_output(&mut self) -> Option<BridgeOutput> {
        self.out.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) is due: the start-up hold's next probe or
    /// its end, while it runs.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.is_closed() {
            return None;
        }
        self.hold.poll_timeout()
    }

    /// Time passed: writes a start-up probe or ends the hold when due, relaying what was held.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.is_closed() {
            return;
        }
        loop {
            let due = self.hold.handle_timeout(now);
            if due == Due::Nothing {
                return;
            }
            self.hold_due(due);
        }
    }

    fn hold_due(&mut self, due: Due) {
        match due {
            Due::Nothing => {}
            Due::Probe { count } => {
                let mut line = Vec::new();
                jsonrpc::encode_notification(&mut line, mcp::TOOLS_LIST_CHANGED, None);
                self.out.push_back(BridgeOutput::Transmit {
                    to: BridgePeer::Agent,
                    bytes: line,
                });
                self.event(BridgeEvent::Probed { count });
            }
            Due::Release { held, by } => {
                let count = held.len();
                self.out
                    .extend(held.into_iter().map(|bytes| BridgeOutput::Transmit {
                        to: BridgePeer::Agent,
                        bytes,
                    }));
                let seqs = std::mem::take(&mut self.held_seqs);
                self.ack(seqs);
                self.event(BridgeEvent::Released { count, by });
            }
        }
    }

    /// Whether the agent is ready and notifications are relayed at once.
    pub fn is_delivering(&self) -> bool {
        self.hold.is_open()
    }

    /// Notifications held until the agent is ready.
    pub fn held_notifications(&self) -> usize {
        self.hold.held()
    }

    /// Whether teardown has happened (all further input is ignored).
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Requests forwarded and not yet answered.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    fn agent_line(&mut self, line: Line<'_>, now: Instant) {
        match self.face.classify(line) {
            AgentLine::Blank => {}
            AgentLine::Invalid {
                answer,
                len,
                code,
                detail,
            } => {
                self.out.push_back(BridgeOutput::Transmit {
                    to: BridgePeer::Agent,
                    bytes: answer,
                });
                self.event(BridgeEvent::AgentLineInvalid { len, code, detail });
            }
            AgentLine::Answered(answer) => self.out.push_back(BridgeOutput::Transmit {
                to: BridgePeer::Agent,
                bytes: answer,
            }),
            AgentLine::Initialize { answer, client } => {
                self.out.push_back(BridgeOutput::Transmit {
                    to: BridgePeer::Agent,
                    bytes: answer,
                });
                self.hold.client(client.as_deref());
            }
            AgentLine::Request(req) => {
                if req.method == mcp::TOOLS_LIST {
                    let due = self.hold.tools_requested();
                    self.hold_due(due);
                }
                self.forward(req.id, req.method, req.params, now);
            }
            AgentLine::Cancelled(agent_id) => {
                if let Some(id) = self.pending.find(|f| f.agent_id == agent_id) {
                    self.pending.remove(id);
                    self.event(BridgeEvent::Cancelled { id });
                }
            }
            AgentLine::Notification(method) if method == mcp::INITIALIZED => {
                self.hold.initialized(now);
                self.handle_timeout(now);
            }
            AgentLine::Notification(method) => {
                self.event(BridgeEvent::AgentNotificationIgnored { method })
            }
            AgentLine::Response => self.event(BridgeEvent::AgentResponseIgnored),
        }
    }

    fn forward(&mut self, agent_id: Id, method: String, params: Option<RawJson>, now: Instant) {
        let id = self.pending.next_id();
        let frame = Frame::McpRequest(McpRequest { id, method, params });
        let mut bytes = Vec::new();
        let encoded = encode_frame(&frame, &mut bytes, self.config.max_frame_bytes);
        let Frame::McpRequest(McpRequest { method, .. }) = frame else {
            unreachable!("built as a request above")
        };
        match encoded {
            Ok(_) => {
                let inserted = self.pending.insert(Forwarded {
                    agent_id,
                    method: method.clone(),
                    since: now,
                });
                debug_assert_eq!(inserted, id);
                self.out.push_back(BridgeOutput::Transmit {
                    to: BridgePeer::Runner,
                    bytes,
                });
                self.event(BridgeEvent::Forwarded { id, method });
            }
            Err(too_large) => {
                let message = format!(
                    "request too large: {} bytes exceeds the {}-byte IPC frame limit",
                    too_large.len, too_large.max
                );
                self.answer_agent(Some(&agent_id), &RpcError::new(INTERNAL_ERROR, message));
                self.event(BridgeEvent::RequestTooLarge {
                    method,
                    len: too_large.len,
                    max: too_large.max,
                });
            }
        }
    }

    fn runner_decoded(&mut self, decoded: Decoded, now: Instant) {
        match decoded {
            Decoded::Frame(Frame::McpResponse(resp)) => {
                self.complete(resp.id, resp.outcome, now);
            }
            Decoded::Frame(Frame::McpNotification(n)) => {
                let mut line = Vec::new();
                jsonrpc::encode_notification(&mut line, &n.method, n.params.as_ref());
                match self.hold.offer(line) {
                    Offer::Pass(line) => {
                        self.out.push_back(BridgeOutput::Transmit {
                            to: BridgePeer::Agent,
                            bytes: line,
                        });
                        self.ack(n.seq);
                    }
                    Offer::Held => self.held_seqs.extend(n.seq),
                    Offer::Refused => {
                        let held = self.hold.held();
                        self.event(BridgeEvent::HoldFull {
                            method: n.method,
                            held,
                        });
                    }
                }
            }
            Decoded::Frame(Frame::Shutdown(Shutdown { reason })) => {
                self.close(ExitReason::RunnerShutdown { reason }, now);
            }
            Decoded::Frame(Frame::Error(e)) => {
                if let Some(id) = e.id.filter(|id| self.pending.contains(*id)) {
                    let error = RpcError::new(INTERNAL_ERROR, e.message.clone());
                    self.complete(id, Outcome::Error(error), now);
                }
                self.event(BridgeEvent::RunnerError {
                    message: e.message,
                    id: e.id,
                });
            }
            Decoded::Frame(frame @ (Frame::McpRequest(_) | Frame::Ack(_))) => {
                self.event(BridgeEvent::UnexpectedFrame { kind: frame.kind() });
            }
            Decoded::Dropped(dropped) => {
                if let DropReason::InvalidFields {
                    kind: FrameKind::McpResponse,
                    id: Some(id),
                    detail,
                } = &dropped.reason
                    && self.pending.contains(*id)
                {
                    let message = format!("malformed response from the runner: {detail}");
                    self.complete(
                        *id,
                        Outcome::Error(RpcError::new(INTERNAL_ERROR, message)),
                        now,
                    );
                }
                self.event(BridgeEvent::FrameDropped(dropped));
            }
        }
    }

    fn complete(&mut self, id: u64, outcome: Outcome, now: Instant) {
        match self.pending.take(id) {
            Ok(forwarded) => self.answer(id, forwarded, &outcome, now, true),
            Err(_) => self.event(BridgeEvent::Unmatched { id }),
        }
    }

    /// Answers the agent; `live`: the session goes on (not teardown), so the start-up hold moves.
    fn answer(
        &mut self,
        id: u64,
        forwarded: Forwarded,
        outcome: &Outcome,
        now: Instant,
        live: bool,
    ) {
        let mut line = Vec::new();
        jsonrpc::encode_outcome(&mut line, &forwarded.agent_id, outcome);
        self.out.push_back(BridgeOutput::Transmit {
            to: BridgePeer::Agent,
            bytes: line,
        });
        let listed = forwarded.method == mcp::TOOLS_LIST;
        self.event(BridgeEvent::Answered {
            id,
            method: forwarded.method,
            elapsed: now.saturating_duration_since(forwarded.since),
            ok: matches!(outcome, Outcome::Result(_)),
        });
        if listed && live {
            self.hold.tools_listed(now);
            // The first probe is due at once.
            self.handle_timeout(now);
        }
    }

    fn close(&mut self, reason: ExitReason, now: Instant) {
        if self.is_closed() {
            return;
        }
        let why = match &reason {
            ExitReason::AgentClosed => "the agent closed its MCP connection".to_owned(),
            ExitReason::RunnerShutdown { reason: Some(r) } => format!("the runner shut down ({r})"),
            ExitReason::RunnerShutdown { reason: None } => "the runner shut down".to_owned(),
            ExitReason::RunnerClosed => "the runner closed the connection".to_owned(),
            ExitReason::Terminated => "the bridge was terminated".to_owned(),
        };
        let error = Outcome::Error(RpcError::new(
            INTERNAL_ERROR,
            format!("ac7 bridge closing: {why}"),
        ));
        for (id, forwarded) in self.pending.fail_all() {
            self.answer(id, forwarded, &error, now, false);
        }
        let count = self.hold.discard();
        // Never written, so never acknowledged: the runner hands them to the next bridge.
        self.held_seqs.clear();
        if count > 0 {
            self.event(BridgeEvent::HeldDiscarded { count });
        }
        if matches!(reason, ExitReason::AgentClosed | ExitReason::Terminated) {
            let frame = Frame::Shutdown(Shutdown {
                reason: Some(reason.label().to_owned()),
            });
            let mut bytes = Vec::new();
            if encode_frame(&frame, &mut bytes, self.config.max_frame_bytes).is_ok() {
                self.out.push_back(BridgeOutput::Transmit {
                    to: BridgePeer::Runner,
                    bytes,
                });
            }
        }
        self.state = State::Closed;
        self.out.push_back(BridgeOutput::Exit(reason));
    }

    /// Tells the runner these notifications were written to the agent (one `ack` frame each).
    /// The driver writes outputs in order, so an `ack` never overtakes its line.
    fn ack(&mut self, seqs: impl IntoIterator<Item = u64>) {
        for seq in seqs {
            let mut bytes = Vec::new();
            if encode_frame(
                &Frame::Ack(Ack { seq }),
                &mut bytes,
                self.config.max_frame_bytes,
            )
            .is_ok()
            {
                self.out.push_back(BridgeOutput::Transmit {
                    to: BridgePeer::Runner,
                    bytes,
                });
            }
        }
    }

    fn answer_agent(&mut self, id: Option<&Id>, error: &RpcError) {
        self.out.push_back(BridgeOutput::Transmit {
            to: BridgePeer::Agent,
            bytes: error_line(id, error),
        });
    }

    fn event(&mut self, event: BridgeEvent) {
        self.out.push_back(BridgeOutput::Event(event));
    }
}

#[cfg(test)]
mod tests;
