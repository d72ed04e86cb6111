//! What replicas on one PostgreSQL database must agree on besides the log: presence (and the
//! streams of a replica that died), busy, the per-member rate limit, the subscription cap, the
//! sign-in limiter, sessions, revoked tokens, and whose web app is open (Web Push).

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::time::{Duration, Instant};

use ac7_protocol::signin::totp;
use ac7_runtime::broker::ratelimit::Rate;
use ac7_runtime::broker::sessions;
use serde_json::{Value, json};

use crate::broker_support::TestBroker;
use crate::common::postgres::TestDb;
use crate::pg_replicas::replicas_with;

/// `builder`'s entry on a replica's roster.
async fn presence_of(b: &TestBroker, who: &str) -> Value {
    let r = b.get("/roster", "director").await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["connected"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == who)
        .cloned()
        .unwrap()
}

#[tokio::test]
async fn presence_and_busy_are_the_same_on_every_replica() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas_with(&db, 2, |_| {}).await;
    let _a = rs[0].sse("builder", None).await;
    let _b = rs[1].sse("builder", None).await;
    for r in &rs {
        assert_eq!(presence_of(r, "builder").await["connected"], 2);
    }
    let busy = rs[0]
        .post("/presence/busy", "builder", json!({"busy": true}))
        .await;
    assert_eq!(busy.status, 204, "{}", busy.text);
    assert_eq!(presence_of(&rs[1], "builder").await["busy"], true);
    rs[1]
        .post("/presence/busy", "builder", json!({"busy": false}))
        .await;
    assert_eq!(presence_of(&rs[0], "builder").await.get("busy"), None);
    drop(_a);
    crate::common::wait_until(
        "a closed stream to leave the other replica's roster",
        Duration::from_secs(5),
        async || (presence_of(&rs[1], "builder").await["connected"] == 1).then_some(()),
    )
    .await;
}

/// Web Push leaves alone a member whose web app is open on another replica than the one that
/// handled the message, and notifies them again once it is closed.
#[tokio::test]
async fn web_push_skips_a_member_whose_app_is_open_on_another_replica() {
    use crate::web_push::{PushService, session, subscribe};
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas_with(&db, 2, |c| c.push_private_network = true).await;
    let mut push = PushService::start().await;
    let sub = push.subscription(201).await;
    subscribe(&rs[0], "builder", &sub).await;
    // Builder's web app is open on the second replica (a browser session's stream), which the
    // first one's roster counts.
    let cookie = session(&rs[1], "builder");
    let browser = rs[1].browser_sse("builder", &cookie).await;
    assert_eq!(presence_of(&rs[0], "builder").await["connected"], 1);
    let seen = rs[0]
        .push(
            "director",
            json!({"to": "builder", "body": "seen in the app"}),
        )
        .await;
    // The app closes; its end reaches the first replica's roster, and the next direct
    // message is a notification. Notifications go out in commit order, so the first one
    // the push service gets shows whether the earlier message was sent too.
    drop(browser);
    crate::common::wait_until(
        "the closed app to leave the first replica's roster",
        Duration::from_secs(5),
        async || (presence_of(&rs[0], "builder").await["connected"] == 0).then_some(()),
    )
    .await;
    let unseen = rs[0]
        .push(
            "director",
            json!({"to": "builder", "body": "nobody is looking"}),
        )
        .await;
    let got = push.next().await;
    assert_eq!(
        got["payload"]["messageId"], unseen["id"],
        "the message {} reached the app and was pushed too: {got}",
        seen["id"]
    );
}

