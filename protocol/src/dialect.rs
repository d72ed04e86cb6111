//! Dialects: how ac7 talks to the programs around it — MCP (the agent's side of the ac7 MCP
//! bridge), the length-prefixed `call_tool` dialect, the Ash dialect, Codex's `app-server` JSON-RPC and the
//! Agent Client Protocol (ACP) — with the machines that speak them.

pub mod acp;
pub mod ash;
pub mod call_tool;
pub mod call_tool_bridge;
pub mod codex;
pub mod delivery;
pub mod mcp;
pub(crate) mod mcp_face;
pub mod schema;
