//! Objectives and their append-only event log in the store.

use ac7_protocol::domain::objective::{Objective, ObjectiveEvent, Status};
use rusqlite::{Connection, OptionalExtension, params};

use super::db::StoreError;

/// Inserts a new objective with its first events.
pub fn insert(
    conn: &Connection,
    obj: &Objective,
    events: &[ObjectiveEvent],
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO objectives (id, seq, assignee, originator, status, created_at, json)
         VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM objectives), ?2, ?3, ?4, ?5, ?6)",
        params![
            obj.id,
            obj.assignee,
            obj.originator,
            obj.status.as_str(),
            obj.created_at,
            serde_json::to_string(obj)?
        ],
    )?;
    append_events(conn, events)
}

/// Whether an id is taken.
pub fn exists(conn: &Connection, id: &str) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM objectives WHERE id = ?1")?
        .query_row([id], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Writes the new state of `obj` and appends `events`.
pub fn update(
    conn: &Connection,
    obj: &Objective,
    events: &[ObjectiveEvent],
) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE objectives SET assignee = ?2, originator = ?3, status = ?4, json = ?5 WHERE id = ?1",
        params![obj.id, obj.assignee, obj.originator, obj.status.as_str(), serde_json::to_string(obj)?],
    )?;
    append_events(conn, events)
}

fn append_events(conn: &Connection, events: &[ObjectiveEvent]) -> Result<(), StoreError> {
    let mut stmt =
        conn.prepare_cached("INSERT INTO objective_events (objective_id, json) VALUES (?1, ?2)")?;
    for e in events {
        stmt.execute(params![e.objective_id, serde_json::to_string(e)?])?;
    }
    Ok(())
}

/// One objective.
pub fn get(conn: &Connection, id: &str) -> Result<Option<Objective>, StoreError> {
    conn.prepare_cached("SELECT json FROM objectives WHERE id = ?1")?
        .query_row([id], |r| r.get::<_, String>(0))
        .optional()?
        .map(|j| Ok(serde_json::from_str(&j)?))
        .transpose()
}

/// The event log of one objective, oldest first.
pub fn events(conn: &Connection, id: &str) -> Result<Vec<ObjectiveEvent>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT json FROM objective_events WHERE objective_id = ?1 ORDER BY seq")?;
    let rows = stmt.query_map([id], |r| r.get::<_, String>(0))?;
    rows.map(|j| Ok(serde_json::from_str(&j?)?)).collect()
}

/// Filters for [`list`].
#[derive(Debug, Clone, Default)]
pub struct ListFilter<'a> {
    /// Only this assignee.
    pub assignee: Option<&'a str>,
    /// Only this status.
    pub status: Option<Status>,
    /// Only objectives where this member is assignee, originator or watcher.
    pub participant: Option<&'a str>,
}

/// Objectives matching `filter`, newest first (createdAt desc, then id desc).
pub fn list(conn: &Connection, filter: &ListFilter<'_>) -> Result<Vec<Objective>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT json FROM objectives
         WHERE (?1 IS NULL OR assignee = ?1)
           AND (?2 IS NULL OR status = ?2)
           AND (?3 IS NULL OR assignee = ?3 OR originator = ?3
                OR EXISTS (SELECT 1 FROM json_each(objectives.json, '$.watchers') WHERE value = ?3))
         ORDER BY created_at DESC, id DESC",
    )?;
    let rows = stmt.query_map(
        params![
            filter.assignee,
            filter.status.map(Status::as_str),
            filter.participant
        ],
        |r| r.get::<_, String>(0),
    )?;
    rows.map(|j| Ok(serde_json::from_str(&j?)?)).collect()
}

/// Open objectives assigned to `name`: active (newest first) then blocked (newest first).
pub fn open_for(conn: &Connection, name: &str) -> Result<Vec<Objective>, StoreError> {
    let mut out = list(
        conn,
        &ListFilter {
            assignee: Some(name),
            status: Some(Status::Active),
            participant: None,
        },
    )?;
    out.extend(list(
        conn,
        &ListFilter {
            assignee: Some(name),
            status: Some(Status::Blocked),
            participant: None,
        },
    )?);
    Ok(out)
}

/// Takes removed member `name` off every objective: as assignee or originator it becomes
/// [`super::team::removed_name`], and it leaves watcher lists. No event is logged (the audit
/// log keeps what happened under the old name). Returns how many objectives changed.
pub fn detach_member(conn: &Connection, name: &str) -> Result<usize, StoreError> {
    let found = list(
        conn,
        &ListFilter {
            participant: Some(name),
            ..ListFilter::default()
        },
    )?;
    let gone = super::team::removed_name(name);
    for mut obj in found.iter().cloned() {
        if obj.assignee == name {
            obj.assignee.clone_from(&gone);
        }
        if obj.originator == name {
            obj.originator.clone_from(&gone);
        }
        obj.watchers.retain(|w| w != name);
        update(conn, &obj, &[])?;
    }
    Ok(found.len())
}
