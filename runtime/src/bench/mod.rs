//! Helpers for the `ac7-bench` binary: percentiles, peak RSS of a process, JSON output.
//!
//! Benchmarks are measurements, never assertions: each scenario prints one JSON object.

pub mod bridge;
pub mod dialects;

use std::path::PathBuf;
use std::time::Duration;

/// Latency summary of a set of samples, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Latency {
    /// Number of samples.
    pub n: usize,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Smallest sample.
    pub min_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

impl Latency {
    /// Summarizes `samples` (sorted in place). `None` when there are none.
    pub fn of(samples: &mut [Duration]) -> Option<Self> {
        samples.sort_unstable();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        Some(Self {
            n: samples.len(),
            p50_us: us(percentile(samples, 50.0)?),
            p99_us: us(percentile(samples, 99.0)?),
            min_us: us(*samples.first()?),
            max_us: us(*samples.last()?),
        })
    }
}

/// The `p`-th percentile (nearest rank) of sorted `samples`.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// Median of `samples` (sorted in place).
pub fn median(samples: &mut [Duration]) -> Option<Duration> {
    samples.sort_unstable();
    percentile(samples, 50.0)
}

/// Peak resident set size (`VmHWM`) of a live process, in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_field_kib(pid, "VmHWM:")
}

/// Current resident set size (`VmRSS`) of a live process, in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_field_kib(pid, "VmRSS:")
}

fn status_field_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The `ac7` binary next to the running executable (`target/<profile>/ac7`).
pub fn sibling_binary(name: &str) -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| std::io::Error::other("the executable has no directory"))?;
    let path = dir.join(name);
    if path.exists() {
        Ok(path)
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "{} not found: build it first (cargo build --release --bin {name})",
                path.display()
            ),
        ))
    }
}

/// Writes `value` as one line of JSON on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let mut samples: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let l = Latency::of(&mut samples).unwrap();
        assert_eq!(l.p50_us, 50.0);
        assert_eq!(l.p99_us, 99.0);
        assert_eq!(l.min_us, 1.0);
        assert_eq!(l.max_us, 100.0);
        assert_eq!(percentile(&[], 50.0), None);
        let one = [Duration::from_micros(7)];
        assert_eq!(percentile(&one, 99.0), Some(Duration::from_micros(7)));
        assert_eq!(percentile(&one, 0.0), Some(Duration::from_micros(7)));
    }

    #[test]
    fn reads_own_rss() {
        let pid = std::process::id();
        // Current first: the peak read afterwards covers it even if other test threads allocate.
        let now = rss_kib(pid).unwrap();
        let peak = peak_rss_kib(pid).unwrap();
        assert!(peak >= now && now > 0, "peak {peak} now {now}");
    }
}
