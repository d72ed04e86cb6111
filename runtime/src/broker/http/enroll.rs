//! Device-code enrollment (`ac7 connect`; broker-api §6.3, web.md §3.2) over
//! [`ac7_protocol::signin::enroll::EnrollStore`].
//!
//! * `POST /enroll {labelHint?}` (no auth) → `{deviceCode, userCode, verificationUri,
//!   verificationUriComplete, expiresIn, interval}`. Limits per client address: 10 enrollments
//!   an hour (the window opens at the first) and 3 live at once; past either, 429 with
//!   `Retry-After` and `retryAfter`. The client address is the socket peer; only with
//!   `ac7 serve --trust-proxy` is it the first `X-Forwarded-For` entry (a header any client can
//!   set, so trusting it without a proxy that overwrites it would let anyone pick their key —
//!   ac7's bug).
//! * `POST /enroll/poll {deviceCode}` (no auth) → `200 {token, tokenId, member}` once approved
//!   (one-shot), else 400 `{"error": "authorization_pending" | "slow_down" | "expired_token" |
//!   "access_denied", "errorDescription"?}`.
//! * `GET /enroll/pending`, `POST /enroll/approve`, `POST /enroll/reject` need `members.manage`.
//!   Approval mints the device's token at once (origin `enroll`, label `label` → hint →
//!   `connected device`); its plaintext waits in memory for the device's next poll. A grant the
//!   device never collects is revoked when the enrollment expires (ac7 leaves it live).
//! * Enrollments live in memory: a broker restart forgets pending ones (the CLI's poll then
//!   gets `expired_token` and the user runs `ac7 connect` again).

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use ac7_protocol::domain::permission::Permission;
use ac7_protocol::signin::enroll::{
    CreateError, DEVICE_RANDOM_BYTES, DecideError, EnrollConfig, EnrollEvent, EnrollStore,
    PollOutcome, USER_RANDOM_BYTES, normalize_user_code,
};
use ac7_protocol::signin::limiter::{AttemptLimiter, LimiterConfig};
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::session::client_addr;
use super::{ApiError, Body, Caller, Issues, Shared, obj, parse_json, reply};
use crate::broker::AppState;
use crate::broker::bootstrap::{add_member, new_member_record, validate_member};
use crate::broker::db::StoreError;
use crate::broker::now_ms;
use crate::broker::team::{self, Role};

/// Enrollments one client address may start per hour.
const MINTS: LimiterConfig = LimiterConfig {
    max_failures: 10,
    window: 3600,
    max_lock: 3600,
};

/// What an approval hands the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    token: String,
    token_id: String,
}

/// The broker's enrollment desk: the store, each enrollment's user agent (by user code), and
/// the per-address mint limit.
#[derive(Debug)]
pub(crate) struct EnrollDesk {
    store: EnrollStore<Grant>,
    user_agents: BTreeMap<String, String>,
    mints: AttemptLimiter<String>,
}

impl EnrollDesk {
    /// An empty desk.
    pub(crate) fn new(config: EnrollConfig) -> Self {
        EnrollDesk {
            store: EnrollStore::new(config),
            user_agents: BTreeMap::new(),
            mints: AttemptLimiter::new(MINTS),
        }
    }
}

impl EnrollDesk {
    /// Expires what is due and returns the grants to revoke.
    fn expire(&mut self, now: u64) -> Vec<(String, Grant)> {
        self.store.handle_timeout(now);
        self.mints.handle_timeout(now);
        let mut revoke = Vec::new();
        while let Some(EnrollEvent::Revoke { member, grant }) = self.store.poll_output() {
            revoke.push((member, grant));
        }
        let live: std::collections::BTreeSet<String> = self
            .store
            .pending(now)
            .into_iter()
            .map(|p| normalize_user_code(&p.user_code))
            .collect();
        self.user_agents.retain(|code, _| live.contains(code));
        revoke
    }
}

fn now_secs() -> u64 {
    u64::try_from(now_ms() / 1000).unwrap_or(0)
}

