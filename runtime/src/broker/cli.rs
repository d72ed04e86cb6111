//! `ac7 serve` and the offline `ac7 member …` administration.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use super::bootstrap::{self, AdminError, add_member, validate_member};
use super::config::{MemberSection, TeamConfig, TeamSection};
use super::datadir;
use super::db::{Store, StoreError, SyncMode};
use super::pg::PgConfig;
use super::team::{self, Role};
use super::{BrokerConfig, now_ms};

/// `ac7 serve`.
#[derive(Debug, Args)]
#[command(after_help = SERVE_CONFIG_HELP)]
pub struct ServeArgs {
    /// Read flags from this TOML file: the keys are the flags' names (`port = 8717`,
    /// `trust-proxy = true`, `member = ["a:lead:admin", "b"]`). The command line and the
    /// flags' environment variables win over the file.
    #[arg(long, env = "AC7_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The team's database: a SQLite file (created if missing), or a PostgreSQL URL
    /// (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?sslmode=…]`) that any number of `ac7 serve`
    /// replicas share.
    #[arg(long, default_value = "./ac7.db", env = "AC7_DB")]
    pub db: PathBuf,
    /// On PostgreSQL: connections each replica keeps at most.
    #[arg(long, value_name = "N")]
    pub db_pool_size: Option<usize>,
    /// On PostgreSQL: seconds one statement may run before the server cancels it.
    #[arg(long, value_name = "SECS")]
    pub db_statement_timeout: Option<u64>,
    /// On PostgreSQL: seconds to wait for a connection (TCP, TLS and sign-in).
    #[arg(long, value_name = "SECS")]
    pub db_connect_timeout: Option<u64>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", env = "AC7_HOST")]
    pub host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8717, env = "AC7_PORT")]
    pub port: u16,
    /// Team config (JSON) used to create the team when the database has none.
    #[arg(long)]
    pub team_config: Option<PathBuf>,
    /// Team name, to create a team from flags instead of a file.
    #[arg(long, requires = "directive")]
    pub team_name: Option<String>,
    /// Team directive (with --team-name).
    #[arg(long)]
    pub directive: Option<String>,
    /// Team context (with --team-name).
    #[arg(long, default_value = "")]
    pub context: String,
    /// A member, with --team-name: `NAME[:ROLE[:PERM,PERM…]]` (repeatable). Permissions may name presets (`admin`, `operator`).
    #[arg(long = "member", value_name = "NAME[:ROLE[:PERMS]]")]
    pub members: Vec<String>,
    /// Largest file accepted by `POST /fs/write`, in bytes (hard cap 1 GiB).
    #[arg(long, default_value_t = 25 * 1024 * 1024)]
    pub max_file_bytes: u64,
    /// `normal` survives a broker crash; `full` also fsyncs every commit (survives power loss).
    #[arg(long, value_enum, default_value_t = SyncMode::Normal)]
    pub sync: SyncMode,
    /// Messages a member may create per second, sustained (`/push`, objective changes and discussion); 0 = no limit.
    #[arg(long, default_value_t = 50, value_name = "N")]
    pub push_rate: u32,
    /// Messages a member may create at once before `--push-rate` applies.
    #[arg(long, default_value_t = 200, value_name = "N")]
    pub push_burst: u32,
    /// Bytes of files each member may own (its home, and files it wrote in objective folders); 0 = no quota.
    #[arg(long, default_value_t = 1024 * 1024 * 1024, value_name = "BYTES")]
    pub file_quota_bytes: u64,
    /// Delete messages and member activity older than N days (at start, then hourly); 0 = keep everything.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub retain_days: u32,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key).
    #[arg(long, requires = "tls_key", value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert", value_name = "PATH")]
    pub tls_key: Option<PathBuf>,
    /// Open connections at most; more are answered 503 and closed. Default: derived from the
    /// open-file limit, keeping descriptors free for the database, blobs and probes (at most 4096).
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Seconds a client has to send a complete request head once it started one.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub header_timeout: u64,
    /// Seconds a connection with no request in progress may stay silent.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub idle_timeout: u64,
    /// Seconds a write may make no progress (a client that stopped reading) before the connection is closed.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub write_timeout: u64,
    /// Bytes a live subscriber may have queued before it is disconnected (it resumes with Last-Event-ID).
    #[arg(long, default_value_t = 8 * 1024 * 1024, value_name = "BYTES")]
    pub subscriber_queue_bytes: usize,
    /// Live subscriptions (SSE or WebSocket) one member may hold at once; more get 429.
    #[arg(long, default_value_t = 32)]
    pub max_subscriptions: usize,
    /// Behind a reverse proxy: take the client address (sign-in and enrollment limits) from the
    /// first `X-Forwarded-For` entry and the scheme (CSRF origin check) from `X-Forwarded-Proto`.
    /// Only with a proxy that overwrites those headers: clients can set them.
    #[arg(long)]
    pub trust_proxy: bool,
    /// Seconds a device waits between enrollment polls (`ac7 connect`); hidden, for tests.
    #[arg(long, hide = true, default_value_t = 5)]
    pub enroll_interval: u64,
    /// The operator's contact that Web Push services are given with each notification
    /// (`mailto:` or `https:` URL), so they can reach whoever runs the broker.
    #[arg(long, default_value = crate::broker::webpush::DEFAULT_SUBJECT, value_name = "URL")]
    pub push_subject: String,
    /// Let browsers register Web Push endpoints on plain http and on loopback, private,
    /// link-local or other non-public addresses: only for a push service inside your own
    /// network. Without it an endpoint must be https and the broker connects only to public
    /// addresses (checked on the resolved address at each connection, so a name that resolves
    /// to a private address is refused too): a member cannot make the broker send requests
    /// into its own network.
    #[arg(long)]
    pub push_private_network: bool,
}

