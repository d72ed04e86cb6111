//! `ac7 migrate --from FILE --to postgres://…`: moves a team from its SQLite file into an empty
//! PostgreSQL database, so that it can run as `ac7 serve --db postgres://…` replicas.
//!
//! # What it does, in order
//!
//! 1. Opens the SQLite file read-only, after taking the advisory lock `ac7 serve` and the
//!    offline verbs hold on it ([`super::db::Store::open`]): a file in use is refused. A file
//!    that is not an ac7 database, has no team, or lacks a table or column of the current
//!    schema (written by an older ac7 and never opened by this one) is refused too, each with
//!    one line saying what to do. Nothing has touched PostgreSQL yet.
//! 2. Connects to PostgreSQL and applies the schema's migrations ([`super::pg::migrate()`],
//!    under its advisory lock), as a replica does at start.
//! 3. In ONE transaction, which first takes the same advisory lock (so a replica starting
//!    meanwhile waits in its own migration step, for at most its statement timeout, and then
//!    finds the team): refuses a target that holds anything of a team, then copies every
//!    table, and commits. Any error rolls everything back: the target is left with the empty
//!    schema of step 2, and the migration can simply be run again.
//!
//! # How each part is copied
//!
//! Rows are read in their order (`ORDER BY` the key) and written in multi-row `INSERT`s of at
//! most [`BATCH_ROWS`] rows or about [`BATCH_BYTES`] bytes, so no table is ever held in memory.
//! Every column keeps its value: member ids (`members.seq`) and incarnations (`since_seq`,
//! `member_activity.member_seq`), token and session hashes (every token and sign-in keeps
//! working), the sign-in limiter's state (a locked-out guesser stays locked out) and the
//! first-admin setup code while nobody has TOTP, message sequence numbers (their order, and
//! every `after_id` / `Last-Event-ID` cursor), objective event and activity ids.
//!
//! - **Counters.** SQLite's `AUTOINCREMENT` never hands out a number twice, even after the row
//!   with it is gone (a removed member, pruned messages); its last number is in
//!   `sqlite_sequence` (for the message log of a newer file, whose `messages` has no such
//!   counter, in `messages_mark`). Each PostgreSQL counter is set to the larger of that and the
//!   highest copied number: `log_head.last_seq` for the message log, `activity_head.last_id` for
//!   activity, and with `setval` the identity sequences of `members.seq` and
//!   `objective_events.seq`, `activity_blocks.id` and `push_subscriptions.id`, so the next
//!   insert on PostgreSQL continues after them and collides with nothing.
//! - **File contents.** Each blob is read from the blob directory beside the file (or from
//!   the legacy `blobs.data` column) one chunk at a time and written as `blob_chunks` rows by
//!   the store's own chunk writer (`blobs::store_chunks`), exactly as an upload on
//!   PostgreSQL is. A blob whose content is missing or of the wrong size stops the migration.
//! - **`messages.audience`** (who a message was for when it was pushed; read only by the live
//!   delivery of replicas) is computed with the function the push path uses
//!   ([`ac7_protocol::domain::message::audience`]) from the message's route and sender, and
//!   stored as the push path stores it: NULL where the route implies it (the general channel:
//!   everyone; a DM: its two parties; an unroutable message: its sender), else the key of its
//!   JSON list in `message_keys` (added after the copied keys). For a channel or objective
//!   thread the push path took the thread's members at push time, which the SQLite file does
//!   not record; the copy takes its members now (channel members; assignee, originator,
//!   watchers and `members.manage` holders), plus the sender. The approximation is never
//!   visible: a replica's live delivery starts after the log's last message at its start, so no
//!   copied message is ever delivered live again; replays and `/history` decide visibility
//!   from current memberships.
//! - **Not copied:** what a SQLite broker keeps only in memory (presence, busy, rate limits,
//!   device enrollments) and its blob trash (contents already unreferenced). The PostgreSQL
//!   tables for that state start empty, as for a new team.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use ac7_protocol::domain::message::{self, Route};
use ac7_protocol::domain::objective::thread_members;
use clap::Args;

