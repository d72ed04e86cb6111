//! The runner's JSON-RPC client for `codex app-server`, with the channel sink that turns broker
//! events into turns.
//!
//! Start-up: `initialize`, then `thread/start` (briefing prose as `developerInstructions`,
//! `approvalPolicy: "never"`, `sandbox: "danger-full-access"`); [`CodexOutput::Ready`] carries the
//! thread id, [`CodexOutput::Failed`] the reason either failed. The thread's status (`notLoaded`,
//! `idle`, `active`, `systemError`) and its active turn are tracked from the `thread/start`
//! response and from `thread/started`, `thread/status/changed`, `turn/started` and
//! `turn/completed` notifications. Approval requests from codex are denied
//! (`{"decision":"deny","action":"cancel"}`); any other server request gets `-32601`.
//!
//! The sink ([`CodexClient::notify`]) takes [`SinkEvent`]s: a rendered `<channel>` text and
//! whom to tell if it cannot be delivered. Events arriving within [`BUNDLE_WINDOW`] of the first
//! buffered one are joined with `\n` into one text input. A flush (window elapsed, status changed,
//! shutdown) routes the bundle by the thread's state: `idle` or `systemError` → `turn/start`;
//! `active` with a known turn → `turn/steer` with `expectedTurnId`; no thread yet, `notLoaded`, or
//! `active` without a known turn → the events go back to the front of the buffer and wait. One
//! delivery is in flight at a time, so the order of events is the order they were pushed.
//!
//! A `turn/steer` that lost the race with the end of its turn (`expected active turn`, `no active
//! turn`, `not steerable`) is never dropped: its events wait, at the front, until that turn is
//! over for us too (`turn/completed`, another `turn/started`, or the thread leaving `active`), and
//! then go as a new `turn/start` (or steer the next turn); that turn is never steered again.
//!
//! A bundle codex refuses (a JSON-RPC error other than the steer race, e.g. an input over codex's
//! length limit) is split in halves, and each half is delivered on its own, before anything newer
//! — so one oversized event does not take the others down with it. Only a single event that codex
//! refuses is dropped ([`CodexEvent::Dropped`] for the log, at once). When the last part of a
//! refused bundle is settled, one [`CodexOutput::Undelivered`] per sender asks the driver to tell
//! that sender (a DM built by [`Undelivered::push_body`]) about all of their events that codex
//! refused. Events still waiting at shutdown are reported the same way.
//!
//! `systemError` is what codex reports after a turn failed (the model endpoint answered an error,
//! the stream broke): the thread still takes a new `turn/start`, so it is routed like `idle` —
//! one failed turn must not make the member deaf. The events each turn carried are remembered by
//! turn id (from the `turn/start` answer, or the steered turn); when `turn/completed` says the turn
//! `failed`, [`CodexOutput::TurnFailed`] reports it with its reason (the turn's `error.message`,
//! else the last final `error` notification of that turn), and each sender whose event it carried
//! gets one [`CodexOutput::Undelivered`] of kind [`NoticeKind::TurnFailed`].
//!
//! Events without a sender to tell — the member's own, system notices, and such notices
//! themselves (data key [`UNDELIVERED_KEY`]) — are never the subject of a notice, so two members
//! can never bounce notices.
//!
//! After [`CodexClient::shutdown`] codex's stdin is closed and nothing more is written to it:
//! application requests still open (and any made later) are answered with an error at once, a
//! late start-up answer starts nothing, and a delivery answered late is either taken or dropped
//! (reported as above), never kept.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::codec::json::RawJson;
use crate::codec::jsonrpc::{self, Id, METHOD_NOT_FOUND, Message, Outcome, RpcError};
use crate::codec::line::{Line, LineDecoder};
use crate::session::pending::Pending;

pub use super::delivery::{
    BUNDLE_WINDOW, NoticeKind, SinkEvent, TurnFailure, UNDELIVERED_KEY, Undelivered,
};
use super::delivery::{Bundle, turn_failure};

