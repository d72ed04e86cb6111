//! The team's store functions (team, members, tokens, browser sessions, TOTP secrets,
//! activity, and the member administration use cases) on PostgreSQL and on SQLite: the same
//! sequence through `Store::tx` / `Store::view` on each, compared answer by answer. Without a
//! PostgreSQL server the tests skip (fail under `CI=true`), as in `pg_store`.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use ac7_protocol::domain::permission::{Permission, PermissionSet};
use ac7_protocol::signin::totp;
use ac7_protocol::trace::activity::ActivityEvent;
use ac7_runtime::broker::activity::{self, Query};
use ac7_runtime::broker::bootstrap::{self, AdminError};
use ac7_runtime::broker::db::{Store, StoreError};
use ac7_runtime::broker::pg::PgConfig;
use ac7_runtime::broker::sessions::{self, SessionAuth};
use ac7_runtime::broker::store::{Backend, Conn};
use ac7_runtime::broker::team::{self, MemberRecord, Role, Team, TokenAuth};
use ac7_runtime::broker::tokens;
use ac7_runtime::params;

use crate::common::postgres::TestDb;

/// The two stores: `(PostgreSQL, SQLite)`, or `None` without a server.
async fn stores() -> Option<(TestDb, Store, Store)> {
    let db = TestDb::create().await?;
    let pg = Store::open_postgres(PgConfig::parse(&db.url).unwrap()).unwrap();
    assert_eq!(pg.backend(), Backend::Postgres);
    let sqlite = Store::open_in_memory().unwrap();
    Some((db, pg, sqlite))
}

/// One step of a transcript: what a store function answered, as text, with random values
/// (token plaintexts, ids, session ids) left out by the caller.
type Log = Vec<String>;

fn note(log: &mut Log, what: &str, v: impl std::fmt::Debug) {
    log.push(format!("{what}: {v:?}"));
}

fn member(name: &str, title: &str, perms: &[Permission]) -> MemberRecord {
    let mut permissions = PermissionSet::default();
    for p in perms {
        permissions.insert(*p);
    }
    MemberRecord {
        name: name.to_owned(),
        role: Role {
            title: title.to_owned(),
            description: String::new(),
        },
        instructions: format!("instructions of {name}"),
        permissions,
    }
}

fn event(json: serde_json::Value) -> ActivityEvent {
    serde_json::from_value(json).unwrap()
}

fn exchange(ts: i64) -> ActivityEvent {
    event(serde_json::json!({
        "kind": "opaque_http", "ts": ts, "duration": 5, "entry": {
            "kind": "opaque_http", "startedAt": ts, "endedAt": ts + 5, "host": "example.com",
            "method": "GET", "url": "/x", "status": 200,
            "requestHeaders": {}, "responseHeaders": {},
            "requestBodyPreview": null, "responseBodyPreview": null}
    }))
}

fn marker(kind: &str, ts: i64, objective: &str) -> ActivityEvent {
    let mut json = serde_json::json!({"kind": kind, "ts": ts, "objectiveId": objective});
    if kind == "objective_close" {
        json["result"] = "done".into();
    }
    event(json)
}

/// Activity rows as `(id, member, kind, ts)`.
fn rows(rows: &[ac7_protocol::trace::activity::ActivityRow]) -> Vec<(u64, String, String, i64)> {
    rows.iter()
        .map(|r| {
            (
                r.id,
                r.member_name.clone(),
                r.event.kind().to_owned(),
                r.event.ts(),
            )
        })
        .collect()
}

