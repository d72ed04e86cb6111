//! The file space's store functions ([`ac7_runtime::broker::fs`], [`ac7_runtime::broker::blobs`])
//! on PostgreSQL and on SQLite, through `Store::tx` / `Store::view`: the same answers on both,
//! and on PostgreSQL file contents as ordered chunks in the database (written, read back,
//! deduplicated, dropped with the last entry). Without a PostgreSQL server the tests skip (fail
//! under `CI=true`).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ac7_protocol::domain::vfs::FsPath;
use ac7_runtime::broker::blobs::{self, CHUNK, StagedBlob, Stored};
use ac7_runtime::broker::db::{Store, StoreError};
use ac7_runtime::broker::fs::{self, Collide, FsEntry, FsError};
use ac7_runtime::broker::pg::PgConfig;
use ac7_runtime::broker::store::Conn;
use ac7_runtime::params;
use axum::body::Bytes;
use futures_util::StreamExt;

use crate::common::postgres::TestDb;

fn p(s: &str) -> FsPath {
    FsPath::parse(s).unwrap()
}

/// A PostgreSQL store on a fresh database, or `None` (skipped).
async fn pg_store() -> Option<(TestDb, Store)> {
    let db = TestDb::create().await?;
    let store = Store::open_postgres(PgConfig::parse(&db.url).unwrap()).unwrap();
    Some((db, store))
}

/// `data` staged in `dir` as an upload would be, sent in pieces of 100 000 bytes.
async fn stage(dir: &Path, data: &[u8]) -> StagedBlob {
    let pieces: Vec<Result<Bytes, String>> = data
        .chunks(100_000)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    blobs::stage(
        dir,
        futures_util::stream::iter(pieces),
        u64::MAX,
        Duration::from_secs(5),
        false,
    )
    .await
    .unwrap()
}

/// The whole content of a file, read as the HTTP handler serves it: a blob file or inline bytes
/// on SQLite, on PostgreSQL chunk by chunk, each chunk in a read transaction of its own.
async fn read_back(store: &Arc<Store>, dir: &Path, path: &str) -> Vec<u8> {
    let stored = store
        .tx(|c| {
            let entry = fs::get(c, &p(path))?.unwrap();
            fs::read(c, dir, &entry)
        })
        .unwrap();
    match stored {
        Stored::Inline(bytes) => bytes,
        Stored::File(mut f) => {
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut out).unwrap();
            out
        }
        Stored::Chunks { hash, size } => {
            let s = Arc::clone(store);
            let mut stream = std::pin::pin!(blobs::chunk_stream(size, move |idx| {
                s.view(|c| blobs::chunk(c, &hash, idx))
            }));
            let mut out = Vec::new();
            while let Some(piece) = stream.next().await {
                let piece = piece.unwrap();
                assert!(piece.len() <= CHUNK, "one chunk at a time");
                out.extend_from_slice(&piece);
            }
            assert_eq!(out.len() as u64, size);
            out
        }
    }
}

/// `(refcount, chunk rows)` of blob `hash`; `None` without a row.
fn blob_row(c: &Conn<'_>, hash: &str) -> Result<Option<(i64, i64)>, StoreError> {
    let refcount = c.query_row(
        "SELECT refcount FROM blobs WHERE hash = ?1",
        params![hash],
        |r| r.get::<i64>(0),
    )?;
    let chunks = c
        .query_row(
            "SELECT COUNT(*) FROM blob_chunks WHERE hash = ?1",
            params![hash],
            |r| r.get::<i64>(0),
        )?
        .unwrap_or(0);
    Ok(refcount.map(|r| (r, chunks)))
}

