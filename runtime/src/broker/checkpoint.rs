//! Checkpoints of the SQLite write-ahead log, on a thread of their own.
//!
//! A checkpoint copies the pages the WAL holds back into the database file and fsyncs it, so
//! that the log can start over. SQLite's automatic checkpoint does that inside the COMMIT that
//! carries the log past 1000 pages: that commit, and every push waiting behind it, waited for
//! the copy and the fsyncs (milliseconds) before anything was delivered.
//!
//! Here the write connection only counts. Its WAL hook sees how many frames the log holds after
//! each commit and, once [`START_FRAMES`] more have come since the last checkpoint, wakes the
//! checkpoint thread, which:
//! 1. runs a PASSIVE checkpoint on a connection of its own: it copies what is committed while
//!    the writer goes on committing (no lock shared with the writer, no busy wait);
//! 2. then asks the next commit to checkpoint what was committed meanwhile, inline: the few
//!    frames of that commit and the ones before it since the first pass began, and the fsyncs,
//!    where SQLite's own checkpoint copied the whole log. A commit is the one moment nothing
//!    else writes, so the log is then fully copied and the next write transaction starts it
//!    over from its beginning: the `-wal` file stays near [`START_FRAMES`] frames however long
//!    the broker writes. (The thread taking the write connection itself for this would wait
//!    behind a busy writer indefinitely; a commit never does.)
//!
//! A reader holding an old snapshot (a long replay) keeps both passes short of the end; the
//! next commits ask again. Should the log reach [`BACKSTOP_FRAMES`] anyway (the thread cannot
//! keep up, or its connection failed), the commit that takes it there waits for a pass in
//! progress to end and checkpoints inline, as SQLite itself would have, so the log is bounded.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use rusqlite::{Connection, ffi};

/// Frames added since the last checkpoint that wake the checkpoint thread: about 16 MB of 4 KB
/// pages, four times SQLite's own automatic checkpoint, as each round costs a commit the fsyncs
/// of its second pass whatever its size (a page written many times is copied once).
pub const START_FRAMES: i32 = 4000;

/// Frames at which a commit checkpoints inline: the thread fell this far behind.
pub const BACKSTOP_FRAMES: i32 = 4 * START_FRAMES;

/// What the checkpoints did since the store opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Checkpoints the thread ran on its own connection, beside the writer.
    pub background: u64,
    /// Second passes a commit ran inline to finish a background checkpoint.
    pub finished: u64,
    /// Checkpoints a commit ran inline because the log reached [`BACKSTOP_FRAMES`].
    pub inline: u64,
    /// Checkpoints that failed (logged; the next commits ask again).
    pub failed: u64,
}

/// The state the write connection's hook and the thread share. The hook reaches it through a
/// raw pointer: it lives as long as the [`Checkpointer`], which unhooks the connection before
/// it goes (see [`Checkpointer::unhook`]).
#[derive(Debug, Default)]
struct Shared {
    /// Set by the hook, taken by the thread; `stop` ends the thread.
    state: Mutex<Signal>,
    /// Set by the thread after a complete first pass: the next commit finishes the round.
    finish: AtomicBool,
    wake: Condvar,
    /// Signalled when the thread ends a pass.
    idle: Condvar,
    /// The log's size in frames after the last commit.
    last: AtomicI32,
    /// The log's size in frames when the last checkpoint began (what it covered).
    mark: AtomicI32,
    background: AtomicU64,
    finished: AtomicU64,
    inline: AtomicU64,
    failed: AtomicU64,
}

#[derive(Debug, Default)]
struct Signal {
    due: bool,
    stop: bool,
    /// The thread is checkpointing.
    running: bool,
}