/// Team, members and tokens.
fn team_and_members(c: &Conn<'_>) -> Result<Log, StoreError> {
    let mut log = Log::new();
    note(&mut log, "no team", team::team_get(c)?);
    let mut t = Team {
        name: "crew".into(),
        directive: "ship it".into(),
        context: String::new(),
        permission_presets: ac7_protocol::domain::permission::default_presets(),
    };
    team::team_put(c, &t, 1_000)?;
    t.name = "crew two".into();
    t.permission_presets
        .insert("reader".into(), vec!["activity.read".into()]);
    team::team_put(c, &t, 2_000)?;
    note(&mut log, "team", team::team_get(c)?);
    let created_at: Option<i64> =
        c.query_row("SELECT created_at FROM team", params![], |r| r.get(0))?;
    note(&mut log, "team created_at", created_at);

    let ann = member("ann", "lead", &[Permission::MembersManage]);
    let bob = member("bob", "builder", &[]);
    note(&mut log, "insert ann", team::member_insert(c, &ann, 10)?);
    note(&mut log, "insert bob", team::member_insert(c, &bob, 11)?);
    note(
        &mut log,
        "insert ann again",
        team::member_insert(c, &ann, 12)?,
    );
    // The message log's head (LOG's table, written directly here) starts a new member.
    c.execute(
        "INSERT INTO messages (seq, id_text, ts, body) VALUES (7, 'm7', 0, '')",
        params![],
    )?;
    let carol = member("Carol", "tester", &[]);
    note(
        &mut log,
        "insert Carol",
        team::member_insert(c, &carol, 13)?,
    );
    note(&mut log, "members", team::members_list(c)?);
    for name in ["ann", "bob", "Carol", "carol", "nobody"] {
        note(&mut log, &format!("get {name}"), team::member_get(c, name)?);
        note(
            &mut log,
            &format!("exists {name}"),
            team::member_exists(c, name)?,
        );
        note(&mut log, &format!("seq {name}"), team::member_seq(c, name)?);
        note(
            &mut log,
            &format!("since {name}"),
            team::member_since(c, name)?,
        );
    }
    for name in ["ANN", "carol", "CAROL", "an", "a%", "a_n", "bob "] {
        note(
            &mut log,
            &format!("taken {name}"),
            team::member_name_taken(c, name)?,
        );
    }
    let mut bob2 = bob.clone();
    bob2.role.title = "reviewer".into();
    bob2.permissions.insert(Permission::ActivityRead);
    team::member_update(c, &bob2)?;
    note(&mut log, "bob updated", team::member_get(c, "bob")?);
    note(&mut log, "managers", team::managers(c)?);
    note(
        &mut log,
        "last admin ann",
        bootstrap::is_last_admin(c, "ann")?,
    );
    note(
        &mut log,
        "last admin bob",
        bootstrap::is_last_admin(c, "bob")?,
    );

    // Tokens: issued at distinct times (their ids are random; the order is by time, then id).
    let (ann1, info1) = team::token_issue(c, "ann", "laptop", "bootstrap", None, 100)?;
    let (_, info2) = team::token_issue(c, "ann", "phone", "rotate", Some("ann"), 200)?;
    let (bob1, info3) = team::token_issue(c, "bob", "initial", "bootstrap", Some("ann"), 150)?;
    let (ghost, _) = team::token_issue(c, "ghost", "orphan", "bootstrap", None, 160)?;
    let strip = |ts: Vec<team::TokenInfo>| {
        ts.into_iter()
            .map(|t| {
                (
                    t.member_name,
                    t.label,
                    t.origin,
                    t.created_at,
                    t.last_used_at,
                    t.expires_at,
                    t.created_by,
                )
            })
            .collect::<Vec<_>>()
    };
    note(&mut log, "ann tokens", strip(team::tokens_list(c, "ann")?));
    let found = team::token_lookup(c, &tokens::sha256_hex(ann1.as_bytes()))?;
    note(
        &mut log,
        "lookup ann1",
        found.map(|(id, m, e)| (id == info1.id, m, e)),
    );
    note(
        &mut log,
        "lookup unknown",
        team::token_lookup(c, &tokens::sha256_hex(b"nope"))?,
    );
    let resolved = |c: &Conn<'_>, plain: &str, now: i64| -> Result<String, StoreError> {
        Ok(
            match team::resolve_token(c, &tokens::sha256_hex(plain.as_bytes()), now)? {
                TokenAuth::Member(id, m) => format!("member {} {}", m.name, id.len()),
                other => format!("{other:?}"),
            },
        )
    };
    note(&mut log, "resolve ann1", resolved(c, &ann1, 500)?);
    note(&mut log, "resolve bob1", resolved(c, &bob1, 600)?);
    note(&mut log, "resolve ghost", resolved(c, &ghost, 700)?);
    note(&mut log, "resolve ghost again", resolved(c, &ghost, 800)?);
    note(&mut log, "resolve junk", resolved(c, "ac7_junk", 900)?);
    c.execute(
        "UPDATE tokens SET expires_at = ?2 WHERE id = ?1",
        params![info3.id, 1_000i64],
    )?;
    note(&mut log, "resolve bob1 expired", resolved(c, &bob1, 1_000)?);
    note(&mut log, "resolve bob1 before", resolved(c, &bob1, 999)?);
    note(
        &mut log,
        "ann tokens used",
        strip(team::tokens_list(c, "ann")?),
    );
    note(&mut log, "bob tokens", strip(team::tokens_list(c, "bob")?));
    note(
        &mut log,
        "token exists",
        team::token_id_exists(c, &info2.id)?,
    );
    note(
        &mut log,
        "delete ann2 as bob",
        team::token_delete(c, "bob", &info2.id)?,
    );
    note(
        &mut log,
        "delete ann2",
        team::token_delete(c, "ann", &info2.id)?,
    );
    note(&mut log, "token gone", team::token_id_exists(c, &info2.id)?);
    team::token_touch(c, &info1.id, 4_242)?;
    team::token_delete_id(c, "no-such-id")?;
    note(
        &mut log,
        "ann tokens left",
        strip(team::tokens_list(c, "ann")?),
    );
    note(&mut log, "revoke bob's", team::tokens_revoke_all(c, "bob")?);
    note(
        &mut log,
        "bob tokens left",
        strip(team::tokens_list(c, "bob")?),
    );

    // Deleting a member takes its credentials and memberships (other groups' tables too).
    team::token_issue(c, "bob", "again", "rotate", None, 300)?;
    c.execute(
        "INSERT INTO fs_grants (path, member_name, granted_at) VALUES ('/ann/x', 'bob', 1)",
        params![],
    )?;
    sessions::session_create(c, "bob", None, 0, 1_000)?;
    sessions::totp_set(c, "bob", "AAAA")?;
    note(&mut log, "delete bob", team::member_delete(c, "bob")?);
    note(&mut log, "delete bob again", team::member_delete(c, "bob")?);
    for (what, sql) in [
        ("tokens", "SELECT 1 FROM tokens WHERE member_name = 'bob'"),
        (
            "grants",
            "SELECT 1 FROM fs_grants WHERE member_name = 'bob'",
        ),
        (
            "sessions",
            "SELECT 1 FROM sessions WHERE member_name = 'bob'",
        ),
        (
            "totp",
            "SELECT 1 FROM member_totp WHERE member_name = 'bob'",
        ),
    ] {
        note(
            &mut log,
            &format!("bob {what} left"),
            c.exists(sql, params![])?,
        );
    }
    // A name given again is a new member: a new id, never the old one.
    note(
        &mut log,
        "insert bob anew",
        team::member_insert(c, &bob, 20)?,
    );
    note(&mut log, "seq bob anew", team::member_seq(c, "bob")?);
    note(&mut log, "members at last", team::members_list(c)?);
    Ok(log)
}

