//! Chat endpoints: `/healthz`, `/briefing`, `/roster`, `/push`, `/history`, `/presence/busy`.

use ac7_protocol::domain::message::{
    self, MAX_ATTACHMENTS, MAX_BODY_CHARS, MAX_TITLE_CHARS, PushPayload, Route, Thread,
};
use ac7_protocol::domain::permission::Permission;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, Body, Caller, Issues, Sender, Shared, obj, parse_json, reply, reply_raw};
use crate::broker::cursors::ResumePoint;
use crate::broker::messages::{self, HistoryError, HistoryRequest};
use crate::broker::now_ms;
use crate::broker::publish::{self, Draft, PostError};
use crate::broker::team::{self, MemberRecord, Team};
use crate::broker::writer::PushError;

pub(super) async fn healthz() -> Response {
    reply(
        StatusCode::OK,
        &obj! {"status" => "ok", "version" => env!("CARGO_PKG_VERSION")},
    )
}

pub(super) async fn briefing(
    State(state): State<Shared>,
    caller: Caller,
) -> Result<Response, ApiError> {
    let team::BriefingFacts {
        team,
        members,
        open_objectives: open,
        through,
    } = team::briefing_facts(&state.store, &caller.name)?;
    let me = members
        .iter()
        .find(|m| m.name == caller.name)
        .ok_or_else(|| ApiError::unauthorized("token references unknown member"))?;
    Ok(reply(
        StatusCode::OK,
        &Briefing {
            name: &me.name,
            role: &me.role,
            permissions: me.permissions,
            instructions: compose_briefing(me, &team, &members),
            team: &team,
            teammates: members.iter().map(MemberRecord::teammate).collect(),
            open_objectives: open,
            delivered_nothing: through == Some(ResumePoint::FromStart),
            delivered_through: match through {
                Some(ResumePoint::After(id)) => Some(id),
                Some(ResumePoint::FromStart) | None => None,
            },
        },
    ))
}

/// `BriefingResponse`, keys in ac7's order.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Briefing<'a> {
    name: &'a str,
    role: &'a team::Role,
    permissions: ac7_protocol::domain::permission::PermissionSet,
    instructions: String,
    team: &'a Team,
    teammates: Vec<team::Teammate<'a>>,
    open_objectives: Vec<ac7_protocol::domain::objective::Objective>,
    /// The last message written to any of the member's live streams, else (before the first)
    /// the last message logged before the member joined: a runner that starts resumes after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    delivered_through: Option<String>,
    /// `true` when there is no such message: a runner resumes from the log's first message.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    delivered_nothing: bool,
}

/// `/roster`, keys in ac7's order.
#[derive(serde::Serialize)]
struct Roster<'a> {
    teammates: Vec<team::Teammate<'a>>,
    connected: Vec<crate::broker::hub::Presence>,
}

