//! The agent's MCP config file (`.mcp.json`): merge the `ac7` server entry in, and put the file
//! back exactly as it was on every exit path.
//!
//! Before anything is written, the original bytes (or the fact that there was no file) are saved
//! in a backup record next to the config, `.<name>.ac7-backup.json` (0600), together with the
//! runner's pid. [`McpConfigGuard::restore`] writes the original bytes back (or removes the file
//! the runner created) and deletes the record; it runs on normal exit, on an agent crash, after
//! SIGINT/SIGTERM, and from `Drop` when the runner unwinds from a panic. After `kill -9` the
//! record stays behind, and the next runner started on the same config restores it before
//! doing anything else — unless the pid in it is still alive, in which case that runner owns the
//! file and the new one refuses to start.
//!
//! Every write is atomic (`fsutil::write_atomic_mode`: a temp file in the same directory, fsync,
//! rename, fsync of the directory). The merged and the restored config keep the original file's
//! permission bits (saved in the backup record too); a config the runner creates is 0600, like the
//! backup record. The merged file keeps every other top-level key and server entry; it is written as
//! 2-space indented JSON (key order may change while the runner runs; the original bytes come
//! back at the end).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use ac7_protocol::codec::base64;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Why the config could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The existing file is not a JSON object.
    #[error(
        "refusing to modify {}: existing file is not a valid JSON object ({reason}). Fix or delete the file, then re-run.",
        path.display()
    )]
    NotAnObject {
        /// The config path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The config's folder does not exist.
    #[error(
        "cannot write the MCP config {}: its folder {} does not exist",
        path.display(),
        folder.display()
    )]
    NoFolder {
        /// The config path.
        path: PathBuf,
        /// Its folder.
        folder: PathBuf,
    },
    /// Another live runner has this config installed.
    #[error(
        "{} is in use by another ac7 runner (pid {pid}): stop it first, or run this agent from another directory",
        path.display()
    )]
    InUse {
        /// The config path.
        path: PathBuf,
        /// The other runner.
        pid: u32,
    },
    /// A file operation failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What was attempted.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct Backup {
    /// The runner that wrote the config.
    pid: u32,
    /// The original bytes, base64; `None` when there was no file.
    original: Option<String>,
    /// The original file's permission bits (absent in records of older runners: 0600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mode: Option<u32>,
}

/// The installed config; restores the original when told to or when dropped.
#[derive(Debug)]
pub struct McpConfigGuard {
    path: PathBuf,
    backup: PathBuf,
    original: Option<Vec<u8>>,
    mode: u32,
    restored: bool,
}

/// Where the backup record of `path` lives.
pub fn backup_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.ac7-backup.json"))
}

/// Puts back a config left behind by a runner that died without restoring it. Returns the pid
/// of that runner when something was restored.
pub fn recover_stale(path: &Path) -> Result<Option<u32>, ConfigError> {
    let backup = backup_path(path);
    let record = match fs::read(&backup) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(io_error("read", &backup, source)),
    };
    let Ok(record) = serde_json::from_slice::<Backup>(&record) else {
        // Not ours to interpret: leave it for a human.
        return Err(ConfigError::Io {
            op: "understand the backup record",
            path: backup,
            source: io::Error::other("it is not an ac7 backup record"),
        });
    };
    if record.pid != std::process::id() && Path::new(&format!("/proc/{}", record.pid)).exists() {
        return Err(ConfigError::InUse {
            path: path.to_owned(),
            pid: record.pid,
        });
    }
    let original = record.original.as_deref().map(base64::decode_lenient);
    put_back(path, original.as_deref(), record.mode.unwrap_or(0o600))?;
    remove_if_exists(&backup)?;
    Ok(Some(record.pid))
}

