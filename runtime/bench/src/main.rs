//! `ac7-bench <scenario>`: runs one benchmark scenario and prints one JSON object on stdout.
//! Build with `--release`: `cargo run --release --bin ac7-bench -- bridge` (scenarios: see
//! `ac7_runtime::bench`).

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match ac7_runtime::bench::run(&args) {
        Ok(code) => std::process::ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(err) => {
            eprintln!("ac7-bench: {err:#}");
            std::process::ExitCode::from(1)
        }
    }
}
