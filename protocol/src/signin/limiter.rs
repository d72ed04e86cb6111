//! Failed-attempt limiting for sign-in (and any other guessable secret), per key, with
//! lockouts that double while the failures go on; and [`SignInGuard`], the keys a TOTP sign-in
//! is counted under.
//!
//! Contract of [`AttemptLimiter`] (time is `now`, unix seconds, passed in):
//! * A key's window opens at its first failure and lasts [`LimiterConfig::window`] seconds
//!   (sign-in: [`SIGN_IN`], 15 minutes). The failure that brings an open window to
//!   [`LimiterConfig::max_failures`] locks the key: [`AttemptLimiter::check`] refuses it with
//!   [`Locked`] (`retry_after` seconds from `now`) until the lock ends. Attempts made while
//!   locked are not evaluated, not counted, and do not extend the lock.
//! * The first lock lasts until the window closes. Each further lock of the same key (a
//!   *strike*) lasts twice the one before — `window · 2^(strikes−1)` from the failure that
//!   locked it — capped at [`LimiterConfig::max_lock`]. A key that stays quiet for `max_lock`
//!   after its last lock ends starts afresh (no strikes). With `max_lock <= window` every lock
//!   is just the window (no doubling).
//! * [`AttemptLimiter::record_success`] clears the key, strikes included.
//! * Memory: a key lives while its window is open, it is locked, or its strikes are
//!   remembered; [`AttemptLimiter::handle_timeout`] drops the rest and
//!   [`AttemptLimiter::poll_timeout`] says when the next key can go.
//!
//! Contract of [`SignInGuard`]: every attempt is counted under its client address (IPv4: the
//! address; IPv6: its /64, which one subscriber usually holds whole, see [`address_key`]), and
//! * a *named* attempt (`member` given) under that member;
//! * a *nameless* attempt (the code is tried against every member) under one team-wide key,
//!   so no number of source addresses buys more guesses: the team's nameless budget is
//!   [`NAMELESS`] (10 failures per window, doubling lockouts up to a day). While it is locked,
//!   nameless attempts get 429 and a member signs in with their name (their own budget is
//!   untouched by the guesser). A member whose own key is locked is no candidate for a nameless
//!   code ([`SignInGuard::member_locked`]), so a lock cannot be walked around by leaving the
//!   name out.
//! * A success clears the address and the member, never the team-wide nameless key (a member
//!   signing in must not hand a guesser a fresh budget).
//! * [`SignInGuard::handle_failure`] returns the lockouts the failure started, for the caller
//!   to log; [`SignInGuard::stats`] counts failures and lockouts for a metrics endpoint.

use crate::UnixSecs;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Limits of one limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimiterConfig {
    /// Failures inside one window that lock the key.
    pub max_failures: u32,
    /// Length of the window in seconds, from the key's first failure; also the first lock.
    pub window: u64,
    /// The longest lock in seconds (locks double up to it); also how long a quiet key keeps
    /// its strikes after its last lock ended.
    pub max_lock: u64,
}

/// One day: the longest sign-in lock.
const DAY: u64 = 24 * 60 * 60;

/// Sign-in attempts per member and per address: 5 failures per 15 minutes, then locks of
/// 15 min, 30 min, 1 h, … up to a day.
pub const SIGN_IN: LimiterConfig = LimiterConfig {
    max_failures: 5,
    window: 15 * 60,
    max_lock: DAY,
};

/// Sign-in attempts without a member name, for the whole team: 10 failures per 15 minutes,
/// then locks doubling up to a day.
pub const NAMELESS: LimiterConfig = LimiterConfig {
    max_failures: 10,
    window: 15 * 60,
    max_lock: DAY,
};

/// The key is locked for `retry_after` more seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many attempts; try again in {retry_after} s")]
pub struct Locked {
    /// Seconds until the lock ends (at least 1).
    pub retry_after: u64,
}

/// What a limiter remembers of one key: enough to keep it outside the process (in a database
/// several brokers share) and put it back with [`AttemptLimiter::restore`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyState {
    /// First failure of the open window (`None`: no window open).
    pub opened: Option<UnixSecs>,
    /// Failures in the open window.
    pub failures: u32,
    /// When the current (or last) lock ends.
    pub locked_until: UnixSecs,
    /// Locks so far (reset after `max_lock` of quiet).
    pub strikes: u32,
}

