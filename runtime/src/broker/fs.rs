//! The shared file space in the store: entries, content-addressed blobs with
//! reference counts, and read grants.
//!
//! File bytes are stored once per SHA-256 however many entries point at them:
//! the `blobs` table keeps each blob's size and `refcount` (the entries pointing
//! at it), and the bytes live where [`super::blobs`] keeps them (on SQLite the blob
//! directory, older databases in the row; on PostgreSQL chunks in the database). The
//! row is deleted with the last entry. Entry and blob row change in one transaction,
//! so a write is either wholly there or not at all.
//!
//! Every function runs on a [`Conn`], in the caller's transaction, on SQLite or
//! PostgreSQL alike.

use ac7_protocol::domain::permission::{Permission, PermissionSet};
use ac7_protocol::domain::vfs::{FsPath, Scope};
use serde::Serialize;

use super::AppState;
pub use super::blobs::Content;
use super::blobs::{self, StagedBlob, Stored};
use super::db::{Store, StoreError};
use super::store::{Conn, Row};
use super::tokens::sha256_hex;
use crate::params;

/// An entry (`FsEntry`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FsEntry {
    /// Absolute path.
    pub path: String,
    /// Last segment.
    pub name: String,
    /// `file` or `directory`.
    pub kind: String,
    /// Member, `obj:<id>`, or `objectives`.
    pub owner: String,
    /// Bytes (files only).
    pub size: Option<u64>,
    /// MIME type (files only).
    pub mime_type: Option<String>,
    /// SHA-256 hex (files only).
    pub hash: Option<String>,
    /// Creation time.
    pub created_at: i64,
    /// Creator.
    pub created_by: String,
    /// Last change.
    pub updated_at: i64,
}

impl FsEntry {
    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        self.kind == "directory"
    }
}

/// A file-space failure, with the API's `code`.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// 404 `not_found`.
    #[error("{0}")]
    NotFound(String),
    /// 403 `forbidden`.
    #[error("{0}")]
    Forbidden(String),
    /// 409 `exists`.
    #[error("already exists: {0}")]
    Exists(String),
    /// 409 `not_a_directory`.
    #[error("not a directory: {0}")]
    NotADirectory(String),
    /// 409 `is_a_directory`.
    #[error("is a directory: {0}")]
    IsADirectory(String),
    /// 409 `not_empty`.
    #[error("directory not empty: {0}")]
    NotEmpty(String),
    /// 400 `invalid_input`.
    #[error("{0}")]
    InvalidInput(String),
    /// 404 without a code: stat of a path that is not there.
    #[error("no such path: {0}")]
    NoSuchPath(String),
    /// 413 `quota_exceeded`: the write would put `member` over the file quota.
    #[error(
        "file quota exceeded: {member} has {used} of {quota} bytes in use; this file needs {size} more — remove files first"
    )]
    QuotaExceeded {
        /// Who the bytes are charged to.
        member: String,
        /// Bytes in use.
        used: u64,
        /// The quota.
        quota: u64,
        /// Bytes the write adds.
        size: u64,
    },
    /// 413 `too_large`.
    #[error("file is too large ({size} bytes > {limit} bytes)")]
    TooLarge {
        /// Offered size.
        size: u64,
        /// The cap.
        limit: u64,
    },
    /// 500.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<rusqlite::Error> for FsError {
    fn from(e: rusqlite::Error) -> Self {
        FsError::Store(StoreError::Sqlite(e))
    }
}

impl FsError {
    /// The API error code.
    pub fn code(&self) -> &'static str {
        match self {
            FsError::NotFound(_) | FsError::NoSuchPath(_) => "not_found",
            FsError::QuotaExceeded { .. } => "quota_exceeded",
            FsError::Forbidden(_) => "forbidden",
            FsError::Exists(_) => "exists",
            FsError::NotADirectory(_) => "not_a_directory",
            FsError::IsADirectory(_) => "is_a_directory",
            FsError::NotEmpty(_) => "not_empty",
            FsError::InvalidInput(_) => "invalid_input",
            FsError::TooLarge { .. } => "too_large",
            FsError::Store(_) => "internal",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            FsError::NotFound(_) | FsError::NoSuchPath(_) => 404,
            FsError::QuotaExceeded { .. } => 413,
            FsError::Forbidden(_) => 403,
            FsError::Exists(_)
            | FsError::NotADirectory(_)
            | FsError::IsADirectory(_)
            | FsError::NotEmpty(_) => 409,
            FsError::InvalidInput(_) => 400,
            FsError::TooLarge { .. } => 413,
            FsError::Store(_) => 500,
        }
    }
}

/// How a write treats an existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collide {
    /// 409 `exists`.
    Error,
    /// Replace the content.
    Overwrite,
    /// Pick `name-1.ext`, `name-2.ext`, …
    Suffix,
}

