//! Device-code enrollment (`ac7 connect`) over
//! [`ac7_protocol::signin::enroll::EnrollStore`].
//!
//! * `POST /enroll {labelHint?}` (no auth) → `{deviceCode, userCode, verificationUri,
//!   verificationUriComplete, expiresIn, interval}`. Limits per client address: 10 enrollments
//!   an hour (the window opens at the first) and 3 live at once; past either, 429 with
//!   `Retry-After` and `retryAfter`. The client address is the socket peer; only with
//!   `ac7 serve --trust-proxy` is it the first `X-Forwarded-For` entry (a header any client can
//!   set, so trusting it without a proxy that overwrites it would let anyone pick their key).
//! * `POST /enroll/poll {deviceCode}` (no auth) → `200 {token, tokenId, member}` once approved
//!   (one-shot), else 400 `{"error": "authorization_pending" | "slow_down" | "expired_token" |
//!   "access_denied", "errorDescription"?}`.
//! * `GET /enroll/pending`, `POST /enroll/approve`, `POST /enroll/reject` need `members.manage`.
//!   Approval mints the device's token at once (origin `enroll`, label `label` → hint →
//!   `connected device`); its plaintext waits in the store for the device's next poll. A grant
//!   the device never collects is revoked when the enrollment expires (the TypeScript ac7
//!   leaves it live).
//! * Enrollments live in the store ([`crate::broker::enrollments`]): a restart forgets none,
//!   and with replicas a device may poll any of them.

use std::sync::{Arc, Weak};
use std::time::Duration;

use ac7_protocol::domain::permission::Permission;
use ac7_protocol::signin::enroll::{
    CreateError, DEVICE_RANDOM_BYTES, DecideError, PollOutcome, USER_RANDOM_BYTES,
    normalize_user_code,
};
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
use crate::broker::enrollments::{self, Desk, Grant, MINTS};
use crate::broker::now_ms;
use crate::broker::store::Conn;
use crate::broker::team::{self, Role};

fn now_secs() -> u64 {
    u64::try_from(now_ms() / 1000).unwrap_or(0)
}

