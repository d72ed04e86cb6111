//! `/fs…`: ls, stat, read, write (raw body), mkdir, rm, mv, shared, all.
//!
//! Access: `members.manage` holders may do anything; a member owns `/<name>/…`;
//! the members of an objective (assignee, originator, watchers) own
//! `/objectives/<id>/…`; anyone who received a file as an attachment may read it.
//! Listing needs ownership (objective members may list their objective's folder).
//! Paths are normalised and `..`, `//`, NUL and non-UTF-8 are refused with 400.

use ac7_protocol::domain::permission::Permission;
use ac7_protocol::domain::vfs::{FsPath, Scope};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, Body, Caller, Shared, disposition, obj, parse_json, query_bytes, reply};
use crate::broker::blobs::{self, StageError, Stored};
use crate::broker::fs::{self as store, Collide, FsError};
use crate::broker::store::Conn;
use crate::broker::{now_ms, objectives};

fn fs_err(status: StatusCode, msg: impl Into<String>, code: &str) -> ApiError {
    ApiError::new(status, msg).with("code", json!(code))
}

fn forbidden(msg: String) -> ApiError {
    fs_err(StatusCode::FORBIDDEN, msg, "forbidden")
}

fn parse_path(raw: &[u8]) -> Result<FsPath, ApiError> {
    FsPath::from_bytes(raw).map_err(|e| {
        fs_err(
            StatusCode::BAD_REQUEST,
            format!("invalid path: {e}"),
            "invalid_input",
        )
    })
}

fn required_path(uri: &Uri, key: &str) -> Result<FsPath, ApiError> {
    match query_bytes(uri.query(), key) {
        Some(raw) if !raw.is_empty() => parse_path(&raw),
        _ => Err(ApiError::bad_request(format!(
            "`{key}` query parameter is required"
        ))),
    }
}

fn is_objective_member(c: &Conn<'_>, id: &str, name: &str) -> Result<bool, ApiError> {
    Ok(objectives::get(c, id)?
        .is_some_and(|o| ac7_protocol::domain::objective::is_thread_member(&o, name, false)))
}

/// Whether `caller` owns `path` (may write, delete, move, list there).
pub(crate) fn can_write(c: &Conn<'_>, caller: &Caller, path: &FsPath) -> Result<bool, ApiError> {
    if caller.has(Permission::MembersManage) {
        return Ok(true);
    }
    match path.scope() {
        Scope::Root | Scope::ObjectivesRoot => Ok(false),
        Scope::Home { member } => Ok(member == caller.name),
        Scope::Objective { id } => is_objective_member(c, id, &caller.name),
    }
}

/// Whether `caller` may read `path`: ownership or a grant.
pub(crate) fn can_read(c: &Conn<'_>, caller: &Caller, path: &FsPath) -> Result<bool, ApiError> {
    Ok(can_write(c, caller, path)? || store::has_grant(c, path, &caller.name)?)
}

pub(super) async fn ls(
    State(state): State<Shared>,
    caller: Caller,
    uri: Uri,
) -> Result<Response, ApiError> {
    let path = match query_bytes(uri.query(), "path") {
        Some(raw) if !raw.is_empty() => parse_path(&raw)?,
        _ => FsPath::root(),
    };
    state.store.view(|c| {
        let entries = if path.is_root() {
            let all = store::children(c, &path)?;
            if caller.has(Permission::MembersManage) {
                all
            } else {
                all.into_iter()
                    .filter(|e| e.path.trim_start_matches('/') == caller.name)
                    .collect()
            }
        } else {
            if !can_write(c, &caller, &path)? {
                return Err(forbidden(format!("cannot list {path}")));
            }
            match store::get(c, &path)? {
                Some(e) if !e.is_dir() => {
                    return Err(fs_err(
                        StatusCode::CONFLICT,
                        format!("not a directory: {path}"),
                        "not_a_directory",
                    ));
                }
                Some(_) => store::children(c, &path)?,
                None => Vec::new(),
            }
        };
        Ok(reply(StatusCode::OK, &obj! {"entries" => &entries}))
    })
}