/// Browser sessions and TOTP secrets.
fn sign_in(c: &Conn<'_>) -> Result<Log, StoreError> {
    let mut log = Log::new();
    for (i, name) in ["ann", "bob", "cy"].iter().enumerate() {
        team::member_insert(
            c,
            &member(name, "t", &[]),
            i64::try_from(i).unwrap_or_default(),
        )?;
    }
    let (id, row) = sessions::session_create(c, "ann", Some(&"u".repeat(300)), 1_000, 100)?;
    note(&mut log, "session", (row.member.clone(), row.expires_at));
    note(&mut log, "hash", row.hash == sessions::session_hash(&id));
    let ua: Option<Option<String>> = c.query_row(
        "SELECT user_agent FROM sessions WHERE hash = ?1",
        params![row.hash],
        |r| r.get(0),
    )?;
    note(&mut log, "ua length", ua.flatten().map(|u| u.len()));
    note(
        &mut log,
        "get 1099",
        sessions::session_get(c, &row.hash, 1_099)?.map(|r| r.expires_at),
    );
    note(
        &mut log,
        "get 1100",
        sessions::session_get(c, &row.hash, 1_100)?,
    );
    sessions::session_slide(c, &row.hash, 1_050, 100)?;
    note(
        &mut log,
        "exists 1100",
        sessions::session_exists(c, &row.hash, 1_100)?,
    );
    note(
        &mut log,
        "token id",
        team::token_id_exists(c, &format!("{}{}", sessions::SESSION_ID_PREFIX, row.hash))?,
    );
    let auth = |c: &Conn<'_>, hash: &str, now: i64| -> Result<String, StoreError> {
        Ok(match sessions::session_member(c, hash, now)? {
            SessionAuth::Member(r, m) => format!("member {} until {}", m.name, r.expires_at),
            other => format!("{other:?}"),
        })
    };
    note(&mut log, "auth", auth(c, &row.hash, 1_100)?);
    note(&mut log, "auth expired", auth(c, &row.hash, 1_150)?);
    let (_, ghost) = sessions::session_create(c, "ghost", None, 1_000, 100)?;
    note(&mut log, "auth orphan", auth(c, &ghost.hash, 1_001)?);
    note(&mut log, "purge 1149", sessions::sessions_purge(c, 1_149)?);
    note(&mut log, "purge 1150", sessions::sessions_purge(c, 1_150)?);
    let (_, a2) = sessions::session_create(c, "ann", None, 0, 10_000)?;
    sessions::session_create(c, "ann", None, 0, 10_000)?;
    sessions::session_create(c, "bob", None, 0, 10_000)?;
    note(
        &mut log,
        "delete one",
        sessions::session_delete(c, &a2.hash)?,
    );
    note(
        &mut log,
        "delete one again",
        sessions::session_delete(c, &a2.hash)?,
    );
    note(
        &mut log,
        "delete ann's",
        sessions::sessions_delete_member(c, "ann")?,
    );
    note(
        &mut log,
        "delete ann's again",
        sessions::sessions_delete_member(c, "ann")?,
    );

    // TOTP: confirmed and pending secrets, the replay guard, enrolled members in member order.
    note(&mut log, "any before", sessions::totp_any(c)?);
    let secret = |n: u8| totp::base32_encode(&[n; 20]);
    sessions::totp_set_pending(c, "cy", &secret(3))?;
    note(&mut log, "any with only pending", sessions::totp_any(c)?);
    sessions::totp_set(c, "bob", &secret(2))?;
    sessions::totp_set(c, "ann", &secret(1))?;
    sessions::totp_set(c, "ghost", &secret(9))?;
    sessions::totp_accept_step(c, "bob", u64::MAX)?;
    note(&mut log, "bob", sessions::totp_get(c, "bob")?);
    note(&mut log, "cy", sessions::totp_get(c, "cy")?);
    note(&mut log, "nobody", sessions::totp_get(c, "nobody")?);
    note(&mut log, "enrolled", sessions::totp_enrolled(c)?);
    note(&mut log, "any", sessions::totp_any(c)?);

    // Sign-in: named, nameless, replayed, wrong; confirmation of a pending secret.
    let now_secs = 1_700_000_000u64;
    let code_of = |n: u8, at: u64| totp::code_at(&[n; 20], at, 6);
    let login = |c: &Conn<'_>, member: Option<&str>, code: &str, at: u64| {
        let a = sessions::LoginAttempt {
            member,
            code,
            now_secs: at,
            user_agent: None,
            now_ms: 5_000,
            ttl_ms: 100,
        };
        sessions::totp_login(c, &a, |n| n == "bob").map(|(known, out)| {
            format!(
                "known {known}: {:?}",
                out.map(|(m, id, row)| (m.name, id.len(), row.expires_at))
            )
        })
    };
    note(
        &mut log,
        "login ann",
        login(c, Some("ann"), &code_of(1, now_secs), now_secs)?,
    );
    note(
        &mut log,
        "login ann replayed",
        login(c, Some("ann"), &code_of(1, now_secs), now_secs)?,
    );
    note(
        &mut log,
        "login ann nameless later",
        login(c, None, &code_of(1, now_secs + 60), now_secs + 60)?,
    );
    note(
        &mut log,
        "login bob (locked) nameless",
        login(c, None, &code_of(2, now_secs), now_secs)?,
    );
    note(
        &mut log,
        "login bob named",
        login(c, Some("bob"), &code_of(2, now_secs), now_secs)?,
    );
    note(
        &mut log,
        "login wrong",
        login(c, Some("ann"), "000000", now_secs)?,
    );
    note(
        &mut log,
        "login made-up name",
        login(c, Some("zed"), &code_of(1, now_secs), now_secs)?,
    );
    note(
        &mut log,
        "login ghost",
        login(c, None, &code_of(9, now_secs), now_secs)?,
    );
    note(&mut log, "ann after", sessions::totp_get(c, "ann")?);
    note(
        &mut log,
        "ann sessions",
        c.query(
            "SELECT member_name, created_at, expires_at, last_seen FROM sessions ORDER BY created_at, member_name",
            params![],
            |r| Ok((r.get::<String>(0)?, r.get::<i64>(1)?, r.get::<i64>(2)?, r.get::<i64>(3)?)),
        )?,
    );
    note(
        &mut log,
        "confirm nobody",
        sessions::totp_confirm(c, "ann", "123456", now_secs)?,
    );
    note(
        &mut log,
        "confirm cy wrong",
        sessions::totp_confirm(c, "cy", "000000", now_secs)?,
    );
    note(
        &mut log,
        "confirm cy",
        sessions::totp_confirm(c, "cy", &code_of(3, now_secs), now_secs)?,
    );
    note(&mut log, "cy after", sessions::totp_get(c, "cy")?);
    sessions::totp_set_pending(c, "cy", "not base32!")?;
    note(
        &mut log,
        "confirm bad secret",
        sessions::totp_confirm(c, "cy", "123456", now_secs)?,
    );
    sessions::totp_delete(c, "cy")?;
    note(&mut log, "cy deleted", sessions::totp_get(c, "cy")?);
    Ok(log)
}

