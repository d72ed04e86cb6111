//! Drives the objectives tracker machine: triggers in, debounced refreshes of the open set from
//! the broker, `notifications/tools/list_changed` out when the set changed.

use std::sync::{Arc, Mutex};

use ac7_protocol::dialect::mcp;
use ac7_protocol::domain::objective::{Objective, Status};
use ac7_protocol::domain::toolbox::{Body, Method, Request};
use ac7_protocol::session::tracker::{ObjectivesTracker, TrackerOutput};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::sys::clock::sleep_until;

use super::activity::MarkersHandle;
use crate::client::broker::BrokerClient;
use crate::runner::ipc_server::RunnerHandle;

/// What of an objective the agent sees in its tool descriptions.
type Summary = (String, Status, String, String);

fn summary(o: &Objective) -> Summary {
    (o.id.clone(), o.status, o.title.clone(), o.outcome.clone())
}

/// Shared view of the open objectives, for `tools/list`.
pub type OpenObjectives = Arc<Mutex<Vec<Objective>>>;

/// Tells the tracker that the open set may have changed.
#[derive(Debug, Clone)]
pub struct TrackerHandle {
    tx: mpsc::UnboundedSender<()>,
}

impl TrackerHandle {
    /// An objective event arrived, or a tool changed objectives.
    pub fn trigger(&self) {
        let _ = self.tx.send(());
    }
}

/// Starts the tracker task.
pub fn spawn(
    client: BrokerClient,
    me: String,
    open: OpenObjectives,
    runner: RunnerHandle,
    markers: Option<MarkersHandle>,
) -> TrackerHandle {
    let (tx, mut triggers) = mpsc::unbounded_channel::<()>();
    let initial: Vec<Summary> = open
        .lock()
        .map(|o| o.iter().map(summary).collect())
        .unwrap_or_default();
    tokio::spawn(async move {
        let mut machine = ObjectivesTracker::new(initial);
        let (done_tx, mut done) = mpsc::unbounded_channel::<Option<Vec<Objective>>>();
        loop {
            let deadline = machine.poll_timeout().map(Instant::from_std);
            tokio::select! {
                trigger = triggers.recv() => match trigger {
                    Some(()) => machine.handle_trigger(Instant::now().into_std()),
                    None => return,
                },
                () = sleep_until(deadline) => machine.handle_timeout(Instant::now().into_std()),
                Some(fresh) = done.recv() => {
                    if let Some(fresh) = &fresh
                        && let Ok(mut shared) = open.lock()
                    {
                        shared.clone_from(fresh);
                    }
                    if let (Some(fresh), Some(markers)) = (&fresh, &markers) {
                        markers.refreshed(fresh.clone());
                    }
                    let summaries = fresh.map(|f| f.iter().map(summary).collect());
                    machine.handle_refreshed(summaries, Instant::now().into_std());
                }
            }
            while let Some(output) = machine.poll_output() {
                match output {
                    TrackerOutput::Refresh => {
                        let (client, me, done_tx) = (client.clone(), me.clone(), done_tx.clone());
                        tokio::spawn(async move {
                            let _ = done_tx.send(fetch_open(&client, &me).await);
                        });
                    }
                    TrackerOutput::ListChanged => {
                        tracing::info!(
                            "open objectives changed; telling the agent to re-list tools"
                        );
                        runner.notify(mcp::TOOLS_LIST_CHANGED, None);
                    }
                    other => {
                        tracing::warn!(?other, "tracker: an output this version does not handle")
                    }
                }
            }
        }
    });
    TrackerHandle { tx }
}

/// The agent's active objectives followed by its blocked ones (assigned to it only: for members
/// without `objectives.create` the broker also returns ones they originated or watch).
async fn fetch_open(client: &BrokerClient, me: &str) -> Option<Vec<Objective>> {
    #[derive(serde::Deserialize)]
    struct List {
        objectives: Vec<Objective>,
    }
    let mut open = Vec::new();
    for status in ["active", "blocked"] {
        let request = Request {
            method: Method::Get,
            path: format!(
                "/objectives?assignee={}&status={status}",
                ac7_protocol::domain::toolbox::encode_component(me)
            ),
            body: Body::Empty,
        };
        let response = match client.execute(&request).await {
            Ok(r) if r.status == 200 => r,
            Ok(r) => {
                tracing::warn!(status = r.status, "objectives refresh failed");
                return None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "objectives refresh failed");
                return None;
            }
        };
        let list: List = serde_json::from_slice(&response.body).ok()?;
        open.extend(list.objectives.into_iter().filter(|o| o.assignee == me));
    }
    Some(open)
}
