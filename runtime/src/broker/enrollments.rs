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

use ac7_protocol::signin::enroll::{
    DEVICE_CODE_PREFIX, EnrollConfig, EnrollOutput, EnrollRecord, EnrollState, EnrollStore,
};
use ac7_protocol::signin::limiter::{AttemptLimiter, KeyState, LimiterConfig};

use super::StoreError;
use super::sessions::session_hash;
use super::store::conn::{Backend, Conn};
use super::store::value::Row;
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
        super::team::token_delete_id(c, &g.token_id)?;
    }
    Ok(())
}