use super::blobs::{self, Stored};
use super::db::{Store, StoreError};
use super::pg::{PgConfig, migrate::MIGRATION_LOCK};
use super::store::{Conn, Row, ToValue, Value};
use super::{channels, datadir, messages, objectives, team};
use crate::params;

/// `ac7 migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The SQLite database of the team (`ac7 serve --db FILE`); only read. Stop its broker first.
    #[arg(long, value_name = "FILE")]
    pub from: PathBuf,
    /// The PostgreSQL database to copy the team into: `postgres://USER[:PASSWORD]@HOST[:PORT]/DB`
    /// (with `?sslmode=…` as for `ac7 serve`). It must hold no team.
    #[arg(long, value_name = "URL")]
    pub to: String,
}

/// The text after the options in `ac7 migrate --help`.
pub const HELP_FOOTER: &str = "\
Copies the whole team (team settings, members and their tokens, browser sessions and TOTP secrets,
the message log in its order, channels, objectives and their history, files with their contents,
member activity, the Web Push key and browsers' subscriptions) from the SQLite file of `ac7 serve --db FILE` into an empty PostgreSQL database,
in one transaction: on any error nothing is copied. Every token and signed-in browser keeps
working. The file is only read, and refused while a broker or `ac7 member` has it open.

Afterwards run the team as `ac7 serve --db postgres://…` (as many replicas as wanted), no longer
on the file: what a broker on the file took in would not reach the replicas.

Exit status: 0 when copied (a summary on stdout: rows per table, bytes of file contents); 2 when
refused or failed (one line on stderr says why).";

/// Rows per multi-row `INSERT`.
pub const BATCH_ROWS: usize = 500;
/// Bytes of text per multi-row `INSERT` (roughly: the batch is sent once it holds more).
pub const BATCH_BYTES: usize = 4 * 1024 * 1024;

/// Why the migration was refused or failed. Each is one line.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// `--from` names no file.
    #[error("no SQLite database at {0}")]
    NoSource(String),
    /// `--from` is not an ac7 database.
    #[error("{path} is not an ac7 database: {why}")]
    NotAc7 {
        /// The file.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// `--from` lacks a table or column of the current schema.
    #[error(
        "{path} was written by an older ac7 (it has no {what}): run `ac7 member list --db {path}` once with this ac7 to bring it up to date, then migrate"
    )]
    OldSchema {
        /// The file.
        path: String,
        /// The missing table or column.
        what: String,
    },
    /// `--from` holds no team.
    #[error("{0} has no team: there is nothing to migrate")]
    NoTeam(String),
    /// A broker (or an offline verb) has `--from` open.
    #[error(
        "the database {0} is in use by another process (is `ac7 serve` running on it?): stop it, then migrate"
    )]
    Busy(String),
    /// The target holds a team already.
    #[error(
        "{target} is not empty ({what}): `ac7 migrate` copies a team only into an empty database; create a new one (createdb) and migrate into that"
    )]
    NotEmpty {
        /// The target, password hidden.
        target: String,
        /// What it holds.
        what: String,
    },
    /// Opening or reading the SQLite file failed.
    #[error("cannot read {path}: {source}")]
    Source {
        /// The file.
        path: String,
        /// What failed.
        source: Box<StoreError>,
    },
    /// Connecting to PostgreSQL (or migrating its schema) failed.
    #[error("{0}")]
    Target(Box<StoreError>),
    /// The copy failed; the transaction was rolled back.
    #[error("nothing was copied: {0}")]
    Copy(Box<StoreError>),
}

impl From<StoreError> for MigrateError {
    fn from(e: StoreError) -> MigrateError {
        MigrateError::Copy(Box::new(e))
    }
}

/// What was copied: rows per table, and the bytes of file contents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// The team's name.
    pub team: String,
    /// `(table, rows)`, in the order copied.
    pub tables: Vec<(&'static str, u64)>,
    /// Bytes of file contents written as chunks.
    pub content_bytes: u64,
}

