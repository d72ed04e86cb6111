//! The message log in the store: append, `/history` queries and `Last-Event-ID` replay.
//!
//! `seq` (the row id) gives the total order that live delivery also follows.
//!
//! # How a message is stored
//!
//! A row holds each part of the message once, and the wire JSON is rebuilt from them on read:
//!
//! - `id`: the id's 16 bytes when it is a UUID in canonical form (every id the broker stamps),
//!   else NULL and the id in `id_text`;
//! - `ts`, `body`: as they are;
//! - `to_key`, `from_key`: the recipient and the sender as ids of `message_keys`, which holds
//!   each name and thread key once;
//! - `thread`: the thread key's id in `message_keys`, negated for objective threads (so that
//!   `thread < 0` is every objective thread); NULL for a DM;
//! - `extra`: NULL when the message has no title, level `info`, no attachments and the `data`
//!   its thread implies (`{"thread": <key>}` for a channel or objective post, `{}` otherwise);
//!   else a JSON object with what differs: `t` (title), `l` (level), `d` (data), `a`
//!   (attachments). A message whose rebuilt JSON would not be the very bytes logged is kept
//!   whole instead, as `{"j": <wire JSON>}` (with an empty `body`); [`encode`] checks.
//! - `audience` (PostgreSQL only, see [`super::follower`]): who it was pushed to, as the
//!   `message_keys` id of its JSON (`null`: everyone, or the list of names); NULL when it is
//!   what the route implies without thread members (everyone for the general channel, the two
//!   parties of a DM).
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

use ac7_protocol::domain::message::{
    self, Attachment, Audience, LogLevel, Membership, Message, Route, Thread,
};
use serde_json::{Map, Value};

use super::db::StoreError;
use super::store::{Backend, Conn, ToValue};
use crate::params;

/// Appends `msg`; returns its sequence number.
///
/// On SQLite `seq` is the row id, the larger of the newest one and `messages_mark` (the highest
/// number pruning may have removed, see [`super::db`]) plus one, so no number is handed out
/// twice; the one write connection serializes appends.
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
    let stored = encode(msg, json, thread.as_deref())?;
    // On PostgreSQL the number comes first: every appending transaction then holds the
    // `log_head` row before it adds a key, so none waits for another's new key while that one
    // waits for the head (a deadlock PostgreSQL breaks by failing one of the two pushes).
    let pg_seq = match c.backend() {
        Backend::Sqlite => None,
        Backend::Postgres => Some(
            c.query_row(
                "UPDATE log_head SET last_seq = last_seq + ?1 WHERE id = 1 RETURNING last_seq",
                params![1i64],
                |r| r.get::<i64>(0),
            )?
            .ok_or_else(|| StoreError::Corrupt("the log_head row is missing".into()))?,
        ),
    };
    let to_key = msg.to.as_deref().map(|k| key_id(c, k)).transpose()?;
    let from_key = msg.from.as_deref().map(|k| key_id(c, k)).transpose()?;
    let thread_code = thread
        .as_deref()
        .map(|t| Ok::<_, StoreError>(thread_code(t, key_id(c, t)?)))
        .transpose()?;
    let row = params![
        stored.id,
        stored.id_text,
        msg.ts,
        to_key,
        from_key,
        thread_code,
        stored.body,
        stored.extra
    ];
    let seq = match pg_seq {
        None => {
            // `seq` is the rowid: SQLite reports it without the result table a `RETURNING`
            // clause builds.
            c.execute(
                "INSERT INTO messages (seq, id, id_text, ts, to_key, from_key, thread, body, extra)
                 VALUES (MAX((SELECT COALESCE(MAX(seq), 0) FROM messages),
                             (SELECT seq FROM messages_mark WHERE id = 1)) + 1,
                         ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                row,
            )?;
            c.as_sqlite().map(rusqlite::Connection::last_insert_rowid)
        }
        Some(seq) => {
            // Replicas deliver what they read back from the log: the audience decided at push
            // time travels with the row (NULL: what the route implies).
            let route = route_of(msg.to.as_deref(), thread.as_deref());
            let audience = if *audience
                == message::audience(msg.from.as_deref(), &route, &Default::default())
            {
                None
            } else {
                Some(key_id(c, &audience_json(audience)?)?)
            };
            let mut values = row.to_vec();
            values.extend(params![seq, audience]);
            c.execute(
                "INSERT INTO messages (id, id_text, ts, to_key, from_key, thread, body, extra, seq, audience)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                &values,
            )?;
            c.execute("SELECT pg_notify('ac7_log', ?1)", params![seq.to_string()])?;
            Some(seq)
        }
    };
    seq.ok_or_else(|| StoreError::Corrupt("an insert into the log returned no sequence".into()))
}

