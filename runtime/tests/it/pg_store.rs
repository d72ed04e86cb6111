//! The PostgreSQL module of the broker against a real server: connect errors, migrations,
//! the schema, the ordered log and the doorbell. Each test has a database of its own
//! ([`common::postgres::TestDb`]); without a server they skip (fail under `CI=true`).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ac7_runtime::broker::pg::{
    self, Doorbell, LogMessage, PgConfig, PgError, PgPool, Ring, log, migrate,
};

use ac7_runtime::broker::db::{Store, StoreError};
use ac7_runtime::broker::store::postgres::PgStore;
use ac7_runtime::broker::store::{Conn, Value};
use ac7_runtime::params;

use crate::common;
use crate::common::postgres::TestDb;

fn msg(id: String, from: &str) -> LogMessage {
    LogMessage {
        json: format!(r#"{{"id":"{id}","body":"hi"}}"#),
        id,
        ts: 1_700_000_000_000,
        to_name: None,
        from_name: Some(from.to_owned()),
        thread: None,
    }
}

async fn database_exists(name: &str) -> bool {
    let admin = PgPool::connect(PgConfig::parse(&common::postgres::admin_url()).unwrap())
        .await
        .unwrap();
    let client = admin.get().await.unwrap();
    let n: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    n > 0
}

#[tokio::test]
async fn connect_failures_are_one_line_errors_that_name_the_fix() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let good = db.config();

    // Refused: a port nothing listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut refused = good.clone();
    refused.host = "127.0.0.1".to_owned();
    refused.port = port;
    let e = PgPool::connect(refused).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PgError::Unreachable { .. }), "{e:?}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.contains("refused"), "{text}");
    assert!(text.contains("is the server running"), "{text}");

    // A database that does not exist: named, with the createdb line; and not created.
    let missing = format!("{}_missing", db.name);
    let e = PgPool::connect(good.with_dbname(&missing))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PgError::NoDatabase { .. }), "{e:?}");
    assert!(
        text.contains(&format!("no database \"{missing}\"")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "createdb -h {} -p {} -U {} {missing}",
            good.host, good.port, good.user
        )),
        "{text}"
    );
    assert!(!database_exists(&missing).await);

    // A role that does not exist.
    let mut nobody = good.clone();
    nobody.user = "ac7_no_such_role".to_owned();
    let e = PgPool::connect(nobody).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PgError::NoRole { .. }), "{e:?}");
    assert!(text.contains("no role \"ac7_no_such_role\""), "{text}");
    assert!(text.contains("createuser"), "{text}");

    // verify-full with the web PKI roots: the test server's certificate (Debian's snakeoil, or
    // none at all) does not pass, and that is a TLS error, not a connection error.
    let mut tls = good.clone();
    tls.sslmode = pg::SslMode::VerifyFull;
    let e = PgPool::connect(tls).await.unwrap_err();
    assert!(matches!(e, PgError::Tls { .. }), "{e:?}");
    assert!(
        e.to_string().contains("check sslmode and sslrootcert"),
        "{e}"
    );
    // An unreadable sslrootcert is refused before connecting.
    let mut tls = good.clone();
    tls.sslmode = pg::SslMode::VerifyCa;
    tls.sslrootcert = Some("/nonexistent/ac7-root.pem".into());
    let e = PgPool::connect(tls).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("cannot read sslrootcert /nonexistent/ac7-root.pem"),
        "{e}"
    );

    // sslmode=require on a server with TLS: encrypted (through rustls), not verified.
    let plain = db.pool().await;
    let ssl: String = plain
        .get()
        .await
        .unwrap()
        .query_one("SHOW ssl", &[])
        .await
        .unwrap()
        .get(0);
    if ssl == "on" {
        let mut tls = good.clone();
        tls.sslmode = pg::SslMode::Require;
        let pool = PgPool::connect(tls).await.unwrap();
        let encrypted: bool = pool
            .get()
            .await
            .unwrap()
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(encrypted);
    }

    // A schema-less database stays schema-less after all that.
    assert_eq!(migrate::current_version(&db.pool().await).await.unwrap(), 0);
    for e in [
        PgError::BadUrl("x".into()),
        PgError::Timeout {
            addr: "h:1".into(),
            after: Duration::from_secs(5),
        },
    ] {
        assert!(!e.to_string().contains('\n'), "{e}");
    }
}