/// Runs `ac7 migrate`: the summary on stdout and 0, or one line on stderr and 2.
#[allow(clippy::print_stdout, clippy::print_stderr)]
pub fn run(args: MigrateArgs) -> i32 {
    let target = match PgConfig::parse(&args.to) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ac7: {e}");
            return 2;
        }
    };
    let place = target.redacted();
    match migrate(&args.from, target) {
        Ok(summary) => {
            println!(
                "copied team '{}' from {} to {place}",
                summary.team,
                args.from.display()
            );
            for (table, rows) in &summary.tables {
                println!("  {table:<17} {rows:>9}");
            }
            println!("  {:<17} {:>9}", "content bytes", summary.content_bytes);
            println!(
                "serve the team from PostgreSQL now (ac7 serve --db with the --to URL), no longer from {}",
                args.from.display()
            );
            0
        }
        Err(e) => {
            // One line, whatever the cause's text holds.
            let line = e
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            eprintln!("ac7: {line}");
            2
        }
    }
}

/// Copies the team in the SQLite file `from` into the PostgreSQL database `to` (see the module
/// docs). Blocking; runs without an async runtime.
pub fn migrate(from: &Path, to: PgConfig) -> Result<Summary, MigrateError> {
    // Declared first, dropped last: the file stays locked until the copy is over.
    let Source {
        path,
        mut conn,
        _lock,
    } = Source::open(from)?;
    let target = Store::open_postgres(to.clone()).map_err(|e| MigrateError::Target(Box::new(e)))?;
    let place = to.redacted();
    // One read transaction: the copy sees one state of the file.
    let snapshot = conn.transaction().map_err(|e| MigrateError::Source {
        path,
        source: Box::new(e.into()),
    })?;
    let src = Conn::sqlite(&snapshot);
    let blob_dir = datadir::blob_dir(from);
    target.tx(|dst| -> Result<Summary, MigrateError> {
        dst.execute("SELECT pg_advisory_xact_lock(?1)", params![MIGRATION_LOCK])?;
        refuse_non_empty(dst, &place)?;
        Ok(copy(&src, dst, &blob_dir)?)
    })
}

/// The SQLite file, open read-only, with the advisory lock held.
struct Source {
    path: String,
    conn: rusqlite::Connection,
    /// Holds the advisory lock on the file.
    _lock: std::fs::File,
}

impl Source {
    fn open(path: &Path) -> Result<Source, MigrateError> {
        let shown = path.display().to_string();
        let read_err = |source: StoreError| MigrateError::Source {
            path: shown.clone(),
            source: Box::new(source),
        };
        if !path.is_file() {
            return Err(MigrateError::NoSource(shown));
        }
        let lock = std::fs::File::open(path).map_err(|source| {
            read_err(StoreError::File {
                what: "cannot open it".into(),
                source,
            })
        })?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(MigrateError::Busy(shown)),
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(read_err(StoreError::File {
                    what: "cannot lock it".into(),
                    source,
                }));
            }
        }
        let conn = rusqlite::Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| read_err(e.into()))?;
        check_schema(&conn, &shown)?;
        let has_team = Conn::sqlite(&conn)
            .exists("SELECT 1 FROM team", params![])
            .map_err(read_err)?;
        if !has_team {
            return Err(MigrateError::NoTeam(shown));
        }
        Ok(Source {
            path: shown,
            conn,
            _lock: lock,
        })
    }
}

/// A table to copy: its name, its columns (the same on both databases) and its key order.
struct Table {
    name: &'static str,
    columns: &'static str,
    order: &'static str,
}

