//! Channels in the store. `general` is implicit: it has no row and every member is in it.

use std::collections::BTreeSet;

use serde::Serialize;

use super::db::StoreError;
use super::store::{Backend, Conn, Row};
use super::{AppState, notices};
use crate::params;

/// A channel (`Channel`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Channel {
    /// UUID, or `general`.
    pub id: String,
    /// Unique slug.
    pub slug: String,
    /// Creator (`__system__` for general).
    pub created_by: String,
    /// Creation time.
    pub created_at: i64,
    /// Archive time, if archived.
    pub archived_at: Option<i64>,
}

/// A channel from one viewer's side (`ChannelSummary`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelSummary {
    /// The channel.
    #[serde(flatten)]
    pub channel: Channel,
    /// Whether the viewer is a member.
    pub joined: bool,
    /// The viewer's role.
    pub my_role: Option<String>,
    /// Member rows (presence count for general).
    pub member_count: usize,
}

/// A membership row (`ChannelMember`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelMember {
    /// Channel id.
    pub channel_id: String,
    /// Member.
    pub member_name: String,
    /// `admin` or `member`.
    pub role: String,
    /// Join time.
    pub joined_at: i64,
}

/// The implicit general channel.
pub fn general(boot_time: i64) -> Channel {
    Channel {
        id: "general".into(),
        slug: "general".into(),
        created_by: "__system__".into(),
        created_at: boot_time,
        archived_at: None,
    }
}

fn channel_row(r: &Row) -> Result<Channel, StoreError> {
    Ok(Channel {
        id: r.get(0)?,
        slug: r.get(1)?,
        created_by: r.get(2)?,
        created_at: r.get(3)?,
        archived_at: r.get(4)?,
    })
}

const COLS: &str = "id, slug, created_by, created_at, archived_at";

/// When the general channel was created: when the team was (`None` before there is a team).
pub fn general_created_at(c: &Conn<'_>) -> Result<Option<i64>, StoreError> {
    c.query_row("SELECT created_at FROM team WHERE id = 1", params![], |r| {
        r.get::<i64>(0)
    })
}

/// By slug (archived included).
pub fn by_slug(c: &Conn<'_>, slug: &str) -> Result<Option<Channel>, StoreError> {
    c.query_row(
        &format!("SELECT {COLS} FROM channels WHERE slug = ?1"),
        params![slug],
        channel_row,
    )
}

/// By id (archived included).
pub fn by_id(c: &Conn<'_>, id: &str) -> Result<Option<Channel>, StoreError> {
    c.query_row(
        &format!("SELECT {COLS} FROM channels WHERE id = ?1"),
        params![id],
        channel_row,
    )
}

/// Non-archived channels, newest first. Channels created in the same millisecond come newest
/// first on SQLite (by row id, which follows creation); PostgreSQL has no creation order
/// beside `created_at`, so they come by id there.
pub fn list_active(c: &Conn<'_>) -> Result<Vec<Channel>, StoreError> {
    let tie = match c.backend() {
        Backend::Sqlite => "rowid DESC",
        Backend::Postgres => "id DESC",
    };
    c.query(
        &format!(
            "SELECT {COLS} FROM channels WHERE archived_at IS NULL ORDER BY created_at DESC, {tie}"
        ),
        params![],
        channel_row,
    )
}

/// Archived channels, most recently archived first.
pub fn list_archived(c: &Conn<'_>) -> Result<Vec<Channel>, StoreError> {
    c.query(
        &format!(
            "SELECT {COLS} FROM channels WHERE archived_at IS NOT NULL ORDER BY archived_at DESC, id"
        ),
        params![],
        channel_row,
    )
}

/// Creates a channel with `creator` as admin.
pub fn create(c: &Conn<'_>, slug: &str, creator: &str, now: i64) -> Result<Channel, StoreError> {
    let ch = Channel {
        id: uuid::Uuid::new_v4().to_string(),
        slug: slug.to_owned(),
        created_by: creator.to_owned(),
        created_at: now,
        archived_at: None,
    };
    c.execute(
        "INSERT INTO channels (id, slug, created_by, created_at) VALUES (?1, ?2, ?3, ?4)",
        params![ch.id, ch.slug, ch.created_by, ch.created_at],
    )?;
    add_member(c, &ch.id, creator, "admin", now)?;
    Ok(ch)
}

/// Renames a channel.
pub fn rename(c: &Conn<'_>, id: &str, slug: &str) -> Result<(), StoreError> {
    c.execute(
        "UPDATE channels SET slug = ?2 WHERE id = ?1",
        params![id, slug],
    )?;
    Ok(())
}

