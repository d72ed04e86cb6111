//! The HTTP face of the broker: the router, errors, authentication, body parsing.

mod activity;
mod admin;
mod channels;
mod chat;
pub(crate) mod enroll;
mod fs;
mod objectives;
mod push;
pub(crate) mod security;
mod session;
mod subscribe;

use std::sync::Arc;

use ac7_protocol::domain::permission::{Permission, PermissionSet};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::AppState;
use super::db::StoreError;
use super::{team, tokens};

/// Shared state handed to every handler.
pub(crate) type Shared = Arc<AppState>;

/// Builds the router.
pub(crate) fn router(state: Shared) -> Router {
    let json_limit = state.config.max_json_bytes;
    let file_limit = usize::try_from(state.config.max_file_bytes).unwrap_or(usize::MAX);
    Router::new()
        .route("/healthz", get(chat::healthz))
        .route("/metrics", get(session::metrics))
        .route("/briefing", get(chat::briefing))
        .route("/roster", get(chat::roster))
        .route("/push", post(chat::push))
        .route("/push/vapid-public-key", get(push::vapid_public_key))
        .route("/push/subscriptions", post(push::subscribe))
        .route("/push/subscriptions/{id}", delete(push::unsubscribe))
        .route("/history", get(chat::history))
        .route("/subscribe", get(subscribe::subscribe))
        .route("/presence/busy", post(chat::busy))
        .route("/channels", get(channels::list).post(channels::create))
        .route(
            "/channels/{slug}",
            get(channels::view)
                .patch(channels::rename)
                .delete(channels::archive),
        )
        .route("/channels/{slug}/members", post(channels::add_member))
        .route(
            "/channels/{slug}/members/{name}",
            delete(channels::remove_member),
        )
        .route(
            "/objectives",
            get(objectives::list).post(objectives::create),
        )
        .route(
            "/objectives/{id}",
            get(objectives::view).patch(objectives::update),
        )
        .route("/objectives/{id}/complete", post(objectives::complete))
        .route("/objectives/{id}/cancel", post(objectives::cancel))
        .route("/objectives/{id}/reassign", post(objectives::reassign))
        .route(
            "/objectives/{id}/watchers",
            post(objectives::watchers).patch(objectives::watchers),
        )
        .route("/objectives/{id}/discuss", post(objectives::discuss))
        .route("/objectives/{id}/activity", get(activity::objective))
        .route("/fs/ls", get(fs::ls))
        .route("/fs/stat", get(fs::stat))
        .route("/fs/read/{*path}", get(fs::read))
        .route(
            "/fs/write",
            post(fs::write).layer(DefaultBodyLimit::max(file_limit)),
        )
        .route("/fs/mkdir", post(fs::mkdir))
        .route("/fs/rm", delete(fs::rm))
        .route("/fs/mv", post(fs::mv))
        .route("/fs/shared", get(fs::shared))
        .route("/fs/all", get(fs::all))
        .route("/team", get(admin::team_get).patch(admin::team_patch))
        .route("/backup", get(admin::backup))
        .route("/team/presets", get(admin::presets_list))
        .route(
            "/team/presets/{name}",
            axum::routing::put(admin::preset_put).delete(admin::preset_delete),
        )
        .route(
            "/members",
            get(admin::members_list).post(admin::members_create),
        )
        .route(
            "/members/{name}",
            axum::routing::patch(admin::member_update).delete(admin::member_delete),
        )
        .route("/members/{name}/rotate-token", post(admin::rotate_token))
        .route("/members/{name}/tokens", get(admin::tokens_list))
        .route("/members/{name}/tokens/{id}", delete(admin::token_delete))
        .route(
            "/members/{name}/activity",
            get(activity::list).post(activity::upload),
        )
        .route("/members/{name}/activity/stream", get(activity::stream))
        .route("/session", get(session::get))
        .route("/session/totp", post(session::login))
        .route("/session/logout", post(session::logout))
        .route("/members/{name}/enroll-totp", post(session::enroll_totp))
        .route(
            "/members/{name}/enroll-totp/confirm",
            post(session::enroll_totp_confirm),
        )
        .route("/setup/status", get(session::setup_status))
        .route("/setup", post(session::setup))
        .route("/enroll", post(enroll::create))
        .route("/enroll/poll", post(enroll::poll))
        .route("/enroll/pending", get(enroll::pending))
        .route("/enroll/approve", post(enroll::approve))
        .route("/enroll/reject", post(enroll::reject))
        // The web app: its assets, and the shell for browser navigations (broker/web.rs).
        .route("/_app/{*path}", get(super::web::asset))
        .route("/sw.js", get(super::web::service_worker))
        .route("/manifest.webmanifest", get(super::web::manifest))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(json_limit))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), outer))
        .with_state(state)
}

