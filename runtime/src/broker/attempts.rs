//! The sign-in limiter's memory, in the store.
//!
//! Every attempt at a guessable secret (a TOTP code, the setup code) loads the keys it can
//! touch into a fresh [`SignInGuard`], lets the guard check and count it, and writes back the
//! keys that changed, all in the transaction that also evaluates the secret. So brokers sharing
//! one database count exactly the same failures (on PostgreSQL the transaction first takes a
//! team-wide advisory lock, so two replicas never both pass a key's fifth failure), and a
//! restart forgets nothing. A row lives while its key holds something — an open window, a
//! lock, strikes remembered — and is dropped once the guard says it expires.
//!
//! Keys are stored as text: `a:<address>` for a client address, `m:<name>` for a member,
//! `*` for the team-wide nameless budget.

use ac7_protocol::signin::limiter::{
    Claim, KeyState, LockoutEvent, Refusal, SignInGuard, SignInKey, SignInStats,
};

use super::StoreError;
use super::store::conn::{Backend, Conn};
use crate::params;

/// The scope of the sign-in keys in `attempt_limits`.
const SIGNIN: &str = "signin";

/// The advisory lock every sign-in attempt takes on PostgreSQL (`ac7sign` in ASCII).
const SIGNIN_LOCK: i64 = 0x0061_6337_7369_676e;

fn key_text(key: &SignInKey) -> String {
    match key {
        SignInKey::Address(a) => format!("a:{a}"),
        SignInKey::Member(m) => format!("m:{m}"),
        SignInKey::Nameless => "*".to_owned(),
    }
}

fn key_of(text: &str) -> Option<SignInKey> {
    match text.split_once(':') {
        Some(("a", a)) => Some(SignInKey::Address(a.to_owned())),
        Some(("m", m)) => Some(SignInKey::Member(m.to_owned())),
        _ if text == "*" => Some(SignInKey::Nameless),
        _ => None,
    }
}

/// A guard holding the stored state of every key one attempt can touch.
#[derive(Debug)]
pub struct Attempt {
    guard: SignInGuard,
    loaded: Vec<(SignInKey, Option<KeyState>)>,
}

/// Loads the keys an attempt from `address` for `claim` is counted under, and every member's
/// key (a locked member is no candidate for a nameless code).
pub fn load(c: &Conn<'_>, address: &str, claim: Claim<'_>) -> Result<Attempt, StoreError> {
    if c.backend() == Backend::Postgres {
        c.execute("SELECT pg_advisory_xact_lock(?1)", params![SIGNIN_LOCK])?;
    }
    let mut keys = SignInGuard::keys(address, claim);
    keys.push(SignInKey::Nameless);
    let mut wanted: Vec<String> = keys.iter().map(key_text).collect();
    wanted.sort();
    wanted.dedup();
    let read = |r: &super::store::value::Row| -> Result<(String, KeyState), StoreError> {
        Ok((
            r.get::<String>(0)?,
            KeyState {
                opened: r.get::<Option<u64>>(1)?,
                failures: r.get(2)?,
                locked_until: r.get(3)?,
                strikes: r.get(4)?,
            },
        ))
    };
    const COLUMNS: &str = "SELECT key, opened, failures, locked_until, strikes FROM attempt_limits";
    let mut rows = c.query(
        &format!("{COLUMNS} WHERE scope = ?1 AND key >= 'm:' AND key < 'm;'"),
        params![SIGNIN],
        read,
    )?;
    for k in &wanted {
        if !k.starts_with("m:") {
            rows.extend(c.query_row(
                &format!("{COLUMNS} WHERE scope = ?1 AND key = ?2"),
                params![SIGNIN, k],
                read,
            )?);
        }
    }
    let mut guard = SignInGuard::default();
    let mut loaded: Vec<(SignInKey, Option<KeyState>)> = Vec::new();
    for (text, st) in rows {
        if let Some(key) = key_of(&text) {
            guard.restore(key.clone(), Some(st));
            loaded.push((key, Some(st)));
        }
    }
    for key in keys {
        if !loaded.iter().any(|(k, _)| *k == key) {
            loaded.push((key, None));
        }
    }
    Ok(Attempt { guard, loaded })
}

impl Attempt {
    /// Whether the attempt may be evaluated (see [`SignInGuard::check`]).
    pub fn check(&mut self, address: &str, claim: Claim<'_>, now: u64) -> Result<(), Refusal> {
        self.guard.check(address, claim, now)
    }

    /// Whether `member`'s own key is locked.
    pub fn member_locked(&self, member: &str, now: u64) -> bool {
        self.guard.member_locked(member, now)
    }

    /// Counts a failure under `claim`'s keys; returns the lockouts it started.
    pub fn fail(&mut self, address: &str, claim: Claim<'_>, now: u64) -> Vec<LockoutEvent> {
        self.track(SignInGuard::keys(address, claim));
        self.guard.handle_failure(address, claim, now)
    }

