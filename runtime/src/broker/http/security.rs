//! What the router's outer layer does first and last: CSRF defence and security headers.
//!
//! * **CSRF.** A state-changing request (any method but GET, HEAD, OPTIONS) that carries no
//!   `Authorization` header but the `ac7_session` cookie must carry an `Origin` (or, without
//!   one, a `Referer`) naming the broker's own origin — the scheme it serves (`https` with TLS;
//!   with `--trust-proxy`, `X-Forwarded-Proto`) and the request's `Host` — else 403
//!   `{"error":"cross-origin request refused"}`. A WebSocket upgrade with the cookie gets the
//!   same check. A cookie read (GET, HEAD, OPTIONS) that names a foreign `Origin` (`null`
//!   included) is refused the same way; one without `Origin` is served (browsers send none on
//!   a same-origin GET, and a navigation from another site's link carries only a `Referer`).
//!   Any cookie-less, bearer-less state-changing request that names a *foreign* `Origin` is
//!   refused too (a foreign page cannot drive login, setup or enrollment from a visitor's
//!   browser). Bearer requests are exempt: a browser never attaches one by itself.
//! * **Headers** on every response, errors included: a strict `Content-Security-Policy` (no
//!   inline script or style: the web app ships its JS and CSS as files), `nosniff`,
//!   `Referrer-Policy: no-referrer`, `X-Frame-Options: DENY`, `Cross-Origin-Opener-Policy` and
//!   `Cross-Origin-Resource-Policy: same-origin`, and HSTS when the broker serves HTTPS. A
//!   handler that sets its own CSP (file bodies: `sandbox`) keeps it.
//! * **Sliding cookie.** When the request's session slid, the response carries a fresh
//!   `Set-Cookie` with the full `Max-Age` (see [`super::session`]).

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::Response;

use super::session::{COOKIE, CookieRefresh, cookie_value, https, set_cookie};
use super::{ApiError, Shared};

/// The policy of every response that does not set its own.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; media-src 'self'; connect-src 'self'; font-src 'self'; manifest-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// The origin this request was addressed to (`scheme://host[:port]`, lower case).
fn own_origin(headers: &HeaderMap, state: &Shared) -> Option<String> {
    let host = headers.get(header::HOST)?.to_str().ok()?.trim();
    let forwarded_proto = || {
        let v = headers.get("x-forwarded-proto")?.to_str().ok()?;
        Some(v.split(',').next()?.trim().to_ascii_lowercase())
    };
    let scheme = match (state.config.trust_proxy, https(state)) {
        (true, tls) => forwarded_proto().unwrap_or_else(|| scheme_of(tls).to_owned()),
        (false, tls) => scheme_of(tls).to_owned(),
    };
    Some(format!("{scheme}://{}", host.to_ascii_lowercase()))
}

fn scheme_of(tls: bool) -> &'static str {
    if tls { "https" } else { "http" }
}

/// The origin part (`scheme://authority`) of a URL, lower case.
fn origin_of(url: &str) -> String {
    let url = url.trim();
    let rest_at = url.find("://").map_or(0, |i| i + 3);
    let end = url[rest_at..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| rest_at + i);
    url[..end].to_ascii_lowercase()
}

/// What the request says its origin is: `Origin`, else the origin of `Referer`.
fn claimed_origin(headers: &HeaderMap) -> Option<String> {
    let get = |h| headers.get(h).and_then(|v: &HeaderValue| v.to_str().ok());
    match get(header::ORIGIN) {
        Some(o) if o != "null" => Some(origin_of(o)),
        Some(_) => Some("null".to_owned()),
        None => get(header::REFERER).map(origin_of),
    }
}

