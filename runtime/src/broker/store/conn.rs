//! [`Conn`]: one SQL connection inside a store transaction, whichever database holds the team.
//!
//! Store functions are written once against `&Conn`: `execute`, `query_row`, `query`, with
//! `?1`-style placeholders and SQL that both SQLite and PostgreSQL accept (`INSERT … ON
//! CONFLICT … DO …`, `RETURNING`, `COALESCE`, `CAST(… AS BIGINT)`). Where the dialects part,
//! a function asks [`Conn::backend`]. Calls are synchronous: the store runs every transaction
//! off the async worker threads (see [`super::off_worker`]).

use super::super::db::StoreError;
use super::value::{Row, ToValue, Value};

/// Which database a [`Conn`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded SQLite file.
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
}

/// A connection (inside the store's transaction) that store functions run SQL on.
pub struct Conn<'a> {
    inner: Inner<'a>,
    /// The store's cache of `message_keys` rows, and how the rows this transaction reads reach
    /// it.
    keys: Option<(&'a super::keys::KeyCache, KeyFill<'a>)>,
}

/// How the `message_keys` rows a transaction reads reach the store's cache.
#[derive(Debug, Clone, Copy)]
pub enum KeyFill<'a> {
    /// A read transaction: what it reads is committed, so at once.
    Now,
    /// A write transaction: a row it reads may be one it added itself, which a rollback would
    /// take back (and SQLite could then hand its id to another key). The rows wait here; the
    /// store hands them to the cache once the transaction has committed.
    AfterCommit(&'a std::cell::RefCell<Vec<(i64, String)>>),
}

#[derive(Clone, Copy)]
enum Inner<'a> {
    Sqlite(&'a rusqlite::Connection),
    Postgres(&'a super::postgres::Session),
}

impl std::fmt::Debug for Conn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Conn").field(&self.backend()).finish()
    }
}

impl<'a> Conn<'a> {
    /// A SQLite connection (or transaction: it derefs to one).
    pub fn sqlite(conn: &'a rusqlite::Connection) -> Conn<'a> {
        Conn {
            inner: Inner::Sqlite(conn),
            keys: None,
        }
    }

    /// A PostgreSQL session (inside the transaction the store opened on it).
    pub fn postgres(session: &'a super::postgres::Session) -> Conn<'a> {
        Conn {
            inner: Inner::Postgres(session),
            keys: None,
        }
    }

    /// The same connection, looking `message_keys` rows up in `keys` first and adding the
    /// rows it reads as `fill` says.
    pub fn with_keys<'b>(&'b self, keys: &'b super::keys::KeyCache, fill: KeyFill<'b>) -> Conn<'b> {
        Conn {
            inner: self.inner,
            keys: Some((keys, fill)),
        }
    }