type Bucket = KeyState;

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

    /// The limits this limiter applies.
    pub fn config(&self) -> LimiterConfig {
        self.config
    }

    /// Whether `key` may attempt now.
    pub fn check(&self, key: &K, now: UnixSecs) -> Result<(), Locked> {
        match self.buckets.get(key) {
            Some(b) if now < b.locked_until => Err(Locked {
                retry_after: b.locked_until - now,
            }),
            _ => Ok(()),
        }
    }

    /// Records a failed attempt of `key`. `Err` when the key is locked after it; the lock is
    /// new (this failure started it) when `strikes_before < strikes` — see [`Lockout`].
    pub fn record_failure(&mut self, key: K, now: UnixSecs) -> Result<(), Lockout> {
        let config = self.config;
        let b = self.buckets.entry(key).or_default();
        if now < b.locked_until {
            return Err(Lockout {
                retry_after: b.locked_until - now,
                strikes: b.strikes,
                new: false,
            });
        }
        if b.strikes > 0 && now >= b.locked_until.saturating_add(config.max_lock) {
            b.strikes = 0;
        }
        let open = b
            .opened
            .filter(|&opened| now < opened.saturating_add(config.window));
        let opened = open.unwrap_or(now);
        b.opened = Some(opened);
        b.failures = if open.is_some() { b.failures + 1 } else { 1 };
        if b.failures < config.max_failures {
            return Ok(());
        }
        b.strikes = b.strikes.saturating_add(1);
        b.locked_until = if b.strikes == 1 {
            opened.saturating_add(config.window)
        } else {
            let factor = 1u64.checked_shl(b.strikes - 1).unwrap_or(u64::MAX);
            let lock = config.window.saturating_mul(factor);
            now.saturating_add(lock.min(config.max_lock.max(config.window)))
        };
        b.opened = None;
        b.failures = 0;
        Err(Lockout {
            retry_after: b.locked_until.saturating_sub(now).max(1),
            strikes: b.strikes,
            new: true,
        })
    }

    /// Clears `key` after a successful attempt.
    pub fn record_success(&mut self, key: &K, _now: UnixSecs) {
        self.buckets.remove(key);
    }

    /// Drops the keys that hold nothing any more: no open window, no lock, no strikes
    /// remembered.
    pub fn handle_timeout(&mut self, now: UnixSecs) {
        let config = self.config;
        self.buckets.retain(|_, b| now < Self::expiry(config, b));
    }

    /// When the next key can be dropped (then [`AttemptLimiter::handle_timeout`] frees it).
    pub fn poll_timeout(&self) -> Option<UnixSecs> {
        self.buckets
            .values()
            .map(|b| Self::expiry(self.config, b))
            .min()
    }

    /// When a bucket holds nothing any more: its window closed and its strikes forgotten.
    fn expiry(config: LimiterConfig, b: &Bucket) -> UnixSecs {
        let window = b.opened.map_or(0, |o| o.saturating_add(config.window));
        let strikes = if b.strikes > 0 {
            b.locked_until.saturating_add(config.max_lock)
        } else {
            0
        };
        window.max(strikes)
    }

    /// What the limiter holds for `key` (`None`: nothing, as for a key never seen).
    pub fn state(&self, key: &K) -> Option<KeyState> {
        self.buckets.get(key).copied()
    }

    /// Puts back what [`AttemptLimiter::state`] gave for `key` (`None` forgets the key).
    pub fn restore(&mut self, key: K, state: Option<KeyState>) {
        match state {
            Some(s) => {
                self.buckets.insert(key, s);
            }
            None => {
                self.buckets.remove(&key);
            }
        }
    }

    /// When `state` holds nothing any more under this limiter's limits (its window closed and
    /// its strikes forgotten): the time a store may drop it.
    pub fn expires(&self, state: &KeyState) -> UnixSecs {
        Self::expiry(self.config, state)
    }

    /// Whether `key` is locked at `now`.
    pub fn is_locked(&self, key: &K, now: UnixSecs) -> bool {
        self.check(key, now).is_err()
    }

    /// Keys locked at `now`.
    pub fn locked(&self, now: UnixSecs) -> usize {
        self.buckets
            .values()
            .filter(|b| now < b.locked_until)
            .count()
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

/// The state of a key after a counted failure locked it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lockout {
    /// Seconds until the lock ends (at least 1).
    pub retry_after: u64,
    /// Locks of this key so far, this one included.
    pub strikes: u32,
    /// Whether this failure started the lock (else the key was already locked).
    pub new: bool,
}

