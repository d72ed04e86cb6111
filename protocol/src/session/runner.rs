//! The runner's side of the IPC socket: which bridge is attached, requests in, responses and
//! notifications out.
//!
//! The driver accepts connections and reports them with [`RunnerSession::handle_connect`], feeds
//! their bytes with [`RunnerSession::handle_bytes`] and their end with
//! [`RunnerSession::handle_closed`]. The application answers each [`IncomingRequest`] with
//! [`RunnerSession::respond`], pushes events with [`RunnerSession::notify`], and ends the session
//! with [`RunnerSession::shutdown`]. Everything to write or close comes out of
//! [`RunnerSession::poll_output`]; outputs for one connection are in order, and a
//! [`RunnerOutput::Close`] follows that connection's last [`RunnerOutput::Transmit`].
//!
//! Who connected: the driver classifies each connection ([`Origin`]) by the peer's process.
//! The agent's own bridges run inside the agent's process tree; anything else (`claude mcp list`
//! doing a health check from another terminal, a stray `ac7 mcp-bridge`) is an *outsider*. Inside
//! the tree, what counts is who started the bridge (its parent process): the agent itself
//! ([`Origin::Agent`]), or another process ([`Origin::Client`]), such as `claude mcp list` run by
//! the agent through its shell tool, which starts a bridge to check its health. A bridge of
//! another process is the agent's bridge only when it is the same client's as the attached one
//! (that client reconnecting) or when none is attached; else it is *foreign*. Outsiders and
//! foreign bridges are served — their requests are answered — but never displace the agent's
//! bridge, never count as attached, and never receive queued or live notifications; one that is
//! still connected when the agent's bridge goes away is not promoted (the agent's client starts
//! a new bridge, which gets what was queued meanwhile). Everything below is about the agent's
//! bridges.
//!
//! Policy: one bridge at a time. With [`BridgePolicy::DisplaceOld`] (the default) a
//! newcomer takes over and the old connection gets `shutdown{reason:"displaced-by-new-bridge"}`
//! and is closed; with [`BridgePolicy::RejectNew`] the newcomer gets an `error` frame and is
//! closed. A response goes only to the connection that asked; one for a connection that is gone
//! is dropped. Notifications go to the attached bridge; while none is attached they wait in a
//! bounded queue (overflow drops the oldest and says so) and are delivered on attach.
//!
//! Handing over between bridges: every notification carries a `seq`. A bridge that says first
//! thing that it acknowledges (`ack{seq:0}`) sends `ack{seq}` for each notification once it
//! wrote it to the agent. When such a bridge goes — it closed, sent `shutdown`, or was
//! displaced — whatever it was sent and never acknowledged goes to the next bridge (at once if
//! one is attached, else queued ahead of later notifications), so a notification the old bridge
//! never wrote is written once, by the new one. A displaced bridge is not closed at once: it
//! gets `shutdown` and is read until it closes (its acknowledgements say what it wrote); only
//! then is the rest handed over. Bridges that do not acknowledge (other implementations) are
//! handled as before: what they were sent counts as delivered. Under
//! [`BridgePolicy::AllowMany`] every bridge already got every notification, so nothing is
//! handed over.
//!
//! A response that would not fit in a frame is replaced, so no request waits forever: a
//! `tools/call` gets an `isError` result `<tool>: result too large (N bytes > MAX)`, any other
//! method a `-32603` error.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::codec::frame::{
    Decoded, DropReason, Dropped, ErrorFrame, Frame, FrameDecoder, FrameKind, FrameTooLarge,
    MAX_FRAME_BYTES, McpNotification, McpResponse, Shutdown, encode_frame_vec,
};
use crate::codec::json::RawJson;
use crate::codec::jsonrpc::{INTERNAL_ERROR, Outcome, RpcError};
use crate::dialect::mcp;

/// The `shutdown` reason sent to a displaced bridge.
pub const DISPLACED_REASON: &str = "displaced-by-new-bridge";
/// The `error` message sent to a rejected bridge.
pub const ALREADY_ATTACHED: &str = "runner already attached";

/// What to do when a second bridge connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BridgePolicy {
    /// The newcomer takes over; the old connection is shut down and closed (production).
    #[default]
    DisplaceOld,
    /// The newcomer is refused with an `error` frame and closed (tests).
    RejectNew,
    /// Every bridge stays attached (Codex runs more than one instance of an MCP server). Each
    /// still gets only the responses to its own requests; notifications go to all of them.
    AllowMany,
}

