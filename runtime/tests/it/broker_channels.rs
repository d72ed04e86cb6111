//! Channels over HTTP: list, create, view, join/add, leave/remove, rename, archive.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use crate::broker_support;

use broker_support::start_broker;
use serde_json::{Value, json};

fn slugs(v: &Value) -> Vec<String> {
    v["channels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["slug"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn channel_lifecycle() {
    let b = start_broker().await;
    let r = b.get("/channels", "builder").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["channels"][0]["id"], "general");
    assert_eq!(r.json["channels"][0]["memberCount"], 3);
    snap!("channels_initial", r.json);

    let r = b.post("/channels", "builder", json!({"slug": "dev"})).await;
    assert_eq!(r.status, 201);
    snap!("channel_created", r.json.clone());
    let id = r.json["id"].as_str().unwrap().to_owned();
    let r = b.post("/channels", "builder", json!({"slug": "dev"})).await;
    assert_eq!(
        (r.status, r.json.clone()),
        (
            409,
            json!({"error": "a channel called \"dev\" already exists", "code": "slug_taken"})
        )
    );
    let r = b
        .post("/channels", "builder", json!({"slug": "Bad Slug"}))
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (400, json!("invalid channel input"))
    );
    let r = b
        .post("/channels", "builder", json!({"slug": "general"}))
        .await;
    assert_eq!((r.status, r.json["code"].clone()), (403, json!("reserved")));
    let r = b
        .raw("POST", "/channels", Some("builder"), Some(b"{".to_vec()))
        .await;
    assert_eq!(r.status, 400);

    let r = b.get("/channels/dev", "builder").await;
    assert_eq!(r.json["channel"]["myRole"], "admin");
    assert_eq!(r.json["members"][0]["memberName"], "builder");
    assert_eq!(b.get("/channels/nope", "builder").await.status, 404);
    let r = b.get("/channels/general", "builder").await;
    assert_eq!(r.json["members"], json!([]));

    // admin adds; non-admin may not add others; self-join is allowed
    let r = b
        .post(
            "/channels/dev/members",
            "builder",
            json!({"member": "reviewer"}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["channel"]["memberCount"].clone()),
        (200, json!(2))
    );
    snap!("channel_with_members", r.json);
    let r = b
        .post(
            "/channels/dev/members",
            "reviewer",
            json!({"member": "director"}),
        )
        .await;
    assert_eq!(
        (r.status, r.json.clone()),
        (403, json!({"error": "only admins can add other members"}))
    );
    let r = b.post("/channels/dev/members", "reviewer", json!({})).await;
    assert_eq!(
        (r.status, r.json["code"].clone()),
        (409, json!("already_member"))
    );
    let r = b
        .raw("POST", "/channels/dev/members", Some("director"), None)
        .await;
    assert_eq!(
        (r.status, r.json["channel"]["myRole"].clone()),
        (200, json!("member"))
    );
    let r = b
        .post(
            "/channels/dev/members",
            "builder",
            json!({"member": "ghost"}),
        )
        .await;
    assert_eq!(r.status, 404);

    // posting requires membership; channel messages reach members only
    let r = b
        .post(
            "/push",
            "director",
            json!({"body": "hi dev", "data": {"thread": format!("chan:{id}")}}),
        )
        .await;
    assert_eq!(r.json["delivery"]["targets"], 3);

    // leave / remove
    let r = b
        .call("DELETE", "/channels/dev/members/director", "director", None)
        .await;
    assert_eq!(
        (r.status, r.json["channel"]["joined"].clone()),
        (200, json!(false))
    );
    let r = b
        .call("DELETE", "/channels/dev/members/builder", "reviewer", None)
        .await;
    assert_eq!(r.status, 403);
    let r = b
        .call("DELETE", "/channels/dev/members/director", "builder", None)
        .await;
    assert_eq!(
        (r.status, r.json["code"].clone()),
        (409, json!("not_member"))
    );
    let r = b
        .call("DELETE", "/channels/dev/members/builder", "builder", None)
        .await;
    assert_eq!(
        r.status, 409,
        "the last admin cannot leave while others remain"
    );
    let r = b
        .post(
            "/push",
            "director",
            json!({"body": "x", "data": {"thread": format!("chan:{id}")}}),
        )
        .await;
    assert_eq!(r.status, 403);

    // rename (admin only), then archive
    let r = b
        .call(
            "PATCH",
            "/channels/dev",
            "reviewer",
            Some(json!({"slug": "dev2"})),
        )
        .await;
    assert_eq!(r.status, 403);
    let r = b
        .call(
            "PATCH",
            "/channels/dev",
            "builder",
            Some(json!({"slug": "dev2"})),
        )
        .await;
    assert_eq!((r.status, r.json["slug"].clone()), (200, json!("dev2")));
    assert_eq!(
        b.call("DELETE", "/channels/dev2", "reviewer", None)
            .await
            .status,
        403
    );
    let r = b.call("DELETE", "/channels/dev2", "builder", None).await;
    assert_eq!(r.status, 200);
    assert!(r.json["archivedAt"].is_i64());
    assert_eq!(
        slugs(&b.get("/channels", "builder").await.json),
        vec!["general"]
    );
    // ?archived=true lists the archived ones, with when, for everyone
    for who in ["builder", "director"] {
        let r = b.get("/channels?archived=true", who).await;
        assert_eq!(slugs(&r.json), vec!["dev2"], "{who}: {}", r.text);
        assert!(r.json["channels"][0]["archivedAt"].is_i64(), "{}", r.text);
    }
    assert_eq!(
        slugs(&b.get("/channels?archived=false", "builder").await.json),
        vec!["general"]
    );
    let r = b.get("/channels?archived=maybe", "builder").await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (400, json!("archived must be true or false"))
    );
    let r = b
        .post(
            "/push",
            "builder",
            json!({"body": "x", "data": {"thread": format!("chan:{id}")}}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (410, json!("channel is archived"))
    );
    // history of an archived channel is still readable by its members
    let r = b.get("/history?channel=dev2", "builder").await;
    assert_eq!(r.json["messages"][0]["body"], "hi dev");
}

#[tokio::test]
async fn channels_listed_newest_first() {
    let b = start_broker().await;
    b.post("/channels", "builder", json!({"slug": "a"})).await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    b.post("/channels", "reviewer", json!({"slug": "b"})).await;
    let r = b.get("/channels", "director").await;
    assert_eq!(slugs(&r.json), vec!["b", "a", "general"]);
    assert_eq!(r.json["channels"][0]["joined"], false);
    assert_eq!(r.json["channels"][0]["myRole"], Value::Null);
}
