#![no_main]
//! See `ac7_protocol::fuzzing::acp_ops` for the input format and the oracles.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ac7_protocol::fuzzing::acp_ops(data));
