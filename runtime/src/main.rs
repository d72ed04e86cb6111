fn main() -> std::process::ExitCode {
    let cli = ac7_runtime::cli::parse();
    match ac7_runtime::cli::run(cli) {
        Ok(code) => std::process::ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(err) => {
            eprintln!("ac7: {}", ac7_runtime::cli::error_text(&err));
            std::process::ExitCode::from(1)
        }
    }
}
