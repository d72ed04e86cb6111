//! The SQLite file: opening it (WAL), the schema, and the error type of the store.
//!
//! Durability: every mutation runs in a transaction that is committed before the
//! HTTP response is written. The journal is WAL with `synchronous=NORMAL`, so a
//! committed transaction survives a crash of the broker process (`kill -9`): the
//! WAL frames are in the OS page cache as soon as `COMMIT` returns. `--sync full`
//! additionally fsyncs the WAL on every commit, which also survives power loss.
//!
//! The WAL is checkpointed (copied back into the database file) by a thread of its own, not
//! inside the commit that fills it ([`super::checkpoint`]).
//!
//! One process owns the file: [`Store::open`] takes an exclusive advisory lock
//! (`flock`) on it, so a second `ac7 serve`, or `ac7 member …` while the broker
//! runs, is refused with [`StoreError::Busy`]. Its connections go through the broker's VFS
//! (`wal_vfs`), which also keeps every other process (a `sqlite3` shell) out while it
//! is open and lets the connections share the WAL index in memory, without a file lock per
//! transaction; a consistent copy of a running broker's file comes from `ac7 backup`.
//!
//! # Schema changes
//!
//! `SCHEMA` creates every table of a new database; `migrate` then brings an older file up
//! to it, idempotently (each step checks for what it adds), so any earlier database opens.
//! Steps so far:
//!
//! 1. **Member incarnations** (a name that is removed and created again is a new member; see
//!    [`super::team`]): `members.since_seq`, the message log's head when the member was
//!    created (existing members: 0, the earliest point, so they keep all they saw), and
//!    `member_activity.member_seq`, the `members.seq` (never reused) of the member who
//!    uploaded the row (existing rows: the current member of that name, else 0), with the
//!    index `member_activity_incarnation (member_name, member_seq, id)` in place of
//!    `member_activity_member (member_name, id)`.
//! 2. **Activity blocks** (see [`super::activity_blocks`]): the table `activity_blocks` and
//!    `member_activity.system_block`, `tools_block`, `messages_block` (existing rows: NULL,
//!    their events stay whole in `event_json`).
//! 3. **Compact messages** (see [`super::messages`]): `messages` loses `to_name`, `from_name`,
//!    `json` and its text `thread` for key ids (`to_key`, `from_key`, `thread`, in the new
//!    table `message_keys`), the id as 16 bytes (`id`, or `id_text`), `body` and `extra`; the
//!    table is rebuilt row by row with the same sequence numbers (its counter goes to the mark
//!    of step 6), each row's JSON rebuilt exactly (or kept whole in `extra` where it would not
//!    be). Its indexes become partial (`thread`, `to_key`) and `id` gets a unique index of its
//!    own.
//! 4. **Web Push** (see [`super::webpush`]): the tables `push_vapid` (the team's VAPID key)
//!    and `push_subscriptions` (the browsers' subscriptions); both are in `SCHEMA`, whose
//!    `CREATE TABLE IF NOT EXISTS` adds them to an older file.
//! 5. **Members version**: the one-row table `members_version`, raised by triggers on every
//!    insert, update and delete of `members`, so the roster keeps the member list while it
//!    stays the same ([`super::team::MembersCache`]); in `SCHEMA` too, with its triggers.
//! 6. **The log's mark**: a new file's `messages.seq` is a plain row id, without the
//!    `AUTOINCREMENT` counter SQLite would update (a B-tree write and a fifth page in the log)
//!    on every push. The one-row table `messages_mark` (in `SCHEMA`) keeps instead the highest
//!    number that may have left the table: retention raises it to the newest number before it
//!    deletes, and each append takes the larger of it and the newest row's, plus one, so no
//!    number is handed out twice.
//! 7. **The log without the counter**: an older file's `messages` table, still with its
//!    `AUTOINCREMENT` counter, is rebuilt once without it (every row copied with its number,
//!    the indexes made again), its mark starting at that counter. Step 3 makes the table
//!    without the counter too.
//!
//! Reads do not wait for writes: besides the one write connection (behind the
//! mutex every mutation takes) the store keeps a few read-only connections
//! ([`Store::read`]). In WAL mode a reader sees the last committed state and
//! never blocks the writer, so a slow `/history` or a long replay does not hold
//! up `/push` or `/roster`.

use std::cell::RefCell;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rusqlite::Connection;

use super::checkpoint::{CheckpointStats, Checkpointer};
use super::store::{Backend, Conn, KeyFill, off_worker};

/// A store failure. Nothing here is the client's fault: it maps to 500.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused or failed.
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A stored JSON column could not be decoded.
    #[error("corrupt stored JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A stored value broke an invariant.
    #[error("corrupt store: {0}")]
    Corrupt(String),
    /// PostgreSQL refused, failed, or is out of reach.
    #[error(transparent)]
    Postgres(#[from] super::pg::PgError),
    /// Another process holds the database.
    #[error("the database {0} is in use by another process (is `ac7 serve` running on it?)")]
    Busy(String),
    /// A file beside the database (the database itself, a blob) could not be read or written.
    #[error("{what}: {source}")]
    File {
        /// What was being done.
        what: String,
        /// What failed.
        source: std::io::Error,
    },
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> StoreError {
        StoreError::Postgres(super::pg::PgError::Db(e))
    }
}

impl StoreError {
    /// Whether the database is out of reach for now (a restart, a network cut): the request
    /// may succeed later (503), and nothing was written.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Postgres(e) => e.is_unavailable(),
            _ => false,
        }
    }

    /// Whether the disk (or the database's size limit) is full.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(f, _)) => {
                f.code == rusqlite::ErrorCode::DiskFull
            }
            StoreError::File { source, .. } => source.kind() == std::io::ErrorKind::StorageFull,
            _ => false,
        }
    }
}

/// How hard SQLite syncs on commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SyncMode {
    /// WAL + `synchronous=NORMAL`: survives a process crash.
    #[default]
    Normal,
    /// WAL + `synchronous=FULL`: also survives power loss; slower.
    Full,
}

/// How many read-only connections a file-backed store keeps.
const READERS: usize = 4;

/// The team's database: the embedded SQLite file (the default) or PostgreSQL
/// ([`Store::open_postgres`]). Store functions run through [`Store::tx`] and [`Store::view`]
/// on either; [`Store::with`], [`Store::read`] and [`Store::try_with`] hand out the raw
/// SQLite connection to the code not yet written against [`Conn`], and exist only on SQLite.
#[derive(Debug)]
pub struct Store {
    backing: Backing,
    /// `message_keys` rows read so far (filled by reads, and by writes once they commit).
    keys: super::store::keys::KeyCache,
}

