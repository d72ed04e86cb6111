//! `ac7 quickstart`: a throw-away team to try ac7 with, no API key needed.
//!
//! It creates a private temporary directory (mode 0700) holding the database, creates a team of
//! two — `director` (you, an admin) and `builder` — serves the broker on a free loopback port,
//! and runs `builder` as a stand-in agent: `ac7 run -- ac7 demo-agent`, which answers every
//! direct message through the real runner and bridge (see [`demo_agent`]). Once `builder`
//! is connected it prints the URL, the director's token and the commands to talk to it, then
//! runs until Ctrl-C / SIGTERM, when it stops the agent and the broker, removes the directory
//! and exits 0.

pub mod demo_agent;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::broker::bootstrap::bootstrap;
use crate::broker::config::{MemberSection, TeamConfig, TeamSection};
use crate::broker::db::{Store, SyncMode};
use crate::broker::first_run::{self, Credential};
use crate::broker::team::Role;
use crate::broker::{self, BrokerConfig};
use crate::sys::unix_socket::PrivateDir;

/// How long the stand-in agent has to join the team.
const AGENT_JOIN_TIMEOUT: Duration = Duration::from_secs(30);

/// `ac7 quickstart`.
#[derive(Debug, clap::Args)]
pub struct QuickstartArgs {
    /// Loopback port for the broker (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
}

fn member(name: &str, title: &str, instructions: &str, permissions: &[&str]) -> MemberSection {
    MemberSection {
        name: name.into(),
        role: Role {
            title: title.into(),
            description: String::new(),
        },
        instructions: instructions.into(),
        permissions: permissions.iter().map(|p| (*p).to_owned()).collect(),
    }
}

fn demo_team() -> TeamConfig {
    TeamConfig {
        team: TeamSection {
            name: "quickstart".into(),
            directive: "Show a new user how a message reaches an agent.".into(),
            context: String::new(),
            permission_presets: Default::default(),
        },
        members: vec![
            member("director", "director", "", &["admin"]),
            member("builder", "demo agent", "Answer every direct message.", &[]),
        ],
    }
}

/// Runs `ac7 quickstart`; returns the exit code.
#[allow(clippy::print_stdout)]
pub fn quickstart(args: QuickstartArgs) -> anyhow::Result<i32> {
    let dir = PrivateDir::create(&std::env::temp_dir())
        .context("creating the quickstart's temporary directory")?;
    let db = dir.path.join("ac7.db");
    let agent_dir = dir.path.join("builder");
    std::fs::create_dir(&agent_dir)?;
    let creds = {
        let store = Store::open(&db, SyncMode::Normal)?;
        let issued = bootstrap(&store, &demo_team())?;
        first_run::credentials(&store, &issued)?
    };
    let (director, builder) = first_run::cast(&creds).context("the demo team has no members")?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let code = runtime.block_on(serve(
        args.port, &dir.path, &db, &agent_dir, director, builder,
    ))?;
    drop(runtime);
    drop(dir);
    Ok(code)
}

#[allow(clippy::print_stdout)]
async fn serve(
    port: u16,
    dir: &Path,
    db: &Path,
    agent_dir: &Path,
    director: &Credential,
    builder: &Credential,
) -> anyhow::Result<i32> {
    use tokio::signal::unix::{SignalKind, signal};
    // Signals first: a Ctrl-C from here on is an orderly stop.
    let (mut int, mut term) = (
        signal(SignalKind::interrupt())?,
        signal(SignalKind::terminate())?,
    );
    let listener = tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .await
        .with_context(|| format!("cannot listen on 127.0.0.1:{port}"))?;
    let running = broker::start(BrokerConfig::new(db.to_owned()), listener).await?;
    let url = first_run::client_url(running.addr);
    let mut agent = spawn_agent(&url, &builder.token, agent_dir)?;

    let joined = tokio::select! {
        joined = wait_until_connected(&url, &director.token, &builder.name) => joined,
        status = agent.wait() => Err(anyhow::anyhow!("the demo agent exited early ({})", status?)),
        _ = int.recv() => Ok(false),
        _ = term.recv() => Ok(false),
    };
    let code = match joined {
        Ok(true) => {
            println!("ac7 quickstart: a throw-away team in {}", dir.display());
            println!("broker: {url}");
            println!(
                "{}: a demo agent (`ac7 run -- ac7 demo-agent`) that answers direct messages",
                builder.name
            );
            println!(
                "{} (you, an admin) token: {}",
                director.name, director.token
            );
            match &running.setup_code {
                Some(code) => print!("web app: {}", first_run::setup_text(&url, code)),
                None => println!("web app: {url}/"),
            }
            println!("talk to {} from another terminal:", builder.name);
            print!(
                "{}",
                first_run::talk_commands(&url, director, &builder.name)
            );
            println!("Ctrl-C stops the team and removes its files.");
            tokio::select! {
                _ = int.recv() => 0,
                _ = term.recv() => 0,
                status = agent.wait() => {
                    eprintln!("ac7 quickstart: the demo agent exited ({})", status?);
                    1
                }
            }
        }
        Ok(false) => 0,
        Err(err) => {
            eprintln!("ac7 quickstart: {err:#}");
            1
        }
    };
    stop_agent(&mut agent).await;
    running.shutdown().await?;
    Ok(code)
}

/// `ac7 run --url URL -- ac7 demo-agent` as `builder`, in its own process group so that a
/// terminal's Ctrl-C reaches only us (we stop it in order).
fn spawn_agent(url: &str, token: &str, cwd: &Path) -> anyhow::Result<tokio::process::Child> {
    let exe = std::env::current_exe().context("locating the ac7 binary")?;
    let mut cmd = tokio::process::Command::new(&exe);
    cmd.arg("run")
        .arg("--url")
        .arg(url)
        .arg("--")
        .arg(&exe)
        .arg("demo-agent")
        .env("AC7_TOKEN", token)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .process_group(0);
    if std::env::var_os(crate::logging::LOG_ENV).is_none() {
        cmd.env(crate::logging::LOG_ENV, "warn");
    }
    cmd.spawn()
        .with_context(|| format!("starting {} run", exe.display()))
}

/// Polls `/roster` until `name` has a live stream.
async fn wait_until_connected(url: &str, token: &str, name: &str) -> anyhow::Result<bool> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let deadline = Instant::now() + AGENT_JOIN_TIMEOUT;
    loop {
        let roster: Option<Value> = match http
            .get(format!("{url}/roster"))
            .bearer_auth(token)
            .send()
            .await
        {
            Ok(resp) if resp.status().is_success() => resp.json().await.ok(),
            _ => None,
        };
        let connected = roster
            .as_ref()
            .and_then(|r| r.get("connected"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|p| {
                p.get("name").and_then(Value::as_str) == Some(name)
                    && p.get("connected").and_then(Value::as_u64).unwrap_or(0) > 0
            });
        if connected {
            return Ok(true);
        }
        if Instant::now() > deadline {
            bail!(
                "the demo agent did not join within {}s",
                AGENT_JOIN_TIMEOUT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGTERM to the runner (it stops the agent and restores its config), SIGKILL after 5 s.
async fn stop_agent(agent: &mut tokio::process::Child) {
    if let Some(pid) = agent
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    if tokio::time::timeout(Duration::from_secs(5), agent.wait())
        .await
        .is_err()
    {
        let _ = agent.kill().await;
    }
}
