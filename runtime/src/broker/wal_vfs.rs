//! The broker's SQLite VFS: the file is this process's alone, and each commit's WAL frames go
//! out with one `pwrite`.
//!
//! **One process.** The VFS is SQLite's `unix-excl`: the first connection to lock the
//! database takes a write lock over its lock bytes for the whole process, so no other process
//! (a `sqlite3` shell, another program) can read or write it while the broker has it open; the
//! connections of this process share the WAL index in memory instead of a `-shm` file, and take
//! their locks on it among themselves. Without it every transaction cost five `fcntl` calls on
//! the `-shm` file (its read mark, the write lock, their releases). Every connection to the
//! file must be read-write (a read-only one takes ordinary locks, which in one process replace
//! the process-wide one); the store's readers are read-only by `PRAGMA query_only`.
//!
//! **One write a commit.** SQLite appends a commit to the write-ahead log as frames, each a
//! 24-byte header and a page, and writes every header and every page with a `pwrite` of its
//! own: a message, which changes five pages, costs ten system calls, each touching one or two
//! pages of the kernel's cache. Here writes to the log that continue one another are kept in a
//! buffer and go out together when the commit's last frame is complete, and before anything
//! else is done with the file (a read, a sync, a size, a truncation, a file control, its
//! close) or a write lands elsewhere. Every other file (the database) is `unix-excl`'s own.
//!
//! Nothing is left in the buffer once SQLite has written a commit, so what other connections
//! read (they see a commit only once the index says so, after the frames are written) and
//! what a crash leaves are as without it. The end of a commit is the page that follows a frame
//! header whose "database size" field is set, the mark SQLite gives a commit's last frame; a
//! header rewritten on its own (SQLite re-checksumming frames it overwrote) is written at once.
//! A long transaction spilling pages before its commit is written out every [`MAX_BUFFER`]
//! bytes.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use rusqlite::ffi;

/// The name every connection to the broker's database opens it with.
pub(super) const NAME: &CStr = c"ac7-wal";

/// The most bytes kept before they are written: what the unix VFSes write in one call (it
/// takes a length below 128 KiB; a longer one is cut to its low 17 bits).
const MAX_BUFFER: usize = 64 << 10;

/// A frame header: page number, database size (non-zero on a commit's last frame), salts,
/// checksums.
const FRAME_HEADER: usize = 24;

/// The log's own header, before the first frame.
const LOG_HEADER: i64 = 32;

/// Registers the VFS (once per process; not as the default). The error is SQLite's code.
pub(super) fn register() -> Result<(), c_int> {
    static DONE: OnceLock<Result<(), c_int>> = OnceLock::new();
    *DONE.get_or_init(|| {
        // SAFETY: `sqlite3_vfs_find` returns a built-in VFS, which lives as long as the
        // process; the copy is leaked, so the registered VFS does too.
        unsafe {
            let base = ffi::sqlite3_vfs_find(c"unix-excl".as_ptr());
            if base.is_null() {
                return Err(ffi::SQLITE_ERROR);
            }
            let mut vfs = *base;
            vfs.pNext = std::ptr::null_mut();
            vfs.zName = NAME.as_ptr();
            vfs.szOsFile = (*base).szOsFile + size_of::<LogFile>() as c_int;
            vfs.xOpen = Some(open);
            BASE.set(Base(base)).map_err(|_| ffi::SQLITE_MISUSE)?;
            let vfs = Box::leak(Box::new(vfs));
            match ffi::sqlite3_vfs_register(vfs, 0) {
                ffi::SQLITE_OK => Ok(()),
                rc => Err(rc),
            }
        }
    })
}

/// The built-in VFS (`unix-excl`) everything is delegated to.
struct Base(*mut ffi::sqlite3_vfs);
// SAFETY: a VFS is immutable once registered and SQLite's own methods are thread-safe.
unsafe impl Send for Base {}
unsafe impl Sync for Base {}
static BASE: OnceLock<Base> = OnceLock::new();