pub(super) async fn stat(
    State(state): State<Shared>,
    caller: Caller,
    uri: Uri,
) -> Result<Response, ApiError> {
    let path = required_path(&uri, "path")?;
    if path.is_root() {
        return Err(fs_err(
            StatusCode::BAD_REQUEST,
            "cannot stat /",
            "invalid_input",
        ));
    }
    state.store.view(|c| {
        if !can_read(c, &caller, &path)? {
            return Err(forbidden(format!("cannot stat {path}")));
        }
        let entry = store::get(c, &path)?
            .ok_or_else(|| ApiError::not_found(format!("no such path: {path}")))?;
        Ok(reply(StatusCode::OK, &obj! {"entry" => &entry}))
    })
}

pub(super) async fn read(
    State(state): State<Shared>,
    caller: Caller,
    uri: Uri,
) -> Result<Response, ApiError> {
    let raw = uri.path().strip_prefix("/fs/read").unwrap_or("");
    let path = parse_path(&super::percent_decode_with(raw, false))?;
    let blob_dir = state.blob_dir();
    // `tx`, not `view`: on SQLite the blob file is opened under the write lock, which
    // `empty_trash` takes too, so a concurrent delete cannot unlink it between the row and
    // the open.
    let (entry, content) = state.store.tx(|c| -> Result<_, ApiError> {
        if !can_read(c, &caller, &path)? {
            return Err(forbidden(format!("cannot stat {path}")));
        }
        let entry = store::get(c, &path)?
            .ok_or_else(|| FsError::NotFound(format!("no such path: {path}")))?;
        if entry.is_dir() {
            return Err(FsError::IsADirectory(path.to_string()).into());
        }
        let content = store::read(c, &blob_dir, &entry)?;
        Ok((entry, content))
    })?;
    let mime = entry
        .mime_type
        .as_deref()
        .unwrap_or("application/octet-stream");
    let streamed = |body: axum::body::Body, size: u64| {
        let mut resp = body.into_response();
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(size));
        resp
    };
    let mut resp = match content {
        Stored::Inline(bytes) => bytes.into_response(),
        Stored::File(file) => streamed(
            axum::body::Body::from_stream(file_chunks(tokio::fs::File::from_std(file))),
            entry.size.unwrap_or(0),
        ),
        Stored::Chunks { hash, size } => {
            let state = state.clone();
            streamed(
                axum::body::Body::from_stream(blobs::chunk_stream(size, move |idx| {
                    state.store.view(|c| blobs::chunk(c, &hash, idx))
                })),
                size,
            )
        }
    };
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(mime).unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    safety_headers(headers, mime, &entry.name);
    Ok(resp)
}

/// Types a browser shows without running anything: served inline. Everything
/// else (HTML, SVG, XML, JavaScript, PDF, unknown types…) is an attachment.
fn is_passive(mime: &str) -> bool {
    let essence = mime
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(
        essence.as_str(),
        "text/plain"
            | "text/markdown"
            | "text/csv"
            | "application/json"
            | "image/png"
            | "image/jpeg"
            | "image/gif"
            | "image/webp"
            | "image/avif"
            | "image/bmp"
    ) || essence.starts_with("audio/")
        || essence.starts_with("video/")
}

/// Every file read: `nosniff`, a sandboxing CSP (nothing in the file may run or
/// load anything), and `attachment` for anything but passive types.
fn safety_headers(headers: &mut axum::http::HeaderMap, mime: &str, name: &str) {
    headers.insert(
        header::CONTENT_DISPOSITION,
        disposition(is_passive(mime), name),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox; default-src 'none'"),
    );
}

