//! Accessibility and narrow screens: axe-core (from npm, installed once into the target
//! directory) finds no violation on any route of the web app, in the light and the dark
//! theme, at desktop and at phone width (360 px), where no page scrolls sideways either.

use serde_json::{Value, json};

use crate::broker_support::start_broker;
use crate::common::npm::npm_package;
use crate::common::webdriver::{Browser, chromium};
use crate::web_app::{api, open, session_for};

/// The axe-core version the test runs.
const AXE_VERSION: &str = "4.14.1";

/// Runs axe on the page shown (the script is injected into it) and returns its violations as
/// lines `rule (impact): selector :: summary`.
async fn axe(br: &Browser, axe_src: &str) -> Vec<String> {
    let run = format!(
        "{axe_src}\n;const done = arguments[arguments.length - 1];\
         axe.run(document, {{resultTypes: ['violations']}})\
           .then(r => done(r.violations.flatMap(v => v.nodes.map(n => \
              v.id + ' (' + v.impact + '): ' + n.target.join(' ') + ' :: ' + (n.failureSummary || '').replace(/\\s+/g, ' ')))))\
           .catch(e => done(['axe failed: ' + e]));"
    );
    let out: Value = br.script_async(&run, json!([])).await;
    out.as_array()
        .unwrap_or_else(|| panic!("axe answered {out}"))
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_owned())
        .collect()
}

/// How far the page (or any scrolling view inside it) scrolls sideways, in CSS pixels.
const SIDEWAYS: &str = "let worst = document.documentElement.scrollWidth - document.documentElement.clientWidth; let culprit = document.documentElement; \
     for (const el of document.querySelectorAll('*')) { const s = getComputedStyle(el); \
       if ((s.overflowX === 'auto' || s.overflowX === 'scroll') && !el.matches('pre, pre *, code, table, .table-wrap, .tabs')) \
         if (el.scrollWidth - el.clientWidth > worst) { worst = el.scrollWidth - el.clientWidth; culprit = el; } } \
     const wide = [...culprit.querySelectorAll('*')].filter(e => e.getBoundingClientRect().right > culprit.getBoundingClientRect().left + culprit.clientWidth + 0.5 && !e.closest('pre, table')) \
       .slice(-3).map(e => e.tagName.toLowerCase() + (e.className && typeof e.className === 'string' ? '.' + e.className.trim().split(/\\s+/).join('.') : '') + ' ' + Math.round(e.getBoundingClientRect().right)); \
     return worst > 0 ? worst + ' px in ' + culprit.tagName.toLowerCase() + '.' + culprit.className + ' (too wide: ' + wide.join(', ') + ')' : null";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_passes_axe_in_both_themes_on_desktop_and_phone() {
    let Some((chrome, driver)) = chromium() else {
        return;
    };
    let axe_src =
        std::fs::read_to_string(npm_package("axe-core", AXE_VERSION, "axe-npm").join("axe.min.js"))
            .expect("axe.min.js");
    let b = start_broker().await;
    let o = api(
        &b,
        "POST",
        "/objectives",
        Some(json!({"title": "Accessible", "outcome": "axe finds nothing", "assignee": "builder", "body": "Some `code` and **bold**."})),
    )
    .await;
    let id = o["id"].as_str().unwrap().to_owned();
    api(&b, "POST", "/channels", Some(json!({"slug": "ops"}))).await;
    let old = api(&b, "POST", "/channels", Some(json!({"slug": "old"}))).await;
    b.push(
        "director",
        json!({"body": "before the archive", "data": {"thread": format!("chan:{}", old["id"].as_str().unwrap())}}),
    )
    .await;
    api(&b, "DELETE", "/channels/old", None).await;
    let r = b
        .post(
            "/members/builder/activity",
            "builder",
            json!({"events": [crate::broker_activity::exchange(1_000)]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    b.push(
        "builder",
        json!({"to": "director", "body": "a message with a link https://example.com and `code`"}),
    )
    .await;
    let routes = [
        "/".to_owned(),
        "/inbox".to_owned(),
        "/objectives".to_owned(),
        "/objectives/new".to_owned(),
        format!("/objectives/{id}"),
        format!("/objectives/{id}?tab=trace"),
        "/members".to_owned(),
        "/@builder".to_owned(),
        "/account".to_owned(),
        "/c/general".to_owned(),
        "/c/ops".to_owned(),
        "/c/old".to_owned(),
        "/dm/builder".to_owned(),
        "/channels".to_owned(),
        "/channels/new".to_owned(),
        "/files/director".to_owned(),
        "/enroll".to_owned(),
    ];
    let mut problems: Vec<String> = Vec::new();
    for (width, height) in [(1280, 900), (360, 780)] {
        let br = Browser::start_sized(&chrome, &driver, width, height).await;
        br.goto(&format!("{}/", b.url)).await;
        br.wait_for("main.signin", 15, "the sign-in page").await;
        assert_eq!(
            br.script("return innerWidth", json!([])).await,
            json!(width),
            "the viewport is not {width} px wide"
        );
        for theme in ["light", "dark"] {
            // Signed out: the sign-in page and the setup page.
            br.goto(&format!("{}/healthz", b.url)).await;
            br.delete_cookies().await;
            // The DM with builder opens with builder's activity beside it (on wide screens).
            br.script(
                &format!(
                    "localStorage.setItem('ac7:theme', '{theme}'); localStorage.setItem('ac7:dm-activity', '1')"
                ),
                json!([]),
            )
            .await;
            for path in ["/", "/setup"] {
                br.goto(&format!("{}{path}", b.url)).await;
                br.wait_until(
                    "return !!document.querySelector('main.signin form, main.signin .card')",
                    15,
                    &format!("the signed-out page {path}"),
                )
                .await;
                for v in axe(&br, &axe_src).await {
                    problems.push(format!("{width}px {theme} {path} (signed out): {v}"));
                }
            }
            let id = session_for(&b, "director");
            br.add_cookie("ac7_session", &id).await;
            for path in &routes {
                open(&br, &b, path).await;
                // Let the view's own fetches land.
                br.wait_until(
                    "return performance.getEntriesByType('resource').every(e => e.responseEnd > 0) && !document.querySelector('.boot')",
                    10,
                    "the view to settle",
                )
                .await;
                for v in axe(&br, &axe_src).await {
                    problems.push(format!("{width}px {theme} {path}: {v}"));
                }
                if width <= 360 {
                    let over = br.script(SIDEWAYS, json!([])).await;
                    if let Some(over) = over.as_str() {
                        br.screenshot(&format!("sideways-{}", path.replace('/', "_")))
                            .await;
                        problems.push(format!(
                            "{width}px {theme} {path}: scrolls sideways by {over}"
                        ));
                    }
                }
            }
        }
        br.quit().await;
    }
    assert!(
        problems.is_empty(),
        "{} accessibility problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}
