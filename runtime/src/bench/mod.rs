//! Benchmark harness shared by the `ac7-bench` scenarios.
pub mod broker;
