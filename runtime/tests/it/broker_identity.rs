//! A member name that is removed and created again is a new member: the new one inherits
//! none of the old one's DMs, activity, objectives, files or credentials, while the rest of
//! the team keeps its own side of the history (docs/broker.md, "Removing a member").

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use crate::broker_support::{self, TestBroker};

use serde_json::{Value, json};

/// An `opaque_http` activity event at `ts`, tagged with `host` so tests can tell rows apart.
fn exchange(ts: u64, host: &str) -> Value {
    json!({"kind": "opaque_http", "ts": ts, "duration": 5, "entry": {
        "kind": "opaque_http", "startedAt": ts, "endedAt": ts + 5, "host": host,
        "method": "GET", "url": "/x", "status": 200,
        "requestHeaders": {}, "responseHeaders": {},
        "requestBodyPreview": null, "responseBodyPreview": "ok"}})
}

/// Creates `name` as `director`; its token replaces any earlier one in `b.tokens`.
async fn create(b: &mut TestBroker, name: &str) {
    let r = b
        .post(
            "/members",
            "director",
            json!({"name": name, "role": {"title": "temp"}, "permissions": []}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let token = r.json["token"].as_str().unwrap().to_owned();
    b.tokens.insert(name.to_owned(), token);
}

fn bodies(history: &Value) -> Vec<String> {
    history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_owned())
        .collect()
}

fn hosts(activity: &Value) -> Vec<String> {
    activity["activity"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|row| row["event"]["entry"]["host"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_reused_name_inherits_nothing_of_the_removed_member() {
    let mut b = broker_support::start_broker().await;
    // Everything the old carol could see starts after this message (it is the replay cursor).
    let anchor = b
        .push("director", json!({"body": "anchor before carol"}))
        .await;
    let anchor = anchor["id"].as_str().unwrap().to_owned();

    create(&mut b, "carol").await;
    b.push(
        "builder",
        json!({"to": "carol", "body": "secret for old carol"}),
    )
    .await;
    b.push(
        "carol",
        json!({"to": "builder", "body": "old carol's reply"}),
    )
    .await;
    let r = b
        .post(
            "/members/carol/activity",
            "carol",
            json!({"events": [
                {"kind": "objective_open", "ts": 1000, "objectiveId": "obj-x"},
                exchange(2000, "old.example")
            ]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = b
        .write_file(
            "carol",
            "/carol/notes.txt",
            "text/plain",
            b"old notes",
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    b.push(
        "carol",
        json!({"to": "builder", "body": "notes attached", "attachments": [
            {"path": "/carol/notes.txt", "name": "n", "size": 1, "mimeType": "t"}]}),
    )
    .await;
    let r = b
        .post(
            "/objectives",
            "director",
            json!({"title": "old work", "outcome": "done", "assignee": "carol", "watchers": ["builder"]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let assigned = r.json["id"].as_str().unwrap().to_owned();
    let r = b
        .post(
            "/objectives",
            "director",
            json!({"title": "watched", "outcome": "done", "assignee": "builder", "watchers": ["carol"]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let watched = r.json["id"].as_str().unwrap().to_owned();
    // An auditor watching the old carol's activity.
    let mut audit = b
        .sse_path("director", "/members/carol/activity/stream", None)
        .await;

    let r = b.call("DELETE", "/members/carol", "director", None).await;
    assert_eq!(r.status, 204, "{}", r.text);
    create(&mut b, "carol").await;

    // The new carol's history, in every form, holds nothing of the old one.
    let r = b.get("/history", "carol").await;
    assert_eq!(r.status, 200);
    assert_eq!(bodies(&r.json), vec!["anchor before carol"], "{}", r.text);
    let r = b.get("/history?with=builder", "carol").await;
    assert_eq!(bodies(&r.json), Vec::<String>::new(), "{}", r.text);
    let mut sse = b.sse("carol", Some(&anchor)).await;
    let mut ws = b.ws("carol", Some(&anchor)).await;
    b.push("builder", json!({"to": "carol", "body": "hello new carol"}))
        .await;
    assert_eq!(sse.next_message().await["body"], "hello new carol");
    assert_eq!(ws.next_message().await["body"], "hello new carol");

    for who in ["carol", "director"] {
        let r = b.get("/members/carol/activity", who).await;
        assert_eq!((r.status, r.json.clone()), (200, json!({"activity": []})));
    }
    let mut stream = b
        .sse_path("carol", "/members/carol/activity/stream", Some("0"))
        .await;
    let r = b
        .post(
            "/members/carol/activity",
            "carol",
            json!({"events": [exchange(3000, "new.example")]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let ev = stream.next_event().await;
    assert_eq!(ev.event.as_deref(), Some("activity"));
    let row: Value = serde_json::from_str(&ev.data).unwrap();
    assert_eq!(row["event"]["entry"]["host"], "new.example");
    let r = b.get("/members/carol/activity", "director").await;
    assert_eq!(hosts(&r.json), vec!["new.example"]);

    // The auditor's stream of the removed member's activity ended at the removal.
    assert!(
        tokio::time::timeout(std::time::Duration::from_secs(5), audit.next_block())
            .await
            .expect("the activity stream of a removed member must end")
            .is_none()
    );

    // Objectives: the old carol's are not the new carol's, in the list, to view, or to work.
    let r = b.get("/objectives", "carol").await;
    assert_eq!((r.status, r.json.clone()), (200, json!({"objectives": []})));
    for id in [&assigned, &watched] {
        let r = b.get(&format!("/objectives/{id}"), "carol").await;
        assert_eq!(r.status, 403, "{id}: {}", r.text);
    }
    let r = b
        .post(
            &format!("/objectives/{assigned}/complete"),
            "carol",
            json!({"result": "not mine"}),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text);
    let r = b.get(&format!("/objectives/{assigned}"), "builder").await;
    assert_eq!(r.json["objective"]["assignee"], "carol (removed)");
    assert_eq!(r.json["objective"]["status"], "active");
    let r = b.get(&format!("/objectives/{watched}"), "builder").await;
    assert_eq!(r.json["objective"]["watchers"], json!([]));

    // Files: the new home is empty; the old one is archived for admins.
    let r = b.get("/fs/ls?path=/carol", "carol").await;
    assert_eq!(
        (r.status, r.json.clone()),
        (200, json!({"entries": []})),
        "{}",
        r.text
    );
    let r = b.get("/fs/read/carol/notes.txt", "carol").await;
    assert_eq!(r.status, 404, "{}", r.text);
    let r = b.get("/fs/ls?path=/removed%20members", "director").await;
    let archive = r.json["entries"][0]["path"].as_str().unwrap().to_owned();
    assert!(archive.starts_with("/removed members/carol-"), "{archive}");
    let r = b
        .get(&format!("/fs/read{archive}/notes.txt"), "director")
        .await;
    assert_eq!((r.status, r.text.as_str()), (200, "old notes"));
    let r = b
        .get(&format!("/fs/read{archive}/notes.txt"), "carol")
        .await;
    assert_eq!(r.status, 403, "{}", r.text);
    // The read grant builder got with the attachment followed the file.
    let r = b.get("/fs/shared", "builder").await;
    assert_eq!(
        r.json["entries"][0]["path"].as_str(),
        Some(format!("{archive}/notes.txt").as_str()),
        "{}",
        r.text
    );
    let r = b
        .get(&format!("/fs/read{archive}/notes.txt"), "builder")
        .await;
    assert_eq!((r.status, r.text.as_str()), (200, "old notes"));
    let r = b.get("/fs/shared", "carol").await;
    assert_eq!(r.json["entries"], json!([]), "{}", r.text);

    // The rest of the team keeps its side: builder sees its DMs with both carols.
    let r = b.get("/history?with=carol", "builder").await;
    assert_eq!(
        bodies(&r.json),
        vec![
            "hello new carol",
            "notes attached",
            "old carol's reply",
            "secret for old carol"
        ]
    );
    // An admin hands the orphaned objective on, and may delete the archived home.
    let r = b
        .post(
            &format!("/objectives/{assigned}/reassign"),
            "director",
            json!({"to": "builder"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let path = archive.replace(' ', "%20");
    let r = b
        .call(
            "DELETE",
            &format!("/fs/rm?path={path}&recursive=true"),
            "director",
            None,
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text);
}

/// The objective activity of a removed member stays with it: a new member of the same name
/// who is later given the objective sees only its own intervals and rows.
#[tokio::test]
async fn objective_activity_follows_the_member_not_the_name() {
    let mut b = broker_support::start_broker().await;
    create(&mut b, "carol").await;
    let r = b
        .post(
            "/objectives",
            "director",
            json!({"title": "t", "outcome": "o", "assignee": "carol"}),
        )
        .await;
    let id = r.json["id"].as_str().unwrap().to_owned();
    // The old carol opens the objective and never closes it.
    let r = b
        .post(
            "/members/carol/activity",
            "carol",
            json!({"events": [
                {"kind": "objective_open", "ts": 1000, "objectiveId": id},
                exchange(2000, "old.example")
            ]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = b.call("DELETE", "/members/carol", "director", None).await;
    assert_eq!(r.status, 204);
    create(&mut b, "carol").await;
    let r = b
        .post(
            &format!("/objectives/{id}/reassign"),
            "director",
            json!({"to": "carol"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = b
        .post(
            "/members/carol/activity",
            "carol",
            json!({"events": [exchange(3000, "new.example")]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    // The new carol can view the objective, but the old carol's open interval is not hers.
    let r = b.get(&format!("/objectives/{id}/activity"), "carol").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        (hosts(&r.json), r.json["intervals"].clone()),
        (vec![], json!([]))
    );
    // An auditor sees the old carol's exchange in the old interval, and nothing of the new one.
    let r = b
        .get(&format!("/objectives/{id}/activity"), "director")
        .await;
    assert_eq!(hosts(&r.json), vec!["old.example"], "{}", r.text);
}

/// A device enrollment approved for a member that is then removed hands nothing over, even
/// when a new member has taken the name before the device collects.
#[tokio::test]
async fn an_enrollment_for_a_removed_member_is_not_handed_to_its_successor() {
    let mut b = broker_support::start_broker().await;
    let body = |v: Value| Some(serde_json::to_vec(&v).unwrap());
    let r = b
        .raw(
            "POST",
            "/enroll",
            None,
            body(json!({"labelHint": "laptop"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let device = r.json["deviceCode"].as_str().unwrap().to_owned();
    let user = r.json["userCode"].as_str().unwrap().to_owned();
    let r = b
        .post(
            "/enroll/approve",
            "director",
            json!({"mode": "create", "userCode": user, "memberName": "carol",
                   "role": {"title": "engineer"}, "permissions": []}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = b.call("DELETE", "/members/carol", "director", None).await;
    assert_eq!(r.status, 204);
    create(&mut b, "carol").await;
    let r = b
        .raw(
            "POST",
            "/enroll/poll",
            None,
            body(json!({"deviceCode": device})),
        )
        .await;
    assert_eq!(
        (r.status, r.json["error"].clone()),
        (400, json!("expired_token")),
        "{}",
        r.text
    );
}
