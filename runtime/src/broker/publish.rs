//! Logging a message and fanning it out, in one critical section so live
//! delivery follows the log's order exactly (which `Last-Event-ID` replay relies on).

use std::collections::BTreeSet;
use std::sync::Arc;

use ac7_protocol::domain::message::{Attachment, Audience, LogLevel, Message, Thread};
use ac7_protocol::domain::objective::{self as obj_rules, Action};
use ac7_protocol::domain::permission::PermissionSet;
use ac7_protocol::domain::vfs::{FsPath, Scope};
use serde_json::{Map, Value};

use super::db::StoreError;
use super::hub::Frame;
use super::store::Conn;
use super::{AppState, fs, messages};

/// A message about to be logged.
#[derive(Debug, Clone)]
pub struct Draft {
    /// DM recipient.
    pub to: Option<String>,
    /// Sender.
    pub from: String,
    /// Title.
    pub title: Option<String>,
    /// Body.
    pub body: String,
    /// Level.
    pub level: LogLevel,
    /// Data (already stripped of reserved keys).
    pub data: Map<String, Value>,
    /// Canonical attachments.
    pub attachments: Vec<Attachment>,
}

/// Stamps `draft` with an id and `now`, and appends it to the log (inside the
/// caller's transaction, if any). Deliver the returned frame with [`deliver`]
/// after committing.
pub fn log(
    c: &Conn<'_>,
    draft: Draft,
    audience: &Audience,
    now: i64,
) -> Result<(Message, Arc<Frame>), StoreError> {
    let msg = Message {
        id: messages::new_id(),
        ts: now,
        to: draft.to,
        from: Some(draft.from),
        title: draft.title,
        body: draft.body,
        level: draft.level,
        data: draft.data,
        attachments: draft.attachments,
    };
    let json = serde_json::to_string(&msg)?;
    messages::insert(c, &msg, &json, audience)?;
    let frame = Arc::new(Frame::new(msg.id.clone(), json));
    Ok((msg, frame))
}

/// Hands a committed frame to the live subscribers; returns how many took it. With replicas
/// (PostgreSQL) the follower delivers it, in log order with every replica's messages, and
/// this returns its count (see [`super::follower`]).
pub fn deliver(state: &AppState, audience: &Audience, frame: &Arc<Frame>, now: i64) -> usize {
    match &state.follower {
        None => state.hub.deliver(audience, frame, now),
        Some(follower) => {
            if let Err(e) = follower.catch_up(state) {
                tracing::warn!(error = %e, "reading the log back for live delivery failed; the doorbell retries");
            }
            follower.live_count(&frame.id).unwrap_or(0)
        }
    }
}

/// Grants read access to `attachments` to every recipient except the file's owner.
pub fn grant_attachments(
    c: &Conn<'_>,
    attachments: &[Attachment],
    recipients: &BTreeSet<String>,
    now: i64,
) -> Result<(), StoreError> {
    for a in attachments {
        let Ok(path) = FsPath::parse(&a.path) else {
            continue;
        };
        let owner = match path.scope() {
            Scope::Home { member } => Some(member.to_owned()),
            Scope::Root | Scope::ObjectivesRoot | Scope::Objective { .. } => None,
        };
        for r in recipients {
            if owner.as_deref() != Some(r.as_str()) {
                fs::grant(c, &a.path, r, now)?;
            }
        }
    }
    Ok(())
}

/// Why a post (a message, an objective's discussion or change) was refused.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// The direct recipient is not a member.
    #[error("no such agent: {0}")]
    NoSuchAgent(String),
    /// An attachment path does not parse.
    #[error("attachment path {path}: {reason}")]
    AttachmentPath {
        /// The path as given.
        path: String,
        /// Why it does not parse.
        reason: String,
    },
    /// An attachment names no file.
    #[error("attachment not found: {0}")]
    AttachmentNotFound(String),
    /// An attachment names a directory.
    #[error("attachment is a directory: {0}")]
    AttachmentIsDirectory(String),
    /// The sender may not read an attachment.
    #[error("no access to attachment: {0}")]
    AttachmentForbidden(String),
    /// The channel thread names no channel.
    #[error("no such channel: {0}")]
    NoSuchChannel(String),
    /// The channel is archived.
    #[error("channel is archived")]
    ChannelArchived,
    /// The sender is not in the channel.
    #[error("not a member of this channel")]
    NotChannelMember,
    /// The objective thread names no objective.
    #[error("no such objective: {0}")]
    NoSuchObjective(String),
    /// The sender may not post on the objective's thread.
    #[error("{0}")]
    Forbidden(String),
    /// Store failure.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Resolves attachments against the file space: each must exist, be a file and be
