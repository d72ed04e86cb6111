//! The runner's live stream (broker → runner) as a machine: when to connect, what to send as the
//! last event id, which messages reach the agent, and when to backfill from `/history`.
//!
//! The driver opens a connection when [`LiveOutput::Connect`] says so and reports it with
//! [`LiveStream::handle_connected`] (or its failure with [`LiveStream::handle_closed`]), feeds
//! every decoded frame with [`LiveStream::handle_frame`] (keepalives too: any sign of life
//! counts), runs each [`LiveOutput::Fetch`] as `GET /history` and answers with
//! [`LiveStream::handle_history`] or [`LiveStream::handle_history_failed`], drops the connection
//! on [`LiveOutput::Disconnect`], and calls [`LiveStream::handle_timeout`] at
//! [`LiveStream::poll_timeout`]. Time is an input; jitter comes from the seed in the config.
//!
//! - **Backoff.** After a connection ends, the next attempt waits 1 s doubling to 30 s, ±20 %
//!   jitter; a connection that delivered a message or stayed up 10 s resets it to 1 s.
//! - **Watchdog.** An open connection with nothing heard for 45 s is dropped (the broker sends a
//!   keepalive every 15 s), and so is a connect not answered within 45 s.
//! - **Last event id.** Every message handed on (or skipped as a duplicate) becomes the id sent on
//!   the next connect; the broker replays what the member may see after it.
//! - **Dedupe.** A bounded set of recent ids keeps any message from being delivered twice.
//! - **Backfill.** When the broker answers a connect with a [`Reset`] (it cannot place the last
//!   id: another database, or one restored from before it), the machine pages `/history`: first
//!   the newest message older than the newest one delivered (`before=<ts>&limit=1`), then forward
//!   from it with the exact cursor `after_id` (oldest first) until a short page. Live messages
//!   that arrive meanwhile are held (bounded) and handed on after the backfill, minus those the
//!   backfill delivered. (Placement after a reset is by millisecond, so a message from the
//!   millisecond of the last one delivered that the runner never had, because it was logged
//!   before the runner subscribed, can come too.) A reconnect before any message arrived has no id to resume from: it
//!   backfills everything since the first connection (by the broker's clock, from the whole
//!   second it answered in). Against a broker that does not replay at all (the TypeScript ac7 broker:
//!   [`LiveStream::handle_connected`] with `replays: false`), a reconnect backfills the newest
//!   page of the feed newer than the last message instead.
//!
//! Wire shapes of a reset: SSE `event: reset` with one `data:` line, WebSocket a text frame; both
//! carry the [`Reset`] JSON (`{"type":"reset",…}`, never an `id` key, so no Message looks like it).

use crate::EpochMs;
use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::domain::message::Message;

/// The SSE event type of a reset.
pub const RESET_EVENT: &str = "reset";

/// The response header by which a broker says it replays after `Last-Event-ID` and sends a
/// [`Reset`] when it cannot.
pub const REPLAY_HEADER: &str = "x-ac7-replay";

/// The request header by which a runner says where it runs when it subscribes:
/// `host=<host name>;pid=<process id>` ([`RunnerId`]). The broker shows it on `/roster`, so a
/// second runner for the same member can say where the first one runs. Optional: a subscriber
/// without it (the TypeScript ac7 runner, a browser) is counted as before.
pub const RUNNER_HEADER: &str = "x-ac7-runner";

/// Where a runner runs, as it says in [`RUNNER_HEADER`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerId {
    /// The machine's host name.
    pub host: String,
    /// The runner's process id on that machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

/// The longest host name [`RunnerId::parse`] keeps (a DNS name's limit).
pub const MAX_RUNNER_HOST: usize = 253;

impl RunnerId {
    /// The header value: `host=<host>;pid=<pid>`.
    pub fn to_header(&self) -> String {
        match self.pid {
            Some(pid) => format!("host={};pid={pid}", self.host),
            None => format!("host={}", self.host),
        }
    }

    /// Reads a header value: `;`-separated `key=value` pairs, `host` required (1 to
    /// [`MAX_RUNNER_HOST`] visible ASCII characters, no `;`, `=` or spaces), `pid` optional (a
    /// positive number; one that is not is left out), unknown keys ignored. `None` when there is
    /// no usable host.
    pub fn parse(value: &str) -> Option<RunnerId> {
        let mut host = None;
        let mut pid = None;
        for pair in value.split(';') {
            let Some((key, val)) = pair.split_once('=') else {
                continue;
            };
            match key.trim() {
                "host" => host = Some(val.trim()),
                "pid" => pid = val.trim().parse::<u32>().ok().filter(|p| *p > 0),
                _ => {}
            }
        }
        let host = host.filter(|h| {
            !h.is_empty()
                && h.len() <= MAX_RUNNER_HOST
                && h.bytes()
                    .all(|b| b.is_ascii_graphic() && b != b';' && b != b'=')
        })?;
        Some(RunnerId {
            host: host.to_owned(),
            pid,
        })
    }
}

