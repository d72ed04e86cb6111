//! Tokio drivers around `ac7-protocol` and the `ac7` command line.

pub mod bench;
pub mod broker;
pub mod cli;
pub mod operator;
