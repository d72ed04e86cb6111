//! The store layer: SQL written once against [`Conn`], run on the embedded SQLite file (or, with
//! replicas, on PostgreSQL) inside transactions the store owns.
//!
//! * [`value`]: the values that cross the SQL boundary ([`params!`](crate::params), [`Row`]).
//! * [`conn`]: [`Conn`], a connection inside a transaction, whichever database it is.
//! * [`off_worker`]: where store calls run. They are synchronous; on a multi-threaded runtime
//!   they run under `tokio::task::block_in_place`, so a slow commit (an fsync) hands the worker's
//!   other tasks to another thread instead of stalling them. The one exception is
//!   [`Store::view_small`](super::db::Store::view_small): a read of a few rows by key on SQLite
//!   runs in place when a read connection is free, since a WAL read never waits for a commit.

pub mod conn;
pub mod keys;
pub mod postgres;
pub mod value;

pub use conn::{Backend, Conn, KeyFill};
pub use value::{FromValue, Row, ToValue, Value};

/// Runs the blocking `f` without stalling an async worker: under `block_in_place` on a
/// multi-threaded tokio runtime; as is elsewhere (outside a runtime, or on a current-thread
/// runtime, where nothing else could take the worker's tasks anyway).
pub fn off_worker<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
