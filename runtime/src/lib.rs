//! Tokio drivers around `ac7-protocol` and the `ac7` command line.
#![warn(missing_docs)]

pub mod broker;
pub mod cli;
pub mod clock;
pub mod connect;
pub mod demo_agent;
pub mod dialects;
mod fsutil;
pub mod logging;
pub mod operator;
pub mod operator_activity;
pub mod peer;
pub mod quickstart;
pub mod rlimit;
pub mod runner;
pub mod tls_client;
pub mod unix_socket;