/// Limits and policy of a runner session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerConfig {
    /// Single-bridge policy.
    pub policy: BridgePolicy,
    /// Cap on an IPC frame, newline included.
    pub max_frame_bytes: usize,
    /// Notifications kept while no bridge is attached.
    pub max_queued_notifications: usize,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            policy: BridgePolicy::DisplaceOld,
            max_frame_bytes: MAX_FRAME_BYTES,
            max_queued_notifications: 1024,
        }
    }
}

/// Where a connection comes from, as the driver established it (peer credentials).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Origin {
    /// A bridge the agent process started itself (or the agent itself): it gets the events and
    /// follows the [`BridgePolicy`].
    #[default]
    Agent,
    /// A bridge in the agent's process tree started by another process (its parent, this pid):
    /// like [`Origin::Agent`] when a bridge of the same client is attached or none is; else
    /// foreign (served, gets no events, displaces nothing).
    Client(u32),
    /// Any other process: served, but never displaces the agent's bridge and gets no events.
    Outsider,
}

/// A connection, numbered by the session in accept order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IpcConnId(pub u64);

/// An MCP request for the application to answer with [`RunnerSession::respond`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingRequest {
    /// The connection that asked.
    pub conn: IpcConnId,
    /// The bridge's correlation id.
    pub id: u64,
    /// MCP method.
    pub method: String,
    /// MCP params verbatim.
    pub params: Option<RawJson>,
}

/// Something for the driver or the application to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunnerOutput {
    /// Write these bytes (one or more frames) to the connection.
    Transmit {
        /// Which connection.
        to: IpcConnId,
        /// What.
        bytes: Vec<u8>,
    },
    /// Close the connection (after writing what was transmitted to it).
    Close {
        /// Which.
        conn: IpcConnId,
    },
    /// A request for the application.
    Request(IncomingRequest),
    /// Something worth logging.
    Event(RunnerEvent),
}

/// Why a bridge stopped being attached.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DetachReason {
    /// Its socket closed.
    Closed,
    /// It sent `shutdown`.
    BridgeShutdown {
        /// The reason it gave.
        reason: Option<String>,
    },
    /// A newer bridge displaced it.
    Displaced,
    /// The runner shut down.
    RunnerShutdown,
}

/// Things worth logging.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunnerEvent {
    /// A bridge is now attached.
    Attached {
        /// Its connection.
        conn: IpcConnId,
        /// Queued notifications delivered to it.
        delivered: usize,
    },
    /// A bridge is no longer attached.
    Detached {
        /// Its connection.
        conn: IpcConnId,
        /// Why.
        reason: DetachReason,
        /// Requests it had in flight, whose answers will be dropped.
        abandoned: usize,
    },
    /// A connection from outside the agent's tree: served, gets no events.
    OutsiderConnected {
        /// Its connection.
        conn: IpcConnId,
    },
    /// An outsider's connection ended.
    OutsiderLeft {
        /// Its connection.
        conn: IpcConnId,
        /// Requests it had in flight, whose answers will be dropped.
        abandoned: usize,
    },
    /// A bridge from the agent's tree started by a process that is not the client of the
    /// attached bridge: served, gets no events, and the attached bridge stays.
    ForeignConnected {
        /// Its connection.
        conn: IpcConnId,
        /// The process that started it.
        client: u32,
        /// The agent's bridge that stays attached.
        attached: IpcConnId,
    },
    /// A foreign bridge's connection ended.
    ForeignLeft {
        /// Its connection.
        conn: IpcConnId,
        /// Requests it had in flight, whose answers will be dropped.
        abandoned: usize,
    },
    /// A newcomer was refused (reject-new policy, or the runner has shut down).
    Rejected {
        /// Its connection.
        conn: IpcConnId,
    },
    /// A line from the bridge was dropped.
    FrameDropped {
        /// From where.
        conn: IpcConnId,
        /// The line.
        dropped: Dropped,
    },
    /// A frame a bridge should not send (`mcp_response`, `mcp_notification`).
    UnexpectedFrame {
        /// From where.
        conn: IpcConnId,
        /// Its kind.
        kind: FrameKind,
    },
    /// An `error` frame from the bridge.
    BridgeError {
        /// From where.
        conn: IpcConnId,
        /// Its message.
        message: String,
        /// Its id, if any.
        id: Option<u64>,
    },
    /// A request reused an id still in flight on that connection; it was answered with an error.
    DuplicateRequest {
        /// From where.
        conn: IpcConnId,
        /// The id.
        id: u64,
    },
    /// A request was answered.
    Responded {
        /// To where.
        conn: IpcConnId,
        /// The id.
        id: u64,
        /// Its method.
        method: String,
        /// Time since it arrived.
        elapsed: Duration,
    },
    /// A response for a connection that is gone was dropped.
    ResponseDropped {
        /// The connection.
        conn: IpcConnId,
        /// The id.
        id: u64,
    },
    /// A response did not fit in a frame and was replaced by an error.
    ResultTooLarge {
        /// To where.
        conn: IpcConnId,
        /// The id.
        id: u64,
        /// Encoded length of the original response.
        len: usize,
        /// The cap.
        max: usize,
    },
    /// A notification did not fit in a frame and was dropped.
    NotificationTooLarge {
        /// Its method.
        method: String,
        /// Encoded length.
        len: usize,
        /// The cap.
        max: usize,
    },
    /// Queued notifications were dropped: the queue was full, or the runner shut down.
    NotificationsDropped {
        /// How many.
        count: usize,
    },
    /// Notifications a bridge was sent and never wrote to the agent were handed on.
    Redelivered {
        /// The bridge that did not write them.
        from: IpcConnId,
        /// The bridge they went to (`None`: queued until one attaches).
        to: Option<IpcConnId>,
        /// How many.
        count: usize,
    },
}

