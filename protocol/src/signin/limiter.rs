//! Failed-attempt limiting for sign-in (and any other guessable secret), per key.
//!
//! Contract (time is `now`, unix seconds, passed in):
//! * A key's window opens at its first failure and lasts [`LimiterConfig::window`] seconds
//!   (sign-in: [`SIGN_IN`], 15 minutes). While the window is open and holds
//!   [`LimiterConfig::max_failures`] failures (sign-in: 5), [`AttemptLimiter::check`] refuses the
//!   key with [`Locked`] until the window closes (`retry_after` seconds from `now`); attempts made
//!   while locked are not evaluated and do not extend the lock. When the window has closed the key
//!   starts afresh.
//! * [`AttemptLimiter::record_success`] clears the key (a member who signs in is not left one
//!   failure from a lock).
//! * The web login checks two keys per attempt — the member name and the client address — and
//!   records a failure on both, so a guesser is stopped per member and per address, and (unlike
//!   one global bucket for code-only logins) nobody can lock every member out at once.
//! * Memory: a key lives at most one window; [`AttemptLimiter::purge`] drops closed windows and
//!   [`AttemptLimiter::poll_timeout`] says when the next one closes.

use std::collections::BTreeMap;

/// Limits of one limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimiterConfig {
    /// Failures inside one window that lock the key.
    pub max_failures: u32,
    /// Length of the window in seconds, from the key's first failure.
    pub window: u64,
}

/// Sign-in attempts: 5 failures per 15 minutes.
pub const SIGN_IN: LimiterConfig = LimiterConfig {
    max_failures: 5,
    window: 15 * 60,
};

/// The key is locked for `retry_after` more seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many attempts; try again in {retry_after} s")]
pub struct Locked {
    /// Seconds until the window closes (at least 1).
    pub retry_after: u64,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    opened: u64,
    failures: u32,
}

/// Failure counts per key, each in its own window.
#[derive(Debug, Clone)]
pub struct AttemptLimiter<K: Ord> {
    config: LimiterConfig,
    buckets: BTreeMap<K, Bucket>,
}

impl<K: Ord> AttemptLimiter<K> {
    /// An empty limiter.
    pub fn new(config: LimiterConfig) -> Self {
        AttemptLimiter {
            config,
            buckets: BTreeMap::new(),
        }
    }

    fn closes(&self, b: &Bucket) -> u64 {
        b.opened.saturating_add(self.config.window)
    }

    fn open_bucket(&self, key: &K, now: u64) -> Option<&Bucket> {
        self.buckets.get(key).filter(|b| now < self.closes(b))
    }

    /// Whether `key` may attempt now.
    pub fn check(&self, key: &K, now: u64) -> Result<(), Locked> {
        match self.open_bucket(key, now) {
            Some(b) if b.failures >= self.config.max_failures => Err(Locked {
                retry_after: self.closes(b) - now,
            }),
            _ => Ok(()),
        }
    }

    /// Records a failed attempt of `key`; returns the lock when this failure reached the limit.
    pub fn record_failure(&mut self, key: K, now: u64) -> Result<(), Locked> {
        let fresh = self.open_bucket(&key, now).is_none();
        let bucket = self.buckets.entry(key).or_insert(Bucket {
            opened: now,
            failures: 0,
        });
        if fresh {
            *bucket = Bucket {
                opened: now,
                failures: 0,
            };
        }
        if bucket.failures < self.config.max_failures {
            bucket.failures += 1;
        }
        let bucket = *bucket;
        if bucket.failures >= self.config.max_failures {
            Err(Locked {
                retry_after: self.closes(&bucket) - now,
            })
        } else {
            Ok(())
        }
    }

    /// Clears `key` after a successful attempt.
    pub fn record_success(&mut self, key: &K) {
        self.buckets.remove(key);
    }

    /// Drops the keys whose window has closed.
    pub fn purge(&mut self, now: u64) {
        let window = self.config.window;
        self.buckets
            .retain(|_, b| now < b.opened.saturating_add(window));
    }

    /// When the next window closes (then [`AttemptLimiter::purge`] frees it).
    pub fn poll_timeout(&self) -> Option<u64> {
        self.buckets.values().map(|b| self.closes(b)).min()
    }

    /// Keys currently held.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000;

    #[test]
    fn locks_at_the_fifth_failure_until_the_window_closes() {
        let mut l = AttemptLimiter::new(SIGN_IN);
        for i in 0..4 {
            assert_eq!(l.check(&"alice", T0 + i), Ok(()));
            assert_eq!(l.record_failure("alice", T0 + i), Ok(()), "failure {i}");
        }
        assert_eq!(l.check(&"alice", T0 + 10), Ok(()));
        assert_eq!(
            l.record_failure("alice", T0 + 10),
            Err(Locked { retry_after: 890 })
        );
        assert_eq!(l.check(&"alice", T0 + 10), Err(Locked { retry_after: 890 }));
        // Last second of the window: still locked, 1 s to go.
        assert_eq!(l.check(&"alice", T0 + 899), Err(Locked { retry_after: 1 }));
        // The window closes at its first failure + 15 min.
        assert_eq!(l.check(&"alice", T0 + 900), Ok(()));
        // And the key starts afresh: one failure does not lock it again.
        assert_eq!(l.record_failure("alice", T0 + 900), Ok(()));
        assert_eq!(l.check(&"alice", T0 + 901), Ok(()));
        // Other keys were never affected.
        assert_eq!(l.check(&"bob", T0 + 10), Ok(()));
    }

    #[test]
    fn four_failures_spread_over_windows_never_lock() {
        let mut l = AttemptLimiter::new(SIGN_IN);
        for i in 0..4 {
            assert_eq!(l.record_failure("a", T0 + i), Ok(()));
        }
        // The fifth failure falls just after the window: a new window opens.
        assert_eq!(l.record_failure("a", T0 + 900), Ok(()));
        assert_eq!(l.check(&"a", T0 + 900), Ok(()));
    }

    #[test]
    fn success_clears_the_key() {
        let mut l = AttemptLimiter::new(SIGN_IN);
        for i in 0..4 {
            l.record_failure("a", T0 + i).expect("not locked yet");
        }
        l.record_success(&"a");
        for i in 0..4 {
            assert_eq!(l.record_failure("a", T0 + 10 + i), Ok(()));
        }
    }

    #[test]
    fn attempts_while_locked_do_not_extend_the_lock() {
        let mut l = AttemptLimiter::new(SIGN_IN);
        for _ in 0..5 {
            let _ = l.record_failure("a", T0);
        }
        assert_eq!(
            l.record_failure("a", T0 + 500),
            Err(Locked { retry_after: 400 })
        );
        assert_eq!(l.check(&"a", T0 + 900), Ok(()));
    }

    #[test]
    fn purge_frees_closed_windows() {
        let mut l = AttemptLimiter::new(SIGN_IN);
        l.record_failure("a", T0).expect("first");
        l.record_failure("b", T0 + 100).expect("first");
        assert_eq!(l.poll_timeout(), Some(T0 + 900));
        l.purge(T0 + 899);
        assert_eq!(l.len(), 2);
        l.purge(T0 + 900);
        assert_eq!(l.len(), 1);
        assert_eq!(l.poll_timeout(), Some(T0 + 1000));
        l.purge(T0 + 1000);
        assert!(l.is_empty());
    }
}
