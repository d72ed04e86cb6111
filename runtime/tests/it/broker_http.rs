//! HTTP tests against a real broker: auth, protocol header, briefing, roster,
//! push, history, bad input, team and member administration.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use crate::broker_support;

use broker_support::start_broker;
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

    let r = b
        .post("/push", "builder", json!({"to": "nobody", "body": "x"}))
        .await;
    assert_eq!(
        (r.status, r.json.clone()),
        (404, json!({"error": "no such agent: nobody"}))
    );

    let r = b.post("/push", "builder", json!({"to": "reviewer"})).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json["error"], "invalid push payload");
    assert!(r.json["details"].is_array());

    let r = b
        .post("/push", "builder", json!({"body": "x", "level": "loud"}))
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (400, json!("invalid push payload"))
    );

    let r = b
        .raw("POST", "/push", Some("builder"), Some(b"not json".to_vec()))
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json["error"], "invalid push payload");
    assert_eq!(
        r.json["details"][0]["message"],
        "Invalid input: expected object, received null"
    );

    let r = b.post("/push", "builder", json!({"body": ""})).await;
    assert_eq!(r.status, 400);
    let r = b
        .post("/push", "builder", json!({"body": "x".repeat(65_537)}))
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json["details"][0]["code"], "too_big");
    let r = b
        .post(
            "/push",
            "builder",
            json!({"body": "x", "title": "t".repeat(201)}),
        )
        .await;
    assert_eq!(r.status, 400);
    let r = b
        .post("/push", "builder", json!({"to": "bad name", "body": "x"}))
        .await;
    assert_eq!(r.status, 400);

    // thread validation
    let r = b
        .post(
            "/push",
            "builder",
            json!({"body": "x", "data": {"thread": "dm"}}),
        )
        .await;
    assert_eq!(r.status, 400);
    let r = b
        .post(
            "/push",
            "builder",
            json!({"body": "x", "data": {"thread": 5}}),
        )
        .await;
    assert_eq!(r.status, 400);
    let r = b
        .post(
            "/push",
            "builder",
            json!({"body": "x", "data": {"thread": "chan:nope"}}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (404, json!("no such channel: nope"))
    );
    let r = b
        .post(
            "/push",
            "builder",
            json!({"body": "x", "data": {"thread": "obj:nope"}}),
        )
        .await;
    assert_eq!(r.status, 404);
    let r = b
        .post(
            "/push",
            "builder",
            json!({"body": "general", "data": {"thread": "chan:general"}}),
        )
        .await;
    assert_eq!(r.status, 200);
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
async fn team_members_and_tokens() {
    let b = start_broker().await;
    let r = b.get("/team", "builder").await;
    assert_eq!(r.json["team"]["name"], "peer-team");
    snap!("team", r.json);
    let r = b.get("/members", "builder").await;
    assert!(r.json["members"][0].get("instructions").is_none());
    let r = b.get("/members", "director").await;
    assert_eq!(r.json["members"][0]["instructions"], "");

    let r = b
        .post(
            "/members",
            "builder",
            json!({"name": "scout", "role": {"title": "scout"}, "permissions": []}),
        )
        .await;
    assert_eq!(
        (r.status, r.json.clone()),
        (
            403,
            json!({"error": "creating members requires the members.manage permission"})
        )
    );
    let r = b
        .post(
            "/members",
            "director",
            json!({"name": "bad name!", "role": {"title": "x"}}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (400, json!("invalid member payload"))
    );
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

    let r = b
        .call(
            "PATCH",
            "/members/scout",
            "director",
            Some(json!({"instructions": "new"})),
        )
        .await;
    assert_eq!(
        (r.status, r.json["instructions"].clone()),
        (200, json!("new"))
    );
    let r = b
        .call(
            "PATCH",
            "/members/director",
            "director",
            Some(json!({"permissions": []})),
        )
        .await;
    assert_eq!(r.status, 409);
    let r = b
        .call(
            "PATCH",
            "/members/ghost",
            "director",
            Some(json!({"instructions": "x"})),
        )
        .await;
    assert_eq!(r.status, 404);

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
    assert_eq!(
        b.call("DELETE", "/members/scout/tokens/nope", "director", None)
            .await
            .status,
        404
    );
    assert_eq!(
        b.call(
            "DELETE",
            &format!("/members/scout/tokens/{tid}"),
            "director",
            None
        )
        .await
        .status,
        204
    );

    assert_eq!(
        b.call("DELETE", "/members/director", "director", None)
            .await
            .status,
        409
    );
    assert_eq!(
        b.call("DELETE", "/members/scout", "reviewer", None)
            .await
            .status,
        403
    );
    assert_eq!(
        b.call("DELETE", "/members/scout", "director", None)
            .await
            .status,
        204
    );
    assert_eq!(
        b.post("/push", "reviewer", json!({"to": "scout", "body": "x"}))
            .await
            .status,
        404
    );

    // team edits and presets
    assert_eq!(
        b.call("PATCH", "/team", "reviewer", Some(json!({"name": "x"})))
            .await
            .status,
        403
    );
    assert_eq!(
        b.call("PATCH", "/team", "director", Some(json!({})))
            .await
            .status,
        400
    );
    let r = b
        .call(
            "PATCH",
            "/team",
            "director",
            Some(json!({"directive": "New directive."})),
        )
        .await;
    assert_eq!(r.json["team"]["directive"], "New directive.");
    let r = b
        .call(
            "PUT",
            "/team/presets/qa",
            "director",
            Some(json!({"permissions": ["objectives.watch"]})),
        )
        .await;
    assert_eq!(
        r.json,
        json!({"preset": {"name": "qa", "permissions": ["objectives.watch"]}})
    );
    assert_eq!(
        b.call(
            "PUT",
            "/team/presets/qa",
            "director",
            Some(json!({"permissions": ["admin"]}))
        )
        .await
        .status,
        400
    );
    let r = b.get("/team/presets", "reviewer").await;
    assert_eq!(r.json["presets"]["qa"], json!(["objectives.watch"]));
    assert_eq!(
        b.call("DELETE", "/team/presets/qa", "director", None)
            .await
            .status,
        200
    );
    assert_eq!(
        b.call("DELETE", "/team/presets/qa", "director", None)
            .await
            .status,
        404
    );
}

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
    order(
        &r.text,
        &[
            "id",
            "ts",
            "to",
            "from",
            "title",
            "body",
            "level",
            "data",
            "attachments",
        ],
    );
    let r = b
        .post(
            "/objectives",
            "director",
            json!({"title": "t", "outcome": "o", "assignee": "builder"}),
        )
        .await;
    order(
        &r.text,
        &[
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
        ],
    );
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

/// Where broker-api.md gives an error text, ours is that text byte for byte.
#[tokio::test]
async fn error_texts_are_the_specs() {
    const LEAVES: &str = "Valid leaves: team.manage, members.manage, objectives.create, \
                          objectives.cancel, objectives.reassign, objectives.watch, activity.read. \
                          Presets: admin, operator.";
    let b = start_broker().await;
    // §1: member create with an unknown permission
    let r = b
        .post(
            "/members",
            "director",
            json!({"name": "x", "role": {"title": "x"}, "permissions": ["boss"]}),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json["error"],
        format!("create member 'x': unknown permission or preset 'boss'. {LEAVES}")
    );
    // §1: member update with an unknown permission
    let r = b
        .call(
            "PATCH",
            "/members/builder",
            "director",
            Some(json!({"permissions": ["boss"]})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json["error"],
        format!("update member 'builder': unknown permission or preset 'boss'. {LEAVES}")
    );
    // §1: a preset holds leaves only (presets may not nest); an unknown leaf is refused
    for bad in ["objectives.fly", "admin"] {
        let r = b
            .call(
                "PUT",
                "/team/presets/qa",
                "director",
                Some(json!({"permissions": ["objectives.watch", bad]})),
            )
            .await;
        assert_eq!(r.status, 400);
        assert_eq!(
            r.json["error"],
            format!("preset 'qa': unknown permission or preset '{bad}'. {LEAVES}")
        );
    }
    // §7: a blank objective title
    let r = b
        .post(
            "/objectives",
            "director",
            json!({"title": "   ", "outcome": "o", "assignee": "builder"}),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json["error"], "title is required");
    // §9.4: removing members.manage from the last admin
    let r = b
        .call(
            "PATCH",
            "/members/director",
            "director",
            Some(json!({"permissions": ["operator"]})),
        )
        .await;
    assert_eq!(r.status, 409);
    assert_eq!(
        r.json["error"],
        "cannot remove members.manage from the last admin — promote someone else first"
    );
}