#[tokio::test]
async fn two_replicas_migrating_at_once_apply_each_migration_once() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let (a, b) = (db.pool().await, db.pool().await);
    let (ra, rb) = tokio::join!(migrate(&a), migrate(&b));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let latest = pg::latest_version();
    let mut applied = [ra.applied.clone(), rb.applied.clone()];
    applied.sort();
    assert_eq!(
        applied,
        [vec![], (1..=latest).collect::<Vec<_>>()],
        "{ra:?} {rb:?}"
    );
    assert_eq!((ra.to, rb.to), (latest, latest));
    let client = a.get().await.unwrap();
    let rows: Vec<(i32, String)> = client
        .query(
            "SELECT version, name FROM schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        rows,
        vec![
            (1, "schema v1".to_owned()),
            (2, "activity blocks".to_owned()),
            (3, "compact messages".to_owned()),
            (4, "web push".to_owned()),
            (5, "browser streams".to_owned()),
            (6, "members version".to_owned())
        ]
    );
    // A later start finds nothing to do.
    let again = migrate(&a).await.unwrap();
    assert_eq!(
        again,
        pg::Migrated {
            from: latest,
            to: latest,
            applied: vec![]
        }
    );
}

#[tokio::test]
async fn a_schema_newer_than_the_binary_is_refused() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let pool = db.pool().await;
    migrate(&pool).await.unwrap();
    let future = pg::latest_version() + 1;
    pool.get()
        .await
        .unwrap()
        .execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, 'from the future', 0)",
            &[&future],
        )
        .await
        .unwrap();
    let e = migrate(&pool).await.unwrap_err();
    assert!(
        matches!(e, PgError::SchemaTooNew { found, known } if found == future && known == future - 1),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains(&format!("version {future}")) && text.contains("run a newer ac7"),
        "{text}"
    );
}

/// Every SQLite table and column has its PostgreSQL counterpart (and the shared state tables
/// exist), so a store layer and `ac7 migrate` can map one onto the other.
#[tokio::test]
async fn schema_v1_mirrors_the_sqlite_schema() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let pool = db.pool().await;
    migrate(&pool).await.unwrap();
    let client = pool.get().await.unwrap();
    let mut pg_cols: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in client
        .query(
            "SELECT table_name::TEXT, column_name::TEXT FROM information_schema.columns
             WHERE table_schema = 'public'",
            &[],
        )
        .await
        .unwrap()
    {
        pg_cols.entry(r.get(0)).or_default().insert(r.get(1));
    }
    let sqlite = Store::open_in_memory().unwrap();
    let sqlite_cols: BTreeMap<String, BTreeSet<String>> = sqlite.with(|conn| {
        let tables: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        tables
            .into_iter()
            .map(|t| {
                let cols: BTreeSet<String> = conn
                    .prepare(&format!("SELECT name FROM pragma_table_info('{t}')"))
                    .unwrap()
                    .query_map([], |r| r.get(0))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect();
                (t, cols)
            })
            .collect()
    });
    assert!(sqlite_cols.len() >= 15, "{sqlite_cols:?}");
    for (table, cols) in &sqlite_cols {
        // The SQLite log's mark (the highest number that may have left `messages`) is kept on
        // PostgreSQL by the log's counter row.
        if table == "messages_mark" {
            assert!(
                pg_cols.contains_key("log_head"),
                "no PostgreSQL table log_head"
            );
            continue;
        }
        let pg = pg_cols
            .get(table)
            .unwrap_or_else(|| panic!("no PostgreSQL table {table}"));
        for col in cols {
            // Contents live in blob_chunks on PostgreSQL.
            if (table.as_str(), col.as_str()) == ("blobs", "data") {
                continue;
            }
            assert!(pg.contains(col), "{table}.{col} has no PostgreSQL column");
        }
    }
    for shared in [
        "schema_migrations",
        "log_head",
        "replicas",
        "presence",
        "member_status",
        "delivery_cursors",
        "rate_buckets",
        "attempt_limits",
        "setup_code",
        "enrollments",
        "blob_chunks",
    ] {
        assert!(pg_cols.contains_key(shared), "no table {shared}");
    }
    let head: i64 = log::head(&*client).await.unwrap();
    assert_eq!(head, 0);
}

