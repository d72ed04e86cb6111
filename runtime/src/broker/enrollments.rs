//! Device-code enrollments (`ac7 connect`) in the store.
//!
//! The enrollment desk is the sans-IO [`EnrollStore`] plus a per-address mint limit. Each
//! request loads the live enrollments (at most [`EnrollConfig::max_pending`]) and the
//! address's mint count into a fresh desk inside one transaction, lets the desk decide, and
//! writes back what changed; grants that expired uncollected are revoked in the same
//! transaction. So every broker on the store sees the same enrollments (a device may poll any
//! replica, an admin approve on any other), nothing is decided twice (on PostgreSQL the
//! transaction first takes a team-wide advisory lock), and a restart forgets nothing.
//!
//! Rows are keyed by the SHA-256 of the device code, never the code itself. An approved row
//! holds the device's new token until the device collects it with its next poll (then the row
//! goes) or the enrollment expires (then the token is revoked).

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use ac7_protocol::domain::permission::PermissionSet;
use ac7_protocol::signin::enroll::{
    CreateError, Created, DEVICE_CODE_PREFIX, DEVICE_RANDOM_BYTES, DecideError, EnrollConfig,
    EnrollOutput, EnrollRecord, EnrollState, EnrollStore, PendingView, PollOutcome,
    USER_RANDOM_BYTES, normalize_user_code,
};
use ac7_protocol::signin::limiter::{AttemptLimiter, KeyState, LimiterConfig};

use super::bootstrap::{AdminError, add_member, new_member_record};
use super::sessions::session_hash;
use super::store::conn::{Backend, Conn};
use super::store::value::Row;
use super::team::{self, MemberRecord, Role, TokenInfo};
use super::{AppState, StoreError, now_secs};
use crate::params;

/// Enrollments one client address may start per hour.
pub const MINTS: LimiterConfig = LimiterConfig {
    max_failures: 10,
    window: 3600,
    max_lock: 3600,
};

/// The scope of the mint counts in `attempt_limits`.
const SCOPE: &str = "enroll";

/// The advisory lock every enrollment request takes on PostgreSQL (`ac7enrl` in ASCII).
const LOCK: i64 = 0x0061_6337_656e_726c;

/// What an approval hands the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The device's new token (plaintext, until collected).
    pub token: String,
    /// Its id.
    pub token_id: String,
}

/// The enrollments and one address's mint count, loaded for one request.
#[derive(Debug)]
pub struct Desk {
    /// The enrollments.
    pub store: EnrollStore<Grant>,
    /// The user agent that started each enrollment, by stored user code.
    pub user_agents: BTreeMap<String, String>,
    /// Mints per address (only the loaded address is saved).
    pub mints: AttemptLimiter<String>,
    loaded: BTreeMap<String, (EnrollRecord<Grant>, Option<String>)>,
    mint_key: Option<(String, Option<KeyState>)>,
}

/// The key a device polls with: the hash of its device code.
pub fn device_key(device_code: &str) -> String {
    session_hash(device_code)
}

fn record_of(r: &Row) -> Result<(String, EnrollRecord<Grant>, Option<String>), StoreError> {
    let state = match r.get::<String>(6)?.as_str() {
        "pending" => EnrollState::Pending {
            last_poll: r.get(7)?,
        },
        "approved" => EnrollState::Approved {
            member: r.get::<Option<String>>(8)?.unwrap_or_default(),
            grant: Grant {
                token_id: r.get::<Option<String>>(9)?.unwrap_or_default(),
                token: r.get::<Option<String>>(10)?.unwrap_or_default(),
            },
        },
        "denied" => EnrollState::Denied {
            reason: r.get::<Option<String>>(11)?.unwrap_or_default(),
        },
        other => return Err(StoreError::Corrupt(format!("enrollment state {other:?}"))),
    };
    Ok((
        r.get(0)?,
        EnrollRecord {
            user_code: r.get(1)?,
            address: r.get(2)?,
            label: r.get(3)?,
            created_at: r.get(4)?,
            expires_at: r.get(5)?,
            state,
        },
        r.get(12)?,
    ))
}

