//! `/fs…`: ls, stat, read, write (raw body), mkdir, rm, mv, shared, all.
//!
//! Access: `members.manage` holders may do anything; a member owns `/<name>/…`;
//! the members of an objective (assignee, originator, watchers) own
//! `/objectives/<id>/…`; anyone who received a file as an attachment may read it.
//! Listing needs ownership (objective members may list their objective's folder).
//! Paths are normalised and `..`, `//`, NUL and non-UTF-8 are refused with 400.

use ac7_protocol::domain::vfs::FsPath;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, Body, Caller, Shared, disposition, obj, parse_json, query_bytes, reply};
use crate::broker::blobs::{self, StageError, Stored};
use crate::broker::fs::{self as store, Collide, FsError, Upload};
use crate::broker::now_ms;

fn fs_err(status: StatusCode, msg: impl Into<String>, code: &str) -> ApiError {
    ApiError::new(status, msg).with("code", json!(code))
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

impl From<FsError> for ApiError {
    fn from(e: FsError) -> Self {
        let msg = e.to_string();
        match e {
            FsError::Store(inner) => inner.into(),
            FsError::NoSuchPath(_) => ApiError::not_found(msg),
            FsError::QuotaExceeded { used, quota, .. } => {
                fs_err(StatusCode::PAYLOAD_TOO_LARGE, msg, "quota_exceeded")
                    .with("used", json!(used))
                    .with("quota", json!(quota))
            }
            e => {
                let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
                ApiError::new(status, msg).with("code", json!(e.code()))
            }
        }
    }
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
    let entries = store::list_dir(&state.store, &caller.name, caller.permissions, &path)?;
    Ok(reply(StatusCode::OK, &obj! {"entries" => &entries}))
}

pub(super) async fn stat(
    State(state): State<Shared>,
    caller: Caller,
    uri: Uri,
) -> Result<Response, ApiError> {
    let path = required_path(&uri, "path")?;
    let entry = store::stat_entry(&state.store, &caller.name, caller.permissions, &path)?;
    Ok(reply(StatusCode::OK, &obj! {"entry" => &entry}))
}

pub(super) async fn read(
    State(state): State<Shared>,
    caller: Caller,
    uri: Uri,
) -> Result<Response, ApiError> {
    let raw = uri.path().strip_prefix("/fs/read").unwrap_or("");
    let path = parse_path(&super::percent_decode_with(raw, false))?;
    let (entry, content) = store::open_file(
        &state.store,
        &state.blob_dir(),
        &caller.name,
        caller.permissions,
        &path,
    )?;
    let mime = entry
        .mime_type
        .as_deref()
        .unwrap_or("application/octet-stream");
    Ok(match content {
        Stored::Inline(bytes) => {
            let mut resp = bytes.into_response();
            typed(resp.headers_mut(), mime, &entry.name);
            resp
        }
        Stored::File(file) => streamed(
            axum::body::Body::from_stream(file_chunks(tokio::fs::File::from_std(file))),
            entry.size.unwrap_or(0),
            mime,
            &entry.name,
        ),
        Stored::Chunks { hash, size } => {
            let state = state.clone();
            streamed(
                axum::body::Body::from_stream(blobs::chunk_stream(size, move |idx| {
                    store::read_chunk(&state.store, &hash, idx)
                })),
                size,
                mime,
                &entry.name,
            )
        }
    })
}

/// A streamed file of `size` bytes, typed `mime`, named `name`.
pub(super) fn streamed(body: axum::body::Body, size: u64, mime: &str, name: &str) -> Response {
    let mut resp = body.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    typed(resp.headers_mut(), mime, name);
    resp
}

/// A served file's type and the headers that keep a browser safe with it.
fn typed(headers: &mut axum::http::HeaderMap, mime: &str, name: &str) {
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(mime).unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    safety_headers(headers, mime, name);
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
pub(super) fn file_chunks(
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
    let upload = Upload {
        path: &path,
        mime: &mime,
        collide,
    };
    // Refuse early what would be refused after the upload anyway.
    store::check_upload(
        &state,
        &caller.name,
        caller.permissions,
        upload,
        declared.unwrap_or(0),
    )?;
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
    let (entry, renamed) = store::commit_upload(
        &state,
        &caller.name,
        caller.permissions,
        upload,
        &staged,
        now_ms(),
    )?;
    Ok(reply(
        StatusCode::OK,
        &obj! {"entry" => &entry, "renamed" => &renamed},
    ))
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
    let entry = store::make_dir(
        &state.store,
        &caller.name,
        caller.permissions,
        &path,
        b.recursive,
        now_ms(),
    )?;
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
    store::remove_path(&state, &caller.name, caller.permissions, &path, recursive)?;
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
    let entry = store::move_path(
        &state.store,
        &caller.name,
        caller.permissions,
        &from,
        &to,
        now_ms(),
    )?;
    Ok(reply(StatusCode::OK, &obj! {"entry" => &entry}))
}

pub(super) async fn shared(
    State(state): State<Shared>,
    caller: Caller,
) -> Result<Response, ApiError> {
    let entries = store::shared_with_member(&state.store, &caller.name)?;
    Ok(reply(StatusCode::OK, &obj! {"entries" => &entries}))
}

pub(super) async fn all(State(state): State<Shared>, caller: Caller) -> Result<Response, ApiError> {
    let entries = store::every_file(&state.store, caller.permissions)?;
    Ok(reply(StatusCode::OK, &obj! {"entries" => &entries}))
}
