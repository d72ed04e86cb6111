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

use std::collections::BTreeSet;
use std::sync::Arc;

use ac7_protocol::domain::message::{self, Audience, LogLevel, Route, is_valid_name};
use ac7_protocol::domain::permission::Permission;
use ac7_protocol::session::live::Reset;
use ac7_protocol::trace::activity::{ACTIVITY_KINDS, ActivityEvent, ActivityUpload};
use ac7_protocol::trace::reminder;
use axum::extract::{FromRequestParts, Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::subscribe::{Opening, Replay, Source, respond, stream_request, subscribe_error};
use super::{ApiError, Body, Caller, Shared, reply};
use crate::broker::activity::{self, DEFAULT_LIMIT, MAX_LIMIT, Query};
use crate::broker::publish::Draft;
use crate::broker::{now_ms, objectives};

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
    // On SQLite: delivered inside the transaction, under the store's write lock, like `/push`:
    // a stream opening with `Last-Event-ID` takes that lock too, so it sees each row either in
    // its replay or live, never both. On PostgreSQL the activity follower delivers the rows
    // after the commit, in id order with every replica's (see `activity_follower`).
    let n = state.store.tx(|c| -> Result<usize, ApiError> {
        // Stamped with the uploader's incarnation; a request authenticated just before its
        // member was removed (its credential is gone now) must not land in a successor's stream.
        let member_seq = match crate::broker::team::member_seq(c, &name)? {
            Some(seq) if crate::broker::team::token_id_exists(c, &caller.token_id)? => seq,
            _ => return Err(ApiError::unauthorized("unknown token")),
        };
        let rows = activity::append(c, &name, member_seq, upload.events, now)?;
        if state.activity_follower.is_none() {
            let only = Audience::Only([name.clone()].into());
            for row in &rows {
                state
                    .activity_hub
                    .deliver(&only, &Arc::new(activity::frame(row)?), now);
            }
        }
        Ok(rows.len())
    })?;
    if let Some(follower) = &state.activity_follower
        && let Err(e) = crate::broker::store::off_worker(|| follower.catch_up(&state))
    {
        tracing::warn!(error = %e, "reading activity back for live delivery failed; the doorbell retries");
    }
    if let Some(context) = context {
        remind(&state, &name, &context, now).await;
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

/// The objective context reminder: a DM from `ac7` listing the member's open objectives
/// missing from `context`, at most once per objective per 5 minutes (cool-downs kept in the
/// store, so replicas share them). A failure
/// is logged; the upload it follows has succeeded either way.
async fn remind(state: &Shared, member: &str, context: &str, now: i64) {
    let open = match state.store.view(|c| objectives::open_for(c, member)) {
        Ok(open) => open,
        Err(e) => {
            tracing::warn!(error = %e, "objective context reminder: cannot list objectives");
            return;
        }
    };
    let body = match state
        .store
        .tx(|c| activity::remind_check(c, member, context, &open, now))
    {
        Ok(body) => body,
        Err(e) => {
            tracing::warn!(error = %e, "objective context reminder: cannot check cool-downs");
            return;
        }
    };
    let Some(body) = body else {
        return;
    };
    let route = Route::Direct {
        to: member.to_owned(),
    };
    let draft = Draft {
        to: Some(member.to_owned()),
        from: REMINDER_SENDER.to_owned(),
        title: Some(reminder::TITLE.to_owned()),
        body,
        level: LogLevel::Notice,
        data: Default::default(),
        attachments: Vec::new(),
    };
    let audience = message::audience(Some(REMINDER_SENDER), &route, &BTreeSet::new());
    if let Err(e) = state.writer.push(draft, audience, now).await {
        tracing::warn!(error = %e, "objective context reminder: cannot send");
    }
}

/// Who the reminder is from (a reserved name no member can take).
const REMINDER_SENDER: &str = "ac7";

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
    let rows = state.store.view(|c| activity::list(c, &name, &q, false))?;
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
    let now = now_ms();
    // In a write transaction although it only reads: on SQLite that takes the lock uploads
    // deliver under, and the stream is registered before it is released, so the head and the
    // live tail join without a gap or a duplicate. On PostgreSQL the stream is registered with
    // the activity follower, whose position ends the replay (see `activity_follower`).
    let (opening, sub) = state.store.tx_then(
        |c| -> Result<_, ApiError> {
            let head = activity::head(c, &name)?;
            let opening = match &last_id {
                None => Opening::Live,
                Some(id) => match id.trim().parse::<i64>() {
                    Ok(cursor) if (0..=activity::last_id(c)?).contains(&cursor) => {
                        Opening::Replay(Replay {
                            state: Arc::clone(&state),
                            source: Source::Activity {
                                member: name.clone(),
                            },
                            cursor,
                            head,
                        })
                    }
                    _ => Opening::Reset(Reset::unknown_id(id)),
                },
            };
            if !crate::broker::team::token_id_exists(c, &caller.token_id)? {
                return Err(ApiError::unauthorized("unknown token"));
            }
            Ok(opening)
        },
        |opening| -> Result<_, ApiError> {
            let watch = || {
                state
                    .activity_hub
                    .watch(&name, &caller.name, &caller.token_id, now)
            };
            let Some(follower) = &state.activity_follower else {
                return Ok((opening, watch().map_err(subscribe_error)?));
            };
            let cursor = match &opening {
                Opening::Replay(replay) => Some(replay.cursor),
                Opening::Live | Opening::Reset(_) => None,
            };
            let (sub, delivered) = follower.watch_at(&state, cursor, watch)?;
            let opening = match opening {
                Opening::Replay(mut replay) => {
                    replay.head = delivered;
                    Opening::Replay(replay)
                }
                other => other,
            };
            Ok((opening, sub.map_err(subscribe_error)?))
        },
    )??;
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
    let (rows, intervals) = state.store.view(|c| -> Result<_, ApiError> {
        objectives::load_for(
            c,
            &id,
            &caller.name,
            caller.permissions,
            ac7_protocol::domain::objective::Action::View,
        )?;
        let mut intervals = activity::objective_intervals(c, &id)?;
        if !caller.has(Permission::ActivityRead) {
            let me = crate::broker::team::member_seq(c, &caller.name)?;
            intervals.retain(|iv| iv.member == caller.name && Some(iv.member_seq) == me);
        }
        let rows = activity::in_intervals(c, &intervals, q.before_id, q.limit)?;
        Ok((rows, intervals))
    })?;
    let intervals: Vec<_> = intervals
        .iter()
        .map(|iv| json!({"memberName": iv.member, "from": iv.from, "to": iv.to}))
        .collect();
    Ok(reply(
        StatusCode::OK,
        &json!({"activity": rows, "intervals": intervals}),
    ))
}