#[derive(Debug)]
enum Backing {
    Sqlite(SqliteFile),
    Postgres(Box<super::store::postgres::PgStore>),
}

/// The write connection behind a mutex, plus read-only connections. Critical
/// sections are short and never span an `.await`.
#[derive(Debug)]
struct SqliteFile {
    conn: Arc<Mutex<Connection>>,
    /// Read-only connections (empty for an in-memory store: reads use `conn`).
    readers: Vec<Mutex<Connection>>,
    next_reader: std::sync::atomic::AtomicUsize,
    /// Holds the advisory lock on the database file while the store lives.
    _lock: Option<std::fs::File>,
    /// Checkpoints the WAL off the commit path (a file-backed store's; taken by `close`).
    checkpointer: Mutex<Option<Checkpointer>>,
    /// How hard a commit syncs.
    sync: SyncMode,
}

impl Store {
    /// Opens (creating if needed) the database at `path` and applies the schema.
    pub fn open(path: &Path, sync: SyncMode) -> Result<Store, StoreError> {
        super::datadir::prepare_db_file(path).map_err(|source| StoreError::File {
            what: format!("cannot create or secure {}", path.display()),
            source,
        })?;
        let busy = || StoreError::Busy(path.display().to_string());
        // Every connection to the file goes through the broker's VFS (`wal_vfs`): the file is
        // this process's alone, and a commit's log writes go out as one.
        let vfs = match super::wal_vfs::register() {
            Ok(()) => Some(super::wal_vfs::NAME),
            Err(code) => {
                tracing::warn!(
                    code,
                    "cannot register the broker's VFS; opening the database with SQLite's default"
                );
                None
            }
        };
        let open = |flags| match vfs {
            Some(name) => Connection::open_with_flags_and_vfs(path, flags, name),
            None => Connection::open_with_flags(path, flags),
        };
        let conn = open(rusqlite::OpenFlags::default())?;
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .open(path)
            .map_err(|source| StoreError::File {
                what: format!("cannot open {}", path.display()),
                source,
            })?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(busy()),
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(StoreError::File {
                    what: format!("cannot lock {}", path.display()),
                    source,
                });
            }
        }
        let mut store = Store::init(conn, sync).map_err(|e| match e {
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(f, _))
                if matches!(
                    f.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) =>
            {
                busy()
            }
            other => other,
        })?;
        for _ in 0..READERS {
            // Opened for writing, read-only by pragma: a read-only handle would take ordinary
            // locks, and in one process those replace the process-wide lock the VFS holds.
            let reader = open(
                rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
                    | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            reader.pragma_update(None, "query_only", true)?;
            reader.busy_timeout(std::time::Duration::from_secs(2))?;
            store.readers.push(Mutex::new(reader));
        }
        let own = open(rusqlite::OpenFlags::default())?;
        own.busy_timeout(std::time::Duration::from_secs(2))?;
        let checkpointer = Checkpointer::start(Arc::clone(&store.conn), own).map_err(|source| {
            StoreError::File {
                what: "cannot start the checkpoint thread".into(),
                source,
            }
        })?;
        store.checkpointer = Mutex::new(Some(checkpointer));
        store._lock = Some(lock);
        Ok(Store {
            backing: Backing::Sqlite(store),
            keys: Default::default(),
        })
    }

    /// Closes a SQLite file for good at a clean shutdown: the WAL is checkpointed into the
    /// database and every connection to the file is closed, so SQLite removes the `-wal` and
    /// `-shm` files and the database is one self-contained file. The store answers nothing
    /// after this (its connections are empty in-memory ones). PostgreSQL: nothing to do.
    pub fn close(&self) -> Result<(), StoreError> {
        let Backing::Sqlite(file) = &self.backing else {
            return Ok(());
        };
        // Stopping it takes the write connection (to unhook it): done before that is taken here.
        let checkpointer = file
            .checkpointer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(checkpointer);
        let mut conn = file.conn.lock().unwrap_or_else(PoisonError::into_inner);
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        for reader in &file.readers {
            let mut reader = reader.lock().unwrap_or_else(PoisonError::into_inner);
            drop(std::mem::replace(
                &mut *reader,
                Connection::open_in_memory()?,
            ));
        }
        let last = std::mem::replace(&mut *conn, Connection::open_in_memory()?);
        last.close().map_err(|(_, e)| e)?;
        Ok(())
    }

    /// An in-memory store (for tests of store functions).
    pub fn open_in_memory() -> Result<Store, StoreError> {
        Ok(Store {
            backing: Backing::Sqlite(Store::init(
                Connection::open_in_memory()?,
                SyncMode::Normal,
            )?),
            keys: Default::default(),
        })
    }

    /// The team's database on PostgreSQL: connects and migrates (see
    /// [`super::store::postgres::PgStore::open`]).
    pub fn open_postgres(config: super::pg::PgConfig) -> Result<Store, StoreError> {
        Ok(Store {
            backing: Backing::Postgres(Box::new(super::store::postgres::PgStore::open(config)?)),
            keys: Default::default(),
        })
    }

    /// What the WAL checkpoints did since the file was opened; `None` for an in-memory or
    /// PostgreSQL store, or after [`Store::close`].
    pub fn checkpoints(&self) -> Option<CheckpointStats> {
        let Backing::Sqlite(file) = &self.backing else {
            return None;
        };
        let checkpointer = file
            .checkpointer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        checkpointer.as_ref().map(Checkpointer::stats)
    }

    /// Which database holds the team.
    pub fn backend(&self) -> Backend {
        match self.backing {
            Backing::Sqlite(_) => Backend::Sqlite,
            Backing::Postgres(_) => Backend::Postgres,
        }
    }

    /// The SQLite file, for the raw-connection calls that only SQLite has.
    fn sqlite(&self) -> &SqliteFile {
        match &self.backing {
            Backing::Sqlite(s) => s,
            Backing::Postgres(_) => unreachable!(
                "a raw SQLite call on a PostgreSQL store: this path is not written against Conn yet"
            ),
        }
    }

    fn init(conn: Connection, sync: SyncMode) -> Result<SqliteFile, StoreError> {
        conn.busy_timeout(std::time::Duration::from_secs(2))?;
        // Before the first write: only a new, empty file takes it (one made with another size
        // keeps its own).
        conn.pragma_update(None, "page_size", PAGE_SIZE)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(
            None,
            "synchronous",
            match sync {
                SyncMode::Normal => "NORMAL",
                SyncMode::Full => "FULL",
            },
        )?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.execute_batch(SCHEMA)?;
        migrate(&conn)?;
        Ok(SqliteFile {
            conn: Arc::new(Mutex::new(conn)),
            readers: Vec::new(),
            next_reader: std::sync::atomic::AtomicUsize::new(0),
            _lock: None,
            checkpointer: Mutex::new(None),
            sync,
        })
    }

    /// Runs the read-only `f` on a read connection (a free one if any, else the
    /// next in turn), never on the write connection of a file-backed store. `f`
    /// sees the last committed state. Runs off the async workers ([`off_worker`]).
    pub fn read<T>(&self, f: impl FnOnce(&Connection) -> T) -> T {
        let file = self.sqlite();
        off_worker(|| file.read_here(f))
    }

    /// Copies a SQLite database, consistent as of one moment, into a new file at `to` (`VACUUM
    /// INTO`), on a read connection: writes go on meanwhile.
    pub fn snapshot(&self, to: &Path) -> Result<(), StoreError> {
        let to = to
            .to_str()
            .ok_or_else(|| StoreError::Corrupt(format!("{} is not UTF-8", to.display())))?;
        self.read(|conn| {
            let query_only: bool = conn.pragma_query_value(None, "query_only", |r| r.get(0))?;
            conn.pragma_update(None, "query_only", false)?;
            let copied = conn.execute("VACUUM INTO ?1", [to]);
            conn.pragma_update(None, "query_only", query_only)?;
            copied?;
            Ok(())
        })
    }

    /// Runs `f` if the connection is free right now; `None` if someone holds it. Runs off the
    /// async workers ([`off_worker`]).
    pub fn try_with<T>(&self, f: impl FnOnce(&mut Connection) -> T) -> Option<T> {
        let file = self.sqlite();
        off_worker(|| match file.conn.try_lock() {
            Ok(mut guard) => Some(f(&mut guard)),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(f(&mut p.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => None,
        })
    }

    /// Runs `f` with exclusive access to the connection, off the async workers
    /// ([`off_worker`]).
    pub fn with<T>(&self, f: impl FnOnce(&mut Connection) -> T) -> T {
        let file = self.sqlite();
        off_worker(|| file.with_here(f))
    }

    /// Runs `f` in one transaction (on SQLite's write connection): committed when `f`
    /// returns `Ok`, rolled back when it returns `Err` (or panics). Off the async workers.
    pub fn tx<T, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&Conn<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.tx_then(f, |out| out)
    }

    /// [`Store::tx`], then `then` on what `f` returned, right after the commit. On SQLite
    /// `then` still holds the write connection, so what it does (fanning messages out) happens
    /// in commit order with every other transaction's. On PostgreSQL it just follows the commit.
    pub fn tx_then<T, U, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&Conn<'_>) -> Result<T, E>,
        then: impl FnOnce(T) -> U,
    ) -> Result<U, E> {
        match &self.backing {
            Backing::Sqlite(file) => off_worker(|| {
                file.with_here(|conn| {
                    self.written(
                        |fill| sqlite_tx(conn, |c| f(&c.with_keys(&self.keys, fill))),
                        then,
                    )
                })
            }),
            Backing::Postgres(pg) => off_worker(|| {
                self.written(
                    |fill| pg.tx(false, |c| f(&c.with_keys(&self.keys, fill))),
                    then,
                )
            }),
        }
    }

    /// Runs the write transaction `tx`, then `then` on what it returned: the `message_keys`
    /// rows it read or added reach the cache once it has committed, not before.
    fn written<T, U, E>(
        &self,
        tx: impl FnOnce(KeyFill<'_>) -> Result<T, E>,
        then: impl FnOnce(T) -> U,
    ) -> Result<U, E> {
        let read = RefCell::default();
        let out = tx(KeyFill::AfterCommit(&read))?;
        self.keys.remember_committed(&read);
        Ok(then(out))
    }

    /// SQLite's write connection, to write on the calling thread (even an async worker), when
    /// it is free this instant and a commit has no fsync to do (none under `--sync full`, nor
    /// while a checkpoint waits for the next commit to finish it: a worker must not wait for a
    /// disk); `None` otherwise, and always on PostgreSQL (a network round trip). For a short
    /// write whose hand-off to another thread would cost more than it.
    pub fn writer_here(&self) -> Option<WriteHere<'_>> {
        let Backing::Sqlite(file) = &self.backing else {
            return None;
        };
        if file.sync == SyncMode::Full {
            return None;
        }
        let conn = file.conn.try_lock().ok()?;
        let checkpointer = file
            .checkpointer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if checkpointer
            .as_ref()
            .is_some_and(Checkpointer::finish_pending)
        {
            return None;
        }
        Some(WriteHere { store: self, conn })
    }

    /// [`Store::view`] for a read of a few rows by key (a member, a session, the roster): on
    /// SQLite, when a read connection is free it runs right here, on the async worker, because
    /// a WAL read never waits for the writer (nor for an fsync) and handing the worker's
    /// tasks to another thread for it costs more than the read. With every read connection
    /// busy, or on PostgreSQL (a network round trip), it is [`Store::view`]. Anything that
    /// may read many rows or a file's contents uses [`Store::view`].
    pub fn view_small<T, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&Conn<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        if let Backing::Sqlite(file) = &self.backing
            && let Some(conn) = file.free_reader()
        {
            return f(&Conn::sqlite(&conn).with_keys(&self.keys, KeyFill::Now));
        }
        self.view(f)
    }

    /// Runs the read-only `f` in a read transaction (on SQLite a read connection: it sees the
    /// last committed state and never waits for the writer). Off the async workers.
    pub fn view<T, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&Conn<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        match &self.backing {
            Backing::Sqlite(file) => off_worker(|| {
                file.read_here(|conn| f(&Conn::sqlite(conn).with_keys(&self.keys, KeyFill::Now)))
            }),
            Backing::Postgres(pg) => {
                off_worker(|| pg.tx(true, |c| f(&c.with_keys(&self.keys, KeyFill::Now))))
            }
        }
    }
}

