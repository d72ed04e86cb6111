//! Web sign-in state in the store: browser sessions and members' TOTP secrets.
//!
//! * **Sessions.** A session id is 32 random bytes, base64url (43 characters); it travels only
//!   in the `ac7_session` cookie. The store keeps its SHA-256 (hex), never the id, so a copy of
//!   the database signs nobody in. A session lives [`SESSION_TTL`] after its last use (sliding:
//!   a cookie-authenticated request moves `expires_at` forward, at most once per
//!   [`slide_step`] so a busy browser does not write on every request). Logout and member
//!   removal delete it server-side; expired rows count as absent at once and are deleted at
//!   start and then hourly ([`spawn_purge`]).
//! * **TOTP secrets** (RFC 6238, base32) live in `member_totp`. There is no key-encryption key
//!   in ac7-rs: the secret is stored as text in the database, which is created `0600` in a
//!   `0700` directory like every other secret-bearing file (tokens are stored hashed, but a TOTP
//!   secret must be readable to verify a code). `last_step` is the replay guard: a code at or
//!   before it is refused. A re-enrollment is *pending* (`pending_secret`) until confirmed with a
//!   code from the new secret; only then does it replace the old one (and reset `last_step`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use base64::Engine as _;

use ac7_protocol::signin::limiter::{Claim, Refusal};

use super::AppState;
use super::attempts::Judged;
use super::db::StoreError;
use super::hub::Closed;
use super::store::Conn;
use super::tokens;

/// How long a session lives after its last use: 7 days.
pub const SESSION_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The prefix that marks a caller's credential id as a session (bearer callers carry a
/// token id; see `http::Caller::token_id`).
pub const SESSION_ID_PREFIX: &str = "session:";

/// Whether a caller's credential id is a browser session's (the web app's) rather than a
/// bearer token's.
pub fn is_browser(token_id: &str) -> bool {
    token_id.starts_with(SESSION_ID_PREFIX)
}

/// How often a running broker deletes expired sessions.
const PURGE_EVERY: Duration = Duration::from_secs(3600);

/// The smallest move of a sliding expiry worth a write: a sixtieth of the TTL, at most a minute.
pub fn slide_step(ttl_ms: i64) -> i64 {
    (ttl_ms / 60).clamp(1, 60_000)
}

/// A fresh session id (32 random bytes, base64url). Fails only without an OS entropy source.
pub fn new_session_id() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The stored key of a session id.
pub fn session_hash(id: &str) -> String {
    tokens::sha256_hex(id.as_bytes())
}

/// A live session as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    /// SHA-256 (hex) of the id.
    pub hash: String,
    /// Who signed in.
    pub member: String,
    /// Expiry (epoch ms).
    pub expires_at: i64,
}

/// Stores a new session of `member` for `ttl_ms`; returns the id (for the cookie) and the row.
pub fn session_create(
    c: &Conn<'_>,
    member: &str,
    user_agent: Option<&str>,
    now: i64,
    ttl_ms: i64,
) -> Result<(String, SessionRow), StoreError> {
    let id = new_session_id().map_err(|e| StoreError::Corrupt(format!("no entropy: {e}")))?;
    let row = SessionRow {
        hash: session_hash(&id),
        member: member.to_owned(),
        expires_at: now.saturating_add(ttl_ms),
    };
    c.execute(
        "INSERT INTO sessions (hash, member_name, created_at, expires_at, last_seen, user_agent)
         VALUES (?1, ?2, ?3, ?4, ?3, ?5)",
        crate::params![
            row.hash,
            row.member,
            now,
            row.expires_at,
            user_agent.map(|ua| ua.chars().take(256).collect::<String>())
        ],
    )?;
    Ok((id, row))
}