/// An open log: SQLite's file object (first, so SQLite's pointer is ours), then the built-in
/// VFS's file for the same file, in the rest of the space SQLite allocated.
#[repr(C)]
struct LogFile {
    file: ffi::sqlite3_file,
    inner: *mut ffi::sqlite3_file,
    /// Bytes written by SQLite and not yet by us, from `at`.
    pending: Vec<u8>,
    at: i64,
    /// The last write was a commit's last frame header: its page ends the commit.
    commit_page_next: bool,
}

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let Some(Base(base)) = BASE.get() else {
        return ffi::SQLITE_MISUSE;
    };
    // SAFETY: SQLite gives `file` with `szOsFile` bytes: room for a `LogFile` followed by the
    // built-in VFS's file, or the built-in VFS's file alone at the start.
    unsafe {
        let Some(base_open) = (**base).xOpen else {
            return ffi::SQLITE_MISUSE;
        };
        if flags & ffi::SQLITE_OPEN_WAL == 0 {
            return base_open(*base, name, file, flags, out_flags);
        }
        let log = file.cast::<LogFile>();
        let inner = log.add(1).cast::<ffi::sqlite3_file>();
        let rc = base_open(*base, name, inner, flags, out_flags);
        if rc != ffi::SQLITE_OK || (*inner).pMethods.is_null() {
            // SQLite calls `xClose` only when `pMethods` is set: leave it unset.
            (*file).pMethods = std::ptr::null();
            return rc;
        }
        if (*(*inner).pMethods).iVersion < 3 {
            // A table without every method this one has: the log is written as it is.
            if let Some(close) = (*(*inner).pMethods).xClose {
                close(inner);
            }
            return base_open(*base, name, file, flags, out_flags);
        }
        log.write(LogFile {
            file: ffi::sqlite3_file {
                pMethods: &LOG_METHODS,
            },
            inner,
            pending: Vec::new(),
            at: 0,
            commit_page_next: false,
        });
        ffi::SQLITE_OK
    }
}

/// The log file behind SQLite's pointer.
///
/// # Safety
/// `file` is a file this VFS opened as a log, not yet closed.
unsafe fn log<'a>(file: *mut ffi::sqlite3_file) -> &'a mut LogFile {
    // SAFETY: the caller's contract; SQLite uses a file from one thread at a time.
    unsafe { &mut *file.cast::<LogFile>() }
}

impl LogFile {
    fn methods(&self) -> &ffi::sqlite3_io_methods {
        // SAFETY: the built-in VFS set the inner file's methods when it opened it, a table of
        // version 3 at least (`open` checks).
        unsafe { &*(*self.inner).pMethods }
    }

    /// Writes what is pending; on failure it is dropped (SQLite rolls the commit back). (One
    /// copy of it serves every method.)
    #[inline(never)]
    fn flush(&mut self) -> c_int {
        self.commit_page_next = false;
        if self.pending.is_empty() {
            return ffi::SQLITE_OK;
        }
        let rc = self.write_through(&self.pending, self.at);
        self.pending.clear();
        rc
    }

