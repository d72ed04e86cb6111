//! Team and member administration: `/team`, `/team/presets`, `/members`, tokens.

use ac7_protocol::domain::permission::Permission;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;

use super::{ApiError, Body, Caller, Issues, Shared, obj, parse_json, reply};
use crate::broker::bootstrap::{self, AdminError, NewMember, validate_member};
use crate::broker::now_ms;
use crate::broker::team::{MemberRecord, Role};

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

/// `GET /backup` (`members.manage`): a consistent copy of the team's SQLite database, taken
/// while the broker runs. The copy is made beside the database, opened, unlinked and streamed,
/// so none of it stays on the broker's disk.
pub(super) async fn backup(
    State(state): State<Shared>,
    caller: Caller,
) -> Result<Response, ApiError> {
    ApiError::require(caller.permissions, Permission::MembersManage, "a backup")?;
    if state.store.backend() == crate::broker::store::Backend::Postgres {
        return Err(ApiError::conflict(
            "this team is kept in PostgreSQL: back it up with pg_dump",
        ));
    }
    let db = &state.config.db_path;
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".backup-{}", uuid::Uuid::new_v4().simple()));
    let copy = db.with_file_name(name);
    // Whatever happened, nothing of the copy stays on disk (an open file outlives its name).
    let opened = state
        .store
        .snapshot(&copy)
        .map(|()| std::fs::File::open(&copy));
    let _ = std::fs::remove_file(&copy);
    let file = opened?.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot read the copy: {e}"),
        )
    })?;
    let size = file.metadata().map_or(0, |m| m.len());
    Ok(super::fs::streamed(
        axum::body::Body::from_stream(super::fs::file_chunks(tokio::fs::File::from_std(file))),
        size,
        "application/vnd.sqlite3",
        "ac7-backup.db",
    ))
}

pub(super) async fn team_get(
    State(state): State<Shared>,
    _caller: Caller,
) -> Result<Response, ApiError> {
    let team = bootstrap::team_view(&state.store)?;
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
    let team = bootstrap::edit_team(&state.store, name, directive, context, now_ms())?;
    Ok(reply(StatusCode::OK, &obj! {"team" => &team}))
}

pub(super) async fn presets_list(
    State(state): State<Shared>,
    _caller: Caller,
) -> Result<Response, ApiError> {
    let team = bootstrap::team_view(&state.store)?;
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
    let leaves = bootstrap::put_preset(&state.store, &name, &b.permissions, now_ms())?;
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
    bootstrap::delete_preset(&state.store, &name, now_ms())?;
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
    let members = bootstrap::list_members(&state.store)?;
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
    let (record, token) = bootstrap::create_member(
        &state,
        &caller.name,
        &NewMember {
            name: b.name,
            role: b.role,
            instructions: b.instructions,
            permissions: b.permissions,
        },
        now_ms(),
    )?;
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
    let record = bootstrap::change_member(
        &state,
        &name,
        b.role,
        b.instructions,
        b.permissions.as_deref(),
        now_ms(),
    )?;
    Ok(reply(StatusCode::OK, &MemberRecord::view(&record)))
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
    bootstrap::delete_member(&state, &name, &caller.name, now_ms())?;
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
    let (token, info) = bootstrap::rotate_member_token(&state, &name, &caller.name, now_ms())?;
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
    let tokens = bootstrap::member_tokens(&state.store, &name)?;
    Ok(reply(StatusCode::OK, &obj! {"tokens" => &tokens}))
}

pub(super) async fn token_delete(
    State(state): State<Shared>,
    caller: Caller,
    Path((name, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    self_or_manager(&caller, &name)?;
    bootstrap::revoke_member_token(&state, &name, &id)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