/// The live session with this id hash, if any (expired rows count as absent).
pub fn session_get(c: &Conn<'_>, hash: &str, now: i64) -> Result<Option<SessionRow>, StoreError> {
    c.query_row(
        "SELECT hash, member_name, expires_at FROM sessions WHERE hash = ?1 AND expires_at > ?2",
        crate::params![hash, now],
        |r| {
            Ok(SessionRow {
                hash: r.get(0)?,
                member: r.get(1)?,
                expires_at: r.get(2)?,
            })
        },
    )
}

/// Moves a session's expiry to `now + ttl_ms`.
pub fn session_slide(c: &Conn<'_>, hash: &str, now: i64, ttl_ms: i64) -> Result<(), StoreError> {
    c.execute(
        "UPDATE sessions SET expires_at = ?2, last_seen = ?3 WHERE hash = ?1",
        crate::params![hash, now.saturating_add(ttl_ms), now],
    )?;
    Ok(())
}

/// Deletes one session; whether it existed.
pub fn session_delete(c: &Conn<'_>, hash: &str) -> Result<bool, StoreError> {
    Ok(c.execute("DELETE FROM sessions WHERE hash = ?1", crate::params![hash])? == 1)
}

/// Deletes every session of a member (removed, or its sign-in secret replaced).
pub fn sessions_delete_member(c: &Conn<'_>, member: &str) -> Result<usize, StoreError> {
    c.execute(
        "DELETE FROM sessions WHERE member_name = ?1",
        crate::params![member],
    )
}

/// Deletes every session of `member` but the one hashed `keep` (the caller's own, if it is
/// one); returns the hashes deleted (their live streams are for the caller to end).
pub fn sessions_end_others(
    c: &Conn<'_>,
    member: &str,
    keep: Option<&str>,
) -> Result<Vec<String>, StoreError> {
    let hashes: Vec<String> = c.query(
        "SELECT hash FROM sessions WHERE member_name = ?1",
        crate::params![member],
        |r| r.get(0),
    )?;
    let mut gone = Vec::new();
    for hash in hashes {
        if keep == Some(hash.as_str()) {
            continue;
        }
        c.execute("DELETE FROM sessions WHERE hash = ?1", crate::params![hash])?;
        gone.push(hash);
    }
    Ok(gone)
}

/// Whether a live (unexpired) session has this id hash.
pub fn session_exists(c: &Conn<'_>, hash: &str, now: i64) -> Result<bool, StoreError> {
    c.exists(
        "SELECT 1 FROM sessions WHERE hash = ?1 AND expires_at > ?2",
        crate::params![hash, now],
    )
}

/// Deletes the sessions that expired before `now`; how many.
pub fn sessions_purge(c: &Conn<'_>, now: i64) -> Result<usize, StoreError> {
    c.execute(
        "DELETE FROM sessions WHERE expires_at <= ?1",
        crate::params![now],
    )
}

/// Who a session cookie (by its id's hash) signs in, as [`session_member`] found it.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionAuth {
    /// A live session of an existing member.
    Member(SessionRow, super::team::MemberRecord),
    /// No live session has this hash.
    Expired,
    /// The session is live but its member is gone.
    Orphan,
}

/// The live session with this id hash and its member (read only: the caller deletes an
/// orphan and slides the expiry).
pub fn session_member(c: &Conn<'_>, hash: &str, now: i64) -> Result<SessionAuth, StoreError> {
    let Some(row) = session_get(c, hash, now)? else {
        return Ok(SessionAuth::Expired);
    };
    Ok(match super::team::member_get(c, &row.member)? {
        Some(m) => SessionAuth::Member(row, m),
        None => SessionAuth::Orphan,
    })
}

/// Purges expired sessions now and then every hour while the broker runs.
pub fn spawn_purge(state: &Arc<AppState>) {
    let weak: Weak<AppState> = Arc::downgrade(state);
    tokio::spawn(async move {
        loop {
            let Some(state) = weak.upgrade() else { return };
            match state.store.tx(|c| sessions_purge(c, super::now_ms())) {
                Ok(0) => {}
                Ok(n) => tracing::debug!(sessions = n, "purged expired sessions"),
                Err(e) => tracing::warn!(error = %e, "cannot purge expired sessions"),
            }
            drop(state);
            tokio::time::sleep(PURGE_EVERY).await;
        }
    });
}

