//! The store on PostgreSQL: [`PgStore`] runs a store transaction's statements synchronously,
//! like SQLite's, from the blocking section the store already runs in.
//!
//! The pool's connections are driven by a small tokio runtime of the store's own (two worker
//! threads), so a statement never depends on the caller's runtime being free: the calling
//! thread sends the statement to its connection and parks until the answer comes back
//! ([`wait`]). A [`Session`] is one pooled connection with its prepared statements, inside one
//! transaction (`BEGIN … COMMIT`, or `ROLLBACK` on any error).
//!
//! SQL arrives with SQLite's `?1` placeholders and is rewritten to `$1` once per statement
//! ([`placeholders`]); statements are prepared once per connection and cached.

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use tokio_postgres::Statement;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use super::super::db::StoreError;
use super::super::pg::{PgConfig, PgError, PgPool, PooledClient, migrate};
use super::conn::Conn;
use super::value::{Row, Value};

/// A PostgreSQL database holding a team, with its connection pool.
#[derive(Debug)]
pub struct PgStore {
    pool: PgPool,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Dropping a runtime blocks on its workers, which an async context forbids.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl PgStore {
    /// Connects (one-line errors for every way that fails) and brings the schema to the
    /// version this binary knows (under an advisory lock: replicas starting at once migrate
    /// once; a newer schema is refused).
    pub fn open(config: PgConfig) -> Result<PgStore, StoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ac7-pg")
            .enable_all()
            .build()
            .map_err(|source| StoreError::File {
                what: "cannot start the PostgreSQL connection threads".into(),
                source,
            })?;
        let started = wait(runtime.spawn(async move {
            let pool = PgPool::connect(config).await?;
            migrate(&pool).await?;
            Ok::<_, PgError>(pool)
        }));
        // Dropping a runtime blocks on its workers, which an async caller forbids: on failure
        // it is shut down in the background.
        let pool = match started {
            Ok(Ok(pool)) => pool,
            Ok(Err(e)) => {
                runtime.shutdown_background();
                return Err(e.into());
            }
            Err(e) => {
                runtime.shutdown_background();
                return Err(StoreError::Corrupt(format!(
                    "PostgreSQL start-up task failed: {e}"
                )));
            }
        };
        let store = PgStore {
            pool,
            runtime: Some(runtime),
        };
        Ok(store)
    }

    /// The pool (for the doorbell and tests).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn session(&self) -> Result<Session, StoreError> {
        let pool = self.pool.clone();
        let rt = self
            .runtime
            .as_ref()
            .ok_or_else(|| StoreError::Corrupt("the PostgreSQL store is closed".into()))?;
        let client = wait(rt.spawn(async move { pool.get().await }))
            .map_err(|e| StoreError::Corrupt(format!("PostgreSQL pool task failed: {e}")))??;
        Ok(Session {
            client: RefCell::new(client),
            open: std::cell::Cell::new(false),
        })
    }

    /// Runs `f` in one transaction (committed on `Ok`, rolled back on `Err`); `read_only`
    /// opens it `READ ONLY`.
    pub fn tx<T, E: From<StoreError>>(
        &self,
        read_only: bool,
        f: impl FnOnce(&Conn<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let session = self.session()?;
        session.execute_batch(if read_only {
            "BEGIN READ ONLY"
        } else {
            "BEGIN"
        })?;
        session.open.set(true);
        let outcome = f(&Conn::postgres(&session));
        let end = match &outcome {
            Ok(_) => "COMMIT",
            Err(_) => "ROLLBACK",
        };
        let ended = session.execute_batch(end);
        session.open.set(false);
        match (outcome, ended) {
            (Ok(out), Ok(())) => Ok(out),
            (Ok(_), Err(e)) => Err(e.into()),
            (Err(e), ended) => {
                // A failed rollback leaves the connection in no known state: drop it.
                if ended.is_err() {
                    session.client.borrow_mut().forget();
                }
                Err(e)
            }
        }
    }
}

/// One pooled connection with its prepared statements, inside a transaction (see the module
/// docs).
#[derive(Debug)]
pub struct Session {
    client: RefCell<PooledClient>,
    /// A transaction is open on it (a closure that panicked leaves it so).
    open: std::cell::Cell<bool>,
}

impl Drop for Session {
    fn drop(&mut self) {
        // Never hand the next caller a connection in the middle of someone's transaction.
        if self.open.get() {
            self.client.get_mut().forget();
        }
    }
}

