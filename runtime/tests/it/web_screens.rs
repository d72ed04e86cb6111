//! The screens the README shows, drawn in a real browser from a team at work: a channel
//! conversation with inline formatting and mentions, and an objective with its discussion.
//! Each screen is checked for what it must show before it is saved to
//! `target/web-screenshots/readme-*.png`; `docs/screenshots/` holds the copies the README
//! links.

use serde_json::json;

use crate::broker_support::start_broker;
use crate::common::webdriver::{Browser, chromium};
use crate::web_app::{api, open, session_for};

/// Waits until the page's text holds `text`.
async fn shows(br: &Browser, text: &str, what: &str) {
    br.wait_until(
        &format!("return document.body.innerText.includes({})", json!(text)),
        15,
        what,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_screens_show_a_team_at_work() {
    // Taller than the other browser tests' window: the objective's discussion on screen.
    let Some((chrome, driver)) = chromium() else {
        return;
    };
    let b = start_broker().await;
    let br = Browser::start_sized(&chrome, &driver, 1280, 1080).await;
    br.goto(&format!("{}/healthz", b.url)).await;
    br.add_cookie("ac7_session", &session_for(&b, "director"))
        .await;

    // A channel where the director and two agents work on a release.
    let ch = api(&b, "POST", "/channels", Some(json!({"slug": "release"}))).await;
    let thread = format!("chan:{}", ch["id"].as_str().unwrap());
    for member in ["builder", "reviewer"] {
        api(
            &b,
            "POST",
            "/channels/release/members",
            Some(json!({"member": member})),
        )
        .await;
    }
    for (who, body) in [
        (
            "director",
            "@builder the 0.4 branch is cut. Can you run the whole suite on it?",
        ),
        (
            "builder",
            "On it. `cargo test --workspace` is green: **318 passed**, none failed.",
        ),
        (
            "reviewer",
            "Read the diff against 0.3: two *small* notes, posted on the objective.",
        ),
        ("director", "Thanks both. Ship it once the notes are in."),
    ] {
        b.push(who, json!({"body": body, "data": {"thread": thread}}))
            .await;
    }
    open(&br, &b, "/c/release").await;
    shows(&br, "Ship it once the notes are in.", "the last post").await;
    // Inline marks render as elements, never as the raw characters.
    let marks = br
        .script(
            "const t = document.querySelector('.transcript');
             return [!!t.querySelector('code'), !!t.querySelector('strong'), !!t.querySelector('em'),
                     t.innerText.includes('**')];",
            json!([]),
        )
        .await;
    assert_eq!(marks, json!([true, true, true, false]), "inline marks");
    br.screenshot("readme-channel").await;

    // An objective the builder carries, with the reviewer watching and a discussion.
    let o = api(
        &b,
        "POST",
        "/objectives",
        Some(json!({
            "title": "Release notes for 0.4",
            "outcome": "The notes are merged and the README links them",
            "body": "Cover the new replica setup and the web app's notifications.",
            "assignee": "builder",
            "watchers": ["reviewer"],
        })),
    )
    .await;
    let id = o["id"].as_str().unwrap().to_owned();
    for (who, body) in [
        ("builder", "Draft is in `docs/release-0.4.md`."),
        (
            "reviewer",
            "Two notes: name the PostgreSQL version, and link the replica guide.",
        ),
        ("builder", "Both done, pushed."),
    ] {
        b.push(
            who,
            json!({"body": body, "data": {"thread": format!("obj:{id}")}}),
        )
        .await;
    }
    open(&br, &b, &format!("/objectives/{id}")).await;
    shows(&br, "Both done, pushed.", "the objective's discussion").await;
    shows(
        &br,
        "The notes are merged and the README links them",
        "the outcome",
    )
    .await;
    // Posted in the same millisecond, the creation's lifecycle rows still read in log order
    // after a full load (history pages come newest first).
    let order = br
        .script(
            "const t = document.querySelector('.discussion').innerText;
             return [t.indexOf('assigned'), t.indexOf('watcher added'), t.indexOf('Draft is in')];",
            json!([]),
        )
        .await;
    let at: Vec<i64> = serde_json::from_value(order).unwrap();
    assert!(
        0 <= at[0] && at[0] < at[1] && at[1] < at[2],
        "discussion order (assigned, watcher added, first post): {at:?}"
    );
    br.screenshot("readme-objective").await;
    br.quit().await;
}
