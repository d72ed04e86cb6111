//! What `ac7` asks of the operating system, in one place: Unix sockets served race-free
//! ([`unix_socket`]), the HTTPS client's trust roots ([`tls_client`]), atomic file writes
//! (`fsutil`), the open-file limit ([`rlimit`]), the allocator's settings of the processes that
//! relay ([`keep_heap_for_relaying`]), and time — the wall clock, read only here, and sleeping
//! until a deadline ([`clock`]).

pub mod clock;
pub(crate) mod fsutil;
pub mod rlimit;
pub mod tls_client;
pub mod unix_socket;

/// Lets glibc's malloc keep the heap pages a relaying process (a runner, a bridge) frees, up to a
/// few MiB, instead of giving them back at once. These processes build and drop buffers of tens
/// to hundreds of KiB per burst (32 tool lists of 8 KiB answered in one write are 256 KiB). With
/// glibc's defaults each such buffer past 128 KiB was a fresh mapping, and each free at the top
/// of the heap trimmed it, so the next burst paid a page fault per 4 KiB again: with 32 requests
/// in flight, a fifth of the runner's time went to page faults. Kept: up to 2 MiB of free heap
/// (`M_TRIM_THRESHOLD`), mappings only from 512 KiB (`M_MMAP_THRESHOLD`). The broker keeps its
/// own setting (it returns large message buffers at once). A no-op off glibc.
pub fn keep_heap_for_relaying() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts allocator parameters; glibc serialises it, and it is called
    // before the process's runtime starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 512 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 2 * 1024 * 1024);
    }
}

/// Appends `bytes` to `buf`, taking the vector whole (no copy) when `buf` is empty.
pub(crate) fn append(buf: &mut Vec<u8>, bytes: Vec<u8>) {
    if buf.is_empty() {
        *buf = bytes;
    } else {
        buf.extend_from_slice(&bytes);
    }
}
