//! `ac7-bench <scenario>`: runs one benchmark scenario and prints one JSON object on stdout.
//! Build with `--release`: `cargo run --release --bin ac7-bench -- bridge` (scenarios: see
//! `scenarios/mod.rs`), and `ac7-bench web` (the web app in headless Chromium: first load
//! size, time to interactive, push → visible; see `web.rs`).

mod scenarios;
mod web;

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = if args.first().map(String::as_str) == Some("web") {
        web::run().map(|report| {
            #[allow(clippy::print_stdout)]
            {
                println!("{report}");
            }
            0
        })
    } else {
        scenarios::run(&args)
    };
    match result {
        Ok(code) => std::process::ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(err) => {
            eprintln!("ac7-bench: {err:#}");
            std::process::ExitCode::from(1)
        }
    }
}