/// The config file's place among the sources of a setting.
const SERVE_CONFIG_HELP: &str = "Each setting comes from, first match: the flag, its environment \
variable (AC7_DB, AC7_HOST, AC7_PORT), the --config file (AC7_CONFIG), the default. \
Relative paths are taken from the working directory, in the file as on the command line.";

fn parse_member_flag(spec: &str) -> anyhow::Result<MemberSection> {
    let mut parts = spec.splitn(3, ':');
    let name = parts.next().unwrap_or_default().to_owned();
    let title = parts
        .next()
        .filter(|t| !t.is_empty())
        .unwrap_or("member")
        .to_owned();
    let permissions = parts
        .next()
        .map(|p| {
            p.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    if name.is_empty() {
        bail!("--member {spec:?}: the name is missing (expected NAME[:ROLE[:PERMS]])");
    }
    Ok(MemberSection {
        name,
        role: Role {
            title,
            description: String::new(),
        },
        instructions: String::new(),
        permissions,
    })
}

fn team_config_from(args: &ServeArgs) -> anyhow::Result<Option<TeamConfig>> {
    if let Some(path) = &args.team_config {
        return Ok(Some(TeamConfig::load(path)?));
    }
    let Some(name) = &args.team_name else {
        return Ok(None);
    };
    if args.members.is_empty() {
        bail!("--team-name needs at least one --member NAME[:ROLE[:PERMS]]");
    }
    Ok(Some(TeamConfig {
        team: TeamSection {
            name: name.clone(),
            directive: args.directive.clone().unwrap_or_default(),
            context: args.context.clone(),
            permission_presets: Default::default(),
        },
        members: args
            .members
            .iter()
            .map(|m| parse_member_flag(m))
            .collect::<anyhow::Result<_>>()?,
    }))
}

/// Applies the TLS, connection and subscriber flags to `config`.
fn connection_settings(args: &ServeArgs, config: &mut BrokerConfig) -> anyhow::Result<()> {
    use std::time::Duration;
    for (flag, secs) in [
        ("--header-timeout", args.header_timeout),
        ("--idle-timeout", args.idle_timeout),
        ("--write-timeout", args.write_timeout),
    ] {
        if secs == 0 {
            bail!("{flag} must be at least 1 second");
        }
    }
    if args.max_connections == Some(0) || args.max_subscriptions == 0 {
        bail!("--max-connections and --max-subscriptions must be at least 1");
    }
    config.limits = super::server::Limits {
        header_timeout: Duration::from_secs(args.header_timeout),
        idle_timeout: Duration::from_secs(args.idle_timeout),
        write_timeout: Duration::from_secs(args.write_timeout),
        max_connections: connection_cap(args.max_connections),
    };
    config.queue_bytes = args.subscriber_queue_bytes;
    config.max_subscriptions_per_member = args.max_subscriptions;
    config.trust_proxy = args.trust_proxy;
    if args.enroll_interval == 0 {
        bail!("--enroll-interval must be at least 1");
    }
    config.enroll.interval = args.enroll_interval;
    if !(args.push_subject.starts_with("mailto:") || args.push_subject.starts_with("https://")) {
        bail!(
            "--push-subject must be a mailto: or https: URL, got {:?}",
            args.push_subject
        );
    }
    config.push_subject = args.push_subject.clone();
    config.push_private_network = args.push_private_network;
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let files = super::server::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        };
        // Refuse unusable files before anything is created.
        super::server::tls_acceptor(&files)?;
        config.tls = Some(files);
    }
    Ok(())
}