fn desk(state: &AppState) -> std::sync::MutexGuard<'_, EnrollDesk> {
    state
        .enroll
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Revokes grants that will never be collected.
fn revoke(state: &AppState, grants: Vec<(String, Grant)>) {
    if grants.is_empty() {
        return;
    }
    let result = state.store.tx(|c| -> Result<(), StoreError> {
        for (_, g) in &grants {
            team::token_delete_id(c, &g.token_id)?;
        }
        Ok(())
    });
    match result {
        Ok(()) => {
            for (member, g) in &grants {
                tracing::info!(%member, token_id = %g.token_id, "revoked an enrollment token the device never collected");
            }
        }
        Err(e) => tracing::error!(error = %e, "cannot revoke uncollected enrollment tokens"),
    }
    state.forget_auth();
}

/// Expires enrollments (and revokes uncollected grants) every few seconds while the broker runs.
pub(crate) fn spawn_expiry(state: &Arc<AppState>) {
    let weak: Weak<AppState> = Arc::downgrade(state);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let Some(state) = weak.upgrade() else { return };
            let grants = desk(&state).expire(now_secs());
            revoke(&state, grants);
        }
    });
}

fn too_many(retry_after: u64, why: &str) -> ApiError {
    let mut e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, why)
        .with("code", json!("rate_limited"))
        .with("retryAfter", json!(retry_after));
    e.retry_after = Some(retry_after);
    e
}

fn random<const N: usize>() -> Result<[u8; N], ApiError> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("no entropy: {e}"),
        )
    })?;
    Ok(b)
}

/// `POST /enroll`.
pub(super) async fn create(
    State(state): State<Shared>,
    parts: Parts,
    Body(body): Body,
) -> Result<Response, ApiError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct CreateBody {
        #[serde(default)]
        label_hint: Option<String>,
    }
    let b: CreateBody = if body.iter().all(u8::is_ascii_whitespace) {
        CreateBody { label_hint: None }
    } else {
        parse_json(&body, "enroll")?
    };
    Issues::default()
        .opt_len("labelHint", b.label_hint.as_deref(), 0, 64)
        .finish("enroll")?;
    let address = client_addr(&parts, &state);
    let ua = parts
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.chars().take(256).collect::<String>());
    let now = now_secs();
    let (created, grants) = {
        let mut desk = desk(&state);
        let grants = desk.expire(now);
        if let Err(l) = desk.mints.check(&address, now) {
            drop(desk);
            revoke(&state, grants);
            return Err(too_many(
                l.retry_after,
                &format!(
                    "too many enrollments from this address (at most {} an hour); retry in {} s",
                    MINTS.max_failures, l.retry_after
                ),
            ));
        }
        let mut attempt = 0;
        let created = loop {
            attempt += 1;
            let device = random::<DEVICE_RANDOM_BYTES>()?;
            let user = random::<USER_RANDOM_BYTES>()?;
            let label = b.label_hint.as_deref().unwrap_or("");
            match desk.store.create(&device, &user, &address, label, now) {
                Ok(c) => break Ok(c),
                Err(CreateError::CodeTaken) if attempt < 8 => continue,
                Err(e) => break Err(e),
            }
        };
        let created = match created {
            Ok(c) => c,
            Err(CreateError::TooMany { retry_after }) => {
                drop(desk);
                revoke(&state, grants);
                return Err(too_many(
                    retry_after,
                    &format!("too many pending enrollments; retry in {retry_after} s"),
                ));
            }
            Err(e @ CreateError::CodeTaken) => {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    e.to_string(),
                ));
            }
        };
        let _ = desk.mints.record_failure(address.clone(), now);
        if let Some(ua) = ua {
            desk.user_agents
                .insert(normalize_user_code(&created.user_code), ua);
        }
        (created, grants)
    };
    revoke(&state, grants);
    tracing::info!(%address, user_code = %created.user_code, "device enrollment started");
    let complete = format!("/enroll?code={}", created.user_code);
    Ok(reply(
        StatusCode::OK,
        &obj! {
            "deviceCode" => &created.device_code,
            "userCode" => &created.user_code,
            "verificationUri" => "/enroll",
            "verificationUriComplete" => &complete,
            "expiresIn" => &created.expires_at.saturating_sub(now),
            "interval" => &created.interval,
        },
    ))
}

fn poll_error(code: &str, description: Option<&str>) -> ApiError {
    let e = ApiError::bad_request(code);
    match description {
        Some(d) => e.with("errorDescription", json!(d)),
        None => e,
    }
}

