//! The runtime's integration tests, in one test binary (`cargo test -p ac7-runtime --test it`).
//!
//! One binary instead of one per file: the runtime is linked once, not once per file, and the
//! tests of every file run in parallel in one process. Run one file's tests with a filter on its
//! module: `cargo test -p ac7-runtime --test it broker_http::`.
//!
//! Adding a test file: put it here as `runtime/tests/it/<name>.rs` and add `mod <name>;` below
//! (keep the list sorted). Shared support is `crate::common` (bridge, runner, Python venv,
//! `wait_until`/`within`) and `crate::broker_support` (a real broker on 127.0.0.1, the `snap!`
//! macro); a file uses them with `use crate::common;` / `use crate::broker_support;`.
//!
//! Every test shares this process with all the others, so a test never changes process-wide
//! state: no `std::env::set_var`, no `set_current_dir`, no signal handlers, no umask; pass
//! environment and working directories to the child processes it starts instead.

#[macro_use]
mod broker_support;
mod common;

mod acp_real;
mod acp_scripted;
mod admin_cli;
mod ash_bridge;
mod ash_real;
mod bridge_sdk;
mod bridge_stdio;
mod broker_activity;
mod broker_channels;
mod broker_cli;
mod broker_edges;
mod broker_fs;
mod broker_http;
mod broker_identity;
mod broker_limits;
mod broker_objectives;
mod broker_stream;
mod broker_tls;
mod call_tool;
mod claude_real;
mod cli_packaging;
mod client_failover;
mod codex_real;
mod ipc_server;
mod pg_activity;
mod pg_fs;
mod pg_log;
mod pg_migrate;
mod pg_replicas;
mod pg_serve;
mod pg_shared;
mod pg_store;
mod pg_team;
mod quickstart;
mod runner_activity;
mod runner_e2e;
mod runner_lifecycle;
mod serve_config;
mod trace_real;
mod web_a11y;
mod web_app;
mod web_auth;
mod web_chat;
mod web_live;
mod web_push;
mod web_screens;
mod web_serve;
