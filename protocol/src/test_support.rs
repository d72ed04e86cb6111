//! Shared test configuration: proptest regressions and insta snapshots live at the top level.

use proptest::test_runner::{Config, FileFailurePersistence};

/// A proptest config that records failures in `proptest-regressions/<name>.txt` at the
/// repository root.
pub(crate) fn proptest_config(name: &'static str) -> Config {
    let path = format!(
        "{}/../proptest-regressions/{name}.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    Config {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(Box::leak(
            path.into_boxed_str(),
        )))),
        ..Config::default()
    }
}

/// Runs `f` with insta writing to the top-level `snapshots/` directory.
pub(crate) fn snapshots<R>(f: impl FnOnce() -> R) -> R {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots"));
    settings.set_prepend_module_to_snapshot(true);
    settings.bind(f)
}
