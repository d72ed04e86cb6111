//! Start-up delivery: the runner's notifications are held until the agent can take them.
//!
//! The runner flushes the events it queued while no bridge was attached the moment a bridge
//! connects — milliseconds after the agent spawned it, long before the agent is listening. An MCP
//! client that drops notifications it has no handler for yet loses them. So the bridge holds every
//! notification from the runner (channel events and `notifications/tools/list_changed` alike: one
//! queue keeps their order) until the agent is ready. The hold starts to end once
//!
//! 1. the agent has sent `notifications/initialized`, and
//! 2. the answer to its first `tools/list` has been written to it.
//!
//! What follows depends on the client (its `clientInfo.name` in `initialize`):
//!
//! - **Claude Code** (`claude-code`) is *probed*: the bridge writes
//!   `notifications/tools/list_changed` at once, then again after [`PROBE_INTERVAL`], doubling the
//!   gap up to [`PROBE_MAX_INTERVAL`]. Claude Code registers its `notifications/tools/list_changed`
//!   handler in the same step as its `notifications/claude/channel` handler, right after it, and
//!   drops either notification before that step without a trace; once registered, a
//!   `list_changed` makes it ask `tools/list` again. So the first `tools/list` request after a
//!   probe proves the channel handler is in place, and everything written after it is taken
//!   (Claude handles its stdin in order): the hold opens then. Should no such request come
//!   within [`PROBE_CEILING`] (a client that never answers the probe), the hold opens anyway.
//! - **Any other client** waits a fixed [`START_GRACE`] and nothing else is written to it.
//!
//! Then the held notifications go out in the order they arrived and every later one is relayed
//! at once: the hold costs nothing after start-up.
//!
//! # What Claude Code does, measured
//!
//! Claude Code 2.1.197, interactive (in tmux, with `--dangerously-load-development-channels
//! server:ac7`), against an MCP server that logs its stdio with timestamps and answers at once,
//! and a local stand-in for the Messages API (a channel notification Claude took starts a model
//! turn whose request carries its text; one it dropped never shows up). From the answer to its
//! first `tools/list` on, the server wrote a numbered channel notification every 20 or 50 ms. On
//! a 2-core machine shared with other builds:
//!
//! - After `initialize`, `notifications/initialized` and `tools/list`, Claude sends nothing on
//!   its own (no `resources/list`, `prompts/list` or `ping`: the server offers only tools and the
//!   channel). Registering its handlers leaves no trace on the wire.
//! - The first notification Claude took was written 20–274 ms after the answer (7 runs); with
//!   three extra busy loops, 60–574 ms (8 runs); with Claude stopped (SIGSTOP) for 500 ms right
//!   after the answer, 613–733 ms, and once more than 1.2 s (4 runs). Everything written earlier
//!   was lost.
//! - With a `notifications/tools/list_changed` written before each channel notification, the
//!   first `tools/list` after one came 99–1782 ms after the answer, always 28–389 ms *after* the
//!   first channel notification Claude took, and not one channel notification written after that
//!   request was lost (18 of those runs).
//! - `claude -p` (print mode) takes no channel notifications at all; with `--input-format
//!   stream-json` it answered the probes from 27 ms on.
//!
//! # Bounds
//!
//! The hold is bounded like the runner's queue: at most [`MAX_HELD_NOTIFICATIONS`] notifications
//! and [`MAX_HELD_BYTES`] bytes. At the bound the oldest are kept (they are what the agent missed
//! first) and each newer notification is refused and reported ([`super::BridgeEvent::HoldFull`],
//! logged as a warning); nothing is dropped without a log line. Held notifications are
//! discarded (and reported) only when the bridge tears down before the agent was ready; they were
//! never acknowledged, so the runner gives them to the next bridge.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::dialect::mcp;

/// How long after the agent's first `tools/list` answer the held notifications wait, for a client
/// that is not probed (anything but Claude Code).
pub const START_GRACE: Duration = Duration::from_millis(250);

/// The gap after the first probe of Claude Code; each further gap is twice the last, up to
/// [`PROBE_MAX_INTERVAL`].
pub const PROBE_INTERVAL: Duration = Duration::from_millis(50);

/// The longest gap between two probes.
pub const PROBE_MAX_INTERVAL: Duration = Duration::from_millis(400);

/// How long a probed client may take to answer before the hold opens anyway. Claude Code took
/// up to 1.8 s on a loaded machine (stopped for 0.5 s besides); this leaves room for a machine far
/// busier than that.
pub const PROBE_CEILING: Duration = Duration::from_secs(10);

/// Notifications held at most before the agent is ready (the runner's queue holds as many).
pub const MAX_HELD_NOTIFICATIONS: usize = 1024;

