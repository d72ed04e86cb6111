//! `ac7-bench <scenario>`: runs one benchmark scenario and prints one JSON object on stdout.
//!
//! Build with `--release`: `cargo run --release --bin ac7-bench -- bridge`.

use ac7_runtime::bench;

const SCENARIOS: &str = "bridge, bridge-roundtrip, bridge-throughput, bridge-spawn, bridge-rss";

fn main() -> anyhow::Result<()> {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let report = match scenario.as_str() {
        "bridge" | "bridge-roundtrip" | "bridge-throughput" | "bridge-spawn" | "bridge-rss" => {
            use bench::bridge::{Options, Part, run};
            let parts: &[Part] = match scenario.as_str() {
                "bridge-roundtrip" => &[Part::Roundtrip],
                "bridge-throughput" => &[Part::Throughput],
                "bridge-spawn" => &[Part::Spawn],
                "bridge-rss" => &[Part::Rss],
                _ => &[Part::Roundtrip, Part::Throughput, Part::Spawn, Part::Rss],
            };
            let options = Options::standard(bench::sibling_binary("ac7")?);
            serde_json::to_value(run(&scenario, parts, &options)?)?
        }
        _ => anyhow::bail!("usage: ac7-bench <scenario>; scenarios: {SCENARIOS}"),
    };
    bench::print_json(&report)
}