/// A file read in 64 KiB chunks; a read error ends the body (the client sees a
/// short body against its `Content-Length`).
fn file_chunks(
    file: tokio::fs::File,
) -> impl futures_util::Stream<Item = std::io::Result<axum::body::Bytes>> {
    futures_util::stream::unfold(Some(file), |file| async move {
        use tokio::io::AsyncReadExt;
        let mut file = file?;
        let mut buf = vec![0u8; 64 * 1024];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(axum::body::Bytes::from(buf)), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
}

/// How long an upload may send nothing before it is given up (408).
const UPLOAD_IDLE: std::time::Duration = std::time::Duration::from_secs(60);

/// `POST /fs/write`: the raw body is streamed to a temp file in the blob
/// directory while it is hashed (never held in memory), then the entry is
/// committed with the blob (on SQLite the file moved to its content address, on
/// PostgreSQL its chunks inserted; see [`blobs`]).
pub(super) async fn write(
    State(state): State<Shared>,
    caller: Caller,
    uri: Uri,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let path = required_path(&uri, "path")?;
    let mime =
        match query_bytes(uri.query(), "mime").map(|m| String::from_utf8_lossy(&m).into_owned()) {
            Some(m) if !m.is_empty() && m.len() <= 255 => m,
            _ => return Err(ApiError::bad_request("`mime` query parameter is required")),
        };
    let collide = match query_bytes(uri.query(), "collide").as_deref() {
        None | Some(b"") | Some(b"error") => Collide::Error,
        Some(b"overwrite") => Collide::Overwrite,
        Some(b"suffix") => Collide::Suffix,
        Some(_) => {
            return Err(fs_err(
                StatusCode::BAD_REQUEST,
                "`collide` must be error, overwrite or suffix",
                "invalid_input",
            ));
        }
    };
    let limit = state.config.max_file_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(size) = declared.filter(|&n| n > limit) {
        return Err(FsError::TooLarge { size, limit }.into());
    }
    // Refuse early what would be refused after the upload anyway.
    let charged = store::charged_to(&path, &caller.name);
    state.store.view(|c| -> Result<(), ApiError> {
        if !can_write(c, &caller, &path)? {
            return Err(forbidden(format!("cannot write to {path}")));
        }
        let replaced = replaced_size(c, &path, collide)?;
        check_quota(&state, c, &charged, declared.unwrap_or(0), replaced)
    })?;
    let staged = blobs::stage(
        &state.blob_dir(),
        body.into_data_stream(),
        limit,
        UPLOAD_IDLE,
        state.config.sync == crate::broker::db::SyncMode::Full,
    )
    .await
    .map_err(|e| match e {
        StageError::TooLarge { limit } => FsError::TooLarge {
            size: limit + 1,
            limit,
        }
        .into(),
        StageError::Idle(d) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("no upload data received for {} s", d.as_secs()),
        ),
        StageError::Body(msg) => ApiError::bad_request(msg),
        StageError::Store(e) => e.into(),
    })?;
    let now = now_ms();
    let (entry, renamed, replaced) = state.store.tx(|c| -> Result<_, ApiError> {
        if !can_write(c, &caller, &path)? {
            return Err(forbidden(format!("cannot write to {path}")));
        }
        let replaced = replaced_size(c, &path, collide)?;
        check_quota(&state, c, &charged, staged.size, replaced)?;
        // A file published for a write that then fails is removed again here, under the write
        // lock. Should the commit itself fail, the file stays (no row references it): the next
        // start removes it, and an upload of the same content meanwhile uses it as is.
        let (entry, renamed) =
            store::write_staged(c, &path, &staged, &mime, collide, &caller.name, now)
                .inspect_err(|_| staged.unpublish())?;
        Ok((entry, renamed, replaced.is_some()))
    })?;
    if replaced && let Err(e) = blobs::empty_trash_after(&state.store, &state.blob_dir()) {
        tracing::warn!(error = %e, "cannot remove replaced blobs");
    }
    Ok(reply(
        StatusCode::OK,
        &obj! {"entry" => &entry, "renamed" => &renamed},
    ))
}

/// The size of the file an overwriting write replaces.
fn replaced_size(c: &Conn<'_>, path: &FsPath, collide: Collide) -> Result<Option<u64>, ApiError> {
    Ok(match collide {
        Collide::Overwrite => store::get(c, path)?.and_then(|e| e.size),
        _ => None,
    })
}

/// 413 `quota_exceeded` if adding `size` bytes (replacing `replaced` bytes)
/// would put `member` over the file quota.
fn check_quota(
    state: &Shared,
    c: &Conn<'_>,
    member: &str,
    size: u64,
    replaced: Option<u64>,
) -> Result<(), ApiError> {
    let Some(quota) = state.config.file_quota_bytes else {
        return Ok(());
    };
    let used = store::usage(c, member)?;
    let after = (used + size).saturating_sub(replaced.unwrap_or(0));
    if after > quota {
        return Err(fs_err(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "file quota exceeded: {member} has {used} of {quota} bytes in use; this file needs {size} more — remove files first"
            ),
            "quota_exceeded",
        )
        .with("used", json!(used))
        .with("quota", json!(quota)));
    }
    Ok(())
}

