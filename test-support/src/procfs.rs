//! Memory figures of a live process from `/proc/<pid>/status`, for the tests that bound a
//! process's memory and for `ac7-bench`.

/// A field (in KiB) of `/proc/<pid>/status` (this process when `None`), e.g. `VmHWM` (peak RSS)
/// or `VmRSS`.
pub fn proc_status_kib(pid: Option<u32>, field: &str) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_owned(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

/// Peak resident set size (`VmHWM`) of a live process, in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    proc_status_kib(Some(pid), "VmHWM")
}

/// Current resident set size (`VmRSS`) of a live process, in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    proc_status_kib(Some(pid), "VmRSS")
}