/// The write connection, held by the calling thread ([`Store::writer_here`]).
pub struct WriteHere<'a> {
    store: &'a Store,
    conn: MutexGuard<'a, Connection>,
}

impl WriteHere<'_> {
    /// [`Store::tx_then`], here.
    pub fn tx_then<T, U, E: From<StoreError>>(
        mut self,
        f: impl FnOnce(&Conn<'_>) -> Result<T, E>,
        then: impl FnOnce(T) -> U,
    ) -> Result<U, E> {
        let keys = &self.store.keys;
        let conn = &mut *self.conn;
        self.store.written(
            |fill| sqlite_tx(conn, |c| f(&c.with_keys(keys, fill))),
            then,
        )
    }
}

/// Runs `f` in a transaction on `conn`: committed on `Ok`, rolled back on `Err` (and when `f`
/// panics). `BEGIN` and `COMMIT` are statements of the connection's cache, parsed once.
fn sqlite_tx<T, E: From<StoreError>>(
    conn: &mut Connection,
    f: impl FnOnce(&Conn<'_>) -> Result<T, E>,
) -> Result<T, E> {
    /// Rolls back whatever is still open when it goes: the transaction of an `f` that failed,
    /// panicked, or whose `COMMIT` failed.
    struct Open<'c>(&'c Connection);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            if !self.0.is_autocommit()
                && let Err(e) = self.0.execute_batch("ROLLBACK")
            {
                tracing::warn!(error = %e, "rolling back a failed transaction failed");
            }
        }
    }
    let conn: &Connection = conn;
    let step = |sql: &str| -> Result<(), StoreError> {
        conn.prepare_cached(sql)?.execute([])?;
        Ok(())
    };
    step("BEGIN")?;
    let open = Open(conn);
    let out = f(&Conn::sqlite(conn))?;
    step("COMMIT")?;
    drop(open);
    Ok(out)
}

