//! Session machines: the sans-IO state machines of ac7's own processes — the MCP bridge, the
//! runner's IPC session, the live stream, the objectives tracker — and the correlation table
//! they share. Each follows the crate's machine contract (see the [crate docs](crate)).

pub mod live;
pub mod mcp_bridge;
pub mod pending;
pub mod runner;
pub mod tracker;

#[cfg(test)]
mod handover_tests;
