//! The web app in a real browser (headless Chromium over WebDriver, test-support/src/webdriver.rs)
//! against a real broker: objectives, files and their safe preview, reload on every route,
//! CSRF from another origin and session revocation. Screenshots of the main screens go to
//! `target/web-screenshots/`.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use crate::broker_support::{TestBroker, start_broker};
use crate::common::webdriver::{Browser, chromium};
use ac7_runtime::broker::sessions;
use serde_json::{Value, json};

/// A broker, a browser signed in as `member` (a session made in the store, its cookie set in
/// the browser), and the browser showing `path`.
pub(crate) async fn signed_in(member: &str, path: &str) -> Option<(TestBroker, Browser, String)> {
    let (chrome, driver) = chromium()?;
    let b = start_broker().await;
    let browser = Browser::start(&chrome, &driver).await;
    let id = session_for(&b, member);
    // A cookie can only be set on the origin the browser shows.
    browser.goto(&format!("{}/healthz", b.url)).await;
    browser.add_cookie("ac7_session", &id).await;
    open(&browser, &b, path).await;
    Some((b, browser, id))
}

pub(crate) fn session_for(b: &TestBroker, member: &str) -> String {
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    b.broker
        .state
        .store
        .tx(|conn| sessions::session_create(conn, member, Some("web_app test"), now, 3_600_000))
        .unwrap()
        .0
}

/// Navigates (a full page load) and waits for the app's ready marker.
pub(crate) async fn open(browser: &Browser, b: &TestBroker, path: &str) {
    browser.goto(&format!("{}{path}", b.url)).await;
    browser
        .wait_until(
            "return document.body && document.body.dataset.ready === '1'",
            15,
            &format!("the app to render {path}"),
        )
        .await;
}

