//! Logs on stderr, level from `AC7_LOG` (the default depends on the command: `warn` for the
//! bridge, `info` for the broker and operator verbs): human-readable lines when stderr is a
//! terminal, one JSON object per line otherwise (for log collectors and tests).
//!
//! Stdout is never used: for `ac7 mcp-bridge` it carries the MCP protocol.

use tracing_subscriber::EnvFilter;

/// The environment variable holding the log filter (`error`, `warn`, `info`, `debug`, `trace`,
/// or any `tracing-subscriber` directive such as `ac7_runtime::dialects::mcp_bridge=debug`).
pub const LOG_ENV: &str = "AC7_LOG";

/// The bridge's filter when `AC7_LOG` is unset or empty: quiet unless something goes wrong.
pub const DEFAULT_LEVEL: &str = "warn";

/// Installs the global subscriber writing to stderr (text on a terminal, else JSON lines), with `default_level` when
/// `AC7_LOG` is unset or invalid. Does nothing if one is already installed (tests, or a second
/// call).
pub fn init(default_level: &str) {
    let human = std::io::IsTerminal::is_terminal(&std::io::stderr());
    install(default_level, std::io::stderr, human);
}

/// [`init`] writing JSON lines to `writer` instead of stderr (the runner's log file).
pub fn init_with_writer<W>(default_level: &str, writer: W)
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    install(default_level, writer, false);
}

fn install<W>(default_level: &str, writer: W, human: bool)
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    let configured = std::env::var(LOG_ENV).ok().filter(|v| !v.trim().is_empty());
    let (filter, invalid) = match configured.as_deref().map(EnvFilter::try_new) {
        None => (EnvFilter::new(default_level), None),
        Some(Ok(filter)) => (filter, None),
        Some(Err(err)) => (EnvFilter::new(default_level), Some(err)),
    };
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    let installed = if human {
        fmt.try_init().is_ok()
    } else {
        fmt.json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init()
            .is_ok()
    };
    if let (true, Some(err)) = (installed, invalid) {
        tracing::warn!(
            value = configured.as_deref().unwrap_or_default(),
            error = %err,
            "{LOG_ENV} is not a valid log filter; using {default_level}"
        );
    }
}