/// Archives a channel.
pub fn archive(c: &Conn<'_>, id: &str, now: i64) -> Result<(), StoreError> {
    c.execute(
        "UPDATE channels SET archived_at = ?2 WHERE id = ?1",
        params![id, now],
    )?;
    Ok(())
}

/// Member rows: admins first, then by join order.
pub fn members(c: &Conn<'_>, id: &str) -> Result<Vec<ChannelMember>, StoreError> {
    c.query(
        "SELECT channel_id, member_name, role, joined_at FROM channel_members WHERE channel_id = ?1
         ORDER BY CASE role WHEN 'admin' THEN 0 ELSE 1 END, joined_at, seq",
        params![id],
        |r| {
            Ok(ChannelMember {
                channel_id: r.get(0)?,
                member_name: r.get(1)?,
                role: r.get(2)?,
                joined_at: r.get(3)?,
            })
        },
    )
}

/// Member names of a channel.
pub fn member_names(c: &Conn<'_>, id: &str) -> Result<BTreeSet<String>, StoreError> {
    Ok(c.query(
        "SELECT member_name FROM channel_members WHERE channel_id = ?1",
        params![id],
        |r| r.get::<String>(0),
    )?
    .into_iter()
    .collect())
}

/// The role of `name` in the channel, if a member.
pub fn role_of(c: &Conn<'_>, id: &str, name: &str) -> Result<Option<String>, StoreError> {
    c.query_row(
        "SELECT role FROM channel_members WHERE channel_id = ?1 AND member_name = ?2",
        params![id, name],
        |r| r.get::<String>(0),
    )
}

/// Adds a member row.
pub fn add_member(
    c: &Conn<'_>,
    id: &str,
    name: &str,
    role: &str,
    now: i64,
) -> Result<(), StoreError> {
    c.execute(
        "INSERT INTO channel_members (channel_id, member_name, role, joined_at, seq)
         VALUES (?1, ?2, ?3, ?4, (SELECT COALESCE(MAX(seq), 0) + 1 FROM channel_members))",
        params![id, name, role, now],
    )?;
    Ok(())
}

/// Removes a member row.
pub fn remove_member(c: &Conn<'_>, id: &str, name: &str) -> Result<(), StoreError> {
    c.execute(
        "DELETE FROM channel_members WHERE channel_id = ?1 AND member_name = ?2",
        params![id, name],
    )?;
    Ok(())
}

