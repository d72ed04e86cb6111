//! `ac7-bench <scenario>`: runs one benchmark scenario and prints one JSON object on stdout.
//!
//! Build with `--release`: `cargo run --release --bin ac7-bench -- bridge`.

use std::process::ExitCode;

use ac7_runtime::bench;

const SCENARIOS: &str = "bridge, bridge-roundtrip, bridge-throughput, bridge-spawn, bridge-rss, \
                         call-tool, ash-spawn, ash-query";

fn main() -> ExitCode {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let result = match scenario.as_str() {
        "bridge" | "bridge-roundtrip" | "bridge-throughput" | "bridge-spawn" | "bridge-rss" => {
            bridge(&scenario)
        }
        "call-tool" | "ash-spawn" | "ash-query" => dialect(&scenario),
        _ => {
            eprintln!("usage: ac7-bench <scenario>; scenarios: {SCENARIOS}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("ac7-bench {scenario}: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn bridge(scenario: &str) -> anyhow::Result<()> {
    use bench::bridge::{Options, Part, run};
    let parts: &[Part] = match scenario {
        "bridge-roundtrip" => &[Part::Roundtrip],
        "bridge-throughput" => &[Part::Throughput],
        "bridge-spawn" => &[Part::Spawn],
        "bridge-rss" => &[Part::Rss],
        _ => &[Part::Roundtrip, Part::Throughput, Part::Spawn, Part::Rss],
    };
    let options = Options::standard(bench::sibling_binary("ac7")?);
    bench::print_json(&run(scenario, parts, &options)?)
}

fn dialect(scenario: &str) -> anyhow::Result<()> {
    use bench::dialects;
    let ac7 = bench::sibling_binary("ac7")?;
    match scenario {
        "call-tool" => bench::print_json(&dialects::call_tool(&ac7, 1000)?),
        "ash-spawn" => bench::print_json(&dialects::ash_spawn(&ac7, 20)?),
        _ => bench::print_json(&dialects::ash_query(&ac7, 200)?),
    }
}