/// The connection cap: `--max-connections`, else derived from the open-file limit (raised to
/// its hard limit first). Each connection is a file descriptor: a cap past the limit leaves
/// the connections over it (a `/healthz` probe too) waiting unanswered at accept instead of
/// getting the cap's `503`.
fn connection_cap(explicit: Option<usize>) -> usize {
    use super::server::{FD_HEADROOM, default_max_connections};
    let fds = crate::sys::rlimit::raise_fd_limit();
    let Some(cap) = explicit else {
        let cap = default_max_connections(fds);
        tracing::info!(
            max_connections = cap,
            open_file_limit = fds,
            "connection cap {cap}, derived from the open-file limit (--max-connections sets it)"
        );
        return cap;
    };
    let needed = u64::try_from(cap)
        .unwrap_or(u64::MAX)
        .saturating_add(FD_HEADROOM);
    if let Some(fds) = fds
        && fds < needed
    {
        tracing::warn!(
            open_file_limit = fds,
            max_connections = cap,
            headroom = FD_HEADROOM,
            "--max-connections leaves no headroom under the open-file limit (it needs {FD_HEADROOM} more descriptors): at the cap, new connections and /healthz wait unanswered; raise `ulimit -n` or lower --max-connections"
        );
    }
    tracing::info!(
        max_connections = cap,
        open_file_limit = fds,
        "connection cap {cap} (--max-connections)"
    );
    cap
}

/// The loud warning for a broker reachable from other machines without TLS.
#[allow(clippy::print_stderr)]
fn warn_plaintext(addr: SocketAddr) {
    let line = "!".repeat(78);
    eprintln!(
        "{line}\n!! WARNING: ac7 serve is listening on {addr} (not loopback) WITHOUT TLS.\n!! Bearer tokens and every message cross the network in clear text.\n!! Serve HTTPS with --tls-cert CERT.pem --tls-key KEY.pem, or put a TLS proxy\n!! in front and bind --host 127.0.0.1.\n{line}"
    );
    tracing::warn!(%addr, "listening on a non-loopback address without TLS");
}