/// Loads the live enrollments, and `address`'s mint count when given.
pub fn load(c: &Conn<'_>, config: EnrollConfig, address: Option<&str>) -> Result<Desk, StoreError> {
    if c.backend() == Backend::Postgres {
        c.execute("SELECT pg_advisory_xact_lock(?1)", params![LOCK])?;
    }
    let mut desk = Desk {
        store: EnrollStore::new(config),
        user_agents: BTreeMap::new(),
        mints: AttemptLimiter::new(MINTS),
        loaded: BTreeMap::new(),
        mint_key: None,
    };
    let rows = c.query(
        "SELECT device_code_hash, user_code, address, label, created_at, expires_at, state,
                last_poll, member_name, token_id, token, reason, user_agent
         FROM enrollments ORDER BY created_at, user_code",
        params![],
        record_of,
    )?;
    for (key, record, ua) in rows {
        if let Some(ua) = &ua {
            desk.user_agents
                .insert(record.user_code.clone(), ua.clone());
        }
        desk.store.restore(key.clone(), record.clone());
        desk.loaded.insert(key, (record, ua));
    }
    if let Some(address) = address {
        let st = c.query_row(
            "SELECT opened, failures, locked_until, strikes FROM attempt_limits
             WHERE scope = ?1 AND key = ?2",
            params![SCOPE, address],
            |r| {
                Ok(KeyState {
                    opened: r.get(0)?,
                    failures: r.get(1)?,
                    locked_until: r.get(2)?,
                    strikes: r.get(3)?,
                })
            },
        )?;
        desk.mints.restore(address.to_owned(), st);
        desk.mint_key = Some((address.to_owned(), st));
    }
    Ok(desk)
}

impl Desk {
    /// Expires what is due; returns the uncollected grants to revoke.
    pub fn expire(&mut self, now: u64) -> Vec<(String, Grant)> {
        self.store.handle_timeout(now);
        let mut revoke = Vec::new();
        while let Some(EnrollOutput::Revoke { member, grant }) = self.store.poll_output() {
            revoke.push((member, grant));
        }
        revoke
    }

    /// When the next enrollment expires (epoch seconds), `None` with none live.
    pub fn next_expiry(&self) -> Option<u64> {
        self.store.poll_timeout()
    }

    /// Writes back what changed: enrollments created, decided, polled or gone, and the loaded
    /// address's mint count.
    pub fn save(&self, c: &Conn<'_>, now: u64) -> Result<(), StoreError> {
        let mut now_held: BTreeMap<String, (&EnrollRecord<Grant>, Option<&String>)> =
            BTreeMap::new();
        for (key, record) in self.store.records() {
            // A device code created by this request is stored as its hash.
            let key = if key.starts_with(DEVICE_CODE_PREFIX) {
                device_key(key)
            } else {
                key.to_owned()
            };
            now_held.insert(key, (record, self.user_agents.get(&record.user_code)));
        }
        for key in self.loaded.keys() {
            if !now_held.contains_key(key) {
                c.execute(
                    "DELETE FROM enrollments WHERE device_code_hash = ?1",
                    params![key],
                )?;
            }
        }
        for (key, (record, ua)) in &now_held {
            if let Some((before, before_ua)) = self.loaded.get(key)
                && before == *record
                && before_ua.as_ref() == *ua
            {
                continue;
            }
            let (state, last_poll, member, token_id, token, reason) = match &record.state {
                EnrollState::Pending { last_poll } => {
                    ("pending", *last_poll, None, None, None, None)
                }
                EnrollState::Approved { member, grant } => (
                    "approved",
                    None,
                    Some(member.as_str()),
                    Some(grant.token_id.as_str()),
                    Some(grant.token.as_str()),
                    None,
                ),
                EnrollState::Denied { reason } => {
                    ("denied", None, None, None, None, Some(reason.as_str()))
                }
            };
            c.execute(
                "INSERT INTO enrollments (device_code_hash, user_code, address, label, user_agent,
                   created_at, expires_at, state, last_poll, member_name, token_id, token, reason)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
                 ON CONFLICT (device_code_hash) DO UPDATE SET state = excluded.state,
                   last_poll = excluded.last_poll, member_name = excluded.member_name,
                   token_id = excluded.token_id, token = excluded.token, reason = excluded.reason,
                   user_agent = excluded.user_agent",
                params![
                    key,
                    record.user_code,
                    record.address,
                    record.label,
                    ua.map(String::as_str),
                    record.created_at,
                    record.expires_at,
                    state,
                    last_poll,
                    member,
                    token_id,
                    token,
                    reason
                ],
            )?;
        }
        if let Some((address, before)) = &self.mint_key {
            let after = self.mints.state(address);
            if after != *before {
                match after {
                    Some(st) if now < self.mints.expires(&st) => {
                        c.execute(
                            "INSERT INTO attempt_limits
                               (scope, key, opened, failures, locked_until, strikes, expires_at)
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                             ON CONFLICT (scope, key) DO UPDATE SET opened = excluded.opened,
                               failures = excluded.failures, locked_until = excluded.locked_until,
                               strikes = excluded.strikes, expires_at = excluded.expires_at",
                            params![
                                SCOPE,
                                address,
                                st.opened,
                                st.failures,
                                st.locked_until,
                                st.strikes,
                                self.mints.expires(&st)
                            ],
                        )?;
                    }
                    _ => {
                        c.execute(
                            "DELETE FROM attempt_limits WHERE scope = ?1 AND key = ?2",
                            params![SCOPE, address],
                        )?;
                    }
                }
                c.execute(
                    "DELETE FROM attempt_limits WHERE scope = ?1 AND expires_at <= ?2",
                    params![SCOPE, now],
                )?;
            }
        }
        Ok(())
    }
}

