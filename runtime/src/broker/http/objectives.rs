//! `/objectives…`: list, view, create, update, complete, cancel, reassign,
//! watchers (POST and PATCH), discuss.
//!
//! Every mutation, its audit events and its lifecycle messages are committed in
//! one transaction before the response; the pushes go out right after the commit.

use ac7_protocol::domain::message::{self, Attachment};
use ac7_protocol::domain::objective::{
    self as rules, Change, MAX_BODY_CHARS, MAX_DISCUSS_CHARS, MAX_OUTCOME_CHARS, MAX_REASON_CHARS,
    MAX_RESULT_CHARS, MAX_TITLE_CHARS, MAX_WATCHERS, Objective, ObjectiveEvent, Status,
};
use ac7_protocol::domain::permission::Permission;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, Body, Caller, Issues, Sender, Shared, obj, parse_json, reply};
use crate::broker::objectives::{self as uc, CreateRequest, ObjectiveError, Post};
use crate::broker::{AppState, now_ms};

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
    let objectives = uc::list_visible(
        &state.store,
        &caller.name,
        caller.permissions,
        assignee.as_deref(),
        status,
    )?;
    Ok(reply(StatusCode::OK, &obj! {"objectives" => &objectives}))
}

impl From<ObjectiveError> for ApiError {
    fn from(e: ObjectiveError) -> Self {
        let msg = e.to_string();
        match e {
            ObjectiveError::NotFound(_) => ApiError::not_found(msg),
            ObjectiveError::Forbidden(_) => ApiError::forbidden(msg),
            ObjectiveError::UnknownAssignee(_)
            | ObjectiveError::UnknownWatcher(_)
            | ObjectiveError::Invalid(_) => ApiError::bad_request(msg),
            ObjectiveError::Transition(t) => ApiError::new(
                StatusCode::from_u16(t.status()).unwrap_or(StatusCode::BAD_REQUEST),
                msg,
            ),
            ObjectiveError::Post(e) => e.into(),
            ObjectiveError::Fs(e) => e.into(),
            ObjectiveError::Store(e) => e.into(),
        }
    }
}

pub(super) async fn view(
    State(state): State<Shared>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (obj, events) = uc::view(&state.store, &caller.name, caller.permissions, &id)?;
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
    let obj = uc::create_objective(
        &state,
        &caller.name,
        caller.permissions,
        CreateRequest {
            title: b.title,
            outcome: b.outcome,
            assignee: b.assignee,
            body: b.body,
            watchers,
            attachments: b.attachments.unwrap_or_default(),
        },
        now_ms(),
    )?;
    Ok(reply(StatusCode::OK, &obj))
}

/// Applies one change for `caller` and answers with the objective as it now stands.
fn mutate(
    state: &AppState,
    caller: &Caller,
    id: &str,
    change: Change,
) -> Result<Response, ApiError> {
    let obj = uc::change_objective(
        state,
        &caller.name,
        caller.permissions,
        id,
        change,
        now_ms(),
    )?;
    Ok(reply(StatusCode::OK, &obj))
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
    mutate(&state, &caller, &id, Change::Complete { result: b.result })
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
    mutate(&state, &caller, &id, Change::Cancel { reason: b.reason })
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
    mutate(
        &state,
        &caller,
        &id,
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
    mutate(&state, &caller, &id, Change::Watchers { add, remove })
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
    let msg = uc::discuss(
        &state,
        &caller.name,
        caller.permissions,
        &id,
        Post {
            title: b.title,
            body: b.body,
            attachments: b.attachments.unwrap_or_default(),
        },
        now_ms(),
    )?;
    Ok(reply(StatusCode::OK, &msg))
}