const TEAM: Table = Table {
    name: "team",
    columns: "id, name, directive, context, presets, created_at",
    order: "id",
};
const MEMBERS: Table = Table {
    name: "members",
    columns: "seq, name, role_title, role_description, instructions, permissions, created_at, since_seq",
    order: "seq",
};
const TOKENS: Table = Table {
    name: "tokens",
    columns: "id, member_name, hash, label, origin, created_at, last_used_at, expires_at, created_by",
    order: "id",
};
const SESSIONS: Table = Table {
    name: "sessions",
    columns: "hash, member_name, created_at, expires_at, last_seen, user_agent",
    order: "hash",
};
const MEMBER_TOTP: Table = Table {
    name: "member_totp",
    columns: "member_name, secret, last_step, pending_secret",
    order: "member_name",
};
const ATTEMPT_LIMITS: Table = Table {
    name: "attempt_limits",
    columns: "scope, key, opened, failures, locked_until, strikes, expires_at",
    order: "scope, key",
};
const SETUP_CODE: Table = Table {
    name: "setup_code",
    columns: "id, code",
    order: "id",
};
const CHANNELS: Table = Table {
    name: "channels",
    columns: "id, slug, created_by, created_at, archived_at",
    order: "id",
};
const CHANNEL_MEMBERS: Table = Table {
    name: "channel_members",
    columns: "channel_id, member_name, role, joined_at, seq",
    order: "seq, channel_id, member_name",
};
const OBJECTIVES: Table = Table {
    name: "objectives",
    columns: "id, seq, assignee, originator, status, created_at, json",
    order: "seq, id",
};
const OBJECTIVE_EVENTS: Table = Table {
    name: "objective_events",
    columns: "seq, objective_id, json",
    order: "seq",
};
const MESSAGE_KEYS: Table = Table {
    name: "message_keys",
    columns: "id, key",
    order: "id",
};
const MESSAGES: Table = Table {
    name: "messages",
    columns: "seq, id, id_text, ts, to_key, from_key, thread, body, extra",
    order: "seq",
};
const BLOBS: Table = Table {
    name: "blobs",
    columns: "hash, size, refcount",
    order: "hash",
};
const FS_ENTRIES: Table = Table {
    name: "fs_entries",
    columns: "path, parent, name, kind, owner, size, mime, hash, created_at, created_by, updated_at",
    order: "path",
};
const FS_GRANTS: Table = Table {
    name: "fs_grants",
    columns: "path, member_name, granted_at",
    order: "path, member_name",
};
const ACTIVITY_BLOCKS: Table = Table {
    name: "activity_blocks",
    columns: "id, hash, parent, refs, data",
    order: "id",
};
const MEMBER_ACTIVITY: Table = Table {
    name: "member_activity",
    columns: "id, member_name, ts, kind, event_json, created_at, member_seq, system_block, tools_block, messages_block",
    order: "id",
};

const PUSH_VAPID: Table = Table {
    name: "push_vapid",
    columns: "id, private_pkcs8, created_at",
    order: "id",
};
const PUSH_SUBSCRIPTIONS: Table = Table {
    name: "push_subscriptions",
    columns: "id, member_name, endpoint, p256dh, auth, created_at",
    order: "id",
};

/// Every table copied, in the order copied (a referenced row before the rows that reference
/// it: channels before their members, objectives before their events, blobs before entries, activity blocks before activity).
const TABLES: [&Table; 20] = [
    &TEAM,
    &MEMBERS,
    &TOKENS,
    &SESSIONS,
    &MEMBER_TOTP,
    &ATTEMPT_LIMITS,
    &SETUP_CODE,
    &CHANNELS,
    &CHANNEL_MEMBERS,
    &OBJECTIVES,
    &OBJECTIVE_EVENTS,
    &MESSAGE_KEYS,
    &MESSAGES,
    &BLOBS,
    &FS_ENTRIES,
    &FS_GRANTS,
    &ACTIVITY_BLOCKS,
    &MEMBER_ACTIVITY,
    &PUSH_VAPID,
    &PUSH_SUBSCRIPTIONS,
];

/// Refuses a file that is not an ac7 database, or lacks a table or column this copy reads.
fn check_schema(conn: &rusqlite::Connection, path: &str) -> Result<(), MigrateError> {
    let not_ac7 = |why: String| MigrateError::NotAc7 {
        path: path.to_owned(),
        why,
    };
    let columns = |table: &str| -> Result<Vec<String>, MigrateError> {
        let mut stmt = conn
            .prepare("SELECT name FROM pragma_table_info(?1)")
            .map_err(|e| not_ac7(e.to_string()))?;
        let names = stmt
            .query_map([table], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| not_ac7(e.to_string()))?;
        Ok(names)
    };
    if columns("team")?.is_empty() {
        return Err(not_ac7("it has no team table".into()));
    }
    for table in TABLES {
        let have = columns(table.name)?;
        if have.is_empty() {
            return Err(MigrateError::OldSchema {
                path: path.to_owned(),
                what: format!("table {}", table.name),
            });
        }
        for column in table.columns.split(", ") {
            if !have.iter().any(|c| c == column) {
                return Err(MigrateError::OldSchema {
                    path: path.to_owned(),
                    what: format!("column {}.{column}", table.name),
                });
            }
        }
    }
    Ok(())
}