#[tokio::test]
async fn the_streams_of_a_replica_killed_with_sigkill_leave_the_roster_within_15_s() {
    use crate::common::served::{serve, token};
    let Some(db) = TestDb::create().await else {
        return;
    };
    let target = std::path::Path::new(&db.url);
    let mut a = serve(
        target,
        &[
            "--team-name",
            "replicated",
            "--directive",
            "Stay up.",
            "--member",
            "director:lead:admin",
            "--member",
            "builder:engineer",
        ],
    );
    let b = serve(target, &[]);
    let (director, builder) = (
        token(&a, "director").to_owned(),
        token(&a, "builder").to_owned(),
    );
    let http = reqwest::Client::new();
    let stream = http
        .get(format!("{}/subscribe?name=builder", a.url))
        .bearer_auth(&builder)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let connected = async || -> u64 {
        let roster: Value = http
            .get(format!("{}/roster", b.url))
            .bearer_auth(&director)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        roster["connected"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "builder")
            .unwrap()["connected"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(connected().await, 1, "the other replica sees the stream");
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let killed = Instant::now();
    crate::common::wait_until(
        "the dead replica's stream to leave the roster",
        Duration::from_secs(16),
        async || (connected().await == 0).then_some(()),
    )
    .await;
    eprintln!("gone {:?} after the kill", killed.elapsed());
    drop(stream);
}

#[tokio::test]
async fn the_rate_limit_holds_across_replicas() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas_with(&db, 3, |cfg| {
        cfg.push_rate = Some(Rate {
            per_second: 1,
            burst: 5,
        });
    })
    .await;
    let started = Instant::now();
    let (mut ok, mut refused) = (0, 0);
    for i in 0..15 {
        let r = rs[i % 3]
            .post(
                "/push",
                "director",
                json!({"to": "builder", "body": format!("n{i}")}),
            )
            .await;
        match r.status {
            200 => ok += 1,
            429 => {
                refused += 1;
                assert_eq!(r.json["code"], "rate_limited");
                assert!(r.json["retryAfter"].as_u64().unwrap() >= 1);
            }
            other => panic!("unexpected {other}: {}", r.text),
        }
    }
    // One token a second refills while the loop runs.
    let refilled = started.elapsed().as_secs();
    assert!(
        ok >= 5 && ok <= 5 + refilled + 1,
        "{ok} pushes accepted across three replicas in {refilled} s (burst 5, 1/s)"
    );
    assert_eq!(ok + refused, 15);
    // Other members have their own bucket.
    assert_eq!(
        rs[2]
            .post("/push", "builder", json!({"to": "director", "body": "hi"}))
            .await
            .status,
        200
    );
}

/// Asks for a live stream of `builder` (the body is left unread).
async fn open(b: &TestBroker) -> reqwest::Response {
    b.http
        .get(format!("{}/subscribe?name=builder", b.url))
        .bearer_auth(b.token("builder"))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_subscription_cap_counts_every_replica() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas_with(&db, 3, |cfg| cfg.max_subscriptions_per_member = 2).await;
    let _a = rs[0].sse("builder", None).await;
    let _b = rs[1].sse("builder", None).await;
    let third = open(&rs[2]).await;
    assert_eq!(third.status(), 429);
    let v: Value = third.json().await.unwrap();
    assert_eq!(v["code"], "too_many_subscriptions");
    drop(_a);
    crate::common::wait_until(
        "a stream to end and free a place on another replica",
        Duration::from_secs(5),
        async || open(&rs[2]).await.status().is_success().then_some(()),
    )
    .await;
}

fn secret_of(member: &str) -> String {
    let mut bytes = [7u8; 20];
    for (i, b) in member.bytes().enumerate().take(20) {
        bytes[i] = b;
    }
    totp::new_secret(&bytes)
}

fn code_now(secret: &str) -> String {
    let key = totp::base32_decode(secret).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    totp::code_at(&key, now, totp::DIGITS)
}

async fn sign_in(b: &TestBroker, member: &str, code: &str) -> reqwest::Response {
    b.http
        .post(format!("{}/session/totp", b.url))
        .json(&json!({"member": member, "code": code}))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_sign_in_limiter_holds_across_replicas() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas_with(&db, 3, |_| {}).await;
    let secret = secret_of("builder");
    rs[0]
        .broker
        .state
        .store
        .tx(|c| sessions::totp_set(c, "builder", &secret))
        .unwrap();
    let right = code_now(&secret);
    let wrong = format!(
        "{:06}",
        (right.parse::<u32>().unwrap() + 500_000) % 1_000_000
    );
    // Five wrong codes, spread over the replicas, lock the member (and the address) everywhere.
    for i in 0..5 {
        assert_eq!(sign_in(&rs[i % 3], "builder", &wrong).await.status(), 401);
    }
    for r in &rs {
        let locked = sign_in(r, "builder", &right).await;
        assert_eq!(
            locked.status(),
            429,
            "the right code is refused while locked"
        );
        assert!(locked.headers().contains_key("retry-after"));
    }
}

#[tokio::test]
async fn a_session_made_on_one_replica_works_on_another_until_logout() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas_with(&db, 2, |_| {}).await;
    let secret = secret_of("director");
    rs[0]
        .broker
        .state
        .store
        .tx(|c| sessions::totp_set(c, "director", &secret))
        .unwrap();
    let r = sign_in(&rs[0], "director", &code_now(&secret)).await;
    assert_eq!(r.status(), 200);
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let session = |b: &TestBroker| {
        b.http
            .get(format!("{}/session", b.url))
            .header("cookie", cookie.clone())
            .send()
    };
    let on_b = session(&rs[1]).await.unwrap();
    assert_eq!(on_b.status(), 200);
    let v: Value = on_b.json().await.unwrap();
    assert_eq!(v["member"], "director");
    let out = rs[1]
        .http
        .post(format!("{}/session/logout", rs[1].url))
        .header("cookie", cookie.clone())
        .header("origin", rs[1].url.clone())
        .send()
        .await
        .unwrap();
    assert!(out.status().is_success(), "{}", out.status());
    crate::common::wait_until(
        "the session logged out on one replica to be refused by the other",
        Duration::from_secs(10),
        async || (session(&rs[0]).await.unwrap().status() == 401).then_some(()),
    )
    .await;
}