impl Shared {
    /// After a commit that left `frames` frames in the log.
    fn committed(&self, frames: c_int) -> Decision {
        self.last.store(frames, Ordering::Relaxed);
        if frames >= BACKSTOP_FRAMES {
            return Decision::Backstop;
        }
        if self.finish.swap(false, Ordering::AcqRel) {
            return Decision::Finish;
        }
        if self.grown(frames) {
            let mut signal = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            // Again under the lock, where the thread moves the mark as it takes a request.
            if !signal.due && self.grown(frames) {
                signal.due = true;
                self.wake.notify_one();
            }
        }
        Decision::Nothing
    }

    /// Whether a log of `frames` frames holds [`START_FRAMES`] more than the last round covered.
    fn grown(&self, frames: c_int) -> bool {
        let mark = self.mark.load(Ordering::Relaxed);
        // A log smaller than the mark has started over since: count from its beginning.
        let base = if frames < mark { 0 } else { mark };
        frames - base >= START_FRAMES
    }
}

/// What a commit does about the log it left.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Nothing,
    /// The second pass of a background checkpoint.
    Finish,
    /// The log reached the backstop.
    Backstop,
}

/// The checkpoint thread of one SQLite file, and the hook on its write connection.
#[derive(Debug)]
pub struct Checkpointer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    writer: Arc<Mutex<Connection>>,
}

