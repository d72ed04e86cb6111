//! Team, members and tokens in the store.
//!
//! # Incarnations: a name is not an identity
//!
//! Messages, activity, objectives, channels and files refer to members by name, and a
//! removed member's name may be given to a new member. The new one is a different member
//! and inherits nothing: each member row carries its *incarnation*:
//!
//! - `members.seq`, the member's id: `AUTOINCREMENT`, so never reused, even after the row
//!   is deleted ([`member_seq`]);
//! - `members.since_seq`, the message log's head when the member was created
//!   ([`member_since`]). A member's own slices of the log (DMs to it, everything it sent)
//!   are the rows after that position: rows of that name at or before it were an earlier
//!   member's (see [`super::messages`]).
//!
//! Activity rows are stamped with the uploader's `members.seq` (see [`super::activity`]).
//! Everything else that names the member is dealt with when it is removed
//! ([`super::bootstrap::remove_member`]). Members that existed before incarnations have
//! `since_seq` 0 (the schema change is in [`super::db`]).

use std::sync::{Arc, Mutex, PoisonError};

use ac7_protocol::domain::permission::PermissionSet;
use serde::Serialize;

use super::db::StoreError;
use super::store::{Conn, Row};
use super::tokens;

pub use ac7_protocol::domain::team::{Role, Team};

/// A member as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberRecord {
    /// Unique name.
    pub name: String,
    /// Role.
    pub role: Role,
    /// Private instructions.
    pub instructions: String,
    /// Resolved leaf permissions.
    pub permissions: PermissionSet,
}

/// The public projection (`Teammate`).
#[derive(Debug, Clone, Serialize)]
pub struct Teammate<'a> {
    /// Name.
    pub name: &'a str,
    /// Role.
    pub role: &'a Role,
    /// Permissions.
    pub permissions: PermissionSet,
}

/// The full record with instructions (`Member`).
#[derive(Debug, Clone, Serialize)]
pub struct MemberView<'a> {
    /// Name.
    pub name: &'a str,
    /// Role.
    pub role: &'a Role,
    /// Permissions.
    pub permissions: PermissionSet,
    /// Private instructions.
    pub instructions: &'a str,
}

impl MemberRecord {
    /// As a `Teammate`.
    pub fn teammate(&self) -> Teammate<'_> {
        Teammate {
            name: &self.name,
            role: &self.role,
            permissions: self.permissions,
        }
    }

    /// As a `Member`.
    pub fn view(&self) -> MemberView<'_> {
        MemberView {
            name: &self.name,
            role: &self.role,
            permissions: self.permissions,
            instructions: &self.instructions,
        }
    }
}

/// Token metadata (`TokenInfo`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenInfo {
    /// Token id (UUID).
    pub id: String,
    /// Owner.
    pub member_name: String,
    /// Free label.
    pub label: String,
    /// `bootstrap`, `rotate`, or `enroll`.
    pub origin: String,
    /// Creation time.
    pub created_at: i64,
    /// Last authenticated use.
    pub last_used_at: Option<i64>,
    /// Expiry, if any.
    pub expires_at: Option<i64>,
    /// Who issued it.
    pub created_by: Option<String>,
}

/// Reads the team, if one was created.
pub fn team_get(c: &Conn<'_>) -> Result<Option<Team>, StoreError> {
    let row = c.query_row(
        "SELECT name, directive, context, presets FROM team WHERE id = 1",
        crate::params![],
        |r| {
            Ok((
                r.get::<String>(0)?,
                r.get::<String>(1)?,
                r.get::<String>(2)?,
                r.get::<String>(3)?,
            ))
        },
    )?;
    row.map(|(name, directive, context, presets)| {
        Ok(Team {
            name,
            directive,
            context,
            permission_presets: serde_json::from_str(&presets)?,
        })
    })
    .transpose()
}

/// Creates or replaces the team row.
pub fn team_put(c: &Conn<'_>, team: &Team, now: i64) -> Result<(), StoreError> {
    c.execute(
        "INSERT INTO team (id, name, directive, context, presets, created_at) VALUES (1, ?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (id) DO UPDATE SET name = excluded.name, directive = excluded.directive,
             context = excluded.context, presets = excluded.presets",
        crate::params![
            team.name,
            team.directive,
            team.context,
            serde_json::to_string(&team.permission_presets)?,
            now
        ],
    )?;
    Ok(())
}

fn member_from_row(r: &Row) -> Result<MemberRecord, StoreError> {
    Ok(MemberRecord {
        name: r.get(0)?,
        role: Role {
            title: r.get(1)?,
            description: r.get(2)?,
        },
        instructions: r.get(3)?,
        permissions: serde_json::from_str(&r.get::<String>(4)?)?,
    })
}

