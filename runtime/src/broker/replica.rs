//! What a replica shares with the others about itself when several serve one team from
//! PostgreSQL: its live streams (presence), busy reports, and its heartbeat; and the team-wide
//! token bucket of each member.
//!
//! * **Browsers.** Each `presence` row also counts the member's browser streams (the web
//!   app's), so Web Push leaves alone a member whose app is open on any replica
//!   ([`browsers_elsewhere`]).
//! * **Heartbeat.** Each replica has a row in `replicas` and refreshes it every
//!   [`HEARTBEAT`]. A member's `connected` on the roster is its live streams on this replica
//!   (from the hub) plus the `presence` rows of every other replica whose heartbeat is younger
//!   than [`EXPIRY`], so the streams of a replica
//!   that died (SIGKILL, lost host) stop counting within 15 s. The heartbeat also rewrites this
//!   replica's rows from its own hub (so a lost update heals within one beat), raises each
//!   member's `last_seen`, closes the local streams (live activity streams too) of tokens
//!   revoked and members removed on another replica, and forgets full token buckets and
//!   long-dead replicas.
//! * **Subscription cap.** Opening a stream takes the member's `member_status` row lock, sums
//!   the live streams over fresh replicas and adds this replica's one in the same transaction,
//!   so the cap holds across replicas; a stream's end is written by a background task.
//! * **Busy** is `member_status.busy_until`, read by every replica's roster.
//! * **Rate limits.** [`take_token`] is the per-member token bucket of
//!   [`super::ratelimit`] as one statement on `rate_buckets`, serialized by the row lock and
//!   timed by the database's clock, so the limit is exact across replicas.
//!
//! `replicas`, `presence` and `rate_buckets` are unlogged tables: nothing in them outlives a
//! crash of the database server that a heartbeat does not put back within one beat.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;

use super::hub::{Closed, LiveCount};
use super::ratelimit::Rate;
use super::store::Conn;
use super::{AppState, StoreError, now_ms};
use crate::params;

/// How often a replica refreshes its heartbeat and presence rows.
pub const HEARTBEAT: Duration = Duration::from_secs(5);

/// How old a replica's heartbeat may be before its streams stop counting.
pub const EXPIRY: Duration = Duration::from_secs(15);

/// A replica whose heartbeat is this old is deleted (with its presence rows).
const FORGET_AFTER: Duration = Duration::from_secs(3600);

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A stream that ended on this replica: its member, and whether it was a browser's.
pub type StreamEnd = (String, bool);

/// This replica: its id and the queue of stream ends for the presence writer.
#[derive(Debug)]
pub struct Replica {
    /// Random id of this process in `replicas`.
    pub id: String,
    closed: mpsc::UnboundedSender<StreamEnd>,
}

/// What the roster shows of a member from the other replicas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shared {
    /// Live streams on the other fresh replicas.
    pub connected: usize,
    /// The latest `last_seen` any replica wrote.
    pub last_seen: i64,
    /// Until when a runner reported busy (epoch ms).
    pub busy_until: i64,
}

/// Registers this replica (listening on `addr`); the background tasks start with
/// [`spawn`].
pub fn register(
    c: &Conn<'_>,
    addr: &str,
) -> Result<(Replica, mpsc::UnboundedReceiver<StreamEnd>), StoreError> {
    let id = super::sessions::new_session_id()
        .map_err(|e| StoreError::File {
            what: "cannot draw a replica id".to_owned(),
            source: std::io::Error::other(e.to_string()),
        })?
        .chars()
        .take(16)
        .collect::<String>();
    let now = now_ms();
    c.execute(
        "INSERT INTO replicas (id, addr, version, started_at, heartbeat_at) VALUES (?1, ?2, ?3, ?4, ?4)",
        params![id, addr, env!("CARGO_PKG_VERSION"), now],
    )?;
    let (closed, rx) = mpsc::unbounded_channel();
    Ok((Replica { id, closed }, rx))
}