/// Appends a message from `ann` (to `to`, stamped `ts`) through [`insert`]; its number.
#[cfg(test)]
pub(crate) fn append_for_test(store: &super::db::Store, to: Option<&str>, ts: i64) -> i64 {
    let msg = Message {
        id: new_id(),
        ts,
        to: to.map(str::to_owned),
        from: Some("ann".to_owned()),
        title: None,
        body: format!("at {ts}"),
        level: LogLevel::Info,
        data: Map::new(),
        attachments: Vec::new(),
    };
    let json = serde_json::to_string(&msg).unwrap();
    store
        .tx(|c| insert(c, &msg, &json, &Audience::Everyone))
        .unwrap()
}

/// The route of a stored message, from its recipient and thread key.
pub fn route_of(to: Option<&str>, thread: Option<&str>) -> Route {
    match (to, thread.map(Thread::parse)) {
        (Some(to), _) => Route::Direct { to: to.to_owned() },
        (None, Some(Ok(Thread::General))) => Route::General,
        (None, Some(Ok(Thread::Channel(id)))) => Route::Channel(id),
        (None, Some(Ok(Thread::Objective(id)))) => Route::Objective(id),
        (None, Some(Err(_)) | None) => Route::Unroutable,
    }
}

/// An audience as stored in `message_keys`: `null` for everyone, else the JSON list of names.
pub fn audience_json(audience: &Audience) -> Result<String, StoreError> {
    Ok(match audience {
        Audience::Everyone => "null".to_owned(),
        Audience::Only(names) => serde_json::to_string(names)?,
    })
}

/// The audience of a stored row: its `message_keys` text, or (NULL) what the route implies.
pub fn stored_audience(
    key: Option<&str>,
    from: Option<&str>,
    route: &Route,
) -> Result<Audience, StoreError> {
    Ok(match key {
        None => message::audience(from, route, &Default::default()),
        Some("null") => Audience::Everyone,
        Some(names) => Audience::Only(serde_json::from_str(names)?),
    })
}

/// The `message_keys` id of `key`, added if new.
pub fn key_id(c: &Conn<'_>, key: &str) -> Result<i64, StoreError> {
    if let Some(id) = find_key(c, key)? {
        return Ok(id);
    }
    c.execute(
        "INSERT INTO message_keys (key) VALUES (?1) ON CONFLICT (key) DO NOTHING",
        params![key],
    )?;
    select_key(c, key)?
        .ok_or_else(|| StoreError::Corrupt(format!("the message key {key:?} is missing")))
}

/// The `message_keys` id of `key`, if it has one.
fn find_key(c: &Conn<'_>, key: &str) -> Result<Option<i64>, StoreError> {
    match c.key_cache().and_then(|k| k.id(key)) {
        Some(id) => Ok(Some(id)),
        None => select_key(c, key),
    }
}

/// [`find_key`] in the database (the row found goes to the cache as the transaction allows).
fn select_key(c: &Conn<'_>, key: &str) -> Result<Option<i64>, StoreError> {
    let id = c.query_row(
        "SELECT id FROM message_keys WHERE key = ?1",
        params![key],
        |r| r.get::<i64>(0),
    )?;
    if let Some(id) = id {
        c.remember_key(id, key);
    }
    Ok(id)
}

/// The key whose `message_keys` id is `id`.
fn key_of(c: &Conn<'_>, id: i64) -> Result<std::sync::Arc<str>, StoreError> {
    if let Some(key) = c.key_cache().and_then(|k| k.key(id)) {
        return Ok(key);
    }
    let key = c
        .query_row(
            "SELECT key FROM message_keys WHERE id = ?1",
            params![id],
            |r| r.get::<String>(0),
        )?
        .ok_or_else(|| StoreError::Corrupt(format!("message key {id} is missing")))?;
    c.remember_key(id, &key);
    Ok(key.into())
}

/// The `thread` column of thread key `thread` whose `message_keys` id is `id`.
pub fn thread_code(thread: &str, id: i64) -> i64 {
    if thread.starts_with("obj:") { -id } else { id }
}

/// The columns of a message's row that are not keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The id's 16 bytes, when it is a canonical UUID.
    pub id: Option<Vec<u8>>,
    /// The id, when it is not.
    pub id_text: Option<String>,
    /// The body (empty when `extra` holds the whole JSON).
    pub body: String,
    /// What the rest of the message holds beyond the defaults (see the module docs).
    pub extra: Option<String>,
}