impl From<Lockout> for Locked {
    fn from(l: Lockout) -> Locked {
        Locked {
            retry_after: l.retry_after,
        }
    }
}

/// What a sign-in attempt is counted under.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum SignInKey {
    /// A client address ([`address_key`]).
    Address(String),
    /// A member, by name.
    Member(String),
    /// Every attempt without a member name, team-wide.
    Nameless,
}

impl std::fmt::Display for SignInKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SignInKey::Address(a) => write!(f, "address {a}"),
            SignInKey::Member(m) => write!(f, "member {m}"),
            SignInKey::Nameless => f.write_str("sign-ins without a member name"),
        }
    }
}

/// The key a client address is limited under: an IPv4 address as itself (an IPv4-mapped IPv6
/// address too), an IPv6 address as its /64 (`2001:db8:1:2::/64`), since one subscriber
/// usually holds a whole /64 and could otherwise take a fresh budget per address.
pub fn address_key(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                let prefix = std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
                format!("{prefix}/64")
            }
        },
    }
}

/// What an attempt claims to be, which decides the keys it counts under (besides its address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim<'a> {
    /// A code for this member (who exists and has TOTP: a name that is not such a member
    /// is counted as [`Claim::AnyMember`], so made-up names buy nothing).
    Member(&'a str),
    /// A code tried against every member: the team-wide nameless budget.
    AnyMember,
    /// A secret of no member (the one-time setup code): the address alone.
    NoMember,
}

/// A lock the guard refused an attempt with: which key, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The key that is locked.
    pub key: SignInKey,
    /// Seconds until it unlocks.
    pub retry_after: u64,
}

/// A lock a failure started (to log: one line per lockout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockoutEvent {
    /// The key now locked.
    pub key: SignInKey,
    /// How long it is locked, in seconds.
    pub lock_secs: u64,
    /// Locks of this key so far, this one included.
    pub strikes: u32,
}

/// Counters for a metrics endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SignInStats {
    /// Failed attempts that named a member (or no member at all: the setup code).
    pub named_failures: u64,
    /// Failed attempts without a member name.
    pub nameless_failures: u64,
    /// Attempts refused because a key was locked.
    pub refused: u64,
    /// Lockouts started.
    pub lockouts: u64,
}

impl SignInStats {
    /// Adds `other`'s counts (stats of guards rebuilt per attempt from a shared store).
    pub fn add(&mut self, other: SignInStats) {
        self.named_failures += other.named_failures;
        self.nameless_failures += other.nameless_failures;
        self.refused += other.refused;
        self.lockouts += other.lockouts;
    }
}

/// The sign-in limiter of a team: per address, per member, and one team-wide budget for
/// attempts without a member name (see the module docs).
#[derive(Debug, Clone)]
pub struct SignInGuard {
    per_key: AttemptLimiter<SignInKey>,
    nameless: AttemptLimiter<SignInKey>,
    stats: SignInStats,
}

impl Default for SignInGuard {
    fn default() -> Self {
        SignInGuard::new(SIGN_IN, NAMELESS)
    }
}

impl SignInGuard {
    /// A guard with `per_key` limits for addresses and members and `nameless` for the team.
    pub fn new(per_key: LimiterConfig, nameless: LimiterConfig) -> Self {
        SignInGuard {
            per_key: AttemptLimiter::new(per_key),
            nameless: AttemptLimiter::new(nameless),
            stats: SignInStats::default(),
        }
    }

    /// The keys an attempt from `address` for `claim` is counted under (the address first).
    pub fn keys(address: &str, claim: Claim<'_>) -> Vec<SignInKey> {
        let mut keys = vec![SignInKey::Address(address.to_owned())];
        match claim {
            Claim::Member(m) => keys.push(SignInKey::Member(m.to_owned())),
            Claim::AnyMember => keys.push(SignInKey::Nameless),
            Claim::NoMember => {}
        }
        keys
    }

