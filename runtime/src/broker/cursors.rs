//! The durable per-member delivery cursor: the last message the broker wrote to any of a
//! member's live streams, kept in the store (so it survives restarts and is shared by
//! replicas). A runner that starts resumes from it and gets what its member missed while no
//! runner was live.
//!
//! Streams note each message they write ([`Cursors::note`]); a background task writes the
//! notes every [`FLUSH_EVERY`] (and a broker that shuts down writes the rest), so a crash
//! forgets at most that much progress: a runner then gets those messages again, never misses
//! one. A cursor only moves forward (by log sequence), whichever stream or replica writes it,
//! and goes with its member.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use super::store::Conn;
use super::{AppState, StoreError, now_ms};
use crate::params;

/// How often noted positions are written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Positions noted since the last write: member → message id.
#[derive(Debug, Default)]
pub struct Cursors {
    pending: Mutex<HashMap<String, String>>,
}

impl Cursors {
    /// `member`'s stream was written message `id` (ids come in log order per stream).
    pub fn note(&self, member: &str, id: &str) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        match pending.get_mut(member) {
            Some(last) => id.clone_into(last),
            None => {
                pending.insert(member.to_owned(), id.to_owned());
            }
        }
    }

    /// Writes what was noted (moving each cursor forward only).
    pub fn flush(&self, state: &AppState) -> Result<usize, StoreError> {
        let pending =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner));
        if pending.is_empty() {
            return Ok(0);
        }
        let now = now_ms();
        state.store.tx(|c| {
            for (member, id) in &pending {
                advance(c, member, id, now)?;
            }
            Ok::<_, StoreError>(())
        })?;
        Ok(pending.len())
    }
}

/// Moves `member`'s cursor to message `id` unless it is already at or past it.
pub fn advance(c: &Conn<'_>, member: &str, id: &str, now: i64) -> Result<(), StoreError> {
    let (condition, value) = super::messages::id_condition(id, 4);
    c.execute(
        &format!(
            "INSERT INTO delivery_cursors (member_name, last_seq, last_id, updated_at)
             SELECT ?1, seq, ?2, ?3 FROM messages WHERE {condition}
             ON CONFLICT (member_name) DO UPDATE SET last_seq = excluded.last_seq,
               last_id = excluded.last_id, updated_at = excluded.updated_at
             WHERE excluded.last_seq > delivery_cursors.last_seq"
        ),
        params![member, id, now, value],
    )?;
    Ok(())
}

/// The id of the last message delivered to `member`'s live streams, if any.
pub fn get(c: &Conn<'_>, member: &str) -> Result<Option<String>, StoreError> {
    c.query_row(
        "SELECT last_id FROM delivery_cursors WHERE member_name = ?1",
        params![member],
        |r| r.get(0),
    )
}

/// Where a runner of `member` that starts resumes: after its cursor; for a member that never had
/// a live stream, after the last message logged before it joined (its incarnation's start), or
/// from the log's first message when none is left of those. `None` for an unknown member.
pub fn resume_point(c: &Conn<'_>, member: &str) -> Result<Option<ResumePoint>, StoreError> {
    if let Some(id) = get(c, member)? {
        return Ok(Some(ResumePoint::After(id)));
    }
    let Some(since) = super::team::member_since(c, member)? else {
        return Ok(None);
    };
    let anchor: Option<(Option<Vec<u8>>, Option<String>)> = c.query_row(
        "SELECT id, id_text FROM messages WHERE seq <= ?1 ORDER BY seq DESC LIMIT 1",
        params![since],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok(Some(match anchor {
        Some((id, id_text)) => ResumePoint::After(super::messages::id_of(id.as_deref(), id_text)?),
        None => ResumePoint::FromStart,
    }))
}

/// Where a starting runner picks up (see [`resume_point`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumePoint {
    /// After this message.
    After(String),
    /// From the log's first message.
    FromStart,
}

/// Forgets `member`'s cursor (its member is gone; a member created later under the name starts
/// afresh).
pub fn forget(c: &Conn<'_>, member: &str) -> Result<(), StoreError> {
    c.execute(
        "DELETE FROM delivery_cursors WHERE member_name = ?1",
        params![member],
    )?;
    Ok(())
}

/// Writes noted positions every [`FLUSH_EVERY`] while the broker runs.
pub fn spawn(state: &Arc<AppState>) {
    let weak: Weak<AppState> = Arc::downgrade(state);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(FLUSH_EVERY).await;
            let Some(state) = weak.upgrade() else { return };
            if let Err(e) = super::store::off_worker(|| state.cursors.flush(&state)) {
                tracing::warn!(error = %e, "cannot write delivery cursors; retrying");
            }
        }
    });
}
