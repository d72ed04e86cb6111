//! The message log, channels, objectives and retention as store functions on PostgreSQL and
//! on SQLite: the same calls through `Store::tx` / `Store::view` give the same answers on
//! both. On PostgreSQL the log also takes its numbers from `log_head` in commit order and rings
//! the doorbell. Each test has a database of its own ([`common::postgres::TestDb`]); without a
//! server they skip (fail under `CI=true`).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::collections::HashSet;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ac7_protocol::domain::message::{LogLevel, Message};
use ac7_protocol::domain::objective::{self as rules, Change, NewObjective, Objective, Status};
use ac7_runtime::broker::channels;
use ac7_runtime::broker::db::{Store, StoreError};
use ac7_runtime::broker::messages::{self, Feed, ViewerScope, Window};
use ac7_runtime::broker::objectives::{self, ListFilter};
use ac7_runtime::broker::pg::{Doorbell, PgConfig, Ring};
use ac7_runtime::broker::retention;
use ac7_runtime::broker::store::{Backend, Conn};
use ac7_runtime::params;

use crate::common;
use crate::common::postgres::TestDb;

/// A PostgreSQL store on a fresh database and an in-memory SQLite store.
async fn stores() -> Option<(TestDb, Store, Store)> {
    let db = TestDb::create().await?;
    let pg = Store::open_postgres(PgConfig::parse(&db.url).unwrap()).unwrap();
    assert_eq!(pg.backend(), Backend::Postgres);
    Some((db, pg, Store::open_in_memory().unwrap()))
}

