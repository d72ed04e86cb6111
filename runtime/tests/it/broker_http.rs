//! HTTP tests against a real broker: auth, protocol header, briefing, roster,
//! push, history, bad input, team and member administration.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use crate::broker_support;

use broker_support::{req, start_broker};
use serde_json::json;

#[tokio::test]
async fn health_and_auth_errors() {
    let b = start_broker().await;
    let r = b.raw("GET", "/healthz", None, None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["status"], "ok");

    let r = b.raw("GET", "/briefing", None, None).await;
    assert_eq!(
        (r.status, r.json.clone()),
        (401, json!({"error": "missing credentials"}))
    );

    let resp = b
        .http
        .get(format!("{}/briefing", b.url))
        .header("authorization", "Bearer ")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap(),
        json!({"error": "missing bearer token"})
    );

    let resp = b
        .http
        .get(format!("{}/briefing", b.url))
        .bearer_auth("ac7_not_a_real_token")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap(),
        json!({"error": "unknown token"})
    );

    let resp = b
        .http
        .get(format!("{}/briefing", b.url))
        .bearer_auth(b.token("director"))
        .header("x-ac7-protocol", "2")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap(),
        json!({"error": "unsupported protocol version", "got": "2", "expected": 1})
    );
    let resp = b
        .http
        .get(format!("{}/briefing", b.url))
        .bearer_auth(b.token("director"))
        .header("x-ac7-protocol", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);

    // every authenticated route refuses a missing token
    for (m, p) in [
        ("GET", "/roster"),
        ("POST", "/push"),
        ("GET", "/history"),
        ("GET", "/objectives"),
        ("GET", "/fs/ls"),
    ] {
        assert_eq!(b.raw(m, p, None, None).await.status, 401, "{m} {p}");
    }
}

#[tokio::test]
async fn unknown_route_and_method_are_json() {
    let b = start_broker().await;
    let r = b.get("/nope", "builder").await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json["error"], "no such route: GET /nope");
    let r = b.call("DELETE", "/push", "builder", None).await;
    assert_eq!(r.status, 405);
    assert!(r.json["error"].is_string());
}

#[tokio::test]
async fn briefing_and_roster_shapes() {
    let b = start_broker().await;
    let r = b.get("/briefing", "builder").await;
    assert_eq!(r.status, 200);
    let mut brief = r.json.clone();
    let prose = brief["instructions"].as_str().unwrap().to_owned();
    assert!(prose.contains("builder") && prose.contains("Team: peer-team"));
    brief["instructions"] = json!("<prose>");
    snap!("briefing_builder", brief);

    let r = b.get("/roster", "director").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["connected"].as_array().unwrap().len(), 3);
    assert!(r.json["connected"][0].get("busy").is_none());
    snap!("roster", r.json);

    // busy is reported while fresh
    let r = b
        .post("/presence/busy", "builder", json!({"busy": true}))
        .await;
    assert_eq!(r.status, 204);
    let r = b.get("/roster", "director").await;
    assert_eq!(r.json["connected"][1]["busy"], true);
    b.post("/presence/busy", "builder", json!({"busy": false}))
        .await;
    let r = b.get("/roster", "director").await;
    assert!(r.json["connected"][1].get("busy").is_none());
}

