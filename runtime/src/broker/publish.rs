//! Logging a message and fanning it out, in one critical section so live
//! delivery follows the log's order exactly (which `Last-Event-ID` replay relies on).

use std::collections::BTreeSet;
use std::sync::Arc;

use ac7_protocol::domain::message::{Attachment, Audience, LogLevel, Message};
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
        id: uuid::Uuid::new_v4().to_string(),
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
