//! The activity uploader: a sans-IO queue that turns recorded [`ActivityEvent`]s into
//! `POST /members/:name/activity` batches. Unlike the TypeScript runner's uploader, an oversized
//! event evicts nothing, a batch the broker refuses is not retried, and closing drains the whole
//! queue.
//!
//! - [`Uploader::enqueue`] serializes the event once and queues it. The queue holds at most
//!   `max_events` events and `max_bytes` bytes of JSON (UTF-8). When a new event does not fit,
//!   the oldest queued events are dropped (logged, with their count); an event larger than
//!   `max_bytes` on its own is refused (logged) and evicts nothing.
//! - A batch holds at most `batch_events` events and `batch_bytes` bytes (a single event larger
//!   than `batch_bytes` goes alone). It leaves at most `linger` after the first event that found
//!   an empty queue, at once when a full batch is waiting, and at once after a successful upload
//!   when events remain. One request is in flight at a time: a batch comes out of
//!   [`Uploader::poll_output`] as [`UploaderOutput::Transmit`] when it is due (after an input or
//!   [`Uploader::handle_timeout`]), and the next one only after its [`Uploader::handle_result`].
//! - [`Uploader::handle_result`]: a 2xx clears the batch. A network error, a 5xx, 408 or 429
//!   puts the batch back at the head and waits (200 ms doubling to 30 s, ±20 % seeded jitter).
//!   Any other status (400, 401, 403, 404, 413, …) drops that batch with one log line: the
//!   broker will not accept it later either, and the queue behind it keeps moving.
//! - [`Uploader::close`] stops accepting events and drains everything queued — several batches,
//!   retries included — until `close_deadline` has passed; then what is left is dropped (logged).
//!   [`Uploader::is_done`] says when the driver can stop.
//!
//! Contract: inputs `enqueue`, `handle_result` and `close`, each with `now` last; outputs (batches
//! to send and log lines, in order) drained with `poll_output` until `None`; timers via
//! `poll_timeout` / `handle_timeout(now)`.
//!
//! There is no idempotency key: a batch the broker committed whose response was lost is sent
//! again (the broker then stores it twice).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::activity::ActivityEvent;

/// The uploader's limits and timers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploaderConfig {
    /// Most events queued (the in-flight batch not counted). Default 1000.
    pub max_events: usize,
    /// Most bytes of event JSON queued (the in-flight batch not counted). Default 1 MiB.
    pub max_bytes: usize,
    /// Most events per upload. Default 50.
    pub batch_events: usize,
    /// Most bytes of event JSON per upload (one larger event goes alone). Default 64 KiB.
    pub batch_bytes: usize,
    /// Longest wait between the first queued event and its upload. Default 500 ms.
    pub linger: Duration,
    /// First retry delay. Default 200 ms.
    pub backoff_start: Duration,
    /// Longest retry delay. Default 30 s.
    pub backoff_max: Duration,
    /// How long [`Uploader::close`] keeps trying. Default 5 s.
    pub close_deadline: Duration,
    /// Seed of the jitter generator.
    pub seed: u64,
}

impl Default for UploaderConfig {
    fn default() -> Self {
        Self {
            max_events: 1000,
            max_bytes: 1 << 20,
            batch_events: 50,
            batch_bytes: 64 << 10,
            linger: Duration::from_millis(500),
            backoff_start: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            close_deadline: Duration::from_secs(5),
            seed: 0,
        }
    }
}

/// One upload to send: `POST /members/:name/activity` with `body` as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Names this batch in [`Uploader::handle_result`].
    pub id: u64,
    /// `{"events":[…]}`.
    pub body: Vec<u8>,
    /// How many events it carries.
    pub events: usize,
}

/// How an upload ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadResult {
    /// The broker answered with this status.
    Status(u16),
    /// No answer (connection refused, timeout, reset).
    Network(String),
}

/// Something for the driver, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UploaderOutput {
    /// Send this batch; answer with [`Uploader::handle_result`].
    Transmit(Batch),
    /// Log this line.
    Log(UploaderLog),
}

