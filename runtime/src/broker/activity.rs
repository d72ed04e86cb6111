//! The activity store: one append-only stream of [`ActivityEvent`]s per member
//! kept in the broker's database in `member_activity`.
//!
//! Unlike the public ac7 the rows live in the main database file (one file to back
//! up, one lock, one `--retain-days`), and the table is created on open like every
//! other table. Rows are never tied to a member row: they outlive a deleted member.
//!
//! Each row is stamped with its uploader's incarnation (`member_seq`: the `members.seq` of
//! the member, never reused; see [`super::team`]). A member's stream is the rows of its own
//! incarnation only: a new member given a removed member's name starts with an empty one.
//! For a name that is no member now, [`list`] gives the rows of every earlier member of that
//! name (they outlive it). Objective intervals pair markers per incarnation and take only
//! that incarnation's rows.
//!
//! Reads are newest first in append order (`id` descending), so the `before_id`
//! cursor of [`Query`] is exact: a page never repeats or skips a row, even when
//! runner clocks put `ts` out of order. `from`/`to` filter on the event's own `ts`.

use std::collections::BTreeSet;
use std::sync::Arc;

use ac7_protocol::domain::message::{self, Audience, LogLevel, Route};
use ac7_protocol::domain::objective::Action;
use ac7_protocol::domain::permission::{Permission, PermissionSet};
use ac7_protocol::trace::activity::{ActivityEvent, ActivityRow, OpaqueEntryKind, OpaqueHttpEntry};
use ac7_protocol::trace::reminder;

use super::activity_blocks::{self, Parts, Refs};
use super::db::{Store, StoreError};
use super::hub::{StreamError, Subscription};
use super::objectives::ObjectiveError;
use super::publish::Draft;
use super::store::{Backend, Conn, Value};
use super::{AppState, team};

/// Rows a list returns when the client names no `limit`.
pub const DEFAULT_LIMIT: usize = 200;
/// Most rows one list returns.
pub const MAX_LIMIT: usize = 1000;

/// Appends `events` for `member`, whose id (`members.seq`) is `member_seq`, in the caller's
/// transaction (all or nothing); returns the stored rows in upload order.
///
/// On SQLite the id is the `AUTOINCREMENT` row id; the one write connection serializes
/// uploads. On PostgreSQL the ids come from the counter row `activity_head`, whose row lock
/// this transaction then holds until it ends, so ids become visible in commit order; the
/// doorbell ([`super::pg::ACTIVITY_CHANNEL`]) rings at commit with the last id (see
/// [`super::activity_follower`]).
pub fn append(
    c: &Conn<'_>,
    member: &str,
    member_seq: i64,
    events: Vec<ActivityEvent>,
    now: i64,
) -> Result<Vec<ActivityRow>, StoreError> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    // On PostgreSQL: the ids `first..=last`, taken at once.
    let mut next = match c.backend() {
        Backend::Sqlite => None,
        Backend::Postgres => {
            let n = i64::try_from(events.len())
                .map_err(|_| StoreError::Corrupt("an upload larger than i64".into()))?;
            let last = c
                .query_row(
                    "UPDATE activity_head SET last_id = last_id + ?1 WHERE id = 1 RETURNING last_id",
                    crate::params![n],
                    |r| r.get::<i64>(0),
                )?
                .ok_or_else(|| StoreError::Corrupt("the activity_head row is missing".into()))?;
            c.execute(
                "SELECT pg_notify(?1, ?2)",
                crate::params![super::pg::ACTIVITY_CHANNEL, last.to_string()],
            )?;
            Some(last - n + 1)
        }
    };
    let mut rows = Vec::with_capacity(events.len());
    for mut event in events {
        // An exchange's system prompt, tools and conversation go to shared blocks; the row
        // keeps the rest.
        let parts = Parts::take(&mut event);
        let refs = match &parts {
            Some(parts) => activity_blocks::store(c, parts)?,
            None => Refs::default(),
        };
        let json = serde_json::to_string(&event)?;
        if let Some(parts) = parts {
            parts.put(&mut event);
        }
        let ts = event.ts();
        let id = match next.as_mut() {
            None => c.query_row(
                "INSERT INTO member_activity (member_name, ts, kind, event_json, created_at, member_seq,
                     system_block, tools_block, messages_block)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) RETURNING id",
                crate::params![
                    member,
                    ts,
                    event.kind(),
                    json,
                    now,
                    member_seq,
                    refs.system,
                    refs.tools,
                    refs.messages
                ],
                |r| r.get::<i64>(0),
            )?,
            Some(next) => {
                let id = *next;
                *next += 1;
                c.execute(
                    "INSERT INTO member_activity (id, member_name, ts, kind, event_json, created_at, member_seq,
                         system_block, tools_block, messages_block)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                    crate::params![
                        id,
                        member,
                        ts,
                        event.kind(),
                        json,
                        now,
                        member_seq,
                        refs.system,
                        refs.tools,
                        refs.messages
                    ],
                )?;
                Some(id)
            }
        }
        .ok_or_else(|| StoreError::Corrupt("an activity insert returned no id".into()))?;
        rows.push(ActivityRow {
            id: u64::try_from(id).unwrap_or(0),
            member_name: member.to_owned(),
            event,
            created_at: now,
        });
    }
    Ok(rows)
}

