//! The oracle of the `trace_upload` fuzz target: the activity [`Uploader`](crate::trace::uploader::Uploader) against a simulated broker.

use std::time::{Duration, Instant};

use super::Input;
use crate::trace::activity::{ActivityEvent, ActivityUpload};
use crate::trace::uploader::{
    Batch, UploadResult, Uploader, UploaderConfig, UploaderLog, UploaderOutput,
};

/// An [`Uploader`] with small caps, a clock, and an account of every event it was given.
pub struct UploadSim {
    up: Uploader,
    config: UploaderConfig,
    now: Instant,
    next_ts: crate::EpochMs,
    /// Timestamps of accepted events, in order.
    accepted: Vec<crate::EpochMs>,
    delivered: Vec<crate::EpochMs>,
    /// The batch on the wire: id and its event timestamps.
    flying: Option<(u64, Vec<crate::EpochMs>)>,
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
        let before = self.drain();
        self.up.enqueue(&event, self.now);
        let refused = self.drain() > before;
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

    /// Takes every output: a batch goes on the wire, a log line is accounted for. Returns how
    /// many events were refused.
    fn drain(&mut self) -> usize {
        let mut refused = 0;
        while let Some(output) = self.up.poll_output() {
            let log = match output {
                UploaderOutput::Transmit(batch) => {
                    self.sent(batch);
                    continue;
                }
                UploaderOutput::Log(log) => log,
            };
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

    /// A batch the uploader sent: checks its caps and order and puts it on the wire.
    fn sent(&mut self, batch: Batch) {
        assert!(
            self.flying.is_none(),
            "a second batch while one is in flight"
        );
        let upload = ActivityUpload::parse(&batch.body).expect("a batch is a valid upload");
        assert_eq!(upload.events.len(), batch.events);
        assert!(batch.events >= 1 && batch.events <= self.config.batch_events);
        let json_bytes = batch.body.len() - 13 - (batch.events - 1);
        assert!(
            batch.events == 1 || json_bytes <= self.config.batch_bytes,
            "batch of {json_bytes} bytes"
        );
        let ts: Vec<crate::EpochMs> = upload.events.iter().map(ActivityEvent::ts).collect();
        assert!(ts.windows(2).all(|w| w[0] < w[1]), "reordered batch {ts:?}");
        if let (Some(first), Some(last)) = (ts.first(), self.delivered.last()) {
            assert!(first > last, "batch {ts:?} after delivered {last}");
        }
        self.flying = Some((batch.id, ts));
    }

    /// Takes what the uploader sent and logged and checks the caps and the books.
    fn step(&mut self) {
        self.drain();
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