/// The briefing prose: who you are, the team, your teammates, and how to work here.
fn compose_briefing(me: &MemberRecord, team: &Team, members: &[MemberRecord]) -> String {
    let mut lines = vec![format!("You are {}, a member of an ac7 team.", me.name)];
    let description = me.role.description.trim();
    lines.push(if description.is_empty() {
        format!("Your role here: {}", me.role.title)
    } else {
        format!("Your role here: {} — {description}", me.role.title)
    });
    lines.push(String::new());
    lines.push(format!("Team: {}", team.name));
    lines.push(format!("Directive: {}", team.directive));
    if !team.context.trim().is_empty() {
        lines.push(format!("Context: {}", team.context));
    }
    lines.push(String::new());
    if !me.instructions.trim().is_empty() {
        lines.push("Personal instructions:".into());
        lines.push(me.instructions.trim().to_owned());
        lines.push(String::new());
    }
    let others: Vec<&MemberRecord> = members.iter().filter(|m| m.name != me.name).collect();
    if !others.is_empty() {
        let width = others
            .iter()
            .map(|m| m.name.chars().count())
            .max()
            .unwrap_or(0);
        lines.push("Teammates on the net:".into());
        for m in others {
            let description = m.role.description.trim();
            lines.push(if description.is_empty() {
                format!("  {:<width$} — {}", m.name, m.role.title)
            } else {
                format!("  {:<width$} — {}: {description}", m.name, m.role.title)
            });
        }
        lines.push(String::new());
    }
    lines.extend(
        [
            "How messages reach you: teammates' messages and objective updates arrive as",
            "<channel source=\"ac7\" thread=\"…\" from=\"NAME\">body</channel> events. Treat each one as new",
            "input and act on it. Answer a general-channel message with `broadcast`, a direct message with",
            "`send`, and a channel post with `channels_post`. Your own messages are not echoed back to you.",
            "",
            "── Objectives ──",
            "An objective is work assigned to one member with an outcome that is the contract: it is done",
            "when the outcome holds, not before. You hear about yours as events with kind=\"objective\"",
            "(event=\"assigned\", \"blocked\", \"completed\", …). Work them with `objectives_list`,",
            "`objectives_view`, `objectives_update` (blocked/active with a reason) and",
            "`objectives_complete` (with a result that shows the outcome holds). Discuss on the",
            "objective's thread with `objectives_discuss`.",
            "",
            "Use `roster` to see who is online and `recent` to catch up on history.",
        ]
        .map(str::to_owned),
    );
    lines.join("\n")
}

pub(super) async fn roster(
    State(state): State<Shared>,
    _caller: Caller,
) -> Result<Response, ApiError> {
    let (members, connected) = team::roster(&state, now_ms())?;
    Ok(reply(
        StatusCode::OK,
        &Roster {
            teammates: members.iter().map(MemberRecord::teammate).collect(),
            connected,
        },
    ))
}

#[derive(Deserialize)]
pub(super) struct BusyBody {
    busy: bool,
}

/// How long a busy report lasts without a refresh.
const BUSY_TTL_MS: i64 = 30_000;

