//! What `ac7` asks of the operating system, in one place: Unix sockets served race-free
//! ([`unix_socket`]), the HTTPS client's trust roots ([`tls_client`]), atomic file writes
//! (`fsutil`), the open-file limit ([`rlimit`]), and time — the wall clock, read only here, and
//! sleeping until a deadline ([`clock`]).

pub mod clock;
pub(crate) mod fsutil;
pub mod rlimit;
pub mod tls_client;
pub mod unix_socket;

/// Appends `bytes` to `buf`, taking the vector whole (no copy) when `buf` is empty.
pub(crate) fn append(buf: &mut Vec<u8>, bytes: Vec<u8>) {
    if buf.is_empty() {
        *buf = bytes;
    } else {
        buf.extend_from_slice(&bytes);
    }
}
