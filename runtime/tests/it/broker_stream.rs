//! The live stream: SSE and WebSocket delivery, visibility, keepalive,
//! `Last-Event-ID` replay, and a slow subscriber being cut loose.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use crate::broker_support;

use std::time::Duration;

use ac7_protocol::domain::message::{self, Route};
use broker_support::{start_broker, start_with};
use serde_json::json;

#[tokio::test]
async fn subscribe_errors() {
    let b = start_broker().await;
    let r = b.get("/subscribe", "builder").await;
    assert_eq!(
        (r.status, r.json.clone()),
        (400, json!({"error": "name query parameter is required"}))
    );
    let r = b.get("/subscribe?name=reviewer", "builder").await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json["error"],
        "user 'builder' cannot subscribe to 'reviewer'; the name query parameter must equal the caller's authenticated name"
    );
    let r = b.raw("GET", "/subscribe?name=builder", None, None).await;
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn sse_delivers_what_the_member_may_see() {
    let b = start_broker().await;
    let mut builder = b.sse("builder", None).await;
    let mut reviewer = b.sse("reviewer", None).await;
    assert_eq!(
        b.get("/roster", "director").await.json["connected"][1]["connected"],
        1
    );

    let dm = b
        .post(
            "/push",
            "director",
            json!({"to": "builder", "body": "please build X"}),
        )
        .await;
    assert_eq!(dm.json["delivery"], json!({"live": 1, "targets": 1}));
    let got = builder.next_message().await;
    assert_eq!(got, dm.json["message"]);
    snap!("sse_dm_frame", got);

    b.push(
        "director",
        json!({"body": "hello team", "title": "broadcast test"}),
    )
    .await;
    assert_eq!(builder.next_message().await["body"], "hello team");
    assert_eq!(reviewer.next_message().await["body"], "hello team");

    // self-echo reaches the sender; the DM target gets it too
    b.push(
        "builder",
        json!({"to": "reviewer", "body": "ready for review"}),
    )
    .await;
    assert_eq!(builder.next_message().await["body"], "ready for review");
    assert_eq!(reviewer.next_message().await["body"], "ready for review");

    // a DM between others is invisible
    b.push("director", json!({"to": "reviewer", "body": "secret"}))
        .await;
    assert_eq!(reviewer.next_message().await["body"], "secret");
    builder.expect_silence(200).await;

    // channel posts go to channel members only
    let chan = b
        .post("/channels", "reviewer", json!({"slug": "qa"}))
        .await
        .json["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = b
        .post(
            "/push",
            "reviewer",
            json!({"body": "qa only", "data": {"thread": format!("chan:{chan}")}}),
        )
        .await;
    assert_eq!(r.json["delivery"], json!({"live": 1, "targets": 1}));
    assert_eq!(reviewer.next_message().await["body"], "qa only");
    builder.expect_silence(200).await;
    let r = b
        .post(
            "/push",
            "builder",
            json!({"body": "x", "data": {"thread": format!("chan:{chan}")}}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (403, json!("not a member of this channel"))
    );
}

#[tokio::test]
async fn sse_keepalive_comment() {
    let b = start_with(|c| c.keepalive = Duration::from_millis(100)).await;
    let mut s = b.sse("builder", None).await;
    let block = tokio::time::timeout(Duration::from_secs(5), s.next_block())
        .await
        .unwrap()
        .unwrap();
    assert!(block.starts_with(':'), "expected a comment, got {block:?}");
}

#[tokio::test]
async fn websocket_delivers_one_message_per_text_frame() {
    let b = start_broker().await;
    let mut ws = b.ws("builder", None).await;
    crate::common::wait_until(
        "the socket to be registered",
        Duration::from_secs(5),
        async || b.get("/roster", "director").await.json["connected"][1]["connected"] == 1,
    )
    .await;
    let sent = b
        .push(
            "director",
            json!({"to": "builder", "body": "please build X", "data": {"k": "v"}}),
        )
        .await;
    assert_eq!(ws.next_message().await, sent);
    let sent = b.push("reviewer", json!({"body": "broadcast"})).await;
    assert_eq!(ws.next_message().await, sent);
    b.push(
        "director",
        json!({"to": "reviewer", "body": "not for builder"}),
    )
    .await;
    let sent = b
        .push("director", json!({"to": "builder", "body": "last"}))
        .await;
    assert_eq!(ws.next_message().await, sent);
}

#[tokio::test]
async fn last_event_id_replays_visible_messages_then_goes_live() {
    let b = start_broker().await;
    let first = b
        .push("director", json!({"to": "builder", "body": "first"}))
        .await;
    let a = b
        .push("director", json!({"to": "builder", "body": "a"}))
        .await;
    b.push("director", json!({"to": "reviewer", "body": "hidden"}))
        .await;
    let c = b.push("reviewer", json!({"body": "c"})).await;

    let mut s = b.sse("builder", first["id"].as_str()).await;
    assert_eq!(s.next_message().await, a);
    assert_eq!(s.next_message().await, c);
    let live = b
        .push("director", json!({"to": "builder", "body": "live"}))
        .await;
    assert_eq!(s.next_message().await, live);

    // WebSocket honours Last-Event-ID too
    let mut ws = b.ws("builder", a["id"].as_str()).await;
    assert_eq!(ws.next_message().await, c);
    assert_eq!(ws.next_message().await, live);

    // query-parameter form
    let resp = b
        .http
        .get(format!(
            "{}/subscribe?name=builder&lastEventId={}",
            b.url,
            c["id"].as_str().unwrap()
        ))
        .bearer_auth(b.token("builder"))
        .send()
        .await
        .unwrap();
    let text = tokio::time::timeout(Duration::from_millis(500), async {
        let mut stream = resp.bytes_stream();
        use futures_util::StreamExt;
        let chunk = stream.next().await.unwrap().unwrap();
        String::from_utf8_lossy(&chunk).into_owned()
    })
    .await
    .unwrap();
    assert!(text.contains("\"body\":\"live\""), "{text}");
}

/// Logs `n` messages straight into the store (fast), all in one millisecond:
/// message `i` is `make(i)`.
fn log_many(
    b: &broker_support::TestBroker,
    n: usize,
    make: impl Fn(usize) -> ac7_runtime::broker::publish::Draft,
) {
    let now = ac7_runtime::broker::now_ms();
    b.broker
        .state
        .store
        .tx(|c| {
            for i in 0..n {
                let draft = make(i);
                // Who a push of it would have reached: a DM its two parties, else everyone.
                let route = Route::of(draft.to.as_deref(), &draft.data);
                let audience = message::audience(Some(&draft.from), &route, &Default::default());
                ac7_runtime::broker::publish::log(c, draft, &audience, now)?;
            }
            Ok::<_, ac7_runtime::broker::db::StoreError>(())
        })
        .unwrap();
    // With replicas, live delivery follows the log: hand these to the (absent) live streams
    // now, as a push would have, so a stream opened later replays them from the log.
    if let Some(follower) = &b.broker.state.follower {
        follower.catch_up(&b.broker.state).unwrap();
    }
}

fn draft(from: &str, to: Option<&str>, body: String) -> ac7_runtime::broker::publish::Draft {
    ac7_runtime::broker::publish::Draft {
        to: to.map(str::to_owned),
        from: from.into(),
        title: None,
        body,
        level: Default::default(),
        data: Default::default(),
        attachments: vec![],
    }
}

/// 2,700 visible messages (and 300 hidden ones between them) after the id.
fn log_gap(b: &broker_support::TestBroker) {
    log_many(b, 3000, |i| {
        if i % 10 == 9 {
            draft("director", Some("reviewer"), format!("hidden{i}"))
        } else {
            draft("director", None, format!("m{}", i - i / 10))
        }
    });
}

#[tokio::test]
async fn replay_of_a_long_gap_is_complete_then_live_without_gap_or_duplicate() {
    let b = start_broker().await;
    let first = b.push("director", json!({"body": "start"})).await;
    log_gap(&b);
    let mut s = b.sse("builder", first["id"].as_str()).await;
    // Pushed after the subscription, while the replay is still to be read.
    let mut live = Vec::new();
    for i in 0..50 {
        live.push(
            b.push("reviewer", json!({"body": format!("live{i}")}))
                .await,
        );
    }
    for i in 0..2700 {
        let m = s.next_message().await;
        assert_eq!(
            m["body"],
            format!("m{i}"),
            "replayed in order, none skipped"
        );
    }
    for sent in &live {
        assert_eq!(
            &s.next_message().await,
            sent,
            "live follows with no gap or duplicate"
        );
    }
    let after = b.push("director", json!({"body": "after"})).await;
    assert_eq!(s.next_message().await, after);

    // The same over WebSocket (`lastEventId` in the query).
    let mut ws = b.ws_query("builder", first["id"].as_str().unwrap()).await;
    for i in 0..2700 {
        assert_eq!(ws.next_message().await["body"], format!("m{i}"));
    }
    for sent in &live {
        assert_eq!(&ws.next_message().await, sent);
    }
    assert_eq!(ws.next_message().await, after);
}

#[tokio::test]
async fn an_unknown_last_event_id_gets_a_reset_then_live() {
    let b = start_broker().await;
    let mut s = b.sse("builder", Some("no-such-id")).await;
    let reset = s.next_event().await;
    assert_eq!(reset.event.as_deref(), Some("reset"));
    assert_eq!(reset.id, None);
    let data: serde_json::Value = serde_json::from_str(&reset.data).unwrap();
    assert_eq!(
        data,
        json!({
            "type": "reset",
            "reason": "unknown-last-event-id",
            "lastEventId": "no-such-id",
            "detail": "no message with this id in the broker's log; live from now on, backfill from /history"
        })
    );
    let mut ws = b.ws_query("builder", "no-such-id").await;
    assert_eq!(
        ws.next_message().await,
        data,
        "the same reset as a WebSocket text frame"
    );
    let live = b.push("director", json!({"body": "live"})).await;
    assert_eq!(s.next_message().await, live);
    assert_eq!(ws.next_message().await, live);
}

#[tokio::test]
async fn history_pages_exactly_with_id_cursors_when_messages_share_a_millisecond() {
    let b = start_broker().await;
    log_many(&b, 3001, |i| {
        if i % 10 == 9 {
            draft("director", Some("reviewer"), format!("hidden{i}"))
        } else {
            draft("director", None, format!("m{}", i - i / 10))
        }
    });
    // 2,701 visible to builder: m0 ..= m2700.
    let all = b.get("/history?limit=1", "builder").await.json["messages"][0].clone();
    assert_eq!(all["body"], "m2700");

    // Newest first with before_id.
    let mut bodies = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            None => "/history?limit=100".to_owned(),
            Some(id) => format!("/history?limit=100&before_id={id}"),
        };
        let page = b.get(&path, "builder").await.json["messages"]
            .as_array()
            .unwrap()
            .clone();
        let Some(last) = page.last() else { break };
        cursor = Some(last["id"].as_str().unwrap().to_owned());
        bodies.extend(page.iter().map(|m| m["body"].as_str().unwrap().to_owned()));
        assert!(bodies.len() <= 2701, "paging never ends");
    }
    let expected: Vec<String> = (0..2701).rev().map(|i| format!("m{i}")).collect();
    assert_eq!(
        bodies, expected,
        "before_id: every message once, newest first"
    );

    // Oldest first with after_id, starting from `after` (ms).
    let mut bodies = Vec::new();
    let mut path = "/history?limit=100&after=0".to_owned();
    loop {
        let page = b.get(&path, "builder").await.json["messages"]
            .as_array()
            .unwrap()
            .clone();
        let Some(last) = page.last() else { break };
        path = format!(
            "/history?limit=100&after_id={}",
            last["id"].as_str().unwrap()
        );
        bodies.extend(page.iter().map(|m| m["body"].as_str().unwrap().to_owned()));
        assert!(bodies.len() <= 2701, "paging never ends");
    }
    let expected: Vec<String> = (0..2701).map(|i| format!("m{i}")).collect();
    assert_eq!(
        bodies, expected,
        "after_id: every message once, oldest first"
    );

    let bad = b.get("/history?after_id=nope", "builder").await;
    assert_eq!(bad.status, 400, "{}", bad.text);
}