/// `extra`, decoded.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Extra {
    #[serde(rename = "t", default, skip_serializing_if = "Option::is_none")]
    title: Option<String>,
    #[serde(rename = "l", default, skip_serializing_if = "Option::is_none")]
    level: Option<LogLevel>,
    #[serde(rename = "d", default, skip_serializing_if = "Option::is_none")]
    data: Option<Map<String, Value>>,
    #[serde(rename = "a", default, skip_serializing_if = "Option::is_none")]
    attachments: Option<Vec<Attachment>>,
    #[serde(rename = "j", default, skip_serializing_if = "Option::is_none")]
    json: Option<String>,
}

/// A new message id: a random (version 4) UUID in canonical form. Each thread takes the OS's
/// random bytes 4 KiB at a time, so one `getrandom` call serves 256 ids instead of one (ids
/// are public, so holding the next ones in memory gives nothing away).
pub fn new_id() -> String {
    const POOL: usize = 16 * 256;
    thread_local! {
        static RANDOM: std::cell::RefCell<([u8; POOL], usize)> =
            const { std::cell::RefCell::new(([0; POOL], POOL)) };
    }
    RANDOM.with_borrow_mut(|(pool, used)| {
        if *used == POOL {
            if getrandom::fill(pool).is_err() {
                return uuid::Uuid::new_v4().to_string();
            }
            *used = 0;
        }
        let mut bytes = [0; 16];
        bytes.copy_from_slice(&pool[*used..*used + 16]);
        *used += 16;
        uuid::Builder::from_random_bytes(bytes)
            .into_uuid()
            .hyphenated()
            .to_string()
    })
}

/// The id column of a message id: its 16 bytes when it is a UUID in canonical form.
pub fn uuid_bytes(id: &str) -> Option<Vec<u8>> {
    let u = uuid::Uuid::try_parse(id).ok()?;
    (u.hyphenated().to_string() == id).then(|| u.as_bytes().to_vec())
}

/// The `data` a message with no `extra` has: its thread for a channel or objective post.
fn implied_data(thread: Option<&str>) -> Map<String, Value> {
    let mut data = Map::new();
    if let Some(t) = thread.filter(|t| *t != "chan:general") {
        data.insert("thread".to_owned(), Value::String(t.to_owned()));
    }
    data
}

/// The stored columns of `msg`, logged as `json`, whose thread key is `thread`. Checks that
/// [`decode`] gives `json` back; keeps `json` whole when it would not.
pub fn encode(msg: &Message, json: &str, thread: Option<&str>) -> Result<Stored, StoreError> {
    let id = uuid_bytes(&msg.id);
    let id_text = id.is_none().then(|| msg.id.clone());
    let implied = implied_data(thread);
    let same_data = serde_json::to_string(&msg.data)? == serde_json::to_string(&implied)?;
    let extra = Extra {
        title: msg.title.clone(),
        level: (msg.level != LogLevel::Info).then_some(msg.level),
        data: (!same_data).then(|| msg.data.clone()),
        attachments: (!msg.attachments.is_empty()).then(|| msg.attachments.clone()),
        json: None,
    };
    let extra = if extra.title.is_none()
        && extra.level.is_none()
        && extra.data.is_none()
        && extra.attachments.is_none()
    {
        None
    } else {
        Some(serde_json::to_string(&extra)?)
    };
    let stored = Stored {
        id,
        id_text,
        body: msg.body.clone(),
        extra,
    };
    let rebuilt = decode(
        &msg.id,
        msg.ts,
        msg.to.as_deref(),
        msg.from.as_deref(),
        thread,
        &stored.body,
        stored.extra.as_deref(),
    );
    if rebuilt.ok().as_deref() == Some(json) {
        return Ok(stored);
    }
    whole(stored.id, stored.id_text, json)
}

/// The stored columns of a message known only as its columns and wire JSON (a row of an
/// older log): [`encode`] when the JSON is a message with those columns, else kept whole.
pub fn encode_logged(
    id: &str,
    ts: i64,
    to: Option<&str>,
    from: Option<&str>,
    thread: Option<&str>,
    json: &str,
) -> Result<Stored, StoreError> {
    match serde_json::from_str::<Message>(json) {
        Ok(msg)
            if msg.id == id
                && msg.ts == ts
                && msg.to.as_deref() == to
                && msg.from.as_deref() == from =>
        {
            encode(&msg, json, thread)
        }
        _ => {
            let bytes = uuid_bytes(id);
            let text = bytes.is_none().then(|| id.to_owned());
            whole(bytes, text, json)
        }
    }
}