impl Checkpointer {
    /// Hooks `writer` (replacing SQLite's automatic checkpoint on it) and starts the thread,
    /// which checkpoints through `own`, a read-write connection to the same file.
    pub fn start(writer: Arc<Mutex<Connection>>, own: Connection) -> std::io::Result<Checkpointer> {
        let shared = Arc::new(Shared::default());
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("ac7-checkpoint".into())
                .spawn(move || run(&shared, &own))?
        };
        {
            let conn = writer.lock().unwrap_or_else(PoisonError::into_inner);
            // SAFETY: the hook's context is the `Shared` this checkpointer owns (an `Arc`, so
            // its address is stable); `unhook` removes the hook before that `Arc` can go.
            unsafe {
                ffi::sqlite3_wal_hook(
                    conn.handle(),
                    Some(on_commit),
                    Arc::as_ptr(&shared).cast_mut().cast::<c_void>(),
                );
            }
        }
        Ok(Checkpointer {
            shared,
            thread: Some(thread),
            writer,
        })
    }

    /// Whether the next commit finishes a round (copies and fsyncs inline).
    pub fn finish_pending(&self) -> bool {
        self.shared.finish.load(Ordering::Relaxed)
    }

    /// What the checkpoints did so far.
    pub fn stats(&self) -> CheckpointStats {
        let s = &self.shared;
        CheckpointStats {
            background: s.background.load(Ordering::Acquire),
            finished: s.finished.load(Ordering::Relaxed),
            inline: s.inline.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
        }
    }

    /// Stops the thread (a checkpoint in progress finishes first), closes its connection and
    /// takes the hook off the write connection, which commits as before but checkpoints only
    /// when asked (a clean shutdown's TRUNCATE). Idempotent. Must not be called holding the
    /// write connection: taking the hook off takes it.
    pub fn stop(&mut self) {
        {
            let mut signal = self
                .shared
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            signal.stop = true;
            self.shared.wake.notify_one();
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the checkpoint thread panicked");
        }
        self.unhook();
    }

    fn unhook(&self) {
        let conn = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: removing a hook is always sound; the connection is open (the store replaces
        // it rather than leaving it closed).
        unsafe {
            ffi::sqlite3_wal_hook(conn.handle(), None, std::ptr::null_mut());
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// SQLite's WAL hook: called on the write connection after each commit, with the log's size.
unsafe extern "C" fn on_commit(
    context: *mut c_void,
    db: *mut ffi::sqlite3,
    name: *const c_char,
    frames: c_int,
) -> c_int {
    // SAFETY: `context` is the `Shared` of the live `Checkpointer` that installed this hook.
    let shared = unsafe { &*context.cast_const().cast::<Shared>() };
    let decision = shared.committed(frames);
    // SAFETY: SQLite allows a checkpoint from inside the WAL hook (its own automatic checkpoint
    // is one); `db` and `name` are the ones it passed.
    let checkpoint = || unsafe {
        ffi::sqlite3_wal_checkpoint_v2(
            db,
            name,
            ffi::SQLITE_CHECKPOINT_PASSIVE,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    let rc = match decision {
        Decision::Nothing => return ffi::SQLITE_OK,
        Decision::Finish => checkpoint(),
        // A pass of the thread in progress would make this checkpoint busy and let the log grow
        // on: wait for it to end, and keep the thread from starting another meanwhile.
        Decision::Backstop => {
            let mut signal = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            while signal.running {
                signal = shared
                    .idle
                    .wait(signal)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            checkpoint()
        }
    };
    match (rc, decision) {
        (ffi::SQLITE_OK, Decision::Finish) => shared.finished.fetch_add(1, Ordering::Relaxed),
        (ffi::SQLITE_OK, _) => shared.inline.fetch_add(1, Ordering::Relaxed),
        // The thread is checkpointing right now (a finishing pass does not wait for it): its
        // round ends by asking again.
        (ffi::SQLITE_BUSY, _) => 0,
        _ => shared.failed.fetch_add(1, Ordering::Relaxed),
    };
    // The commit has happened whatever a checkpoint did: never report it as failed.
    ffi::SQLITE_OK
}

/// The thread: waits to be asked, then checkpoints (see the module docs).
fn run(shared: &Shared, own: &Connection) {
    loop {
        {
            let mut signal = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            while !signal.due && !signal.stop {
                signal = shared
                    .wake
                    .wait(signal)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if signal.stop {
                return;
            }
            signal.due = false;
            signal.running = true;
            // What this round covers: commits from here on count towards the next one.
            shared
                .mark
                .store(shared.last.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        match passive(own) {
            Ok((log, copied)) => {
                // Short of the end, a reader's snapshot stopped it, and the next commit would
                // get no further. Otherwise the next commit copies what was committed meanwhile.
                if copied == log {
                    shared.finish.store(true, Ordering::Release);
                }
                shared.background.fetch_add(1, Ordering::Release);
            }
            Err(e) => {
                shared.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "checkpoint of the write-ahead log failed");
            }
        }
        shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .running = false;
        shared.idle.notify_all();
    }
}

/// A PASSIVE checkpoint on `conn`: the log's size and how much of it is now copied, in frames.
fn passive(conn: &Connection) -> rusqlite::Result<(i32, i32)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get(1)?, row.get(2)?))
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::broker::db::{PAGE_SIZE, Store, SyncMode};

    /// Commits `n` transactions of one 4 KB row each (about two WAL frames apiece).
    fn write(store: &Store, n: usize) {
        for _ in 0..n {
            store.with(|c| {
                c.execute("INSERT INTO scratch (b) VALUES (zeroblob(4000))", [])
                    .expect("insert");
            });
        }
    }

    fn open(dir: &Path) -> Store {
        let store = Store::open(&dir.join("ac7.db"), SyncMode::Normal).expect("open");
        store.with(|c| {
            c.execute_batch("CREATE TABLE scratch (b BLOB)")
                .expect("table");
        });
        store
    }

    fn len(path: &Path) -> u64 {
        std::fs::metadata(path).map_or(0, |m| m.len())
    }

    #[test]
    fn a_growing_log_is_checkpointed_beside_the_writer_not_inside_a_commit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        write(
            &store,
            usize::try_from(START_FRAMES * 7 / 10).expect("positive"),
        );
        // The commit after a complete pass finishes its round; the writes may all have come
        // before the thread's pass ended (or during a second one), so a commit now and then.
        let deadline = Instant::now() + Duration::from_secs(20);
        let stats = loop {
            let stats = store.checkpoints().expect("a file store checkpoints");
            if stats.finished >= 1 || Instant::now() > deadline {
                break stats;
            }
            std::thread::sleep(Duration::from_millis(5));
            write(&store, 1);
        };
        assert!(stats.background >= 1, "the thread checkpointed: {stats:?}");
        assert!(stats.finished >= 1, "and a commit finished it: {stats:?}");
        assert_eq!(stats.inline, 0, "no commit checkpointed: {stats:?}");
        assert_eq!(stats.failed, 0, "{stats:?}");
        // Only checkpoints write the database file itself: the rows of the first START_FRAMES
        // frames are in it (a row is a page, plus the interior pages each commit rewrites).
        let db = len(&dir.path().join("ac7.db"));
        let rows = u64::try_from(START_FRAMES / 4).expect("positive") * 4000;
        assert!(db >= rows, "the database file holds the rows: {db} bytes");
    }

    #[test]
    fn the_log_starts_over_however_long_the_writes_go_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let wal = dir.path().join("ac7.db-wal");
        // About three times the backstop in frames (two a commit), committed back to back.
        let frame = u64::try_from(PAGE_SIZE).expect("positive") + 24;
        let mut largest = 0;
        for _ in 0..BACKSTOP_FRAMES * 3 / 200 {
            write(&store, 100);
            largest = largest.max(len(&wal));
        }
        let bound = u64::try_from(BACKSTOP_FRAMES + 64).expect("positive") * frame;
        assert!(
            largest <= bound,
            "the -wal file reached {largest} bytes (bound {bound}): {:?}",
            store.checkpoints()
        );
        let db = len(&dir.path().join("ac7.db"));
        assert!(
            largest < db,
            "the log ({largest}) is smaller than what it wrote ({db})"
        );
    }

    #[test]
    fn closing_stops_the_thread_and_leaves_one_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        write(&store, 3000);
        store.close().expect("close");
        assert_eq!(store.checkpoints(), None);
        for suffix in ["-wal", "-shm"] {
            let path = dir.path().join(format!("ac7.db{suffix}"));
            assert!(!path.exists(), "{} is gone", path.display());
        }
        drop(store);
        // Everything the commits wrote is in the one file.
        let store = Store::open(&dir.path().join("ac7.db"), SyncMode::Normal).expect("reopen");
        let rows: i64 = store.read(|c| {
            c.query_row("SELECT count(*) FROM scratch", [], |r| r.get(0))
                .expect("count")
        });
        assert_eq!(rows, 3000);
    }

    #[test]
    fn the_hook_asks_once_per_start_frames_finishes_once_and_backstops() {
        let shared = Shared::default();
        let due = |s: &Shared| s.state.lock().expect("lock").due;
        assert_eq!(shared.committed(START_FRAMES - 1), Decision::Nothing);
        assert!(!due(&shared));
        assert_eq!(shared.committed(START_FRAMES), Decision::Nothing);
        assert!(due(&shared));
        // A round covered the log up to here: the next START_FRAMES count from it.
        shared.state.lock().expect("lock").due = false;
        shared.mark.store(START_FRAMES, Ordering::Relaxed);
        shared.committed(2 * START_FRAMES - 1);
        assert!(!due(&shared));
        shared.committed(2 * START_FRAMES);
        assert!(due(&shared));
        // The log started over (it is smaller than the mark): counted from its beginning.
        shared.state.lock().expect("lock").due = false;
        shared.mark.store(5 * START_FRAMES, Ordering::Relaxed);
        shared.committed(START_FRAMES - 1);
        assert!(!due(&shared));
        shared.committed(START_FRAMES);
        assert!(due(&shared));
        // A complete first pass: the next commit, and only it, finishes the round.
        shared.finish.store(true, Ordering::Relaxed);
        assert_eq!(shared.committed(START_FRAMES + 1), Decision::Finish);
        assert_eq!(shared.committed(START_FRAMES + 2), Decision::Nothing);
        assert_eq!(shared.committed(BACKSTOP_FRAMES - 1), Decision::Nothing);
        assert_eq!(shared.committed(BACKSTOP_FRAMES), Decision::Backstop);
    }
}