/// Activity: append, list with every filter, heads, objective intervals.
fn activity_stream(c: &Conn<'_>) -> Result<Log, StoreError> {
    let mut log = Log::new();
    note(&mut log, "last id empty", activity::last_id(c)?);
    team::member_insert(c, &member("ann", "t", &[]), 0)?;
    let ann = team::member_seq(c, "ann")?.unwrap_or_default();
    let appended = activity::append(
        c,
        "ann",
        ann,
        vec![
            marker("objective_open", 1_000, "obj-1"),
            exchange(2_000),
            marker("objective_open", 2_500, "obj-2"),
            exchange(3_000),
            marker("objective_close", 4_000, "obj-1"),
            exchange(5_000),
        ],
        77,
    )?;
    note(&mut log, "appended", rows(&appended));
    note(
        &mut log,
        "created_at",
        appended.iter().map(|r| r.created_at).collect::<Vec<_>>(),
    );
    // A removed member's rows, and a malformed row.
    activity::append(
        c,
        "gone",
        99,
        vec![exchange(2_100), marker("objective_close", 6_000, "obj-2")],
        78,
    )?;
    let malformed = activity::append(c, "gone", 98, vec![exchange(7_000)], 79)?;
    c.execute(
        "UPDATE member_activity SET event_json = 'not json' WHERE id = ?1",
        params![i64::try_from(malformed[0].id).unwrap()],
    )?;
    let q = |limit: usize| Query {
        limit,
        ..Query::default()
    };
    note(
        &mut log,
        "ann all",
        rows(&activity::list(c, "ann", &q(100), false)?),
    );
    note(
        &mut log,
        "ann ascending",
        rows(&activity::list(c, "ann", &q(100), true)?),
    );
    note(
        &mut log,
        "ann limit 2",
        rows(&activity::list(c, "ann", &q(2), false)?),
    );
    let filtered = Query {
        from: Some(2_000),
        to: Some(4_000),
        kinds: vec!["opaque_http", "objective_close"],
        before_id: Some(6),
        after_id: Some(1),
        limit: 10,
    };
    note(
        &mut log,
        "ann filtered",
        rows(&activity::list(c, "ann", &filtered, false)?),
    );
    let gone = activity::list(c, "gone", &q(100), false)?;
    note(&mut log, "gone (no member now)", rows(&gone));
    note(
        &mut log,
        "malformed host",
        gone.first()
            .map(|r| serde_json::to_value(&r.event).unwrap()["entry"]["host"].clone()),
    );
    note(&mut log, "head ann", activity::head(c, "ann")?);
    note(&mut log, "head gone", activity::head(c, "gone")?);
    note(&mut log, "head nobody", activity::head(c, "nobody")?);
    let intervals = activity::objective_intervals(c, "obj-1")?;
    note(&mut log, "intervals obj-1", &intervals);
    note(
        &mut log,
        "intervals obj-2",
        activity::objective_intervals(c, "obj-2")?,
    );
    note(
        &mut log,
        "intervals none",
        activity::objective_intervals(c, "obj")?,
    );
    note(
        &mut log,
        "in obj-1",
        rows(&activity::in_intervals(c, &intervals, None, 10)?),
    );
    let both: Vec<_> = intervals
        .iter()
        .cloned()
        .chain(activity::objective_intervals(c, "obj-2")?)
        .collect();
    note(
        &mut log,
        "in both",
        rows(&activity::in_intervals(c, &both, None, 10)?),
    );
    note(
        &mut log,
        "in both before 4",
        rows(&activity::in_intervals(c, &both, Some(4), 1)?),
    );
    note(
        &mut log,
        "in none",
        rows(&activity::in_intervals(c, &[], None, 10)?),
    );
    // Deleted rows keep their ids spent.
    c.execute(
        "DELETE FROM member_activity WHERE member_name = 'gone'",
        params![],
    )?;
    note(&mut log, "last id after delete", activity::last_id(c)?);
    Ok(log)
}

