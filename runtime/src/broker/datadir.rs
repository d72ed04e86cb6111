//! The broker's files on disk: the SQLite database (with its `-wal`/`-shm`
//! companions) and the blob directory beside it, kept private to the user who runs
//! the broker.
//!
//! - The database file is created with mode 0600 (SQLite gives the WAL and SHM
//!   files the database file's mode), and an existing one with a wider mode is
//!   narrowed to 0600 when opened.
//! - The blob directory `<db>-blobs/` is created 0700.
//! - `ac7 serve` refuses a data directory (the directory holding the database)
//!   that is group- or world-writable: anyone who can write there can replace the
//!   database or its WAL.
//! - A start that fails removes the files it created ([`CreatedFiles`]).

use std::fs::{self, DirBuilder, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why the data directory was refused.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// The directory is writable by others.
    #[error(
        "the data directory {dir} is writable by other users (mode {mode:04o}): anyone who can write there can replace the database. Run `chmod go-w {dir}`, or pass a --db in a private directory"
    )]
    Unsafe {
        /// The directory.
        dir: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The directory does not exist.
    #[error(
        "the data directory {dir} does not exist: create it first (`mkdir -m 700 -p {dir}`), or pass a --db in an existing directory"
    )]
    Missing {
        /// The directory.
        dir: String,
    },
    /// The directory cannot be inspected.
    #[error("cannot use the data directory {dir}: {source}")]
    Io {
        /// The directory.
        dir: String,
        /// What failed.
        source: io::Error,
    },
}

/// The directory holding `db` (`.` for a bare file name).
pub fn data_dir(db: &Path) -> PathBuf {
    match db.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Where the blobs of the database `db` live: `<db>-blobs/` beside it.
pub fn blob_dir(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push("-blobs");
    data_dir(db).join(name)
}

/// The SQLite companion files of `db` (`-wal`, `-shm`, `-journal`).
fn companions(db: &Path) -> [PathBuf; 3] {
    ["-wal", "-shm", "-journal"].map(|suffix| {
        let mut name = db.as_os_str().to_os_string();
        name.push(suffix);
        PathBuf::from(name)
    })
}

/// Refuses a group- or world-writable data directory.
pub fn check_data_dir(db: &Path) -> Result<(), DataDirError> {
    let dir = data_dir(db);
    let meta = fs::metadata(&dir).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => DataDirError::Missing {
            dir: dir.display().to_string(),
        },
        _ => DataDirError::Io {
            dir: dir.display().to_string(),
            source,
        },
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(DataDirError::Unsafe {
            dir: dir.display().to_string(),
            mode,
        });
    }
    Ok(())
}

/// Creates the database file 0600 if it is missing, and narrows an existing
/// database (and its companions) to 0600.
pub fn prepare_db_file(db: &Path) -> io::Result<()> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(db)
    {
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    for path in std::iter::once(db.to_owned()).chain(companions(db)) {
        narrow(&path, 0o600)?;
    }
    Ok(())
}

/// Creates the blob directory 0700 (narrowing an existing one) and returns it.
pub fn prepare_blob_dir(db: &Path) -> io::Result<PathBuf> {
    let dir = blob_dir(db);
    match DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => narrow(&dir, 0o700)?,
        Err(e) => return Err(e),
    }
    Ok(dir)
}

/// Sets `path` to `mode` if it has bits outside it; a missing path is fine.
fn narrow(path: &Path, mode: u32) -> io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let have = meta.permissions().mode() & 0o7777;
    if meta.file_type().is_symlink() || have & !mode == 0 {
        return Ok(());
    }
    tracing::info!(path = %path.display(), from = format!("{have:04o}"), to = format!("{mode:04o}"), "narrowing file mode");
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// The files a start is about to create for `db`; [`CreatedFiles::remove`] deletes
/// them again when the start fails. A database that existed before is never
/// touched (nor its WAL, which may hold its latest commits); only an empty blob
/// directory made by this start is removed then.
#[derive(Debug)]
pub struct CreatedFiles {
    db_is_new: bool,
    db: PathBuf,
    blob_dir: Option<PathBuf>,
}

impl CreatedFiles {
    /// Notes which of `db`'s files do not exist yet.
    pub fn before_start(db: &Path) -> CreatedFiles {
        let blobs = blob_dir(db);
        CreatedFiles {
            db_is_new: fs::symlink_metadata(db).is_err(),
            db: db.to_owned(),
            blob_dir: fs::symlink_metadata(&blobs).is_err().then_some(blobs),
        }
    }

    /// Removes what the failed start created (call after the store is closed).
    pub fn remove(&self) {
        if self.db_is_new {
            for p in std::iter::once(self.db.clone()).chain(companions(&self.db)) {
                let _ = fs::remove_file(p);
            }
            if let Some(d) = &self.blob_dir {
                let _ = fs::remove_dir_all(d);
            }
        } else if let Some(d) = &self.blob_dir {
            let _ = fs::remove_dir(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_paths() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("team.db");
        assert_eq!(blob_dir(&db), dir.path().join("team.db-blobs"));
        assert_eq!(blob_dir(Path::new("x.db")), Path::new("./x.db-blobs"));
        prepare_db_file(&db).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&db), 0o600);
        fs::set_permissions(&db, fs::Permissions::from_mode(0o644)).unwrap();
        let wal = dir.path().join("team.db-wal");
        fs::write(&wal, b"").unwrap();
        fs::set_permissions(&wal, fs::Permissions::from_mode(0o664)).unwrap();
        prepare_db_file(&db).unwrap();
        assert_eq!(mode(&db), 0o600);
        assert_eq!(mode(&wal), 0o600);
        let blobs = prepare_blob_dir(&db).unwrap();
        assert_eq!(mode(&blobs), 0o700);

        check_data_dir(&db).unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let err = check_data_dir(&db).unwrap_err().to_string();
        assert!(err.contains("chmod go-w"), "{err}");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
    }

    #[test]
    fn a_failed_start_removes_only_what_it_created() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("a.db");
        let created = CreatedFiles::before_start(&db);
        prepare_db_file(&db).unwrap();
        prepare_blob_dir(&db).unwrap();
        fs::write(dir.path().join("a.db-wal"), b"x").unwrap();
        created.remove();
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);

        prepare_db_file(&db).unwrap();
        let created = CreatedFiles::before_start(&db);
        fs::write(dir.path().join("a.db-wal"), b"x").unwrap();
        prepare_blob_dir(&db).unwrap();
        created.remove();
        assert!(db.exists(), "a database that existed before stays");
        assert!(dir.path().join("a.db-wal").exists(), "and so does its WAL");
        assert!(!blob_dir(&db).exists());
    }
}
