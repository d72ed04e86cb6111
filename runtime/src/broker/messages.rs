//! The message log in the store: append, `/history` queries and `Last-Event-ID` replay.
//!
//! Every message is stored as its wire JSON plus the columns needed to query it.
//! `seq` (the row id) gives the total order that live delivery also follows.
//!
//! Queries touch only rows the viewer may see. What a viewer sees
//! ([`ac7_protocol::domain::message::matches_viewer`]) is a union of *sources*, each an
//! indexed column: DMs to it (`to_name`), everything it sent (`from_name`), the
//! general channel and each channel and objective thread it belongs to
//! (`thread`). [`page`] reads at most `limit` rows from each source in `seq`
//! order through its index, then merges them: the cost follows the rows the
//! viewer may see, not the size of the log.
//!
//! A viewer's own sources (DMs to it, what it sent, its DM feeds) start after its
//! incarnation's first position ([`ViewerScope::since`], see [`super::team`]): rows of its
//! name before that belong to an earlier member of the same name. The other party of a DM
//! keeps seeing it (only the viewer's own incarnation bounds a query).

use std::collections::HashSet;

use ac7_protocol::domain::message::{Audience, Membership, Message, Route};

use super::db::StoreError;
use super::store::{Backend, Conn, ToValue};
use crate::params;

/// Appends `msg`; returns its sequence number.
///
/// On SQLite `seq` is the AUTOINCREMENT row id; the one write connection serializes appends.
/// On PostgreSQL the number comes from the counter row `log_head`, whose row lock this
/// transaction then holds until it ends, so numbers become visible in commit order (see
/// [`super::pg::log`]); the doorbell ([`super::pg::log::LOG_CHANNEL`]) rings at commit.
pub fn insert(
    c: &Conn<'_>,
    msg: &Message,
    json: &str,
    audience: &Audience,
) -> Result<i64, StoreError> {
    let thread = match &msg.to {
        Some(_) => None,
        None => match Route::of_message(msg) {
            Route::General => Some("chan:general".to_owned()),
            Route::Channel(id) => Some(format!("chan:{id}")),
            Route::Objective(id) => Some(format!("obj:{id}")),
            Route::Direct { .. } | Route::Unroutable => None,
        },
    };
    let seq = match c.backend() {
        Backend::Sqlite => c.query_row(
            "INSERT INTO messages (id, ts, to_name, from_name, thread, json)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING seq",
            params![msg.id, msg.ts, msg.to, msg.from, thread, json],
            |r| r.get::<i64>(0),
        )?,
        Backend::Postgres => {
            let seq = c
                .query_row(
                    "UPDATE log_head SET last_seq = last_seq + ?1 WHERE id = 1 RETURNING last_seq",
                    params![1i64],
                    |r| r.get::<i64>(0),
                )?
                .ok_or_else(|| StoreError::Corrupt("the log_head row is missing".into()))?;
            // Replicas deliver what they read back from the log: the audience decided at push
            // time travels with the row (NULL: everyone).
            let audience = match audience {
                Audience::Everyone => None,
                Audience::Only(names) => Some(serde_json::to_string(names)?),
            };
            c.execute(
                "INSERT INTO messages (seq, id, ts, to_name, from_name, thread, json, audience)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    seq, msg.id, msg.ts, msg.to, msg.from, thread, json, audience
                ],
            )?;
            c.execute("SELECT pg_notify('ac7_log', ?1)", params![seq.to_string()])?;
            Some(seq)
        }
    };
    seq.ok_or_else(|| StoreError::Corrupt("an insert into the log returned no sequence".into()))
}

/// What one viewer belongs to, loaded once per query.
#[derive(Debug, Clone)]
pub struct ViewerScope {
    /// Channel ids the viewer is a member of.
    pub channels: HashSet<String>,
    /// Objective ids whose thread the viewer is in (ignored when `manager`).
    pub objectives: HashSet<String>,
    /// `members.manage` holders are in every objective thread.
    pub manager: bool,
    /// The viewer's incarnation starts after this log position: its own sources (DMs to and
    /// from it) hold only later rows. `i64::MAX` (nothing) for a name that is no member.
    pub since: i64,
}

impl Membership for ViewerScope {
    fn in_channel(&self, channel_id: &str) -> bool {
        self.channels.contains(channel_id)
    }

    fn in_objective_thread(&self, objective_id: &str) -> bool {
        self.manager || self.objectives.contains(objective_id)
    }
}

