//! Versioned migrations, applied at start under a session advisory lock.
//!
//! `schema_migrations(version, name, applied_at)` records what was applied. [`migrate`] takes
//! `pg_advisory_lock` on a dedicated connection, so replicas starting at once queue up: the
//! first applies what is missing, the others then find nothing to do. Each migration runs in
//! its own transaction together with its `schema_migrations` row, so a failed one leaves no
//! trace and the next start tries it again. A database with a version this binary does not
//! know is refused ([`PgError::SchemaTooNew`]) before anything is touched.

use super::PgError;
use super::pool::PgPool;
use super::schema;

/// The advisory lock key of the migration (`ac7migr` in ASCII).
pub const MIGRATION_LOCK: i64 = 0x0061_6337_6d69_6772;

/// One schema step.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Its number: 1, 2, … with no gaps.
    pub version: i32,
    /// A short name.
    pub name: &'static str,
    /// The SQL (several statements).
    pub sql: &'static str,
}

/// Every migration this binary knows, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "schema v1",
        sql: schema::V1,
    },
    Migration {
        version: 2,
        name: "activity blocks",
        sql: schema::V2,
    },
    Migration {
        version: 3,
        name: "compact messages",
        sql: schema::V3,
    },
    Migration {
        version: 4,
        name: "web push",
        sql: schema::V4,
    },
    Migration {
        version: 5,
        name: "browser streams",
        sql: schema::V5,
    },
    Migration {
        version: 6,
        name: "members version",
        sql: schema::V6,
    },
];

/// The schema version this binary brings a database to.
pub fn latest_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// What [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// The version found before (0: an empty database).
    pub from: i32,
    /// The version now.
    pub to: i32,
    /// Versions applied by this call (empty when another replica got there first).
    pub applied: Vec<i32>,
}

/// Brings the database to [`latest_version`], or refuses a newer one.
pub async fn migrate(pool: &PgPool) -> Result<Migrated, PgError> {
    // A connection of its own: the session lock goes away with it, whatever happens below.
    let mut client = pool.connect_one().await?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
                version INTEGER PRIMARY KEY,
                name TEXT NOT NULL,
                applied_at BIGINT NOT NULL
            )",
        )
        .await?;
    let from: i32 = client
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .await?
        .try_get(0)?;
    let known = latest_version();
    if from > known {
        return Err(PgError::SchemaTooNew { found: from, known });
    }
    let mut applied = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| m.version > from) {
        let tx = client.transaction().await?;
        tx.batch_execute(m.sql).await?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_at)
             VALUES ($1, $2, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT)",
            &[&m.version, &m.name],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(
            version = m.version,
            name = m.name,
            "applied a PostgreSQL migration"
        );
        applied.push(m.version);
    }
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await?;
    Ok(Migrated {
        from,
        to: known.max(from),
        applied,
    })
}

/// The highest applied version (0 when none, or when `schema_migrations` does not exist).
pub async fn current_version(pool: &PgPool) -> Result<i32, PgError> {
    let client = pool.get().await?;
    let exists: bool = client
        .query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[])
        .await?
        .try_get(0)?;
    if !exists {
        return Ok(0);
    }
    Ok(client
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .await?
        .try_get(0)?)
}
