//! `ac7 serve`: the broker.
//!
//! One process holds the team's state in an embedded SQLite file (WAL), or any
//! number of replicas share it in PostgreSQL ([`pg`], [`follower`], [`replica`]),
//! and serves the broker's HTTP API, with the live stream on `GET /subscribe` as
//! SSE (plain GET) or WebSocket (upgrade request).
//!
//! Layout: [`db`] opens the file; [`team`], [`messages`], [`channels`],
//! [`objectives`] and [`fs`] are the store per concern; [`hub`] is the
//! in-process fanout; `http` holds the routes; [`bootstrap`] creates a team
//! from a [`config::TeamConfig`]; [`cli`] holds the `serve` and `member` commands.
//!
//! # Behaviour worth knowing
//!
//! - **Ordering.** A push is logged and fanned out under the one store lock, so
//!   every subscriber sees messages in log order; `Last-Event-ID` replay and the
//!   live tail join without a gap or a duplicate.
//! - **Replay.** `Last-Event-ID` header, or `lastEventId` query parameter (SSE and
//!   WebSocket). At most 1,000 messages, the newest ones; an unknown id replays nothing.
//! - **Slow subscribers.** Each has a queue of at most 1,024 frames and 8 MiB
//!   (`--subscriber-queue-bytes`); past either the subscriber is dropped and its
//!   queue freed (SSE stream ends; WebSocket closes with 1013), and the client
//!   reconnects with `Last-Event-ID`. A client that stops reading is also cut by
//!   the write timeout (see [`server`]). A member holds at most 32 live
//!   subscriptions (`--max-subscriptions`; 429 past it).
//! - **Connections.** Header, idle and write timeouts, a connection cap, and
//!   optional TLS: see [`server`].
//! - **Keepalive.** SSE `:` comment, WebSocket ping, every 15 s.
//! - **Reserved `data` keys** (`from`, `ts`, `msg_id`, `level`, `title`, `target`,
//!   `ts_ms`) are stripped on `/push`. `data.thread` must be absent, `chan:<id>` or
//!   `obj:<id>` (400 otherwise); posting to a channel needs membership, to an
//!   objective thread needs thread membership (403).
//! - **Visibility.** `/history`, replay and live fanout share one rule
//!   (`ac7_protocol::domain::message::matches_viewer`): DMs to their two parties, general
//!   to all, channel posts to members, objective threads to thread members; a
//!   sender always sees their own messages. (The TypeScript ac7's default feed shows
//!   channel and objective posts to everyone; ours does not.)
//! - **Attachment grants** go to the message's audience (DM recipient, channel
//!   members, objective thread members, or everyone for general), not to every
//!   member as the TypeScript ac7 does for channel posts.
//! - **Objectives.** `members.manage` holders may view any objective (they are
//!   implicit thread members); objective members may list `/objectives/<id>`.
//!   `objectives.reassign` or `members.manage` may reassign. Lifecycle pushes are
//!   committed with the change, then fanned out before the response is sent.
//! - **Files.** Content is stored once per SHA-256 in the blob directory beside
//!   the database (uploads are streamed there, never held in memory; see
//!   [`blobs`]); its reference count is written in the same transaction as the
//!   entry. Top-level directories (homes, `/objectives`) cannot be removed. A
//!   member's files count against its quota ([`fs::usage`]; 413 `quota_exceeded`).
//! - **Limits.** Message-creating requests are rate-limited per member
//!   ([`ratelimit`], 429 with `Retry-After`); messages older than
//!   `retain_days` are pruned ([`retention`]).
//! - **Tokens.** A resolved token is cached for 5 s (cleared at once by any
//!   member or token change over HTTP); `lastUsedAt` is accurate to that.
//!   Revoking a token (rotate, delete, member removal) ends the live streams
//!   opened with it at once (WebSocket close 1008). A permission change leaves
//!   streams open: what a stream delivers is decided per message, at push time.
//! - **Errors.** Unknown routes are 404 JSON, wrong methods 405 JSON, bodies over
//!   the cap 413 JSON, a body not received within 60 s 408 JSON. JSON keys of
//!   inner `data` maps come out sorted (key order carries no meaning). A `/history`
//!   `limit` that is not a number of at least 1 (`0`, `-1`, `abc`) is 400
//!   as on the activity list (a client asking for nothing gets told, not 100 messages).
//! - **Activity** uploaded by a member is redacted again at the broker
//!   (`ac7_protocol::trace::redact`), whoever uploaded it: the runner redacts what it
//!   records, a client posting directly may not.
//! - **Removing a member** frees its name; a member created under it later inherits none of
//!   the old one's DMs, activity, objectives, home folder or credentials (its incarnation: see
//!   [`team`]; what removal does: [`bootstrap::remove_member`]).
//! - **Sign-in.** Browser sessions (TOTP login, cookie, CSRF and security headers),
//!   first-admin setup and device-code enrollment: see [`sessions`] and `http::session`.
//! - **Not implemented:** the "session online" notice.