pub(crate) async fn api(b: &TestBroker, method: &str, path: &str, body: Option<Value>) -> Value {
    let r = b.call(method, path, "director", body).await;
    assert!(r.status < 300, "{method} {path}: {} {}", r.status, r.json);
    r.json
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_and_complete_an_objective_in_the_browser() {
    let Some((b, br, _)) = signed_in("director", "/objectives/new").await else {
        return;
    };
    br.wait_for("form.objective-new", 10, "the create form")
        .await;
    br.find("input[name=title]")
        .await
        .unwrap()
        .send_keys("Ship the web app")
        .await;
    br.find("textarea[name=outcome]")
        .await
        .unwrap()
        .send_keys("The browser tests pass")
        .await;
    br.find("textarea[name=body]")
        .await
        .unwrap()
        .send_keys("Details in the brief.")
        .await;
    // Assign it to ourselves (so we may complete it) and let the reviewer watch.
    br.script(
        "document.querySelector('select[name=assignee]').value = 'director'",
        json!([]),
    )
    .await;
    br.click_on(
        "input[name=watchers][value=reviewer]",
        10,
        "the reviewer watcher",
    )
    .await;
    br.screenshot("objective-new").await;
    br.click_on("form.objective-new button[type=submit]", 10, "create")
        .await;

    br.wait_for(
        ".objective-detail[data-status=active]",
        10,
        "the new objective's page",
    )
    .await;
    let url = br.url().await;
    let id = url.rsplit('/').next().unwrap().to_owned();
    let view = api(&b, "GET", &format!("/objectives/{id}"), None).await;
    assert_eq!(view["objective"]["title"], "Ship the web app");
    assert_eq!(view["objective"]["assignee"], "director");
    assert_eq!(view["objective"]["watchers"], json!(["reviewer"]));
    let events = br.find("ol.events").await.unwrap().text().await;
    assert!(events.contains("assigned to director"), "{events}");

    // A discussion post appears in the thread.
    br.find("form.discuss textarea")
        .await
        .unwrap()
        .send_keys("Starting now.")
        .await;
    br.click_on("form.discuss button", 10, "post to the discussion")
        .await;
    br.wait_until(
        "return document.querySelector('.discussion').innerText.includes('Starting now.')",
        10,
        "the discussion post",
    )
    .await;

    br.find("form.complete textarea")
        .await
        .unwrap()
        .send_keys("All green in CI.")
        .await;
    br.click_on("form.complete button", 10, "complete").await;
    br.wait_for(
        ".objective-detail[data-status=done]",
        10,
        "the completed objective",
    )
    .await;
    let result = br.find(".callout.result").await.unwrap().text().await;
    assert!(result.contains("All green in CI."), "{result}");
    br.screenshot("objective-detail").await;
    let view = api(&b, "GET", &format!("/objectives/{id}"), None).await;
    assert_eq!(view["objective"]["status"], "done");
    assert_eq!(view["objective"]["result"], "All green in CI.");

    // The list shows it, and the status filter applies.
    open(&br, &b, "/objectives?status=done").await;
    br.wait_for(
        &format!(".objective-row[data-id='{id}']"),
        10,
        "the objective in the done list",
    )
    .await;
    br.screenshot("objectives").await;
    open(&br, &b, "/objectives?status=active").await;
    br.wait_for(".objectives", 10, "the list").await;
    assert!(
        br.find(&format!(".objective-row[data-id='{id}']"))
            .await
            .is_none()
    );
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_and_preview_files_and_html_never_runs() {
    let Some((b, br, _)) = signed_in("director", "/files/director").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let md = dir.path().join("notes.md");
    std::fs::write(
        &md,
        "# Plan\n\n- one\n- two\n\n<script>window.x = 1</script>\n",
    )
    .unwrap();
    let input = br
        .wait_for("input.upload-input", 10, "the upload button")
        .await;
    input.send_keys(md.to_str().unwrap()).await;
    let row = ".file-row[data-path='/director/notes.md'] a.name";
    br.wait_for(row, 10, "the uploaded file").await;
    br.screenshot("files").await;
    br.click_on(row, 10, "the uploaded file").await;
    br.wait_for(
        ".preview[data-kind=markdown] h2",
        10,
        "the markdown preview",
    )
    .await;
    let text = br.find(".markdown").await.unwrap().text().await;
    assert!(text.contains("Plan") && text.contains("two"), "{text}");
    // The <script> of the markdown is text on the page, not an element.
    assert!(text.contains("<script>window.x = 1</script>"), "{text}");
    assert_eq!(
        br.script(
            "return document.querySelectorAll('.preview script').length",
            json!([])
        )
        .await,
        json!(0)
    );

    // An HTML page uploaded over the API: its preview is its source, and nothing in it runs.
    let html = "<!doctype html><title>x</title><script>document.title = 'pwned'; window.x = 1;</script><img src=x onerror=\"window.x=2\">";
    upload(&b, "/director/evil.html", "text/html", html.as_bytes()).await;
    open(&br, &b, "/files/director/evil.html").await;
    let pre = br
        .wait_for(".preview[data-kind=text] pre", 10, "the html source")
        .await;
    assert!(pre.text().await.contains("document.title = 'pwned'"));
    assert_eq!(
        br.script("return [document.title, String(window.x)]", json!([]))
            .await,
        json!(["ac7", "undefined"])
    );
    br.screenshot("file-preview-html").await;

    // Opening its download URL directly does not run it either (attachment, sandbox CSP).
    br.goto(&format!("{}/fs/read/director/evil.html", b.url))
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let title = br.title().await;
    assert_ne!(title, "pwned");
    let x = br.script("return String(window.x)", json!([])).await;
    assert_ne!(x, json!("1"));

    // An image previews through a blob: URL.
    upload(&b, "/director/dot.png", "image/png", PNG).await;
    open(&br, &b, "/files/director/dot.png").await;
    br.wait_until(
        "const i = document.querySelector('.preview img'); return i && i.complete && i.naturalWidth > 0 && i.src.startsWith('blob:')",
        10,
        "the image preview",
    )
    .await;

    // Audio plays in the page (the policy lets media load from the broker), and so does an
    // audio attachment in a thread; a video gets a player too.
    upload(&b, "/director/beep.wav", "audio/wav", &wav(0.25)).await;
    open(&br, &b, "/files/director/beep.wav").await;
    br.wait_until(
        "const a = document.querySelector('.preview[data-kind=audio] audio'); return !!a && a.readyState >= 1 && a.duration > 0.2 && a.duration < 0.3",
        15,
        "the audio player to read the file's length",
    )
    .await;
    upload(
        &b,
        "/director/clip.webm",
        "video/webm",
        b"not really a video",
    )
    .await;
    open(&br, &b, "/files/director/clip.webm").await;
    br.wait_for(
        ".preview[data-kind=video] video[controls]",
        10,
        "the video player",
    )
    .await;
    b.push(
        "director",
        json!({"to": "builder", "body": "listen", "attachments": [
            {"path": "/director/beep.wav", "name": "beep.wav", "size": 2044, "mimeType": "audio/wav"}
        ]}),
    )
    .await;
    open(&br, &b, "/dm/builder").await;
    br.wait_until(
        "const a = document.querySelector('.att-media audio'); return !!a && a.readyState >= 1 && a.duration > 0.2",
        15,
        "the audio attachment's player",
    )
    .await;
    br.quit().await;
}

/// A silent WAV file (8 kHz, mono, 16-bit PCM) `secs` long.
fn wav(secs: f64) -> Vec<u8> {
    let samples = (8000.0 * secs) as u32;
    let data = samples * 2;
    let mut out = Vec::new();
    out.extend(b"RIFF");
    out.extend((36 + data).to_le_bytes());
    out.extend(b"WAVEfmt ");
    out.extend(16u32.to_le_bytes());
    out.extend(1u16.to_le_bytes()); // PCM
    out.extend(1u16.to_le_bytes()); // mono
    out.extend(8000u32.to_le_bytes());
    out.extend(16000u32.to_le_bytes()); // bytes per second
    out.extend(2u16.to_le_bytes()); // block align
    out.extend(16u16.to_le_bytes()); // bits per sample
    out.extend(b"data");
    out.extend(data.to_le_bytes());
    out.resize(out.len() + data as usize, 0);
    out
}

/// A 1×1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0,
    0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d, 0x1d, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

async fn upload(b: &TestBroker, path: &str, mime: &str, bytes: &[u8]) {
    let r = b
        .http
        .post(format!("{}/fs/write", b.url))
        .query(&[("path", path), ("mime", mime)])
        .bearer_auth(b.token("director"))
        .body(bytes.to_vec())
        .send()
        .await
        .unwrap();
    assert!(
        r.status().is_success(),
        "upload {path}: {}",
        r.text().await.unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_on_every_route_lands_in_the_app() {
    let Some((b, br, _)) = signed_in("director", "/").await else {
        return;
    };
    let o = api(
        &b,
        "POST",
        "/objectives",
        Some(json!({"title": "t", "outcome": "o", "assignee": "builder"})),
    )
    .await;
    let id = o["id"].as_str().unwrap().to_owned();
    upload(&b, "/director/a.txt", "text/plain", b"hello").await;
    for path in [
        "/".to_owned(),
        "/inbox".to_owned(),
        "/objectives".to_owned(),
        "/objectives/new".to_owned(),
        format!("/objectives/{id}"),
        format!("/objectives/{id}?tab=trace"),
        "/files/director".to_owned(),
        "/files/director/a.txt".to_owned(),
        "/members".to_owned(),
        "/@builder".to_owned(),
        "/@builder/activity".to_owned(),
        "/members/builder/activity".to_owned(),
        "/c/general".to_owned(),
        "/dm/builder".to_owned(),
        "/channels".to_owned(),
        "/account".to_owned(),
    ] {
        // A full page load of the deep URL: what a reload does.
        open(&br, &b, &path).await;
        let shape = br
            .script("return [document.contentType, !!document.getElementById('app'), document.body.innerText.trim().startsWith('{')]", json!([]))
            .await;
        assert_eq!(shape, json!(["text/html", true, false]), "{path}");
    }
    // The pages left behind closed their streams: the back/forward cache keeps a left page
    // alive, and one that kept its live stream open would hold one of the browser's six
    // sockets per host (a few reloads later the next page load waits a minute for one).
    // Only the page on screen is connected.
    let seen = std::cell::RefCell::new(Value::Null);
    crate::common::wait_until_showing(
        "the director's pages left behind to disconnect",
        std::time::Duration::from_secs(15),
        || format!("GET /roster connected: {}", seen.borrow()),
        async || {
            let roster = api(&b, "GET", "/roster", None).await;
            let director = roster["connected"]
                .as_array()
                .and_then(|c| c.iter().find(|p| p["name"] == "director"))
                .cloned();
            let n = director.as_ref().and_then(|p| p["connected"].as_u64());
            *seen.borrow_mut() = roster["connected"].clone();
            n == Some(1)
        },
    )
    .await;
    // The objective page shows the objective; the activity page its member.
    open(&br, &b, &format!("/objectives/{id}")).await;
    br.wait_for(".objective-detail", 10, "the objective").await;
    open(&br, &b, "/@builder/activity").await;
    br.wait_for(".page.activity", 10, "the activity feed").await;
    br.screenshot("activity").await;
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_from_another_origin_is_refused_and_a_revoked_session_signs_out() {
    let Some((b, br, _)) = signed_in("director", "/objectives").await else {
        return;
    };
    let o = api(
        &b,
        "POST",
        "/objectives",
        Some(json!({"title": "keep me", "outcome": "o", "assignee": "builder"})),
    )
    .await;
    let id = o["id"].as_str().unwrap().to_owned();

    // Another origin (same site: another port on 127.0.0.1, so the SameSite=Strict cookie
    // is sent) serves a form that cancels the objective.
    let page = format!(
        "<!doctype html><form method=post action=\"{}/objectives/{id}/cancel\" enctype=\"text/plain\">\
         <input name='{{\"reason\":\"x\",\"y\":\"' value='\"}}'><button id=go>go</button></form>",
        b.url
    );
    let evil = serve_once_forever(page).await;
    br.goto(&evil).await;
    br.wait_for("#go", 10, "the foreign form")
        .await
        .click()
        .await;
    br.wait_until(
        "return document.body.innerText.includes('cross-origin request refused')",
        10,
        "the refusal",
    )
    .await;
    let view = api(&b, "GET", &format!("/objectives/{id}"), None).await;
    assert_eq!(view["objective"]["status"], "active");

    // Revoking the session server-side signs the open app out at its next request.
    open(&br, &b, "/objectives").await;
    b.broker
        .state
        .store
        .tx(|conn| sessions::sessions_delete_member(conn, "director"))
        .unwrap();
    br.script(
        "history.pushState(null, '', '/objectives'); dispatchEvent(new PopStateEvent('popstate'))",
        json!([]),
    )
    .await;
    br.wait_for("main.signin", 15, "the sign-in screen after revocation")
        .await;
    let text = br.find("main.signin").await.unwrap().text().await;
    assert!(text.contains("session expired"), "{text}");
    // The reason stays however often the sign-in screen is drawn again (a navigation, or the
    // background sync seeing the same 401 first) until someone signs in.
    br.script(
        "history.pushState(null, '', '/channels'); dispatchEvent(new PopStateEvent('popstate'))",
        json!([]),
    )
    .await;
    let text = br.find("main.signin").await.unwrap().text().await;
    assert!(
        text.contains("session expired"),
        "after a second draw: {text}"
    );
    br.screenshot("signed-out").await;
    br.quit().await;
}

/// A tiny HTTP server on another port answering every request with `page`; returns its URL.
async fn serve_once_forever(page: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://127.0.0.1:{}/", l.local_addr().unwrap().port());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let page = page.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    url
}

/// Clicks the first `button` whose text is `label`.
async fn click_button(br: &Browser, label: &str) {
    br.wait_until(
        &format!(
            "const b = [...document.querySelectorAll('button')].find(b => b.textContent === {}); if (b) b.click(); return !!b",
            json!(label)
        ),
        10,
        &format!("the {label} button"),
    )
    .await;
}

/// The archived #old-plans on screen: its history, the archived line, no composer.
async fn shows_archived_read_only(br: &Browser) {
    br.wait_until(
        "return [...document.querySelectorAll('.transcript .msg .body')].some(e => e.textContent === 'the plan we dropped')",
        10,
        "the archived channel's history",
    )
    .await;
    let note = br.find(".archived-note").await.unwrap().text().await;
    assert!(note.contains("archived on"), "{note}");
    assert!(br.find(".composer").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archived_channel_keeps_its_history_read_only() {
    let Some((b, br, _)) = signed_in("director", "/channels").await else {
        return;
    };
    let ch = api(&b, "POST", "/channels", Some(json!({"slug": "old-plans"}))).await;
    let id = ch["id"].as_str().unwrap().to_owned();
    b.push(
        "director",
        json!({"body": "the plan we dropped", "data": {"thread": format!("chan:{id}")}}),
    )
    .await;
    click_button(&br, "Refresh").await;
    br.wait_until(
        "return [...document.querySelectorAll('.page ul.items a')].some(a => a.textContent === '#old-plans')",
        10,
        "the new channel in the list",
    )
    .await;

    // Archived elsewhere: the list moves it into a collapsed "Archived" group.
    api(&b, "DELETE", "/channels/old-plans", None).await;
    click_button(&br, "Refresh").await;
    br.wait_until(
        "const d = document.querySelector('details.archived'); return !!d && !d.open && d.querySelector('summary').textContent === 'Archived (1)'",
        10,
        "the collapsed archived group",
    )
    .await;
    assert_eq!(
        br.script(
            "return [...document.querySelectorAll('.page > ul.items a')].some(a => a.textContent === '#old-plans')",
            json!([])
        )
        .await,
        false
    );
    br.click_on("details.archived summary", 10, "the archived group")
        .await;
    br.click_on(
        "details.archived a[href='/c/old-plans']",
        10,
        "the archived channel",
    )
    .await;

    // Its history, read-only, with when it was archived.
    shows_archived_read_only(&br).await;
    br.screenshot("channel-archived").await;

    // A link to it in a fresh browser opens it the same way.
    br.script("localStorage.clear()", json!([])).await;
    open(&br, &b, "/c/old-plans").await;
    shows_archived_read_only(&br).await;
    // The group is the broker's list: a channel made and archived while this browser was
    // away is in it too.
    api(&b, "POST", "/channels", Some(json!({"slug": "never-seen"}))).await;
    api(&b, "DELETE", "/channels/never-seen", None).await;
    open(&br, &b, "/channels").await;
    br.wait_until(
        "const d = document.querySelector('details.archived'); return !!d && d.querySelector('summary').textContent === 'Archived (2)' && !!d.querySelector(\"a[href='/c/never-seen']\") && !!d.querySelector(\"a[href='/c/old-plans']\")",
        10,
        "both archived channels in the group",
    )
    .await;
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_archived_while_open_turns_read_only() {
    let Some((b, br, _)) = signed_in("director", "/").await else {
        return;
    };
    let ch = api(&b, "POST", "/channels", Some(json!({"slug": "old-plans"}))).await;
    let id = ch["id"].as_str().unwrap().to_owned();
    b.push(
        "director",
        json!({"body": "the plan we dropped", "data": {"thread": format!("chan:{id}")}}),
    )
    .await;
    open(&br, &b, "/c/old-plans").await;
    br.wait_for(".composer", 10, "the channel's composer").await;
    // Archived by someone else: the broker's `channels` notice makes the app read the list
    // again, and the open channel loses its composer.
    api(&b, "DELETE", "/channels/old-plans", None).await;
    br.wait_until(
        "return !!document.querySelector('.archived-note') && !document.querySelector('.composer')",
        20,
        "the channel turning read-only",
    )
    .await;
    shows_archived_read_only(&br).await;
    assert!(br.url().await.ends_with("/c/old-plans"));
    br.quit().await;
}

/// Scrolls the element `css` to `top` (and tells the app at once, as the browser does on
/// its next frame).
async fn scroll_to(br: &Browser, css: &str, top: u32) {
    br.script(
        "const e = document.querySelector(arguments[0]); e.scrollTop = arguments[1]; e.dispatchEvent(new Event('scroll')); return e.scrollTop",
        json!([css, top]),
    )
    .await;
}

async fn wait_scrolled(br: &Browser, css: &str, top: u32, what: &str) {
    br.wait_until(
        &format!(
            "const e = document.querySelector({}); return !!e && Math.abs(e.scrollTop - {top}) <= 2",
            json!(css)
        ),
        10,
        what,
    )
    .await;
}

/// Messages of one millisecond read in the order they were logged, however they arrived: the
/// newest page, then an older page ("Load older") that ends inside that millisecond, then live
/// ones. Drives the app's own thread store in the page, with times chosen to tie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_one_millisecond_keep_log_order_across_pages() {
    let Some((b, br, _)) = signed_in("director", "/").await else {
        return;
    };
    let order = br
        .script_async(
            r#"const done = arguments[arguments.length - 1];
            const app = document.querySelector('script[type=module]').src;
            import(app.replace(/app\.js$/, 'store.js')).then((s) => {
              const m = (n, ts) => ({ id: 'tie-' + n, ts, body: 'm' + n, from: 'director', data: { thread: 'chan:ties' } });
              // The newest page (newest first): m3..m5, m3 and m4 in one millisecond.
              s.addHistory([m(5, 3000), m(4, 2000), m(3, 2000)]);
              // The page before it ends in that millisecond.
              s.addHistory([m(2, 2000), m(1, 2000), m(0, 1000)]);
              // Live, after both: one in the newest millisecond, one later.
              s.addMessages([m(6, 3000)]);
              s.addMessages([m(7, 4000)]);
              done(s.thread('chan:ties').msgs.map((x) => x.body));
            }, (e) => done(String(e)));"#,
            json!([]),
        )
        .await;
    assert_eq!(
        order,
        json!(["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7"])
    );
    br.quit().await;
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_returns_to_where_the_user_was_scrolled() {
    let Some((b, br, _)) = signed_in("director", "/").await else {
        return;
    };
    for i in 0..80 {
        b.push(
            "builder",
            json!({"to": "director", "body": format!("line {i}")}),
        )
        .await;
    }
    for i in 0..60 {
        api(
            &b,
            "POST",
            "/channels",
            Some(json!({"slug": format!("room-{i}")})),
        )
        .await;
    }

    // A thread read half-way up, left for another page and come back to.
    open(&br, &b, "/dm/builder").await;
    br.wait_until(
        "return document.querySelectorAll('.transcript .msg').length >= 80",
        10,
        "the DM's messages",
    )
    .await;
    let bottom = br
        .script(
            "const s = document.querySelector('.scroller'); return s.scrollHeight - s.clientHeight",
            json!([]),
        )
        .await
        .as_u64()
        .unwrap();
    assert!(bottom > 600, "the thread does not scroll: {bottom}");
    scroll_to(&br, ".scroller", 300).await;
    br.click_on(".rail a[href='/members']", 10, "the members link")
        .await;
    br.wait_for(".page h1", 10, "the members page").await;
    br.script("history.back()", json!([])).await;
    wait_scrolled(&br, ".scroller", 300, "the thread where it was left").await;
    assert!(br.url().await.ends_with("/dm/builder"));

    // A list the same way; a fresh visit starts at the top.
    br.click_on(
        ".rail .nav-head a[href='/channels']",
        10,
        "the channels link",
    )
    .await;
    br.wait_until(
        "return document.querySelectorAll('.page ul.items li').length >= 61",
        10,
        "the channel list",
    )
    .await;
    scroll_to(&br, ".view", 500).await;
    wait_scrolled(&br, ".view", 500, "the list scrolled").await;
    br.click_on("a[href='/c/room-0']", 10, "a channel").await;
    br.wait_for(".composer", 10, "the channel").await;
    br.script("history.back()", json!([])).await;
    wait_scrolled(&br, ".view", 500, "the list where it was left").await;
    br.script("history.forward()", json!([])).await;
    br.wait_for(".composer", 10, "the channel again").await;
    br.click_on(
        ".rail .nav-head a[href='/channels']",
        10,
        "the channels link",
    )
    .await;
    br.wait_until(
        "return document.querySelectorAll('.page ul.items li').length >= 61",
        10,
        "the channel list again",
    )
    .await;
    wait_scrolled(&br, ".view", 0, "a fresh visit at the top").await;
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_admin_renames_the_channel_and_the_address_follows() {
    let Some((b, br, _)) = signed_in("director", "/").await else {
        return;
    };
    api(&b, "POST", "/channels", Some(json!({"slug": "draft-room"}))).await;
    open(&br, &b, "/c/draft-room").await;
    br.click_on(
        "button[aria-label='Channel members and settings']",
        10,
        "the channel settings",
    )
    .await;
    let input = br
        .wait_for("form.rename input", 10, "the rename form")
        .await;
    input.clear().await;
    input.send_keys("Final Room").await;
    br.click_on("form.rename button", 10, "rename").await;
    br.wait_until(
        "return location.pathname === '/c/final-room' && document.querySelector('.thread-head h1').textContent === '#final-room' && !!document.querySelector(\".rail a[href='/c/final-room']\")",
        10,
        "the renamed channel",
    )
    .await;
    let ch = api(&b, "GET", "/channels/final-room", None).await;
    assert_eq!(ch["channel"]["slug"], "final-room");

    // Renamed by someone else: the open channel's address follows when the list is read
    // again (every few seconds).
    api(
        &b,
        "PATCH",
        "/channels/final-room",
        Some(json!({"slug": "last-room"})),
    )
    .await;
    br.wait_until(
        "return location.pathname === '/c/last-room' && document.querySelector('.thread-head h1').textContent === '#last-room'",
        20,
        "the address after a rename elsewhere",
    )
    .await;
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_objective_takes_attachments() {
    let Some((b, br, _)) = signed_in("director", "/objectives/new").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("brief notes.txt");
    std::fs::write(&file, "what to build\n").unwrap();
    br.wait_for("form.objective-new", 10, "the create form")
        .await;
    br.find("input[name=title]")
        .await
        .unwrap()
        .send_keys("With a brief")
        .await;
    br.find("textarea[name=outcome]")
        .await
        .unwrap()
        .send_keys("The brief is read")
        .await;
    br.find("form.objective-new input[type=file]")
        .await
        .unwrap()
        .send_keys(file.to_str().unwrap())
        .await;
    br.wait_until(
        "return [...document.querySelectorAll('form.objective-new .chip')].some(c => c.textContent.startsWith('✓ brief notes.txt'))",
        10,
        "the uploaded file's chip",
    )
    .await;
    br.click_on("form.objective-new button[type=submit]", 10, "create")
        .await;
    br.wait_for(".objective-detail", 10, "the new objective's page")
        .await;
    let id = br.url().await.rsplit('/').next().unwrap().to_owned();
    let view = api(&b, "GET", &format!("/objectives/{id}"), None).await;
    let atts = view["objective"]["attachments"].as_array().unwrap();
    assert_eq!(atts.len(), 1, "{view}");
    assert_eq!(atts[0]["name"], "brief notes.txt");
    assert_eq!(atts[0]["path"], format!("/objectives/{id}/brief notes.txt"));
    br.wait_until(
        "return [...document.querySelectorAll('.objective-detail a')].some(a => a.textContent === 'brief notes.txt')",
        10,
        "the attachment on the objective's page",
    )
    .await;
    br.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_opens_the_members_activity_beside_it() {
    let Some((b, br, _)) = signed_in("director", "/").await else {
        return;
    };
    let r = b
        .post(
            "/members/builder/activity",
            "builder",
            json!({"events": [crate::broker_activity::exchange(1_000)]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    open(&br, &b, "/dm/builder").await;
    br.wait_for(".composer", 10, "the DM").await;
    assert!(
        br.find(".side-panel")
            .await
            .unwrap()
            .attr("hidden")
            .await
            .is_some(),
        "the panel starts closed"
    );
    // Hold the panel's first read after its answer arrives, so an upload lands between the
    // read and the live stream's opening: the stream must not lose it.
    br.script(
        "const real = window.fetch;
         window.__heldRead = false;
         const gate = new Promise((r) => { window.__releaseRead = r; });
         window.fetch = async (url, init) => {
           const res = await real(url, init);
           if (String(url).startsWith('/members/builder/activity?')) {
             window.__heldRead = true;
             await gate;
           }
           return res;
         };",
        json!([]),
    )
    .await;
    br.click_on("button.side-toggle", 10, "the activity toggle")
        .await;
    br.wait_until("return window.__heldRead === true", 10, "the panel's read")
        .await;
    b.post(
        "/members/builder/activity",
        "builder",
        json!({"events": [crate::broker_activity::exchange(2_000)]}),
    )
    .await;
    br.script("window.__releaseRead()", json!([])).await;
    br.wait_until(
        "return document.querySelectorAll('aside.side-panel .activity-feed > li:not(.empty)').length === 2 && !!document.querySelector('.split-main .composer')",
        10,
        "the activity beside the conversation, with the row uploaded while it opened",
    )
    .await;
    // Live: a new exchange appears in the panel.
    b.post(
        "/members/builder/activity",
        "builder",
        json!({"events": [crate::broker_activity::exchange(3_000)]}),
    )
    .await;
    br.wait_until(
        "return document.querySelectorAll('aside.side-panel .activity-feed > li:not(.empty)').length === 3",
        10,
        "the live activity row",
    )
    .await;
    br.screenshot("dm-activity").await;
    // Remembered for the next DM; closed again with the toggle.
    open(&br, &b, "/dm/builder").await;
    br.wait_until(
        "const p = document.querySelector('aside.side-panel'); return !!p && !p.hidden",
        10,
        "the panel open again",
    )
    .await;
    br.click_on("button.side-toggle", 10, "the activity toggle")
        .await;
    br.wait_until(
        "return document.querySelector('aside.side-panel').hidden && document.querySelector('button.side-toggle').getAttribute('aria-pressed') === 'false'",
        10,
        "the panel closed",
    )
    .await;
    br.quit().await;
}