    fn write(&mut self, data: &[u8], offset: i64) -> c_int {
        // Taken before anything else: whatever comes after a commit's last header is written
        // before SQLite hears back.
        let ends_commit = std::mem::take(&mut self.commit_page_next);
        let end = self.at + self.pending.len() as i64;
        if !self.pending.is_empty() && offset != end {
            let rc = self.flush();
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        let commit_header =
            data.len() == FRAME_HEADER && offset >= LOG_HEADER && data[4..8] != [0, 0, 0, 0];
        if commit_header && self.pending.is_empty() {
            // A header rewritten on its own, or a commit of one frame: its page (if any)
            // follows and is written at once too.
            self.commit_page_next = true;
            return self.write_through(data, offset);
        }
        if self.pending.is_empty() {
            self.at = offset;
        }
        self.pending.extend_from_slice(data);
        if commit_header {
            self.commit_page_next = true;
            return ffi::SQLITE_OK;
        }
        if ends_commit || self.pending.len() >= MAX_BUFFER {
            return self.flush();
        }
        ffi::SQLITE_OK
    }

    /// Writes `data` at `offset` with the built-in VFS, [`MAX_BUFFER`] bytes at a time.
    fn write_through(&self, data: &[u8], offset: i64) -> c_int {
        let Some(write) = self.methods().xWrite else {
            return ffi::SQLITE_MISUSE;
        };
        let mut at = offset;
        for piece in data.chunks(MAX_BUFFER) {
            let len = piece.len() as c_int;
            // SAFETY: `inner` is open; `piece` is `len` bytes.
            let rc = unsafe { write(self.inner, piece.as_ptr().cast(), len, at) };
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            at += len as i64;
        }
        ffi::SQLITE_OK
    }
}

/// Writes what is pending, then calls the built-in VFS's `method` on the inner file with `args`
/// (`missing` where its table has no such method: `SQLITE_MISUSE` unless given).
macro_rules! flushed {
    ($file:expr, $method:ident($($arg:expr),*) $(else $missing:expr)?) => {{
        // SAFETY: SQLite calls a file's methods with the file it opened.
        let log = unsafe { log($file) };
        let rc = log.flush();
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        match log.methods().$method {
            // SAFETY: the built-in VFS's method, on its own open file, with SQLite's arguments.
            Some(method) => unsafe { method(log.inner, $($arg),*) },
            None => flushed!(@missing $($missing)?),
        }
    }};
    (@missing) => { ffi::SQLITE_MISUSE };
    (@missing $missing:expr) => { $missing };
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes a file once; after this the memory is SQLite's again.
    unsafe {
        let log = log(file);
        let flushed = log.flush();
        let closed = match log.methods().xClose {
            Some(close) => close(log.inner),
            None => ffi::SQLITE_MISUSE,
        };
        std::ptr::drop_in_place(file.cast::<LogFile>());
        (*file).pMethods = std::ptr::null();
        if flushed != ffi::SQLITE_OK {
            flushed
        } else {
            closed
        }
    }
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    flushed!(file, xRead(buf, amount, offset))
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    let Ok(len) = usize::try_from(amount) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    // SAFETY: SQLite passes `amount` readable bytes at `buf`, and its own file.
    unsafe {
        let data = std::slice::from_raw_parts(buf.cast::<u8>(), len);
        log(file).write(data, offset)
    }
}

unsafe extern "C" fn truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    flushed!(file, xTruncate(size))
}

unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    flushed!(file, xSync(flags))
}

unsafe extern "C" fn file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    flushed!(file, xFileSize(size))
}

unsafe extern "C" fn lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    flushed!(file, xLock(level))
}

unsafe extern "C" fn unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    flushed!(file, xUnlock(level))
}

unsafe extern "C" fn check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    flushed!(file, xCheckReservedLock(out))
}

unsafe extern "C" fn file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    flushed!(file, xFileControl(op, arg))
}

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite's own open file.
    unsafe {
        let log = log(file);
        log.methods()
            .xSectorSize
            .map_or(4096, |size| size(log.inner))
    }
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite's own open file.
    unsafe {
        let log = log(file);
        log.methods()
            .xDeviceCharacteristics
            .map_or(0, |device| device(log.inner))
    }
}

unsafe extern "C" fn shm_map(
    file: *mut ffi::sqlite3_file,
    page: c_int,
    page_size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    flushed!(file, xShmMap(page, page_size, extend, out) else ffi::SQLITE_IOERR_SHMMAP)
}

unsafe extern "C" fn shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    flushed!(file, xShmLock(offset, n, flags) else ffi::SQLITE_IOERR_SHMLOCK)
}

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: SQLite's own open file. A barrier has no way to report a failed write, so it
    // writes nothing: a log's shared memory is never used (the database file's is).
    unsafe {
        let log = log(file);
        if let Some(barrier) = log.methods().xShmBarrier {
            barrier(log.inner);
        }
    }
}

