//! `/objectives…`: list, view, create, update, complete, cancel, reassign,
//! watchers (POST and PATCH), discuss.
//!
//! Every mutation, its audit events and its lifecycle messages are committed in
//! one transaction before the response; the pushes go out right after the commit.

use std::sync::Arc;

use ac7_protocol::domain::message::{self, Attachment, Audience, LogLevel, Route};
use ac7_protocol::domain::objective::{
    self as rules, Action, Change, MAX_BODY_CHARS, MAX_DISCUSS_CHARS, MAX_OUTCOME_CHARS,
    MAX_REASON_CHARS, MAX_RESULT_CHARS, MAX_TITLE_CHARS, MAX_WATCHERS, NewObjective, Objective,
    ObjectiveEvent, Status,
};
use ac7_protocol::domain::permission::Permission;
use ac7_protocol::domain::vfs::FsPath;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;

use super::chat::canonical_attachments;
use super::{ApiError, Body, Caller, Issues, Sender, Shared, obj, parse_json, reply};
use crate::broker::db::StoreError;
use crate::broker::hub::Frame;
use crate::broker::objectives::{self as store, ListFilter};
use crate::broker::publish::grant_attachments;
use crate::broker::publish::{self, Draft};
use crate::broker::store::Conn;
use crate::broker::{AppState, fs, now_ms, team};

#[derive(Deserialize)]
pub(super) struct ListQuery {
    assignee: Option<String>,
    status: Option<String>,
}

pub(super) async fn list(
    State(state): State<Shared>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let status = match q.status.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(Status::parse(s).ok_or_else(|| {
            ApiError::bad_request("invalid query").with(
                "details",
                json!([{
                    "code": "invalid_value", "values": ["active", "blocked", "done", "cancelled"], "path": ["status"],
                    "message": "Invalid option: expected one of \"active\"|\"blocked\"|\"done\"|\"cancelled\"",
                }]),
            )
        })?),
    };
    let assignee = q.assignee.filter(|s| !s.is_empty());
    if let Some(a) = &assignee
        && !message::is_valid_name(a)
    {
        return Err(ApiError::bad_request("invalid query")
            .with("details", json!([super::name_issue("assignee")])));
    }
    let objectives = state.store.view(|c| -> Result<_, ApiError> {
        if caller.has(Permission::ObjectivesCreate) {
            Ok(store::list(
                c,
                &ListFilter {
                    assignee: assignee.as_deref(),
                    status,
                    participant: None,
                },
            )?)
        } else {
            if assignee.as_ref().is_some_and(|a| *a != caller.name) {
                return Err(ApiError::forbidden(
                    "members without objectives.create may only list their own objectives",
                ));
            }
            Ok(store::list(
                c,
                &ListFilter {
                    assignee: None,
                    status,
                    participant: Some(&caller.name),
                },
            )?)
        }
    })?;
    Ok(reply(StatusCode::OK, &obj! {"objectives" => &objectives}))
}

pub(super) fn load(c: &Conn<'_>, id: &str) -> Result<Objective, ApiError> {
    store::get(c, id)?.ok_or_else(|| ApiError::not_found(format!("no such objective: {id}")))
}

pub(super) fn authorize(obj: &Objective, caller: &Caller, action: Action) -> Result<(), ApiError> {
    rules::authorize(obj, &caller.name, caller.permissions, action)
        .map_err(|e| ApiError::forbidden(e.0))
}

pub(super) async fn view(
    State(state): State<Shared>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (obj, events) = state.store.view(|c| {
        let obj = load(c, &id)?;
        authorize(&obj, &caller, Action::View)?;
        let events = store::events(c, &id)?;
        Ok::<_, ApiError>((obj, events))
    })?;
    #[derive(serde::Serialize)]
    struct View {
        objective: Objective,
        events: Vec<ObjectiveEvent>,
    }
    Ok(reply(
        StatusCode::OK,
        &View {
            objective: obj,
            events,
        },
    ))
}