/// Why a channel request was refused. Nothing was written: the transaction rolled back.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The general channel cannot be changed this way; the text says how.
    #[error("{0}")]
    Reserved(&'static str),
    /// The new slug is not 1–32 characters of `[a-z0-9-]` (see [`valid_slug`]).
    #[error("invalid slug")]
    InvalidSlug,
    /// No channel has that slug.
    #[error("no such channel: {0}")]
    NotFound(String),
    /// The channel is archived.
    #[error("channel #{0} is archived")]
    Archived(String),
    /// The caller is not an admin of the channel.
    #[error("only channel admins can {doing}")]
    NotAdmin {
        /// What the caller tried.
        doing: &'static str,
    },
    /// Another channel has the slug.
    #[error("a channel called \"{0}\" already exists")]
    SlugTaken(String),
    /// The role is neither `admin` nor `member`.
    #[error("role must be admin or member")]
    InvalidRole,
    /// A non-admin tried to add someone else.
    #[error("only admins can add other members")]
    AddOthers,
    /// The member to add does not exist.
    #[error("no such member: {0}")]
    NoSuchMember(String),
    /// The member is already in the channel.
    #[error("{name} is already a member of #{slug}")]
    AlreadyMember {
        /// The member.
        name: String,
        /// The channel.
        slug: String,
    },
    /// The member is not in the channel.
    #[error("{name} is not a member of #{slug}")]
    NotMember {
        /// The member.
        name: String,
        /// The channel.
        slug: String,
    },
    /// Removing the member would leave the channel without an admin while others remain.
    #[error("cannot remove the last admin of #{0} while others remain — promote someone first")]
    LastAdmin(String),
    /// Store failure.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether `slug` is 1–32 characters of `[a-z0-9-]`, alphanumeric at both ends, no `--`.
pub fn valid_slug(slug: &str) -> bool {
    let b = slug.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && !slug.contains("--")
}

const RESERVED: &str = "the general channel is reserved";

/// The general channel from anyone's side: everyone is in it; its member count is who is
/// connected.
fn general_summary(state: &AppState, c: &Conn<'_>) -> ChannelSummary {
    let created = general_created_at(c)
        .ok()
        .flatten()
        .unwrap_or(state.boot_time);
    ChannelSummary {
        channel: general(created),
        joined: true,
        my_role: Some("member".into()),
        member_count: state.hub.member_count(),
    }
}

fn summary(c: &Conn<'_>, ch: Channel, viewer: &str) -> Result<ChannelSummary, StoreError> {
    let role = role_of(c, &ch.id, viewer)?;
    let count = member_names(c, &ch.id)?.len();
    Ok(ChannelSummary {
        channel: ch,
        joined: role.is_some(),
        my_role: role,
        member_count: count,
    })
}

fn find(c: &Conn<'_>, slug: &str) -> Result<Channel, ChannelError> {
    by_slug(c, slug)?.ok_or_else(|| ChannelError::NotFound(slug.to_owned()))
}

fn not_archived(ch: &Channel) -> Result<(), ChannelError> {
    match ch.archived_at {
        Some(_) => Err(ChannelError::Archived(ch.slug.clone())),
        None => Ok(()),
    }
}

fn require_admin(
    c: &Conn<'_>,
    ch: &Channel,
    caller: &str,
    doing: &'static str,
) -> Result<(), ChannelError> {
    if role_of(c, &ch.id, caller)?.as_deref() == Some("admin") {
        Ok(())
    } else {
        Err(ChannelError::NotAdmin { doing })
    }
}

/// A channel from `viewer`'s side with its member rows.
fn with_members(
    c: &Conn<'_>,
    ch: Channel,
    viewer: &str,
) -> Result<(ChannelSummary, Vec<ChannelMember>), StoreError> {
    let members = members(c, &ch.id)?;
    let summary = summary(c, ch, viewer)?;
    Ok((summary, members))
}

/// Every active channel and general from `viewer`'s side, newest first.
pub fn list_for(state: &AppState, viewer: &str) -> Result<Vec<ChannelSummary>, ChannelError> {
    let mut all = state.store.view(|c| -> Result<_, ChannelError> {
        let general = general_summary(state, c);
        let mut all = Vec::new();
        for ch in list_active(c)? {
            all.push(summary(c, ch, viewer)?);
        }
        all.push(general);
        Ok(all)
    })?;
    all.sort_by_key(|c| std::cmp::Reverse(c.channel.created_at));
    Ok(all)
}

/// Every archived channel from `viewer`'s side, most recently archived first (their history
/// stays readable by their members).
pub fn list_archived_for(
    state: &AppState,
    viewer: &str,
) -> Result<Vec<ChannelSummary>, ChannelError> {
    state.store.view(|c| -> Result<_, ChannelError> {
        let mut all = Vec::new();
        for ch in list_archived(c)? {
            all.push(summary(c, ch, viewer)?);
        }
        Ok(all)
    })
}

/// Channel `slug` from `viewer`'s side with its member rows (none for general).
pub fn view(
    state: &AppState,
    viewer: &str,
    slug: &str,
) -> Result<(ChannelSummary, Vec<ChannelMember>), ChannelError> {
    if slug == "general" {
        let general = state
            .store
            .view(|c| Ok::<_, ChannelError>(general_summary(state, c)))?;
        return Ok((general, Vec::new()));
    }
    state.store.view(|c| {
        let ch = find(c, slug)?;
        Ok(with_members(c, ch, viewer)?)
    })
}

/// Creates channel `slug` with `creator` as its admin; refuses general, a bad slug and a
/// taken one.
pub fn create_channel(
    state: &AppState,
    creator: &str,
    slug: &str,
    now: i64,
) -> Result<Channel, ChannelError> {
    if slug == "general" {
        return Err(ChannelError::Reserved(RESERVED));
    }
    if !valid_slug(slug) {
        return Err(ChannelError::InvalidSlug);
    }
    notices::channels_tx(state, |c| {
        if by_slug(c, slug)?.is_some() {
            return Err(ChannelError::SlugTaken(slug.to_owned()));
        }
        Ok(create(c, slug, creator, now)?)
    })
}

/// Renames channel `slug` to `new_slug` for one of its admins; returns the renamed channel.
/// Refuses general (either side), a bad or taken slug and an archived channel.
pub fn rename_channel(
    state: &AppState,
    caller: &str,
    slug: &str,
    new_slug: &str,
) -> Result<Channel, ChannelError> {
    if slug == "general" || new_slug == "general" {
        return Err(ChannelError::Reserved(RESERVED));
    }
    if !valid_slug(new_slug) {
        return Err(ChannelError::InvalidSlug);
    }
    let ch = notices::channels_tx(state, |c| {
        let ch = find(c, slug)?;
        not_archived(&ch)?;
        require_admin(c, &ch, caller, "rename this channel")?;
        if new_slug != ch.slug && by_slug(c, new_slug)?.is_some() {
            return Err(ChannelError::SlugTaken(new_slug.to_owned()));
        }
        rename(c, &ch.id, new_slug)?;
        Ok(ch)
    })?;
    Ok(Channel {
        slug: new_slug.to_owned(),
        ..ch
    })
}

/// Archives channel `slug` at `now` for one of its admins; returns the archived channel.
pub fn archive_channel(
    state: &AppState,
    caller: &str,
    slug: &str,
    now: i64,
) -> Result<Channel, ChannelError> {
    if slug == "general" {
        return Err(ChannelError::Reserved(RESERVED));
    }
    let ch = notices::channels_tx(state, |c| {
        let ch = find(c, slug)?;
        not_archived(&ch)?;
        require_admin(c, &ch, caller, "archive this channel")?;
        archive(c, &ch.id, now)?;
        Ok::<_, ChannelError>(ch)
    })?;
    Ok(Channel {
        archived_at: Some(now),
        ..ch
    })
}

/// Adds `member` (the caller when `None`) to channel `slug` with `role` (`member` when
/// `None`); only admins add others, and a member joining alone is a plain member. Returns
/// the channel from the caller's side with its member rows.
pub fn add_to_channel(
    state: &AppState,
    caller: &str,
    slug: &str,
    member: Option<String>,
    role: Option<String>,
    now: i64,
) -> Result<(ChannelSummary, Vec<ChannelMember>), ChannelError> {
    if slug == "general" {
        return Err(ChannelError::Reserved(
            "everyone is already in the general channel",
        ));
    }
    let role = role.unwrap_or_else(|| "member".into());
    if role != "member" && role != "admin" {
        return Err(ChannelError::InvalidRole);
    }
    notices::channels_tx(state, |c| {
        let ch = find(c, slug)?;
        not_archived(&ch)?;
        let target = member.unwrap_or_else(|| caller.to_owned());
        if target != caller {
            if role_of(c, &ch.id, caller)?.as_deref() != Some("admin") {
                return Err(ChannelError::AddOthers);
            }
            if !super::team::member_exists(c, &target)? {
                return Err(ChannelError::NoSuchMember(target));
            }
        }
        if role_of(c, &ch.id, &target)?.is_some() {
            return Err(ChannelError::AlreadyMember {
                name: target,
                slug: ch.slug,
            });
        }
        // Self-join is always as a plain member.
        let role = if target == caller {
            "member"
        } else {
            role.as_str()
        };
        add_member(c, &ch.id, &target, role, now)?;
        Ok(with_members(c, ch, caller)?)
    })
}

/// Removes `name` from channel `slug` (anyone may leave; only admins remove others; the
/// last admin stays while others remain). Returns the channel from the caller's side with
/// its member rows.
pub fn remove_from_channel(
    state: &AppState,
    caller: &str,
    slug: &str,
    name: &str,
) -> Result<(ChannelSummary, Vec<ChannelMember>), ChannelError> {
    if slug == "general" {
        return Err(ChannelError::Reserved(
            "nobody can leave the general channel",
        ));
    }
    notices::channels_tx(state, |c| {
        let ch = find(c, slug)?;
        if name != caller {
            require_admin(c, &ch, caller, "remove other members")?;
        }
        let Some(role) = role_of(c, &ch.id, name)? else {
            return Err(ChannelError::NotMember {
                name: name.to_owned(),
                slug: ch.slug,
            });
        };
        if role == "admin" {
            let admins = members(c, &ch.id)?
                .into_iter()
                .filter(|m| m.role == "admin")
                .count();
            let others = members(c, &ch.id)?.len() > 1;
            if admins == 1 && others {
                return Err(ChannelError::LastAdmin(ch.slug));
            }
        }
        remove_member(c, &ch.id, name)?;
        Ok(with_members(c, ch, caller)?)
    })
}

#[cfg(test)]
mod tests {
    use super::valid_slug;

    #[test]
    fn slugs() {
        for ok in ["a", "dev", "dev-2", "a1"] {
            assert!(valid_slug(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "a--b", "Dev", "a b", &"a".repeat(33)] {
            assert!(!valid_slug(bad), "{bad}");
        }
    }
}