fn grants(c: &Conn<'_>) -> Result<Vec<(String, String, i64)>, StoreError> {
    c.query(
        "SELECT path, member_name, granted_at FROM fs_grants ORDER BY path, member_name",
        params![],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
}

fn err(e: FsError) -> String {
    format!("{} {e}", e.code())
}

/// A realistic sequence over the file space: directories, writes that collide, copies, grants,
/// moves onto a stale grant, listings in order, usage, a member's home archived, removals.
/// Everything it observes, as text.
fn exercise(c: &Conn<'_>) -> Result<Vec<String>, FsError> {
    let mut seen = Vec::new();
    let mut note = |what: &str, v: String| seen.push(format!("{what}: {v}"));
    fs::ensure_dir(c, &p("/ann"), "ann", 1)?;
    fs::ensure_dir(c, &p("/bob"), "bob", 1)?;
    note(
        "mkdir nested",
        format!("{:?}", fs::mkdir(c, &p("/ann/d/e"), true, "ann", 2)?),
    );
    note(
        "mkdir exists",
        fs::mkdir(c, &p("/ann/d"), false, "ann", 2).map_or_else(err, |e| e.path),
    );
    note(
        "mkdir no parent",
        fs::mkdir(c, &p("/ann/x/y"), false, "ann", 2).map_or_else(err, |e| e.path),
    );
    for (i, name) in [
        "b.txt", "B.txt", "a.txt", "_u.txt", "Z", "a b.txt", "10.txt", "9.txt",
    ]
    .iter()
    .enumerate()
    {
        let (e, renamed) = fs::write(
            c,
            &p(&format!("/ann/{name}")),
            name.as_bytes(),
            "text/plain",
            Collide::Error,
            "ann",
            10 + i as i64,
        )?;
        note("write", format!("{e:?} {renamed}"));
    }
    let (e, renamed) = fs::write(
        c,
        &p("/ann/a.txt"),
        b"a.txt",
        "text/plain",
        Collide::Suffix,
        "ann",
        30,
    )?;
    note("suffixed", format!("{e:?} {renamed}"));
    note(
        "collide error",
        fs::write(c, &p("/ann/a.txt"), b"x", "t", Collide::Error, "ann", 31)
            .map_or_else(err, |e| e.0.path),
    );
    note(
        "onto a directory",
        fs::write(c, &p("/ann/d"), b"x", "t", Collide::Overwrite, "ann", 31)
            .map_or_else(err, |e| e.0.path),
    );
    let (e, _) = fs::write(
        c,
        &p("/ann/b.txt"),
        b"new content",
        "text/markdown",
        Collide::Overwrite,
        "ann",
        32,
    )?;
    note("overwrite", format!("{e:?}"));
    let src = fs::get(c, &p("/ann/a.txt"))?.unwrap();
    note(
        "copy",
        format!(
            "{:?}",
            fs::copy(c, &src, &p("/objectives/o1/a.txt"), "ann", 33)?
        ),
    );
    note(
        "copy again",
        format!(
            "{:?}",
            fs::copy(c, &src, &p("/objectives/o1/a.txt"), "bob", 34)?
        ),
    );
    note(
        "children /ann",
        format!("{:?}", fs::children(c, &p("/ann"))?),
    );
    note(
        "children /",
        format!("{:?}", fs::children(c, &FsPath::root())?),
    );
    note("usage ann", fs::usage(c, "ann")?.to_string());
    note("usage bob", fs::usage(c, "bob")?.to_string());
    // An owner that only SQLite's case-blind `LIKE 'obj:%'` took for an objective's.
    c.execute(
        "INSERT INTO fs_entries (path, parent, name, kind, owner, size, mime, hash, created_at, created_by, updated_at)
         VALUES ('/odd/f', '/odd', 'f', 'file', 'OBJ:odd', 5, 't', NULL, 1, 'bob', 1)",
        params![],
    )?;
    note("usage bob (OBJ:)", fs::usage(c, "bob")?.to_string());
    c.execute("DELETE FROM fs_entries WHERE path = '/odd/f'", params![])?;

    fs::grant(c, "/ann/a.txt", "bob", 40)?;
    fs::grant(c, "/ann/a.txt", "bob", 41)?;
    fs::grant(c, "/ann/a.txt", "cy", 42)?;
    fs::grant(c, "/ann/moved.txt", "bob", 5)?; // stale, at the destination of the move
    note(
        "has grant",
        format!(
            "{} {}",
            fs::has_grant(c, &p("/ann/a.txt"), "bob")?,
            fs::has_grant(c, &p("/ann/a.txt"), "dan")?
        ),
    );
    note(
        "shared with bob",
        format!("{:?}", fs::shared_with(c, "bob")?),
    );
    note(
        "move",
        format!(
            "{:?}",
            fs::rename(c, &p("/ann/a.txt"), &p("/ann/moved.txt"), "ann", 50)?
        ),
    );
    note(
        "move a directory",
        fs::rename(c, &p("/ann/d"), &p("/ann/d2"), "ann", 51).map_or_else(err, |e| e.path),
    );
    note(
        "move onto a file",
        fs::rename(c, &p("/ann/Z"), &p("/ann/b.txt"), "ann", 51).map_or_else(err, |e| e.path),
    );
    note("grants after move", format!("{:?}", grants(c)?));
    note("all files", format!("{:?}", fs::all_files(c)?));
    note("blob stats", format!("{:?}", fs::blob_stats(c)?));
    note(
        "remove non-empty",
        fs::remove(c, &p("/ann/d"), false).map_or_else(err, |()| "removed".into()),
    );
    fs::remove(c, &p("/ann/d"), true)?;
    fs::remove(c, &p("/ann/_u.txt"), false)?;
    note("blob stats after rm", format!("{:?}", fs::blob_stats(c)?));

    // Ann leaves: her home moves whole, grants with it; a grant already at the destination
    // for the same member gives way.
    fs::grant(c, "/removed members/ann-7/moved.txt", "bob", 1)?;
    fs::grant(c, "/removed members/ann-7/moved.txt", "eve", 1)?;
    note(
        "archive",
        format!("{:?}", fs::archive_home(c, "ann", 7, "admin", 60)?),
    );
    note(
        "archive without a home",
        format!("{:?}", fs::archive_home(c, "nobody", 8, "admin", 60)?),
    );
    note(
        "children archived",
        format!(
            "{:?}",
            fs::children(c, &p("/removed members/ann-7"))?
                .into_iter()
                .map(|e| (e.path, e.owner))
                .collect::<Vec<_>>()
        ),
    );
    note("grants after archive", format!("{:?}", grants(c)?));
    fs::ensure_dir(c, &p("/ann"), "ann", 70)?;
    note(
        "archive again",
        format!("{:?}", fs::archive_home(c, "ann", 7, "admin", 71)?),
    );
    fs::remove(c, &p("/removed members/ann-7"), true)?;
    fs::remove(c, &p("/objectives/o1"), true)?;
    note("blob stats at the end", format!("{:?}", fs::blob_stats(c)?));
    Ok(seen)
}

#[tokio::test]
async fn fs_store_answers_the_same_on_sqlite_and_postgres() {
    let Some((_db, pg)) = pg_store().await else {
        return;
    };
    let sqlite = Store::open_in_memory().unwrap();
    let on_pg = pg.tx(exercise).unwrap();
    let on_sqlite = sqlite.tx(exercise).unwrap();
    for (a, b) in on_pg.iter().zip(&on_sqlite) {
        assert_eq!(a, b);
    }
    assert_eq!(on_pg.len(), on_sqlite.len());
    assert!(
        on_pg.iter().any(|s| s == "usage bob (OBJ:): 10"),
        "{on_pg:#?}"
    );

    // What is left, read in read-only transactions on both.
    let left = |c: &Conn<'_>| -> Result<_, StoreError> {
        Ok((
            fs::all_files(c)?,
            fs::children(c, &FsPath::root())?,
            fs::children(c, &p("/removed members"))?,
            fs::blob_stats(c)?,
        ))
    };
    let (a, b) = (pg.view(left).unwrap(), sqlite.view(left).unwrap());
    assert_eq!(a, b);
    let archived: Vec<&str> = a.2.iter().map(|e: &FsEntry| e.path.as_str()).collect();
    assert_eq!(archived, ["/removed members/ann-7-1"]);

    // A failed transaction leaves nothing behind.
    for store in [&pg, &sqlite] {
        let r = store.tx(|c| -> Result<(), FsError> {
            fs::write(
                c,
                &p("/bob/gone.txt"),
                b"gone",
                "t",
                Collide::Error,
                "bob",
                1,
            )?;
            Err(FsError::InvalidInput("on purpose".into()))
        });
        assert!(r.is_err());
        assert_eq!(
            store.view(|c| fs::get(c, &p("/bob/gone.txt"))).unwrap(),
            None
        );
    }
    assert_eq!(pg.view(left).unwrap(), sqlite.view(left).unwrap());
}