/// The member administration use cases, up to the calls into other groups.
fn administration(c: &Conn<'_>) -> Result<Log, StoreError> {
    let mut log = Log::new();
    let outcome = |r: Result<String, AdminError>| match r {
        Ok(v) => v,
        Err(AdminError::Store(e)) => format!("store error: {e}"),
        Err(e) => format!("{e:?}"),
    };
    note(
        &mut log,
        "no team",
        outcome(bootstrap::load_team(c).map(|t| t.name)),
    );
    team::team_put(
        c,
        &Team {
            name: "crew".into(),
            directive: "d".into(),
            context: String::new(),
            permission_presets: ac7_protocol::domain::permission::default_presets(),
        },
        0,
    )?;
    team::member_insert(c, &member("Ann", "lead", &[Permission::MembersManage]), 0)?;
    team::member_insert(c, &member("bob", "builder", &[]), 0)?;
    let role = Role {
        title: "t".into(),
        description: String::new(),
    };
    for (name, perms) in [
        ("ann", vec!["admin".to_owned()]),
        ("cy", vec!["no.such.permission".to_owned()]),
        ("cy", vec!["operator".to_owned()]),
    ] {
        note(
            &mut log,
            &format!("new {name} {perms:?}"),
            outcome(
                bootstrap::new_member_record(c, name, &role, "", &perms, "create")
                    .map(|m| format!("{:?}", m.permissions.names())),
            ),
        );
    }
    let update = |c: &Conn<'_>, name: &str, perms: Option<&[String]>, title: &str| {
        outcome(
            bootstrap::update_member(
                c,
                name,
                |m| m.role.title = title.to_owned(),
                perms,
                "update",
            )
            .map(|m| format!("{} {} {:?}", m.name, m.role.title, m.permissions.names())),
        )
    };
    note(&mut log, "update nobody", update(c, "nobody", None, "x"));
    note(
        &mut log,
        "update bob",
        update(c, "bob", Some(&["operator".to_owned()]), "reviewer"),
    );
    note(
        &mut log,
        "demote last admin",
        update(c, "Ann", Some(&[]), "lead"),
    );
    note(&mut log, "bad title", update(c, "bob", None, ""));
    note(&mut log, "bob stored", team::member_get(c, "bob")?);
    note(
        &mut log,
        "remove nobody",
        outcome(bootstrap::remove_member_checked(c, "nobody", "Ann", 0).map(|()| String::new())),
    );
    note(
        &mut log,
        "remove last admin",
        outcome(bootstrap::remove_member_checked(c, "Ann", "Ann", 0).map(|()| String::new())),
    );
    note(
        &mut log,
        "rotate nobody",
        outcome(bootstrap::rotate_token(c, "nobody", None, 0).map(|(_, i)| i.label)),
    );
    team::token_issue(c, "Ann", "one", "bootstrap", None, 1)?;
    team::token_issue(c, "Ann", "two", "bootstrap", None, 2)?;
    let rotated = bootstrap::rotate_token(c, "Ann", Some("bob"), 3);
    note(
        &mut log,
        "rotate Ann",
        outcome(
            rotated
                .as_ref()
                .map(|(_, i)| format!("{} {} {:?}", i.label, i.origin, i.created_by))
                .map_err(|e| AdminError::Invalid(e.to_string())),
        ),
    );
    let only = team::tokens_list(c, "Ann")?;
    note(
        &mut log,
        "Ann tokens",
        only.iter().map(|t| t.label.clone()).collect::<Vec<_>>(),
    );
    let id = only.first().map(|t| t.id.clone()).unwrap_or_default();
    note(
        &mut log,
        "revoke unknown",
        outcome(bootstrap::revoke_token(c, "Ann", "nope").map(|()| String::new())),
    );
    note(
        &mut log,
        "revoke as bob",
        outcome(bootstrap::revoke_token(c, "bob", &id).map(|()| String::new())),
    );
    note(
        &mut log,
        "revoke last of last admin",
        outcome(bootstrap::revoke_token(c, "Ann", &id).map(|()| String::new())),
    );
    team::token_issue(c, "Ann", "three", "rotate", None, 4)?;
    note(
        &mut log,
        "revoke with another left",
        outcome(bootstrap::revoke_token(c, "Ann", &id).map(|()| String::new())),
    );
    note(
        &mut log,
        "Ann tokens at last",
        team::tokens_list(c, "Ann")?
            .iter()
            .map(|t| t.label.clone())
            .collect::<Vec<_>>(),
    );
    Ok(log)
}