/// Runs `ac7 serve` until Ctrl-C / SIGTERM.
///
/// Order of a start: check the flags and the data directory, bind the listener,
/// then open (or create) the database and the team, then serve. A start that
/// fails removes every file it created, and prints tokens only once it serves.
#[allow(clippy::print_stdout)]
pub fn serve(args: ServeArgs) -> anyhow::Result<i32> {
    const HARD_CAP: u64 = 1024 * 1024 * 1024;
    if args.max_file_bytes > HARD_CAP {
        bail!("--max-file-bytes may be at most {HARD_CAP} (1 GiB)");
    }
    let postgres = match postgres_target(&args) {
        Ok(pg) => pg,
        Err(e) => return Ok(refuse(&e)),
    };
    if postgres.is_none() {
        datadir::check_data_dir(&args.db)?;
    }
    // TLS, connection and subscriber settings: checked (TLS files read) before anything is created.
    let mut settings = BrokerConfig::new(args.db.clone());
    settings.postgres = postgres.clone();
    connection_settings(&args, &mut settings)?;
    crate::sys::give_back_large_buffers();
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let addr: SocketAddr = format!("{}:{}", args.host, args.port)
            .parse()
            .or_else(|_| {
                std::net::ToSocketAddrs::to_socket_addrs(&(args.host.as_str(), args.port))
                    .map_err(anyhow::Error::from)
                    .and_then(|mut a| a.next().context("host resolved to no address"))
            })
            .with_context(|| format!("bad --host {}", args.host))?;
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!(
                "cannot listen on {addr} (is another broker running there? pick another --port)"
            )
        })?;
        let tls = settings.tls.is_some();
        if !tls && !addr.ip().is_loopback() {
            warn_plaintext(addr);
        }
        let created = postgres
            .is_none()
            .then(|| datadir::CreatedFiles::before_start(&args.db));
        let started = async {
            let issued = open_team(&args, postgres.as_ref())?;
            let mut config = settings;
            config.max_file_bytes = args.max_file_bytes;
            config.sync = args.sync;
            config.retain_days = (args.retain_days > 0).then_some(args.retain_days);
            config.file_quota_bytes = (args.file_quota_bytes > 0).then_some(args.file_quota_bytes);
            config.push_rate = (args.push_rate > 0).then_some(super::ratelimit::Rate {
                per_second: args.push_rate,
                burst: args.push_burst.max(1),
            });
            let broker = super::start(config, listener).await?;
            Ok::<_, anyhow::Error>((broker, issued))
        }
        .await;
        let (broker, issued) = match started {
            Ok(ok) => ok,
            Err(e) => {
                if let Some(created) = &created {
                    created.remove();
                }
                if postgres.is_some() && operator_fault(&e) {
                    return Ok(refuse(&e));
                }
                return Err(e);
            }
        };
        if let Some((team_name, creds)) = &issued {
            let place = match &postgres {
                Some(pg) => pg.redacted(),
                None => args.db.display().to_string(),
            };
            println!("created team '{team_name}' in {place}");
            println!("bearer tokens (shown once; only their SHA-256 is stored):");
            let width = creds.iter().map(|c| c.name.len()).max().unwrap_or(0);
            for c in creds {
                println!("  {:<width$}  {}", c.name, c.token);
            }
        }
        let scheme = if tls { "https" } else { "http" };
        println!("ac7 broker listening on {scheme}://{}", broker.addr);
        if let Some((_, creds)) = &issued {
            let mut url = super::first_run::client_url(broker.addr);
            if tls {
                url = url.replacen("http://", "https://", 1);
            }
            print!("{}", super::first_run::next_steps(&url, creds));
        }
        if let Some(code) = &broker.setup_code {
            let mut url = super::first_run::client_url(broker.addr);
            if tls {
                url = url.replacen("http://", "https://", 1);
            }
            // Part of the first-run text on stdout; on a later start (still nobody enrolled)
            // on stderr, beside the logs, so stdout stays the one listening line.
            if issued.is_some() {
                print!("{}", super::first_run::setup_text(&url, code));
            } else {
                #[allow(clippy::print_stderr)]
                {
                    eprint!("{}", super::first_run::setup_text(&url, code));
                }
            }
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        broker.shutdown_and_close().await?;
        Ok::<_, anyhow::Error>(0)
    })
}

/// `--db` as a PostgreSQL URL, with the `--db-*` settings applied; `None` for a SQLite file.
fn postgres_target(args: &ServeArgs) -> anyhow::Result<Option<PgConfig>> {
    let Some(url) = args
        .db
        .to_str()
        .filter(|s| s.starts_with("postgres://") || s.starts_with("postgresql://"))
    else {
        return Ok(None);
    };
    let mut config = PgConfig::parse(url)?;
    if let Some(n) = args.db_pool_size {
        if n == 0 {
            bail!("--db-pool-size must be at least 1");
        }
        config.pool_size = n;
    }
    if let Some(secs) = args.db_statement_timeout {
        config.statement_timeout = std::time::Duration::from_secs(secs);
    }
    if let Some(secs) = args.db_connect_timeout {
        config.connect_timeout = std::time::Duration::from_secs(secs.max(1));
    }
    Ok(Some(config))
}