/// Logs one lifecycle message per event (inside `conn`'s transaction) and returns
/// the frames with their audiences, to deliver after commit.
fn log_events(
    c: &Conn<'_>,
    obj: &Objective,
    events: &[ObjectiveEvent],
    now: i64,
) -> Result<Vec<(Audience, Arc<Frame>)>, StoreError> {
    let managers = team::managers(c)?;
    let mut out = Vec::with_capacity(events.len());
    for ev in events {
        let recipients = rules::event_recipients(obj, ev, managers.iter().map(String::as_str));
        let audience = message::audience(
            Some(&ev.actor),
            &Route::Objective(obj.id.clone()),
            &recipients,
        );
        let (_, frame) = publish::log(
            c,
            Draft {
                to: None,
                from: ev.actor.clone(),
                title: None,
                body: rules::lifecycle_body(obj, ev),
                level: LogLevel::Info,
                data: rules::lifecycle_data(obj, ev),
                attachments: Vec::new(),
            },
            &audience,
            now,
        )?;
        out.push((audience, frame));
    }
    Ok(out)
}

fn deliver_all(state: &AppState, frames: &[(Audience, Arc<Frame>)], now: i64) {
    for (audience, frame) in frames {
        publish::deliver(state, audience, frame, now);
    }
}

#[derive(Deserialize)]
pub(super) struct CreateBody {
    title: String,
    outcome: String,
    assignee: String,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    watchers: Option<Vec<String>>,
    #[serde(default)]
    attachments: Option<Vec<Attachment>>,
}

pub(super) async fn create(
    State(state): State<Shared>,
    Sender(caller): Sender,
    Body(body): Body,
) -> Result<Response, ApiError> {
    if !caller.has(Permission::ObjectivesCreate) {
        return Err(ApiError::forbidden(rules::CREATE_FORBIDDEN));
    }
    let b: CreateBody = parse_json(&body, "objective")?;
    let watchers = b.watchers.unwrap_or_default();
    let mut issues = Issues::default();
    // The schema checks the text as sent (as ac7's does): "" is a payload issue, while a
    // blank "   " passes here and the store, which trims, answers "title is required".
    issues
        .len("title", &b.title, 1, MAX_TITLE_CHARS)
        .len("outcome", &b.outcome, 1, MAX_OUTCOME_CHARS)
        .opt_len("body", b.body.as_deref(), 0, MAX_BODY_CHARS)
        .name("assignee", &b.assignee)
        .count("watchers", watchers.len(), MAX_WATCHERS)
        .count(
            "attachments",
            b.attachments.as_ref().map_or(0, Vec::len),
            message::MAX_ATTACHMENTS,
        );
    for w in &watchers {
        issues.name("watchers", w);
    }
    issues.finish("objective")?;
    let now = now_ms();
    let obj = state.store.tx_then(
        |c| {
            if !team::member_exists(c, &b.assignee)? {
                return Err(ApiError::bad_request(format!(
                    "unknown assignee: {}",
                    b.assignee
                )));
            }
            for w in &watchers {
                if !team::member_exists(c, w)? {
                    return Err(ApiError::bad_request(format!("unknown watcher: {w}")));
                }
            }
            let given = canonical_attachments(c, &caller, b.attachments.as_deref().unwrap_or(&[]))?;
            let id = state.next_objective_id(c, now)?;
            let mut attachments = Vec::with_capacity(given.len());
            for a in &given {
                let src =
                    FsPath::parse(&a.path).map_err(|e| ApiError::bad_request(e.to_string()))?;
                let entry = fs::get(c, &src)?
                    .ok_or_else(|| ApiError::bad_request(format!("attachment not found: {src}")))?;
                let dest = FsPath::parse(&format!("/objectives/{id}"))
                    .and_then(|d| d.join(src.name()))
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
                let copied = fs::copy(c, &entry, &dest, &caller.name, now)?;
                attachments.push(Attachment {
                    path: copied.path,
                    name: copied.name,
                    size: copied.size.unwrap_or(0),
                    mime_type: copied
                        .mime_type
                        .unwrap_or_else(|| "application/octet-stream".into()),
                });
            }
            let (obj, events) = rules::create(
                NewObjective {
                    id,
                    title: b.title.clone(),
                    outcome: b.outcome.clone(),
                    body: b.body.clone().unwrap_or_default(),
                    assignee: b.assignee.clone(),
                    originator: caller.name.clone(),
                    watchers: watchers.clone(),
                    attachments,
                },
                now,
            )
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
            store::insert(c, &obj, &events)?;
            let frames = log_events(c, &obj, &events, now)?;
            Ok::<_, ApiError>((obj, frames))
        },
        |(obj, frames)| {
            deliver_all(&state, &frames, now);
            obj
        },
    )?;
    Ok(reply(StatusCode::OK, &obj))
}

