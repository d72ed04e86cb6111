//! Objectives: the wire shapes, the lifecycle state machine, who may do what,
//! the append-only event log entries, and the lifecycle push bodies.
//!
//! ```text
//!            create (assigned [+ watcher_added × n])
//!              ▼
//!   ┌──────► active ◄─────────┐
//!   │          │ update status=blocked + reason → blocked
//!   │          ▼              │ update status=active → unblocked
//!   │        blocked ─────────┘
//!   │   complete → done (terminal)       cancel → cancelled (terminal)
//!   │   reassign → same status, new assignee
//!   └── watchers may change in any status, including terminal ones
//! ```
//!
//! Everything here is pure: the caller passes the time (`now`, epoch ms), checks
//! that names exist, persists the result and fans out the pushes.

use crate::EpochMs;
use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::domain::message::Attachment;
use crate::domain::permission::{Permission, PermissionSet};

/// Longest title, in characters.
pub const MAX_TITLE_CHARS: usize = 200;
/// Longest outcome, in characters.
pub const MAX_OUTCOME_CHARS: usize = 2048;
/// Longest body, in characters.
pub const MAX_BODY_CHARS: usize = 4096;
/// Longest block/cancel reason or reassign note, in characters.
pub const MAX_REASON_CHARS: usize = 2048;
/// Longest completion result, in characters.
pub const MAX_RESULT_CHARS: usize = 4096;
/// Longest discussion post, in characters.
pub const MAX_DISCUSS_CHARS: usize = 16_384;
/// Most watchers in one list.
pub const MAX_WATCHERS: usize = 64;

/// Lifecycle status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Being worked on.
    Active,
    /// Waiting on something (see `blockReason`).
    Blocked,
    /// Completed with a result (terminal).
    Done,
    /// Cancelled (terminal).
    Cancelled,
}

impl Status {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Active => "active",
            Status::Blocked => "blocked",
            Status::Done => "done",
            Status::Cancelled => "cancelled",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Status> {
        [
            Status::Active,
            Status::Blocked,
            Status::Done,
            Status::Cancelled,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    /// Whether no further lifecycle change is possible.
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Done | Status::Cancelled)
    }

