//! Benchmark harness for `ac7-bench`: shared measurement helpers and the
//! scenario dispatcher. Each scenario prints one JSON object on stdout.
//!
//! ```text
//! cargo run --release --bin ac7-bench -- broker-push      # durable pushes/s, 16 clients
//! cargo run --release --bin ac7-bench -- broker-delivery  # push -> SSE delivery latency, 10 subscribers
//! cargo run --release --bin ac7-bench -- broker-rss       # idle and loaded broker RSS
//! ```

pub mod broker;

use std::collections::BTreeMap;

use serde_json::Value;

/// The scenarios `ac7-bench` knows.
pub const SCENARIOS: &[&str] = &["broker-push", "broker-delivery", "broker-rss"];

/// Runs the scenario named by `args[0]`; returns the process exit code.
pub fn run(args: &[String]) -> anyhow::Result<i32> {
    match args.first().map(String::as_str) {
        Some("broker-push") => emit(&broker::push()?),
        Some("broker-delivery") => emit(&broker::delivery()?),
        Some("broker-rss") => emit(&broker::rss()?),
        Some(broker::CHILD_ARG) => broker::child_main(&args[1..]),
        other => {
            anyhow::bail!(
                "unknown scenario {:?}; expected one of: {}",
                other.unwrap_or(""),
                SCENARIOS.join(", ")
            )
        }
    }
}

/// A scenario's result: key -> value, printed as one JSON object (sorted keys).
pub type Report = BTreeMap<&'static str, Value>;

#[allow(clippy::print_stdout)]
fn emit(report: &Report) -> anyhow::Result<i32> {
    println!("{}", serde_json::to_string(report)?);
    Ok(0)
}

/// The `p`-th percentile (0–100) of sorted samples, nearest-rank; 0 when empty.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A field (in KiB) of `/proc/<pid>/status`, e.g. `VmHWM` (peak RSS) or `VmRSS`.
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

/// Peak RSS (VmHWM) of this process, in KiB.
pub fn peak_rss_kib() -> Option<u64> {
    proc_status_kib(None, "VmHWM")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&v, 0.0), 1);
        assert_eq!(percentile(&[], 50.0), 0);
        assert_eq!(percentile(&[7], 99.0), 7);
    }

    #[test]
    fn reads_own_rss() {
        assert!(peak_rss_kib().is_some_and(|k| k > 0));
        assert!(proc_status_kib(Some(std::process::id()), "VmRSS").is_some());
    }
}