#[tokio::test]
async fn contents_are_chunked_deduplicated_and_dropped_with_the_last_entry() {
    let Some((_db, pg)) = pg_store().await else {
        return;
    };
    let pg = Arc::new(pg);
    let sqlite = Arc::new(Store::open_in_memory().unwrap());
    let big: Vec<u8> = (0..600 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    let big_hash = ac7_runtime::broker::tokens::sha256_hex(&big);
    let empty_hash = ac7_runtime::broker::tokens::sha256_hex(b"");
    let mut answers = Vec::new();
    for store in [&pg, &sqlite] {
        let dir = tempfile::tempdir().unwrap();
        let mut seen = Vec::new();
        let write = |path: &'static str, staged: &StagedBlob, collide: Collide| {
            store.tx(|c| {
                fs::ensure_dir(c, &p("/ann"), "ann", 1)?;
                fs::write_staged(
                    c,
                    &p(path),
                    staged,
                    "application/octet-stream",
                    collide,
                    "ann",
                    2,
                )
            })
        };
        // A multi-chunk upload and an empty one.
        let staged = stage(dir.path(), &big).await;
        assert_eq!(staged.hash, big_hash);
        let (e, _) = write("/ann/big.bin", &staged, Collide::Error).unwrap();
        seen.push(format!("{e:?}"));
        drop(staged);
        let staged = stage(dir.path(), b"").await;
        let (e, _) = write("/ann/empty", &staged, Collide::Error).unwrap();
        seen.push(format!("{e:?}"));
        drop(staged);
        assert_eq!(read_back(store, dir.path(), "/ann/big.bin").await, big);
        assert_eq!(read_back(store, dir.path(), "/ann/empty").await, b"");
        // The same content again: one blob, two references.
        let staged = stage(dir.path(), &big).await;
        let (e, _) = write("/ann/same.bin", &staged, Collide::Error).unwrap();
        seen.push(format!("{e:?}"));
        drop(staged);
        seen.push(format!("{:?}", store.view(fs::blob_stats).unwrap()));
        assert_eq!(read_back(store, dir.path(), "/ann/same.bin").await, big);
        // A write that fails after storing its content leaves nothing of it.
        let other = stage(dir.path(), b"never stored").await;
        let r = store.tx(|c| -> Result<(), FsError> {
            fs::write_staged(c, &p("/ann/no.bin"), &other, "t", Collide::Error, "ann", 3)?;
            Err(FsError::InvalidInput("on purpose".into()))
        });
        assert!(r.is_err());
        seen.push(format!("{:?}", store.view(fs::blob_stats).unwrap()));
        drop(other);
        // Delete one entry, then the other.
        store
            .tx(|c| fs::remove(c, &p("/ann/big.bin"), false))
            .unwrap();
        seen.push(format!("{:?}", store.view(fs::blob_stats).unwrap()));
        assert_eq!(read_back(store, dir.path(), "/ann/same.bin").await, big);
        store
            .tx(|c| fs::remove(c, &p("/ann/same.bin"), false))
            .unwrap();
        seen.push(format!("{:?}", store.view(fs::blob_stats).unwrap()));
        // Overwriting drops the replaced content.
        let staged = stage(dir.path(), b"two").await;
        write("/ann/empty", &staged, Collide::Overwrite).unwrap();
        drop(staged);
        seen.push(format!("{:?}", store.view(fs::blob_stats).unwrap()));
        assert_eq!(read_back(store, dir.path(), "/ann/empty").await, b"two");
        store.tx(|c| blobs::empty_trash(c, dir.path())).unwrap();
        answers.push(seen);

        if Arc::ptr_eq(store, &pg) {
            // Chunks: the big blob's are gone with its last entry, and so is the empty one's row.
            let rows = pg
                .view(|c| Ok::<_, StoreError>((blob_row(c, &big_hash)?, blob_row(c, &empty_hash)?)))
                .unwrap();
            assert_eq!(rows, (None, None));
            let chunks = pg
                .view(|c| {
                    c.query_row("SELECT COUNT(*) FROM blob_chunks", params![], |r| {
                        r.get::<i64>(0)
                    })
                })
                .unwrap();
            assert_eq!(chunks, Some(1), "only the chunk of \"two\" is left");
        }
    }
    assert_eq!(answers[0], answers[1]);
}