async fn not_found(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no such route: {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method {method} is not allowed on {}", uri.path()),
    )
}

/// The one layer around every route, outermost first: the CSRF check (`security`), the
/// shell for browser navigations (`web`), the `X-AC7-Protocol` check, then the route; on the
/// way out a JSON body for every error, `Vary` where the shell rule could have answered, the
/// sliding cookie and the security headers. One layer rather than four: each layer boxes
/// the request's future and clones the service below it, on every request.
async fn outer(State(state): State<Shared>, mut req: Request, next: Next) -> Response {
    if let Err(refused) = security::csrf_check(req.method(), req.headers(), &state) {
        return security::finish(&state, refused.into_response(), None);
    }
    let varies = match super::web::shell_rule(req.method(), req.uri().path(), req.headers()) {
        super::web::ShellRule::Shell(shell) => return security::finish(&state, shell, None),
        super::web::ShellRule::Varies => true,
        super::web::ShellRule::Exempt => false,
    };
    let refresh = security::refresh_slot(&mut req);
    let mut resp = match protocol_refusal(req.headers()) {
        Some(refused) => refused.into_response(),
        None => json_errors(next.run(req).await).await,
    };
    if varies {
        super::web::add_vary(&mut resp);
    }
    security::finish(&state, resp, refresh)
}

/// Refuses an `X-AC7-Protocol` header other than `1`.
fn protocol_refusal(headers: &axum::http::HeaderMap) -> Option<ApiError> {
    let v = headers.get("x-ac7-protocol")?;
    let got = String::from_utf8_lossy(v.as_bytes()).into_owned();
    if got.trim().parse::<f64>().ok() == Some(1.0) {
        return None;
    }
    Some(
        ApiError::new(StatusCode::BAD_REQUEST, "unsupported protocol version")
            .with("got", json!(got))
            .with("expected", json!(1)),
    )
}

/// Gives every error answer a JSON body: the rejections of axum's own extractors
/// (a bad query string, a bad path segment…) are plain text; they become
/// `{"error": "<that text>"}` with the same status.
async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let text = match axum::body::to_bytes(resp.into_body(), 64 * 1024).await {
        Ok(b) if !b.is_empty() => String::from_utf8_lossy(&b).trim().to_owned(),
        _ => status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_owned(),
    };
    ApiError::new(status, text).into_response()
}

/// An error response: `{"error": "...", …extras}` (keys in that order, as ac7 sends them).
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    error: String,
    extras: Vec<(String, Value)>,
    /// Seconds for a `Retry-After` header.
    retry_after: Option<u64>,
}

impl serde::Serialize for ApiError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(1 + self.extras.len()))?;
        map.serialize_entry("error", &self.error)?;
        for (k, v) in &self.extras {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, msg: impl Into<String>) -> ApiError {
        ApiError {
            status,
            error: msg.into(),
            extras: Vec::new(),
            retry_after: None,
        }
    }

    pub(crate) fn with(mut self, key: &str, value: Value) -> ApiError {
        self.extras.push((key.into(), value));
        self
    }

    pub(crate) fn bad_request(msg: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, msg)
    }

    pub(crate) fn forbidden(msg: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, msg)
    }

    pub(crate) fn not_found(msg: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, msg)
    }

    pub(crate) fn conflict(msg: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, msg)
    }

    pub(crate) fn unauthorized(msg: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, msg)
    }

    /// The same error with another text (same status and extras).
    pub(crate) fn saying(mut self, msg: impl Into<String>) -> ApiError {
        self.error = msg.into();
        self
    }

    /// `{"error": "invalid <thing> payload", "details": [...]}`.
    pub(crate) fn invalid(thing: &str, details: Vec<Value>) -> ApiError {
        ApiError::bad_request(format!("invalid {thing} payload"))
            .with("details", Value::Array(details))
    }

    /// Requires `perm`, naming it in the 403.
    pub(crate) fn require(
        perms: PermissionSet,
        perm: Permission,
        doing: &str,
    ) -> Result<(), ApiError> {
        if perms.contains(perm) {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "{doing} requires the {perm} permission"
            )))
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(&self)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if e.is_disk_full() {
            tracing::error!(error = %e, "disk full");
            return ApiError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "the broker's disk is full: nothing was stored; ask the operator to free space, then retry",
            )
            .with("code", json!("disk_full"));
        }
        if e.is_unavailable() {
            tracing::warn!(error = %e, "database unavailable");
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unavailable: nothing was done; retry shortly",
            )
            .with("code", json!("database_unavailable"));
        }
        tracing::error!(error = %e, "store failure");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal error: {e}"),
        )
    }
}