impl SqliteFile {
    fn read_here<T>(&self, f: impl FnOnce(&Connection) -> T) -> T {
        if self.readers.is_empty() {
            return self.with_here(|conn| f(conn));
        }
        if let Some(guard) = self.free_reader() {
            return f(&guard);
        }
        let i = self
            .next_reader
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            % self.readers.len();
        let guard = self.readers[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f(&guard)
    }

    /// A read connection nobody holds right now, if any.
    fn free_reader(&self) -> Option<MutexGuard<'_, Connection>> {
        self.readers.iter().find_map(|r| r.try_lock().ok())
    }

    fn with_here<T>(&self, f: impl FnOnce(&mut Connection) -> T) -> T {
        let mut guard = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard)
    }
}

/// Whether `table` has a column `column`.
fn has_column(conn: &Connection, table: &str, column: &str) -> Result<bool, StoreError> {
    Ok(conn
        .prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
        .exists([table, column])?)
}

/// Brings a database created by an older version up to `SCHEMA` (see the module docs),
/// in one transaction.
fn migrate(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| -> Result<bool, StoreError> {
        // 1. Member incarnations.
        if !has_column(conn, "members", "since_seq")? {
            conn.execute_batch(
                "ALTER TABLE members ADD COLUMN since_seq INTEGER NOT NULL DEFAULT 0",
            )?;
        }
        if !has_column(conn, "member_activity", "member_seq")? {
            conn.execute_batch(
                "ALTER TABLE member_activity ADD COLUMN member_seq INTEGER NOT NULL DEFAULT 0;
                 UPDATE member_activity SET member_seq = COALESCE(
                     (SELECT seq FROM members WHERE members.name = member_activity.member_name), 0);",
            )?;
        }
        conn.execute_batch(
            "CREATE INDEX IF NOT EXISTS member_activity_incarnation
                 ON member_activity(member_name, member_seq, id);
             DROP INDEX IF EXISTS member_activity_member;",
        )?;
        // 2. Activity blocks (the table itself is in `SCHEMA`).
        for column in ["system_block", "tools_block", "messages_block"] {
            if !has_column(conn, "member_activity", column)? {
                conn.execute_batch(&format!(
                    "ALTER TABLE member_activity ADD COLUMN {column} INTEGER"
                ))?;
            }
        }
        // 3. Compact messages.
        if has_column(conn, "messages", "json")? {
            compact_messages(conn)?;
        }
        conn.execute_batch(MESSAGES_INDEXES)?;
        // 6. The log's mark: its table is in `SCHEMA`.
        // 7. The log without the counter.
        let table: String = conn.query_row(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'messages'",
            [],
            |r| r.get(0),
        )?;
        let rebuilt = table.to_ascii_uppercase().contains("AUTOINCREMENT");
        if rebuilt {
            drop_log_counter(conn)?;
        }
        Ok(rebuilt)
    })();
    match result {
        Ok(rebuilt) => {
            conn.execute_batch("COMMIT")?;
            if rebuilt {
                // The copy went through the write-ahead log: back into the file, and the log
                // file cut short, rather than left at the size of the whole table.
                conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
            }
            Ok(())
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Rebuilds a `messages` table of wire JSON rows (before step 3) as compact rows, keeping every
/// sequence number, and its counter in the mark.
fn compact_messages(conn: &Connection) -> Result<(), StoreError> {
    use super::messages;
    mark_from_counter(conn)?;
    conn.execute_batch(
        "DROP INDEX IF EXISTS messages_thread;
         DROP INDEX IF EXISTS messages_to;
         DROP INDEX IF EXISTS messages_from;
         ALTER TABLE messages RENAME TO messages_json;",
    )?;
    conn.execute_batch(MESSAGES_TABLE)?;
    let c = Conn::sqlite(conn);
    {
        let mut read = conn.prepare(
            "SELECT seq, id, ts, to_name, from_name, thread, json FROM messages_json ORDER BY seq",
        )?;
        let mut rows = read.query([])?;
        while let Some(r) = rows.next()? {
            let seq: i64 = r.get(0)?;
            let id: String = r.get(1)?;
            let ts: i64 = r.get(2)?;
            let to: Option<String> = r.get(3)?;
            let from: Option<String> = r.get(4)?;
            let thread: Option<String> = r.get(5)?;
            let json: String = r.get(6)?;
            let stored = messages::encode_logged(
                &id,
                ts,
                to.as_deref(),
                from.as_deref(),
                thread.as_deref(),
                &json,
            )?;
            let to_key = to.as_deref().map(|k| messages::key_id(&c, k)).transpose()?;
            let from_key = from
                .as_deref()
                .map(|k| messages::key_id(&c, k))
                .transpose()?;
            let thread_code = match thread.as_deref() {
                Some(t) => Some(messages::thread_code(t, messages::key_id(&c, t)?)),
                None => None,
            };
            conn.execute(
                "INSERT INTO messages (seq, id, id_text, ts, to_key, from_key, thread, body, extra)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                rusqlite::params![
                    seq,
                    stored.id,
                    stored.id_text,
                    ts,
                    to_key,
                    from_key,
                    thread_code,
                    stored.body,
                    stored.extra
                ],
            )?;
        }
    }
    conn.execute_batch("DROP TABLE messages_json")?;
    Ok(())
}

/// Raises the log's mark to the `AUTOINCREMENT` counter of an older file's `messages` table,
/// before that table (and its counter) is rebuilt: the numbers never go back, pruned messages
/// keep theirs. (`sqlite_sequence` exists in every file: `members` has a counter too.)
fn mark_from_counter(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch(
        "UPDATE messages_mark SET seq = MAX(seq, COALESCE(
             (SELECT seq FROM sqlite_sequence WHERE name = 'messages'), 0)) WHERE id = 1",
    )?;
    Ok(())
}