/// `Err(403)` when the request must prove it comes from the broker's own pages and does not.
pub(super) fn csrf_check(
    method: &Method,
    headers: &HeaderMap,
    state: &Shared,
) -> Result<(), ApiError> {
    let upgrade = headers.contains_key(header::UPGRADE);
    let changes = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    let cookie = cookie_value(headers, COOKIE).is_some();
    // A read is checked only when it could read as the visitor and names where it comes from.
    let named_read = cookie && headers.contains_key(header::ORIGIN);
    if !(changes || upgrade || named_read) || headers.contains_key(header::AUTHORIZATION) {
        return Ok(());
    }
    let claimed = claimed_origin(headers);
    let own = own_origin(headers, state);
    let same = matches!((&claimed, &own), (Some(c), Some(o)) if c == o);
    let refused = if cookie {
        !same
    } else {
        // No cookie: only a named foreign origin is refused.
        changes && claimed.is_some() && !same
    };
    if refused {
        tracing::warn!(
            %method,
            origin = claimed.as_deref().unwrap_or("(none)"),
            "cross-origin request refused"
        );
        return Err(ApiError::forbidden("cross-origin request refused"));
    }
    Ok(())
}

/// A slot for the cookie resolver to say it slid the session, set on requests that may sign
/// in with the cookie (no `Authorization`, an `ac7_session` cookie) and read back by
/// [`finish`].
pub(super) fn refresh_slot(req: &mut Request) -> Option<CookieRefresh> {
    let headers = req.headers();
    if headers.contains_key(header::AUTHORIZATION) || cookie_value(headers, COOKIE).is_none() {
        return None;
    }
    let refresh = CookieRefresh::default();
    req.extensions_mut().insert(refresh.clone());
    Some(refresh)
}

/// The sliding cookie and the security headers, on every answer.
pub(super) fn finish(
    state: &Shared,
    mut resp: Response,
    refresh: Option<CookieRefresh>,
) -> Response {
    let slid = refresh.and_then(|r| {
        r.0.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    });
    if let Some(id) = slid
        && !resp.headers().contains_key(header::SET_COOKIE)
        && resp.status() != StatusCode::UNAUTHORIZED
    {
        resp.headers_mut().insert(
            header::SET_COOKIE,
            set_cookie(state, &id, state.config.session_ttl.as_secs()),
        );
    }
    let h = resp.headers_mut();
    let hsts = https(state).then_some(&HSTS);
    for (name, value) in STATICS.iter().chain(hsts) {
        h.entry(name).or_insert_with(|| value.clone());
    }
    resp
}

/// The headers of every response, parsed once (each answer takes copies that share their
/// bytes).
static STATICS: [(HeaderName, HeaderValue); 6] = [
    static_header("content-security-policy", CSP),
    static_header("x-content-type-options", "nosniff"),
    static_header("referrer-policy", "no-referrer"),
    static_header("x-frame-options", "DENY"),
    static_header("cross-origin-opener-policy", "same-origin"),
    static_header("cross-origin-resource-policy", "same-origin"),
];

/// Over HTTPS only.
static HSTS: (HeaderName, HeaderValue) =
    static_header("strict-transport-security", "max-age=31536000");

const fn static_header(name: &'static str, value: &'static str) -> (HeaderName, HeaderValue) {
    (
        HeaderName::from_static(name),
        HeaderValue::from_static(value),
    )
}

/// The headers of every response (HSTS only over HTTPS), lower-case names: this layer adds
/// them to the router's answers, and the accept loop (`broker::server`) writes them on the
/// answers it makes itself (hyper's `400`/`414`/`431`, the connection cap's `503`).
pub(crate) fn headers(https: bool) -> impl Iterator<Item = (&'static str, &'static str)> {
    let hsts = https.then_some(&HSTS);
    STATICS.iter().chain(hsts).map(|(name, value)| {
        (
            name.as_str(),
            value
                .to_str()
                .expect("the static headers are visible ASCII"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_cut_from_urls() {
        assert_eq!(origin_of("http://127.0.0.1:9/x/y?z"), "http://127.0.0.1:9");
        assert_eq!(origin_of("HTTPS://Example.com"), "https://example.com");
        assert_eq!(origin_of("https://a.b?x#y"), "https://a.b");
        let mut h = HeaderMap::new();
        h.insert(header::REFERER, HeaderValue::from_static("http://h:1/page"));
        assert_eq!(claimed_origin(&h).as_deref(), Some("http://h:1"));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert_eq!(claimed_origin(&h).as_deref(), Some("null"));
    }
}