    /// Counts a success of `member` from `address`.
    pub fn pass(&mut self, address: &str, member: &str, now: u64) {
        self.track(vec![
            SignInKey::Address(address.to_owned()),
            SignInKey::Member(member.to_owned()),
        ]);
        self.guard.handle_success(address, member, now);
    }

    /// What this attempt added to the counters.
    pub fn stats(&self) -> SignInStats {
        self.guard.stats()
    }

    fn track(&mut self, keys: Vec<SignInKey>) {
        for key in keys {
            if !self.loaded.iter().any(|(k, _)| *k == key) {
                let st = self.guard.state(&key);
                self.loaded.push((key, st));
            }
        }
    }

    /// Writes back the keys the guard changed (dropping those that hold nothing any more) and
    /// forgets expired rows.
    pub fn save(&self, c: &Conn<'_>, now: u64) -> Result<(), StoreError> {
        let mut changed = false;
        for (key, before) in &self.loaded {
            let after = self.guard.state(key);
            if after == *before {
                continue;
            }
            changed = true;
            let text = key_text(key);
            match after {
                Some(st) if now < self.guard.expires(key, &st) => {
                    c.execute(
                        "INSERT INTO attempt_limits
                           (scope, key, opened, failures, locked_until, strikes, expires_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                         ON CONFLICT (scope, key) DO UPDATE SET opened = excluded.opened,
                           failures = excluded.failures, locked_until = excluded.locked_until,
                           strikes = excluded.strikes, expires_at = excluded.expires_at",
                        params![
                            SIGNIN,
                            text,
                            st.opened,
                            st.failures,
                            st.locked_until,
                            st.strikes,
                            self.guard.expires(key, &st)
                        ],
                    )?;
                }
                _ => {
                    c.execute(
                        "DELETE FROM attempt_limits WHERE scope = ?1 AND key = ?2",
                        params![SIGNIN, text],
                    )?;
                }
            }
        }
        if changed {
            c.execute(
                "DELETE FROM attempt_limits WHERE scope = ?1 AND expires_at <= ?2",
                params![SIGNIN, now],
            )?;
        }
        Ok(())
    }
}

/// Sign-in keys locked at `now`, across every broker on the store.
pub fn locked(c: &Conn<'_>, now: u64) -> Result<u64, StoreError> {
    Ok(c.query_row(
        "SELECT count(*) FROM attempt_limits WHERE scope = ?1 AND locked_until > ?2",
        params![SIGNIN, now],
        |r| r.get::<u64>(0),
    )?
    .unwrap_or(0))
}

/// How an attempt at a guessable secret came out.
pub enum Judged<'a, T, E> {
    /// The secret was right: the member named signed in (their key and the address are
    /// cleared).
    Passed(T, String),
    /// It was wrong: refuse with the error, counted under the claim.
    Failed(E, Claim<'a>),
}

/// Runs one attempt at a guessable secret under the sign-in limiter, in one transaction with
/// the limiter's keys (so every broker on the store counts the same failures): refused with
/// the [`Refusal`] while a key `asked` counts under is locked; else `judge` evaluates the
/// attempt (it may ask whether a member is locked) and the limiter counts what it judged. An
/// `Err` from `judge` counts as nothing and commits nothing. Each lockout started is logged
/// (one line per key); the broker's sign-in counters add what the attempt counted.
pub fn guarded<'a, T, E: From<StoreError> + From<Refusal>>(
    state: &super::AppState,
    address: &str,
    asked: Claim<'_>,
    now: u64,
    judge: impl FnOnce(&Conn<'_>, &dyn Fn(&str) -> bool) -> Result<Judged<'a, T, E>, E>,
) -> Result<T, E> {
    let (outcome, stats) = state.store.tx(|c| -> Result<_, E> {
        let mut a = load(c, address, asked)?;
        if let Err(r) = a.check(address, asked, now) {
            return Ok((Err(E::from(r)), a.stats()));
        }
        let judged = judge(c, &|member| a.member_locked(member, now))?;
        let outcome = match judged {
            Judged::Passed(t, member) => {
                a.pass(address, &member, now);
                Ok(t)
            }
            Judged::Failed(e, claim) => {
                for l in a.fail(address, claim, now) {
                    tracing::warn!(
                        locked = %l.key,
                        lock_secs = l.lock_secs,
                        strikes = l.strikes,
                        "sign-in locked after repeated failures"
                    );
                }
                Err(e)
            }
        };
        a.save(c, now)?;
        Ok((outcome, a.stats()))
    })?;
    state
        .signin_stats
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .add(stats);
    outcome
}

/// How many sign-in keys are locked at `now`, in a read transaction.
pub fn locked_now(store: &super::db::Store, now: u64) -> Result<u64, StoreError> {
    store.view(|c| locked(c, now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_texts_round_trip() {
        for k in [
            SignInKey::Address("10.0.0.1".into()),
            SignInKey::Address("2001:db8::/64".into()),
            SignInKey::Member("a:b".into()),
            SignInKey::Nameless,
        ] {
            assert_eq!(key_of(&key_text(&k)), Some(k));
        }
        assert_eq!(key_of("x:1"), None);
    }
}
