//! Creating a team in an empty database, and the member administration shared by
//! the HTTP API and the offline `ac7 member` commands.

use ac7_protocol::domain::message::is_valid_name;
use ac7_protocol::domain::permission::{Permission, PermissionSet, default_presets, resolve};
use ac7_protocol::domain::vfs::FsPath;

use super::config::{ConfigError, TeamConfig};
use super::db::{Store, StoreError};
use super::hub::Closed;
use super::store::Conn;
use super::team::{self, MemberRecord, Role, Team};
use super::{AppState, fs, now_ms};

/// A member created with its one-time plaintext token.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    /// Member name.
    pub name: String,
    /// The bearer token (shown once).
    pub token: String,
}

/// Why bootstrapping failed.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// Bad config.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Store failure.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A team already exists.
    #[error("the database already has a team ({0}); not creating another")]
    AlreadyHasTeam(String),
}

/// Checks team fields against the API limits.
pub fn validate_team(team: &Team) -> Result<(), String> {
    let n = |s: &str| s.chars().count();
    if !(1..=128).contains(&n(&team.name)) {
        return Err("team name must be 1-128 characters".into());
    }
    if !(1..=512).contains(&n(&team.directive)) {
        return Err("team directive must be 1-512 characters".into());
    }
    if n(&team.context) > 4096 {
        return Err("team context must be at most 4096 characters".into());
    }
    Ok(())
}

/// Names no member may take (compared without regard to case): `.` and `..` are
/// not directory names, `/objectives` is the objectives' folder, `ac7` speaks for
/// the broker itself.
pub const RESERVED_NAMES: [&str; 4] = [".", "..", "ac7", "objectives"];

/// Checks member fields against the API limits.
pub fn validate_member(name: &str, role: &Role, instructions: &str) -> Result<(), String> {
    if !is_valid_name(name) {
        return Err(format!(
            "member name {name:?} must be 1-128 characters of A-Z a-z 0-9 . _ -"
        ));
    }
    if RESERVED_NAMES.iter().any(|r| r.eq_ignore_ascii_case(name)) {
        return Err(format!(
            "member name {name:?} is reserved (not allowed: {})",
            RESERVED_NAMES.join(", ")
        ));
    }
    if !(1..=64).contains(&role.title.chars().count()) {
        return Err(format!("member {name}: role title must be 1-64 characters"));
    }
    if role.description.chars().count() > 512 {
        return Err(format!(
            "member {name}: role description must be at most 512 characters"
        ));
    }
    if instructions.chars().count() > 8192 {
        return Err(format!(
            "member {name}: instructions must be at most 8192 characters"
        ));
    }
    Ok(())
}

/// Creates the team and members of `config` in `store` and returns each member's token.
pub fn bootstrap(store: &Store, config: &TeamConfig) -> Result<Vec<IssuedToken>, BootstrapError> {
    let now = now_ms();
    let mut presets = default_presets();
    presets.extend(config.team.permission_presets.clone());
    for (name, leaves) in &presets {
        ac7_protocol::domain::permission::resolve_preset(name, leaves, &presets)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
    }
    let team = Team {
        name: config.team.name.clone(),
        directive: config.team.directive.clone(),
        context: config.team.context.clone(),
        permission_presets: presets,
    };
    validate_team(&team).map_err(ConfigError::Invalid)?;
    if config.members.is_empty() {
        return Err(ConfigError::Invalid("at least one member is required".into()).into());
    }
    let mut records = Vec::new();
    for m in &config.members {
        validate_member(&m.name, &m.role, &m.instructions).map_err(ConfigError::Invalid)?;
        let permissions = resolve(
            &m.permissions,
            &team.permission_presets,
            &format!("member '{}'", m.name),
        )
        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if records
            .iter()
            .any(|r: &MemberRecord| r.name.eq_ignore_ascii_case(&m.name))
        {
            return Err(
                ConfigError::Invalid(format!("member '{}' is listed twice", m.name)).into(),
            );
        }
        records.push(MemberRecord {
            name: m.name.clone(),
            role: m.role.clone(),
            instructions: m.instructions.clone(),
            permissions,
        });
    }
    store.tx(|c| {
        if let Some(existing) = team::team_get(c)? {
            return Err(BootstrapError::AlreadyHasTeam(existing.name));
        }
        team::team_put(c, &team, now)?;
        let mut issued = Vec::new();
        for r in &records {
            issued.push(add_member(c, r, None, now)?);
        }
        Ok(issued)
    })
}