/// Rebuilds an older file's `messages` table, whose `AUTOINCREMENT` counter SQLite updates on
/// every append, as the table without it: every row copied with its number, the indexes made
/// again, the counter kept in the mark. About a quarter of a second per 100,000 messages,
/// once; the old table's pages stay in the file, free, and the log fills them as it grows
/// (`ac7 backup` writes a copy without them).
fn drop_log_counter(conn: &Connection) -> Result<(), StoreError> {
    mark_from_counter(conn)?;
    let rows: i64 = conn.query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))?;
    tracing::info!(
        messages = rows,
        "rebuilding the message log's table without its counter (once)"
    );
    conn.execute_batch(&format!(
        "ALTER TABLE messages RENAME TO messages_counted;
         {MESSAGES_TABLE};
         INSERT INTO messages (seq, id, id_text, ts, to_key, from_key, thread, body, extra)
             SELECT seq, id, id_text, ts, to_key, from_key, thread, body, extra
             FROM messages_counted ORDER BY seq;
         DROP TABLE messages_counted;
         {MESSAGES_INDEXES}"
    ))?;
    Ok(())
}

/// The page size of a new database file. A message changes four pages (its row and three index
/// entries), each appended to the write-ahead log whole and copied again by the checkpoint: at
/// 2 KiB a push writes half the bytes it did at SQLite's default 4 KiB, for about 1.5% more disk
/// a message (room lost at the end of each smaller page). 1 KiB pages lose 5%.
pub(super) const PAGE_SIZE: i64 = 2048;

/// The `messages` table (as in `SCHEMA`), for the step that rebuilds an older one.
const MESSAGES_TABLE: &str = "CREATE TABLE messages (
    seq INTEGER PRIMARY KEY,
    id BLOB,
    id_text TEXT,
    ts INTEGER NOT NULL,
    to_key INTEGER,
    from_key INTEGER,
    thread INTEGER,
    body TEXT NOT NULL,
    extra TEXT
)";

