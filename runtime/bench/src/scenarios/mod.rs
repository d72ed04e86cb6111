//! The `ac7-bench` harness: the scenario dispatcher and the measurement helpers every scenario
//! shares (percentiles, peak RSS of a process, JSON output). Benchmarks are measurements, never
//! assertions: each scenario prints one JSON object on stdout.
//!
//! ```text
//! cargo run --release --bin ac7-bench -- e2e              # an agent through the real runner, bridge and broker, vs floors
//! cargo run --release --bin ac7-bench -- fanout           # one broadcast to 100 live streams: SSE, WebSocket, a do-nothing server
//! cargo run --release --bin ac7-bench -- bridge           # all four bridge figures
//! cargo run --release --bin ac7-bench -- bridge-roundtrip # tools/list and tools/call p50/p99
//! cargo run --release --bin ac7-bench -- bridge-throughput | bridge-spawn | bridge-rss
//! cargo run --release --bin ac7-bench -- broker-push      # durable pushes/s, 16 clients
//! cargo run --release --bin ac7-bench -- broker-delivery  # push -> SSE delivery latency, 10 subscribers
//! cargo run --release --bin ac7-bench -- broker-rss       # idle and loaded broker RSS
//! cargo run --release --bin ac7-bench -- broker-history   # /history p50 (1 % of 100 k visible), /roster under it
//! cargo run --release --bin ac7-bench -- broker-slow-consumer # stalled SSE client vs 600 x 900 KB
//! cargo run --release --bin ac7-bench -- broker-upload    # broker RSS during 8 concurrent 24 MB uploads
//! cargo run --release --bin ac7-bench -- broker-disk      # bytes per message at 100 k messages, /history page
//! cargo run --release --bin ac7-bench -- activity-storage # bytes per llm_exchange of a 1,500-exchange session
//! cargo run --release --bin ac7-bench -- runner           # roster round trips, push -> notification, RSS
//! cargo run --release --bin ac7-bench -- call-tool        # call_tool round trip through the bridge
//! cargo run --release --bin ac7-bench -- ash-spawn        # ash-bridge spawn -> R
//! cargo run --release --bin ac7-bench -- ash-query        # query -> done with an instant stand-in agent
//! cargo run --release --bin ac7-bench -- trace            # model call direct vs via the trace proxy, runner RSS
//! cargo run --release --bin ac7-bench -- proxy-attack     # runner fds, RSS, model call under 1,100 silent conns / 16 x 50 MB
//! cargo run --release --bin ac7-bench -- acp              # push -> session/prompt at an ACP agent through ac7 acp
//! ```

use ac7_test_support::{catalogue, procfs};

pub(crate) use procfs::{peak_rss_kib, rss_kib};

pub(crate) mod acp;
pub(crate) mod bridge;
pub(crate) mod broker;
pub(crate) mod dialects;
pub(crate) mod e2e;
pub(crate) mod fanout;
pub(crate) mod floor;
pub(crate) mod history;
pub(crate) mod proxy_attack;
pub(crate) mod runner;
pub(crate) mod slow_consumer;
pub(crate) mod storage;
pub(crate) mod trace;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

/// The scenarios `ac7-bench` knows.
pub(crate) const SCENARIOS: &[&str] = &[
    "e2e",
    "fanout",
    "bridge",
    "bridge-roundtrip",
    "bridge-throughput",
    "bridge-spawn",
    "bridge-rss",
    "broker-push",
    "broker-delivery",
    "broker-rss",
    "broker-history",
    "broker-slow-consumer",
    "broker-upload",
    "broker-replicas",
    "broker-disk",
    "activity-storage",
    "runner",
    "call-tool",
    "ash-spawn",
    "ash-query",
    "trace",
    "proxy-attack",
    "acp",
];

