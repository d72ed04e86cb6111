//! The doorbell: a task that `LISTEN`s on [`LOG_CHANNEL`], [`ACTIVITY_CHANNEL`] and
//! [`NOTICE_CHANNEL`] on one connection of its own and publishes the newest message sequence
//! and activity row id it heard, and passes on each browser notice ring
//! ([`Doorbell::notices`]).
//!
//! A ring only says "the log (or the activity table) has grown to at least this number"; the
//! consumer then reads the table after its own last number. When the listening connection dies
//! (server restart, terminated backend, a failed ping) the task reconnects with backoff (100 ms
//! doubling to 5 s) and, once listening again, reports [`Ring::Reconnected`] to every consumer:
//! notifications sent while it was away are lost, so each consumer re-reads its table from its
//! last number. A missed doorbell delays a delivery; it never loses one.
//!
//! [`Doorbell::ring`] waits for the log; further consumers take a [`Bell`] of their own
//! ([`Doorbell::bell`]), each with its own idea of what it has seen. Notice rings are not
//! numbers to catch up to but events: they go out on a broadcast queue as heard, and one
//! sent while the connection was away is lost (their consumers re-read on a timer anyway).

use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client};

use super::PgError;
use super::config::PgConfig;
use super::error::describe;
use super::log::LOG_CHANNEL;
use super::pool::connect_raw;
use super::tls::MakeRustls;
use crate::broker::notices::NOTICE_CHANNEL;

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A quiet listening connection is checked this often (a dead peer that sent no reset is
/// noticed within this plus [`PING_TIMEOUT`]).
const PING_EVERY: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// Notice rings held for a consumer that has not read them yet; a consumer further behind
/// skips the oldest (and should act as if it had heard one of each).
const NOTICES_HELD: usize = 64;

/// The `LISTEN`/`NOTIFY` channel of activity uploads. Its payload is the id of the last
/// `member_activity` row of the committed upload, in decimal, and nothing else.
pub const ACTIVITY_CHANNEL: &str = "ac7_activity";

/// What the doorbell task has heard so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DoorbellState {
    /// The newest message sequence announced (0 before any).
    pub newest: i64,
    /// The newest activity row id announced (0 before any).
    pub activity: i64,
    /// How many times the task has reconnected since it started.
    pub reconnects: u64,
}

/// What changed since the consumer last asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ring {
    /// The table has grown to at least this number (a message sequence, an activity id).
    Seq(i64),
    /// The listening connection was lost and is back: announcements may have been missed,
    /// re-read the table from your last number.
    Reconnected,
}

/// Which announcements a [`Bell`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// Messages appended to the log ([`LOG_CHANNEL`]).
    Log,
    /// Activity rows uploaded ([`ACTIVITY_CHANNEL`]).
    Activity,
}

/// One consumer of the doorbell: waits for announcements on its channel, and for
/// reconnections.
#[derive(Debug)]
pub struct Bell {
    rx: watch::Receiver<DoorbellState>,
    seen: DoorbellState,
    channel: Channel,
}

impl Bell {
    /// Waits for the next change: a reconnection first (it supersedes any number heard
    /// meanwhile), else the newest number of this bell's channel. Rings that came while nobody
    /// waited are merged. A bell whose doorbell is gone rings [`Ring::Reconnected`] every 5 s.
    pub async fn ring(&mut self) -> Ring {
        loop {
            let now = *self.rx.borrow_and_update();
            if now.reconnects != self.seen.reconnects {
                self.seen = now;
                return Ring::Reconnected;
            }
            let (newest, seen) = match self.channel {
                Channel::Log => (now.newest, self.seen.newest),
                Channel::Activity => (now.activity, self.seen.activity),
            };
            if newest > seen {
                self.seen = now;
                return Ring::Seq(newest);
            }
            if self.rx.changed().await.is_err() {
                // The task ended (it only does by panicking, or with its doorbell): fall back
                // to polling the table.
                tokio::time::sleep(BACKOFF_MAX).await;
                return Ring::Reconnected;
            }
        }
    }
}

