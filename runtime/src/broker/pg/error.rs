//! [`PgError`]: what went wrong talking to PostgreSQL, one line each, split by whose move it is.

use std::time::Duration;

use tokio_postgres::error::SqlState;

/// Oldest PostgreSQL major version the broker runs on.
pub const MIN_SERVER_VERSION: u32 = 13;

/// A PostgreSQL failure. The operator's variants (URL, server, role, database, TLS, version,
/// schema) name the problem and what to do; the rest are the broker's or the connection's.
/// No message contains the password.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    // --- the operator's: fix the URL or the server, then start again ---
    /// The URL could not be parsed.
    #[error("bad PostgreSQL URL: {0}")]
    BadUrl(String),
    /// Nothing answered at the address (refused, unresolvable, unreachable).
    #[error(
        "cannot reach PostgreSQL at {addr}: {reason}; is the server running and listening there?"
    )]
    Unreachable {
        /// `host:port`.
        addr: String,
        /// What the socket said.
        reason: String,
    },
    /// Connecting (TCP, TLS, sign-in) took longer than the connect timeout.
    #[error(
        "PostgreSQL at {addr} did not answer within {} s; check the host, port and firewall (or raise connect_timeout)",
        after.as_secs_f64()
    )]
    Timeout {
        /// `host:port`.
        addr: String,
        /// The limit that passed.
        after: Duration,
    },
    /// The server refused the credentials.
    #[error(
        "PostgreSQL at {addr} refused user \"{user}\": {reason}; check the user and password in the URL"
    )]
    AuthFailed {
        /// `host:port`.
        addr: String,
        /// The role.
        user: String,
        /// The server's reason.
        reason: String,
    },
    /// The role does not exist.
    #[error(
        "PostgreSQL at {addr} has no role \"{user}\"; create it (createuser -h {host} -p {port} {user}) or fix the user in the URL"
    )]
    NoRole {
        /// `host:port`.
        addr: String,
        /// Host alone.
        host: String,
        /// Port alone.
        port: u16,
        /// The role.
        user: String,
    },
    /// The database does not exist.
    #[error(
        "PostgreSQL at {addr} has no database \"{dbname}\"; create it with `createdb -h {host} -p {port} -U {user} {dbname}`"
    )]
    NoDatabase {
        /// `host:port`.
        addr: String,
        /// Host alone.
        host: String,
        /// Port alone.
        port: u16,
        /// The role.
        user: String,
        /// The database.
        dbname: String,
    },
    /// TLS was required (or verification asked for) and could not be set up.
    #[error(
        "TLS to PostgreSQL at {addr} failed: {reason}; check sslmode and sslrootcert in the URL"
    )]
    Tls {
        /// `host:port`.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The server is older than [`MIN_SERVER_VERSION`].
    #[error("PostgreSQL at {addr} is version {version}; ac7 needs {MIN_SERVER_VERSION} or newer")]
    TooOld {
        /// `host:port`.
        addr: String,
        /// What the server reported.
        version: String,
    },
    /// The database was migrated by a newer ac7.
    #[error(
        "the database schema is at version {found} but this ac7 knows versions up to {known}; run a newer ac7 (downgrading is not supported)"
    )]
    SchemaTooNew {
        /// Highest applied version.
        found: i32,
        /// Highest version this binary knows.
        known: i32,
    },

    // --- the broker's or the connection's: a 503 while the database is away, else a 500 ---
    /// No pooled connection became free within the connect timeout.
    #[error("no PostgreSQL connection became free within {} s", .0.as_secs_f64())]
    PoolTimeout(Duration),
    /// A statement failed, or the connection broke.
    #[error("PostgreSQL: {}", describe(.0))]
    Db(#[from] tokio_postgres::Error),
    /// A stored value broke an invariant.
    #[error("corrupt PostgreSQL store: {0}")]
    Corrupt(String),
}

impl PgError {
    /// Whether the database is away (connection lost, unreachable, timed out) rather than
    /// refusing this request: worth a 503 and a retry.
    pub fn is_unavailable(&self) -> bool {
        match self {
            PgError::Unreachable { .. } | PgError::Timeout { .. } | PgError::PoolTimeout(_) => true,
            PgError::Db(e) => {
                e.is_closed()
                    || e.code().is_some_and(|c| {
                        matches!(
                            *c,
                            SqlState::ADMIN_SHUTDOWN
                                | SqlState::CRASH_SHUTDOWN
                                | SqlState::CANNOT_CONNECT_NOW
                                | SqlState::CONNECTION_FAILURE
                                | SqlState::CONNECTION_EXCEPTION
                        )
                    })
                    || (e.as_db_error().is_none() && source_io(e).is_some())
            }
            _ => false,
        }
    }
}

/// A `tokio_postgres` error on one line: the server's message when there is one, else the
/// error and its cause.
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// The I/O error under a `tokio_postgres` error, if that is what it is.
pub(super) fn source_io(e: &tokio_postgres::Error) -> Option<&std::io::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        cur = err.source();
    }
    None
}