/// Server requests answered with a denial.
pub const DENIED_REQUESTS: [&str; 5] = [
    "item/commandExecution/requestApproval",
    "item/fileChange/requestApproval",
    "item/permissions/requestApproval",
    "item/tool/requestUserInput",
    "mcpServer/elicitation/request",
];

const STEER_RACE: [&str; 3] = ["expected active turn", "no active turn", "not steerable"];

/// The reason of a failed turn that codex gave none for.
const TURN_FAILED: &str = "the turn failed";

/// How many ended turns are remembered (for a delivery answered after its turn ended).
const ENDED_TURNS: usize = 16;

/// What the runner asks of codex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodexConfig {
    /// `clientInfo.name`.
    pub client_name: String,
    /// `clientInfo.version`.
    pub client_version: String,
    /// The thread's working directory.
    pub cwd: String,
    /// The briefing prose; omitted when empty.
    pub developer_instructions: String,
    /// `--model`, if given.
    pub model: Option<String>,
    /// How long events are gathered into one delivery after the first ([`BUNDLE_WINDOW`]
    /// normally).
    pub bundle_window: Duration,
}

/// The thread's status as codex reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadStatus {
    /// Not loaded yet.
    NotLoaded,
    /// Waiting for input.
    Idle,
    /// Running a turn.
    Active,
    /// Broken.
    SystemError,
}

/// Why an application request ([`CodexClient::request`]) got no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodexRequestError {
    /// Codex answered with a JSON-RPC error.
    #[error("{message}")]
    Codex {
        /// The JSON-RPC error code.
        code: i64,
        /// Codex's message.
        message: String,
    },
    /// The session ended (shutdown, or codex went away) before codex answered.
    #[error("the codex session ended before codex answered")]
    SessionEnded,
}

/// Something for the driver to do or know.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodexOutput {
    /// Write this line to codex's stdin.
    Transmit(Vec<u8>),
    /// The thread exists; the sink delivers from now on.
    Ready {
        /// Its id.
        thread_id: String,
    },
    /// Start-up failed (`initialize` or `thread/start`): tear down.
    Failed(String),
    /// Close codex's stdin (after [`CodexClient::shutdown`]).
    CloseStdin,
    /// The answer to a [`CodexClient::request`].
    Response {
        /// The id `request` returned.
        id: u64,
        /// The result, or the error message.
        outcome: Result<Value, CodexRequestError>,
    },
    /// Events codex did not take, or whose turn failed: tell their sender (see
    /// [`Undelivered::push_body`]).
    Undelivered(Undelivered),
    /// A turn failed (record it; its senders get [`CodexOutput::Undelivered`]).
    TurnFailed(TurnFailure),
    /// Something worth logging.
    Event(CodexEvent),
}

/// Things worth logging.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodexEvent {
    /// A bundle went out.
    Delivering {
        /// `turn/start` or `turn/steer`.
        method: &'static str,
        /// Events in it.
        events: usize,
    },
    /// Events that could not be delivered.
    Dropped {
        /// How many.
        events: usize,
        /// Why.
        reason: String,
    },
    /// The thread's status changed.
    Status(ThreadStatus),
    /// A server request was answered (`denied` = with a denial, else `-32601`).
    ServerRequest {
        /// Its method.
        method: String,
        /// Whether it was an approval we denied.
        denied: bool,
    },
    /// An `error` notification from codex.
    CodexError(String),
    /// A line that is not JSON-RPC.
    Unparseable {
        /// Its length.
        len: usize,
    },
}

#[derive(Debug, Clone)]
enum Call {
    Initialize,
    ThreadStart,
    Deliver {
        events: Vec<SinkEvent>,
        /// The turn steered (`turn/steer`), or `None` (`turn/start`).
        steer: Option<String>,
        /// A part of a refused bundle (waits as a unit, before the buffer).
        part: bool,
    },
    Interrupt,
    App,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// `initialize` sent, not answered yet.
    Initializing,
    /// `thread/start` sent, not answered yet.
    StartingThread,
    /// The thread exists; events can be delivered.
    Running {
        /// The thread every turn goes to.
        thread_id: String,
        /// The turn codex is running, between `turn/started` and `turn/completed`.
        active_turn: Option<String>,
    },
    /// `initialize` or `thread/start` failed.
    Failed,
    /// `shutdown` ran.
    Closed,
}

