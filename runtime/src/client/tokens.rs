//! The tokens `ac7 connect` stores, and which token a verb uses.
//!
//! Storage (our choice, written down): one file per user, `$XDG_CONFIG_HOME/ac7/auth.json`
//! (default `~/.config/ac7/auth.json`; `AC7_AUTH_FILE` overrides the path), not ac7's
//! `.ac7/auth.json` walked up from the working directory — a token is a credential of the user,
//! not of a checkout, and a file in a work tree ends up committed. The directory is created (or
//! tightened to) `0700` and the file is written atomically with mode `0600`:
//! `{"schema":1,"entries":[{"url","token","member","savedAt"}]}`, one entry per broker URL
//! (compared without a trailing `/`). A missing, unreadable or foreign-schema file reads as empty.
//!
//! Resolution, for every verb that talks to a broker (`ac7 push/roster/history/objectives/…`,
//! `ac7 claude-code`, `ac7 codex`, `ac7 run`): `--token` > `AC7_TOKEN` > the stored entry for the
//! verb's URL.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The schema version of the auth file.
const SCHEMA: u32 = 1;

#[derive(Debug, Default, Serialize, Deserialize)]
struct AuthFile {
    schema: u32,
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    url: String,
    token: String,
    #[serde(default)]
    member: String,
    #[serde(default)]
    saved_at: i64,
}

/// Where tokens are stored (see the module docs).
pub fn auth_file_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("AC7_AUTH_FILE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|p| !p.is_empty())
                .map(|h| PathBuf::from(h).join(".config"))
        })?;
    Some(base.join("ac7").join("auth.json"))
}

/// A URL as the store compares it: without a trailing `/`.
pub(crate) fn url_key(url: &str) -> &str {
    url.trim_end_matches('/')
}

fn read_file(path: &Path) -> AuthFile {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<AuthFile>(&b).ok())
        .filter(|f| f.schema == SCHEMA)
        .unwrap_or(AuthFile {
            schema: SCHEMA,
            entries: Vec::new(),
        })
}

/// The stored token for `url`, if any.
pub fn stored_token(url: &str) -> Option<String> {
    let path = auth_file_path()?;
    read_file(&path)
        .entries
        .into_iter()
        .find(|e| url_key(&e.url) == url_key(url))
        .map(|e| e.token)
        .filter(|t| !t.is_empty())
}

/// [`resolve_token`] for a list of replicas' URLs: the given token, else the first stored
/// entry for any of them.
pub fn resolve_token_any(given: Option<&str>, urls: &[String]) -> Option<String> {
    urls.iter().find_map(|url| resolve_token(given, url))
}

/// `--token` / `AC7_TOKEN` (clap merges them, the flag first), else the stored entry for `url`.
pub fn resolve_token(given: Option<&str>, url: &str) -> Option<String> {
    given
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .or_else(|| stored_token(url))
}

/// Saves `token` for `url` (replacing that URL's entry); returns the file's path.
pub(crate) fn save(url: &str, token: &str, member: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = auth_file_path().context(
        "cannot tell where to save the token: set XDG_CONFIG_HOME or HOME (or AC7_AUTH_FILE)",
    )?;
    let dir = path
        .parent()
        .context("the auth file path has no directory")?;
    // A folder made here is private (0700); one that exists keeps its mode: it may be shared
    // (AC7_AUTH_FILE in a project folder), and the file itself is 0600 either way.
    if !dir.is_dir() {
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make {} private (0700)", dir.display()))?;
    }
    let mut file = read_file(&path);
    file.entries.retain(|e| url_key(&e.url) != url_key(url));
    file.entries.push(Entry {
        url: url_key(url).to_owned(),
        token: token.to_owned(),
        member: member.to_owned(),
        saved_at: crate::sys::clock::now_ms(),
    });
    write_file(&path, &file)?;
    Ok(path)
}

/// Forgets the stored tokens of `urls`; returns the file's path and whether any was stored
/// (the file is written only then).
pub(crate) fn forget(urls: &[String]) -> anyhow::Result<(PathBuf, bool)> {
    let path = auth_file_path().context(
        "cannot tell where tokens are stored: set XDG_CONFIG_HOME or HOME (or AC7_AUTH_FILE)",
    )?;
    let mut file = read_file(&path);
    let before = file.entries.len();
    file.entries
        .retain(|e| !urls.iter().any(|u| url_key(u) == url_key(&e.url)));
    if file.entries.len() == before {
        return Ok((path, false));
    }
    write_file(&path, &file)?;
    Ok((path, true))
}

fn write_file(path: &Path, file: &AuthFile) -> anyhow::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(file)?;
    bytes.push(b'\n');
    crate::sys::fsutil::write_atomic_mode(path, &bytes, 0o600)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The error of a verb that found no token anywhere.
pub fn no_token(url: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "no token for {url}: pass --token, set AC7_TOKEN, or run `ac7 connect --url {url}` once"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_keys_ignore_a_trailing_slash() {
        assert_eq!(url_key("http://h:1/"), url_key("http://h:1"));
    }

    #[test]
    fn a_foreign_or_broken_file_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("auth.json");
        std::fs::write(&p, b"{not json").unwrap();
        assert!(read_file(&p).entries.is_empty());
        std::fs::write(&p, br#"{"schema":2,"entries":[{"url":"u","token":"t"}]}"#).unwrap();
        assert!(read_file(&p).entries.is_empty());
        std::fs::write(&p, br#"{"schema":1,"entries":[{"url":"u","token":"t"}]}"#).unwrap();
        assert_eq!(read_file(&p).entries.len(), 1);
    }
}
