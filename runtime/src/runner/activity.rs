//! The activity pipeline: drives the protocol's [`Uploader`] and [`BusyReporter`] for one member.
//!
//! [`ActivityPipeline::start`] spawns one task that owns both machines and an
//! [`ActivityHandle`] (cheap to clone) that feeds it without ever waiting on the network:
//! [`ActivityHandle::record`] queues an event for `POST /members/<me>/activity`,
//! [`ActivityHandle::llm_started`] / [`ActivityHandle::llm_finished`] count LLM calls for the busy
//! flag. Uploads go one at a time (batching, backoff and caps: `ac7_protocol::trace::uploader`);
//! busy reports go through a second task that posts `POST /presence/busy` strictly in order,
//! skipping reports overtaken by a newer one while a post was in flight.
//!
//! [`ActivityPipeline::shutdown`] reports `busy: false` if the member was reported busy, then
//! uploads everything still queued, giving up after the uploader's close deadline (5 s).
//!
//! [`Activity`] is what the runners start (every runner kind): the pipeline plus the objective
//! markers (`ac7_protocol::trace::markers`) — an `objective_open` per open objective assigned to
//! the member at start, opens and closes (with the real reason, looked up with
//! `GET /objectives/:id`) after each objectives-tracker refresh, and `runner_shutdown` closes
//! at exit, before the final upload.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use ac7_protocol::domain::objective::Objective;
use ac7_protocol::domain::toolbox::{Body, Method, Request, encode_component};
use ac7_protocol::trace::activity::ActivityEvent;
use ac7_protocol::trace::busy::{BusyConfig, BusyOutput, BusyReporter};
use ac7_protocol::trace::markers::{Lookup, MarkerOutput, ObjectiveMarkers};
use ac7_protocol::trace::uploader::{
    UploadResult, Uploader, UploaderConfig, UploaderLog, UploaderOutput,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::broker::BrokerClient;
use crate::sys::clock::sleep_until;

/// Longest wait for one busy report.
const BUSY_POST_TIMEOUT: Duration = Duration::from_secs(5);

/// The pipeline's settings.
#[derive(Debug, Clone, Default)]
pub struct PipelineConfig {
    /// Upload caps and timers.
    pub uploader: UploaderConfig,
    /// Busy debounce, heartbeat and stale timers.
    pub busy: BusyConfig,
}

enum Command {
    Record(Box<ActivityEvent>),
    Started(u64),
    Finished(u64),
}

/// Feeds the pipeline; clone it freely. Every method returns at once.
#[derive(Debug, Clone)]
pub struct ActivityHandle {
    tx: mpsc::UnboundedSender<Command>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Record(_) => "Record",
            Self::Started(_) => "Started",
            Self::Finished(_) => "Finished",
        })
    }
}

impl ActivityHandle {
    /// Queues an event for upload (dropped with a log line once the pipeline shut down).
    pub fn record(&self, event: ActivityEvent) {
        if self.tx.send(Command::Record(Box::new(event))).is_err() {
            tracing::debug!("activity: pipeline stopped; event dropped");
        }
    }

    /// An LLM call under `key` started (the member is busy).
    pub fn llm_started(&self, key: u64) {
        let _ = self.tx.send(Command::Started(key));
    }

    /// An LLM call under `key` finished.
    pub fn llm_finished(&self, key: u64) {
        let _ = self.tx.send(Command::Finished(key));
    }
}

/// The running pipeline. See the module docs.
#[derive(Debug)]
pub struct ActivityPipeline {
    stop: mpsc::UnboundedSender<()>,
    task: JoinHandle<()>,
}

impl ActivityPipeline {
    /// Starts the pipeline for `member`, uploading and reporting with `client`.
    pub fn start(
        client: BrokerClient,
        member: String,
        config: PipelineConfig,
    ) -> (Self, ActivityHandle) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (stop, stop_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(client, member, config, rx, stop_rx));
        (Self { stop, task }, ActivityHandle { tx })
    }

    /// Reports `busy: false` if needed and uploads what is queued (bounded by the close
    /// deadline); events recorded after this are dropped.
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "activity: pipeline task failed");
        }
    }
}

type Upload = Pin<Box<dyn Future<Output = UploadResult> + Send>>;

