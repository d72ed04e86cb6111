//! `POST /members/:name/activity` and `GET /members/:name/activity`
//! (activity.md §3.2, §3.3; the store is [`crate::broker::activity`]).
//!
//! Uploads come from the member itself. Reads are for the member and for holders
//! of `activity.read`. Query parameters of the list: `from`, `to` (inclusive
//! bounds on the event's `ts`, epoch ms), `kind` (repeatable, any of the four
//! kinds), `before_id` (row id: only older rows, the paging cursor), `limit`
//! (a positive integer, default 200, at most 1000 — larger values are clamped).

use ac7_protocol::message::is_valid_name;
use ac7_protocol::permission::Permission;
use ac7_protocol::trace::activity::{ACTIVITY_KINDS, ActivityUpload};
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::{ApiError, Body, Caller, Shared, percent_decode, reply};
use crate::broker::activity::{self, DEFAULT_LIMIT, MAX_LIMIT, Query};
use crate::broker::now_ms;

/// 400 unless `name` is a valid member name.
pub(super) fn check_name(name: &str) -> Result<(), ApiError> {
    if is_valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::bad_request("invalid name"))
    }
}

/// 403 unless `caller` is `name` or holds `activity.read`; `doing` names the act.
pub(super) fn check_reader(caller: &Caller, name: &str, doing: &str) -> Result<(), ApiError> {
    if caller.name == name || caller.has(Permission::ActivityRead) {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "{doing} activity requires activity.read permission, or self"
        )))
    }
}

/// `POST /members/:name/activity`: 201 `{"accepted": n}`.
pub(super) async fn upload(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    if caller.name != name {
        return Err(ApiError::forbidden(format!(
            "user '{}' cannot upload activity for '{name}'",
            caller.name
        )));
    }
    let upload = ActivityUpload::parse(&body)
        .map_err(|e| ApiError::invalid("activity", vec![json!({"message": e.to_string()})]))?;
    let rows = state
        .store
        .with(|conn| activity::append(conn, &name, upload.events, now_ms()))?;
    let n = rows.len();
    Ok(reply(StatusCode::CREATED, &json!({"accepted": n})))
}

/// The query pairs of `raw`, percent-decoded.
fn pairs(raw: Option<&str>) -> Vec<(String, String)> {
    raw.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (
                String::from_utf8_lossy(&percent_decode(k)).into_owned(),
                String::from_utf8_lossy(&percent_decode(v)).into_owned(),
            )
        })
        .collect()
}

/// An integer parameter; non-numeric → 400 naming it.
fn int_param(v: &str, key: &str) -> Result<i64, ApiError> {
    v.trim().parse::<i64>().map_err(|_| {
        ApiError::bad_request(format!("invalid `{key}` parameter: expected an integer"))
    })
}

/// Parses the list query (see the module docs).
pub(super) fn parse_query(raw: Option<&str>) -> Result<Query, ApiError> {
    let mut q = Query {
        limit: DEFAULT_LIMIT,
        ..Query::default()
    };
    for (k, v) in pairs(raw) {
        match k.as_str() {
            "from" => q.from = Some(int_param(&v, "from")?),
            "to" => q.to = Some(int_param(&v, "to")?),
            "before_id" => q.before_id = Some(int_param(&v, "before_id")?),
            "kind" => {
                let kind = ACTIVITY_KINDS
                    .iter()
                    .find(|k| **k == v)
                    .ok_or_else(|| ApiError::bad_request(format!("invalid kind: {v}")))?;
                if !q.kinds.contains(kind) {
                    q.kinds.push(kind);
                }
            }
            "limit" => {
                let n = int_param(&v, "limit")?;
                if n < 1 {
                    return Err(ApiError::bad_request(
                        "invalid `limit` parameter: expected a positive integer",
                    ));
                }
                q.limit = usize::try_from(n).unwrap_or(MAX_LIMIT).min(MAX_LIMIT);
            }
            _ => {}
        }
    }
    Ok(q)
}

/// `GET /members/:name/activity`: 200 `{"activity": [row…]}`, newest first.
pub(super) async fn list(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    check_reader(&caller, &name, "reading")?;
    let q = parse_query(raw.as_deref())?;
    let rows = state
        .store
        .read(|conn| activity::list(conn, &name, &q, false))?;
    Ok(reply(StatusCode::OK, &json!({"activity": rows})))
}