/// Inserts a member (the name must be free), creates its home, issues its first token.
pub fn add_member(
    c: &Conn<'_>,
    record: &MemberRecord,
    created_by: Option<&str>,
    now: i64,
) -> Result<IssuedToken, StoreError> {
    if !team::member_insert(c, record, now)? {
        return Err(StoreError::Corrupt(format!(
            "member '{}' already exists",
            record.name
        )));
    }
    let home = FsPath::parse(&format!("/{}", record.name))
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    fs::ensure_dir(c, &home, &record.name, now).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let (token, _) = team::token_issue(c, &record.name, "initial", "bootstrap", created_by, now)?;
    Ok(IssuedToken {
        name: record.name.clone(),
        token,
    })
}

/// Removes member `name` in `c`'s transaction; `false` if there is no such member. The
/// caller checks that it is not the last admin, and afterwards ends its live streams.
///
/// What happens to what the member leaves behind (docs/broker.md, "Removing a member"):
///
/// - its tokens, browser sessions, TOTP secret, channel memberships and the read grants it
///   held are deleted ([`team::member_delete`]);
/// - its home folder `/<name>` moves, whole, to `/removed members/<name>-<id>` (a name no
///   member can take: only `members.manage` holders reach it; read grants others hold on
///   those files follow them), so a new member of that name starts with an empty home;
/// - on objectives it is replaced by [`team::removed_name`] as assignee and originator (open
///   ones stay open, for someone with `objectives.reassign` to hand on) and dropped from
///   watcher lists. The objectives' audit events keep the name as it was;
/// - messages and activity stay: the rest of the team keeps its side of the history, and a new
///   member of that name sees none of it (its incarnation starts later; see [`team`]).
pub fn remove_member(c: &Conn<'_>, name: &str, actor: &str, now: i64) -> Result<bool, StoreError> {
    let Some(id) = team::member_seq(c, name)? else {
        return Ok(false);
    };
    fs::archive_home(c, name, id, actor, now).map_err(|e| match e {
        fs::FsError::Store(e) => e,
        other => StoreError::Corrupt(other.to_string()),
    })?;
    super::objectives::detach_member(c, name)?;
    super::cursors::forget(c, name)?;
    team::member_delete(c, name)
}

/// Whether removing `members.manage` from (or deleting) `name` would leave no admin.
pub fn is_last_admin(c: &Conn<'_>, name: &str) -> Result<bool, StoreError> {
    let managers = team::managers(c)?;
    Ok(managers.len() == 1 && managers[0] == name)
}

/// Whether `perms` holds `members.manage`.
pub fn is_manager(perms: PermissionSet) -> bool {
    perms.contains(Permission::MembersManage)
}

/// Why a member administration step (over HTTP or `ac7 member`) was refused. Nothing was
/// written: the caller's transaction rolls back.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Store failure.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The database has no team.
    #[error("no team configured")]
    NoTeam,
    /// The request is invalid (bad permissions, bad fields).
    #[error("{0}")]
    Invalid(String),
    /// No such member or token.
    #[error("{0}")]
    NotFound(String),
    /// The change conflicts with the team's state (a taken name, the last admin).
    #[error("{0}")]
    Conflict(String),
}

fn no_such_member(name: &str) -> AdminError {
    AdminError::NotFound(format!("no such member: {name}"))
}

/// The team, which must exist.
pub fn load_team(c: &Conn<'_>) -> Result<Team, AdminError> {
    team::team_get(c)?.ok_or(AdminError::NoTeam)
}

/// The record of a new member `name`: `permissions` resolved through the team's presets
/// (`context` names the request in the error); a conflict when the name is taken (without
/// regard to case). Nothing is stored.
pub fn new_member_record(
    c: &Conn<'_>,
    name: &str,
    role: &Role,
    instructions: &str,
    permissions: &[String],
    context: &str,
) -> Result<MemberRecord, AdminError> {
    let team = load_team(c)?;
    let permissions = resolve(permissions, &team.permission_presets, context)
        .map_err(|e| AdminError::Invalid(e.to_string()))?;
    if let Some(existing) = team::member_name_taken(c, name)? {
        return Err(AdminError::Conflict(team::name_taken_text(name, &existing)));
    }
    Ok(MemberRecord {
        name: name.to_owned(),
        role: role.clone(),
        instructions: instructions.to_owned(),
        permissions,
    })
}