/// readable by `reader` (holding `perms`); name, size and MIME type come from the stored
/// file.
pub fn canonical_attachments(
    c: &Conn<'_>,
    reader: &str,
    perms: PermissionSet,
    given: &[Attachment],
) -> Result<Vec<Attachment>, PostError> {
    let mut out = Vec::with_capacity(given.len());
    for a in given {
        let path = FsPath::parse(&a.path).map_err(|e| PostError::AttachmentPath {
            path: a.path.clone(),
            reason: e.to_string(),
        })?;
        let entry =
            fs::get(c, &path)?.ok_or_else(|| PostError::AttachmentNotFound(path.to_string()))?;
        if entry.is_dir() {
            return Err(PostError::AttachmentIsDirectory(path.to_string()));
        }
        if !fs::can_read(c, reader, perms, &path)? {
            return Err(PostError::AttachmentForbidden(path.to_string()));
        }
        out.push(Attachment {
            path: entry.path.clone(),
            name: entry.name.clone(),
            size: entry.size.unwrap_or(0),
            mime_type: entry
                .mime_type
                .clone()
                .unwrap_or_else(|| "application/octet-stream".into()),
        });
    }
    Ok(out)
}

/// Makes sure direct recipient `to` is known to the hub: a member added since the hub
/// last looked (offline, or on another replica) is registered on first sight.
pub fn ensure_recipient(state: &AppState, to: &str, now: i64) -> Result<(), PostError> {
    if state.hub.has_member(to) {
        return Ok(());
    }
    match state.store.view_small(|c| super::team::member_get(c, to))? {
        Some(m) => {
            state.hub.register_member(&m.name, m.role, now);
            Ok(())
        }
        None => Err(PostError::NoSuchAgent(to.to_owned())),
    }
}

/// Checks that `sender` (holding `perms`) may post on `thread` with attachments `given`:
/// returns the thread's members (none for the general channel) and the attachments as
/// stored.
pub fn prepare_post(
    store: &super::db::Store,
    sender: &str,
    perms: PermissionSet,
    thread: &Thread,
    given: &[Attachment],
) -> Result<(BTreeSet<String>, Vec<Attachment>), PostError> {
    if *thread == Thread::General && given.is_empty() {
        return Ok((BTreeSet::new(), Vec::new()));
    }
    store.view_small(|c| {
        Ok((
            thread_members(c, sender, perms, thread)?,
            canonical_attachments(c, sender, perms, given)?,
        ))
    })
}

/// Validates a thread for posting by `sender` and returns its member list (empty for the
/// general channel).
fn thread_members(
    c: &Conn<'_>,
    sender: &str,
    perms: PermissionSet,
    thread: &Thread,
) -> Result<BTreeSet<String>, PostError> {
    match thread {
        Thread::General => Ok(BTreeSet::new()),
        Thread::Channel(id) => {
            let ch = super::channels::by_id(c, id)?
                .ok_or_else(|| PostError::NoSuchChannel(id.clone()))?;
            if ch.archived_at.is_some() {
                return Err(PostError::ChannelArchived);
            }
            let members = super::channels::member_names(c, id)?;
            if !members.contains(sender) {
                return Err(PostError::NotChannelMember);
            }
            Ok(members)
        }
        Thread::Objective(id) => {
            let o = super::objectives::get(c, id)?
                .ok_or_else(|| PostError::NoSuchObjective(id.clone()))?;
            obj_rules::authorize(&o, sender, perms, Action::Discuss)
                .map_err(|e| PostError::Forbidden(e.0))?;
            let managers = super::team::managers(c)?;
            Ok(obj_rules::thread_members(
                &o,
                managers.iter().map(String::as_str),
            ))
        }
    }
}
