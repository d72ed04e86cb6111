//! `ac7-bench web`: the web app in headless Chromium (WebDriver, the client of the browser
//! tests) against an in-process broker on loopback.
//!
//! * `first_load_bytes`: the compressed bodies of the shell and every `/_app/` asset a cold
//!   browser fetched (Resource Timing `encodedBodySize`), and the API JSON it read (apart);
//! * `interactive_ms`: navigation start → the app's ready marker (`performance.mark`
//!   `ac7-ready`, set when the first view has rendered), cold and warm (p50 of 10 reloads);
//! * `push_to_visible_ms`: `POST /push` returned (wall clock, µs) → a `MutationObserver` saw
//!   the message in the open DM thread (`performance.timeOrigin + performance.now()`), p50/p99
//!   over 40 pushes;
//! * `long_thread_interactive_ms`: navigation start → the ready marker on a DM thread holding
//!   1,000 messages (the thread renders a window of its newest rows), p50 of 5 loads, with the
//!   newest message on screen when the marker is set.

use ac7_test_support::webdriver;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ac7_protocol::domain::message::Audience;
use ac7_runtime::broker::config::TeamConfig;
use ac7_runtime::broker::db::{Store, SyncMode};
use ac7_runtime::broker::{BrokerConfig, bootstrap, publish, sessions, start};
use anyhow::Context;
use serde_json::{Value, json};

const TEAM: &str = r#"{
  "team": {"name": "bench-team", "directive": "Measure the web app.", "context": "Bench."},
  "members": [
    {"name": "director", "role": {"title": "director", "description": "Leads."}, "permissions": ["admin"]},
    {"name": "builder", "role": {"title": "engineer", "description": "Builds."}},
    {"name": "reviewer", "role": {"title": "reviewer", "description": "Reviews."}}
  ]
}"#;

const PUSHES: usize = 40;
const RELOADS: usize = 10;
/// Messages in the long thread, and loads of it measured.
const LONG_THREAD: usize = 1000;
const LONG_LOADS: usize = 5;

