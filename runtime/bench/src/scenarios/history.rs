//! `broker-history`: `/history` for a member who sees little of a big log, and `/roster` while
//! such reads run.
//!
//! The log holds 100,000 messages: 99 % are posts in a channel the caller (`m0`) is not in, 1 %
//! general posts it sees, spread evenly. Figures: `/history` (the default page of 100) p50/p99
//! for one client in a loop; then `/roster` p50/p99 while four clients hammer `/history`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde_json::json;

use super::broker::{BrokerChild, client, rt};
use super::{Report, percentile};
use ac7_protocol::domain::message::Audience;
use ac7_runtime::broker::publish::{Draft, log};
use ac7_runtime::broker::{channels, now_ms};

const MESSAGES: usize = 100_000;
/// One message in this many is visible to the caller.
const VISIBLE_EVERY: usize = 100;
const SAMPLES: usize = 2_000;
const HAMMERS: usize = 4;

fn seed(store: &ac7_runtime::broker::db::Store) -> anyhow::Result<()> {
    store.tx(|c| -> anyhow::Result<()> {
        let now = now_ms();
        let hidden = channels::create(c, "hidden", "director", now)?;
        channels::add_member(c, &hidden.id, "m1", "member", now)?;
        let thread = format!("chan:{}", hidden.id);
        let channel = Audience::Only(["director", "m1"].map(String::from).into());
        for i in 0..MESSAGES {
            let mut data = serde_json::Map::new();
            let audience = if i % VISIBLE_EVERY != 0 {
                data.insert("thread".into(), json!(thread));
                &channel
            } else {
                &Audience::Everyone
            };
            log(
                c,
                Draft {
                    to: None,
                    from: "director".into(),
                    title: None,
                    body: format!("message {i} with a body of ordinary length for a chat line"),
                    level: Default::default(),
                    data,
                    attachments: Vec::new(),
                },
                audience,
                now - (MESSAGES - i) as i64,
            )?;
        }
        Ok(())
    })
}

/// GET `url` as `token`: microseconds to the last byte, and the body.
async fn timed_get(
    http: &reqwest::Client,
    url: &str,
    token: &str,
) -> Result<(u64, axum::body::Bytes), reqwest::Error> {
    let t = Instant::now();
    let body = http
        .get(url)
        .bearer_auth(token)
        .send()
        .await?
        .bytes()
        .await?;
    Ok((
        u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX),
        body,
    ))
}

/// The `broker-history` scenario.
pub(crate) fn history() -> anyhow::Result<Report> {
    let b = BrokerChild::spawn_with(2, seed)?;
    let url = b.url.clone();
    let token = b.token("m0").to_owned();
    let roster_token = b.token("m1").to_owned();
    let (history_lat, roster_lat, page_len) = rt()?.block_on(async move {
        let http = client()?;
        let history = format!("{url}/history");
        let mut page_len = 0;
        let mut lat = Vec::with_capacity(SAMPLES);
        for i in 0..SAMPLES + 100 {
            let (us, body) = timed_get(&http, &history, &token).await?;
            if i >= 100 {
                lat.push(us);
            } else if i == 0 {
                let v: serde_json::Value = serde_json::from_slice(&body)?;
                page_len = v["messages"].as_array().map_or(0, Vec::len);
            }
        }
        lat.sort_unstable();

        // /roster while four clients read /history in a loop.
        let stop = Arc::new(AtomicBool::new(false));
        let mut hammers = Vec::new();
        for _ in 0..HAMMERS {
            let (http, history, token, stop) = (
                http.clone(),
                history.clone(),
                token.clone(),
                Arc::clone(&stop),
            );
            hammers.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    timed_get(&http, &history, &token).await?;
                }
                Ok::<_, reqwest::Error>(())
            }));
        }
        let roster = format!("{url}/roster");
        let mut roster_lat = Vec::with_capacity(SAMPLES / 4);
        for _ in 0..SAMPLES / 4 {
            roster_lat.push(timed_get(&http, &roster, &roster_token).await?.0);
        }
        stop.store(true, Ordering::Relaxed);
        for h in hammers {
            h.await??;
        }
        roster_lat.sort_unstable();
        Ok::<_, anyhow::Error>((lat, roster_lat, page_len))
    })?;
    let mut r = Report::new();
    r.insert("scenario", json!("broker-history"));
    r.insert("messages", json!(MESSAGES));
    r.insert("visible_to_caller", json!(MESSAGES / VISIBLE_EVERY));
    r.insert("page_len", json!(page_len));
    r.insert("history_p50_us", json!(percentile(&history_lat, 50.0)));
    r.insert("history_p99_us", json!(percentile(&history_lat, 99.0)));
    r.insert("history_readers_during_roster", json!(HAMMERS));
    r.insert("roster_p50_us", json!(percentile(&roster_lat, 50.0)));
    r.insert("roster_p99_us", json!(percentile(&roster_lat, 99.0)));
    Ok(r)
}
