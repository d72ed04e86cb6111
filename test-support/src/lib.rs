//! Fixtures shared by the `ac7-runtime` integration tests (`runtime/tests/it`) and the
//! `ac7-bench` harness: [`catalogue`] (a director's `tools/list`), [`procfs`] (memory figures of
//! a live process) and [`webdriver`] (the browser tests' WebDriver client).

pub mod catalogue;
pub mod procfs;
pub mod webdriver;
