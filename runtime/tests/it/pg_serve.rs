//! `ac7 serve --db postgres://…` as a process: what an operator sees when the database URL, the
//! server, the role or the database is wrong (one line, exit 2, nothing created).

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::process::Command;

use crate::common;
use crate::common::postgres::TestDb;

/// `ac7 serve --db url` with team flags: (exit code, stderr without log lines).
fn serve_refused(url: &str) -> (Option<i32>, String) {
    let out = Command::new(common::ac7())
        .args([
            "serve",
            "--port",
            "0",
            "--db",
            url,
            "--db-connect-timeout",
            "3",
            "--team-name",
            "t",
            "--directive",
            "d",
            "--member",
            "a:lead:admin",
        ])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| !l.starts_with('{'))
        .collect::<Vec<_>>()
        .join("\n");
    (out.status.code(), stderr)
}

#[tokio::test]
async fn a_wrong_database_url_is_one_line_and_exit_2() {
    // Only the server's presence is needed: skip (or fail under CI) without it.
    let Some(db) = TestDb::create().await else {
        return;
    };
    let base = db.url.rsplit_once('/').unwrap().0.to_owned();
    let missing = format!("ac7_missing_{}", std::process::id());
    let cases = [
        (
            "postgres://postgres@127.0.0.1:1/x".to_owned(),
            "cannot reach PostgreSQL at 127.0.0.1:1",
        ),
        (format!("{base}/{missing}"), "has no database"),
        (
            "postgres://ac7_no_such_role@127.0.0.1:5432/postgres".to_owned(),
            "has no role \"ac7_no_such_role\"",
        ),
        ("postgres://a@b:notaport/x".to_owned(), "bad PostgreSQL URL"),
        (
            format!("{}?sslmode=bogus", db.url),
            "sslmode=bogus is not one of",
        ),
    ];
    for (url, says) in cases {
        let (code, stderr) = serve_refused(&url);
        assert_eq!(code, Some(2), "{url}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{url}: one line: {stderr}");
        assert!(
            stderr.starts_with("ac7: ") && stderr.contains(says),
            "{url}: {stderr}"
        );
        assert!(!stderr.contains("password"), "{stderr}");
    }
    // Nothing was created for the missing database.
    let admin = ac7_runtime::broker::pg::PgPool::connect(
        ac7_runtime::broker::pg::PgConfig::parse(&common::postgres::admin_url()).unwrap(),
    )
    .await
    .unwrap();
    let n: i64 = admin
        .get()
        .await
        .unwrap()
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&missing],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}