/// Why the broker could not replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResetReason {
    /// The broker's log has no message with that id (another database, a restored backup, or an
    /// id from the future).
    UnknownLastEventId,
}

/// The `type` tag of a reset frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResetTag {
    /// `"reset"`.
    Reset,
}

/// The broker's "I cannot replay from there" notice: the stream continues live from now, and the
/// client backfills what it missed from `/history`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reset {
    /// Always [`ResetTag::Reset`].
    #[serde(rename = "type")]
    pub kind: ResetTag,
    /// Why.
    pub reason: ResetReason,
    /// The id the client sent.
    pub last_event_id: String,
    /// A sentence for logs.
    pub detail: String,
}

impl Reset {
    /// The reset for an id the log does not have.
    pub fn unknown_id(last_event_id: &str) -> Reset {
        Reset {
            kind: ResetTag::Reset,
            reason: ResetReason::UnknownLastEventId,
            last_event_id: last_event_id.to_owned(),
            detail: "no message with this id in the broker's log; live from now on, backfill from /history"
                .to_owned(),
        }
    }

    /// The JSON of this reset (one line).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// One decoded frame of the live stream.
#[derive(Debug, Clone, PartialEq)]
pub enum LiveFrame {
    /// A message.
    Message(Message),
    /// The broker cannot replay from the id sent.
    Reset(Reset),
    /// A keepalive (SSE comment, WebSocket ping) or anything else that shows the link is up.
    Alive,
}

/// A frame that is neither a Message nor a reset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a live frame that is neither a Message nor a reset: {0}")]
pub struct FrameError(pub String);

impl LiveFrame {
    /// Decodes an SSE event: `message` (or no type) is a Message, `reset` a [`Reset`], any other
    /// type is a sign of life.
    pub fn from_sse(event: &str, data: &str) -> Result<LiveFrame, FrameError> {
        match event {
            "message" | "" => serde_json::from_str(data)
                .map(LiveFrame::Message)
                .map_err(|e| FrameError(e.to_string())),
            RESET_EVENT => serde_json::from_str(data)
                .map(LiveFrame::Reset)
                .map_err(|e| FrameError(e.to_string())),
            _ => Ok(LiveFrame::Alive),
        }
    }

    /// Decodes a WebSocket text frame: an object with `"type":"reset"` is a [`Reset`], anything
    /// else must be a Message.
    pub fn from_ws_text(text: &str) -> Result<LiveFrame, FrameError> {
        #[derive(Deserialize)]
        struct Tag {
            #[serde(rename = "type")]
            kind: Option<serde_json::Value>,
        }
        let tag: Tag = serde_json::from_str(text).map_err(|e| FrameError(e.to_string()))?;
        if tag.kind.as_ref().and_then(|v| v.as_str()) == Some(RESET_EVENT) {
            return serde_json::from_str(text)
                .map(LiveFrame::Reset)
                .map_err(|e| FrameError(e.to_string()));
        }
        serde_json::from_str(text)
            .map(LiveFrame::Message)
            .map_err(|e| FrameError(e.to_string()))
    }
}

/// One `GET /history` the machine wants run (the feed of everything the member may see).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryQuery {
    /// Pass back to [`LiveStream::handle_history`].
    pub id: u64,
    /// `before=<ms>` (newest first).
    pub before_ts: Option<EpochMs>,
    /// `after=<ms>` (oldest first).
    pub after_ts: Option<EpochMs>,
    /// `after_id=<id>` (oldest first).
    pub after_id: Option<String>,
    /// `limit=<n>`.
    pub limit: usize,
}

impl HistoryQuery {
    /// The request path, e.g. `/history?after_id=…&limit=100`.
    pub fn path(&self) -> String {
        let mut path = format!("/history?limit={}", self.limit);
        if let Some(ts) = self.before_ts {
            path.push_str(&format!("&before={ts}"));
        }
        if let Some(ts) = self.after_ts {
            path.push_str(&format!("&after={ts}"));
        }
        if let Some(id) = &self.after_id {
            path.push_str("&after_id=");
            path.push_str(&crate::domain::toolbox::encode_component(id));
        }
        path
    }
}

