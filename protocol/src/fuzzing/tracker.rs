//! The oracle of the `tracker` fuzz target: the objectives tracker's debounce and refreshes.

use std::time::{Duration, Instant};

use super::{Input, MAX_POLLS};

/// `tracker`: fuzzer bytes as 2-byte operations `[kind, arg]` on an
/// [`crate::session::tracker::ObjectivesTracker`] over a "true" open set that changes only together with
/// a trigger (as objective events do): trigger (maybe changing the truth), time passing
/// (`arg` ms), the refresh in flight answered with the truth as it was when that refresh started,
/// or failed. Then the tracker settles: time runs to every timer and every refresh is answered.
///
/// Oracles: one refresh in flight at a time; a refresh starts only once [`crate::session::tracker::DEBOUNCE`]
/// passed since the last trigger (or right after the previous refresh, when a timer fired during
/// it); `ListChanged` exactly when an answered set differs from the one known before; a timer is
/// never left in the past; after settling nothing is pending, and unless a refresh failed since
/// the last trigger the tracker knows the true set (no change was missed).
pub fn tracker_ops(data: &[u8]) {
    use crate::session::tracker::{DEBOUNCE, ObjectivesTracker, TrackerOutput};
    let mut input = Input::new(data);
    let start = Instant::now();
    let mut now = start;
    let mut truth: Vec<u8> = Vec::new();
    let mut tracker: ObjectivesTracker<u8> = ObjectivesTracker::new(truth.clone());
    let mut in_flight = false;
    // What the refresh in flight read: the truth when it started (a fetch sees the state of
    // its time; a change after that needs the next refresh).
    let mut read = truth.clone();
    let mut last_trigger: Option<Instant> = None;
    // A timer fired while a refresh was in flight: the next refresh may start without a wait.
    let mut owed = false;
    // A refresh failed since the last trigger (a failed refresh keeps the old set, by design).
    let mut failed = false;
    let drain = |tracker: &mut ObjectivesTracker<u8>,
                 in_flight: &mut bool,
                 read: &mut Vec<u8>,
                 truth: &[u8],
                 owed: &mut bool,
                 last_trigger: Option<Instant>,
                 now: Instant,
                 before: &[u8]| {
        let mut polls = 0;
        while let Some(out) = tracker.poll_output() {
            polls += 1;
            assert!(polls <= MAX_POLLS, "poll_output does not terminate");
            match out {
                TrackerOutput::Refresh => {
                    assert!(!*in_flight, "a second refresh while one is in flight");
                    let waited = last_trigger.is_some_and(|t| now >= t + DEBOUNCE);
                    assert!(waited || *owed, "a refresh before the debounce");
                    *owed = false;
                    *in_flight = true;
                    *read = truth.to_vec();
                }
                TrackerOutput::ListChanged => {
                    assert_ne!(tracker.open(), before, "ListChanged without a change");
                }
            }
        }
    };
    let mut steps = 0;
    while !input.is_empty() && steps < 2_000 {
        steps += 1;
        let (kind, arg) = (input.below(5), input.byte());
        let before = tracker.open().to_vec();
        match kind {
            0 => {
                if arg % 2 == 1 {
                    truth = (0..arg % 5).collect();
                }
                tracker.handle_trigger(now);
                last_trigger = Some(now);
                failed = false;
            }
            1 | 2 => {
                now += Duration::from_millis(u64::from(arg));
                if tracker.poll_timeout().is_some_and(|at| at <= now) {
                    if in_flight {
                        owed = true;
                    }
                    tracker.handle_timeout(now);
                }
            }
            3 if in_flight => {
                in_flight = false;
                tracker.handle_refreshed(Some(read.clone()), now);
                assert_eq!(tracker.open(), read);
                let changed = before != read;
                let mut saw_change = false;
                let mut polls = 0;
                while let Some(out) = tracker.poll_output() {
                    polls += 1;
                    assert!(polls <= MAX_POLLS, "poll_output does not terminate");
                    match out {
                        TrackerOutput::ListChanged => saw_change = true,
                        TrackerOutput::Refresh => {
                            assert!(owed, "a refresh after a refresh nobody asked for");
                            owed = false;
                            in_flight = true;
                            read = truth.clone();
                        }
                    }
                }
                assert_eq!(
                    saw_change, changed,
                    "ListChanged must say whether the set changed"
                );
                continue;
            }
            4 if in_flight => {
                in_flight = false;
                failed = true;
                tracker.handle_refreshed(None, now);
                assert_eq!(tracker.open(), before, "a failed refresh changed the set");
            }
            _ => {}
        }
        drain(
            &mut tracker,
            &mut in_flight,
            &mut read,
            &truth,
            &mut owed,
            last_trigger,
            now,
            &before,
        );
        assert!(
            tracker.poll_timeout().is_none_or(|at| at > now),
            "a timer left in the past"
        );
    }
    // Settle: run every timer, answer every refresh with the truth.
    for _ in 0..16 {
        let before = tracker.open().to_vec();
        if in_flight {
            in_flight = false;
            tracker.handle_refreshed(Some(read.clone()), now);
        } else if let Some(at) = tracker.poll_timeout() {
            now = now.max(at);
            tracker.handle_timeout(now);
        } else {
            break;
        }
        let mut polls = 0;
        while let Some(out) = tracker.poll_output() {
            polls += 1;
            assert!(polls <= MAX_POLLS, "poll_output does not terminate");
            match out {
                TrackerOutput::Refresh => {
                    assert!(!in_flight, "a second refresh while one is in flight");
                    in_flight = true;
                    read = truth.clone();
                }
                TrackerOutput::ListChanged => assert_ne!(tracker.open(), before),
            }
        }
    }
    assert!(
        !in_flight && tracker.poll_timeout().is_none(),
        "the tracker never settled"
    );
    // The truth changes only with a trigger, and every trigger is followed by a refresh that
    // starts after it: unless one failed since, the last answer is the truth.
    if !failed {
        assert_eq!(tracker.open(), truth, "a change was missed");
    }
}