#[tokio::test]
async fn slow_subscriber_is_disconnected_and_catches_up_by_replay() {
    let b = start_with(|c| c.queue_capacity = 4).await;
    let mut slow = b.sse("builder", None).await;
    let mut fast = b.sse("reviewer", None).await;
    let total = 300;
    let body = "x".repeat(60_000);
    let fast_task = tokio::spawn(async move {
        let mut ids = Vec::new();
        for _ in 0..total {
            ids.push(fast.next_message().await["id"].as_str().unwrap().to_owned());
        }
        ids
    });
    let mut sent = Vec::new();
    for _ in 0..total {
        sent.push(
            b.push("director", json!({"body": body})).await["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    // the fast reader got everything, in order
    assert_eq!(fast_task.await.unwrap(), sent);
    // the slow one was cut off: it drains what it had, then its stream ends
    let mut got = Vec::new();
    while let Some(block) = tokio::time::timeout(Duration::from_secs(5), slow.next_block())
        .await
        .unwrap()
    {
        if let Some(id) = block.lines().find_map(|l| l.strip_prefix("id: ")) {
            got.push(id.to_owned());
        }
    }
    assert!(
        got.len() < total,
        "the slow subscriber should have been disconnected"
    );
    assert_eq!(
        got[..],
        sent[..got.len()],
        "what it got is a prefix, in order"
    );
    // reconnecting with Last-Event-ID replays the rest
    let mut again = b.sse("builder", got.last().map(String::as_str)).await;
    for id in &sent[got.len()..] {
        assert_eq!(again.next_message().await["id"].as_str().unwrap(), id);
    }
}

/// For a pseudo-random mix of DMs, broadcasts, channel posts and objective-thread
/// posts, what each member received live is exactly what `/history` shows them.
#[tokio::test]
async fn history_matches_live_delivery_for_every_member() {
    let b = start_broker().await;
    let members = ["director", "builder", "reviewer"];
    let mut streams = Vec::new();
    for m in members {
        streams.push(b.sse(m, None).await);
    }
    let chan = b
        .post("/channels", "builder", json!({"slug": "dev"}))
        .await
        .json["id"]
        .as_str()
        .unwrap()
        .to_owned();
    b.post(
        "/channels/dev/members",
        "builder",
        json!({"member": "director"}),
    )
    .await;
    let obj = b
        .post(
            "/objectives",
            "director",
            json!({"title": "t", "outcome": "o", "assignee": "reviewer"}),
        )
        .await
        .json["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // deterministic pseudo-random choices (no clock, no OS randomness)
    let mut seed: u64 = 0x5eed;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    let mut sent = 0;
    while sent < 40 {
        let from = members[next(3) as usize];
        let body = match next(4) {
            0 => json!({"to": members[next(3) as usize], "body": format!("dm {sent}")}),
            1 => json!({"body": format!("general {sent}")}),
            2 => {
                json!({"body": format!("chan {sent}"), "data": {"thread": format!("chan:{chan}")}})
            }
            _ => json!({"body": format!("obj {sent}"), "data": {"thread": format!("obj:{obj}")}}),
        };
        // builder/director are in #dev; director (admin) and reviewer (assignee) in the objective thread
        if b.post("/push", from, body).await.status == 200 {
            sent += 1;
        }
    }
    for (i, m) in members.iter().enumerate() {
        let history = b.get("/history?limit=1000", m).await.json["messages"]
            .as_array()
            .unwrap()
            .clone();
        let mut live = Vec::new();
        for _ in 0..history.len() {
            live.push(streams[i].next_message().await);
        }
        streams[i].expect_silence(100).await;
        let mut history = history;
        history.reverse();
        assert_eq!(live, history, "live and history differ for {m}");
    }
}

#[tokio::test]
async fn shutdown_ends_live_streams_and_completes() {
    let b = start_broker().await;
    let mut sse = b.sse("builder", None).await;
    let mut ws = b.ws("reviewer", None).await;
    let done = tokio::time::timeout(Duration::from_secs(5), b.broker.shutdown()).await;
    assert!(
        matches!(done, Ok(Ok(()))),
        "shutdown did not complete: {done:?}"
    );
    let end = tokio::time::timeout(Duration::from_secs(5), sse.next_block())
        .await
        .unwrap();
    assert!(end.is_none(), "the SSE stream should end, got {end:?}");
    use futures_util::StreamExt;
    let frame = tokio::time::timeout(Duration::from_secs(5), ws.ws.next())
        .await
        .unwrap();
    match frame {
        Some(Ok(tokio_tungstenite::tungstenite::Message::Close(Some(c)))) => {
            assert_eq!(u16::from(c.code), 1013)
        }
        None | Some(Err(_)) => {}
        other => panic!("expected the socket to close, got {other:?}"),
    }
}

/// A push that finds the broker idle is committed where it arrived, without the writer thread,
/// and is delivered like any other, in order.
#[tokio::test]
async fn a_lone_push_is_committed_in_place_and_delivered_in_order() {
    if broker_support::sqlite_only("the in-place commit is SQLite's") {
        return;
    }
    let b = start_broker().await;
    let mut sub = b.sse("builder", None).await;
    for i in 0..5 {
        let sent = b
            .push("director", json!({"body": format!("alone {i}")}))
            .await;
        assert_eq!(sub.next_message().await, sent);
    }
    let stats = b.broker.state.commit_stats();
    assert_eq!(stats.pushes, 5, "{stats:?}");
    // Each push was alone; one may still have met a write of the broker's own (a cursor, a
    // presence change) holding the connection and gone to the writer thread.
    assert!(stats.in_place >= 4, "{stats:?}");
    assert_eq!(stats.in_place + stats.queued, 5, "{stats:?}");
}

/// Pushes that arrive while the store is busy wait for the writer thread and are committed
/// together; each is acknowledged, logged once, and delivered in log order.
#[tokio::test]
async fn queued_pushes_are_group_committed_in_order() {
    if broker_support::sqlite_only("holding the one write connection") {
        return;
    }
    let b = start_broker().await;
    let mut sub = b.sse("builder", None).await;
    // Warm the token cache so the requests below need the store only to commit.
    let first = b.push("director", json!({"body": "warm-up"})).await;
    assert_eq!(sub.next_message().await, first);
    let before = b.broker.state.commit_stats();
    let state = std::sync::Arc::clone(&b.broker.state);
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    // Hold the store until every push below is queued (at most 10 s).
    let holder = std::thread::spawn(move || {
        state.store.with(|_| {
            locked_tx.send(()).unwrap();
            let _ = release_rx.recv_timeout(Duration::from_secs(10));
        });
    });
    locked_rx.recv().unwrap();
    let mut pushes = Vec::new();
    for i in 0..20 {
        let (http, url, token) = (
            b.http.clone(),
            b.url.clone(),
            b.token("director").to_owned(),
        );
        pushes.push(tokio::spawn(async move {
            let r = http
                .post(format!("{url}/push"))
                .bearer_auth(token)
                .json(&json!({"body": format!("queued {i}")}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 200);
        }));
    }
    // With the write connection held, not one of these 20 is committed in place: every one
    // goes to the writer thread.
    crate::common::wait_until("20 pushes queued", Duration::from_secs(10), async || {
        b.broker.state.commit_stats().queued == before.queued + 20
    })
    .await;
    release_tx.send(()).unwrap();
    for p in pushes {
        p.await.unwrap();
    }
    holder.join().unwrap();
    // The 20 pushes queued behind the held lock were committed in batches, not one by one.
    let stats = b.broker.state.commit_stats();
    assert_eq!(stats.pushes, 21, "{stats:?}");
    assert_eq!(stats.in_place, before.in_place, "{stats:?}");
    assert!(
        stats.grouped >= 1 && stats.largest > 1 && stats.commits < 21,
        "no group commit happened: {stats:?}"
    );
    let mut history = b.get("/history?limit=20", "builder").await.json["messages"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        history
            .iter()
            .all(|m| m["body"].as_str().unwrap().starts_with("queued "))
    );
    history.reverse();
    for h in history {
        assert_eq!(sub.next_message().await, h);
    }
}

#[tokio::test]
async fn history_does_not_wait_for_the_write_lock() {
    if broker_support::sqlite_only("the one write connection") {
        return;
    }
    let b = start_broker().await;
    let sent = b.push("director", json!({"body": "hello"})).await;
    // Authenticate once first (the token check itself is cached for a few seconds).
    assert_eq!(b.get("/history?limit=1", "builder").await.status, 200);
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let state = std::sync::Arc::clone(&b.broker.state);
    // Hold the write path's lock until /history has answered (or 10 s passed).
    let holder = std::thread::spawn(move || {
        state.store.with(|_conn| {
            let _ = held_tx.send(());
            done_rx.recv_timeout(Duration::from_secs(10)).is_ok()
        })
    });
    held_rx.await.unwrap();
    let history = b.get("/history?limit=10", "builder").await;
    let _ = done_tx.send(());
    assert!(
        holder.join().unwrap(),
        "/history waited for the write lock (answered only after the holder gave up)"
    );
    assert_eq!(history.json["messages"][0], sent);
}

/// Where a member's first runner resumes: before any live stream of it, the briefing points
/// at the last message logged before the member joined, or says nothing was delivered when no
/// such message exists; once its stream got a message, at that message.
#[tokio::test]
async fn the_briefing_says_where_a_first_runner_resumes() {
    let b = start_broker().await;
    // Members made with the team, on an empty log.
    let r = b.get("/briefing", "builder").await;
    assert_eq!(r.json["deliveredNothing"], json!(true), "{}", r.text);
    assert!(r.json.get("deliveredThrough").is_none(), "{}", r.text);
    let before = b.push("director", json!({"body": "before scout"})).await;
    let r = b.get("/briefing", "builder").await;
    assert_eq!(
        r.json["deliveredNothing"],
        json!(true),
        "still nothing delivered: {}",
        r.text
    );

    let r = b
        .post(
            "/members",
            "director",
            json!({"name": "scout", "role": {"title": "scout"}, "permissions": []}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let scout = r.json["token"].as_str().unwrap().to_owned();
    b.push("director", json!({"to": "scout", "body": "after scout"}))
        .await;
    let r = b
        .http
        .get(format!("{}/briefing", b.url))
        .bearer_auth(&scout)
        .send()
        .await
        .unwrap();
    let briefing: serde_json::Value = r.json().await.unwrap();
    assert_eq!(briefing["deliveredThrough"], before["id"], "{briefing}");
    assert!(briefing.get("deliveredNothing").is_none(), "{briefing}");
}