/// Refuses a target holding any part of a team (inside the copy's transaction).
fn refuse_non_empty(dst: &Conn<'_>, place: &str) -> Result<(), MigrateError> {
    let count = |table: &str| -> Result<i64, StoreError> {
        Ok(dst
            .query_row(&format!("SELECT COUNT(*) FROM {table}"), params![], |r| {
                r.get::<i64>(0)
            })?
            .unwrap_or(0))
    };
    let mut held = Vec::new();
    for table in TABLES {
        if count(table.name)? > 0 {
            held.push(table.name);
        }
    }
    if held.is_empty() {
        return Ok(());
    }
    let team = dst.query_row("SELECT name FROM team", params![], |r| r.get::<String>(0))?;
    let what = match team {
        Some(name) => format!(
            "it holds team '{name}' with {} members and {} messages",
            count("members")?,
            count("messages")?
        ),
        None => format!("it has rows in {}", held.join(", ")),
    };
    Err(MigrateError::NotEmpty {
        target: place.to_owned(),
        what,
    })
}

/// Copies every table from `src` (a read transaction on the SQLite file) to `dst` (the
/// PostgreSQL transaction), then sets the counters.
fn copy(src: &Conn<'_>, dst: &Conn<'_>, blob_dir: &Path) -> Result<Summary, StoreError> {
    let mut summary = Summary {
        team: src
            .query_row("SELECT name FROM team", params![], |r| r.get::<String>(0))?
            .unwrap_or_default(),
        ..Summary::default()
    };
    for table in TABLES {
        let rows = match table.name {
            "messages" => copy_messages(src, dst)?,
            "message_keys" => {
                let rows = copy_table(src, dst, table, "", |_, _| Ok(()))?;
                // Audiences copied with the messages get keys after these.
                set_identity(src, dst, "message_keys", "id")?;
                rows
            }
            "blobs" => {
                let (rows, bytes) = copy_blobs(src, dst, blob_dir)?;
                summary.content_bytes = bytes;
                rows
            }
            _ => copy_table(src, dst, table, "", |_, _| Ok(()))?,
        };
        summary.tables.push((table.name, rows));
    }
    let mark = kept_number(
        src,
        "messages_mark",
        "SELECT seq FROM messages_mark WHERE id = 1",
        params![],
    )?;
    let head = counter(src, "messages", "seq")?.max(mark);
    dst.execute(
        "UPDATE log_head SET last_seq = ?1 WHERE id = 1",
        params![head],
    )?;
    let activity = counter(src, "member_activity", "id")?;
    dst.execute(
        "UPDATE activity_head SET last_id = ?1 WHERE id = 1",
        params![activity],
    )?;
    for (table, column) in [
        ("members", "seq"),
        ("objective_events", "seq"),
        ("activity_blocks", "id"),
        ("push_subscriptions", "id"),
    ] {
        set_identity(src, dst, table, column)?;
    }
    Ok(summary)
}

/// Sets the identity sequence of `table.column` on `dst` to the last number `src` handed out.
fn set_identity(
    src: &Conn<'_>,
    dst: &Conn<'_>,
    table: &str,
    column: &str,
) -> Result<(), StoreError> {
    let last = counter(src, table, column)?;
    if last > 0 {
        dst.query_row(
            &format!(
                "SELECT setval(CAST(pg_get_serial_sequence('{table}', '{column}') AS regclass), ?1)"
            ),
            params![last],
            |r| r.get::<i64>(0),
        )?;
    }
    Ok(())
}

