//! Objective markers (unlike the TypeScript runner's, a close says why and only objectives
//! assigned to the member count): which objectives the member works on,
//! as `objective_open` / `objective_close` events.
//!
//! - [`ObjectiveMarkers::handle_refreshed`] takes the member's open objectives (the briefing's
//!   at start, then each tracker refresh). Only objectives assigned to the member with status
//!   `active` or `blocked` count (the broker also lists ones the member originated or watches).
//!   Ids new to the set → `objective_open`; ids gone → a [`MarkerOutput::LookUp`].
//! - [`ObjectiveMarkers::handle_lookup`] turns the look-up into the close reason: assigned to
//!   someone else (or no longer visible: 403) → `reassigned`; `done` → `done`; `cancelled` (or
//!   gone: 404) → `cancelled`. A look-up that failed, or an objective still open and ours, keeps
//!   the marker open; the next refresh tries again.
//! - [`ObjectiveMarkers::shutdown`] closes every open marker with `runner_shutdown`.
//!
//! Contract: inputs `handle_refreshed`, `handle_lookup` and `shutdown`, each with `now` (epoch
//! milliseconds, the events' `ts`) last; outputs drained with `poll_output` until `None`.

use crate::EpochMs;
use std::collections::{BTreeSet, VecDeque};

use super::activity::{ActivityEvent, CloseReason};
use crate::domain::objective::{Objective, Status};

/// What `GET /objectives/:id` said about an objective whose marker may close.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// 200 with the objective.
    Found(Box<Objective>),
    /// 403: the member may no longer see it.
    Forbidden,
    /// 404.
    NotFound,
    /// Anything else (network error, 5xx).
    Failed,
}

/// Something for the driver, in order.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum MarkerOutput {
    /// Record this `objective_open` / `objective_close` event.
    Record(Box<ActivityEvent>),
    /// Look this objective up (`GET /objectives/:id`) and answer with
    /// [`ObjectiveMarkers::handle_lookup`]: it left the open set while its marker is open.
    LookUp(String),
}

/// The open markers of one member. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct ObjectiveMarkers {
    me: String,
    open: BTreeSet<String>,
    out: VecDeque<MarkerOutput>,
}

impl ObjectiveMarkers {
    /// No marker open yet.
    pub fn new(me: impl Into<String>) -> Self {
        Self {
            me: me.into(),
            open: BTreeSet::new(),
            out: VecDeque::new(),
        }
    }

    fn mine(&self, o: &Objective) -> bool {
        o.assignee == self.me && matches!(o.status, Status::Active | Status::Blocked)
    }

    /// The open objectives now, at `now`: an open for each new one, then a look-up for each id
    /// gone from the set while its marker is open.
    pub fn handle_refreshed(&mut self, objectives: &[Objective], now: EpochMs) {
        let current: BTreeSet<&str> = objectives
            .iter()
            .filter(|o| self.mine(o))
            .map(|o| o.id.as_str())
            .collect();
        for id in &current {
            if self.open.insert((*id).to_owned()) {
                self.out.push_back(MarkerOutput::Record(Box::new(
                    ActivityEvent::ObjectiveOpen {
                        ts: now,
                        objective_id: (*id).to_owned(),
                    },
                )));
            }
        }
        let gone: Vec<String> = self
            .open
            .iter()
            .filter(|id| !current.contains(id.as_str()))
            .cloned()
            .collect();
        self.out.extend(gone.into_iter().map(MarkerOutput::LookUp));
    }

    /// The look-up of a gone id, at `now`: its close event, or nothing (the marker stays open).
    pub fn handle_lookup(&mut self, id: &str, lookup: &Lookup, now: EpochMs) {
        if let Some(close) = self.close_reason(id, lookup, now) {
            self.out.push_back(MarkerOutput::Record(Box::new(close)));
        }
    }

    fn close_reason(&mut self, id: &str, lookup: &Lookup, ts: EpochMs) -> Option<ActivityEvent> {
        if !self.open.contains(id) {
            return None;
        }
        let result = match lookup {
            Lookup::Found(o) if o.assignee != self.me => CloseReason::Reassigned,
            Lookup::Found(o) => match o.status {
                Status::Done => CloseReason::Done,
                Status::Cancelled => CloseReason::Cancelled,
                Status::Active | Status::Blocked => return None,
            },
            Lookup::Forbidden => CloseReason::Reassigned,
            Lookup::NotFound => CloseReason::Cancelled,
            Lookup::Failed => return None,
        };
        self.open.remove(id);
        Some(ActivityEvent::ObjectiveClose {
            ts,
            objective_id: id.to_owned(),
            result,
        })
    }