#[tokio::test]
async fn push_stamps_strips_and_validates() {
    let b = start_broker().await;
    let r = b
        .post(
            "/push",
            "builder",
            json!({"to": "reviewer", "body": "ready", "from": "director", "data": {"from": "x", "ts": 1, "msg_id": "m", "level": "l", "title": "t", "target": "g", "ts_ms": "9", "k": "v"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["message"]["from"], "builder");
    assert_eq!(r.json["message"]["data"], json!({"k": "v"}));
    assert_eq!(r.json["delivery"], json!({"live": 0, "targets": 1}));
    snap!("push_dm", r.json);

    let r = b
        .post(
            "/push",
            "director",
            json!({"body": "hello team", "title": "broadcast test", "level": "info"}),
        )
        .await;
    assert_eq!(r.json["delivery"]["targets"], 3);
    snap!("push_broadcast", r.json);

    let answers = b
        .check(vec![
            req("POST", "/push", "builder")
                .body(json!({"to": "nobody", "body": "x"}))
                .answers_json(404, json!({"error": "no such agent: nobody"})),
            req("POST", "/push", "builder")
                .body(json!({"to": "reviewer"}))
                .answers_at(400, "/error", json!("invalid push payload")),
            req("POST", "/push", "builder")
                .body(json!({"body": "x", "level": "loud"}))
                .answers_at(400, "/error", json!("invalid push payload")),
        ])
        .await;
    assert!(answers[1].json["details"].is_array());

    let r = b
        .raw("POST", "/push", Some("builder"), Some(b"not json".to_vec()))
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json["error"], "invalid push payload");
    assert_eq!(
        r.json["details"][0]["message"],
        "Invalid input: expected object, received null"
    );

    let push = |body: serde_json::Value| req("POST", "/push", "builder").body(body);
    b.check(vec![
        push(json!({"body": ""})).answers(400),
        push(json!({"body": "x".repeat(65_537)})).answers_at(
            400,
            "/details/0/code",
            json!("too_big"),
        ),
        push(json!({"body": "x", "title": "t".repeat(201)})).answers(400),
        push(json!({"to": "bad name", "body": "x"})).answers(400),
        // thread validation
        push(json!({"body": "x", "data": {"thread": "dm"}})).answers(400),
        push(json!({"body": "x", "data": {"thread": 5}})).answers(400),
        push(json!({"body": "x", "data": {"thread": "chan:nope"}})).answers_at(
            404,
            "/error",
            json!("no such channel: nope"),
        ),
        push(json!({"body": "x", "data": {"thread": "obj:nope"}})).answers(404),
        push(json!({"body": "general", "data": {"thread": "chan:general"}})).answers(200),
    ])
    .await;
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let b = broker_support::start_with(|c| c.max_json_bytes = 4096).await;
    let big = json!({"body": "x".repeat(5000)});
    let r = b.post("/push", "builder", big).await;
    assert_eq!(r.status, 413);
    assert!(r.json["error"].is_string());
}

#[tokio::test]
async fn history_visibility_and_params() {
    let b = start_broker().await;
    b.push("director", json!({"body": "hello team"})).await;
    b.push(
        "director",
        json!({"to": "builder", "body": "please build X"}),
    )
    .await;
    b.push(
        "builder",
        json!({"to": "reviewer", "body": "ready for review"}),
    )
    .await;
    b.push("builder", json!({"to": "builder", "body": "note to self"}))
        .await;
    // a channel only builder is in
    let r = b.post("/channels", "builder", json!({"slug": "dev"})).await;
    let chan = r.json["id"].as_str().unwrap().to_owned();
    b.push(
        "builder",
        json!({"body": "channel msg", "data": {"thread": format!("chan:{chan}")}}),
    )
    .await;

    let bodies = |r: &broker_support::Resp| -> Vec<String> {
        r.json["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["body"].as_str().unwrap().to_owned())
            .collect()
    };
    let r = b.get("/history", "builder").await;
    assert_eq!(
        bodies(&r),
        vec![
            "channel msg",
            "note to self",
            "ready for review",
            "please build X",
            "hello team"
        ]
    );
    let r = b.get("/history", "reviewer").await;
    // reviewer is not in #dev and not party to director->builder
    assert_eq!(bodies(&r), vec!["ready for review", "hello team"]);
    let r = b.get("/history?with=builder", "reviewer").await;
    assert_eq!(bodies(&r), vec!["ready for review"]);
    let r = b.get("/history?limit=2", "builder").await;
    assert_eq!(bodies(&r).len(), 2);
    let r = b.get("/history?channel=general", "reviewer").await;
    assert_eq!(bodies(&r), vec!["hello team"]);
    let r = b.get("/history?channel=dev", "builder").await;
    assert_eq!(bodies(&r), vec!["channel msg"]);
    let r = b.get("/history?channel=dev", "reviewer").await;
    assert_eq!(
        (r.status, r.json.clone()),
        (403, json!({"error": "not a member of this channel"}))
    );
    let r = b.get("/history?channel=zzz", "reviewer").await;
    assert_eq!(r.status, 404);
    let r = b.get("/history?before=abc", "director").await;
    assert_eq!(
        (r.status, r.json.clone()),
        (400, json!({"error": "invalid `before` parameter"}))
    );
    let r = b.get("/history?with=bad%20name", "director").await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json["error"], "`with` must be a valid name");
    let r = b.get("/history?with=builder&channel=dev", "director").await;
    assert_eq!(r.status, 400);
    let r = b.get("/history?before=1", "director").await;
    assert_eq!(bodies(&r).len(), 0);
    snap!("history_reviewer", b.get("/history", "reviewer").await.json);
}

#[tokio::test]
async fn the_roster_shows_each_member_change_at_once() {
    let b = start_broker().await;
    broker_support::rosters_follow_member_changes(&b, &[&b]).await;
}

#[tokio::test]
async fn team_members_and_tokens() {
    let b = start_broker().await;
    let r = b.get("/team", "builder").await;
    assert_eq!(r.json["team"]["name"], "peer-team");
    snap!("team", r.json);
    let r = b.get("/members", "builder").await;
    assert!(r.json["members"][0].get("instructions").is_none());
    let r = b.get("/members", "director").await;
    assert_eq!(r.json["members"][0]["instructions"], "");

    b.check(vec![
        req("POST", "/members", "builder")
            .body(json!({"name": "scout", "role": {"title": "scout"}, "permissions": []}))
            .answers_json(
                403,
                json!({"error": "creating members requires the members.manage permission"}),
            ),
        req("POST", "/members", "director")
            .body(json!({"name": "bad name!", "role": {"title": "x"}}))
            .answers_at(400, "/error", json!("invalid member payload")),
    ])
    .await;
    let r = b
        .post("/members", "director", json!({"name": "scout", "role": {"title": "scout", "description": "Scouts."}, "instructions": "look around", "permissions": ["operator"]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["member"]["permissions"],
        json!([
            "objectives.create",
            "objectives.cancel",
            "objectives.reassign"
        ])
    );
    let scout_token = r.json["token"].as_str().unwrap().to_owned();
    assert!(scout_token.starts_with("ac7_") && scout_token.len() == 47);
    snap!("member_created", r.json);
    let r = b
        .post(
            "/members",
            "director",
            json!({"name": "scout", "role": {"title": "x"}, "permissions": []}),
        )
        .await;
    assert_eq!(r.status, 409);
    let r = b
        .post(
            "/members",
            "director",
            json!({"name": "x", "role": {"title": "x"}, "permissions": ["boss"]}),
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(
        r.json["error"]
            .as_str()
            .unwrap()
            .contains("unknown permission or preset 'boss'")
    );

    // the new member can authenticate, appears in the roster and can receive DMs
    let resp = b
        .http
        .get(format!("{}/briefing", b.url))
        .bearer_auth(&scout_token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        b.get("/roster", "builder").await.json["connected"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    b.push("builder", json!({"to": "scout", "body": "hi"}))
        .await;

    b.check(vec![
        req("PATCH", "/members/scout", "director")
            .body(json!({"instructions": "new"}))
            .answers_at(200, "/instructions", json!("new")),
        req("PATCH", "/members/director", "director")
            .body(json!({"permissions": []}))
            .answers(409),
        req("PATCH", "/members/ghost", "director")
            .body(json!({"instructions": "x"}))
            .answers(404),
    ])
    .await;

    // tokens: self may list/rotate, others may not
    let r = b.get("/members/builder/tokens", "builder").await;
    assert_eq!(r.json["tokens"].as_array().unwrap().len(), 1);
    assert!(r.json["tokens"][0]["lastUsedAt"].is_i64(), "{}", r.text);
    assert_eq!(r.json["tokens"][0]["origin"], "bootstrap");
    let r = b.get("/members/builder/tokens", "reviewer").await;
    assert_eq!(r.status, 403);
    let old = b.token("builder").to_owned();
    let r = b
        .post("/members/builder/rotate-token", "builder", json!({}))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["tokenInfo"]["origin"], "rotate");
    let new = r.json["token"].as_str().unwrap().to_owned();
    let resp = b
        .http
        .get(format!("{}/briefing", b.url))
        .bearer_auth(&old)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let resp = b
        .http
        .get(format!("{}/briefing", b.url))
        .bearer_auth(&new)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);

    let r = b.get("/members/scout/tokens", "director").await;
    let tid = r.json["tokens"][0]["id"].as_str().unwrap().to_owned();
    b.check(vec![
        req("DELETE", "/members/scout/tokens/nope", "director").answers(404),
        req("DELETE", format!("/members/scout/tokens/{tid}"), "director").answers(204),
        req("DELETE", "/members/director", "director").answers(409),
        req("DELETE", "/members/scout", "reviewer").answers(403),
        req("DELETE", "/members/scout", "director").answers(204),
        req("POST", "/push", "reviewer")
            .body(json!({"to": "scout", "body": "x"}))
            .answers(404),
        // team edits and presets
        req("PATCH", "/team", "reviewer")
            .body(json!({"name": "x"}))
            .answers(403),
        req("PATCH", "/team", "director")
            .body(json!({}))
            .answers(400),
        req("PATCH", "/team", "director")
            .body(json!({"directive": "New directive."}))
            .answers_at(200, "/team/directive", json!("New directive.")),
        req("PUT", "/team/presets/qa", "director")
            .body(json!({"permissions": ["objectives.watch"]}))
            .answers_json(
                200,
                json!({"preset": {"name": "qa", "permissions": ["objectives.watch"]}}),
            ),
        req("PUT", "/team/presets/qa", "director")
            .body(json!({"permissions": ["admin"]}))
            .answers(400),
        req("GET", "/team/presets", "reviewer").answers_at(
            200,
            "/presets/qa",
            json!(["objectives.watch"]),
        ),
        req("DELETE", "/team/presets/qa", "director").answers(200),
        req("DELETE", "/team/presets/qa", "director").answers(404),
    ])
    .await;
}

/// Message's keys, in the order the TypeScript broker sends them.
const MESSAGE: [&str; 9] = [
    "id",
    "ts",
    "to",
    "from",
    "title",
    "body",
    "level",
    "data",
    "attachments",
];
/// Objective's keys, in the order the TypeScript broker sends them.
const OBJECTIVE: [&str; 14] = [
    "id",
    "title",
    "body",
    "outcome",
    "status",
    "assignee",
    "originator",
    "watchers",
    "createdAt",
    "updatedAt",
    "completedAt",
    "result",
    "blockReason",
    "attachments",
];

/// Keys come out in ac7's order (the captures), not sorted.
#[tokio::test]
async fn wire_key_order_matches_ac7() {
    let b = start_broker().await;
    let order = |text: &str, keys: &[&str]| {
        let pos: Vec<usize> = keys
            .iter()
            .map(|k| {
                text.find(&format!("\"{k}\":"))
                    .unwrap_or_else(|| panic!("{k} missing in {text}"))
            })
            .collect();
        assert!(
            pos.windows(2).all(|w| w[0] < w[1]),
            "keys out of order in {text}"
        );
    };
    let r = b
        .post("/push", "director", json!({"to": "builder", "body": "x"}))
        .await;
    assert!(
        r.text
            .starts_with(r#"{"delivery":{"live":0,"targets":1},"message":{"id":""#),
        "{}",
        r.text
    );
    order(&r.text, &MESSAGE);
    let r = b
        .post(
            "/objectives",
            "director",
            json!({"title": "t", "outcome": "o", "assignee": "builder"}),
        )
        .await;
    order(&r.text, &OBJECTIVE);
    let r = b.get("/briefing", "builder").await;
    order(
        &r.text,
        &[
            "name",
            "role",
            "permissions",
            "instructions",
            "team",
            "teammates",
            "openObjectives",
        ],
    );
    let r = b.get("/roster", "builder").await;
    order(
        &r.text,
        &["teammates", "connected", "createdAt", "lastSeen"],
    );
    let r = b.get("/fs/ls?path=/", "builder").await;
    order(
        &r.text,
        &[
            "path",
            "name",
            "kind",
            "owner",
            "size",
            "mimeType",
            "hash",
            "createdAt",
            "createdBy",
            "updatedAt",
        ],
    );
    let r = b.post("/push", "builder", json!({"to": "reviewer"})).await;
    assert!(
        r.text
            .starts_with(r#"{"error":"invalid push payload","details":"#),
        "{}",
        r.text
    );
}

/// The keys of a JSON object, in the order they came over the wire (serde_json keeps it).
fn keys(v: &serde_json::Value) -> Vec<&str> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect()
}

/// Every shape the broker sends — on its own and inside event payloads, with the `data` bags the
/// broker writes and the objective audit payloads — has exactly the TypeScript broker's keys in
/// its order; a client's `data` comes back in the client's order.
#[tokio::test]
async fn every_shape_has_the_specs_key_order() {
    let b = start_broker().await;
    let mut live = b.sse("builder", None).await;

    // A client's `data`, verbatim and in its order, live and from history.
    let r = b
        .post(
            "/push",
            "director",
            json!({"to": "builder", "body": "x", "data": {"zeta": 1, "alpha": {"y": 1, "b": 2}, "mid": "m"}}),
        )
        .await;
    assert_eq!(keys(&r.json), ["delivery", "message"]);
    assert_eq!(keys(&r.json["delivery"]), ["live", "targets"]);
    for m in [r.json["message"].clone(), live.next_message().await] {
        assert_eq!(keys(&m), MESSAGE);
        assert_eq!(keys(&m["data"]), ["zeta", "alpha", "mid"]);
        assert_eq!(keys(&m["data"]["alpha"]), ["y", "b"]);
    }

    // An objective, its audit events and its lifecycle pushes.
    let obj = b
        .post(
            "/objectives",
            "director",
            json!({"title": "t", "outcome": "o", "assignee": "builder", "watchers": ["reviewer"]}),
        )
        .await
        .json;
    assert_eq!(keys(&obj), OBJECTIVE);
    let id = obj["id"].as_str().unwrap();
    let r = b
        .post(
            &format!("/objectives/{id}/reassign"),
            "director",
            json!({"to": "reviewer", "note": "n"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let view = b.get(&format!("/objectives/{id}"), "director").await.json;
    assert_eq!(keys(&view), ["objective", "events"]);
    assert_eq!(keys(&view["objective"]), OBJECTIVE);
    let events = view["events"].as_array().unwrap();
    for e in events {
        assert_eq!(keys(e), ["objectiveId", "ts", "actor", "kind", "payload"]);
    }
    let payload = |kind: &str| {
        let e = events.iter().find(|e| e["kind"] == kind).unwrap();
        keys(&e["payload"])
    };
    assert_eq!(
        payload("assigned"),
        ["title", "outcome", "assignee", "watchers"]
    );
    assert_eq!(payload("reassigned"), ["from", "to", "note"]);
    assert_eq!(payload("watcher_added"), ["name"]);
    let pushed = live.next_message().await;
    assert_eq!(keys(&pushed), MESSAGE);
    assert_eq!(
        keys(&pushed["data"]),
        [
            "kind",
            "event",
            "objective_id",
            "objective_status",
            "thread",
            "actor"
        ]
    );
    let r = b
        .post(
            &format!("/objectives/{id}/discuss"),
            "director",
            json!({"body": "d"}),
        )
        .await;
    assert_eq!(keys(&r.json), MESSAGE);
    assert_eq!(keys(&r.json["data"]), ["kind", "objective_id", "thread"]);
    let history = b.get("/history?limit=50", "director").await.json;
    for m in history["messages"].as_array().unwrap() {
        assert_eq!(keys(m), MESSAGE);
    }

    // Channels: Channel, ChannelSummary (Channel's keys first), ChannelMember.
    let r = b.post("/channels", "builder", json!({"slug": "dev"})).await;
    assert_eq!(
        keys(&r.json),
        ["id", "slug", "createdBy", "createdAt", "archivedAt"]
    );
    let summary = [
        "id",
        "slug",
        "createdBy",
        "createdAt",
        "archivedAt",
        "joined",
        "myRole",
        "memberCount",
    ];
    let r = b.get("/channels/dev", "builder").await.json;
    assert_eq!(keys(&r), ["channel", "members"]);
    assert_eq!(keys(&r["channel"]), summary);
    assert_eq!(
        keys(&r["members"][0]),
        ["channelId", "memberName", "role", "joinedAt"]
    );
    let r = b.get("/channels", "builder").await.json;
    for c in r["channels"].as_array().unwrap() {
        assert_eq!(keys(c), summary);
    }

    // Presence (no `busy` while nobody reported busy).
    let r = b.get("/roster", "builder").await.json;
    for p in r["connected"].as_array().unwrap() {
        assert_eq!(
            keys(p),
            ["name", "connected", "createdAt", "lastSeen", "role"]
        );
    }
}

#[tokio::test]
async fn reserved_and_case_twin_names_are_refused() {
    let b = start_broker().await;
    let member = |name: &str| json!({"name": name, "role": {"title": "scout", "description": ""}, "permissions": []});
    for name in [".", "..", "ac7", "AC7", "objectives"] {
        let r = b.post("/members", "director", member(name)).await;
        assert_eq!(r.status, 400, "{name}: {}", r.text);
        assert!(
            r.json["error"].as_str().unwrap().contains("reserved"),
            "{name}: {}",
            r.text
        );
    }
    let r = b.post("/members", "director", member("Builder")).await;
    assert_eq!(r.status, 409, "{}", r.text);
    assert!(r.json["error"].as_str().unwrap().contains("'builder'"));
    let r = b.post("/members", "director", member("scout")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = b.post("/members", "director", member("SCOUT")).await;
    assert_eq!(r.status, 409, "{}", r.text);
}

#[tokio::test]
async fn extractor_rejections_are_json() {
    let b = start_broker().await;
    // a query string axum cannot decode
    let r = b.get("/history?limit=1&limit=2", "builder").await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    assert!(
        r.json["error"].as_str().unwrap().contains("limit"),
        "{}",
        r.text
    );
    // a path segment that is not UTF-8
    let r = b.get("/channels/%FF", "builder").await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(r.json["error"].is_string(), "{}", r.text);
}

#[tokio::test]
async fn message_floods_get_429_with_retry_after() {
    use ac7_runtime::broker::ratelimit::Rate;
    let b = broker_support::start_with(|c| {
        c.push_rate = Some(Rate {
            per_second: 1,
            burst: 3,
        })
    })
    .await;
    // The burst passes; the next push is refused (a slow machine may see a
    // token refill on the way, so allow a few more before the refusal).
    let mut accepted = 0;
    let r = loop {
        let r = b.post("/push", "builder", json!({"body": "flood"})).await;
        if r.status != 200 || accepted == 10 {
            break r;
        }
        accepted += 1;
    };
    assert!(accepted >= 3, "the burst of 3 was refused after {accepted}");
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(r.json["code"], "rate_limited");
    assert_eq!(r.json["retryAfter"], 1);
    assert!(r.json["error"].as_str().unwrap().contains("per second"));
    // other message-creating endpoints draw from the same bucket
    let r = b
        .post(
            "/objectives",
            "builder",
            json!({"title": "t", "outcome": "o", "assignee": "builder"}),
        )
        .await;
    assert_eq!(r.status, 429, "{}", r.text);
    // nothing was stored for the refused push
    let h = b.get("/history?limit=100", "builder").await;
    assert_eq!(h.text.matches("flood").count(), accepted);
    // another member has their own bucket
    b.push("reviewer", json!({"body": "hello"})).await;
    // and the bucket refills
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    b.push("builder", json!({"body": "later"})).await;
}

/// Where the TypeScript broker answers with a fixed error text, ours is that text byte for byte.
#[tokio::test]
async fn error_texts_are_the_specs() {
    const LEAVES: &str = "Valid leaves: team.manage, members.manage, objectives.create, \
                          objectives.cancel, objectives.reassign, objectives.watch, activity.read. \
                          Presets: admin, operator.";
    let unknown =
        |context: &str, x: &str| format!("{context}: unknown permission or preset '{x}'. {LEAVES}");
    let b = start_broker().await;
    let obj = b
        .post(
            "/objectives",
            "director",
            json!({"title": "t", "outcome": "o", "assignee": "builder"}),
        )
        .await
        .json;
    let id = obj["id"].as_str().unwrap();
    // (what, method, path, caller, raw body, status, the TypeScript broker's text). The text is
    // `None` where only the status is fixed (and a `code`, checked below).
    type Case<'a> = (
        &'a str,
        &'a str,
        String,
        &'a str,
        Option<String>,
        u16,
        Option<String>,
    );
    // A preset holds leaves only; `bad` is refused with the preset as context.
    let preset = |what: &'static str, bad: &str| -> Case<'static> {
        (
            what,
            "PUT",
            "/team/presets/qa".into(),
            "director",
            Some(json!({"permissions": ["objectives.watch", bad]}).to_string()),
            400,
            Some(unknown("preset 'qa'", bad)),
        )
    };
    let cases: Vec<Case> = vec![
        (
            "member create, unknown permission",
            "POST",
            "/members".into(),
            "director",
            Some(json!({"name": "x", "role": {"title": "x"}, "permissions": ["boss"]}).to_string()),
            400,
            Some(unknown("create member 'x'", "boss")),
        ),
        (
            "member update, unknown permission",
            "PATCH",
            "/members/builder".into(),
            "director",
            Some(json!({"permissions": ["boss"]}).to_string()),
            400,
            Some(unknown("update member 'builder'", "boss")),
        ),
        preset("a preset with an unknown leaf", "objectives.fly"),
        preset("presets may not nest", "admin"),
        (
            "a blank objective title",
            "POST",
            "/objectives".into(),
            "director",
            Some(json!({"title": "   ", "outcome": "o", "assignee": "builder"}).to_string()),
            400,
            Some("title is required".into()),
        ),
        (
            "members.manage off the last admin",
            "PATCH",
            "/members/director".into(),
            "director",
            Some(json!({"permissions": ["operator"]}).to_string()),
            409,
            Some(
                "cannot remove members.manage from the last admin — promote someone else first"
                    .into(),
            ),
        ),
        (
            "deleting the last admin",
            "DELETE",
            "/members/director".into(),
            "director",
            None,
            409,
            None,
        ),
        (
            "a member that exists",
            "POST",
            "/members".into(),
            "director",
            Some(json!({"name": "builder", "role": {"title": "x"}, "permissions": []}).to_string()),
            409,
            Some("member 'builder' already exists".into()),
        ),
        (
            "rotating someone else's token",
            "POST",
            "/members/director/rotate-token".into(),
            "builder",
            None,
            403,
            None,
        ),
        (
            "a team patch with no fields",
            "PATCH",
            "/team".into(),
            "director",
            Some(json!({"name": 3}).to_string()),
            400,
            Some("no fields to update (name, directive, context)".into()),
        ),
        (
            "a malformed busy report",
            "POST",
            "/presence/busy".into(),
            "builder",
            Some(json!({"busy": "yes"}).to_string()),
            400,
            Some("invalid busy report".into()),
        ),
        (
            "a busy report that is not JSON",
            "POST",
            "/presence/busy".into(),
            "builder",
            Some("{".into()),
            400,
            Some("invalid busy report".into()),
        ),
        (
            "a push to nobody",
            "POST",
            "/push".into(),
            "director",
            Some(json!({"to": "ghost", "body": "x"}).to_string()),
            404,
            Some("no such agent: ghost".into()),
        ),
        (
            "history with and channel",
            "GET",
            "/history?with=builder&channel=general".into(),
            "director",
            None,
            400,
            Some("`with` and `channel` are mutually exclusive".into()),
        ),
        (
            "history of an unknown channel",
            "GET",
            "/history?channel=nope".into(),
            "director",
            None,
            404,
            Some("no such channel: nope".into()),
        ),
        (
            "an unknown channel",
            "GET",
            "/channels/nope".into(),
            "director",
            None,
            404,
            Some("no such channel: nope".into()),
        ),
        (
            "creating the reserved general channel",
            "POST",
            "/channels".into(),
            "builder",
            Some(json!({"slug": "general"}).to_string()),
            403,
            None,
        ),
        (
            "an unknown objective",
            "GET",
            "/objectives/nope".into(),
            "director",
            None,
            404,
            Some("no such objective: nope".into()),
        ),
        (
            "an unknown assignee",
            "POST",
            "/objectives".into(),
            "director",
            Some(json!({"title": "t", "outcome": "o", "assignee": "ghost"}).to_string()),
            400,
            Some("unknown assignee: ghost".into()),
        ),
        (
            "an unknown watcher",
            "POST",
            format!("/objectives/{id}/watchers"),
            "director",
            Some(json!({"add": ["ghost"]}).to_string()),
            400,
            Some("unknown watcher: ghost".into()),
        ),
        (
            "reassigning to nobody",
            "POST",
            format!("/objectives/{id}/reassign"),
            "director",
            Some(json!({"to": "ghost"}).to_string()),
            400,
            Some("unknown assignee: ghost".into()),
        ),
        (
            "fs/stat without a path",
            "GET",
            "/fs/stat".into(),
            "builder",
            None,
            400,
            Some("`path` query parameter is required".into()),
        ),
        (
            "fs/stat of a missing path",
            "GET",
            "/fs/stat?path=/builder/nope".into(),
            "builder",
            None,
            404,
            Some("no such path: /builder/nope".into()),
        ),
        (
            "fs/stat of /",
            "GET",
            "/fs/stat?path=/".into(),
            "builder",
            None,
            400,
            None,
        ),
    ];
    for (what, method, path, who, body, status, text) in cases {
        let r = b
            .raw(method, &path, Some(who), body.map(String::into_bytes))
            .await;
        assert_eq!(r.status, status, "{what}: {}", r.text);
        assert!(r.json["error"].is_string(), "{what}: {}", r.text);
        if let Some(text) = text {
            assert_eq!(r.json["error"], text.as_str(), "{what}");
        }
    }
    // The channel store's errors carry their code.
    let r = b
        .post("/channels", "builder", json!({"slug": "general"}))
        .await;
    assert_eq!(r.json["code"], "reserved");
    // A malformed busy report says what was wrong.
    let r = b
        .post("/presence/busy", "builder", json!({"busy": 1}))
        .await;
    assert!(r.json["details"].is_array(), "{}", r.text);
}

/// `GET /backup` needs members.manage. On SQLite it is the database as of the request (a SQLite
/// file holding the log) and leaves nothing beside it; on PostgreSQL it points at pg_dump.
#[tokio::test]
async fn backup_is_the_database_for_an_admin() {
    let b = start_broker().await;
    b.push("director", json!({"body": "in the copy"})).await;
    let r = b.get("/backup", "builder").await;
    assert_eq!(
        (r.status, r.json["error"].as_str()),
        (403, Some("a backup requires the members.manage permission"))
    );
    let resp = b
        .http
        .get(format!("{}/backup", b.url))
        .bearer_auth(b.token("director"))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    if broker_support::on_postgres() {
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(
            (status, v["error"].as_str()),
            (
                409,
                Some("this team is kept in PostgreSQL: back it up with pg_dump")
            )
        );
        return;
    }
    assert_eq!(status, 200);
    assert_eq!(resp.headers()["content-type"], "application/vnd.sqlite3");
    let bytes = resp.bytes().await.unwrap();
    assert!(bytes.starts_with(b"SQLite format 3\0"));
    let copy = tempfile::tempdir().unwrap();
    let file = copy.path().join("copy.db");
    std::fs::write(&file, &bytes).unwrap();
    let body: String = rusqlite::Connection::open(&file)
        .unwrap()
        .query_row("SELECT body FROM messages", [], |r| r.get(0))
        .unwrap();
    assert_eq!(body, "in the copy");
    let left: Vec<_> = std::fs::read_dir(b.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("backup"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