impl Replica {
    /// Counts a new stream of `member` on this replica (a `browser`'s or not), unless the
    /// member already holds `cap` live streams across replicas (`local` of them here): then
    /// `Err(cap)` and nothing is counted.
    pub fn stream_opening(
        &self,
        c: &Conn<'_>,
        member: &str,
        browser: bool,
        local: usize,
        cap: usize,
        now: i64,
    ) -> Result<Result<(), usize>, StoreError> {
        c.execute(
            "INSERT INTO member_status (member_name, last_seen, busy_until) VALUES (?1, ?2, 0)
             ON CONFLICT (member_name) DO UPDATE SET last_seen = GREATEST(member_status.last_seen, excluded.last_seen)",
            params![member, now],
        )?;
        let live = c
            .query_row(
                "SELECT COALESCE(SUM(p.connected), 0) FROM presence p JOIN replicas r ON r.id = p.replica_id
                 WHERE p.member_name = ?1 AND r.heartbeat_at > ?2 AND r.id <> ?3",
                params![member, now - ms(EXPIRY), self.id],
                |r| r.get::<i64>(0),
            )?
            .unwrap_or(0);
        if usize::try_from(live)
            .unwrap_or(usize::MAX)
            .saturating_add(local)
            >= cap
        {
            return Ok(Err(cap));
        }
        c.execute(
            "INSERT INTO presence (replica_id, member_name, connected, browsers, heartbeat_at)
             VALUES (?1, ?2, 1, ?3, ?4)
             ON CONFLICT (replica_id, member_name) DO UPDATE SET connected = presence.connected + 1,
               browsers = presence.browsers + excluded.browsers, heartbeat_at = excluded.heartbeat_at",
            params![self.id, member, i64::from(browser), now],
        )?;
        Ok(Ok(()))
    }

    /// Notes that a stream of `member` on this replica (a `browser`'s or not) ended (written
    /// in the background).
    pub fn stream_closed(&self, member: &str, browser: bool) {
        let _ = self.closed.send((member.to_owned(), browser));
    }
}

/// Marks `member` busy until `until` (0 clears it).
pub fn set_busy(c: &Conn<'_>, member: &str, until: i64) -> Result<(), StoreError> {
    c.execute(
        "INSERT INTO member_status (member_name, last_seen, busy_until) VALUES (?1, 0, ?2)
         ON CONFLICT (member_name) DO UPDATE SET busy_until = excluded.busy_until",
        params![member, until],
    )?;
    Ok(())
}

/// Every member's presence on the other replicas fresh at `now` (this replica's own streams
/// are counted by its hub, which knows at once when one ends).
pub fn presence(
    c: &Conn<'_>,
    me: &Replica,
    now: i64,
) -> Result<HashMap<String, Shared>, StoreError> {
    let mut out: HashMap<String, Shared> = HashMap::new();
    for (name, last_seen, busy_until) in c.query(
        "SELECT member_name, last_seen, busy_until FROM member_status",
        params![],
        |r| Ok((r.get::<String>(0)?, r.get::<i64>(1)?, r.get::<i64>(2)?)),
    )? {
        let e = out.entry(name).or_default();
        e.last_seen = last_seen;
        e.busy_until = busy_until;
    }
    for (name, live) in c.query(
        "SELECT p.member_name, SUM(p.connected) FROM presence p JOIN replicas r ON r.id = p.replica_id
         WHERE r.heartbeat_at > ?1 AND r.id <> ?2 GROUP BY p.member_name",
        params![now - ms(EXPIRY), me.id],
        |r| Ok((r.get::<String>(0)?, r.get::<i64>(1)?)),
    )? {
        out.entry(name).or_default().connected = usize::try_from(live).unwrap_or(0);
    }
    Ok(out)
}