/// Merges `mcpServers.<name> = entry` into the config at `path`, after saving the original.
pub fn install(path: &Path, name: &str, entry: Value) -> Result<McpConfigGuard, ConfigError> {
    // The backup record goes next to the config: say so about the config, not the record.
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if matches!(fs::metadata(folder), Err(e) if e.kind() == io::ErrorKind::NotFound) {
        return Err(ConfigError::NoFolder {
            path: path.to_owned(),
            folder: folder.to_owned(),
        });
    }
    recover_stale(path)?;
    let original = match fs::read(path) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(source) => return Err(io_error("read", path, source)),
    };
    let mode = match &original {
        None => 0o600,
        Some(_) => {
            use std::os::unix::fs::PermissionsExt;
            fs::metadata(path)
                .map_err(|source| io_error("stat", path, source))?
                .permissions()
                .mode()
                & 0o7777
        }
    };
    let mut config = match &original {
        None => Map::new(),
        Some(bytes) => match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(map)) => map,
            Ok(other) => {
                return Err(ConfigError::NotAnObject {
                    path: path.to_owned(),
                    reason: format!(
                        "it holds a JSON {}",
                        ac7_protocol::codec::json::kind_name(&other)
                    ),
                });
            }
            Err(e) => {
                return Err(ConfigError::NotAnObject {
                    path: path.to_owned(),
                    reason: e.to_string(),
                });
            }
        },
    };
    let backup = backup_path(path);
    let record = Backup {
        pid: std::process::id(),
        original: original.as_deref().map(base64::encode),
        mode: Some(mode),
    };
    let record = serde_json::to_vec(&record)
        .map_err(|e| io_error("encode", &backup, io::Error::other(e)))?;
    write_atomic(&backup, &record, 0o600)?;

    let guard = McpConfigGuard {
        path: path.to_owned(),
        backup,
        original,
        mode,
        restored: false,
    };
    let servers = config
        .entry("mcpServers")
        .or_insert_with(|| Value::Object(Map::new()));
    if !servers.is_object() {
        *servers = Value::Object(Map::new());
    }
    if let Value::Object(servers) = servers {
        servers.insert(name.to_owned(), entry);
    }
    let mut text = serde_json::to_vec_pretty(&Value::Object(config))
        .map_err(|e| io_error("encode", path, io::Error::other(e)))?;
    text.push(b'\n');
    // On failure the guard restores (drops) what was there.
    write_atomic(path, &text, mode)?;
    Ok(guard)
}

impl McpConfigGuard {
    /// The config path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Puts the original back (or removes the file the runner created) and deletes the backup
    /// record. Idempotent. On failure the backup record is kept and the error says where it is.
    pub fn restore(&mut self) -> Result<(), ConfigError> {
        if self.restored {
            return Ok(());
        }
        put_back(&self.path, self.original.as_deref(), self.mode)?;
        remove_if_exists(&self.backup)?;
        self.restored = true;
        Ok(())
    }
}

impl Drop for McpConfigGuard {
    fn drop(&mut self) {
        if let Err(err) = self.restore() {
            eprintln!(
                "ac7: warning: failed to restore {}: {err}\n  The backup record is still at {} — the next ac7 run here restores it.",
                self.path.display(),
                self.backup.display()
            );
        }
    }
}

fn put_back(path: &Path, original: Option<&[u8]>, mode: u32) -> Result<(), ConfigError> {
    match original {
        Some(bytes) => write_atomic(path, bytes, mode),
        None => remove_if_exists(path),
    }
}

fn remove_if_exists(path: &Path) -> Result<(), ConfigError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_error("remove", path, e)),
        _ => Ok(()),
    }
}

fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ConfigError> {
    crate::sys::fsutil::write_atomic_mode(path, bytes, mode)
        .map_err(|source| io_error("write", path, source))
}