/// What the machine asks of its driver.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LiveOutput {
    /// Open the stream, sending this as `Last-Event-ID` (SSE) or `lastEventId` (WebSocket).
    Connect {
        /// The id of the last message seen, if any.
        last_event_id: Option<String>,
    },
    /// Close the current connection (it is considered gone already).
    Disconnect {
        /// Why, for the log.
        reason: String,
    },
    /// Hand this message to the agent.
    Deliver(Message),
    /// Run this `GET /history`.
    Fetch(HistoryQuery),
    /// A backfill from `/history` is over (for the log).
    Backfilled {
        /// Where it read from: `after_id=<id>`, `after=<epoch ms>` (exclusive), or
        /// `newest-after=<epoch ms>` (the newest page, the messages from that millisecond on).
        from: String,
        /// How many messages it handed on (duplicates not counted; the live messages held
        /// meanwhile neither).
        delivered: usize,
    },
    /// The next connect waits this long (for the log).
    Backoff {
        /// The delay.
        delay: Duration,
        /// Why the last connection ended.
        reason: String,
    },
}

/// Timing and limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveConfig {
    /// The first reconnect delay (and the one after a healthy connection).
    pub backoff_start: Duration,
    /// The longest reconnect delay.
    pub backoff_max: Duration,
    /// A connection up this long counts as healthy.
    pub healthy_after: Duration,
    /// Nothing heard for this long drops the connection.
    pub silence_limit: Duration,
    /// How many recent ids dedupe remembers.
    pub remembered_ids: usize,
    /// Messages per `/history` page when backfilling.
    pub page: usize,
    /// Live messages held during a backfill before the connection is dropped and retried.
    pub max_held: usize,
    /// Seed of the jitter.
    pub seed: u64,
    /// The id of a message already seen before this machine started: the first connect resumes
    /// after it (a runner picking up where its member's last one left off).
    pub resume_from: Option<String>,
}

impl Default for LiveConfig {
    fn default() -> Self {
        Self {
            backoff_start: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            healthy_after: Duration::from_secs(10),
            silence_limit: Duration::from_secs(45),
            remembered_ids: 4096,
            page: 100,
            max_held: 4096,
            seed: 0,
            resume_from: None,
        }
    }
}

/// Where a backfill is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// Asked for the newest message older than the last one delivered.
    Anchor,
    /// Paging forward (oldest first) with `after_id` / `after`.
    Forward,
    /// One newest-first page from a broker that cannot replay.
    Newest,
}

#[derive(Debug, Clone, PartialEq)]
struct Backfill {
    step: Step,
    /// The outstanding query's id.
    query: u64,
    /// Where it reads from, for [`LiveOutput::Backfilled`] (empty until the anchor is known).
    from: String,
    /// Messages from `/history` handed on so far.
    delivered: usize,
    /// Live messages that arrived meanwhile, in order.
    held: VecDeque<Message>,
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Waiting to connect at `at`.
    Waiting { at: Instant },
    /// [`LiveOutput::Connect`] was emitted; no answer yet.
    Connecting { since: Instant },
    /// Connected.
    Open {
        since: Instant,
        heard: Instant,
        delivered: usize,
        backfill: Option<Backfill>,
    },
    /// Stopped for good.
    Stopped,
}

/// The live-stream machine. See the module docs.
///
/// Contract: every input takes `now` last. What happened is `handle_connected` /
/// `handle_frame` / `handle_closed` for the stream, `handle_history` / `handle_history_failed`
/// for the fetch a [`LiveOutput::Fetch`] asked for, and `handle_timeout` when
/// [`poll_timeout`](Self::poll_timeout) is due; [`shutdown`](Self::shutdown) stops it. Outputs are
/// drained from [`poll_output`](Self::poll_output). It writes no bytes: the driver owns the HTTP
/// request, so there is no `Transmit`.
#[derive(Debug, Clone)]
pub struct LiveStream {
    config: LiveConfig,
    phase: Phase,
    backoff: Duration,
    rng: u64,
    last_id: Option<String>,
    last_ts: Option<EpochMs>,
    seen: BTreeSet<String>,
    seen_order: VecDeque<String>,
    connected_before: bool,
    /// The broker's clock (whole seconds, epoch ms) at the first connection.
    origin_ms: Option<EpochMs>,
    next_query: u64,
    out: VecDeque<LiveOutput>,
}

impl LiveStream {
    /// A machine that connects at once (`now`).
    pub fn new(config: LiveConfig, now: Instant) -> Self {
        let backoff = config.backoff_start;
        let rng = config.seed ^ 0x9E37_79B9_7F4A_7C15;
        let last_id = config.resume_from.clone();
        let mut me = Self {
            config,
            phase: Phase::Waiting { at: now },
            backoff,
            rng,
            last_id,
            last_ts: None,
            seen: BTreeSet::new(),
            seen_order: VecDeque::new(),
            connected_before: false,
            origin_ms: None,
            next_query: 0,
            out: VecDeque::new(),
        };
        me.handle_timeout(now);
        me
    }

