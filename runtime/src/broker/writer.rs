//! Group commit for `/push`. Pushes that arrive together go to the writer thread (a thread of
//! its own, so their commit, and an fsync it may do, never stalls an async worker); it logs
//! every push waiting in a single transaction, commits once, fans the batch out in log order
//! and answers each request. So under load many pushes share one commit (one WAL write; on
//! PostgreSQL, one transaction on the log's counter row). A push is acknowledged only after the
//! commit that holds it.
//!
//! The writer holds the store lock for the whole batch, so it serialises with every other
//! mutation, and delivery still follows the log's order.
//!
//! A push that finds no other push in progress, the write connection free and no checkpoint
//! waiting for a commit to finish it is committed right where it arrived, on its async worker
//! (SQLite only): the hand-off to the writer thread and back (two wake-ups of a sleeping
//! thread, the dearest part of a lone push) would cost more than the commit. Pushes that
//! arrive meanwhile queue for the writer thread, which takes the store lock after it, so the
//! log's order and delivery order stay one. Such a push lets the live streams it woke write
//! the message before it writes its own answer (when the runtime has more than one worker).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Weak};

use ac7_protocol::domain::message::{Audience, Message};
use tokio::sync::oneshot;

use super::db::{StoreError, WriteHere};
use super::hub::Frame;
use super::publish::{self, Draft};
use super::store::Conn;
use super::{AppState, team};

/// Most pushes committed together.
const MAX_BATCH: usize = 256;

/// Who a push goes to and when it was made.
struct Item {
    audience: Audience,
    now: i64,
}

struct Job {
    draft: Draft,
    item: Item,
    reply: oneshot::Sender<Result<Logged, PushError>>,
}

/// A push once committed and delivered: the message, its frame (which holds its JSON), and
/// how many live streams it was handed to.
pub type Logged = (Message, Arc<Frame>, usize);

/// The handle requests use to reach the writer thread.
#[derive(Debug)]
pub struct Writer {
    tx: mpsc::Sender<Job>,
    stats: Counters,
    /// Pushes between their arrival and their answer.
    busy: AtomicUsize,
}

/// How the pushes were committed so far: what shows whether group commit happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Commits that logged pushes.
    pub commits: u64,
    /// Pushes logged by those commits.
    pub pushes: u64,
    /// Commits that held more than one push.
    pub grouped: u64,
    /// The most pushes one commit held.
    pub largest: u64,
    /// Pushes handed to the writer thread.
    pub queued: u64,
    /// Pushes committed where they arrived (alone, without the writer thread).
    pub in_place: u64,
}

#[derive(Debug, Default)]
struct Counters {
    commits: AtomicU64,
    pushes: AtomicU64,
    grouped: AtomicU64,
    largest: AtomicU64,
    queued: AtomicU64,
    in_place: AtomicU64,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("now", &self.item.now)
            .finish_non_exhaustive()
    }
}

/// The receiving end, handed to [`spawn`] once the state exists.
#[derive(Debug)]
pub struct WriterQueue {
    rx: mpsc::Receiver<Job>,
}

/// A writer handle and its queue.
pub fn channel() -> (Writer, WriterQueue) {
    let (tx, rx) = mpsc::channel();
    let stats = Counters::default();
    let busy = AtomicUsize::new(0);
    (Writer { tx, stats, busy }, WriterQueue { rx })
}

impl Writer {
    /// The commit counters since the broker started.
    pub fn stats(&self) -> CommitStats {
        let s = &self.stats;
        CommitStats {
            commits: s.commits.load(Ordering::Relaxed),
            pushes: s.pushes.load(Ordering::Relaxed),
            grouped: s.grouped.load(Ordering::Relaxed),
            largest: s.largest.load(Ordering::Relaxed),
            queued: s.queued.load(Ordering::Relaxed),
            in_place: s.in_place.load(Ordering::Relaxed),
        }
    }