#[tokio::test]
async fn chunks_are_written_once_and_counted_on_postgres() {
    let Some((_db, pg)) = pg_store().await else {
        return;
    };
    let pg = Arc::new(pg);
    let dir = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..600 * 1024u32).map(|i| (i % 253) as u8).collect();
    let hash = ac7_runtime::broker::tokens::sha256_hex(&big);
    let staged = stage(dir.path(), &big).await;
    pg.tx(|c| {
        fs::ensure_dir(c, &p("/ann"), "ann", 1)?;
        fs::write_staged(c, &p("/ann/1.bin"), &staged, "t", Collide::Error, "ann", 2)
    })
    .unwrap();
    // 600 KiB in chunks of 256 KiB: 256 + 256 + 88.
    let sizes = pg
        .view(|c| {
            c.query(
                "SELECT idx, length(data) FROM blob_chunks WHERE hash = ?1 ORDER BY idx",
                params![hash],
                |r| Ok((r.get::<i64>(0)?, r.get::<i64>(1)?)),
            )
        })
        .unwrap();
    assert_eq!(sizes, [(0, 262_144), (1, 262_144), (2, 90_112)]);
    assert_eq!(pg.view(|c| blob_row(c, &hash)).unwrap(), Some((1, 3)));

    // Two replicas storing the same new content at once: the second waits for the first and
    // counts itself in; the chunks are written once.
    let gate = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        for (i, pause) in [(2, 300u64), (3, 0)] {
            let (pg, staged, gate) = (&pg, &staged, &gate);
            s.spawn(move || {
                pg.tx(|c| {
                    c.execute("SELECT 1", params![])?;
                    gate.wait();
                    if pause == 0 {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    let r = fs::write_staged(
                        c,
                        &p(&format!("/ann/{i}.bin")),
                        staged,
                        "t",
                        Collide::Error,
                        "ann",
                        3,
                    )?;
                    std::thread::sleep(Duration::from_millis(pause));
                    Ok::<_, FsError>(r)
                })
                .unwrap();
            });
        }
    });
    assert_eq!(pg.view(|c| blob_row(c, &hash)).unwrap(), Some((3, 3)));
    // Now a blob nobody had, from two transactions at once.
    let fresh: Vec<u8> = big.iter().rev().copied().collect();
    let fresh_hash = ac7_runtime::broker::tokens::sha256_hex(&fresh);
    let staged = stage(dir.path(), &fresh).await;
    std::thread::scope(|s| {
        for (i, pause) in [(4, 300u64), (5, 0)] {
            let (pg, staged, gate) = (&pg, &staged, &gate);
            s.spawn(move || {
                pg.tx(|c| {
                    c.execute("SELECT 1", params![])?;
                    gate.wait();
                    if pause == 0 {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    let r = fs::write_staged(
                        c,
                        &p(&format!("/ann/{i}.bin")),
                        staged,
                        "t",
                        Collide::Error,
                        "ann",
                        3,
                    )?;
                    std::thread::sleep(Duration::from_millis(pause));
                    Ok::<_, FsError>(r)
                })
                .unwrap();
            });
        }
    });
    assert_eq!(pg.view(|c| blob_row(c, &fresh_hash)).unwrap(), Some((2, 3)));
    assert_eq!(read_back(&pg, dir.path(), "/ann/5.bin").await, fresh);

    // Recovery and the trash have nothing to do on PostgreSQL: a file in the temp directory
    // (another replica's upload, perhaps) stays.
    let other = stage(dir.path(), b"in flight").await;
    let in_tmp = || std::fs::read_dir(dir.path().join("tmp")).unwrap().count();
    let before = in_tmp();
    assert!(before > 0);
    pg.tx(|c| blobs::recover(c, dir.path())).unwrap();
    assert_eq!(pg.tx(|c| blobs::empty_trash(c, dir.path())).unwrap(), 0);
    assert_eq!(in_tmp(), before);
    drop(other);
    for i in 1..=5 {
        pg.tx(|c| fs::remove(c, &p(&format!("/ann/{i}.bin")), false))
            .unwrap();
    }
    assert_eq!(pg.view(fs::blob_stats).unwrap(), (0, 0));
    let chunks = pg
        .view(|c| {
            c.query_row("SELECT COUNT(*) FROM blob_chunks", params![], |r| {
                r.get::<i64>(0)
            })
        })
        .unwrap();
    assert_eq!(chunks, Some(0));
}