/// The authenticated member.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) name: String,
    pub(crate) permissions: PermissionSet,
    /// Id of the token the request authenticated with (live streams remember it, so
    /// revoking the token ends them); `session:<hash>` for a browser session.
    pub(crate) token_id: String,
}

impl Caller {
    pub(crate) fn has(&self, p: Permission) -> bool {
        self.permissions.contains(p)
    }
}

impl FromRequestParts<Shared> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Shared,
    ) -> Result<Self, Self::Rejection> {
        // Bearer first; a request without `Authorization` may sign in with the session cookie.
        let Some(value) = parts.headers.get(header::AUTHORIZATION) else {
            return session::cookie_caller(parts, state);
        };
        let value = value.to_str().unwrap_or("");
        // "Bearer" with nothing after it (proxies trim the trailing space) is an empty token.
        let Some(token) = value
            .strip_prefix("Bearer")
            .filter(|rest| rest.is_empty() || rest.starts_with(' '))
        else {
            return Err(ApiError::unauthorized("missing credentials"));
        };
        let token = token.trim();
        if token.is_empty() {
            return Err(ApiError::unauthorized("missing bearer token"));
        }
        let hash = tokens::sha256_hex(token.as_bytes());
        if let Some(c) = state.cached_auth(&hash) {
            return Ok(Caller {
                name: c.name,
                permissions: c.permissions,
                token_id: c.token_id,
            });
        }
        let now = super::now_ms();
        let caller = match team::authenticate(&state.store, &hash, now)? {
            team::TokenAuth::Member(token_id, m) => Caller {
                name: m.name,
                permissions: m.permissions,
                token_id,
            },
            team::TokenAuth::Unknown => return Err(ApiError::unauthorized("unknown token")),
            team::TokenAuth::Orphan => {
                return Err(ApiError::unauthorized("token references unknown member"));
            }
        };
        state.remember_auth(
            hash,
            caller.token_id.clone(),
            caller.name.clone(),
            caller.permissions,
        );
        Ok(caller)
    }
}

/// The authenticated member, on a request that creates messages (`/push`, objective
/// changes and discussion): takes a token from the member's bucket, or answers
/// 429 with `Retry-After` (see [`crate::broker::ratelimit`]).
#[derive(Debug, Clone)]
pub(crate) struct Sender(pub(crate) Caller);

impl FromRequestParts<Shared> for Sender {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Shared,
    ) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, state).await?;
        let limiter = &state.push_limiter;
        // With replicas the bucket is the member's one in the database, shared by all.
        let taken = match (limiter.rate(), &state.replica) {
            (Some(rate), Some(_)) => {
                crate::broker::replica::take_shared_token(&state.store, &caller.name, rate)?
            }
            _ => limiter.take(&caller.name, std::time::Instant::now()),
        };
        match taken {
            Ok(()) => Ok(Sender(caller)),
            Err(wait) => {
                let secs = super::ratelimit::retry_after_secs(wait);
                let rate = limiter.rate().map_or(0, |r| r.per_second);
                let burst = limiter.rate().map_or(0, |r| r.burst);
                let mut err = ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "rate limit: at most {rate} messages per second per member (bursts of {burst}); retry in {secs} s"
                    ),
                )
                .with("code", json!("rate_limited"))
                .with("retryAfter", json!(secs));
                err.retry_after = Some(secs);
                Err(err)
            }
        }
    }
}

/// How long a client may take to send its request body.
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A request body read to the end, with the size cap turned into a JSON 413 and a
/// body that does not arrive within [`BODY_TIMEOUT`] turned into a JSON 408.
pub(crate) struct Body(pub(crate) Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let Ok(read) = tokio::time::timeout(BODY_TIMEOUT, Bytes::from_request(req, state)).await
        else {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "request body not received within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            ));
        };
        match read {
            Ok(b) => Ok(Body(b)),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body is larger than this server accepts",
            )
            .with("code", json!("too_large"))),
            Err(e) => Err(ApiError::bad_request(format!(
                "could not read request body: {e}"
            ))),
        }
    }
}

/// Parses a JSON object body into `T`; a body that is not JSON counts as `null`.
/// Failures are 400 `invalid <thing> payload` with validator-style `details`.
pub(crate) fn parse_json<T: DeserializeOwned>(body: &[u8], thing: &str) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if !value.is_object() {
        return Err(ApiError::invalid(
            thing,
            vec![json!({
                "expected": "object",
                "code": "invalid_type",
                "path": [],
                "message": format!("Invalid input: expected object, received {}", ac7_protocol::codec::json::kind_name(&value)),
            })],
        ));
    }
    serde_json::from_value(value).map_err(|e| {
        ApiError::invalid(
            thing,
            vec![json!({"code": "invalid_type", "path": [], "message": e.to_string()})],
        )
    })
}