/// A member's sign-in secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TotpRow {
    /// The confirmed secret (base32), if any.
    pub secret: Option<String>,
    /// The last accepted time step (replay guard).
    pub last_step: Option<u64>,
    /// A secret issued by a re-enrollment, waiting for its confirming code.
    pub pending: Option<String>,
}

/// The TOTP row of `member`, if it has one.
pub fn totp_get(c: &Conn<'_>, member: &str) -> Result<Option<TotpRow>, StoreError> {
    c.query_row(
        "SELECT secret, last_step, pending_secret FROM member_totp WHERE member_name = ?1",
        crate::params![member],
        |r| {
            Ok(TotpRow {
                secret: r.get(0)?,
                last_step: r.get::<Option<i64>>(1)?.and_then(|s| u64::try_from(s).ok()),
                pending: r.get(2)?,
            })
        },
    )
}

/// Every member with a confirmed secret, in member creation order: `(name, secret, last_step)`.
pub fn totp_enrolled(c: &Conn<'_>) -> Result<Vec<(String, String, Option<u64>)>, StoreError> {
    c.query(
        "SELECT t.member_name, t.secret, t.last_step FROM member_totp t
         JOIN members m ON m.name = t.member_name
         WHERE t.secret IS NOT NULL ORDER BY m.seq",
        crate::params![],
        |r| {
            Ok((
                r.get::<String>(0)?,
                r.get::<String>(1)?,
                r.get::<Option<i64>>(2)?.and_then(|s| u64::try_from(s).ok()),
            ))
        },
    )
}

/// Whether any member can sign in with TOTP (else the team needs its first-admin setup).
pub fn totp_any(c: &Conn<'_>) -> Result<bool, StoreError> {
    c.exists(
        "SELECT 1 FROM member_totp t JOIN members m ON m.name = t.member_name
         WHERE t.secret IS NOT NULL",
        crate::params![],
    )
}

/// The one-time first-admin setup code while no member has TOTP: the stored one, else `fresh`
/// (stored now, so every broker on the store accepts and prints the same code). `None` once a
/// member has TOTP (the code is then dropped).
pub fn setup_code_open(c: &Conn<'_>, fresh: &str) -> Result<Option<String>, StoreError> {
    if totp_any(c)? {
        c.execute("DELETE FROM setup_code", crate::params![])?;
        return Ok(None);
    }
    c.execute(
        "INSERT INTO setup_code (id, code) VALUES (1, ?1) ON CONFLICT (id) DO NOTHING",
        crate::params![fresh],
    )?;
    setup_code_get(c)
}

/// The stored setup code, if any.
pub fn setup_code_get(c: &Conn<'_>) -> Result<Option<String>, StoreError> {
    c.query_row(
        "SELECT code FROM setup_code WHERE id = 1",
        crate::params![],
        |r| r.get(0),
    )
}

/// Whether `given` is the stored setup code (compared in constant time). The code is not used
/// up here: it stays valid until the first admin signs in with the secret it issued
/// ([`totp_login`] drops it then), so a reload before scanning shows the same secret again.
pub fn setup_code_matches(c: &Conn<'_>, given: &str) -> Result<bool, StoreError> {
    let Some(code) = setup_code_get(c)? else {
        return Ok(false);
    };
    let (stored, given) = (session_hash(&code), session_hash(given));
    Ok(ac7_protocol::signin::totp::constant_time_eq(
        stored.as_bytes(),
        given.as_bytes(),
    ))
}