/// The stored columns of a message kept whole as `json`.
pub fn whole(
    id: Option<Vec<u8>>,
    id_text: Option<String>,
    json: &str,
) -> Result<Stored, StoreError> {
    Ok(Stored {
        id,
        id_text,
        body: String::new(),
        extra: Some(serde_json::to_string(&Extra {
            json: Some(json.to_owned()),
            ..Extra::default()
        })?),
    })
}

/// The message id of a row's `id` and `id_text`.
pub fn id_of(id: Option<&[u8]>, id_text: Option<String>) -> Result<String, StoreError> {
    match (id, id_text) {
        (Some(bytes), _) => uuid::Uuid::from_slice(bytes)
            .map(|u| u.hyphenated().to_string())
            .map_err(|e| {
                StoreError::Corrupt(format!("a message id of {} bytes: {e}", bytes.len()))
            }),
        (None, Some(text)) => Ok(text),
        (None, None) => Err(StoreError::Corrupt("a message without an id".into())),
    }
}

/// The wire JSON of a stored message.
pub fn decode(
    id: &str,
    ts: i64,
    to: Option<&str>,
    from: Option<&str>,
    thread: Option<&str>,
    body: &str,
    extra: Option<&str>,
) -> Result<String, StoreError> {
    let extra: Extra = match extra {
        Some(e) => serde_json::from_str(e)?,
        None => Extra::default(),
    };
    if let Some(json) = extra.json {
        return Ok(json);
    }
    if extra.title.is_none()
        && extra.level.is_none()
        && extra.data.is_none()
        && extra.attachments.is_none()
    {
        // The common message, written as serde writes a `Message` (key order, escapes).
        let mut out: Vec<u8> = Vec::with_capacity(body.len() + 160);
        let text = |out: &mut Vec<u8>, s: Option<&str>| -> Result<(), StoreError> {
            match s {
                Some(s) => serde_json::to_writer(&mut *out, s)?,
                None => out.extend_from_slice(b"null"),
            }
            Ok(())
        };
        out.extend_from_slice(b"{\"id\":");
        text(&mut out, Some(id))?;
        out.extend_from_slice(format!(",\"ts\":{ts},\"to\":").as_bytes());
        text(&mut out, to)?;
        out.extend_from_slice(b",\"from\":");
        text(&mut out, from)?;
        out.extend_from_slice(b",\"title\":null,\"body\":");
        text(&mut out, Some(body))?;
        out.extend_from_slice(b",\"level\":\"info\",\"data\":{");
        if let Some(t) = thread.filter(|t| *t != "chan:general") {
            out.extend_from_slice(b"\"thread\":");
            text(&mut out, Some(t))?;
        }
        out.extend_from_slice(b"},\"attachments\":[]}");
        return String::from_utf8(out)
            .map_err(|e| StoreError::Corrupt(format!("a rebuilt message is not UTF-8: {e}")));
    }
    Ok(serde_json::to_string(&Message {
        id: id.to_owned(),
        ts,
        to: to.map(str::to_owned),
        from: from.map(str::to_owned),
        title: extra.title,
        body: body.to_owned(),
        level: extra.level.unwrap_or(LogLevel::Info),
        data: extra.data.unwrap_or_else(|| implied_data(thread)),
        attachments: extra.attachments.unwrap_or_default(),
    })?)
}

/// The columns a read selects from `messages m` (see [`read_row`]), with the keys joined.
pub const READ_COLUMNS: &str =
    "m.seq, m.id, m.id_text, m.ts, tk.key, fk.key, hk.key, m.body, m.extra";

/// The joins [`READ_COLUMNS`] needs.
pub const READ_JOINS: &str = "LEFT JOIN message_keys tk ON tk.id = m.to_key
         LEFT JOIN message_keys fk ON fk.id = m.from_key
         LEFT JOIN message_keys hk ON hk.id = abs(m.thread)";

