//! Sans-IO core of ac7.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod frame;
pub mod json;
pub mod jsonrpc;
pub mod line;
pub mod pending;

#[cfg(test)]
pub(crate) mod test_support;
