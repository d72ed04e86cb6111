//! Browser sign-in: TOTP login, the session cookie, `GET /session`, logout, TOTP enrollment and
//! the first-admin setup.
//!
//! * `POST /session/totp {code, member?}` → `200 {member, role, permissions, expiresAt}` and
//!   `Set-Cookie: ac7_session=<id>; HttpOnly; SameSite=Strict; Path=/; Max-Age=604800` (plus
//!   `Secure` when the broker serves HTTPS). A code that is not six digits is 400 `invalid login
//!   payload` (not counted); a wrong code 401 `invalid code`; a replayed one 401 `code already
//!   used; wait for the next code`. Without `member` the code is tried against every member with
//!   TOTP; when it matches more than one (a one-in-a-million collision) the answer is 401 asking
//!   for the name. Failures are counted by the sign-in guard
//!   (`ac7_protocol::signin::limiter::SignInGuard`): against the client address (an IPv6
//!   client's whole /64), and against the member when named — or, without a name (or with a
//!   name that is no member with TOTP), against one team-wide budget, so no number of source
//!   addresses buys more guesses. 5 failures in 15 minutes lock an address or a member, 10 the
//!   nameless budget; each further lock of the same key lasts twice the last, up to a day.
//!   A locked key gets 429 `too many attempts; try again later` (the nameless budget: `… sign in
//!   with your member name …`) with `retryAfter` and a `Retry-After` header; a success clears
//!   the address and the member (never the nameless budget). A member whose own key is locked
//!   is no candidate for a nameless code. Each lockout is one WARN line naming the key;
//!   `GET /metrics` counts failures, refusals and lockouts.
//! * The cookie authenticates every API route after a bearer token (a request with
//!   `Authorization` is never read as a cookie request). Its session slides: each use moves the
//!   server-side expiry to now + 7 days, and the response then carries a fresh `Set-Cookie` with
//!   the full `Max-Age`, so the browser's copy slides too (ac7 sets it once at login).
//! * `GET /session` → the login shape (bearer callers get `expiresAt = 9007199254740991`).
//! * `POST /session/logout` → 204, deletes the cookie's session server-side (ending its live
//!   streams) and clears the cookie — also when the session had already expired, and without
//!   needing valid credentials (ac7 answers 401 then and leaves the cookie).

use std::net::{IpAddr, SocketAddr};

use ac7_protocol::signin::limiter::{Refusal, SignInKey, address_key};
use ac7_protocol::signin::totp::{self, TotpError};
use axum::extract::{ConnectInfo, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, Body, Caller, Shared, obj, parse_json, reply};
use crate::broker::sessions::{self, SESSION_ID_PREFIX, SessionError, TotpRefusal};
use crate::broker::{attempts, now_ms, now_secs, team};

/// The session cookie's name.
pub(crate) const COOKIE: &str = "ac7_session";

/// `expiresAt` of a caller that did not sign in with a session (JavaScript's largest safe integer).
const NO_EXPIRY: i64 = 9_007_199_254_740_991;

/// The value of cookie `name` in the request's `Cookie` headers.
pub(crate) fn cookie_value<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (k, v) = pair.trim().split_once('=')?;
            (k.trim() == name).then(|| v.trim().trim_matches('"'))
        })
        .filter(|v| !v.is_empty())
}

/// Whether the broker serves HTTPS (cookies get `Secure`, responses HSTS).
pub(crate) fn https(state: &Shared) -> bool {
    state.config.tls.is_some()
}

/// The `Set-Cookie` value for session `id` (empty id and `max_age` 0: clears it).
pub(crate) fn set_cookie(state: &Shared, id: &str, max_age_secs: u64) -> HeaderValue {
    let secure = if https(state) { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age_secs}{secure}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("ac7_session=; Path=/; Max-Age=0"))
}

fn ttl_ms(state: &Shared) -> i64 {
    i64::try_from(state.config.session_ttl.as_millis()).unwrap_or(i64::MAX)
}

/// Set by the router's outer layer on a request that may sign in with the cookie; the cookie
/// resolver fills it when it slid the session, and the layer then refreshes the browser's
/// cookie on the response.
#[derive(Debug, Clone, Default)]
pub(crate) struct CookieRefresh(pub(crate) std::sync::Arc<std::sync::Mutex<Option<String>>>);

/// Resolves the `ac7_session` cookie of a request without `Authorization` (its
/// 401 texts are the TypeScript broker's).
pub(crate) fn cookie_caller(parts: &Parts, state: &Shared) -> Result<Caller, ApiError> {
    let Some(id) = cookie_value(&parts.headers, COOKIE) else {
        return Err(ApiError::unauthorized("missing credentials"));
    };
    let hash = sessions::session_hash(id);
    let (member, slid) = sessions::cookie_session(&state.store, &hash, now_ms(), ttl_ms(state))?;
    if slid && let Some(slot) = parts.extensions.get::<CookieRefresh>() {
        *slot
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(id.to_owned());
    }
    Ok(Caller {
        name: member.name,
        permissions: member.permissions,
        token_id: format!("{SESSION_ID_PREFIX}{hash}"),
    })
}