/// Three replicas append concurrently in small batches while a reader follows the log: the
/// reader always continues at exactly `last + 1` (no row it skipped ever appears later) and
/// sees all 900 messages once, each replica's in the order it appended them.
#[tokio::test]
async fn concurrent_appends_from_three_replicas_commit_in_sequence_order() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let reader_pool = db.pool().await;
    migrate(&reader_pool).await.unwrap();
    const PER_REPLICA: usize = 300;
    let mut writers = Vec::new();
    for r in 0..3u64 {
        let pool = db.pool().await;
        writers.push(tokio::spawn(async move {
            let mut client = pool.get().await.unwrap();
            let mut n = 0usize;
            let mut x = r + 7; // a small LCG for batch sizes 1..=5
            while n < PER_REPLICA {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let size = usize::try_from(x >> 61).unwrap() % 5 + 1;
                let size = size.min(PER_REPLICA - n);
                let batch: Vec<LogMessage> = (n..n + size)
                    .map(|i| msg(format!("r{r}-{i:04}"), &format!("r{r}")))
                    .collect();
                let seqs = log::append(&mut client, &batch).await.unwrap();
                assert_eq!(seqs.end - seqs.start, i64::try_from(size).unwrap());
                n += size;
            }
        }));
    }
    let reader = reader_pool.get().await.unwrap();
    let mut last = 0i64;
    let mut seen: Vec<log::LogRow> = Vec::new();
    common::within(60, "the reader to see 900 messages", async {
        while seen.len() < 3 * PER_REPLICA {
            let rows = log::read_after(&*reader, last, 64).await.unwrap();
            for row in rows {
                assert_eq!(
                    row.seq,
                    last + 1,
                    "after {last} the reader got {}: a gap that a later commit fills",
                    row.seq
                );
                last = row.seq;
                seen.push(row);
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    for w in writers {
        w.await.unwrap();
    }
    assert!(
        log::read_after(&*reader, last, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(log::head(&*reader).await.unwrap(), 900);
    let ids: BTreeSet<&str> = seen.iter().map(|r| r.message.id.as_str()).collect();
    assert_eq!(ids.len(), 900);
    for r in 0..3 {
        let mine: Vec<&str> = seen
            .iter()
            .filter(|row| row.message.from_name.as_deref() == Some(&format!("r{r}")))
            .map(|row| row.message.id.as_str())
            .collect();
        let expected: Vec<String> = (0..PER_REPLICA).map(|i| format!("r{r}-{i:04}")).collect();
        assert_eq!(mine, expected);
    }
    // The stored bytes are the appended ones.
    assert_eq!(
        seen[0].message,
        msg(
            seen[0].message.id.clone(),
            seen[0].message.from_name.as_deref().unwrap()
        )
    );
}

#[tokio::test]
async fn a_failed_append_takes_no_sequence_number() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let pool = db.pool().await;
    migrate(&pool).await.unwrap();
    let mut client = pool.get().await.unwrap();
    let s = log::append(&mut client, &[msg("a".into(), "x")])
        .await
        .unwrap();
    assert_eq!(s, 1..2);
    // The second message repeats an id: the whole batch rolls back, the counter with it.
    let e = log::append(&mut client, &[msg("b".into(), "x"), msg("a".into(), "x")])
        .await
        .unwrap_err();
    assert!(matches!(e, PgError::Db(_)), "{e:?}");
    let s = log::append(&mut client, &[msg("c".into(), "x"), msg("d".into(), "x")])
        .await
        .unwrap();
    assert_eq!(s, 2..4);
    let rows = log::read_after(&*client, 0, 10).await.unwrap();
    let got: Vec<(i64, &str)> = rows
        .iter()
        .map(|r| (r.seq, r.message.id.as_str()))
        .collect();
    assert_eq!(got, vec![(1, "a"), (2, "c"), (3, "d")]);
    assert_eq!(log::read_after(&*client, 1, 1).await.unwrap()[0].seq, 2);
    assert!(log::append(&mut client, &[]).await.unwrap().is_empty());
}

/// The pid of the doorbell's backend (by its application name).
async fn doorbell_backend(client: &tokio_postgres::Client, dbname: &str) -> Option<i32> {
    client
        .query_opt(
            "SELECT pid FROM pg_stat_activity
             WHERE datname = $1 AND application_name = 'ac7-doorbell-under-test'",
            &[&dbname],
        )
        .await
        .unwrap()
        .map(|r| r.get::<_, i32>(0))
}

/// The doorbell hears appends; when its backend is terminated it reconnects by itself, says
/// so, and hears later appends.
#[tokio::test]
async fn the_doorbell_reconnects_after_its_backend_is_terminated() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let pool = db.pool().await;
    migrate(&pool).await.unwrap();
    let mut config = db.config();
    config.application_name = "ac7-doorbell-under-test".to_owned();
    let mut bell = Doorbell::start(&config).await.unwrap();
    let mut client = pool.get().await.unwrap();

    log::append(&mut client, &[msg("m1".into(), "x"), msg("m2".into(), "x")])
        .await
        .unwrap();
    let ring = common::within(10, "the first ring", bell.ring()).await;
    assert_eq!(ring, Ring::Seq(2));

    let pid = doorbell_backend(&client, &db.name)
        .await
        .expect("the doorbell's backend");
    let killed: bool = client
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(killed);

    // An append while it is away is not heard, but the reconnection is.
    log::append(&mut client, &[msg("m3".into(), "x")])
        .await
        .unwrap();
    let ring = common::within(15, "the doorbell to reconnect", async {
        loop {
            match bell.ring().await {
                Ring::Reconnected => return Ring::Reconnected,
                // m3 may have been heard before the termination reached the connection.
                Ring::Seq(3) => continue,
                other => panic!("unexpected ring {other:?}"),
            }
        }
    })
    .await;
    assert_eq!(ring, Ring::Reconnected);
    assert_eq!(bell.state().reconnects, 1);
    let new_pid = doorbell_backend(&client, &db.name)
        .await
        .expect("a new doorbell backend");
    assert_ne!(new_pid, pid);

    log::append(&mut client, &[msg("m4".into(), "x")])
        .await
        .unwrap();
    // If the doorbell was listening again before m3 committed, m3 is heard on the new
    // connection, possibly after the reconnection was reported; nothing else may come first.
    let ring = common::within(10, "a ring after the reconnection", async {
        loop {
            match bell.ring().await {
                Ring::Seq(3) => continue,
                other => return other,
            }
        }
    })
    .await;
    assert_eq!(ring, Ring::Seq(4));
}

/// A pooled connection whose backend dies is thrown away, and the pool serves a fresh one.
#[tokio::test]
async fn the_pool_replaces_a_connection_whose_backend_died() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let mut config = db.config();
    config.application_name = "ac7-pool-under-test".to_owned();
    config.pool_size = 1;
    let pool = PgPool::connect(config).await.unwrap();
    let pid: i32 = pool
        .get()
        .await
        .unwrap()
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let admin = db.pool().await;
    admin
        .get()
        .await
        .unwrap()
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    // The first use of the dead connection (if the pool has not noticed yet) fails as
    // "database away", not as a bad request.
    if let Err(e) = pool.get().await.unwrap().query_one("SELECT 1", &[]).await {
        let e = PgError::from(e);
        assert!(e.is_unavailable(), "{e:?}");
    }
    let new_pid = common::wait_until(
        "a fresh pooled connection",
        Duration::from_secs(10),
        async || {
            let client = pool.get().await.ok()?;
            client
                .query_one("SELECT pg_backend_pid()", &[])
                .await
                .ok()
                .map(|r| r.get::<_, i32>(0))
        },
    )
    .await;
    assert_ne!(new_pid, pid);
}

/// Runs `f` in a transaction on each store: `(PostgreSQL, SQLite)`.
fn on_both<T>(
    pg: &PgStore,
    sqlite: &Store,
    f: impl Fn(&Conn<'_>) -> Result<T, StoreError>,
) -> (Result<T, StoreError>, Result<T, StoreError>) {
    (pg.tx(false, &f), sqlite.tx(&f))
}

/// One store function, written once against `Conn`: upserts, `RETURNING`, counts, NULLs and
/// `ON CONFLICT DO NOTHING`.
fn exercise(c: &Conn<'_>) -> Result<Vec<Value>, StoreError> {
    c.execute(
        "INSERT INTO team (id, name, directive, context, presets, created_at)
         VALUES (1, ?1, ?2, '', '{}', ?3)
         ON CONFLICT (id) DO UPDATE SET name = excluded.name",
        params!["first", "ship it", 1_700_000_000_000i64],
    )?;
    c.execute(
        "INSERT INTO team (id, name, directive, context, presets, created_at)
         VALUES (1, ?1, '', '', '{}', 0)
         ON CONFLICT (id) DO UPDATE SET name = excluded.name",
        params!["second"],
    )?;
    let seq = c
        .query_row(
            "INSERT INTO members (name, role_title, role_description, instructions, permissions, created_at)
             VALUES (?1, 'engineer', '', '', '[]', ?2) RETURNING seq",
            params!["carol", 5i64],
            |r| r.get::<i64>(0),
        )?
        .unwrap_or_default();
    for _ in 0..2 {
        c.execute(
            "INSERT INTO blob_trash (hash) VALUES (?1) ON CONFLICT DO NOTHING",
            params!["h1"],
        )?;
    }
    let mut out = c
        .query_row(
            "SELECT name, directive, created_at FROM team WHERE id = 1",
            params![],
            |r| Ok(vec![r.get(0)?, r.get(1)?, r.get(2)?]),
        )?
        .unwrap_or_default();
    out.push(Value::Int(seq));
    out.extend(c.query(
        "SELECT CAST(COUNT(*) AS BIGINT) FROM members WHERE name = ?1 OR ?2 IS NULL",
        params!["carol", Option::<String>::None],
        |r| r.get::<Value>(0),
    )?);
    let trashed = c.exists("SELECT 1 FROM blob_trash WHERE hash = ?1", params!["h1"])?;
    out.push(Value::Int(i64::from(trashed)));
    Ok(out)
}

#[tokio::test]
async fn store_sql_answers_the_same_on_sqlite_and_postgres() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let pg = PgStore::open(PgConfig::parse(&db.url).unwrap()).unwrap();
    let sqlite = Store::open_in_memory().unwrap();
    let (on_pg, on_sqlite) = on_both(&pg, &sqlite, exercise);
    let on_pg = on_pg.unwrap();
    assert_eq!(
        on_pg,
        vec![
            Value::Text("second".into()),
            Value::Text("ship it".into()),
            Value::Int(1_700_000_000_000),
            Value::Int(1),
            Value::Int(1),
            Value::Int(1),
        ]
    );
    assert_eq!(on_pg, on_sqlite.unwrap());

    // A transaction whose closure fails leaves nothing behind, on both.
    let (a, b) = on_both(&pg, &sqlite, |c| -> Result<(), StoreError> {
        c.execute("INSERT INTO blob_trash (hash) VALUES (?1)", params!["h2"])?;
        Err(StoreError::Corrupt("on purpose".into()))
    });
    assert!(a.is_err() && b.is_err());
    let (a, b) = on_both(&pg, &sqlite, |c| {
        c.exists("SELECT 1 FROM blob_trash WHERE hash = ?1", params!["h2"])
    });
    assert_eq!(
        (a.unwrap(), b.unwrap()),
        (false, false),
        "h2 survived a rollback"
    );
    // One pooled connection served all of it.
    assert_eq!(pg.pool().idle(), 1);
}

#[tokio::test]
async fn a_transaction_that_panics_leaves_no_half_open_connection_behind() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let pg = PgStore::open(PgConfig::parse(&db.url).unwrap()).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pg.tx(false, |c| -> Result<(), StoreError> {
            c.execute("INSERT INTO blob_trash (hash) VALUES (?1)", params!["half"])?;
            panic!("a bug in a store function");
        })
    }));
    assert!(panicked.is_err());
    // The next transactions start clean: nothing of the panicked one, no "already in a
    // transaction" connection handed out.
    for _ in 0..3 {
        let seen = pg
            .tx(false, |c| {
                c.exists("SELECT 1 FROM blob_trash WHERE hash = ?1", params!["half"])
            })
            .unwrap();
        assert!(!seen);
    }
    pg.tx(false, |c| {
        c.execute(
            "INSERT INTO blob_trash (hash) VALUES (?1)",
            params!["whole"],
        )
    })
    .unwrap();
    assert!(
        pg.tx(true, |c| c.exists(
            "SELECT 1 FROM blob_trash WHERE hash = ?1",
            params!["whole"]
        ))
        .unwrap()
    );
}