#[derive(Deserialize)]
pub(super) struct MkdirBody {
    path: String,
    #[serde(default)]
    recursive: bool,
}

pub(super) async fn mkdir(
    State(state): State<Shared>,
    caller: Caller,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let b: MkdirBody = parse_json(&body, "mkdir")?;
    let path = parse_path(b.path.as_bytes())?;
    let entry = state.store.tx(|c| {
        if path.is_root() || !can_write(c, &caller, &path)? {
            return Err(forbidden(format!("cannot mkdir {path}")));
        }
        Ok::<_, ApiError>(store::mkdir(c, &path, b.recursive, &caller.name, now_ms())?)
    })?;
    Ok(reply(StatusCode::OK, &obj! {"entry" => &entry}))
}

pub(super) async fn rm(
    State(state): State<Shared>,
    caller: Caller,
    uri: Uri,
) -> Result<Response, ApiError> {
    let path = required_path(&uri, "path")?;
    let recursive = matches!(
        query_bytes(uri.query(), "recursive").as_deref(),
        Some(b"true") | Some(b"1")
    );
    state.store.tx(|c| {
        if !can_write(c, &caller, &path)? {
            return Err(forbidden(format!("cannot remove {path}")));
        }
        if path.segments().count() < 2 {
            return Err(fs_err(
                StatusCode::BAD_REQUEST,
                format!("cannot remove top-level directory {path}"),
                "invalid_input",
            ));
        }
        Ok::<_, ApiError>(store::remove(c, &path, recursive)?)
    })?;
    if let Err(e) = blobs::empty_trash_after(&state.store, &state.blob_dir()) {
        tracing::warn!(error = %e, "cannot remove deleted blobs");
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
pub(super) struct MvBody {
    from: String,
    to: String,
}

pub(super) async fn mv(
    State(state): State<Shared>,
    caller: Caller,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let b: MvBody = parse_json(&body, "mv")?;
    let from = parse_path(b.from.as_bytes())?;
    let to = parse_path(b.to.as_bytes())?;
    let entry = state.store.tx(|c| {
        if !can_write(c, &caller, &from)? {
            return Err(forbidden(format!("cannot move {from}")));
        }
        if !can_write(c, &caller, &to)? {
            return Err(forbidden(format!("cannot write to {to}")));
        }
        Ok::<_, ApiError>(store::rename(c, &from, &to, &caller.name, now_ms())?)
    })?;
    Ok(reply(StatusCode::OK, &obj! {"entry" => &entry}))
}

pub(super) async fn shared(
    State(state): State<Shared>,
    caller: Caller,
) -> Result<Response, ApiError> {
    let entries = state.store.view(|c| store::shared_with(c, &caller.name))?;
    Ok(reply(StatusCode::OK, &obj! {"entries" => &entries}))
}

pub(super) async fn all(State(state): State<Shared>, caller: Caller) -> Result<Response, ApiError> {
    if !caller.has(Permission::MembersManage) {
        return Err(forbidden(
            "admin permission required to list all files".into(),
        ));
    }
    let entries = state.store.view(store::all_files)?;
    Ok(reply(StatusCode::OK, &obj! {"entries" => &entries}))
}
