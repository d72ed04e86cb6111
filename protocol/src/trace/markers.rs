//! Objective markers (unlike the TypeScript runner's, a close says why and only objectives
//! assigned to the member count): which objectives the member works on,
//! as `objective_open` / `objective_close` events.
//!
//! - [`ObjectiveMarkers::refreshed`] takes the member's open objectives (the briefing's at
//!   start, then each tracker refresh). Only objectives assigned to the member with status
//!   `active` or `blocked` count (the broker also lists ones the member originated or watches).
//!   Ids new to the set → `objective_open`; ids gone are returned for a look-up.
//! - [`ObjectiveMarkers::resolve`] turns the look-up into the close reason: assigned to someone
//!   else (or no longer visible: 403) → `reassigned`; `done` → `done`; `cancelled` (or gone:
//!   404) → `cancelled`. A look-up that failed, or an objective still open and ours, keeps the
//!   marker open; the next refresh tries again.
//! - [`ObjectiveMarkers::shutdown`] closes every open marker with `runner_shutdown`.

use std::collections::BTreeSet;

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

/// The open markers of one member. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct ObjectiveMarkers {
    me: String,
    open: BTreeSet<String>,
}

impl ObjectiveMarkers {
    /// No marker open yet.
    pub fn new(me: impl Into<String>) -> Self {
        Self {
            me: me.into(),
            open: BTreeSet::new(),
        }
    }

    fn mine(&self, o: &Objective) -> bool {
        o.assignee == self.me && matches!(o.status, Status::Active | Status::Blocked)
    }

    /// The open objectives now: opens for the new ones, and the ids to look up (gone from the
    /// set while their marker is open).
    pub fn refreshed(
        &mut self,
        objectives: &[Objective],
        ts: u64,
    ) -> (Vec<ActivityEvent>, Vec<String>) {
        let now: BTreeSet<&str> = objectives
            .iter()
            .filter(|o| self.mine(o))
            .map(|o| o.id.as_str())
            .collect();
        let mut opens = Vec::new();
        for id in &now {
            if self.open.insert((*id).to_owned()) {
                opens.push(ActivityEvent::ObjectiveOpen {
                    ts,
                    objective_id: (*id).to_owned(),
                });
            }
        }
        let gone = self
            .open
            .iter()
            .filter(|id| !now.contains(id.as_str()))
            .cloned()
            .collect();
        (opens, gone)
    }

    /// The look-up of a gone id: the close event, or `None` (the marker stays open).
    pub fn resolve(&mut self, id: &str, lookup: &Lookup, ts: u64) -> Option<ActivityEvent> {
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

    /// Closes every open marker with `runner_shutdown`.
    pub fn shutdown(&mut self, ts: u64) -> Vec<ActivityEvent> {
        std::mem::take(&mut self.open)
            .into_iter()
            .map(|objective_id| ActivityEvent::ObjectiveClose {
                ts,
                objective_id,
                result: CloseReason::RunnerShutdown,
            })
            .collect()
    }

    /// The ids with an open marker.
    pub fn open_ids(&self) -> impl Iterator<Item = &str> {
        self.open.iter().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (opens, gone) = m.refreshed(
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
        let (opens, gone) = m.refreshed(&[obj("e", "builder", Status::Active)], 20);
        assert!(opens.is_empty());
        assert_eq!(gone, ["a", "b", "d"]);
        let close = |e: Option<ActivityEvent>| match e {
            Some(ActivityEvent::ObjectiveClose { result, .. }) => Some(result),
            _ => None,
        };
        let found = |o| Lookup::Found(Box::new(o));
        assert_eq!(
            close(m.resolve("a", &found(obj("a", "reviewer", Status::Active)), 21)),
            Some(CloseReason::Reassigned)
        );
        assert_eq!(
            close(m.resolve("b", &found(obj("b", "builder", Status::Cancelled)), 21)),
            Some(CloseReason::Cancelled)
        );
        assert_eq!(close(m.resolve("d", &Lookup::Failed, 21)), None);
        let (_, gone) = m.refreshed(&[obj("e", "builder", Status::Active)], 30);
        assert_eq!(gone, ["d"]);
        assert_eq!(
            close(m.resolve("d", &found(obj("d", "builder", Status::Done)), 31)),
            Some(CloseReason::Done)
        );
        assert_eq!(
            close(m.resolve("d", &Lookup::NotFound, 31)),
            None,
            "closed once"
        );
        let last = m.shutdown(40);
        assert_eq!(
            last,
            [ActivityEvent::ObjectiveClose {
                ts: 40,
                objective_id: "e".into(),
                result: CloseReason::RunnerShutdown
            }]
        );
        assert!(m.shutdown(41).is_empty());
    }
}
