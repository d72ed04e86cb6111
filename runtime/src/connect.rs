//! `ac7 connect --url URL`: device-code enrollment from a terminal, and the stored tokens every
//! verb falls back to.
//!
//! Flow: `POST /enroll {labelHint}` (the host name, or `--label`); print the verification URL
//! (the broker's `/enroll?code=…`) and the user code; poll `POST /enroll/poll` every `interval`
//! seconds (`slow_down` adds 5 s) until a `members.manage` holder approves or rejects in the web
//! app, the enrollment expires, or Ctrl-C / SIGTERM cancels — then nothing is saved. Network or
//! unexpected answers while polling are reported and retried.
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
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// `ac7 connect`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// The broker's URL.
    #[arg(long, env = "AC7_URL", default_value = crate::runner::DEFAULT_URL, value_parser = crate::cli::broker_url)]
    pub url: String,
    /// What the approver sees this device as (default: the host name).
    #[arg(long)]
    pub label: Option<String>,
    /// Print the token instead of saving it.
    #[arg(long)]
    pub no_write: bool,
}

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

fn url_key(url: &str) -> &str {
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
fn save(url: &str, token: &str, member: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = auth_file_path().context(
        "cannot tell where to save the token: set XDG_CONFIG_HOME or HOME (or AC7_AUTH_FILE)",
    )?;
    let dir = path
        .parent()
        .context("the auth file path has no directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot make {} private (0700)", dir.display()))?;
    let mut file = read_file(&path);
    file.entries.retain(|e| url_key(&e.url) != url_key(url));
    file.entries.push(Entry {
        url: url_key(url).to_owned(),
        token: token.to_owned(),
        member: member.to_owned(),
        saved_at: crate::clock::now_ms(),
    });
    let mut bytes = serde_json::to_vec_pretty(&file)?;
    bytes.push(b'\n');
    crate::fsutil::write_atomic_mode(&path, &bytes, 0o600)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

fn host_label() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .map(|h| h.trim().chars().take(64).collect::<String>())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "connected device".to_owned())
}

/// How a poll ended.
enum Polled {
    Approved { token: String, member: String },
    Failed(String),
}

/// Runs `ac7 connect`; the exit code (0 saved, 2 refused/expired/failed, 130 cancelled).
#[allow(clippy::print_stdout, clippy::print_stderr)]
pub fn connect(args: ConnectArgs) -> anyhow::Result<i32> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let base = url_key(&args.url).to_owned();
        let http = crate::tls_client::builder()?
            .timeout(Duration::from_secs(30))
            .build()?;
        let label = args
            .label
            .clone()
            .map(|l| l.chars().take(64).collect::<String>())
            .unwrap_or_else(host_label);
        let resp = http
            .post(format!("{base}/enroll"))
            .json(&json!({"labelHint": label}))
            .send()
            .await
            .map_err(|e| crate::operator::cannot_reach(&base, e))?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let why = body["error"].as_str().unwrap_or("no reason given");
            eprintln!("ac7 connect: the broker refused to start an enrollment (HTTP {status}): {why}");
            return Ok(2);
        }
        let (Some(device), Some(user)) = (body["deviceCode"].as_str(), body["userCode"].as_str())
        else {
            eprintln!("ac7 connect: the broker's answer has no deviceCode/userCode: {body}");
            return Ok(2);
        };
        let mut interval = body["interval"].as_u64().unwrap_or(5).max(1);
        let expires_in = body["expiresIn"].as_u64().unwrap_or(300);
        let visit = format!(
            "{base}{}",
            body["verificationUriComplete"]
                .as_str()
                .unwrap_or("/enroll")
        );
        // Handlers first, so a Ctrl-C right after the code is shown still cancels cleanly.
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        println!("to connect this device, open this page as a team admin and approve the code:");
        println!("  visit:  {visit}");
        println!("  code:   {user}");
        println!("  expires in {expires_in} s");
        println!("waiting for approval... (press Ctrl-C to cancel)");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(expires_in);
        let poll = async {
            loop {
                let wake = (tokio::time::Instant::now() + Duration::from_secs(interval)).min(deadline);
                tokio::time::sleep_until(wake).await;
                if tokio::time::Instant::now() >= deadline {
                    return Polled::Failed("the enrollment expired before anyone approved it; run ac7 connect again".into());
                }
                let sent = http
                    .post(format!("{base}/enroll/poll"))
                    .json(&json!({"deviceCode": device}))
                    .send()
                    .await;
                let resp = match sent {
                    Ok(r) => r,
                    Err(e) => {
                        eprintln!("poll error (will retry): {e}");
                        continue;
                    }
                };
                let ok = resp.status().is_success();
                let code = resp.status();
                let body: Value = resp.json().await.unwrap_or(Value::Null);
                if ok {
                    let token = body["token"].as_str().unwrap_or("").to_owned();
                    let member = body["member"]["name"].as_str().unwrap_or("").to_owned();
                    if token.is_empty() {
                        return Polled::Failed(format!("the broker approved but sent no token: {body}"));
                    }
                    return Polled::Approved { token, member };
                }
                match body["error"].as_str().unwrap_or("") {
                    "authorization_pending" => {}
                    "slow_down" => interval += 5,
                    "expired_token" => {
                        return Polled::Failed("the enrollment expired (or the broker restarted); run ac7 connect again".into());
                    }
                    "access_denied" => {
                        let why = body["errorDescription"].as_str().unwrap_or("no reason given");
                        return Polled::Failed(format!("the enrollment was rejected: {why}"));
                    }
                    other => eprintln!("poll error (will retry): HTTP {code} {other}"),
                }
            }
        };
        let outcome = tokio::select! {
            o = poll => o,
            _ = int.recv() => {
                eprintln!("cancelled — no token saved.");
                return Ok(130);
            }
            _ = term.recv() => {
                eprintln!("cancelled — no token saved.");
                return Ok(130);
            }
        };
        match outcome {
            Polled::Failed(why) => {
                eprintln!("ac7 connect: {why}");
                Ok(2)
            }
            Polled::Approved { token, member } => {
                println!("approved: this device is now {member}");
                if args.no_write {
                    println!("token: {token}");
                } else {
                    let path = save(&base, &token, &member)?;
                    println!("saved to: {}", path.display());
                }
                println!("next: ac7 roster --url {base}   (or ac7 claude-code / ac7 codex with --url {base})");
                Ok(0)
            }
        }
    })
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
