//! Objectives and their append-only event log in the store.

use ac7_protocol::domain::objective::{Objective, ObjectiveEvent, Status};

use super::db::StoreError;
use super::store::{Backend, Conn};
use crate::params;

/// Inserts a new objective with its first events.
pub fn insert(c: &Conn<'_>, obj: &Objective, events: &[ObjectiveEvent]) -> Result<(), StoreError> {
    c.execute(
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
    append_events(c, events)
}

/// Whether an id is taken.
pub fn exists(c: &Conn<'_>, id: &str) -> Result<bool, StoreError> {
    c.exists("SELECT 1 FROM objectives WHERE id = ?1", params![id])
}

/// Writes the new state of `obj` and appends `events`.
pub fn update(c: &Conn<'_>, obj: &Objective, events: &[ObjectiveEvent]) -> Result<(), StoreError> {
    c.execute(
        "UPDATE objectives SET assignee = ?2, originator = ?3, status = ?4, json = ?5 WHERE id = ?1",
        params![
            obj.id,
            obj.assignee,
            obj.originator,
            obj.status.as_str(),
            serde_json::to_string(obj)?
        ],
    )?;
    append_events(c, events)
}

fn append_events(c: &Conn<'_>, events: &[ObjectiveEvent]) -> Result<(), StoreError> {
    for e in events {
        c.execute(
            "INSERT INTO objective_events (objective_id, json) VALUES (?1, ?2)",
            params![e.objective_id, serde_json::to_string(e)?],
        )?;
    }
    Ok(())
}

/// One objective.
pub fn get(c: &Conn<'_>, id: &str) -> Result<Option<Objective>, StoreError> {
    c.query_row(
        "SELECT json FROM objectives WHERE id = ?1",
        params![id],
        |r| r.get::<String>(0),
    )?
    .map(|j| Ok(serde_json::from_str(&j)?))
    .transpose()
}

/// The event log of one objective, oldest first.
pub fn events(c: &Conn<'_>, id: &str) -> Result<Vec<ObjectiveEvent>, StoreError> {
    c.query(
        "SELECT json FROM objective_events WHERE objective_id = ?1 ORDER BY seq",
        params![id],
        |r| r.get::<String>(0),
    )?
    .iter()
    .map(|j| Ok(serde_json::from_str(j)?))
    .collect()
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
pub fn list(c: &Conn<'_>, filter: &ListFilter<'_>) -> Result<Vec<Objective>, StoreError> {
    // Whether ?3 is among the watchers, in each dialect's JSON functions.
    let sql = match c.backend() {
        Backend::Sqlite => {
            "SELECT json FROM objectives
             WHERE (?1 IS NULL OR assignee = ?1)
               AND (?2 IS NULL OR status = ?2)
               AND (?3 IS NULL OR assignee = ?3 OR originator = ?3
                    OR EXISTS (SELECT 1 FROM json_each(objectives.json, '$.watchers') WHERE value = ?3))
             ORDER BY created_at DESC, id DESC"
        }
        Backend::Postgres => {
            "SELECT json FROM objectives
             WHERE (?1::text IS NULL OR assignee = ?1)
               AND (?2::text IS NULL OR status = ?2)
               AND (?3::text IS NULL OR assignee = ?3 OR originator = ?3
                    OR (objectives.json::jsonb -> 'watchers') @> jsonb_build_array(?3::text))
             ORDER BY created_at DESC, id DESC"
        }
    };
    c.query(
        sql,
        params![
            filter.assignee,
            filter.status.map(Status::as_str),
            filter.participant
        ],
        |r| r.get::<String>(0),
    )?
    .iter()
    .map(|j| Ok(serde_json::from_str(j)?))
    .collect()
}

/// Open objectives assigned to `name`: active (newest first) then blocked (newest first).
pub fn open_for(c: &Conn<'_>, name: &str) -> Result<Vec<Objective>, StoreError> {
    let mut out = list(
        c,
        &ListFilter {
            assignee: Some(name),
            status: Some(Status::Active),
            participant: None,
        },
    )?;
    out.extend(list(
        c,
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
pub fn detach_member(c: &Conn<'_>, name: &str) -> Result<usize, StoreError> {
    let found = list(
        c,
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
        update(c, &obj, &[])?;
    }
    Ok(found.len())
}
