//! Retention: pruning messages and member activity older than a number of days.
//!
//! What is pruned: rows of the message log (DMs, broadcasts, channel posts,
//! objective discussion and lifecycle messages) whose timestamp is older than
//! the cutoff, and member activity rows (model exchanges, objective markers)
//! whose event `ts` is older than the cutoff. What never is: the team, members and tokens, channels and their
//! membership, objectives and their audit events (an objective's history stays
//! complete), files and their read grants. A client resuming with the id of a
//! pruned message is handled like any id the broker cannot place.
//!
//! `ac7 serve --retain-days N` prunes at start and then hourly; `ac7 prune --db
//! PATH --older-than-days N` prunes once, offline (the broker must be stopped,
//! like for `ac7 member`). Deletes run in batches, each its own transaction, so
//! the broker's store lock is never held for long. The shared blocks of deleted model
//! exchanges that no remaining row uses go with them ([`super::activity_blocks::release`]). The database file does not
//! shrink: SQLite reuses the freed pages.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::AppState;
use super::activity_blocks::{self, Refs};
use super::db::{Store, StoreError};
use super::store::{Backend, Conn};
use crate::params;

/// Milliseconds in a day.
pub const DAY_MS: i64 = 24 * 60 * 60 * 1000;

/// Rows deleted per transaction.
const BATCH: usize = 5_000;

/// How often a running broker prunes.
const EVERY: Duration = Duration::from_secs(3600);

/// The cutoff (epoch ms) for keeping `days` days before `now`.
pub fn cutoff(now_ms: i64, days: u32) -> i64 {
    now_ms.saturating_sub(i64::from(days).saturating_mul(DAY_MS))
}

/// Deletes up to `limit` messages and up to `limit` activity rows older than
/// `cutoff` (epoch ms), oldest first (inside the caller's transaction); returns how many
/// rows in all (below `limit` means both tables are done).
pub fn prune_batch(c: &Conn<'_>, cutoff: i64, limit: usize) -> Result<usize, StoreError> {
    if c.backend() == Backend::Sqlite {
        // The newest number may be among those deleted (`ts` is the broker's clock, which can
        // go back): keep it in the mark, so appends go on after it.
        c.execute(
            "UPDATE messages_mark SET seq = MAX(seq, (SELECT COALESCE(MAX(seq), 0) FROM messages))
             WHERE id = 1",
            params![],
        )?;
    }
    let messages = c.execute(
        "DELETE FROM messages WHERE seq IN
         (SELECT seq FROM messages WHERE ts < ?1 ORDER BY seq LIMIT ?2)",
        params![cutoff, limit],
    )?;
    if c.backend() == Backend::Postgres {
        // Block references change under the lock uploads take (see `activity_blocks`).
        c.query_row(
            "SELECT last_id FROM activity_head WHERE id = 1 FOR UPDATE",
            params![],
            |r| r.get::<i64>(0),
        )?;
    }
    let gone = c.query(
        "DELETE FROM member_activity WHERE id IN
         (SELECT id FROM member_activity WHERE ts < ?1 ORDER BY ts LIMIT ?2)
         RETURNING system_block, tools_block, messages_block",
        params![cutoff, limit],
        |r| {
            Ok(Refs {
                system: r.get(0)?,
                tools: r.get(1)?,
                messages: r.get(2)?,
            })
        },
    )?;
    let activity = gone.len();
    activity_blocks::release(c, &gone)?;
    Ok(messages + activity)
}

/// Deletes every message and activity row older than `cutoff`, batch by batch, each batch
/// its own transaction; returns how many.
pub fn prune_all(store: &Store, cutoff: i64) -> Result<usize, StoreError> {
    let mut total = 0;
    loop {
        let n = store.tx(|c| prune_batch(c, cutoff, BATCH))?;
        total += n;
        if n < BATCH {
            return Ok(total);
        }
    }
}

