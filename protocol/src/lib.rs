//! Sans-IO core of ac7.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
