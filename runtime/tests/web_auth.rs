//! Web sign-in over real HTTP against a real broker: TOTP login, the session cookie (API and
//! live stream), logout, expiry, rate limits, CSRF, security headers, `/fs/read` of active
//! content, TOTP enrollment, the first-admin setup, device-code enrollment and `ac7 connect`.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

mod broker_support;

use std::time::Duration;

use ac7_protocol::signin::totp;
use ac7_runtime::broker::sessions;
use broker_support::{SseClient, TestBroker, start_broker, start_with};
use serde_json::{Value, json};

/// A fixed secret per member (base32 of 20 bytes).
fn secret_of(member: &str) -> String {
    let mut bytes = [0u8; 20];
    for (i, b) in member.bytes().cycle().take(20).enumerate() {
        bytes[i] = b.wrapping_add(i as u8);
    }
    totp::new_secret(&bytes)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The current code of `secret`, `skew` steps away.
fn code(secret: &str, skew: i64) -> String {
    let key = totp::base32_decode(secret).unwrap();
    let at = now_secs().saturating_add_signed(skew * totp::PERIOD as i64);
    totp::code_at(&key, at, totp::DIGITS)
}

/// Gives `member` a (fresh) TOTP secret straight in the store; returns it.
fn enroll_direct(b: &TestBroker, member: &str) -> String {
    let secret = secret_of(member);
    b.broker
        .state
        .store
        .with(|conn| sessions::totp_set(conn, member, &secret))
        .unwrap();
    secret
}

struct Reply {
    status: u16,
    json: Value,
    headers: reqwest::header::HeaderMap,
}

/// A request with optional cookie, Origin and JSON body (no bearer token).
async fn send(
    b: &TestBroker,
    method: &str,
    path: &str,
    cookie: Option<&str>,
    origin: Option<&str>,
    body: Option<Value>,
) -> Reply {
    let mut req = b
        .http
        .request(method.parse().unwrap(), format!("{}{path}", b.url));
    if let Some(c) = cookie {
        req = req.header("cookie", format!("ac7_session={c}"));
    }
    if let Some(o) = origin {
        req = req.header("origin", o);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    Reply {
        status,
        json: serde_json::from_str(&text).unwrap_or(Value::Null),
        headers,
    }
}

/// The `ac7_session` value a response sets.
fn session_cookie(r: &Reply) -> String {
    let set = r.headers["set-cookie"].to_str().unwrap();
    set.strip_prefix("ac7_session=")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned()
}

/// Signs `member` in with a fresh secret; returns the cookie value.
async fn login(b: &TestBroker, member: &str) -> String {
    let secret = enroll_direct(b, member);
    let r = send(
        b,
        "POST",
        "/session/totp",
        None,
        None,
        Some(json!({"code": code(&secret, 0), "member": member})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    session_cookie(&r)
}

#[tokio::test]
async fn login_wrong_code_replay_and_shape() {
    let b = start_broker().await;
    let secret = enroll_direct(&b, "director");
    let good = code(&secret, 0);
    let wrong = format!(
        "{:06}",
        (good.parse::<u32>().unwrap() + 500_000) % 1_000_000
    );
    let r = send(
        &b,
        "POST",
        "/session/totp",
        None,
        None,
        Some(json!({"code": wrong})),
    )
    .await;
    assert_eq!(
        (r.status, r.json.clone()),
        (401, json!({"error": "invalid code"}))
    );
    let r = send(
        &b,
        "POST",
        "/session/totp",
        None,
        None,
        Some(json!({"code": "12345"})),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.json);
    assert_eq!(r.json["error"], "invalid login payload");

    // Codeless login finds the member.
    let r = send(
        &b,
        "POST",
        "/session/totp",
        None,
        None,
        Some(json!({"code": good})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["member"], "director");
    assert_eq!(r.json["role"]["title"], "director");
    assert!(r.json["permissions"].as_array().unwrap().len() >= 7);
    assert!(r.json["expiresAt"].as_i64().unwrap() > 0);
    let set = r.headers["set-cookie"].to_str().unwrap();
    for part in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=604800"] {
        assert!(set.contains(part), "{set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: no Secure: {set}");
    let cookie = session_cookie(&r);
    assert_eq!(cookie.len(), 43);

    // The same code never signs in twice.
    let r = send(
        &b,
        "POST",
        "/session/totp",
        None,
        None,
        Some(json!({"code": good, "member": "director"})),
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json["error"], "code already used; wait for the next code");

    // GET /session with the cookie; with a bearer token the expiry is "never".
    let r = send(&b, "GET", "/session", Some(&cookie), None, None).await;
    assert_eq!(
        (r.status, r.json["member"].clone()),
        (200, json!("director"))
    );
    let r = b.get("/session", "builder").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["member"], "builder");
    assert_eq!(r.json["expiresAt"], json!(9_007_199_254_740_991_i64));
    // No credentials at all.
    let r = send(&b, "GET", "/session", None, None, None).await;
    assert_eq!(
        (r.status, r.json.clone()),
        (401, json!({"error": "missing credentials"}))
    );
    let r = send(&b, "GET", "/session", Some("forged"), None, None).await;
    assert_eq!(
        (r.status, r.json.clone()),
        (401, json!({"error": "session expired"}))
    );
}

#[tokio::test]
async fn login_is_rate_limited_per_member_and_address() {
    let b = start_broker().await;
    let secret = enroll_direct(&b, "builder");
    let good = code(&secret, 0);
    let wrong = format!("{:06}", (good.parse::<u32>().unwrap() + 1) % 1_000_000);
    for i in 0..5 {
        let r = send(
            &b,
            "POST",
            "/session/totp",
            None,
            None,
            Some(json!({"code": wrong, "member": "builder"})),
        )
        .await;
        assert_eq!(r.status, 401, "attempt {i}: {}", r.json);
    }
    // Locked now: even the right code is refused, with Retry-After.
    let r = send(
        &b,
        "POST",
        "/session/totp",
        None,
        None,
        Some(json!({"code": good, "member": "builder"})),
    )
    .await;
    assert_eq!(r.status, 429, "{}", r.json);
    assert_eq!(r.json["error"], "too many attempts; try again later");
    let secs: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=900).contains(&secs), "{secs}");
    assert_eq!(r.json["retryAfter"], json!(secs));
    // The address is locked too: codeless attempts and other members from it.
    let r = send(
        &b,
        "POST",
        "/session/totp",
        None,
        None,
        Some(json!({"code": good})),
    )
    .await;
    assert_eq!(r.status, 429);
}

#[tokio::test]
async fn cookie_authenticates_the_api_and_the_live_stream() {
    let b = start_broker().await;
    let cookie = login(&b, "builder").await;
    let own = b.url.clone();
    let r = send(&b, "GET", "/roster", Some(&cookie), None, None).await;
    assert_eq!(r.status, 200, "{}", r.json);

    // The SSE stream with only the cookie.
    let resp = b
        .http
        .get(format!("{}/subscribe?name=builder", b.url))
        .header("cookie", format!("ac7_session={cookie}"))
        .header("accept", "text/event-stream")
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut sse = SseClient::from_response(resp);
    b.push(
        "director",
        json!({"to": "builder", "body": "over the cookie stream"}),
    )
    .await;
    let m = sse.next_message().await;
    assert_eq!(m["body"], "over the cookie stream");

    // A push from the browser (cookie + own Origin) reaches the API.
    let r = send(
        &b,
        "POST",
        "/push",
        Some(&cookie),
        Some(&own),
        Some(json!({"to": "director", "body": "from the browser"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["message"]["from"], "builder");

    // Logout ends the session server-side: the old cookie is refused and the stream ends.
    let r = send(
        &b,
        "POST",
        "/session/logout",
        Some(&cookie),
        Some(&own),
        None,
    )
    .await;
    assert_eq!(r.status, 204);
    let cleared = r.headers["set-cookie"].to_str().unwrap();
    assert!(
        cleared.starts_with("ac7_session=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );
    let r = send(&b, "GET", "/roster", Some(&cookie), None, None).await;
    assert_eq!(
        (r.status, r.json.clone()),
        (401, json!({"error": "session expired"}))
    );
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while sse.next_block().await.is_some() {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the cookie's live stream outlived the logout"
    );
    // Logging out again (session gone) still clears the cookie.
    let r = send(
        &b,
        "POST",
        "/session/logout",
        Some(&cookie),
        Some(&own),
        None,
    )
    .await;
    assert_eq!(r.status, 204);
}

#[tokio::test]
async fn sessions_expire_and_slide() {
    let b = start_with(|c| c.session_ttl = Duration::from_secs(2)).await;
    let cookie = login(&b, "builder").await;
    // Used every 0.5 s for 3 s: it slides past its first expiry, refreshing the cookie.
    let mut refreshed = false;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let r = send(&b, "GET", "/roster", Some(&cookie), None, None).await;
        assert_eq!(r.status, 200, "{}", r.json);
        if let Some(set) = r.headers.get("set-cookie") {
            let set = set.to_str().unwrap();
            assert!(set.contains(&cookie) && set.contains("Max-Age=2"), "{set}");
            refreshed = true;
        }
    }
    assert!(refreshed, "the sliding session never refreshed the cookie");
    // Left alone past its TTL it is gone.
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    let r = send(&b, "GET", "/roster", Some(&cookie), None, None).await;
    assert_eq!(
        (r.status, r.json.clone()),
        (401, json!({"error": "session expired"}))
    );
}

#[tokio::test]
async fn csrf_origin_check() {
    let b = start_broker().await;
    let cookie = login(&b, "builder").await;
    let push = json!({"to": "director", "body": "x"});
    let refused = json!({"error": "cross-origin request refused"});
    let r = send(&b, "POST", "/push", Some(&cookie), None, Some(push.clone())).await;
    assert_eq!((r.status, r.json.clone()), (403, refused.clone()));
    let r = send(
        &b,
        "POST",
        "/push",
        Some(&cookie),
        Some("https://evil.example"),
        Some(push.clone()),
    )
    .await;
    assert_eq!((r.status, r.json.clone()), (403, refused.clone()));
    let r = send(
        &b,
        "POST",
        "/push",
        Some(&cookie),
        Some(&b.url),
        Some(push.clone()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    // A same-origin Referer serves when there is no Origin.
    let r = b
        .http
        .post(format!("{}/push", b.url))
        .header("cookie", format!("ac7_session={cookie}"))
        .header("referer", format!("{}/dm/director", b.url))
        .json(&push)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // Bearer requests need no Origin.
    let r = b.post("/push", "builder", push.clone()).await;
    assert_eq!(r.status, 200, "{}", r.json);
    // A foreign page cannot drive a login either.
    let r = send(
        &b,
        "POST",
        "/session/totp",
        None,
        Some("https://evil.example"),
        Some(json!({"code": "123456"})),
    )
    .await;
    assert_eq!((r.status, r.json.clone()), (403, refused.clone()));
    // A WebSocket upgrade with the cookie from a foreign origin is refused.
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = format!(
        "{}/subscribe?name=builder",
        b.url.replace("http://", "ws://")
    )
    .into_client_request()
    .unwrap();
    req.headers_mut()
        .insert("cookie", format!("ac7_session={cookie}").parse().unwrap());
    req.headers_mut()
        .insert("origin", "https://evil.example".parse().unwrap());
    match tokio_tungstenite::connect_async(req).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 403)
        }
        other => panic!("cross-origin WebSocket accepted: {:?}", other.map(|_| ())),
    }
    // …and accepted from our own origin.
    let mut req = format!(
        "{}/subscribe?name=builder",
        b.url.replace("http://", "ws://")
    )
    .into_client_request()
    .unwrap();
    req.headers_mut()
        .insert("cookie", format!("ac7_session={cookie}").parse().unwrap());
    req.headers_mut().insert("origin", b.url.parse().unwrap());
    assert!(tokio_tungstenite::connect_async(req).await.is_ok());
}

fn assert_security_headers(h: &reqwest::header::HeaderMap, what: &str) {
    let csp = h
        .get("content-security-policy")
        .unwrap_or_else(|| panic!("{what}: no CSP"))
        .to_str()
        .unwrap();
    assert!(csp.contains("default-src 'none'"), "{what}: {csp}");
    for (k, v) in [
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("x-frame-options", "DENY"),
        ("cross-origin-opener-policy", "same-origin"),
        ("cross-origin-resource-policy", "same-origin"),
    ] {
        assert_eq!(
            h.get(k).map(|v| v.to_str().unwrap()),
            Some(v),
            "{what}: header {k}"
        );
    }
    assert!(
        h.get("strict-transport-security").is_none(),
        "{what}: HSTS on plain HTTP"
    );
}

#[tokio::test]
async fn security_headers_on_every_response() {
    let b = start_broker().await;
    let r = b.get("/roster", "builder").await;
    assert_eq!(r.status, 200);
    assert_security_headers(&r.headers, "JSON");
    let csp = r.headers["content-security-policy"].to_str().unwrap();
    assert_eq!(
        csp,
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; font-src 'self'; manifest-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    );
    let r = b.get("/no/such/route", "builder").await;
    assert_eq!(r.status, 404);
    assert_security_headers(&r.headers, "404");
    let r = send(&b, "GET", "/roster", None, None, None).await;
    assert_eq!(r.status, 401);
    assert_security_headers(&r.headers, "401");
    let r = send(&b, "POST", "/push", Some("x"), None, None).await;
    assert_eq!(r.status, 403);
    assert_security_headers(&r.headers, "403");
}
