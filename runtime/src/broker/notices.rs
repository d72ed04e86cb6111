//! Notices for the browsers: events on the live streams of session-cookie callers that
//! say "re-read this", carrying no data of their own. SSE only, no `id:` (the resume position
//! stays the last message); bearer callers (runners, the CLI) never get them, so the runner's
//! stream parser never sees a kind it does not know.
//!
//! * `event: presence`, `{"type":"presence","name":…}`: a member's stream opened or closed on
//!   this broker, or its busy report started or ended; the web app re-reads `/roster`.
//! * `event: channels`, `{"type":"channels"}`: a channel was created, renamed or archived, or
//!   someone joined or left one; the web app re-reads `/channels` (and the archived list).
//!
//! A channel change ([`channels_tx`]) reaches every replica: on PostgreSQL its transaction
//! rings [`NOTICE_CHANNEL`] (delivered at commit), and each replica's doorbell
//! ([`super::pg::Doorbell::notices`]) turns the ring into the notice for its own browsers, the
//! changing replica's included; on SQLite (one process) it is sent after the commit.
//! A ring lost while a doorbell reconnects is covered by the web app's 10 s re-read.

use std::sync::Arc;

use super::AppState;
use super::hub::Frame;
use super::store::{Backend, Conn};
use super::{StoreError, sessions};
use crate::params;

/// The `LISTEN`/`NOTIFY` channel of browser notices shared by the replicas. Its payload is
/// the notice's event name (only `channels` so far).
pub const NOTICE_CHANNEL: &str = "ac7_notice";

/// The event name of a channel-list change.
pub const CHANNELS: &str = "channels";

/// Sends `event` with `json` to every browser stream on this broker.
fn to_browsers(state: &AppState, event: &str, json: String) {
    let frame = Arc::new(Frame::notice(event, json));
    state.hub.notify(&frame, sessions::is_browser);
}

/// Tells the browsers on this broker that `name`'s presence changed here (a stream opened or
/// closed, a busy report started or ended), so they re-read `/roster` at once instead of at
/// their next poll.
pub fn presence_changed(state: &AppState, name: &str) {
    let json = serde_json::json!({"type": "presence", "name": name}).to_string();
    to_browsers(state, "presence", json);
}

/// Runs `change` (to channels or their members) in one transaction; once it commits, every
/// browser of the team hears `channels`. On PostgreSQL the transaction rings every replica's
/// doorbell (delivered at commit); on SQLite this broker tells its browsers after the commit.
pub fn channels_tx<T, E: From<StoreError>>(
    state: &AppState,
    change: impl FnOnce(&Conn<'_>) -> Result<T, E>,
) -> Result<T, E> {
    let done = state.store.tx(|c| -> Result<T, E> {
        let done = change(c)?;
        if c.backend() == Backend::Postgres {
            c.execute(
                "SELECT pg_notify(?1, ?2)",
                params![NOTICE_CHANNEL, CHANNELS],
            )?;
        }
        Ok(done)
    })?;
    if state.store.backend() == Backend::Sqlite {
        channels_changed(state);
    }
    Ok(done)
}

/// Tells the browsers on this broker that the channel list changed.
pub fn channels_changed(state: &AppState) {
    to_browsers(state, CHANNELS, format!(r#"{{"type":"{CHANNELS}"}}"#));
}

/// Turns a ring heard on [`NOTICE_CHANNEL`] into the notice for this broker's browsers;
/// logs and drops a payload it does not know.
pub fn heard(state: &AppState, payload: &str) {
    match payload {
        CHANNELS => channels_changed(state),
        other => tracing::warn!(payload = other, "ignored an unknown browser notice ring"),
    }
}