/// Loads, authorizes, checks, applies, persists and announces one change.
fn mutate(
    state: &AppState,
    caller: &Caller,
    id: &str,
    action: Action,
    check: impl FnOnce(&Conn<'_>) -> Result<(), ApiError>,
    change: Change,
) -> Result<Response, ApiError> {
    let now = now_ms();
    let obj = state.store.tx_then(
        |c| {
            let mut obj = load(c, id)?;
            authorize(&obj, caller, action)?;
            check(c)?;
            let events = rules::apply(&mut obj, &caller.name, change, now).map_err(|e| {
                ApiError::new(
                    StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST),
                    e.to_string(),
                )
            })?;
            store::update(c, &obj, &events)?;
            let frames = log_events(c, &obj, &events, now)?;
            Ok::<_, ApiError>((obj, frames))
        },
        |(obj, frames)| {
            deliver_all(state, &frames, now);
            obj
        },
    )?;
    Ok(reply(StatusCode::OK, &obj))
}

fn no_check(_: &Conn<'_>) -> Result<(), ApiError> {
    Ok(())
}

#[derive(Deserialize)]
pub(super) struct UpdateBody {
    #[serde(default)]
    status: Option<String>,
    #[serde(default, rename = "blockReason")]
    block_reason: Option<String>,
}

pub(super) async fn update(
    State(state): State<Shared>,
    Sender(caller): Sender,
    Path(id): Path<String>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let b: UpdateBody = parse_json(&body, "update")?;
    let mut issues = Issues::default();
    if b.status.is_none() && b.block_reason.is_none() {
        issues.custom("update must include at least one of: status, blockReason");
    }
    issues.opt_len(
        "blockReason",
        b.block_reason.as_deref(),
        0,
        MAX_REASON_CHARS,
    );
    let status = match b.status.as_deref() {
        None => None,
        Some("active") => Some(Status::Active),
        Some("blocked") => Some(Status::Blocked),
        Some(_) => {
            return Err(ApiError::invalid(
                "update",
                vec![
                    json!({"code": "invalid_value", "values": ["active", "blocked"], "path": ["status"],
                    "message": "Invalid option: expected one of \"active\"|\"blocked\""}),
                ],
            ));
        }
    };
    issues.finish("update")?;
    mutate(
        &state,
        &caller,
        &id,
        Action::Update,
        no_check,
        Change::Update {
            status,
            block_reason: b.block_reason,
        },
    )
}

#[derive(Deserialize)]
pub(super) struct CompleteBody {
    result: String,
}

pub(super) async fn complete(
    State(state): State<Shared>,
    Sender(caller): Sender,
    Path(id): Path<String>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let b: CompleteBody = parse_json(&body, "complete")?;
    Issues::default()
        .len("result", &b.result, 1, MAX_RESULT_CHARS)
        .finish("complete")?;
    mutate(
        &state,
        &caller,
        &id,
        Action::Complete,
        no_check,
        Change::Complete { result: b.result },
    )
}

#[derive(Deserialize, Default)]
pub(super) struct CancelBody {
    #[serde(default)]
    reason: Option<String>,
}

pub(super) async fn cancel(
    State(state): State<Shared>,
    Sender(caller): Sender,
    Path(id): Path<String>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    // An empty or unparseable body means "no reason".
    let b: CancelBody = serde_json::from_slice(&body).unwrap_or_default();
    Issues::default()
        .opt_len("reason", b.reason.as_deref(), 0, MAX_REASON_CHARS)
        .finish("cancel")?;
    mutate(
        &state,
        &caller,
        &id,
        Action::Cancel,
        no_check,
        Change::Cancel { reason: b.reason },
    )
}

