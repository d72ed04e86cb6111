//! What the turn-driven runners (Codex, ACP agents) share about delivering broker events as
//! turns: the event as the sink takes it ([`SinkEvent`]), the bundling window ([`Bundle`]), and
//! the "not delivered" / "turn failed" notices its sender gets when the agent did not take it or
//! the turn carrying it failed ([`Undelivered`]).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::domain::message::Message as BrokerMessage;

/// How long events are gathered into one input (from the first buffered one).
pub const BUNDLE_WINDOW: Duration = Duration::from_millis(200);

/// The `data` key that marks a "not delivered" notice (its value: the undelivered message ids).
/// An event carrying it never causes a notice of its own.
pub const UNDELIVERED_KEY: &str = "undelivered";

/// One event for the sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkEvent {
    /// The rendered `<channel>` text.
    pub text: String,
    /// Whom to tell if it cannot be delivered: `(sender, message id)`.
    pub reply_to: Option<(String, String)>,
}

impl SinkEvent {
    /// The event for `message` as delivered to member `me`: its [`codex_text`] and, unless the
    /// message is `me`'s own, a system notice (`from` absent or `ac7`), or itself a "not
    /// delivered" notice, its sender to tell on failure.
    ///
    /// [`codex_text`]: crate::domain::channel::codex_text
    pub fn from_message(message: &BrokerMessage, me: &str) -> Self {
        let reply_to = message
            .from
            .as_deref()
            .filter(|from| !from.is_empty() && *from != me && *from != "ac7")
            .filter(|_| !message.data.contains_key(UNDELIVERED_KEY))
            .map(|from| (from.to_owned(), message.id.clone()));
        Self {
            text: crate::domain::channel::codex_text(message),
            reply_to,
        }
    }
}

impl From<String> for SinkEvent {
    /// An event with nobody to tell.
    fn from(text: String) -> Self {
        Self {
            text,
            reply_to: None,
        }
    }
}

/// Events waiting to reach the agent as one input, and the bundling window they gather in: the
/// first event of a bundle opens the window, which closes `window` later (events that come
/// meanwhile join the bundle). The machine decides when a closed window's events go (a turn
/// may be running).
#[derive(Debug, Clone, Default)]
pub struct Bundle {
    events: VecDeque<SinkEvent>,
    closes_at: Option<Instant>,
}

impl Bundle {
    /// Queues `event`; opens the window (until `now + window`) unless it is open.
    pub fn push(&mut self, event: SinkEvent, now: Instant, window: Duration) {
        self.events.push_back(event);
        self.closes_at.get_or_insert(now + window);
    }

    /// Puts `events` back in front, in their order (they could not go); the window stays as it
    /// is.
    pub fn put_back(&mut self, events: Vec<SinkEvent>) {
        for event in events.into_iter().rev() {
            self.events.push_front(event);
        }
    }

    /// When the open window closes.
    pub fn closes_at(&self) -> Option<Instant> {
        self.closes_at
    }

    /// Whether events are gathering in an open window.
    pub fn is_gathering(&self) -> bool {
        self.closes_at.is_some()
    }

    /// At `now`: whether the open window is over; if so, it is closed.
    pub fn window_over(&mut self, now: Instant) -> bool {
        let over = self.closes_at.is_some_and(|at| now >= at);
        if over {
            self.closes_at = None;
        }
        over
    }

    /// Closes the window now (what is queued may go at once).
    pub fn close_window(&mut self) {
        self.closes_at = None;
    }

    /// Takes every queued event, oldest first (the window is left as it is).
    pub fn take(&mut self) -> Vec<SinkEvent> {
        self.events.drain(..).collect()
    }

    /// Events queued.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// What became of the events a notice is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticeKind {
    /// The agent refused the request carrying them.
    Refused,
    /// The agent took them, but the turn that carried them failed.
    TurnFailed,
}

/// Events from one sender that the agent did not take, or whose turn failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undelivered {
    /// The sender.
    pub to: String,
    /// Their message ids, in push order.
    pub msg_ids: Vec<String>,
    /// Why (the agent's error message, or the failed turn's reason).
    pub reason: String,
    /// Refused, or carried by a failed turn.
    pub kind: NoticeKind,
}

impl Undelivered {
    /// The `POST /push` body telling the sender, sent as member `me` whose agent is codex.
    pub fn push_body(&self, me: &str) -> Value {
        self.push_body_for(me, "codex")
    }

    /// The `POST /push` body telling the sender, sent as member `me` whose agent is called
    /// `agent`: a `warning` DM whose `data` carries [`UNDELIVERED_KEY`] with the message ids.
    pub fn push_body_for(&self, me: &str, agent: &str) -> Value {
        let ids = self.msg_ids.join(", ");
        let (what, verb, them) = if self.msg_ids.len() == 1 {
            ("your message", "was", "it")
        } else {
            ("your messages", "were", "them")
        };
        let (title, body) = match self.kind {
            NoticeKind::Refused => (
                "not delivered",
                format!(
                    "{what} {ids} {verb} not delivered to {me}: {agent} did not take {them} ({}). Send {them} again later, or reach {me} another way.",
                    self.reason
                ),
            ),
            NoticeKind::TurnFailed => (
                "turn failed",
                format!(
                    "{what} {ids} reached {me}, but the {agent} turn carrying {them} failed ({}), so {me} may not have acted on {them}. Send {them} again later, or reach {me} another way.",
                    self.reason
                ),
            ),
        };
        json!({
            "to": self.to,
            "level": "warning",
            "title": title,
            "body": body,
            "data": { UNDELIVERED_KEY: ids },
        })
    }
}

/// A turn that the agent reported failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnFailure {
    /// The turn's id.
    pub turn_id: String,
    /// Why it failed.
    pub reason: String,
    /// The ids of the messages it carried that have a sender to tell, in push order.
    pub msg_ids: Vec<String>,
}

/// Message ids grouped by sender, in name order.
fn by_sender(pairs: impl Iterator<Item = (String, String)>) -> BTreeMap<String, Vec<String>> {
    let mut by_sender: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (to, msg_id) in pairs {
        by_sender.entry(to).or_default().push(msg_id);
    }
    by_sender
}

/// A failed turn that carried `events`: the record, and one notice per sender (in name order).
pub(crate) fn turn_failure(
    turn_id: String,
    reason: String,
    events: &[SinkEvent],
) -> (TurnFailure, Vec<Undelivered>) {
    let msg_ids = events
        .iter()
        .filter_map(|e| e.reply_to.as_ref().map(|(_, id)| id.clone()))
        .collect();
    let notices = notices(events, &reason, NoticeKind::TurnFailed);
    (
        TurnFailure {
            turn_id,
            reason,
            msg_ids,
        },
        notices,
    )
}

/// One notice of `kind` per sender of `events` (in name order), naming all their events.
pub(crate) fn notices(events: &[SinkEvent], reason: &str, kind: NoticeKind) -> Vec<Undelivered> {
    by_sender(events.iter().filter_map(|e| e.reply_to.clone()))
        .into_iter()
        .map(|(to, msg_ids)| Undelivered {
            to,
            msg_ids,
            reason: reason.to_owned(),
            kind,
        })
        .collect()
}