fn now_ms_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub(crate) fn run() -> anyhow::Result<Value> {
    let (chrome, driver) =
        webdriver::chromium().context("chromium is needed for `ac7-bench web`")?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("ac7.db");
        let config: TeamConfig = serde_json::from_str(TEAM)?;
        let (issued, session) = {
            let store = Store::open(&db, SyncMode::Normal)?;
            let issued = bootstrap::bootstrap(&store, &config)?;
            let now = i64::try_from(now_ms_f64() as u64)?;
            let (id, _) =
                store.tx(|c| sessions::session_create(c, "director", None, now, 3_600_000))?;
            // The long thread: director and reviewer, alternating, a minute of history each.
            store.tx(|c| {
                for i in 0..LONG_THREAD {
                    let (from, to) = if i % 2 == 0 {
                        ("director", "reviewer")
                    } else {
                        ("reviewer", "director")
                    };
                    let draft = publish::Draft {
                        to: Some(to.to_owned()),
                        from: from.to_owned(),
                        title: None,
                        body: format!("long-{i:04}: a line of the long thread, **bold** and `code`."),
                        level: Default::default(),
                        data: Default::default(),
                        attachments: Vec::new(),
                    };
                    let audience =
                        Audience::Only([from.to_owned(), to.to_owned()].into_iter().collect());
                    let at = now - 60_000 * (LONG_THREAD - i) as i64;
                    publish::log(c, draft, &audience, at)?;
                }
                Ok::<_, ac7_runtime::broker::db::StoreError>(())
            })?;
            (issued, id)
        };
        let builder = issued
            .iter()
            .find(|i| i.name == "builder")
            .context("builder token")?
            .token
            .clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let broker = start(BrokerConfig::new(db), listener).await?;
        let url = format!("http://{}", broker.addr);
        let br = webdriver::Browser::start(&chrome, &driver).await;
        br.goto(&format!("{url}/healthz")).await;
        br.add_cookie("ac7_session", &session).await;

        // Cold first load (fresh profile: nothing cached).
        br.goto(&format!("{url}/")).await;
        let ready = "const m = performance.getEntriesByName('ac7-ready')[0]; return m ? m.startTime : null";
        let cold = br.wait_until(ready, 30, "the app's ready marker").await;
        let sizes = br
            .script(
                "const n = performance.getEntriesByType('navigation')[0];
                 let app = n.encodedBodySize, files = 1, api = 0;
                 for (const r of performance.getEntriesByType('resource')) {
                   if (new URL(r.name).pathname.startsWith('/_app/')) { app += r.encodedBodySize; files++; }
                   else api += r.encodedBodySize;
                 }
                 return [app, files, api, n.decodedBodySize];",
                json!([]),
            )
            .await;

        // Warm loads: the immutable assets come from the cache.
        let mut warm = Vec::new();
        for _ in 0..RELOADS {
            br.goto(&format!("{url}/objectives")).await;
            warm.push(br.wait_until(ready, 30, "the ready marker").await.as_f64().unwrap_or(f64::NAN));
        }
        warm.sort_by(f64::total_cmp);

        // The long thread, warm: navigation → ready, with its newest message on screen.
        let newest = format!("long-{:04}", LONG_THREAD - 1);
        let mut long = Vec::new();
        for _ in 0..LONG_LOADS {
            br.goto(&format!("{url}/dm/reviewer")).await;
            let at = br.wait_until(ready, 30, "the long thread").await.as_f64().unwrap_or(f64::NAN);
            let shown = br
                .script(
                    "return document.body.innerText.includes(arguments[0])",
                    json!([newest]),
                )
                .await;
            anyhow::ensure!(shown == json!(true), "the long thread's newest message was not on screen when the app was ready");
            long.push(at);
        }
        long.sort_by(f64::total_cmp);

        // Push → visible, in the DM thread with builder.
        br.goto(&format!("{url}/dm/builder")).await;
        br.wait_until(ready, 30, "the DM thread").await;
        br.script(
            "window.__seen = {};
             new MutationObserver((muts) => {
               const t = performance.timeOrigin + performance.now();
               for (const m of muts) for (const n of m.addedNodes) {
                 const s = n.textContent || '';
                 const i = s.indexOf('bench-');
                 if (i >= 0) { const k = s.slice(i, i + 12); if (!(k in window.__seen)) window.__seen[k] = t; }
               }
             }).observe(document.body, {childList: true, subtree: true});",
            json!([]),
        )
        .await;
        let http = reqwest::Client::new();
        let mut lat = Vec::new();
        for i in 0..PUSHES {
            let key = format!("bench-{i:06}");
            let r = http
                .post(format!("{url}/push"))
                .bearer_auth(&builder)
                .json(&json!({"to": "director", "body": key}))
                .send()
                .await?;
            let returned = now_ms_f64();
            anyhow::ensure!(r.status().is_success(), "push failed: {}", r.status());
            let seen = br
                .wait_until(&format!("return window.__seen['{key}'] || null"), 10, "the pushed message")
                .await
                .as_f64()
                .unwrap_or(f64::NAN);
            lat.push(seen - returned);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        lat.sort_by(f64::total_cmp);
        br.quit().await;
        drop(broker);
        Ok(json!({
            "scenario": "web",
            "first_load_bytes_gzip": sizes[0],
            "first_load_files": sizes[1],
            "first_load_api_json_bytes": sizes[2],
            "shell_bytes_uncompressed": sizes[3],
            "goal_first_load_bytes": 60 * 1024,
            "interactive_ms_cold": cold,
            "interactive_ms_warm_p50": pct(&warm, 0.5),
            "goal_interactive_ms": 300,
            "push_to_visible_ms_p50": pct(&lat, 0.5),
            "push_to_visible_ms_p99": pct(&lat, 0.99),
            "push_to_visible_ms_max": lat.last(),
            "pushes": PUSHES,
            "goal_push_to_visible_ms_p50": 50,
            "long_thread_messages": LONG_THREAD,
            "long_thread_interactive_ms_p50": pct(&long, 0.5),
            "long_thread_interactive_ms_max": long.last(),
            "goal_long_thread_interactive_ms": 300,
        }))
    })
}
