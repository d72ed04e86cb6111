//! Sans-IO core of ac7.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod message;
pub mod objective;
pub mod permission;
pub mod vfs;
