//! Web Push: the broker's subscriptions and notifications, against a stand-in push service
//! (`runtime/tests/python/push_service.py`) that decrypts every notification with the
//! subscription's private key and checks the VAPID signature, as a browser's push service and
//! the browser would.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use ac7_runtime::broker::webpush;
use base64::Engine;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use crate::broker_support::{TestBroker, start_with};
use crate::common;

/// The stand-in push service.
pub(crate) struct PushService {
    url: String,
    out: Lines<BufReader<ChildStdout>>,
    http: reqwest::Client,
    _child: Child,
}

impl PushService {
    pub(crate) async fn start() -> PushService {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/push_service.py");
        let mut child = tokio::process::Command::new(common::python())
            .arg(script)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start the push service stand-in");
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = common::within(60, "the push service to start", out.next_line())
            .await
            .unwrap()
            .expect("push service output");
        let port = serde_json::from_str::<Value>(&first).unwrap()["port"]
            .as_u64()
            .unwrap();
        PushService {
            url: format!("http://127.0.0.1:{port}"),
            out,
            http: reqwest::Client::new(),
            _child: child,
        }
    }

    /// A browser's subscription (`{endpoint, keys}`); its pushes are answered with `status`.
    pub(crate) async fn subscription(&self, status: u16) -> Value {
        self.http
            .post(format!("{}/new", self.url))
            .json(&json!({"status": status}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The next push received: `{sub, ttl, urgency, encoding, vapid, payload}`; fails on a push
    /// that did not verify or decrypt.
    pub(crate) async fn next(&mut self) -> Value {
        let line = common::within(30, "a push notification", self.out.next_line())
            .await
            .unwrap()
            .expect("push service ended");
        let v: Value = serde_json::from_str(&line).unwrap();
        assert!(v.get("error").is_none(), "a push failed its checks: {v}");
        v
    }

    /// The next `n` pushes, by subscription number.
    async fn next_n(&mut self, n: usize) -> BTreeMap<u64, Value> {
        let mut got = BTreeMap::new();
        for _ in 0..n {
            let v = self.next().await;
            let sub = v["sub"].as_u64().unwrap();
            assert!(
                got.insert(sub, v).is_none(),
                "two pushes for subscription {sub}"
            );
        }
        got
    }
}

/// The stand-in's number for a subscription, from its endpoint.
fn number(sub: &Value) -> u64 {
    sub["endpoint"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// A broker that may send to the stand-in on 127.0.0.1 over plain http.
async fn broker_for_the_stand_in() -> TestBroker {
    start_with(|c| c.push_private_network = true).await
}

pub(crate) async fn subscribe(b: &TestBroker, who: &str, sub: &Value) -> Value {
    let r = b.post("/push/subscriptions", who, sub.clone()).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["endpoint"], sub["endpoint"]);
    assert!(r.json["id"].as_i64().unwrap() > 0, "{}", r.text);
    assert!(r.json["createdAt"].as_i64().unwrap() > 0, "{}", r.text);
    r.json
}

pub(crate) fn session(b: &TestBroker, member: &str) -> String {
    let now = ac7_runtime::broker::now_ms();
    b.broker
        .state
        .store
        .tx(|c| ac7_runtime::broker::sessions::session_create(c, member, None, now, 3_600_000))
        .unwrap()
        .0
}

fn subscriptions_of(b: &TestBroker, member: &str) -> Vec<String> {
    b.broker
        .state
        .store
        .view(|c| webpush::subscriptions_of(c, member))
        .unwrap()
        .into_iter()
        .map(|s| s.endpoint)
        .collect()
}

#[tokio::test]
async fn notifications_reach_whom_they_should_encrypted_and_signed() {
    let b = broker_for_the_stand_in().await;
    let mut svc = PushService::start().await;
    let key = b.raw("GET", "/push/vapid-public-key", None, None).await;
    assert_eq!(key.status, 200, "{}", key.text);
    let public = key.json["publicKey"].as_str().unwrap().to_owned();
    assert_eq!(public.len(), 87, "base64url of a 65-byte point: {public}");

    let builder = svc.subscription(201).await;
    let reviewer = svc.subscription(201).await;
    let director = svc.subscription(201).await;
    subscribe(&b, "builder", &builder).await;
    subscribe(&b, "reviewer", &reviewer).await;
    subscribe(&b, "director", &director).await;
    let (nb, nr) = (number(&builder), number(&reviewer));

    // A DM: its recipient only, always.
    let dm = b
        .push(
            "director",
            json!({"to": "builder", "title": "Deploy", "body": "hello builder"}),
        )
        .await;
    let got = svc.next().await;
    assert_eq!(got["sub"], nb);
    assert_eq!(
        got["payload"],
        json!({"title": "director — Deploy", "body": "hello builder", "tag": "ac7:dm:director",
               "url": "/dm/director", "severity": "normal", "messageId": dm["id"]})
    );
    assert_eq!(got["ttl"], "3600");
    assert_eq!(got["encoding"], "aes128gcm");
    assert_eq!(
        got["vapid"],
        json!({"sub": "mailto:admin@ac7.local", "k": public})
    );

    // An info broadcast notifies nobody; the warning after it everyone but its sender (the
    // dispatcher takes messages in commit order, so the info one was decided first).
    b.push("director", json!({"body": "plain news"})).await;
    let long = "é".repeat(200);
    let warning = b
        .push("director", json!({"body": long, "level": "warning"}))
        .await;
    let got = svc.next_n(2).await;
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![nb, nr]);
    for v in got.values() {
        let p = &v["payload"];
        assert_eq!(p["messageId"], warning["id"], "{v}");
        assert_eq!(
            (&p["title"], &p["tag"], &p["url"], &p["severity"]),
            (
                &json!("director → #team"),
                &json!("ac7:team"),
                &json!("/"),
                &json!("high")
            )
        );
        assert_eq!(p["body"].as_str().unwrap().chars().count(), 180);
        assert_eq!(v["urgency"], "high");
    }

    // An @mention at info: the one named (any case), not the sender nor the others.
    let mention = b
        .push("builder", json!({"body": "ping @Reviewer: the tests"}))
        .await;
    let got = svc.next().await;
    assert_eq!(got["sub"], nr);
    assert_eq!(got["payload"]["messageId"], mention["id"]);
    assert_eq!(got["payload"]["title"], "builder → #team");
    assert_eq!(got["payload"]["severity"], "normal");

    // A channel: its members only, with its own tag and URL.
    let r = b
        .post("/channels", "director", json!({"slug": "ops"}))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let chan = r.json["id"].as_str().unwrap().to_owned();
    let r = b
        .post(
            "/channels/ops/members",
            "director",
            json!({"member": "builder"}),
        )
        .await;
    assert!(r.status < 300, "{}", r.text);
    let post = b
        .push(
            "director",
            json!({"body": "ops alert", "level": "error", "data": {"thread": format!("chan:{chan}")}}),
        )
        .await;
    let got = svc.next().await;
    assert_eq!(got["sub"], nb, "reviewer is not in #ops: {got}");
    assert_eq!(
        got["payload"],
        json!({"title": "director → #ops", "body": "ops alert", "tag": format!("ac7:chan:{chan}"),
               "url": "/c/ops", "severity": "high", "messageId": post["id"]})
    );

    // Reviewer has the web app open (a browser session's live stream): no push; builder's
    // agent stream (a bearer token) does not count as the web app.
    let cookie = session(&b, "reviewer");
    let _browser = b.browser_sse("reviewer", &cookie).await;
    let _agent = b.sse("builder", None).await;
    b.push(
        "director",
        json!({"to": "reviewer", "body": "you are looking"}),
    )
    .await;
    let after = b
        .push(
            "director",
            json!({"to": "builder", "body": "your agent runs"}),
        )
        .await;
    let got = svc.next().await;
    assert_eq!(got["sub"], nb, "reviewer had the app open: {got}");
    assert_eq!(got["payload"]["messageId"], after["id"]);
}

#[tokio::test]
async fn subscriptions_upsert_go_away_and_refuse_bad_input() {
    let b = broker_for_the_stand_in().await;
    let mut svc = PushService::start().await;

    // The push service says the subscription is gone: it is deleted.
    let gone = svc.subscription(410).await;
    subscribe(&b, "builder", &gone).await;
    b.push(
        "director",
        json!({"to": "builder", "body": "anyone there?"}),
    )
    .await;
    assert_eq!(svc.next().await["sub"], number(&gone));
    common::wait_until(
        "the gone subscription to be deleted",
        Duration::from_secs(20),
        async || subscriptions_of(&b, "builder").is_empty(),
    )
    .await;

    // Posting an endpoint again re-binds it to the caller, same row.
    let sub = svc.subscription(201).await;
    let first = subscribe(&b, "builder", &sub).await;
    let again = subscribe(&b, "reviewer", &sub).await;
    assert_eq!(first["id"], again["id"]);
    assert_eq!(first["createdAt"], again["createdAt"]);
    assert!(subscriptions_of(&b, "builder").is_empty());
    assert_eq!(
        subscriptions_of(&b, "reviewer"),
        vec![sub["endpoint"].as_str().unwrap()]
    );
    // Now builder's DMs notify nobody, reviewer's do.
    b.push("director", json!({"to": "builder", "body": "not you"}))
        .await;
    let dm = b
        .push("director", json!({"to": "reviewer", "body": "you"}))
        .await;
    let got = svc.next().await;
    assert_eq!(got["payload"]["messageId"], dm["id"]);

    // Only the holder deletes a subscription.
    let id = again["id"].as_i64().unwrap();
    let path = format!("/push/subscriptions/{id}");
    let r = b.call("DELETE", &path, "builder", None).await;
    assert_eq!(r.status, 404, "{}", r.text);
    let r = b.call("DELETE", &path, "reviewer", None).await;
    assert_eq!(r.status, 204, "{}", r.text);
    let r = b.call("DELETE", &path, "reviewer", None).await;
    assert_eq!(r.status, 404, "{}", r.text);
    for bad in ["0", "-3", "abc"] {
        let r = b
            .call(
                "DELETE",
                &format!("/push/subscriptions/{bad}"),
                "reviewer",
                None,
            )
            .await;
        assert_eq!(
            (r.status, r.json["error"].as_str()),
            (400, Some("invalid subscription id")),
            "{bad}: {}",
            r.text
        );
    }

    // Bad keys and endpoints: 400 saying what is wrong; nothing stored.
    let fresh = svc.subscription(201).await;
    let with = |endpoint: &Value, p256dh: &Value, auth: &Value| json!({"endpoint": endpoint, "keys": {"p256dh": p256dh, "auth": auth}});
    let (e, p, a) = (
        &fresh["endpoint"],
        &fresh["keys"]["p256dh"],
        &fresh["keys"]["auth"],
    );
    // An uncompressed point of the right size that is not on the curve.
    let off_curve = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([4u8; 65]);
    let cases = [
        (with(e, &json!("not base64!"), a), "keys.p256dh"),
        (with(e, &json!("BAAA"), a), "keys.p256dh"),
        (with(e, &json!(off_curve), a), "not a point on the curve"),
        (with(e, p, &json!("AAAA")), "keys.auth"),
        (with(&json!("ftp://push.example/x"), p, a), "endpoint"),
        (with(&json!("not a url"), p, a), "endpoint"),
        (
            with(
                &json!(format!("https://p.example/{}", "x".repeat(2048))),
                p,
                a,
            ),
            "invalid push subscription payload",
        ),
        (json!({"endpoint": e}), "invalid push subscription payload"),
    ];
    for (body, says) in cases {
        let r = b.post("/push/subscriptions", "builder", body.clone()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text);
        assert!(
            r.json["error"].as_str().unwrap().contains(says),
            "{body}: {}",
            r.text
        );
    }
    assert!(subscriptions_of(&b, "builder").is_empty());
    let r = b
        .raw(
            "POST",
            "/push/subscriptions",
            None,
            Some(serde_json::to_vec(&fresh).unwrap()),
        )
        .await;
    assert_eq!(r.status, 401, "{}", r.text);

    // Removing a member removes their subscriptions.
    subscribe(&b, "reviewer", &fresh).await;
    let r = b
        .call("DELETE", "/members/reviewer", "director", None)
        .await;
    assert!(r.status < 300, "{}", r.text);
    assert!(subscriptions_of(&b, "reviewer").is_empty());
}

/// By default the broker sends only to push services on public addresses over https: a
/// member cannot make it send requests into its own network. An endpoint on plain http, on a
/// loopback, private or link-local address, or named `localhost`, is refused with a 400 that
/// names the flag; a subscription stored while the flag was on is not sent to once the broker
/// runs without it.
#[tokio::test]
async fn by_default_push_endpoints_must_be_public_https() {
    let mut svc = PushService::start().await;
    let sub = svc.subscription(201).await;
    let b = start_with(|_| {}).await;
    let with = |endpoint: &str| json!({"endpoint": endpoint, "keys": sub["keys"]});
    for (endpoint, says) in [
        (sub["endpoint"].as_str().unwrap(), "must be an https URL"),
        ("http://push.example/x", "must be an https URL"),
        ("https://127.0.0.1:9/x", "not on a public address"),
        ("https://[::1]/x", "not on a public address"),
        ("https://10.1.2.3/x", "not on a public address"),
        (
            "https://169.254.169.254/latest/meta-data",
            "not on a public address",
        ),
        ("https://2130706433/x", "not on a public address"),
        ("https://localhost:8443/x", "not on a public address"),
    ] {
        let r = b
            .post("/push/subscriptions", "builder", with(endpoint))
            .await;
        assert_eq!(r.status, 400, "{endpoint}: {}", r.text);
        let error = r.json["error"].as_str().unwrap();
        assert!(error.contains(says), "{endpoint}: {error}");
        assert!(
            error.contains("--push-private-network"),
            "{endpoint}: {error}"
        );
    }
    assert!(subscriptions_of(&b, "builder").is_empty());
    // A public push service's endpoint is taken.
    subscribe(
        &b,
        "builder",
        &with("https://fcm.googleapis.com/fcm/send/abc"),
    )
    .await;

    // The stand-in's subscription, stored as a broker with the flag would have: the DM that
    // would notify it sends nothing.
    let now = ac7_runtime::broker::now_ms();
    b.broker
        .state
        .store
        .tx(|c| {
            webpush::subscription_upsert(
                c,
                "reviewer",
                sub["endpoint"].as_str().unwrap(),
                sub["keys"]["p256dh"].as_str().unwrap(),
                sub["keys"]["auth"].as_str().unwrap(),
                now,
            )
        })
        .unwrap();
    b.push("director", json!({"to": "reviewer", "body": "stay inside"}))
        .await;
    let nothing = tokio::time::timeout(Duration::from_secs(2), svc.out.next_line()).await;
    assert!(
        nothing.is_err(),
        "the stand-in on 127.0.0.1 got a push: {nothing:?}"
    );
}

/// The installable app in a real browser: the manifest and its icons load, the service worker
/// registers at `/` and caches the shell, the app starts offline from it, and the account
/// page's Notifications switch subscribes (where the browser has a push service) or says
/// plainly why it cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_installs_starts_offline_and_offers_notifications() {
    let Some((b, br, _)) = crate::web_app::signed_in("director", "/account").await else {
        return;
    };
    let scope = br
        .script_async(
            "const done = arguments[0]; navigator.serviceWorker.ready.then(r => done(r.scope), e => done('failed: ' + e))",
            json!([]),
        )
        .await;
    assert_eq!(scope, json!(format!("{}/", b.url)));
    let manifest = br
        .script_async(
            "const done = arguments[0];
             (async () => {
               const href = document.querySelector('link[rel=manifest]').getAttribute('href');
               const m = await (await fetch(href)).json();
               const icons = [];
               for (const i of m.icons) {
                 const r = await fetch(i.src);
                 const bytes = new Uint8Array(await r.arrayBuffer());
                 icons.push([i.sizes, r.status, r.headers.get('content-type'), bytes[1] === 0x50 && bytes[2] === 0x4e]);
               }
               return {href, name: m.name, start: m.start_url, display: m.display, icons};
             })().then(done, e => done('failed: ' + e));",
            json!([]),
        )
        .await;
    assert_eq!(manifest["href"], "/manifest.webmanifest", "{manifest}");
    assert_eq!(
        (&manifest["name"], &manifest["start"], &manifest["display"]),
        (&json!("ac7"), &json!("/"), &json!("standalone")),
        "{manifest}"
    );
    assert_eq!(
        manifest["icons"],
        json!([
            ["192x192", 200, "image/png", true],
            ["512x512", 200, "image/png", true]
        ])
    );
    // The worker's cache holds the shell and every script and style.
    let cached = br
        .wait_until(
            "return window.__cached || (caches.keys().then(async ks => { const c = ks.find(k => k.startsWith('ac7-')); if (c) window.__cached = (await (await caches.open(c)).keys()).map(r => new URL(r.url).pathname.split('/').pop()); }), false)",
            20,
            "the service worker's cache",
        )
        .await;
    for name in [
        "shell.html",
        "app.css",
        "core.js",
        "app.js",
        "chat.js",
        "push.js",
    ] {
        assert!(
            cached.as_array().unwrap().iter().any(|c| c == name),
            "{name} not cached: {cached}"
        );
    }
    // Offline, a reload still starts the app (from the cached shell) and says the broker is
    // out of reach.
    br.wait_until(
        "return navigator.serviceWorker.controller !== null",
        20,
        "the service worker to control the page",
    )
    .await;
    br.set_offline(true).await;
    br.refresh().await;
    br.wait_until(
        "return document.body && document.body.innerText.includes('The broker did not answer')",
        20,
        "the app to start offline",
    )
    .await;
    br.set_offline(false).await;
    crate::web_app::open(&br, &b, "/account").await;

    // The Notifications switch.
    br.set_permission("notifications", "granted").await;
    br.click_on(
        "input[role=switch]:not([disabled])",
        15,
        "the Notifications switch",
    )
    .await;
    let said = br
        .wait_until(
            "const s = document.querySelector('[data-push-status]').textContent; return /^(On|Could not)/.test(s) && s",
            30,
            "the switch to subscribe or say why not",
        )
        .await;
    let said = said.as_str().unwrap().to_owned();
    let on = br
        .script(
            "return document.querySelector('input[role=switch]').checked",
            json!([]),
        )
        .await;
    let rows = b
        .broker
        .state
        .store
        .view(|c| webpush::subscriptions_of(c, "director"))
        .unwrap();
    if said.starts_with("On") {
        assert_eq!(on, json!(true));
        assert_eq!(rows.len(), 1, "{said}");
        // Off again: gone from the broker.
        br.click_on("input[role=switch]:not([disabled])", 15, "the switch")
            .await;
        br.wait_until(
            "return document.querySelector('[data-push-status]').textContent === 'Off.'",
            30,
            "the switch to turn off",
        )
        .await;
        assert!(subscriptions_of(&b, "director").is_empty());
    } else {
        // Headless Chromium without a push service refuses PushManager.subscribe: the page
        // says so, the switch stays off and the broker has nothing.
        eprintln!("headless Chromium refused the push subscription: {said}");
        assert!(
            said.starts_with("Could not turn notifications on: this browser could not subscribe"),
            "{said}"
        );
        assert_eq!(on, json!(false));
        assert!(rows.is_empty());
        let class = br
            .script(
                "return document.querySelector('[data-push-status]').className",
                json!([]),
            )
            .await;
        assert_eq!(class, "error");
    }
    br.quit().await;
}