/// The first admin's pending setup secret: the one issued already, else `fresh` (stored now
/// as `admin`'s pending secret). Asking again returns the same secret until it is confirmed.
pub fn setup_secret(c: &Conn<'_>, admin: &str, fresh: &str) -> Result<String, StoreError> {
    if let Some(pending) = totp_get(c, admin)?.and_then(|r| r.pending) {
        return Ok(pending);
    }
    totp_set_pending(c, admin, fresh)?;
    Ok(fresh.to_owned())
}

/// While the first-admin setup is open (a setup code exists and nobody has a confirmed
/// secret): the first admin and the pending secret setup issued them, if it did.
fn setup_candidate(c: &Conn<'_>) -> Result<Option<(String, String)>, StoreError> {
    if totp_any(c)? || setup_code_get(c)?.is_none() {
        return Ok(None);
    }
    let Some(admin) = super::team::managers(c)?.into_iter().next() else {
        return Ok(None);
    };
    Ok(totp_get(c, &admin)?
        .and_then(|r| r.pending)
        .map(|p| (admin, p)))
}

/// Sets `member`'s confirmed secret (replacing any, clearing the replay guard and any pending one).
pub fn totp_set(c: &Conn<'_>, member: &str, secret: &str) -> Result<(), StoreError> {
    c.execute(
        "INSERT INTO member_totp (member_name, secret, last_step, pending_secret) VALUES (?1, ?2, NULL, NULL)
         ON CONFLICT (member_name) DO UPDATE SET secret = excluded.secret, last_step = NULL, pending_secret = NULL",
        crate::params![member, secret],
    )?;
    Ok(())
}

/// Records a pending (unconfirmed) secret for `member`, keeping the confirmed one.
pub fn totp_set_pending(c: &Conn<'_>, member: &str, secret: &str) -> Result<(), StoreError> {
    c.execute(
        "INSERT INTO member_totp (member_name, secret, last_step, pending_secret) VALUES (?1, NULL, NULL, ?2)
         ON CONFLICT (member_name) DO UPDATE SET pending_secret = excluded.pending_secret",
        crate::params![member, secret],
    )?;
    Ok(())
}

/// Persists the last accepted step of `member`'s confirmed secret.
pub fn totp_accept_step(c: &Conn<'_>, member: &str, step: u64) -> Result<(), StoreError> {
    c.execute(
        "UPDATE member_totp SET last_step = ?2 WHERE member_name = ?1",
        crate::params![member, i64::try_from(step).unwrap_or(i64::MAX)],
    )?;
    Ok(())
}

/// Forgets `member`'s sign-in secrets (member removed).
pub fn totp_delete(c: &Conn<'_>, member: &str) -> Result<(), StoreError> {
    c.execute(
        "DELETE FROM member_totp WHERE member_name = ?1",
        crate::params![member],
    )?;
    Ok(())
}

/// Why a TOTP sign-in or confirmation was refused (nothing was written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TotpRefusal {
    /// The code matches no candidate (or a stored secret that does not decode).
    Invalid,
    /// The code was used already.
    Replayed,
    /// The code matches more than one member (a nameless sign-in).
    Ambiguous,
}

/// What a TOTP sign-in found: whether `member` (when named) has a confirmed secret, and the
/// signed-in member with its new session's id and row, or why not.
pub type LoginOutcome = (
    bool,
    Result<(super::team::MemberRecord, String, SessionRow), TotpRefusal>,
);

/// A TOTP sign-in attempt.
#[derive(Debug, Clone, Copy)]
pub struct LoginAttempt<'a> {
    /// The member named, if any.
    pub member: Option<&'a str>,
    /// The six-digit code.
    pub code: &'a str,
    /// Now, in Unix seconds (TOTP steps).
    pub now_secs: u64,
    /// The browser's user agent, kept with the session.
    pub user_agent: Option<&'a str>,
    /// Now, in epoch ms (the session's times).
    pub now_ms: i64,
    /// How long the new session lives.
    pub ttl_ms: i64,
}

