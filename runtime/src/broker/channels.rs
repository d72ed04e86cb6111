//! Channels in the store. `general` is implicit: it has no row and every member is in it.

use std::collections::BTreeSet;

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use super::db::StoreError;

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

fn channel_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Channel> {
    Ok(Channel {
        id: r.get(0)?,
        slug: r.get(1)?,
        created_by: r.get(2)?,
        created_at: r.get(3)?,
        archived_at: r.get(4)?,
    })
}

const COLS: &str = "id, slug, created_by, created_at, archived_at";

/// By slug (archived included).
pub fn by_slug(conn: &Connection, slug: &str) -> Result<Option<Channel>, StoreError> {
    Ok(conn
        .prepare_cached(&format!("SELECT {COLS} FROM channels WHERE slug = ?1"))?
        .query_row([slug], channel_row)
        .optional()?)
}

/// By id (archived included).
pub fn by_id(conn: &Connection, id: &str) -> Result<Option<Channel>, StoreError> {
    Ok(conn
        .prepare_cached(&format!("SELECT {COLS} FROM channels WHERE id = ?1"))?
        .query_row([id], channel_row)
        .optional()?)
}

/// Non-archived channels, newest first.
pub fn list_active(conn: &Connection) -> Result<Vec<Channel>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLS} FROM channels WHERE archived_at IS NULL ORDER BY created_at DESC, rowid DESC"
    ))?;
    Ok(stmt.query_map([], channel_row)?.collect::<Result<_, _>>()?)
}

/// Creates a channel with `creator` as admin.
pub fn create(
    conn: &Connection,
    slug: &str,
    creator: &str,
    now: i64,
) -> Result<Channel, StoreError> {
    let ch = Channel {
        id: uuid::Uuid::new_v4().to_string(),
        slug: slug.to_owned(),
        created_by: creator.to_owned(),
        created_at: now,
        archived_at: None,
    };
    conn.execute(
        "INSERT INTO channels (id, slug, created_by, created_at) VALUES (?1, ?2, ?3, ?4)",
        params![ch.id, ch.slug, ch.created_by, ch.created_at],
    )?;
    add_member(conn, &ch.id, creator, "admin", now)?;
    Ok(ch)
}

/// Renames a channel.
pub fn rename(conn: &Connection, id: &str, slug: &str) -> Result<(), StoreError> {
    conn.execute("UPDATE channels SET slug = ?2 WHERE id = ?1", [id, slug])?;
    Ok(())
}

/// Archives a channel.
pub fn archive(conn: &Connection, id: &str, now: i64) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE channels SET archived_at = ?2 WHERE id = ?1",
        params![id, now],
    )?;
    Ok(())
}

/// Member rows: admins first, then by join order.
pub fn members(conn: &Connection, id: &str) -> Result<Vec<ChannelMember>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT channel_id, member_name, role, joined_at FROM channel_members WHERE channel_id = ?1
         ORDER BY CASE role WHEN 'admin' THEN 0 ELSE 1 END, joined_at, seq",
    )?;
    let rows = stmt.query_map([id], |r| {
        Ok(ChannelMember {
            channel_id: r.get(0)?,
            member_name: r.get(1)?,
            role: r.get(2)?,
            joined_at: r.get(3)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Member names of a channel.
pub fn member_names(conn: &Connection, id: &str) -> Result<BTreeSet<String>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT member_name FROM channel_members WHERE channel_id = ?1")?;
    Ok(stmt
        .query_map([id], |r| r.get::<_, String>(0))?
        .collect::<Result<_, _>>()?)
}

/// The role of `name` in the channel, if a member.
pub fn role_of(conn: &Connection, id: &str, name: &str) -> Result<Option<String>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT role FROM channel_members WHERE channel_id = ?1 AND member_name = ?2",
        )?
        .query_row([id, name], |r| r.get(0))
        .optional()?)
}

/// Adds a member row.
pub fn add_member(
    conn: &Connection,
    id: &str,
    name: &str,
    role: &str,
    now: i64,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO channel_members (channel_id, member_name, role, joined_at, seq)
         VALUES (?1, ?2, ?3, ?4, (SELECT COALESCE(MAX(seq), 0) + 1 FROM channel_members))",
        params![id, name, role, now],
    )?;
    Ok(())
}

/// Removes a member row.
pub fn remove_member(conn: &Connection, id: &str, name: &str) -> Result<(), StoreError> {
    conn.execute(
        "DELETE FROM channel_members WHERE channel_id = ?1 AND member_name = ?2",
        [id, name],
    )?;
    Ok(())
}