/// The client's state. See the [module docs](self).
///
/// Contract: every input and command takes `now` last. What happened is `handle_bytes` (codex's
/// stdout) and `handle_timeout` (the bundle window; [`poll_timeout`](Self::poll_timeout) says
/// when); the application emits channel events with [`notify`](Self::notify), sends requests of
/// its own with [`request`](Self::request) and ends with [`shutdown`](Self::shutdown). Outputs are
/// drained from [`poll_output`](Self::poll_output): [`CodexOutput::Transmit`] (a line for codex's
/// stdin), `Ready` / `Failed`, `CloseStdin`, `Response`s, `Undelivered` notices and `Event`s.
#[derive(Debug, Clone)]
pub struct CodexClient {
    config: CodexConfig,
    phase: Phase,
    lines: LineDecoder,
    calls: Pending<Call>,
    status: ThreadStatus,
    bundle: Bundle,
    /// Parts of a refused bundle still to deliver, each on its own, before the buffer.
    parts: VecDeque<Vec<SinkEvent>>,
    /// Events codex refused, with its reason, not reported yet (while parts are pending).
    refused: Vec<(SinkEvent, String)>,
    /// The turn a steer lost the race with: it is over, never steer it again.
    lost_turn: Option<String>,
    /// What each turn carried, by turn id, until it completes.
    carried: BTreeMap<String, Vec<SinkEvent>>,
    /// The last final `error` notification of each running turn.
    turn_errors: BTreeMap<String, String>,
    /// Turns that completed lately, with the failure reason of those that failed.
    ended: VecDeque<(String, Option<String>)>,
    delivering: bool,
    out: VecDeque<CodexOutput>,
}

#[derive(Deserialize)]
struct StatusWire {
    #[serde(rename = "type")]
    kind: String,
}

fn parse_status(value: Option<&Value>) -> Option<ThreadStatus> {
    let status: StatusWire = serde_json::from_value(value?.clone()).ok()?;
    Some(match status.kind.as_str() {
        "notLoaded" => ThreadStatus::NotLoaded,
        "idle" => ThreadStatus::Idle,
        "active" => ThreadStatus::Active,
        "systemError" => ThreadStatus::SystemError,
        _ => return None,
    })
}

impl CodexClient {
    /// A client for a codex that has just been spawned: `initialize` is its first output.
    pub fn new(config: CodexConfig, _now: Instant) -> Self {
        let mut client = Self {
            config,
            phase: Phase::Initializing,
            lines: LineDecoder::new(64 * 1024 * 1024),
            calls: Pending::new(),
            status: ThreadStatus::NotLoaded,
            bundle: Bundle::default(),
            parts: VecDeque::new(),
            refused: Vec::new(),
            lost_turn: None,
            carried: BTreeMap::new(),
            turn_errors: BTreeMap::new(),
            ended: VecDeque::new(),
            delivering: false,
            out: VecDeque::new(),
        };
        let params = json!({"clientInfo": {"name": client.config.client_name, "version": client.config.client_version}});
        client.request_call("initialize", &params, Call::Initialize);
        client
    }

    /// An event for the agent.
    pub fn notify(&mut self, event: impl Into<SinkEvent>, now: Instant) {
        let event = event.into();
        if matches!(self.phase, Phase::Closed | Phase::Failed) {
            self.refuse(vec![event], "codex is not running");
            self.report_refused();
            return;
        }
        self.bundle.push(event, now, self.config.bundle_window);
    }

