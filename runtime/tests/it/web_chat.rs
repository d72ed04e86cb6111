//! The web app's chat, sign-in and members screens in a real browser (headless Chromium over
//! WebDriver, test-support/src/webdriver.rs) against a real broker: TOTP sign-in through the page,
//! a DM pushed by an agent appearing without a reload, a reply typed in the composer reaching
//! an agent's runner (`ac7 run` with the Python MCP SDK agent) as a channel notification,
//! message bodies shown as text, channels, member administration, and a reload on every route.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use crate::common;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::broker_support::{TestBroker, start_broker};
use crate::common::webdriver::{Browser, chromium};
use ac7_protocol::signin::totp;
use ac7_runtime::broker::sessions;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

const ENTER: &str = "\u{E007}";

/// Gives `member` a TOTP secret in the store (as a confirmed enrollment would); returns it.
fn enroll(b: &TestBroker, member: &str) -> String {
    let secret = totp::new_secret(&[7; 20]);
    b.broker
        .state
        .store
        .tx(|conn| sessions::totp_set(conn, member, &secret))
        .unwrap();
    secret
}

fn code_now(secret: &str) -> String {
    code_at(secret, 0)
}

/// The code of `secret` `steps` steps from now (the broker accepts ±1).
fn code_at(secret: &str, steps: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    totp::code_at(
        &totp::base32_decode(secret).unwrap(),
        now + steps * totp::PERIOD,
        totp::DIGITS,
    )
}

/// A broker and a browser signed in as `member` through the sign-in page, showing `path`.
async fn signed_in(member: &str, path: &str) -> Option<(TestBroker, Browser)> {
    let (chrome, driver) = chromium()?;
    let b = start_broker().await;
    let br = Browser::start(&chrome, &driver).await;
    let secret = enroll(&b, member);
    br.goto(&format!("{}{path}", b.url)).await;
    sign_in(&br, member, &secret).await;
    Some((b, br))
}

/// Types the current code into the sign-in page (the member's name too: codes of two members
/// may collide) and waits for the shell.
async fn sign_in(br: &Browser, member: &str, secret: &str) {
    sign_in_with(br, member, &code_now(secret)).await;
}

async fn sign_in_with(br: &Browser, member: &str, code: &str) {
    let field = br.wait_for("#totp-code", 15, "the sign-in page").await;
    br.script("document.querySelector('details').open = true", json!([]))
        .await;
    br.find("input[name=member]")
        .await
        .unwrap()
        .send_keys(member)
        .await;
    field.send_keys(code).await;
    br.wait_for("nav.rail", 15, "the app after signing in")
        .await;
}