    /// Whether the objective is still on its assignee's plate.
    pub fn is_open(self) -> bool {
        !self.is_terminal()
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An objective as served on the wire (key order as in ac7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Objective {
    /// Opaque id (`obj-<base36 ms>-<base36 counter>`).
    pub id: String,
    /// Short title.
    pub title: String,
    /// Longer description (may be empty).
    pub body: String,
    /// The contract: what done means.
    pub outcome: String,
    /// Lifecycle status.
    pub status: Status,
    /// Who works on it.
    pub assignee: String,
    /// Who created it.
    pub originator: String,
    /// Extra thread members, in the order they were added.
    pub watchers: Vec<String>,
    /// Creation time (epoch ms).
    pub created_at: EpochMs,
    /// Last mutation time (epoch ms).
    pub updated_at: EpochMs,
    /// Completion time, only when done.
    pub completed_at: Option<EpochMs>,
    /// Completion result, only when done.
    pub result: Option<String>,
    /// Why it is blocked (kept on cancel).
    pub block_reason: Option<String>,
    /// Files, under `/objectives/<id>/`.
    pub attachments: Vec<Attachment>,
}

/// The kinds of audit-log events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Created and assigned.
    Assigned,
    /// active -> blocked.
    Blocked,
    /// blocked -> active.
    Unblocked,
    /// -> done.
    Completed,
    /// -> cancelled.
    Cancelled,
    /// New assignee.
    Reassigned,
    /// A watcher joined the thread.
    WatcherAdded,
    /// A watcher left the thread.
    WatcherRemoved,
}

impl EventKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Assigned => "assigned",
            EventKind::Blocked => "blocked",
            EventKind::Unblocked => "unblocked",
            EventKind::Completed => "completed",
            EventKind::Cancelled => "cancelled",
            EventKind::Reassigned => "reassigned",
            EventKind::WatcherAdded => "watcher_added",
            EventKind::WatcherRemoved => "watcher_removed",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<EventKind> {
        [
            EventKind::Assigned,
            EventKind::Blocked,
            EventKind::Unblocked,
            EventKind::Completed,
            EventKind::Cancelled,
            EventKind::Reassigned,
            EventKind::WatcherAdded,
            EventKind::WatcherRemoved,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// One audit-log entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectiveEvent {
    /// The objective.
    pub objective_id: String,
    /// When (epoch ms).
    pub ts: EpochMs,
    /// Who caused it.
    pub actor: String,
    /// What happened.
    pub kind: EventKind,
    /// Kind-specific details.
    pub payload: Map<String, Value>,
}

/// An action on an existing objective, for [`authorize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `GET /objectives/:id`.
    View,
    /// `PATCH /objectives/:id`.
    Update,
    /// `POST …/complete`.
    Complete,
    /// `POST …/cancel`.
    Cancel,
    /// `POST …/reassign`.
    Reassign,
    /// `POST|PATCH …/watchers`.
    Watchers,
    /// `POST …/discuss`.
    Discuss,
}

/// Why a caller may not act; the message is the API's 403 text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Forbidden(pub String);

/// The 403 text for a create attempt without `objectives.create`.
pub const CREATE_FORBIDDEN: &str = "creating objectives requires the objectives.create permission";

/// Whether `actor` (with `perms`) may perform `action` on `obj`.
pub fn authorize(
    obj: &Objective,
    actor: &str,
    perms: PermissionSet,
    action: Action,
) -> Result<(), Forbidden> {
    let is_assignee = obj.assignee == actor;
    let is_originator = obj.originator == actor;
    let is_watcher = obj.watchers.iter().any(|w| w == actor);
    let (allowed, msg) = match action {
        Action::View => (
            is_assignee
                || is_originator
                || is_watcher
                || perms.contains(Permission::ObjectivesCreate)
                || perms.contains(Permission::MembersManage),
            "not a thread participant; viewing requires objectives.create".to_owned(),
        ),
        Action::Update => (
            is_assignee || perms.contains(Permission::ObjectivesCancel),
            "only the assignee or a member with objectives.cancel may update this objective"
                .to_owned(),
        ),
        Action::Complete => (
            is_assignee,
            "only the assignee may complete this objective".to_owned(),
        ),
        Action::Cancel => (
            is_originator || perms.contains(Permission::ObjectivesCancel),
            "cancel requires originator or objectives.cancel permission".to_owned(),
        ),
        Action::Reassign => (
            perms.contains(Permission::ObjectivesReassign)
                || perms.contains(Permission::MembersManage),
            "reassign requires the objectives.reassign permission".to_owned(),
        ),
        Action::Watchers => (
            is_originator || perms.contains(Permission::ObjectivesWatch),
            "watcher changes require originator or objectives.watch permission".to_owned(),
        ),
        Action::Discuss => (
            is_assignee || is_originator || is_watcher || perms.contains(Permission::MembersManage),
            format!(
                "user '{actor}' is not a member of objective {}'s thread",
                obj.id
            ),
        ),
    };
    if allowed { Ok(()) } else { Err(Forbidden(msg)) }
}

/// Whether `name` is a thread member: assignee, originator, watcher, or (when
/// `is_manager`) a `members.manage` holder.
pub fn is_thread_member(obj: &Objective, name: &str, is_manager: bool) -> bool {
    is_manager
        || obj.assignee == name
        || obj.originator == name
        || obj.watchers.iter().any(|w| w == name)
}

/// The thread members: assignee, originator, watchers and every manager.
pub fn thread_members<'a>(
    obj: &Objective,
    managers: impl IntoIterator<Item = &'a str>,
) -> BTreeSet<String> {
    let mut set: BTreeSet<String> = managers.into_iter().map(str::to_owned).collect();
    set.insert(obj.assignee.clone());
    set.insert(obj.originator.clone());
    set.extend(obj.watchers.iter().cloned());
    set
}

/// Who receives the push for `event`: the thread members after the change, plus the
/// previous assignee of a reassignment and a removed watcher.
pub fn event_recipients<'a>(
    obj: &Objective,
    event: &ObjectiveEvent,
    managers: impl IntoIterator<Item = &'a str>,
) -> BTreeSet<String> {
    let mut set = thread_members(obj, managers);
    let extra = match event.kind {
        EventKind::Reassigned => event.payload.get("from"),
        EventKind::WatcherRemoved => event.payload.get("name"),
        EventKind::Assigned
        | EventKind::Blocked
        | EventKind::Unblocked
        | EventKind::Completed
        | EventKind::Cancelled
        | EventKind::WatcherAdded => None,
    };
    if let Some(Value::String(name)) = extra {
        set.insert(name.clone());
    }
    set
}