/// The members with the web app open (a browser stream) on another replica fresh at `now`.
pub fn browsers_elsewhere(
    c: &Conn<'_>,
    me: &Replica,
    now: i64,
) -> Result<HashSet<String>, StoreError> {
    c.query(
        "SELECT DISTINCT p.member_name FROM presence p JOIN replicas r ON r.id = p.replica_id
         WHERE p.browsers > 0 AND r.heartbeat_at > ?1 AND r.id <> ?2",
        params![now - ms(EXPIRY), me.id],
        |r| r.get::<String>(0),
    )
    .map(|names| names.into_iter().collect())
}

/// Takes one token from `member`'s bucket at `rate`, or says how long until one is there.
pub fn take_token(
    c: &Conn<'_>,
    member: &str,
    rate: Rate,
) -> Result<Result<(), Duration>, StoreError> {
    let interval = i64::try_from(1_000_000 / u64::from(rate.per_second.max(1))).unwrap_or(1);
    let window = interval.saturating_mul(i64::from(rate.burst.max(1)));
    // `excluded.full_at_us - interval` is the database's clock at this statement.
    let took = c.query_row(
        "INSERT INTO rate_buckets (member_name, full_at_us)
         VALUES (?1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + ?2)
         ON CONFLICT (member_name) DO UPDATE
           SET full_at_us = GREATEST(rate_buckets.full_at_us, excluded.full_at_us - ?2) + ?2
           WHERE GREATEST(rate_buckets.full_at_us, excluded.full_at_us - ?2) + ?2
                 - (excluded.full_at_us - ?2) <= ?3
         RETURNING full_at_us",
        params![member, interval, window],
        |r| r.get::<i64>(0),
    )?;
    if took.is_some() {
        return Ok(Ok(()));
    }
    let ahead = c
        .query_row(
            "SELECT full_at_us - (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
             FROM rate_buckets WHERE member_name = ?1",
            params![member],
            |r| r.get::<i64>(0),
        )?
        .unwrap_or(0);
    let wait = (ahead + interval - window).max(1);
    Ok(Err(Duration::from_micros(u64::try_from(wait).unwrap_or(1))))
}

/// What a heartbeat found gone: streams' tokens (member, token id) and members.
type Stale = (Vec<(String, String)>, Vec<String>);

/// One heartbeat: refreshes this replica's row and presence rows from `counts` (live streams
/// per member on this replica) and `last_seen`; answers which of `tokens` (member, token id)
/// are gone and which of `members` no longer exist.
fn beat(
    c: &Conn<'_>,
    id: &str,
    addr: &str,
    counts: &[LiveCount],
    tokens: &[(String, String)],
) -> Result<Stale, StoreError> {
    let now = now_ms();
    c.execute(
        "INSERT INTO replicas (id, addr, version, started_at, heartbeat_at) VALUES (?1, ?2, ?3, ?4, ?4)
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
        params![id, addr, env!("CARGO_PKG_VERSION"), now],
    )?;
    c.execute("DELETE FROM presence WHERE replica_id = ?1", params![id])?;
    for live in counts {
        if live.streams > 0 {
            c.execute(
                "INSERT INTO presence (replica_id, member_name, connected, browsers, heartbeat_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![id, live.name, live.streams, live.browsers, now],
            )?;
        }
        c.execute(
            "INSERT INTO member_status (member_name, last_seen, busy_until) VALUES (?1, ?2, 0)
             ON CONFLICT (member_name) DO UPDATE SET last_seen = GREATEST(member_status.last_seen, excluded.last_seen)",
            params![live.name, live.last_seen],
        )?;
    }
    c.execute(
        "DELETE FROM replicas WHERE heartbeat_at < ?1",
        params![now - ms(FORGET_AFTER)],
    )?;
    c.execute(
        "DELETE FROM rate_buckets WHERE full_at_us < (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
        params![],
    )?;
    let mut revoked = Vec::new();
    for (member, token) in tokens {
        if !super::team::token_id_exists(c, token)? {
            revoked.push((member.clone(), token.clone()));
        }
    }
    let mut removed = Vec::new();
    for live in counts {
        if super::team::member_get(c, &live.name)?.is_none() {
            removed.push(live.name.clone());
        }
    }
    Ok((revoked, removed))
}