/// Runs `f` on the enrollment desk in one transaction (loaded with `address`'s mint count when
/// given), after expiring what is due and revoking the grants nobody collected; what `f` and
/// the expiry changed is written back when `f` returns `Ok`.
fn at_desk<T>(
    state: &AppState,
    address: Option<&str>,
    f: impl FnOnce(&Conn<'_>, &mut Desk, u64) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let now = now_secs();
    let (out, revoked, next) = state.store.tx(|c| -> Result<_, ApiError> {
        let mut desk = enrollments::load(c, state.config.enroll, address)?;
        let revoked = desk.expire(now);
        enrollments::revoke(c, &revoked)?;
        let out = f(c, &mut desk, now)?;
        desk.save(c, now)?;
        Ok((out, revoked, desk.next_expiry()))
    })?;
    // The expiry task wakes only when the next expiry moved.
    state.enroll_next.send_if_modified(|at| {
        let moved = *at != next;
        *at = next;
        moved
    });
    for (member, g) in &revoked {
        tracing::info!(%member, token_id = %g.token_id, "revoked an enrollment token the device never collected");
    }
    if !revoked.is_empty() {
        state.forget_auth();
    }
    Ok(out)
}

/// Expires enrollments (and revokes uncollected grants) when they are due while the broker
/// runs: the task sleeps until the earliest expiry the desk reported (`poll_timeout`), or until
/// a request on this process changes it; with no enrollment it sleeps until one is made. (On
/// PostgreSQL another replica's enrollments expire by that replica's task, and by any request.)
pub(crate) fn spawn_expiry(state: &Arc<AppState>) {
    /// The wait before trying again after the store failed.
    const RETRY: Duration = Duration::from_secs(5);
    let weak: Weak<AppState> = Arc::downgrade(state);
    let mut next = state.enroll_next.subscribe();
    tokio::spawn(async move {
        loop {
            let Some(state) = weak.upgrade() else { return };
            // Expires what is due and publishes the next expiry.
            let expired =
                crate::broker::store::off_worker(|| at_desk(&state, None, |_, _, _| Ok(())));
            drop(state);
            let wait = match expired {
                Err(e) => {
                    tracing::warn!(error = %e.error, "cannot expire enrollments");
                    Some(RETRY)
                }
                Ok(()) => (*next.borrow_and_update())
                    .map(|at| Duration::from_secs(at.saturating_sub(now_secs()))),
            };
            match wait {
                Some(wait) => {
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        changed = next.changed() => if changed.is_err() { return },
                    }
                }
                None => {
                    if next.changed().await.is_err() {
                        return;
                    }
                }
            }
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
    let label = b.label_hint.clone().unwrap_or_default();
    let (created, now) = at_desk(&state, Some(&address), |_, desk, now| {
        if let Err(l) = desk.mints.check(&address, now) {
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
            match desk.store.create(&device, &user, &address, &label, now) {
                Ok(c) => break c,
                Err(CreateError::CodeTaken) if attempt < 8 => continue,
                Err(CreateError::TooMany { retry_after }) => {
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
            }
        };
        let _ = desk.mints.record_failure(address.clone(), now);
        if let Some(ua) = ua {
            desk.user_agents
                .insert(normalize_user_code(&created.user_code), ua);
        }
        Ok((created, now))
    })?;
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
    let key = enrollments::device_key(&b.device_code);
    let outcome = at_desk(&state, None, |c, desk, now| {
        let outcome = desk.store.poll(&key, now);
        if let PollOutcome::Approved { member, grant } = outcome {
            // The grant's token goes with its member: if it is gone, so is the member it was
            // minted for (even if a new member has that name now).
            let record = if team::token_id_exists(c, &grant.token_id)? {
                team::member_get(c, &member)?
            } else {
                None
            };
            return Ok(match record {
                Some(record) => Collected::Approved(record, grant),
                None => {
                    // Removed between approval and collection.
                    enrollments::revoke(c, &[(member, grant)])?;
                    Collected::Other(PollOutcome::Expired)
                }
            });
        }
        Ok(Collected::Other(outcome))
    })?;
    let outcome = match outcome {
        Collected::Approved(record, grant) => {
            tracing::info!(member = %record.name, "device enrollment collected");
            return Ok(reply(
                StatusCode::OK,
                &obj! {
                    "token" => &grant.token,
                    "tokenId" => &grant.token_id,
                    "member" => &record.teammate(),
                },
            ));
        }
        Collected::Other(o) => o,
    };
    match outcome {
        PollOutcome::Pending => Err(poll_error("authorization_pending", None)),
        PollOutcome::SlowDown => Err(poll_error("slow_down", None)),
        PollOutcome::Expired => Err(poll_error("expired_token", None)),
        PollOutcome::Denied { reason } => Err(poll_error("access_denied", Some(&reason))),
        PollOutcome::Approved { .. } => Err(poll_error("expired_token", None)),
    }
}

/// A poll's outcome once its grant, if any, was checked against its member.
enum Collected {
    Approved(team::MemberRecord, Grant),
    Other(PollOutcome<Grant>),
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
    let list = at_desk(&state, None, |_, desk, now| {
        Ok(desk
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
            .collect::<Vec<super::Obj>>())
    })?;
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
    let now_ms = now_ms();
    let code = normalize_user_code(&b.user_code);
    // One transaction from the check to the approval: the code cannot be decided by anyone
    // else in between, and a refused approval mints nothing.
    let (record, info, shown_code) = at_desk(&state, None, |c, desk, now| {
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
            return Err(decide_error(err));
        };
        let label = b
            .label
            .clone()
            .filter(|l| !l.trim().is_empty())
            .or_else(|| Some(pending.label.clone()).filter(|l| !l.trim().is_empty()))
            .unwrap_or_else(|| "connected device".to_owned());
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
        let grant = Grant {
            token,
            token_id: info.id.clone(),
        };
        desk.store
            .approve(&code, caller.permissions, &record.name, grant, now)
            .map_err(decide_error)?;
        desk.user_agents.remove(&code);
        Ok((record, info, pending.user_code))
    })?;
    state.forget_auth();
    if create.is_some() {
        state
            .hub
            .register_member(&record.name, record.role.clone(), now_ms);
    }
    tracing::info!(member = %record.name, by = %caller.name, user_code = %shown_code, "device enrollment approved");
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
    let reason = b
        .reason
        .clone()
        .unwrap_or_else(|| format!("rejected by {}", caller.name));
    at_desk(&state, None, |_, desk, now| {
        desk.store
            .deny(&b.user_code, caller.permissions, &reason, now)
            .map_err(decide_error)?;
        desk.user_agents.remove(&normalize_user_code(&b.user_code));
        Ok(())
    })?;
    tracing::info!(by = %caller.name, user_code = %b.user_code, "device enrollment rejected");
    Ok(StatusCode::NO_CONTENT.into_response())
}
