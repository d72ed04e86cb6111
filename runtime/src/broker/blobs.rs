//! File contents: one interface ([`add_ref`], [`unref`], [`open`], [`empty_trash`],
//! [`recover`]) over the two places they live, chosen by the connection's backend.
//!
//! Either way an upload is first streamed into `tmp/<random>` under the blob directory while
//! it is hashed and counted ([`stage`]), so the broker never holds a whole file in memory; a
//! staged file is removed when the [`StagedBlob`] is dropped. The `blobs` table keeps each
//! blob's size and reference count, changed in the transaction that changes the entry.
//!
//! **SQLite**: contents are files in the blob directory `<db>-blobs/` beside the database.
//! When the entry is committed, a blob that is new to the store is renamed to its content
//! address `<aa>/<sha256>` ([`StagedBlob::publish`]); a blob the store already has is dropped.
//! `tmp/` is emptied at start too. When the last entry goes, the row is deleted and the hash
//! is put in `blob_trash` in the same transaction; [`empty_trash`] (after such commits, and at
//! start) unlinks the files of trashed hashes that no row references again. Databases written
//! before the blob directory existed keep their contents in the `data` column of `blobs`;
//! those are still read from there ([`Stored::Inline`]).
//!
//! **PostgreSQL**: replicas share no disk, so contents are rows of `blob_chunks`: the bytes in
//! order, [`CHUNK`] bytes a row (the last one shorter; an empty blob has none). A new blob's
//! chunks are inserted, from the staged file one chunk at a time, in the transaction that
//! creates its entry; the chunks are deleted in the transaction that drops the last reference.
//! Reading fetches one chunk at a time ([`chunk`], [`chunk_stream`]). There is no trash and
//! nothing on disk to recover.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use futures_util::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::db::{Store, StoreError};
use super::store::{Backend, Conn};
use crate::params;

/// Bytes per row of `blob_chunks` (PostgreSQL).
pub const CHUNK: usize = 256 * 1024;

/// Where the blob with `hash` lives in `dir`.
pub fn blob_path(dir: &Path, hash: &str) -> PathBuf {
    dir.join(hash.get(..2).unwrap_or("xx")).join(hash)
}

fn tmp_dir(dir: &Path) -> PathBuf {
    dir.join("tmp")
}

/// An upload written to `tmp/`, hashed, not yet in the store.
#[derive(Debug)]
pub struct StagedBlob {
    temp: PathBuf,
    dir: PathBuf,
    /// SHA-256 hex of the content.
    pub hash: String,
    /// Bytes.
    pub size: u64,
    published: AtomicBool,
}

impl StagedBlob {
    /// Moves the content to its address (keeping a file already there, which has
    /// the same content). Returns whether this call created the file.
    pub fn publish(&self) -> io::Result<bool> {
        let dest = blob_path(&self.dir, &self.hash);
        if dest.exists() {
            return Ok(false);
        }
        if let Some(parent) = dest.parent() {
            std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
                .create(parent)?;
        }
        fs::rename(&self.temp, &dest)?;
        self.published.store(true, Ordering::Relaxed);
        Ok(true)
    }

    /// Undoes [`StagedBlob::publish`] (the commit that referenced it failed).
    pub fn unpublish(&self) {
        if self.published.swap(false, Ordering::Relaxed) {
            let _ = fs::remove_file(blob_path(&self.dir, &self.hash));
        }
    }
}