fn io_error(op: &'static str, path: &Path, source: io::Error) -> ConfigError {
    ConfigError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use serde_json::json;

    use super::*;

    fn entry() -> Value {
        json!({"command": "/bin/ac7", "args": ["mcp-bridge"], "env": {"AC7_RUNNER_SOCKET": "/tmp/s.sock"}})
    }

    #[test]
    fn merges_keeps_other_entries_and_restores_the_exact_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".mcp.json");
        let original = b"{\"mcpServers\":{\"other\":{\"command\":\"x\"}},  \"keep\": [1, 2]}";
        fs::write(&path, original).unwrap();
        let mut guard = install(&path, "ac7", entry()).unwrap();
        let merged: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(merged["mcpServers"]["other"], json!({"command": "x"}));
        assert_eq!(merged["mcpServers"]["ac7"], entry());
        assert_eq!(merged["keep"], json!([1, 2]));
        assert!(backup_path(&path).exists());
        guard.restore().unwrap();
        assert_eq!(fs::read(&path).unwrap(), original);
        assert!(!backup_path(&path).exists());
        guard.restore().unwrap();
        drop(guard);
        assert_eq!(fs::read(&path).unwrap(), original, "restore is idempotent");
    }

    #[test]
    fn the_merged_and_the_restored_file_keep_the_original_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".mcp.json");
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        for original in [0o644, 0o640, 0o666] {
            fs::write(&path, b"{}").unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(original)).unwrap();
            let mut guard = install(&path, "ac7", entry()).unwrap();
            assert_eq!(mode(&path), original, "merged");
            assert_eq!(mode(&backup_path(&path)), 0o600, "the record stays private");
            guard.restore().unwrap();
            assert_eq!(mode(&path), original, "restored");

            // After kill -9 the next runner restores the mode too.
            let guard = install(&path, "ac7", entry()).unwrap();
            std::mem::forget(guard);
            let record: Value =
                serde_json::from_slice(&fs::read(backup_path(&path)).unwrap()).unwrap();
            let mut record = record.as_object().unwrap().clone();
            record.insert("pid".into(), json!(u32::MAX));
            fs::write(backup_path(&path), serde_json::to_vec(&record).unwrap()).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
            assert_eq!(recover_stale(&path).unwrap(), Some(u32::MAX));
            assert_eq!(mode(&path), original, "recovered");
            assert_eq!(fs::read(&path).unwrap(), b"{}");
        }
        // A config the runner creates is private.
        fs::remove_file(&path).unwrap();
        let guard = install(&path, "ac7", entry()).unwrap();
        assert_eq!(mode(&path), 0o600);
        drop(guard);
    }

    #[test]
    fn a_created_file_is_removed_and_drop_restores() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".mcp.json");
        {
            let _guard = install(&path, "ac7", entry()).unwrap();
            assert!(path.exists());
        }
        assert!(!path.exists());
        assert!(!backup_path(&path).exists());
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            0,
            "no temp files left"
        );
    }

    #[test]
    fn refuses_a_file_that_is_not_an_object() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".mcp.json");
        for bad in ["[1]", "{oops"] {
            fs::write(&path, bad).unwrap();
            let err = install(&path, "ac7", entry()).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("refusing to modify {}", path.display())),
                "{err}"
            );
            assert_eq!(fs::read(&path).unwrap(), bad.as_bytes(), "left untouched");
            assert!(!backup_path(&path).exists());
        }
    }

    #[test]
    fn a_record_left_by_a_dead_runner_is_restored_and_a_live_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".mcp.json");
        fs::write(&path, b"{\"a\":1}").unwrap();
        let guard = install(&path, "ac7", entry()).unwrap();
        // Simulate kill -9: the guard never runs.
        std::mem::forget(guard);
        // Pretend the record belongs to a dead pid.
        let record = json!({"pid": u32::MAX, "original": base64::encode(b"{\"a\":1}")});
        fs::write(backup_path(&path), serde_json::to_vec(&record).unwrap()).unwrap();
        assert_eq!(recover_stale(&path).unwrap(), Some(u32::MAX));
        assert_eq!(fs::read(&path).unwrap(), b"{\"a\":1}");

        // A live runner (this test process's parent stands in for it) keeps its config.
        let live = json!({"pid": std::os::unix::process::parent_id(), "original": null});
        fs::write(backup_path(&path), serde_json::to_vec(&live).unwrap()).unwrap();
        assert!(matches!(
            install(&path, "ac7", entry()),
            Err(ConfigError::InUse { .. })
        ));
    }
}