pub mod activity;
pub mod activity_blocks;
pub mod activity_follower;
pub mod attempts;
pub mod blobs;
pub mod bootstrap;
pub mod channels;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod cursors;
pub mod datadir;
pub mod db;
pub mod enrollments;
pub mod first_run;
pub mod follower;
pub mod fs;
mod http;
pub mod hub;
pub mod messages;
pub mod migrate_team;
pub mod notices;
pub mod objectives;
pub mod pg;
pub mod publish;
pub mod ratelimit;
pub mod replica;
mod repoll;
pub mod retention;
pub mod serve_config;
pub mod server;
pub mod sessions;
pub mod store;
pub mod team;
pub mod tokens;
mod wal_vfs;
mod web;
pub mod webpush;
pub mod writer;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

use db::{Store, StoreError, SyncMode};
use hub::Hub;

/// Runtime settings of a broker.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// SQLite file (unused when `postgres` is set).
    pub db_path: PathBuf,
    /// The team's database on PostgreSQL instead of the SQLite file (`--db postgres://…`).
    pub postgres: Option<pg::PgConfig>,
    /// How hard commits sync.
    pub sync: SyncMode,
    /// Largest file `POST /fs/write` accepts (bytes).
    pub max_file_bytes: u64,
    /// Largest JSON body (bytes).
    pub max_json_bytes: usize,
    /// SSE keepalive comment interval (also the WebSocket ping interval).
    pub keepalive: Duration,
    /// Frames a subscriber may have queued before it is disconnected.
    pub queue_capacity: usize,
    /// Per-member rate of message-creating requests (`None`: unlimited).
    pub push_rate: Option<ratelimit::Rate>,
    /// Bytes of files a member may own (`None`: unlimited); see [`fs::usage`].
    pub file_quota_bytes: Option<u64>,
    /// Days of messages to keep (`None`: all); see [`retention`].
    pub retain_days: Option<u32>,
    /// Bytes a subscriber may have queued before it is disconnected.
    pub queue_bytes: usize,
    /// Live subscriptions (SSE or WebSocket) one member may hold at once.
    pub max_subscriptions_per_member: usize,
    /// Connection limits and timeouts of the accept loop.
    pub limits: server::Limits,
    /// Serve HTTPS with this certificate chain and key (PEM files).
    pub tls: Option<server::TlsFiles>,
    /// How long a browser session lives after its last use ([`sessions::SESSION_TTL`]).
    pub session_ttl: Duration,
    /// Take the client address from `X-Forwarded-For` (first entry) instead of the socket
    /// peer: only behind a reverse proxy that sets it (`--trust-proxy`).
    pub trust_proxy: bool,
    /// Device-code enrollment timings and limits (`ac7 connect`).
    pub enroll: ac7_protocol::signin::enroll::EnrollConfig,
    /// The contact Web Push services are given in each request's VAPID claims (`mailto:` or
    /// `https:`; `--push-subject`).
    pub push_subject: String,
    /// Web Push endpoints may be plain http and on non-public addresses
    /// (`--push-private-network`); otherwise https to public addresses only.
    pub push_private_network: bool,
}

impl BrokerConfig {
    /// Defaults for a database path: 25 MiB files, 1 MiB JSON, 15 s keepalive, subscriber
    /// queues of 1024 frames and 8 MiB, 32 live subscriptions per member, the
    /// [`server::Limits`] defaults, plain HTTP, no rate limit, no file quota (`ac7 serve`
    /// sets its own defaults from its flags).
    pub fn new(db_path: PathBuf) -> BrokerConfig {
        BrokerConfig {
            db_path,
            postgres: None,
            sync: SyncMode::Normal,
            max_file_bytes: 25 * 1024 * 1024,
            max_json_bytes: 1024 * 1024,
            keepalive: Duration::from_secs(15),
            queue_capacity: 1024,
            push_rate: None,
            file_quota_bytes: None,
            retain_days: None,
            queue_bytes: 8 * 1024 * 1024,
            max_subscriptions_per_member: 32,
            limits: server::Limits::default(),
            tls: None,
            session_ttl: sessions::SESSION_TTL,
            trust_proxy: false,
            enroll: ac7_protocol::signin::enroll::EnrollConfig::default(),
            push_subject: webpush::DEFAULT_SUBJECT.to_owned(),
            push_private_network: false,
        }
    }
}