/// A call the session cannot honour because the application made a mistake.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RunnerMisuse {
    /// `respond` for a request that is not in flight on that (live) connection: never asked, or
    /// already answered.
    #[error("request {id} on connection {} is not awaiting a response", conn.0)]
    NotInFlight {
        /// The connection.
        conn: IpcConnId,
        /// The id.
        id: u64,
    },
    /// `respond` for a connection the session never numbered.
    #[error("connection {} does not exist", .0.0)]
    UnknownConnection(IpcConnId),
}

#[derive(Debug, Clone)]
struct InFlight {
    method: String,
    tool: Option<String>,
    since: Instant,
}

/// What a served connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The agent's bridge: gets the events.
    Bridge,
    /// From the agent's tree, another client's: served only.
    Foreign,
    /// From outside the agent's tree: served only.
    Outsider,
}

#[derive(Debug, Clone)]
struct Attached {
    origin: Origin,
    role: Role,
    decoder: FrameDecoder,
    in_flight: BTreeMap<u64, InFlight>,
    /// The bridge acknowledges what it writes (it sent `ack{seq:0}`).
    acks: bool,
    /// Notifications sent to it and not acknowledged, by `seq`.
    unacked: BTreeMap<u64, Vec<u8>>,
    /// Displaced: told to shut down, read until it closes, sent nothing new.
    draining: bool,
}

#[derive(Debug, Clone)]
enum Lifecycle {
    Serving,
    ShutDown { reason: Option<String> },
}

/// The runner's protocol state. See the [module docs](self).
///
/// Contract: every input takes `now` last. What happened on a socket is `handle_connect` /
/// `handle_bytes` / `handle_closed`; the application answers each [`RunnerOutput::Request`] with
/// [`respond`](Self::respond), pushes an MCP notification to the agent with
/// [`notify`](Self::notify), and ends the session with [`shutdown`](Self::shutdown). Outputs are
/// drained from [`poll_output`](Self::poll_output): [`RunnerOutput::Transmit`] `{ to, bytes }`,
/// `Close`, `Request`s and `Event`s. No timers: a request waits for its answer or for teardown.
#[derive(Debug, Clone)]
pub struct RunnerSession {
    config: RunnerConfig,
    lifecycle: Lifecycle,
    next_conn: u64,
    /// Served connections: the agent's bridges (at most one unless the policy is `AllowMany`)
    /// and outsiders.
    attached: BTreeMap<IpcConnId, Attached>,
    /// Notifications waiting for a bridge, in `seq` order.
    queued: VecDeque<(u64, Vec<u8>)>,
    next_seq: u64,
    out: VecDeque<RunnerOutput>,
}

