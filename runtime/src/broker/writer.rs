//! Group commit for `/push`: one writer thread logs every waiting push in a
//! single transaction, commits once, then fans the batch out in log order and
//! answers each request. Under load many pushes share one commit (one WAL
//! write); alone, a push is committed at once. A push is acknowledged only
//! after the commit that holds it.
//!
//! The writer holds the store lock for the whole batch, so it serialises with
//! every other mutation, and delivery still follows the log's order.

use std::collections::BTreeSet;
use std::sync::mpsc;
use std::sync::{Arc, Weak};

use ac7_protocol::message::{Audience, Message};
use tokio::sync::oneshot;

use super::db::StoreError;
use super::hub::Frame;
use super::publish::{self, Draft};
use super::{AppState, team};

/// Most pushes committed together.
const MAX_BATCH: usize = 256;

struct Job {
    draft: Option<Draft>,
    audience: Audience,
    now: i64,
    reply: oneshot::Sender<Result<(Message, usize), String>>,
}

/// The handle requests use to reach the writer thread.
#[derive(Debug)]
pub struct Writer {
    tx: mpsc::Sender<Job>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("now", &self.now)
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
    (Writer { tx }, WriterQueue { rx })
}

impl Writer {
    /// Logs, commits and delivers one message; returns it with its live count.
    pub async fn push(
        &self,
        draft: Draft,
        audience: Audience,
        now: i64,
    ) -> Result<(Message, usize), String> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job {
                draft: Some(draft),
                audience,
                now,
                reply,
            })
            .map_err(|_| "the broker is shutting down".to_owned())?;
        rx.await
            .map_err(|_| "the broker is shutting down".to_owned())?
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

fn run_batch(state: &AppState, mut jobs: Vec<Job>) {
    state.store.with(|conn| {
        let logged = (|| -> Result<Vec<(Message, Arc<Frame>)>, StoreError> {
            let tx = conn.transaction()?;
            let mut everyone: Option<BTreeSet<String>> = None;
            let mut out = Vec::with_capacity(jobs.len());
            for job in &mut jobs {
                let Some(draft) = job.draft.take() else {
                    return Err(StoreError::Corrupt("push job without a draft".into()));
                };
                let (msg, frame) = publish::log(&tx, draft, job.now)?;
                if !msg.attachments.is_empty() {
                    let recipients = match &job.audience {
                        Audience::Only(names) => names.clone(),
                        Audience::Everyone => match &everyone {
                            Some(all) => all.clone(),
                            None => {
                                let all: BTreeSet<String> = team::members_list(&tx)?
                                    .into_iter()
                                    .map(|m| m.name)
                                    .collect();
                                everyone = Some(all.clone());
                                all
                            }
                        },
                    };
                    publish::grant_attachments(&tx, &msg.attachments, &recipients, job.now)?;
                }
                out.push((msg, frame));
            }
            tx.commit()?;
            Ok(out)
        })();
        match logged {
            Ok(out) => {
                for (job, (msg, frame)) in jobs.into_iter().zip(out) {
                    let live = publish::deliver(state, &job.audience, &frame, job.now);
                    let _ = job.reply.send(Ok((msg, live)));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "push batch failed; nothing in it was logged");
                let text = format!("internal error: {e}");
                for job in jobs {
                    let _ = job.reply.send(Err(text.clone()));
                }
            }
        }
    });
}
