//! The broker on PostgreSQL: connecting, the schema and its migrations, the message log and
//! its doorbell. The store layer of `ac7 serve --db postgres://…` is built on this module; any
//! number of broker processes (replicas) share one database.
//!
//! - [`PgConfig`] parses a libpq-style URL (`sslmode`, `sslrootcert`; TLS through rustls).
//! - [`PgPool`] connects (failures are one-line [`PgError`]s naming the fix: server
//!   unreachable, wrong credentials, no such role or database, TLS, server too old) and pools
//!   connections.
//! - [`migrate()`] brings the schema to the version this binary knows, once even when replicas
//!   start together, and refuses a database migrated by a newer binary.
//! - [`log`] appends messages and reads them back in order; [`Doorbell`] hears appends (and
//!   activity uploads) made by any replica.
//!
//! # One team per database
//!
//! As with the SQLite file, a database holds one team (`team` has one row). Tables carry no
//! team id; several teams need several databases.
//!
//! # The sequence invariant
//!
//! Messages are numbered 1, 2, 3, … by commit order: a message with a smaller sequence is
//! committed, and visible, before any with a larger one. So a reader that has seen sequence
//! `n` never misses a row by continuing after `n`, on any replica. It is held by one counter
//! row (`log_head`) that every append updates first and keeps locked until it commits (see
//! [`log`]).
//!
//! # The doorbell
//!
//! An append's transaction notifies `ac7_log` with its last sequence (never the message):
//! PostgreSQL delivers it at commit, to every replica listening. The notification is only a
//! hint to read the table; the table is the truth. A replica whose listening connection drops
//! reconnects and re-reads the log after its last sequence ([`Ring::Reconnected`]), so a lost
//! notification delays a delivery but never loses one.
//!
//! Activity uploads ring the same doorbell on a second channel, `ac7_activity`, with the id of
//! their last row; their ids are ordered the same way, by the counter row `activity_head`
//! (see [`crate::broker::activity_follower`]).

pub mod config;
pub mod doorbell;
pub mod error;
pub mod log;
pub mod migrate;
pub mod pool;
pub mod schema;
pub mod tls;

pub use config::{PgConfig, SslMode};
pub use doorbell::{ACTIVITY_CHANNEL, Bell, Channel, Doorbell, DoorbellState, Ring};
pub use error::PgError;
pub use log::{LOG_CHANNEL, LogMessage, LogRow};
pub use migrate::{Migrated, latest_version, migrate};
pub use pool::{PgPool, PooledClient};