/// A list request.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Only events with `ts >= from`.
    pub from: Option<i64>,
    /// Only events with `ts <= to`.
    pub to: Option<i64>,
    /// Only these kinds (any of them); empty = all.
    pub kinds: Vec<&'static str>,
    /// Only rows appended before row `before_id` (exclusive).
    pub before_id: Option<i64>,
    /// Only rows appended after row `after_id` (exclusive).
    pub after_id: Option<i64>,
    /// At most this many rows.
    pub limit: usize,
}

/// `member`'s rows matching `q`, newest first (or oldest first with `ascending`): those of
/// the current member of that name, or, when no member has it, of every earlier one.
pub fn list(
    c: &Conn<'_>,
    member: &str,
    q: &Query,
    ascending: bool,
) -> Result<Vec<ActivityRow>, StoreError> {
    let mut sql = String::from(
        "SELECT id, member_name, event_json, created_at, system_block, tools_block, messages_block
         FROM member_activity WHERE member_name = ?",
    );
    let mut args: Vec<Value> = vec![Value::Text(member.to_owned())];
    if let Some(seq) = team::member_seq(c, member)? {
        sql.push_str(" AND member_seq = ?");
        args.push(Value::Int(seq));
    }
    for (cond, v) in [
        (" AND ts >= ?", q.from),
        (" AND ts <= ?", q.to),
        (" AND id < ?", q.before_id),
        (" AND id > ?", q.after_id),
    ] {
        if let Some(v) = v {
            sql.push_str(cond);
            args.push(Value::Int(v));
        }
    }
    if !q.kinds.is_empty() {
        sql.push_str(" AND kind IN (");
        sql.push_str(&vec!["?"; q.kinds.len()].join(","));
        sql.push(')');
        args.extend(q.kinds.iter().map(|k| Value::Text((*k).to_owned())));
    }
    sql.push_str(if ascending {
        " ORDER BY id ASC LIMIT ?"
    } else {
        " ORDER BY id DESC LIMIT ?"
    });
    args.push(Value::Int(i64::try_from(q.limit).unwrap_or(i64::MAX)));
    query_rows(c, &sql, &args)
}

/// Up to `limit` rows of anyone with an id above `after_id`, oldest first, each with whether
/// [`list`] would give it for its member name now: the row is of the current member of that
/// name, or no member has the name.
pub fn after(
    c: &Conn<'_>,
    after_id: i64,
    limit: usize,
) -> Result<Vec<(ActivityRow, bool)>, StoreError> {
    let raws = c.query(
        "SELECT a.id, a.member_name, a.event_json, a.created_at,
                a.system_block, a.tools_block, a.messages_block,
                CASE WHEN m.seq IS NULL OR m.seq = a.member_seq THEN 1 ELSE 0 END
         FROM member_activity a LEFT JOIN members m ON m.name = a.member_name
         WHERE a.id > ?1 ORDER BY a.id LIMIT ?2",
        crate::params![after_id, i64::try_from(limit).unwrap_or(i64::MAX)],
        |r| Ok((Raw::read(r)?, r.get::<i64>(7)? == 1)),
    )?;
    let (raws, current): (Vec<Raw>, Vec<bool>) = raws.into_iter().unzip();
    Ok(assemble(c, raws)?.into_iter().zip(current).collect())
}