/// The indexes of `messages`, made by [`migrate`] once the table has its current columns.
const MESSAGES_INDEXES: &str = "
CREATE UNIQUE INDEX IF NOT EXISTS messages_id ON messages(id);
CREATE UNIQUE INDEX IF NOT EXISTS messages_id_text ON messages(id_text) WHERE id_text IS NOT NULL;
CREATE INDEX IF NOT EXISTS messages_thread ON messages(thread, seq) WHERE thread IS NOT NULL;
CREATE INDEX IF NOT EXISTS messages_to ON messages(to_key, seq) WHERE to_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS messages_from ON messages(from_key, seq);
";

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS team (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    name TEXT NOT NULL,
    directive TEXT NOT NULL,
    context TEXT NOT NULL,
    presets TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS members (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    role_title TEXT NOT NULL,
    role_description TEXT NOT NULL,
    instructions TEXT NOT NULL,
    permissions TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    since_seq INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS members_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
INSERT OR IGNORE INTO members_version (id, version) VALUES (1, 0);
CREATE TRIGGER IF NOT EXISTS members_version_insert AFTER INSERT ON members
BEGIN UPDATE members_version SET version = version + 1; END;
CREATE TRIGGER IF NOT EXISTS members_version_update AFTER UPDATE ON members
BEGIN UPDATE members_version SET version = version + 1; END;
CREATE TRIGGER IF NOT EXISTS members_version_delete AFTER DELETE ON members
BEGIN UPDATE members_version SET version = version + 1; END;
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    member_name TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    label TEXT NOT NULL,
    origin TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    last_used_at INTEGER,
    expires_at INTEGER,
    created_by TEXT
);
CREATE INDEX IF NOT EXISTS tokens_member ON tokens(member_name);
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY,
    id BLOB,
    id_text TEXT,
    ts INTEGER NOT NULL,
    to_key INTEGER,
    from_key INTEGER,
    thread INTEGER,
    body TEXT NOT NULL,
    extra TEXT
);
CREATE TABLE IF NOT EXISTS messages_mark (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL
);
INSERT OR IGNORE INTO messages_mark (id, seq) VALUES (1, 0);
CREATE TABLE IF NOT EXISTS message_keys (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS channels (
    id TEXT PRIMARY KEY,
    slug TEXT NOT NULL UNIQUE,
    created_by TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    archived_at INTEGER
);
CREATE TABLE IF NOT EXISTS channel_members (
    channel_id TEXT NOT NULL REFERENCES channels(id),
    member_name TEXT NOT NULL,
    role TEXT NOT NULL,
    joined_at INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (channel_id, member_name)
);
CREATE INDEX IF NOT EXISTS channel_members_member ON channel_members(member_name);
CREATE TABLE IF NOT EXISTS objectives (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    assignee TEXT NOT NULL,
    originator TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS objective_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    objective_id TEXT NOT NULL REFERENCES objectives(id),
    json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS objective_events_obj ON objective_events(objective_id, seq);
CREATE TABLE IF NOT EXISTS blobs (
    hash TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    refcount INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS fs_entries (
    path TEXT PRIMARY KEY,
    parent TEXT NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    owner TEXT NOT NULL,
    size INTEGER,
    mime TEXT,
    hash TEXT REFERENCES blobs(hash),
    created_at INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS fs_entries_parent ON fs_entries(parent);
CREATE TABLE IF NOT EXISTS fs_grants (
    path TEXT NOT NULL,
    member_name TEXT NOT NULL,
    granted_at INTEGER NOT NULL,
    PRIMARY KEY (path, member_name)
);
CREATE INDEX IF NOT EXISTS fs_grants_member ON fs_grants(member_name);
CREATE TABLE IF NOT EXISTS blob_trash (
    hash TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS member_activity (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    member_name TEXT NOT NULL,
    ts INTEGER NOT NULL,
    kind TEXT NOT NULL,
    event_json TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    member_seq INTEGER NOT NULL DEFAULT 0,
    system_block INTEGER,
    tools_block INTEGER,
    messages_block INTEGER
);
CREATE TABLE IF NOT EXISTS activity_blocks (
    id INTEGER PRIMARY KEY,
    hash BLOB NOT NULL UNIQUE,
    parent INTEGER,
    refs INTEGER NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS member_activity_ts ON member_activity(ts);
CREATE INDEX IF NOT EXISTS member_activity_kind ON member_activity(kind, ts);
CREATE TABLE IF NOT EXISTS sessions (
    hash TEXT PRIMARY KEY,
    member_name TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    last_seen INTEGER NOT NULL,
    user_agent TEXT
);
CREATE INDEX IF NOT EXISTS sessions_member ON sessions(member_name);
CREATE INDEX IF NOT EXISTS sessions_expires ON sessions(expires_at);
CREATE TABLE IF NOT EXISTS member_totp (
    member_name TEXT PRIMARY KEY,
    secret TEXT,
    last_step INTEGER,
    pending_secret TEXT
);
CREATE TABLE IF NOT EXISTS attempt_limits (
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    opened INTEGER,
    failures INTEGER NOT NULL,
    locked_until INTEGER NOT NULL,
    strikes INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX IF NOT EXISTS attempt_limits_expires ON attempt_limits(scope, expires_at);
CREATE TABLE IF NOT EXISTS setup_code (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    code TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS delivery_cursors (
    member_name TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL,
    last_id TEXT NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS reminder_cooldowns (
    key TEXT PRIMARY KEY,
    fired_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS push_vapid (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    private_pkcs8 BLOB NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS push_subscriptions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    member_name TEXT NOT NULL,
    endpoint TEXT NOT NULL UNIQUE,
    p256dh TEXT NOT NULL,
    auth TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS push_subscriptions_member ON push_subscriptions(member_name);
CREATE TABLE IF NOT EXISTS enrollments (
    device_code_hash TEXT PRIMARY KEY,
    user_code TEXT NOT NULL UNIQUE,
    address TEXT NOT NULL,
    label TEXT NOT NULL,
    user_agent TEXT,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'denied')),
    last_poll INTEGER,
    member_name TEXT,
    token_id TEXT,
    token TEXT,
    reason TEXT
);
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// A new database file is made with [`PAGE_SIZE`] pages; one made before with SQLite's
    /// default keeps its own and opens as before.
    #[test]
    fn a_new_file_takes_the_smaller_pages_and_an_existing_one_keeps_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let page_size = |path: &Path| {
            let store = Store::open(path, SyncMode::Normal).unwrap();
            store
                .sqlite()
                .with_here(|c| c.pragma_query_value(None, "page_size", |r| r.get::<_, i64>(0)))
        };
        let new = dir.path().join("new.db");
        assert_eq!(page_size(&new).unwrap(), PAGE_SIZE);
        assert_eq!(page_size(&new).unwrap(), PAGE_SIZE, "reopened");

        let old = dir.path().join("old.db");
        {
            let c = Connection::open(&old).unwrap();
            c.pragma_update(None, "page_size", 4096).unwrap();
            c.execute_batch("CREATE TABLE kept (v TEXT); INSERT INTO kept VALUES ('here');")
                .unwrap();
        }
        assert_eq!(page_size(&old).unwrap(), 4096);
        let store = Store::open(&old, SyncMode::Normal).unwrap();
        let kept: String = store
            .sqlite()
            .with_here(|c| c.query_row("SELECT v FROM kept", [], |r| r.get(0)))
            .unwrap();
        assert_eq!(kept, "here");
    }

    /// A file whose `messages` table has SQLite's `AUTOINCREMENT` counter gets the table without
    /// it, once, with every row and its number kept and its indexes made again, and its log goes
    /// on after the counter, also past numbers pruned from the end; a new file's table has none
    /// and its mark starts at 0.
    #[test]
    fn an_older_files_log_loses_its_counter_and_goes_on_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let append = |store: &Store| super::super::messages::append_for_test(store, None, 1);
        let one = |store: &Store, sql: &str| -> String {
            store
                .sqlite()
                .with_here(|c| c.query_row(sql, [], |r| r.get(0)))
                .unwrap()
        };
        let table_sql = "SELECT sql FROM sqlite_master WHERE name = 'messages'";

        let new = Store::open(&dir.path().join("new.db"), SyncMode::Normal).unwrap();
        assert!(!one(&new, table_sql).contains("AUTOINCREMENT"));
        assert_eq!((append(&new), append(&new)), (1, 2));

        let path = dir.path().join("old.db");
        {
            let store = Store::open(&path, SyncMode::Normal).unwrap();
            // What an older version made: the same table with the counter, its rows 39 and 40
            // kept and 41, the newest, pruned.
            store
                .sqlite()
                .with_here(|c| {
                    c.execute_batch(&format!(
                        "DROP TABLE messages;
                         DROP TABLE messages_mark;
                         {};
                         {MESSAGES_INDEXES}
                         INSERT INTO messages (seq, id_text, ts, to_key, thread, body, extra)
                             VALUES (39, 'm39', 5, 7, 7, 'to seven', '{{\"x\":1}}');
                         INSERT INTO messages (seq, id, ts, from_key, body)
                             VALUES (40, x'00112233445566778899aabbccddeeff', 6, 8, 'from eight');
                         INSERT INTO messages (seq, ts, body) VALUES (41, 7, 'pruned');
                         DELETE FROM messages WHERE seq = 41;",
                        MESSAGES_TABLE.replace(
                            "seq INTEGER PRIMARY KEY,",
                            "seq INTEGER PRIMARY KEY AUTOINCREMENT,"
                        )
                    ))
                })
                .unwrap();
            assert!(one(&store, table_sql).contains("AUTOINCREMENT"));
        }
        let old = Store::open(&path, SyncMode::Normal).unwrap();
        assert!(!one(&old, table_sql).contains("AUTOINCREMENT"), "rebuilt");
        let wal = std::fs::metadata(dir.path().join("old.db-wal")).map_or(0, |m| m.len());
        assert_eq!(wal, 0, "the copy is checkpointed and the log cut short");
        assert_eq!(
            one(
                &old,
                "SELECT COALESCE(group_concat(name, ','), '') FROM sqlite_sequence
                 WHERE name LIKE 'messages%'"
            ),
            "",
        );
        let rows = one(
            &old,
            "SELECT group_concat(seq || ':' || COALESCE(hex(id), '') || ':'
                 || COALESCE(id_text, '') || ':' || ts || ':' || COALESCE(to_key, '') || ':'
                 || COALESCE(from_key, '') || ':' || COALESCE(thread, '') || ':' || body
                 || ':' || COALESCE(extra, ''), '|')
             FROM (SELECT * FROM messages ORDER BY seq)",
        );
        assert_eq!(
            rows,
            "39::m39:5:7::7:to seven:{\"x\":1}|\
             40:00112233445566778899AABBCCDDEEFF::6::8::from eight:"
        );
        assert_eq!(
            one(
                &old,
                "SELECT group_concat(name, ',') FROM (SELECT name FROM sqlite_master
                 WHERE type = 'index' AND tbl_name = 'messages' AND sql IS NOT NULL ORDER BY name)"
            ),
            "messages_from,messages_id,messages_id_text,messages_thread,messages_to"
        );
        assert_eq!(one(&old, "PRAGMA integrity_check"), "ok");
        assert_eq!(append(&old), 42);
        assert_eq!(append(&old), 43);
        drop(old);
        let again = Store::open(&path, SyncMode::Normal).unwrap();
        assert_eq!(append(&again), 44, "reopened");
    }

    /// A transaction whose work fails or panics is rolled back, and the write connection takes
    /// the next one as if nothing happened; a committed one stays.
    #[test]
    fn a_failed_or_panicking_transaction_leaves_nothing_behind() {
        let store = Store::open_in_memory().unwrap();
        let count = |store: &Store| {
            store
                .view(|c| c.query_row("SELECT COUNT(*) FROM channels", &[], |r| r.get::<i64>(0)))
                .unwrap()
                .unwrap()
        };
        let insert = |c: &Conn<'_>, id: &str| {
            c.execute(
                "INSERT INTO channels (id, slug, created_by, created_at) VALUES (?1, ?1, 'a', 0)",
                crate::params![id],
            )
        };
        let failed: Result<(), StoreError> = store.tx(|c| {
            insert(c, "one")?;
            Err(StoreError::Corrupt("no".into()))
        });
        assert!(failed.is_err());
        assert_eq!(count(&store), 0);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.tx(|c| -> Result<(), StoreError> {
                insert(c, "two")?;
                panic!("in the middle of a transaction")
            })
        }));
        assert!(panicked.is_err());
        assert_eq!(count(&store), 0);
        store.tx(|c| insert(c, "three")).unwrap();
        assert_eq!(count(&store), 1);
    }

    /// The two tables as they were before member incarnations (`members` without `since_seq`,
    /// `member_activity` without `member_seq`), with the old index.
    const OLD_TABLES: &str = r#"
CREATE TABLE members (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    role_title TEXT NOT NULL,
    role_description TEXT NOT NULL,
    instructions TEXT NOT NULL,
    permissions TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE member_activity (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    member_name TEXT NOT NULL,
    ts INTEGER NOT NULL,
    kind TEXT NOT NULL,
    event_json TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX member_activity_member ON member_activity(member_name, id);
INSERT INTO members (name, role_title, role_description, instructions, permissions, created_at)
    VALUES ('gone', 't', '', '', '[]', 0), ('ann', 't', '', '', '[]', 0);
DELETE FROM members WHERE name = 'gone';
INSERT INTO member_activity (member_name, ts, kind, event_json, created_at)
    VALUES ('ann', 1, 'opaque_http', '{}', 1), ('gone', 2, 'opaque_http', '{}', 2);
"#;

    #[test]
    fn an_older_database_is_migrated_and_its_members_keep_everything() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(OLD_TABLES).unwrap();
        let store = Store::init(conn, SyncMode::Normal).unwrap();
        store.with_here(|conn| {
            // Existing members start at the beginning of the log: they keep every DM.
            let since: Vec<(String, i64, i64)> = conn
                .prepare("SELECT name, seq, since_seq FROM members")
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(since, vec![("ann".to_owned(), 2, 0)]);
            // Their rows are theirs; a removed member's rows belong to no member now.
            let stamps: Vec<(String, i64)> = conn
                .prepare("SELECT member_name, member_seq FROM member_activity ORDER BY id")
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(stamps, vec![("ann".to_owned(), 2), ("gone".to_owned(), 0)]);
            let q = crate::broker::activity::Query {
                limit: 10,
                ..Default::default()
            };
            let c = Conn::sqlite(conn);
            assert_eq!(crate::broker::activity::list(&c, "ann", &q, false).unwrap().len(), 1);
            assert_eq!(crate::broker::activity::list(&c, "gone", &q, false).unwrap().len(), 1);
            let index: Vec<String> = conn
                .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'member_activity' ORDER BY name")
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(index.contains(&"member_activity_incarnation".to_owned()), "{index:?}");
            assert!(!index.contains(&"member_activity_member".to_owned()), "{index:?}");
            // Opening again changes nothing.
            migrate(conn).unwrap();
        });
    }

    /// `member_activity` as it was before activity blocks: each exchange whole in `event_json`.
    const BEFORE_BLOCKS: &str = r#"
CREATE TABLE member_activity (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    member_name TEXT NOT NULL,
    ts INTEGER NOT NULL,
    kind TEXT NOT NULL,
    event_json TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    member_seq INTEGER NOT NULL DEFAULT 0
);
"#;

    /// An exchange whose conversation is `turns` user messages, with a system prompt and a tool.
    fn exchange(ts: u64, turns: usize) -> ActivityEvent {
        let messages: Vec<serde_json::Value> = (0..turns)
            .map(|i| serde_json::json!({"role": "user", "content": [{"type": "text", "text": format!("turn {i}")}]}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "kind": "llm_exchange", "ts": ts, "duration": 5,
            "entry": {"kind": "anthropic_messages", "startedAt": ts, "endedAt": ts + 5,
                "request": {"model": "m", "maxTokens": 10, "temperature": null,
                    "system": "You are ann.", "messages": messages,
                    "tools": [{"name": "ls", "description": null, "inputSchema": {"type": "object"}}]},
                "response": null}
        }))
        .unwrap()
    }

    use ac7_protocol::trace::activity::ActivityEvent;

    #[test]
    fn exchanges_stored_whole_by_an_older_version_read_back_and_prune() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(BEFORE_BLOCKS).unwrap();
        let old = exchange(1, 3);
        conn.execute(
            "INSERT INTO member_activity (member_name, ts, kind, event_json, created_at, member_seq)
             VALUES ('ann', 1, 'llm_exchange', ?1, 1, 0)",
            [serde_json::to_string(&old).unwrap()],
        )
        .unwrap();
        let store = Store::init(conn, SyncMode::Normal).unwrap();
        store.with_here(|conn| {
            let c = Conn::sqlite(conn);
            let q = crate::broker::activity::Query {
                limit: 10,
                ..Default::default()
            };
            let events = |c: &Conn<'_>| -> Vec<ActivityEvent> {
                let mut rows = crate::broker::activity::list(c, "ann", &q, false).unwrap();
                rows.reverse();
                rows.into_iter().map(|r| r.event).collect()
            };
            assert_eq!(events(&c), vec![old.clone()]);
            // The next exchange goes to blocks; both read back whole.
            let new = exchange(2, 5);
            crate::broker::activity::append(&c, "ann", 0, vec![new.clone()], 2).unwrap();
            assert_eq!(events(&c), vec![old.clone(), new.clone()]);
            let blocks: i64 = conn
                .query_row("SELECT COUNT(*) FROM activity_blocks", [], |r| r.get(0))
                .unwrap();
            assert_eq!(blocks, 3, "system, tools, conversation");
            // Pruning the old row frees nothing; pruning the new one frees its blocks.
            assert_eq!(crate::broker::retention::prune_batch(&c, 2, 10).unwrap(), 1);
            assert_eq!(events(&c), vec![new]);
            assert_eq!(crate::broker::retention::prune_batch(&c, 3, 10).unwrap(), 1);
            let blocks: i64 = conn
                .query_row("SELECT COUNT(*) FROM activity_blocks", [], |r| r.get(0))
                .unwrap();
            assert_eq!(blocks, 0);
            // Opening again changes nothing.
            migrate(conn).unwrap();
        });
    }

    /// `messages` as it was before compact messages: text columns and each message's JSON.
    const JSON_MESSAGES: &str = r#"