/// `POST /enroll/poll`.
pub(super) async fn poll(
    State(state): State<Shared>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct PollBody {
        device_code: String,
    }
    let b: PollBody = parse_json(&body, "poll")?;
    let now = now_secs();
    let (outcome, grants) = {
        let mut desk = desk(&state);
        let outcome = desk.store.poll(&b.device_code, now);
        (outcome, desk.expire(now))
    };
    revoke(&state, grants);
    match outcome {
        PollOutcome::Pending => Err(poll_error("authorization_pending", None)),
        PollOutcome::SlowDown => Err(poll_error("slow_down", None)),
        PollOutcome::Expired => Err(poll_error("expired_token", None)),
        PollOutcome::Denied { reason } => Err(poll_error("access_denied", Some(&reason))),
        PollOutcome::Approved { member, grant } => {
            let record = state.store.view(|c| -> Result<_, StoreError> {
                // The grant's token goes with its member: if it is gone, so is the member it
                // was minted for (even if a new member has that name now).
                if !team::token_id_exists(c, &grant.token_id)? {
                    return Ok(None);
                }
                team::member_get(c, &member)
            })?;
            let Some(record) = record else {
                // Removed between approval and collection.
                revoke(&state, vec![(member, grant)]);
                return Err(poll_error("expired_token", None));
            };
            tracing::info!(member = %record.name, "device enrollment collected");
            Ok(reply(
                StatusCode::OK,
                &obj! {
                    "token" => &grant.token,
                    "tokenId" => &grant.token_id,
                    "member" => &record.teammate(),
                },
            ))
        }
    }
}

fn require_manager(caller: &Caller, doing: &str) -> Result<(), ApiError> {
    ApiError::require(caller.permissions, Permission::MembersManage, doing)
}

/// `GET /enroll/pending`.
pub(super) async fn pending(
    State(state): State<Shared>,
    caller: Caller,
) -> Result<Response, ApiError> {
    require_manager(&caller, "listing enrollments")?;
    let now = now_secs();
    let (list, grants) = {
        let mut desk = desk(&state);
        let grants = desk.expire(now);
        let list: Vec<super::Obj> = desk
            .store
            .pending(now)
            .into_iter()
            .map(|p| {
                let ua = desk
                    .user_agents
                    .get(&normalize_user_code(&p.user_code))
                    .cloned();
                let ip = (p.address != "unknown").then_some(p.address);
                let ms = |s: u64| i64::try_from(s).unwrap_or(i64::MAX).saturating_mul(1000);
                obj! {
                    "userCode" => &p.user_code,
                    "labelHint" => &p.label,
                    "sourceIp" => &ip,
                    "sourceUa" => &ua,
                    "createdAt" => &ms(p.created_at),
                    "expiresAt" => &ms(p.expires_at),
                }
            })
            .collect();
        (list, grants)
    };
    revoke(&state, grants);
    Ok(reply(StatusCode::OK, &obj! {"enrollments" => &list}))
}

