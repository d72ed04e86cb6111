//! `POST /members/:name/activity` and `GET /members/:name/activity`
//! (the store is [`crate::broker::activity`]).
//!
//! Uploads come from the member itself, and are redacted here as the runner redacts
//! what it records (a client may post directly). Reads are for the member and for holders
//! of `activity.read`. Query parameters of the list: `from`, `to` (inclusive
//! bounds on the event's `ts`, epoch ms), `kind` (repeatable, any of the five
//! kinds), `before_id` (row id: only older rows, the paging cursor), `limit`
//! (a positive integer, default 200, at most 1000 — larger values are clamped).
//!
//! `GET /members/:name/activity/stream` is the live tail, with the same
//! visibility: a WebSocket for an upgrade request (one `ActivityRow` JSON per text
//! frame), SSE otherwise (`id: <row id>`, `event: activity`, `data: <row>`, a `:`
//! keepalive). With `Last-Event-ID` (or `?lastEventId=`) the member's rows after
//! that id are replayed first, oldest first, then live rows, with no gap and no
//! duplicate; an id that is not a row id of this broker gets the `reset` event of
//! `/subscribe` first. With replicas (PostgreSQL) row ids are the shared table's, so a stream
//! resumes on any replica the same way, and every replica's watchers get every row
//! ([`crate::broker::activity_follower`]). It shares `/subscribe`'s machinery (byte- and
//! frame-capped queues, paged replay, revocation) but not its hub: activity never
//! reaches an agent's `/subscribe` stream.

use std::sync::Arc;

use ac7_protocol::domain::message::is_valid_name;
use ac7_protocol::domain::permission::Permission;
use ac7_protocol::session::live::Reset;
use ac7_protocol::trace::activity::{ACTIVITY_KINDS, ActivityEvent, ActivityUpload};
use ac7_protocol::trace::reminder;
use axum::extract::{FromRequestParts, Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::subscribe::{Opening, Replay, Source, respond, stream_request};
use super::{ApiError, Body, Caller, Shared, reply};
use crate::broker::activity::{self, DEFAULT_LIMIT, MAX_LIMIT, Query, StreamStart};
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
    let mut upload = ActivityUpload::parse(&body)
        .map_err(|e| ApiError::invalid("activity", vec![json!({"message": e.to_string()})]))?;
    // The runner redacts what it records; a client posting here directly may not have.
    for event in &mut upload.events {
        redact(event).map_err(|e| ApiError::invalid("activity", vec![json!({"message": e})]))?;
    }
    let now = now_ms();
    let context = reminder::reminder_context(&upload.events);
    let n = activity::upload(&state, &name, &caller.token_id, upload.events, now)?;
    if let Some(context) = context {
        activity::remind(&state, &name, &context, now).await;
    }
    Ok(reply(StatusCode::CREATED, &json!({"accepted": n})))
}

/// Redacts `event` in place with the runner's redactor (`ac7_protocol::trace::redact`):
/// every string of an LLM exchange (and the whole value of credential keys), and an opaque
/// exchange's URL, host, previews and headers (credential headers whole). Idempotent: what
/// the runner already redacted comes out the same.
fn redact(event: &mut ActivityEvent) -> Result<(), String> {
    use ac7_protocol::trace::redact::{redact_header, redact_json, redact_text};
    let text = |s: &mut String| {
        if let std::borrow::Cow::Owned(r) = redact_text(s) {
            *s = r;
        }
    };
    match event {
        ActivityEvent::ObjectiveOpen { .. } | ActivityEvent::ObjectiveClose { .. } => {}
        ActivityEvent::TurnFailed { reason, .. } => text(reason),
        ActivityEvent::LlmExchange { entry, .. } => {
            let mut value = serde_json::to_value(&*entry).map_err(|e| e.to_string())?;
            redact_json(&mut value);
            *entry = serde_json::from_value(value)
                .map_err(|e| format!("an llm_exchange entry cannot be redacted: {e}"))?;
        }
        ActivityEvent::OpaqueHttp { entry, .. } => {
            text(&mut entry.url);
            text(&mut entry.host);
            text(&mut entry.method);
            for headers in [&mut entry.request_headers, &mut entry.response_headers] {
                for (name, value) in headers.iter_mut() {
                    *value = redact_header(name, value);
                }
            }
            for preview in [
                &mut entry.request_body_preview,
                &mut entry.response_body_preview,
            ]
            .into_iter()
            .flatten()
            {
                text(preview);
            }
        }
    }
    Ok(())
}

/// The query pairs of `raw`, percent-decoded (`+` is a space; invalid UTF-8 becomes U+FFFD).
fn pairs(raw: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(raw.unwrap_or("").as_bytes())
        .into_owned()
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
    let rows = activity::list_rows(&state.store, &name, &q)?;
    Ok(reply(StatusCode::OK, &json!({"activity": rows})))
}

/// `GET /members/:name/activity/stream`: SSE or WebSocket (see the module docs).
pub(super) async fn stream(
    State(state): State<Shared>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Response, ApiError> {
    let (mut parts, _body) = req.into_parts();
    let caller = Caller::from_request_parts(&mut parts, &state).await?;
    check_name(&name)?;
    check_reader(&caller, &name, "streaming")?;
    let (last_id, upgrade) = stream_request(&mut parts, &state).await?;
    let (start, sub) = activity::open_stream(
        &state,
        &name,
        &caller.name,
        &caller.token_id,
        last_id.as_deref(),
        now_ms(),
    )?;
    let opening = match start {
        StreamStart::Live => Opening::Live,
        StreamStart::Replay { cursor, head } => Opening::Replay(Replay {
            state: Arc::clone(&state),
            source: Source::Activity { member: name },
            cursor,
            head,
        }),
        StreamStart::Unknown => Opening::Reset(Reset::unknown_id(last_id.as_deref().unwrap_or(""))),
    };
    Ok(respond(&state, upgrade, opening, sub, true))
}

/// `GET /objectives/:id/activity`: the exchanges of every member within its
/// open intervals on the objective (from its `objective_open`/`objective_close`
/// markers), newest first: `{"activity": [row…], "intervals": [{memberName,
/// from, to}…]}`. The caller must be able to view the objective; without
/// `activity.read` only the caller's own rows and intervals are included.
/// `before_id` and `limit` page as on the member list.
pub(super) async fn objective(
    State(state): State<Shared>,
    caller: Caller,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = parse_query(raw.as_deref())?;
    let (rows, intervals) =
        activity::objective_activity(&state.store, &caller.name, caller.permissions, &id, &q)?;
    let intervals: Vec<_> = intervals
        .iter()
        .map(|iv| json!({"memberName": iv.member, "from": iv.from, "to": iv.to}))
        .collect();
    Ok(reply(
        StatusCode::OK,
        &json!({"activity": rows, "intervals": intervals}),
    ))
}