    /// The id of the last message seen (sent on the next connect).
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    /// Whether a connection is open.
    pub fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Open { .. })
    }

    /// Whether a backfill is under way.
    pub fn is_backfilling(&self) -> bool {
        matches!(
            self.phase,
            Phase::Open {
                backfill: Some(_),
                ..
            }
        )
    }

    /// The next output, if any.
    pub fn poll_output(&mut self) -> Option<LiveOutput> {
        self.out.pop_front()
    }

    /// When [`LiveStream::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Waiting { at } => Some(*at),
            Phase::Open { heard, .. } | Phase::Connecting { since: heard } => {
                Some(*heard + self.config.silence_limit)
            }
            Phase::Stopped => None,
        }
    }

    /// Time passed: connect when the backoff is over; drop a silent connection.
    pub fn handle_timeout(&mut self, now: Instant) {
        match &self.phase {
            Phase::Waiting { at } if now >= *at => {
                self.phase = Phase::Connecting { since: now };
                self.out.push_back(LiveOutput::Connect {
                    last_event_id: self.last_id.clone(),
                });
            }
            Phase::Open { heard, .. } | Phase::Connecting { since: heard }
                if now >= *heard + self.config.silence_limit =>
            {
                let what = if self.is_open() {
                    "nothing heard"
                } else {
                    "no answer to the connect"
                };
                let reason = format!("{what} for {} s", self.config.silence_limit.as_secs_f64());
                self.out.push_back(LiveOutput::Disconnect {
                    reason: reason.clone(),
                });
                self.closed(now, reason);
            }
            _ => {}
        }
    }

    /// The connection asked for is open. `replays`: the broker replays after the last event id
    /// (our broker says so with [`REPLAY_HEADER`]); when it does not, a reconnect backfills.
    /// `broker_ms`: the broker's clock when it answered (its `Date` header, epoch ms), if known.
    pub fn handle_connected(&mut self, replays: bool, broker_ms: Option<EpochMs>, now: Instant) {
        if !matches!(self.phase, Phase::Connecting { .. }) {
            return;
        }
        let backfill = if !replays && self.connected_before && self.last_ts.is_some() {
            Some(self.start_backfill(Step::Newest, None))
        } else if let (true, true, None, Some(origin)) = (
            replays,
            self.connected_before,
            &self.last_id,
            self.origin_ms,
        ) {
            // Nothing received yet, so no id to resume from: everything since the first
            // connection (from its second: `Date` has second resolution).
            Some(self.start_backfill(Step::Forward, Some(origin - 1)))
        } else {
            None
        };
        if !self.connected_before {
            self.origin_ms = broker_ms.map(|ms| ms - ms.rem_euclid(1000));
        }
        self.connected_before = true;
        self.phase = Phase::Open {
            since: now,
            heard: now,
            delivered: 0,
            backfill,
        };
    }

    /// The connection (or the attempt) ended.
    pub fn handle_closed(&mut self, reason: &str, now: Instant) {
        if matches!(self.phase, Phase::Connecting { .. } | Phase::Open { .. }) {
            self.closed(now, reason.to_owned());
        }
    }

    /// A frame arrived on the open connection.
    pub fn handle_frame(&mut self, frame: LiveFrame, now: Instant) {
        let Phase::Open {
            heard, backfill, ..
        } = &mut self.phase
        else {
            return;
        };
        *heard = now;
        match frame {
            LiveFrame::Alive => {}
            LiveFrame::Message(message) => {
                if let Some(b) = backfill {
                    if b.held.len() >= self.config.max_held {
                        let reason = format!(
                            "more than {} live messages during a backfill",
                            self.config.max_held
                        );
                        self.out.push_back(LiveOutput::Disconnect {
                            reason: reason.clone(),
                        });
                        self.closed(now, reason);
                    } else {
                        b.held.push_back(message);
                    }
                } else {
                    let _ = self.deliver(message);
                }
            }
            LiveFrame::Reset(_) => {
                if backfill.is_none() && self.last_ts.is_some() {
                    let b = self.start_backfill(Step::Anchor, None);
                    if let Phase::Open { backfill, .. } = &mut self.phase {
                        *backfill = Some(b);
                    }
                }
            }
        }
    }

    /// The answer to [`LiveOutput::Fetch`] `query`: the `messages` array, in the broker's order.
    pub fn handle_history(&mut self, query: u64, messages: Vec<Message>, now: Instant) {
        let Phase::Open {
            backfill: Some(b), ..
        } = &mut self.phase
        else {
            return;
        };
        if b.query != query {
            return;
        }
        let _ = now;
        match b.step {
            Step::Anchor => {
                let anchor = messages.into_iter().next();
                b.step = Step::Forward;
                let (after_id, after_ts) = match anchor {
                    Some(m) => (Some(m.id), None),
                    // Nothing older: everything from the last delivered millisecond on.
                    None => (None, self.last_ts.map(|ts| ts - 1)),
                };
                b.from = cursor_text(after_id.as_deref(), after_ts);
                self.fetch(after_id, after_ts, None);
            }
            Step::Forward => {
                let full = messages.len() >= self.config.page;
                let cursor = messages.last().map(|m| m.id.clone());
                self.deliver_backfilled(messages);
                match cursor {
                    Some(id) if full => self.fetch(Some(id), None, None),
                    _ => self.finish_backfill(),
                }
            }
            Step::Newest => {
                let last_ts = self.last_ts.unwrap_or(i64::MIN);
                let mut missed: Vec<Message> =
                    messages.into_iter().filter(|m| m.ts >= last_ts).collect();
                missed.reverse();
                self.deliver_backfilled(missed);
                self.finish_backfill();
            }
        }
    }

    /// [`LiveOutput::Fetch`] `query` failed: drop the connection and try again later (the
    /// broker will say reset again, and the backfill restarts where the deliveries left off).
    pub fn handle_history_failed(&mut self, query: u64, reason: &str, now: Instant) {
        let Phase::Open {
            backfill: Some(b), ..
        } = &self.phase
        else {
            return;
        };
        if b.query != query {
            return;
        }
        let reason = format!("backfill from /history failed: {reason}");
        self.out.push_back(LiveOutput::Disconnect {
            reason: reason.clone(),
        });
        self.closed(now, reason);
    }

    /// Stops for good: no more connects.
    pub fn shutdown(&mut self, _now: Instant) {
        self.phase = Phase::Stopped;
    }

    fn start_backfill(&mut self, step: Step, after_ts: Option<EpochMs>) -> Backfill {
        let (before_ts, limit) = match step {
            Step::Anchor => (self.last_ts, 1),
            Step::Forward | Step::Newest => (None, self.config.page),
        };
        let from = match step {
            Step::Anchor => String::new(),
            Step::Forward => cursor_text(None, after_ts),
            Step::Newest => format!("newest-after={}", self.last_ts.unwrap_or_default()),
        };
        let query = self.emit_fetch(before_ts, after_ts, None, limit);
        Backfill {
            step,
            query,
            from,
            delivered: 0,
            held: VecDeque::new(),
        }
    }

    /// Hands on a page from `/history`, counting what was new in the backfill.
    fn deliver_backfilled(&mut self, messages: Vec<Message>) {
        let mut new = 0;
        for m in messages {
            if self.deliver(m) {
                new += 1;
            }
        }
        if let Phase::Open {
            backfill: Some(b), ..
        } = &mut self.phase
        {
            b.delivered += new;
        }
    }

    fn fetch(
        &mut self,
        after_id: Option<String>,
        after_ts: Option<EpochMs>,
        before_ts: Option<EpochMs>,
    ) {
        let limit = self.config.page;
        let query = self.emit_fetch(before_ts, after_ts, after_id, limit);
        if let Phase::Open {
            backfill: Some(b), ..
        } = &mut self.phase
        {
            b.query = query;
        }
    }

    fn emit_fetch(
        &mut self,
        before_ts: Option<EpochMs>,
        after_ts: Option<EpochMs>,
        after_id: Option<String>,
        limit: usize,
    ) -> u64 {
        self.next_query += 1;
        let id = self.next_query;
        self.out.push_back(LiveOutput::Fetch(HistoryQuery {
            id,
            before_ts,
            after_ts,
            after_id,
            limit,
        }));
        id
    }

    fn finish_backfill(&mut self) {
        let Phase::Open { backfill, .. } = &mut self.phase else {
            return;
        };
        let Some(b) = backfill.take() else {
            return;
        };
        self.out.push_back(LiveOutput::Backfilled {
            from: b.from,
            delivered: b.delivered,
        });
        for m in b.held {
            let _ = self.deliver(m);
        }
    }

    /// Hands `message` on unless it was seen before (`false`); either way it becomes the last
    /// event id.
    fn deliver(&mut self, message: Message) -> bool {
        self.last_id = Some(message.id.clone());
        self.last_ts = Some(self.last_ts.map_or(message.ts, |t| t.max(message.ts)));
        if !self.seen.insert(message.id.clone()) {
            return false;
        }
        self.seen_order.push_back(message.id.clone());
        if self.seen_order.len() > self.config.remembered_ids
            && let Some(old) = self.seen_order.pop_front()
        {
            self.seen.remove(&old);
        }
        if let Phase::Open { delivered, .. } = &mut self.phase {
            *delivered += 1;
        }
        self.out.push_back(LiveOutput::Deliver(message));
        true
    }

    fn closed(&mut self, now: Instant, reason: String) {
        let healthy = match &self.phase {
            Phase::Open {
                since, delivered, ..
            } => {
                *delivered > 0 || now.saturating_duration_since(*since) >= self.config.healthy_after
            }
            _ => false,
        };
        if healthy {
            self.backoff = self.config.backoff_start;
        }
        let delay = self.jitter(self.backoff);
        self.backoff = (self.backoff * 2).min(self.config.backoff_max);
        self.phase = Phase::Waiting { at: now + delay };
        self.out.push_back(LiveOutput::Backoff { delay, reason });
    }

    /// `delay` ±20 %, from the seeded generator.
    fn jitter(&mut self, delay: Duration) -> Duration {
        jitter(&mut self.rng, delay)
    }
}