/// Invalid input or a forbidden transition; `status()` says which HTTP status fits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransitionError {
    /// The request makes no sense for this objective (400).
    #[error("{0}")]
    InvalidInput(String),
    /// The objective is terminal or the move is not allowed from here (409).
    #[error("{0}")]
    Conflict(String),
}

impl TransitionError {
    /// 400 or 409.
    pub fn status(&self) -> u16 {
        match self {
            TransitionError::InvalidInput(_) => 400,
            TransitionError::Conflict(_) => 409,
        }
    }
}

/// What a new objective is made from (names already checked to exist).
#[derive(Debug, Clone, PartialEq)]
pub struct NewObjective {
    /// The id to use.
    pub id: String,
    /// Title (trimmed here).
    pub title: String,
    /// Outcome (trimmed here).
    pub outcome: String,
    /// Body (trimmed here).
    pub body: String,
    /// Assignee.
    pub assignee: String,
    /// Creator.
    pub originator: String,
    /// Initial watchers (assignee, originator and duplicates are skipped).
    pub watchers: Vec<String>,
    /// Attachments (already placed under `/objectives/<id>/`).
    pub attachments: Vec<Attachment>,
}

/// Creates an objective: status `active`, an `assigned` event, then one
/// `watcher_added` event per initial watcher.
pub fn create(
    new: NewObjective,
    now: EpochMs,
) -> Result<(Objective, Vec<ObjectiveEvent>), TransitionError> {
    let title = new.title.trim().to_owned();
    let outcome = new.outcome.trim().to_owned();
    if title.is_empty() {
        return Err(TransitionError::InvalidInput("title is required".into()));
    }
    if outcome.is_empty() {
        return Err(TransitionError::InvalidInput("outcome is required".into()));
    }
    let mut watchers: Vec<String> = Vec::new();
    for w in new.watchers {
        if w != new.assignee && w != new.originator && !watchers.contains(&w) {
            watchers.push(w);
        }
    }
    let obj = Objective {
        id: new.id,
        title,
        body: new.body.trim().to_owned(),
        outcome,
        status: Status::Active,
        assignee: new.assignee,
        originator: new.originator,
        watchers,
        created_at: now,
        updated_at: now,
        completed_at: None,
        result: None,
        block_reason: None,
        attachments: new.attachments,
    };
    let mut payload =
        obj_map(json!({"title": obj.title, "outcome": obj.outcome, "assignee": obj.assignee}));
    if !obj.watchers.is_empty() {
        payload.insert("watchers".into(), json!(obj.watchers));
    }
    let mut events = vec![event(
        &obj,
        &obj.originator,
        EventKind::Assigned,
        payload,
        now,
    )];
    for w in &obj.watchers {
        events.push(event(
            &obj,
            &obj.originator,
            EventKind::WatcherAdded,
            obj_map(json!({"name": w})),
            now,
        ));
    }
    Ok((obj, events))
}

/// A change to an existing objective.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// `PATCH`: block, unblock, or edit the block reason.
    Update {
        /// `active` or `blocked` (others are refused).
        status: Option<Status>,
        /// The block reason.
        block_reason: Option<String>,
    },
    /// Finish with a result.
    Complete {
        /// What was delivered.
        result: String,
    },
    /// Abandon.
    Cancel {
        /// Why (optional).
        reason: Option<String>,
    },
    /// Hand to someone else (the caller checked the name exists).
    Reassign {
        /// New assignee.
        to: String,
        /// Optional note.
        note: Option<String>,
    },
    /// Edit watchers (the caller checked the names exist).
    Watchers {
        /// Names to add.
        add: Vec<String>,
        /// Names to remove.
        remove: Vec<String>,
    },
}

