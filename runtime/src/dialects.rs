//! The dialect drivers: thin tokio loops around the `ac7-protocol` machines that speak to the
//! programs around ac7 — the agent's stdio and the sockets of the three bridge kinds.
//!
//! Glossary (each name means one thing):
//! - **bridge**: a process an agent (or a host) starts that speaks a dialect on one side and
//!   relays to ac7 on the other. [`mcp_bridge`] is `ac7 mcp-bridge`, the MCP stdio bridge that
//!   relays to the runner's socket; [`call_tool_bridge`] is the `call_tool` bridge (MCP on stdio,
//!   `call_tool` frames to a parent); [`ash_bridge`] is `ac7 ash-bridge`, the Ash bridge that
//!   runs the agent for an Ash host.
//! - **host**: the process on the other end of a bridge that drives it and answers it:
//!   [`call_tool_host`] is the `call_tool` parent (it answers `call_tool` requests);
//!   [`ash_host`] drives an Ash bridge ([`ash_host::AshClient`] is the handle to that task).
//! - **runner**: `ac7 run` / `ac7 claude-code` / `ac7 codex` — it serves MCP bridges on its IPC
//!   socket ([`crate::runner::ipc_server`]); the protocol crate's `session::runner` is its machine.
//! - `stdio`: the agent-stdio plumbing the stdio bridges share; [`ash_sessions`]: the Ash
//!   bridge's session map.

pub mod ash_bridge;
pub mod ash_host;
pub mod ash_sessions;
pub mod call_tool_bridge;
pub mod call_tool_host;
pub mod mcp_bridge;
pub mod relay;
pub(crate) mod stdio;
