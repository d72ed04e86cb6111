//! Time: the wall clock, read in one place ([`now_ms`]), and sleeping until a deadline that may
//! not be set ([`sleep_until`]).

use tokio::time::Instant;

/// Current time in epoch milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Sleeps until `deadline`; with none, never wakes (a `select!` arm for a machine's
/// `poll_timeout()` or an optional timer).
pub async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
