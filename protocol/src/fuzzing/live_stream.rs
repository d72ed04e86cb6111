//! The oracle of the `live_stream` fuzz target: a simulated broker, network and clock around the live stream.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::{Input, MAX_POLLS};

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
                crate::session::live::LiveOutput::Backfilled { .. } => {}
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