    fn limiter(&self, key: &SignInKey) -> &AttemptLimiter<SignInKey> {
        match key {
            SignInKey::Nameless => &self.nameless,
            SignInKey::Address(_) | SignInKey::Member(_) => &self.per_key,
        }
    }

    fn limiter_mut(&mut self, key: &SignInKey) -> &mut AttemptLimiter<SignInKey> {
        match key {
            SignInKey::Nameless => &mut self.nameless,
            SignInKey::Address(_) | SignInKey::Member(_) => &mut self.per_key,
        }
    }

    /// What the guard holds for `key` (to keep it in a shared store).
    pub fn state(&self, key: &SignInKey) -> Option<KeyState> {
        self.limiter(key).state(key)
    }

    /// Puts back a key's state from a shared store (`None` forgets the key).
    pub fn restore(&mut self, key: SignInKey, state: Option<KeyState>) {
        self.limiter_mut(&key).restore(key, state);
    }

    /// When a store may drop `key` holding `state` (see [`AttemptLimiter::expires`]).
    pub fn expires(&self, key: &SignInKey, state: &KeyState) -> UnixSecs {
        self.limiter(key).expires(state)
    }

    /// Whether an attempt from `address` (an [`address_key`]) for `claim` may be evaluated
    /// now; a refusal is counted in [`SignInGuard::stats`].
    pub fn check(&mut self, address: &str, claim: Claim<'_>, now: UnixSecs) -> Result<(), Refusal> {
        for key in Self::keys(address, claim) {
            if let Err(l) = self.limiter(&key).check(&key, now) {
                self.stats.refused += 1;
                return Err(Refusal {
                    key,
                    retry_after: l.retry_after,
                });
            }
        }
        Ok(())
    }

    /// Whether `member`'s own key is locked (such a member is no candidate for a nameless
    /// code).
    pub fn member_locked(&self, member: &str, now: UnixSecs) -> bool {
        self.per_key
            .is_locked(&SignInKey::Member(member.to_owned()), now)
    }

    /// Counts a failed attempt; returns the lockouts it started.
    pub fn handle_failure(
        &mut self,
        address: &str,
        claim: Claim<'_>,
        now: UnixSecs,
    ) -> Vec<LockoutEvent> {
        match claim {
            Claim::Member(_) | Claim::NoMember => self.stats.named_failures += 1,
            Claim::AnyMember => self.stats.nameless_failures += 1,
        }
        let mut started = Vec::new();
        for key in Self::keys(address, claim) {
            if let Err(l) = self.limiter_mut(&key).record_failure(key.clone(), now)
                && l.new
            {
                self.stats.lockouts += 1;
                started.push(LockoutEvent {
                    key,
                    lock_secs: l.retry_after,
                    strikes: l.strikes,
                });
            }
        }
        started
    }

    /// Counts a success of `member` from `address`: clears both (never the nameless key).
    pub fn handle_success(&mut self, address: &str, member: &str, now: UnixSecs) {
        self.per_key
            .record_success(&SignInKey::Address(address.to_owned()), now);
        self.per_key
            .record_success(&SignInKey::Member(member.to_owned()), now);
    }

    /// Drops keys that hold nothing any more.
    pub fn handle_timeout(&mut self, now: UnixSecs) {
        self.per_key.handle_timeout(now);
        self.nameless.handle_timeout(now);
    }

    /// When [`SignInGuard::handle_timeout`] next frees a key.
    pub fn poll_timeout(&self) -> Option<UnixSecs> {
        self.per_key
            .poll_timeout()
            .into_iter()
            .chain(self.nameless.poll_timeout())
            .min()
    }

    /// Keys held (for bounding memory: the caller runs `handle_timeout` when this grows).
    pub fn len(&self) -> usize {
        self.per_key.len() + self.nameless.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.per_key.is_empty() && self.nameless.is_empty()
    }

    /// Failures, refusals and lockouts so far.
    pub fn stats(&self) -> SignInStats {
        self.stats
    }

    /// Keys locked at `now`.
    pub fn locked(&self, now: UnixSecs) -> usize {
        self.per_key.locked(now) + self.nameless.locked(now)
    }
}

#[cfg(test)]
mod tests;
