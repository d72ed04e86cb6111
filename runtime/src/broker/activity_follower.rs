//! Live activity streams when several replicas share one database (the store on PostgreSQL).
//!
//! On SQLite one process owns the database: an upload hands its rows to the live activity
//! streams ([`super::AppState::activity_hub`]) inside its transaction, under the one write
//! lock, and a stream that opens takes that lock too, so rows arrive in id order and a
//! `Last-Event-ID` replay joins the live tail exactly. With replicas an upload commits on any
//! of them; a replica learns of the others' through the doorbell (channel `ac7_activity` on
//! the log doorbell's connection, a hint only) and of its own when it commits. Either way the
//! [`ActivityFollower`] reads `member_activity` after the last id it delivered, in id order,
//! and hands each row to this replica's watchers of the row's member. A replica whose
//! listening connection drops reads on from that id once it is back, so a missed doorbell
//! delays a row, never loses it.
//!
//! # Ids in commit order
//!
//! "Everything after the last id delivered" only works if ids become visible in id order. An
//! identity column does not give that: ids are handed out at insert and become visible at
//! commit, so under concurrent uploads id 12 may commit before id 11, and a replica that read
//! up to 12 would skip 11 for ever. Two ways out: read again with a safety margin (the ids of
//! the last few seconds, dropping those already delivered), which is exact only while no
//! upload stays uncommitted longer than the margin and needs a set of delivered ids; or make
//! ids visible in commit order. The broker does the latter, as for the message log
//! ([`super::pg::log`]): an upload first updates the counter row `activity_head`
//! (`last_id = last_id + n … RETURNING last_id`), holds its row lock until it commits, and
//! inserts its rows with those ids. A second upload waits on that row until the first has
//! ended (and gets the same ids if the first rolled back), so ids become visible in order with
//! no hole that fills later: whoever has seen id `n` can continue after `n` for ever, on any
//! replica. The price is that uploads are serialized on one row for the length of their
//! transaction (one per request, inserting its few rows and nothing else).
//!
//! # Joining the live tail
//!
//! A watcher is registered under the follower's lock ([`ActivityFollower::watch_at`]), which
//! also says up to which id this replica has delivered: a `Last-Event-ID` replay ends there and
//! the live stream begins after it. A cursor beyond that (the client got rows through a replica
//! further ahead) makes this replica catch up first, so no row at or below the cursor comes
//! live afterwards. Each row is replayed or delivered live, never both, never neither.
//!
//! A row goes to the watchers of its member's name when it belongs to the member of that name
//! now, or no member has the name: the rows `GET /members/:name/activity` lists. A row of an
//! earlier member of a name now taken by another goes to nobody.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ac7_protocol::domain::message::Audience;

use super::AppState;
use super::activity;
use super::db::StoreError;

/// Rows read (and delivered) per round trip.
const PAGE: usize = 500;

/// The replica's place in `member_activity` (see the module docs).
#[derive(Debug)]
pub struct ActivityFollower {
    /// The last id delivered to this replica's live activity streams.
    delivered: Mutex<i64>,
}

impl ActivityFollower {
    /// A follower that has delivered everything up to `head`.
    pub fn new(head: i64) -> ActivityFollower {
        ActivityFollower {
            delivered: Mutex::new(head),
        }
    }

    fn place(&self) -> MutexGuard<'_, i64> {
        self.delivered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The last id delivered here.
    pub fn delivered(&self) -> i64 {
        *self.place()
    }

    /// Delivers every committed row after the last one delivered, in id order; returns how
    /// many rows it read. Blocking (store reads): call it off the async workers.
    pub fn catch_up(&self, state: &AppState) -> Result<usize, StoreError> {
        deliver_after(&mut self.place(), state)
    }

    /// Runs `watch` (which registers a live stream) under the follower's lock, after catching
    /// up first if `cursor` (the stream's `Last-Event-ID`) is beyond what this replica has
    /// delivered; returns its result and the last id delivered before the stream existed.
    pub fn watch_at<T>(
        &self,
        state: &AppState,
        cursor: Option<i64>,
        watch: impl FnOnce() -> T,
    ) -> Result<(T, i64), StoreError> {
        let mut delivered = self.place();
        if cursor.is_some_and(|c| c > *delivered) {
            deliver_after(&mut delivered, state)?;
        }
        Ok((watch(), *delivered))
    }
}

/// Reads and delivers the rows after `*delivered`, moving it on row by row.
fn deliver_after(delivered: &mut i64, state: &AppState) -> Result<usize, StoreError> {
    let mut total = 0;
    loop {
        let after = *delivered;
        let batch = state.store.view(|c| activity::after(c, after, PAGE))?;
        if batch.is_empty() {
            return Ok(total);
        }
        let now = super::now_ms();
        for (row, listed) in batch {
            if listed {
                let only = Audience::Only(BTreeSet::from([row.member_name.clone()]));
                let frame = Arc::new(activity::frame(&row)?);
                state.activity_hub.deliver(&only, &frame, now);
            }
            *delivered = i64::try_from(row.id).unwrap_or(i64::MAX);
            total += 1;
        }
    }
}

/// Catches this replica's activity follower up at once, then whenever any replica's upload
/// commits (`bell` rings for `ac7_activity`) and after the doorbell's connection came back (a
/// ring may have been missed). Runs until the broker's state is gone.
pub fn spawn_bell(state: &Arc<AppState>, mut bell: super::pg::Bell) {
    let weak = Arc::downgrade(state);
    tokio::spawn(async move {
        loop {
            let Some(state) = weak.upgrade() else { return };
            let run = tokio::task::spawn_blocking(move || {
                state
                    .activity_follower
                    .as_ref()
                    .map(|f| f.catch_up(&state))
                    .transpose()
            })
            .await;
            match run {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "reading activity after a doorbell failed");
                }
                Err(e) => tracing::error!(error = %e, "the activity follower task failed"),
            }
            let _ring = bell.ring().await;
        }
    });
}