unsafe extern "C" fn shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    flushed!(file, xShmUnmap(delete) else ffi::SQLITE_OK)
}

unsafe extern "C" fn fetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    amount: c_int,
    out: *mut *mut c_void,
) -> c_int {
    flushed!(file, xFetch(offset, amount, out) else {
        // SAFETY: SQLite passes where the page's address goes.
        unsafe { *out = std::ptr::null_mut() };
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn unfetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    page: *mut c_void,
) -> c_int {
    flushed!(file, xUnfetch(offset, page) else ffi::SQLITE_OK)
}

static LOG_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};
    use std::path::Path;

    fn writer(path: &Path) -> Connection {
        register().expect("the VFS registers");
        let c = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), NAME).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c.pragma_update(None, "synchronous", "NORMAL").unwrap();
        // Checkpoints only when asked, so the log holds everything written.
        c.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        c.execute_batch(
            "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, k TEXT UNIQUE, v BLOB);
             CREATE INDEX t_v ON t(v);",
        )
        .unwrap();
        c
    }

    /// A directory, the database's path in it, and a writer on it.
    fn fresh() -> (tempfile::TempDir, std::path::PathBuf, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let w = writer(&path);
        (dir, path, w)
    }

    /// What a process that stopped now would leave: the database and its log, copied, and
    /// opened afresh, which makes SQLite rebuild the index from the log and check every
    /// frame's checksum (a wrong byte loses the commit it is in and every later one).
    fn recovered(dir: &Path, from: &Path) -> Connection {
        let copy = dir.join("copy.db");
        for stale in ["copy.db-wal", "copy.db-shm"] {
            let _ = std::fs::remove_file(dir.join(stale));
        }
        std::fs::copy(from, &copy).unwrap();
        let mut wal = from.as_os_str().to_owned();
        wal.push("-wal");
        let mut copy_wal = copy.as_os_str().to_owned();
        copy_wal.push("-wal");
        std::fs::copy(&wal, &copy_wal).unwrap();
        Connection::open(&copy).unwrap()
    }

    fn count(c: &Connection) -> i64 {
        c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    fn ok(c: &Connection) {
        let check: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
    }

    #[test]
    fn commits_read_back_live_and_after_a_stop() {
        let (dir, path, w) = fresh();
        let reader = Connection::open(&path).unwrap();
        for i in 0..2000 {
            let tx = w.unchecked_transaction().unwrap();
            tx.execute(
                "INSERT INTO t (k, v) VALUES (?1, randomblob(?2))",
                rusqlite::params![format!("k{i}"), 20 + i % 300],
            )
            .unwrap();
            tx.commit().unwrap();
            if i % 97 == 0 {
                // Another connection, on the default VFS, sees each commit once made.
                assert_eq!(count(&reader), i + 1);
            }
        }
        assert_eq!(count(&reader), 2000);
        let after = recovered(dir.path(), &path);
        assert_eq!(count(&after), 2000);
        ok(&after);
        drop(after);
        // Checkpointed and closed through the VFS, then opened again.
        w.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        drop(w);
        let again = Connection::open(&path).unwrap();
        assert_eq!(count(&again), 2000);
        ok(&again);
    }

    #[test]
    fn a_transaction_larger_than_the_cache_spills_and_commits_whole() {
        let (dir, path, w) = fresh();
        // A tiny cache: the transaction writes frames before its commit, then writes pages it
        // already wrote again (which makes SQLite rewrite those frames and their checksums).
        w.pragma_update(None, "cache_size", 10).unwrap();
        let tx = w.unchecked_transaction().unwrap();
        for i in 0..3000 {
            tx.execute(
                "INSERT INTO t (k, v) VALUES (?1, randomblob(900))",
                rusqlite::params![format!("k{i}")],
            )
            .unwrap();
        }
        tx.execute("UPDATE t SET v = randomblob(700) WHERE id % 3 = 0", [])
            .unwrap();
        tx.commit().unwrap();
        // What the commit wrote is all in the log, right after it.
        let after = recovered(dir.path(), &path);
        assert_eq!(count(&after), 3000);
        ok(&after);
        drop(after);
        // And a rollback of another large one leaves the first whole.
        let tx = w.unchecked_transaction().unwrap();
        tx.execute("UPDATE t SET v = randomblob(800)", []).unwrap();
        tx.rollback().unwrap();
        w.execute("INSERT INTO t (k, v) VALUES ('last', x'00')", [])
            .unwrap();
        let reader = Connection::open(&path).unwrap();
        assert_eq!(count(&reader), 3001);
        let after = recovered(dir.path(), &path);
        assert_eq!(count(&after), 3001);
        let short: i64 = after
            .query_row("SELECT count(*) FROM t WHERE length(v) = 700", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(short, 1000);
        ok(&after);
    }

    #[test]
    fn a_commit_of_megabytes_is_written_whole() {
        let (dir, path, w) = fresh();
        // Commits of many frames (as a group commit of many messages, or a large file) pass
        // the size SQLite writes in one call; sizes around it, to the byte.
        let mut rows = 0;
        for (n, size) in [(40, 3000), (33, 4000), (1, 131_072 - 24), (900, 2500)] {
            let tx = w.unchecked_transaction().unwrap();
            for i in 0..n {
                tx.execute(
                    "INSERT INTO t (k, v) VALUES (?1, randomblob(?2))",
                    rusqlite::params![format!("big{rows}-{i}"), size],
                )
                .unwrap();
            }
            tx.commit().unwrap();
            rows += n;
        }
        let after = recovered(dir.path(), &path);
        assert_eq!(count(&after), rows);
        ok(&after);
    }

    #[test]
    fn a_reader_on_another_thread_never_sees_a_partial_commit() {
        let (dir, path, w) = fresh();
        w.execute_batch(
            "CREATE TABLE pair (a INTEGER, b INTEGER); INSERT INTO pair VALUES (0, 0);",
        )
        .unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reading = {
            let (path, stop) = (path.clone(), std::sync::Arc::clone(&stop));
            std::thread::spawn(move || {
                let r =
                    Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
                let mut seen = 0;
                let mut last = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let (a, b, n): (i64, i64, i64) = r
                        .query_row(
                            "SELECT a, b, (SELECT count(*) FROM t) FROM pair",
                            [],
                            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                        )
                        .unwrap();
                    assert_eq!(a, b, "both halves of one commit");
                    assert_eq!(n, a, "the row of the same commit");
                    assert!(a >= last, "commits seen in order");
                    last = a;
                    seen += 1;
                }
                seen
            })
        };
        for i in 1..=1500i64 {
            let tx = w.unchecked_transaction().unwrap();
            tx.execute("UPDATE pair SET a = ?1", [i]).unwrap();
            tx.execute(
                "INSERT INTO t (k, v) VALUES (?1, randomblob(200))",
                [format!("k{i}")],
            )
            .unwrap();
            tx.execute("UPDATE pair SET b = ?1", [i]).unwrap();
            tx.commit().unwrap();
            if i % 500 == 0 {
                // The log restarts after a checkpoint: its header is written again.
                w.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
                    .unwrap();
            }
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(reading.join().unwrap() > 0);
        let after = recovered(dir.path(), &path);
        assert_eq!(count(&after), 1500);
        ok(&after);
    }

    /// What the table should hold: row id → blob length.
    type Model = std::collections::BTreeMap<i64, i64>;

    #[derive(Debug, Clone)]
    enum Op {
        /// One transaction inserting `rows` blobs of `size` bytes.
        Commit { rows: usize, size: i64 },
        /// One transaction giving every `stride`th row a blob of `size` bytes.
        Rewrite { stride: i64, size: i64 },
        /// One transaction deleting every `stride`th row.
        Delete { stride: i64 },
        /// A transaction inserting `rows` blobs, rolled back.
        Abandon { rows: usize },
        /// A checkpoint: PASSIVE, RESTART or TRUNCATE.
        Checkpoint(u8),
        /// Pages the connection may keep before it spills: 8, or SQLite's default.
        Cache(bool),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (1..80usize, 0..6000i64).prop_map(|(rows, size)| Op::Commit { rows, size }),
            2 => (1..5i64, 0..9000i64).prop_map(|(stride, size)| Op::Rewrite { stride, size }),
            1 => (2..6i64).prop_map(|stride| Op::Delete { stride }),
            1 => (1..200usize).prop_map(|rows| Op::Abandon { rows }),
            1 => (0..3u8).prop_map(Op::Checkpoint),
            1 => any::<bool>().prop_map(Op::Cache),
        ]
    }

    fn state(c: &Connection) -> Model {
        let mut s = c.prepare("SELECT id, length(v) FROM t").unwrap();
        s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    fn apply(w: &Connection, model: &mut Model, next: &mut i64, op: &Op) {
        let blob = "INSERT INTO t (k, v) VALUES (?1, randomblob(?2))";
        match *op {
            Op::Commit { rows, size } => {
                let tx = w.unchecked_transaction().unwrap();
                for _ in 0..rows {
                    *next += 1;
                    tx.execute(blob, rusqlite::params![format!("k{next}"), size])
                        .unwrap();
                    model.insert(*next, size);
                }
                tx.commit().unwrap();
            }
            Op::Rewrite { stride, size } => {
                w.execute(
                    "UPDATE t SET v = randomblob(?1) WHERE id % ?2 = 0",
                    [size, stride],
                )
                .unwrap();
                model
                    .iter_mut()
                    .filter(|(id, _)| *id % stride == 0)
                    .for_each(|(_, len)| *len = size);
            }
            Op::Delete { stride } => {
                w.execute("DELETE FROM t WHERE id % ?1 = 0", [stride])
                    .unwrap();
                model.retain(|id, _| id % stride != 0);
            }
            Op::Abandon { rows } => {
                let tx = w.unchecked_transaction().unwrap();
                for i in 0..rows {
                    tx.execute(blob, rusqlite::params![format!("gone{i}"), 3000])
                        .unwrap();
                }
                tx.rollback().unwrap();
            }
            Op::Checkpoint(mode) => {
                let mode = ["PASSIVE", "RESTART", "TRUNCATE"][usize::from(mode)];
                w.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |_| Ok(()))
                    .unwrap();
            }
            Op::Cache(small) => {
                w.pragma_update(None, "cache_size", if small { 8 } else { -2000 })
                    .unwrap();
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 24,
            failure_persistence: Some(Box::new(
                proptest::test_runner::FileFailurePersistence::Direct(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../proptest-regressions/wal_vfs.txt"
                )),
            )),
            ..proptest::test_runner::Config::default()
        })]

        /// After every step, another connection reads what was committed, and the database
        /// and log a process would leave right then hold it too.
        #[test]
        fn every_commit_is_in_the_log_when_sqlite_hears_back(
            ops in proptest::collection::vec(op(), 1..14),
            full in proptest::prelude::any::<bool>(),
        ) {
            let (dir, path, w) = fresh();
            if full {
                // Each commit synced (the broker's `--sync full`).
                w.pragma_update(None, "synchronous", "FULL").unwrap();
            }
            let reader = Connection::open(&path).unwrap();
            let (mut model, mut next) = (Model::new(), 0);
            for op in &ops {
                apply(&w, &mut model, &mut next, op);
                proptest::prop_assert_eq!(&state(&reader), &model, "read live after {:?}", op);
                let after = recovered(dir.path(), &path);
                proptest::prop_assert_eq!(&state(&after), &model, "recovered after {:?}", op);
                ok(&after);
            }
        }
    }
}
