//! The objectives tracker: when the agent's open objectives may have changed, refresh them
//! (debounced) and say `notifications/tools/list_changed` when they did.
//!
//! Triggers ([`ObjectivesTracker::handle_trigger`]) are objective events on the live stream and
//! the tool calls that change objectives (create, complete, cancel, reassign). A burst of
//! triggers less than [`DEBOUNCE`] apart becomes one [`TrackerOutput::Refresh`], emitted
//! [`DEBOUNCE`] after the last trigger of the burst (trailing debounce: each trigger restarts the
//! timer). The application fetches the open set and reports it with
//! [`ObjectivesTracker::handle_refreshed`]; if it differs from the previous one the tracker emits
//! [`TrackerOutput::ListChanged`].
//!
//! One refresh at a time: a timer that fires while a refresh is in flight is remembered and a new
//! refresh starts as soon as the current one ends, so a change during a refresh is never missed
//! (the TypeScript runner drops such a firing). A failed refresh keeps the old set.

use std::time::{Duration, Instant};

/// The debounce delay: bursts of objective changes within 150 ms coalesce into one refresh.
pub const DEBOUNCE: Duration = Duration::from_millis(150);

/// Something for the application to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrackerOutput {
    /// Fetch the open objectives and report them with `handle_refreshed`.
    Refresh,
    /// The open set changed: send `notifications/tools/list_changed` to the agent.
    ListChanged,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Refresh {
    Idle,
    /// A refresh is in flight; `again` when a timer fired meanwhile.
    InFlight {
        again: bool,
    },
}

/// The tracker's state, generic over how an open objective is summarised (`T` compares equal
/// when nothing the agent sees about it changed).
///
/// Contract: every input takes `now` last — `handle_trigger`, `handle_timeout` (due at
/// [`poll_timeout`](Self::poll_timeout)) and `handle_refreshed`, the outcome of the fetch a
/// [`TrackerOutput::Refresh`] asked for. Outputs are drained from
/// [`poll_output`](Self::poll_output).
#[derive(Debug, Clone)]
pub struct ObjectivesTracker<T> {
    open: Vec<T>,
    deadline: Option<Instant>,
    refresh: Refresh,
    out: std::collections::VecDeque<TrackerOutput>,
}

impl<T: PartialEq> ObjectivesTracker<T> {
    /// A tracker that starts from the open set in the briefing.
    pub fn new(open: Vec<T>) -> Self {
        Self {
            open,
            deadline: None,
            refresh: Refresh::Idle,
            out: Default::default(),
        }
    }