const COLS: &str = "path, name, kind, owner, size, mime, hash, created_at, created_by, updated_at";

fn row(r: &Row) -> Result<FsEntry, StoreError> {
    Ok(FsEntry {
        path: r.get(0)?,
        name: r.get(1)?,
        kind: r.get(2)?,
        owner: r.get(3)?,
        size: r
            .get::<Option<i64>>(4)?
            .map(|s| u64::try_from(s).unwrap_or(0)),
        mime_type: r.get(5)?,
        hash: r.get(6)?,
        created_at: r.get(7)?,
        created_by: r.get(8)?,
        updated_at: r.get(9)?,
    })
}

/// One entry.
pub fn get(c: &Conn<'_>, path: &FsPath) -> Result<Option<FsEntry>, StoreError> {
    c.query_row(
        &format!("SELECT {COLS} FROM fs_entries WHERE path = ?1"),
        params![path.as_str()],
        row,
    )
}

/// Children of a directory: directories first, then files, each by name.
pub fn children(c: &Conn<'_>, dir: &FsPath) -> Result<Vec<FsEntry>, StoreError> {
    c.query(
        &format!(
            "SELECT {COLS} FROM fs_entries WHERE parent = ?1 ORDER BY CASE kind WHEN 'directory' THEN 0 ELSE 1 END, name"
        ),
        params![dir.as_str()],
        row,
    )
}

/// Every file, newest first.
pub fn all_files(c: &Conn<'_>) -> Result<Vec<FsEntry>, StoreError> {
    c.query(
        &format!(
            "SELECT {COLS} FROM fs_entries WHERE kind = 'file' ORDER BY updated_at DESC, path"
        ),
        params![],
        row,
    )
}

