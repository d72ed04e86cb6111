//! Member activity over HTTP: uploads in the TypeScript runner's
//! shape, listing with filters and cursor, visibility, the live stream.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use crate::broker_support;

use broker_support::start_broker;
use serde_json::{Value, json};

/// An `llm_exchange` exactly as the TypeScript runner uploads it.
pub(crate) fn exchange(ts: u64) -> Value {
    json!({
        "kind": "llm_exchange",
        "ts": ts,
        "duration": 1200,
        "entry": {
            "kind": "anthropic_messages",
            "startedAt": ts,
            "endedAt": ts + 1200,
            "request": {
                "model": "claude-sonnet-4-5",
                "maxTokens": 4096,
                "temperature": null,
                "system": "You are builder.",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "work on obj-1"}]},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "ls", "input": {"path": "/"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "toolUseId": "tu_1", "content": "a b", "isError": false}]}
                ],
                "tools": [{"name": "ls", "description": null, "inputSchema": {"type": "object"}}]
            },
            "response": {
                "stopReason": "end_turn",
                "stopSequence": null,
                "messages": [{"role": "assistant", "content": [{"type": "text", "text": "done"}]}],
                "usage": {"inputTokens": 100, "outputTokens": 20, "cacheCreationInputTokens": 5, "cacheReadInputTokens": 50},
                "status": 200
            }
        }
    })
}

