//! Where a runner's logs go.
//!
//! A runner logs at `warn` unless `AC7_LOG` says otherwise. When the agent owns a terminal (the
//! runner's stdin or stdout is a tty, which the agent inherits — `ac7 claude-code`, `ac7 run` in a
//! shell), the logs go to a file instead of stderr, so they are never drawn over the agent's screen:
//! `$XDG_STATE_HOME/ac7/runner-<pid>.log` (default `~/.local/state/ac7/`; the directory 0700, the
//! file 0600, truncated if a file of that name is left from an earlier process). Its path is
//! printed once on stderr before the agent starts. Without a terminal (`ac7 codex`, whose agent
//! talks over pipes; a runner under a supervisor) the logs stay on stderr.

use std::ffi::OsString;
use std::fs::{DirBuilder, OpenOptions};
use std::io::IsTerminal;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// A runner's log level when `AC7_LOG` is unset.
pub const RUNNER_LEVEL: &str = "warn";

static LOG_FILE: OnceLock<PathBuf> = OnceLock::new();

/// Whether the agent the runner starts will own a terminal (the runner's stdin or stdout is one).
pub fn agent_owns_terminal() -> bool {
    std::io::stdin().is_terminal() || std::io::stdout().is_terminal()
}

/// The directory for log files: `$XDG_STATE_HOME/ac7`, or `$HOME/.local/state/ac7`.
pub fn log_dir(xdg_state_home: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    match xdg_state_home.filter(|v| !v.is_empty()) {
        Some(state) => Some(PathBuf::from(state).join("ac7")),
        None => home
            .filter(|v| !v.is_empty())
            .map(|home| PathBuf::from(home).join(".local/state/ac7")),
    }
}

/// Installs the runner's logging: to a file when `to_file` (the agent owns the terminal), else to
/// stderr. A file that cannot be created is reported once on stderr and the logs go to stderr.
pub fn init(to_file: bool) {
    if to_file {
        match open_log_file() {
            Ok((path, file)) => {
                crate::logging::init_with_writer(RUNNER_LEVEL, Mutex::new(file));
                let _ = LOG_FILE.set(path);
                return;
            }
            Err(e) => eprintln!("ac7: warning: cannot open a log file ({e}); logging to stderr"),
        }
    }
    crate::logging::init(RUNNER_LEVEL);
}

/// The log file, when the logs go to one.
pub fn log_file() -> Option<&'static std::path::Path> {
    LOG_FILE.get().map(PathBuf::as_path)
}

/// Prints the log file's path on stderr (once, before the agent starts).
pub fn announce() {
    if let Some(path) = log_file() {
        eprintln!("ac7: runner logs: {}", path.display());
    }
}

fn open_log_file() -> Result<(PathBuf, std::fs::File), String> {
    let dir = log_dir(std::env::var_os("XDG_STATE_HOME"), std::env::var_os("HOME"))
        .ok_or("neither XDG_STATE_HOME nor HOME is set")?;
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("runner-{}.log", std::process::id()));
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // An existing file keeps its mode through open(2): make it private.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((path, file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_follows_xdg_then_home() {
        assert_eq!(
            log_dir(Some("/s".into()), Some("/h".into())),
            Some(PathBuf::from("/s/ac7"))
        );
        assert_eq!(
            log_dir(Some("".into()), Some("/h".into())),
            Some(PathBuf::from("/h/.local/state/ac7"))
        );
        assert_eq!(log_dir(None, None), None);
    }
}