/// One member's working interval on an objective: from an `objective_open`
/// marker to the next `objective_close` (inclusive, on `ts`); `to` is `None`
/// while still open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    /// Whose activity.
    pub member: String,
    /// Which member of that name (`members.seq`; see the module docs).
    pub member_seq: i64,
    /// The open marker's `ts`.
    pub from: i64,
    /// The close marker's `ts`, if closed.
    pub to: Option<i64>,
}

/// The intervals in which members worked on `objective`, from their markers in
/// append order, per member incarnation. A second open while one is open keeps the first;
/// a close without an open is ignored.
pub fn objective_intervals(c: &Conn<'_>, objective: &str) -> Result<Vec<Interval>, StoreError> {
    // The objective is a field of the event's JSON: the markers are read and matched here.
    let markers = c
        .query(
            "SELECT member_name, member_seq, kind, ts, event_json FROM member_activity
             WHERE kind IN ('objective_open', 'objective_close')
             ORDER BY id",
            crate::params![],
            |r| {
                Ok((
                    (r.get::<String>(0)?, r.get::<i64>(1)?),
                    r.get::<String>(2)?,
                    r.get::<i64>(3)?,
                    r.get::<String>(4)?,
                ))
            },
        )?
        .into_iter()
        .filter(|(_, _, _, json)| marker_objective(json).as_deref() == Some(objective))
        .map(|(who, kind, ts, _)| (who, kind, ts));
    let mut open: std::collections::BTreeMap<(String, i64), i64> = Default::default();
    let mut out = Vec::new();
    for (who, kind, ts) in markers {
        if kind == "objective_open" {
            open.entry(who).or_insert(ts);
        } else if let Some(from) = open.remove(&who) {
            out.push(Interval {
                member: who.0,
                member_seq: who.1,
                from,
                to: Some(ts),
            });
        }
    }
    out.extend(
        open.into_iter()
            .map(|((member, member_seq), from)| Interval {
                member,
                member_seq,
                from,
                to: None,
            }),
    );
    Ok(out)
}

/// The `objectiveId` of a marker's stored JSON, if it has one (as text).
fn marker_objective(json: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Marker {
        #[serde(rename = "objectiveId")]
        objective_id: Option<serde_json::Value>,
    }
    match serde_json::from_str::<Marker>(json).ok()?.objective_id? {
        serde_json::Value::String(s) => Some(s),
        _ => None,
    }
}