/// Loads `viewer`'s memberships.
pub fn viewer_scope(c: &Conn<'_>, viewer: &str, manager: bool) -> Result<ViewerScope, StoreError> {
    let channels: HashSet<String> = c
        .query(
            "SELECT channel_id FROM channel_members WHERE member_name = ?1",
            params![viewer],
            |r| r.get::<String>(0),
        )?
        .into_iter()
        .collect();
    let mut objectives = HashSet::new();
    if !manager {
        let sql = match c.backend() {
            Backend::Sqlite => {
                "SELECT id FROM objectives WHERE assignee = ?1 OR originator = ?1
                 OR EXISTS (SELECT 1 FROM json_each(objectives.json, '$.watchers') WHERE value = ?1)"
            }
            Backend::Postgres => {
                "SELECT id FROM objectives WHERE assignee = ?1 OR originator = ?1
                 OR (objectives.json::jsonb -> 'watchers') @> jsonb_build_array(?1::text)"
            }
        };
        objectives.extend(c.query(sql, params![viewer], |r| r.get::<String>(0))?);
    }
    Ok(ViewerScope {
        channels,
        objectives,
        manager,
        since: super::team::member_since(c, viewer)?.unwrap_or(i64::MAX),
    })
}

/// Which slice of history to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Feed {
    /// Everything the viewer may see.
    All,
    /// The general channel.
    General,
    /// One named channel (the caller checked membership).
    Channel(String),
    /// DMs between the viewer and this member.
    With(String),
}

/// Bounds and order of one page. Every bound is exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Only rows with `seq` greater than this.
    pub after_seq: Option<i64>,
    /// Only rows with `seq` less than this.
    pub before_seq: Option<i64>,
    /// Only rows with `ts` greater than this (epoch ms).
    pub after_ts: Option<i64>,
    /// Only rows with `ts` less than this (epoch ms).
    pub before_ts: Option<i64>,
    /// Oldest first (`seq` ascending) instead of newest first.
    pub oldest_first: bool,
    /// At most this many rows.
    pub limit: usize,
}

impl Window {
    /// The newest `limit` rows.
    pub fn newest(limit: usize) -> Window {
        Window {
            after_seq: None,
            before_seq: None,
            after_ts: None,
            before_ts: None,
            oldest_first: false,
            limit,
        }
    }
}

/// One stored message: its position in the log, id and wire JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The log position.
    pub seq: i64,
    /// The message id.
    pub id: String,
    /// The Message JSON as logged (and as sent live).
    pub json: String,
}