#[tokio::test]
async fn a_token_rotated_on_one_replica_closes_its_streams_on_another() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas_with(&db, 2, |_| {}).await;
    let mut stream = rs[0].sse("builder", None).await;
    let rotated = rs[1]
        .post("/members/builder/rotate-token", "director", json!({}))
        .await;
    assert_eq!(rotated.status, 200, "{}", rotated.text);
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while stream.next_block().await.is_some() {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the revoked token's stream on the other replica stays open"
    );
}

#[tokio::test]
async fn an_enrollment_started_on_one_replica_is_approved_on_another_and_collected_on_a_third() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas_with(&db, 3, |_| {}).await;
    let started: Value = rs[0]
        .http
        .post(format!("{}/enroll", rs[0].url))
        .json(&json!({"labelHint": "laptop"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let device = started["deviceCode"].as_str().unwrap().to_owned();
    let user_code = started["userCode"].as_str().unwrap().to_owned();
    let poll = async |b: &TestBroker| {
        let r = b
            .http
            .post(format!("{}/enroll/poll", b.url))
            .json(&json!({"deviceCode": device}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    let (status, pending) = poll(&rs[2]).await;
    assert_eq!(
        (status, pending["error"].as_str()),
        (400, Some("authorization_pending"))
    );
    // Polled again at once on another replica: too soon, the interval is shared too.
    let (status, soon) = poll(&rs[0]).await;
    assert_eq!((status, soon["error"].as_str()), (400, Some("slow_down")));
    let listed = rs[1].get("/enroll/pending", "director").await;
    assert_eq!(
        listed.json["enrollments"][0]["userCode"],
        user_code.as_str()
    );
    assert_eq!(listed.json["enrollments"][0]["labelHint"], "laptop");
    let approved = rs[1]
        .post(
            "/enroll/approve",
            "director",
            json!({"mode": "bind", "userCode": user_code, "memberName": "builder"}),
        )
        .await;
    assert_eq!(approved.status, 200, "{}", approved.text);
    let (status, got) = poll(&rs[2]).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["member"]["name"], "builder");
    // Collected once: every replica now calls the code expired, and the token works everywhere.
    for r in &rs {
        let (status, again) = poll(r).await;
        assert_eq!(
            (status, again["error"].as_str()),
            (400, Some("expired_token"))
        );
    }
    let token = got["token"].as_str().unwrap();
    for r in &rs {
        let me = r
            .http
            .get(format!("{}/briefing", r.url))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(me.status(), 200);
    }
}

#[tokio::test]
async fn the_objective_reminder_cools_down_across_replicas() {
    use crate::broker_activity::exchange_with;
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas_with(&db, 2, |_| {}).await;
    let made = rs[0]
        .post(
            "/objectives",
            "director",
            json!({"title": "Forgotten", "outcome": "done", "assignee": "builder"}),
        )
        .await;
    assert_eq!(made.status, 200, "{}", made.text);
    let mut builder = rs[0].sse("builder", None).await;
    for (i, r) in rs.iter().enumerate() {
        let up = r
            .post(
                "/members/builder/activity",
                "builder",
                json!({"events": [exchange_with(i as u64 + 1, &["hi", "there"], true)]}),
            )
            .await;
        assert_eq!(up.status, 201, "{}", up.text);
        if i == 0 {
            let m = builder.next_message().await;
            assert_eq!(m["title"], "objective context reminder");
        }
    }
    // The second replica knows the first one reminded: no second DM within the cool-down.
    builder.expect_silence(500).await;
}