impl RunnerSession {
    /// A session with no bridge attached.
    pub fn new(config: RunnerConfig) -> Self {
        Self {
            config,
            lifecycle: Lifecycle::Serving,
            next_conn: 0,
            attached: BTreeMap::new(),
            queued: VecDeque::new(),
            next_seq: 1,
            out: VecDeque::new(),
        }
    }

    /// A bridge connected from `origin`; returns the id the session gave it.
    pub fn handle_connect(&mut self, origin: Origin, _now: Instant) -> IpcConnId {
        let conn = IpcConnId(self.next_conn);
        self.next_conn += 1;
        if let Lifecycle::ShutDown { reason } = &self.lifecycle {
            let frame = Frame::Shutdown(Shutdown {
                reason: reason.clone(),
            });
            self.transmit(conn, &frame);
            self.out.push_back(RunnerOutput::Close { conn });
            self.event(RunnerEvent::Rejected { conn });
            return conn;
        }
        if origin == Origin::Outsider {
            self.serve(conn, origin, Role::Outsider);
            self.event(RunnerEvent::OutsiderConnected { conn });
            return conn;
        }
        if let Origin::Client(client) = origin {
            let attached: Vec<IpcConnId> = self.agent_bridges().collect();
            let same_client = attached
                .iter()
                .any(|c| self.attached.get(c).is_some_and(|a| a.origin == origin));
            if let (Some(&live), false) = (attached.last(), same_client) {
                self.serve(conn, origin, Role::Foreign);
                self.event(RunnerEvent::ForeignConnected {
                    conn,
                    client,
                    attached: live,
                });
                return conn;
            }
        }
        match self.config.policy {
            BridgePolicy::AllowMany => {}
            BridgePolicy::DisplaceOld => {
                let old: Vec<IpcConnId> = self.agent_bridges().collect();
                for old in old {
                    let frame = Frame::Shutdown(Shutdown {
                        reason: Some(DISPLACED_REASON.to_owned()),
                    });
                    self.transmit(old, &frame);
                    // Read until it closes: its acknowledgements (if it sends any) say what
                    // it wrote; the rest is handed on then. Whether it acknowledges may not be
                    // known yet (its first bytes may still be unread), so it is never cut off.
                    if let Some(a) = self.attached.get_mut(&old) {
                        a.draining = true;
                        let abandoned = std::mem::take(&mut a.in_flight).len();
                        self.event(RunnerEvent::Detached {
                            conn: old,
                            reason: DetachReason::Displaced,
                            abandoned,
                        });
                    }
                }
            }
            BridgePolicy::RejectNew => {
                if self.agent_bridges().next().is_some() {
                    let frame = Frame::Error(ErrorFrame {
                        message: ALREADY_ATTACHED.to_owned(),
                        id: None,
                    });
                    self.transmit(conn, &frame);
                    self.out.push_back(RunnerOutput::Close { conn });
                    self.event(RunnerEvent::Rejected { conn });
                    return conn;
                }
            }
        }
        self.serve(conn, origin, Role::Bridge);
        let delivered = self.queued.len();
        let queued: Vec<(u64, Vec<u8>)> = self.queued.drain(..).collect();
        self.send_numbered(conn, queued);
        self.event(RunnerEvent::Attached { conn, delivered });
        conn
    }

    /// Bytes read from a connection. Bytes from a connection that is not attached are ignored.
    pub fn handle_bytes(&mut self, conn: IpcConnId, bytes: &[u8], now: Instant) {
        let Some(attached) = self.attached.get_mut(&conn) else {
            return;
        };
        attached.decoder.push(bytes);
        while let Some(decoded) = self
            .attached
            .get_mut(&conn)
            .and_then(|a| a.decoder.decode())
        {
            self.frame_from_bridge(conn, decoded, now);
        }
    }

    /// A connection reached EOF or failed.
    pub fn handle_closed(&mut self, conn: IpcConnId, now: Instant) {
        if let Some(decoded) = self
            .attached
            .get_mut(&conn)
            .and_then(|a| a.decoder.decode_eof())
        {
            self.frame_from_bridge(conn, decoded, now);
        }
        if self.attached.contains_key(&conn) {
            self.detach(conn, DetachReason::Closed);
        }
    }