async fn wait_body(br: &Browser, text: &str, what: &str) {
    br.wait_until(
        &format!(
            "return [...document.querySelectorAll('.transcript .msg .body')].some(e => e.textContent === {})",
            json!(text)
        ),
        15,
        what,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn totp_sign_in_session_and_sign_out() {
    let Some((chrome, driver)) = chromium() else {
        return;
    };
    let b = start_broker().await;
    let br = Browser::start(&chrome, &driver).await;
    let secret = enroll(&b, "director");

    // A deep URL without a session shows the sign-in page, and stays the URL.
    br.goto(&format!("{}/dm/builder", b.url)).await;
    br.wait_for("#totp-code", 15, "the sign-in page").await;
    let field = br.find("#totp-code").await.unwrap();
    assert_eq!(
        field.attr("autocomplete").await.as_deref(),
        Some("one-time-code")
    );
    br.screenshot("sign-in").await;

    // A wrong code is refused with the reason, and the field is cleared.
    field.send_keys(&wrong_code(&secret)).await;
    br.wait_until(
        "return document.querySelector('.signin .error').textContent.includes('not valid')",
        10,
        "the wrong code's error",
    )
    .await;
    assert_eq!(
        br.script(
            "return document.querySelector('#totp-code').value",
            json!([])
        )
        .await,
        ""
    );

    // The right one signs in and lands on the page asked for.
    sign_in(&br, "director", &secret).await;
    br.wait_for(".thread-head", 10, "the DM thread").await;
    assert!(br.url().await.ends_with("/dm/builder"));
    let who = br
        .script(
            "return document.querySelector('.rail .team').textContent",
            json!([]),
        )
        .await;
    assert!(who.as_str().unwrap().contains("director"), "{who}");

    // The session survives a reload.
    br.refresh().await;
    br.wait_for(".thread-head", 15, "the DM thread after a reload")
        .await;

    // Sign out: back to the sign-in page, and the old session is gone server-side.
    br.click_on(".nav-foot button", 10, "sign out").await;
    br.wait_for("#totp-code", 10, "the sign-in page after signing out")
        .await;
    br.goto(&format!("{}/inbox", b.url)).await;
    br.wait_for("#totp-code", 15, "the sign-in page on a new load")
        .await;
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_admin_sets_up_the_team_in_the_browser() {
    let Some((chrome, driver)) = chromium() else {
        return;
    };
    let b = start_broker().await;
    let setup = b
        .broker
        .setup_code
        .clone()
        .expect("a new team has a setup code");
    let br = Browser::start(&chrome, &driver).await;
    br.goto(&format!("{}/setup?code={setup}", b.url)).await;
    let secret = br
        .wait_for(".reveal.totp code.secret", 15, "the new secret")
        .await
        .text()
        .await;
    // The setup code is taken out of the address bar; the QR is an image from a Blob.
    assert!(br.url().await.ends_with("/setup"), "{}", br.url().await);
    let qr = br.find("img.qr").await.unwrap().attr("src").await.unwrap();
    assert!(qr.starts_with("blob:"), "{qr}");
    let uri = br
        .script(
            "return document.querySelector('.reveal.totp code.uri').textContent",
            json!([]),
        )
        .await;
    assert!(
        uri.as_str().unwrap().starts_with("otpauth://totp/"),
        "{uri}"
    );
    br.screenshot("setup").await;

    // A reload before the authenticator is set up shows the same secret again (nothing is
    // final until the first sign-in with it).
    br.refresh().await;
    let again = br
        .wait_for(".reveal.totp code.secret", 15, "the secret after a reload")
        .await
        .text()
        .await;
    assert_eq!(again.trim(), secret.trim());
    assert!(br.url().await.ends_with("/setup"), "{}", br.url().await);

    // Confirming a code signs the admin in.
    let field = br
        .find("form input[autocomplete=one-time-code]")
        .await
        .unwrap();
    field.send_keys(&code_now(secret.trim())).await;
    br.click_on("form button.primary", 10, "the form's button")
        .await;
    br.wait_until(
        "const a = [...document.querySelectorAll('a.button')].find(a => a.textContent.startsWith('Open the team')); return a && a.offsetParent !== null",
        10,
        "the signed-in notice",
    )
    .await;
    br.goto(&format!("{}/", b.url)).await;
    br.wait_for(".home .cards", 15, "the team home").await;
    // The code is single-use: the page now says the team is set up.
    br.goto(&format!("{}/setup?code={setup}", b.url)).await;
    br.wait_until(
        "return document.body.innerText.includes('already set up')",
        10,
        "the already-set-up page",
    )
    .await;
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reenrolling_totp_from_the_account_page() {
    let Some((b, br)) = signed_in("director", "/account").await else {
        return;
    };
    let old = enroll_secret_of(&b, "director");
    br.script(
        "[...document.querySelectorAll('button')].find(b => b.textContent === 'Enroll TOTP').click()",
        json!([]),
    )
    .await;
    let secret = br
        .wait_for(".enroll-totp code.secret", 10, "the new secret")
        .await
        .text()
        .await;
    let secret = secret.trim().to_owned();
    assert_ne!(secret, old);
    assert!(br.find(".enroll-totp img.qr").await.is_some(), "a QR code");
    // A wrong code is refused and the old secret still counts.
    confirm_with(&br, &wrong_code(&secret)).await;
    br.wait_until(
        "return document.querySelector('.enroll-totp .error').textContent.includes('not valid')",
        10,
        "the refusal",
    )
    .await;
    assert_eq!(enroll_secret_of(&b, "director"), old);
    confirm_with(&br, &code_now(&secret)).await;
    br.wait_until(
        "return document.body.innerText.includes('Authenticator enrolled for director')",
        10,
        "the confirmation",
    )
    .await;
    assert_eq!(enroll_secret_of(&b, "director"), secret);

    // Signing in again works with the new secret (the next step's code: this one is used up).
    br.click_on(".nav-foot button", 10, "sign out").await;
    sign_in_with(&br, "director", &code_at(&secret, 1)).await;
    br.quit().await;
}

/// A six-digit code that is not `secret`'s current one.
fn wrong_code(secret: &str) -> String {
    let good = code_now(secret);
    if good == "000000" { "111111" } else { "000000" }.to_owned()
}

/// Types `code` into the re-enrollment's confirmation form and submits it.
async fn confirm_with(br: &Browser, code: &str) {
    br.find(".enroll-totp input[autocomplete=one-time-code]")
        .await
        .unwrap()
        .send_keys(code)
        .await;
    br.click_on(".enroll-totp button.primary", 10, "confirm enrollment")
        .await;
}

/// `member`'s confirmed TOTP secret in the store.
fn enroll_secret_of(b: &TestBroker, member: &str) -> String {
    b.broker
        .state
        .store
        .with(|conn| {
            conn.query_row(
                "SELECT secret FROM member_totp WHERE member_name = ?1",
                [member],
                |r| r.get::<_, String>(0),
            )
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_pushed_by_an_agent_appears_without_reload_as_text() {
    let Some((b, br)) = signed_in("director", "/dm/builder").await else {
        return;
    };
    br.wait_for(".thread-head", 10, "the DM thread").await;
    // Wait until the live stream is open (the roster counts the browser as connected).
    wait_connected(&b, "director").await;
    br.script("window.__noReload = 1", json!([])).await;

    let body = "<img src=x onerror=\"document.title='owned'\"> see https://example.com/a and javascript:alert(1)";
    b.push("builder", json!({"to": "director", "body": body}))
        .await;
    wait_body(&br, body, "the pushed DM in the open thread").await;
    assert_eq!(
        br.script("return window.__noReload", json!([])).await,
        json!(1),
        "the page was not reloaded"
    );
    // Shown as text: no element from the body, only the http(s) URL became a link.
    let shape = br
        .script(
            "const b = [...document.querySelectorAll('.msg .body')].pop();
             return {imgs: b.querySelectorAll('img').length,
                     links: [...b.querySelectorAll('a')].map(a => a.getAttribute('href')),
                     title: document.title}",
            json!([]),
        )
        .await;
    assert_eq!(shape["imgs"], 0, "{shape}");
    assert_eq!(shape["links"], json!(["https://example.com/a"]), "{shape}");
    assert_ne!(shape["title"], "owned");

    // A DM to another thread counts as unread in the rail and the inbox.
    b.push(
        "reviewer",
        json!({"to": "director", "body": "ping from reviewer"}),
    )
    .await;
    br.wait_until(
        "const a = document.querySelector('.rail a[href=\"/dm/reviewer\"] .badge'); return a && a.textContent === '1'",
        10,
        "the unread badge",
    )
    .await;
    br.click_on("a.nav-item[href='/inbox']", 10, "the inbox link")
        .await;
    br.wait_until(
        "return document.querySelector('.inbox') && document.querySelector('.inbox').textContent.includes('ping from reviewer')",
        10,
        "the inbox item",
    )
    .await;
    br.screenshot("inbox").await;
    br.quit().await;
}

/// Waits until `member` has a live stream open (the browser's EventSource).
async fn wait_connected(b: &TestBroker, member: &str) {
    for _ in 0..200 {
        let r = b.get("/roster", "builder").await;
        let n = r.json["connected"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == member)
            .map_or(0, |p| p["connected"].as_u64().unwrap_or(0));
        if n > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{member}'s browser never opened its live stream");
}

/// `ac7 run` as `member` with the Python MCP SDK agent waiting for `bodies` (the runner's
/// `messages` scenario, tests/python/runner_agent.py).
fn runner(b: &TestBroker, member: &str, dir: &Path, bodies: &[&str]) -> Child {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/runner_agent.py");
    Command::new(env!("CARGO_BIN_EXE_ac7"))
        .args(["run", "--url", &b.url, "--socket"])
        .arg(dir.join("r.sock"))
        .arg("--")
        .arg(common::python())
        .arg(script)
        .arg("messages")
        .current_dir(dir)
        .env("AC7_TOKEN", b.token(member))
        .env("AC7_TEST_WORK", dir)
        .env("AC7_TEST_EXPECT", bodies.join(","))
        .env("AC7_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_from_the_composer_reaches_the_agents_runner() {
    let Some((b, br)) = signed_in("director", "/dm/builder").await else {
        return;
    };
    let dir = common::tempdir();
    let reply = "please rebase on main";
    let mut child = runner(&b, "builder", dir.path(), &[reply]);
    common::within(60, "the agent to listen", async {
        while !dir.path().join("ready").exists() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;

    let ta = br.wait_for(".composer textarea", 10, "the composer").await;
    ta.send_keys(reply).await;
    ta.send_keys(ENTER).await;
    wait_body(&br, reply, "the sent reply in the thread").await;
    br.screenshot("dm").await;

    let status = common::within(60, "the runner to exit", child.wait())
        .await
        .unwrap();
    assert!(status.success(), "runner exited with {status}");
    let out: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("result.json")).unwrap())
            .unwrap();
    assert_eq!(out["received"], json!([reply]), "{out}");
    // Stored once, as a DM from director to builder.
    let h = b.get("/history?with=director", "builder").await;
    let sent: Vec<&Value> = h.json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["body"] == reply)
        .collect();
    assert_eq!(sent.len(), 1, "{}", h.text);
    assert_eq!(sent[0]["from"], "director");
    assert_eq!(sent[0]["to"], "builder");
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_create_post_and_mentions() {
    let Some((b, br)) = signed_in("director", "/channels/new").await else {
        return;
    };
    let name = br.wait_for("input[name=slug]", 10, "the create form").await;
    // Normalised while typing.
    name.send_keys("Front End").await;
    name.send_keys(ENTER).await;
    br.wait_until(
        "return location.pathname === '/c/front-end' && !!document.querySelector('.composer textarea')",
        10,
        "the new channel",
    )
    .await;
    // '@' completes a teammate's name.
    let ta = br.find(".composer textarea").await.unwrap();
    ta.send_keys("hello @rev").await;
    br.wait_until(
        "const l = document.querySelector('.mentions'); return l && !l.hidden && l.textContent === '@reviewer'",
        10,
        "the mention completion",
    )
    .await;
    ta.send_keys("\u{E004}").await; // Tab picks it
    ta.send_keys("welcome").await;
    ta.send_keys(ENTER).await;
    wait_body(&br, "hello @reviewer welcome", "the channel post").await;
    br.screenshot("channel").await;

    let ch = b.get("/channels/front-end", "director").await;
    let id = ch.json["channel"]["id"].as_str().unwrap().to_owned();
    let h = b.get("/history?channel=front-end", "director").await;
    assert_eq!(h.json["messages"][0]["body"], "hello @reviewer welcome");
    assert_eq!(
        h.json["messages"][0]["data"]["thread"],
        format!("chan:{id}")
    );

    // Someone else's post there arrives live.
    b.post(
        "/channels/front-end/members",
        "director",
        json!({"member": "builder"}),
    )
    .await;
    b.push(
        "builder",
        json!({"body": "on it", "data": {"thread": format!("chan:{id}")}}),
    )
    .await;
    wait_body(&br, "on it", "builder's channel post").await;
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_creates_a_member_and_sees_its_token_once() {
    let Some((b, br)) = signed_in("director", "/members").await else {
        return;
    };
    br.wait_for("table.members", 10, "the members list").await;
    br.click_on("button.primary", 10, "the primary button")
        .await;
    br.wait_for("input[aria-label=Name]", 10, "the new-member form")
        .await
        .send_keys("tester")
        .await;
    br.find("input[aria-label='Role description']")
        .await
        .unwrap()
        .send_keys("Tests things.")
        .await;
    // The operator preset ticks its leaves.
    br.script(
        "[...document.querySelectorAll('.presets button')].find(b => b.textContent === 'operator').click()",
        json!([]),
    )
    .await;
    br.click_on("form.card button.primary", 10, "the card's button")
        .await;
    let token = br
        .wait_for(".reveal code.secret", 10, "the token banner")
        .await
        .text()
        .await;
    br.screenshot("members").await;
    // The banner stays (ac7 hid it at once) and the token works as a bearer.
    br.wait_until(
        "return [...document.querySelectorAll('table.members td')].some(t => t.textContent === 'tester')",
        10,
        "the new row",
    )
    .await;
    assert!(br.find(".reveal code.secret").await.is_some());
    let r = b
        .http
        .get(format!("{}/briefing", b.url))
        .bearer_auth(token.trim())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let brief: Value = r.json().await.unwrap();
    assert_eq!(brief["name"], "tester");
    assert_eq!(
        brief["permissions"],
        json!([
            "objectives.create",
            "objectives.cancel",
            "objectives.reassign"
        ])
    );
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_chat_route_reloads_into_the_app() {
    let Some((b, br)) = signed_in("director", "/").await else {
        return;
    };
    for (path, selector) in [
        ("/", ".home .cards"),
        ("/inbox", ".inbox"),
        ("/channels", ".page h1"),
        ("/channels/new", "input[name=slug]"),
        ("/c/general", ".composer textarea"),
        ("/dm/builder", ".composer textarea"),
        ("/members", "table.members"),
        ("/@builder", ".profile .manage"),
        ("/account", "dl.keys"),
        ("/enroll", "input[aria-label='User code']"),
    ] {
        br.goto(&format!("{}{path}", b.url)).await;
        br.wait_for(selector, 15, &format!("{path} after a full load"))
            .await;
        assert!(br.url().await.ends_with(path), "{path}");
    }
    br.screenshot("home").await;
    br.quit().await;
}

/// An unauthenticated JSON POST (as `ac7 connect` makes); returns `(status, body)`.
async fn anonymous_post(b: &TestBroker, path: &str, body: Value) -> (u16, Value) {
    let r = b
        .raw("POST", path, None, Some(serde_json::to_vec(&body).unwrap()))
        .await;
    (r.status, r.json)
}

/// Starts a device enrollment the way `ac7 connect` does; returns `(userCode, deviceCode)`.
async fn start_enrollment(b: &TestBroker, label: &str) -> (String, String) {
    let (status, r) = anonymous_post(b, "/enroll", json!({"labelHint": label})).await;
    assert_eq!(status, 200, "{r}");
    (
        r["userCode"].as_str().unwrap().to_owned(),
        r["deviceCode"].as_str().unwrap().to_owned(),
    )
}

async fn poll(b: &TestBroker, device: &str) -> (u16, Value) {
    anonymous_post(b, "/enroll/poll", json!({"deviceCode": device})).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_approves_and_rejects_devices_in_the_browser() {
    let Some((b, br)) = signed_in("director", "/").await else {
        return;
    };
    let (laptop, laptop_dc) = start_enrollment(&b, "laptop").await;
    let (phone, phone_dc) = start_enrollment(&b, "phone").await;

    // Both are listed on the members page; one is rejected there.
    br.goto(&format!("{}/members", b.url)).await;
    br.wait_until(
        &format!(
            "const p = document.querySelector('.pending'); return p && p.textContent.includes({}) && p.textContent.includes({})",
            json!(laptop),
            json!(phone)
        ),
        15,
        "the pending enrollments",
    )
    .await;
    br.screenshot("pending-enrollments").await;
    br.script(
        "window.confirm = () => true;
         const li = [...document.querySelectorAll('.pending li')].find(l => l.textContent.includes(arguments[0]));
         li.querySelector('button.danger').click()",
        json!([phone]),
    )
    .await;
    br.wait_until(
        &format!(
            "const p = document.querySelector('.pending'); return !p.textContent.includes({})",
            json!(phone)
        ),
        10,
        "the rejected enrollment to leave the list",
    )
    .await;
    let (status, body) = poll(&b, &phone_dc).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("access_denied"))
    );

    // The approval page: the code from the URL is looked up (and taken out of the address
    // bar); the device is bound to builder.
    br.goto(&format!("{}/enroll?code={laptop}", b.url)).await;
    br.wait_for("form.card select", 15, "the approval card")
        .await;
    assert!(br.url().await.ends_with("/enroll"), "{}", br.url().await);
    let card = br.find("form.card").await.unwrap().text().await;
    assert!(card.contains(&laptop) && card.contains("laptop"), "{card}");
    br.script(
        "document.querySelector('form.card select').value = 'builder'",
        json!([]),
    )
    .await;
    br.screenshot("enroll").await;
    br.click_on("form.card button.primary", 10, "the card's button")
        .await;
    br.wait_until(
        "return document.body.innerText.includes('is bound to builder')",
        10,
        "the approval notice",
    )
    .await;
    let (status, body) = poll(&b, &laptop_dc).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["member"]["name"], "builder");
    let token = body["token"].as_str().unwrap();
    let r = b
        .http
        .get(format!("{}/briefing", b.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // A code that is not pending says so.
    br.goto(&format!("{}/enroll?code=ABCD-EFGH", b.url)).await;
    br.wait_until(
        "return document.body.innerText.includes('No pending enrollment has that code')",
        10,
        "the not-found message",
    )
    .await;
    br.quit().await;
}