pub(super) async fn busy(
    State(state): State<Shared>,
    caller: Caller,
    Body(body): Body,
) -> Result<Response, ApiError> {
    // As the TypeScript broker words it: "invalid busy report", not the usual "invalid … payload".
    let b: BusyBody = parse_json(&body, "busy").map_err(|e| e.saying("invalid busy report"))?;
    let now = now_ms();
    let until = if b.busy { now + BUSY_TTL_MS } else { 0 };
    if state.hub.set_busy(&caller.name, until, now) {
        crate::broker::notices::presence_changed(&state, &caller.name);
    }
    crate::broker::replica::report_busy(&state, &caller.name, until)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

impl From<PostError> for ApiError {
    fn from(e: PostError) -> Self {
        let msg = e.to_string();
        match e {
            PostError::NoSuchAgent(_)
            | PostError::NoSuchChannel(_)
            | PostError::NoSuchObjective(_) => ApiError::not_found(msg),
            PostError::AttachmentPath { .. }
            | PostError::AttachmentNotFound(_)
            | PostError::AttachmentIsDirectory(_) => ApiError::bad_request(msg),
            PostError::AttachmentForbidden(_)
            | PostError::NotChannelMember
            | PostError::Forbidden(_) => ApiError::forbidden(msg),
            PostError::ChannelArchived => ApiError::new(StatusCode::GONE, msg),
            PostError::Store(e) => e.into(),
        }
    }
}

impl From<HistoryError> for ApiError {
    fn from(e: HistoryError) -> Self {
        let msg = e.to_string();
        match e {
            HistoryError::NoSuchChannel(_) => ApiError::not_found(msg),
            HistoryError::NotChannelMember => ApiError::forbidden(msg),
            HistoryError::UnknownCursor(_) => ApiError::bad_request(msg),
            HistoryError::Store(e) => e.into(),
        }
    }
}

pub(super) async fn push(
    State(state): State<Shared>,
    Sender(caller): Sender,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let payload: PushPayload = parse_json(&body, "push")?;
    Issues::default()
        .len("body", &payload.body, 1, MAX_BODY_CHARS)
        .opt_len("title", payload.title.as_deref(), 0, MAX_TITLE_CHARS)
        .count(
            "attachments",
            payload.attachments.as_ref().map_or(0, Vec::len),
            MAX_ATTACHMENTS,
        )
        .finish("push")?;
    if let Some(to) = &payload.to
        && !message::is_valid_name(to)
    {
        return Err(ApiError::invalid("push", vec![super::name_issue("to")]));
    }
    let mut data = payload.data.unwrap_or_default();
    message::strip_reserved(&mut data);
    let thread = Thread::from_data(&data).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let now = now_ms();
    // Presence entries mirror the member table; a member added since (offline, or on another
    // replica) is registered on first sight.
    if let Some(to) = &payload.to {
        publish::ensure_recipient(&state, to, now)?;
    }
    let given = payload.attachments.unwrap_or_default();
    let (thread_members, attachments) = publish::prepare_post(
        &state.store,
        &caller.name,
        caller.permissions,
        &thread,
        &given,
    )?;
    let route = Route::of(payload.to.as_deref(), &data);
    let audience = message::audience(Some(&caller.name), &route, &thread_members);
    let targets = match &route {
        Route::Direct { .. } => 1,
        Route::General => state.hub.member_count(),
        Route::Channel(_) | Route::Objective(_) => thread_members.len(),
        Route::Unroutable => 0,
    };
    let draft = Draft {
        to: payload.to,
        from: caller.name,
        title: payload.title,
        body: payload.body,
        level: payload.level.unwrap_or_default(),
        data,
        attachments,
    };
    let (msg, frame, live) = state
        .writer
        .push(&state, draft, audience.clone(), now)
        .await
        .map_err(|e| match e {
            PushError::Unavailable => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
                .with("code", serde_json::json!("database_unavailable")),
            PushError::ShuttingDown | PushError::Failed(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
            }
        })?;
    let response = push_answer(live, targets, &frame.json);
    // Committed: the members away from the web app get a notification.
    state.push.message(msg, route, audience);
    Ok(response)
}

/// `{"delivery":{"live":…,"targets":…},"message":…}`, the message as the JSON its commit
/// rendered for the live streams (the same serialization: written once per push, not twice).
fn push_answer(live: usize, targets: usize, message: &str) -> Response {
    let (live, targets) = (live.to_string(), targets.to_string());
    let mut body = String::with_capacity(48 + message.len());
    for part in [
        "{\"delivery\":{\"live\":",
        &live,
        ",\"targets\":",
        &targets,
        "},\"message\":",
        message,
        "}",
    ] {
        body.push_str(part);
    }
    reply_raw(StatusCode::OK, body)
}

#[derive(Deserialize)]
pub(super) struct HistoryQuery {
    with: Option<String>,
    channel: Option<String>,
    limit: Option<String>,
    before: Option<String>,
    after: Option<String>,
    before_id: Option<String>,
    after_id: Option<String>,
}

/// `/history`'s `limit`: default 100; a number of at least 1, floored, at most 1000.
/// Anything else (`0`, `-1`, `abc`, empty) is a 400 in the shape of the activity list's
/// (the TypeScript broker maps it to 100 silently; a caller asking for nothing should hear so).
fn history_limit(value: Option<&str>) -> Result<usize, ApiError> {
    let Some(v) = value else {
        return Ok(100);
    };
    match v.trim().parse::<f64>() {
        Ok(l) if l.is_finite() && l >= 1.0 => Ok(l.floor().min(1000.0) as usize),
        _ => Err(ApiError::bad_request(
            "invalid `limit` parameter: expected a positive integer",
        )),
    }
}

/// An epoch-ms query bound (`before`, `after`): a finite number, floored.
fn ms_param(value: Option<String>, key: &str) -> Result<Option<i64>, ApiError> {
    match value.filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(b) => match b.trim().parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(Some(v.floor() as i64)),
            _ => Err(ApiError::bad_request(format!("invalid `{key}` parameter"))),
        },
    }
}