/// A running doorbell. Dropping it stops the task.
#[derive(Debug)]
pub struct Doorbell {
    log: Bell,
    notices: broadcast::Sender<String>,
    task: JoinHandle<()>,
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Doorbell {
    /// Connects and listens (errors of this first connection are returned, one line each),
    /// then keeps listening in a task, reconnecting by itself. Start it before reading where
    /// the log is, so that no append between that read and the `LISTEN` goes unheard.
    pub async fn start(config: &PgConfig) -> Result<Doorbell, PgError> {
        let tls = MakeRustls::new(config).map_err(|reason| PgError::Tls {
            addr: config.addr(),
            reason,
        })?;
        let (tx, rx) = watch::channel(DoorbellState::default());
        let (notices, _) = broadcast::channel(NOTICES_HELD);
        let first = listen(config, &tls, &tx, &notices).await?;
        let task = tokio::spawn(run(config.clone(), tls, tx, notices.clone(), first));
        Ok(Doorbell {
            log: Bell {
                rx,
                seen: DoorbellState::default(),
                channel: Channel::Log,
            },
            notices,
            task,
        })
    }

    /// Waits for the next change of the log: a reconnection first (it supersedes any sequence
    /// heard meanwhile), else the newest sequence. Rings that came while nobody waited are
    /// merged.
    pub async fn ring(&mut self) -> Ring {
        self.log.ring().await
    }

    /// A further consumer of `channel`, which has seen nothing yet (its first
    /// [`Bell::ring`] answers at once if anything was heard). It rings while `self` lives.
    pub fn bell(&self, channel: Channel) -> Bell {
        Bell {
            rx: self.log.rx.clone(),
            seen: DoorbellState::default(),
            channel,
        }
    }

    /// The browser notice rings ([`NOTICE_CHANNEL`] payloads) heard from now on, while
    /// `self` lives.
    pub fn notices(&self) -> broadcast::Receiver<String> {
        self.notices.subscribe()
    }

    /// What the task has heard so far.
    pub fn state(&self) -> DoorbellState {
        *self.log.rx.borrow()
    }

    /// Another receiver of the state, for further consumers (valid while `self` lives).
    pub fn subscribe(&self) -> watch::Receiver<DoorbellState> {
        self.log.rx.clone()
    }
}

/// A listening connection: the client (kept to ping, and because dropping it closes the
/// connection) and the task polling its messages, which ends when the connection does.
async fn listen(
    config: &PgConfig,
    tls: &MakeRustls,
    tx: &watch::Sender<DoorbellState>,
    notices: &broadcast::Sender<String>,
) -> Result<(Client, JoinHandle<()>), PgError> {
    let (client, mut connection) = connect_raw(config, tls).await?;
    let tx = tx.clone();
    let notices = notices.clone();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n)))
                    if n.channel() == LOG_CHANNEL || n.channel() == ACTIVITY_CHANNEL =>
                {
                    let log = n.channel() == LOG_CHANNEL;
                    match n.payload().parse::<i64>() {
                        Ok(number) => {
                            tx.send_if_modified(|s| {
                                let newest = if log { &mut s.newest } else { &mut s.activity };
                                let newer = number > *newest;
                                if newer {
                                    *newest = number;
                                }
                                newer
                            });
                        }
                        Err(_) => tracing::warn!(
                            channel = n.channel(),
                            payload = n.payload(),
                            "ignored a doorbell ring that is not a number"
                        ),
                    }
                }
                Some(Ok(AsyncMessage::Notification(n))) if n.channel() == NOTICE_CHANNEL => {
                    // Nobody listening is fine: the ring had no one to tell.
                    let _ = notices.send(n.payload().to_owned());
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!(error = %describe(&e), "the doorbell's PostgreSQL connection failed");
                    return;
                }
                None => return,
            }
        }
    });
    let listen =
        format!("LISTEN {LOG_CHANNEL}; LISTEN {ACTIVITY_CHANNEL}; LISTEN {NOTICE_CHANNEL}");
    if let Err(e) = client.batch_execute(&listen).await {
        driver.abort();
        return Err(e.into());
    }
    Ok((client, driver))
}

async fn run(
    config: PgConfig,
    tls: MakeRustls,
    tx: watch::Sender<DoorbellState>,
    notices: broadcast::Sender<String>,
    first: (Client, JoinHandle<()>),
) {
    let mut current = Some(first);
    let mut backoff = BACKOFF_MIN;
    loop {
        let (client, mut driver) = match current.take() {
            Some(c) => c,
            None => match listen(&config, &tls, &tx, &notices).await {
                Ok(c) => {
                    backoff = BACKOFF_MIN;
                    tx.send_modify(|s| s.reconnects += 1);
                    tracing::info!("the doorbell is listening again");
                    c
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis(), "the doorbell cannot reconnect yet");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = tx.closed() => return,
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            },
        };
        loop {
            tokio::select! {
                _ = &mut driver => break,
                () = tx.closed() => {
                    driver.abort();
                    return;
                }
                () = tokio::time::sleep(PING_EVERY) => {
                    let ping = tokio::time::timeout(PING_TIMEOUT, client.simple_query("SELECT 1")).await;
                    if !matches!(ping, Ok(Ok(_))) {
                        driver.abort();
                        break;
                    }
                }
            }
        }
        drop(client);
        tracing::warn!("the doorbell lost its PostgreSQL connection; reconnecting");
    }
}