    /// The application's answer to a request.
    pub fn respond(
        &mut self,
        conn: IpcConnId,
        id: u64,
        outcome: Outcome,
        now: Instant,
    ) -> Result<(), RunnerMisuse> {
        if conn.0 >= self.next_conn {
            return Err(RunnerMisuse::UnknownConnection(conn));
        }
        let Some(attached) = self.attached.get_mut(&conn).filter(|a| !a.draining) else {
            self.event(RunnerEvent::ResponseDropped { conn, id });
            return Ok(());
        };
        let in_flight = attached
            .in_flight
            .remove(&id)
            .ok_or(RunnerMisuse::NotInFlight { conn, id })?;
        let max = self.config.max_frame_bytes;
        let bytes = match encode_frame_vec(&Frame::McpResponse(McpResponse { id, outcome }), max) {
            Ok(bytes) => bytes,
            Err(FrameTooLarge { len, max }) => {
                self.event(RunnerEvent::ResultTooLarge { conn, id, len, max });
                too_large_response(id, &in_flight, len, max)
            }
        };
        self.out
            .push_back(RunnerOutput::Transmit { to: conn, bytes });
        self.event(RunnerEvent::Responded {
            conn,
            id,
            method: in_flight.method,
            elapsed: now.saturating_duration_since(in_flight.since),
        });
        Ok(())
    }

    /// Sends an MCP notification to the agent's attached bridge(s), or queues it until one
    /// attaches. Outsiders never get one.
    pub fn notify(&mut self, method: &str, params: Option<RawJson>, _now: Instant) {
        if matches!(self.lifecycle, Lifecycle::ShutDown { .. }) {
            self.event(RunnerEvent::NotificationsDropped { count: 1 });
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let frame = Frame::McpNotification(McpNotification {
            method: method.to_owned(),
            params,
            seq: Some(seq),
        });
        let bytes = match encode_frame_vec(&frame, self.config.max_frame_bytes) {
            Ok(bytes) => bytes,
            Err(FrameTooLarge { len, max }) => {
                self.event(RunnerEvent::NotificationTooLarge {
                    method: method.to_owned(),
                    len,
                    max,
                });
                return;
            }
        };
        let conns: Vec<IpcConnId> = self.agent_bridges().collect();
        if !conns.is_empty() {
            for conn in conns {
                self.send_numbered(conn, vec![(seq, bytes.clone())]);
            }
            return;
        }
        self.queued.push_back((seq, bytes));
        self.trim_queue();
    }

    /// Sends numbered notifications to `conn` (one write), remembering them until acknowledged.
    fn send_numbered(&mut self, conn: IpcConnId, items: Vec<(u64, Vec<u8>)>) {
        if items.is_empty() {
            return;
        }
        let mut bytes = Vec::new();
        if let Some(a) = self.attached.get_mut(&conn) {
            for (seq, line) in items {
                bytes.extend_from_slice(&line);
                a.unacked.insert(seq, line);
            }
        }
        self.out
            .push_back(RunnerOutput::Transmit { to: conn, bytes });
    }

    fn trim_queue(&mut self) {
        let excess = self
            .queued
            .len()
            .saturating_sub(self.config.max_queued_notifications);
        if excess > 0 {
            self.queued.drain(..excess);
            self.event(RunnerEvent::NotificationsDropped { count: excess });
        }
    }

    /// Ends the session (agent exited, signal): every connection (the attached bridge and any
    /// outsider) gets `shutdown{reason}` and is closed; later connections get the same and are
    /// closed. Idempotent.
    pub fn shutdown(&mut self, reason: Option<&str>, _now: Instant) {
        if matches!(self.lifecycle, Lifecycle::ShutDown { .. }) {
            return;
        }
        let reason = reason.map(str::to_owned);
        let conns: Vec<IpcConnId> = self.attached.keys().copied().collect();
        for conn in conns {
            let frame = Frame::Shutdown(Shutdown {
                reason: reason.clone(),
            });
            self.transmit(conn, &frame);
            self.out.push_back(RunnerOutput::Close { conn });
            self.detach(conn, DetachReason::RunnerShutdown);
        }
        if !self.queued.is_empty() {
            let count = self.queued.len();
            self.queued.clear();
            self.event(RunnerEvent::NotificationsDropped { count });
        }
        self.lifecycle = Lifecycle::ShutDown { reason };
    }

    /// The next thing to do, until `None`.
    pub fn poll_output(&mut self) -> Option<RunnerOutput> {
        self.out.pop_front()
    }

    /// The agent's attached bridge (the newest one under `AllowMany`), if any.
    pub fn attached(&self) -> Option<IpcConnId> {
        self.agent_bridges().next_back()
    }

    /// How many of the agent's bridges are attached.
    pub fn attached_count(&self) -> usize {
        self.agent_bridges().count()
    }

    /// How many outsiders are being served.
    pub fn outsider_count(&self) -> usize {
        self.attached
            .values()
            .filter(|a| a.role == Role::Outsider)
            .count()
    }

    /// How many foreign bridges (the agent's tree, another client) are being served.
    pub fn foreign_count(&self) -> usize {
        self.attached
            .values()
            .filter(|a| a.role == Role::Foreign)
            .count()
    }

    /// How many displaced bridges are still being read until they close.
    pub fn draining_count(&self) -> usize {
        self.attached.values().filter(|a| a.draining).count()
    }

    fn agent_bridges(&self) -> impl DoubleEndedIterator<Item = IpcConnId> + '_ {
        self.attached
            .iter()
            .filter(|(_, a)| a.role == Role::Bridge && !a.draining)
            .map(|(conn, _)| *conn)
    }