/// Signs in with `a.code`: against the named member's secret, or without a name against
/// every member with a confirmed secret whose own sign-in key is not `locked`. While the
/// first-admin setup is open, the secret it issued (still pending) is a candidate too: the
/// first sign-in with it confirms it and uses the setup code up. On success the step is used
/// up and a session is created.
pub fn totp_login(
    c: &Conn<'_>,
    a: &LoginAttempt<'_>,
    locked: impl Fn(&str) -> bool,
) -> Result<LoginOutcome, StoreError> {
    use ac7_protocol::signin::totp::{self, TotpError};
    let LoginAttempt {
        member,
        code,
        now_secs,
        user_agent,
        now_ms,
        ttl_ms,
    } = *a;
    // (name, secret, last step, whether it is the first admin's pending setup secret)
    let mut enrolled: Vec<(String, String, Option<u64>, bool)> = totp_enrolled(c)?
        .into_iter()
        .map(|(n, s, l)| (n, s, l, false))
        .collect();
    if let Some((admin, pending)) = setup_candidate(c)? {
        enrolled.push((admin, pending, None, true));
    }
    let known = member.is_some_and(|name| enrolled.iter().any(|(n, ..)| n == name));
    let candidates = enrolled.into_iter().filter(|(n, ..)| match member {
        Some(name) => n == name,
        None => !locked(n),
    });
    let mut matched: Vec<(String, u64, Option<String>)> = Vec::new();
    let mut replayed = false;
    for (name, secret, last, setup) in candidates {
        let Ok(key) = totp::base32_decode(&secret) else {
            tracing::error!(member = %name, "stored TOTP secret is not base32");
            continue;
        };
        match totp::verify(&key, code, now_secs, last) {
            Ok(step) => matched.push((name, step, setup.then_some(secret))),
            Err(TotpError::Replayed) => replayed = true,
            Err(_) => {}
        }
    }
    let (name, step, setup) = match matched.len() {
        1 => matched.remove(0),
        0 if replayed => return Ok((known, Err(TotpRefusal::Replayed))),
        0 => return Ok((known, Err(TotpRefusal::Invalid))),
        _ => return Ok((known, Err(TotpRefusal::Ambiguous))),
    };
    let Some(m) = super::team::member_get(c, &name)? else {
        return Ok((known, Err(TotpRefusal::Invalid)));
    };
    if let Some(secret) = setup {
        // The first sign-in with the setup secret confirms it and closes the setup.
        totp_set(c, &name, &secret)?;
        c.execute("DELETE FROM setup_code", crate::params![])?;
        tracing::info!(member = %name, "first-admin setup confirmed by the first sign-in");
    }
    totp_accept_step(c, &name, step)?;
    let (id, row) = session_create(c, &name, user_agent, now_ms, ttl_ms)?;
    Ok((known, Ok((m, id, row))))
}

/// Why confirming a pending TOTP enrollment failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfirmError {
    /// The member has no pending secret.
    NoPending,
    /// The pending secret does not decode (a store fault).
    BadSecret(String),
    /// The code is not one of the pending secret.
    Refused(TotpRefusal),
}

/// Confirms `member`'s pending secret with `code` at `now_secs`: it becomes the member's
/// secret, with the code's step used up.
pub fn totp_confirm(
    c: &Conn<'_>,
    member: &str,
    code: &str,
    now_secs: u64,
) -> Result<Result<(), ConfirmError>, StoreError> {
    use ac7_protocol::signin::totp::{self, TotpError};
    let Some(pending) = totp_get(c, member)?.and_then(|r| r.pending) else {
        return Ok(Err(ConfirmError::NoPending));
    };
    let key = match totp::base32_decode(&pending) {
        Ok(key) => key,
        Err(e) => return Ok(Err(ConfirmError::BadSecret(e.to_string()))),
    };
    match totp::verify(&key, code, now_secs, None) {
        Ok(step) => {
            totp_set(c, member, &pending)?;
            totp_accept_step(c, member, step)?;
            Ok(Ok(()))
        }
        Err(TotpError::Replayed) => Ok(Err(ConfirmError::Refused(TotpRefusal::Replayed))),
        Err(TotpError::Malformed | TotpError::Invalid) => {
            Ok(Err(ConfirmError::Refused(TotpRefusal::Invalid)))
        }
    }
}