/// Whether a failed start is the operator's to fix (the database URL, server, role,
/// database, TLS, schema version): one line and exit 2.
fn operator_fault(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause.downcast_ref::<super::pg::PgError>().is_some()
            || matches!(
                cause.downcast_ref::<StoreError>(),
                Some(StoreError::Postgres(_))
            )
            || matches!(
                cause.downcast_ref::<super::StartError>(),
                Some(super::StartError::Store(StoreError::Postgres(_)))
            )
    })
}

/// Prints a refusal to start as one line; the exit code 2.
#[allow(clippy::print_stderr)]
fn refuse(e: &anyhow::Error) -> i32 {
    eprintln!("ac7: {e}");
    2
}

/// Opens the database and creates the team if it has none; returns the team's
/// name and the new members' credentials when it created one. A missing database
/// is created only when there is a team to put in it.
fn open_team(
    args: &ServeArgs,
    postgres: Option<&PgConfig>,
) -> anyhow::Result<Option<(String, Vec<super::first_run::Credential>)>> {
    let place = postgres.map_or_else(|| args.db.display().to_string(), PgConfig::redacted);
    let no_team = || {
        anyhow::anyhow!(
            "{place} has no team yet: pass --team-config FILE (JSON) or --team-name NAME --directive TEXT --member NAME[:ROLE[:PERMS]]"
        )
    };
    let (config, store) = match postgres {
        Some(pg) => (
            None,
            super::store::off_worker(|| Store::open_postgres(pg.clone()))?,
        ),
        None => {
            let config = if args.db.exists() {
                None
            } else {
                Some(team_config_from(args)?.ok_or_else(no_team)?)
            };
            let store = Store::open(&args.db, args.sync)
                .with_context(|| format!("opening database {}", args.db.display()))?;
            (config, store)
        }
    };
    let has_team = store.view(team::team_get)?.is_some();
    if has_team {
        if args.team_config.is_some() || args.team_name.is_some() {
            tracing::warn!("the database already has a team; ignoring --team-config/--team-name");
        }
        return Ok(None);
    }
    let config = match config {
        Some(c) => c,
        None => team_config_from(args)?.ok_or_else(no_team)?,
    };
    let issued = match bootstrap::bootstrap(&store, &config) {
        Ok(issued) => issued,
        // Replicas started at once on an empty database: one creates the team (and prints
        // its tokens), the others find it made and join.
        Err(e) if postgres.is_some() && store.view(team::team_get)?.is_some() => {
            tracing::info!(error = %e, "another replica created the team first; joining it");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let creds = super::first_run::credentials(&store, &issued)?;
    Ok(Some((config.team.name, creds)))
}

/// Member administration actions.
#[derive(Debug, Subcommand)]
pub enum MemberAction {
    /// List members (NAME, ROLE, PERMISSIONS; --json for everything).
    List,
    /// Add a member and print its token.
    Add(MemberFields),
    /// Change a member's role, instructions or permissions.
    Update(MemberFields),
    /// Remove a member (and revoke its tokens).
    Remove {
        /// Member name.
        name: String,
    },
    /// Revoke a member's tokens and print a new one (an admin's token, or the member's own).
    RotateToken {
        /// Member name.
        name: String,
    },
    /// List a member's tokens: ID, ORIGIN, LABEL, CREATED, LAST USED (an admin's token, or the
    /// member's own).
    Tokens {
        /// Member name.
        name: String,
    },
    /// Revoke one of a member's tokens (a lost device's) by the ID `ac7 member tokens` shows;
    /// its live streams close at once.
    RevokeToken {
        /// Member name.
        name: String,
        /// The token's id.
        id: String,
    },
}

/// Fields for `member add` / `member update`.
#[derive(Debug, Args)]
pub struct MemberFields {
    /// Member name.
    pub name: String,
    /// Role title.
    #[arg(long)]
    pub role: Option<String>,
    /// Role description.
    #[arg(long)]
    pub description: Option<String>,
    /// Private instructions.
    #[arg(long)]
    pub instructions: Option<String>,
    /// Comma-separated permissions or presets.
    #[arg(long, value_delimiter = ',')]
    pub permissions: Option<Vec<String>>,
}

/// `ac7 member …` offline, on the database file `db` (the broker stopped): the JSON that
/// `--json` prints (the broker's answer to the same request through the API).
pub fn member_offline(db: &Path, action: MemberAction) -> anyhow::Result<serde_json::Value> {
    if !db.exists() {
        bail!(
            "no database at {} (start `ac7 serve --db {0}` with a team config first)",
            db.display()
        );
    }
    let store = Store::open(db, SyncMode::Normal).map_err(|err| match err {
        StoreError::Busy(_) => anyhow::anyhow!(
            "{err}: while the broker runs, work through it: pass an admin's token (--token or \
             AC7_TOKEN, and --url)"
        ),
        other => other.into(),
    })?;
    if store.view(team::team_get)?.is_none() {
        bail!("the database has no team yet");
    }
    let now = now_ms();
    let value = match action {
        MemberAction::List => {
            let members = store.view(team::members_list)?;
            let value = serde_json::json!({
                "members": members.iter().map(team::MemberRecord::view).collect::<Vec<_>>()
            });
            value
        }
        MemberAction::Add(f) => {
            let role = Role {
                title: f.role.unwrap_or_else(|| "member".into()),
                description: f.description.unwrap_or_default(),
            };
            let instructions = f.instructions.unwrap_or_default();
            validate_member(&f.name, &role, &instructions).map_err(anyhow::Error::msg)?;
            let permissions = f.permissions.unwrap_or_default();
            let (record, issued) = store.tx(|c| -> Result<_, AdminError> {
                let record = bootstrap::new_member_record(
                    c,
                    &f.name,
                    &role,
                    &instructions,
                    &permissions,
                    &format!("member '{}'", f.name),
                )?;
                let issued = add_member(c, &record, None, now)?;
                Ok((record, issued))
            })?;
            serde_json::json!({"member": record.teammate(), "token": issued.token})
        }
        MemberAction::Update(f) => {
            let context = format!("member '{}'", f.name);
            let m = store.tx(|c| {
                bootstrap::update_member(
                    c,
                    &f.name,
                    |m| {
                        if let Some(t) = f.role {
                            m.role.title = t;
                        }
                        if let Some(d) = f.description {
                            m.role.description = d;
                        }
                        if let Some(i) = f.instructions {
                            m.instructions = i;
                        }
                    },
                    f.permissions.as_deref(),
                    &context,
                )
            })?;
            serde_json::to_value(m.view())?
        }
        MemberAction::Remove { name } => {
            store.tx(|c| bootstrap::remove_member_checked(c, &name, "ac7", now))?;
            serde_json::json!({"removed": name})
        }
        MemberAction::RotateToken { name } => {
            let (token, info) = store.tx(|c| bootstrap::rotate_token(c, &name, None, now))?;
            serde_json::json!({"token": token, "tokenInfo": info})
        }
        MemberAction::Tokens { name } => {
            let tokens = store.view(|c| -> Result<_, AdminError> {
                if !team::member_exists(c, &name)? {
                    return Err(AdminError::NotFound(format!("no such member: {name}")));
                }
                Ok(team::tokens_list(c, &name)?)
            })?;
            serde_json::json!({ "tokens": tokens })
        }
        MemberAction::RevokeToken { name, id } => {
            store.tx(|c| bootstrap::revoke_token(c, &name, &id))?;
            serde_json::json!({"revoked": id, "member": name})
        }
    };
    Ok(value)
}

/// `ac7 prune`: offline retention against the database file.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// SQLite database file (the broker must be stopped).
    #[arg(long, default_value = "./ac7.db", env = "AC7_DB")]
    pub db: PathBuf,
    /// Delete messages and member activity older than this many days (at least 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub older_than_days: u32,
}

/// Runs `ac7 prune`: deletes old messages and activity (see [`super::retention`]).
#[allow(clippy::print_stdout)]
pub fn prune(args: PruneArgs) -> anyhow::Result<i32> {
    if !args.db.exists() {
        bail!("no database at {}", args.db.display());
    }
    let store = Store::open(&args.db, SyncMode::Normal)?;
    let cutoff = super::retention::cutoff(now_ms(), args.older_than_days);
    let n = super::retention::prune_all(&store, cutoff)?;
    println!(
        "pruned {n} row{} (messages and activity) older than {} days from {}",
        if n == 1 { "" } else { "s" },
        args.older_than_days,
        args.db.display()
    );
    Ok(0)
}
