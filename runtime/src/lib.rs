//! Tokio drivers around `ac7-protocol` and the `ac7` command line.
#![warn(missing_docs)]

pub mod bench;
pub mod broker;
pub mod cli;
pub mod clock;
pub mod demo_agent;
pub mod dialects;
mod fsutil;
pub mod logging;
pub mod operator;
pub mod operator_activity;
pub mod peer;
pub mod quickstart;
pub mod runner;
pub mod tls_client;
pub mod unix_socket;

// The flat paths of the modules before the `dialects/` and `runner/` folders, kept so code
// written against them (tests, examples, work in flight) keeps compiling; new code uses the
// folder paths.
#[doc(hidden)]
pub use dialects::ash_host as ash_client;
#[doc(hidden)]
pub use dialects::mcp_bridge as bridge;
#[doc(hidden)]
pub use dialects::{ash_bridge, ash_sessions, call_tool_bridge, call_tool_host};
#[doc(hidden)]
pub use runner::ipc_server;