/// Something worth one log line.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UploaderLog {
    /// An event larger than the whole queue was not queued.
    Refused {
        /// Its size in bytes.
        bytes: usize,
    },
    /// The queue was full: this many of the oldest events were dropped.
    Evicted {
        /// How many.
        events: usize,
    },
    /// The broker refused a batch for good; it was dropped.
    Rejected {
        /// The status.
        status: u16,
        /// How many events it carried.
        events: usize,
    },
    /// An upload failed and will be retried.
    Retrying {
        /// Why.
        reason: String,
        /// The wait before the retry.
        delay: Duration,
    },
    /// An event recorded after [`Uploader::close`] was not queued.
    Closed,
    /// The close deadline passed: this many events were never uploaded.
    DroppedAtClose {
        /// How many.
        events: usize,
    },
}

/// The uploader. See the module docs.
#[derive(Debug, Clone)]
pub struct Uploader {
    config: UploaderConfig,
    /// Serialized events, oldest first.
    queue: VecDeque<String>,
    queued_bytes: usize,
    /// The batch on the wire: its id and its events (put back at the head on a retryable error).
    in_flight: Option<(u64, Vec<String>)>,
    next_id: u64,
    /// When the next batch may leave (set while events are queued).
    due: Option<Instant>,
    /// A retry wait in progress: no batch before this.
    backoff_until: Option<Instant>,
    backoff: Duration,
    rng: u64,
    /// Set by [`Uploader::close`]: the drain deadline.
    closing: Option<Instant>,
    /// The deadline passed (or everything drained after close).
    finished: bool,
    out: VecDeque<UploaderOutput>,
}

impl Uploader {
    /// An empty uploader.
    pub fn new(config: UploaderConfig) -> Self {
        let backoff = config.backoff_start;
        let rng = config.seed ^ 0x5851_F42D_4C95_7F2D;
        Self {
            config,
            queue: VecDeque::new(),
            queued_bytes: 0,
            in_flight: None,
            next_id: 0,
            due: None,
            backoff_until: None,
            backoff,
            rng,
            closing: None,
            finished: false,
            out: VecDeque::new(),
        }
    }

    /// Queues one event (see the module docs for the caps).
    pub fn enqueue(&mut self, event: &ActivityEvent, now: Instant) {
        if self.closing.is_some() {
            self.log(UploaderLog::Closed);
            return;
        }
        // Serializing our own types cannot fail (string keys, finite numbers).
        let json = serde_json::to_string(event).unwrap_or_default();
        self.enqueue_json(json, now);
        self.handle_timeout(now);
    }

    fn log(&mut self, line: UploaderLog) {
        self.out.push_back(UploaderOutput::Log(line));
    }

    fn enqueue_json(&mut self, json: String, now: Instant) {
        let size = json.len();
        if size > self.config.max_bytes || self.config.max_events == 0 {
            self.log(UploaderLog::Refused { bytes: size });
            return;
        }
        let mut evicted = 0;
        while self.queue.len() + 1 > self.config.max_events
            || self.queued_bytes + size > self.config.max_bytes
        {
            self.drop_oldest();
            evicted += 1;
        }
        if evicted > 0 {
            self.log(UploaderLog::Evicted { events: evicted });
        }
        self.queue.push_back(json);
        self.queued_bytes += size;
        let linger = now + self.config.linger;
        let due = match self.due {
            Some(due) => due.min(linger),
            None => linger,
        };
        self.due = Some(if self.full_batch_waiting() { now } else { due });
    }

    fn drop_oldest(&mut self) {
        if let Some(old) = self.queue.pop_front() {
            self.queued_bytes -= old.len();
        }
    }

    fn full_batch_waiting(&self) -> bool {
        self.queue.len() >= self.config.batch_events || self.queued_bytes >= self.config.batch_bytes
    }

