//! Tokio drivers around `ac7-protocol` and the `ac7` command line.
#![warn(missing_docs)]

pub mod broker;
pub mod cli;
pub mod client;
pub mod connect;
pub mod dialects;
pub mod logging;
pub mod operator;
pub mod quickstart;
pub mod runner;
pub mod sys;
