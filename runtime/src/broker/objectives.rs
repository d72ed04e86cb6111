//! Objectives and their append-only event log in the store.

use std::sync::Arc;

use ac7_protocol::domain::message::{self, Attachment, Audience, LogLevel, Message, Route};
use ac7_protocol::domain::objective::{
    self as rules, Action, Change, NewObjective, Objective, ObjectiveEvent, Status, TransitionError,
};
use ac7_protocol::domain::permission::{Permission, PermissionSet};
use ac7_protocol::domain::vfs::FsPath;

use super::db::{Store, StoreError};
use super::hub::Frame;
use super::publish::{self, Draft, PostError};
use super::store::{Backend, Conn};
use super::{AppState, fs, team};
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
    let gone = team::removed_name(name);
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

/// Why an objective request was refused. Nothing was written: the transaction rolled back.
#[derive(Debug, thiserror::Error)]
pub enum ObjectiveError {
    /// No objective has that id.
    #[error("no such objective: {0}")]
    NotFound(String),
    /// The caller may not do this; the text says why.
    #[error("{0}")]
    Forbidden(String),
    /// The assignee is not a member.
    #[error("unknown assignee: {0}")]
    UnknownAssignee(String),
    /// A watcher is not a member.
    #[error("unknown watcher: {0}")]
    UnknownWatcher(String),
    /// The new objective is invalid (a blank title, a bad attachment path).
    #[error("{0}")]
    Invalid(String),
    /// The change is not allowed for the objective as it stands.
    #[error(transparent)]
    Transition(TransitionError),
    /// An attachment was refused.
    #[error(transparent)]
    Post(#[from] PostError),
    /// Copying an attachment into the objective's folder failed.
    #[error(transparent)]
    Fs(#[from] fs::FsError),
    /// Store failure.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Objective `id` if `actor` (holding `perms`) may do `action` on it, in the caller's
/// transaction.
pub fn load_for(
    c: &Conn<'_>,
    id: &str,
    actor: &str,
    perms: PermissionSet,
    action: Action,
) -> Result<Objective, ObjectiveError> {
    let obj = get(c, id)?.ok_or_else(|| ObjectiveError::NotFound(id.to_owned()))?;
    rules::authorize(&obj, actor, perms, action).map_err(|e| ObjectiveError::Forbidden(e.0))?;
    Ok(obj)
}

/// The objectives `viewer` may list: with `objectives.create` any (filtered by `assignee`
/// and `status`), otherwise only those it takes part in (and `assignee`, if given, must be
/// itself).
pub fn list_visible(
    store: &Store,
    viewer: &str,
    perms: PermissionSet,
    assignee: Option<&str>,
    status: Option<Status>,
) -> Result<Vec<Objective>, ObjectiveError> {
    store.view(|c| {
        if perms.contains(Permission::ObjectivesCreate) {
            Ok(list(
                c,
                &ListFilter {
                    assignee,
                    status,
                    participant: None,
                },
            )?)
        } else {
            if assignee.is_some_and(|a| a != viewer) {
                return Err(ObjectiveError::Forbidden(
                    "members without objectives.create may only list their own objectives".into(),
                ));
            }
            Ok(list(
                c,
                &ListFilter {
                    assignee: None,
                    status,
                    participant: Some(viewer),
                },
            )?)
        }
    })
}

/// Objective `id` with its events, for a viewer allowed to see it.
pub fn view(
    store: &Store,
    viewer: &str,
    perms: PermissionSet,
    id: &str,
) -> Result<(Objective, Vec<ObjectiveEvent>), ObjectiveError> {
    store.view(|c| {
        let obj = load_for(c, id, viewer, perms, Action::View)?;
        let events = events(c, id)?;
        Ok((obj, events))
    })
}

/// Logs one lifecycle message per event (inside `c`'s transaction) and returns the frames
/// with their audiences, to deliver after commit.
fn log_events(
    c: &Conn<'_>,
    obj: &Objective,
    events: &[ObjectiveEvent],
    now: i64,
) -> Result<Vec<(Audience, Arc<Frame>)>, StoreError> {
    let managers = team::managers(c)?;
    let mut out = Vec::with_capacity(events.len());
    for ev in events {
        let recipients = rules::event_recipients(obj, ev, managers.iter().map(String::as_str));
        let audience = message::audience(
            Some(&ev.actor),
            &Route::Objective(obj.id.clone()),
            &recipients,
        );
        let (_, frame) = publish::log(
            c,
            Draft {
                to: None,
                from: ev.actor.clone(),
                title: None,
                body: rules::lifecycle_body(obj, ev),
                level: LogLevel::Info,
                data: rules::lifecycle_data(obj, ev),
                attachments: Vec::new(),
            },
            &audience,
            now,
        )?;
        out.push((audience, frame));
    }
    Ok(out)
}

fn deliver_all(state: &AppState, frames: &[(Audience, Arc<Frame>)], now: i64) {
    for (audience, frame) in frames {
        publish::deliver(state, audience, frame, now);
    }
}

/// A new objective as requested (texts as sent; names checked to be valid).
#[derive(Debug, Clone)]
pub struct CreateRequest {
    /// Title.
    pub title: String,
    /// Outcome.
    pub outcome: String,
    /// Assignee.
    pub assignee: String,
    /// Body.
    pub body: Option<String>,
    /// Watchers.
    pub watchers: Vec<String>,
    /// Attachments from the file space, copied into the objective's folder.
    pub attachments: Vec<Attachment>,
}

/// Creates an objective from `creator` (holding `perms`): assignee and watchers must be
/// members, attachments readable files (copied into the objective's folder). The objective,
/// its events and their lifecycle messages are committed together; the messages go out
/// right after the commit.
pub fn create_objective(
    state: &AppState,
    creator: &str,
    perms: PermissionSet,
    req: CreateRequest,
    now: i64,
) -> Result<Objective, ObjectiveError> {
    state.store.tx_then(
        |c| {
            if !team::member_exists(c, &req.assignee)? {
                return Err(ObjectiveError::UnknownAssignee(req.assignee.clone()));
            }
            for w in &req.watchers {
                if !team::member_exists(c, w)? {
                    return Err(ObjectiveError::UnknownWatcher(w.clone()));
                }
            }
            let given = publish::canonical_attachments(c, creator, perms, &req.attachments)?;
            let id = state.next_objective_id(c, now)?;
            let mut attachments = Vec::with_capacity(given.len());
            for a in &given {
                let src =
                    FsPath::parse(&a.path).map_err(|e| ObjectiveError::Invalid(e.to_string()))?;
                let entry = fs::get(c, &src)?
                    .ok_or_else(|| PostError::AttachmentNotFound(src.to_string()))?;
                let dest = FsPath::parse(&format!("/objectives/{id}"))
                    .and_then(|d| d.join(src.name()))
                    .map_err(|e| ObjectiveError::Invalid(e.to_string()))?;
                let copied = fs::copy(c, &entry, &dest, creator, now)?;
                attachments.push(Attachment {
                    path: copied.path,
                    name: copied.name,
                    size: copied.size.unwrap_or(0),
                    mime_type: copied
                        .mime_type
                        .unwrap_or_else(|| "application/octet-stream".into()),
                });
            }
            let (obj, events) = rules::create(
                NewObjective {
                    id,
                    title: req.title.clone(),
                    outcome: req.outcome.clone(),
                    body: req.body.clone().unwrap_or_default(),
                    assignee: req.assignee.clone(),
                    originator: creator.to_owned(),
                    watchers: req.watchers.clone(),
                    attachments,
                },
                now,
            )
            .map_err(|e| ObjectiveError::Invalid(e.to_string()))?;
            insert(c, &obj, &events)?;
            let frames = log_events(c, &obj, &events, now)?;
            Ok((obj, frames))
        },
        |(obj, frames)| {
            deliver_all(state, &frames, now);
            obj
        },
    )
}

/// Applies `change` to objective `id` for `actor` (holding `perms`): loads, authorizes,
/// checks that named members exist (a new assignee, watchers), applies, persists and logs
/// the lifecycle messages in one transaction; they go out right after the commit.
pub fn change_objective(
    state: &AppState,
    actor: &str,
    perms: PermissionSet,
    id: &str,
    change: Change,
    now: i64,
) -> Result<Objective, ObjectiveError> {
    let action = match &change {
        Change::Update { .. } => Action::Update,
        Change::Complete { .. } => Action::Complete,
        Change::Cancel { .. } => Action::Cancel,
        Change::Reassign { .. } => Action::Reassign,
        Change::Watchers { .. } => Action::Watchers,
    };
    state.store.tx_then(
        |c| {
            let mut obj = load_for(c, id, actor, perms, action)?;
            match &change {
                Change::Reassign { to, .. } if !team::member_exists(c, to)? => {
                    return Err(ObjectiveError::UnknownAssignee(to.clone()));
                }
                Change::Watchers { add, remove } => {
                    for n in add.iter().chain(remove) {
                        if !team::member_exists(c, n)? {
                            return Err(ObjectiveError::UnknownWatcher(n.clone()));
                        }
                    }
                }
                _ => {}
            }
            let events =
                rules::apply(&mut obj, actor, change, now).map_err(ObjectiveError::Transition)?;
            update(c, &obj, &events)?;
            let frames = log_events(c, &obj, &events, now)?;
            Ok((obj, frames))
        },
        |(obj, frames)| {
            deliver_all(state, &frames, now);
            obj
        },
    )
}

/// A message on an objective's thread.
#[derive(Debug, Clone)]
pub struct Post {
    /// Title.
    pub title: Option<String>,
    /// Body.
    pub body: String,
    /// Attachments from the file space.
    pub attachments: Vec<Attachment>,
}

/// Posts `actor`'s message on objective `id`'s thread: the thread's members receive it
/// (and read access to its attachments); delivered right after the commit.
pub fn discuss(
    state: &AppState,
    actor: &str,
    perms: PermissionSet,
    id: &str,
    post: Post,
    now: i64,
) -> Result<Message, ObjectiveError> {
    let Post {
        title,
        body,
        attachments,
    } = post;
    state.store.tx_then(
        |c| {
            let obj = load_for(c, id, actor, perms, Action::Discuss)?;
            let attachments = publish::canonical_attachments(c, actor, perms, &attachments)?;
            let managers = team::managers(c)?;
            let members = rules::thread_members(&obj, managers.iter().map(String::as_str));
            let audience =
                message::audience(Some(actor), &Route::Objective(obj.id.clone()), &members);
            let (msg, frame) = publish::log(
                c,
                Draft {
                    to: None,
                    from: actor.to_owned(),
                    title,
                    body,
                    level: LogLevel::Info,
                    data: rules::discuss_data(&obj.id),
                    attachments,
                },
                &audience,
                now,
            )?;
            publish::grant_attachments(c, &msg.attachments, &members, now)?;
            Ok((msg, audience, frame))
        },
        |(msg, audience, frame)| {
            publish::deliver(state, &audience, &frame, now);
            msg
        },
    )
}
