//! Codecs: bytes in, items out, and back — framing and wire shapes with no session state.
//!
//! Every decoder follows one shape (tokio-util style): `push(bytes)`, then `decode()` until
//! `None`, then `decode_eof()` at end of input.

pub mod base64;
pub mod frame;
pub mod http1;
pub mod json;
pub mod jsonrpc;
pub mod length_prefixed;
pub mod line;
pub mod sse;
