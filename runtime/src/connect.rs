//! `ac7 connect --url URL`: device-code enrollment from a terminal; and `ac7 logout`.
//!
//! Flow: `POST /enroll {labelHint}` (the host name, or `--label`); print the verification URL
//! (the broker's `/enroll?code=…`) and the user code; poll `POST /enroll/poll` every `interval`
//! seconds (`slow_down` adds 5 s) until a `members.manage` holder approves or rejects in the web
//! app, the enrollment expires, or Ctrl-C / SIGTERM cancels — then nothing is saved. Network or
//! unexpected answers while polling are reported and retried.
//!
//! The token is saved in the store of [`crate::client::tokens`], which every verb that talks
//! to a broker reads.

use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};

use crate::client::tokens::{self, resolve_token_any};
use crate::client::{DEFAULT_URL, broker_url, cannot_reach};

/// `ac7 connect`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// The broker's URL.
    #[arg(long, env = "AC7_URL", default_value = DEFAULT_URL, value_parser = broker_url)]
    pub url: String,
    /// What the approver sees this device as (default: the host name).
    #[arg(long)]
    pub label: Option<String>,
    /// Print the token instead of saving it.
    #[arg(long)]
    pub no_write: bool,
}

/// `ac7 logout`.
#[derive(Debug, clap::Args)]
pub struct LogoutArgs {
    /// The broker whose stored token to forget (repeatable; AC7_URL, comma-separated).
    #[arg(
        long,
        env = "AC7_URL",
        default_value = DEFAULT_URL,
        value_parser = broker_url,
        value_delimiter = ',',
        action = clap::ArgAction::Append
    )]
    pub url: Vec<String>,
}

/// `ac7 logout`: forgets the token `ac7 connect` stored for each URL (the token itself stays
/// valid until an admin rotates it: `ac7 member rotate-token NAME`).
#[allow(clippy::print_stdout)]
pub fn logout(args: LogoutArgs) -> anyhow::Result<i32> {
    let (path, forgot) = tokens::forget(&args.url)?;
    if forgot {
        println!(
            "forgot the token for {} ({}); it stays valid until rotated",
            args.url.join(", "),
            path.display()
        );
    } else {
        println!(
            "no token is stored for {} in {}",
            args.url.join(", "),
            path.display()
        );
    }
    Ok(0)
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
        let base = tokens::url_key(&args.url).to_owned();
        let http = crate::sys::tls_client::builder()?
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
            .map_err(|e| cannot_reach(&base, e))?;
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
                    let path = tokens::save(&base, &token, &member)?;
                    println!("saved to: {}", path.display());
                }
                println!("next: ac7 roster --url {base}   (or ac7 claude-code / ac7 codex with --url {base})");
                Ok(0)
            }
        }
    })
}

/// Before a runner (`ac7 claude-code`, `codex`, `run`) starts: when no token resolves for its
/// URL and a person is at the terminal, offers to run `ac7 connect` now. Elsewhere it does
/// nothing, and the runner's own error names the command to run. The error is `ac7 connect`'s
/// when it failed (the runner starts anyway and says what it lacks).
#[allow(clippy::print_stderr)]
pub fn offer_connect(given: Option<&str>, urls: &[String]) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    if resolve_token_any(given, urls).is_some()
        || !std::io::stdin().is_terminal()
        || !std::io::stderr().is_terminal()
    {
        return Ok(());
    }
    let url = urls.first().map_or(DEFAULT_URL, String::as_str).to_owned();
    eprint!(
        "ac7: no token for {url}. Connect this device now with `ac7 connect --url {url}` (an admin approves it)? [Y/n] "
    );
    let mut answer = String::new();
    if std::io::stdin().read_line(&mut answer).is_err() {
        return Ok(());
    }
    let answer = answer.trim();
    if !(answer.is_empty()
        || answer.eq_ignore_ascii_case("y")
        || answer.eq_ignore_ascii_case("yes"))
    {
        return Ok(());
    }
    let args = ConnectArgs {
        url,
        label: None,
        no_write: false,
    };
    connect(args).map(|_| ())
}