#[derive(Deserialize)]
pub(super) struct ReassignBody {
    to: String,
    #[serde(default)]
    note: Option<String>,
}

pub(super) async fn reassign(
    State(state): State<Shared>,
    Sender(caller): Sender,
    Path(id): Path<String>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let b: ReassignBody = parse_json(&body, "reassign")?;
    Issues::default()
        .name("to", &b.to)
        .opt_len("note", b.note.as_deref(), 0, MAX_REASON_CHARS)
        .finish("reassign")?;
    let to = b.to.clone();
    let check = move |c: &Conn<'_>| {
        if team::member_exists(c, &to)? {
            Ok(())
        } else {
            Err(ApiError::bad_request(format!("unknown assignee: {to}")))
        }
    };
    mutate(
        &state,
        &caller,
        &id,
        Action::Reassign,
        check,
        Change::Reassign {
            to: b.to,
            note: b.note,
        },
    )
}

#[derive(Deserialize)]
pub(super) struct WatchersBody {
    #[serde(default)]
    add: Option<Vec<String>>,
    #[serde(default)]
    remove: Option<Vec<String>>,
}

pub(super) async fn watchers(
    State(state): State<Shared>,
    Sender(caller): Sender,
    Path(id): Path<String>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let b: WatchersBody = parse_json(&body, "watchers")?;
    let add = b.add.unwrap_or_default();
    let remove = b.remove.unwrap_or_default();
    let mut issues = Issues::default();
    if add.is_empty() && remove.is_empty() {
        issues.custom("must include at least one of: add, remove");
    }
    issues
        .count("add", add.len(), MAX_WATCHERS)
        .count("remove", remove.len(), MAX_WATCHERS);
    for n in add.iter().chain(&remove) {
        issues.name("watchers", n);
    }
    issues.finish("watchers")?;
    let names: Vec<String> = add.iter().chain(&remove).cloned().collect();
    let check = move |c: &Conn<'_>| {
        for n in &names {
            if !team::member_exists(c, n)? {
                return Err(ApiError::bad_request(format!("unknown watcher: {n}")));
            }
        }
        Ok(())
    };
    mutate(
        &state,
        &caller,
        &id,
        Action::Watchers,
        check,
        Change::Watchers { add, remove },
    )
}

#[derive(Deserialize)]
pub(super) struct DiscussBody {
    body: String,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    attachments: Option<Vec<Attachment>>,
}

pub(super) async fn discuss(
    State(state): State<Shared>,
    Sender(caller): Sender,
    Path(id): Path<String>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let b: DiscussBody = parse_json(&body, "discuss")?;
    Issues::default()
        .len("body", &b.body, 1, MAX_DISCUSS_CHARS)
        .opt_len("title", b.title.as_deref(), 0, message::MAX_TITLE_CHARS)
        .count(
            "attachments",
            b.attachments.as_ref().map_or(0, Vec::len),
            message::MAX_ATTACHMENTS,
        )
        .finish("discuss")?;
    let now = now_ms();
    let msg = state.store.tx_then(
        |c| {
            let obj = load(c, &id)?;
            authorize(&obj, &caller, Action::Discuss)?;
            let attachments =
                canonical_attachments(c, &caller, b.attachments.as_deref().unwrap_or(&[]))?;
            let managers = team::managers(c)?;
            let members = rules::thread_members(&obj, managers.iter().map(String::as_str));
            let audience = message::audience(
                Some(&caller.name),
                &Route::Objective(obj.id.clone()),
                &members,
            );
            let (msg, frame) = publish::log(
                c,
                Draft {
                    to: None,
                    from: caller.name.clone(),
                    title: b.title.clone(),
                    body: b.body.clone(),
                    level: LogLevel::Info,
                    data: rules::discuss_data(&obj.id),
                    attachments,
                },
                &audience,
                now,
            )?;
            grant_attachments(c, &msg.attachments, &members, now)?;
            Ok::<_, ApiError>((msg, audience, frame))
        },
        |(msg, audience, frame)| {
            publish::deliver(&state, &audience, &frame, now);
            msg
        },
    )?;
    Ok(reply(StatusCode::OK, &msg))
}