/// Runs the scenario named by `args[0]`; returns the process exit code.
pub(crate) fn run(args: &[String]) -> anyhow::Result<i32> {
    match args.first().map(String::as_str) {
        Some(
            scenario @ ("bridge" | "bridge-roundtrip" | "bridge-throughput" | "bridge-spawn"
            | "bridge-rss"),
        ) => {
            use bridge::{Options, Part};
            let parts: &[Part] = match scenario {
                "bridge-roundtrip" => &[Part::Roundtrip],
                "bridge-throughput" => &[Part::Throughput],
                "bridge-spawn" => &[Part::Spawn],
                "bridge-rss" => &[Part::Rss],
                _ => &[Part::Roundtrip, Part::Throughput, Part::Spawn, Part::Rss],
            };
            let options = Options::standard(sibling_binary("ac7")?);
            print_json(&bridge::run(scenario, parts, &options)?)?;
            Ok(0)
        }
        Some("broker-push") => emit(&broker::push()?),
        Some("broker-delivery") => emit(&broker::delivery()?),
        Some("broker-rss") => emit(&broker::rss()?),
        Some("broker-history") => emit(&history::history()?),
        Some("broker-slow-consumer") => emit(&slow_consumer::run()?),
        Some("broker-upload") => emit(&broker::upload()?),
        Some("broker-replicas") => emit(&broker::replicas()?),
        Some("broker-disk") => emit(&storage::disk()?),
        Some("activity-storage") => emit(&storage::activity_storage()?),
        Some("runner") => {
            print_json(&runner::run()?)?;
            Ok(0)
        }
        Some("call-tool") => {
            print_json(&dialects::call_tool(&sibling_binary("ac7")?, 1000)?)?;
            Ok(0)
        }
        Some("ash-spawn") => {
            print_json(&dialects::ash_spawn(&sibling_binary("ac7")?, 20)?)?;
            Ok(0)
        }
        Some("ash-query") => {
            print_json(&dialects::ash_query(&sibling_binary("ac7")?, 200)?)?;
            Ok(0)
        }
        Some("trace") => {
            print_json(&trace::run()?)?;
            Ok(0)
        }
        Some("proxy-attack") => {
            print_json(&proxy_attack::run()?)?;
            Ok(0)
        }
        Some("e2e") => {
            print_json(&e2e::run()?)?;
            Ok(0)
        }
        Some("acp") => {
            print_json(&acp::run()?)?;
            Ok(0)
        }
        Some("fanout") => {
            print_json(&fanout::run()?)?;
            Ok(0)
        }
        Some(broker::CHILD_ARG) => broker::child_main(&args[1..]),
        Some(e2e::AGENT_ARG) => e2e::agent_main(),
        Some(acp::AGENT_ARG) => acp::agent_main(),
        Some(floor::ECHO_ARG) => floor::echo_main(&args[1..]),
        Some(floor::SERVER_ARG) => floor::server_main(),
        Some(floor::RELAY_ARG) => floor::relay_main(&args[1..]),
        other => anyhow::bail!(
            "unknown scenario {:?}; expected one of: {}",
            other.unwrap_or(""),
            SCENARIOS.join(", ")
        ),
    }
}

/// A scenario's result: key -> value, printed as one JSON object (sorted keys).
pub(crate) type Report = BTreeMap<&'static str, Value>;

fn emit(report: &Report) -> anyhow::Result<i32> {
    print_json(report)?;
    Ok(0)
}

/// Latency summary of a set of samples, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) struct Latency {
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
    pub(crate) fn of(samples: &mut [Duration]) -> Option<Self> {
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

/// The `p`-th percentile (0–100, nearest rank) of sorted `samples`; `None` when empty.
pub(crate) fn percentile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// Median of `samples` (sorted in place).
pub(crate) fn median(samples: &mut [Duration]) -> Option<Duration> {
    samples.sort_unstable();
    percentile(samples, 50.0)
}

/// A binary next to the running executable (`target/<profile>/<name>`).
pub(crate) fn sibling_binary(name: &str) -> std::io::Result<PathBuf> {
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
pub(crate) fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
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
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 100.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile::<u64>(&[], 50.0), None);
        assert_eq!(percentile(&[7u64], 99.0), Some(7));
    }

    #[test]
    fn reads_own_rss() {
        let pid = std::process::id();
        // Current first: the peak read afterwards covers it even if other test threads allocate.
        let now = rss_kib(pid).unwrap();
        let peak = peak_rss_kib(pid).unwrap();
        assert!(peak >= now && now > 0, "peak {peak} now {now}");
        assert!(procfs::proc_status_kib(None, "VmRSS").is_some());
    }
}
