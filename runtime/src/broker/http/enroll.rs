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

use ac7_protocol::domain::permission::Permission;
use ac7_protocol::signin::enroll::{DecideError, PollOutcome};
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::session::client_addr;
use super::{ApiError, Body, Caller, Issues, Shared, obj, parse_json, reply};
use crate::broker::bootstrap::validate_member;
use crate::broker::enrollments::{self, Approval, Collected, EnrollError};
use crate::broker::now_ms;
use crate::broker::team::Role;

fn too_many(retry_after: u64, why: &str) -> ApiError {
    let mut e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, why)
        .with("code", json!("rate_limited"))
        .with("retryAfter", json!(retry_after));
    e.retry_after = Some(retry_after);
    e
}

impl From<EnrollError> for ApiError {
    fn from(e: EnrollError) -> Self {
        let msg = e.to_string();
        match e {
            EnrollError::TooManyMints { retry_after, .. }
            | EnrollError::TooManyPending { retry_after } => too_many(retry_after, &msg),
            EnrollError::CodeTaken(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, msg),
            EnrollError::NoEntropy(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, msg),
            EnrollError::Decide(e) => decide_error(e),
            EnrollError::NoSuchMember(_) => ApiError::not_found(msg),
            EnrollError::Admin(e) => e.into(),
            EnrollError::Store(e) => e.into(),
        }
    }
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
    let (created, now) = enrollments::start(&state, &address, &label, ua)?;
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
    let outcome = enrollments::poll(&state, &key)?;
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

fn require_manager(caller: &Caller, doing: &str) -> Result<(), ApiError> {
    ApiError::require(caller.permissions, Permission::MembersManage, doing)
}

/// `GET /enroll/pending`.
pub(super) async fn pending(
    State(state): State<Shared>,
    caller: Caller,
) -> Result<Response, ApiError> {
    require_manager(&caller, "listing enrollments")?;
    let list = enrollments::pending(&state)?
        .into_iter()
        .map(|(p, ua)| {
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
        .collect::<Vec<super::Obj>>();
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
    let (record, info, shown_code) = enrollments::approve(
        &state,
        &caller.name,
        caller.permissions,
        &Approval {
            user_code: b.user_code,
            member_name: b.member_name,
            create,
            label: b.label,
        },
        now_ms(),
    )?;
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
    enrollments::reject(&state, caller.permissions, &b.user_code, &reason)?;
    tracing::info!(by = %caller.name, user_code = %b.user_code, "device enrollment rejected");
    Ok(StatusCode::NO_CONTENT.into_response())
}
