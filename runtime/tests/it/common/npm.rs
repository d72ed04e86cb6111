//! npm packages the tests run for real (Codex, Claude Code), installed once per checkout.

use std::path::{Path, PathBuf};

/// The binary `bin` of npm package `package@version`: `$env_var` when set, else installed once
/// into `<target dir>/tmp/<dir>` (Cargo's scratch directory for integration tests; under a lock,
/// so parallel test binaries install it once).
pub fn npm_bin(env_var: &str, package: &str, version: &str, dir: &str, bin: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env_var).filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(dir);
    let path = dir.join("node_modules/.bin").join(bin);
    std::fs::create_dir_all(&dir).unwrap();
    let lock = std::fs::File::create(dir.join(".lock")).unwrap();
    lock.lock().unwrap();
    if !path.exists() {
        let out = std::process::Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&dir)
            .arg(format!("{package}@{version}"))
            .output()
            .unwrap_or_else(|e| panic!("npm is needed to install {package} for this test: {e}"));
        assert!(
            out.status.success(),
            "npm install {package} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    path
}

/// The directory of npm package `package@version` (its files, e.g. a browser script),
/// installed once into `<target dir>/tmp/<dir>` like [`npm_bin`].
pub fn npm_package(package: &str, version: &str, dir: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(dir);
    let path = dir.join("node_modules").join(package);
    std::fs::create_dir_all(&dir).unwrap();
    let lock = std::fs::File::create(dir.join(".lock")).unwrap();
    lock.lock().unwrap();
    if !path.join("package.json").exists() {
        let out = std::process::Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&dir)
            .arg(format!("{package}@{version}"))
            .output()
            .unwrap_or_else(|e| panic!("npm is needed to install {package} for this test: {e}"));
        assert!(
            out.status.success(),
            "npm install {package} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    path
}

/// The Claude Code version the tests run.
pub const CLAUDE_VERSION: &str = "2.1.197";

/// The real `claude`: `$AC7_TEST_CLAUDE`, else `@anthropic-ai/claude-code@CLAUDE_VERSION`
/// installed once into `<target dir>/tmp/claude-npm`.
pub fn claude() -> PathBuf {
    static CLAUDE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CLAUDE
        .get_or_init(|| {
            npm_bin(
                "AC7_TEST_CLAUDE",
                "@anthropic-ai/claude-code",
                CLAUDE_VERSION,
                "claude-npm",
                "claude",
            )
        })
        .clone()
}
