//! Live activity streams across replicas on one PostgreSQL database: activity uploaded through
//! any replica reaches every watcher of that member on every replica, once, in id order, even
//! when an upload with a smaller id commits after one with a larger id, or when a doorbell is
//! missed; a watcher that moves to another replica resumes with `Last-Event-ID` without a gap
//! or a duplicate; a watcher whose token is revoked through another replica is cut off.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::time::Duration;

use ac7_runtime::broker::activity;
use ac7_runtime::broker::db::{Store, StoreError};
use ac7_runtime::broker::team;
use serde_json::{Value, json};

use crate::broker_support::{SseClient, TestBroker};
use crate::common::postgres::TestDb;
use crate::pg_replicas::replicas_with;

/// The live activity stream of `builder`.
const BUILDER: &str = "/members/builder/activity/stream";

fn marker(ts: u64, objective: &str) -> Value {
    json!({"kind": "objective_open", "ts": ts, "objectiveId": objective})
}

/// Uploads `events` as `who` through `url` (the runner's endpoint).
async fn upload(http: &reqwest::Client, url: &str, who: &str, token: &str, events: Vec<Value>) {
    let r = http
        .post(format!("{url}/members/{who}/activity"))
        .bearer_auth(token)
        .json(&json!({ "events": events }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
}

/// [`upload`] through replica `r`.
async fn upload_on(r: &TestBroker, who: &str, events: Vec<Value>) {
    upload(&r.http, &r.url, who, r.token(who), events).await;
}

/// `builder`'s stored row ids, oldest first (the table's order).
async fn stored(r: &TestBroker) -> Vec<u64> {
    let list = r
        .get("/members/builder/activity?limit=1000", "director")
        .await;
    assert_eq!(list.status, 200, "{}", list.text);
    let mut ids: Vec<u64> = list.json["activity"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["id"].as_u64().unwrap())
        .collect();
    ids.reverse();
    ids
}

/// The next activity row of an SSE watcher (its SSE id is the row id).
async fn next_row(s: &mut SseClient) -> Value {
    let ev = s.next_event().await;
    assert_eq!(ev.event.as_deref(), Some("activity"), "{ev:?}");
    let row: Value = serde_json::from_str(&ev.data).unwrap();
    assert_eq!(ev.id, Some(row["id"].to_string()));
    row
}

/// The ids of the next `n` rows of an SSE watcher.
async fn next_ids(s: &mut SseClient, n: usize) -> Vec<u64> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(next_row(s).await["id"].as_u64().unwrap());
    }
    ids
}