/// A row of [`READ_COLUMNS`] (from column 0): the message, and its route.
pub fn read_row(r: &super::store::Row) -> Result<(Row, Route, Option<String>), StoreError> {
    let seq: i64 = r.get(0)?;
    let id = id_of(r.get::<Option<Vec<u8>>>(1)?.as_deref(), r.get(2)?)?;
    let to: Option<String> = r.get(4)?;
    let from: Option<String> = r.get(5)?;
    let thread: Option<String> = r.get(6)?;
    let json = decode(
        &id,
        r.get(3)?,
        to.as_deref(),
        from.as_deref(),
        thread.as_deref(),
        &r.get::<String>(7)?,
        r.get::<Option<String>>(8)?.as_deref(),
    )?;
    let route = route_of(to.as_deref(), thread.as_deref());
    Ok((Row { seq, id, json }, route, from))
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
        Backend::Sqlite if condition == ALL_OBJECTIVES => (
            "messages m INDEXED BY messages_thread",
            condition.to_owned(),
        ),
        Backend::Sqlite => ("messages m", condition.to_owned()),
        // `+x` (no index on x) is SQLite's; PostgreSQL has no unary plus.
        Backend::Postgres => ("messages m", condition.replace("+m.to_key", "m.to_key")),
    };
    format!(
        "SELECT m.seq, m.id, m.id_text, m.ts, m.to_key, m.from_key, m.thread, m.body, m.extra
         FROM {table} WHERE {condition}
         AND m.seq > ?1 AND m.seq < ?2 AND m.ts > ?3 AND m.ts < ?4 ORDER BY m.seq {order} LIMIT ?5"
    )
}

/// A thread's posts. (`+m.to_key`: the check must not steer SQLite to the `to_key` index.)
const THREAD: &str = "m.thread = ?6 AND +m.to_key IS NULL";
/// Every objective thread's posts (their `thread` is negative).
const ALL_OBJECTIVES: &str = "m.thread < 0 AND +m.to_key IS NULL";