    /// Counts one successful commit of `pushes` pushes.
    fn count(&self, pushes: usize) {
        let n = u64::try_from(pushes).unwrap_or(u64::MAX);
        let s = &self.stats;
        s.commits.fetch_add(1, Ordering::Relaxed);
        s.pushes.fetch_add(n, Ordering::Relaxed);
        if n > 1 {
            s.grouped.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(pushes = n, "group commit");
        }
        s.largest.fetch_max(n, Ordering::Relaxed);
    }

    /// Logs, commits and delivers one push on the write connection `here` (its lock released
    /// on return).
    fn commit_here(
        &self,
        state: &AppState,
        here: WriteHere<'_>,
        drafts: &mut [Option<Draft>; 1],
        items: &[Item; 1],
    ) -> Result<Logged, PushError> {
        let mut done = failed(here.tx_then(
            |c| log_items(c, drafts, items),
            |logged| deliver_items(state, items, logged),
        ))?;
        self.stats.in_place.fetch_add(1, Ordering::Relaxed);
        done.pop()
            .ok_or_else(|| PushError::Failed("a commit without its push".into()))
    }

    /// Logs, commits and delivers one message (right here when it is alone, else in the
    /// writer's next batch); returns it with its frame and live count.
    pub async fn push(
        &self,
        state: &AppState,
        draft: Draft,
        audience: Audience,
        now: i64,
    ) -> Result<Logged, PushError> {
        let busy = Busy::enter(&self.busy);
        let (mut drafts, items) = ([Some(draft)], [Item { audience, now }]);
        let done_here = if busy.alone {
            // The write connection's lock is released inside: it is never held across an await.
            state
                .store
                .writer_here()
                .map(|here| self.commit_here(state, here, &mut drafts, &items))
        } else {
            None
        };
        if let Some(done) = done_here {
            let logged = done?;
            drop(busy);
            if logged.2 > 0 && more_than_one_worker() {
                // The live streams handed the frame were woken by this task, so they wait
                // behind it on this worker. Let them write it before this request goes on to
                // write its answer: the recipients hear of the message first, the sender a few
                // microseconds later (what it is told, the live count, is settled already).
                // With one worker (one CPU to run on) the recipients cannot start before the
                // broker is done either way, and the yield's extra round of the scheduler is
                // only a cost.
                super::repoll::yield_to_queued().await;
            }
            return Ok(logged);
        }
        let ([Some(draft)], [item]) = (drafts, items) else {
            return Err(PushError::Failed("a push without its draft".into()));
        };
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job { draft, item, reply })
            .map_err(|_| PushError::ShuttingDown)?;
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        rx.await.map_err(|_| PushError::ShuttingDown)?
    }
}

/// Counts a push from its arrival to its answer (also when its request is dropped).
struct Busy<'a> {
    count: &'a AtomicUsize,
    /// No other push was in progress when this one arrived.
    alone: bool,
}