/// Revokes the tokens of grants that will never be collected.
pub fn revoke(c: &Conn<'_>, grants: &[(String, Grant)]) -> Result<(), StoreError> {
    for (_, g) in grants {
        team::token_delete_id(c, &g.token_id)?;
    }
    Ok(())
}

/// Why an enrollment request was refused. Nothing was written: the transaction rolled back.
#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    /// The client address started too many enrollments this hour.
    #[error(
        "too many enrollments from this address (at most {max} an hour); retry in {retry_after} s"
    )]
    TooManyMints {
        /// Seconds until it may start another.
        retry_after: u64,
        /// Enrollments an hour.
        max: u32,
    },
    /// The client address has too many enrollments pending.
    #[error("too many pending enrollments; retry in {retry_after} s")]
    TooManyPending {
        /// Seconds until one expires.
        retry_after: u64,
    },
    /// No free code could be drawn.
    #[error("{0}")]
    CodeTaken(String),
    /// The system has no entropy for the codes.
    #[error("no entropy: {0}")]
    NoEntropy(String),
    /// The enrollment cannot be decided (unknown, expired, decided already, or not the
    /// approver's to decide).
    #[error(transparent)]
    Decide(DecideError),
    /// The member to bind the device to does not exist.
    #[error("no such member: {0}")]
    NoSuchMember(String),
    /// The member to create was refused.
    #[error(transparent)]
    Admin(#[from] AdminError),
    /// Store failure.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn random<const N: usize>() -> Result<[u8; N], EnrollError> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| EnrollError::NoEntropy(e.to_string()))?;
    Ok(b)
}

