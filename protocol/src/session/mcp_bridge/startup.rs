//! Start-up delivery: the runner's notifications are held until the agent can take them.
//!
//! The runner flushes the events it queued while no bridge was attached the moment a bridge
//! connects — milliseconds after the agent spawned it, long before the agent is listening. Claude
//! Code registers its `notifications/claude/channel` handler only after it sent
//! `notifications/initialized`, got the answer to its first `tools/list`, and a further
//! ~80–125 ms; anything earlier is dropped without a trace. So the bridge holds every
//! notification from the runner (channel events and `notifications/tools/list_changed` alike:
//! the client registers all its handlers after the handshake, and one queue keeps their order)
//! until
//!
//! 1. the agent has sent `notifications/initialized`, and
//! 2. the answer to its first `tools/list` has been written to it, and
//! 3. [`START_GRACE`] has passed since both became true (a timer: `poll_timeout` /
//!    `handle_timeout`).
//!
//! Then the held notifications go out in the order they arrived and every later one is relayed
//! at once: the hold costs nothing after start-up.
//!
//! The hold is bounded like the runner's queue: at most [`MAX_HELD_NOTIFICATIONS`] notifications
//! and [`MAX_HELD_BYTES`] bytes. At the bound the oldest are kept (they are what the agent missed
//! first) and each newer notification is refused and reported ([`super::BridgeEvent::HoldFull`],
//! logged as a warning); nothing is dropped without a log line. Held notifications are
//! discarded (and reported) only when the bridge tears down before the agent was ready.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long after the agent's first `tools/list` answer the held notifications wait.
///
/// Claude Code (2.1.x) registers its channel-notification handler ~80–125 ms after it receives
/// its first `tools/list` answer and silently drops channel notifications that arrive before
/// that; 250 ms is twice the worst delay measured, and short enough that nobody notices it at
/// start-up.
pub const START_GRACE: Duration = Duration::from_millis(250);

/// Notifications held at most before the agent is ready (the runner's queue holds as many).
pub const MAX_HELD_NOTIFICATIONS: usize = 1024;

/// Bytes of notifications held at most before the agent is ready.
pub const MAX_HELD_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone)]
enum Stage {
    /// Waiting for the handshake.
    Waiting { initialized: bool, listed: bool },
    /// Both conditions met; releasing at `until`.
    Grace { until: Instant },
    /// Relaying at once.
    Open,
}

/// What happened to an offered notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Relay it now.
    Pass(Vec<u8>),
    /// Held until the agent is ready.
    Held,
    /// The hold is full: not kept.
    Refused,
}

/// The hold's state. See the [module docs](self).
#[derive(Debug, Clone)]
pub(crate) struct StartupHold {
    stage: Stage,
    held: VecDeque<Vec<u8>>,
    held_bytes: usize,
    grace: Duration,
    max_count: usize,
    max_bytes: usize,
}

impl StartupHold {
    pub(crate) fn new(grace: Duration, max_count: usize, max_bytes: usize) -> Self {
        Self {
            stage: Stage::Waiting {
                initialized: false,
                listed: false,
            },
            held: VecDeque::new(),
            held_bytes: 0,
            grace,
            max_count,
            max_bytes,
        }
    }

    /// The agent sent `notifications/initialized`.
    pub(crate) fn initialized(&mut self, now: Instant) {
        if let Stage::Waiting { initialized, .. } = &mut self.stage {
            *initialized = true;
        }
        self.check(now);
    }

    /// The answer to a `tools/list` was written to the agent.
    pub(crate) fn tools_listed(&mut self, now: Instant) {
        if let Stage::Waiting { listed, .. } = &mut self.stage {
            *listed = true;
        }
        self.check(now);
    }

    fn check(&mut self, now: Instant) {
        if let Stage::Waiting {
            initialized: true,
            listed: true,
        } = self.stage
        {
            self.stage = Stage::Grace {
                until: now + self.grace,
            };
        }
    }

    /// A notification line for the agent.
    pub(crate) fn offer(&mut self, line: Vec<u8>) -> Offer {
        if matches!(self.stage, Stage::Open) {
            return Offer::Pass(line);
        }
        if self.held.len() >= self.max_count || self.held_bytes + line.len() > self.max_bytes {
            return Offer::Refused;
        }
        self.held_bytes += line.len();
        self.held.push_back(line);
        Offer::Held
    }

    /// When the grace ends, while it runs.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self.stage {
            Stage::Grace { until } => Some(until),
            _ => None,
        }
    }

    /// Ends the grace when it is due; returns the held notifications to relay, in order.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Option<VecDeque<Vec<u8>>> {
        match self.stage {
            Stage::Grace { until } if now >= until => {
                self.stage = Stage::Open;
                self.held_bytes = 0;
                Some(std::mem::take(&mut self.held))
            }
            _ => None,
        }
    }

    /// Whether notifications are relayed at once.
    pub(crate) fn is_open(&self) -> bool {
        matches!(self.stage, Stage::Open)
    }

    /// Notifications held now.
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// Teardown: forgets what is held; returns how many.
    pub(crate) fn discard(&mut self) -> usize {
        let count = self.held.len();
        self.held.clear();
        self.held_bytes = 0;
        count
    }
}