/// Exchanges (`llm_exchange`, `opaque_http`) inside `intervals`, newest first,
/// at most `limit`, only rows before `before_id` when given.
pub fn in_intervals(
    c: &Conn<'_>,
    intervals: &[Interval],
    before_id: Option<i64>,
    limit: usize,
) -> Result<Vec<ActivityRow>, StoreError> {
    if intervals.is_empty() {
        return Ok(Vec::new());
    }
    let mut sql = String::from(
        "SELECT id, member_name, event_json, created_at, system_block, tools_block, messages_block
         FROM member_activity
         WHERE kind IN ('llm_exchange', 'opaque_http') AND id < ? AND (",
    );
    let mut args: Vec<Value> = vec![Value::Int(before_id.unwrap_or(i64::MAX))];
    for (i, iv) in intervals.iter().enumerate() {
        if i > 0 {
            sql.push_str(" OR ");
        }
        sql.push_str("(member_name = ? AND member_seq = ? AND ts >= ? AND ts <= ?)");
        args.push(Value::Text(iv.member.clone()));
        args.push(Value::Int(iv.member_seq));
        args.push(Value::Int(iv.from));
        args.push(Value::Int(iv.to.unwrap_or(i64::MAX)));
    }
    sql.push_str(") ORDER BY id DESC LIMIT ?");
    args.push(Value::Int(i64::try_from(limit).unwrap_or(i64::MAX)));
    query_rows(c, &sql, &args)
}

/// Runs `sql` (selecting the columns [`Raw::read`] reads) into rows.
fn query_rows(c: &Conn<'_>, sql: &str, args: &[Value]) -> Result<Vec<ActivityRow>, StoreError> {
    let params: Vec<&dyn super::store::ToValue> = args.iter().map(|v| v as _).collect();
    let raws = c.query(sql, &params, Raw::read)?;
    assemble(c, raws)
}

/// A stored row as read: `id, member_name, event_json, created_at, system_block,
/// tools_block, messages_block`.
struct Raw {
    id: i64,
    member_name: String,
    json: String,
    created_at: i64,
    refs: Refs,
}

impl Raw {
    fn read(r: &super::store::Row) -> Result<Raw, StoreError> {
        Ok(Raw {
            id: r.get(0)?,
            member_name: r.get(1)?,
            json: r.get(2)?,
            created_at: r.get(3)?,
            refs: Refs {
                system: r.get(4)?,
                tools: r.get(5)?,
                messages: r.get(6)?,
            },
        })
    }
}

/// The rows of `raws`, each event with its parts put back from the blocks it points at
/// (read once for all the rows).
fn assemble(c: &Conn<'_>, raws: Vec<Raw>) -> Result<Vec<ActivityRow>, StoreError> {
    let refs: Vec<Refs> = raws
        .iter()
        .map(|r| r.refs)
        .filter(|r| !r.is_empty())
        .collect();
    let mut blocks = if refs.is_empty() {
        activity_blocks::Loaded::default()
    } else {
        activity_blocks::load(c, &refs)?
    };
    Ok(raws
        .into_iter()
        .map(|raw| {
            let event = serde_json::from_str::<ActivityEvent>(&raw.json)
                .ok()
                .and_then(|mut event| {
                    if !raw.refs.is_empty() {
                        blocks.parts(&raw.refs)?.put(&mut event);
                    }
                    Some(event)
                });
            row(raw.id, raw.member_name, event, raw.created_at)
        })
        .collect())
}

/// A row as a live-stream frame: SSE `id: <row id>`, `event: activity`, the
/// row's JSON as data (and as the WebSocket text frame).
pub fn frame(row: &ActivityRow) -> Result<super::hub::Frame, StoreError> {
    Ok(super::hub::Frame::event(
        row.id.to_string(),
        "activity",
        serde_json::to_string(row)?,
    ))
}

/// The last row id of `member` (0 if none), among the rows [`list`] gives.
pub fn head(c: &Conn<'_>, member: &str) -> Result<i64, StoreError> {
    let max = match team::member_seq(c, member)? {
        Some(seq) => c.query_row(
            "SELECT COALESCE(MAX(id), 0) FROM member_activity
             WHERE member_name = ?1 AND member_seq = ?2",
            crate::params![member, seq],
            |r| r.get::<i64>(0),
        )?,
        None => c.query_row(
            "SELECT COALESCE(MAX(id), 0) FROM member_activity WHERE member_name = ?1",
            crate::params![member],
            |r| r.get::<i64>(0),
        )?,
    };
    Ok(max.unwrap_or(0))
}

/// The last row id of anyone (0 if none): ids above it were never handed out. It is the
/// id counter's own value (rows deleted since count), which each database keeps its own way:
/// SQLite in `sqlite_sequence`, PostgreSQL in `activity_head` (committed uploads only).
pub fn last_id(c: &Conn<'_>) -> Result<i64, StoreError> {
    let sql = match c.backend() {
        Backend::Sqlite => {
            "SELECT COALESCE(MAX(seq), 0) FROM sqlite_sequence WHERE name = 'member_activity'"
        }
        Backend::Postgres => "SELECT last_id FROM activity_head WHERE id = 1",
    };
    Ok(c.query_row(sql, crate::params![], |r| r.get::<i64>(0))?
        .unwrap_or(0))
}

/// A stored row; one whose JSON (or a block it points at) no longer decodes comes back as an
/// `opaque_http` placeholder with host `malformed-payload`, as in the TypeScript broker.
fn row(id: i64, member_name: String, event: Option<ActivityEvent>, created_at: i64) -> ActivityRow {
    let event = event.unwrap_or_else(|| ActivityEvent::OpaqueHttp {
        ts: 0,
        duration: 0,
        entry: OpaqueHttpEntry {
            kind: OpaqueEntryKind::OpaqueHttp,
            started_at: 0,
            ended_at: 0,
            host: "malformed-payload".to_owned(),
            method: "UNKNOWN".to_owned(),
            url: String::new(),
            status: None,
            request_headers: Default::default(),
            response_headers: Default::default(),
            request_body_preview: None,
            response_body_preview: None,
            truncated: Vec::new(),
        },
    });
    ActivityRow {
        id: u64::try_from(id).unwrap_or(0),
        member_name,
        event,
        created_at,
    }
}

/// The objective context reminder's check for `member` (see
/// [`ac7_protocol::trace::reminder::Reminders::check`]) against the cool-downs kept in the store:
/// the reminder body, or `None`; the keys it fires are stored, expired ones dropped.
pub fn remind_check(
    c: &Conn<'_>,
    member: &str,
    context: &str,
    open: &[ac7_protocol::domain::objective::Objective],
    now: i64,
) -> Result<Option<String>, StoreError> {
    use ac7_protocol::trace::reminder::{COOLDOWN_MS, Reminders};
    let prefix = format!("{member}:");
    if c.backend() == Backend::Postgres {
        // Replicas checking the same member at once: one after the other.
        c.execute(
            "SELECT pg_advisory_xact_lock(hashtext(?1)::bigint)",
            crate::params![format!("ac7 reminder {member}")],
        )?;
    }
    let mut reminders = Reminders::default();
    let upper = format!("{member};");
    for (key, at) in c.query(
        "SELECT key, fired_at FROM reminder_cooldowns WHERE key >= ?1 AND key < ?2",
        crate::params![prefix, upper],
        |r| Ok((r.get::<String>(0)?, r.get::<i64>(1)?)),
    )? {
        reminders.restore(key, at);
    }
    let body = reminders.check(member, context, open, now);
    if body.is_some() {
        for (key, at) in reminders.fired() {
            c.execute(
                "INSERT INTO reminder_cooldowns (key, fired_at) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET fired_at = excluded.fired_at",
                crate::params![key, at],
            )?;
        }
    }
    c.execute(
        "DELETE FROM reminder_cooldowns WHERE fired_at < ?1",
        crate::params![now - COOLDOWN_MS],
    )?;
    Ok(body)
}

/// Stores `events` uploaded by `member` (authenticated with token `token_id`) at `now`;
/// returns how many. On SQLite the rows are delivered to the member's activity streams inside
/// the transaction, under the store's write lock, like a push: a stream opening with
/// `Last-Event-ID` takes that lock too, so it sees each row either in its replay or live,
/// never both. With the activity follower (PostgreSQL) they are delivered after the commit,
/// in id order with every replica's.
pub fn upload(
    state: &AppState,
    member: &str,
    token_id: &str,
    events: Vec<ActivityEvent>,
    now: i64,
) -> Result<usize, StreamError> {
    let n = state.store.tx(|c| -> Result<usize, StreamError> {
        // Stamped with the uploader's incarnation; a request authenticated just before its
        // member was removed (its credential is gone now) must not land in a successor's stream.
        let member_seq = match team::member_seq(c, member)? {
            Some(seq) if team::token_id_exists(c, token_id)? => seq,
            _ => return Err(StreamError::UnknownToken),
        };
        let rows = append(c, member, member_seq, events, now)?;
        if state.activity_follower.is_none() {
            let only = Audience::Only([member.to_owned()].into());
            for row in &rows {
                state
                    .activity_hub
                    .deliver(&only, &Arc::new(frame(row)?), now);
            }
        }
        Ok(rows.len())
    })?;
    if let Some(follower) = &state.activity_follower
        && let Err(e) = super::store::off_worker(|| follower.catch_up(state))
    {
        tracing::warn!(error = %e, "reading activity back for live delivery failed; the doorbell retries");
    }
    Ok(n)
}

/// Who the objective context reminder is from (a reserved name no member can take).
const REMINDER_SENDER: &str = "ac7";

/// The objective context reminder: a DM from `ac7` listing `member`'s open objectives
/// missing from `context`, at most once per objective per 5 minutes (cool-downs kept in the
/// store, so replicas share them). A failure is logged; the upload it follows has succeeded
/// either way.
pub async fn remind(state: &AppState, member: &str, context: &str, now: i64) {
    let open = match state.store.view(|c| super::objectives::open_for(c, member)) {
        Ok(open) => open,
        Err(e) => {
            tracing::warn!(error = %e, "objective context reminder: cannot list objectives");
            return;
        }
    };
    let body = match state
        .store
        .tx(|c| remind_check(c, member, context, &open, now))
    {
        Ok(body) => body,
        Err(e) => {
            tracing::warn!(error = %e, "objective context reminder: cannot check cool-downs");
            return;
        }
    };
    let Some(body) = body else {
        return;
    };
    let route = Route::Direct {
        to: member.to_owned(),
    };
    let draft = Draft {
        to: Some(member.to_owned()),
        from: REMINDER_SENDER.to_owned(),
        title: Some(reminder::TITLE.to_owned()),
        body,
        level: LogLevel::Notice,
        data: Default::default(),
        attachments: Vec::new(),
    };
    let audience = message::audience(Some(REMINDER_SENDER), &route, &BTreeSet::new());
    if let Err(e) = state.writer.push(state, draft, audience, now).await {
        tracing::warn!(error = %e, "objective context reminder: cannot send");
    }
}

/// `member`'s rows matching `q`, newest first, in a read transaction.
pub fn list_rows(store: &Store, member: &str, q: &Query) -> Result<Vec<ActivityRow>, StoreError> {
    store.view(|c| list(c, member, q, false))
}

/// One page of a replay of `member`'s rows: those after `cursor` through `head`, oldest
/// first, at most `limit`.
pub fn replay_page(
    store: &Store,
    member: &str,
    cursor: i64,
    head: i64,
    limit: usize,
) -> Result<Vec<ActivityRow>, StoreError> {
    let q = Query {
        after_id: Some(cursor),
        before_id: Some(head + 1),
        limit,
        ..Default::default()
    };
    store.view(|c| list(c, member, &q, true))
}

/// Where a live stream starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamStart {
    /// Live rows only: no last event id.
    Live,
    /// The rows after `cursor` through `head` first, then live ones.
    Replay {
        /// The last id the client has.
        cursor: i64,
        /// The last id delivered before the stream was registered.
        head: i64,
    },
    /// The last event id cannot be placed: the client must start over.
    Unknown,
}