CREATE TABLE messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    ts INTEGER NOT NULL,
    to_name TEXT,
    from_name TEXT,
    thread TEXT,
    json TEXT NOT NULL
);
CREATE INDEX messages_thread ON messages(thread, seq);
CREATE INDEX messages_to ON messages(to_name, seq);
CREATE INDEX messages_from ON messages(from_name, seq);
"#;

    #[test]
    fn messages_logged_as_json_by_an_older_version_read_back_the_same() {
        use crate::broker::messages::{self, Feed, ViewerScope, Window};
        use ac7_protocol::domain::message::{Attachment, LogLevel, Message};
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(JSON_MESSAGES).unwrap();
        let msg = |id: &str, ts: i64, to: Option<&str>, thread: Option<&str>| Message {
            id: id.to_owned(),
            ts,
            to: to.map(str::to_owned),
            from: Some("ann".to_owned()),
            title: None,
            body: format!("body {ts}"),
            level: LogLevel::Info,
            data: thread
                .map(|t| {
                    let mut d = serde_json::Map::new();
                    d.insert("thread".into(), serde_json::json!(t));
                    d
                })
                .unwrap_or_default(),
            attachments: Vec::new(),
        };
        let mut odd = msg(
            "5b0c6a1e-7f55-4a39-9d0e-0c1f2a3b4c5d",
            4,
            None,
            Some("obj:o1"),
        );
        odd.title = Some("t".into());
        odd.level = LogLevel::Warning;
        odd.data.insert("kind".into(), serde_json::json!("update"));
        odd.attachments.push(Attachment {
            path: "/ann/a.txt".into(),
            name: "a.txt".into(),
            size: 1,
            mime_type: "text/plain".into(),
        });
        let rows = [
            (
                msg("0f8fad5b-d9cb-469f-a165-70867728950e", 1, Some("bob"), None),
                None,
            ),
            (
                msg("7c9e6679-7425-40de-944b-e07fc1f90ae7", 2, None, None),
                Some("chan:general"),
            ),
            (msg("not-a-uuid", 3, None, Some("chan:c1")), Some("chan:c1")),
            (odd, Some("obj:o1")),
        ];
        let mut logged = Vec::new();
        for (m, thread) in &rows {
            let json = serde_json::to_string(m).unwrap();
            conn.execute(
                "INSERT INTO messages (id, ts, to_name, from_name, thread, json)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                rusqlite::params![m.id, m.ts, m.to, m.from, thread, json],
            )
            .unwrap();
            logged.push(json);
        }
        // A row whose JSON is no message, and a pruned one that keeps its number taken.
        conn.execute_batch(
            "INSERT INTO messages (id, ts, from_name, thread, json)
                 VALUES ('x', 5, 'ann', 'chan:general', '{\"odd\": true}');
             INSERT INTO messages (id, ts, json) VALUES ('gone', 6, '{}');
             DELETE FROM messages WHERE id = 'gone';",
        )
        .unwrap();
        logged.push(r#"{"odd": true}"#.to_owned());
        let store = Store::init(conn, SyncMode::Normal).unwrap();
        store.with_here(|conn| {
            let c = Conn::sqlite(conn);
            let scope = ViewerScope {
                channels: ["c1".to_owned()].into(),
                objectives: Default::default(),
                manager: true,
                since: 0,
            };
            let mut window = Window::newest(10);
            window.oldest_first = true;
            let page = messages::page(&c, "ann", &scope, &Feed::All, &window).unwrap();
            let got: Vec<(i64, String, String)> =
                page.into_iter().map(|r| (r.seq, r.id, r.json)).collect();
            let want: Vec<(i64, String, String)> = rows
                .iter()
                .map(|(m, _)| m.id.clone())
                .chain(["x".to_owned()])
                .zip(logged.iter().cloned())
                .enumerate()
                .map(|(i, (id, json))| (i as i64 + 1, id, json))
                .collect();
            assert_eq!(got, want);
            assert_eq!(messages::seq_of(&c, "not-a-uuid").unwrap(), Some(3));
            assert_eq!(
                messages::seq_of(&c, "7c9e6679-7425-40de-944b-e07fc1f90ae7").unwrap(),
                Some(2)
            );
            // The next message takes the number after the pruned one.
            let next = msg("9b2f3c4d-0000-4000-8000-000000000000", 7, Some("bob"), None);
            let json = serde_json::to_string(&next).unwrap();
            let seq = messages::insert(
                &c,
                &next,
                &json,
                &ac7_protocol::domain::message::Audience::Everyone,
            )
            .unwrap();
            assert_eq!(seq, 7);
            // Opening again changes nothing.
            migrate(conn).unwrap();
            let again = messages::page(&c, "ann", &scope, &Feed::All, &window).unwrap();
            assert_eq!(again.len(), 6);
            assert_eq!(again[5].json, json);
        });
    }
}
