//! Objectives over HTTP: lifecycle, permissions, audit events, lifecycle pushes
//! to thread members, discussion, watchers, reassignment, list scoping.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use crate::broker_support;

use broker_support::{req, start_broker};
use serde_json::{Value, json};

fn kinds(events: &Value) -> Vec<String> {
    events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn full_lifecycle_with_pushes() {
    let b = start_broker().await;
    let mut builder = b.sse("builder", None).await;
    let mut reviewer = b.sse("reviewer", None).await;
    let mut director = b.sse("director", None).await;

    b.check(vec![
        req("POST", "/objectives", "builder")
            .body(json!({"title": "t", "outcome": "o", "assignee": "reviewer"}))
            .answers_json(
                403,
                json!({"error": "creating objectives requires the objectives.create permission"}),
            ),
        req("POST", "/objectives", "director")
            .body(json!({"title": "", "outcome": "o", "assignee": "builder"}))
            .answers_at(400, "/error", json!("invalid objective payload")),
        req("POST", "/objectives", "director")
            .body(json!({"title": "t", "outcome": "o", "assignee": "ghost"}))
            .answers_json(400, json!({"error": "unknown assignee: ghost"})),
        req("POST", "/objectives", "director")
            .body(
                json!({"title": "t", "outcome": "o", "assignee": "builder", "watchers": ["ghost"]}),
            )
            .answers_json(400, json!({"error": "unknown watcher: ghost"})),
    ])
    .await;

    let r = b
        .post(
            "/objectives",
            "director",
            json!({"title": "Build the widget", "outcome": "Widget builds and tests pass", "body": "Details here", "assignee": "builder", "watchers": ["reviewer"]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let obj = r.json.clone();
    let id = obj["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("obj-"));
    snap!("objective_created", obj);

    // assigned + watcher_added reach assignee, watcher, and the originator/admin
    for s in [&mut builder, &mut reviewer, &mut director] {
        let m = s.next_message().await;
        assert_eq!(m["data"]["event"], "assigned");
        assert_eq!(m["data"]["thread"], format!("obj:{id}"));
        assert_eq!(s.next_message().await["data"]["event"], "watcher_added");
    }

    // builder's briefing lists it as open
    let r = b.get("/briefing", "builder").await;
    assert_eq!(r.json["openObjectives"][0]["id"], id);

    // PATCH: validation and permissions
    let path = format!("/objectives/{id}");
    b.check(vec![
        req("PATCH", &path, "builder").body(json!({})).answers_at(
            400,
            "/details/0/message",
            json!("update must include at least one of: status, blockReason"),
        ),
        req("PATCH", &path, "reviewer")
            .body(json!({"status": "blocked"}))
            .answers_at(
                403,
                "/error",
                json!(
                    "only the assignee or a member with objectives.cancel may update this objective"
                ),
            ),
        req("PATCH", &path, "builder")
            .body(json!({"status": "blocked"}))
            .answers_at(
                400,
                "/error",
                json!("blockReason is required when transitioning to blocked"),
            ),
    ])
    .await;
    let r = b
        .call(
            "PATCH",
            &path,
            "builder",
            Some(json!({"status": "blocked", "blockReason": "waiting on API keys"})),
        )
        .await;
    assert_eq!(
        (
            r.status,
            r.json["status"].clone(),
            r.json["blockReason"].clone()
        ),
        (200, json!("blocked"), json!("waiting on API keys"))
    );
    let m = reviewer.next_message().await;
    assert_eq!(
        m["body"],
        format!(
            "[objective blocked] {id}\ntitle:    Build the widget\nassignee: builder\nreason:   waiting on API keys"
        )
    );
    assert_eq!(m["from"], "builder");
    assert_eq!(
        builder.next_message().await["data"]["objective_status"],
        "blocked"
    );
    assert_eq!(director.next_message().await["data"]["event"], "blocked");
    let r = b
        .call("PATCH", &path, "builder", Some(json!({"status": "active"})))
        .await;
    assert_eq!(
        (r.json["status"].clone(), r.json["blockReason"].clone()),
        (json!("active"), Value::Null)
    );
    assert_eq!(reviewer.next_message().await["data"]["event"], "unblocked");
    assert_eq!(builder.next_message().await["data"]["event"], "unblocked");
    // no-op: no event
    let r = b
        .call("PATCH", &path, "builder", Some(json!({"status": "active"})))
        .await;
    assert_eq!(r.status, 200);

    // discuss
    let r = b
        .post(
            &format!("{path}/discuss"),
            "reviewer",
            json!({"body": "looks good so far"}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json["data"],
        json!({"kind": "objective_discuss", "objective_id": id, "thread": format!("obj:{id}")})
    );
    snap!("discuss_message", r.json);
    assert_eq!(builder.next_message().await["body"], "looks good so far");
    assert_eq!(
        reviewer.next_message().await["body"],
        "looks good so far",
        "the poster's own stream echoes it"
    );
    let r = b
        .post(&format!("{path}/discuss"), "builder", json!({"body": ""}))
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (400, json!("invalid discuss payload"))
    );
    // a stranger to the thread cannot discuss, nor spoof the thread via /push
    let r = b
        .post(
            "/members",
            "director",
            json!({"name": "scout", "role": {"title": "scout"}, "permissions": []}),
        )
        .await;
    let scout_token = r.json["token"].as_str().unwrap().to_owned();
    let resp = b
        .http
        .post(format!("{}{path}/discuss", b.url))
        .bearer_auth(&scout_token)
        .json(&json!({"body": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["error"],
        format!("user 'scout' is not a member of objective {id}'s thread")
    );
    let resp = b
        .http
        .post(format!("{}/push", b.url))
        .bearer_auth(&scout_token)
        .json(&json!({"body": "spoof", "data": {"thread": format!("obj:{id}")}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    // a thread member may post on the thread via /push; it goes to thread members only
    let r = b
        .post(
            "/push",
            "builder",
            json!({"body": "via push", "data": {"thread": format!("obj:{id}")}}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["delivery"]["targets"], 3);
    assert_eq!(reviewer.next_message().await["body"], "via push");
    assert_eq!(builder.next_message().await["body"], "via push");

    // watchers: POST and PATCH both work; permissions; validation
    let watchers = format!("{path}/watchers");
    b.check(vec![
        req("POST", &watchers, "builder")
            .body(json!({"add": ["scout"]}))
            .answers_at(
                403,
                "/error",
                json!("watcher changes require originator or objectives.watch permission"),
            ),
        req("POST", &watchers, "director")
            .body(json!({}))
            .answers_at(
                400,
                "/details/0/message",
                json!("must include at least one of: add, remove"),
            ),
        req("POST", &watchers, "director")
            .body(json!({"add": ["ghost"]}))
            .answers_at(400, "/error", json!("unknown watcher: ghost")),
    ])
    .await;
    let r = b
        .post(
            &format!("{path}/watchers"),
            "director",
            json!({"add": ["scout"]}),
        )
        .await;
    assert_eq!(r.json["watchers"], json!(["reviewer", "scout"]));
    let r = b
        .call(
            "PATCH",
            &format!("{path}/watchers"),
            "director",
            Some(json!({"remove": ["scout"]})),
        )
        .await;
    assert_eq!(
        (r.status, r.json["watchers"].clone()),
        (200, json!(["reviewer"]))
    );
    assert_eq!(
        builder.next_message().await["data"]["event"],
        "watcher_added"
    );
    assert_eq!(
        builder.next_message().await["data"]["event"],
        "watcher_removed"
    );

    // reassign
    let r = b
        .post(
            &format!("{path}/reassign"),
            "builder",
            json!({"to": "reviewer"}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (
            403,
            json!("reassign requires the objectives.reassign permission")
        )
    );
    let r = b
        .post(
            &format!("{path}/reassign"),
            "director",
            json!({"to": "ghost"}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (400, json!("unknown assignee: ghost"))
    );
    let r = b
        .post(
            &format!("{path}/reassign"),
            "director",
            json!({"to": "builder"}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (
            400,
            json!(format!("objective {id} is already assigned to builder"))
        )
    );
    let r = b
        .post(
            &format!("{path}/reassign"),
            "director",
            json!({"to": "reviewer", "note": "builder is busy"}),
        )
        .await;
    assert_eq!(r.json["assignee"], "reviewer");
    // the previous assignee still hears about the reassignment
    let m = builder.next_message().await;
    assert_eq!(m["data"]["event"], "reassigned");
    snap!("reassigned_push", m);

    // complete
    let r = b
        .post(
            &format!("{path}/complete"),
            "builder",
            json!({"result": "done"}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (403, json!("only the assignee may complete this objective"))
    );
    let r = b
        .post(
            &format!("{path}/complete"),
            "reviewer",
            json!({"result": ""}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (400, json!("invalid complete payload"))
    );
    let r = b
        .post(
            &format!("{path}/complete"),
            "reviewer",
            json!({"result": "Widget built; tests pass."}),
        )
        .await;
    assert_eq!((r.status, r.json["status"].clone()), (200, json!("done")));
    assert!(r.json["completedAt"].is_i64());
    b.check(vec![
        req("POST", format!("{path}/complete"), "reviewer")
            .body(json!({"result": "again"}))
            .answers_json(
                409,
                json!({"error": format!("objective {id} is already done")}),
            ),
        req("PATCH", &path, "reviewer")
            .body(json!({"status": "blocked", "blockReason": "x"}))
            .answers(409),
        req("POST", format!("{path}/cancel"), "director")
            .body(json!({}))
            .answers(409),
        req("POST", format!("{path}/reassign"), "director")
            .body(json!({"to": "builder"}))
            .answers(409),
    ])
    .await;

    // the audit log, oldest first
    let r = b.get(&path, "director").await;
    assert_eq!(
        kinds(&r.json["events"]),
        vec![
            "assigned",
            "watcher_added",
            "blocked",
            "unblocked",
            "watcher_added",
            "watcher_removed",
            "reassigned",
            "completed"
        ]
    );
    snap!("objective_view", r.json);
    let r = b.get("/objectives/obj-does-not-exist", "builder").await;
    assert_eq!(
        (r.status, r.json.clone()),
        (
            404,
            json!({"error": "no such objective: obj-does-not-exist"})
        )
    );
}

#[tokio::test]
async fn cancel_view_and_list_scoping() {
    let b = start_broker().await;
    let o1 = b
        .post(
            "/objectives",
            "director",
            json!({"title": "Doomed", "outcome": "never", "assignee": "builder"}),
        )
        .await
        .json;
    let o2 = b
        .post(
            "/objectives",
            "director",
            json!({"title": "Other", "outcome": "x", "assignee": "reviewer"}),
        )
        .await
        .json;
    let id1 = o1["id"].as_str().unwrap();
    let id2 = o2["id"].as_str().unwrap();

    // view: participants and objectives.create only
    assert_eq!(
        b.get(&format!("/objectives/{id2}"), "builder").await.status,
        403
    );
    assert_eq!(
        b.get(&format!("/objectives/{id2}"), "reviewer")
            .await
            .status,
        200
    );

    // list: without objectives.create, only own; with, filters apply literally
    let ids = |v: &Value| -> Vec<String> {
        v["objectives"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids(&b.get("/objectives", "builder").await.json), vec![id1]);
    assert_eq!(
        ids(&b
            .get("/objectives?assignee=builder&status=active", "builder")
            .await
            .json),
        vec![id1]
    );
    let r = b.get("/objectives?assignee=reviewer", "builder").await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (
            403,
            json!("members without objectives.create may only list their own objectives")
        )
    );
    let r = b.get("/objectives?status=bogus", "builder").await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (400, json!("invalid query"))
    );
    assert_eq!(
        ids(&b.get("/objectives", "director").await.json),
        vec![id2, id1]
    );
    assert_eq!(
        ids(&b
            .get("/objectives?assignee=reviewer", "director")
            .await
            .json),
        vec![id2]
    );

    // cancel: originator or objectives.cancel
    let r = b
        .post(
            &format!("/objectives/{id1}/cancel"),
            "builder",
            json!({"reason": "nope"}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (
            403,
            json!("cancel requires originator or objectives.cancel permission")
        )
    );
    let r = b
        .raw(
            "POST",
            &format!("/objectives/{id1}/cancel"),
            Some("director"),
            Some(b"not json".to_vec()),
        )
        .await;
    assert_eq!(
        (r.status, r.json["status"].clone()),
        (200, json!("cancelled"))
    );
    let r = b.get(&format!("/objectives/{id1}"), "builder").await;
    assert_eq!(r.json["events"][1]["kind"], "cancelled");
    assert_eq!(r.json["events"][1]["payload"], json!({}));
    assert_eq!(
        ids(&b.get("/objectives?status=cancelled", "director").await.json),
        vec![id1]
    );
    assert!(
        b.get("/briefing", "builder").await.json["openObjectives"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // objective thread history is visible to thread members only
    let bodies = |v: &Value| -> Vec<String> {
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["body"].as_str().unwrap().to_owned())
            .collect()
    };
    let builder_sees = bodies(&b.get("/history", "builder").await.json);
    assert!(
        builder_sees
            .iter()
            .any(|m| m.starts_with("[objective cancelled]"))
    );
    assert!(!builder_sees.iter().any(|m| m.contains(id2)));
    let director_sees = bodies(&b.get("/history", "director").await.json);
    assert!(director_sees.iter().any(|m| m.contains(id2)));
}

#[tokio::test]
async fn attachments_are_mirrored_into_the_objective_namespace() {
    let b = start_broker().await;
    let r = b
        .write_file(
            "director",
            "/director/spec.txt",
            "text/plain",
            b"the spec",
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    let r = b
        .post(
            "/objectives",
            "director",
            json!({"title": "t", "outcome": "o", "assignee": "builder",
                   "attachments": [{"path": "/director/spec.txt", "name": "lie.exe", "size": 1, "mimeType": "x/y"}]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let id = r.json["id"].as_str().unwrap().to_owned();
    let att = &r.json["attachments"][0];
    assert_eq!(att["path"], format!("/objectives/{id}/spec.txt"));
    assert_eq!(
        (att["size"].clone(), att["mimeType"].clone()),
        (json!(8), json!("text/plain"))
    );
    // the assignee can read it; an outsider cannot
    let r = b
        .raw(
            "GET",
            &format!("/fs/read/objectives/{id}/spec.txt"),
            Some("builder"),
            None,
        )
        .await;
    assert_eq!((r.status, r.text.as_str()), (200, "the spec"));
    let r = b
        .raw(
            "GET",
            &format!("/fs/read/objectives/{id}/spec.txt"),
            Some("reviewer"),
            None,
        )
        .await;
    assert_eq!(r.status, 403);
    // the assignee may add files there too
    let r = b
        .write_file(
            "builder",
            &format!("/objectives/{id}/notes.txt"),
            "text/plain",
            b"n",
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["entry"]["owner"], format!("obj:{id}"));
}