/// Every member, in creation order.
pub fn members_list(c: &Conn<'_>) -> Result<Vec<MemberRecord>, StoreError> {
    c.query(
        "SELECT name, role_title, role_description, instructions, permissions FROM members ORDER BY seq",
        crate::params![],
        member_from_row,
    )
}

/// The member list as last read, with the `members_version` it was read at, so that a roster
/// read while no member changes costs one row. A trigger raises the version in the same
/// transaction as every insert, update and delete of `members` (by this process, another
/// replica, or a migration), so a cached list is used only at the version it was read at.
#[derive(Debug, Default)]
pub struct MembersCache(Mutex<Option<(i64, Arc<[MemberRecord]>)>>);

impl MembersCache {
    /// Every member, in creation order ([`members_list`]), as of `c`'s view or later.
    pub fn members(&self, c: &Conn<'_>) -> Result<Arc<[MemberRecord]>, StoreError> {
        // The version first: a list read after it is at that version or newer, so one stored
        // under it is never older than the version says.
        let version: Option<i64> = c.query_row(
            "SELECT version FROM members_version WHERE id = 1",
            crate::params![],
            |r| r.get(0),
        )?;
        if let (Some(v), Some((at, members))) = (version, &*self.lock())
            && *at == v
        {
            return Ok(members.clone());
        }
        let members: Arc<[MemberRecord]> = members_list(c)?.into();
        if let Some(v) = version {
            *self.lock() = Some((v, members.clone()));
        }
        Ok(members)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(i64, Arc<[MemberRecord]>)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One member by name.
pub fn member_get(c: &Conn<'_>, name: &str) -> Result<Option<MemberRecord>, StoreError> {
    c.query_row(
        "SELECT name, role_title, role_description, instructions, permissions FROM members WHERE name = ?1",
        crate::params![name],
        member_from_row,
    )
}

/// Whether a member exists.
pub fn member_exists(c: &Conn<'_>, name: &str) -> Result<bool, StoreError> {
    c.exists(
        "SELECT 1 FROM members WHERE name = ?1",
        crate::params![name],
    )
}

/// The existing member whose name equals `name` without regard to case (names
/// are unique that way: `Alice` and `alice` cannot both exist). Names are ASCII, and
/// `lower` folds ASCII letters alike on both databases.
pub fn member_name_taken(c: &Conn<'_>, name: &str) -> Result<Option<String>, StoreError> {
    c.query_row(
        "SELECT name FROM members WHERE lower(name) = lower(?1) ORDER BY seq",
        crate::params![name],
        |r| r.get(0),
    )
}

/// Why `name` cannot be taken when `existing` holds it: the TypeScript broker's `member '<name>'
/// already exists`; for a case twin, with the reason, since the names differ.
pub fn name_taken_text(name: &str, existing: &str) -> String {
    if name == existing {
        format!("member '{existing}' already exists")
    } else {
        format!("member '{existing}' already exists (names are unique without regard to case)")
    }
}

/// Inserts a member, whose incarnation starts at the message log's current head; `false` if
/// the name is taken. A taken name draws no id (PostgreSQL's identity would spend one on a
/// conflicting insert), so ids run alike on both databases.
pub fn member_insert(c: &Conn<'_>, m: &MemberRecord, now: i64) -> Result<bool, StoreError> {
    let n = c.execute(
        "INSERT INTO members (name, role_title, role_description, instructions, permissions, created_at, since_seq)
         SELECT ?1, ?2, ?3, ?4, ?5, ?6, (SELECT COALESCE(MAX(seq), 0) FROM messages)
         WHERE NOT EXISTS (SELECT 1 FROM members WHERE name = ?1)
         ON CONFLICT (name) DO NOTHING",
        crate::params![
            m.name,
            m.role.title,
            m.role.description,
            m.instructions,
            serde_json::to_string(&m.permissions)?,
            now
        ],
    )?;
    Ok(n == 1)
}

/// Overwrites a member's role, instructions and permissions.
pub fn member_update(c: &Conn<'_>, m: &MemberRecord) -> Result<(), StoreError> {
    c.execute(
        "UPDATE members SET role_title = ?2, role_description = ?3, instructions = ?4, permissions = ?5 WHERE name = ?1",
        crate::params![
            m.name,
            m.role.title,
            m.role.description,
            m.instructions,
            serde_json::to_string(&m.permissions)?
        ],
    )?;
    Ok(())
}

/// The id of member `name` (`members.seq`, never reused), if it exists.
pub fn member_seq(c: &Conn<'_>, name: &str) -> Result<Option<i64>, StoreError> {
    c.query_row(
        "SELECT seq FROM members WHERE name = ?1",
        crate::params![name],
        |r| r.get(0),
    )
}

/// The message log position member `name` was created at (its DMs are the rows after it),
/// if it exists.
pub fn member_since(c: &Conn<'_>, name: &str) -> Result<Option<i64>, StoreError> {
    c.query_row(
        "SELECT since_seq FROM members WHERE name = ?1",
        crate::params![name],
        |r| r.get(0),
    )
}

/// What a removed member `name` is called where the name stays in the team's current state
/// (an objective's assignee or originator): no member can ever take it, since names have
/// no spaces or parentheses.
pub fn removed_name(name: &str) -> String {
    format!("{name} (removed)")
}

/// Deletes a member's row and its credentials and memberships: tokens, channel memberships,
/// file grants, browser sessions, TOTP secret and Web Push subscriptions.
/// [`super::bootstrap::remove_member`] does the rest of a removal (home folder, objectives).
pub fn member_delete(c: &Conn<'_>, name: &str) -> Result<bool, StoreError> {
    c.execute(
        "DELETE FROM tokens WHERE member_name = ?1",
        crate::params![name],
    )?;
    c.execute(
        "DELETE FROM channel_members WHERE member_name = ?1",
        crate::params![name],
    )?;
    c.execute(
        "DELETE FROM fs_grants WHERE member_name = ?1",
        crate::params![name],
    )?;
    super::sessions::sessions_delete_member(c, name)?;
    super::sessions::totp_delete(c, name)?;
    super::webpush::subscriptions_delete_member(c, name)?;
    Ok(c.execute("DELETE FROM members WHERE name = ?1", crate::params![name])? == 1)
}

/// Names of every member holding `members.manage`.
pub fn managers(c: &Conn<'_>) -> Result<Vec<String>, StoreError> {
    Ok(members_list(c)?
        .into_iter()
        .filter(|m| {
            m.permissions
                .contains(ac7_protocol::domain::permission::Permission::MembersManage)
        })
        .map(|m| m.name)
        .collect())
}

/// Issues a token for `member`; returns the plaintext (shown once) and its info.
pub fn token_issue(
    c: &Conn<'_>,
    member: &str,
    label: &str,
    origin: &str,
    created_by: Option<&str>,
    now: i64,
) -> Result<(String, TokenInfo), StoreError> {
    let token = tokens::generate()
        .map_err(|e| StoreError::Corrupt(format!("no entropy for a token: {e}")))?;
    let info = TokenInfo {
        id: uuid::Uuid::new_v4().to_string(),
        member_name: member.to_owned(),
        label: label.to_owned(),
        origin: origin.to_owned(),
        created_at: now,
        last_used_at: None,
        expires_at: None,
        created_by: created_by.map(str::to_owned),
    };
    c.execute(
        "INSERT INTO tokens (id, member_name, hash, label, origin, created_at, created_by) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        crate::params![
            info.id,
            member,
            tokens::sha256_hex(token.as_bytes()),
            label,
            origin,
            now,
            created_by
        ],
    )?;
    Ok((token, info))
}

/// Looks a token up by its hash: `(token id, member name, expires_at)`.
pub fn token_lookup(
    c: &Conn<'_>,
    hash: &str,
) -> Result<Option<(String, String, Option<i64>)>, StoreError> {
    c.query_row(
        "SELECT id, member_name, expires_at FROM tokens WHERE hash = ?1",
        crate::params![hash],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
}

/// Records that a token was just used.
pub fn token_touch(c: &Conn<'_>, id: &str, now: i64) -> Result<(), StoreError> {
    c.execute(
        "UPDATE tokens SET last_used_at = ?2 WHERE id = ?1",
        crate::params![id, now],
    )?;
    Ok(())
}

/// Deletes one token by id.
pub fn token_delete_id(c: &Conn<'_>, id: &str) -> Result<(), StoreError> {
    c.execute("DELETE FROM tokens WHERE id = ?1", crate::params![id])?;
    Ok(())
}

/// A member's tokens, oldest first.
pub fn tokens_list(c: &Conn<'_>, member: &str) -> Result<Vec<TokenInfo>, StoreError> {
    c.query(
        "SELECT id, member_name, label, origin, created_at, last_used_at, expires_at, created_by
         FROM tokens WHERE member_name = ?1 ORDER BY created_at, id",
        crate::params![member],
        |r| {
            Ok(TokenInfo {
                id: r.get(0)?,
                member_name: r.get(1)?,
                label: r.get(2)?,
                origin: r.get(3)?,
                created_at: r.get(4)?,
                last_used_at: r.get(5)?,
                expires_at: r.get(6)?,
                created_by: r.get(7)?,
            })
        },
    )
}

/// Deletes a member's token; `false` if there is no such token for that member.
pub fn token_delete(c: &Conn<'_>, member: &str, id: &str) -> Result<bool, StoreError> {
    Ok(c.execute(
        "DELETE FROM tokens WHERE id = ?1 AND member_name = ?2",
        crate::params![id, member],
    )? == 1)
}

/// Revokes every token of `member`.
pub fn tokens_revoke_all(c: &Conn<'_>, member: &str) -> Result<usize, StoreError> {
    c.execute(
        "DELETE FROM tokens WHERE member_name = ?1",
        crate::params![member],
    )
}

/// Whether the token with this id still exists (it was not revoked); for a browser session
/// (`session:<hash>`), whether the session is still live.
pub fn token_id_exists(c: &Conn<'_>, id: &str) -> Result<bool, StoreError> {
    if let Some(hash) = id.strip_prefix(super::sessions::SESSION_ID_PREFIX) {
        return super::sessions::session_exists(c, hash, super::now_ms());
    }
    c.exists("SELECT 1 FROM tokens WHERE id = ?1", crate::params![id])
}

/// Who a bearer token (by its hash) authenticates, as [`resolve_token`] found it.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenAuth {
    /// The token is live and its member exists: `(token id, member)`.
    Member(String, MemberRecord),
    /// No such token, or it expired.
    Unknown,
    /// The token's member is gone (the token was deleted just now).
    Orphan,
}

/// Resolves a bearer token by its hash at `now`: records its use on success, and deletes a
/// token whose member no longer exists.
pub fn resolve_token(c: &Conn<'_>, hash: &str, now: i64) -> Result<TokenAuth, StoreError> {
    let Some((token_id, member, expires)) = token_lookup(c, hash)? else {
        return Ok(TokenAuth::Unknown);
    };
    if expires.is_some_and(|e| e <= now) {
        return Ok(TokenAuth::Unknown);
    }
    match member_get(c, &member)? {
        Some(m) => {
            // Cached for a few seconds after this, so `lastUsedAt` is accurate to the
            // cache's lifetime without a write per request.
            token_touch(c, &token_id, now)?;
            Ok(TokenAuth::Member(token_id, m))
        }
        None => {
            token_delete_id(c, &token_id)?;
            Ok(TokenAuth::Orphan)
        }
    }
}

/// What a member's briefing is made of, read in one transaction.
#[derive(Debug)]
pub struct BriefingFacts {
    /// The team (empty before there is one).
    pub team: Team,
    /// Every member.
    pub members: Vec<MemberRecord>,
    /// The member's open objectives.
    pub open_objectives: Vec<ac7_protocol::domain::objective::Objective>,
    /// Where a runner of the member resumes.
    pub through: Option<super::cursors::ResumePoint>,
}

/// The team, the members, `name`'s open objectives and resume point, for its briefing.
pub fn briefing_facts(store: &super::db::Store, name: &str) -> Result<BriefingFacts, StoreError> {
    store.view(|c| {
        let team = team_get(c)?.unwrap_or_else(|| Team {
            name: String::new(),
            directive: String::new(),
            context: String::new(),
            permission_presets: Default::default(),
        });
        Ok(BriefingFacts {
            team,
            members: members_list(c)?,
            open_objectives: super::objectives::open_for(c, name)?,
            through: super::cursors::resume_point(c, name)?,
        })
    })
}

/// Every member and who of them is connected at `now`: this broker's streams and busy
/// reports, plus, with replicas, those of every other replica.
pub fn roster(
    state: &super::AppState,
    now: i64,
) -> Result<(Arc<[MemberRecord]>, Vec<super::hub::Presence>), StoreError> {
    let (members, shared) = state.store.view_small(|c| -> Result<_, StoreError> {
        let shared = match &state.replica {
            Some(me) => Some(super::replica::presence(c, me, now)?),
            None => None,
        };
        Ok((state.members.members(c)?, shared))
    })?;
    let mut connected = state
        .hub
        .presence(members.iter().map(|m| m.name.as_str()), now);
    if let Some(shared) = shared {
        for p in &mut connected {
            let s = shared.get(&p.name).copied().unwrap_or_default();
            p.connected += s.connected;
            p.last_seen = p.last_seen.max(s.last_seen);
            p.busy = (s.busy_until > now).then_some(true);
        }
    }
    Ok((members, connected))
}

/// Authenticates a bearer token by its hash at `now` ([`resolve_token`], in its own
/// transaction).
pub fn authenticate(
    store: &super::db::Store,
    hash: &str,
    now: i64,
) -> Result<TokenAuth, StoreError> {
    store.tx(|c| resolve_token(c, hash, now))
}