    /// Closes every open marker with `runner_shutdown`, at `now`.
    pub fn shutdown(&mut self, now: EpochMs) {
        let closes = std::mem::take(&mut self.open)
            .into_iter()
            .map(|objective_id| {
                MarkerOutput::Record(Box::new(ActivityEvent::ObjectiveClose {
                    ts: now,
                    objective_id,
                    result: CloseReason::RunnerShutdown,
                }))
            });
        self.out.extend(closes);
    }

    /// The next output.
    pub fn poll_output(&mut self) -> Option<MarkerOutput> {
        self.out.pop_front()
    }

    /// The ids with an open marker.
    pub fn open_ids(&self) -> impl Iterator<Item = &str> {
        self.open.iter().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events recorded and the ids looked up since the last drain.
    fn drain(m: &mut ObjectiveMarkers) -> (Vec<ActivityEvent>, Vec<String>) {
        let (mut events, mut lookups) = (Vec::new(), Vec::new());
        while let Some(output) = m.poll_output() {
            match output {
                MarkerOutput::Record(event) => events.push(*event),
                MarkerOutput::LookUp(id) => lookups.push(id),
            }
        }
        (events, lookups)
    }

    fn refreshed(
        m: &mut ObjectiveMarkers,
        objectives: &[Objective],
        ts: EpochMs,
    ) -> (Vec<ActivityEvent>, Vec<String>) {
        m.handle_refreshed(objectives, ts);
        drain(m)
    }

    fn resolve(
        m: &mut ObjectiveMarkers,
        id: &str,
        lookup: &Lookup,
        ts: EpochMs,
    ) -> Option<ActivityEvent> {
        m.handle_lookup(id, lookup, ts);
        let (events, lookups) = drain(m);
        assert!(lookups.is_empty() && events.len() <= 1);
        events.into_iter().next()
    }

    fn shutdown(m: &mut ObjectiveMarkers, ts: EpochMs) -> Vec<ActivityEvent> {
        m.shutdown(ts);
        drain(m).0
    }

    fn obj(id: &str, assignee: &str, status: Status) -> Objective {
        serde_json::from_value(serde_json::json!({
            "id": id, "title": "t", "body": "", "outcome": "o", "status": status,
            "assignee": assignee, "originator": "director", "watchers": [],
            "createdAt": 1, "updatedAt": 1, "completedAt": null, "result": null,
            "blockReason": null, "attachments": []
        }))
        .unwrap()
    }

    #[test]
    fn opens_only_mine_and_closes_with_the_real_reason() {
        let mut m = ObjectiveMarkers::new("builder");
        let (opens, gone) = refreshed(
            &mut m,
            &[
                obj("a", "builder", Status::Active),
                obj("b", "builder", Status::Blocked),
                obj("c", "reviewer", Status::Active),
                obj("d", "builder", Status::Active),
                obj("e", "builder", Status::Active),
            ],
            10,
        );
        assert_eq!(opens.len(), 4);
        assert!(gone.is_empty());
        let (opens, gone) = refreshed(&mut m, &[obj("e", "builder", Status::Active)], 20);
        assert!(opens.is_empty());
        assert_eq!(gone, ["a", "b", "d"]);
        let close = |e: Option<ActivityEvent>| match e {
            Some(ActivityEvent::ObjectiveClose { result, .. }) => Some(result),
            _ => None,
        };
        let found = |o| Lookup::Found(Box::new(o));
        assert_eq!(
            close(resolve(
                &mut m,
                "a",
                &found(obj("a", "reviewer", Status::Active)),
                21
            )),
            Some(CloseReason::Reassigned)
        );
        assert_eq!(
            close(resolve(
                &mut m,
                "b",
                &found(obj("b", "builder", Status::Cancelled)),
                21
            )),
            Some(CloseReason::Cancelled)
        );
        assert_eq!(close(resolve(&mut m, "d", &Lookup::Failed, 21)), None);
        let (_, gone) = refreshed(&mut m, &[obj("e", "builder", Status::Active)], 30);
        assert_eq!(gone, ["d"]);
        assert_eq!(
            close(resolve(
                &mut m,
                "d",
                &found(obj("d", "builder", Status::Done)),
                31
            )),
            Some(CloseReason::Done)
        );
        assert_eq!(
            close(resolve(&mut m, "d", &Lookup::NotFound, 31)),
            None,
            "closed once"
        );
        let last = shutdown(&mut m, 40);
        assert_eq!(
            last,
            [ActivityEvent::ObjectiveClose {
                ts: 40,
                objective_id: "e".into(),
                result: CloseReason::RunnerShutdown
            }]
        );
        assert!(shutdown(&mut m, 41).is_empty());
    }
}
