//! Claude Code's settings files, as far as the runner reads them: the `env` blocks Claude Code
//! puts into its own environment at start, and its managed settings.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Where Claude Code reads its managed settings on Linux.
pub(crate) const MANAGED_SETTINGS_DIR: &str = "/etc/claude-code";

/// What the runner reads of Claude Code's settings: the `env` blocks Claude Code puts into its
/// environment at start (global config, user, project, local and managed settings), and the
/// managed settings' `channelsEnabled`.
#[derive(Debug, Default)]
pub(crate) struct ClaudeSettings {
    /// (file, its `env` object) for each settings file that has one.
    pub(crate) env: Vec<(PathBuf, serde_json::Map<String, Value>)>,
    /// The managed settings files found.
    pub(crate) managed: Vec<PathBuf>,
    /// `channelsEnabled` in the managed settings (the last file's that has it).
    pub(crate) channels_enabled: Option<Value>,
}

impl ClaudeSettings {
    /// The settings files of the user and of this directory: the global config
    /// (`$CLAUDE_CONFIG_DIR/.claude.json`, else `~/.claude.json`), `$CLAUDE_CONFIG_DIR` (else
    /// `~/.claude`)`/settings.json`, `.claude/settings.json` and `.claude/settings.local.json`.
    pub(crate) fn files() -> Vec<PathBuf> {
        let config_dir = std::env::var_os("CLAUDE_CONFIG_DIR").filter(|v| !v.is_empty());
        let home = std::env::var_os("HOME").filter(|v| !v.is_empty());
        let mut files = Vec::new();
        match (&config_dir, &home) {
            (Some(dir), _) => {
                files.push(Path::new(dir).join(".claude.json"));
                files.push(Path::new(dir).join("settings.json"));
            }
            (None, Some(home)) => {
                files.push(Path::new(home).join(".claude.json"));
                files.push(Path::new(home).join(".claude/settings.json"));
            }
            (None, None) => {}
        }
        files.push(".claude/settings.json".into());
        files.push(".claude/settings.local.json".into());
        files
    }

    /// Reads the settings `files` ([`ClaudeSettings::files`]) and the managed settings in
    /// `managed_dir` (`managed-settings.json`, then `managed-settings.d/*.json` in name order).
    /// Files that are missing or do not parse are skipped.
    pub(crate) fn read(files: &[PathBuf], managed_dir: &Path) -> Self {
        let mut managed = vec![managed_dir.join("managed-settings.json")];
        if let Ok(entries) = std::fs::read_dir(managed_dir.join("managed-settings.d")) {
            let mut more: Vec<_> = entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.extension().is_some_and(|e| e == "json")
                        && !p
                            .file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
                })
                .collect();
            more.sort();
            managed.extend(more);
        }
        let read = |path: &Path| -> Option<serde_json::Map<String, Value>> {
            let text = std::fs::read(path).ok()?;
            match serde_json::from_slice(&text) {
                Ok(Value::Object(map)) => Some(map),
                _ => None,
            }
        };
        let mut settings = Self::default();
        for path in files.iter().chain(&managed) {
            let Some(mut map) = read(path) else {
                continue;
            };
            if managed.contains(path) {
                settings.managed.push(path.clone());
                if let Some(enabled) = map.remove("channelsEnabled") {
                    settings.channels_enabled = Some(enabled);
                }
            }
            if let Some(Value::Object(env)) = map.remove("env") {
                settings.env.push((path.clone(), env));
            }
        }
        settings
    }
}

impl ClaudeSettings {
    /// The values `name` is given in the `env` of Claude Code's settings, with the file each is
    /// in (in the order Claude Code applies them: the last one wins there).
    pub(crate) fn env_values(&self, name: &str) -> Vec<(&Path, String)> {
        self.env
            .iter()
            .filter_map(|(path, vars)| match vars.get(name)? {
                Value::String(v) if !v.is_empty() => Some((path.as_path(), v.clone())),
                _ => None,
            })
            .collect()
    }
}
