//! Sans-IO core of ac7.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bridge;
pub mod frame;
pub mod json;
pub mod jsonrpc;
pub mod line;
pub mod mcp;
pub mod pending;
pub mod runner;

#[cfg(test)]
pub(crate) mod test_support;