/// Changes member `name`: `edit` sets its role and instructions, then `permissions` (when
/// given) are resolved through the team's presets (`context` names the request in the error)
/// and may not take `members.manage` from the last admin; the result is validated and stored.
pub fn update_member(
    c: &Conn<'_>,
    name: &str,
    edit: impl FnOnce(&mut MemberRecord),
    permissions: Option<&[String]>,
    context: &str,
) -> Result<MemberRecord, AdminError> {
    let team = load_team(c)?;
    let mut m = team::member_get(c, name)?.ok_or_else(|| no_such_member(name))?;
    edit(&mut m);
    if let Some(p) = permissions {
        let perms = resolve(p, &team.permission_presets, context)
            .map_err(|e| AdminError::Invalid(e.to_string()))?;
        if !is_manager(perms) && is_last_admin(c, name)? {
            return Err(AdminError::Conflict(
                "cannot remove members.manage from the last admin — promote someone else first"
                    .into(),
            ));
        }
        m.permissions = perms;
    }
    validate_member(&m.name, &m.role, &m.instructions).map_err(AdminError::Invalid)?;
    team::member_update(c, &m)?;
    Ok(m)
}

/// Removes member `name` ([`remove_member`]), unless there is no such member or it is the
/// last admin.
pub fn remove_member_checked(
    c: &Conn<'_>,
    name: &str,
    actor: &str,
    now: i64,
) -> Result<(), AdminError> {
    if !team::member_exists(c, name)? {
        return Err(no_such_member(name));
    }
    if is_last_admin(c, name)? {
        return Err(AdminError::Conflict(
            "cannot remove the last admin — promote someone else first".into(),
        ));
    }
    remove_member(c, name, actor, now)?;
    Ok(())
}

/// Revokes every token of member `name` and issues a new one (`rotated`, by `created_by`);
/// returns its plaintext and info.
pub fn rotate_token(
    c: &Conn<'_>,
    name: &str,
    created_by: Option<&str>,
    now: i64,
) -> Result<(String, team::TokenInfo), AdminError> {
    if !team::member_exists(c, name)? {
        return Err(no_such_member(name));
    }
    team::tokens_revoke_all(c, name)?;
    Ok(team::token_issue(
        c, name, "rotated", "rotate", created_by, now,
    )?)
}

/// Revokes member `name`'s token `id`, unless it is not one of its tokens or it is the last
/// token of the last admin.
pub fn revoke_token(c: &Conn<'_>, name: &str, id: &str) -> Result<(), AdminError> {
    let tokens = team::tokens_list(c, name)?;
    if !tokens.iter().any(|t| t.id == id) {
        return Err(AdminError::NotFound("no such token".into()));
    }
    if tokens.len() == 1 && is_last_admin(c, name)? {
        return Err(AdminError::Conflict(
            "cannot revoke the last token of the last admin".into(),
        ));
    }
    team::token_delete(c, name, id)?;
    Ok(())
}

/// The team.
pub fn team_view(store: &Store) -> Result<Team, AdminError> {
    store.view(load_team)
}

/// Sets the given team fields, validates and stores the team; returns it.
pub fn edit_team(
    store: &Store,
    name: Option<String>,
    directive: Option<String>,
    context: Option<String>,
    now: i64,
) -> Result<Team, AdminError> {
    store.tx(|c| {
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
        validate_team(&team).map_err(AdminError::Invalid)?;
        team::team_put(c, &team, now)?;
        Ok(team)
    })
}

/// Sets permission preset `name` to `permissions` resolved to leaves (which it returns).
pub fn put_preset(
    store: &Store,
    name: &str,
    permissions: &[String],
    now: i64,
) -> Result<Vec<String>, AdminError> {
    store.tx(|c| {
        let mut team = load_team(c)?;
        let set = ac7_protocol::domain::permission::resolve_preset(
            name,
            permissions,
            &team.permission_presets,
        )
        .map_err(|e| AdminError::Invalid(e.to_string()))?;
        let leaves: Vec<String> = set.names().into_iter().map(str::to_owned).collect();
        team.permission_presets
            .insert(name.to_owned(), leaves.clone());
        team::team_put(c, &team, now)?;
        Ok(leaves)
    })
}

/// Deletes permission preset `name` (members keep the leaves they were given).
pub fn delete_preset(store: &Store, name: &str, now: i64) -> Result<(), AdminError> {
    store.tx(|c| {
        let mut team = load_team(c)?;
        if team.permission_presets.remove(name).is_none() {
            return Err(AdminError::NotFound(format!("no such preset: {name}")));
        }
        team::team_put(c, &team, now)?;
        Ok(())
    })
}