/// One indexed slice of the log a viewer may see.
enum Source<'a> {
    /// DMs to this member (`messages_to`).
    To(&'a str),
    /// Everything this member sent (`messages_from`).
    From(&'a str),
    /// DMs from the second member to the first (`messages_to`).
    Dm { to: &'a str, from: &'a str },
    /// Posts in one thread (`messages_thread`).
    Thread(String),
    /// Posts in every objective thread (`members.manage` holders).
    AllObjectives,
}

/// The sources whose union is what `viewer` may see of `feed`.
fn sources<'a>(viewer: &'a str, scope: &ViewerScope, feed: &'a Feed) -> Vec<Source<'a>> {
    match feed {
        Feed::General => vec![Source::Thread("chan:general".into())],
        Feed::Channel(id) => vec![Source::Thread(format!("chan:{id}"))],
        Feed::With(other) => vec![
            Source::Dm {
                to: viewer,
                from: other,
            },
            Source::Dm {
                to: other,
                from: viewer,
            },
        ],
        Feed::All => {
            let mut out = vec![
                Source::To(viewer),
                Source::From(viewer),
                Source::Thread("chan:general".into()),
            ];
            // Any order: the rows are merged by seq.
            out.extend(
                scope
                    .channels
                    .iter()
                    .map(|c| Source::Thread(format!("chan:{c}"))),
            );
            if scope.manager {
                out.push(Source::AllObjectives);
            } else {
                out.extend(
                    scope
                        .objectives
                        .iter()
                        .map(|o| Source::Thread(format!("obj:{o}"))),
                );
            }
            out
        }
    }
}

/// The query of one source: `condition` binds `?6` (and `?7`); `?1`–`?5` are the window.
fn source_sql(backend: Backend, condition: &str, order: &str) -> String {
    let (table, condition) = match backend {
        // A range of threads ordered by seq would otherwise walk the whole log by seq.
        Backend::Sqlite if condition == ALL_OBJECTIVES => {
            ("messages INDEXED BY messages_thread", condition.to_owned())
        }
        Backend::Sqlite => ("messages", condition.to_owned()),
        // `+x` (no index on x) is SQLite's; PostgreSQL has no unary plus on text.
        Backend::Postgres => ("messages", condition.replace("+to_name", "to_name")),
    };
    format!(
        "SELECT seq, id, json FROM {table} WHERE {condition}
         AND seq > ?1 AND seq < ?2 AND ts > ?3 AND ts < ?4 ORDER BY seq {order} LIMIT ?5"
    )
}

/// A thread's posts. (`+to_name`: the check must not steer SQLite to the `to_name` index,
/// where NULL matches every post in every thread.)
const THREAD: &str = "thread = ?6 AND +to_name IS NULL";
/// Every objective thread's posts.
const ALL_OBJECTIVES: &str = "thread >= 'obj:' AND thread < 'obj;' AND +to_name IS NULL";

/// Every source condition and the index it must search, for the query-plan test.
#[cfg(test)]
const CONDITIONS: &[(&str, &str)] = &[
    ("to_name = ?6", "messages_to"),
    ("from_name = ?6", "messages_from"),
    ("to_name = ?6 AND from_name = ?7", "messages_"),
    (THREAD, "messages_thread"),
    (ALL_OBJECTIVES, "messages_thread"),
];

/// One page of what `viewer` may see of `feed` within `window`, in the
/// window's order.
pub fn page(
    c: &Conn<'_>,
    viewer: &str,
    scope: &ViewerScope,
    feed: &Feed,
    window: &Window,
) -> Result<Vec<Row>, StoreError> {
    let order = if window.oldest_first { "ASC" } else { "DESC" };
    let after_seq = window.after_seq.unwrap_or(i64::MIN);
    let before_seq = window.before_seq.unwrap_or(i64::MAX);
    let after_ts = window.after_ts.unwrap_or(i64::MIN);
    let before_ts = window.before_ts.unwrap_or(i64::MAX);
    let limit = window.limit as i64;
    // The viewer's own sources start with its incarnation.
    let own_after_seq = after_seq.max(scope.since);
    let mut rows: Vec<Row> = Vec::new();
    for source in sources(viewer, scope, feed) {
        let after_seq = match source {
            Source::To(_) | Source::From(_) | Source::Dm { .. } => &own_after_seq,
            Source::Thread(_) | Source::AllObjectives => &after_seq,
        };
        let mut args: Vec<&dyn ToValue> =
            vec![after_seq, &before_seq, &after_ts, &before_ts, &limit];
        let condition = match &source {
            Source::To(name) | Source::From(name) => {
                args.push(name);
                if matches!(source, Source::To(_)) {
                    "to_name = ?6"
                } else {
                    "from_name = ?6"
                }
            }
            Source::Dm { to, from } => {
                args.push(to);
                args.push(from);
                "to_name = ?6 AND from_name = ?7"
            }
            Source::Thread(thread) => {
                args.push(thread);
                THREAD
            }
            Source::AllObjectives => ALL_OBJECTIVES,
        };
        rows.extend(
            c.query(&source_sql(c.backend(), condition, order), &args, |r| {
                Ok(Row {
                    seq: r.get(0)?,
                    id: r.get(1)?,
                    json: r.get(2)?,
                })
            })?,
        );
    }
    if window.oldest_first {
        rows.sort_unstable_by_key(|r| r.seq);
    } else {
        rows.sort_unstable_by_key(|r| std::cmp::Reverse(r.seq));
    }
    rows.dedup_by_key(|r| r.seq);
    rows.truncate(window.limit);
    Ok(rows)
}

/// The log position of message `id`, if the log has it.
pub fn seq_of(c: &Conn<'_>, id: &str) -> Result<Option<i64>, StoreError> {
    c.query_row("SELECT seq FROM messages WHERE id = ?1", params![id], |r| {
        r.get::<i64>(0)
    })
}

/// The newest log position (0 for an empty log).
pub fn head(c: &Conn<'_>) -> Result<i64, StoreError> {
    Ok(c.query_row(
        "SELECT COALESCE(MAX(seq), 0) FROM messages",
        params![],
        |r| r.get::<i64>(0),
    )?
    .unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each source reads through an index, so a query touches the viewer's rows only, never a
    /// scan of the log (the rows another member sees cost nothing).
    #[test]
    fn every_source_is_an_index_search() {
        let store = crate::broker::db::Store::open_in_memory().unwrap();
        store.with(|conn| {
            for (condition, index) in CONDITIONS {
                for order in ["ASC", "DESC"] {
                    let sql = format!(
                        "EXPLAIN QUERY PLAN {}",
                        source_sql(Backend::Sqlite, condition, order)
                    );
                    let mut stmt = conn.prepare(&sql).unwrap();
                    // Unbound parameters are NULL: the plan does not depend on them.
                    let mut rows = stmt.raw_query();
                    let mut plan = Vec::new();
                    while let Some(row) = rows.next().unwrap() {
                        plan.push(row.get::<_, String>(3).unwrap());
                    }
                    let plan = plan.join(" | ");
                    assert!(
                        plan.contains(&format!("USING INDEX {index}")) && !plan.contains("SCAN"),
                        "{condition} {order}: {plan}"
                    );
                }
            }
        });
    }
}