    /// Queues the next batch to send, when one is due and none is in flight.
    fn send_due(&mut self, now: Instant) {
        if self.finished || self.in_flight.is_some() || self.queue.is_empty() {
            return;
        }
        if self.backoff_until.is_some_and(|at| now < at) {
            return;
        }
        self.backoff_until = None;
        let draining = self.closing.is_some();
        if !draining && self.due.is_some_and(|at| now < at) {
            return;
        }
        let mut events = Vec::new();
        let mut bytes = 0;
        while let Some(next) = self.queue.front() {
            let fits = events.len() < self.config.batch_events
                && (events.is_empty() || bytes + next.len() <= self.config.batch_bytes);
            if !fits {
                break;
            }
            bytes += next.len();
            self.queued_bytes -= next.len();
            events.extend(self.queue.pop_front());
        }
        self.due = None;
        let mut body = Vec::with_capacity(bytes + events.len() + 12);
        body.extend_from_slice(b"{\"events\":[");
        for (i, event) in events.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(event.as_bytes());
        }
        body.extend_from_slice(b"]}");
        let id = self.next_id;
        self.next_id += 1;
        let count = events.len();
        self.in_flight = Some((id, events));
        self.out.push_back(UploaderOutput::Transmit(Batch {
            id,
            body,
            events: count,
        }));
    }

    /// How the upload of batch `id` ended (results for other ids are ignored).
    pub fn handle_result(&mut self, id: u64, result: UploadResult, now: Instant) {
        let Some((flying, _)) = &self.in_flight else {
            return;
        };
        if *flying != id {
            return;
        }
        let Some((_, events)) = self.in_flight.take() else {
            return;
        };
        let retry = match result {
            UploadResult::Status(status) if (200..300).contains(&status) => None,
            UploadResult::Status(status @ (408 | 429 | 500..)) => Some(format!("status {status}")),
            UploadResult::Status(status) => {
                self.log(UploaderLog::Rejected {
                    status,
                    events: events.len(),
                });
                None
            }
            UploadResult::Network(reason) => Some(reason),
        };
        match retry {
            None => {
                self.backoff = self.config.backoff_start;
                if !self.queue.is_empty() {
                    self.due = Some(now);
                }
            }
            Some(reason) => {
                if self.finished {
                    return;
                }
                // Back at the head, in order; the caps then hold again by dropping the oldest.
                for event in events.into_iter().rev() {
                    self.queued_bytes += event.len();
                    self.queue.push_front(event);
                }
                let mut evicted = 0;
                while self.queue.len() > self.config.max_events
                    || self.queued_bytes > self.config.max_bytes
                {
                    self.drop_oldest();
                    evicted += 1;
                }
                if evicted > 0 {
                    self.log(UploaderLog::Evicted { events: evicted });
                }
                let delay = crate::session::live::jitter(&mut self.rng, self.backoff);
                self.backoff = (self.backoff * 2).min(self.config.backoff_max);
                self.backoff_until = Some(now + delay);
                self.due = Some(now + delay);
                self.log(UploaderLog::Retrying { reason, delay });
            }
        }
        self.handle_timeout(now);
    }

    /// Stops accepting events; everything queued is sent as fast as the broker takes it, until
    /// `close_deadline` from `now`.
    pub fn close(&mut self, now: Instant) {
        if self.closing.is_none() {
            self.closing = Some(now + self.config.close_deadline);
        }
        self.handle_timeout(now);
    }

    /// When [`Uploader::handle_timeout`] has something to do (a batch due, a retry, the close
    /// deadline).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.finished {
            return None;
        }
        let send = if self.in_flight.is_none() && !self.queue.is_empty() {
            match (self.closing, self.backoff_until, self.due) {
                (_, Some(at), _) => Some(at),
                (Some(_), None, _) => None, // draining: sent at once by the input that allowed it
                (None, None, due) => due,
            }
        } else {
            None
        };
        match (send, self.closing) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Time passed: a batch that is due is queued for sending; after close, the deadline or an
    /// empty queue finishes the uploader.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.finish_if_over(now);
        self.send_due(now);
    }

    fn finish_if_over(&mut self, now: Instant) {
        let Some(deadline) = self.closing else {
            return;
        };
        if self.finished {
            return;
        }
        let nothing_left = self.queue.is_empty() && self.in_flight.is_none();
        if nothing_left {
            self.finished = true;
        } else if now >= deadline {
            let left = self.queue.len() + self.in_flight.as_ref().map_or(0, |(_, e)| e.len());
            self.queue.clear();
            self.queued_bytes = 0;
            self.in_flight = None;
            self.finished = true;
            self.log(UploaderLog::DroppedAtClose { events: left });
        }
    }

    /// After [`Uploader::close`]: everything was sent, or the deadline passed.
    pub fn is_done(&self) -> bool {
        self.finished
    }

    /// The next output: a batch to send or a log line.
    pub fn poll_output(&mut self) -> Option<UploaderOutput> {
        self.out.pop_front()
    }

    /// Events queued (the in-flight batch not counted).
    pub fn queued_events(&self) -> usize {
        self.queue.len()
    }

    /// Bytes queued (the in-flight batch not counted).
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    /// Events in the batch on the wire.
    pub fn in_flight_events(&self) -> usize {
        self.in_flight.as_ref().map_or(0, |(_, e)| e.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(ts: crate::EpochMs, pad: usize) -> ActivityEvent {
        ActivityEvent::ObjectiveOpen {
            ts,
            objective_id: format!("o{ts}{}", "x".repeat(pad)),
        }
    }

    /// An uploader with a driver's view of its outputs: batches and log lines, each in order.
    struct Driven {
        up: Uploader,
        batches: VecDeque<Batch>,
        logs: VecDeque<UploaderLog>,
    }

    impl Driven {
        fn new(config: UploaderConfig) -> Self {
            Self {
                up: Uploader::new(config),
                batches: VecDeque::new(),
                logs: VecDeque::new(),
            }
        }

        fn collect(&mut self) {
            while let Some(output) = self.up.poll_output() {
                match output {
                    UploaderOutput::Transmit(batch) => self.batches.push_back(batch),
                    UploaderOutput::Log(line) => self.logs.push_back(line),
                }
            }
        }

        /// Time passes to `now`; then the next batch sent, if any.
        fn transmit(&mut self, now: Instant) -> Option<Batch> {
            self.up.handle_timeout(now);
            self.collect();
            self.batches.pop_front()
        }

        /// The next log line.
        fn log(&mut self) -> Option<UploaderLog> {
            self.collect();
            self.logs.pop_front()
        }
    }

    impl std::ops::Deref for Driven {
        type Target = Uploader;
        fn deref(&self) -> &Uploader {
            &self.up
        }
    }

    impl std::ops::DerefMut for Driven {
        fn deref_mut(&mut self) -> &mut Uploader {
            &mut self.up
        }
    }

    fn ts_of(batch: &Batch) -> Vec<crate::EpochMs> {
        let upload = super::super::activity::ActivityUpload::parse(&batch.body).unwrap();
        upload.events.iter().map(ActivityEvent::ts).collect()
    }

    #[test]
    fn batches_leave_after_linger_or_at_once_when_full() {
        let t0 = Instant::now();
        let mut up = Driven::new(UploaderConfig::default());
        up.enqueue(&open(1, 0), t0);
        assert_eq!(up.transmit(t0), None);
        assert_eq!(up.poll_timeout(), Some(t0 + Duration::from_millis(500)));
        let batch = up.transmit(t0 + Duration::from_millis(500)).unwrap();
        assert_eq!(ts_of(&batch), [1]);
        up.handle_result(batch.id, UploadResult::Status(200), t0);
        for ts in 2..=52 {
            up.enqueue(&open(ts, 0), t0);
        }
        let batch = up.transmit(t0).unwrap();
        assert_eq!(batch.events, 50);
        assert_eq!(up.transmit(t0), None, "one request in flight");
        up.handle_result(batch.id, UploadResult::Status(204), t0);
        assert_eq!(ts_of(&up.transmit(t0).unwrap()), [52], "rest at once");
    }

    #[test]
    fn an_event_over_the_cap_is_refused_and_evicts_nothing() {
        let t0 = Instant::now();
        let config = UploaderConfig {
            max_bytes: 1000,
            ..UploaderConfig::default()
        };
        let mut up = Driven::new(config);
        for ts in 1..=5 {
            up.enqueue(&open(ts, 10), t0);
        }
        up.enqueue(&open(6, 2000), t0);
        assert_eq!(up.log(), Some(UploaderLog::Refused { bytes: 2051 }));
        assert_eq!(up.queued_events(), 5);
        // A fitting event that needs room evicts only the oldest it must.
        up.enqueue(&open(7, 700), t0);
        assert_eq!(up.log(), Some(UploaderLog::Evicted { events: 1 }));
        let batch = up.transmit(t0 + Duration::from_secs(1)).unwrap();
        assert_eq!(ts_of(&batch), [2, 3, 4, 5, 7]);
    }

    #[test]
    fn a_rejected_batch_is_dropped_and_the_queue_moves_on() {
        let t0 = Instant::now();
        let config = UploaderConfig {
            batch_events: 2,
            ..UploaderConfig::default()
        };
        let mut up = Driven::new(config);
        for ts in 1..=4 {
            up.enqueue(&open(ts, 0), t0);
        }
        let first = up.transmit(t0).unwrap();
        up.handle_result(first.id, UploadResult::Status(400), t0);
        assert_eq!(
            up.log(),
            Some(UploaderLog::Rejected {
                status: 400,
                events: 2
            })
        );
        assert_eq!(ts_of(&up.transmit(t0).unwrap()), [3, 4]);
    }

    #[test]
    fn server_errors_back_off_and_retry_the_same_batch() {
        let t0 = Instant::now();
        let mut up = Driven::new(UploaderConfig::default());
        up.enqueue(&open(1, 0), t0);
        let mut now = t0 + Duration::from_millis(500);
        let mut delays = Vec::new();
        for status in [503, 429, 408] {
            let batch = up.transmit(now).unwrap();
            assert_eq!(ts_of(&batch), [1]);
            up.handle_result(batch.id, UploadResult::Status(status), now);
            let Some(UploaderLog::Retrying { delay, .. }) = up.log() else {
                panic!("no retry log");
            };
            delays.push(delay);
            assert_eq!(up.transmit(now), None);
            now += delay;
        }
        assert!(delays[0] >= Duration::from_millis(160) && delays[0] <= Duration::from_millis(240));
        assert!(delays[2] >= Duration::from_millis(640) && delays[2] <= Duration::from_millis(960));
        let batch = up.transmit(now).unwrap();
        up.handle_result(batch.id, UploadResult::Status(200), now);
        assert_eq!(up.queued_events() + up.in_flight_events(), 0);
    }

    #[test]
    fn close_drains_every_batch_including_one_in_flight() {
        let t0 = Instant::now();
        let mut up = Driven::new(UploaderConfig::default());
        for ts in 1..=120 {
            up.enqueue(&open(ts, 0), t0);
        }
        let first = up.transmit(t0).unwrap();
        up.close(t0);
        up.enqueue(&open(121, 0), t0);
        assert_eq!(up.log(), Some(UploaderLog::Closed));
        up.handle_result(first.id, UploadResult::Network("reset".into()), t0);
        let mut sent = Vec::new();
        let mut now = t0;
        while !up.is_done() {
            match up.transmit(now) {
                Some(batch) => {
                    sent.extend(ts_of(&batch));
                    up.handle_result(batch.id, UploadResult::Status(200), now);
                }
                None if up.is_done() => break,
                None => now = up.poll_timeout().unwrap(),
            }
        }
        assert_eq!(sent, (1..=120).collect::<Vec<_>>());
        assert!(now < t0 + Duration::from_secs(1));
    }

    #[test]
    fn close_gives_up_at_the_deadline() {
        let t0 = Instant::now();
        let mut up = Driven::new(UploaderConfig::default());
        up.enqueue(&open(1, 0), t0);
        up.close(t0);
        let mut now = t0;
        while !up.is_done() {
            match up.transmit(now) {
                Some(batch) => up.handle_result(batch.id, UploadResult::Status(502), now),
                None if up.is_done() => break,
                None => now = up.poll_timeout().unwrap(),
            }
        }
        assert_eq!(now, t0 + Duration::from_secs(5));
        let logs: Vec<_> = std::iter::from_fn(|| up.log()).collect();
        assert_eq!(
            logs.last(),
            Some(&UploaderLog::DroppedAtClose { events: 1 })
        );
    }
}