/// Prunes `state`'s store to `days` days now and then every hour, until the
/// broker is gone. Also unlinks blob files left in the trash.
pub(crate) fn spawn(state: &Arc<AppState>, days: u32) {
    let weak: Weak<AppState> = Arc::downgrade(state);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        loop {
            tick.tick().await;
            let Some(state) = weak.upgrade() else {
                return;
            };
            let run = tokio::task::spawn_blocking(move || {
                let cut = cutoff(super::now_ms(), days);
                let pruned = prune_all(&state.store, cut)?;
                let dir = state.blob_dir();
                super::blobs::empty_trash_after(&state.store, &dir)?;
                Ok::<_, StoreError>(pruned)
            })
            .await;
            match run {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => tracing::info!(pruned = n, days, "pruned old messages and activity"),
                Ok(Err(e)) => tracing::error!(error = %e, "pruning old messages failed"),
                Err(e) => tracing::error!(error = %e, "pruning task failed"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::db::Store;

    #[test]
    fn prunes_only_older_messages_in_batches() {
        let store = Store::open_in_memory().unwrap();
        store.with(|conn| {
            for i in 0..12i64 {
                conn.execute(
                    "INSERT INTO messages (id_text, ts, body) VALUES (?1, ?2, '')",
                    rusqlite::params![format!("m{i}"), i * 10],
                )
                .unwrap();
            }
            let tx = conn.transaction().unwrap();
            assert_eq!(prune_batch(&Conn::sqlite(&tx), 50, 3).unwrap(), 3);
            assert_eq!(
                prune_batch(&Conn::sqlite(&tx), 50, 3).unwrap(),
                2,
                "ts 50 itself stays"
            );
            tx.commit().unwrap();
            let left: Vec<i64> = conn
                .prepare("SELECT ts FROM messages ORDER BY seq")
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(left, vec![50, 60, 70, 80, 90, 100, 110]);
        });
        let n = prune_all(&store, 95).unwrap();
        assert_eq!(n, 5);
        assert_eq!(cutoff(10 * DAY_MS, 3), 7 * DAY_MS);
    }

    /// Appends a DM stamped `ts`; its number.
    fn append(store: &Store, ts: i64) -> i64 {
        crate::broker::messages::append_for_test(store, Some("bob"), ts)
    }

    /// The numbers a query of one integer column returns, in its order.
    fn numbers(store: &Store, sql: &str) -> Vec<i64> {
        store.with(|conn| {
            conn.prepare(sql)
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        })
    }

    #[test]
    fn a_number_pruned_is_never_handed_out_again() {
        let store = Store::open_in_memory().unwrap();
        assert_eq!(
            (append(&store, 10), append(&store, 20), append(&store, 30)),
            (1, 2, 3)
        );
        // Everything goes: the next message still takes the number after the last one.
        assert_eq!(prune_all(&store, 100).unwrap(), 3);
        assert_eq!(append(&store, 110), 4);
        // The clock went back: the newest message is the oldest by time, and goes alone.
        assert_eq!(append(&store, 105), 5);
        assert_eq!(prune_all(&store, 108).unwrap(), 1);
        assert_eq!(
            numbers(&store, "SELECT seq FROM messages ORDER BY seq"),
            vec![4]
        );
        assert_eq!(append(&store, 120), 6);
        // Without a prune in between, numbers simply follow the newest row.
        assert_eq!(append(&store, 130), 7);
    }

    #[test]
    fn prunes_old_activity_too() {
        let store = Store::open_in_memory().unwrap();
        store.with(|conn| {
            for ts in [10i64, 20, 30, 40] {
                conn.execute(
                    "INSERT INTO member_activity (member_name, ts, kind, event_json, created_at)
                     VALUES ('a', ?1, 'objective_open', '{}', 0)",
                    [ts],
                )
                .unwrap();
            }
        });
        prune_all(&store, 30).unwrap();
        assert_eq!(
            numbers(&store, "SELECT ts FROM member_activity ORDER BY id"),
            vec![30, 40]
        );
        assert_eq!(cutoff(0, u32::MAX), -(i64::from(u32::MAX) * DAY_MS));
    }
}