    /// The store's `message_keys` cache, to look rows up in.
    pub fn key_cache(&self) -> Option<&'a super::keys::KeyCache> {
        self.keys.map(|(cache, _)| cache)
    }

    /// A `message_keys` row this transaction read: into the cache now (a read), once the
    /// transaction commits (a write), or nowhere (no cache).
    pub fn remember_key(&self, id: i64, key: &str) {
        match self.keys {
            Some((cache, KeyFill::Now)) => cache.remember(id, key),
            Some((_, KeyFill::AfterCommit(rows))) => rows.borrow_mut().push((id, key.to_owned())),
            None => {}
        }
    }

    /// The database behind it.
    pub fn backend(&self) -> Backend {
        match self.inner {
            Inner::Sqlite(_) => Backend::Sqlite,
            Inner::Postgres(_) => Backend::Postgres,
        }
    }

    /// Runs one statement; returns the rows it changed.
    pub fn execute(&self, sql: &str, params: &[&dyn ToValue]) -> Result<usize, StoreError> {
        match &self.inner {
            Inner::Sqlite(c) => Ok(c
                .prepare_cached(sql)?
                .execute(rusqlite::params_from_iter(values(params)))?),
            Inner::Postgres(s) => s.execute(sql, &values(params).collect::<Vec<_>>()),
        }
    }

    /// Runs statements without parameters (schema, pragmas).
    pub fn execute_batch(&self, sql: &str) -> Result<(), StoreError> {
        match &self.inner {
            Inner::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Inner::Postgres(s) => s.execute_batch(sql),
        }
    }

    /// The rows of a query, each through `f`.
    pub fn query<T>(
        &self,
        sql: &str,
        params: &[&dyn ToValue],
        mut f: impl FnMut(&Row) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        match &self.inner {
            Inner::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                let width = stmt.column_count();
                let mut rows = stmt.query(rusqlite::params_from_iter(values(params)))?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    out.push(f(&sqlite_row(r, width)?)?);
                }
                Ok(out)
            }
            Inner::Postgres(s) => s
                .query(sql, &values(params).collect::<Vec<_>>())?
                .iter()
                .map(&mut f)
                .collect(),
        }
    }

    /// The first row of a query through `f`, if there is one.
    pub fn query_row<T>(
        &self,
        sql: &str,
        params: &[&dyn ToValue],
        f: impl FnOnce(&Row) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        match &self.inner {
            Inner::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                let width = stmt.column_count();
                let mut rows = stmt.query(rusqlite::params_from_iter(values(params)))?;
                match rows.next()? {
                    Some(r) => Ok(Some(f(&sqlite_row(r, width)?)?)),
                    None => Ok(None),
                }
            }
            Inner::Postgres(s) => s
                .query(sql, &values(params).collect::<Vec<_>>())?
                .first()
                .map(f)
                .transpose(),
        }
    }

    /// Whether a query returns any row.
    pub fn exists(&self, sql: &str, params: &[&dyn ToValue]) -> Result<bool, StoreError> {
        Ok(self.query_row(sql, params, |_| Ok(()))?.is_some())
    }

    /// The raw SQLite connection, for the few SQLite-only maintenance paths (blob recovery,
    /// `VACUUM`); `None` on PostgreSQL.
    pub fn as_sqlite(&self) -> Option<&'a rusqlite::Connection> {
        match self.inner {
            Inner::Sqlite(c) => Some(c),
            Inner::Postgres(_) => None,
        }
    }
}

fn values<'p>(params: &'p [&'p dyn ToValue]) -> impl Iterator<Item = Value> + 'p {
    params.iter().map(|p| p.to_value())
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Int(i) => ValueRef::Integer(*i),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

fn sqlite_row(r: &rusqlite::Row<'_>, width: usize) -> Result<Row, StoreError> {
    use rusqlite::types::ValueRef;
    let mut values = Vec::with_capacity(width);
    for i in 0..width {
        values.push(match r.get_ref(i)? {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(n) => Value::Int(n),
            ValueRef::Text(t) => Value::Text(
                std::str::from_utf8(t)
                    .map_err(|e| StoreError::Corrupt(format!("column {i} is not UTF-8: {e}")))?
                    .to_owned(),
            ),
            ValueRef::Blob(b) => Value::Blob(b.to_vec()),
            ValueRef::Real(x) => {
                return Err(StoreError::Corrupt(format!(
                    "column {i} holds a float ({x}); the store keeps integers"
                )));
            }
        });
    }
    Ok(Row::new(values))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params;

    #[test]
    fn sqlite_statements_bind_and_read_every_kind() {
        let raw = rusqlite::Connection::open_in_memory().expect("in-memory SQLite");
        let c = Conn::sqlite(&raw);
        c.execute_batch("CREATE TABLE t (i INTEGER, s TEXT, b BLOB, n TEXT)")
            .expect("schema");
        let changed = c
            .execute(
                "INSERT INTO t (i, s, b, n) VALUES (?1, ?2, ?3, ?4)",
                params![42i64, "x", b"\x00\x01".to_vec(), Option::<String>::None],
            )
            .expect("insert");
        assert_eq!(changed, 1);
        let row = c
            .query_row("SELECT i, s, b, n FROM t WHERE s = ?1", params!["x"], |r| {
                Ok((
                    r.get::<i64>(0)?,
                    r.get::<String>(1)?,
                    r.get::<Vec<u8>>(2)?,
                    r.get::<Option<String>>(3)?,
                ))
            })
            .expect("query");
        assert_eq!(row, Some((42, "x".to_owned(), vec![0, 1], None)));
        assert_eq!(
            c.query_row("SELECT i FROM t WHERE s = ?1", params!["y"], |r| r
                .get::<i64>(0))
                .expect("query"),
            None
        );
        assert!(c.exists("SELECT 1 FROM t", params![]).expect("exists"));
        let all = c
            .query("SELECT i FROM t UNION ALL SELECT 7", params![], |r| {
                r.get::<i64>(0)
            })
            .expect("query");
        assert_eq!(all, [42, 7]);
        assert_eq!(c.backend(), Backend::Sqlite);
    }
}
