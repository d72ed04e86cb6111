//! `/fs…`: ls, stat, read, write (raw body), mkdir, rm, mv, shared, all.
//!
//! Access: `members.manage` holders may do anything; a member owns `/<name>/…`;
//! the members of an objective (assignee, originator, watchers) own
//! `/objectives/<id>/…`; anyone who received a file as an attachment may read it.
//! Listing needs ownership (objective members may list their objective's folder).
//! Paths are normalised and `..`, `//`, NUL and non-UTF-8 are refused with 400.

use ac7_protocol::permission::Permission;
use ac7_protocol::vfs::{FsPath, Scope};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use rusqlite::Connection;
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, Body, Caller, Shared, disposition, obj, parse_json, query_bytes, reply};
use crate::broker::fs::{self as store, Collide, FsError};
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

fn is_objective_member(conn: &Connection, id: &str, name: &str) -> Result<bool, ApiError> {
    Ok(objectives::get(conn, id)?
        .is_some_and(|o| ac7_protocol::objective::is_thread_member(&o, name, false)))
}

/// Whether `caller` owns `path` (may write, delete, move, list there).
pub(crate) fn can_write(
    conn: &Connection,
    caller: &Caller,
    path: &FsPath,
) -> Result<bool, ApiError> {
    if caller.has(Permission::MembersManage) {
        return Ok(true);
    }
    match path.scope() {
        Scope::Root | Scope::ObjectivesRoot => Ok(false),
        Scope::Home { member } => Ok(member == caller.name),
        Scope::Objective { id } => is_objective_member(conn, id, &caller.name),
    }
}

/// Whether `caller` may read `path`: ownership or a grant.
pub(crate) fn can_read(
    conn: &Connection,
    caller: &Caller,
    path: &FsPath,
) -> Result<bool, ApiError> {
    Ok(can_write(conn, caller, path)? || store::has_grant(conn, path, &caller.name)?)
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
    state.store.with(|conn| {
        let entries = if path.is_root() {
            let all = store::children(conn, &path)?;
            if caller.has(Permission::MembersManage) {
                all
            } else {
                all.into_iter()
                    .filter(|e| e.path.trim_start_matches('/') == caller.name)
                    .collect()
            }
        } else {
            if !can_write(conn, &caller, &path)? {
                return Err(forbidden(format!("cannot list {path}")));
            }
            match store::get(conn, &path)? {
                Some(e) if !e.is_dir() => {
                    return Err(fs_err(
                        StatusCode::CONFLICT,
                        format!("not a directory: {path}"),
                        "not_a_directory",
                    ));
                }
                Some(_) => store::children(conn, &path)?,
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
    state.store.with(|conn| {
        if !can_read(conn, &caller, &path)? {
            return Err(forbidden(format!("cannot stat {path}")));
        }
        let entry = store::get(conn, &path)?
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
    let (entry, bytes) = state.store.with(|conn| -> Result<_, ApiError> {
        if !can_read(conn, &caller, &path)? {
            return Err(forbidden(format!("cannot stat {path}")));
        }
        let entry = store::get(conn, &path)?
            .ok_or_else(|| FsError::NotFound(format!("no such path: {path}")))?;
        if entry.is_dir() {
            return Err(FsError::IsADirectory(path.to_string()).into());
        }
        let bytes = store::read(conn, &entry)?;
        Ok((entry, bytes))
    })?;
    let mime = entry
        .mime_type
        .as_deref()
        .unwrap_or("application/octet-stream");
    let mut resp = bytes.into_response();
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

pub(super) async fn write(
    State(state): State<Shared>,
    caller: Caller,
    uri: Uri,
    Body(body): Body,
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
    if body.len() as u64 > limit {
        return Err(FsError::TooLarge {
            size: body.len() as u64,
            limit,
        }
        .into());
    }
    let state2 = state.clone();
    let now = now_ms();
    // Large bodies: hash and store off the async workers.
    tokio::task::spawn_blocking(move || {
        state2.store.with(|conn| -> Result<_, ApiError> {
            if !can_write(conn, &caller, &path)? {
                return Err(forbidden(format!("cannot write to {path}")));
            }
            let tx = conn
                .transaction()
                .map_err(crate::broker::db::StoreError::from)?;
            let (entry, renamed) =
                store::write(&tx, &path, &body, &mime, collide, &caller.name, now)?;
            tx.commit().map_err(crate::broker::db::StoreError::from)?;
            Ok(reply(
                StatusCode::OK,
                &obj! {"entry" => &entry, "renamed" => &renamed},
            ))
        })
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("write task failed: {e}"),
        )
    })?
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
    state.store.with(|conn| {
        if path.is_root() || !can_write(conn, &caller, &path)? {
            return Err(forbidden(format!("cannot mkdir {path}")));
        }
        let tx = conn
            .transaction()
            .map_err(crate::broker::db::StoreError::from)?;
        let entry = store::mkdir(&tx, &path, b.recursive, &caller.name, now_ms())?;
        tx.commit().map_err(crate::broker::db::StoreError::from)?;
        Ok(reply(StatusCode::OK, &obj! {"entry" => &entry}))
    })
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
    state.store.with(|conn| {
        if !can_write(conn, &caller, &path)? {
            return Err(forbidden(format!("cannot remove {path}")));
        }
        if path.segments().count() < 2 {
            return Err(fs_err(
                StatusCode::BAD_REQUEST,
                format!("cannot remove top-level directory {path}"),
                "invalid_input",
            ));
        }
        let tx = conn
            .transaction()
            .map_err(crate::broker::db::StoreError::from)?;
        store::remove(&tx, &path, recursive)?;
        tx.commit().map_err(crate::broker::db::StoreError::from)?;
        Ok(StatusCode::NO_CONTENT.into_response())
    })
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
    state.store.with(|conn| {
        if !can_write(conn, &caller, &from)? {
            return Err(forbidden(format!("cannot move {from}")));
        }
        if !can_write(conn, &caller, &to)? {
            return Err(forbidden(format!("cannot write to {to}")));
        }
        let tx = conn
            .transaction()
            .map_err(crate::broker::db::StoreError::from)?;
        let entry = store::rename(&tx, &from, &to, &caller.name, now_ms())?;
        tx.commit().map_err(crate::broker::db::StoreError::from)?;
        Ok(reply(StatusCode::OK, &obj! {"entry" => &entry}))
    })
}

pub(super) async fn shared(
    State(state): State<Shared>,
    caller: Caller,
) -> Result<Response, ApiError> {
    let entries = state
        .store
        .with(|conn| store::shared_with(conn, &caller.name))?;
    Ok(reply(StatusCode::OK, &obj! {"entries" => &entries}))
}

pub(super) async fn all(State(state): State<Shared>, caller: Caller) -> Result<Response, ApiError> {
    if !caller.has(Permission::MembersManage) {
        return Err(forbidden(
            "admin permission required to list all files".into(),
        ));
    }
    let entries = state.store.with(|conn| store::all_files(conn))?;
    Ok(reply(StatusCode::OK, &obj! {"entries" => &entries}))
}