/// Stores a `builder` row the way an upload does, but rings no doorbell: as if every
/// replica's notification of it was lost. Returns its id.
async fn insert_unannounced(db: &TestDb, ts: i64) -> u64 {
    let pool = db.pool().await;
    let client = pool.get().await.unwrap();
    let json = marker(u64::try_from(ts).unwrap(), "unannounced").to_string();
    let id: i64 = client
        .query_one(
            "WITH head AS (UPDATE activity_head SET last_id = last_id + 1 WHERE id = 1
                           RETURNING last_id)
             INSERT INTO member_activity (id, member_name, ts, kind, event_json, created_at,
                                          member_seq)
             SELECT last_id, 'builder', $1, 'objective_open', $2, $1,
                    (SELECT seq FROM members WHERE name = 'builder')
             FROM head RETURNING id",
            &[&ts, &json],
        )
        .await
        .unwrap()
        .get(0);
    u64::try_from(id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_through_every_replica_reach_every_watcher_once_in_id_order() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let started = std::time::Instant::now();
    let rs = replicas_with(&db, 3, |_| {}).await;
    // A watcher of builder's activity on each replica (and builder watching itself on one,
    // over WebSocket).
    let mut watchers = Vec::new();
    for r in &rs {
        watchers.push(r.sse_path("director", BUILDER, None).await);
    }
    let mut own = rs[1].ws_path("builder", BUILDER, None).await;
    // builder and reviewer upload through all three at once.
    let rounds = 8;
    let mut tasks = Vec::new();
    for (i, r) in rs.iter().enumerate() {
        for who in ["builder", "reviewer"] {
            let (http, url, token) = (r.http.clone(), r.url.clone(), r.token(who).to_owned());
            tasks.push(tokio::spawn(async move {
                for k in 0..rounds {
                    let ts = 1000 * (i as u64 + 1) + k;
                    let events = vec![marker(ts, "a"), marker(ts, "b")];
                    upload(&http, &url, who, &token, events).await;
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let ids = stored(&rs[2]).await;
    assert_eq!(ids.len(), rs.len() * rounds as usize * 2);
    for (i, w) in watchers.iter_mut().enumerate() {
        assert_eq!(
            next_ids(w, ids.len()).await,
            ids,
            "the watcher on replica {i}: every row of builder, once, in id order"
        );
    }
    let mut got = Vec::new();
    for _ in 0..ids.len() {
        let row = own.next_message().await;
        assert_eq!(row["memberName"], "builder");
        got.push(row["id"].as_u64().unwrap());
    }
    assert_eq!(got, ids, "builder's own WebSocket watcher");
    // Nothing twice.
    for w in &mut watchers {
        w.expect_silence(300).await;
    }
    eprintln!(
        "pg_activity: {} rows to 4 watchers in {:?}",
        ids.len(),
        started.elapsed()
    );
}

// Several threads: the second upload's handler blocks its thread while it waits for the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_commits_late_reaches_every_watcher_before_later_ids() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas_with(&db, 2, |_| {}).await;
    let mut watchers = Vec::new();
    for r in &rs {
        watchers.push(r.sse_path("director", BUILDER, None).await);
    }
    // An upload takes its ids and stays uncommitted...
    let store = Store::open_postgres(db.config()).unwrap();
    let (taken_tx, taken_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let held = tokio::task::spawn_blocking(move || {
        store
            .tx(|c| {
                let seq = team::member_seq(c, "builder")?.unwrap();
                let event = serde_json::from_value(marker(1, "late")).unwrap();
                let rows = activity::append(c, "builder", seq, vec![event], 1)?;
                taken_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                Ok::<_, StoreError>(rows[0].id)
            })
            .unwrap()
    });
    taken_rx.await.unwrap();
    // ...while another is made through replica 1.
    let (http, url, token) = (
        rs[1].http.clone(),
        rs[1].url.clone(),
        rs[1].token("builder").to_owned(),
    );
    let later = tokio::spawn(async move {
        upload(&http, &url, "builder", &token, vec![marker(2, "early")]).await;
    });
    let pool = db.pool().await;
    let client = pool.get().await.unwrap();
    crate::common::wait_until(
        "the second upload to answer or to wait for the first",
        Duration::from_secs(10),
        async || {
            later.is_finished()
                || client
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                                        WHERE datname = $1 AND wait_event_type = 'Lock')",
                        &[&db.name],
                    )
                    .await
                    .unwrap()
                    .get::<_, bool>(0)
        },
    )
    .await;
    release_tx.send(()).unwrap();
    let held_id = held.await.unwrap();
    later.await.unwrap();
    let ids = stored(&rs[0]).await;
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&held_id), "{ids:?} {held_id}");
    for (i, w) in watchers.iter_mut().enumerate() {
        assert_eq!(
            next_ids(w, 2).await,
            ids,
            "the watcher on replica {i}: both rows, in id order"
        );
        w.expect_silence(300).await;
    }
}

#[tokio::test]
async fn a_watcher_resumes_on_another_replica_without_gap_or_duplicate() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas_with(&db, 2, |_| {}).await;
    let mut on_a = rs[0].sse_path("builder", BUILDER, None).await;
    for k in 0..3 {
        upload_on(&rs[1], "builder", vec![marker(k, "first")]).await;
    }
    let seen = next_ids(&mut on_a, 3).await;
    assert_eq!(seen, stored(&rs[0]).await);
    drop(on_a);
    // While nobody watches: uploads through both replicas.
    for k in 3..7 {
        upload_on(
            &rs[usize::try_from(k % 2).unwrap()],
            "builder",
            vec![marker(k, "missed")],
        )
        .await;
    }
    let missed: Vec<u64> = stored(&rs[0]).await.split_off(3);
    // Resumed on the other replica: the missed rows, then live ones from either replica.
    let last = seen[2].to_string();
    let mut on_b = rs[1].sse_path("builder", BUILDER, Some(&last)).await;
    assert_eq!(next_ids(&mut on_b, missed.len()).await, missed);
    upload_on(&rs[0], "builder", vec![marker(7, "live")]).await;
    upload_on(&rs[1], "builder", vec![marker(8, "live")]).await;
    let all = stored(&rs[0]).await;
    assert_eq!(next_ids(&mut on_b, 2).await, all[7..].to_vec());
    on_b.expect_silence(300).await;

    // A client that got a row no replica has announced yet (here through the list) resumes
    // from it on a replica that has not delivered it: the row is not sent again.
    drop(on_b);
    let unannounced = insert_unannounced(&db, 9).await;
    assert_eq!(stored(&rs[0]).await.last(), Some(&unannounced));
    let mut on_a = rs[0]
        .sse_path("builder", BUILDER, Some(&unannounced.to_string()))
        .await;
    upload_on(&rs[1], "builder", vec![marker(10, "after")]).await;
    let newest = *stored(&rs[0]).await.last().unwrap();
    assert_eq!(next_ids(&mut on_a, 1).await, vec![newest]);
    on_a.expect_silence(300).await;
}

#[tokio::test]
async fn a_missed_doorbell_delays_activity_and_never_loses_it() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas_with(&db, 2, |_| {}).await;
    let mut watchers = Vec::new();
    for r in &rs {
        watchers.push(r.sse_path("director", BUILDER, None).await);
    }
    upload_on(&rs[0], "builder", vec![marker(1, "rung")]).await;
    let first = stored(&rs[0]).await;
    for w in &mut watchers {
        assert_eq!(next_ids(w, 1).await, first);
    }
    // A row whose notification is lost, then an upload that rings: both arrive, in order.
    let lost = insert_unannounced(&db, 2).await;
    upload_on(&rs[1], "builder", vec![marker(3, "rung")]).await;
    let rung = *stored(&rs[0]).await.last().unwrap();
    for (i, w) in watchers.iter_mut().enumerate() {
        assert_eq!(next_ids(w, 2).await, vec![lost, rung], "replica {i}");
    }
    // A row no notification announces, then every replica's listening connection is cut:
    // each replica reads the table once it listens again, and finds the row.
    let unheard = insert_unannounced(&db, 4).await;
    for w in &mut watchers {
        w.expect_silence(300).await;
    }
    let pool = db.pool().await;
    let client = pool.get().await.unwrap();
    let cut: i64 = client
        .query_one(
            "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = $1 AND (query LIKE 'LISTEN %' OR query = 'SELECT 1')) AS cut",
            &[&db.name],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(cut, 2, "one listening connection per replica");
    for (i, w) in watchers.iter_mut().enumerate() {
        // Within the 5 s `next_row` waits: the doorbell reconnects at once.
        let row = next_row(w).await;
        assert_eq!(row["id"].as_u64(), Some(unheard), "replica {i}");
        w.expect_silence(300).await;
    }
}

#[tokio::test]
async fn a_token_rotated_on_one_replica_closes_its_activity_streams_on_another() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rs = replicas_with(&db, 2, |_| {}).await;
    let mut watching = rs[0].sse_path("builder", BUILDER, None).await;
    let mut bystander = rs[0].sse_path("director", BUILDER, None).await;
    let rotated = rs[1]
        .post("/members/builder/rotate-token", "director", json!({}))
        .await;
    assert_eq!(rotated.status, 200, "{}", rotated.text);
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while watching.next_block().await.is_some() {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the revoked token's activity stream on the other replica stays open"
    );
    // Another watcher's stream goes on.
    let token = rotated.json["token"].as_str().unwrap();
    upload(
        &rs[1].http,
        &rs[1].url,
        "builder",
        token,
        vec![marker(1, "after")],
    )
    .await;
    assert_eq!(next_ids(&mut bystander, 1).await, stored(&rs[0]).await);
}
