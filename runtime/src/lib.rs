//! Tokio drivers around `ac7-protocol` and the `ac7` command line.
#![warn(missing_docs)]

pub mod ash_bridge;
pub mod ash_client;
pub mod ash_sessions;
pub mod bench;
pub mod bridge;
pub mod broker;
pub mod call_tool_bridge;
pub mod call_tool_host;
pub mod cli;
pub mod clock;
pub mod connect;
pub mod demo_agent;
mod fsutil;
pub mod ipc_server;
pub mod logging;
pub mod operator;
pub mod operator_activity;
pub mod peer;
pub mod quickstart;
pub mod runner;
mod stdio;
pub mod tls_client;
pub mod unix_socket;
