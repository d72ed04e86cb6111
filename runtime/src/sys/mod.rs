//! What `ac7` asks of the operating system, in one place: Unix sockets served race-free
//! ([`unix_socket`]), the HTTPS client's trust roots ([`tls_client`]), atomic file writes
//! (`fsutil`), the open-file limit ([`rlimit`]), the allocator's settings (the broker's
//! [`give_back_large_buffers`], the runners' and bridges' [`keep_heap_for_relaying`]), and time —
//! the wall clock, read only here, and sleeping until a deadline ([`clock`]).

pub mod clock;
pub(crate) mod fsutil;
pub mod rlimit;
pub mod tls_client;
pub mod unix_socket;

/// Pins glibc's mmap threshold at 128 KiB for the broker, so every large buffer (a message body,
/// its JSON, its rendered frame) gets its own mapping and goes back to the OS the moment it is
/// freed. By default glibc raises the threshold after the first such free, and later large
/// buffers come from per-thread heaps that keep their pages: measured with `ac7-bench
/// broker-slow-consumer` (600 x 900 KB pushes), peak RSS 33 MB -> 25 MB and RSS once the burst
/// is over 22-29 MB -> 12 MB, with the healthy subscribers' delivery p50 no worse. A no-op off
/// glibc.
pub fn give_back_large_buffers() {
    mallopt(Mallopt::MmapThreshold, 128 * 1024);
}

/// Lets glibc's malloc keep the heap pages a relaying process (a runner, a bridge) frees, up to a
/// few MiB, instead of giving them back at once. These processes build and drop buffers of tens
/// to hundreds of KiB per burst (32 tool lists of 8 KiB answered in one write are 256 KiB). With
/// glibc's defaults each such buffer past 128 KiB was a fresh mapping, and each free at the top
/// of the heap trimmed it, so the next burst paid a page fault per 4 KiB again: with 32 requests
/// in flight, a fifth of the runner's time went to page faults. Kept: up to 2 MiB of free heap
/// (`M_TRIM_THRESHOLD`), mappings only from 512 KiB (`M_MMAP_THRESHOLD`; setting either turns
/// glibc's moving threshold off, so both are set). The broker gives large buffers back instead
/// ([`give_back_large_buffers`]). A no-op off glibc.
pub fn keep_heap_for_relaying() {
    mallopt(Mallopt::MmapThreshold, 512 * 1024);
    mallopt(Mallopt::TrimThreshold, 2 * 1024 * 1024);
}

/// The glibc malloc parameters `ac7` sets.
#[derive(Clone, Copy)]
enum Mallopt {
    MmapThreshold,
    TrimThreshold,
}

/// Sets one glibc malloc parameter; nothing elsewhere. Called before the process's runtime
/// starts.
fn mallopt(param: Mallopt, value: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let param = match param {
            Mallopt::MmapThreshold => libc::M_MMAP_THRESHOLD,
            Mallopt::TrimThreshold => libc::M_TRIM_THRESHOLD,
        };
        // SAFETY: mallopt only adjusts allocator parameters, and glibc serialises it.
        unsafe {
            libc::mallopt(param, value);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (param, value);
}

/// Whether `fd` is a pipe or a socket: what the event loop can watch, and what a bridge may hand
/// its runner as the agent's stdio.
pub(crate) fn is_pipe_or_socket(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<bool> {
    use std::os::unix::fs::FileTypeExt;
    let kind = std::fs::File::from(fd.try_clone_to_owned()?)
        .metadata()?
        .file_type();
    Ok(kind.is_fifo() || kind.is_socket())
}

/// Appends `bytes` to `buf`, taking the vector whole (no copy) when `buf` is empty.
pub(crate) fn append(buf: &mut Vec<u8>, bytes: Vec<u8>) {
    if buf.is_empty() {
        *buf = bytes;
    } else {
        buf.extend_from_slice(&bytes);
    }
}
