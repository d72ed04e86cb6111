//! Web sign-in over real HTTP against a real broker: TOTP login, the session cookie (API and
//! live stream), logout, expiry, rate limits, CSRF, security headers, `/fs/read` of active
//! content, TOTP enrollment, the first-admin setup, device-code enrollment and `ac7 connect`.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::time::Duration;

use crate::broker_support::{self, TestBroker, anon, req, start_broker, start_with};
use ac7_protocol::signin::totp;
use ac7_runtime::broker::sessions;
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
        .tx(|conn| sessions::totp_set(conn, member, &secret))
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

/// `POST /session/totp` without credentials.
async fn sign_in(b: &TestBroker, code: &str, member: Option<&str>) -> Reply {
    let mut body = json!({"code": code});
    if let Some(m) = member {
        body["member"] = json!(m);
    }
    send(b, "POST", "/session/totp", None, None, Some(body)).await
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
pub(crate) async fn login(b: &TestBroker, member: &str) -> String {
    let secret = enroll_direct(b, member);
    let r = sign_in(b, &code(&secret, 0), Some(member)).await;
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
    let r = sign_in(&b, &wrong, None).await;
    assert_eq!(
        (r.status, r.json.clone()),
        (401, json!({"error": "invalid code"}))
    );
    let r = sign_in(&b, "12345", None).await;
    assert_eq!(r.status, 400, "{}", r.json);
    assert_eq!(r.json["error"], "invalid login payload");

    // Codeless login finds the member.
    let r = sign_in(&b, &good, None).await;
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
    let r = sign_in(&b, &good, Some("director")).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json["error"], "code already used; wait for the next code");

    // GET /session with the cookie; with a bearer token the expiry is "never".
    let answers = b
        .check(vec![
            anon("GET", "/session")
                .cookie(&cookie)
                .answers_at(200, "/member", json!("director")),
            req("GET", "/session", "builder").answers_at(200, "/member", json!("builder")),
            // No credentials at all.
            anon("GET", "/session").answers_json(401, json!({"error": "missing credentials"})),
            anon("GET", "/session")
                .cookie("forged")
                .answers_json(401, json!({"error": "session expired"})),
        ])
        .await;
    assert_eq!(
        answers[1].json["expiresAt"],
        json!(9_007_199_254_740_991_i64)
    );
}

#[tokio::test]
async fn login_is_rate_limited_per_member_and_address() {
    let b = start_broker().await;
    let secret = enroll_direct(&b, "builder");
    let good = code(&secret, 0);
    let wrong = format!("{:06}", (good.parse::<u32>().unwrap() + 1) % 1_000_000);
    for i in 0..5 {
        let r = sign_in(&b, &wrong, Some("builder")).await;
        assert_eq!(r.status, 401, "attempt {i}: {}", r.json);
    }
    // Locked now: even the right code is refused, with Retry-After.
    let r = sign_in(&b, &good, Some("builder")).await;
    assert_eq!(r.status, 429, "{}", r.json);
    assert_eq!(r.json["error"], "too many attempts; try again later");
    let secs: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=900).contains(&secs), "{secs}");
    assert_eq!(r.json["retryAfter"], json!(secs));
    // The address is locked too: codeless attempts and other members from it.
    let r = sign_in(&b, &good, None).await;
    assert_eq!(r.status, 429);
}