pub(super) async fn history(
    State(state): State<Shared>,
    caller: Caller,
    Query(q): Query<HistoryQuery>,
) -> Result<Response, ApiError> {
    let with = q.with.filter(|s| !s.is_empty());
    let channel = q.channel.filter(|s| !s.is_empty());
    if let Some(w) = &with
        && !message::is_valid_name(w)
    {
        return Err(ApiError::bad_request("`with` must be a valid name")
            .with("details", json!([super::name_issue("")])));
    }
    if with.is_some() && channel.is_some() {
        return Err(ApiError::bad_request(
            "`with` and `channel` are mutually exclusive",
        ));
    }
    let limit = history_limit(q.limit.as_deref())?;
    let before_ts = ms_param(q.before, "before")?;
    let after_ts = ms_param(q.after, "after")?;
    let before_id = q.before_id.filter(|s| !s.is_empty());
    let after_id = q.after_id.filter(|s| !s.is_empty());
    let rows = messages::history(
        &state.store,
        &caller.name,
        caller.has(Permission::MembersManage),
        HistoryRequest {
            with,
            channel,
            before_id,
            after_id,
            before_ts,
            after_ts,
            limit,
        },
    )?;
    // The stored JSON is the Message as sent live: no need to decode and encode it again.
    let mut body = String::with_capacity(16 + rows.iter().map(|r| r.json.len() + 1).sum::<usize>());
    body.push_str("{\"messages\":[");
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&row.json);
    }
    body.push_str("]}");
    Ok(reply_raw(StatusCode::OK, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_push_answer_is_byte_for_byte_what_serializing_it_whole_gives() {
        let mut data = serde_json::Map::new();
        data.insert("thread".into(), json!("chan:ops"));
        data.insert("n".into(), json!(1.5));
        let msg = message::Message {
            id: "7570cd11-5c15-45b5-9983-822c0b5c993a".into(),
            ts: 1_795_314_350_478,
            to: None,
            from: Some("ann".into()),
            title: Some("a \"title\"\n".into()),
            body: "caf\u{e9} <b>".into(),
            level: Default::default(),
            data,
            attachments: vec![],
        };
        let json = serde_json::to_string(&msg).unwrap();
        let ours = push_answer(2, 13, &json);
        let whole = reply(
            StatusCode::OK,
            &obj! {"delivery" => &obj!{"live" => &2usize, "targets" => &13usize}, "message" => &msg},
        );
        assert_eq!(ours.status(), whole.status());
        assert_eq!(
            ours.headers().get("content-type"),
            whole.headers().get("content-type")
        );
        let bytes = |r: Response| axum::body::to_bytes(r.into_body(), usize::MAX);
        assert_eq!(bytes(ours).await.unwrap(), bytes(whole).await.unwrap());
    }

    fn member(name: &str, title: &str, description: &str) -> MemberRecord {
        MemberRecord {
            name: name.into(),
            role: ac7_protocol::domain::team::Role {
                title: title.into(),
                description: description.into(),
            },
            instructions: String::new(),
            permissions: Default::default(),
        }
    }

    #[test]
    fn a_role_without_description_gets_no_dash_or_colon() {
        let team = Team {
            name: "t".into(),
            directive: "d".into(),
            ..Team::default()
        };
        let members = [
            member("me", "engineer", " "),
            member("ana", "lead", ""),
            member("bo", "qa", "Tests things."),
        ];
        let prose = compose_briefing(&members[0], &team, &members);
        let lines: Vec<&str> = prose.lines().collect();
        assert!(lines.contains(&"Your role here: engineer"), "{prose}");
        assert!(lines.contains(&"  ana — lead"), "{prose}");
        assert!(lines.contains(&"  bo  — qa: Tests things."), "{prose}");
        assert!(
            !prose.contains(": \n") && !prose.contains("— \n"),
            "{prose}"
        );
    }
}
