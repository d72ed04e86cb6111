//! Live delivery when several replicas share one log (the store on PostgreSQL).
//!
//! On SQLite one process owns the log and delivers each message right after committing it,
//! under the write lock, so live streams get messages in log order. With replicas, messages
//! are committed by any of them; a replica learns of the others' through the doorbell
//! (`LISTEN`/`NOTIFY`, a hint only) and of its own when it commits. Either way the
//! [`Follower`] reads the log after the last sequence it delivered, in sequence order, and
//! hands each message to this replica's live streams. Sequence numbers become visible in
//! commit order with no hole that fills later, so "everything after `delivered`" never skips a
//! message: a missed doorbell delays a delivery, never loses one.
//!
//! A message is delivered to the audience it was pushed to, which its row keeps.
//!
//! A subscription taken on this replica is registered under the follower's lock
//! ([`Follower::subscribe_at`]), which also says up to which sequence this replica has
//! delivered: the subscriber's replay ends there and its live stream begins after it, so a
//! message is either replayed or delivered live, never both, never neither.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use ac7_protocol::domain::message::Audience;

use super::AppState;
use super::db::StoreError;
use super::hub::Frame;
use super::messages;
use super::store::Conn;
use crate::params;

/// Messages read (and delivered) per round trip.
const PAGE: i64 = 500;

/// Live counts remembered for the pushes waiting on them.
const REMEMBERED: usize = 4096;

/// The replica's place in the log (see the module docs).
#[derive(Debug)]
pub struct Follower {
    inner: Mutex<Place>,
}

#[derive(Debug)]
struct Place {
    /// The last sequence delivered to this replica's live streams.
    delivered: i64,
    /// How many live streams took each recently delivered message, by message id.
    live: VecDeque<(String, usize)>,
}

impl Follower {
    /// A follower that has delivered everything up to `head`.
    pub fn new(head: i64) -> Follower {
        Follower {
            inner: Mutex::new(Place {
                delivered: head,
                live: VecDeque::new(),
            }),
        }
    }

    fn place(&self) -> std::sync::MutexGuard<'_, Place> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The last sequence delivered here.
    pub fn delivered(&self) -> i64 {
        self.place().delivered
    }

    /// Delivers every committed message after the last one delivered, in order; returns how
    /// many it delivered. Blocking (store reads): call it off the async workers.
    pub fn catch_up(&self, state: &AppState) -> Result<usize, StoreError> {
        deliver_after(&mut self.place(), state)
    }

    /// How many live streams of this replica took message `id` (after [`Follower::catch_up`]
    /// delivered it).
    pub fn live_count(&self, id: &str) -> Option<usize> {
        self.place()
            .live
            .iter()
            .rev()
            .find(|(i, _)| i == id)
            .map(|(_, n)| *n)
    }

    /// Runs `subscribe` (which registers a live stream) under the follower's lock, after
    /// catching up first when `cursor` (the stream's `Last-Event-ID`, as a sequence) is beyond
    /// what this replica has delivered (a client moving from a replica further ahead); returns
    /// its result and the last sequence delivered before the stream existed.
    pub fn subscribe_at<T>(
        &self,
        state: &AppState,
        cursor: Option<i64>,
        subscribe: impl FnOnce() -> T,
    ) -> Result<(T, i64), StoreError> {
        let mut place = self.place();
        if cursor.is_some_and(|c| c > place.delivered) {
            deliver_after(&mut place, state)?;
        }
        Ok((subscribe(), place.delivered))
    }
}

/// Reads and delivers the messages after `place.delivered`, moving it on message by message.
fn deliver_after(place: &mut Place, state: &AppState) -> Result<usize, StoreError> {
    let mut total = 0;
    loop {
        let after = place.delivered;
        let batch = state.store.view(|c| read_after(c, after))?;
        if batch.is_empty() {
            return Ok(total);
        }
        let now = super::now_ms();
        for (seq, id, frame, audience) in batch {
            let live = state.hub.deliver(&audience, &frame, now);
            place.delivered = seq;
            if place.live.len() == REMEMBERED {
                place.live.pop_front();
            }
            place.live.push_back((id, live));
            total += 1;
        }
    }
}

type Delivery = (i64, String, Arc<Frame>, Audience);

/// The messages after `after`, with the audiences they were pushed to.
fn read_after(c: &Conn<'_>, after: i64) -> Result<Vec<Delivery>, StoreError> {
    c.query(
        &format!(
            "SELECT {}, ak.key FROM messages m {}
             LEFT JOIN message_keys ak ON ak.id = m.audience
             WHERE m.seq > ?1 ORDER BY m.seq LIMIT ?2",
            messages::READ_COLUMNS,
            messages::READ_JOINS
        ),
        params![after, PAGE],
        |r| {
            let (row, route, from) = messages::read_row(r)?;
            let audience = messages::stored_audience(
                r.get::<Option<String>>(9)?.as_deref(),
                from.as_deref(),
                &route,
            )?;
            let frame = Arc::new(Frame::new(row.id.clone(), row.json));
            Ok((row.seq, row.id, frame, audience))
        },
    )
}

/// Passes each browser notice rung by any replica to this replica's browsers
/// ([`super::notices::heard`]); one that fell behind tells them the channels changed (the
/// one notice rung so far), which covers whatever it skipped.
fn spawn_notices(state: &Arc<AppState>, mut rings: tokio::sync::broadcast::Receiver<String>) {
    let weak = Arc::downgrade(state);
    tokio::spawn(async move {
        loop {
            let ring = rings.recv().await;
            let Some(state) = weak.upgrade() else { return };
            match ring {
                Ok(payload) => super::notices::heard(&state, &payload),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    super::notices::channels_changed(&state);
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    });
}

/// Rings this replica's follower whenever any replica's append commits (the doorbell), and
/// after the doorbell's connection came back (a ring may have been missed); starts the
/// activity follower's consumer of the same doorbell ([`super::activity_follower`]). Each
/// reads once as soon as the doorbell listens: an append committed between reading where the
/// log was at start and listening rang nobody. Runs until the broker's state is gone. The
/// answer comes once the doorbell listens and every consumer has taken its bell (so a broker
/// that waits for it before serving hears every browser notice rung after it serves).
pub fn spawn_doorbell(
    state: &Arc<AppState>,
    config: super::pg::PgConfig,
) -> tokio::sync::oneshot::Receiver<()> {
    let weak = Arc::downgrade(state);
    let (listening, answer) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut doorbell = loop {
            match super::pg::Doorbell::start(&config).await {
                Ok(d) => break d,
                Err(e) => {
                    tracing::warn!(error = %e, "the log doorbell cannot listen yet; retrying");
                    if weak.strong_count() == 0 {
                        return;
                    }
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        };
        match weak.upgrade() {
            Some(state) => {
                if state.activity_follower.is_some() {
                    let bell = doorbell.bell(super::pg::Channel::Activity);
                    super::activity_follower::spawn_bell(&state, bell);
                }
                spawn_notices(&state, doorbell.notices());
            }
            None => return,
        }
        let _ = listening.send(());
        loop {
            let Some(state) = weak.upgrade() else { return };
            let run = tokio::task::spawn_blocking(move || {
                state
                    .follower
                    .as_ref()
                    .map(|f| f.catch_up(&state))
                    .transpose()
            })
            .await;
            match run {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "reading the log after a doorbell failed"),
                Err(e) => tracing::error!(error = %e, "the log follower task failed"),
            }
            let _ring = doorbell.ring().await;
        }
    });
    answer
}