    /// Something may have changed the open set: (re)start the debounce timer.
    pub fn handle_trigger(&mut self, now: Instant) {
        self.deadline = Some(now + DEBOUNCE);
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    /// Time passed; fires the debounce timer when it is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.deadline.is_none_or(|d| now < d) {
            return;
        }
        self.deadline = None;
        match self.refresh {
            Refresh::Idle => self.start_refresh(),
            Refresh::InFlight { .. } => self.refresh = Refresh::InFlight { again: true },
        }
    }

    /// The refresh finished: `Some(open)` with the fresh open set, `None` if it failed.
    pub fn handle_refreshed(&mut self, open: Option<Vec<T>>, _now: Instant) {
        let again = match self.refresh {
            Refresh::Idle => return,
            Refresh::InFlight { again } => again,
        };
        self.refresh = Refresh::Idle;
        if let Some(open) = open
            && open != self.open
        {
            self.open = open;
            self.out.push_back(TrackerOutput::ListChanged);
        }
        if again {
            self.start_refresh();
        }
    }

    /// The next thing to do, until `None`.
    pub fn poll_output(&mut self) -> Option<TrackerOutput> {
        self.out.pop_front()
    }

    /// The open set as last known.
    pub fn open(&self) -> &[T] {
        &self.open
    }

    fn start_refresh(&mut self) {
        self.refresh = Refresh::InFlight { again: false };
        self.out.push_back(TrackerOutput::Refresh);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::test_support::proptest_config;

    fn drain(t: &mut ObjectivesTracker<&'static str>) -> Vec<TrackerOutput> {
        std::iter::from_fn(|| t.poll_output()).collect()
    }

    #[test]
    fn a_burst_becomes_one_refresh_after_the_last_trigger() {
        let start = Instant::now();
        let mut t = ObjectivesTracker::new(vec!["obj-1"]);
        t.handle_trigger(start);
        t.handle_trigger(start + Duration::from_millis(100));
        t.handle_timeout(start + Duration::from_millis(150));
        assert!(drain(&mut t).is_empty(), "restarted by the second trigger");
        assert_eq!(t.poll_timeout(), Some(start + Duration::from_millis(250)));
        t.handle_timeout(start + Duration::from_millis(250));
        assert_eq!(drain(&mut t), vec![TrackerOutput::Refresh]);
        assert_eq!(t.poll_timeout(), None);

        t.handle_refreshed(Some(vec!["obj-1"]), start);
        assert!(drain(&mut t).is_empty(), "same set: nothing to say");
    }

    #[test]
    fn changed_set_says_list_changed_and_failure_keeps_the_old_set() {
        let now = Instant::now();
        let mut t = ObjectivesTracker::new(vec!["obj-1"]);
        t.handle_trigger(now);
        t.handle_timeout(now + DEBOUNCE);
        assert_eq!(drain(&mut t), vec![TrackerOutput::Refresh]);
        t.handle_refreshed(None, now);
        assert!(drain(&mut t).is_empty());
        assert_eq!(t.open(), ["obj-1"]);

        t.handle_trigger(now);
        t.handle_timeout(now + DEBOUNCE);
        drain(&mut t);
        t.handle_refreshed(Some(vec!["obj-1", "obj-2"]), now);
        assert_eq!(drain(&mut t), vec![TrackerOutput::ListChanged]);
        assert_eq!(t.open(), ["obj-1", "obj-2"]);
    }

    #[test]
    fn a_firing_during_a_refresh_runs_another_refresh_after_it() {
        let now = Instant::now();
        let mut t = ObjectivesTracker::new(vec![]);
        t.handle_trigger(now);
        t.handle_timeout(now + DEBOUNCE);
        assert_eq!(drain(&mut t), vec![TrackerOutput::Refresh]);
        t.handle_trigger(now + DEBOUNCE);
        t.handle_timeout(now + DEBOUNCE * 2);
        assert!(drain(&mut t).is_empty(), "one refresh at a time");
        t.handle_refreshed(Some(vec!["obj-9"]), now + DEBOUNCE * 2);
        assert_eq!(
            drain(&mut t),
            vec![TrackerOutput::ListChanged, TrackerOutput::Refresh]
        );
        t.handle_refreshed(Some(vec!["obj-9"]), now + DEBOUNCE * 3);
        assert!(drain(&mut t).is_empty());
    }

    proptest! {
        #![proptest_config(proptest_config("tracker"))]

        /// Triggers closer than the debounce form one burst; each burst refreshes exactly once.
        #[test]
        fn the_debounce_fires_once_per_burst(
            bursts in proptest::collection::vec(proptest::collection::vec(0u64..150, 1..8), 1..10),
            idle in 150u64..1000,
        ) {
            let start = Instant::now();
            let mut t = ObjectivesTracker::new(Vec::<u32>::new());
            let mut now = start;
            let mut refreshes = 0;
            let mut generation = 0u32;
            for burst in &bursts {
                for gap in burst {
                    now += Duration::from_millis(*gap);
                    // Time passes up to now: fire anything due first.
                    if let Some(due) = t.poll_timeout() && due <= now {
                        t.handle_timeout(due);
                    }
                    t.handle_trigger(now);
                }
                let due = t.poll_timeout().expect("a trigger arms the timer");
                prop_assert_eq!(due, now + DEBOUNCE);
                now += Duration::from_millis(idle);
                t.handle_timeout(due);
                while let Some(output) = t.poll_output() {
                    if output == TrackerOutput::Refresh {
                        refreshes += 1;
                        generation += 1;
                        t.handle_refreshed(Some(vec![generation]), now);
                    }
                }
            }
            prop_assert_eq!(refreshes, bursts.len());
        }
    }
}