/// Why a sign-in, session or enrollment request was refused.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// A sign-in key the attempt counts under is locked.
    #[error("too many attempts")]
    Locked(Refusal),
    /// The code was refused.
    #[error("code refused")]
    Refused(TotpRefusal),
    /// The session is gone or expired.
    #[error("session expired")]
    Expired,
    /// The session's member no longer exists.
    #[error("session member no longer exists")]
    MemberGone,
    /// No such member.
    #[error("no such member: {0}")]
    NoSuchMember(String),
    /// The member has no pending enrollment to confirm.
    #[error("no pending enrollment for {0}: POST /members/{0}/enroll-totp first")]
    NoPending(String),
    /// The pending secret does not decode (a store fault).
    #[error("{0}")]
    BadSecret(String),
    /// The setup code is wrong.
    #[error("invalid setup code")]
    InvalidSetupCode,
    /// No member holds `members.manage`, so there is nobody to enroll.
    #[error("the team has no member holding members.manage to enroll")]
    NoAdmin,
    /// The first-admin setup is over.
    #[error("setup already done: sign in, or ask an admin to enroll you")]
    SetupDone,
    /// Store failure.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<Refusal> for SessionError {
    fn from(r: Refusal) -> Self {
        SessionError::Locked(r)
    }
}

/// The member signed in with the session whose id hashes to `hash`, at `now`, and whether
/// its expiry slid (it slides to `now + ttl` once it moved by at least [`slide_step`]). A
/// session whose member is gone is deleted.
pub fn cookie_session(
    store: &super::db::Store,
    hash: &str,
    now: i64,
    ttl_ms: i64,
) -> Result<(super::team::MemberRecord, bool), SessionError> {
    // Read first: most requests change nothing, and a read does not wait for the writer.
    let (row, member) = match store.view_small(|c| session_member(c, hash, now))? {
        SessionAuth::Member(row, member) => (row, member),
        SessionAuth::Expired => return Err(SessionError::Expired),
        SessionAuth::Orphan => {
            store.tx(|c| session_delete(c, hash))?;
            return Err(SessionError::MemberGone);
        }
    };
    // Slide when the expiry moved by at least a step (not a write per request).
    let slide = now.saturating_add(ttl_ms) - row.expires_at >= slide_step(ttl_ms);
    if slide {
        store.tx(|c| session_slide(c, hash, now, ttl_ms))?;
    }
    Ok((member, slide))
}

/// Signs in with a TOTP code ([`totp_login`]) under the sign-in limiter, from the client
/// address key `address`. A name that is no member with TOTP counts as a nameless guess.
pub fn sign_in(
    state: &AppState,
    address: &str,
    attempt: &LoginAttempt<'_>,
) -> Result<(super::team::MemberRecord, String, SessionRow), SessionError> {
    let asked = attempt.member.map_or(Claim::AnyMember, Claim::Member);
    super::attempts::guarded(
        state,
        address,
        asked,
        attempt.now_secs,
        |c, member_locked| {
            // A member whose own key is locked is no candidate for a nameless code.
            let (known, outcome) = totp_login(c, attempt, member_locked)?;
            Ok(match outcome {
                Ok((m, id, row)) => {
                    let name = m.name.clone();
                    Judged::Passed((m, id, row), name)
                }
                // A name that is no member with TOTP counts as a nameless guess: made-up names
                // buy nothing. (Such an attempt is still answered 401 after the nameless budget
                // locks, so no answer tells which names are members.)
                Err(r) => Judged::Failed(
                    SessionError::Refused(r),
                    match attempt.member {
                        Some(name) if known => Claim::Member(name),
                        Some(_) | None => Claim::AnyMember,
                    },
                ),
            })
        },
    )
}

