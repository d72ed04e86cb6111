//! The busy signal: which LLM calls are in flight, turned into ordered, debounced
//! `POST /presence/busy` reports (unlike the TypeScript runner's, ordered and debounced).
//!
//! - [`BusyReporter::llm_started`] / [`BusyReporter::llm_finished`] count calls per key (the
//!   trace host's connection id, say): a key started twice needs two finishes; finishing an
//!   unknown key does nothing. A key whose latest start is older than `stale_after` (default
//!   5 min) finishes by itself, logged ([`BusyOutput::Stale`]).
//! - The member is busy while any key is counted. Going busy is reported at once
//!   (`SetBusy(true)`); going idle only after `idle_debounce` (default 250 ms) of idleness, so a
//!   new call inside that window keeps the member busy without any report (rapid alternation
//!   does not post several times a second).
//! - While reported busy, `SetBusy(true)` repeats every `heartbeat` (default 10 s; the broker
//!   forgets a report after 30 s).
//! - The first report is `SetBusy(false)` at creation (clears a flag a crashed runner left);
//!   [`BusyReporter::close`] reports `false` once if the last report was `true`, then nothing.
//!
//! Reports come out in order; the driver sends them one at a time in that order (a late `true`
//! can never overtake a `false`).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// The reporter's timers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyConfig {
    /// Idleness needed before `SetBusy(false)`. Default 250 ms.
    pub idle_debounce: Duration,
    /// Repeat of `SetBusy(true)` while busy. Default 10 s.
    pub heartbeat: Duration,
    /// A key started this long ago finishes by itself. Default 5 min.
    pub stale_after: Duration,
}

impl Default for BusyConfig {
    fn default() -> Self {
        Self {
            idle_debounce: Duration::from_millis(250),
            heartbeat: Duration::from_secs(10),
            stale_after: Duration::from_secs(300),
        }
    }
}

/// Something for the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BusyOutput {
    /// `POST /presence/busy {"busy": …}`.
    SetBusy(bool),
    /// A key was in flight longer than `stale_after` and was finished (`count` calls).
    Stale {
        /// The key.
        key: u64,
        /// How many calls it still counted.
        count: u32,
    },
}

/// One key's calls in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InFlight {
    count: u32,
    /// The latest start.
    since: Instant,
}

/// What the reporter last told the broker, and what it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The last report was `false` (or is the queued first one).
    Idle,
    /// The last report was `true`: it repeats at `heartbeat`; `idle_since` is when the member
    /// went idle while still reported busy (the idle debounce runs from there).
    Busy {
        heartbeat: Instant,
        idle_since: Option<Instant>,
    },
    /// Closed: nothing is counted or reported any more.
    Closed,
}

/// The busy reporter. See the module docs.
///
/// Contract: inputs `llm_started`, `llm_finished` and `close`, each with `now` last; outputs
/// drained with `poll_output` until `None`; timers via `poll_timeout` / `handle_timeout(now)`.
#[derive(Debug, Clone)]
pub struct BusyReporter {
    config: BusyConfig,
    keys: BTreeMap<u64, InFlight>,
    state: State,
    out: VecDeque<BusyOutput>,
}

impl BusyReporter {
    /// A reporter whose first output is `SetBusy(false)`.
    pub fn new(config: BusyConfig) -> Self {
        Self {
            config,
            keys: BTreeMap::new(),
            state: State::Idle,
            out: VecDeque::from([BusyOutput::SetBusy(false)]),
        }
    }

    /// An LLM call under `key` started.
    pub fn llm_started(&mut self, key: u64, now: Instant) {
        if self.state == State::Closed {
            return;
        }
        let entry = self.keys.entry(key).or_insert(InFlight {
            count: 0,
            since: now,
        });
        entry.count = entry.count.saturating_add(1);
        entry.since = now;
        self.update(now);
    }

    /// An LLM call under `key` finished (unknown keys are ignored).
    pub fn llm_finished(&mut self, key: u64, now: Instant) {
        if self.state == State::Closed {
            return;
        }
        if let Some(entry) = self.keys.get_mut(&key) {
            entry.count -= 1;
            if entry.count == 0 {
                self.keys.remove(&key);
            }
        }
        self.update(now);
    }