/// The client address a limit keys on: the socket peer, or with `--trust-proxy` the first
/// `X-Forwarded-For` entry (falling back to the peer when it is absent or not an address).
pub(crate) fn client_ip(parts: &Parts, state: &Shared) -> Option<IpAddr> {
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let forwarded = || {
        let v = parts.headers.get("x-forwarded-for")?.to_str().ok()?;
        v.split(',').next()?.trim().parse::<IpAddr>().ok()
    };
    if state.config.trust_proxy {
        forwarded().or(peer)
    } else {
        peer
    }
}

/// [`client_ip`] as text (`unknown` without one).
pub(crate) fn client_addr(parts: &Parts, state: &Shared) -> String {
    client_ip(parts, state).map_or_else(|| "unknown".to_owned(), |ip| ip.to_string())
}

/// 429 for a locked sign-in key. A locked nameless budget says how to get past it.
fn refused(r: Refusal) -> ApiError {
    let text = match r.key {
        SignInKey::Nameless => {
            "too many attempts without a member name; sign in with your member name, or try again later"
        }
        SignInKey::Address(_) | SignInKey::Member(_) => "too many attempts; try again later",
    };
    let mut e =
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, text).with("retryAfter", json!(r.retry_after));
    e.retry_after = Some(r.retry_after);
    e
}

/// The key the sign-in limiter counts this request's client address under.
pub(crate) fn limiter_address(parts: &Parts, state: &Shared) -> String {
    client_ip(parts, state).map_or_else(|| "unknown".to_owned(), address_key)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginBody {
    code: String,
    #[serde(default)]
    member: Option<String>,
}

/// The 6-digit shape check shared by login, setup and confirmation (400, never counted).
pub(crate) fn check_code(code: &str, thing: &str) -> Result<(), ApiError> {
    if code.len() == 6 && code.bytes().all(|b| b.is_ascii_digit()) {
        Ok(())
    } else {
        Err(ApiError::invalid(
            thing,
            vec![json!({
                "origin": "string", "code": "invalid_format", "format": "regex",
                "pattern": "/^\\d{6}$/", "path": ["code"],
                "message": "code must be 6 digits",
            })],
        ))
    }
}

/// The answer to a TOTP verification failure.
pub(crate) fn totp_refusal(e: TotpError) -> ApiError {
    match e {
        TotpError::Replayed => ApiError::unauthorized(e.to_string()),
        TotpError::Malformed | TotpError::Invalid => ApiError::unauthorized("invalid code"),
    }
}

/// The answer to a refused TOTP sign-in or confirmation.
fn login_refusal(r: TotpRefusal) -> ApiError {
    match r {
        TotpRefusal::Replayed => totp_refusal(TotpError::Replayed),
        TotpRefusal::Invalid => totp_refusal(TotpError::Invalid),
        TotpRefusal::Ambiguous => ApiError::unauthorized(
            "this code matches more than one member; sign in with your name (member)",
        ),
    }
}

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> Self {
        let msg = e.to_string();
        match e {
            SessionError::Locked(r) => refused(r),
            SessionError::Refused(r) => login_refusal(r),
            SessionError::Expired | SessionError::MemberGone | SessionError::InvalidSetupCode => {
                ApiError::unauthorized(msg)
            }
            SessionError::NoSuchMember(_) | SessionError::NoPending(_) => ApiError::not_found(msg),
            SessionError::BadSecret(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, msg),
            SessionError::NoAdmin | SessionError::SetupDone => ApiError::conflict(msg),
            SessionError::Store(e) => e.into(),
        }
    }
}

/// The login shape `{member, role, permissions, expiresAt}`.
fn session_shape(m: &team::MemberRecord, expires_at: i64) -> super::Obj {
    obj! {
        "member" => &m.name,
        "role" => &m.role,
        "permissions" => &m.permissions,
        "expiresAt" => &expires_at,
    }
}

/// `POST /session/totp`.
pub(super) async fn login(
    State(state): State<Shared>,
    parts: Parts,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let b: LoginBody = parse_json(&body, "login")?;
    check_code(&b.code, "login")?;
    let now = now_secs();
    let address = limiter_address(&parts, &state);
    let ua = parts
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok());
    let attempt = sessions::LoginAttempt {
        member: b.member.as_deref(),
        code: &b.code,
        now_secs: now,
        user_agent: ua,
        now_ms: now_ms(),
        ttl_ms: ttl_ms(&state),
    };
    let (m, id, row) = sessions::sign_in(&state, &address, &attempt)?;
    tracing::info!(member = %m.name, "signed in (TOTP)");
    let mut resp = reply(StatusCode::OK, &session_shape(&m, row.expires_at));
    resp.headers_mut().insert(
        header::SET_COOKIE,
        set_cookie(&state, &id, state.config.session_ttl.as_secs()),
    );
    Ok(resp)
}