/// Every source condition and the index it must search, for the query-plan test.
#[cfg(test)]
const CONDITIONS: &[(&str, &str)] = &[
    ("m.to_key = ?6", "messages_to"),
    ("m.from_key = ?6", "messages_from"),
    ("m.to_key = ?6 AND m.from_key = ?7", "messages_"),
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
    // Rows as stored: each source reads up to `limit`, and only the page is rebuilt.
    let mut rows: Vec<StoredRow> = Vec::new();
    'sources: for source in sources(viewer, scope, feed) {
        let after_seq = match source {
            Source::To(_) | Source::From(_) | Source::Dm { .. } => &own_after_seq,
            Source::Thread(_) | Source::AllObjectives => &after_seq,
        };
        // The keys a source names; a key never stored has no rows.
        let mut keys: Vec<i64> = Vec::new();
        let condition = match &source {
            Source::To(name) | Source::From(name) => {
                keys.push(match find_key(c, name)? {
                    Some(k) => k,
                    None => continue 'sources,
                });
                if matches!(source, Source::To(_)) {
                    "m.to_key = ?6"
                } else {
                    "m.from_key = ?6"
                }
            }
            Source::Dm { to, from } => {
                for name in [to, from] {
                    keys.push(match find_key(c, name)? {
                        Some(k) => k,
                        None => continue 'sources,
                    });
                }
                "m.to_key = ?6 AND m.from_key = ?7"
            }
            Source::Thread(thread) => {
                keys.push(match find_key(c, thread)? {
                    Some(k) => thread_code(thread, k),
                    None => continue 'sources,
                });
                THREAD
            }
            Source::AllObjectives => ALL_OBJECTIVES,
        };
        let mut args: Vec<&dyn ToValue> =
            vec![after_seq, &before_seq, &after_ts, &before_ts, &limit];
        args.extend(keys.iter().map(|k| k as &dyn ToValue));
        rows.extend(
            c.query(&source_sql(c.backend(), condition, order), &args, |r| {
                Ok(StoredRow {
                    seq: r.get(0)?,
                    id: r.get(1)?,
                    id_text: r.get(2)?,
                    ts: r.get(3)?,
                    to: r.get(4)?,
                    from: r.get(5)?,
                    thread: r.get(6)?,
                    body: r.get(7)?,
                    extra: r.get(8)?,
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
    let mut keys: std::collections::HashMap<i64, std::sync::Arc<str>> = Default::default();
    let mut key = |id: Option<i64>| -> Result<Option<std::sync::Arc<str>>, StoreError> {
        let Some(id) = id.map(i64::abs) else {
            return Ok(None);
        };
        if let Some(k) = keys.get(&id) {
            return Ok(Some(k.clone()));
        }
        let k = key_of(c, id)?;
        keys.insert(id, k.clone());
        Ok(Some(k))
    };
    rows.into_iter()
        .map(|r| {
            let id = id_of(r.id.as_deref(), r.id_text)?;
            let (to, from, thread) = (key(r.to)?, key(r.from)?, key(r.thread)?);
            let json = decode(
                &id,
                r.ts,
                to.as_deref(),
                from.as_deref(),
                thread.as_deref(),
                &r.body,
                r.extra.as_deref(),
            )?;
            Ok(Row {
                seq: r.seq,
                id,
                json,
            })
        })
        .collect()
}

/// A row of `messages` as stored (keys not resolved).
struct StoredRow {
    seq: i64,
    id: Option<Vec<u8>>,
    id_text: Option<String>,
    ts: i64,
    to: Option<i64>,
    from: Option<i64>,
    thread: Option<i64>,
    body: String,
    extra: Option<String>,
}

/// The condition on `messages` that finds message `id` (`?N` is its place), and the value to
/// bind there.
pub fn id_condition(id: &str, n: usize) -> (String, super::store::Value) {
    match uuid_bytes(id) {
        Some(bytes) => (format!("id = ?{n}"), super::store::Value::Blob(bytes)),
        None => (
            format!("id_text = ?{n}"),
            super::store::Value::Text(id.to_owned()),
        ),
    }
}

/// The log position of message `id`, if the log has it.
pub fn seq_of(c: &Conn<'_>, id: &str) -> Result<Option<i64>, StoreError> {
    let (condition, value) = id_condition(id, 1);
    c.query_row(
        &format!("SELECT seq FROM messages WHERE {condition}"),
        params![value],
        |r| r.get::<i64>(0),
    )
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

/// Why a history request was refused.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// No channel has that slug or id.
    #[error("no such channel: {0}")]
    NoSuchChannel(String),
    /// The viewer is not in the channel.
    #[error("not a member of this channel")]
    NotChannelMember,
    /// A message-id cursor names no message in the log; the field names the cursor.
    #[error(
        "`{0}` names no message in this broker's log; page from a message id this broker returned"
    )]
    UnknownCursor(&'static str),
    /// Store failure.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a history request asks for: at most one of `with` and `channel` (a slug, an id or
/// `general`), message-id cursors and epoch-ms bounds (all exclusive), and a page size.
#[derive(Debug, Clone, Default)]
pub struct HistoryRequest {
    /// DMs with this member.
    pub with: Option<String>,
    /// One channel.
    pub channel: Option<String>,
    /// Messages before this id.
    pub before_id: Option<String>,
    /// Messages after this id (oldest first).
    pub after_id: Option<String>,
    /// Messages before this time.
    pub before_ts: Option<i64>,
    /// Messages after this time (oldest first).
    pub after_ts: Option<i64>,
    /// Page size.
    pub limit: usize,
}

fn cursor(c: &Conn<'_>, id: Option<&str>, key: &'static str) -> Result<Option<i64>, HistoryError> {
    match id {
        None => Ok(None),
        Some(id) => seq_of(c, id)?
            .map(Some)
            .ok_or(HistoryError::UnknownCursor(key)),
    }
}

/// One page of the messages `viewer` may see (everything when `manager`), in a read
/// transaction: a channel must exist and have the viewer as a member.
pub fn history(
    store: &super::db::Store,
    viewer: &str,
    manager: bool,
    req: HistoryRequest,
) -> Result<Vec<Row>, HistoryError> {
    store.view(|c| {
        let feed = match (req.with, req.channel) {
            (Some(w), _) => Feed::With(w),
            (None, Some(name)) if name == "general" => Feed::General,
            (None, Some(name)) => {
                let ch = match super::channels::by_slug(c, &name)? {
                    Some(ch) => ch,
                    None => super::channels::by_id(c, &name)?
                        .ok_or(HistoryError::NoSuchChannel(name))?,
                };
                if super::channels::role_of(c, &ch.id, viewer)?.is_none() {
                    return Err(HistoryError::NotChannelMember);
                }
                Feed::Channel(ch.id)
            }
            (None, None) => Feed::All,
        };
        let scope = viewer_scope(c, viewer, manager)?;
        let window = Window {
            after_seq: cursor(c, req.after_id.as_deref(), "after_id")?,
            before_seq: cursor(c, req.before_id.as_deref(), "before_id")?,
            after_ts: req.after_ts,
            before_ts: req.before_ts,
            oldest_first: req.after_id.is_some() || req.after_ts.is_some(),
            limit: req.limit,
        };
        Ok(page(c, viewer, &scope, &feed, &window)?)
    })
}

/// One page of a replay to `reader` (who sees what `scope` allows): the messages after log
/// position `cursor` through `head`, oldest first, at most `limit`.
pub fn replay_page(
    store: &super::db::Store,
    reader: &str,
    scope: &ViewerScope,
    cursor: i64,
    head: i64,
    limit: usize,
) -> Result<Vec<Row>, StoreError> {
    let window = Window {
        after_seq: Some(cursor),
        before_seq: Some(head + 1),
        after_ts: None,
        before_ts: None,
        oldest_first: true,
        limit,
    };
    store.view(|c| page(c, reader, scope, &Feed::All, &window))
}

/// Where a `/subscribe` stream starts.
#[derive(Debug)]
pub enum LogStart {
    /// Live messages only: no last event id.
    Live,
    /// The log after `cursor` through `head` as `scope` allows, then live messages.
    Replay {
        /// The log position of the last message the client has.
        cursor: i64,
        /// The log position delivered before the stream was registered.
        head: i64,
        /// What the member may see.
        scope: ViewerScope,
    },
    /// The last event id is not in this log: the client must start over.
    Unknown,
}

/// Opens `name`'s live stream (authenticated with `token_id`; `manager` when it holds
/// `members.manage`) at `now`, resuming after message `last_id` when the log has it. The head
/// is read and the subscription taken in one write transaction: on SQLite no push commits
/// (and delivers) in between, so every message is either replayed or live. With replicas the
/// cap counts the member's streams on every replica, and the replay ends where the follower
/// had delivered when the stream was registered.
pub fn open_subscription(
    state: &super::AppState,
    name: &str,
    manager: bool,
    token_id: &str,
    last_id: Option<&str>,
    now: i64,
) -> Result<(LogStart, super::hub::Subscription), super::hub::StreamError> {
    use super::hub::{StreamError, SubscribeError};
    state.store.tx_then(
        |c| -> Result<_, StreamError> {
            let start = match last_id {
                None => LogStart::Live,
                Some(id) => match seq_of(c, id)? {
                    None => LogStart::Unknown,
                    // The client says it has everything through `id`: as good as delivered.
                    Some(cursor) => LogStart::Replay {
                        cursor,
                        head: head(c)?,
                        scope: viewer_scope(c, name, manager)?,
                    },
                },
            };
            if let (LogStart::Replay { .. }, Some(id)) = (&start, last_id) {
                state.cursors.note(name, id);
            }
            if !state.hub.has_member(name)
                && let Some(m) = super::team::member_get(c, name)?
            {
                // Added offline (`ac7 member add`) while the broker was running.
                state.hub.register_member(&m.name, m.role, now);
            }
            // A token revoked since this request authenticated (the auth cache) gets no stream.
            if !super::team::token_id_exists(c, token_id)? {
                return Err(StreamError::UnknownToken);
            }
            // With replicas the cap counts the member's streams on every replica.
            if let Some(replica) = &state.replica
                && let Err(limit) = replica.stream_opening(
                    c,
                    name,
                    super::sessions::is_browser(token_id),
                    state.hub.live_count(name),
                    state.config.max_subscriptions_per_member,
                    now,
                )?
            {
                return Err(StreamError::Refused(SubscribeError::TooMany {
                    name: name.to_owned(),
                    limit,
                }));
            }
            Ok(start)
        },
        |start| -> Result<_, StreamError> {
            let subscribe = || state.hub.subscribe(name, token_id, now);
            let uncount = || {
                // Counted on the shared presence by the transaction: uncount it.
                if let Some(replica) = &state.replica {
                    replica.stream_closed(name, super::sessions::is_browser(token_id));
                }
            };
            let taken = match &state.follower {
                None => subscribe().map(|sub| (start, sub)),
                // With replicas: replay up to what this replica had delivered when the stream
                // was registered; the follower delivers everything after it live.
                Some(follower) => {
                    let cursor = match &start {
                        LogStart::Replay { cursor, .. } => Some(*cursor),
                        _ => None,
                    };
                    let (sub, delivered) = follower
                        .subscribe_at(state, cursor, subscribe)
                        .inspect_err(|_| uncount())?;
                    let start = match start {
                        LogStart::Replay { cursor, scope, .. } => LogStart::Replay {
                            cursor,
                            head: delivered,
                            scope,
                        },
                        other => other,
                    };
                    sub.map(|sub| (start, sub))
                }
            };
            taken.map_err(|e| {
                uncount();
                StreamError::Refused(e)
            })
        },
    )?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids are canonical version-4 UUIDs (so they are stored as 16 bytes), all different, also
    /// across the refills of a thread's pool of random bytes.
    #[test]
    fn new_ids_are_distinct_canonical_v4_uuids() {
        let ids: std::collections::BTreeSet<String> = (0..1000).map(|_| new_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            let u = uuid::Uuid::try_parse(id).unwrap();
            assert_eq!(u.get_version(), Some(uuid::Version::Random), "{id}");
            assert_eq!(u.get_variant(), uuid::Variant::RFC4122, "{id}");
            assert!(uuid_bytes(id).is_some(), "{id}");
        }
    }

    /// Reads and committed writes remember `message_keys` rows; a key a rolled-back write added
    /// never reaches the cache, so when SQLite hands its id to another key, reads name the
    /// right one.
    #[test]
    fn the_key_cache_holds_committed_rows_only() {
        let store = crate::broker::db::Store::open_in_memory().unwrap();
        let alice = store.tx(|c| key_id(c, "alice")).unwrap();
        assert_eq!(store.view(|c| key_of(c, alice)).unwrap().as_ref(), "alice");
        assert_eq!(store.view(|c| find_key(c, "alice")).unwrap(), Some(alice));

        let rolled_back: Result<i64, StoreError> = store.tx(|c| {
            let id = key_id(c, "mallory")?;
            assert_eq!(c.key_cache().map(|k| k.key(id)), Some(None));
            find_key(c, "mallory")?;
            Err(StoreError::Corrupt(format!("roll back {id}")))
        });
        let Err(StoreError::Corrupt(reason)) = rolled_back else {
            panic!("the write was not rolled back");
        };
        let bob = store.tx(|c| key_id(c, "bob")).unwrap();
        assert_eq!(reason, format!("roll back {bob}"), "SQLite reuses the id");
        assert_eq!(store.view(|c| key_of(c, bob)).unwrap().as_ref(), "bob");
        assert_eq!(store.view(|c| find_key(c, "mallory")).unwrap(), None);

        // Answered from the cache: the SQL would find nothing now.
        store
            .with(|conn| conn.execute("DELETE FROM message_keys WHERE key = 'alice'", []))
            .unwrap();
        assert_eq!(store.view(|c| find_key(c, "alice")).unwrap(), Some(alice));
        // A write looks keys up in the cache too.
        assert_eq!(store.tx(|c| key_id(c, "alice")).unwrap(), alice);

        // The keys a committed write added or read are in the cache without a read.
        let carol = store.tx(|c| key_id(c, "carol")).unwrap();
        let dave = store.with(|conn| {
            conn.execute("INSERT INTO message_keys (key) VALUES ('dave')", [])
                .unwrap();
            conn.last_insert_rowid()
        });
        assert_eq!(store.tx(|c| key_id(c, "dave")).unwrap(), dave);
        store
            .with(|conn| {
                conn.execute(
                    "DELETE FROM message_keys WHERE key IN ('carol', 'dave')",
                    [],
                )
            })
            .unwrap();
        assert_eq!(store.view(|c| find_key(c, "carol")).unwrap(), Some(carol));
        assert_eq!(store.view(|c| find_key(c, "dave")).unwrap(), Some(dave));
    }

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

    /// The common messages are stored without `extra` and rebuilt to the very bytes serde
    /// writes for them, escapes included.
    #[test]
    fn common_messages_rebuild_to_their_wire_json() {
        for (to, thread, body) in [
            (Some("bob"), None, "hi \"there\"\n\u{1}é 🚀 </script>"),
            (None, Some("chan:general"), "general"),
            (None, Some("chan:c1"), "a channel post"),
            (None, Some("obj:o1"), "an objective post"),
        ] {
            let mut data = Map::new();
            if let Some(t) = thread.filter(|t| *t != "chan:general") {
                data.insert("thread".into(), Value::String(t.into()));
            }
            let msg = Message {
                id: "0f8fad5b-d9cb-469f-a165-70867728950e".into(),
                ts: 1_700_000_000_123,
                to: to.map(str::to_owned),
                from: Some("ann".into()),
                title: None,
                body: body.into(),
                level: LogLevel::Info,
                data,
                attachments: Vec::new(),
            };
            let json = serde_json::to_string(&msg).unwrap();
            let stored = encode(&msg, &json, thread).unwrap();
            assert_eq!(stored.extra, None, "{json}");
            assert_eq!(stored.id.as_ref().map(Vec::len), Some(16));
            let rebuilt = decode(&msg.id, msg.ts, to, Some("ann"), thread, &stored.body, None);
            assert_eq!(rebuilt.unwrap(), json);
        }
    }
}
