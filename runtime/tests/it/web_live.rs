//! The web app's views stay true to the broker while it changes under them (a real browser
//! against a real broker): read marks and the Inbox count, token lists after a rotation,
//! presence (pushed by the live stream) and member counts from the shared state, and recovery
//! after the connection drops.

use serde_json::json;

use crate::web_app::{api, open, signed_in};

/// The Inbox badge in the nav, and the number of rows the Inbox lists.
const INBOX_COUNTS: &str = "const b = [...document.querySelectorAll('#rail a.nav-item')].find(a => a.getAttribute('href') === '/inbox'); const n = b && b.querySelector('.badge'); return [n ? Number(n.textContent) : 0, document.querySelectorAll('.page.inbox ul.items > li').length]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objective_discussion_counts_as_read_and_the_inbox_badge_matches_its_list() {
    let Some((b, br, _)) = signed_in("director", "/inbox").await else {
        return;
    };
    // An objective the director originated, assigned to the builder, discussed by the
    // builder; and a DM from the builder.
    let o = api(
        &b,
        "POST",
        "/objectives",
        Some(json!({"title": "Read marks", "outcome": "they hold", "assignee": "builder"})),
    )
    .await;
    let id = o["id"].as_str().unwrap().to_owned();
    let r = b
        .post(
            &format!("/objectives/{id}/discuss"),
            "builder",
            json!({"body": "a question about the outcome"}),
        )
        .await;
    assert!(r.status < 300, "{} {}", r.status, r.json);
    let r = b
        .post(
            "/push",
            "builder",
            json!({"to": "director", "body": "hello director"}),
        )
        .await;
    assert!(r.status < 300, "{} {}", r.status, r.json);
    let counts = br
        .wait_until(
            &format!("const c = (() => {{ {INBOX_COUNTS} }})(); return c[1] >= 2 && c"),
            15,
            "both unread threads in the Inbox",
        )
        .await;
    assert_eq!(counts[0], counts[1], "badge and list disagree: {counts}");
    assert!(
        br.script(
            "return document.querySelector('.page.inbox').innerText.includes('Read marks')",
            json!([])
        )
        .await
            == json!(true)
    );

    // Opening the objective reads its discussion.
    br.click_on(
        &format!(".page.inbox a[href='/objectives/{id}']"),
        10,
        "the objective's Inbox row",
    )
    .await;
    br.wait_for(".objective-detail", 10, "the objective").await;
    br.wait_until(
        "return document.querySelector('.discussion').innerText.includes('a question')",
        10,
        "the discussion",
    )
    .await;
    br.click_on("#rail a[href='/inbox']", 10, "the Inbox link")
        .await;
    let counts = br
        .wait_until(
            &format!(
                "if (!document.querySelector('.page.inbox')) return false; \
                 const c = (() => {{ {INBOX_COUNTS} }})(); \
                 return !document.querySelector('.page.inbox').innerText.includes('a question') && c"
            ),
            10,
            "the objective thread read",
        )
        .await;
    assert_eq!(counts[0], counts[1], "badge and list disagree: {counts}");
    // The DM is still unread, and survives a reload as the only thread item.
    open(&br, &b, "/inbox").await;
    let counts = br
        .wait_until(
            &format!("const c = (() => {{ {INBOX_COUNTS} }})(); return c[1] >= 1 && c"),
            10,
            "the Inbox after a reload",
        )
        .await;
    assert_eq!(counts[0], counts[1], "badge and list disagree: {counts}");
    let text = br
        .script(
            "return document.querySelector('.page.inbox').innerText",
            json!([]),
        )
        .await;
    let text = text.as_str().unwrap();
    assert!(text.contains("hello director"), "{text}");
    assert!(!text.contains("a question"), "{text}");
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_tokens_redraws_the_token_list() {
    let Some((b, br, _)) = signed_in("director", "/@builder").await else {
        return;
    };
    br.wait_for("ul.tokens li strong", 10, "the builder's tokens")
        .await;
    let before: Vec<String> = b.get("/members/builder/tokens", "director").await.json["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    br.script("window.confirm = () => true", json!([])).await;
    br.script(
        "[...document.querySelectorAll('.manage button')].find(b => b.textContent === 'Rotate token').click()",
        json!([]),
    )
    .await;
    br.wait_for(
        ".banner-secret, .reveal code, code.secret",
        10,
        "the new token",
    )
    .await;
    // The list now shows the rotated token only, without a reload.
    br.wait_until(
        "const t = document.querySelector('ul.tokens').innerText; return t.includes('rotate') && !t.includes('bootstrap')",
        10,
        "the token list after the rotation",
    )
    .await;
    let after = b.get("/members/builder/tokens", "director").await.json["tokens"].clone();
    let rows = br
        .script(
            "return document.querySelectorAll('ul.tokens li button').length",
            json!([]),
        )
        .await;
    assert_eq!(rows, json!(after.as_array().unwrap().len()), "{after}");
    assert!(
        after
            .as_array()
            .unwrap()
            .iter()
            .all(|t| !before.contains(&t["id"].as_str().unwrap().to_owned())),
        "{after}"
    );
    // Revoking what the list shows works (no stale row).
    br.script(
        "document.querySelector('ul.tokens li button').click()",
        json!([]),
    )
    .await;
    br.wait_until(
        "return document.querySelector('ul.tokens').innerText.includes('No tokens.')",
        10,
        "the empty token list",
    )
    .await;
    assert!(
        br.find(".toast-error").await.is_none(),
        "revoking showed an error"
    );
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_and_member_counts_follow_the_shared_state() {
    let Some((b, br, _)) = signed_in("director", "/members").await else {
        return;
    };
    let state_of = |name: &str| {
        format!(
            "const row = [...document.querySelectorAll('table.members tbody tr')].find(r => r.innerText.includes('{name}')); return row ? row.lastElementChild.textContent : null"
        )
    };
    // The viewer's own stream counts: online without a reload.
    br.wait_until(
        &format!(
            "return ({}) === 'online'",
            format_args!("(() => {{ {} }})()", state_of("director"))
        ),
        15,
        "the viewer shown online",
    )
    .await;
    // The builder comes online while the page is open: the row follows.
    let stream = b.sse("builder", None).await;
    br.wait_until(
        &format!(
            "return ({}) === 'online'",
            format_args!("(() => {{ {} }})()", state_of("builder"))
        ),
        15,
        "the builder shown online",
    )
    .await;
    // With the roster poll idle (the page reports itself hidden, so the poll skips), a busy
    // report still shows: the live stream tells the page to re-read the roster.
    br.script(
        "Object.defineProperty(document, 'visibilityState', {get: () => 'hidden', configurable: true})",
        json!([]),
    )
    .await;
    let r = b
        .post("/presence/busy", "builder", json!({"busy": true}))
        .await;
    assert_eq!(r.status, 204, "{}", r.json);
    br.wait_until(
        &format!(
            "return ({}) === 'working'",
            format_args!("(() => {{ {} }})()", state_of("builder"))
        ),
        15,
        "the builder shown working",
    )
    .await;
    drop(stream);
    br.wait_until(
        &format!(
            "return ({}) === 'working'",
            format_args!("(() => {{ {} }})()", state_of("builder"))
        ),
        15,
        "the builder still working (busy outlives its stream)",
    )
    .await;
    let r = b
        .post("/presence/busy", "builder", json!({"busy": false}))
        .await;
    assert_eq!(r.status, 204, "{}", r.json);
    br.wait_until(
        &format!(
            "return ({}) === 'offline'",
            format_args!("(() => {{ {} }})()", state_of("builder"))
        ),
        15,
        "the builder shown offline",
    )
    .await;
    br.script("delete document.visibilityState", json!([]))
        .await;

    // A channel's member count follows a member added from its settings.
    api(&b, "POST", "/channels", Some(json!({"slug": "ops"}))).await;
    open(&br, &b, "/c/ops").await;
    br.wait_until(
        "const c = document.querySelector('.member-count'); return c && c.textContent === '1 member'",
        10,
        "one member",
    )
    .await;
    br.click_on(".thread-head button.icon", 10, "the settings")
        .await;
    br.wait_for(".settings select", 10, "the add select").await;
    br.script(
        "const s = document.querySelector('.settings select'); s.value = 'builder'; s.dispatchEvent(new Event('change'))",
        json!([]),
    )
    .await;
    br.wait_until(
        "return document.querySelector('.member-count').textContent === '2 members'",
        10,
        "two members",
    )
    .await;
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_that_failed_offline_renders_again_and_presence_greys_out() {
    let Some((b, br, _)) = signed_in("director", "/").await else {
        return;
    };
    br.wait_for(".home .roster .dot.on", 15, "the viewer online")
        .await;
    let o = api(
        &b,
        "POST",
        "/objectives",
        Some(json!({"title": "Offline", "outcome": "comes back", "assignee": "builder"})),
    )
    .await;
    let id = o["id"].as_str().unwrap().to_owned();
    // The network goes away and the live stream with it.
    br.set_offline(true).await;
    b.broker
        .state
        .hub
        .close_member("director", ac7_runtime::broker::hub::Closed::Shutdown);
    br.wait_until(
        "return document.body.classList.contains('disconnected')",
        20,
        "the disconnected state",
    )
    .await;
    // Presence is greyed: no dot is drawn as online while the stream is down.
    let shown = br
        .script(
            "const d = document.querySelector('.home .roster .dot.on'); return d ? getComputedStyle(d).backgroundColor : null",
            json!([]),
        )
        .await;
    assert_eq!(
        shown,
        json!("rgba(0, 0, 0, 0)"),
        "an online dot while disconnected"
    );
    br.script(
        &format!("history.pushState(null, '', '/objectives/{id}'); dispatchEvent(new PopStateEvent('popstate'))"),
        json!([]),
    )
    .await;
    br.wait_for(".error-box", 15, "the failed view").await;
    br.set_offline(false).await;
    br.wait_for(
        ".objective-detail",
        40,
        "the view rendered again after the reconnection",
    )
    .await;
    br.wait_until(
        "return !document.body.classList.contains('disconnected')",
        10,
        "connected again",
    )
    .await;
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_show_inline_formatting_without_html_and_lifecycle_events_as_compact_rows() {
    let Some((b, br, _)) = signed_in("director", "/dm/builder").await else {
        return;
    };
    let body = "run `<b>make</b> **x**` then **ship _it_** *now*: [the docs](https://example.com/docs) \
                or https://example.com/raw. <img src=x onerror=\"window.__owned=1\"> [bad](javascript:alert(1))";
    let r = b
        .post("/push", "builder", json!({"to": "director", "body": body}))
        .await;
    assert!(r.status < 300, "{} {}", r.status, r.json);
    let shape = br
        .wait_until(
            "const b = [...document.querySelectorAll('.transcript .body')].pop(); \
             if (!b || !b.querySelector('code')) return false; \
             return { code: [...b.querySelectorAll('code')].map(c => c.textContent), \
                      strong: [...b.querySelectorAll('strong')].map(c => c.textContent), \
                      em: [...b.querySelectorAll('em')].map(c => c.textContent), \
                      links: [...b.querySelectorAll('a')].map(a => [a.textContent, a.getAttribute('href')]), \
                      elements: b.querySelectorAll('img, b, script').length, owned: window.__owned === 1, \
                      text: b.textContent }",
            15,
            "the formatted message",
        )
        .await;
    assert_eq!(shape["code"], json!(["<b>make</b> **x**"]), "{shape}");
    assert_eq!(shape["strong"], json!(["ship it"]), "{shape}");
    assert_eq!(shape["em"], json!(["it", "now"]), "{shape}");
    assert_eq!(
        shape["links"],
        json!([
            ["the docs", "https://example.com/docs"],
            ["https://example.com/raw", "https://example.com/raw"]
        ]),
        "{shape}"
    );
    assert_eq!(shape["elements"], json!(0), "{shape}");
    assert_eq!(shape["owned"], json!(false), "{shape}");
    let text = shape["text"].as_str().unwrap();
    assert!(
        text.contains("<img src=x onerror=\"window.__owned=1\">")
            && text.contains("[bad](javascript:alert(1))"),
        "{text}"
    );

    // An objective's lifecycle events are compact rows in its discussion.
    let o = api(
        &b,
        "POST",
        "/objectives",
        Some(json!({"title": "Compact", "outcome": "rows", "assignee": "builder"})),
    )
    .await;
    let id = o["id"].as_str().unwrap().to_owned();
    let r = b
        .call(
            "PATCH",
            &format!("/objectives/{id}"),
            "builder",
            Some(json!({"status": "blocked", "blockReason": "waiting   for   keys"})),
        )
        .await;
    assert!(r.status < 300, "{} {}", r.status, r.json);
    open(&br, &b, &format!("/objectives/{id}")).await;
    let rows = br
        .wait_until(
            "const rows = [...document.querySelectorAll('.discussion li.lifecycle')]; \
             return rows.some(r => r.dataset.event === 'blocked') && rows.map(r => [r.dataset.event, r.textContent])",
            15,
            "the lifecycle rows",
        )
        .await;
    let rows = rows.as_array().unwrap();
    let blocked = rows
        .iter()
        .find(|r| r[0] == "blocked")
        .and_then(|r| r[1].as_str())
        .unwrap();
    assert!(blocked.contains("builder blocked"), "{blocked}");
    assert!(blocked.contains("waiting"), "{blocked}");
    assert!(!blocked.contains("[objective"), "{blocked}");
    assert!(
        !blocked.contains(":   "),
        "aligned columns left in: {blocked}"
    );
    assert_eq!(
        br.script(
            "return document.querySelectorAll('.discussion li.msg:not(.lifecycle)').length",
            json!([])
        )
        .await,
        json!(0)
    );
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_level_resets_after_a_send_and_a_toast_opens_its_thread() {
    let Some((b, br, _)) = signed_in("director", "/c/general").await else {
        return;
    };
    br.wait_for(".composer textarea", 10, "the composer").await;
    br.script(
        "document.querySelector('.composer select.level').value = 'warning'",
        json!([]),
    )
    .await;
    br.find(".composer textarea")
        .await
        .unwrap()
        .send_keys("careful now\n")
        .await;
    br.wait_until(
        "return [...document.querySelectorAll('.transcript .msg:not(.pending) .body')].some(e => e.textContent === 'careful now')",
        10,
        "the sent message",
    )
    .await;
    let sent = b.get("/history?limit=1", "director").await.json;
    assert_eq!(sent["messages"][0]["level"], "warning", "{sent}");
    assert_eq!(
        br.script(
            "return document.querySelector('.composer select.level').value",
            json!([])
        )
        .await,
        json!("info")
    );
    // A DM arriving while another thread is on screen raises a toast whose button opens it.
    let r = b
        .post(
            "/push",
            "builder",
            json!({"to": "director", "body": "look at this"}),
        )
        .await;
    assert!(r.status < 300, "{} {}", r.status, r.json);
    br.wait_until(
        "const b = [...document.querySelectorAll('.toast button')].find(b => b.textContent === 'View'); if (b) b.click(); return !!b",
        10,
        "the toast's View button",
    )
    .await;
    br.wait_until(
        "return location.pathname === '/dm/builder' && [...document.querySelectorAll('.transcript .body')].some(e => e.textContent === 'look at this')",
        10,
        "the DM opened from the toast",
    )
    .await;
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_sign_in_says_how_long_to_wait() {
    let Some((chrome, driver)) = crate::common::webdriver::chromium() else {
        return;
    };
    let b = crate::broker_support::start_broker().await;
    let br = crate::common::webdriver::Browser::start(&chrome, &driver).await;
    br.goto(&format!("{}/", b.url)).await;
    let field = br.wait_for("#totp-code", 15, "the sign-in page").await;
    br.script("document.querySelector('details').open = true", json!([]))
        .await;
    br.find("input[name=member]")
        .await
        .unwrap()
        .send_keys("builder")
        .await;
    // Wrong codes until the member is locked (the page clears the field after each).
    for _ in 0..6 {
        field.send_keys("000000").await;
        br.wait_until(
            "return document.querySelector('#totp-code').value === '' && document.querySelector('.signin .error').textContent !== ''",
            10,
            "the refusal",
        )
        .await;
    }
    let text = br
        .script(
            "return document.querySelector('.signin .error').textContent",
            json!([]),
        )
        .await;
    let text = text.as_str().unwrap();
    assert!(
        text.starts_with("Too many attempts. Try again in ") && text.ends_with("minutes."),
        "{text}"
    );
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_thread_renders_in_windows() {
    let Some((b, br, _)) = signed_in("director", "/").await else {
        return;
    };
    for n in 0..260 {
        let r = b
            .post(
                "/push",
                "builder",
                json!({"to": "director", "body": format!("line {n}")}),
            )
            .await;
        assert!(r.status < 300, "{} {}", r.status, r.json);
    }
    open(&br, &b, "/dm/builder").await;
    let rows = "return document.querySelectorAll('.transcript li.msg').length";
    br.wait_until(
        "return [...document.querySelectorAll('.transcript .body')].some(e => e.textContent === 'line 259')",
        15,
        "the newest line",
    )
    .await;
    // The newest window only; the first row of a window shows its sender.
    assert_eq!(br.script(rows, json!([])).await, json!(150));
    assert_eq!(
        br.script(
            "return document.querySelector('.transcript li.msg .from') === document.querySelector('.transcript li.msg').querySelector('.from')",
            json!([])
        )
        .await,
        json!(true)
    );
    // Load older widens the window over memory, then pages from the broker.
    let mut seen = vec![150];
    for _ in 0..3 {
        br.click_on("button.older", 10, "Load older").await;
        let before = *seen.last().unwrap();
        let now = br
            .wait_until(
                &format!("const n = document.querySelectorAll('.transcript li.msg').length; return n > {before} && n"),
                10,
                "more rows",
            )
            .await;
        seen.push(now.as_u64().unwrap());
    }
    assert_eq!(*seen.last().unwrap(), 260, "{seen:?}");
    assert!(
        br.script(
            "return [...document.querySelectorAll('.transcript .body')].some(e => e.textContent === 'line 0')",
            json!([])
        )
        .await
            == json!(true)
    );
    br.quit().await;
}