/// Runs `f` on the enrollment desk in one transaction (loaded with `address`'s mint count when
/// given), after expiring what is due and revoking the grants nobody collected; what `f` and
/// the expiry changed is written back when `f` returns `Ok`.
fn at_desk<T, E: From<StoreError>>(
    state: &AppState,
    address: Option<&str>,
    f: impl FnOnce(&Conn<'_>, &mut Desk, u64) -> Result<T, E>,
) -> Result<T, E> {
    let now = now_secs();
    let (out, revoked, next) = state.store.tx(|c| -> Result<_, E> {
        let mut desk = load(c, state.config.enroll, address)?;
        let revoked = desk.expire(now);
        revoke(c, &revoked)?;
        let out = f(c, &mut desk, now)?;
        desk.save(c, now)?;
        Ok((out, revoked, desk.next_expiry()))
    })?;
    // The expiry task wakes only when the next expiry moved.
    state.enroll_next.send_if_modified(|at| {
        let moved = *at != next;
        *at = next;
        moved
    });
    for (member, g) in &revoked {
        tracing::info!(%member, token_id = %g.token_id, "revoked an enrollment token the device never collected");
    }
    if !revoked.is_empty() {
        state.forget_auth();
    }
    Ok(out)
}

/// Expires enrollments (and revokes uncollected grants) when they are due while the broker
/// runs: the task sleeps until the earliest expiry the desk reported (`poll_timeout`), or until
/// a request on this process changes it; with no enrollment it sleeps until one is made. (On
/// PostgreSQL another replica's enrollments expire by that replica's task, and by any request.)
pub(crate) fn spawn_expiry(state: &Arc<AppState>) {
    /// The wait before trying again after the store failed.
    const RETRY: Duration = Duration::from_secs(5);
    let weak: Weak<AppState> = Arc::downgrade(state);
    let mut next = state.enroll_next.subscribe();
    tokio::spawn(async move {
        loop {
            let Some(state) = weak.upgrade() else { return };
            // Expires what is due and publishes the next expiry.
            let expired = super::store::off_worker(|| {
                at_desk(&state, None, |_, _, _| Ok::<_, StoreError>(()))
            });
            drop(state);
            let wait = match expired {
                Err(e) => {
                    tracing::warn!(error = %e, "cannot expire enrollments");
                    Some(RETRY)
                }
                Ok(()) => (*next.borrow_and_update())
                    .map(|at| Duration::from_secs(at.saturating_sub(now_secs()))),
            };
            match wait {
                Some(wait) => {
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        changed = next.changed() => if changed.is_err() { return },
                    }
                }
                None => {
                    if next.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    });
}

/// Starts a device enrollment from client address `address` (at most [`MINTS`] an hour),
/// with the device's `label` hint and user agent; returns it and the time (Unix seconds).
pub fn start(
    state: &AppState,
    address: &str,
    label: &str,
    user_agent: Option<String>,
) -> Result<(Created, u64), EnrollError> {
    at_desk(state, Some(address), |_, desk, now| {
        if let Err(l) = desk.mints.check(&address.to_owned(), now) {
            return Err(EnrollError::TooManyMints {
                retry_after: l.retry_after,
                max: MINTS.max_failures,
            });
        }
        let mut attempt = 0;
        let created = loop {
            attempt += 1;
            let device = random::<DEVICE_RANDOM_BYTES>()?;
            let user = random::<USER_RANDOM_BYTES>()?;
            match desk.store.create(&device, &user, address, label, now) {
                Ok(c) => break c,
                Err(CreateError::CodeTaken) if attempt < 8 => continue,
                Err(CreateError::TooMany { retry_after }) => {
                    return Err(EnrollError::TooManyPending { retry_after });
                }
                Err(e @ CreateError::CodeTaken) => {
                    return Err(EnrollError::CodeTaken(e.to_string()));
                }
            }
        };
        let _ = desk.mints.record_failure(address.to_owned(), now);
        if let Some(ua) = user_agent {
            desk.user_agents
                .insert(normalize_user_code(&created.user_code), ua);
        }
        Ok((created, now))
    })
}

/// A poll's outcome once its grant, if any, was checked against its member.
#[derive(Debug)]
pub enum Collected {
    /// Approved: the member and its token, handed over once.
    Approved(MemberRecord, Grant),
    /// Anything else.
    Other(PollOutcome<Grant>),
}

/// A device's poll with the key of its device code ([`device_key`]). A grant whose token (and
/// so the member it was minted for) is gone is revoked and reads as expired.
pub fn poll(state: &AppState, key: &str) -> Result<Collected, EnrollError> {
    at_desk(state, None, |c, desk, now| {
        let outcome = desk.store.poll(key, now);
        if let PollOutcome::Approved { member, grant } = outcome {
            // The grant's token goes with its member: if it is gone, so is the member it was
            // minted for (even if a new member has that name now).
            let record = if team::token_id_exists(c, &grant.token_id)? {
                team::member_get(c, &member)?
            } else {
                None
            };
            return Ok(match record {
                Some(record) => Collected::Approved(record, grant),
                None => {
                    // Removed between approval and collection.
                    revoke(c, &[(member, grant)])?;
                    Collected::Other(PollOutcome::Expired)
                }
            });
        }
        Ok(Collected::Other(outcome))
    })
}

/// The pending enrollments with the user agent that started each, if known.
pub fn pending(state: &AppState) -> Result<Vec<(PendingView, Option<String>)>, EnrollError> {
    at_desk(state, None, |_, desk, now| {
        Ok(desk
            .store
            .pending(now)
            .into_iter()
            .map(|p| {
                let ua = desk
                    .user_agents
                    .get(&normalize_user_code(&p.user_code))
                    .cloned();
                (p, ua)
            })
            .collect())
    })
}

/// An approval: bind the device to an existing member, or create the member (`create`: role,
/// instructions, permissions, already validated).
#[derive(Debug, Clone)]
pub struct Approval {
    /// The code the human typed.
    pub user_code: String,
    /// The member.
    pub member_name: String,
    /// The member to create, if any.
    pub create: Option<(Role, String, Vec<String>)>,
    /// The token's label (else the device's hint, else `connected device`).
    pub label: Option<String>,
}

/// Approves an enrollment for `approver` (holding `perms`): mints the device's token (origin
/// `enroll`) for the member, created first when asked (then it is the member's only token).
/// One transaction from the check to the approval: the code cannot be decided by anyone else
/// in between, and a refused approval mints nothing. After the commit the broker forgets cached
/// credentials and the hub knows a created member. Returns the member, the token's info and
/// the user code as shown.
pub fn approve(
    state: &AppState,
    approver: &str,
    perms: PermissionSet,
    a: &Approval,
    now_ms: i64,
) -> Result<(MemberRecord, TokenInfo, String), EnrollError> {
    let code = normalize_user_code(&a.user_code);
    let (record, info, shown_code) = at_desk(state, None, |c, desk, now| {
        let listed = desk
            .store
            .pending(now)
            .into_iter()
            .find(|p| normalize_user_code(&p.user_code) == code);
        let Some(pending) = listed else {
            // Not pending: the store says why (nothing is approved by this call).
            let dummy = Grant {
                token: String::new(),
                token_id: String::new(),
            };
            let err = desk
                .store
                .approve(&code, perms, &a.member_name, dummy, now)
                .err()
                .unwrap_or(DecideError::NotFound);
            return Err(EnrollError::Decide(err));
        };
        let label = a
            .label
            .clone()
            .filter(|l| !l.trim().is_empty())
            .or_else(|| Some(pending.label.clone()).filter(|l| !l.trim().is_empty()))
            .unwrap_or_else(|| "connected device".to_owned());
        let record = match &a.create {
            None => team::member_get(c, &a.member_name)?
                .ok_or_else(|| EnrollError::NoSuchMember(a.member_name.clone()))?,
            Some((role, instructions, member_perms)) => {
                let record = new_member_record(
                    c,
                    &a.member_name,
                    role,
                    instructions,
                    member_perms,
                    &format!("create member '{}'", a.member_name),
                )?;
                add_member(c, &record, Some(approver), now_ms)?;
                // The device's token is its only one.
                team::tokens_revoke_all(c, &record.name)?;
                record
            }
        };
        let (token, info) =
            team::token_issue(c, &record.name, &label, "enroll", Some(approver), now_ms)?;
        let grant = Grant {
            token,
            token_id: info.id.clone(),
        };
        desk.store
            .approve(&code, perms, &record.name, grant, now)
            .map_err(EnrollError::Decide)?;
        desk.user_agents.remove(&code);
        Ok((record, info, pending.user_code))
    })?;
    state.forget_auth();
    if a.create.is_some() {
        state
            .hub
            .register_member(&record.name, record.role.clone(), now_ms);
    }
    Ok((record, info, shown_code))
}

/// Rejects enrollment `user_code` for an approver holding `perms`, with `reason` for the
/// device.
pub fn reject(
    state: &AppState,
    perms: PermissionSet,
    user_code: &str,
    reason: &str,
) -> Result<(), EnrollError> {
    at_desk(state, None, |_, desk, now| {
        desk.store
            .deny(user_code, perms, reason, now)
            .map_err(EnrollError::Decide)?;
        desk.user_agents.remove(&normalize_user_code(user_code));
        Ok(())
    })
}
