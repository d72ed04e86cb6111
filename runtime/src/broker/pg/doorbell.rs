//! The log doorbell: a task that `LISTEN`s on [`LOG_CHANNEL`] on a connection of its own and
//! publishes the newest sequence it heard.
//!
//! A ring only says "the log has grown to at least this sequence"; the consumer then reads
//! the log after its own last sequence. When the listening connection dies (server restart,
//! terminated backend, a failed ping) the task reconnects with backoff (100 ms doubling to 5 s)
//! and, once listening again, reports [`Ring::Reconnected`]: notifications sent while it was
//! away are lost, so the consumer re-reads the log from its last sequence. A missed doorbell
//! delays a delivery; it never loses one.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client};

use super::PgError;
use super::config::PgConfig;
use super::error::describe;
use super::log::LOG_CHANNEL;
use super::pool::connect_raw;
use super::tls::MakeRustls;

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A quiet listening connection is checked this often (a dead peer that sent no reset is
/// noticed within this plus [`PING_TIMEOUT`]).
const PING_EVERY: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// What the doorbell task has heard so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DoorbellState {
    /// The newest sequence announced (0 before any).
    pub newest: i64,
    /// How many times the task has reconnected since it started.
    pub reconnects: u64,
}

/// What changed since the consumer last asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ring {
    /// The log has grown to at least this sequence.
    Seq(i64),
    /// The listening connection was lost and is back: announcements may have been missed,
    /// re-read the log from your last sequence.
    Reconnected,
}

/// A running doorbell. Dropping it stops the task.
#[derive(Debug)]
pub struct Doorbell {
    rx: watch::Receiver<DoorbellState>,
    seen: DoorbellState,
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
        let first = listen(config, &tls, &tx).await?;
        let task = tokio::spawn(run(config.clone(), tls, tx, first));
        Ok(Doorbell {
            rx,
            seen: DoorbellState::default(),
            task,
        })
    }

    /// Waits for the next change: a reconnection first (it supersedes any sequence heard
    /// meanwhile), else the newest sequence. Rings that came while nobody waited are merged.
    pub async fn ring(&mut self) -> Ring {
        loop {
            let now = *self.rx.borrow_and_update();
            if now.reconnects != self.seen.reconnects {
                self.seen = now;
                return Ring::Reconnected;
            }
            if now.newest > self.seen.newest {
                self.seen = now;
                return Ring::Seq(now.newest);
            }
            if self.rx.changed().await.is_err() {
                // The task ended (it only does by panicking): fall back to polling the log.
                tokio::time::sleep(BACKOFF_MAX).await;
                return Ring::Reconnected;
            }
        }
    }

    /// What the task has heard so far.
    pub fn state(&self) -> DoorbellState {
        *self.rx.borrow()
    }

    /// Another receiver of the state, for further consumers (valid while `self` lives).
    pub fn subscribe(&self) -> watch::Receiver<DoorbellState> {
        self.rx.clone()
    }
}

/// A listening connection: the client (kept to ping, and because dropping it closes the
/// connection) and the task polling its messages, which ends when the connection does.
async fn listen(
    config: &PgConfig,
    tls: &MakeRustls,
    tx: &watch::Sender<DoorbellState>,
) -> Result<(Client, JoinHandle<()>), PgError> {
    let (client, mut connection) = connect_raw(config, tls).await?;
    let tx = tx.clone();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) if n.channel() == LOG_CHANNEL => {
                    match n.payload().parse::<i64>() {
                        Ok(seq) => {
                            tx.send_if_modified(|s| {
                                let newer = seq > s.newest;
                                if newer {
                                    s.newest = seq;
                                }
                                newer
                            });
                        }
                        Err(_) => tracing::warn!(
                            payload = n.payload(),
                            "ignored a doorbell ring that is not a sequence"
                        ),
                    }
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
    if let Err(e) = client.batch_execute(&format!("LISTEN {LOG_CHANNEL}")).await {
        driver.abort();
        return Err(e.into());
    }
    Ok((client, driver))
}

async fn run(
    config: PgConfig,
    tls: MakeRustls,
    tx: watch::Sender<DoorbellState>,
    first: (Client, JoinHandle<()>),
) {
    let mut current = Some(first);
    let mut backoff = BACKOFF_MIN;
    loop {
        let (client, mut driver) = match current.take() {
            Some(c) => c,
            None => match listen(&config, &tls, &tx).await {
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
