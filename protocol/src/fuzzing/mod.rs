//! Oracles for fuzzing: each function interprets arbitrary bytes as input to a protocol machine
//! and panics when the machine breaks one of its promises. The `fuzz/` targets call these; the
//! crate's own tests run them on random bytes too.
//!
//! Enabled with the `fuzzing` feature (always on in this crate's tests).
//!
//! One file per fuzz target, named like the target in `fuzz/fuzz_targets/`; `input` reads fuzzer
//! bytes as decisions, `trace_exchange` builds the traced exchanges the trace oracles share, and
//! `tests` runs every oracle on random and typical input and replays the seed corpora.

mod acp;
mod ash_bridge;
mod ash_host;
mod bridge_session;
mod call_tool_bridge;
mod codex;
mod decode;
mod decode_lp;
mod input;
mod live_stream;
mod runner_session;
mod signin;
mod sse;
#[cfg(test)]
mod tests;
mod trace_exchange;
mod trace_http;
mod trace_redact;
mod trace_upload;
mod tracker;

pub use acp::acp_ops;
pub use ash_bridge::ash_bridge_ops;
pub use ash_host::ash_host_ops;
pub use bridge_session::bridge_ops;
pub use call_tool_bridge::call_tool_bridge_ops;
pub use codex::codex_ops;
pub use decode::decode_chunks;
pub use decode_lp::decode_lp;
pub use live_stream::{LiveSim, LiveStep, live_ops};
pub use runner_session::runner_ops;
pub use signin::signin_ops;
pub use sse::sse_stream;
pub use trace_exchange::{secret_exchange, secret_response, trace_secrets};
pub use trace_http::trace_http;
pub use trace_redact::trace_redact;
pub use trace_upload::{UploadSim, trace_upload};
pub use tracker::tracker_ops;

use input::Input;
use trace_exchange::trace_feed;

/// More polls than this after one input means `poll_output` does not terminate.
const MAX_POLLS: usize = 100_000;
