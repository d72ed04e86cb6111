//! What runners that died without cleaning up (`kill -9`, a crash, a power cut) left behind,
//! removed when the next runner starts (every kind: `claude-code`, `codex`, `run`):
//!
//! - the trace host's CA and bundle files, `$TMPDIR/ac7-trace-ca-<pid>-<8 hex>.pem` and
//!   `$TMPDIR/ac7-trace-bundle-<pid>-<8 hex>.pem` ([`super::trace::ca::CaFile`]);
//! - `ac7 codex`'s temporary Codex homes, `<cache>/ac7/codex/ac7-codex-<pid>-<12 hex>/`.
//!
//! An entry is removed only when its name is exactly one of these (ac7's own), it belongs to this
//! user, it is of the right type (a regular file, a directory; never a symbolic link), and the
//! pid in its name is not a running process, so a live runner's files are never touched (a pid
//! reused by another process keeps a dead runner's files until it ends, which errs on the safe
//! side). Codex homes named without a pid (`ac7-codex-<12 hex>`, by older versions) are left
//! alone: nothing says whose they are. The IPC sockets and their lock files are
//! [`super::ipc_server::remove_stale_sockets`]'s.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::lifecycle::pid_alive;

/// Prefix of the trace CA file names.
pub const CA_PREFIX: &str = "ac7-trace-ca";
/// Prefix of the Codex bundle file names.
pub const BUNDLE_PREFIX: &str = "ac7-trace-bundle";
/// Prefix of the temporary Codex home names.
pub const CODEX_HOME_PREFIX: &str = "ac7-codex";
/// Hex digits after the pid in a CA or bundle file name.
pub const FILE_NONCE_HEX: usize = 8;
/// Hex digits after the pid in a Codex home name.
pub const HOME_NONCE_HEX: usize = 12;

/// The pid in `<prefix>-<pid>-<nonce hex digits><suffix>`, when `name` is exactly that.
fn owner(name: &str, prefix: &str, nonce: usize, suffix: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?;
    let rest = rest.strip_suffix(suffix)?;
    let (pid, hex) = rest.split_once('-')?;
    let well_formed = !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && hex.len() == nonce
        && hex.bytes().all(|b| b.is_ascii_hexdigit());
    well_formed.then(|| pid.parse().ok()).flatten()
}

/// Removes the dead runners' CA and bundle files in `tmp` and Codex homes in `codex_homes` (see
/// the module docs); returns what it removed.
pub fn remove_dead_runners_files(tmp: &Path, codex_homes: Option<&Path>) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for (path, meta) in entries(tmp) {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let pid = owner(name, CA_PREFIX, FILE_NONCE_HEX, ".pem")
            .or_else(|| owner(name, BUNDLE_PREFIX, FILE_NONCE_HEX, ".pem"));
        if let Some(pid) = pid
            && meta.file_type().is_file()
            && !pid_alive(pid)
        {
            remove(&path, std::fs::remove_file(&path), pid, &mut removed);
        }
    }
    for (path, meta) in codex_homes.map(entries).unwrap_or_default() {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if let Some(pid) = owner(name, CODEX_HOME_PREFIX, HOME_NONCE_HEX, "")
            && meta.file_type().is_dir()
            && !pid_alive(pid)
        {
            remove(&path, std::fs::remove_dir_all(&path), pid, &mut removed);
        }
    }
    removed
}

/// The entries of `dir` that belong to this user, with their own (not followed) metadata.
fn entries(dir: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let me = rustix::process::geteuid().as_raw();
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    read.flatten()
        .filter_map(|entry| {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).ok()?;
            (meta.uid() == me).then_some((path, meta))
        })
        .collect()
}

fn remove(path: &Path, result: std::io::Result<()>, pid: u32, removed: &mut Vec<PathBuf>) {
    match result {
        Ok(()) => {
            tracing::info!(path = %path.display(), pid, "removed a dead runner's leftover");
            removed.push(path.to_owned());
        }
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "cannot remove a dead runner's leftover");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn only_ac7s_own_names_are_read() {
        assert_eq!(
            owner("ac7-trace-ca-42-0a1b2c3d.pem", CA_PREFIX, 8, ".pem"),
            Some(42)
        );
        assert_eq!(
            owner("ac7-codex-7-0123456789ab", CODEX_HOME_PREFIX, 12, ""),
            Some(7)
        );
        for bad in [
            "ac7-trace-ca-42-0a1b2c3.pem",
            "ac7-trace-ca-42-0a1b2c3g.pem",
            "ac7-trace-ca--0a1b2c3d.pem",
            "ac7-trace-ca-4x-0a1b2c3d.pem",
            "ac7-trace-ca-42-0a1b2c3d.pem.bak",
            "xac7-trace-ca-42-0a1b2c3d.pem",
            "ac7-trace-ca-0a1b2c3d.pem",
        ] {
            assert_eq!(owner(bad, CA_PREFIX, 8, ".pem"), None, "{bad}");
        }
        assert_eq!(
            owner("ac7-codex-0123456789ab", CODEX_HOME_PREFIX, 12, ""),
            None,
            "an old name without a pid"
        );
    }

    #[test]
    fn dead_runners_files_go_and_live_ones_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let homes = tempfile::tempdir().unwrap();
        let dead = 999_999_999u32; // above pid_max: never running
        let live = std::process::id();
        let t = |name: String| tmp.path().join(name);
        let h = |name: String| homes.path().join(name);
        for path in [
            t(format!("ac7-trace-ca-{dead}-0a1b2c3d.pem")),
            t(format!("ac7-trace-bundle-{dead}-0a1b2c3d.pem")),
            t(format!("ac7-trace-ca-{live}-0a1b2c3d.pem")),
            t(format!("ac7-trace-ca-{dead}-notes.txt")),
        ] {
            std::fs::write(path, "x").unwrap();
        }
        // A directory with a CA's name is not a CA file; a link with a home's name not a home.
        std::fs::create_dir(t(format!("ac7-trace-ca-{dead}-ffffffff.pem"))).unwrap();
        for dir in [
            h(format!("ac7-codex-{dead}-0123456789ab")),
            h(format!("ac7-codex-{live}-0123456789ab")),
            h("ac7-codex-0123456789ab".into()),
        ] {
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("config.toml"), "").unwrap();
        }
        let target = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(target.path(), h(format!("ac7-codex-{dead}-aaaaaaaaaaaa")))
            .unwrap();

        let mut removed = remove_dead_runners_files(tmp.path(), Some(homes.path()));
        removed.sort();
        let mut want = vec![
            t(format!("ac7-trace-bundle-{dead}-0a1b2c3d.pem")),
            t(format!("ac7-trace-ca-{dead}-0a1b2c3d.pem")),
            h(format!("ac7-codex-{dead}-0123456789ab")),
        ];
        want.sort();
        assert_eq!(removed, want);
        assert!(t(format!("ac7-trace-ca-{live}-0a1b2c3d.pem")).exists());
        assert!(t(format!("ac7-trace-ca-{dead}-notes.txt")).exists());
        assert!(t(format!("ac7-trace-ca-{dead}-ffffffff.pem")).is_dir());
        assert!(h(format!("ac7-codex-{live}-0123456789ab")).exists());
        assert!(h("ac7-codex-0123456789ab".into()).exists());
        assert!(target.path().exists(), "a link is not followed");
    }
}
