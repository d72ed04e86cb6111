//! Team and member administration: `/team`, `/team/presets`, `/members`, tokens.

use ac7_protocol::domain::permission::{self, Permission};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;

use super::{ApiError, Body, Caller, Issues, Shared, obj, parse_json, reply};
use crate::broker::bootstrap::{self, AdminError, add_member, validate_member};
use crate::broker::hub::Closed;
use crate::broker::now_ms;
use crate::broker::store::Conn;
use crate::broker::team::{self, MemberRecord, Role, Team};

impl From<AdminError> for ApiError {
    fn from(e: AdminError) -> ApiError {
        match e {
            AdminError::Store(e) => e.into(),
            AdminError::NoTeam => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            AdminError::Invalid(m) => ApiError::bad_request(m),
            AdminError::NotFound(m) => ApiError::not_found(m),
            AdminError::Conflict(m) => ApiError::conflict(m),
        }
    }
}

fn load_team(c: &Conn<'_>) -> Result<Team, ApiError> {
    Ok(bootstrap::load_team(c)?)
}

pub(super) async fn team_get(
    State(state): State<Shared>,
    _caller: Caller,
) -> Result<Response, ApiError> {
    let team = state.store.view(load_team)?;
    Ok(reply(StatusCode::OK, &obj! {"team" => &team}))
}

pub(super) async fn team_patch(
    State(state): State<Shared>,
    caller: Caller,
    Body(body): Body,
) -> Result<Response, ApiError> {
    ApiError::require(
        caller.permissions,
        Permission::TeamManage,
        "updating the team",
    )?;
    let v: serde_json::Map<String, Value> = parse_json(&body, "team")?;
    let field = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let (name, directive, context) = (field("name"), field("directive"), field("context"));
    if name.is_none() && directive.is_none() && context.is_none() {
        return Err(ApiError::bad_request(
            "no fields to update (name, directive, context)",
        ));
    }
    let team = state.store.tx(|c| {
        let mut team = load_team(c)?;
        if let Some(n) = name {
            team.name = n;
        }
        if let Some(d) = directive {
            team.directive = d;
        }
        if let Some(c) = context {
            team.context = c;
        }
        bootstrap::validate_team(&team).map_err(ApiError::bad_request)?;
        team::team_put(c, &team, now_ms())?;
        Ok::<_, ApiError>(team)
    })?;
    Ok(reply(StatusCode::OK, &obj! {"team" => &team}))
}

pub(super) async fn presets_list(
    State(state): State<Shared>,
    _caller: Caller,
) -> Result<Response, ApiError> {
    let team = state.store.view(load_team)?;
    Ok(reply(
        StatusCode::OK,
        &obj! {"presets" => &team.permission_presets},
    ))
}

#[derive(Deserialize)]
pub(super) struct PresetBody {
    permissions: Vec<String>,
}

pub(super) async fn preset_put(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    ApiError::require(
        caller.permissions,
        Permission::TeamManage,
        "editing presets",
    )?;
    let b: PresetBody = parse_json(&body, "preset")?;
    Issues::default()
        .len("name", &name, 1, 64)
        .count("permissions", b.permissions.len(), 32)
        .finish("preset")?;
    let leaves = state.store.tx(|c| {
        let mut team = load_team(c)?;
        let set = permission::resolve_preset(&name, &b.permissions, &team.permission_presets)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let leaves: Vec<String> = set.names().into_iter().map(str::to_owned).collect();
        team.permission_presets.insert(name.clone(), leaves.clone());
        team::team_put(c, &team, now_ms())?;
        Ok::<_, ApiError>(leaves)
    })?;
    Ok(reply(
        StatusCode::OK,
        &obj! {"preset" => &obj!{"name" => &name, "permissions" => &leaves}},
    ))
}

pub(super) async fn preset_delete(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    ApiError::require(
        caller.permissions,
        Permission::TeamManage,
        "deleting presets",
    )?;
    state.store.tx(|c| {
        let mut team = load_team(c)?;
        if team.permission_presets.remove(&name).is_none() {
            return Err(ApiError::not_found(format!("no such preset: {name}")));
        }
        team::team_put(c, &team, now_ms())?;
        Ok(())
    })?;
    // Members hold resolved leaves, so nothing changes for them; report none.
    Ok(reply(
        StatusCode::OK,
        &obj! {"deleted" => &name, "referencedBy" => &[(); 0]},
    ))
}

pub(super) async fn members_list(
    State(state): State<Shared>,
    caller: Caller,
) -> Result<Response, ApiError> {
    let members = state.store.view(team::members_list)?;
    let body = if caller.has(Permission::MembersManage) {
        obj! {"members" => &members.iter().map(MemberRecord::view).collect::<Vec<_>>()}
    } else {
        obj! {"members" => &members.iter().map(MemberRecord::teammate).collect::<Vec<_>>()}
    };
    Ok(reply(StatusCode::OK, &body))
}

