//! `/channels…`: list, view, create, rename, archive, join/add, leave/remove.
//! `general` is implicit: everyone is in it and it has no member rows.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, Body, Caller, Shared, obj, parse_json, reply};
use crate::broker::channels::{self as store, Channel, ChannelMember, ChannelSummary};
use crate::broker::store::Conn;
use crate::broker::{AppState, now_ms, team};

fn chan_err(status: StatusCode, msg: impl Into<String>, code: &str) -> ApiError {
    ApiError::new(status, msg).with("code", json!(code))
}

/// Whether `slug` is 1–32 characters of `[a-z0-9-]`, alphanumeric at both ends, no `--`.
pub(crate) fn valid_slug(slug: &str) -> bool {
    let b = slug.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && !slug.contains("--")
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

fn general(state: &AppState, c: &Conn<'_>) -> Result<ChannelSummary, ApiError> {
    let created = store::general_created_at(c)
        .ok()
        .flatten()
        .unwrap_or(state.boot_time);
    Ok(ChannelSummary {
        channel: store::general(created),
        joined: true,
        my_role: Some("member".into()),
        member_count: state.hub.member_count(),
    })
}

fn summary(c: &Conn<'_>, ch: Channel, viewer: &str) -> Result<ChannelSummary, ApiError> {
    let role = store::role_of(c, &ch.id, viewer)?;
    let count = store::member_names(c, &ch.id)?.len();
    Ok(ChannelSummary {
        channel: ch,
        joined: role.is_some(),
        my_role: role,
        member_count: count,
    })
}

fn find(c: &Conn<'_>, slug: &str) -> Result<Channel, ApiError> {
    store::by_slug(c, slug)?.ok_or_else(|| ApiError::not_found(format!("no such channel: {slug}")))
}

/// A channel from `viewer`'s side with its member rows.
fn with_members(
    c: &Conn<'_>,
    ch: Channel,
    viewer: &str,
) -> Result<(ChannelSummary, Vec<ChannelMember>), ApiError> {
    let members = store::members(c, &ch.id)?;
    let summary = summary(c, ch, viewer)?;
    Ok((summary, members))
}

fn members_reply((summary, members): (ChannelSummary, Vec<ChannelMember>)) -> Response {
    reply(
        StatusCode::OK,
        &obj! {"channel" => &summary, "members" => &members},
    )
}

pub(super) async fn list(
    State(state): State<Shared>,
    caller: Caller,
) -> Result<Response, ApiError> {
    let mut all = state.store.view(|c| -> Result<_, ApiError> {
        let general = general(&state, c)?;
        let mut all = Vec::new();
        for ch in store::list_active(c)? {
            all.push(summary(c, ch, &caller.name)?);
        }
        all.push(general);
        Ok(all)
    })?;
    all.sort_by_key(|c| std::cmp::Reverse(c.channel.created_at));
    Ok(reply(StatusCode::OK, &obj! {"channels" => &all}))
}

pub(super) async fn view(
    State(state): State<Shared>,
    caller: Caller,
    Path(slug): Path<String>,
) -> Result<Response, ApiError> {
    if slug == "general" {
        let general = state.store.view(|c| general(&state, c))?;
        return Ok(reply(
            StatusCode::OK,
            &obj! {"channel" => &general, "members" => &[(); 0]},
        ));
    }
    let found = state.store.view(|c| {
        let ch = find(c, &slug)?;
        with_members(c, ch, &caller.name)
    })?;
    Ok(members_reply(found))
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
    if b.slug == "general" {
        return Err(chan_err(
            StatusCode::FORBIDDEN,
            "the general channel is reserved",
            "reserved",
        ));
    }
    if !valid_slug(&b.slug) {
        return Err(slug_issue());
    }
    let ch = state.store.tx(|c| {
        if store::by_slug(c, &b.slug)?.is_some() {
            return Err(chan_err(
                StatusCode::CONFLICT,
                format!("a channel called \"{}\" already exists", b.slug),
                "slug_taken",
            ));
        }
        Ok(store::create(c, &b.slug, &caller.name, now_ms())?)
    })?;
    Ok(reply(StatusCode::CREATED, &ch))
}

fn require_admin(c: &Conn<'_>, ch: &Channel, caller: &Caller, doing: &str) -> Result<(), ApiError> {
    if store::role_of(c, &ch.id, &caller.name)?.as_deref() == Some("admin") {
        Ok(())
    } else {
        Err(chan_err(
            StatusCode::FORBIDDEN,
            format!("only channel admins can {doing}"),
            "forbidden",
        ))
    }
}

fn not_archived(ch: &Channel) -> Result<(), ApiError> {
    if ch.archived_at.is_some() {
        Err(chan_err(
            StatusCode::GONE,
            format!("channel #{} is archived", ch.slug),
            "archived",
        ))
    } else {
        Ok(())
    }
}

pub(super) async fn rename(
    State(state): State<Shared>,
    caller: Caller,
    Path(slug): Path<String>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let b: SlugBody = parse_json(&body, "channel")?;
    if slug == "general" || b.slug == "general" {
        return Err(chan_err(
            StatusCode::FORBIDDEN,
            "the general channel is reserved",
            "reserved",
        ));
    }
    if !valid_slug(&b.slug) {
        return Err(slug_issue());
    }
    let ch = state.store.tx(|c| {
        let ch = find(c, &slug)?;
        not_archived(&ch)?;
        require_admin(c, &ch, &caller, "rename this channel")?;
        if b.slug != ch.slug && store::by_slug(c, &b.slug)?.is_some() {
            return Err(chan_err(
                StatusCode::CONFLICT,
                format!("a channel called \"{}\" already exists", b.slug),
                "slug_taken",
            ));
        }
        store::rename(c, &ch.id, &b.slug)?;
        Ok(ch)
    })?;
    Ok(reply(
        StatusCode::OK,
        &Channel {
            slug: b.slug.clone(),
            ..ch
        },
    ))
}

pub(super) async fn archive(
    State(state): State<Shared>,
    caller: Caller,
    Path(slug): Path<String>,
) -> Result<Response, ApiError> {
    if slug == "general" {
        return Err(chan_err(
            StatusCode::FORBIDDEN,
            "the general channel is reserved",
            "reserved",
        ));
    }
    let (ch, now) = state.store.tx(|c| {
        let ch = find(c, &slug)?;
        not_archived(&ch)?;
        require_admin(c, &ch, &caller, "archive this channel")?;
        let now = now_ms();
        store::archive(c, &ch.id, now)?;
        Ok::<_, ApiError>((ch, now))
    })?;
    Ok(reply(
        StatusCode::OK,
        &Channel {
            archived_at: Some(now),
            ..ch
        },
    ))
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
    if slug == "general" {
        return Err(chan_err(
            StatusCode::FORBIDDEN,
            "everyone is already in the general channel",
            "reserved",
        ));
    }
    let role = b.role.unwrap_or_else(|| "member".into());
    if role != "member" && role != "admin" {
        return Err(chan_err(
            StatusCode::BAD_REQUEST,
            "role must be admin or member",
            "invalid_input",
        ));
    }
    let found = state.store.tx(|c| {
        let ch = find(c, &slug)?;
        not_archived(&ch)?;
        let target = b.member.unwrap_or_else(|| caller.name.clone());
        if target != caller.name {
            if store::role_of(c, &ch.id, &caller.name)?.as_deref() != Some("admin") {
                return Err(ApiError::forbidden("only admins can add other members"));
            }
            if !team::member_exists(c, &target)? {
                return Err(chan_err(
                    StatusCode::NOT_FOUND,
                    format!("no such member: {target}"),
                    "not_found",
                ));
            }
        }
        if store::role_of(c, &ch.id, &target)?.is_some() {
            return Err(chan_err(
                StatusCode::CONFLICT,
                format!("{target} is already a member of #{}", ch.slug),
                "already_member",
            ));
        }
        // Self-join is always as a plain member.
        let role = if target == caller.name {
            "member"
        } else {
            role.as_str()
        };
        store::add_member(c, &ch.id, &target, role, now_ms())?;
        with_members(c, ch, &caller.name)
    })?;
    Ok(members_reply(found))
}

pub(super) async fn remove_member(
    State(state): State<Shared>,
    caller: Caller,
    Path((slug, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    if slug == "general" {
        return Err(chan_err(
            StatusCode::FORBIDDEN,
            "nobody can leave the general channel",
            "reserved",
        ));
    }
    let found = state.store.tx(|c| {
        let ch = find(c, &slug)?;
        if name != caller.name {
            require_admin(c, &ch, &caller, "remove other members")?;
        }
        let Some(role) = store::role_of(c, &ch.id, &name)? else {
            return Err(chan_err(StatusCode::CONFLICT, format!("{name} is not a member of #{}", ch.slug), "not_member"));
        };
        if role == "admin" {
            let admins = store::members(c, &ch.id)?.into_iter().filter(|m| m.role == "admin").count();
            let others = store::members(c, &ch.id)?.len() > 1;
            if admins == 1 && others {
                return Err(chan_err(
                    StatusCode::CONFLICT,
                    format!("cannot remove the last admin of #{} while others remain — promote someone first", ch.slug),
                    "forbidden",
                ));
            }
        }
        store::remove_member(c, &ch.id, &name)?;
        with_members(c, ch, &caller.name)
    })?;
    Ok(members_reply(found))
}

#[cfg(test)]
mod tests {
    use super::valid_slug;

    #[test]
    fn slugs() {
        for ok in ["a", "dev", "dev-2", "a1"] {
            assert!(valid_slug(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "a--b", "Dev", "a b", &"a".repeat(33)] {
            assert!(!valid_slug(bad), "{bad}");
        }
    }
}