/// The number `sql` (with `args`) reads from `holder`, a bookkeeping table an older file may
/// lack: 0 then, or when it holds no such row.
fn kept_number(
    src: &Conn<'_>,
    holder: &str,
    sql: &str,
    args: &[&dyn ToValue],
) -> Result<i64, StoreError> {
    if !src.exists(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
        params![holder],
    )? {
        return Ok(0);
    }
    Ok(src.query_row(sql, args, |r| r.get::<i64>(0))?.unwrap_or(0))
}

/// The last number SQLite handed out in `table`'s `AUTOINCREMENT` column: its
/// `sqlite_sequence` entry, or the highest `column` if that is larger (or the only one).
fn counter(src: &Conn<'_>, table: &str, column: &str) -> Result<i64, StoreError> {
    let kept = kept_number(
        src,
        "sqlite_sequence",
        "SELECT seq FROM sqlite_sequence WHERE name = ?1",
        params![table],
    )?;
    let max = src
        .query_row(
            &format!("SELECT COALESCE(MAX({column}), 0) FROM {table}"),
            params![],
            |r| r.get::<i64>(0),
        )?
        .unwrap_or(0);
    Ok(kept.max(max))
}

/// Copies `table` row by row in key order, in batches; `more` appends the values of the
/// `extra` target columns (`""`: none) for a row. The rows copied.
fn copy_table(
    src: &Conn<'_>,
    dst: &Conn<'_>,
    table: &Table,
    extra: &str,
    mut more: impl FnMut(&Row, &mut Vec<Value>) -> Result<(), StoreError>,
) -> Result<u64, StoreError> {
    let columns = if extra.is_empty() {
        table.columns.to_owned()
    } else {
        format!("{}, {extra}", table.columns)
    };
    let mut batch = Batch::new(dst, table.name, columns);
    src.query(
        &format!(
            "SELECT {} FROM {} ORDER BY {}",
            table.columns, table.name, table.order
        ),
        params![],
        |row| {
            let mut values = (0..row.len())
                .map(|i| row.get::<Value>(i))
                .collect::<Result<Vec<_>, _>>()?;
            more(row, &mut values)?;
            batch.push(values)
        },
    )?;
    batch.finish()
}

/// Rows waiting for one multi-row `INSERT`.
struct Batch<'c, 'a> {
    dst: &'c Conn<'a>,
    table: &'static str,
    columns: String,
    width: usize,
    values: Vec<Value>,
    bytes: usize,
    copied: u64,
}

impl<'c, 'a> Batch<'c, 'a> {
    fn new(dst: &'c Conn<'a>, table: &'static str, columns: String) -> Batch<'c, 'a> {
        let width = columns.split(',').count();
        Batch {
            dst,
            table,
            columns,
            width,
            values: Vec::new(),
            bytes: 0,
            copied: 0,
        }
    }

    fn push(&mut self, row: Vec<Value>) -> Result<(), StoreError> {
        if row.len() != self.width {
            return Err(StoreError::Corrupt(format!(
                "a {} row has {} values for {} columns",
                self.table,
                row.len(),
                self.width
            )));
        }
        self.bytes += row
            .iter()
            .map(|v| match v {
                Value::Text(s) => s.len(),
                Value::Blob(b) => b.len(),
                Value::Int(_) | Value::Null => 8,
            })
            .sum::<usize>();
        self.values.extend(row);
        if self.values.len() >= BATCH_ROWS * self.width || self.bytes >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        let rows = self.values.len() / self.width;
        if rows == 0 {
            return Ok(());
        }
        let tuples: Vec<String> = (0..rows)
            .map(|r| {
                let marks: Vec<String> = (1..=self.width)
                    .map(|c| format!("?{}", r * self.width + c))
                    .collect();
                format!("({})", marks.join(", "))
            })
            .collect();
        let sql = format!(
            "INSERT INTO {} ({}) VALUES {}",
            self.table,
            self.columns,
            tuples.join(", ")
        );
        let params: Vec<&dyn ToValue> = self.values.iter().map(|v| v as &dyn ToValue).collect();
        let inserted = self.dst.execute(&sql, &params)?;
        if inserted != rows {
            return Err(StoreError::Corrupt(format!(
                "{} of {rows} {} rows were inserted",
                inserted, self.table
            )));
        }
        self.copied += rows as u64;
        self.values.clear();
        self.bytes = 0;
        Ok(())
    }