impl Session {
    fn client(&self) -> std::cell::Ref<'_, PooledClient> {
        self.client.borrow()
    }

    /// The prepared statement for `sql`. The server infers each parameter's type from where
    /// it stands; where it cannot (`?2 IS NULL`), the statement is prepared again with the
    /// types of the values bound now (integer `BIGINT`, text `TEXT`, bytes `BYTEA`).
    fn statement(&self, sql: &str, params: &[Value]) -> Result<Statement, StoreError> {
        if let Some(s) = self.client.borrow_mut().statements().get(sql) {
            return Ok(s.clone());
        }
        let text = placeholders(sql);
        // A failed Parse aborts the transaction: try it behind a savepoint (once per statement
        // and connection; afterwards it is cached).
        self.execute_batch("SAVEPOINT ac7_prepare")?;
        let first = wait(self.client().prepare(&text));
        self.execute_batch(if first.is_ok() {
            "RELEASE SAVEPOINT ac7_prepare"
        } else {
            "ROLLBACK TO SAVEPOINT ac7_prepare"
        })?;
        let prepared = match first {
            Err(e) if e.code() == Some(&SqlState::INDETERMINATE_DATATYPE) => {
                let types: Vec<Type> = params
                    .iter()
                    .map(|v| match v {
                        Value::Int(_) => Type::INT8,
                        Value::Blob(_) => Type::BYTEA,
                        Value::Text(_) | Value::Null => Type::TEXT,
                    })
                    .collect();
                wait(self.client().prepare_typed(&text, &types))?
            }
            other => other?,
        };
        self.client
            .borrow_mut()
            .statements()
            .insert(sql.to_owned(), prepared.clone());
        Ok(prepared)
    }

    /// Runs one statement; the rows it changed.
    pub(super) fn execute(&self, sql: &str, params: &[Value]) -> Result<usize, StoreError> {
        let stmt = self.statement(sql, params)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|v| v as _).collect();
        let n = wait(self.client().execute(&stmt, &refs))?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// Runs statements without parameters.
    pub(super) fn execute_batch(&self, sql: &str) -> Result<(), StoreError> {
        Ok(wait(self.client().batch_execute(sql))?)
    }

    /// The rows of a query.
    pub(super) fn query(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, StoreError> {
        let stmt = self.statement(sql, params)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|v| v as _).collect();
        wait(self.client().query(&stmt, &refs))?
            .iter()
            .map(pg_row)
            .collect()
    }
}

/// Rewrites SQLite's `?N` (and bare `?`) placeholders to PostgreSQL's `$N`, leaving quoted
/// text alone.
pub fn placeholders(sql: &str) -> std::borrow::Cow<'_, str> {
    if !sql.contains('?') {
        return sql.into();
    }
    let mut out = String::with_capacity(sql.len() + 8);
    let mut quote: Option<char> = None;
    let mut next = 1u32;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => {
                quote = None;
                out.push(c);
            }
            (Some(_), c) => out.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                out.push(c);
            }
            (None, '?') => {
                let mut digits = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    digits.push(*d);
                    chars.next();
                }
                out.push('$');
                if digits.is_empty() {
                    out.push_str(&next.to_string());
                    next += 1;
                } else {
                    out.push_str(&digits);
                }
            }
            (None, c) => out.push(c),
        }
    }
    out.into()
}

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::BOOL => (*i != 0).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR => i.to_string().to_sql(ty, out),
                _ => Err(format!("cannot bind an integer as {ty}").into()),
            },
            Value::Text(s) => match *ty {
                Type::BYTEA => s.as_bytes().to_sql(ty, out),
                _ => s.to_sql(ty, out),
            },
            Value::Blob(b) => match *ty {
                Type::BYTEA => b.to_sql(ty, out),
                _ => Err(format!("cannot bind bytes as {ty}").into()),
            },
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

fn pg_row(r: &tokio_postgres::Row) -> Result<Row, StoreError> {
    let mut values = Vec::with_capacity(r.len());
    for (i, col) in r.columns().iter().enumerate() {
        let v = match *col.type_() {
            Type::INT8 => r.try_get::<_, Option<i64>>(i)?.map(Value::Int),
            Type::INT4 => r
                .try_get::<_, Option<i32>>(i)?
                .map(|n| Value::Int(i64::from(n))),
            Type::INT2 => r
                .try_get::<_, Option<i16>>(i)?
                .map(|n| Value::Int(i64::from(n))),
            Type::BOOL => r
                .try_get::<_, Option<bool>>(i)?
                .map(|b| Value::Int(i64::from(b))),
            Type::BYTEA => r.try_get::<_, Option<Vec<u8>>>(i)?.map(Value::Blob),
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => {
                r.try_get::<_, Option<String>>(i)?.map(Value::Text)
            }
            ref other => {
                return Err(StoreError::Corrupt(format!(
                    "column {} has type {other}; the store reads BIGINT, TEXT and BYTEA \
                     (cast sums and other numerics to BIGINT)",
                    col.name()
                )));
            }
        };
        values.push(v.unwrap_or(Value::Null));
    }
    Ok(Row::new(values))
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `f` to completion on this thread, parking between polls. For futures that only wait
/// on channels to tasks running elsewhere (a connection's driver on the store's runtime, a
/// task spawned there), never for ones that need the calling thread's runtime.
pub fn wait<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_dollars_outside_quotes() {
        assert_eq!(placeholders("SELECT 1"), "SELECT 1");
        assert_eq!(
            placeholders("UPDATE t SET a = ?2 WHERE b = ?1 AND c = ?12"),
            "UPDATE t SET a = $2 WHERE b = $1 AND c = $12"
        );
        assert_eq!(placeholders("VALUES (?, ?)"), "VALUES ($1, $2)");
        assert_eq!(
            placeholders("SELECT '?1', \"a?\" FROM t WHERE x = ?1"),
            "SELECT '?1', \"a?\" FROM t WHERE x = $1"
        );
    }

    #[test]
    fn wait_runs_a_future_that_is_woken_from_another_thread() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let _ = tx.send(7);
        });
        assert_eq!(wait(rx).ok(), Some(7));
    }
}