/// Collects validator-style issues.
#[derive(Debug, Default)]
pub(crate) struct Issues(Vec<Value>);

impl Issues {
    /// Checks `min <= chars(s) <= max`.
    pub(crate) fn len(&mut self, path: &str, s: &str, min: usize, max: usize) -> &mut Self {
        let n = s.chars().count();
        if n < min {
            self.0.push(json!({
                "origin": "string", "code": "too_small", "minimum": min, "inclusive": true, "path": [path],
                "message": format!("Too small: expected string to have >={min} characters"),
            }));
        } else if n > max {
            self.0.push(json!({
                "origin": "string", "code": "too_big", "maximum": max, "inclusive": true, "path": [path],
                "message": format!("Too big: expected string to have <={max} characters"),
            }));
        }
        self
    }

    /// Checks an optional string.
    pub(crate) fn opt_len(
        &mut self,
        path: &str,
        s: Option<&str>,
        min: usize,
        max: usize,
    ) -> &mut Self {
        if let Some(s) = s {
            self.len(path, s, min, max);
        }
        self
    }

    /// Checks `len <= max` for a list.
    pub(crate) fn count(&mut self, path: &str, n: usize, max: usize) -> &mut Self {
        if n > max {
            self.0.push(json!({
                "origin": "array", "code": "too_big", "maximum": max, "inclusive": true, "path": [path],
                "message": format!("Too big: expected array to have <={max} items"),
            }));
        }
        self
    }

    /// Checks a member name.
    pub(crate) fn name(&mut self, path: &str, s: &str) -> &mut Self {
        if !ac7_protocol::domain::message::is_valid_name(s) {
            self.0.push(name_issue(path));
        }
        self
    }

    /// Adds a custom issue.
    pub(crate) fn custom(&mut self, msg: &str) -> &mut Self {
        self.0
            .push(json!({"code": "custom", "path": [], "message": msg}));
        self
    }

    /// `Err(invalid <thing> payload)` if any issue was found.
    pub(crate) fn finish(&mut self, thing: &str) -> Result<(), ApiError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(thing, std::mem::take(&mut self.0)))
        }
    }
}

pub(crate) fn name_issue(path: &str) -> Value {
    let path: Vec<&str> = if path.is_empty() { vec![] } else { vec![path] };
    json!({
        "origin": "string", "code": "invalid_format", "format": "regex",
        "pattern": "/^[a-zA-Z0-9._-]+$/", "path": path,
        "message": "name must be alphanumeric with . _ - allowed",
    })
}

/// A JSON object whose keys keep the order they were added in (ac7's order),
/// with each value serialised straight from its Rust type (so nested structs keep
/// their field order too).
#[derive(Debug, Default)]
pub(crate) struct Obj(Vec<(&'static str, Box<serde_json::value::RawValue>)>);

impl Obj {
    pub(crate) fn new() -> Obj {
        Obj::default()
    }

    /// Appends `key: value`.
    pub(crate) fn field<T: serde::Serialize + ?Sized>(
        mut self,
        key: &'static str,
        value: &T,
    ) -> Obj {
        match serde_json::value::to_raw_value(value) {
            Ok(raw) => self.0.push((key, raw)),
            Err(e) => tracing::error!(key, error = %e, "cannot serialise a response field"),
        }
        self
    }
}

impl serde::Serialize for Obj {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// `obj!{"a" => &x, "b" => &y}`: an [`Obj`] with those fields in that order.
macro_rules! obj {
    ($($k:literal => $v:expr),* $(,)?) => {
        $crate::broker::http::Obj::new()$(.field($k, $v))*
    };
}
pub(crate) use obj;

/// A JSON response with a status.
pub(crate) fn reply<T: serde::Serialize>(status: StatusCode, body: &T) -> Response {
    (status, axum::Json(body)).into_response()
}

/// A JSON response whose body is written already (around JSON stored or rendered before).
pub(crate) fn reply_raw(status: StatusCode, body: String) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// `Content-Disposition: inline; filename="…"` (or `attachment; …` when not
/// `inline`) with control characters, `"` and `\` replaced by `_`.
pub(crate) fn disposition(inline: bool, name: &str) -> HeaderValue {
    let kind = if inline { "inline" } else { "attachment" };
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_control() || c == '"' || c == '\\' {
                '_'
            } else {
                c
            }
        })
        .collect();
    HeaderValue::from_str(&format!("{kind}; filename=\"{clean}\""))
        .unwrap_or(HeaderValue::from_static(kind))
}

/// The percent-decoded bytes of query parameter `key` (first occurrence).
pub(crate) fn query_bytes(query: Option<&str>, key: &str) -> Option<Vec<u8>> {
    query?
        .split('&')
        .filter(|p| !p.is_empty())
        .find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k) == key.as_bytes()).then(|| percent_decode(v))
        })
}