/// Applies `change` by `actor` at `now`. On success `obj` is updated and the
/// events produced are returned (empty for a no-op, which leaves `obj` untouched).
/// Authorization is separate ([`authorize`]).
pub fn apply(
    obj: &mut Objective,
    actor: &str,
    change: Change,
    now: EpochMs,
) -> Result<Vec<ObjectiveEvent>, TransitionError> {
    let id = obj.id.clone();
    let terminal = obj.status.is_terminal();
    let mut events = Vec::new();
    match change {
        Change::Update {
            status,
            block_reason,
        } => {
            if terminal {
                return Err(TransitionError::Conflict(format!(
                    "objective {id} is {} and cannot be updated",
                    obj.status
                )));
            }
            let reason = block_reason
                .map(|r| r.trim().to_owned())
                .filter(|r| !r.is_empty());
            match status {
                Some(Status::Blocked) => {
                    let Some(reason) = reason else {
                        return Err(TransitionError::InvalidInput(
                            "blockReason is required when transitioning to blocked".into(),
                        ));
                    };
                    if obj.status == Status::Blocked {
                        if obj.block_reason.as_deref() != Some(reason.as_str()) {
                            obj.block_reason = Some(reason);
                            obj.updated_at = now;
                        }
                    } else {
                        obj.status = Status::Blocked;
                        obj.block_reason = Some(reason.clone());
                        obj.updated_at = now;
                        events.push(event(
                            obj,
                            actor,
                            EventKind::Blocked,
                            obj_map(json!({"reason": reason})),
                            now,
                        ));
                    }
                }
                Some(Status::Active) => {
                    if obj.status == Status::Blocked {
                        obj.status = Status::Active;
                        obj.block_reason = None;
                        obj.updated_at = now;
                        events.push(event(obj, actor, EventKind::Unblocked, Map::new(), now));
                    }
                }
                Some(other @ (Status::Done | Status::Cancelled)) => {
                    return Err(TransitionError::InvalidInput(format!(
                        "status {other} cannot be set by update; use complete or cancel"
                    )));
                }
                None => {
                    if obj.status == Status::Blocked
                        && let Some(reason) = reason
                        && obj.block_reason.as_deref() != Some(reason.as_str())
                    {
                        obj.block_reason = Some(reason);
                        obj.updated_at = now;
                    }
                }
            }
        }
        Change::Complete { result } => {
            if terminal {
                return Err(TransitionError::Conflict(format!(
                    "objective {id} is already {}",
                    obj.status
                )));
            }
            let result = result.trim().to_owned();
            if result.is_empty() {
                return Err(TransitionError::InvalidInput(
                    "result must not be empty".into(),
                ));
            }
            obj.status = Status::Done;
            obj.completed_at = Some(now);
            obj.result = Some(result.clone());
            obj.block_reason = None;
            obj.updated_at = now;
            events.push(event(
                obj,
                actor,
                EventKind::Completed,
                obj_map(json!({"result": result})),
                now,
            ));
        }
        Change::Cancel { reason } => {
            if terminal {
                return Err(TransitionError::Conflict(format!(
                    "objective {id} is already {}",
                    obj.status
                )));
            }
            let mut payload = Map::new();
            if let Some(r) = reason
                .map(|r| r.trim().to_owned())
                .filter(|r| !r.is_empty())
            {
                payload.insert("reason".into(), Value::String(r));
            }
            obj.status = Status::Cancelled;
            obj.updated_at = now;
            events.push(event(obj, actor, EventKind::Cancelled, payload, now));
        }
        Change::Reassign { to, note } => {
            if terminal {
                return Err(TransitionError::Conflict(format!(
                    "objective {id} is {} and cannot be reassigned",
                    obj.status
                )));
            }
            if to == obj.assignee {
                return Err(TransitionError::InvalidInput(format!(
                    "objective {id} is already assigned to {to}"
                )));
            }
            let from = std::mem::replace(&mut obj.assignee, to.clone());
            let mut payload = obj_map(json!({"from": from, "to": to}));
            if let Some(n) = note.map(|n| n.trim().to_owned()).filter(|n| !n.is_empty()) {
                payload.insert("note".into(), Value::String(n));
            }
            obj.updated_at = now;
            events.push(event(obj, actor, EventKind::Reassigned, payload, now));
        }
        Change::Watchers { add, remove } => {
            for name in add {
                if name != obj.assignee && name != obj.originator && !obj.watchers.contains(&name) {
                    obj.watchers.push(name.clone());
                    events.push(event(
                        obj,
                        actor,
                        EventKind::WatcherAdded,
                        obj_map(json!({"name": name})),
                        now,
                    ));
                }
            }
            for name in remove {
                if let Some(pos) = obj.watchers.iter().position(|w| *w == name) {
                    obj.watchers.remove(pos);
                    events.push(event(
                        obj,
                        actor,
                        EventKind::WatcherRemoved,
                        obj_map(json!({"name": name})),
                        now,
                    ));
                }
            }
            if !events.is_empty() {
                obj.updated_at = now;
            }
        }
    }
    Ok(events)
}

