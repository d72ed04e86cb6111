//! `/channels…`: list, view, create, rename, archive, join/add, leave/remove.
//! `general` is implicit: everyone is in it and it has no member rows.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, Body, Caller, Shared, obj, parse_json, reply};
use crate::broker::channels::{self as uc, ChannelError, ChannelMember, ChannelSummary};
use crate::broker::now_ms;

fn chan_err(status: StatusCode, msg: impl Into<String>, code: &str) -> ApiError {
    ApiError::new(status, msg).with("code", json!(code))
}

fn slug_issue() -> ApiError {
    ApiError::bad_request("invalid channel input").with(
        "details",
        json!([{
            "origin": "string", "code": "invalid_format", "format": "regex",
            "pattern": "/^[a-z0-9](?:[a-z0-9]|-(?!-))*[a-z0-9]$|^[a-z0-9]$/", "path": ["slug"],
            "message": "slug must be lowercase letters/digits/dashes, no consecutive dashes, no leading/trailing dash",
        }]),
    )
}

impl From<ChannelError> for ApiError {
    fn from(e: ChannelError) -> Self {
        let msg = e.to_string();
        match e {
            ChannelError::Reserved(_) => chan_err(StatusCode::FORBIDDEN, msg, "reserved"),
            ChannelError::InvalidSlug => slug_issue(),
            ChannelError::NotFound(_) => ApiError::not_found(msg),
            ChannelError::Archived(_) => chan_err(StatusCode::GONE, msg, "archived"),
            ChannelError::NotAdmin { .. } => chan_err(StatusCode::FORBIDDEN, msg, "forbidden"),
            ChannelError::SlugTaken(_) => chan_err(StatusCode::CONFLICT, msg, "slug_taken"),
            ChannelError::InvalidRole => chan_err(StatusCode::BAD_REQUEST, msg, "invalid_input"),
            ChannelError::AddOthers => ApiError::forbidden(msg),
            ChannelError::NoSuchMember(_) => chan_err(StatusCode::NOT_FOUND, msg, "not_found"),
            ChannelError::AlreadyMember { .. } => {
                chan_err(StatusCode::CONFLICT, msg, "already_member")
            }
            ChannelError::NotMember { .. } => chan_err(StatusCode::CONFLICT, msg, "not_member"),
            ChannelError::LastAdmin(_) => chan_err(StatusCode::CONFLICT, msg, "forbidden"),
            ChannelError::Store(e) => e.into(),
        }
    }
}

fn members_reply((summary, members): (ChannelSummary, Vec<ChannelMember>)) -> Response {
    reply(
        StatusCode::OK,
        &obj! {"channel" => &summary, "members" => &members},
    )
}

#[derive(Deserialize)]
pub(super) struct ListQuery {
    archived: Option<String>,
}

/// `GET /channels`: the active channels and general; `?archived=true`: the archived ones.
pub(super) async fn list(
    State(state): State<Shared>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let archived = match q.archived.as_deref() {
        None | Some("false" | "0") => false,
        Some("true" | "1") => true,
        Some(_) => return Err(ApiError::bad_request("archived must be true or false")),
    };
    let all = if archived {
        uc::list_archived_for(&state, &caller.name)?
    } else {
        uc::list_for(&state, &caller.name)?
    };
    Ok(reply(StatusCode::OK, &obj! {"channels" => &all}))
}

pub(super) async fn view(
    State(state): State<Shared>,
    caller: Caller,
    Path(slug): Path<String>,
) -> Result<Response, ApiError> {
    Ok(members_reply(uc::view(&state, &caller.name, &slug)?))
}

#[derive(Deserialize)]
pub(super) struct SlugBody {
    slug: String,
}

pub(super) async fn create(
    State(state): State<Shared>,
    caller: Caller,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let b: SlugBody = parse_json(&body, "channel")?;
    let ch = uc::create_channel(&state, &caller.name, &b.slug, now_ms())?;
    Ok(reply(StatusCode::CREATED, &ch))
}

pub(super) async fn rename(
    State(state): State<Shared>,
    caller: Caller,
    Path(slug): Path<String>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let b: SlugBody = parse_json(&body, "channel")?;
    let ch = uc::rename_channel(&state, &caller.name, &slug, &b.slug)?;
    Ok(reply(StatusCode::OK, &ch))
}

pub(super) async fn archive(
    State(state): State<Shared>,
    caller: Caller,
    Path(slug): Path<String>,
) -> Result<Response, ApiError> {
    let ch = uc::archive_channel(&state, &caller.name, &slug, now_ms())?;
    Ok(reply(StatusCode::OK, &ch))
}

#[derive(Deserialize, Default)]
pub(super) struct AddBody {
    #[serde(default)]
    member: Option<String>,
    #[serde(default)]
    role: Option<String>,
}

pub(super) async fn add_member(
    State(state): State<Shared>,
    caller: Caller,
    Path(slug): Path<String>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let b: AddBody = if body.iter().all(u8::is_ascii_whitespace) {
        AddBody::default()
    } else {
        parse_json(&body, "channel member")?
    };
    let found = uc::add_to_channel(&state, &caller.name, &slug, b.member, b.role, now_ms())?;
    Ok(members_reply(found))
}

pub(super) async fn remove_member(
    State(state): State<Shared>,
    caller: Caller,
    Path((slug, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let found = uc::remove_from_channel(&state, &caller.name, &slug, &name)?;
    Ok(members_reply(found))
}