#[derive(Deserialize)]
pub(super) struct CreateMember {
    name: String,
    role: Role,
    #[serde(default)]
    instructions: String,
    permissions: Vec<String>,
}

pub(super) async fn members_create(
    State(state): State<Shared>,
    caller: Caller,
    Body(body): Body,
) -> Result<Response, ApiError> {
    if !caller.has(Permission::MembersManage) {
        return Err(ApiError::forbidden(
            "creating members requires the members.manage permission",
        ));
    }
    let b: CreateMember = parse_json(&body, "member")?;
    validate_member(&b.name, &b.role, &b.instructions).map_err(ApiError::bad_request)?;
    let now = now_ms();
    let (record, token) = state.store.tx(|c| -> Result<_, AdminError> {
        let record = bootstrap::new_member_record(
            c,
            &b.name,
            &b.role,
            &b.instructions,
            &b.permissions,
            &format!("create member '{}'", b.name),
        )?;
        let issued = add_member(c, &record, Some(&caller.name), now)?;
        Ok((record, issued.token))
    })?;
    state.forget_auth();
    state
        .hub
        .register_member(&record.name, record.role.clone(), now);
    Ok(reply(
        StatusCode::OK,
        &obj! {"member" => &record.teammate(), "token" => &token},
    ))
}

#[derive(Deserialize)]
pub(super) struct UpdateMember {
    #[serde(default)]
    role: Option<Role>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    permissions: Option<Vec<String>>,
}

pub(super) async fn member_update(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    ApiError::require(
        caller.permissions,
        Permission::MembersManage,
        "updating members",
    )?;
    let b: UpdateMember = parse_json(&body, "member update")?;
    if b.role.is_none() && b.instructions.is_none() && b.permissions.is_none() {
        return Err(ApiError::bad_request(
            "no fields to update (role, instructions, permissions)",
        ));
    }
    let record = state.store.tx(|c| {
        bootstrap::update_member(
            c,
            &name,
            |m| {
                if let Some(role) = b.role {
                    m.role = role;
                }
                if let Some(i) = b.instructions {
                    m.instructions = i;
                }
            },
            b.permissions.as_deref(),
            &format!("update member '{name}'"),
        )
    })?;
    state.forget_auth();
    state
        .hub
        .register_member(&record.name, record.role.clone(), now_ms());
    Ok(reply(StatusCode::OK, &record.view()))
}

pub(super) async fn member_delete(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    ApiError::require(
        caller.permissions,
        Permission::MembersManage,
        "removing members",
    )?;
    state
        .store
        .tx(|c| bootstrap::remove_member_checked(c, &name, &caller.name, now_ms()))?;
    state.forget_auth();
    state.hub.remove_member(&name);
    state.activity_hub.close_owner(&name, None, Closed::Removed);
    // Streams watching its activity end too: a new member of that name is someone else.
    state.activity_hub.remove_member(&name);
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn self_or_manager(caller: &Caller, name: &str) -> Result<(), ApiError> {
    if caller.name == name || caller.has(Permission::MembersManage) {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "managing tokens of '{name}' requires being '{name}' or the members.manage permission"
        )))
    }
}

pub(super) async fn rotate_token(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    self_or_manager(&caller, &name)?;
    let (token, info) = state
        .store
        .tx(|c| bootstrap::rotate_token(c, &name, Some(&caller.name), now_ms()))?;
    // After the commit: a stream registers only after checking its token under the store's
    // lock, so none registers with an old token after this.
    state.forget_auth();
    state.hub.close_member(&name, Closed::Revoked);
    state.activity_hub.close_owner(&name, None, Closed::Revoked);
    Ok(reply(
        StatusCode::OK,
        &obj! {"token" => &token, "tokenInfo" => &info},
    ))
}

pub(super) async fn tokens_list(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    self_or_manager(&caller, &name)?;
    let tokens = state.store.view(|c| -> Result<_, ApiError> {
        if !team::member_exists(c, &name)? {
            return Err(ApiError::not_found(format!("no such member: {name}")));
        }
        Ok(team::tokens_list(c, &name)?)
    })?;
    Ok(reply(StatusCode::OK, &obj! {"tokens" => &tokens}))
}

pub(super) async fn token_delete(
    State(state): State<Shared>,
    caller: Caller,
    Path((name, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    self_or_manager(&caller, &name)?;
    state.store.tx(|c| bootstrap::revoke_token(c, &name, &id))?;
    state.forget_auth();
    state.hub.close_token(&name, &id);
    state
        .activity_hub
        .close_owner(&name, Some(&id), Closed::Revoked);
    Ok(StatusCode::NO_CONTENT.into_response())
}
