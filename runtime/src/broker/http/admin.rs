//! Team and member administration: `/team`, `/team/presets`, `/members`, tokens.

use ac7_protocol::domain::permission::{self, Permission};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;

use super::{ApiError, Body, Caller, Issues, Shared, obj, parse_json, reply};
use crate::broker::bootstrap::{self, add_member, is_last_admin, validate_member};
use crate::broker::db::StoreError;
use crate::broker::hub::Closed;
use crate::broker::now_ms;
use crate::broker::team::{self, MemberRecord, Role, Team};

fn load_team(conn: &rusqlite::Connection) -> Result<Team, ApiError> {
    team::team_get(conn)?
        .ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "no team configured"))
}

pub(super) async fn team_get(
    State(state): State<Shared>,
    _caller: Caller,
) -> Result<Response, ApiError> {
    let team = state.store.with(|conn| load_team(conn))?;
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
    state.store.with(|conn| {
        let mut team = load_team(conn)?;
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
        team::team_put(conn, &team, now_ms())?;
        Ok(reply(StatusCode::OK, &obj! {"team" => &team}))
    })
}

pub(super) async fn presets_list(
    State(state): State<Shared>,
    _caller: Caller,
) -> Result<Response, ApiError> {
    let team = state.store.with(|conn| load_team(conn))?;
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
    state.store.with(|conn| {
        let mut team = load_team(conn)?;
        let set = permission::resolve_preset(&name, &b.permissions, &team.permission_presets)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let leaves: Vec<String> = set.names().into_iter().map(str::to_owned).collect();
        team.permission_presets.insert(name.clone(), leaves.clone());
        team::team_put(conn, &team, now_ms())?;
        Ok(reply(
            StatusCode::OK,
            &obj! {"preset" => &obj!{"name" => &name, "permissions" => &leaves}},
        ))
    })
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
    state.store.with(|conn| {
        let mut team = load_team(conn)?;
        if team.permission_presets.remove(&name).is_none() {
            return Err(ApiError::not_found(format!("no such preset: {name}")));
        }
        team::team_put(conn, &team, now_ms())?;
        // Members hold resolved leaves, so nothing changes for them; report none.
        Ok(reply(
            StatusCode::OK,
            &obj! {"deleted" => &name, "referencedBy" => &[(); 0]},
        ))
    })
}

pub(super) async fn members_list(
    State(state): State<Shared>,
    caller: Caller,
) -> Result<Response, ApiError> {
    let members = state.store.with(|conn| team::members_list(conn))?;
    let body = if caller.has(Permission::MembersManage) {
        obj! {"members" => &members.iter().map(MemberRecord::view).collect::<Vec<_>>()}
    } else {
        obj! {"members" => &members.iter().map(MemberRecord::teammate).collect::<Vec<_>>()}
    };
    Ok(reply(StatusCode::OK, &body))
}

/// The record of a new member `name`: permissions resolved through the team's presets; 409
/// when the name is taken (without regard to case). Nothing is stored.
pub(super) fn new_member_record(
    conn: &rusqlite::Connection,
    name: &str,
    role: &Role,
    instructions: &str,
    permissions: &[String],
) -> Result<MemberRecord, ApiError> {
    let team = load_team(conn)?;
    let permissions = permission::resolve(
        permissions,
        &team.permission_presets,
        &format!("create member '{name}'"),
    )
    .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if let Some(existing) = team::member_name_taken(conn, name)? {
        return Err(ApiError::conflict(team::name_taken_text(name, &existing)));
    }
    Ok(MemberRecord {
        name: name.to_owned(),
        role: role.clone(),
        instructions: instructions.to_owned(),
        permissions,
    })
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
    let (record, token) = state.store.with(|conn| -> Result<_, ApiError> {
        let record = new_member_record(conn, &b.name, &b.role, &b.instructions, &b.permissions)?;
        let tx = conn.transaction().map_err(StoreError::from)?;
        let issued = add_member(&tx, &record, Some(&caller.name), now)?;
        tx.commit().map_err(StoreError::from)?;
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
    let record = state.store.with(|conn| -> Result<_, ApiError> {
        let team = load_team(conn)?;
        let mut m = team::member_get(conn, &name)?
            .ok_or_else(|| ApiError::not_found(format!("no such member: {name}")))?;
        if let Some(role) = b.role {
            m.role = role;
        }
        if let Some(i) = b.instructions {
            m.instructions = i;
        }
        if let Some(p) = b.permissions {
            let perms = permission::resolve(
                &p,
                &team.permission_presets,
                &format!("update member '{name}'"),
            )
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
            if !perms.contains(Permission::MembersManage) && is_last_admin(conn, &name)? {
                return Err(ApiError::conflict(
                    "cannot remove members.manage from the last admin — promote someone else first",
                ));
            }
            m.permissions = perms;
        }
        validate_member(&m.name, &m.role, &m.instructions).map_err(ApiError::bad_request)?;
        team::member_update(conn, &m)?;
        Ok(m)
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
    state.store.with(|conn| {
        if !team::member_exists(conn, &name)? {
            return Err(ApiError::not_found(format!("no such member: {name}")));
        }
        if is_last_admin(conn, &name)? {
            return Err(ApiError::conflict(
                "cannot remove the last admin — promote someone else first",
            ));
        }
        let tx = conn.transaction().map_err(StoreError::from)?;
        bootstrap::remove_member(&tx, &name, &caller.name, now_ms())?;
        tx.commit().map_err(StoreError::from)?;
        Ok(())
    })?;
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
    state.store.with(|conn| {
        if !team::member_exists(conn, &name)? {
            return Err(ApiError::not_found(format!("no such member: {name}")));
        }
        let tx = conn.transaction().map_err(StoreError::from)?;
        team::tokens_revoke_all(&tx, &name)?;
        state.forget_auth();
        let (token, info) = team::token_issue(
            &tx,
            &name,
            "rotated",
            "rotate",
            Some(&caller.name),
            now_ms(),
        )?;
        tx.commit().map_err(StoreError::from)?;
        // Under the store lock, so no stream can register with an old token after this.
        state.hub.close_member(&name, Closed::Revoked);
        state.activity_hub.close_owner(&name, None, Closed::Revoked);
        Ok(reply(
            StatusCode::OK,
            &obj! {"token" => &token, "tokenInfo" => &info},
        ))
    })
}

pub(super) async fn tokens_list(
    State(state): State<Shared>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    self_or_manager(&caller, &name)?;
    let tokens = state.store.with(|conn| team::tokens_list(conn, &name))?;
    Ok(reply(StatusCode::OK, &obj! {"tokens" => &tokens}))
}

pub(super) async fn token_delete(
    State(state): State<Shared>,
    caller: Caller,
    Path((name, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    self_or_manager(&caller, &name)?;
    state.store.with(|conn| {
        let tokens = team::tokens_list(conn, &name)?;
        if !tokens.iter().any(|t| t.id == id) {
            return Err(ApiError::not_found("no such token"));
        }
        if tokens.len() == 1 && is_last_admin(conn, &name)? {
            return Err(ApiError::conflict(
                "cannot revoke the last token of the last admin",
            ));
        }
        team::token_delete(conn, &name, &id)?;
        state.forget_auth();
        state.hub.close_token(&name, &id);
        state
            .activity_hub
            .close_owner(&name, Some(&id), Closed::Revoked);
        Ok(StatusCode::NO_CONTENT.into_response())
    })
}
