//! File contents on disk: the blob directory `<db>-blobs/` beside the database.
//!
//! An upload is streamed into `tmp/<random>` while it is hashed and counted
//! ([`stage`]), so the broker never holds a whole file in memory. When the
//! entry is committed, a blob that is new to the store is renamed to its content
//! address `<aa>/<sha256>` ([`StagedBlob::publish`]); a blob the store already
//! has is dropped. A staged file that is never published (the client went away,
//! the body was too large, the commit failed) is removed when the [`StagedBlob`]
//! is dropped; `tmp/` is emptied at start too.
//!
//! The `blobs` table keeps each blob's size and reference count. When the last
//! entry goes, its row is deleted and the hash is put in `blob_trash` in the same
//! transaction; [`empty_trash`] (after such commits, and at start) unlinks the
//! files of trashed hashes that no row references again.
//!
//! Databases written before the blob directory existed keep their contents in
//! the `data` column of `blobs`; those are still read from there ([`Stored`]).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use futures_util::{Stream, StreamExt};
use rusqlite::{Connection, OptionalExtension};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::db::StoreError;

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

/// Where a file's content is.
#[derive(Debug)]
pub enum Stored {
    /// In the database row (databases from before the blob directory, and empty files).
    Inline(Vec<u8>),
    /// An open handle on the blob file (opened under the store lock, so a
    /// concurrent delete cannot take it away mid-read).
    File(fs::File),
}

/// Opens the content of blob `hash`; `None` if the store has no such blob.
pub fn open(conn: &Connection, dir: &Path, hash: &str) -> Result<Option<Stored>, StoreError> {
    let row: Option<Option<Vec<u8>>> = conn
        .prepare_cached(
            "SELECT CASE WHEN length(data) > 0 OR size = 0 THEN data END FROM blobs WHERE hash = ?1",
        )?
        .query_row([hash], |r| r.get(0))
        .optional()?;
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

/// Whether the store has a row for blob `hash`.
fn has_row(conn: &Connection, hash: &str) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM blobs WHERE hash = ?1")?
        .query_row([hash], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Unlinks the files of trashed blobs no row references any more. Runs under
/// the store lock (so no upload publishes the same hash meanwhile).
pub fn empty_trash(conn: &Connection, dir: &Path) -> Result<usize, StoreError> {
    let hashes: Vec<String> = conn
        .prepare_cached("SELECT hash FROM blob_trash")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut removed = 0;
    for hash in hashes {
        if !has_row(conn, &hash)? {
            match fs::remove_file(blob_path(dir, &hash)) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(%hash, error = %e, "cannot remove a deleted blob; will retry");
                    continue;
                }
            }
        }
        conn.prepare_cached("DELETE FROM blob_trash WHERE hash = ?1")?
            .execute([&hash])?;
    }
    Ok(removed)
}

/// At start (no upload is in flight): removes temp files left by a crash, blob
/// files no row references (published just before a crash that lost the
/// commit), and empties the trash.
pub fn recover(conn: &Connection, dir: &Path) -> Result<(), StoreError> {
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
            if !has_row(conn, &name)? {
                tracing::info!(blob = %name, "removing an unreferenced blob file");
                let _ = fs::remove_file(file.path());
            }
        }
    }
    empty_trash(conn, dir)?;
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
        let store = crate::broker::db::Store::open_in_memory().unwrap();
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
        store.with(|conn| {
            conn.execute(
                "INSERT INTO blobs (hash, size, refcount, data) VALUES (?1, 4, 1, x'')",
                [&kept.hash],
            )
            .unwrap();
            recover(conn, dir.path()).unwrap();
        });
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