/// Member `name` and, when `session_hash` names its session, when that expires (`None` for
/// a caller without a session).
pub fn current(
    store: &super::db::Store,
    name: &str,
    session_hash: Option<&str>,
    now: i64,
) -> Result<(super::team::MemberRecord, Option<i64>), SessionError> {
    store.view(|c| {
        let m = super::team::member_get(c, name)?.ok_or(SessionError::MemberGone)?;
        let expires = match session_hash {
            Some(hash) => Some(
                session_get(c, hash, now)?
                    .ok_or(SessionError::Expired)?
                    .expires_at,
            ),
            None => None,
        };
        Ok((m, expires))
    })
}

/// Ends the session whose id hashes to `hash` (expired or not) and, after the commit, the
/// live streams opened with it.
pub fn sign_out(state: &AppState, hash: &str) -> Result<(), StoreError> {
    let member = state.store.tx(|c| -> Result<_, StoreError> {
        let row = session_get(c, hash, i64::MIN)?;
        session_delete(c, hash)?;
        Ok(row.map(|r| r.member))
    })?;
    if let Some(member) = member {
        let token_id = format!("{SESSION_ID_PREFIX}{hash}");
        state.hub.close_token(&member, &token_id);
        state
            .activity_hub
            .close_owner(&member, Some(&token_id), Closed::Revoked);
        tracing::info!(%member, "signed out");
    }
    Ok(())
}

/// Keeps `secret` as member `name`'s pending TOTP secret; returns the team's name.
pub fn start_enrollment(
    store: &super::db::Store,
    name: &str,
    secret: &str,
) -> Result<String, SessionError> {
    store.tx(|c| {
        if !super::team::member_exists(c, name)? {
            return Err(SessionError::NoSuchMember(name.to_owned()));
        }
        totp_set_pending(c, name, secret)?;
        Ok(super::team::team_get(c)?
            .map(|t| t.name)
            .unwrap_or_default())
    })
}

/// Confirms member `name`'s pending secret with `code` ([`totp_confirm`]) under the
/// sign-in limiter; then every session of the member but `keep` ends, with its live
/// streams. Returns how many sessions ended.
pub fn confirm_enrollment(
    state: &AppState,
    address: &str,
    name: &str,
    code: &str,
    now_secs: u64,
    keep: Option<&str>,
) -> Result<usize, SessionError> {
    super::attempts::guarded(state, address, Claim::Member(name), now_secs, |c, _| {
        Ok(match totp_confirm(c, name, code, now_secs)? {
            Ok(()) => Judged::Passed((), name.to_owned()),
            Err(ConfirmError::NoPending) => return Err(SessionError::NoPending(name.to_owned())),
            Err(ConfirmError::BadSecret(e)) => return Err(SessionError::BadSecret(e)),
            Err(ConfirmError::Refused(r)) => {
                Judged::Failed(SessionError::Refused(r), Claim::Member(name))
            }
        })
    })?;
    // The old secret no longer signs anyone in: neither do the sessions it opened.
    let ended = state.store.tx(|c| sessions_end_others(c, name, keep))?;
    for hash in &ended {
        let token_id = format!("{SESSION_ID_PREFIX}{hash}");
        state.hub.close_token(name, &token_id);
        state
            .activity_hub
            .close_owner(name, Some(&token_id), Closed::Revoked);
    }
    Ok(ended.len())
}

/// Whether the first-admin setup is open: a setup code exists and nobody has TOTP yet.
pub fn setup_needed(store: &super::db::Store) -> Result<bool, StoreError> {
    store.view(|c| Ok(setup_code_get(c)?.is_some() && !totp_any(c)?))
}

