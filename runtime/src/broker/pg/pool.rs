//! Connecting, and [`PgPool`]: a bounded set of reusable connections.
//!
//! The pool opens connections lazily up to `pool_size`, hands them out one request at a time
//! ([`PgPool::get`]), takes them back on drop, and throws away any whose connection has closed
//! (the server restarted, the backend was terminated): the next `get` opens a fresh one.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Connection, Socket};

use super::PgError;
use super::config::PgConfig;
use super::error::{MIN_SERVER_VERSION, describe, source_io};
use super::tls::{MakeRustls, RustlsStream};

/// The raw connection half `tokio_postgres` hands back: poll it to drive the client.
pub type RawConnection = Connection<Socket, RustlsStream<Socket>>;

/// Opens one connection (not pooled) and returns both halves; the caller drives the
/// connection half. Every failure is classified into a one-line [`PgError`].
pub async fn connect_raw(
    config: &PgConfig,
    tls: &MakeRustls,
) -> Result<(Client, RawConnection), PgError> {
    let addr = config.addr();
    let client_config = config.client_config();
    let attempt = client_config.connect(tls.clone());
    match tokio::time::timeout(config.connect_timeout, attempt).await {
        Err(_) => Err(PgError::Timeout {
            addr,
            after: config.connect_timeout,
        }),
        Ok(Ok(pair)) => Ok(pair),
        Ok(Err(e)) => Err(classify(config, e)),
    }
}

/// Maps a failure to connect onto the operator's variants of [`PgError`].
fn classify(config: &PgConfig, e: tokio_postgres::Error) -> PgError {
    let addr = config.addr();
    if let Some(code) = e.code() {
        let reason = e
            .as_db_error()
            .map(|d| d.message().to_owned())
            .unwrap_or_default();
        if *code == SqlState::INVALID_CATALOG_NAME {
            return PgError::NoDatabase {
                addr,
                host: config.host.clone(),
                port: config.port,
                user: config.user.clone(),
                dbname: config.dbname.clone(),
            };
        }
        if *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            && reason.contains("does not exist")
        {
            return PgError::NoRole {
                addr,
                host: config.host.clone(),
                port: config.port,
                user: config.user.clone(),
            };
        }
        if *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        {
            return PgError::AuthFailed {
                addr,
                user: config.user.clone(),
                reason,
            };
        }
        return PgError::Db(e);
    }
    let text = e.to_string();
    if text.starts_with("error performing TLS handshake") {
        let reason = std::error::Error::source(&e)
            .map(ToString::to_string)
            .unwrap_or(text);
        return PgError::Tls { addr, reason };
    }
    if text.starts_with("authentication error") {
        let reason = std::error::Error::source(&e)
            .map(ToString::to_string)
            .unwrap_or(text);
        return PgError::AuthFailed {
            addr,
            user: config.user.clone(),
            reason,
        };
    }
    if text.starts_with("error connecting to server") {
        if let Some(io) = source_io(&e) {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return PgError::Timeout {
                    addr,
                    after: config.connect_timeout,
                };
            }
            return PgError::Unreachable {
                addr,
                reason: io.to_string(),
            };
        }
        return PgError::Unreachable {
            addr,
            reason: describe(&e),
        };
    }
    PgError::Db(e)
}

/// Drives a pooled connection's protocol until it closes, logging why it did.
fn spawn_driver(connection: RawConnection) {
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %describe(&e), "PostgreSQL connection closed");
        }
    });
}

#[derive(Debug)]
struct Inner {
    config: PgConfig,
    tls: MakeRustls,
    idle: Mutex<Vec<(Client, Statements)>>,
    permits: Arc<Semaphore>,
}

/// A bounded pool of connections to one database. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct PgPool {
    inner: Arc<Inner>,
}

/// Statements prepared on one connection, by their SQL text; they travel with it through the
/// pool.
pub type Statements = std::collections::HashMap<String, tokio_postgres::Statement>;