    /// Bytes from codex's stdout.
    pub fn handle_bytes(&mut self, bytes: &[u8], now: Instant) {
        let mut lines = std::mem::take(&mut self.lines);
        lines.push(bytes);
        while let Some(line) = lines.decode() {
            match line {
                Line::Oversized { len } => self.event(CodexEvent::Unparseable { len }),
                Line::Complete(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => {}
                Line::Complete(bytes) => match jsonrpc::parse_message(bytes) {
                    Ok(message) => self.message(message, now),
                    Err(_) => self.event(CodexEvent::Unparseable { len: bytes.len() }),
                },
            }
        }
        self.lines = lines;
    }

    /// When `handle_timeout` is next due (the bundle window).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.bundle.closes_at()
    }

    /// Time passed: flushes the bundle when its window is over.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.bundle.window_over(now) {
            self.flush();
        }
    }

    /// Teardown: flush what can be delivered, interrupt the active turn, close stdin.
    pub fn shutdown(&mut self, _now: Instant) {
        if matches!(self.phase, Phase::Closed) {
            return;
        }
        self.bundle.close_window();
        self.flush();
        if let Phase::Running {
            thread_id,
            active_turn: Some(turn_id),
        } = &self.phase
        {
            let params = json!({"threadId": thread_id, "turnId": turn_id});
            self.request_call("turn/interrupt", &params, Call::Interrupt);
        }
        let mut left: Vec<SinkEvent> = self.parts.drain(..).flatten().collect();
        left.extend(self.bundle.take());
        if !left.is_empty() {
            self.refuse(left, "the session ended before codex could take it");
        }
        // Now: codex may never answer the delivery in flight (it reports its own events).
        self.report_refused();
        // Codex is not read any more: nobody may wait for its answer. Deliveries stay, so that
        // a late answer still says whether codex took their events.
        let ids: Vec<u64> = self.calls.ids().collect();
        for id in ids {
            if matches!(self.calls.get_mut(id), Some(Call::Deliver { .. })) {
                continue;
            }
            if let Some(Call::App) = self.calls.remove(id) {
                self.out.push_back(CodexOutput::Response {
                    id,
                    outcome: Err(CodexRequestError::SessionEnded),
                });
            }
        }
        self.phase = Phase::Closed;
        self.out.push_back(CodexOutput::CloseStdin);
    }

    /// Sends any other request to codex (e.g. `mcpServerStatus/list`); the answer comes out as
    /// [`CodexOutput::Response`] with the returned id.
    /// After [`shutdown`](Self::shutdown) it is answered at once with an error.
    pub fn request(&mut self, method: &str, params: &Value, _now: Instant) -> u64 {
        if matches!(self.phase, Phase::Closed) {
            let id = self.calls.insert(Call::App);
            self.calls.remove(id);
            self.out.push_back(CodexOutput::Response {
                id,
                outcome: Err(CodexRequestError::SessionEnded),
            });
            return id;
        }
        self.request_call(method, params, Call::App)
    }

    /// The next thing to do, until `None`.
    pub fn poll_output(&mut self) -> Option<CodexOutput> {
        self.out.pop_front()
    }

    /// The thread's id, once `thread/start` answered.
    pub fn thread_id(&self) -> Option<&str> {
        match &self.phase {
            Phase::Running { thread_id, .. } => Some(thread_id),
            Phase::Initializing | Phase::StartingThread | Phase::Failed | Phase::Closed => None,
        }
    }

    /// The thread's status.
    pub fn status(&self) -> ThreadStatus {
        self.status
    }

    /// The active turn, if known.
    pub fn active_turn(&self) -> Option<&str> {
        match &self.phase {
            Phase::Running { active_turn, .. } => active_turn.as_deref(),
            Phase::Initializing | Phase::StartingThread | Phase::Failed | Phase::Closed => None,
        }
    }

    /// Events waiting for delivery.
    pub fn buffered(&self) -> usize {
        self.bundle.len() + self.parts.iter().map(Vec::len).sum::<usize>()
    }

    fn message(&mut self, message: Message, now: Instant) {
        match message {
            Message::Response(response) => {
                let Some(id) = response.id.as_raw().parse::<u64>().ok() else {
                    return;
                };
                let Ok(call) = self.calls.take(id) else {
                    return;
                };
                self.response(id, call, response.outcome, now);
            }
            // Stdin is closed: there is no way to answer.
            Message::Request(_) if matches!(self.phase, Phase::Closed) => {}
            Message::Request(request) => {
                let denied = DENIED_REQUESTS.contains(&request.method.as_str());
                let mut line = Vec::new();
                if denied {
                    let result = RawJson::from_text(r#"{"decision":"deny","action":"cancel"}"#)
                        .expect("valid JSON");
                    jsonrpc::encode_response(&mut line, &request.id, &result);
                } else {
                    let error = RpcError::new(
                        METHOD_NOT_FOUND,
                        format!("method not found: {}", request.method),
                    );
                    jsonrpc::encode_error(&mut line, Some(&request.id), &error);
                }
                self.out.push_back(CodexOutput::Transmit(line));
                self.event(CodexEvent::ServerRequest {
                    method: request.method,
                    denied,
                });
            }
            Message::Notification(n) => {
                let params: Value = n
                    .params
                    .as_ref()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(Value::Null);
                match n.method.as_str() {
                    "thread/started" => {
                        if let (Some(id), Phase::Running { thread_id, .. }) =
                            (params["thread"]["id"].as_str(), &mut self.phase)
                        {
                            id.clone_into(thread_id);
                        }
                        if let Some(status) = parse_status(params["thread"].get("status")) {
                            self.set_status(status);
                        }
                    }
                    "thread/status/changed" => {
                        if let Some(status) = parse_status(params.get("status")) {
                            self.set_status(status);
                        }
                    }
                    "turn/started" => {
                        if let (Some(id), Phase::Running { active_turn, .. }) =
                            (params["turn"]["id"].as_str(), &mut self.phase)
                        {
                            *active_turn = Some(id.to_owned());
                            // Events waiting for a steerable turn can go now.
                            self.flush();
                        }
                    }
                    "turn/completed" => self.turn_completed(&params),
                    "error" => {
                        if params["willRetry"] != true
                            && let (Some(turn), Some(message)) = (
                                params["turnId"].as_str(),
                                params["error"]["message"].as_str(),
                            )
                        {
                            self.turn_errors.insert(turn.to_owned(), message.to_owned());
                        }
                        self.event(CodexEvent::CodexError(params.to_string()));
                    }
                    _ => {}
                }
            }
        }
    }

    fn response(&mut self, id: u64, call: Call, outcome: Outcome, _now: Instant) {
        let result = match outcome {
            Outcome::Result(result) => Ok(result.parse::<Value>().unwrap_or(Value::Null)),
            Outcome::Error(error) => Err(error),
        };
        match call {
            Call::Initialize => match result {
                Ok(_) => {
                    self.phase = Phase::StartingThread;
                    let mut params = json!({
                        "cwd": self.config.cwd,
                        "approvalPolicy": "never",
                        "sandbox": "danger-full-access",
                    });
                    if !self.config.developer_instructions.is_empty() {
                        params["developerInstructions"] = json!(self.config.developer_instructions);
                    }
                    if let Some(model) = &self.config.model {
                        params["model"] = json!(model);
                    }
                    self.request_call("thread/start", &params, Call::ThreadStart);
                }
                Err(error) => self.fail(format!("codex initialize failed: {}", error.message)),
            },
            Call::ThreadStart => match result {
                Ok(result) => {
                    let Some(id) = result["thread"]["id"].as_str() else {
                        return self.fail("codex thread/start failed: no thread id".into());
                    };
                    self.phase = Phase::Running {
                        thread_id: id.to_owned(),
                        active_turn: None,
                    };
                    self.out.push_back(CodexOutput::Ready {
                        thread_id: id.to_owned(),
                    });
                    match parse_status(result["thread"].get("status")) {
                        Some(status) => self.set_status(status),
                        None => self.flush(),
                    }
                }
                Err(error) => self.fail(format!("codex thread/start failed: {}", error.message)),
            },
            Call::Deliver {
                events,
                steer,
                part,
            } => {
                self.delivering = false;
                let closed = matches!(self.phase, Phase::Closed);
                match result {
                    Ok(result) => {
                        let turn =
                            steer.or_else(|| result["turn"]["id"].as_str().map(str::to_owned));
                        if let Some(turn) = turn {
                            self.carry(turn, events);
                        }
                    }
                    Err(error)
                        if !closed
                            && steer.is_some()
                            && STEER_RACE.iter().any(|s| error.message.contains(s)) =>
                    {
                        // That turn is over: wait for its end, then start a new one.
                        self.lost_turn = steer;
                        self.requeue(events, part);
                    }
                    Err(_) if !closed && events.len() > 1 => {
                        let mut first = events;
                        let second = first.split_off(first.len() / 2);
                        self.parts.push_front(second);
                        self.parts.push_front(first);
                    }
                    Err(error) => self.refuse(events, &error.message),
                }
                if !self.bundle.is_gathering() || !self.parts.is_empty() {
                    self.flush();
                }
                if !self.delivering && self.parts.is_empty() {
                    self.report_refused();
                }
            }
            Call::Interrupt => {}
            Call::App => self.out.push_back(CodexOutput::Response {
                id,
                outcome: result.map_err(|error| CodexRequestError::Codex {
                    code: error.code,
                    message: error.message,
                }),
            }),
        }
    }

    fn set_status(&mut self, status: ThreadStatus) {
        self.status = status;
        self.event(CodexEvent::Status(status));
        if status != ThreadStatus::NotLoaded {
            self.flush();
        }
    }

    /// Sends the next part of a refused bundle, else the buffered events, if the state allows;
    /// one delivery at a time.
    fn flush(&mut self) {
        if self.delivering || !matches!(self.phase, Phase::Running { .. }) {
            return;
        }
        if let Some(part) = self.parts.pop_front() {
            return self.route(part, true);
        }
        if self.bundle.is_empty() {
            return;
        }
        let events = self.bundle.take();
        self.route(events, false);
    }

    fn route(&mut self, events: Vec<SinkEvent>, part: bool) {
        let Phase::Running {
            thread_id,
            active_turn,
        } = &self.phase
        else {
            return self.requeue(events, part);
        };
        match self.status {
            ThreadStatus::NotLoaded => return self.requeue(events, part),
            // After a failed turn: codex takes a new turn/start, so route as idle.
            ThreadStatus::Idle | ThreadStatus::Active | ThreadStatus::SystemError => {}
        }
        let texts: Vec<&str> = events.iter().map(|e| e.text.as_str()).collect();
        let input = json!([{"type": "text", "text": texts.join("\n")}]);
        let (method, params, steer) = match (self.status, active_turn) {
            (ThreadStatus::Active, None) => return self.requeue(events, part),
            // Codex said this turn cannot be steered any more: wait for its end.
            (ThreadStatus::Active, Some(turn)) if self.lost_turn.as_ref() == Some(turn) => {
                return self.requeue(events, part);
            }
            (ThreadStatus::Active, Some(turn)) => (
                "turn/steer",
                json!({"threadId": thread_id, "input": input, "expectedTurnId": turn}),
                Some(turn.clone()),
            ),
            _ => (
                "turn/start",
                json!({"threadId": thread_id, "input": input}),
                None,
            ),
        };
        self.event(CodexEvent::Delivering {
            method,
            events: events.len(),
        });
        self.delivering = true;
        self.request_call(
            method,
            &params,
            Call::Deliver {
                events,
                steer,
                part,
            },
        );
    }

    /// Puts events that cannot go yet back in front: a part as a unit, others into the buffer
    /// (to go with what is buffered after them).
    fn requeue(&mut self, events: Vec<SinkEvent>, part: bool) {
        if matches!(self.phase, Phase::Closed) {
            // Nothing will flush again.
            return self.refuse(events, "the session ended before codex could take it");
        }
        if part {
            self.parts.push_front(events);
            return;
        }
        self.bundle.put_back(events);
    }

    /// Codex took `events` into `turn`: remember them until it completes (reporting them at
    /// once if it already failed).
    fn carry(&mut self, turn: String, events: Vec<SinkEvent>) {
        if let Some((_, failed)) = self.ended.iter().find(|(id, _)| *id == turn) {
            if let Some(reason) = failed.clone() {
                self.turn_failed(turn, reason, events);
            }
            return;
        }
        self.carried.entry(turn).or_default().extend(events);
    }

    fn turn_completed(&mut self, params: &Value) {
        let turn = &params["turn"];
        let id = turn["id"].as_str().map(str::to_owned);
        if let Phase::Running { active_turn, .. } = &mut self.phase {
            *active_turn = None;
        }
        if let Some(id) = id {
            let error = self.turn_errors.remove(&id);
            let events = self.carried.remove(&id).unwrap_or_default();
            let failed = (turn["status"] == "failed").then(|| {
                turn["error"]["message"]
                    .as_str()
                    .map(str::to_owned)
                    .or(error)
                    .unwrap_or_else(|| TURN_FAILED.to_owned())
            });
            if let Some(reason) = &failed {
                self.turn_failed(id.clone(), reason.clone(), events);
            }
            if self.ended.len() == ENDED_TURNS {
                self.ended.pop_front();
            }
            self.ended.push_back((id, failed));
        }
        // Events waiting for this turn's end can go now.
        self.flush();
    }

    fn turn_failed(&mut self, turn_id: String, reason: String, events: Vec<SinkEvent>) {
        let (failure, notices) = turn_failure(turn_id, reason, &events);
        self.out.push_back(CodexOutput::TurnFailed(failure));
        self.out
            .extend(notices.into_iter().map(CodexOutput::Undelivered));
    }

    fn request_call(&mut self, method: &str, params: &Value, call: Call) -> u64 {
        let id = self.calls.insert(call);
        let params = RawJson::from_value(params).expect("JSON values serialize");
        let mut line = Vec::new();
        jsonrpc::encode_request(&mut line, &Id::number(id), method, Some(&params));
        self.out.push_back(CodexOutput::Transmit(line));
        id
    }

    fn fail(&mut self, reason: String) {
        self.phase = Phase::Failed;
        self.out.push_back(CodexOutput::Failed(reason));
    }

    /// Drops events codex refused (or that can no longer be delivered): logged at once, their
    /// senders told by [`report_refused`](Self::report_refused).
    fn refuse(&mut self, events: Vec<SinkEvent>, reason: &str) {
        self.event(CodexEvent::Dropped {
            events: events.len(),
            reason: reason.to_owned(),
        });
        self.refused
            .extend(events.into_iter().map(|e| (e, reason.to_owned())));
    }

    /// Tells the senders of the refused events: one notice per sender (in name order) naming
    /// all their refused events and the reasons.
    fn report_refused(&mut self) {
        if self.refused.is_empty() {
            return;
        }
        let refused = std::mem::take(&mut self.refused);
        let mut senders: BTreeMap<String, (Vec<String>, Vec<&str>)> = BTreeMap::new();
        for (event, reason) in &refused {
            if let Some((to, msg_id)) = &event.reply_to {
                let (ids, why) = senders.entry(to.clone()).or_default();
                ids.push(msg_id.clone());
                if !why.contains(&reason.as_str()) {
                    why.push(reason);
                }
            }
        }
        for (to, (msg_ids, why)) in senders {
            self.out.push_back(CodexOutput::Undelivered(Undelivered {
                to,
                msg_ids,
                reason: why.join("; "),
                kind: NoticeKind::Refused,
            }));
        }
    }

    fn event(&mut self, event: CodexEvent) {
        self.out.push_back(CodexOutput::Event(event));
    }
}

#[cfg(test)]
mod tests;