/// The `data` of a lifecycle push.
pub fn lifecycle_data(obj: &Objective, event: &ObjectiveEvent) -> Map<String, Value> {
    obj_map(json!({
        "kind": "objective",
        "event": event.kind.as_str(),
        "objective_id": obj.id,
        "objective_status": obj.status.as_str(),
        "thread": format!("obj:{}", obj.id),
        "actor": event.actor,
    }))
}

/// The `data` of a discussion post.
pub fn discuss_data(objective_id: &str) -> Map<String, Value> {
    obj_map(json!({
        "kind": "objective_discuss",
        "objective_id": objective_id,
        "thread": format!("obj:{objective_id}"),
    }))
}

/// The human-readable body of a lifecycle push (`obj` is the state after the change).
pub fn lifecycle_body(obj: &Objective, event: &ObjectiveEvent) -> String {
    let p = |k: &str| {
        event
            .payload
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let reason = || {
        let r = p("reason");
        if r.is_empty() {
            "(no reason given)".to_owned()
        } else {
            r
        }
    };
    let (width, lines): (usize, Vec<(&str, String)>) = match event.kind {
        EventKind::Assigned => {
            let mut lines = vec![
                ("title", obj.title.clone()),
                ("outcome", obj.outcome.clone()),
                ("assignee", obj.assignee.clone()),
                ("originator", obj.originator.clone()),
                ("status", obj.status.as_str().to_owned()),
            ];
            if !obj.body.is_empty() {
                lines.push(("body", obj.body.clone()));
            }
            (12, lines)
        }
        EventKind::Blocked | EventKind::Cancelled => (
            10,
            vec![
                ("title", obj.title.clone()),
                ("assignee", obj.assignee.clone()),
                ("reason", reason()),
            ],
        ),
        EventKind::Unblocked => (
            10,
            vec![
                ("title", obj.title.clone()),
                ("assignee", obj.assignee.clone()),
                ("status", "active (resumed)".to_owned()),
            ],
        ),
        EventKind::Completed => (
            10,
            vec![
                ("title", obj.title.clone()),
                ("outcome", obj.outcome.clone()),
                ("assignee", obj.assignee.clone()),
                ("result", p("result")),
            ],
        ),
        EventKind::Reassigned => (
            9,
            vec![
                ("title", obj.title.clone()),
                ("outcome", obj.outcome.clone()),
                ("from", p("from")),
                ("to", p("to")),
            ],
        ),
        EventKind::WatcherAdded => (
            10,
            vec![
                ("title", obj.title.clone()),
                ("outcome", obj.outcome.clone()),
                ("watcher", p("name")),
                ("status", obj.status.as_str().to_owned()),
            ],
        ),
        EventKind::WatcherRemoved => (
            9,
            vec![("title", obj.title.clone()), ("watcher", p("name"))],
        ),
    };
    let mut out = format!("[objective {}] {}", event.kind.as_str(), obj.id);
    for (label, value) in lines {
        let label = format!("{label}:");
        out.push('\n');
        out.push_str(&format!("{label:<width$}{value}"));
    }
    out
}

/// Formats an objective id: `obj-<base36(now_ms)>-<base36(counter)>`.
pub fn format_id(now_ms: u64, counter: u16) -> String {
    format!("obj-{}-{}", base36(now_ms), base36(u64::from(counter)))
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    if n == 0 {
        return "0".to_owned();
    }
    let mut out = Vec::new();
    while n > 0 {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

fn event(
    obj: &Objective,
    actor: &str,
    kind: EventKind,
    payload: Map<String, Value>,
    now: EpochMs,
) -> ObjectiveEvent {
    ObjectiveEvent {
        objective_id: obj.id.clone(),
        ts: now,
        actor: actor.to_owned(),
        kind,
        payload,
    }
}

fn obj_map(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests;