/// A `/history` cursor as [`LiveOutput::Backfilled`] names it.
fn cursor_text(after_id: Option<&str>, after_ts: Option<EpochMs>) -> String {
    match (after_id, after_ts) {
        (Some(id), _) => format!("after_id={id}"),
        (None, Some(ts)) => format!("after={ts}"),
        (None, None) => "the start".to_owned(),
    }
}

/// `delay` ±20 %, from the seeded generator `rng` (splitmix64; advances it).
pub(crate) fn jitter(rng: &mut u64, delay: Duration) -> Duration {
    *rng = rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *rng;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    // 0.8 ..= 1.2 in 1/1000 steps.
    let permille = 800 + (z % 401);
    delay * u32::try_from(permille).unwrap_or(1000) / 1000
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};

    use super::*;

    #[test]
    fn runner_ids_round_trip_and_bad_values_are_dropped() {
        let id = RunnerId {
            host: "build-box.lan".into(),
            pid: Some(4242),
        };
        assert_eq!(id.to_header(), "host=build-box.lan;pid=4242");
        assert_eq!(RunnerId::parse(&id.to_header()), Some(id));
        assert_eq!(
            RunnerId::parse(" pid=7 ; host=h ; extra=1"),
            Some(RunnerId {
                host: "h".into(),
                pid: Some(7)
            })
        );
        assert_eq!(
            RunnerId::parse("host=h;pid=-3"),
            Some(RunnerId {
                host: "h".into(),
                pid: None
            })
        );
        assert_eq!(RunnerId::parse("pid=7"), None);
        assert_eq!(RunnerId::parse("host=;pid=7"), None);
        assert_eq!(RunnerId::parse("host=a b"), None);
        assert_eq!(RunnerId::parse(&format!("host={}", "h".repeat(254))), None);
        assert_eq!(
            serde_json::to_value(RunnerId::parse("host=h").unwrap()).unwrap(),
            serde_json::json!({"host": "h"})
        );
    }
    use crate::fuzzing::{LiveSim, LiveStep};
    use crate::test_support::proptest_config;

    fn message(id: &str, ts: EpochMs) -> Message {
        Message {
            id: id.into(),
            ts,
            to: None,
            from: Some("director".into()),
            title: None,
            body: id.into(),
            level: crate::domain::message::LogLevel::default(),
            data: serde_json::Map::new(),
            attachments: Vec::new(),
        }
    }

    fn drain(m: &mut LiveStream) -> Vec<LiveOutput> {
        std::iter::from_fn(|| m.poll_output()).collect()
    }

    fn delivered(outputs: &[LiveOutput]) -> Vec<String> {
        outputs
            .iter()
            .filter_map(|o| match o {
                LiveOutput::Deliver(m) => Some(m.id.clone()),
                _ => None,
            })
            .collect()
    }

    fn fetch(outputs: &[LiveOutput]) -> HistoryQuery {
        outputs
            .iter()
            .find_map(|o| match o {
                LiveOutput::Fetch(q) => Some(q.clone()),
                _ => None,
            })
            .expect("a fetch")
    }

    #[test]
    fn backoff_doubles_to_30_s_with_jitter_and_resets_after_a_healthy_connection() {
        let t0 = Instant::now();
        let mut m = LiveStream::new(LiveConfig::default(), t0);
        assert_eq!(
            drain(&mut m),
            vec![LiveOutput::Connect {
                last_event_id: None
            }]
        );
        let mut now = t0;
        let mut delays = Vec::new();
        for _ in 0..8 {
            m.handle_closed("refused", now);
            let out = drain(&mut m);
            let LiveOutput::Backoff { delay, .. } = out[0] else {
                panic!("{out:?}")
            };
            delays.push(delay);
            now = m.poll_timeout().unwrap();
            assert_eq!(now, now.max(t0));
            m.handle_timeout(now);
            assert!(matches!(drain(&mut m)[..], [LiveOutput::Connect { .. }]));
        }
        let base = [1, 2, 4, 8, 16, 30, 30, 30];
        for (d, b) in delays.iter().zip(base) {
            let b = Duration::from_secs(b);
            assert!(
                *d >= b * 8 / 10 && *d <= b * 12 / 10,
                "{d:?} not within 20 % of {b:?}"
            );
        }
        // Up 10 s: healthy, so the next delay is about 1 s again.
        m.handle_connected(true, None, now);
        now += Duration::from_secs(10);
        m.handle_frame(LiveFrame::Alive, now);
        m.handle_closed("stream ended", now);
        let out = drain(&mut m);
        let LiveOutput::Backoff { delay, .. } = out[0] else {
            panic!("{out:?}")
        };
        assert!(delay <= Duration::from_millis(1200), "{delay:?}");
    }

    #[test]
    fn the_same_seed_gives_the_same_jitter() {
        let t0 = Instant::now();
        let run = |seed| {
            let mut m = LiveStream::new(
                LiveConfig {
                    seed,
                    ..LiveConfig::default()
                },
                t0,
            );
            m.handle_closed("x", t0);
            drain(&mut m)
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn silence_drops_the_connection_and_the_last_id_goes_back_on_reconnect() {
        let t0 = Instant::now();
        let mut m = LiveStream::new(LiveConfig::default(), t0);
        drain(&mut m);
        m.handle_connected(true, Some(1_000_000), t0);
        m.handle_frame(LiveFrame::Message(message("a", 5)), t0);
        assert_eq!(delivered(&drain(&mut m)), ["a"]);
        let t1 = t0 + Duration::from_secs(30);
        m.handle_frame(LiveFrame::Alive, t1);
        assert_eq!(m.poll_timeout(), Some(t1 + Duration::from_secs(45)));
        m.handle_timeout(t1 + Duration::from_secs(44));
        assert!(drain(&mut m).is_empty());
        m.handle_timeout(t1 + Duration::from_secs(45));
        let out = drain(&mut m);
        assert!(
            matches!(&out[0], LiveOutput::Disconnect { reason } if reason == "nothing heard for 45 s"),
            "{out:?}"
        );
        m.handle_timeout(m.poll_timeout().unwrap());
        assert_eq!(
            drain(&mut m),
            vec![LiveOutput::Connect {
                last_event_id: Some("a".into())
            }]
        );
    }

    #[test]
    fn a_reset_backfills_from_history_in_order_and_holds_live_messages_meanwhile() {
        let t0 = Instant::now();
        let mut m = LiveStream::new(
            LiveConfig {
                page: 2,
                ..LiveConfig::default()
            },
            t0,
        );
        drain(&mut m);
        m.handle_connected(true, None, t0);
        m.handle_frame(LiveFrame::Message(message("a", 100)), t0);
        m.handle_closed("broker restarted", t0);
        m.handle_timeout(m.poll_timeout().unwrap());
        drain(&mut m);
        m.handle_connected(true, None, t0);
        m.handle_frame(LiveFrame::Reset(Reset::unknown_id("a")), t0);
        let q = fetch(&drain(&mut m));
        assert_eq!(q.path(), "/history?limit=1&before=100");
        // Live messages wait for the backfill.
        m.handle_frame(LiveFrame::Message(message("d", 103)), t0);
        assert!(delivered(&drain(&mut m)).is_empty());
        m.handle_history(q.id, vec![message("z", 99)], t0);
        let q = fetch(&drain(&mut m));
        assert_eq!(q.path(), "/history?limit=2&after_id=z");
        m.handle_history(q.id, vec![message("a", 100), message("b", 101)], t0);
        let out = drain(&mut m);
        assert_eq!(delivered(&out), ["b"], "a was delivered before");
        let q = fetch(&out);
        assert_eq!(q.path(), "/history?limit=2&after_id=b");
        m.handle_history(q.id, vec![message("c", 102), message("d", 103)], t0);
        let out = drain(&mut m);
        assert_eq!(delivered(&out), ["c", "d"]);
        let q = fetch(&out);
        m.handle_history(q.id, vec![], t0);
        let out = drain(&mut m);
        assert!(delivered(&out).is_empty(), "the held d was a duplicate");
        assert_eq!(
            out,
            [LiveOutput::Backfilled {
                from: "after_id=z".into(),
                delivered: 3
            }],
            "b, c and d came from /history"
        );
        assert!(!m.is_backfilling());
        m.handle_frame(LiveFrame::Message(message("e", 104)), t0);
        assert_eq!(delivered(&drain(&mut m)), ["e"]);
        assert_eq!(m.last_event_id(), Some("e"));
    }

    #[test]
    fn a_broker_that_cannot_replay_gets_the_newest_page_backfilled() {
        let t0 = Instant::now();
        let mut m = LiveStream::new(LiveConfig::default(), t0);
        drain(&mut m);
        m.handle_connected(false, None, t0);
        m.handle_frame(LiveFrame::Message(message("a", 100)), t0);
        m.handle_closed("x", t0);
        m.handle_timeout(m.poll_timeout().unwrap());
        drain(&mut m);
        m.handle_connected(false, None, t0);
        let q = fetch(&drain(&mut m));
        assert_eq!(q.path(), "/history?limit=100");
        m.handle_history(
            q.id,
            vec![
                message("c", 102),
                message("b", 101),
                message("a", 100),
                message("y", 1),
            ],
            t0,
        );
        let out = drain(&mut m);
        assert_eq!(delivered(&out), ["b", "c"]);
        assert!(
            out.contains(&LiveOutput::Backfilled {
                from: "newest-after=100".into(),
                delivered: 2
            }),
            "{out:?}"
        );
    }

    #[test]
    fn a_reconnect_before_any_message_backfills_from_the_first_connection() {
        let t0 = Instant::now();
        let mut m = LiveStream::new(LiveConfig::default(), t0);
        drain(&mut m);
        m.handle_connected(true, Some(1_700_000_000_456), t0);
        m.handle_closed("broker restarted", t0);
        m.handle_timeout(m.poll_timeout().unwrap());
        assert_eq!(
            drain(&mut m).last(),
            Some(&LiveOutput::Connect {
                last_event_id: None
            })
        );
        m.handle_connected(true, Some(1_700_000_009_000), t0);
        let q = fetch(&drain(&mut m));
        assert_eq!(q.path(), "/history?limit=100&after=1699999999999");
        m.handle_history(q.id, vec![message("a", 1_700_000_001_000)], t0);
        assert_eq!(delivered(&drain(&mut m)), ["a"]);
        assert!(!m.is_backfilling());
    }

    #[test]
    fn frames_decode_from_sse_and_websocket() {
        let reset = Reset::unknown_id("x");
        let json = reset.to_json();
        assert_eq!(
            json,
            r#"{"type":"reset","reason":"unknown-last-event-id","lastEventId":"x","detail":"no message with this id in the broker's log; live from now on, backfill from /history"}"#
        );
        assert_eq!(
            LiveFrame::from_sse("reset", &json),
            Ok(LiveFrame::Reset(reset.clone()))
        );
        assert_eq!(LiveFrame::from_ws_text(&json), Ok(LiveFrame::Reset(reset)));
        let m = message("a", 1);
        let text = serde_json::to_string(&m).unwrap();
        assert_eq!(
            LiveFrame::from_ws_text(&text),
            Ok(LiveFrame::Message(m.clone()))
        );
        assert_eq!(
            LiveFrame::from_sse("message", &text),
            Ok(LiveFrame::Message(m))
        );
        assert_eq!(LiveFrame::from_sse("ping", "x"), Ok(LiveFrame::Alive));
        assert!(LiveFrame::from_ws_text("[1]").is_err());
        assert!(LiveFrame::from_ws_text(r#"{"type":"reset"}"#).is_err());
    }

    /// The model: the broker's world is always ready for any step; [`LiveSim`] holds the
    /// broker's log and checks every delivery against it.
    struct LiveModel;

    impl ReferenceStateMachine for LiveModel {
        type State = ();
        type Transition = LiveStep;

        fn init_state() -> BoxedStrategy<()> {
            Just(()).boxed()
        }

        fn transitions(_: &()) -> BoxedStrategy<LiveStep> {
            prop_oneof![
                4 => Just(LiveStep::Push),
                2 => (0u16..2000).prop_map(LiveStep::Tick),
                3 => Just(LiveStep::Accept),
                1 => Just(LiveStep::Refuse),
                4 => (0u8..8).prop_map(LiveStep::Feed),
                1 => Just(LiveStep::Keepalive),
                1 => Just(LiveStep::Drop),
                3 => Just(LiveStep::Answer),
                1 => Just(LiveStep::FailFetch),
                1 => Just(LiveStep::Restart),
                1 => any::<u8>().prop_map(LiveStep::Restore),
                1 => Just(LiveStep::Fresh),
            ]
            .boxed()
        }

        fn apply(state: (), _: &LiveStep) {
            state
        }
    }

    impl StateMachineTest for LiveModel {
        type SystemUnderTest = LiveSim;
        type Reference = LiveModel;

        fn init_test(_: &()) -> LiveSim {
            LiveSim::new(42)
        }

        fn apply(mut sim: LiveSim, _: &(), step: LiveStep) -> LiveSim {
            sim.step(&step);
            sim
        }

        fn teardown(mut sim: LiveSim, _: ()) {
            sim.settle();
        }
    }

    prop_state_machine! {
        #![proptest_config(proptest_config("live_model"))]

        /// No message twice or out of order across any sequence of disconnects, replays,
        /// resets, backfills and database swaps; everything in the log delivered once calm.
        #[test]
        fn live_stream_delivers_each_message_once_in_order(sequential 1..120 => LiveModel);
    }
}