async fn run(
    client: BrokerClient,
    member: String,
    config: PipelineConfig,
    mut rx: mpsc::UnboundedReceiver<Command>,
    mut stop: mpsc::UnboundedReceiver<()>,
) {
    let mut uploader = Uploader::new(config.uploader);
    let mut busy = BusyReporter::new(config.busy);
    let (busy_tx, busy_rx) = watch::channel((0_u64, false));
    let poster = tokio::spawn(post_busy(client.clone(), busy_rx));
    let mut busy_seq = 0_u64;
    let mut in_flight: Option<(u64, Upload)> = None;
    let mut closing = false;
    loop {
        let now = Instant::now().into_std();
        busy.handle_timeout(now);
        while let Some(output) = busy.poll_output() {
            match output {
                BusyOutput::SetBusy(value) => {
                    busy_seq += 1;
                    busy_tx.send_replace((busy_seq, value));
                }
                BusyOutput::Stale { key, count } => tracing::warn!(
                    key,
                    count,
                    "activity: an LLM call ran 5 minutes without finishing; no longer counted busy"
                ),
                other => tracing::warn!(
                    ?other,
                    "activity: a busy output this version does not handle"
                ),
            }
        }
        uploader.handle_timeout(now);
        while let Some(output) = uploader.poll_output() {
            match output {
                // One batch at a time: the next comes out only after this one's result.
                UploaderOutput::Transmit(batch) => {
                    let (client, member) = (client.clone(), member.clone());
                    let upload: Upload = Box::pin(async move {
                        match client.post_activity(&member, batch.body).await {
                            Ok(status) => UploadResult::Status(status),
                            Err(e) => UploadResult::Network(e.to_string()),
                        }
                    });
                    in_flight = Some((batch.id, upload));
                }
                UploaderOutput::Log(log) => log_uploader(&log),
                other => tracing::warn!(
                    ?other,
                    "activity: an uploader output this version does not handle"
                ),
            }
        }
        if closing && uploader.is_done() {
            break;
        }
        let deadline = [uploader.poll_timeout(), busy.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
            .map(Instant::from_std);
        tokio::select! {
            command = rx.recv(), if !closing => {
                let now = Instant::now().into_std();
                match command {
                    Some(Command::Record(event)) => uploader.enqueue(&event, now),
                    Some(Command::Started(key)) => busy.llm_started(key, now),
                    Some(Command::Finished(key)) => busy.llm_finished(key, now),
                    None => {
                        closing = true;
                        busy.close(now);
                        uploader.close(now);
                    }
                }
            }
            _ = stop.recv(), if !closing => {
                // Take what callers recorded before the stop, then close.
                let now = Instant::now().into_std();
                while let Ok(command) = rx.try_recv() {
                    match command {
                        Command::Record(event) => uploader.enqueue(&event, now),
                        Command::Started(key) => busy.llm_started(key, now),
                        Command::Finished(key) => busy.llm_finished(key, now),
                    }
                }
                rx.close();
                closing = true;
                busy.close(now);
                uploader.close(now);
            }
            result = async {
                match in_flight.as_mut() {
                    Some((_, upload)) => upload.await,
                    None => std::future::pending().await,
                }
            }, if in_flight.is_some() => {
                if let Some((id, _)) = in_flight.take() {
                    uploader.handle_result(id, result, Instant::now().into_std());
                }
            }
            () = sleep_until(deadline) => {
                uploader.handle_timeout(Instant::now().into_std());
            }
        }
    }
    // The final busy report (if any) was published above; let the poster send it.
    drop(busy_tx);
    if tokio::time::timeout(BUSY_POST_TIMEOUT, poster)
        .await
        .is_err()
    {
        tracing::warn!("activity: the final busy report did not finish in time");
    }
}

/// Posts busy reports in order; a report superseded while a post was in flight is skipped.
async fn post_busy(client: BrokerClient, mut rx: watch::Receiver<(u64, bool)>) {
    while rx.changed().await.is_ok() {
        let (_, value) = *rx.borrow_and_update();
        match client.set_busy(value, BUSY_POST_TIMEOUT).await {
            Ok(204) => {}
            Ok(status) => tracing::warn!(status, busy = value, "activity: busy report refused"),
            Err(e) => tracing::warn!(error = %e, busy = value, "activity: busy report failed"),
        }
    }
}

fn log_uploader(log: &UploaderLog) {
    match log {
        UploaderLog::Refused { bytes } => tracing::warn!(
            bytes,
            "activity: an event larger than the whole upload queue was dropped"
        ),
        UploaderLog::Evicted { events } => tracing::warn!(
            events,
            "activity: upload queue full; dropped the oldest events"
        ),
        UploaderLog::Rejected { status, events } => tracing::warn!(
            status,
            events,
            "activity: the broker refused an upload; its events were dropped"
        ),
        UploaderLog::Retrying { reason, delay } => tracing::info!(
            reason = %reason,
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            "activity: upload failed; retrying"
        ),
        UploaderLog::Closed => tracing::debug!("activity: event after shutdown dropped"),
        UploaderLog::DroppedAtClose { events } => tracing::warn!(
            events,
            "activity: shutdown deadline passed; events never uploaded"
        ),
        other => tracing::warn!(?other, "activity: uploader log"),
    }
}

/// Feeds the objective markers task (see [`Activity::start`]).
#[derive(Debug, Clone)]
pub struct MarkersHandle {
    tx: mpsc::UnboundedSender<MarkerCommand>,
}

#[derive(Debug)]
enum MarkerCommand {
    Refreshed(Vec<Objective>),
    Shutdown(oneshot::Sender<()>),
}

impl MarkersHandle {
    /// The member's open objectives after a tracker refresh.
    pub fn refreshed(&self, open: Vec<Objective>) {
        let _ = self.tx.send(MarkerCommand::Refreshed(open));
    }

    /// Closes the open markers with `runner_shutdown` and stops the task.
    async fn shutdown(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(MarkerCommand::Shutdown(ack)).is_ok() {
            let _ = done.await;
        }
    }
}

/// The runner's activity: the upload pipeline and the objective markers.
#[derive(Debug)]
pub struct Activity {
    pipeline: ActivityPipeline,
    handle: ActivityHandle,
    markers: MarkersHandle,
}

impl Activity {
    /// Starts the pipeline for `me` and opens a marker per objective of `initial` assigned to
    /// `me` (the briefing's open objectives).
    pub fn start(client: BrokerClient, me: String, initial: Vec<Objective>) -> Self {
        let (pipeline, handle) =
            ActivityPipeline::start(client.clone(), me.clone(), PipelineConfig::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(MarkerCommand::Refreshed(initial));
        tokio::spawn(run_markers(client, me, rx, handle.clone()));
        Self {
            pipeline,
            handle,
            markers: MarkersHandle { tx },
        }
    }

    /// Records events and LLM calls (for the trace host).
    pub fn handle(&self) -> ActivityHandle {
        self.handle.clone()
    }

    /// Feeds the markers (for the objectives tracker).
    pub fn markers(&self) -> MarkersHandle {
        self.markers.clone()
    }

    /// Closes the markers (`runner_shutdown`), reports not busy, uploads what is queued.
    pub async fn shutdown(self) {
        self.markers.shutdown().await;
        self.pipeline.shutdown().await;
    }
}

async fn run_markers(
    client: BrokerClient,
    me: String,
    mut rx: mpsc::UnboundedReceiver<MarkerCommand>,
    activity: ActivityHandle,
) {
    let mut markers = ObjectiveMarkers::new(me);
    while let Some(command) = rx.recv().await {
        // Only the newest refresh matters.
        let mut latest = command;
        while let Ok(next) = rx.try_recv() {
            if matches!(latest, MarkerCommand::Shutdown(_)) {
                break;
            }
            latest = next;
        }
        let ack = match latest {
            MarkerCommand::Refreshed(open) => {
                markers.handle_refreshed(&open, crate::sys::clock::now_ms());
                None
            }
            MarkerCommand::Shutdown(ack) => {
                markers.shutdown(crate::sys::clock::now_ms());
                Some(ack)
            }
        };
        while let Some(output) = markers.poll_output() {
            match output {
                MarkerOutput::Record(event) => activity.record(*event),
                MarkerOutput::LookUp(id) => {
                    let lookup = look_up(&client, &id).await;
                    markers.handle_lookup(&id, &lookup, crate::sys::clock::now_ms());
                }
                other => tracing::warn!(
                    ?other,
                    "activity: a marker output this version does not handle"
                ),
            }
        }
        if let Some(ack) = ack {
            let _ = ack.send(());
            return;
        }
    }
}

/// `GET /objectives/:id` for a marker that may close.
async fn look_up(client: &BrokerClient, id: &str) -> Lookup {
    #[derive(serde::Deserialize)]
    struct View {
        objective: Objective,
    }
    let request = Request {
        method: Method::Get,
        path: format!("/objectives/{}", encode_component(id)),
        body: Body::Empty,
    };
    match client.execute(&request).await {
        Ok(r) if r.status == 200 => match serde_json::from_slice::<View>(&r.body) {
            Ok(view) => Lookup::Found(Box::new(view.objective)),
            Err(e) => {
                tracing::warn!(error = %e, "activity: objective look-up answer not understood");
                Lookup::Failed
            }
        },
        Ok(r) if r.status == 403 => Lookup::Forbidden,
        Ok(r) if r.status == 404 => Lookup::NotFound,
        Ok(r) => {
            tracing::warn!(status = r.status, "activity: objective look-up failed");
            Lookup::Failed
        }
        Err(e) => {
            tracing::warn!(error = %e, "activity: objective look-up failed");
            Lookup::Failed
        }
    }
}
