//! Channels in the store. `general` is implicit: it has no row and every member is in it.

use std::collections::BTreeSet;

use serde::Serialize;

use super::db::StoreError;
use super::store::{Backend, Conn, Row};
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