/// `POST /session/totp` from the loopback address `from` (Linux routes all of 127/8 to the
/// loopback interface, so a test can play many clients): `(status, JSON body)`.
async fn sign_in_from(b: &TestBroker, from: std::net::Ipv4Addr, body: &Value) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server: std::net::SocketAddr = b.url.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((from, 0).into()).unwrap();
    let mut stream = socket.connect(server).await.unwrap();
    let body = body.to_string();
    let request = format!(
        "POST /session/totp HTTP/1.1\r\nHost: {server}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw);
    let status = text[9..12].parse().unwrap();
    let json = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

/// A six-digit code that is no member's code now (nor a step either side).
fn no_ones_code(secrets: &[&str]) -> String {
    let taken: Vec<String> = secrets
        .iter()
        .flat_map(|s| [-1, 0, 1].map(|skew| code(s, skew)))
        .collect();
    (0..)
        .map(|n: u32| format!("{:06}", (n * 7919 + 13) % 1_000_000))
        .find(|c| !taken.contains(c))
        .unwrap()
}

/// The `ac7_signin_*` figure `name` of `GET /metrics`.
async fn metric(b: &TestBroker, name: &str) -> u64 {
    let r = b.get("/metrics", "director").await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.text
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics: {}", r.text))
}

#[tokio::test]
async fn nameless_guesses_from_a_thousand_addresses_are_throttled_team_wide() {
    let b = start_broker().await;
    let builder = enroll_direct(&b, "builder");
    let director = enroll_direct(&b, "director");
    let wrong = no_ones_code(&[&builder, &director]);
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let mut refusal = Value::Null;
    for i in 0..1000u32 {
        let from = std::net::Ipv4Addr::new(127, 7, (i / 200) as u8, (i % 200 + 1) as u8);
        let (status, json) = sign_in_from(&b, from, &json!({"code": wrong})).await;
        *statuses.entry(status).or_default() += 1;
        if status == 429 {
            refusal = json;
        }
    }
    // Ten guesses for the whole team, whatever the number of addresses; the rest refused.
    assert_eq!(
        statuses,
        [(401, 10), (429, 990)].into_iter().collect(),
        "{refusal}"
    );
    assert_eq!(
        refusal["error"],
        "too many attempts without a member name; sign in with your member name, or try again later"
    );
    assert!(
        refusal["retryAfter"].as_u64().is_some_and(|s| s > 0),
        "{refusal}"
    );
    // Even the right code is refused without a name while the budget is locked …
    let from = std::net::Ipv4Addr::new(127, 8, 0, 1);
    let (status, _) = sign_in_from(&b, from, &json!({"code": code(&builder, 0)})).await;
    assert_eq!(status, 429);
    // … and a member who names themselves signs in: the guesser spent no member's budget.
    let body = json!({"code": code(&builder, 0), "member": "builder"});
    let (status, json) = sign_in_from(&b, from, &body).await;
    assert_eq!(status, 200, "{json}");
    // The operator sees it in the metrics.
    assert_eq!(
        metric(&b, "ac7_signin_failures_total{kind=\"nameless\"}").await,
        10
    );
    assert!(metric(&b, "ac7_signin_refused_total").await >= 991);
    assert!(metric(&b, "ac7_signin_lockouts_total").await >= 1);
    assert!(metric(&b, "ac7_signin_locked").await >= 1);
}

#[tokio::test]
async fn a_member_locked_by_named_failures_is_not_reachable_without_the_name() {
    let b = start_broker().await;
    let builder = enroll_direct(&b, "builder");
    let director = enroll_direct(&b, "director");
    let wrong = no_ones_code(&[&builder, &director]);
    for i in 0..5u8 {
        let from = std::net::Ipv4Addr::new(127, 9, 0, i + 1);
        let body = json!({"code": wrong, "member": "builder"});
        assert_eq!(sign_in_from(&b, from, &body).await.0, 401, "attempt {i}");
    }
    let fresh = std::net::Ipv4Addr::new(127, 9, 1, 1);
    let body = json!({"code": code(&builder, 0), "member": "builder"});
    assert_eq!(sign_in_from(&b, fresh, &body).await.0, 429);
    // Builder's right code without the name, from an address never seen: not a way in.
    let (status, json) = sign_in_from(&b, fresh, &json!({"code": code(&builder, 0)})).await;
    assert_eq!((status, json), (401, json!({"error": "invalid code"})));
    // Other members are untouched.
    let (status, json) = sign_in_from(&b, fresh, &json!({"code": code(&director, 0)})).await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["member"], "director");
}

#[tokio::test]
async fn made_up_member_names_count_against_the_nameless_budget() {
    let b = start_broker().await;
    let builder = enroll_direct(&b, "builder");
    let wrong = no_ones_code(&[&builder]);
    let mut statuses = Vec::new();
    for i in 0..12u8 {
        let from = std::net::Ipv4Addr::new(127, 10, 0, i + 1);
        let body = json!({"code": wrong, "member": format!("nobody{i}")});
        statuses.push(sign_in_from(&b, from, &body).await.0);
    }
    // A made-up name always gets 401, so no answer tells which names are members; ten of
    // them spend the shared budget, and nameless codes are refused after them.
    assert_eq!(statuses, [401; 12], "{statuses:?}");
    let from = std::net::Ipv4Addr::new(127, 10, 1, 1);
    let (status, _) = sign_in_from(&b, from, &json!({"code": wrong})).await;
    assert_eq!(status, 429);
    assert_eq!(
        metric(&b, "ac7_signin_failures_total{kind=\"nameless\"}").await,
        12
    );
    assert_eq!(
        metric(&b, "ac7_signin_failures_total{kind=\"named\"}").await,
        0
    );
}