/// Why the broker could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The database could not be opened or read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The database has no team yet.
    #[error(
        "the database {0} has no team yet: start with --team-config FILE (or --team-name and --member) to create one"
    )]
    NoTeam(PathBuf),
    /// The listener could not be created.
    #[error("cannot listen: {0}")]
    Listen(#[from] std::io::Error),
    /// The TLS certificate or key could not be used.
    #[error(transparent)]
    Tls(#[from] server::TlsError),
    /// The team's stored Web Push key could not be used.
    #[error("web push: {0}")]
    Push(#[from] webpush::PushError),
}

/// Shared state of a running broker.
#[derive(Debug)]
pub struct AppState {
    /// The store.
    pub store: Store,
    /// The fanout hub.
    pub hub: Hub,
    /// Live activity streams, one entry per watched member (kept apart from `hub`:
    /// watching someone's activity is not presence).
    pub activity_hub: Hub,
    /// Settings.
    pub config: BrokerConfig,
    /// When this process started (epoch ms).
    pub boot_time: i64,
    objective_counter: AtomicU16,
    /// The group-commit writer for `/push`.
    pub(crate) writer: writer::Writer,
    auth_cache: std::sync::Mutex<std::collections::HashMap<String, CachedAuth>>,
    /// Per-member buckets for message-creating requests.
    pub(crate) push_limiter: ratelimit::Limiter,
    /// This process's sign-in counters (the limiter's keys live in the store: [`attempts`]).
    pub(crate) signin_stats: std::sync::Mutex<ac7_protocol::signin::limiter::SignInStats>,
    /// When the next device enrollment expires (epoch seconds), as this process last saw the
    /// enrollments; the expiry task sleeps until then ([`enrollments::spawn_expiry`]).
    pub(crate) enroll_next: tokio::sync::watch::Sender<Option<u64>>,
    /// On PostgreSQL: this replica's place in the shared log; live delivery follows it
    /// ([`follower`]). `None` on SQLite, where a commit delivers its own messages.
    pub follower: Option<follower::Follower>,
    /// On PostgreSQL: this replica's place in the shared activity table; live activity
    /// streams follow it ([`activity_follower`]). `None` on SQLite, where an upload delivers
    /// its own rows.
    pub activity_follower: Option<activity_follower::ActivityFollower>,
    /// On PostgreSQL: this replica's row and presence writer ([`replica`]).
    pub replica: Option<replica::Replica>,
    /// Delivery positions noted by live streams, not yet written ([`cursors`]).
    pub cursors: cursors::Cursors,
    /// Web Push: the team's VAPID key and the notification dispatcher ([`webpush`]).
    pub push: webpush::Dispatcher,
    /// The member list of the last roster read, kept while no member changes.
    pub members: team::MembersCache,
}

impl Drop for AppState {
    fn drop(&mut self) {
        // On PostgreSQL `db_path` is inside this process's private upload staging directory.
        if self.config.postgres.is_some() {
            let _ = std::fs::remove_dir_all(datadir::data_dir(&self.config.db_path));
        }
    }
}

/// A resolved bearer token, remembered for [`AUTH_CACHE_TTL`].
#[derive(Debug, Clone)]
pub(crate) struct CachedAuth {
    pub(crate) token_id: String,
    pub(crate) name: String,
    pub(crate) permissions: ac7_protocol::domain::permission::PermissionSet,
    at: std::time::Instant,
}

/// How long a resolved token is trusted without asking the store again. The HTTP
/// admin endpoints clear the cache at once; changes made offline with `ac7 member`
/// (which needs the broker stopped) cannot race it.
const AUTH_CACHE_TTL: Duration = Duration::from_secs(5);

/// How long a broker on PostgreSQL waits at start for its doorbell to listen before it serves.
const DOORBELL_WAIT: Duration = Duration::from_secs(5);

impl AppState {
    /// How `/push` commits were grouped so far (see [`writer`]).
    pub fn commit_stats(&self) -> writer::CommitStats {
        self.writer.stats()
    }

    /// The blob directory beside the database.
    pub fn blob_dir(&self) -> PathBuf {
        datadir::blob_dir(&self.config.db_path)
    }

    /// The cached resolution of a token hash, if fresh.
    pub(crate) fn cached_auth(&self, hash: &str) -> Option<CachedAuth> {
        let cache = self
            .auth_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        cache
            .get(hash)
            .filter(|c| c.at.elapsed() < AUTH_CACHE_TTL)
            .cloned()
    }

    /// Remembers a token resolution.
    pub(crate) fn remember_auth(
        &self,
        hash: String,
        token_id: String,
        name: String,
        permissions: ac7_protocol::domain::permission::PermissionSet,
    ) {
        let mut cache = self
            .auth_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(
            hash,
            CachedAuth {
                token_id,
                name,
                permissions,
                at: std::time::Instant::now(),
            },
        );
    }

    /// Forgets every cached token (after any member or token change).
    pub(crate) fn forget_auth(&self) {
        self.auth_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }

    /// A fresh objective id (unique in the store; the caller holds the store lock).
    pub(crate) fn next_objective_id(
        &self,
        c: &store::Conn<'_>,
        now: i64,
    ) -> Result<String, StoreError> {
        loop {
            let n = self
                .objective_counter
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1);
            let id = ac7_protocol::domain::objective::format_id(u64::try_from(now).unwrap_or(0), n);
            // Replicas may draw the same id in the same millisecond: the second to take the
            // id's lock sees the first's row once it commits, and draws again.
            if c.backend() == store::conn::Backend::Postgres {
                c.execute(
                    "SELECT pg_advisory_xact_lock(hashtext(?1)::bigint)",
                    crate::params![id],
                )?;
            }
            if !objectives::exists(c, &id)? {
                return Ok(id);
            }
        }
    }
}

pub use crate::sys::clock::{now_ms, now_secs};

/// A broker serving on a socket.
#[derive(Debug)]
pub struct RunningBroker {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The state (for tests and benchmarks).
    pub state: Arc<AppState>,
    /// The one-time first-admin setup code, when the team has no member who can sign in
    /// with TOTP yet (`ac7 serve` prints it as `/setup?code=…`).
    pub setup_code: Option<String>,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl RunningBroker {
    /// Stops accepting, closes live streams, and waits for the server task.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.state.hub.close_all();
        self.state.activity_hub.close_all();
        let result = self
            .task
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        let state = Arc::clone(&self.state);
        if let Err(e) = store::off_worker(|| state.cursors.flush(&state)) {
            tracing::warn!(error = %e, "cannot write the last delivery cursors");
        }
        result
    }

    /// [`shutdown`](Self::shutdown), then closes the database for good (SQLite: the WAL
    /// checkpointed, no `-wal`/`-shm` files left). For a process that exits next.
    pub async fn shutdown_and_close(self) -> std::io::Result<()> {
        let state = Arc::clone(&self.state);
        let result = self.shutdown().await;
        if let Err(e) = store::off_worker(|| state.store.close()) {
            tracing::warn!(error = %e, "cannot checkpoint the database at shutdown");
        }
        result
    }

    /// Waits until the server stops on its own (it only does on error).
    pub async fn wait(self) -> std::io::Result<()> {
        self.task
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    }
}

/// Opens the store (which must hold a team) and serves on `listener`.
pub async fn start(
    mut config: BrokerConfig,
    listener: TcpListener,
) -> Result<RunningBroker, StartError> {
    let store = match &config.postgres {
        Some(pg) => {
            let store = store::off_worker(|| Store::open_postgres(pg.clone()))?;
            // Uploads are staged (hashed while they arrive) in a private local directory of
            // this process; their contents then go to the database.
            let staging = std::env::temp_dir().join(format!(
                "ac7-staging-{}-{}",
                std::process::id(),
                now_ms()
            ));
            let made = std::os::unix::fs::DirBuilderExt::mode(
                std::fs::DirBuilder::new().recursive(true),
                0o700,
            )
            .create(&staging);
            made.map_err(|source| StoreError::File {
                what: format!(
                    "cannot create the upload staging directory {}",
                    staging.display()
                ),
                source,
            })?;
            config.db_path = staging.join("staging.db");
            datadir::prepare_blob_dir(&config.db_path).map_err(|source| StoreError::File {
                what: format!(
                    "cannot create {}",
                    datadir::blob_dir(&config.db_path).display()
                ),
                source,
            })?;
            store
        }
        None => {
            let store = Store::open(&config.db_path, config.sync)?;
            let blob_dir =
                datadir::prepare_blob_dir(&config.db_path).map_err(|source| StoreError::File {
                    what: format!(
                        "cannot create the blob directory {}",
                        datadir::blob_dir(&config.db_path).display()
                    ),
                    source,
                })?;
            store.tx(|c| blobs::recover(c, &blob_dir))?;
            store
        }
    };
    let boot_time = now_ms();
    let limits = hub::HubLimits {
        queue_frames: config.queue_capacity,
        queue_bytes: config.queue_bytes,
        per_member: config.max_subscriptions_per_member,
    };
    let hub = Hub::new(limits);
    let activity_hub = Hub::new(limits);
    let tls = config.tls.as_ref().map(server::tls_acceptor).transpose()?;
    let members = store.view(|c| -> Result<_, StartError> {
        if team::team_get(c)?.is_none() {
            return Err(StartError::NoTeam(config.db_path.clone()));
        }
        Ok(team::members_list(c)?)
    })?;
    let fresh =
        sessions::new_session_id().map_err(|e| StartError::Listen(std::io::Error::other(e)))?;
    let setup_code = store.tx(|c| sessions::setup_code_open(c, &fresh))?;
    for m in members {
        hub.register_member(&m.name, m.role, boot_time);
    }
    let (follower, activity_follower) = match &config.postgres {
        Some(_) => (
            Some(follower::Follower::new(store.view(messages::head)?)),
            Some(activity_follower::ActivityFollower::new(
                store.view(activity::last_id)?,
            )),
        ),
        None => (None, None),
    };
    let addr = listener.local_addr()?;
    let (replica, stream_ends) = match &config.postgres {
        Some(_) => {
            let (r, rx) = store.tx(|c| replica::register(c, &addr.to_string()))?;
            (Some(r), Some(rx))
        }
        None => (None, None),
    };
    let pkcs8 = store.tx(|c| webpush::vapid_ensure(c, now_ms()))?;
    let push_network = if config.push_private_network {
        webpush::Network::Private
    } else {
        webpush::Network::Public
    };
    let (push, push_queue) = webpush::dispatcher(&pkcs8, &config.push_subject, push_network)?;
    let (writer, queue) = writer::channel();
    let state = Arc::new(AppState {
        push,
        push_limiter: ratelimit::Limiter::new(config.push_rate),
        writer,
        store,
        hub,
        activity_hub,
        config,
        boot_time,
        // A random start, so replicas starting together do not walk the same ids.
        objective_counter: AtomicU16::new(
            u16::try_from(std::process::id() & 0xffff).unwrap_or(0) ^ (boot_time as u16),
        ),
        auth_cache: Default::default(),
        signin_stats: Default::default(),
        enroll_next: tokio::sync::watch::Sender::new(None),
        follower,
        activity_follower,
        replica,
        cursors: Default::default(),
        members: Default::default(),
    });
    if let Some(pg) = &state.config.postgres {
        // Serve once the doorbell listens, so that every browser notice rung from then on is
        // heard here; if it cannot listen yet, serve anyway after a while (it keeps trying,
        // and the log is read again whenever it comes back).
        let listening = follower::spawn_doorbell(&state, pg.clone());
        if tokio::time::timeout(DOORBELL_WAIT, listening)
            .await
            .is_err()
        {
            tracing::warn!(
                after_ms = DOORBELL_WAIT.as_millis(),
                "serving before the doorbell listens; live delivery from other replicas waits for it"
            );
        }
    }
    if let Some(rx) = stream_ends {
        replica::spawn(&state, addr.to_string(), rx);
    }
    sessions::spawn_purge(&state);
    cursors::spawn(&state);
    enrollments::spawn_expiry(&state);
    writer::spawn(queue, Arc::downgrade(&state))?;
    webpush::spawn(push_queue, Arc::downgrade(&state), push_network);
    if let Some(days) = state.config.retain_days {
        retention::spawn(&state, days);
    }
    web::warm();
    let app = http::router(Arc::clone(&state));
    let (tx, rx) = oneshot::channel::<()>();
    let limits = state.config.limits.clone();
    let task = tokio::spawn(server::serve(listener, app, tls, limits, async move {
        let _ = rx.await;
    }));
    tracing::info!(%addr, tls = state.config.tls.is_some(), "ac7 broker listening");
    Ok(RunningBroker {
        addr,
        state,
        setup_code,
        shutdown: Some(tx),
        task,
    })
}