fn ids(r: &Value) -> Vec<u64> {
    r["activity"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["id"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn upload_list_filters_and_visibility() {
    let b = start_broker().await;
    let body = json!({"events": [
        {"kind": "objective_open", "ts": 1000, "objectiveId": "obj-1"},
        exchange(2000),
        {"kind": "opaque_http", "ts": 3000, "duration": 5, "entry": {
            "kind": "opaque_http", "startedAt": 3000, "endedAt": 3005, "host": "example.com",
            "method": "GET", "url": "/x?y=1", "status": 200,
            "requestHeaders": {"accept": "*/*"}, "responseHeaders": {},
            "requestBodyPreview": null, "responseBodyPreview": "ok"}},
        {"kind": "objective_close", "ts": 4000, "objectiveId": "obj-1", "result": "done"}
    ]});
    let r = b.post("/members/builder/activity", "builder", body).await;
    assert_eq!((r.status, r.json.clone()), (201, json!({"accepted": 4})));

    // Someone else's stream: 403, whoever uploads.
    let r = b
        .post(
            "/members/reviewer/activity",
            "builder",
            json!({"events": [exchange(1)]}),
        )
        .await;
    assert_eq!(
        (r.status, r.json.clone()),
        (
            403,
            json!({"error": "user 'builder' cannot upload activity for 'reviewer'"})
        )
    );
    // Bad bodies: 400, nothing stored.
    for bad in [
        json!({"events": []}),
        json!({"events": [{"kind": "objective_open", "ts": 1, "objectiveId": ""}]}),
        json!({"events": [{"kind": "nope", "ts": 1}]}),
        json!([]),
    ] {
        let r = b.post("/members/builder/activity", "builder", bad).await;
        assert_eq!(
            (r.status, r.json["error"].clone()),
            (400, json!("invalid activity payload"))
        );
    }
    let too_many: Vec<Value> = (0..501)
        .map(|i| json!({"kind": "objective_open", "ts": i, "objectiveId": "o"}))
        .collect();
    let r = b
        .post(
            "/members/builder/activity",
            "builder",
            json!({"events": too_many}),
        )
        .await;
    assert_eq!(r.status, 400);
    let r = b
        .post(
            "/members/bad%20name/activity",
            "builder",
            json!({"events": [exchange(1)]}),
        )
        .await;
    assert_eq!(
        (r.status, r.json.clone()),
        (400, json!({"error": "invalid name"}))
    );

    // The member reads its own stream, newest first, the upload's shape intact.
    let r = b.get("/members/builder/activity", "builder").await;
    assert_eq!(r.status, 200);
    let rows = r.json["activity"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[0]["event"]["kind"], "objective_close");
    assert_eq!(rows[2]["event"], exchange(2000));
    assert_eq!(rows[2]["memberName"], "builder");
    assert!(rows[2]["createdAt"].as_u64().unwrap() > 1_600_000_000_000);
    let all = ids(&r.json);
    assert!(all.windows(2).all(|w| w[0] > w[1]));

    // An admin (holds activity.read) reads it; a plain member does not.
    assert_eq!(
        b.get("/members/builder/activity", "director").await.status,
        200
    );
    let r = b.get("/members/builder/activity", "reviewer").await;
    assert_eq!(
        (r.status, r.json.clone()),
        (
            403,
            json!({"error": "reading activity requires activity.read permission, or self"})
        )
    );

    // Filters: time range (inclusive), kind (repeatable), cursor, limit.
    let r = b
        .get("/members/builder/activity?from=2000&to=3000", "builder")
        .await;
    assert_eq!(ids(&r.json), vec![all[1], all[2]]);
    let r = b
        .get(
            "/members/builder/activity?kind=objective_open&kind=objective_close",
            "builder",
        )
        .await;
    assert_eq!(ids(&r.json), vec![all[0], all[3]]);
    let r = b.get("/members/builder/activity?limit=2", "builder").await;
    assert_eq!(ids(&r.json), vec![all[0], all[1]]);
    let r = b
        .get(
            &format!("/members/builder/activity?limit=2&before_id={}", all[1]),
            "builder",
        )
        .await;
    assert_eq!(ids(&r.json), vec![all[2], all[3]]);
    let r = b
        .get("/members/builder/activity?limit=5000", "builder")
        .await;
    assert_eq!(ids(&r.json), all);
    for (q, msg) in [
        (
            "limit=-1",
            "invalid `limit` parameter: expected a positive integer",
        ),
        (
            "limit=0",
            "invalid `limit` parameter: expected a positive integer",
        ),
        (
            "limit=ten",
            "invalid `limit` parameter: expected an integer",
        ),
        ("from=x", "invalid `from` parameter: expected an integer"),
        ("kind=chat", "invalid kind: chat"),
    ] {
        let r = b
            .get(&format!("/members/builder/activity?{q}"), "builder")
            .await;
        assert_eq!(
            (r.status, r.json.clone()),
            (400, json!({"error": msg})),
            "{q}"
        );
    }
    // A member with no activity (or no such member): an empty list.
    let r = b.get("/members/ghost/activity", "director").await;
    assert_eq!((r.status, r.json.clone()), (200, json!({"activity": []})));
}

fn marker(ts: u64) -> Value {
    json!({"kind": "objective_open", "ts": ts, "objectiveId": "obj-9"})
}

#[tokio::test]
async fn live_stream_sse_ws_replay_and_visibility() {
    let b = start_broker().await;
    let path = "/members/builder/activity/stream";
    // Visibility: a plain member may not watch another's stream.
    let r = b.get(path, "reviewer").await;
    assert_eq!(
        (r.status, r.json.clone()),
        (
            403,
            json!({"error": "streaming activity requires activity.read permission, or self"})
        )
    );
    let mut agent = b.sse("builder", None).await;
    let mut sse = b.sse_path("director", path, None).await;
    let mut ws = b.ws_path("builder", path, None).await;
    let r = b
        .post(
            "/members/builder/activity",
            "builder",
            json!({"events": [marker(1), exchange(2)]}),
        )
        .await;
    assert_eq!(r.status, 201);
    let first = sse.next_event().await;
    assert_eq!(first.event.as_deref(), Some("activity"));
    let row: Value = serde_json::from_str(&first.data).unwrap();
    assert_eq!(first.id, Some(row["id"].to_string()));
    assert_eq!(
        (row["memberName"].clone(), row["event"].clone()),
        (json!("builder"), marker(1))
    );
    let second: Value = serde_json::from_str(&sse.next_event().await.data).unwrap();
    assert_eq!(second["event"], exchange(2));
    assert_eq!(ws.next_message().await, row);
    assert_eq!(ws.next_message().await, second);
    // Another member's uploads do not reach this stream.
    b.post(
        "/members/reviewer/activity",
        "reviewer",
        json!({"events": [marker(3)]}),
    )
    .await;
    // Activity never reaches the agent's own channel.
    let m = b
        .push("director", json!({"to": "builder", "body": "ping"}))
        .await;
    let got = agent.next_event().await;
    assert_eq!(
        (got.event.as_deref(), got.id),
        (Some("message"), Some(m["id"].as_str().unwrap().to_owned()))
    );

    // Last-Event-ID: replay after that row, then live.
    b.post(
        "/members/builder/activity",
        "builder",
        json!({"events": [marker(4)]}),
    )
    .await;
    let mut resumed = b
        .sse_path("builder", path, Some(&first.id.clone().unwrap()))
        .await;
    let ev: Value = serde_json::from_str(&resumed.next_event().await.data).unwrap();
    assert_eq!(ev, second);
    let ev: Value = serde_json::from_str(&resumed.next_event().await.data).unwrap();
    assert_eq!(ev["event"], marker(4));
    b.post(
        "/members/builder/activity",
        "builder",
        json!({"events": [marker(5)]}),
    )
    .await;
    let ev: Value = serde_json::from_str(&resumed.next_event().await.data).unwrap();
    assert_eq!(ev["event"], marker(5));
    // An id this broker never handed out: reset first.
    let mut reset = b.sse_path("builder", path, Some("999999")).await;
    let ev = reset.next_event().await;
    assert_eq!(ev.event.as_deref(), Some("reset"));
}

#[tokio::test]
async fn objective_activity_spans_assignees_intervals() {
    let b = start_broker().await;
    let r = b
        .post(
            "/objectives",
            "director",
            json!({"title": "t", "outcome": "o", "assignee": "builder", "watchers": ["reviewer"]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let id = r.json["id"].as_str().unwrap().to_owned();
    let open = |ts: u64, o: &str| json!({"kind": "objective_open", "ts": ts, "objectiveId": o});
    let close = |ts: u64, o: &str| json!({"kind": "objective_close", "ts": ts, "objectiveId": o, "result": "reassigned"});
    // builder: works on it 100..200, then on something else; reviewer from 300, still open.
    let r = b
        .post(
            "/members/builder/activity",
            "builder",
            json!({"events": [exchange(50), open(100, &id), exchange(150), close(200, &id),
                              open(240, "obj-other"), exchange(250)]}),
        )
        .await;
    assert_eq!(r.status, 201);
    let r = b
        .post(
            "/members/reviewer/activity",
            "reviewer",
            json!({"events": [exchange(290), open(300, &id), exchange(350)]}),
        )
        .await;
    assert_eq!(r.status, 201);

    let path = format!("/objectives/{id}/activity");
    let r = b.get(&path, "director").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let got: Vec<(String, u64)> = r.json["activity"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["memberName"].as_str().unwrap().to_owned(),
                row["event"]["ts"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![("reviewer".to_owned(), 350), ("builder".to_owned(), 150)]
    );
    assert_eq!(
        r.json["intervals"],
        json!([{"memberName": "builder", "from": 100, "to": 200},
               {"memberName": "reviewer", "from": 300, "to": null}])
    );
    // Without activity.read: only the caller's own part.
    let r = b.get(&path, "builder").await;
    assert_eq!(r.json["activity"].as_array().unwrap().len(), 1);
    assert_eq!(r.json["activity"][0]["memberName"], "builder");
    // Paging and errors.
    let r = b.get(&format!("{path}?limit=1"), "director").await;
    assert_eq!(r.json["activity"][0]["event"]["ts"], 350);
    let r = b.get("/objectives/obj-nope/activity", "director").await;
    assert_eq!(r.status, 404);
}

/// An `llm_exchange` whose request carries `messages` user texts and, when `tools`, one tool.
pub(crate) fn exchange_with(ts: u64, texts: &[&str], tools: bool) -> Value {
    let mut e = exchange(ts);
    let request = &mut e["entry"]["request"];
    request["messages"] = texts
        .iter()
        .map(|t| json!({"role": "user", "content": [{"type": "text", "text": t}]}))
        .collect();
    request["system"] = json!([{"type": "text", "text": "You are builder."}]);
    if !tools {
        request["tools"] = Value::Null;
    }
    e
}

#[tokio::test]
async fn objective_context_reminder_once_per_cooldown_and_not_for_side_requests() {
    let b = start_broker().await;
    let mut ids = Vec::new();
    for (title, assignee) in [
        ("Kept", "builder"),
        ("Forgotten", "builder"),
        ("Theirs", "reviewer"),
    ] {
        let r = b
            .post(
                "/objectives",
                "director",
                json!({"title": title, "outcome": format!("{title} done"), "assignee": assignee}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        ids.push(r.json["id"].as_str().unwrap().to_owned());
    }
    let mut builder = b.sse("builder", None).await;
    let upload = |events: Vec<Value>| {
        let b = &b;
        async move {
            let r = b
                .post(
                    "/members/builder/activity",
                    "builder",
                    json!({ "events": events }),
                )
                .await;
            assert_eq!(r.status, 201, "{}", r.text);
        }
    };
    // Side requests (no tools, or a single message) never remind, even as the last exchange.
    upload(vec![exchange_with(1, &["summarize", "this"], false)]).await;
    upload(vec![
        exchange_with(2, &["x", "y"], true),
        exchange_with(3, &["title?"], true),
    ])
    .await;
    builder.expect_silence(300).await;
    // A main-loop request that mentions only the first objective: one DM for the second.
    let kept = format!("working on {}", ids[0]);
    upload(vec![exchange_with(4, &["hi", &kept, "ok"], true)]).await;
    let m = builder.next_message().await;
    assert_eq!(m["from"], "ac7");
    assert_eq!(m["to"], "builder");
    assert_eq!(m["title"], "objective context reminder");
    assert_eq!(m["level"], "notice");
    assert_eq!(
        m["body"],
        format!(
            "You have 1 active objective(s) that are no longer in your context. Here they are — call `objectives_view` for full details:\n  {}: Forgotten\n    outcome: Forgotten done",
            ids[1]
        )
    );
    // Within 5 minutes the same objective does not fire again.
    upload(vec![exchange_with(5, &["hi", &kept, "ok"], true)]).await;
    builder.expect_silence(300).await;
}

/// A coding agent's model session of `n` exchanges in the upload shape: the same system prompt
/// and tools every time, a conversation that grows by a turn and a tool result per exchange
/// and starts again from a summary every 12 exchanges, and a small side call every 5th.
pub(crate) fn session(n: u64, who: &str) -> Vec<Value> {
    let system = json!([{"type": "text", "text": format!("You are {who}. Work carefully.")}]);
    let tools = json!([
        {"name": "bash", "description": "Runs a command.", "inputSchema": {"type": "object",
            "properties": {"command": {"type": "string"}}, "required": ["command"]}},
        {"name": "read", "description": null, "inputSchema": {"type": "object"}}
    ]);
    let mut conversation =
        vec![json!({"role": "user", "content": [{"type": "text", "text": "work on obj-1"}]})];
    let mut out = Vec::new();
    for i in 0..n {
        let ts = 10_000 + i * 100;
        let (request, reply) = if i % 5 == 4 {
            (
                json!({"model": "claude-haiku-4-5", "maxTokens": 512, "temperature": 0,
                    "system": "Name this session.",
                    "messages": [{"role": "user", "content": [{"type": "text", "text": format!("session {i}")}]}],
                    "tools": null}),
                json!({"role": "assistant", "content": [{"type": "text", "text": "a title"}]}),
            )
        } else {
            let reply = json!({"role": "assistant", "content": [
                {"type": "thinking", "text": format!("step {i}")},
                {"type": "text", "text": format!("running step {i}")},
                {"type": "tool_use", "id": format!("tu_{i}"), "name": "bash",
                    "input": {"command": format!("make step{i}"), "n": i}}]});
            let request = json!({"model": "claude-sonnet-4-5", "maxTokens": 32000,
                "temperature": null, "system": system, "messages": conversation, "tools": tools});
            conversation.push(reply.clone());
            conversation.push(json!({"role": "user", "content": [{"type": "tool_result",
                "toolUseId": format!("tu_{i}"), "content": [{"type": "text", "text": format!("output {i}")}],
                "isError": i % 7 == 0}]}));
            if i % 12 == 11 {
                conversation = vec![json!({"role": "user", "content": [
                    {"type": "text", "text": format!("summary up to {i}")},
                    {"type": "image", "mediaType": "image/png"}]})];
            }
            (request, reply)
        };
        out.push(json!({
            "kind": "llm_exchange", "ts": ts, "duration": 50,
            "entry": {"kind": "anthropic_messages", "api": "anthropic_messages",
                "startedAt": ts, "endedAt": ts + 50, "request": request,
                "response": {"stopReason": "tool_use", "stopSequence": null, "messages": [reply],
                    "usage": {"inputTokens": 3, "outputTokens": 40,
                        "cacheCreationInputTokens": null, "cacheReadInputTokens": 900},
                    "status": 200}}
        }));
    }
    out
}

/// Exchanges keep their system prompt, tools and conversation in shared blocks: every way of
/// reading them back (list pages in both orders, the live stream, its replay) gives each event
/// exactly as uploaded.
#[tokio::test]
async fn exchanges_read_back_exactly_as_uploaded() {
    let b = start_broker().await;
    let path = "/members/builder/activity/stream";
    let mut live = b.sse_path("director", path, None).await;
    let events = session(40, "builder");
    // As the runner uploads: a few events at a time, with markers between.
    let mut uploaded = Vec::new();
    for (i, chunk) in events.chunks(7).enumerate() {
        let mut batch = chunk.to_vec();
        batch.push(marker(20_000 + i as u64));
        let r = b
            .post(
                "/members/builder/activity",
                "builder",
                json!({ "events": batch }),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
        uploaded.extend(batch);
    }
    // Another member with the same tools: its rows are its own.
    let theirs = session(6, "reviewer");
    let r = b
        .post(
            "/members/reviewer/activity",
            "reviewer",
            json!({ "events": theirs }),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);

    let events_of = |r: &Value| -> Vec<Value> {
        r["activity"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row["event"].clone())
            .collect()
    };
    let all = b
        .get("/members/builder/activity?limit=1000", "director")
        .await;
    assert_eq!(all.status, 200, "{}", all.text);
    let mut newest_first = uploaded.clone();
    newest_first.reverse();
    assert_eq!(events_of(&all.json), newest_first);
    // Pages of 5 through the cursor.
    let mut paged = Vec::new();
    let mut before: Option<u64> = None;
    loop {
        let url = match before {
            Some(id) => format!("/members/builder/activity?limit=5&before_id={id}"),
            None => "/members/builder/activity?limit=5".to_owned(),
        };
        let page = b.get(&url, "director").await;
        assert_eq!(page.status, 200, "{}", page.text);
        let page_ids = ids(&page.json);
        if page_ids.is_empty() {
            break;
        }
        before = page_ids.last().copied();
        paged.extend(events_of(&page.json));
    }
    assert_eq!(paged, newest_first);
    let exchanges = b
        .get(
            "/members/builder/activity?limit=1000&kind=llm_exchange",
            "director",
        )
        .await;
    assert_eq!(
        events_of(&exchanges.json),
        events.iter().rev().cloned().collect::<Vec<_>>()
    );
    let r = b
        .get("/members/reviewer/activity?limit=1000", "director")
        .await;
    assert_eq!(
        events_of(&r.json),
        theirs.iter().rev().cloned().collect::<Vec<_>>()
    );
    // The live stream, and its replay from the start.
    for want in &uploaded {
        let row: Value = serde_json::from_str(&live.next_event().await.data).unwrap();
        assert_eq!(&row["event"], want);
    }
    let first_id = ids(&all.json).last().copied().unwrap();
    let mut replay = b
        .sse_path("director", path, Some(&first_id.to_string()))
        .await;
    for want in &uploaded[1..] {
        let row: Value = serde_json::from_str(&replay.next_event().await.data).unwrap();
        assert_eq!(&row["event"], want);
    }
}

/// The store of the suite's backend: a SQLite file, or a fresh PostgreSQL database.
async fn backend_store() -> (
    ac7_runtime::broker::db::Store,
    tempfile::TempDir,
    Option<crate::common::postgres::TestDb>,
) {
    let dir = tempfile::tempdir().unwrap();
    if broker_support::on_postgres() {
        let db = crate::common::postgres::TestDb::create().await.unwrap();
        let store = ac7_runtime::broker::db::Store::open_postgres(db.config()).unwrap();
        (store, dir, Some(db))
    } else {
        let store = broker_support::open_store(&dir.path().join("ac7.db"));
        (store, dir, None)
    }
}

/// Blocks whose reference count is not the rows and chain blocks pointing at them, and the
/// number of blocks.
fn blocks_check(store: &ac7_runtime::broker::db::Store) -> (Vec<i64>, i64) {
    store
        .view(|c| {
            let wrong = c.query(
                "SELECT b.id FROM activity_blocks b WHERE b.refs <>
                     (SELECT COUNT(*) FROM member_activity a WHERE a.system_block = b.id)
                   + (SELECT COUNT(*) FROM member_activity a WHERE a.tools_block = b.id)
                   + (SELECT COUNT(*) FROM member_activity a WHERE a.messages_block = b.id)
                   + (SELECT COUNT(*) FROM activity_blocks p WHERE p.parent = b.id)",
                ac7_runtime::params![],
                |r| r.get::<i64>(0),
            )?;
            let n = c
                .query_row(
                    "SELECT COUNT(*) FROM activity_blocks",
                    ac7_runtime::params![],
                    |r| r.get::<i64>(0),
                )?
                .unwrap_or(0);
            Ok::<_, ac7_runtime::broker::db::StoreError>((wrong, n))
        })
        .unwrap()
}

/// Pruning old exchanges frees the blocks only they used, keeps those later rows still use,
/// and leaves every remaining row whole; pruning all of them leaves no block.
#[tokio::test]
async fn retention_frees_the_blocks_no_row_uses() {
    use ac7_protocol::trace::activity::ActivityEvent;
    use ac7_runtime::broker::{activity, retention};
    let (store, _dir, _pg) = backend_store().await;
    let parse = |events: Vec<Value>| -> Vec<ActivityEvent> {
        events
            .into_iter()
            .map(|e| serde_json::from_value(e).unwrap())
            .collect()
    };
    // Two members with the same system prompt text for one of them: ts 10,000 + 100 i.
    let ann = parse(session(50, "ann"));
    let bob = parse(session(20, "bob"));
    store
        .tx(|c| {
            activity::append(c, "ann", 0, ann[..25].to_vec(), 1)?;
            activity::append(c, "bob", 0, bob.clone(), 1)?;
            activity::append(c, "ann", 0, ann[25..].to_vec(), 1)
        })
        .unwrap();
    let list = |who: &str| -> Vec<ActivityEvent> {
        let q = activity::Query {
            limit: 1000,
            ..Default::default()
        };
        let mut rows: Vec<ActivityEvent> = store
            .view(|c| activity::list(c, who, &q, false))
            .unwrap()
            .into_iter()
            .map(|r| r.event)
            .collect();
        rows.reverse();
        rows
    };
    assert_eq!(list("ann"), ann);
    assert_eq!(list("bob"), bob);
    let (wrong, all_blocks) = blocks_check(&store);
    assert!(wrong.is_empty(), "reference counts off for {wrong:?}");

    // Everything before ts 12,000: ann's and bob's first 20 exchanges.
    let pruned = store
        .tx(|c| retention::prune_batch(c, 12_000, 1_000))
        .unwrap();
    assert_eq!(pruned, 40);
    assert_eq!(list("ann"), ann[20..].to_vec());
    assert_eq!(list("bob"), Vec::<ActivityEvent>::new());
    let (wrong, some_blocks) = blocks_check(&store);
    assert!(wrong.is_empty(), "reference counts off for {wrong:?}");
    assert!(
        some_blocks < all_blocks,
        "{some_blocks} blocks of {all_blocks} left"
    );

    // The rest: no block is left.
    store
        .tx(|c| retention::prune_batch(c, i64::MAX, 1_000))
        .unwrap();
    assert_eq!(list("ann"), Vec::<ActivityEvent>::new());
    assert_eq!(blocks_check(&store), (Vec::new(), 0));
}