/// `GET /metrics` (`members.manage`): the sign-in guard's counters in the Prometheus text
/// format.
pub(super) async fn metrics(
    State(state): State<Shared>,
    caller: Caller,
) -> Result<Response, ApiError> {
    ApiError::require(
        caller.permissions,
        ac7_protocol::domain::permission::Permission::MembersManage,
        "reading the broker's metrics",
    )?;
    let now = now_secs();
    let locked = attempts::locked_now(&state.store, now)?;
    let stats = *state
        .signin_stats
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let body = format!(
        "# HELP ac7_signin_failures_total Failed sign-in attempts, by whether they named a member.\n\
         # TYPE ac7_signin_failures_total counter\n\
         ac7_signin_failures_total{{kind=\"named\"}} {}\n\
         ac7_signin_failures_total{{kind=\"nameless\"}} {}\n\
         # HELP ac7_signin_refused_total Sign-in attempts refused because a key was locked.\n\
         # TYPE ac7_signin_refused_total counter\n\
         ac7_signin_refused_total {}\n\
         # HELP ac7_signin_lockouts_total Sign-in lockouts started.\n\
         # TYPE ac7_signin_lockouts_total counter\n\
         ac7_signin_lockouts_total {}\n\
         # HELP ac7_signin_locked Sign-in keys (addresses, members, the nameless budget) locked now.\n\
         # TYPE ac7_signin_locked gauge\n\
         ac7_signin_locked {}\n",
        stats.named_failures, stats.nameless_failures, stats.refused, stats.lockouts, locked
    );
    Ok((
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response())
}

/// `GET /session`.
pub(super) async fn get(State(state): State<Shared>, caller: Caller) -> Result<Response, ApiError> {
    let session = caller.token_id.strip_prefix(SESSION_ID_PREFIX);
    let (member, expires) = sessions::current(&state.store, &caller.name, session, now_ms())?;
    let expires = expires.unwrap_or(NO_EXPIRY);
    Ok(reply(StatusCode::OK, &session_shape(&member, expires)))
}

/// `POST /session/logout`: ends the cookie's session (if any) and clears the cookie.
pub(super) async fn logout(
    State(state): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if let Some(id) = cookie_value(&headers, COOKIE) {
        sessions::sign_out(&state, &sessions::session_hash(id))?;
    }
    let mut resp = StatusCode::NO_CONTENT.into_response();
    resp.headers_mut()
        .insert(header::SET_COOKIE, set_cookie(&state, "", 0));
    Ok(resp)
}

/// A fresh TOTP secret (base32 of 20 random bytes).
fn new_totp_secret() -> Result<String, ApiError> {
    let mut bytes = [0u8; totp::SECRET_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("no entropy for a secret: {e}"),
        )
    })?;
    Ok(totp::new_secret(&bytes))
}

/// The `otpauth://` URI of `member`'s secret: issuer `ac7`, account `<member> (<team>)`, so an
/// authenticator app lists which team the code is for.
fn totp_uri(team_name: &str, member: &str, secret: &str) -> String {
    totp::otpauth_uri("ac7", &format!("{member} ({team_name})"), secret)
}

/// The QR code of `uri` as a standalone SVG document (dark modules on white, with the quiet
/// zone). The web app shows it as an image (`data:image/svg+xml,…`, allowed by the CSP).
pub(crate) fn qr_svg(uri: &str) -> Result<String, ApiError> {
    let code = qrcode::QrCode::with_error_correction_level(uri.as_bytes(), qrcode::EcLevel::M)
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot encode the QR code: {e}"),
            )
        })?;
    Ok(code
        .render::<qrcode::render::svg::Color<'_>>()
        .min_dimensions(200, 200)
        .dark_color(qrcode::render::svg::Color("#000000"))
        .light_color(qrcode::render::svg::Color("#ffffff"))
        .build())
}

/// `(totpUri, qrSvg)` for `member`'s new secret in team `team_name`.
fn enrollment_shape(
    team_name: &str,
    member: &str,
    secret: &str,
) -> Result<(String, String), ApiError> {
    let uri = totp_uri(team_name, member, secret);
    let svg = qr_svg(&uri)?;
    Ok((uri, svg))
}