/// Decodes `%XX` escapes and `+` (as a space); malformed escapes are kept literally.
pub(crate) fn percent_decode(s: &str) -> Vec<u8> {
    percent_decode_with(s, true)
}

/// Decodes `%XX` escapes; `+` is kept when `plus_is_space` is false (URL paths).
pub(crate) fn percent_decode_with(s: &str, plus_is_space: bool) -> Vec<u8> {
    if plus_is_space && s.contains('+') {
        percent_encoding::percent_decode(s.replace('+', " ").as_bytes()).collect()
    } else {
        percent_encoding::percent_decode_str(s).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b+c"), b"a b c");
        assert_eq!(percent_decode_with("a+b%2Fc", false), b"a+b/c");
        assert_eq!(percent_decode("%FF%00"), vec![0xff, 0]);
        assert_eq!(percent_decode("%+1%zz%4"), b"% 1%zz%4");
        assert_eq!(
            query_bytes(Some("x=1&path=%2Fa%2Fb&path=2"), "path"),
            Some(b"/a/b".to_vec())
        );
        assert_eq!(query_bytes(Some("flag&y="), "flag"), Some(Vec::new()));
        assert_eq!(query_bytes(None, "x"), None);
    }

    #[test]
    fn a_full_disk_is_507() {
        use crate::broker::db::Store;
        // A real SQLITE_FULL: the database may not grow past its page limit.
        let store = Store::open_in_memory().unwrap();
        let err = store.with(|conn| {
            conn.execute_batch("CREATE TABLE big (b BLOB); PRAGMA max_page_count = 20;")
                .unwrap();
            conn.execute("INSERT INTO big VALUES (zeroblob(1000000))", [])
                .map_err(StoreError::from)
                .unwrap_err()
        });
        let api = ApiError::from(err);
        assert_eq!(api.status, StatusCode::INSUFFICIENT_STORAGE);
        assert!(api.error.contains("disk is full"), "{}", api.error);
        // A real ENOSPC: /dev/full refuses every write.
        let source = std::io::Write::write_all(
            &mut std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
            b"x",
        )
        .unwrap_err();
        let api = ApiError::from(StoreError::File {
            what: "writing a blob".into(),
            source,
        });
        assert_eq!(api.status, StatusCode::INSUFFICIENT_STORAGE);
        // anything else stays a 500
        let api = ApiError::from(StoreError::Corrupt("x".into()));
        assert_eq!(api.status, StatusCode::INTERNAL_SERVER_ERROR);
    }

    /// The HTTP layer parses, calls a use case and maps its error: no handler opens a
    /// transaction, holds a connection or writes SQL. Test modules are not scanned (a test may
    /// build a store to provoke an error).
    #[test]
    fn handlers_hold_no_transactions() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/broker/http");
        let needles = [
            concat!(".", "tx("),
            concat!(".", "tx_then("),
            concat!(".", "view("),
            concat!(".", "view_small("),
            concat!("Conn", "<"),
            concat!("store::", "Conn"),
            concat!("SELECT", " "),
            concat!("INSERT", " "),
            concat!("UPDATE", " "),
            concat!("DELETE", " FROM"),
        ];
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .collect();
        files.sort();
        assert!(files.len() > 5, "no handler files under {}", dir.display());
        let mut found = Vec::new();
        for path in &files {
            let text = std::fs::read_to_string(path).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                if line.trim() == "#[cfg(test)]"
                    && lines
                        .get(i + 1)
                        .is_some_and(|next| next.trim_start().starts_with("mod "))
                {
                    break;
                }
                for needle in needles {
                    if line.contains(needle) {
                        found.push(format!(
                            "{}:{}: `{needle}`: {}",
                            path.display(),
                            i + 1,
                            line.trim()
                        ));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "store access in the HTTP layer (move it into a use case):\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn disposition_is_sanitised() {
        assert_eq!(
            disposition(true, "a\"b\\c\n.txt"),
            "inline; filename=\"a_b_c_.txt\""
        );
        assert_eq!(
            disposition(false, "x.svg"),
            "attachment; filename=\"x.svg\""
        );
    }
}