impl Drop for StagedBlob {
    fn drop(&mut self) {
        if !self.published.load(Ordering::Relaxed) {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

/// Why an upload could not be staged.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// The body is larger than the cap.
    #[error("file is larger than {limit} bytes")]
    TooLarge {
        /// The cap.
        limit: u64,
    },
    /// No data arrived for [`StageError::Idle`]'s duration.
    #[error("no data received for {} s", .0.as_secs())]
    Idle(Duration),
    /// The client's body broke off.
    #[error("could not read request body: {0}")]
    Body(String),
    /// Writing the temp file failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Removes a temp file unless it was handed over.
struct TempGuard(Option<PathBuf>);

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

/// Streams `body` into a temp file in `dir`, hashing it; refuses more than
/// `limit` bytes, and a body that sends nothing for `idle`. With `sync`, the
/// file is fsynced before it is handed over.
pub async fn stage<S, E>(
    dir: &Path,
    body: S,
    limit: u64,
    idle: Duration,
    sync: bool,
) -> Result<StagedBlob, StageError>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: std::fmt::Display,
{
    let io_err = |what: &str, source: io::Error| StoreError::File {
        what: what.to_owned(),
        source,
    };
    let tmp = tmp_dir(dir);
    tokio::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&tmp)
        .await
        .map_err(|e| io_err("cannot create the blob temp directory", e))?;
    let mut nonce = [0u8; 12];
    getrandom::fill(&mut nonce).map_err(|e| io_err("no entropy", io::Error::other(e)))?;
    let name: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    let temp = tmp.join(name);
    let mut guard = TempGuard(Some(temp.clone()));
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .await
        .map_err(|e| io_err("cannot create a blob temp file", e))?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut body = std::pin::pin!(body);
    loop {
        let chunk = match tokio::time::timeout(idle, body.next()).await {
            Err(_) => return Err(StageError::Idle(idle)),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(StageError::Body(e.to_string())),
            Ok(Some(Ok(c))) => c,
        };
        size += chunk.len() as u64;
        if size > limit {
            return Err(StageError::TooLarge { limit });
        }
        hasher.update(&chunk);
        file.write_all(&chunk)
            .await
            .map_err(|e| io_err("cannot write a blob", e))?;
    }
    file.flush()
        .await
        .map_err(|e| io_err("cannot write a blob", e))?;
    if sync {
        file.sync_all()
            .await
            .map_err(|e| io_err("cannot sync a blob", e))?;
    }
    drop(file);
    guard.0 = None;
    Ok(StagedBlob {
        temp,
        dir: dir.to_owned(),
        hash: hex(&hasher.finalize()),
        size,
        published: AtomicBool::new(false),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where the content of a new reference comes from.
#[derive(Debug, Clone, Copy)]
pub enum Content<'a> {
    /// Bytes in memory (on SQLite kept in the blob's row).
    Inline(&'a [u8]),
    /// A blob the store already holds (a copy).
    Shared,
    /// An upload staged in the blob directory.
    Staged(&'a StagedBlob),
}

/// Adds a reference to blob `hash` (an entry now points at it), storing the content from
/// `content` if the blob is new to the store: on SQLite by publishing the staged file (call
/// [`StagedBlob::unpublish`] if the transaction then fails), on PostgreSQL as chunks in this
/// transaction. `false` for [`Content::Shared`] when the store has no such blob.
pub fn add_ref(c: &Conn<'_>, hash: &str, content: Content<'_>) -> Result<bool, StoreError> {
    match (content, c.backend()) {
        (Content::Shared, _) => Ok(c.execute(
            "UPDATE blobs SET refcount = refcount + 1 WHERE hash = ?1",
            params![hash],
        )? == 1),
        (Content::Inline(data), Backend::Sqlite) => {
            c.execute(
                "INSERT INTO blobs (hash, size, refcount, data) VALUES (?1, ?2, 1, ?3)
                 ON CONFLICT(hash) DO UPDATE SET refcount = refcount + 1",
                params![hash, data.len() as i64, data],
            )?;
            Ok(true)
        }
        (Content::Staged(staged), Backend::Sqlite) => {
            let n = c.execute(
                "UPDATE blobs SET refcount = refcount + 1 WHERE hash = ?1",
                params![hash],
            )?;
            if n == 0 {
                staged.publish().map_err(|source| StoreError::File {
                    what: "cannot store a blob".into(),
                    source,
                })?;
                c.execute(
                    "INSERT INTO blobs (hash, size, refcount, data) VALUES (?1, ?2, 1, x'')",
                    params![hash, staged.size as i64],
                )?;
            }
            Ok(true)
        }
        (Content::Inline(data), Backend::Postgres) => {
            if pg_ref(c, hash, data.len() as u64)? {
                store_chunks(c, hash, data, data.len() as u64)?;
            }
            Ok(true)
        }
        (Content::Staged(staged), Backend::Postgres) => {
            if pg_ref(c, hash, staged.size)? {
                let file = fs::File::open(&staged.temp).map_err(|source| StoreError::File {
                    what: "cannot read a staged upload".into(),
                    source,
                })?;
                store_chunks(c, hash, file, staged.size)?;
            }
            Ok(true)
        }
    }
}

/// PostgreSQL: adds a reference to blob `hash`, creating its row (one statement, so replicas
/// storing the same new content at once agree: the second waits for the first and counts
/// itself in). Whether this call created the row, and so must store the chunks.
fn pg_ref(c: &Conn<'_>, hash: &str, size: u64) -> Result<bool, StoreError> {
    let refcount = c
        .query_row(
            "INSERT INTO blobs (hash, size, refcount) VALUES (?1, ?2, 1)
             ON CONFLICT (hash) DO UPDATE SET refcount = blobs.refcount + 1
             RETURNING refcount",
            params![hash, size],
            |r| r.get::<i64>(0),
        )?
        .ok_or_else(|| StoreError::Corrupt(format!("no row for blob {hash} after upsert")))?;
    Ok(refcount == 1)
}

/// PostgreSQL: stores the `size` bytes read from `src` as the chunks of blob `hash`, one
/// chunk in memory at a time. Chunks left by anything else under that hash are replaced. The
/// one chunk writer: uploads, and the copy of a SQLite team's contents (`ac7 migrate`).
pub(super) fn store_chunks(
    c: &Conn<'_>,
    hash: &str,
    mut src: impl Read,
    size: u64,
) -> Result<(), StoreError> {
    let read_err = |source| StoreError::File {
        what: format!("cannot read the content of blob {hash}"),
        source,
    };
    c.execute("DELETE FROM blob_chunks WHERE hash = ?1", params![hash])?;
    let mut buf = vec![0u8; CHUNK];
    let mut idx = 0i64;
    let mut total = 0u64;
    loop {
        let n = fill(&mut src, &mut buf).map_err(read_err)?;
        if n == 0 {
            break;
        }
        c.execute(
            "INSERT INTO blob_chunks (hash, idx, data) VALUES (?1, ?2, ?3)",
            params![hash, idx, &buf[..n]],
        )?;
        idx += 1;
        total += n as u64;
        if n < CHUNK {
            break;
        }
    }
    if total != size {
        return Err(StoreError::Corrupt(format!(
            "blob {hash}: expected {size} bytes, read {total}"
        )));
    }
    Ok(())
}

/// Reads into `buf` until it is full or `src` ends; the bytes read.
fn fill(src: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match src.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Drops a reference to blob `hash` (after the entry stops pointing at it). With the last one
/// the row goes, in this transaction; on SQLite the hash goes to the trash (the file is
/// unlinked after the commit, by [`empty_trash`]), on PostgreSQL the chunks go with the row.
pub fn unref(c: &Conn<'_>, hash: &str) -> Result<(), StoreError> {
    c.execute(
        "UPDATE blobs SET refcount = refcount - 1 WHERE hash = ?1",
        params![hash],
    )?;
    let gone = c.execute(
        "DELETE FROM blobs WHERE hash = ?1 AND refcount <= 0",
        params![hash],
    )?;
    if gone > 0 {
        match c.backend() {
            Backend::Sqlite => {
                c.execute(
                    "INSERT INTO blob_trash (hash) VALUES (?1) ON CONFLICT (hash) DO NOTHING",
                    params![hash],
                )?;
            }
            Backend::Postgres => {
                c.execute("DELETE FROM blob_chunks WHERE hash = ?1", params![hash])?;
            }
        }
    }
    Ok(())
}

/// Where a file's content is.
#[derive(Debug)]
pub enum Stored {
    /// In the database row (SQLite databases from before the blob directory, and empty files).
    Inline(Vec<u8>),
    /// An open handle on the blob file (opened under the store's write lock, so a concurrent
    /// delete cannot take it away mid-read).
    File(fs::File),
    /// Chunks in the database (PostgreSQL): [`chunk`] by [`chunk`], through [`chunk_stream`].
    Chunks {
        /// The blob.
        hash: String,
        /// Its bytes.
        size: u64,
    },
}

/// Opens the content of blob `hash`; `None` if the store has no such blob.
pub fn open(c: &Conn<'_>, dir: &Path, hash: &str) -> Result<Option<Stored>, StoreError> {
    if c.backend() == Backend::Postgres {
        return Ok(c
            .query_row(
                "SELECT size FROM blobs WHERE hash = ?1",
                params![hash],
                |r| r.get::<u64>(0),
            )?
            .map(|size| Stored::Chunks {
                hash: hash.to_owned(),
                size,
            }));
    }
    let row = c.query_row(
        "SELECT CASE WHEN length(data) > 0 OR size = 0 THEN data END FROM blobs WHERE hash = ?1",
        params![hash],
        |r| r.get::<Option<Vec<u8>>>(0),
    )?;
    match row {
        None => Ok(None),
        Some(Some(data)) => Ok(Some(Stored::Inline(data))),
        Some(None) => {
            let path = blob_path(dir, hash);
            match fs::File::open(&path) {
                Ok(f) => Ok(Some(Stored::File(f))),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(StoreError::File {
                    what: format!("cannot open {}", path.display()),
                    source,
                }),
            }
        }
    }
}

/// Chunk `idx` (from 0) of blob `hash` (PostgreSQL); `None` if there is none (past the end,
/// or the blob is gone).
pub fn chunk(c: &Conn<'_>, hash: &str, idx: i64) -> Result<Option<Vec<u8>>, StoreError> {
    c.query_row(
        "SELECT data FROM blob_chunks WHERE hash = ?1 AND idx = ?2",
        params![hash, idx],
        |r| r.get::<Vec<u8>>(0),
    )
}

/// The `size` bytes of a chunked blob as a stream, one chunk fetched (by `fetch(idx)`, each in
/// a short read transaction of its own) per item, so a read holds one chunk in memory and no
/// connection between chunks. A missing chunk (the blob was deleted mid-read) or a store error
/// ends the stream with an error: the client sees a short body against its `Content-Length`.
/// Chunks are content-addressed, so whatever is read is the right content.
pub fn chunk_stream<F>(size: u64, fetch: F) -> impl Stream<Item = io::Result<Bytes>> + Send
where
    F: FnMut(i64) -> Result<Option<Vec<u8>>, StoreError> + Send + 'static,
{
    futures_util::stream::unfold(Some((fetch, 0i64, 0u64)), move |state| async move {
        let (mut fetch, idx, sent) = state?;
        if sent >= size {
            return None;
        }
        match fetch(idx) {
            Ok(Some(data)) if !data.is_empty() => {
                let sent = sent + data.len() as u64;
                Some((Ok(Bytes::from(data)), Some((fetch, idx + 1, sent))))
            }
            Ok(_) => Some((
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("blob content ends after {sent} of {size} bytes"),
                )),
                None,
            )),
            Err(e) => Some((Err(io::Error::other(e.to_string())), None)),
        }
    })
}

/// Whether the store has a row for blob `hash`.
fn has_row(c: &Conn<'_>, hash: &str) -> Result<bool, StoreError> {
    c.exists("SELECT 1 FROM blobs WHERE hash = ?1", params![hash])
}

/// SQLite: unlinks the files of trashed blobs no row references any more. Runs under the
/// store's write lock (so no upload publishes the same hash meanwhile). PostgreSQL has no
/// trash (chunks go with their row): 0.
pub fn empty_trash(c: &Conn<'_>, dir: &Path) -> Result<usize, StoreError> {
    if c.backend() == Backend::Postgres {
        return Ok(0);
    }
    let hashes = c.query("SELECT hash FROM blob_trash", params![], |r| {
        r.get::<String>(0)
    })?;
    let mut removed = 0;
    for hash in hashes {
        if !has_row(c, &hash)? {
            match fs::remove_file(blob_path(dir, &hash)) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(%hash, error = %e, "cannot remove a deleted blob; will retry");
                    continue;
                }
            }
        }
        c.execute("DELETE FROM blob_trash WHERE hash = ?1", params![hash])?;
    }
    Ok(removed)
}

/// [`empty_trash`] in a transaction of its own, after a commit that may have trashed blobs.
/// On PostgreSQL there is nothing to do, and no transaction is opened.
pub fn empty_trash_after(store: &Store, dir: &Path) -> Result<usize, StoreError> {
    match store.backend() {
        Backend::Sqlite => store.tx(|c| empty_trash(c, dir)),
        Backend::Postgres => Ok(0),
    }
}

/// At start (no upload is in flight), on SQLite: removes temp files left by a crash, blob
/// files no row references (published just before a crash that lost the commit), and empties
/// the trash. On PostgreSQL nothing: contents are in the database, committed with their
/// entries, and the temp directory may be another replica's.
pub fn recover(c: &Conn<'_>, dir: &Path) -> Result<(), StoreError> {
    if c.backend() == Backend::Postgres {
        return Ok(());
    }
    if let Ok(entries) = fs::read_dir(tmp_dir(dir)) {
        for e in entries.flatten() {
            let _ = fs::remove_file(e.path());
        }
    }
    let shards = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().len() == 2 && e.path().is_dir());
    for shard in shards {
        for file in fs::read_dir(shard.path()).into_iter().flatten().flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            if !has_row(c, &name)? {
                tracing::info!(blob = %name, "removing an unreferenced blob file");
                let _ = fs::remove_file(file.path());
            }
        }
    }
    empty_trash(c, dir)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(parts: &[&'static [u8]]) -> impl Stream<Item = Result<Bytes, String>> {
        futures_util::stream::iter(
            parts
                .iter()
                .map(|p| Ok(Bytes::from_static(p)))
                .collect::<Vec<_>>(),
        )
    }

    fn files_in(dir: &Path) -> usize {
        walk(dir)
    }

    fn walk(dir: &Path) -> usize {
        fs::read_dir(dir).map_or(0, |rd| {
            rd.flatten()
                .map(|e| {
                    if e.path().is_dir() {
                        walk(&e.path())
                    } else {
                        1
                    }
                })
                .sum()
        })
    }

    #[tokio::test]
    async fn staging_hashes_caps_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let idle = Duration::from_secs(5);
        let s = stage(dir.path(), chunks(&[b"hello ", b"world"]), 11, idle, false)
            .await
            .unwrap();
        assert_eq!(s.size, 11);
        assert_eq!(s.hash, crate::broker::tokens::sha256_hex(b"hello world"));
        assert_eq!(files_in(dir.path()), 1);
        drop(s);
        assert_eq!(files_in(dir.path()), 0, "an unpublished blob is removed");

        let err = stage(dir.path(), chunks(&[b"hello ", b"world!"]), 11, idle, true)
            .await
            .unwrap_err();
        assert!(matches!(err, StageError::TooLarge { limit: 11 }));
        assert_eq!(files_in(dir.path()), 0, "nothing left after a refused body");

        let broken = futures_util::stream::iter(vec![
            Ok(Bytes::from_static(b"part")),
            Err("connection reset".to_owned()),
        ]);
        let err = stage(dir.path(), broken, 100, idle, false)
            .await
            .unwrap_err();
        assert!(matches!(err, StageError::Body(_)));
        assert_eq!(files_in(dir.path()), 0, "nothing left after a broken body");

        let s = stage(dir.path(), chunks(&[b"x"]), 1, idle, false)
            .await
            .unwrap();
        assert!(s.publish().unwrap());
        let again = stage(dir.path(), chunks(&[b"x"]), 1, idle, false)
            .await
            .unwrap();
        assert!(!again.publish().unwrap(), "same content: the file is kept");
        drop(again);
        drop(s);
        assert_eq!(
            fs::read(blob_path(
                dir.path(),
                &crate::broker::tokens::sha256_hex(b"x")
            ))
            .unwrap(),
            b"x"
        );
        assert_eq!(files_in(dir.path()), 1);
    }

    #[tokio::test]
    async fn recovery_removes_temp_and_unreferenced_files() {
        let dir = tempfile::tempdir().unwrap();
        let idle = Duration::from_secs(5);
        let store = Store::open_in_memory().unwrap();
        let kept = stage(dir.path(), chunks(&[b"kept"]), 10, idle, false)
            .await
            .unwrap();
        kept.publish().unwrap();
        let orphan = stage(dir.path(), chunks(&[b"orphan"]), 10, idle, false)
            .await
            .unwrap();
        orphan.publish().unwrap();
        let temp = stage(dir.path(), chunks(&[b"temp"]), 10, idle, false)
            .await
            .unwrap();
        std::mem::forget(temp); // as if the process died mid-request
        assert_eq!(files_in(dir.path()), 3);
        store
            .tx(|c| {
                c.execute(
                    "INSERT INTO blobs (hash, size, refcount, data) VALUES (?1, 4, 1, x'')",
                    params![kept.hash],
                )?;
                recover(c, dir.path())
            })
            .unwrap();
        assert_eq!(files_in(dir.path()), 1);
        assert!(blob_path(dir.path(), &kept.hash).exists());
    }

    #[tokio::test]
    async fn an_idle_body_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let stalled = futures_util::stream::pending::<Result<Bytes, String>>();
        let err = stage(dir.path(), stalled, 100, Duration::from_millis(20), false)
            .await
            .unwrap_err();
        assert!(matches!(err, StageError::Idle(_)));
        assert_eq!(files_in(dir.path()), 0);
    }
}