/// Runs `f` in a write transaction on both; the answers must agree. Returns PostgreSQL's.
fn both<T: PartialEq + std::fmt::Debug>(
    pg: &Store,
    sqlite: &Store,
    f: impl Fn(&Conn<'_>) -> Result<T, StoreError>,
) -> T {
    let a = pg.tx(&f).unwrap();
    let b = sqlite.tx(&f).unwrap();
    assert_eq!(a, b, "PostgreSQL and SQLite disagree");
    a
}

/// Runs `f` in a read transaction on both; the answers must agree. Returns PostgreSQL's.
fn both_view<T: PartialEq + std::fmt::Debug>(
    pg: &Store,
    sqlite: &Store,
    f: impl Fn(&Conn<'_>) -> Result<T, StoreError>,
) -> T {
    let a = pg.view(&f).unwrap();
    let b = sqlite.view(&f).unwrap();
    assert_eq!(a, b, "PostgreSQL and SQLite disagree");
    a
}

fn message(id: &str, ts: i64, from: &str, to: Option<&str>, thread: Option<&str>) -> Message {
    let mut data = serde_json::Map::new();
    if let Some(t) = thread {
        data.insert("thread".into(), serde_json::Value::String(t.to_owned()));
    }
    Message {
        id: id.to_owned(),
        ts,
        to: to.map(str::to_owned),
        from: Some(from.to_owned()),
        title: None,
        body: format!("body of {id}"),
        level: LogLevel::Info,
        data,
        attachments: Vec::new(),
    }
}

fn insert(c: &Conn<'_>, m: &Message) -> Result<i64, StoreError> {
    messages::insert(
        c,
        m,
        &serde_json::to_string(m)?,
        &ac7_protocol::domain::message::Audience::Everyone,
    )
}

fn scope(channels: &[&str], objectives: &[&str], manager: bool, since: i64) -> ViewerScope {
    ViewerScope {
        channels: channels.iter().map(|s| (*s).to_owned()).collect(),
        objectives: objectives.iter().map(|s| (*s).to_owned()).collect(),
        manager,
        since,
    }
}

fn ids(rows: &[messages::Row]) -> Vec<String> {
    rows.iter().map(|r| r.id.clone()).collect()
}

#[tokio::test]
async fn the_log_appends_and_pages_the_same_on_both() {
    let Some((_db, pg, sqlite)) = stores().await else {
        return;
    };
    let log = [
        message("g1", 100, "ann", None, None),
        message("dm1", 110, "ann", Some("bob"), None),
        message("c1", 120, "bob", None, Some("chan:dev")),
        message("o1", 130, "cy", None, Some("obj:OBJ-1")),
        message("dm2", 140, "bob", Some("ann"), None),
        message("o2", 150, "ann", None, Some("obj:OBJ-2")),
        message("c2", 160, "cy", None, Some("chan:ops")),
        message("g2", 170, "cy", None, None),
        message("dm3", 180, "cy", Some("bob"), None),
    ];
    let seqs = both(&pg, &sqlite, |c| {
        log.iter()
            .map(|m| insert(c, m))
            .collect::<Result<Vec<_>, _>>()
    });
    assert_eq!(seqs, (1..=9).collect::<Vec<i64>>());
    // Another transaction continues the numbering.
    let next = both(&pg, &sqlite, |c| {
        insert(c, &message("g3", 190, "ann", None, None))
    });
    assert_eq!(next, 10);
    assert_eq!(both_view(&pg, &sqlite, messages::head), 10);
    assert_eq!(
        both_view(&pg, &sqlite, |c| messages::seq_of(c, "c2")),
        Some(7)
    );
    assert_eq!(
        both_view(&pg, &sqlite, |c| messages::seq_of(c, "nope")),
        None
    );
    // PostgreSQL's counter row holds the last number given.
    let last = pg
        .view(|c| {
            c.query_row(
                "SELECT last_seq FROM log_head WHERE id = 1",
                params![],
                |r| r.get::<i64>(0),
            )
        })
        .unwrap();
    assert_eq!(last, Some(10));

    // Pages: every feed, both orders, seq and ts bounds.
    let bob = scope(&["dev"], &["OBJ-1"], false, 0);
    let page = |viewer: &'static str, scope: ViewerScope, feed: Feed, window: Window| {
        ids(&both_view(&pg, &sqlite, move |c| {
            messages::page(c, viewer, &scope, &feed, &window)
        }))
    };
    assert_eq!(
        page("bob", bob.clone(), Feed::All, Window::newest(100)),
        ["g3", "dm3", "g2", "dm2", "o1", "c1", "dm1", "g1"]
    );
    assert_eq!(
        page("bob", bob.clone(), Feed::All, Window::newest(3)),
        ["g3", "dm3", "g2"]
    );
    let oldest = Window {
        after_seq: Some(2),
        oldest_first: true,
        ..Window::newest(4)
    };
    assert_eq!(
        page("bob", bob.clone(), Feed::All, oldest),
        ["c1", "o1", "dm2", "g2"]
    );
    let by_ts = Window {
        after_ts: Some(110),
        before_ts: Some(180),
        before_seq: Some(9),
        ..Window::newest(100)
    };
    assert_eq!(
        page("bob", bob.clone(), Feed::All, by_ts),
        ["g2", "dm2", "o1", "c1"]
    );
    assert_eq!(
        page("bob", bob.clone(), Feed::General, Window::newest(100)),
        ["g3", "g2", "g1"]
    );
    assert_eq!(
        page(
            "bob",
            bob.clone(),
            Feed::Channel("dev".into()),
            Window::newest(100)
        ),
        ["c1"]
    );
    assert_eq!(
        page(
            "bob",
            bob.clone(),
            Feed::With("ann".into()),
            Window::newest(100)
        ),
        ["dm2", "dm1"]
    );
    // A later incarnation of bob sees no DM of the earlier one.
    assert_eq!(
        page(
            "bob",
            scope(&["dev"], &["OBJ-1"], false, 5),
            Feed::All,
            Window::newest(100)
        ),
        ["g3", "dm3", "g2", "o1", "c1", "g1"]
    );
    // A manager is in every objective thread (the range of `obj:` threads).
    assert_eq!(
        page(
            "dee",
            scope(&[], &[], true, 0),
            Feed::All,
            Window::newest(100)
        ),
        ["g3", "g2", "o2", "o1", "g1"]
    );

    // Retention: oldest first, in batches, the cutoff itself stays.
    assert_eq!(both(&pg, &sqlite, |c| retention::prune_batch(c, 150, 3)), 3);
    assert_eq!(retention::prune_all(&pg, 150).unwrap(), 2);
    assert_eq!(retention::prune_all(&sqlite, 150).unwrap(), 2);
    let left = page(
        "dee",
        scope(&[], &[], true, 0),
        Feed::All,
        Window::newest(100),
    );
    assert_eq!(left, ["g3", "g2", "o2"]);
    // The numbering goes on after pruning.
    assert_eq!(
        both(&pg, &sqlite, |c| insert(
            c,
            &message("g4", 200, "ann", None, None)
        )),
        11
    );
}

#[tokio::test]
async fn postgres_log_numbers_follow_commit_order_and_ring_the_doorbell() {
    let Some((db, pg, _sqlite)) = stores().await else {
        return;
    };
    let mut bell = Doorbell::start(&db.config()).await.unwrap();
    let pg = std::sync::Arc::new(pg);

    // The first append holds the counter row until it commits; the second waits for it, so it
    // gets the next number and becomes visible after it.
    let (held_tx, held_rx) = mpsc::channel();
    let first = {
        let pg = std::sync::Arc::clone(&pg);
        std::thread::spawn(move || {
            pg.tx(|c| {
                let seq = insert(c, &message("a", 1, "ann", None, None))?;
                held_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                Ok::<_, StoreError>((seq, Instant::now()))
            })
            .unwrap()
        })
    };
    held_rx.recv().unwrap();
    let second = {
        let pg = std::sync::Arc::clone(&pg);
        std::thread::spawn(move || {
            let seq = pg
                .tx(|c| insert(c, &message("b", 2, "bob", None, None)))
                .unwrap();
            (seq, Instant::now())
        })
    };
    let (a, first_done) = first.join().unwrap();
    let (b, second_done) = second.join().unwrap();
    assert_eq!((a, b), (1, 2));
    assert!(
        second_done > first_done,
        "the second append did not wait for the first to commit"
    );

    // The doorbell heard the commits (the newest sequence at least).
    let mut heard = 0;
    while heard < 2 {
        match common::within(10, "a ring of the log", bell.ring()).await {
            Ring::Seq(n) => heard = n,
            Ring::Reconnected => {}
        }
    }
    assert_eq!(heard, 2);

    // A rolled-back append gives its number back.
    let e = pg
        .tx(|c| {
            insert(c, &message("c", 3, "cy", None, None))?;
            Err::<(), _>(StoreError::Corrupt("on purpose".into()))
        })
        .unwrap_err();
    assert!(e.to_string().contains("on purpose"), "{e}");
    assert_eq!(
        pg.tx(|c| insert(c, &message("d", 4, "dee", None, None)))
            .unwrap(),
        3
    );
}

/// Two appends at once that both add a name the log has no key for: the first holds the
/// counter row and then adds the name, the second adds it too. The second waits for the counter
/// before it adds any key, so both commit; adding its keys first was a deadlock (PostgreSQL
/// failed one of the two pushes with 500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_adding_the_same_new_key_do_not_deadlock() {
    let Some((db, pg, _sqlite)) = stores().await else {
        return;
    };
    let pg = std::sync::Arc::new(pg);
    let (held_tx, held_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let first = {
        let pg = std::sync::Arc::clone(&pg);
        std::thread::spawn(move || {
            pg.tx(|c| {
                let a = insert(c, &message("a", 1, "ann", None, None))?;
                held_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                let b = insert(c, &message("b", 2, "ann", Some("newcomer"), None))?;
                Ok::<_, StoreError>((a, b))
            })
        })
    };
    held_rx.recv().unwrap();
    let second = {
        let pg = std::sync::Arc::clone(&pg);
        std::thread::spawn(move || {
            pg.tx(|c| insert(c, &message("c", 3, "bob", Some("newcomer"), None)))
        })
    };
    // The second is blocked on a lock the first holds.
    let pool = db.pool().await;
    let client = pool.get().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = client
            .query_one(
                "SELECT COUNT(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the second append never waited");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    go_tx.send(()).unwrap();
    let first = first.join().unwrap();
    let second = second.join().unwrap();
    assert_eq!(
        (first.unwrap(), second.unwrap()),
        ((1, 2), 3),
        "both appends commit, in order"
    );
}

#[tokio::test]
async fn tx_then_runs_the_follow_up_after_the_commit() {
    let Some((_db, pg, sqlite)) = stores().await else {
        return;
    };
    for (name, store) in [("postgres", &pg), ("sqlite", &sqlite)] {
        let seq = store
            .tx_then(
                |c| insert(c, &message("y", 2, "ann", None, None)),
                |seq| seq + 100,
            )
            .unwrap();
        assert_eq!(seq, 101, "{name}");
    }
}

#[tokio::test]
async fn channels_behave_the_same_on_both() {
    let Some((_db, pg, sqlite)) = stores().await else {
        return;
    };
    assert_eq!(both_view(&pg, &sqlite, channels::general_created_at), None);
    both(&pg, &sqlite, |c| {
        c.execute(
            "INSERT INTO team (id, name, directive, context, presets, created_at)
             VALUES (1, 't', 'd', '', '{}', ?1)",
            params![42i64],
        )
    });
    assert_eq!(
        both_view(&pg, &sqlite, channels::general_created_at),
        Some(42)
    );
    // Ids are random: create on each, then compare what does not depend on them.
    let create = |store: &Store, slug: &str, creator: &str, now: i64| {
        store
            .tx(|c| channels::create(c, slug, creator, now))
            .unwrap()
    };
    let mut made = Vec::new();
    for store in [&pg, &sqlite] {
        let dev = create(store, "dev", "ann", 100);
        let ops = create(store, "ops", "bob", 200);
        let old = create(store, "old", "ann", 300);
        made.push((dev, ops, old));
    }
    let summary = |store: &Store, id: &str| {
        store
            .tx(|c| {
                let id = id.to_owned();
                channels::add_member(c, &id, "bob", "member", 110)?;
                channels::add_member(c, &id, "cy", "admin", 120)?;
                channels::add_member(c, &id, "dee", "member", 105)?;
                channels::remove_member(c, &id, "dee")?;
                channels::add_member(c, &id, "eve", "member", 110)?;
                channels::rename(c, &id, "devs")?;
                Ok::<_, StoreError>(())
            })
            .unwrap();
        store
            .view(|c| {
                let ch = channels::by_slug(c, "devs")?.unwrap();
                assert_eq!(channels::by_id(c, id)?.as_ref(), Some(&ch));
                assert_eq!(channels::by_slug(c, "dev")?, None);
                let members: Vec<(String, String, i64)> = channels::members(c, id)?
                    .into_iter()
                    .map(|m| (m.member_name, m.role, m.joined_at))
                    .collect();
                Ok::<_, StoreError>((
                    (ch.slug, ch.created_by, ch.created_at, ch.archived_at),
                    members,
                    channels::member_names(c, id)?,
                    channels::role_of(c, id, "cy")?,
                    channels::role_of(c, id, "dee")?,
                ))
            })
            .unwrap()
    };
    let on_pg = summary(&pg, &made[0].0.id);
    assert_eq!(on_pg, summary(&sqlite, &made[1].0.id));
    assert_eq!(
        on_pg.1,
        [
            ("ann".to_owned(), "admin".to_owned(), 100),
            ("cy".to_owned(), "admin".to_owned(), 120),
            ("bob".to_owned(), "member".to_owned(), 110),
            ("eve".to_owned(), "member".to_owned(), 110),
        ]
    );
    let listed = |store: &Store, old: &str| {
        store.tx(|c| channels::archive(c, old, 400)).unwrap();
        store
            .view(|c| {
                Ok::<_, StoreError>((
                    channels::list_active(c)?
                        .into_iter()
                        .map(|ch| ch.slug)
                        .collect::<Vec<_>>(),
                    channels::by_id(c, old)?.and_then(|ch| ch.archived_at),
                ))
            })
            .unwrap()
    };
    let on_pg = listed(&pg, &made[0].2.id);
    assert_eq!(
        on_pg,
        (vec!["ops".to_owned(), "devs".to_owned()], Some(400))
    );
    assert_eq!(on_pg, listed(&sqlite, &made[1].2.id));
}

fn new_objective(id: &str, assignee: &str, originator: &str, watchers: &[&str]) -> NewObjective {
    NewObjective {
        id: id.to_owned(),
        title: format!("title {id}"),
        outcome: "it works".into(),
        body: String::new(),
        assignee: assignee.to_owned(),
        originator: originator.to_owned(),
        watchers: watchers.iter().map(|s| (*s).to_owned()).collect(),
        attachments: Vec::new(),
    }
}

fn listed(c: &Conn<'_>, filter: &ListFilter<'_>) -> Result<Vec<String>, StoreError> {
    Ok(objectives::list(c, filter)?
        .into_iter()
        .map(|o| o.id)
        .collect())
}

#[tokio::test]
async fn objectives_behave_the_same_on_both() {
    let Some((_db, pg, sqlite)) = stores().await else {
        return;
    };
    let made: Vec<(Objective, Vec<_>)> = vec![
        rules::create(new_objective("OBJ-1", "bob", "ann", &["cy"]), 100).unwrap(),
        rules::create(new_objective("OBJ-2", "cy", "ann", &[]), 200).unwrap(),
        rules::create(new_objective("OBJ-3", "bob", "cy", &["dee", "ann"]), 200).unwrap(),
        rules::create(new_objective("OBJ-4", "ann", "bob", &["dee_"]), 50).unwrap(),
    ];
    both(&pg, &sqlite, |c| {
        for (obj, events) in &made {
            objectives::insert(c, obj, events)?;
        }
        Ok(())
    });
    assert!(both_view(&pg, &sqlite, |c| objectives::exists(c, "OBJ-2")));
    assert!(!both_view(&pg, &sqlite, |c| objectives::exists(c, "OBJ-9")));
    // Block one.
    let blocked = both(&pg, &sqlite, |c| {
        let mut obj = objectives::get(c, "OBJ-3")?.unwrap();
        let events = rules::apply(
            &mut obj,
            "bob",
            Change::Update {
                status: Some(Status::Blocked),
                block_reason: Some("waiting".into()),
            },
            300,
        )
        .unwrap();
        objectives::update(c, &obj, &events)?;
        Ok(obj)
    });
    assert_eq!(blocked.status, Status::Blocked);
    assert_eq!(
        both_view(&pg, &sqlite, |c| objectives::get(c, "OBJ-3")),
        Some(blocked)
    );
    let events = both_view(&pg, &sqlite, |c| objectives::events(c, "OBJ-3"));
    assert_eq!(
        events.len(),
        4,
        "assigned, two watchers, blocked: {events:?}"
    );
    assert_eq!(events[0].objective_id, "OBJ-3");

    let all = ListFilter::default();
    assert_eq!(
        both_view(&pg, &sqlite, |c| listed(c, &all)),
        ["OBJ-3", "OBJ-2", "OBJ-1", "OBJ-4"]
    );
    let filters = [
        (
            ListFilter {
                assignee: Some("bob"),
                ..ListFilter::default()
            },
            vec!["OBJ-3", "OBJ-1"],
        ),
        (
            ListFilter {
                status: Some(Status::Active),
                ..ListFilter::default()
            },
            vec!["OBJ-2", "OBJ-1", "OBJ-4"],
        ),
        (
            ListFilter {
                participant: Some("dee"),
                ..ListFilter::default()
            },
            vec!["OBJ-3"],
        ),
        (
            ListFilter {
                participant: Some("cy"),
                status: Some(Status::Active),
                ..ListFilter::default()
            },
            vec!["OBJ-2", "OBJ-1"],
        ),
        (
            ListFilter {
                participant: Some("de"),
                ..ListFilter::default()
            },
            vec![],
        ),
    ];
    for (filter, want) in &filters {
        assert_eq!(
            &both_view(&pg, &sqlite, |c| listed(c, filter)),
            want,
            "{filter:?}"
        );
    }
    let open = both_view(&pg, &sqlite, |c| {
        Ok(objectives::open_for(c, "bob")?
            .into_iter()
            .map(|o| o.id)
            .collect::<Vec<_>>())
    });
    assert_eq!(open, ["OBJ-1", "OBJ-3"]);

    // A removed member leaves every objective.
    assert_eq!(
        both(&pg, &sqlite, |c| objectives::detach_member(c, "ann")),
        4
    );
    let after = both_view(&pg, &sqlite, |c| {
        Ok(objectives::list(c, &all)?
            .into_iter()
            .map(|o| (o.id, o.assignee, o.originator, o.watchers))
            .collect::<Vec<_>>())
    });
    let gone = "ann (removed)".to_owned();
    assert_eq!(after[0].3, ["dee"]);
    assert_eq!(after[2].2, gone);
    assert_eq!(after[3].1, gone);
    assert!(
        both_view(&pg, &sqlite, |c| listed(
            c,
            &ListFilter {
                participant: Some("ann"),
                ..ListFilter::default()
            }
        ))
        .is_empty()
    );
    let members: HashSet<String> = after.iter().flat_map(|o| o.3.clone()).collect();
    assert!(!members.contains("ann"));
}