/// A database of schema version 1 with messages in it: migrating to the current schema keeps
/// every message's number, id, JSON, route and audience.
#[tokio::test]
async fn messages_of_schema_v1_read_back_the_same_after_migrating() {
    use ac7_protocol::domain::message::Audience;
    use ac7_runtime::broker::messages::{self, Feed, ViewerScope, Window};
    let Some(db) = TestDb::create().await else {
        return;
    };
    let pool = db.pool().await;
    {
        let client = pool.get().await.unwrap();
        client
            .batch_execute(
                "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,
                     applied_at BIGINT NOT NULL)",
            )
            .await
            .unwrap();
        client
            .batch_execute(migrate::MIGRATIONS[0].sql)
            .await
            .unwrap();
        client
            .batch_execute("INSERT INTO schema_migrations VALUES (1, 'schema v1', 0)")
            .await
            .unwrap();
        // As V1 logged them: a DM, a general post, a channel post with a title, a row whose
        // id is no UUID, and one whose JSON is no message.
        let dm = r#"{"id":"0f8fad5b-d9cb-469f-a165-70867728950e","ts":1,"to":"bob","from":"ann","title":null,"body":"hi","level":"info","data":{},"attachments":[]}"#;
        let general = r#"{"id":"7c9e6679-7425-40de-944b-e07fc1f90ae7","ts":2,"to":null,"from":"ann","title":null,"body":"all","level":"info","data":{},"attachments":[]}"#;
        let post = r#"{"id":"5b0c6a1e-7f55-4a39-9d0e-0c1f2a3b4c5d","ts":3,"to":null,"from":"ann","title":"t","body":"c","level":"warning","data":{"thread":"chan:c1"},"attachments":[]}"#;
        let text_id = r#"{"id":"m4","ts":4,"to":null,"from":"ann","title":null,"body":"o","level":"info","data":{"thread":"obj:o1"},"attachments":[]}"#;
        let odd = r#"{"odd": "\u00e9"}"#;
        type OldRow<'a> = (
            i64,
            &'a str,
            Option<&'a str>,
            Option<&'a str>,
            &'a str,
            Option<&'a str>,
        );
        let rows: [OldRow<'_>; 5] = [
            (
                1,
                "0f8fad5b-d9cb-469f-a165-70867728950e",
                Some("bob"),
                None,
                dm,
                Some(r#"["ann","bob"]"#),
            ),
            (
                2,
                "7c9e6679-7425-40de-944b-e07fc1f90ae7",
                None,
                Some("chan:general"),
                general,
                None,
            ),
            (
                3,
                "5b0c6a1e-7f55-4a39-9d0e-0c1f2a3b4c5d",
                None,
                Some("chan:c1"),
                post,
                Some(r#"["ann","cid"]"#),
            ),
            (5, "m4", None, Some("obj:o1"), text_id, Some(r#"["ann"]"#)),
            (6, "m5", None, Some("chan:general"), odd, None),
        ];
        for (seq, id, to, thread, json, audience) in rows {
            client
                .execute(
                    "INSERT INTO messages (seq, id, ts, to_name, from_name, thread, json, audience)
                     VALUES ($1, $2, $1, $3, 'ann', $4, $5, $6)",
                    &[&seq, &id, &to, &thread, &json, &audience],
                )
                .await
                .unwrap();
        }
        client
            .batch_execute("UPDATE log_head SET last_seq = 7")
            .await
            .unwrap();
    }
    let done = migrate(&pool).await.unwrap();
    assert_eq!((done.from, done.to), (1, pg::latest_version()));
    let read = log::read_after(&*pool.get().await.unwrap(), 0, 10)
        .await
        .unwrap();
    let want: Vec<(i64, &str, Option<&str>, Option<&str>)> = vec![
        (1, "0f8fad5b-d9cb-469f-a165-70867728950e", Some("bob"), None),
        (
            2,
            "7c9e6679-7425-40de-944b-e07fc1f90ae7",
            None,
            Some("chan:general"),
        ),
        (
            3,
            "5b0c6a1e-7f55-4a39-9d0e-0c1f2a3b4c5d",
            None,
            Some("chan:c1"),
        ),
        (5, "m4", None, Some("obj:o1")),
        (6, "m5", None, Some("chan:general")),
    ];
    assert_eq!(
        read.iter()
            .map(|r| (
                r.seq,
                r.message.id.as_str(),
                r.message.to_name.as_deref(),
                r.message.thread.as_deref()
            ))
            .collect::<Vec<_>>(),
        want
    );
    assert_eq!(
        read[0].message.json,
        r#"{"id":"0f8fad5b-d9cb-469f-a165-70867728950e","ts":1,"to":"bob","from":"ann","title":null,"body":"hi","level":"info","data":{},"attachments":[]}"#
    );
    assert!(read[2].message.json.contains(r#""title":"t""#));
    assert_eq!(read[4].message.json, r#"{"odd": "\u00e9"}"#);
    let store = Store::open_postgres(db.config()).unwrap();
    let (page, audiences) = store
        .view(|c| {
            let scope = ViewerScope {
                channels: ["c1".to_owned()].into(),
                objectives: Default::default(),
                manager: true,
                since: 0,
            };
            let mut window = Window::newest(10);
            window.oldest_first = true;
            let page = messages::page(c, "ann", &scope, &Feed::All, &window)?;
            let audiences = c.query(
                "SELECT ak.key FROM messages m LEFT JOIN message_keys ak ON ak.id = m.audience
                 ORDER BY m.seq",
                params![],
                |r| r.get::<Option<String>>(0),
            )?;
            assert_eq!(messages::seq_of(c, "m4")?, Some(5));
            Ok::<_, StoreError>((page, audiences))
        })
        .unwrap();
    assert_eq!(
        page.iter()
            .map(|r| (r.seq, r.json.as_str()))
            .collect::<Vec<_>>(),
        read.iter()
            .map(|r| (r.seq, r.message.json.as_str()))
            .collect::<Vec<_>>()
    );
    let dm: serde_json::Value = serde_json::from_str(&page[0].json).unwrap();
    assert_eq!(dm["to"], "bob");
    assert_eq!(
        audiences,
        [
            Some(r#"["ann","bob"]"#),
            Some("null"),
            Some(r#"["ann","cid"]"#),
            Some(r#"["ann"]"#),
            Some("null")
        ]
        .map(|a| a.map(str::to_owned))
    );
    assert_eq!(
        messages::stored_audience(Some("null"), Some("ann"), &messages::route_of(None, None))
            .unwrap(),
        Audience::Everyone
    );
}