/// Refuses once the first-admin setup is over.
pub fn setup_open(store: &super::db::Store) -> Result<(), SessionError> {
    if setup_needed(store)? {
        Ok(())
    } else {
        Err(SessionError::SetupDone)
    }
}

/// The first-admin setup under the sign-in limiter: with the right setup `code`, the first
/// member holding `members.manage` gets `fresh` as its pending secret (or keeps the pending
/// one it has). Returns the admin, its secret and the team's name.
pub fn first_admin_setup(
    state: &AppState,
    address: &str,
    code: &str,
    fresh: &str,
    now_secs: u64,
) -> Result<(String, String, String), SessionError> {
    super::attempts::guarded(state, address, Claim::NoMember, now_secs, |c, _| {
        if !setup_code_matches(c, code)? {
            return Ok(Judged::Failed(
                SessionError::InvalidSetupCode,
                Claim::NoMember,
            ));
        }
        let admin = super::team::managers(c)?
            .into_iter()
            .next()
            .ok_or(SessionError::NoAdmin)?;
        let secret = setup_secret(c, &admin, fresh)?;
        let team_name = super::team::team_get(c)?
            .map(|t| t.name)
            .unwrap_or_default();
        Ok(Judged::Passed((admin.clone(), secret, team_name), admin))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::db::Store;

    #[test]
    fn sessions_slide_expire_and_purge() {
        let store = Store::open_in_memory().unwrap();
        store
            .tx(|conn| {
                let (id, row) = session_create(conn, "ann", Some("ua"), 1_000, 100).unwrap();
                assert_eq!(id.len(), 43);
                assert_eq!(row.hash, session_hash(&id));
                // the id itself is not stored
                let stored = conn
                    .exists("SELECT 1 FROM sessions WHERE hash = ?1", crate::params![id])
                    .unwrap();
                assert!(!stored);
                assert_eq!(
                    session_get(conn, &row.hash, 1_099).unwrap().unwrap().member,
                    "ann"
                );
                assert!(session_get(conn, &row.hash, 1_100).unwrap().is_none());
                session_slide(conn, &row.hash, 1_050, 100).unwrap();
                assert!(session_exists(conn, &row.hash, 1_100).unwrap());
                assert_eq!(sessions_purge(conn, 1_149).unwrap(), 0);
                assert_eq!(sessions_purge(conn, 1_150).unwrap(), 1);
                let (_, r2) = session_create(conn, "ann", None, 0, 100).unwrap();
                assert!(session_delete(conn, &r2.hash).unwrap());
                assert!(!session_delete(conn, &r2.hash).unwrap());
                Ok::<_, StoreError>(())
            })
            .unwrap();
        assert_eq!(slide_step(SESSION_TTL.as_millis() as i64), 60_000);
        assert_eq!(slide_step(1_200), 20);
    }

    #[test]
    fn totp_pending_does_not_replace_until_set() {
        let store = Store::open_in_memory().unwrap();
        store
            .tx(|conn| {
                totp_set(conn, "ann", "AAAA").unwrap();
                totp_accept_step(conn, "ann", 7).unwrap();
                totp_set_pending(conn, "ann", "BBBB").unwrap();
                let row = totp_get(conn, "ann").unwrap().unwrap();
                assert_eq!(
                    row,
                    TotpRow {
                        secret: Some("AAAA".into()),
                        last_step: Some(7),
                        pending: Some("BBBB".into())
                    }
                );
                totp_set(conn, "ann", "BBBB").unwrap();
                let row = totp_get(conn, "ann").unwrap().unwrap();
                assert_eq!(
                    (row.secret.as_deref(), row.last_step, row.pending),
                    (Some("BBBB"), None, None)
                );
                // a member with only a pending secret cannot sign in
                totp_set_pending(conn, "bob", "CCCC").unwrap();
                assert_eq!(totp_get(conn, "bob").unwrap().unwrap().secret, None);
                Ok::<_, StoreError>(())
            })
            .unwrap();
    }
}