impl<'a> Busy<'a> {
    fn enter(count: &'a AtomicUsize) -> Busy<'a> {
        let alone = count.fetch_add(1, Ordering::AcqRel) == 0;
        Busy { count, alone }
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts the writer thread. It stops when the state (and so every [`Writer`]) is gone.
pub fn spawn(queue: WriterQueue, state: Weak<AppState>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("ac7-writer".into())
        .spawn(move || {
            while let Ok(first) = queue.rx.recv() {
                let mut jobs = vec![first];
                while jobs.len() < MAX_BATCH {
                    match queue.rx.try_recv() {
                        Ok(job) => jobs.push(job),
                        Err(_) => break,
                    }
                }
                let Some(state) = state.upgrade() else { break };
                run_batch(&state, jobs);
            }
        })
        .map(|_| ())
}

fn run_batch(state: &AppState, jobs: Vec<Job>) {
    let mut drafts = Vec::with_capacity(jobs.len());
    let mut items = Vec::with_capacity(jobs.len());
    let mut replies = Vec::with_capacity(jobs.len());
    for job in jobs {
        drafts.push(Some(job.draft));
        items.push(job.item);
        replies.push(job.reply);
    }
    let result = state.store.tx_then(
        |c| log_items(c, &mut drafts, &items),
        |logged| deliver_items(state, &items, logged),
    );
    match failed(result) {
        Ok(done) => {
            for (reply, result) in replies.into_iter().zip(done) {
                let _ = reply.send(Ok(result));
            }
        }
        Err(text) => {
            for reply in replies {
                let _ = reply.send(Err(text.clone()));
            }
        }
    }
}

/// Logs `drafts` (one per item of `items`) inside the caller's transaction, with the
/// attachment grants of each. All or nothing: the caller's transaction rolls back on `Err`.
fn log_items(
    c: &Conn<'_>,
    drafts: &mut [Option<Draft>],
    items: &[Item],
) -> Result<Vec<(Message, Arc<Frame>)>, StoreError> {
    let mut everyone: Option<BTreeSet<String>> = None;
    let mut out = Vec::with_capacity(items.len());
    for (draft, item) in drafts.iter_mut().zip(items) {
        let Some(draft) = draft.take() else {
            return Err(StoreError::Corrupt("push without a draft".into()));
        };
        let (msg, frame) = publish::log(c, draft, &item.audience, item.now)?;
        if !msg.attachments.is_empty() {
            let recipients = match &item.audience {
                Audience::Only(names) => names.clone(),
                Audience::Everyone => match &everyone {
                    Some(all) => all.clone(),
                    None => {
                        let all: BTreeSet<String> =
                            team::members_list(c)?.into_iter().map(|m| m.name).collect();
                        everyone = Some(all.clone());
                        all
                    }
                },
            };
            publish::grant_attachments(c, &msg.attachments, &recipients, item.now)?;
        }
        out.push((msg, frame));
    }
    Ok(out)
}

/// Counts the commit of `logged` and delivers its messages in order (right after the commit,
/// before any other transaction: see [`super::db::Store::tx_then`]).
fn deliver_items(
    state: &AppState,
    items: &[Item],
    logged: Vec<(Message, Arc<Frame>)>,
) -> Vec<Logged> {
    state.writer.count(logged.len());
    items
        .iter()
        .zip(logged)
        .map(|(item, (msg, frame))| {
            let live = publish::deliver(state, &item.audience, &frame, item.now);
            (msg, frame, live)
        })
        .collect()
}

/// Why a push was not logged (nothing in its commit was logged or delivered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// The database is out of reach for now (a restart, a network cut): retry shortly.
    #[error("the database is unavailable: nothing was done; retry shortly")]
    Unavailable,
    /// The broker is stopping.
    #[error("the broker is shutting down")]
    ShuttingDown,
    /// The commit failed.
    #[error("internal error: {0}")]
    Failed(String),
}

/// A failed commit as what each request of it answers.
fn failed<T>(result: Result<T, StoreError>) -> Result<T, PushError> {
    result.map_err(|e| {
        if e.is_unavailable() {
            tracing::warn!(error = %e, "push not logged: the database is unavailable");
            PushError::Unavailable
        } else {
            tracing::error!(error = %e, "push commit failed; nothing in it was logged");
            PushError::Failed(e.to_string())
        }
    })
}

/// Whether the runtime running this task has more than one worker thread (it has one per CPU
/// the broker may use, unless configured otherwise).
fn more_than_one_worker() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|h| h.metrics().num_workers() > 1)
}

#[cfg(test)]
mod tests {
    use super::more_than_one_worker;

    #[test]
    fn only_a_runtime_with_several_worker_threads_counts_as_more_than_one() {
        assert!(!more_than_one_worker(), "outside any runtime");
        let build = |workers: Option<usize>| {
            match workers {
                None => tokio::runtime::Builder::new_current_thread().build(),
                Some(n) => tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(n)
                    .build(),
            }
            .unwrap()
        };
        assert!(!build(None).block_on(async { more_than_one_worker() }));
        assert!(!build(Some(1)).block_on(async { more_than_one_worker() }));
        assert!(build(Some(2)).block_on(async { more_than_one_worker() }));
    }
}
