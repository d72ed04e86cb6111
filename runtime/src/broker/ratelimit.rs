//! Per-member rate limits: a token bucket per member, with the time passed in.
//!
//! A bucket holds at most `burst` tokens and gains `per_second` tokens a second;
//! each message-creating request takes one. It is kept as the time at which the
//! bucket will be full again (`full_at`), which needs no floating point: taking a
//! token moves `full_at` one interval (`1 s / per_second`) later, and a request is
//! refused while `full_at` is more than `burst` intervals ahead of now.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A rate: `per_second` sustained, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Tokens gained per second (at least 1).
    pub per_second: u32,
    /// Bucket size (at least 1).
    pub burst: u32,
}

impl Rate {
    fn interval(self) -> Duration {
        Duration::from_secs(1) / self.per_second.max(1)
    }

    fn window(self) -> Duration {
        self.interval() * self.burst.max(1)
    }
}

/// One member's bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    full_at: Instant,
}

impl Bucket {
    /// A full bucket.
    pub fn new(now: Instant) -> Bucket {
        Bucket { full_at: now }
    }

    /// Takes one token, or says how long until one is there.
    pub fn take(&mut self, rate: Rate, now: Instant) -> Result<(), Duration> {
        let base = self.full_at.max(now);
        let next = base + rate.interval();
        let ahead = next - now;
        if ahead > rate.window() {
            return Err(ahead - rate.window());
        }
        self.full_at = next;
        Ok(())
    }

    /// Whether the bucket is full at `now` (so it can be forgotten).
    pub fn is_full(&self, now: Instant) -> bool {
        self.full_at <= now
    }
}

/// Buckets per member; `None` rate means no limit.
#[derive(Debug)]
pub struct Limiter {
    rate: Option<Rate>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Limiter {
    /// A limiter at `rate` (`None`: unlimited).
    pub fn new(rate: Option<Rate>) -> Limiter {
        Limiter {
            rate,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// The rate, if limited.
    pub fn rate(&self) -> Option<Rate> {
        self.rate
    }

    /// Takes a token for `member`, or says how long to wait.
    pub fn take(&self, member: &str, now: Instant) -> Result<(), Duration> {
        let Some(rate) = self.rate else {
            return Ok(());
        };
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() > 10_000 {
            buckets.retain(|_, b| !b.is_full(now));
        }
        match buckets.get_mut(member) {
            Some(b) => b.take(rate, now),
            None => {
                let mut b = Bucket::new(now);
                let r = b.take(rate, now);
                buckets.insert(member.to_owned(), b);
                r
            }
        }
    }
}

/// Whole seconds to put in `Retry-After` for a wait (rounded up, at least 1).
pub fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: Rate = Rate {
        per_second: 10,
        burst: 3,
    };

    #[test]
    fn a_full_bucket_gives_exactly_burst_at_once() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        for _ in 0..3 {
            assert_eq!(b.take(RATE, t0), Ok(()));
        }
        // the fourth waits exactly one interval
        assert_eq!(b.take(RATE, t0), Err(Duration::from_millis(100)));
        // one nanosecond short of the interval: still refused, by a nanosecond
        let almost = t0 + Duration::from_millis(100) - Duration::from_nanos(1);
        assert_eq!(b.take(RATE, almost), Err(Duration::from_nanos(1)));
        // at the interval: one token, and only one
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(b.take(RATE, t1), Ok(()));
        assert!(b.take(RATE, t1).is_err());
    }

    #[test]
    fn refill_is_capped_at_burst() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        assert_eq!(b.take(RATE, t0), Ok(()));
        // a long pause refills to burst, not beyond
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert_eq!(b.take(RATE, later), Ok(()));
        }
        assert!(b.take(RATE, later).is_err());
        assert!(!b.is_full(later));
        assert!(b.is_full(later + Duration::from_millis(300)));
    }

    #[test]
    fn sustained_rate_is_per_second() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        let mut ok = 0;
        // one attempt per millisecond for 10 s: burst + 10/s * 10 s
        for ms in 0..10_000u64 {
            if b.take(RATE, t0 + Duration::from_millis(ms)).is_ok() {
                ok += 1;
            }
        }
        assert_eq!(ok, 3 + 100 - 1);
    }

    #[test]
    fn limiter_keeps_members_apart_and_none_is_unlimited() {
        let t0 = Instant::now();
        let l = Limiter::new(Some(Rate {
            per_second: 1,
            burst: 1,
        }));
        assert!(l.take("a", t0).is_ok());
        assert_eq!(l.take("a", t0), Err(Duration::from_secs(1)));
        assert!(l.take("b", t0).is_ok());
        let open = Limiter::new(None);
        for _ in 0..1000 {
            assert!(open.take("a", t0).is_ok());
        }
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