/// A connection out of the pool; derefs to [`tokio_postgres::Client`] and goes back on drop
/// (unless its connection closed, or it was [`forgotten`](PooledClient::forget)).
#[derive(Debug)]
pub struct PooledClient {
    client: Option<Client>,
    statements: Statements,
    inner: Arc<Inner>,
    _permit: OwnedSemaphorePermit,
}

impl Deref for PooledClient {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client
            .as_ref()
            .unwrap_or_else(|| unreachable!("a pooled client is present until drop"))
    }
}

impl DerefMut for PooledClient {
    fn deref_mut(&mut self) -> &mut Client {
        self.client
            .as_mut()
            .unwrap_or_else(|| unreachable!("a pooled client is present until drop"))
    }
}

impl PooledClient {
    /// The statements prepared on this connection.
    pub fn statements(&mut self) -> &mut Statements {
        &mut self.statements
    }

    /// Closes the connection instead of returning it to the pool (its state is unknown).
    pub fn forget(&mut self) {
        self.client = None;
    }
}

impl Drop for PooledClient {
    fn drop(&mut self) {
        if let Some(client) = self.client.take()
            && !client.is_closed()
        {
            let statements = std::mem::take(&mut self.statements);
            self.inner
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((client, statements));
        }
    }
}

impl PgPool {
    /// Connects once to check the URL, the credentials, the database, TLS and the server's
    /// version (one-line errors for each), and keeps that connection as the pool's first.
    /// Creates nothing on the server.
    pub async fn connect(config: PgConfig) -> Result<PgPool, PgError> {
        let tls = MakeRustls::new(&config).map_err(|reason| PgError::Tls {
            addr: config.addr(),
            reason,
        })?;
        let (client, connection) = connect_raw(&config, &tls).await?;
        spawn_driver(connection);
        let row = client.query_one("SHOW server_version_num", &[]).await?;
        let num: String = row.try_get(0)?;
        let major = num.parse::<u32>().unwrap_or(0) / 10_000;
        if major < MIN_SERVER_VERSION {
            let version: String = client
                .query_one("SHOW server_version", &[])
                .await?
                .try_get(0)?;
            return Err(PgError::TooOld {
                addr: config.addr(),
                version,
            });
        }
        let size = config.pool_size.max(1);
        Ok(PgPool {
            inner: Arc::new(Inner {
                config,
                tls,
                idle: Mutex::new(vec![(client, Statements::new())]),
                permits: Arc::new(Semaphore::new(size)),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PgConfig {
        &self.inner.config
    }

    /// The TLS connector (for connections outside the pool, such as the doorbell's).
    pub fn tls(&self) -> &MakeRustls {
        &self.inner.tls
    }

    /// A connection: an idle one, or a new one while fewer than `pool_size` are out. Waits at
    /// most the connect timeout for one to come back.
    pub async fn get(&self) -> Result<PooledClient, PgError> {
        let wait = self.inner.config.connect_timeout;
        let permit = tokio::time::timeout(wait, Arc::clone(&self.inner.permits).acquire_owned())
            .await
            .map_err(|_| PgError::PoolTimeout(wait))?
            .map_err(|_| PgError::PoolTimeout(wait))?;
        let reused = {
            let mut idle = self
                .inner
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            idle.retain(|(c, _)| !c.is_closed());
            idle.pop()
        };
        let (client, statements) = match reused {
            Some(pair) => pair,
            None => (self.connect_one().await?, Statements::new()),
        };
        Ok(PooledClient {
            client: Some(client),
            statements,
            inner: Arc::clone(&self.inner),
            _permit: permit,
        })
    }

    /// A fresh connection outside the pool (closed when the client is dropped): for work that
    /// holds session state, such as the migration's advisory lock.
    pub async fn connect_one(&self) -> Result<Client, PgError> {
        let (client, connection) = connect_raw(&self.inner.config, &self.inner.tls).await?;
        spawn_driver(connection);
        Ok(client)
    }

    /// Connections idle in the pool right now.
    pub fn idle(&self) -> usize {
        self.inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}
