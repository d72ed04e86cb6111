//! The message log in the store: append, `/history` queries and `Last-Event-ID` replay.
//!
//! Every message is stored as its wire JSON plus the columns needed to query it.
//! `seq` (the row id) gives the total order that live delivery also follows.

use std::collections::HashSet;

use ac7_protocol::message::{Membership, Message, Route, matches_viewer};
use rusqlite::{Connection, OptionalExtension, params};

use super::db::StoreError;

/// The most messages one replay sends.
pub const REPLAY_LIMIT: usize = 1000;

/// Appends `msg`; returns its sequence number.
pub fn insert(conn: &Connection, msg: &Message, json: &str) -> Result<i64, StoreError> {
    let thread = match &msg.to {
        Some(_) => None,
        None => match Route::of_message(msg) {
            Route::General => Some("chan:general".to_owned()),
            Route::Channel(id) => Some(format!("chan:{id}")),
            Route::Objective(id) => Some(format!("obj:{id}")),
            Route::Direct { .. } | Route::Unroutable => None,
        },
    };
    conn.prepare_cached(
        "INSERT INTO messages (id, ts, to_name, from_name, thread, json) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![msg.id, msg.ts, msg.to, msg.from, thread, json])?;
    Ok(conn.last_insert_rowid())
}

/// What one viewer belongs to, loaded once per query.
#[derive(Debug, Clone)]
pub struct ViewerScope {
    /// Channel ids the viewer is a member of.
    pub channels: HashSet<String>,
    /// Objective ids whose thread the viewer is in (ignored when `manager`).
    pub objectives: HashSet<String>,
    /// `members.manage` holders are in every objective thread.
    pub manager: bool,
}

impl Membership for ViewerScope {
    fn in_channel(&self, channel_id: &str) -> bool {
        self.channels.contains(channel_id)
    }

    fn in_objective_thread(&self, objective_id: &str) -> bool {
        self.manager || self.objectives.contains(objective_id)
    }
}

/// Loads `viewer`'s memberships.
pub fn viewer_scope(
    conn: &Connection,
    viewer: &str,
    manager: bool,
) -> Result<ViewerScope, StoreError> {
    let mut channels = HashSet::new();
    let mut stmt =
        conn.prepare_cached("SELECT channel_id FROM channel_members WHERE member_name = ?1")?;
    for row in stmt.query_map([viewer], |r| r.get::<_, String>(0))? {
        channels.insert(row?);
    }
    let mut objectives = HashSet::new();
    if !manager {
        let mut stmt = conn.prepare_cached(
            "SELECT id FROM objectives WHERE assignee = ?1 OR originator = ?1
             OR EXISTS (SELECT 1 FROM json_each(objectives.json, '$.watchers') WHERE value = ?1)",
        )?;
        for row in stmt.query_map([viewer], |r| r.get::<_, String>(0))? {
            objectives.insert(row?);
        }
    }
    Ok(ViewerScope {
        channels,
        objectives,
        manager,
    })
}

/// Which slice of history to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Feed {
    /// Everything the viewer may see.
    All,
    /// The general channel.
    General,
    /// One named channel (the caller checked membership).
    Channel(String),
    /// DMs between the viewer and this member.
    With(String),
}

/// Newest-first history for `viewer`, `ts < before`, at most `limit` rows.
pub fn history(
    conn: &Connection,
    viewer: &str,
    scope: &ViewerScope,
    feed: &Feed,
    before: Option<i64>,
    limit: usize,
) -> Result<Vec<Message>, StoreError> {
    let before = before.unwrap_or(i64::MAX);
    let mut out = Vec::new();
    let mut push = |json: String| -> Result<bool, StoreError> {
        let msg: Message = serde_json::from_str(&json)?;
        out.push(msg);
        Ok(out.len() < limit)
    };
    match feed {
        Feed::Channel(id) => {
            let mut stmt = conn.prepare_cached(
                "SELECT json FROM messages WHERE thread = ?1 AND to_name IS NULL AND ts < ?2 ORDER BY seq DESC LIMIT ?3",
            )?;
            for json in stmt
                .query_map(params![format!("chan:{id}"), before, limit as i64], |r| {
                    r.get(0)
                })?
            {
                push(json?)?;
            }
        }
        Feed::General => {
            let mut stmt = conn.prepare_cached(
                "SELECT json FROM messages WHERE thread = 'chan:general' AND to_name IS NULL AND ts < ?1
                 ORDER BY seq DESC LIMIT ?2",
            )?;
            for json in stmt.query_map(params![before, limit as i64], |r| r.get(0))? {
                push(json?)?;
            }
        }
        Feed::With(other) => {
            let mut stmt = conn.prepare_cached(
                "SELECT json FROM messages WHERE to_name IS NOT NULL AND ts < ?3
                 AND ((to_name = ?1 AND from_name = ?2) OR (to_name = ?2 AND from_name = ?1))
                 ORDER BY seq DESC LIMIT ?4",
            )?;
            for json in
                stmt.query_map(params![viewer, other, before, limit as i64], |r| r.get(0))?
            {
                push(json?)?;
            }
        }
        Feed::All => {
            let mut stmt = conn.prepare_cached(
                "SELECT json, to_name, from_name, thread FROM messages WHERE ts < ?1 ORDER BY seq DESC",
            )?;
            let mut rows = stmt.query([before])?;
            while let Some(row) = rows.next()? {
                if visible(viewer, scope, row.get(1)?, row.get(2)?, row.get(3)?)
                    && !push(row.get(0)?)?
                {
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// The messages `viewer` may see that were logged after `last_id`, oldest first,
/// at most [`REPLAY_LIMIT`] (the newest ones when there are more). An unknown
/// `last_id` replays nothing.
pub fn replay_after(
    conn: &Connection,
    viewer: &str,
    scope: &ViewerScope,
    last_id: &str,
) -> Result<Vec<Message>, StoreError> {
    let Some(seq) = conn
        .prepare_cached("SELECT seq FROM messages WHERE id = ?1")?
        .query_row([last_id], |r| r.get::<_, i64>(0))
        .optional()?
    else {
        return Ok(Vec::new());
    };
    let mut stmt = conn.prepare_cached(
        "SELECT json, to_name, from_name, thread FROM messages WHERE seq > ?1 ORDER BY seq DESC",
    )?;
    let mut rows = stmt.query([seq])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        if visible(viewer, scope, row.get(1)?, row.get(2)?, row.get(3)?) {
            out.push(serde_json::from_str::<Message>(&row.get::<_, String>(0)?)?);
            if out.len() >= REPLAY_LIMIT {
                break;
            }
        }
    }
    out.reverse();
    Ok(out)
}

fn visible(
    viewer: &str,
    scope: &ViewerScope,
    to: Option<String>,
    from: Option<String>,
    thread: Option<String>,
) -> bool {
    let route = match (to, thread) {
        (Some(to), _) => Route::Direct { to },
        (None, Some(t)) => match ac7_protocol::message::Thread::parse(&t) {
            Ok(ac7_protocol::message::Thread::General) => Route::General,
            Ok(ac7_protocol::message::Thread::Channel(id)) => Route::Channel(id),
            Ok(ac7_protocol::message::Thread::Objective(id)) => Route::Objective(id),
            Err(_) => Route::Unroutable,
        },
        (None, None) => Route::Unroutable,
    };
    matches_viewer(from.as_deref(), &route, viewer, scope)
}