/// Every member.
pub fn list_members(store: &Store) -> Result<Vec<MemberRecord>, AdminError> {
    Ok(store.view(team::members_list)?)
}

/// A member to create (already validated with [`validate_member`]).
#[derive(Debug, Clone)]
pub struct NewMember {
    /// Name.
    pub name: String,
    /// Role.
    pub role: Role,
    /// Personal instructions.
    pub instructions: String,
    /// Permissions and presets, resolved through the team's presets.
    pub permissions: Vec<String>,
}

/// Creates member `new` on `creator`'s behalf and issues its first token; after the commit
/// the broker forgets cached credentials and the hub knows the member. Returns the member
/// and the token's plaintext.
pub fn create_member(
    state: &AppState,
    creator: &str,
    new: &NewMember,
    now: i64,
) -> Result<(MemberRecord, String), AdminError> {
    let (record, token) = state.store.tx(|c| -> Result<_, AdminError> {
        let record = new_member_record(
            c,
            &new.name,
            &new.role,
            &new.instructions,
            &new.permissions,
            &format!("create member '{}'", new.name),
        )?;
        let issued = add_member(c, &record, Some(creator), now)?;
        Ok((record, issued.token))
    })?;
    state.forget_auth();
    state
        .hub
        .register_member(&record.name, record.role.clone(), now);
    Ok((record, token))
}

/// Changes member `name`'s role, instructions and permissions (those given; see
/// [`update_member`]); after the commit the broker forgets cached credentials and the hub
/// learns the new role.
pub fn change_member(
    state: &AppState,
    name: &str,
    role: Option<Role>,
    instructions: Option<String>,
    permissions: Option<&[String]>,
    now: i64,
) -> Result<MemberRecord, AdminError> {
    let record = state.store.tx(|c| {
        update_member(
            c,
            name,
            |m| {
                if let Some(role) = role {
                    m.role = role;
                }
                if let Some(i) = instructions {
                    m.instructions = i;
                }
            },
            permissions,
            &format!("update member '{name}'"),
        )
    })?;
    state.forget_auth();
    state
        .hub
        .register_member(&record.name, record.role.clone(), now);
    Ok(record)
}

/// Removes member `name` on `actor`'s behalf ([`remove_member_checked`]); after the commit
/// its live streams and those watching its activity end.
pub fn delete_member(
    state: &AppState,
    name: &str,
    actor: &str,
    now: i64,
) -> Result<(), AdminError> {
    state
        .store
        .tx(|c| remove_member_checked(c, name, actor, now))?;
    state.forget_auth();
    state.hub.remove_member(name);
    state.activity_hub.close_owner(name, None, Closed::Removed);
    // Streams watching its activity end too: a new member of that name is someone else.
    state.activity_hub.remove_member(name);
    Ok(())
}

/// Replaces member `name`'s tokens with a new one issued by `actor` ([`rotate_token`]);
/// after the commit the streams opened with the old tokens end. Returns the plaintext and
/// info of the new token.
pub fn rotate_member_token(
    state: &AppState,
    name: &str,
    actor: &str,
    now: i64,
) -> Result<(String, team::TokenInfo), AdminError> {
    let issued = state
        .store
        .tx(|c| rotate_token(c, name, Some(actor), now))?;
    // After the commit: a stream registers only after checking its token under the store's
    // lock, so none registers with an old token after this.
    state.forget_auth();
    state.hub.close_member(name, Closed::Revoked);
    state.activity_hub.close_owner(name, None, Closed::Revoked);
    Ok(issued)
}

/// Member `name`'s tokens.
pub fn member_tokens(store: &Store, name: &str) -> Result<Vec<team::TokenInfo>, AdminError> {
    store.view(|c| {
        if !team::member_exists(c, name)? {
            return Err(no_such_member(name));
        }
        Ok(team::tokens_list(c, name)?)
    })
}

/// Revokes member `name`'s token `id` ([`revoke_token`]); after the commit the streams
/// opened with it end.
pub fn revoke_member_token(state: &AppState, name: &str, id: &str) -> Result<(), AdminError> {
    state.store.tx(|c| revoke_token(c, name, id))?;
    state.forget_auth();
    state.hub.close_token(name, id);
    state
        .activity_hub
        .close_owner(name, Some(id), Closed::Revoked);
    Ok(())
}