/// Opens `watcher`'s live stream (authenticated with `token_id`) of `member`'s activity at
/// `now`, resuming after `last_event_id` when it is a row id of this broker. In a write transaction
/// although it only reads: on SQLite that takes the lock uploads deliver under, and the
/// stream is registered before it is released, so the head and the live tail join without a
/// gap or a duplicate. With the activity follower the stream is registered with it, whose
/// position ends the replay.
pub fn open_stream(
    state: &AppState,
    member: &str,
    watcher: &str,
    token_id: &str,
    last_event_id: Option<&str>,
    now: i64,
) -> Result<(StreamStart, Subscription), StreamError> {
    state.store.tx_then(
        |c| -> Result<_, StreamError> {
            let head = head(c, member)?;
            let start = match last_event_id {
                None => StreamStart::Live,
                Some(id) => match id.trim().parse::<i64>() {
                    Ok(cursor) if (0..=last_id(c)?).contains(&cursor) => {
                        StreamStart::Replay { cursor, head }
                    }
                    _ => StreamStart::Unknown,
                },
            };
            if !team::token_id_exists(c, token_id)? {
                return Err(StreamError::UnknownToken);
            }
            Ok(start)
        },
        |start| -> Result<_, StreamError> {
            let watch = || state.activity_hub.watch(member, watcher, token_id, now);
            let Some(follower) = &state.activity_follower else {
                return Ok((start, watch().map_err(StreamError::Refused)?));
            };
            let cursor = match &start {
                StreamStart::Replay { cursor, .. } => Some(*cursor),
                StreamStart::Live | StreamStart::Unknown => None,
            };
            let (sub, delivered) = follower.watch_at(state, cursor, watch)?;
            let start = match start {
                StreamStart::Replay { cursor, .. } => StreamStart::Replay {
                    cursor,
                    head: delivered,
                },
                other => other,
            };
            Ok((start, sub.map_err(StreamError::Refused)?))
        },
    )?
}

/// The exchanges of every member within their open intervals on objective `id`, newest
/// first, with the intervals, for a `viewer` (holding `perms`) who may view the objective;
/// without `activity.read` only the viewer's own rows and intervals. `q`'s `before_id` and
/// `limit` page.
pub fn objective_activity(
    store: &Store,
    viewer: &str,
    perms: PermissionSet,
    id: &str,
    q: &Query,
) -> Result<(Vec<ActivityRow>, Vec<Interval>), ObjectiveError> {
    store.view(|c| {
        super::objectives::load_for(c, id, viewer, perms, Action::View)?;
        let mut intervals = objective_intervals(c, id)?;
        if !perms.contains(Permission::ActivityRead) {
            let me = team::member_seq(c, viewer)?;
            intervals.retain(|iv| iv.member == viewer && Some(iv.member_seq) == me);
        }
        let rows = in_intervals(c, &intervals, q.before_id, q.limit)?;
        Ok((rows, intervals))
    })
}