fn self_or_manager(caller: &Caller, name: &str, doing: &str) -> Result<(), ApiError> {
    if caller.name == name {
        return Ok(());
    }
    ApiError::require(
        caller.permissions,
        ac7_protocol::domain::permission::Permission::MembersManage,
        doing,
    )
}

/// `POST /members/:name/enroll-totp` (`members.manage` or self): draws a new secret and keeps
/// it *pending* — the member's current secret (if any) keeps working — until
/// `POST /members/:name/enroll-totp/confirm {code}` proves an authenticator holds it. Answers
/// `{member, totpSecret, totpUri, qrSvg}`; the secret is shown this once (a new call replaces
/// the pending secret).
pub(super) async fn enroll_totp(
    State(state): State<Shared>,
    caller: Caller,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    self_or_manager(&caller, &name, "enrolling another member's authenticator")?;
    let secret = new_totp_secret()?;
    let team_name = sessions::start_enrollment(&state.store, &name, &secret)?;
    let (uri, svg) = enrollment_shape(&team_name, &name, &secret)?;
    tracing::info!(member = %name, by = %caller.name, "TOTP enrollment started (pending confirmation)");
    Ok(reply(
        StatusCode::OK,
        &obj! {"member" => &name, "totpSecret" => &secret, "totpUri" => &uri, "qrSvg" => &svg},
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CodeBody {
    code: String,
}

/// `POST /members/:name/enroll-totp/confirm {code}`: a code of the pending secret makes it the
/// member's secret (the code is then used up: it cannot also sign in). 404 `no pending
/// enrollment` without one; 401 `invalid code`; counted by the sign-in limiter. On success
/// every other session of the member ends (the confirming browser keeps its own).
pub(super) async fn enroll_totp_confirm(
    State(state): State<Shared>,
    caller: Caller,
    axum::extract::Path(name): axum::extract::Path<String>,
    parts: Parts,
    Body(body): Body,
) -> Result<Response, ApiError> {
    self_or_manager(&caller, &name, "enrolling another member's authenticator")?;
    let b: CodeBody = parse_json(&body, "confirmation")?;
    check_code(&b.code, "confirmation")?;
    let now = now_secs();
    let address = limiter_address(&parts, &state);
    // The old secret no longer signs anyone in: neither do the sessions it opened. The
    // confirming browser (when it is the member's own session) stays signed in.
    let keep = caller
        .token_id
        .strip_prefix(SESSION_ID_PREFIX)
        .filter(|_| caller.name == name);
    let ended = sessions::confirm_enrollment(&state, &address, &name, &b.code, now, keep)?;
    tracing::info!(member = %name, ended_sessions = ended, "TOTP enrollment confirmed");
    Ok(reply(
        StatusCode::OK,
        &obj! {"member" => &name, "enrolled" => &true},
    ))
}

/// `GET /setup/status` (no auth) → `{needed}`.
pub(super) async fn setup_status(State(state): State<Shared>) -> Result<Response, ApiError> {
    let needed = sessions::setup_needed(&state.store)?;
    Ok(reply(StatusCode::OK, &obj! {"needed" => &needed}))
}

/// `POST /setup {code}` (no auth; `code` is the one-time setup code `ac7 serve` printed):
/// issues the first admin (the first member holding `members.manage`) a TOTP secret and
/// answers `{member, totpSecret, totpUri, qrSvg}`. The secret stays *pending* and the code
/// valid until the first sign-in with that secret (`POST /session/totp`) confirms it: asking
/// again with the code answers the same secret, so a reload before scanning locks nobody out.
/// Wrong codes count against the client address like failed sign-ins. 409 `setup already
/// done` once any member has a confirmed secret.
pub(super) async fn setup(
    State(state): State<Shared>,
    parts: Parts,
    Body(body): Body,
) -> Result<Response, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SetupBody {
        code: String,
    }
    let b: SetupBody = parse_json(&body, "setup")?;
    let now = now_secs();
    let address = limiter_address(&parts, &state);
    sessions::setup_open(&state.store)?;
    let fresh = new_totp_secret()?;
    let (admin, secret, team_name) =
        sessions::first_admin_setup(&state, &address, b.code.trim(), &fresh, now)?;
    let (uri, svg) = enrollment_shape(&team_name, &admin, &secret)?;
    tracing::info!(member = %admin, "first-admin setup: secret issued, pending its first sign-in");
    Ok(reply(
        StatusCode::OK,
        &obj! {"member" => &admin, "totpSecret" => &secret, "totpUri" => &uri, "qrSvg" => &svg},
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; ac7_session=xyz; b=2"),
        );
        assert_eq!(cookie_value(&h, COOKIE), Some("xyz"));
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("x_ac7_session=no"));
        h.append(header::COOKIE, HeaderValue::from_static("ac7_session="));
        assert_eq!(cookie_value(&h, COOKIE), None);
    }
}
