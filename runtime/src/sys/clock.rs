//! Time: the wall clock, read in one place ([`now_ms`]; [`now_secs`] is the same reading in
//! whole seconds), and sleeping until a deadline that may not be set ([`sleep_until`]).

use ac7_protocol::{EpochMs, UnixSecs};
use tokio::time::Instant;

/// The wall clock now.
pub fn now_ms() -> EpochMs {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The wall clock now, in the sign-in machines' whole seconds (0 before 1970).
pub fn now_secs() -> UnixSecs {
    u64::try_from(now_ms().div_euclid(1000)).unwrap_or(0)
}

/// Sleeps until `deadline`; with none, never wakes (a `select!` arm for a machine's
/// `poll_timeout()` or an optional timer).
pub async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