/// Files granted to `member`, most recently updated first.
pub fn shared_with(c: &Conn<'_>, member: &str) -> Result<Vec<FsEntry>, StoreError> {
    c.query(
        &format!(
            "SELECT {} FROM fs_entries e JOIN fs_grants g ON g.path = e.path
             WHERE g.member_name = ?1 AND e.kind = 'file' ORDER BY e.updated_at DESC, e.path",
            COLS.split(", ")
                .map(|c| format!("e.{c}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        params![member],
        row,
    )
}

/// Whether `member` holds a read grant on `path`.
pub fn has_grant(c: &Conn<'_>, path: &FsPath, member: &str) -> Result<bool, StoreError> {
    c.exists(
        "SELECT 1 FROM fs_grants WHERE path = ?1 AND member_name = ?2",
        params![path.as_str(), member],
    )
}

/// Grants `member` read access to `path`.
pub fn grant(c: &Conn<'_>, path: &str, member: &str, now: i64) -> Result<(), StoreError> {
    c.execute(
        "INSERT INTO fs_grants (path, member_name, granted_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (path, member_name) DO NOTHING",
        params![path, member, now],
    )?;
    Ok(())
}

/// Creates `dir` and any missing ancestors as directories. Fails if something on the way is a file.
pub fn ensure_dir(c: &Conn<'_>, dir: &FsPath, actor: &str, now: i64) -> Result<FsEntry, FsError> {
    let mut chain = dir.ancestors();
    chain.push(dir.clone());
    let mut last = None;
    for p in chain {
        match get(c, &p)? {
            Some(e) if e.is_dir() => last = Some(e),
            Some(_) => return Err(FsError::NotADirectory(p.to_string())),
            None => last = Some(insert_dir(c, &p, actor, now)?),
        }
    }
    last.ok_or_else(|| FsError::InvalidInput("cannot create /".into()))
}

fn insert_dir(c: &Conn<'_>, p: &FsPath, actor: &str, now: i64) -> Result<FsEntry, FsError> {
    let parent = p.parent().unwrap_or_else(FsPath::root);
    c.execute(
        "INSERT INTO fs_entries (path, parent, name, kind, owner, created_at, created_by, updated_at)
         VALUES (?1, ?2, ?3, 'directory', ?4, ?5, ?6, ?5)",
        params![p.as_str(), parent.as_str(), p.name(), p.owner(), now, actor],
    )?;
    get(c, p)?.ok_or_else(|| FsError::NotFound(p.to_string()))
}

/// `mkdir`: with `recursive`, creates missing parents; without, the parent must exist.
pub fn mkdir(
    c: &Conn<'_>,
    p: &FsPath,
    recursive: bool,
    actor: &str,
    now: i64,
) -> Result<FsEntry, FsError> {
    if let Some(existing) = get(c, p)? {
        return if existing.is_dir() && recursive {
            Ok(existing)
        } else {
            Err(FsError::Exists(p.to_string()))
        };
    }
    let parent = p.parent().unwrap_or_else(FsPath::root);
    if !recursive && !parent.is_root() {
        match get(c, &parent)? {
            None => {
                return Err(FsError::NotFound(format!(
                    "parent does not exist: {parent}"
                )));
            }
            Some(e) if !e.is_dir() => return Err(FsError::NotADirectory(parent.to_string())),
            Some(_) => {}
        }
    }
    ensure_dir(c, p, actor, now)
}

/// Writes a staged upload as a file (see [`write()`]). Call
/// [`StagedBlob::unpublish`] if the transaction then fails to commit.
#[allow(clippy::too_many_arguments)]
pub fn write_staged(
    c: &Conn<'_>,
    p: &FsPath,
    staged: &StagedBlob,
    mime: &str,
    collide: Collide,
    actor: &str,
    now: i64,
) -> Result<(FsEntry, bool), FsError> {
    place(
        c,
        p,
        &staged.hash,
        Content::Staged(staged),
        staged.size,
        mime,
        collide,
        actor,
        now,
    )
}

/// Bytes of files charged to `member`: files in its home, and files it created
/// in objective folders. Sizes are logical (a copy counts again).
pub fn usage(c: &Conn<'_>, member: &str) -> Result<u64, StoreError> {
    // `lower(substr(…))`: the prefix test SQLite's `LIKE 'obj:%'` made (ASCII case folded),
    // the same on PostgreSQL.
    let n = c
        .query_row(
            "SELECT COALESCE(CAST(SUM(size) AS BIGINT), 0) FROM fs_entries WHERE kind = 'file'
             AND (owner = ?1 OR (lower(substr(owner, 1, 4)) = 'obj:' AND created_by = ?1))",
            params![member],
            |r| r.get::<i64>(0),
        )?
        .unwrap_or(0);
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The member a write to `p` by `actor` is charged to (see [`usage`]).
pub fn charged_to(p: &FsPath, actor: &str) -> String {
    match p.scope() {
        Scope::Home { member } => member.to_owned(),
        _ => actor.to_owned(),
    }
}

/// Writes a file. Parents are created. Returns the entry and whether it was renamed.
pub fn write(
    c: &Conn<'_>,
    p: &FsPath,
    data: &[u8],
    mime: &str,
    collide: Collide,
    actor: &str,
    now: i64,
) -> Result<(FsEntry, bool), FsError> {
    let hash = sha256_hex(data);
    place(
        c,
        p,
        &hash,
        Content::Inline(data),
        data.len() as u64,
        mime,
        collide,
        actor,
        now,
    )
}

#[allow(clippy::too_many_arguments)]
fn place(
    c: &Conn<'_>,
    p: &FsPath,
    hash: &str,
    data: Content<'_>,
    size: u64,
    mime: &str,
    collide: Collide,
    actor: &str,
    now: i64,
) -> Result<(FsEntry, bool), FsError> {
    let parent = p.parent().filter(|q| !q.is_root()).ok_or_else(|| {
        FsError::InvalidInput(format!(
            "cannot write {p}: files must live inside a home or objective directory"
        ))
    })?;
    ensure_dir(c, &parent, actor, now)?;
    let mut target = p.clone();
    let mut renamed = false;
    let mut n = 0;
    loop {
        match get(c, &target)? {
            None => break,
            Some(e) if e.is_dir() => {
                if collide == Collide::Suffix {
                    // fall through to the next suffix
                } else {
                    return Err(FsError::IsADirectory(target.to_string()));
                }
            }
            Some(existing) => match collide {
                Collide::Error => return Err(FsError::Exists(target.to_string())),
                Collide::Overwrite => {
                    add_blob(c, hash, data)?;
                    c.execute(
                        "UPDATE fs_entries SET size = ?2, mime = ?3, hash = ?4, updated_at = ?5 WHERE path = ?1",
                        params![target.as_str(), size as i64, mime, hash, now],
                    )?;
                    // After the entry stops pointing at it (the blob row may go).
                    if let Some(old) = &existing.hash {
                        blobs::unref(c, old)?;
                    }
                    let entry =
                        get(c, &target)?.ok_or_else(|| FsError::NotFound(target.to_string()))?;
                    return Ok((entry, false));
                }
                Collide::Suffix => {}
            },
        }
        n += 1;
        if n > 10_000 {
            return Err(FsError::Exists(p.to_string()));
        }
        target = p
            .with_suffix(n)
            .map_err(|e| FsError::InvalidInput(e.to_string()))?;
        renamed = true;
    }
    add_blob(c, hash, data)?;
    c.execute(
        "INSERT INTO fs_entries (path, parent, name, kind, owner, size, mime, hash, created_at, created_by, updated_at)
         VALUES (?1, ?2, ?3, 'file', ?4, ?5, ?6, ?7, ?8, ?9, ?8)",
        params![target.as_str(), parent.as_str(), target.name(), target.owner(), size as i64, mime, hash, now, actor],
    )?;
    let entry = get(c, &target)?.ok_or_else(|| FsError::NotFound(target.to_string()))?;
    Ok((entry, renamed))
}

fn add_blob(c: &Conn<'_>, hash: &str, data: Content<'_>) -> Result<(), FsError> {
    if !blobs::add_ref(c, hash, data)? {
        return Err(FsError::InvalidInput(format!(
            "attachment is corrupt: blob {hash} is missing"
        )));
    }
    Ok(())
}

/// Copies a file entry to `to` (suffixing on collision), sharing its blob.
pub fn copy(
    c: &Conn<'_>,
    from: &FsEntry,
    to: &FsPath,
    actor: &str,
    now: i64,
) -> Result<FsEntry, FsError> {
    let hash = from
        .hash
        .clone()
        .ok_or_else(|| FsError::IsADirectory(from.path.clone()))?;
    let mime = from
        .mime_type
        .clone()
        .unwrap_or_else(|| "application/octet-stream".into());
    Ok(place(
        c,
        to,
        &hash,
        Content::Shared,
        from.size.unwrap_or(0),
        &mime,
        Collide::Suffix,
        actor,
        now,
    )?
    .0)
}

/// Opens a file's content (`blob_dir`: the blob directory).
pub fn read(c: &Conn<'_>, blob_dir: &std::path::Path, entry: &FsEntry) -> Result<Stored, FsError> {
    let hash = entry
        .hash
        .as_deref()
        .ok_or_else(|| FsError::IsADirectory(entry.path.clone()))?;
    blobs::open(c, blob_dir, hash)?.ok_or_else(|| {
        FsError::InvalidInput(format!("file is corrupt (missing content): {}", entry.path))
    })
}

/// Removes a file, or a directory (non-empty only with `recursive`).
pub fn remove(c: &Conn<'_>, p: &FsPath, recursive: bool) -> Result<(), FsError> {
    let entry = get(c, p)?.ok_or_else(|| FsError::NotFound(format!("no such path: {p}")))?;
    if entry.is_dir() {
        let prefix = format!("{}/", p.as_str());
        let below = c.query(
            "SELECT path, hash FROM fs_entries WHERE substr(path, 1, length(?1)) = ?1",
            params![prefix],
            |r| Ok((r.get::<String>(0)?, r.get::<Option<String>>(1)?)),
        )?;
        if !below.is_empty() && !recursive {
            return Err(FsError::NotEmpty(p.to_string()));
        }
        for (path, hash) in below {
            delete_entry(c, &path, hash.as_deref())?;
        }
    }
    delete_entry(c, p.as_str(), entry.hash.as_deref())
}

fn delete_entry(c: &Conn<'_>, path: &str, hash: Option<&str>) -> Result<(), FsError> {
    c.execute("DELETE FROM fs_entries WHERE path = ?1", params![path])?;
    c.execute("DELETE FROM fs_grants WHERE path = ?1", params![path])?;
    if let Some(h) = hash {
        blobs::unref(c, h)?;
    }
    Ok(())
}

/// Moves a file (directories are refused). Grants follow the file.
pub fn rename(
    c: &Conn<'_>,
    from: &FsPath,
    to: &FsPath,
    actor: &str,
    now: i64,
) -> Result<FsEntry, FsError> {
    let entry = get(c, from)?.ok_or_else(|| FsError::NotFound(format!("no such path: {from}")))?;
    if entry.is_dir() {
        return Err(FsError::InvalidInput(
            "directory move is not supported yet".into(),
        ));
    }
    if get(c, to)?.is_some() {
        return Err(FsError::Exists(to.to_string()));
    }
    let parent = to.parent().filter(|q| !q.is_root()).ok_or_else(|| {
        FsError::InvalidInput(format!(
            "cannot move to {to}: files must live inside a directory"
        ))
    })?;
    ensure_dir(c, &parent, actor, now)?;
    c.execute(
        "UPDATE fs_entries SET path = ?2, parent = ?3, name = ?4, owner = ?5, updated_at = ?6 WHERE path = ?1",
        params![from.as_str(), to.as_str(), parent.as_str(), to.name(), to.owner(), now],
    )?;
    // The grants move; a member's grant already at the destination gives way to the one that
    // moves there (SQLite's `UPDATE OR REPLACE`).
    c.execute(
        "DELETE FROM fs_grants WHERE path = ?2
         AND member_name IN (SELECT member_name FROM fs_grants WHERE path = ?1)",
        params![from.as_str(), to.as_str()],
    )?;
    c.execute(
        "UPDATE fs_grants SET path = ?2 WHERE path = ?1",
        params![from.as_str(), to.as_str()],
    )?;
    get(c, to)?.ok_or_else(|| FsError::NotFound(to.to_string()))
}

/// The top-level folder removed members' homes move to. Its name has a space, which no
/// member name has, so it is nobody's home: only `members.manage` holders reach it.
pub const REMOVED_HOMES: &str = "/removed members";

/// Moves removed member `member`'s home, whole, to `/removed members/<member>-<id>` (`id`:
/// its `members.seq`, never reused; a free suffix is added should a folder of that name exist),
/// with the read grants on it. Returns where it went; `None` without a home.
pub fn archive_home(
    c: &Conn<'_>,
    member: &str,
    id: i64,
    actor: &str,
    now: i64,
) -> Result<Option<FsPath>, FsError> {
    let home =
        FsPath::parse(&format!("/{member}")).map_err(|e| FsError::InvalidInput(e.to_string()))?;
    if get(c, &home)?.is_none() {
        return Ok(None);
    }
    let root = FsPath::parse(REMOVED_HOMES).map_err(|e| FsError::InvalidInput(e.to_string()))?;
    ensure_dir(c, &root, actor, now)?;
    let mut dest = root
        .join(&format!("{member}-{id}"))
        .map_err(|e| FsError::InvalidInput(e.to_string()))?;
    let mut n = 0;
    while get(c, &dest)?.is_some() {
        n += 1;
        dest = root
            .join(&format!("{member}-{id}-{n}"))
            .map_err(|e| FsError::InvalidInput(e.to_string()))?;
    }
    let (from, to) = (home.as_str(), dest.as_str());
    // Every entry at or below the home: the path's prefix changes; the home itself also gets
    // its new parent and name; all of them the owner of the new place.
    c.execute(
        "UPDATE fs_entries SET
             path = ?2 || substr(path, length(?1) + 1),
             parent = CASE WHEN path = ?1 THEN ?3 ELSE ?2 || substr(parent, length(?1) + 1) END,
             name = CASE WHEN path = ?1 THEN ?4 ELSE name END,
             owner = ?5
         WHERE path = ?1 OR substr(path, 1, length(?1) + 1) = ?1 || '/'",
        params![from, to, root.as_str(), dest.name(), dest.owner()],
    )?;
    // The grants follow; one already at a destination path, for the same member, gives way
    // to the one that moves there (SQLite's `UPDATE OR REPLACE`).
    c.execute(
        "DELETE FROM fs_grants WHERE EXISTS (
             SELECT 1 FROM fs_grants g
             WHERE g.member_name = fs_grants.member_name
               AND (g.path = ?1 OR substr(g.path, 1, length(?1) + 1) = ?1 || '/')
               AND ?2 || substr(g.path, length(?1) + 1) = fs_grants.path)",
        params![from, to],
    )?;
    c.execute(
        "UPDATE fs_grants SET path = ?2 || substr(path, length(?1) + 1)
         WHERE path = ?1 OR substr(path, 1, length(?1) + 1) = ?1 || '/'",
        params![from, to],
    )?;
    Ok(Some(dest))
}

/// Number of stored blobs and the sum of their reference counts (for tests and diagnostics).
pub fn blob_stats(c: &Conn<'_>) -> Result<(i64, i64), StoreError> {
    Ok(c.query_row(
        "SELECT COUNT(*), COALESCE(CAST(SUM(refcount) AS BIGINT), 0) FROM blobs",
        params![],
        |r| Ok((r.get::<i64>(0)?, r.get::<i64>(1)?)),
    )?
    .unwrap_or((0, 0)))
}

fn is_objective_member(c: &Conn<'_>, id: &str, name: &str) -> Result<bool, StoreError> {
    Ok(super::objectives::get(c, id)?
        .is_some_and(|o| ac7_protocol::domain::objective::is_thread_member(&o, name, false)))
}

/// Whether `name` (holding `perms`) owns `path` (may write, delete, move, list there):
/// `members.manage` owns everything, a member its home, an objective's members its folder.
pub fn can_write(
    c: &Conn<'_>,
    name: &str,
    perms: PermissionSet,
    path: &FsPath,
) -> Result<bool, StoreError> {
    if perms.contains(Permission::MembersManage) {
        return Ok(true);
    }
    match path.scope() {
        Scope::Root | Scope::ObjectivesRoot => Ok(false),
        Scope::Home { member } => Ok(member == name),
        Scope::Objective { id } => is_objective_member(c, id, name),
    }
}

/// Whether `name` (holding `perms`) may read `path`: ownership or a grant.
pub fn can_read(
    c: &Conn<'_>,
    name: &str,
    perms: PermissionSet,
    path: &FsPath,
) -> Result<bool, StoreError> {
    Ok(can_write(c, name, perms, path)? || has_grant(c, path, name)?)
}

/// The entries `name` (holding `perms`) may see in directory `path`: at the root its home
/// (every home with `members.manage`); elsewhere the directory's children when it owns it
/// (nothing when the directory does not exist).
pub fn list_dir(
    store: &Store,
    name: &str,
    perms: PermissionSet,
    path: &FsPath,
) -> Result<Vec<FsEntry>, FsError> {
    store.view(|c| {
        if path.is_root() {
            let all = children(c, path)?;
            return Ok(if perms.contains(Permission::MembersManage) {
                all
            } else {
                all.into_iter()
                    .filter(|e| e.path.trim_start_matches('/') == name)
                    .collect()
            });
        }
        if !can_write(c, name, perms, path)? {
            return Err(FsError::Forbidden(format!("cannot list {path}")));
        }
        match get(c, path)? {
            Some(e) if !e.is_dir() => Err(FsError::NotADirectory(path.to_string())),
            Some(_) => Ok(children(c, path)?),
            None => Ok(Vec::new()),
        }
    })
}

/// The entry at `path`, for a reader allowed to see it (`/` has none).
pub fn stat_entry(
    store: &Store,
    name: &str,
    perms: PermissionSet,
    path: &FsPath,
) -> Result<FsEntry, FsError> {
    if path.is_root() {
        return Err(FsError::InvalidInput("cannot stat /".into()));
    }
    store.view(|c| {
        if !can_read(c, name, perms, path)? {
            return Err(FsError::Forbidden(format!("cannot stat {path}")));
        }
        get(c, path)?.ok_or_else(|| FsError::NoSuchPath(path.to_string()))
    })
}

/// The file at `path` and its content, for a reader allowed to see it. In a write
/// transaction: on SQLite the blob file is opened under the write lock, which emptying the
/// trash takes too, so a concurrent delete cannot unlink it between the row and the open.
pub fn open_file(
    store: &Store,
    blob_dir: &std::path::Path,
    name: &str,
    perms: PermissionSet,
    path: &FsPath,
) -> Result<(FsEntry, Stored), FsError> {
    store.tx(|c| {
        if !can_read(c, name, perms, path)? {
            return Err(FsError::Forbidden(format!("cannot stat {path}")));
        }
        let entry =
            get(c, path)?.ok_or_else(|| FsError::NotFound(format!("no such path: {path}")))?;
        if entry.is_dir() {
            return Err(FsError::IsADirectory(path.to_string()));
        }
        let content = read(c, blob_dir, &entry)?;
        Ok((entry, content))
    })
}

/// Chunk `idx` of blob `hash` as stored in the database, in a read transaction.
pub fn read_chunk(store: &Store, hash: &str, idx: i64) -> Result<Option<Vec<u8>>, StoreError> {
    store.view(|c| blobs::chunk(c, hash, idx))
}

/// One upload: where, as what type, what to do on a name clash.
#[derive(Debug, Clone, Copy)]
pub struct Upload<'a> {
    /// Destination.
    pub path: &'a FsPath,
    /// MIME type.
    pub mime: &'a str,
    /// On an existing file.
    pub collide: Collide,
}

/// The size of the file an overwriting write replaces.
fn replaced_size(c: &Conn<'_>, path: &FsPath, collide: Collide) -> Result<Option<u64>, StoreError> {
    Ok(match collide {
        Collide::Overwrite => get(c, path)?.and_then(|e| e.size),
        _ => None,
    })
}

/// Refuses adding `size` bytes (replacing `replaced` bytes) when it would put `member`
/// over `quota`.
fn check_quota(
    c: &Conn<'_>,
    quota: Option<u64>,
    member: &str,
    size: u64,
    replaced: Option<u64>,
) -> Result<(), FsError> {
    let Some(quota) = quota else {
        return Ok(());
    };
    let used = usage(c, member)?;
    let after = (used + size).saturating_sub(replaced.unwrap_or(0));
    if after > quota {
        return Err(FsError::QuotaExceeded {
            member: member.to_owned(),
            used,
            quota,
            size,
        });
    }
    Ok(())
}

/// Refuses, before the bytes arrive, an upload of `declared` bytes that would be refused
/// after it anyway: a path `writer` (holding `perms`) does not own, or one over the quota.
pub fn check_upload(
    state: &AppState,
    writer: &str,
    perms: PermissionSet,
    upload: Upload<'_>,
    declared: u64,
) -> Result<(), FsError> {
    let charged = charged_to(upload.path, writer);
    state.store.view(|c| {
        if !can_write(c, writer, perms, upload.path)? {
            return Err(FsError::Forbidden(format!(
                "cannot write to {}",
                upload.path
            )));
        }
        let replaced = replaced_size(c, upload.path, upload.collide)?;
        check_quota(
            c,
            state.config.file_quota_bytes,
            &charged,
            declared,
            replaced,
        )
    })
}

/// Commits an uploaded blob as the file `upload` describes, for `writer` (holding `perms`),
/// with the same checks as [`check_upload`] on the real size. Returns the entry and whether
/// it got another name; the blobs an overwrite replaced are removed after the commit.
pub fn commit_upload(
    state: &AppState,
    writer: &str,
    perms: PermissionSet,
    upload: Upload<'_>,
    staged: &StagedBlob,
    now: i64,
) -> Result<(FsEntry, bool), FsError> {
    let charged = charged_to(upload.path, writer);
    let (entry, renamed, replaced) = state.store.tx(|c| {
        if !can_write(c, writer, perms, upload.path)? {
            return Err(FsError::Forbidden(format!(
                "cannot write to {}",
                upload.path
            )));
        }
        let replaced = replaced_size(c, upload.path, upload.collide)?;
        check_quota(
            c,
            state.config.file_quota_bytes,
            &charged,
            staged.size,
            replaced,
        )?;
        // A file published for a write that then fails is removed again here, under the write
        // lock. Should the commit itself fail, the file stays (no row references it): the next
        // start removes it, and an upload of the same content meanwhile uses it as is.
        let (entry, renamed) = write_staged(
            c,
            upload.path,
            staged,
            upload.mime,
            upload.collide,
            writer,
            now,
        )
        .inspect_err(|_| staged.unpublish())?;
        Ok((entry, renamed, replaced.is_some()))
    })?;
    if replaced && let Err(e) = blobs::empty_trash_after(&state.store, &state.blob_dir()) {
        tracing::warn!(error = %e, "cannot remove replaced blobs");
    }
    Ok((entry, renamed))
}

/// Creates directory `path` (and its parents when `recursive`) for its owner.
pub fn make_dir(
    store: &Store,
    name: &str,
    perms: PermissionSet,
    path: &FsPath,
    recursive: bool,
    now: i64,
) -> Result<FsEntry, FsError> {
    store.tx(|c| {
        if path.is_root() || !can_write(c, name, perms, path)? {
            return Err(FsError::Forbidden(format!("cannot mkdir {path}")));
        }
        mkdir(c, path, recursive, name, now)
    })
}

/// Removes `path` (a directory's content too when `recursive`) for its owner; top-level
/// directories stay. Blobs no longer referenced are removed after the commit.
pub fn remove_path(
    state: &AppState,
    name: &str,
    perms: PermissionSet,
    path: &FsPath,
    recursive: bool,
) -> Result<(), FsError> {
    state.store.tx(|c| {
        if !can_write(c, name, perms, path)? {
            return Err(FsError::Forbidden(format!("cannot remove {path}")));
        }
        if path.segments().count() < 2 {
            return Err(FsError::InvalidInput(format!(
                "cannot remove top-level directory {path}"
            )));
        }
        remove(c, path, recursive)
    })?;
    if let Err(e) = blobs::empty_trash_after(&state.store, &state.blob_dir()) {
        tracing::warn!(error = %e, "cannot remove deleted blobs");
    }
    Ok(())
}

/// Moves `from` to `to` for a member owning both.
pub fn move_path(
    store: &Store,
    name: &str,
    perms: PermissionSet,
    from: &FsPath,
    to: &FsPath,
    now: i64,
) -> Result<FsEntry, FsError> {
    store.tx(|c| {
        if !can_write(c, name, perms, from)? {
            return Err(FsError::Forbidden(format!("cannot move {from}")));
        }
        if !can_write(c, name, perms, to)? {
            return Err(FsError::Forbidden(format!("cannot write to {to}")));
        }
        rename(c, from, to, name, now)
    })
}

/// The files shared with `name` (it holds a read grant on them).
pub fn shared_with_member(store: &Store, name: &str) -> Result<Vec<FsEntry>, FsError> {
    Ok(store.view(|c| shared_with(c, name))?)
}

/// Every file, for a holder of `members.manage`.
pub fn every_file(store: &Store, perms: PermissionSet) -> Result<Vec<FsEntry>, FsError> {
    if !perms.contains(Permission::MembersManage) {
        return Err(FsError::Forbidden(
            "admin permission required to list all files".into(),
        ));
    }
    Ok(store.view(all_files)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::db::Store;

    fn p(s: &str) -> FsPath {
        FsPath::parse(s).unwrap()
    }

    #[test]
    fn blobs_are_shared_and_purged_with_the_last_entry() {
        let store = Store::open_in_memory().unwrap();
        store
            .tx(|conn| -> Result<(), StoreError> {
                ensure_dir(conn, &p("/a"), "a", 1).unwrap();
                write(
                    conn,
                    &p("/a/x.txt"),
                    b"same",
                    "text/plain",
                    Collide::Error,
                    "a",
                    2,
                )
                .unwrap();
                let (e, renamed) = write(
                    conn,
                    &p("/a/x.txt"),
                    b"same",
                    "text/plain",
                    Collide::Suffix,
                    "a",
                    3,
                )
                .unwrap();
                assert!(renamed);
                assert_eq!(e.path, "/a/x-1.txt");
                assert_eq!(blob_stats(conn).unwrap(), (1, 2));
                let src = get(conn, &p("/a/x.txt")).unwrap().unwrap();
                copy(conn, &src, &p("/objectives/o1/x.txt"), "a", 4).unwrap();
                assert_eq!(blob_stats(conn).unwrap(), (1, 3));
                // overwrite with new content: old blob loses one ref, new blob appears
                write(
                    conn,
                    &p("/a/x.txt"),
                    b"other",
                    "text/plain",
                    Collide::Overwrite,
                    "a",
                    5,
                )
                .unwrap();
                assert_eq!(blob_stats(conn).unwrap(), (2, 3));
                remove(conn, &p("/a/x-1.txt"), false).unwrap();
                remove(conn, &p("/objectives/o1"), true).unwrap();
                assert_eq!(blob_stats(conn).unwrap(), (1, 1));
                // inline content (databases from before the blob directory) still reads
                let dir = std::path::Path::new("/nonexistent");
                let e = get(conn, &p("/a/x.txt")).unwrap().unwrap();
                match read(conn, dir, &e).unwrap() {
                    Stored::Inline(bytes) => assert_eq!(bytes, b"other"),
                    _ => panic!("expected inline content"),
                }
                remove(conn, &p("/a"), true).unwrap();
                assert_eq!(blob_stats(conn).unwrap(), (0, 0));
                // deleted blobs wait in the trash for their files to be unlinked
                let trashed: i64 = conn
                    .query_row("SELECT COUNT(*) FROM blob_trash", params![], |r| r.get(0))
                    .unwrap()
                    .unwrap();
                assert_eq!(trashed, 2);
                blobs::empty_trash(conn, dir).unwrap();
                let trashed: i64 = conn
                    .query_row("SELECT COUNT(*) FROM blob_trash", params![], |r| r.get(0))
                    .unwrap()
                    .unwrap();
                assert_eq!(trashed, 0);
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn directories_and_conflicts() {
        let store = Store::open_in_memory().unwrap();
        store
            .tx(|conn| -> Result<(), StoreError> {
                ensure_dir(conn, &p("/a"), "a", 1).unwrap();
                assert!(matches!(
                    mkdir(conn, &p("/a/b/c"), false, "a", 1),
                    Err(FsError::NotFound(_))
                ));
                mkdir(conn, &p("/a/b/c"), true, "a", 1).unwrap();
                assert!(matches!(
                    remove(conn, &p("/a/b"), false),
                    Err(FsError::NotEmpty(_))
                ));
                write(conn, &p("/a/f"), b"1", "text/plain", Collide::Error, "a", 1).unwrap();
                assert!(matches!(
                    write(
                        conn,
                        &p("/a/f/g"),
                        b"1",
                        "text/plain",
                        Collide::Error,
                        "a",
                        1
                    ),
                    Err(FsError::NotADirectory(_))
                ));
                assert!(matches!(
                    write(
                        conn,
                        &p("/a/b"),
                        b"1",
                        "text/plain",
                        Collide::Overwrite,
                        "a",
                        1
                    ),
                    Err(FsError::IsADirectory(_))
                ));
                assert!(matches!(
                    write(conn, &p("/top"), b"1", "t", Collide::Error, "a", 1),
                    Err(FsError::InvalidInput(_))
                ));
                let names: Vec<_> = children(conn, &p("/a"))
                    .unwrap()
                    .into_iter()
                    .map(|e| e.name)
                    .collect();
                assert_eq!(names, vec!["b", "f"]);
                grant(conn, "/a/f", "bob", 2).unwrap();
                let moved = rename(conn, &p("/a/f"), &p("/a/g"), "a", 3).unwrap();
                assert_eq!(moved.updated_at, 3);
                assert!(has_grant(conn, &p("/a/g"), "bob").unwrap());
                assert!(matches!(
                    rename(conn, &p("/a/b"), &p("/a/z"), "a", 3),
                    Err(FsError::InvalidInput(_))
                ));
                Ok(())
            })
            .unwrap();
    }
}