#[tokio::test]
async fn cookie_authenticates_the_api_and_the_live_stream() {
    let b = start_broker().await;
    let cookie = login(&b, "builder").await;
    let own = b.url.clone();
    let r = send(&b, "GET", "/roster", Some(&cookie), None, None).await;
    assert_eq!(r.status, 200, "{}", r.json);

    // The SSE stream with only the cookie.
    let mut sse = b.browser_sse("builder", &cookie).await;
    // A browser's stream hears presence changes (its own opening first), as notices without
    // an id, so its resume position stays the last message.
    let ev = sse.next_event().await;
    assert_eq!(
        (ev.id.as_deref(), ev.event.as_deref()),
        (None, Some("presence"))
    );
    assert_eq!(
        serde_json::from_str::<Value>(&ev.data).unwrap(),
        json!({"type": "presence", "name": "builder"})
    );
    // A busy report of another member is one too (the bearer caller's own stream never
    // hears them).
    let r = b
        .post("/presence/busy", "director", json!({"busy": true}))
        .await;
    assert_eq!(r.status, 204, "{}", r.json);
    let ev = sse.next_event().await;
    assert_eq!(
        serde_json::from_str::<Value>(&ev.data).unwrap(),
        json!({"type": "presence", "name": "director"})
    );
    // Refreshing a report that changes nothing says nothing.
    let r = b
        .post("/presence/busy", "director", json!({"busy": true}))
        .await;
    assert_eq!(r.status, 204, "{}", r.json);
    b.push(
        "director",
        json!({"to": "builder", "body": "over the cookie stream"}),
    )
    .await;
    let m = sse.next_message().await;
    assert_eq!(m["body"], "over the cookie stream");

    // Every change to the channel list, made by anyone, is a `channels` notice: the app
    // re-reads its list (so a rename or an archive shows at once in every open browser).
    let changes: [(&str, &str, Option<Value>); 5] = [
        ("POST", "/channels", Some(json!({"slug": "plans"}))),
        ("PATCH", "/channels/plans", Some(json!({"slug": "roadmap"}))),
        (
            "POST",
            "/channels/roadmap/members",
            Some(json!({"member": "builder"})),
        ),
        ("DELETE", "/channels/roadmap/members/builder", None),
        ("DELETE", "/channels/roadmap", None),
    ];
    for (method, path, body) in changes {
        let r = b.call(method, path, "director", body).await;
        assert!(r.status < 300, "{method} {path}: {} {}", r.status, r.json);
        let ev = sse.next_event().await;
        assert_eq!(
            (ev.id.as_deref(), ev.event.as_deref()),
            (None, Some("channels")),
            "after {method} {path}: {}",
            ev.data
        );
        assert_eq!(
            serde_json::from_str::<Value>(&ev.data).unwrap(),
            json!({"type": "channels"})
        );
    }
    // A refused change says nothing: the next event is the message after it.
    let r = b
        .call("DELETE", "/channels/roadmap", "director", None)
        .await;
    assert_eq!(r.status, 410, "{}", r.json);
    b.push(
        "director",
        json!({"to": "builder", "body": "after the channels"}),
    )
    .await;
    let m = sse.next_message().await;
    assert_eq!(m["body"], "after the channels");

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
    let cookie_push = || anon("POST", "/push").cookie(&cookie).body(push.clone());
    b.check(vec![
        cookie_push().answers_json(403, refused.clone()),
        cookie_push()
            .origin("https://evil.example")
            .answers_json(403, refused.clone()),
        cookie_push().origin(&b.url).answers(200),
    ])
    .await;
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
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; media-src 'self'; connect-src 'self'; font-src 'self'; manifest-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
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

#[tokio::test]
async fn totp_enrollment_is_pending_until_confirmed() {
    let b = start_broker().await;
    let old = enroll_direct(&b, "builder");
    // Only the member or a members.manage holder may enroll.
    let r = b
        .post("/members/builder/enroll-totp", "reviewer", json!({}))
        .await;
    assert_eq!(r.status, 403, "{}", r.json);
    let r = b
        .post("/members/builder/enroll-totp", "director", json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let secret = r.json["totpSecret"].as_str().unwrap().to_owned();
    assert_eq!(secret.len(), 32, "160-bit base32 secret");
    let uri = r.json["totpUri"].as_str().unwrap();
    assert!(
        uri.starts_with("otpauth://totp/ac7:builder%20%28peer-team%29?secret="),
        "{uri}"
    );
    assert!(uri.contains(&secret));
    let svg = r.json["qrSvg"].as_str().unwrap();
    assert!(svg.contains("<svg") && svg.contains("</svg>"), "{svg}");
    // Pending: the old secret is still the one that signs in; the new one does not yet.
    let row = b
        .broker
        .state
        .store
        .tx(|c| sessions::totp_get(c, "builder"))
        .unwrap()
        .unwrap();
    assert_eq!(row.secret.as_deref(), Some(old.as_str()));
    let r = sign_in(&b, &code(&secret, 0), Some("builder")).await;
    assert_eq!(r.status, 401, "a pending secret signed in: {}", r.json);
    // Confirmation: wrong code refused, right code makes it the secret and is used up.
    let wrong = format!(
        "{:06}",
        (code(&secret, 0).parse::<u32>().unwrap() + 7) % 1_000_000
    );
    let r = b
        .post(
            "/members/builder/enroll-totp/confirm",
            "builder",
            json!({"code": wrong}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (401, json!("invalid code"))
    );
    let confirm = code(&secret, 0);
    let r = b
        .post(
            "/members/builder/enroll-totp/confirm",
            "builder",
            json!({"code": confirm}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let r = sign_in(&b, &confirm, Some("builder")).await;
    assert_eq!(r.status, 401, "the confirming code signed in again");
    let r = sign_in(&b, &code(&secret, 1), Some("builder")).await;
    assert_eq!(r.status, 200, "{}", r.json);
    // Nothing pending any more.
    let r = b
        .post(
            "/members/builder/enroll-totp/confirm",
            "builder",
            json!({"code": confirm}),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.json);
}

#[tokio::test]
async fn confirming_a_new_authenticator_ends_the_other_sessions() {
    let b = start_broker().await;
    let own = b.url.clone();
    let session = |ua: &str| {
        b.broker
            .state
            .store
            .tx(|c| {
                sessions::session_create(
                    c,
                    "builder",
                    Some(ua),
                    now_secs() as i64 * 1000,
                    3_600_000,
                )
            })
            .unwrap()
            .0
    };
    let (mine, laptop, phone) = (session("here"), session("laptop"), session("phone"));
    let reviewer = b
        .broker
        .state
        .store
        .tx(|c| sessions::session_create(c, "reviewer", None, now_secs() as i64 * 1000, 3_600_000))
        .unwrap()
        .0;
    let r = send(
        &b,
        "POST",
        "/members/builder/enroll-totp",
        Some(&mine),
        Some(&own),
        Some(json!({})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let secret = r.json["totpSecret"].as_str().unwrap().to_owned();
    // Pending: nothing ends yet.
    assert_eq!(
        send(&b, "GET", "/session", Some(&laptop), None, None)
            .await
            .status,
        200
    );
    let r = send(
        &b,
        "POST",
        "/members/builder/enroll-totp/confirm",
        Some(&mine),
        Some(&own),
        Some(json!({"code": code(&secret, 0)})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    // The member's other sessions are over; the confirming one and other members' stay.
    for other in [&laptop, &phone] {
        let r = send(&b, "GET", "/session", Some(other), None, None).await;
        assert_eq!(r.status, 401, "{}", r.json);
    }
    assert_eq!(
        send(&b, "GET", "/session", Some(&mine), None, None)
            .await
            .status,
        200
    );
    assert_eq!(
        send(&b, "GET", "/session", Some(&reviewer), None, None)
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn first_admin_setup_stays_open_until_its_secret_signs_in() {
    let b = start_broker().await;
    let setup = b
        .broker
        .setup_code
        .clone()
        .expect("a new team has a setup code");
    let r = send(&b, "GET", "/setup/status", None, None, None).await;
    assert_eq!((r.status, r.json.clone()), (200, json!({"needed": true})));
    let r = send(
        &b,
        "POST",
        "/setup",
        None,
        None,
        Some(json!({"code": "guess"})),
    )
    .await;
    assert_eq!(
        (r.status, r.json.clone()),
        (401, json!({"error": "invalid setup code"}))
    );
    let r = send(&b, "POST", "/setup", None, None, Some(json!({}))).await;
    assert_eq!(r.status, 400);
    let r = send(
        &b,
        "POST",
        "/setup",
        None,
        None,
        Some(json!({"code": setup})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["member"], "director");
    let secret = r.json["totpSecret"].as_str().unwrap().to_owned();
    assert!(r.json["qrSvg"].as_str().unwrap().contains("<svg"));
    // Not used up yet: asking again (a reload before scanning) shows the same secret, and
    // the setup is still open.
    let again = send(
        &b,
        "POST",
        "/setup",
        None,
        None,
        Some(json!({"code": setup})),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.json);
    assert_eq!(again.json["totpSecret"], json!(secret));
    assert_eq!(again.json["totpUri"], r.json["totpUri"]);
    let r = send(&b, "GET", "/setup/status", None, None, None).await;
    assert_eq!(r.json, json!({"needed": true}));
    // A wrong code confirms nothing.
    let wrong = if code(&secret, 0) == "000000" {
        "111111"
    } else {
        "000000"
    };
    let r = sign_in(&b, wrong, Some("director")).await;
    assert_eq!(r.status, 401, "{}", r.json);
    let r = send(&b, "GET", "/setup/status", None, None, None).await;
    assert_eq!(r.json, json!({"needed": true}));
    // The first sign-in with the secret confirms it and closes the setup.
    let r = sign_in(&b, &code(&secret, 0), None).await;
    assert_eq!(
        (r.status, r.json["member"].clone()),
        (200, json!("director"))
    );
    let r = send(&b, "GET", "/setup/status", None, None, None).await;
    assert_eq!(r.json, json!({"needed": false}));
    let r = send(
        &b,
        "POST",
        "/setup",
        None,
        None,
        Some(json!({"code": setup})),
    )
    .await;
    assert_eq!(r.status, 409, "{}", r.json);
    // The confirmed secret keeps working (its confirming step is used up).
    let r = sign_in(&b, &code(&secret, 0), Some("director")).await;
    assert_eq!(r.status, 401, "the confirming code signed in twice");
    let r = sign_in(&b, &code(&secret, 1), Some("director")).await;
    assert_eq!(r.status, 200, "{}", r.json);
}

#[tokio::test]
async fn uploaded_html_is_never_served_as_active_content() {
    let b = start_broker().await;
    let html = b"<html><script>fetch('/members')</script></html>";
    for (path, mime) in [
        ("/builder/x.html", "text/html"),
        ("/builder/x.svg", "image/svg+xml"),
    ] {
        let r = b.write_file("builder", path, mime, html, None).await;
        assert_eq!(r.status, 200, "{}", r.text);
        // Read with the browser's credentials (the cookie), as a navigation would.
        let cookie = login(&b, "builder").await;
        let r = send(
            &b,
            "GET",
            &format!("/fs/read{path}"),
            Some(&cookie),
            None,
            None,
        )
        .await;
        assert_eq!(r.status, 200);
        let disp = r.headers["content-disposition"].to_str().unwrap();
        assert!(disp.starts_with("attachment;"), "{path}: {disp}");
        assert_eq!(
            r.headers["content-security-policy"].to_str().unwrap(),
            "sandbox; default-src 'none'",
            "{path}"
        );
        assert_eq!(r.headers["x-content-type-options"], "nosniff");
        assert_eq!(r.headers["x-frame-options"], "DENY");
    }
    // A passive type stays inline, still sandboxed.
    b.write_file("builder", "/builder/p.png", "image/png", b"\x89PNG", None)
        .await;
    let r = b.get("/fs/read/builder/p.png", "builder").await;
    assert!(
        r.headers["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("inline;")
    );
    assert_eq!(
        r.headers["content-security-policy"].to_str().unwrap(),
        "sandbox; default-src 'none'"
    );
}

async fn enroll_start(b: &TestBroker, hint: &str) -> Value {
    let r = send(
        b,
        "POST",
        "/enroll",
        None,
        None,
        Some(json!({"labelHint": hint})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    r.json
}

async fn poll(b: &TestBroker, device: &str) -> Reply {
    send(
        b,
        "POST",
        "/enroll/poll",
        None,
        None,
        Some(json!({"deviceCode": device})),
    )
    .await
}

#[tokio::test]
async fn device_enrollment_over_the_api() {
    // The defaults a device is told.
    let e = enroll_start(&start_broker().await, "laptop").await;
    assert_eq!(e["interval"], 5);
    assert_eq!(e["expiresIn"], 300, "an enrollment lives 300 s");
    // The flow, with a 2 s poll interval (the shortest that still tells a poll made at once
    // from one made an interval later: the store counts whole seconds).
    let b = start_with(|c| c.enroll.interval = 2).await;
    let e = enroll_start(&b, "laptop").await;
    let device = e["deviceCode"].as_str().unwrap().to_owned();
    let user = e["userCode"].as_str().unwrap().to_owned();
    assert!(device.starts_with("ac7-dc_"), "{e}");
    assert_eq!(user.len(), 9);
    assert_crockford(&user);
    assert_eq!(e["verificationUri"], "/enroll");
    assert_eq!(e["verificationUriComplete"], format!("/enroll?code={user}"));
    assert_eq!(e["interval"], 2);
    // Pending, then too soon.
    let r = poll(&b, &device).await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (400, json!("authorization_pending"))
    );
    let r = poll(&b, &device).await;
    assert_eq!(r.json["error"], "slow_down");
    // Only members.manage sees and decides.
    assert_eq!(b.get("/enroll/pending", "builder").await.status, 403);
    let r = b.get("/enroll/pending", "director").await;
    assert_eq!(r.status, 200);
    let list = r.json["enrollments"].as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["userCode"], user.as_str());
    assert_eq!(list[0]["labelHint"], "laptop");
    assert_eq!(list[0]["sourceIp"], "127.0.0.1");
    // Approve by creating a member (the code typed in lower case without the hyphen).
    let typed = user.replace('-', "").to_lowercase();
    let r = b
        .post(
            "/enroll/approve",
            "builder",
            json!({"mode": "bind", "userCode": typed, "memberName": "builder"}),
        )
        .await;
    assert_eq!(r.status, 403);
    let r = b
        .post(
            "/enroll/approve",
            "director",
            json!({"mode": "create", "userCode": typed, "memberName": "laptop-agent",
                   "role": {"title": "engineer"}, "permissions": []}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["member"]["name"], "laptop-agent");
    assert_eq!(r.json["tokenInfo"]["origin"], "enroll");
    assert_eq!(r.json["tokenInfo"]["label"], "laptop");
    assert!(
        r.json.get("token").is_none(),
        "the approver must not see the token"
    );
    // Decided: a second approval is a conflict.
    let r = b
        .post(
            "/enroll/approve",
            "director",
            json!({"mode": "bind", "userCode": user, "memberName": "builder"}),
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.json);
    // The device collects its token once, an interval later; it works.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let r = poll(&b, &device).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["member"]["name"], "laptop-agent");
    let token = r.json["token"].as_str().unwrap().to_owned();
    let roster = b
        .http
        .get(format!("{}/roster", b.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(roster.status().as_u16(), 200);
    let r = poll(&b, &device).await;
    assert_eq!(r.json["error"], "expired_token");

    // Reject: the device hears access_denied with the reason.
    let e = enroll_start(&b, "phone").await;
    let r = b
        .post(
            "/enroll/reject",
            "director",
            json!({"userCode": e["userCode"], "reason": "not ours"}),
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.json);
    let r = poll(&b, e["deviceCode"].as_str().unwrap()).await;
    assert_eq!(
        r.json,
        json!({"error": "access_denied", "errorDescription": "not ours"})
    );
    let r = b
        .post(
            "/enroll/reject",
            "director",
            json!({"userCode": "ZZZZ-ZZZZ"}),
        )
        .await;
    assert_eq!(r.status, 404);
}

/// A user code is `XXXX-XXXX` in Crockford's base32: digits and letters without I, L, O, U.
fn assert_crockford(user: &str) {
    let (a, b) = user.split_once('-').unwrap_or_else(|| panic!("{user}"));
    assert_eq!((a.len(), b.len()), (4, 4), "{user}");
    assert!(
        a.chars()
            .chain(b.chars())
            .all(|c| c.is_ascii_digit() || (c.is_ascii_uppercase() && !"ILOU".contains(c))),
        "{user} is not Crockford base32"
    );
}

#[tokio::test]
async fn a_rejected_enrollment_frees_its_place_at_once() {
    let b = start_broker().await;
    let mut started = Vec::new();
    for n in 0..3 {
        let e = enroll_start(&b, &format!("box-{n}")).await;
        assert_crockford(e["userCode"].as_str().unwrap());
        started.push(e);
    }
    let r = send(&b, "POST", "/enroll", None, None, Some(json!({}))).await;
    assert_eq!(r.status, 429, "{}", r.json);
    // Rejected but not yet polled by its device: it no longer holds a place.
    let r = b
        .post(
            "/enroll/reject",
            "director",
            json!({"userCode": started[0]["userCode"], "reason": "not ours"}),
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.json);
    let fourth = enroll_start(&b, "box-3").await;
    assert_crockford(fourth["userCode"].as_str().unwrap());
    let r = send(&b, "POST", "/enroll", None, None, Some(json!({}))).await;
    assert_eq!(r.status, 429, "{}", r.json);
    // The rejected device still hears why; the pending list holds only undecided ones.
    let r = poll(&b, started[0]["deviceCode"].as_str().unwrap()).await;
    assert_eq!(
        r.json,
        json!({"error": "access_denied", "errorDescription": "not ours"})
    );
    let pending = b.get("/enroll/pending", "director").await.json;
    let codes: Vec<&str> = pending["enrollments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["userCode"].as_str().unwrap())
        .collect();
    assert_eq!(codes.len(), 3, "{pending}");
    assert!(!codes.contains(&started[0]["userCode"].as_str().unwrap()));
    // Typed with the look-alike letters (O for 0, I or L for 1), a code is still found.
    let user = fourth["userCode"].as_str().unwrap();
    let typed: String = user
        .chars()
        .map(|c| match c {
            '0' => 'o',
            '1' => 'l',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    let r = b
        .post("/enroll/reject", "director", json!({"userCode": typed}))
        .await;
    assert_eq!(r.status, 204, "{typed}: {}", r.json);
}

#[tokio::test]
async fn enrollment_is_rate_limited_per_address() {
    let b = start_broker().await;
    // At most 3 live per address; a forwarded address is ignored without --trust-proxy.
    let mut devices = Vec::new();
    for _ in 0..3 {
        let r = b
            .http
            .post(format!("{}/enroll", b.url))
            .header("x-forwarded-for", "10.9.9.9")
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let v: Value = r.json().await.unwrap();
        devices.push((v["deviceCode"].clone(), v["userCode"].clone()));
    }
    let r = send(&b, "POST", "/enroll", None, None, Some(json!({}))).await;
    assert_eq!(r.status, 429, "{}", r.json);
    assert!(r.headers.contains_key("retry-after"));
    assert!(r.json["retryAfter"].as_u64().unwrap() >= 1);
    let pending = b.get("/enroll/pending", "director").await.json;
    assert!(
        pending["enrollments"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["sourceIp"] == "127.0.0.1"),
        "{pending}"
    );
    // Decided and collected, they stop counting as live; the hourly cap (10) still counts.
    let settle = |(device, user): (Value, Value)| {
        let b = &b;
        async move {
            let r = b
                .post("/enroll/reject", "director", json!({"userCode": user}))
                .await;
            assert_eq!(r.status, 204);
            assert_eq!(
                poll(b, device.as_str().unwrap()).await.json["error"],
                "access_denied"
            );
        }
    };
    for d in devices {
        settle(d).await;
    }
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let r = send(&b, "POST", "/enroll", None, None, Some(json!({}))).await;
        statuses.push(r.status);
        if r.status == 200 {
            settle((r.json["deviceCode"].clone(), r.json["userCode"].clone())).await;
        }
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 200, 429]);
}

#[tokio::test]
async fn trusted_proxy_address_keys_the_limits() {
    let b = start_with(|c| c.trust_proxy = true).await;
    let r = b
        .http
        .post(format!("{}/enroll", b.url))
        .header("x-forwarded-for", "10.9.9.9, 10.0.0.1")
        .json(&json!({"labelHint": "behind proxy"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let pending = b.get("/enroll/pending", "director").await.json;
    assert_eq!(
        pending["enrollments"][0]["sourceIp"], "10.9.9.9",
        "{pending}"
    );
}

/// A real `ac7 serve` process on a new team; reads its stdout until the listening line.
struct Served {
    child: std::process::Child,
    url: String,
    tokens: std::collections::HashMap<String, String>,
    setup_url: Option<String>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_process(dir: &std::path::Path) -> Served {
    use std::io::BufRead as _;
    let cfg = dir.join("team.json");
    std::fs::write(&cfg, broker_support::TEAM).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["serve", "--port", "0", "--db"])
        .arg(dir.join("ac7.db"))
        .arg("--team-config")
        .arg(&cfg)
        .args(["--enroll-interval", "1"])
        .env("AC7_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut served = Served {
        child,
        url: String::new(),
        tokens: Default::default(),
        setup_url: None,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Everything up to the end of the first-run text (the setup URL comes last).
    while served.setup_url.is_none() {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("ac7 serve did not print its setup URL");
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() == 2 && parts[1].starts_with("ac7_") {
            served.tokens.insert(parts[0].into(), parts[1].into());
        }
        if let Some(url) = line.strip_prefix("ac7 broker listening on ") {
            served.url = url.to_owned();
        }
        if let Some(u) = line
            .trim()
            .strip_prefix(&format!("{}/setup?code=", served.url))
            && !served.url.is_empty()
        {
            served.setup_url = Some(u.to_owned());
        }
    }
    served
}

#[tokio::test]
async fn ac7_connect_end_to_end() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let served = serve_process(dir.path());
    let http = reqwest::Client::new();
    // The printed setup code issues the first admin's secret (the same one until it signs in).
    let code = served.setup_url.clone().unwrap();
    let mut secrets = Vec::new();
    for _ in 0..2 {
        let r = http
            .post(format!("{}/setup", served.url))
            .json(&json!({"code": code}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let v: Value = r.json().await.unwrap();
        secrets.push(v["totpSecret"].clone());
    }
    assert!(
        secrets[0].is_string() && secrets[0] == secrets[1],
        "{secrets:?}"
    );
    let r = http
        .post(format!("{}/setup", served.url))
        .json(&json!({"code": "not-the-code"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);

    // ac7 connect as a real process, with a private config home and no token anywhere.
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let config = home.join("config");
    let mut connect = tokio::process::Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["connect", "--url", &served.url, "--label", "ci-box"])
        .env("XDG_CONFIG_HOME", &config)
        .env("HOME", &home)
        .env_remove("AC7_TOKEN")
        .env_remove("AC7_URL")
        .env_remove("AC7_AUTH_FILE")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt as _;
    let mut out = tokio::io::BufReader::new(connect.stdout.take().unwrap()).lines();
    let mut user_code = None;
    let mut visit = None;
    while user_code.is_none() {
        let line = tokio::time::timeout(Duration::from_secs(20), out.next_line())
            .await
            .expect("ac7 connect printed no code")
            .unwrap()
            .expect("ac7 connect ended early");
        if let Some(v) = line.trim().strip_prefix("visit:") {
            visit = Some(v.trim().to_owned());
        }
        if let Some(c) = line.trim().strip_prefix("code:") {
            user_code = Some(c.trim().to_owned());
        }
    }
    let user_code = user_code.unwrap();
    assert_eq!(
        visit.as_deref(),
        Some(format!("{}/enroll?code={user_code}", served.url).as_str())
    );
    // An admin approves through the API, binding the device to `builder`.
    let r = http
        .post(format!("{}/enroll/approve", served.url))
        .bearer_auth(&served.tokens["director"])
        .json(&json!({"mode": "bind", "userCode": user_code, "memberName": "builder"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let status = tokio::time::timeout(Duration::from_secs(30), connect.wait())
        .await
        .expect("ac7 connect did not finish after approval")
        .unwrap();
    let mut rest = String::new();
    while let Ok(Some(l)) = out.next_line().await {
        rest.push_str(&l);
        rest.push('\n');
    }
    assert!(status.success(), "ac7 connect failed: {status}\n{rest}");
    assert!(
        rest.contains("approved: this device is now builder"),
        "{rest}"
    );

    let auth_dir = config.join("ac7");
    let auth = auth_dir.join("auth.json");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&auth_dir), 0o700);
    assert_eq!(mode(&auth), 0o600);
    let saved: Value = serde_json::from_slice(&std::fs::read(&auth).unwrap()).unwrap();
    assert_eq!(saved["schema"], 1);
    assert_eq!(saved["entries"][0]["url"], served.url.as_str());
    assert_eq!(saved["entries"][0]["member"], "builder");

    // A verb with no --token and no AC7_TOKEN finds the stored token for its URL.
    let roster = tokio::process::Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["roster", "--json", "--url", &served.url])
        .env("XDG_CONFIG_HOME", &config)
        .env("HOME", &home)
        .env_remove("AC7_TOKEN")
        .env_remove("AC7_AUTH_FILE")
        .output()
        .await
        .unwrap();
    assert!(
        roster.status.success(),
        "{}",
        String::from_utf8_lossy(&roster.stderr)
    );
    let v: Value = serde_json::from_slice(&roster.stdout).unwrap();
    assert!(v["teammates"].is_array(), "{v}");
    // …and a different URL does not get it.
    let other = tokio::process::Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["roster", "--url", "http://127.0.0.1:1"])
        .env("XDG_CONFIG_HOME", &config)
        .env("HOME", &home)
        .env_remove("AC7_TOKEN")
        .env_remove("AC7_AUTH_FILE")
        .output()
        .await
        .unwrap();
    assert!(!other.status.success());
    assert!(
        String::from_utf8_lossy(&other.stderr).contains("ac7 connect --url http://127.0.0.1:1"),
        "{}",
        String::from_utf8_lossy(&other.stderr)
    );
}

#[tokio::test]
async fn ac7_connect_cancelled_saves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_broker().await;
    let config = dir.path().join("config");
    let mut connect = tokio::process::Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["connect", "--url", &b.url])
        .env("XDG_CONFIG_HOME", &config)
        .env_remove("AC7_AUTH_FILE")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt as _;
    let mut out = tokio::io::BufReader::new(connect.stdout.take().unwrap()).lines();
    loop {
        let line = tokio::time::timeout(Duration::from_secs(20), out.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if line.starts_with("waiting for approval") {
            break;
        }
    }
    let pid = connect.id().unwrap();
    // SIGINT, as Ctrl-C sends.
    let _ = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status();
    let status = tokio::time::timeout(Duration::from_secs(10), connect.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(!config.join("ac7").join("auth.json").exists());
}

#[tokio::test]
async fn an_uncollected_enrollment_token_is_revoked() {
    let b = start_with(|c| {
        c.enroll.ttl = 2;
    })
    .await;
    let e = enroll_start(&b, "gone").await;
    let r = b
        .post(
            "/enroll/approve",
            "director",
            json!({"mode": "bind", "userCode": e["userCode"], "memberName": "builder"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let id = r.json["tokenInfo"]["id"].as_str().unwrap().to_owned();
    let listed = |v: &Value| {
        v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == id.as_str())
    };
    assert!(listed(
        &b.get("/members/builder/tokens", "director").await.json
    ));
    // Never polled: once it expires, the token goes (the expiry tick runs every 100 ms here).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let mut gone = false;
    for _ in 0..30 {
        if !listed(&b.get("/members/builder/tokens", "director").await.json) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(gone, "the uncollected enrollment token is still live");
    let r = poll(&b, e["deviceCode"].as_str().unwrap()).await;
    assert_eq!(r.json["error"], "expired_token");
}

#[tokio::test]
async fn over_https_the_cookie_is_secure_and_hsts_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let files = ac7_runtime::broker::server::TlsFiles {
        cert: dir.path().join("cert.pem"),
        key: dir.path().join("key.pem"),
    };
    std::fs::write(&files.cert, certified.cert.pem()).unwrap();
    std::fs::write(&files.key, certified.signing_key.serialize_pem()).unwrap();
    let tls = files.clone();
    let b = start_with(move |c| c.tls = Some(tls)).await;
    let origin = format!("https://localhost:{}", b.broker.addr.port());
    let http = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(certified.cert.pem().as_bytes()).unwrap(),
        )
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let secret = enroll_direct(&b, "builder");
    let r = http
        .post(format!("{origin}/session/totp"))
        .json(&json!({"code": code(&secret, 0), "member": "builder"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.headers()["strict-transport-security"].to_str().unwrap(),
        "max-age=31536000"
    );
    let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(set.ends_with("; Secure"), "{set}");
    let cookie = set.split(';').next().unwrap().to_owned();
    // The own origin is https://…; the http:// spelling of the same host is foreign.
    for (o, want) in [
        (format!("http://localhost:{}", b.broker.addr.port()), 403),
        (origin.clone(), 200),
    ] {
        let r = http
            .post(format!("{origin}/push"))
            .header("cookie", &cookie)
            .header("origin", o.as_str())
            .json(&json!({"to": "director", "body": "tls"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), want, "origin {o}");
    }
}