/// Which of `watchers` (holder, token id) of live activity streams are gone: the tokens
/// revoked (holder, token id), and the holders that are no member any more.
fn stale_watchers(c: &Conn<'_>, watchers: &[(String, String)]) -> Result<Stale, StoreError> {
    let mut revoked = Vec::new();
    let mut removed: Vec<String> = Vec::new();
    for (owner, token) in watchers {
        if removed.contains(owner) {
            continue;
        }
        if super::team::member_get(c, owner)?.is_none() {
            removed.push(owner.clone());
        } else if !super::team::token_id_exists(c, token)? {
            revoked.push((owner.clone(), token.clone()));
        }
    }
    Ok((revoked, removed))
}

/// Starts the heartbeat and the presence writer of this replica.
pub fn spawn(state: &Arc<AppState>, addr: String, mut closed: mpsc::UnboundedReceiver<StreamEnd>) {
    let weak: Weak<AppState> = Arc::downgrade(state);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let Some(state) = weak.upgrade() else { return };
                    let Some(replica) = &state.replica else { return };
                    let counts = state.hub.live_counts();
                    let tokens = state.hub.live_tokens();
                    let watchers = state.activity_hub.live_owner_tokens();
                    let beat = super::store::off_worker(|| {
                        state.store.tx(|c| {
                            let streams = beat(c, &replica.id, &addr, &counts, &tokens)?;
                            Ok::<_, StoreError>((streams, stale_watchers(c, &watchers)?))
                        })
                    });
                    match beat {
                        Ok(((revoked, removed), (revoked_watchers, removed_watchers))) => {
                            for (member, token) in revoked {
                                state.hub.close_token(&member, &token);
                            }
                            for member in removed {
                                state.hub.remove_member(&member);
                            }
                            for (owner, token) in revoked_watchers {
                                state.activity_hub.close_owner(&owner, Some(&token), Closed::Revoked);
                            }
                            for owner in removed_watchers {
                                state.activity_hub.close_owner(&owner, None, Closed::Removed);
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "replica heartbeat failed"),
                    }
                }
                ended = closed.recv() => {
                    let Some(first) = ended else { return };
                    // Per member: streams ended, and of them browsers'.
                    let mut ended: HashMap<String, (i64, i64)> = HashMap::new();
                    let mut count = |(member, browser): StreamEnd| {
                        let e = ended.entry(member).or_default();
                        e.0 += 1;
                        e.1 += i64::from(browser);
                    };
                    count(first);
                    while let Ok(more) = closed.try_recv() {
                        count(more);
                    }
                    let Some(state) = weak.upgrade() else { return };
                    let Some(replica) = &state.replica else { return };
                    let written = super::store::off_worker(|| {
                        state.store.tx(|c| {
                            for (member, (n, browsers)) in &ended {
                                c.execute(
                                    "UPDATE presence SET connected = GREATEST(connected - ?3, 0),
                                       browsers = GREATEST(browsers - ?4, 0)
                                     WHERE replica_id = ?1 AND member_name = ?2",
                                    params![replica.id, member, *n, *browsers],
                                )?;
                            }
                            Ok::<_, StoreError>(())
                        })
                    });
                    if let Err(e) = written {
                        tracing::debug!(error = %e, "stream end not written; the next heartbeat will");
                    }
                }
            }
        }
    });
}

/// Records `member`'s busy report (busy until `until`, 0 clears it) for the other replicas;
/// nothing without replicas.
pub fn report_busy(state: &AppState, member: &str, until: i64) -> Result<(), StoreError> {
    if state.replica.is_some() {
        state.store.tx(|c| set_busy(c, member, until))?;
    }
    Ok(())
}

/// Takes one token from `member`'s bucket shared by every replica ([`take_token`], in its own
/// transaction), or says how long until one is there.
pub fn take_shared_token(
    store: &super::db::Store,
    member: &str,
    rate: Rate,
) -> Result<Result<(), Duration>, StoreError> {
    store.tx(|c| take_token(c, member, rate))
}