/// Bytes of notifications held at most before the agent is ready.
pub const MAX_HELD_BYTES: usize = 16 * 1024 * 1024;

/// What ended the hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleasedBy {
    /// The agent asked `tools/list` after a probe: its handlers are in place.
    Probe {
        /// Probes written by then.
        probes: u32,
    },
    /// A probed agent never asked `tools/list` after a probe within [`PROBE_CEILING`].
    Ceiling {
        /// Probes written by then.
        probes: u32,
    },
    /// The fixed [`START_GRACE`] of an agent that is not probed passed.
    Grace,
}

/// The hold's timings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    pub(crate) grace: Duration,
    pub(crate) probe_interval: Duration,
    pub(crate) probe_max_interval: Duration,
    pub(crate) probe_ceiling: Duration,
}

#[derive(Debug, Clone)]
enum Stage {
    /// Waiting for the handshake.
    Waiting { initialized: bool, listed: bool },
    /// Not probed: releasing at `until`.
    Grace { until: Instant },
    /// Probed: the next probe is due at `next`; released when the agent asks `tools/list` after
    /// one, or at `until`.
    Probing {
        next: Instant,
        interval: Duration,
        until: Instant,
        probes: u32,
    },
    /// Relaying at once.
    Open,
}

/// What an offered notification became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Relay it now.
    Pass(Vec<u8>),
    /// Held until the agent is ready.
    Held,
    /// The hold is full: not kept.
    Refused,
}

/// What is due now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Due {
    /// Nothing (yet).
    Nothing,
    /// Write a probe (`notifications/tools/list_changed`) to the agent.
    Probe {
        /// Probes written with this one.
        count: u32,
    },
    /// The hold is over: relay these, in order.
    Release {
        held: VecDeque<Vec<u8>>,
        by: ReleasedBy,
    },
}

/// The hold's state. See the [module docs](self).
#[derive(Debug, Clone)]
pub(crate) struct StartupHold {
    stage: Stage,
    /// The agent is Claude Code: probed.
    probed: bool,
    held: VecDeque<Vec<u8>>,
    held_bytes: usize,
    timing: Timing,
    max_count: usize,
    max_bytes: usize,
}

impl StartupHold {
    pub(crate) fn new(timing: Timing, max_count: usize, max_bytes: usize) -> Self {
        Self {
            stage: Stage::Waiting {
                initialized: false,
                listed: false,
            },
            probed: false,
            held: VecDeque::new(),
            held_bytes: 0,
            timing,
            max_count,
            max_bytes,
        }
    }

    /// The agent's `initialize` named the client `name`. Counts only before the handshake ends.
    pub(crate) fn client(&mut self, name: Option<&str>) {
        if matches!(self.stage, Stage::Waiting { .. }) {
            self.probed = name == Some(mcp::CLAUDE_CODE_CLIENT);
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
            self.stage = if self.probed {
                Stage::Probing {
                    next: now,
                    interval: self.timing.probe_interval,
                    until: now + self.timing.probe_ceiling,
                    probes: 0,
                }
            } else {
                Stage::Grace {
                    until: now + self.timing.grace,
                }
            };
        }
    }

    /// The agent asked `tools/list`. After a probe, that is the answer to it: the hold is over.
    pub(crate) fn tools_requested(&mut self) -> Due {
        match self.stage {
            Stage::Probing { probes, .. } if probes > 0 => {
                self.release(ReleasedBy::Probe { probes })
            }
            _ => Due::Nothing,
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

    /// When [`handle_timeout`](Self::handle_timeout) is next due: the end of the grace, or the
    /// next probe or the ceiling, whichever is first.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self.stage {
            Stage::Grace { until } => Some(until),
            Stage::Probing { next, until, .. } => Some(next.min(until)),
            _ => None,
        }
    }

    /// What is due at `now`; call until [`Due::Nothing`].
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Due {
        match &mut self.stage {
            Stage::Grace { until } if now >= *until => self.release(ReleasedBy::Grace),
            Stage::Probing { until, probes, .. } if now >= *until => {
                let probes = *probes;
                self.release(ReleasedBy::Ceiling { probes })
            }
            Stage::Probing {
                next,
                interval,
                probes,
                ..
            } if now >= *next => {
                *probes += 1;
                *next = now + *interval;
                *interval = (*interval * 2).min(self.timing.probe_max_interval);
                Due::Probe { count: *probes }
            }
            _ => Due::Nothing,
        }
    }

    fn release(&mut self, by: ReleasedBy) -> Due {
        self.stage = Stage::Open;
        self.held_bytes = 0;
        Due::Release {
            held: std::mem::take(&mut self.held),
            by,
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
