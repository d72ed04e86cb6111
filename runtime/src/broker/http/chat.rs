//! Chat endpoints: `/healthz`, `/briefing`, `/roster`, `/push`, `/history`, `/presence/busy`.

use std::collections::BTreeSet;

use ac7_protocol::domain::message::{
    self, Attachment, MAX_ATTACHMENTS, MAX_BODY_CHARS, MAX_TITLE_CHARS, PushPayload, Route, Thread,
};
use ac7_protocol::domain::objective::{self as obj_rules, Action};
use ac7_protocol::domain::permission::Permission;
use ac7_protocol::domain::vfs::FsPath;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, Body, Caller, Issues, Sender, Shared, obj, parse_json, reply};
use crate::broker::cursors::ResumePoint;
use crate::broker::messages::{self, Feed};
use crate::broker::publish::Draft;
use crate::broker::store::Conn;
use crate::broker::team::{self, MemberRecord, Team};
use crate::broker::writer::PushError;
use crate::broker::{StoreError, channels, fs, now_ms, objectives};

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
    let (team, members, open, through) = state.store.view(|c| -> Result<_, ApiError> {
        let team = team::team_get(c)?.unwrap_or_else(|| Team {
            name: String::new(),
            directive: String::new(),
            context: String::new(),
            permission_presets: Default::default(),
        });
        let members = team::members_list(c)?;
        let open = objectives::open_for(c, &caller.name)?;
        let through = crate::broker::cursors::resume_point(c, &caller.name)?;
        Ok((team, members, open, through))
    })?;
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
    let now = now_ms();
    let (members, shared) = state.store.view(|c| -> Result<_, StoreError> {
        let shared = match &state.replica {
            Some(me) => Some(crate::broker::replica::presence(c, me, now)?),
            None => None,
        };
        Ok((team::members_list(c)?, shared))
    })?;
    let mut connected = state
        .hub
        .presence(members.iter().map(|m| m.name.as_str()), now);
    // With replicas: live streams and busy reports of every replica.
    if let Some(shared) = shared {
        for p in &mut connected {
            let s = shared.get(&p.name).copied().unwrap_or_default();
            p.connected += s.connected;
            p.last_seen = p.last_seen.max(s.last_seen);
            p.busy = (s.busy_until > now).then_some(true);
        }
    }
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
        super::subscribe::presence_changed(&state, &caller.name);
    }
    if state.replica.is_some() {
        state
            .store
            .tx(|c| crate::broker::replica::set_busy(c, &caller.name, until))?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Resolves attachments against the file space: each must exist, be a file and be
/// readable by `caller`; name, size and MIME type come from the stored file.
pub(super) fn canonical_attachments(
    c: &Conn<'_>,
    caller: &Caller,
    given: &[Attachment],
) -> Result<Vec<Attachment>, ApiError> {
    let mut out = Vec::with_capacity(given.len());
    for a in given {
        let path = FsPath::parse(&a.path)
            .map_err(|e| ApiError::bad_request(format!("attachment path {}: {e}", a.path)))?;
        let entry = fs::get(c, &path)?
            .ok_or_else(|| ApiError::bad_request(format!("attachment not found: {path}")))?;
        if entry.is_dir() {
            return Err(ApiError::bad_request(format!(
                "attachment is a directory: {path}"
            )));
        }
        if !super::fs::can_read(c, caller, &path)? {
            return Err(ApiError::forbidden(format!(
                "no access to attachment: {path}"
            )));
        }
        out.push(Attachment {
            path: entry.path.clone(),
            name: entry.name.clone(),
            size: entry.size.unwrap_or(0),
            mime_type: entry
                .mime_type
                .clone()
                .unwrap_or_else(|| "application/octet-stream".into()),
        });
    }
    Ok(out)
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
    if let Some(to) = &payload.to
        && !state.hub.has_member(to)
    {
        match state.store.view(|c| team::member_get(c, to))? {
            Some(m) => state.hub.register_member(&m.name, m.role, now),
            None => return Err(ApiError::not_found(format!("no such agent: {to}"))),
        }
    }
    let given = payload.attachments.unwrap_or_default();
    let (thread_members, attachments) = if thread == Thread::General && given.is_empty() {
        (BTreeSet::new(), Vec::new())
    } else {
        state.store.view(|c| -> Result<_, ApiError> {
            Ok((
                thread_members(c, &caller, &thread)?,
                canonical_attachments(c, &caller, &given)?,
            ))
        })?
    };
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
    let (msg, live) = state
        .writer
        .push(draft, audience.clone(), now)
        .await
        .map_err(|e| match e {
            PushError::Unavailable => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
                .with("code", serde_json::json!("database_unavailable")),
            PushError::ShuttingDown | PushError::Failed(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
            }
        })?;
    let response = reply(
        StatusCode::OK,
        &obj! {"delivery" => &obj!{"live" => &live, "targets" => &targets}, "message" => &msg},
    );
    // Committed: the members away from the web app get a notification.
    state.push.message(msg, route, audience);
    Ok(response)
}

/// Validates a thread for posting by `caller` and returns its member list
/// (empty for the general channel).
fn thread_members(
    c: &Conn<'_>,
    caller: &Caller,
    thread: &Thread,
) -> Result<BTreeSet<String>, ApiError> {
    match thread {
        Thread::General => Ok(BTreeSet::new()),
        Thread::Channel(id) => {
            let ch = channels::by_id(c, id)?
                .ok_or_else(|| ApiError::not_found(format!("no such channel: {id}")))?;
            if ch.archived_at.is_some() {
                return Err(ApiError::new(StatusCode::GONE, "channel is archived"));
            }
            let members = channels::member_names(c, id)?;
            if !members.contains(&caller.name) {
                return Err(ApiError::forbidden("not a member of this channel"));
            }
            Ok(members)
        }
        Thread::Objective(id) => {
            let o = objectives::get(c, id)?
                .ok_or_else(|| ApiError::not_found(format!("no such objective: {id}")))?;
            obj_rules::authorize(&o, &caller.name, caller.permissions, Action::Discuss)
                .map_err(|e| ApiError::forbidden(e.0))?;
            let managers = team::managers(c)?;
            Ok(obj_rules::thread_members(
                &o,
                managers.iter().map(String::as_str),
            ))
        }
    }
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

/// A message-id cursor (`before_id`, `after_id`) as its log position.
fn id_param(c: &Conn<'_>, value: Option<&str>, key: &str) -> Result<Option<i64>, ApiError> {
    match value {
        None => Ok(None),
        Some(id) => messages::seq_of(c, id)?.map(Some).ok_or_else(|| {
            ApiError::bad_request(format!(
                "`{key}` names no message in this broker's log; page from a message id this broker returned"
            ))
        }),
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
    // A read transaction: never the write path's lock.
    let rows = state.store.view(|c| -> Result<_, ApiError> {
        let feed = match (with, channel) {
            (Some(w), _) => Feed::With(w),
            (None, Some(name)) if name == "general" => Feed::General,
            (None, Some(name)) => {
                let ch = match channels::by_slug(c, &name)? {
                    Some(ch) => ch,
                    None => channels::by_id(c, &name)?
                        .ok_or_else(|| ApiError::not_found(format!("no such channel: {name}")))?,
                };
                if channels::role_of(c, &ch.id, &caller.name)?.is_none() {
                    return Err(ApiError::forbidden("not a member of this channel"));
                }
                Feed::Channel(ch.id)
            }
            (None, None) => Feed::All,
        };
        let scope = messages::viewer_scope(c, &caller.name, caller.has(Permission::MembersManage))?;
        let window = messages::Window {
            after_seq: id_param(c, after_id.as_deref(), "after_id")?,
            before_seq: id_param(c, before_id.as_deref(), "before_id")?,
            after_ts,
            before_ts,
            oldest_first: after_id.is_some() || after_ts.is_some(),
            limit,
        };
        Ok(messages::page(c, &caller.name, &scope, &feed, &window)?)
    })?;
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
    Ok((
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

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