fn decide_error(e: DecideError) -> ApiError {
    let status = match e {
        DecideError::Forbidden => StatusCode::FORBIDDEN,
        DecideError::NotFound => StatusCode::NOT_FOUND,
        DecideError::Expired => StatusCode::GONE,
        DecideError::AlreadyApproved | DecideError::AlreadyDenied => StatusCode::CONFLICT,
    };
    ApiError::new(status, e.to_string())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ApproveBody {
    mode: String,
    user_code: String,
    member_name: String,
    #[serde(default)]
    role: Option<Role>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    permissions: Option<Vec<String>>,
    #[serde(default)]
    label: Option<String>,
}

/// `POST /enroll/approve`: `{mode: "bind", userCode, memberName, label?}` or `{mode: "create",
/// userCode, memberName, role, instructions?, permissions, label?}` → `{member, tokenInfo}`.
pub(super) async fn approve(
    State(state): State<Shared>,
    caller: Caller,
    Body(body): Body,
) -> Result<Response, ApiError> {
    require_manager(&caller, "approving enrollments")?;
    let b: ApproveBody = parse_json(&body, "approve")?;
    Issues::default()
        .opt_len("label", b.label.as_deref(), 0, 64)
        .finish("approve")?;
    let create = match b.mode.as_str() {
        "bind" => None,
        "create" => {
            let role = b
                .role
                .clone()
                .ok_or_else(|| ApiError::bad_request("mode create needs a role"))?;
            let instructions = b.instructions.clone().unwrap_or_default();
            validate_member(&b.member_name, &role, &instructions).map_err(ApiError::bad_request)?;
            Some((
                role,
                instructions,
                b.permissions.clone().unwrap_or_default(),
            ))
        }
        other => {
            return Err(ApiError::bad_request(format!(
                "mode must be \"bind\" or \"create\", not {other:?}"
            )));
        }
    };
    let now = now_secs();
    let now_ms = now_ms();
    let code = normalize_user_code(&b.user_code);
    // The desk stays locked from the check to the approval, so the code cannot be decided
    // by someone else in between.
    let mut desk = desk(&state);
    let grants = desk.expire(now);
    let listed = desk
        .store
        .pending(now)
        .into_iter()
        .find(|p| normalize_user_code(&p.user_code) == code);
    let Some(pending) = listed else {
        // Not pending: the store says why (nothing is approved by this call).
        let dummy = Grant {
            token: String::new(),
            token_id: String::new(),
        };
        let err = desk
            .store
            .approve(&code, caller.permissions, &b.member_name, dummy, now)
            .err()
            .unwrap_or(DecideError::NotFound);
        drop(desk);
        revoke(&state, grants);
        return Err(decide_error(err));
    };
    let label = b
        .label
        .clone()
        .filter(|l| !l.trim().is_empty())
        .or_else(|| Some(pending.label.clone()).filter(|l| !l.trim().is_empty()))
        .unwrap_or_else(|| "connected device".to_owned());
    let minted = state.store.tx(|c| -> Result<_, ApiError> {
        let record = match &create {
            None => team::member_get(c, &b.member_name)?
                .ok_or_else(|| ApiError::not_found(format!("no such member: {}", b.member_name)))?,
            Some((role, instructions, perms)) => {
                let record = new_member_record(
                    c,
                    &b.member_name,
                    role,
                    instructions,
                    perms,
                    &format!("create member '{}'", b.member_name),
                )?;
                add_member(c, &record, Some(&caller.name), now_ms)?;
                // The device's token is its only one.
                team::tokens_revoke_all(c, &record.name)?;
                record
            }
        };
        let (token, info) = team::token_issue(
            c,
            &record.name,
            &label,
            "enroll",
            Some(&caller.name),
            now_ms,
        )?;
        Ok((record, token, info))
    });
    let (record, token, info) = match minted {
        Ok(m) => m,
        Err(e) => {
            drop(desk);
            revoke(&state, grants);
            return Err(e);
        }
    };
    let grant = Grant {
        token,
        token_id: info.id.clone(),
    };
    let approved = desk
        .store
        .approve(&code, caller.permissions, &record.name, grant.clone(), now);
    desk.user_agents.remove(&code);
    drop(desk);
    revoke(&state, grants);
    if let Err(e) = approved {
        revoke(&state, vec![(record.name.clone(), grant)]);
        return Err(decide_error(e));
    }
    state.forget_auth();
    if create.is_some() {
        state
            .hub
            .register_member(&record.name, record.role.clone(), now_ms);
    }
    tracing::info!(member = %record.name, by = %caller.name, user_code = %pending.user_code, "device enrollment approved");
    Ok(reply(
        StatusCode::OK,
        &obj! {"member" => &record.teammate(), "tokenInfo" => &info},
    ))
}

/// `POST /enroll/reject {userCode, reason?}` → 204.
pub(super) async fn reject(
    State(state): State<Shared>,
    caller: Caller,
    Body(body): Body,
) -> Result<Response, ApiError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct RejectBody {
        user_code: String,
        #[serde(default)]
        reason: Option<String>,
    }
    require_manager(&caller, "rejecting enrollments")?;
    let b: RejectBody = parse_json(&body, "reject")?;
    Issues::default()
        .opt_len("reason", b.reason.as_deref(), 0, 256)
        .finish("reject")?;
    let now = now_secs();
    let reason = b
        .reason
        .unwrap_or_else(|| format!("rejected by {}", caller.name));
    let (result, grants) = {
        let mut desk = desk(&state);
        let grants = desk.expire(now);
        let result = desk
            .store
            .deny(&b.user_code, caller.permissions, &reason, now);
        desk.user_agents.remove(&normalize_user_code(&b.user_code));
        (result, grants)
    };
    revoke(&state, grants);
    result.map_err(decide_error)?;
    tracing::info!(by = %caller.name, user_code = %b.user_code, "device enrollment rejected");
    Ok(StatusCode::NO_CONTENT.into_response())
}