    /// Whether a call is in flight.
    pub fn is_busy(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Calls in flight under `key`.
    pub fn count(&self, key: u64) -> u32 {
        self.keys.get(&key).map_or(0, |e| e.count)
    }

    fn update(&mut self, now: Instant) {
        let busy = self.is_busy();
        match &mut self.state {
            State::Idle if busy => self.report_busy(now, None),
            State::Busy { idle_since, .. } if busy => *idle_since = None,
            State::Busy { idle_since, .. } if idle_since.is_none() => *idle_since = Some(now),
            _ => {}
        }
        self.handle_timeout(now);
    }

    /// Reports `true` and schedules its repeat, keeping the idle debounce that runs, if any.
    fn report_busy(&mut self, now: Instant, idle_since: Option<Instant>) {
        self.state = State::Busy {
            heartbeat: now + self.config.heartbeat,
            idle_since,
        };
        self.out.push_back(BusyOutput::SetBusy(true));
    }

    /// Stale keys, the idle debounce and the heartbeat.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.state == State::Closed {
            return;
        }
        let stale: Vec<(u64, u32)> = self
            .keys
            .iter()
            .filter(|(_, e)| now.saturating_duration_since(e.since) >= self.config.stale_after)
            .map(|(k, e)| (*k, e.count))
            .collect();
        for (key, count) in stale {
            self.keys.remove(&key);
            self.out.push_back(BusyOutput::Stale { key, count });
            if self.keys.is_empty()
                && let State::Busy { idle_since, .. } = &mut self.state
                && idle_since.is_none()
            {
                *idle_since = Some(now);
            }
        }
        if let State::Busy {
            idle_since: Some(since),
            ..
        } = self.state
            && now.saturating_duration_since(since) >= self.config.idle_debounce
        {
            self.state = State::Idle;
            self.out.push_back(BusyOutput::SetBusy(false));
        }
        if let State::Busy {
            heartbeat,
            idle_since,
        } = self.state
            && now >= heartbeat
        {
            self.report_busy(now, idle_since);
        }
    }

    /// When [`BusyReporter::handle_timeout`] has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let (idle, heartbeat) = match self.state {
            State::Closed => return None,
            State::Idle => (None, None),
            State::Busy {
                heartbeat,
                idle_since,
            } => (
                idle_since.map(|s| s + self.config.idle_debounce),
                Some(heartbeat),
            ),
        };
        let stale = self
            .keys
            .values()
            .map(|e| e.since + self.config.stale_after)
            .min();
        [stale, idle, heartbeat].into_iter().flatten().min()
    }

    /// The runner stops: `SetBusy(false)` once if the last report was `true`; nothing after.
    /// (`now` is taken like every input's; closing keeps no time.)
    pub fn close(&mut self, _now: Instant) {
        if matches!(self.state, State::Busy { .. }) {
            self.out.push_back(BusyOutput::SetBusy(false));
        }
        self.keys.clear();
        self.state = State::Closed;
    }

    /// The next output.
    pub fn poll_output(&mut self) -> Option<BusyOutput> {
        self.out.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(b: &mut BusyReporter) -> Vec<BusyOutput> {
        std::iter::from_fn(|| b.poll_output()).collect()
    }

    #[test]
    fn rapid_alternation_posts_once_and_idle_after_debounce() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut b = BusyReporter::new(BusyConfig::default());
        assert_eq!(drain(&mut b), [BusyOutput::SetBusy(false)]);
        for i in 0..20 {
            b.llm_started(1, ms(i * 50));
            b.llm_finished(1, ms(i * 50 + 20));
        }
        assert_eq!(drain(&mut b), [BusyOutput::SetBusy(true)]);
        b.handle_timeout(ms(19 * 50 + 20 + 249));
        assert_eq!(drain(&mut b), []);
        assert_eq!(b.poll_timeout(), Some(ms(19 * 50 + 20 + 250)));
        b.handle_timeout(ms(19 * 50 + 20 + 250));
        assert_eq!(drain(&mut b), [BusyOutput::SetBusy(false)]);
        assert_eq!(b.poll_timeout(), None);
    }

    #[test]
    fn counts_per_key_heartbeat_stale_and_close() {
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        let mut b = BusyReporter::new(BusyConfig::default());
        drain(&mut b);
        b.llm_started(7, s(0));
        b.llm_started(7, s(1));
        b.llm_started(8, s(1));
        b.llm_finished(7, s(2));
        b.llm_finished(9, s(2));
        assert_eq!((b.count(7), b.count(8)), (1, 1));
        b.llm_finished(8, s(2));
        assert!(b.is_busy());
        b.handle_timeout(s(11));
        assert_eq!(
            drain(&mut b),
            [BusyOutput::SetBusy(true), BusyOutput::SetBusy(true)]
        );
        b.handle_timeout(s(301));
        let out = drain(&mut b);
        assert_eq!(out.first(), Some(&BusyOutput::Stale { key: 7, count: 1 }));
        assert!(!b.is_busy());
        // Still reported busy until the debounce passes; close says false once.
        b.close(s(302));
        assert_eq!(drain(&mut b).last(), Some(&BusyOutput::SetBusy(false)));
        b.close(s(303));
        b.llm_started(1, s(400));
        assert_eq!(drain(&mut b), []);
    }
}