async fn compare(f: fn(&Conn<'_>) -> Result<Log, StoreError>) -> Option<Log> {
    let (_db, pg, sqlite) = stores().await?;
    let on_pg = pg.tx(f).unwrap();
    let on_sqlite = sqlite.tx(f).unwrap();
    for (i, (a, b)) in on_pg.iter().zip(&on_sqlite).enumerate() {
        assert_eq!(a, b, "step {i} differs (left: PostgreSQL, right: SQLite)");
    }
    assert_eq!(on_pg.len(), on_sqlite.len());
    // What was committed reads back the same through a read-only transaction.
    let read = |s: &Store| {
        s.view(|c| {
            Ok::<_, StoreError>(format!(
                "{:?} {:?}",
                team::members_list(c)?,
                team::team_get(c)?
            ))
        })
        .unwrap()
    };
    assert_eq!(read(&pg), read(&sqlite));
    Some(on_sqlite)
}

#[tokio::test]
async fn team_members_and_tokens_answer_alike() {
    let Some(log) = compare(team_and_members).await else {
        return;
    };
    // A few answers pinned, so "the same" is also "right".
    assert!(
        log.contains(&"insert ann again: false".to_owned()),
        "{log:#?}"
    );
    assert!(
        log.contains(&"taken CAROL: Some(\"Carol\")".to_owned()),
        "{log:#?}"
    );
    assert!(log.contains(&"taken a%: None".to_owned()), "{log:#?}");
    assert!(log.contains(&"since Carol: Some(7)".to_owned()), "{log:#?}");
    assert!(
        log.contains(&"seq bob anew: Some(4)".to_owned()),
        "{log:#?}"
    );
    assert!(
        log.contains(&"resolve ghost: \"Orphan\"".to_owned()),
        "{log:#?}"
    );
    assert!(
        log.contains(&"resolve ghost again: \"Unknown\"".to_owned()),
        "{log:#?}"
    );
}

#[tokio::test]
async fn sessions_and_totp_answer_alike() {
    let Some(log) = compare(sign_in).await else {
        return;
    };
    assert!(log.contains(&"ua length: Some(256)".to_owned()), "{log:#?}");
    assert!(
        log.contains(&"login ann: \"known true: Ok((\\\"ann\\\", 43, 5100))\"".to_owned()),
        "{log:#?}"
    );
    assert!(
        log.contains(&"login ann replayed: \"known true: Err(Replayed)\"".to_owned()),
        "{log:#?}"
    );
}

#[tokio::test]
async fn activity_answers_alike() {
    let Some(log) = compare(activity_stream).await else {
        return;
    };
    assert!(
        log.contains(&"last id after delete: 9".to_owned()),
        "{log:#?}"
    );
    assert!(log.contains(&"head gone: 9".to_owned()), "{log:#?}");
}

#[tokio::test]
async fn member_administration_answers_alike() {
    let Some(log) = compare(administration).await else {
        return;
    };
    assert!(
        log.contains(&"remove last admin: \"Conflict(\\\"cannot remove the last admin — promote someone else first\\\")\"".to_owned()),
        "{log:#?}"
    );
}