    fn finish(mut self) -> Result<u64, StoreError> {
        self.flush()?;
        Ok(self.copied)
    }
}

/// Copies the message log in sequence order, each message with the audience the push path
/// would give it now (see the module docs).
fn copy_messages(src: &Conn<'_>, dst: &Conn<'_>) -> Result<u64, StoreError> {
    let managers = team::managers(src)?;
    let keys: HashMap<i64, String> = src
        .query("SELECT id, key FROM message_keys", params![], |r| {
            Ok((r.get::<i64>(0)?, r.get::<String>(1)?))
        })?
        .into_iter()
        .collect();
    let key = |id: Option<i64>| id.and_then(|id| keys.get(&id.abs()).cloned());
    let mut threads: HashMap<String, BTreeSet<String>> = HashMap::new();
    copy_table(src, dst, &MESSAGES, "audience", |row, values| {
        let to = key(row.get::<Option<i64>>(4)?);
        let from = key(row.get::<Option<i64>>(5)?);
        let thread = key(row.get::<Option<i64>>(6)?);
        let route = messages::route_of(to.as_deref(), thread.as_deref());
        let members = match &route {
            Route::Channel(id) | Route::Objective(id) => {
                let key = thread.unwrap_or_default();
                if !threads.contains_key(&key) {
                    let names = match &route {
                        Route::Channel(_) => channels::member_names(src, id)?,
                        _ => objectives::get(src, id)?
                            .map(|o| thread_members(&o, managers.iter().map(String::as_str)))
                            .unwrap_or_default(),
                    };
                    threads.insert(key.clone(), names);
                }
                threads.get(&key).cloned().unwrap_or_default()
            }
            Route::Direct { .. } | Route::General | Route::Unroutable => BTreeSet::new(),
        };
        let audience = message::audience(from.as_deref(), &route, &members);
        values.push(
            if audience == message::audience(from.as_deref(), &route, &BTreeSet::new()) {
                Value::Null
            } else {
                Value::Int(messages::key_id(dst, &messages::audience_json(&audience)?)?)
            },
        );
        Ok(())
    })
}

/// Copies the `blobs` rows, each with its content as chunks; `(rows, content bytes)`.
fn copy_blobs(src: &Conn<'_>, dst: &Conn<'_>, blob_dir: &Path) -> Result<(u64, u64), StoreError> {
    let mut rows = 0u64;
    let mut bytes = 0u64;
    src.query(
        &format!(
            "SELECT {} FROM {} ORDER BY {}",
            BLOBS.columns, BLOBS.name, BLOBS.order
        ),
        params![],
        |row| {
            let hash = row.get::<String>(0)?;
            let size = row.get::<u64>(1)?;
            let refcount = row.get::<i64>(2)?;
            dst.execute(
                "INSERT INTO blobs (hash, size, refcount) VALUES (?1, ?2, ?3)",
                params![hash, size, refcount],
            )?;
            let missing = |source: std::io::Error| StoreError::File {
                what: format!(
                    "the content of blob {hash} ({size} bytes) is not in {}",
                    blobs::blob_path(blob_dir, &hash).display()
                ),
                source,
            };
            match blobs::open(src, blob_dir, &hash)? {
                Some(Stored::Inline(data)) => {
                    blobs::store_chunks(dst, &hash, data.as_slice(), size)?;
                }
                Some(Stored::File(file)) => {
                    let len = file.metadata().map_err(missing)?.len();
                    if len != size {
                        return Err(StoreError::Corrupt(format!(
                            "the content of blob {hash} is {len} bytes, its row says {size}"
                        )));
                    }
                    blobs::store_chunks(dst, &hash, file, size)?;
                }
                Some(Stored::Chunks { .. }) => {
                    return Err(StoreError::Corrupt(
                        "a SQLite blob stored as chunks".to_owned(),
                    ));
                }
                None => {
                    return Err(missing(std::io::Error::from(std::io::ErrorKind::NotFound)));
                }
            }
            rows += 1;
            bytes += size;
            Ok(())
        },
    )?;
    Ok((rows, bytes))
}