    /// Notifications waiting for a bridge.
    pub fn queued_notifications(&self) -> usize {
        self.queued.len()
    }

    /// Whether [`shutdown`](Self::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        matches!(self.lifecycle, Lifecycle::ShutDown { .. })
    }

    fn frame_from_bridge(&mut self, conn: IpcConnId, decoded: Decoded, now: Instant) {
        // A displaced bridge is read only for its acknowledgements and its end.
        let draining = self.attached.get(&conn).is_some_and(|a| a.draining);
        if draining && !matches!(decoded, Decoded::Frame(Frame::Ack(_) | Frame::Shutdown(_))) {
            return;
        }
        match decoded {
            Decoded::Frame(Frame::McpRequest(req)) => {
                let Some(attached) = self.attached.get_mut(&conn) else {
                    return;
                };
                if attached.in_flight.contains_key(&req.id) {
                    let message = format!("duplicate request id {} (still in flight)", req.id);
                    self.error_frame(conn, message, req.id);
                    self.event(RunnerEvent::DuplicateRequest { conn, id: req.id });
                    return;
                }
                let tool = (req.method == mcp::TOOLS_CALL)
                    .then(|| mcp::tool_call_name(req.params.as_ref()));
                attached.in_flight.insert(
                    req.id,
                    InFlight {
                        method: req.method.clone(),
                        tool,
                        since: now,
                    },
                );
                self.out.push_back(RunnerOutput::Request(IncomingRequest {
                    conn,
                    id: req.id,
                    method: req.method,
                    params: req.params,
                }));
            }
            Decoded::Frame(Frame::Shutdown(Shutdown { reason })) => {
                self.out.push_back(RunnerOutput::Close { conn });
                self.detach(conn, DetachReason::BridgeShutdown { reason });
            }
            Decoded::Frame(Frame::Error(e)) => self.event(RunnerEvent::BridgeError {
                conn,
                message: e.message,
                id: e.id,
            }),
            Decoded::Frame(Frame::Ack(ack)) => {
                if let Some(a) = self.attached.get_mut(&conn) {
                    if ack.seq == 0 {
                        a.acks = true;
                    } else {
                        a.unacked.remove(&ack.seq);
                    }
                }
            }
            Decoded::Frame(frame @ (Frame::McpResponse(_) | Frame::McpNotification(_))) => {
                self.event(RunnerEvent::UnexpectedFrame {
                    conn,
                    kind: frame.kind(),
                });
            }
            Decoded::Dropped(dropped) => {
                if let DropReason::InvalidFields {
                    kind: FrameKind::McpRequest,
                    id: Some(id),
                    detail,
                } = &dropped.reason
                    && self
                        .attached
                        .get(&conn)
                        .is_some_and(|a| !a.in_flight.contains_key(id))
                {
                    self.error_frame(conn, format!("invalid mcp_request frame: {detail}"), *id);
                }
                self.event(RunnerEvent::FrameDropped { conn, dropped });
            }
        }
    }

    /// Starts listening to `conn`.
    fn serve(&mut self, conn: IpcConnId, origin: Origin, role: Role) {
        self.attached.insert(
            conn,
            Attached {
                origin,
                role,
                decoder: FrameDecoder::new(self.config.max_frame_bytes),
                in_flight: BTreeMap::new(),
                acks: false,
                unacked: BTreeMap::new(),
                draining: false,
            },
        );
    }

    fn detach(&mut self, conn: IpcConnId, reason: DetachReason) {
        if let Some(attached) = self.attached.remove(&conn) {
            let abandoned = attached.in_flight.len();
            match attached.role {
                // A displaced bridge said so when it was displaced.
                Role::Bridge if attached.draining => {}
                Role::Bridge => self.event(RunnerEvent::Detached {
                    conn,
                    reason: reason.clone(),
                    abandoned,
                }),
                Role::Foreign => self.event(RunnerEvent::ForeignLeft { conn, abandoned }),
                Role::Outsider => self.event(RunnerEvent::OutsiderLeft { conn, abandoned }),
            }
            let hand_on = attached.role == Role::Bridge
                && attached.acks
                && self.config.policy != BridgePolicy::AllowMany
                && reason != DetachReason::RunnerShutdown;
            if hand_on && !attached.unacked.is_empty() {
                self.hand_on(conn, attached.unacked);
            }
        }
    }

    /// Gives what `from` never wrote to the attached bridge, or queues it ahead of later ones.
    fn hand_on(&mut self, from: IpcConnId, unacked: BTreeMap<u64, Vec<u8>>) {
        let count = unacked.len();
        let current = self.agent_bridges().next_back();
        match current {
            Some(to) => {
                self.send_numbered(to, unacked.into_iter().collect());
                self.event(RunnerEvent::Redelivered {
                    from,
                    to: Some(to),
                    count,
                });
            }
            None => {
                let mut all: Vec<(u64, Vec<u8>)> = unacked.into_iter().collect();
                all.extend(self.queued.drain(..));
                all.sort_by_key(|(seq, _)| *seq);
                self.queued = all.into();
                self.trim_queue();
                self.event(RunnerEvent::Redelivered {
                    from,
                    to: None,
                    count,
                });
            }
        }
    }

    fn error_frame(&mut self, conn: IpcConnId, message: String, id: u64) {
        let frame = Frame::Error(ErrorFrame {
            message,
            id: Some(id),
        });
        self.transmit(conn, &frame);
    }

    /// Transmits a frame the session built itself. Only a reason or message longer than the cap
    /// can make one too large; then it goes out without that text rather than not at all.
    fn transmit(&mut self, conn: IpcConnId, frame: &Frame) {
        let max = self.config.max_frame_bytes;
        let bytes = encode_frame_vec(frame, max).unwrap_or_else(|_| {
            let short = match frame {
                Frame::Error(e) => Frame::Error(ErrorFrame {
                    message: "error message too large".to_owned(),
                    id: e.id,
                }),
                _ => Frame::Shutdown(Shutdown::default()),
            };
            encode_frame_vec(&short, usize::MAX).unwrap_or_default()
        });
        self.out
            .push_back(RunnerOutput::Transmit { to: conn, bytes });
    }

    fn event(&mut self, event: RunnerEvent) {
        self.out.push_back(RunnerOutput::Event(event));
    }
}

/// The replacement for a response that did not fit: small enough for any sane cap.
fn too_large_response(id: u64, in_flight: &InFlight, len: usize, max: usize) -> Vec<u8> {
    let outcome = match &in_flight.tool {
        Some(tool) => {
            let tool: String = tool.chars().take(128).collect();
            Outcome::Result(mcp::tool_error(&format!(
                "{tool}: result too large ({len} bytes > {max})"
            )))
        }
        None => Outcome::Error(RpcError::new(
            INTERNAL_ERROR,
            format!(
                "{}: result too large ({len} bytes > {max})",
                in_flight.method.chars().take(128).collect::<String>()
            ),
        )),
    };
    encode_frame_vec(&Frame::McpResponse(McpResponse { id, outcome }), usize::MAX)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
