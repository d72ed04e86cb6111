//! The runner's client for an agent that speaks the Agent Client Protocol (ACP): JSON-RPC 2.0,
//! one message per line, on the agent's stdin and stdout. Gemini CLI (`gemini --acp`), Claude
//! Code's ACP adapter and others speak it.
//!
//! Start-up: `initialize` (protocol version [`PROTOCOL_VERSION`], client capabilities with no
//! file system and no terminal: the agent uses its own), then `session/new` in the configured
//! working directory with the ac7 bridge as a stdio MCP server. [`AcpOutput::Ready`] carries the
//! session id; [`AcpOutput::Failed`] says why start-up failed: an error answer, an agent whose
//! protocol version is not ours, an agent that wants a login first, or no answer within
//! [`AcpConfig::setup_timeout`].
//!
//! Delivery: the sink ([`AcpClient::notify`]) takes [`SinkEvent`]s. Events arriving within the
//! bundling window of the first buffered one are joined with `\n` into one `session/prompt`
//! turn. One turn runs at a time: what arrives while a turn runs waits, and goes as the next turn
//! once it ends (a turn is never cancelled for a newer event; ACP has no way to add input to a
//! running turn, and cancelling would throw away the work the agent is doing). The first turn
//! that succeeds carries the briefing as a text block of its own in front of the events (until
//! one succeeds, every turn carries it).
//!
//! A turn ends with the agent's answer to its `session/prompt`:
//! - a `stopReason` (`end_turn`, `max_tokens`, `max_turn_requests`, `cancelled`): the events
//!   were delivered; `refusal` counts as a failed turn;
//! - an error saying the request itself was wrong (`-32600`, `-32602`): the agent did not take
//!   the events, and each sender gets one [`AcpOutput::Undelivered`] of kind
//!   [`NoticeKind::Refused`];
//! - any other error: the turn failed ([`AcpOutput::TurnFailed`], and an
//!   [`AcpOutput::Undelivered`] of kind [`NoticeKind::TurnFailed`] per sender);
//! - no answer within [`AcpConfig::turn_timeout`]: `session/cancel` goes out, and if the agent
//!   has still not answered [`AcpConfig::cancel_grace`] later the turn is given up as failed.
//!
//! Whichever way a turn ends, the next one may start: a failed turn never leaves the member
//! deaf. [`AcpOutput::TurnStarted`] and [`AcpOutput::TurnEnded`] bracket every turn (for the
//! busy flag).
//!
//! The agent's requests: `session/request_permission` is answered by the
//! [`PermissionPolicy`] (the `allow_once` option, else `allow_always`; the `reject_once` option,
//! else `reject_always`, else `cancelled`); anything else (`fs/*`, `terminal/*`, which we did not
//! offer) gets `-32601`. `session/update` notifications are reported ([`AcpEvent::Update`]) and
//! remembered for the titles of tool calls. Everything malformed or unexpected — a line that is
//! not JSON-RPC, an answer to no request, a notification of another session, an unknown method —
//! is dropped and reported as an [`AcpEvent`]; a malformed request with a readable id is answered
//! with the JSON-RPC error it deserves.
//!
//! After [`AcpClient::shutdown`] the running turn gets `session/cancel`, events still waiting are
//! reported to their senders, the agent's stdin is closed ([`AcpOutput::CloseStdin`]) and nothing
//! more is written to it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::codec::json::RawJson;
use crate::codec::jsonrpc::{
    self, INVALID_PARAMS, INVALID_REQUEST, Id, METHOD_NOT_FOUND, Message, Outcome, RpcError,
};
use crate::codec::line::{Line, LineDecoder};
use crate::session::pending::Pending;

use super::delivery::{
    Bundle, NoticeKind, SinkEvent, TurnFailure, Undelivered, notices, turn_failure,
};

/// The ACP protocol version this client speaks.
pub const PROTOCOL_VERSION: u64 = 1;
/// How long `initialize` and `session/new` may take, each.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a turn may run before it is cancelled.
pub const TURN_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How long a cancelled turn may take to end before it is given up.
pub const CANCEL_GRACE: Duration = Duration::from_secs(10);
/// `initialize`.
pub const INITIALIZE: &str = "initialize";
/// `session/new`.
pub const SESSION_NEW: &str = "session/new";
/// `session/prompt`.
pub const SESSION_PROMPT: &str = "session/prompt";
/// `session/cancel`.
pub const SESSION_CANCEL: &str = "session/cancel";
/// `session/update`.
pub const SESSION_UPDATE: &str = "session/update";
/// `session/request_permission`.
pub const REQUEST_PERMISSION: &str = "session/request_permission";
/// The JSON-RPC error code of ACP's "authentication required".
pub const AUTH_REQUIRED: i64 = -32000;

/// How many tool call titles are remembered (for permission requests that name none).
const TOOL_TITLES: usize = 256;
/// What a refused event's sender is told when the session ended before the agent took it.
const SESSION_ENDED: &str = "the session ended before the agent could take it";

/// An MCP server started by the agent over stdio.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServer {
    /// Its name (the agent's prefix for its tools).
    pub name: String,
    /// The program.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment variables set for it.
    pub env: Vec<(String, String)>,
}

/// How `session/request_permission` is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermissionPolicy {
    /// Allow every tool call.
    Allow,
    /// Deny every tool call.
    Deny,
    /// Allow the tools of the MCP server called `ac7`, deny the others.
    Ac7Tools,
}

/// What the runner asks of the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcpConfig {
    /// `clientInfo.name`.
    pub client_name: String,
    /// `clientInfo.version`.
    pub client_version: String,
    /// The session's working directory (absolute).
    pub cwd: String,
    /// The MCP servers the session starts (the ac7 bridge).
    pub mcp_servers: Vec<McpServer>,
    /// The briefing prose, sent in front of the first turn; none when empty.
    pub briefing: String,
    /// How permission requests are answered.
    pub permission: PermissionPolicy,
    /// How long events are gathered into one turn after the first.
    pub bundle_window: Duration,
    /// How long `initialize` and `session/new` may take, each.
    pub setup_timeout: Duration,
    /// How long a turn may run before it is cancelled.
    pub turn_timeout: Duration,
    /// How long a cancelled turn may take to end before it is given up.
    pub cancel_grace: Duration,
}

/// The agent, as `initialize` described it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentInfo {
    /// `agentInfo.name`, if given.
    pub name: Option<String>,
    /// `agentInfo.title` (for people), if given.
    pub title: Option<String>,
    /// `agentInfo.version`, if given.
    pub version: Option<String>,
}

/// Something for the driver to do or know.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcpOutput {
    /// Write this line to the agent's stdin.
    Transmit(Vec<u8>),
    /// The session exists; events are delivered from now on.
    Ready {
        /// Its id.
        session_id: String,
        /// The agent, as it described itself.
        agent: AgentInfo,
    },
    /// Start-up failed: tear down.
    Failed(String),
    /// Close the agent's stdin (after [`AcpClient::shutdown`]).
    CloseStdin,
    /// A turn went out (the member is busy until its [`AcpOutput::TurnEnded`]).
    TurnStarted {
        /// The turn's number (the id of its `session/prompt`).
        turn: u64,
        /// How many events it carries.
        events: usize,
    },
    /// A turn is over, however it ended.
    TurnEnded {
        /// The turn's number.
        turn: u64,
        /// The agent's `stopReason`, when it gave one.
        stop_reason: Option<String>,
    },
    /// Events the agent did not take, or whose turn failed: tell their sender (see
    /// [`Undelivered::push_body_for`]).
    Undelivered(Undelivered),
    /// A turn failed (record it; its senders get [`AcpOutput::Undelivered`]).
    TurnFailed(TurnFailure),
    /// Something worth logging.
    Event(AcpEvent),
}

/// Things worth logging.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcpEvent {
    /// A `session/update` of the session (its `sessionUpdate` kind).
    Update(String),
    /// A permission request was answered.
    Permission {
        /// The tool call's title, as far as known.
        title: String,
        /// Whether it was allowed.
        allowed: bool,
        /// The option chosen (`None`: answered `cancelled`).
        option: Option<String>,
    },
    /// A request of the agent's answered with `-32601`.
    UnknownRequest(String),
    /// A notification that is not for us (another session, an unknown method, bad params).
    Unexpected(String),
    /// A line that is not JSON-RPC.
    Unparseable {
        /// Its length.
        len: usize,
        /// What is wrong with it.
        detail: String,
    },
    /// An answer to no request of ours (or one given up on).
    Unmatched(String),
    /// A turn ran past the turn timeout: `session/cancel` went out.
    Cancelling {
        /// The turn's number.
        turn: u64,
    },
    /// Events that could not be delivered.
    Dropped {
        /// How many.
        events: usize,
        /// Why.
        reason: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Initialize,
    NewSession,
    Prompt,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Initializing,
    CreatingSession,
    Running { session_id: String },
    Failed,
    Closed,
}

#[derive(Debug, Clone)]
struct Turn {
    id: u64,
    events: Vec<SinkEvent>,
    /// Whether it carries the briefing.
    briefing: bool,
    deadline: Instant,
    /// `session/cancel` went out (the turn timed out).
    cancelled: bool,
}

/// The client's state. See the [module docs](self).
///
/// Contract: every input and command takes `now` last. What happened is `handle_bytes` (the
/// agent's stdout) and `handle_timeout` ([`poll_timeout`](Self::poll_timeout) says when: the
/// bundling window, a start-up request's deadline, a turn's deadline); the application emits
/// events with [`notify`](Self::notify) and ends with [`shutdown`](Self::shutdown). Outputs are
/// drained from [`poll_output`](Self::poll_output).
#[derive(Debug, Clone)]
pub struct AcpClient {
    config: AcpConfig,
    phase: Phase,
    lines: LineDecoder,
    calls: Pending<Call>,
    /// The deadline of the start-up request in flight.
    setup_deadline: Option<Instant>,
    bundle: Bundle,
    turn: Option<Turn>,
    /// A turn carrying the briefing succeeded.
    briefed: bool,
    /// Tool call titles by id, oldest first.
    titles: VecDeque<(String, String)>,
    /// The agent, between `initialize` and `session/new`.
    agent_info: Option<AgentInfo>,
    out: VecDeque<AcpOutput>,
}

#[derive(Deserialize)]
struct PermissionOption {
    #[serde(rename = "optionId")]
    option_id: String,
    kind: String,
}

#[derive(Deserialize)]
struct PermissionRequest {
    #[serde(rename = "sessionId")]
    session_id: String,
    #[serde(rename = "toolCall")]
    tool_call: Value,
    options: Vec<PermissionOption>,
}

/// Whether a tool call title names a tool of the `ac7` MCP server, as agents write them:
/// `mcp__ac7__send` (Claude Code), `send (ac7 MCP Server)` (Gemini CLI).
pub fn is_ac7_tool(title: &str) -> bool {
    let title = title.trim();
    title.starts_with("mcp__ac7__") || title.ends_with("(ac7 MCP Server)")
}

impl AcpClient {
    /// A client for an agent that has just been spawned: `initialize` is its first output.
    pub fn new(config: AcpConfig, now: Instant) -> Self {
        let mut client = Self {
            config,
            phase: Phase::Initializing,
            lines: LineDecoder::new(64 * 1024 * 1024),
            calls: Pending::new(),
            setup_deadline: None,
            bundle: Bundle::default(),
            turn: None,
            briefed: false,
            titles: VecDeque::new(),
            agent_info: None,
            out: VecDeque::new(),
        };
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": {
                "fs": {"readTextFile": false, "writeTextFile": false},
                "terminal": false,
            },
            "clientInfo": {"name": client.config.client_name, "version": client.config.client_version},
        });
        client.request_call(INITIALIZE, &params, Call::Initialize);
        client.setup_deadline = Some(now + client.config.setup_timeout);
        client
    }

    /// An event for the agent.
    pub fn notify(&mut self, event: impl Into<SinkEvent>, now: Instant) {
        let event = event.into();
        if matches!(self.phase, Phase::Closed | Phase::Failed) {
            let reason = "the agent is not running";
            self.refuse(vec![event], reason);
            return;
        }
        self.bundle.push(event, now, self.config.bundle_window);
    }

    /// Bytes from the agent's stdout.
    pub fn handle_bytes(&mut self, bytes: &[u8], now: Instant) {
        let mut lines = std::mem::take(&mut self.lines);
        lines.push(bytes);
        while let Some(line) = lines.decode() {
            match line {
                Line::Oversized { len } => self.event(AcpEvent::Unparseable {
                    len,
                    detail: "line too long".into(),
                }),
                Line::Complete(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => {}
                Line::Complete(bytes) => match jsonrpc::parse_message(bytes) {
                    Ok(message) => self.message(message, now),
                    Err(invalid) => {
                        if let Some(id) = invalid.id()
                            && !matches!(self.phase, Phase::Closed)
                        {
                            let mut line = Vec::new();
                            jsonrpc::encode_error(&mut line, Some(id), &invalid.to_error());
                            self.out.push_back(AcpOutput::Transmit(line));
                        }
                        self.event(AcpEvent::Unparseable {
                            len: bytes.len(),
                            detail: invalid.to_error().message,
                        });
                    }
                },
            }
        }
        self.lines = lines;
    }

    /// When `handle_timeout` is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.bundle.closes_at(),
            self.setup_deadline,
            self.turn.as_ref().map(|t| t.deadline),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Time passed: start-up deadlines, turn deadlines, the bundling window.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.setup_deadline.is_some_and(|at| now >= at) {
            self.setup_deadline = None;
            let step = match self.phase {
                Phase::Initializing => Some(INITIALIZE),
                Phase::CreatingSession => Some(SESSION_NEW),
                _ => None,
            };
            if let Some(step) = step {
                // Its answer, if it ever comes, is for no request.
                let ids: Vec<u64> = self.calls.ids().collect();
                for id in ids {
                    self.calls.remove(id);
                }
                self.fail(format!(
                    "the agent did not answer {step} within {} s",
                    self.config.setup_timeout.as_secs()
                ));
            }
        }
        if let Some(turn) = self.turn.as_mut()
            && now >= turn.deadline
        {
            if turn.cancelled {
                // It did not end after session/cancel either: give it up.
                let turn = self.turn.take().expect("checked above");
                self.calls.remove(turn.id);
                let reason = format!(
                    "the agent did not end the turn within {} s, nor {} s after it was cancelled",
                    self.config.turn_timeout.as_secs(),
                    self.config.cancel_grace.as_secs()
                );
                self.end_turn(turn, None, Some(reason), now);
            } else {
                turn.cancelled = true;
                turn.deadline = now + self.config.cancel_grace;
                let turn = turn.id;
                self.cancel_turn();
                self.event(AcpEvent::Cancelling { turn });
            }
        }
        if self.bundle.window_over(now) {
            self.flush(now);
        }
    }

    /// Teardown: cancel the running turn, report what waits, close stdin.
    pub fn shutdown(&mut self, _now: Instant) {
        if matches!(self.phase, Phase::Closed) {
            return;
        }
        self.bundle.close_window();
        self.setup_deadline = None;
        if let Some(turn) = self.turn.take() {
            // The agent has the events; its answer will not be read.
            self.cancel_turn();
            self.calls.remove(turn.id);
            self.out.push_back(AcpOutput::TurnEnded {
                turn: turn.id,
                stop_reason: None,
            });
        }
        let left = self.bundle.take();
        if !left.is_empty() {
            self.refuse(left, SESSION_ENDED);
        }
        // Nothing is awaited any more: a late answer is for no request.
        let ids: Vec<u64> = self.calls.ids().collect();
        for id in ids {
            self.calls.remove(id);
        }
        self.phase = Phase::Closed;
        self.out.push_back(AcpOutput::CloseStdin);
    }

    /// The next thing to do, until `None`.
    pub fn poll_output(&mut self) -> Option<AcpOutput> {
        self.out.pop_front()
    }

    /// The session's id, once `session/new` answered.
    pub fn session_id(&self) -> Option<&str> {
        match &self.phase {
            Phase::Running { session_id } => Some(session_id),
            _ => None,
        }
    }

    /// The running turn's number.
    pub fn turn(&self) -> Option<u64> {
        self.turn.as_ref().map(|t| t.id)
    }

    /// Events waiting for delivery.
    pub fn buffered(&self) -> usize {
        self.bundle.len()
    }

    /// Whether [`shutdown`](Self::shutdown) ran.
    pub fn is_closed(&self) -> bool {
        matches!(self.phase, Phase::Closed)
    }

    fn message(&mut self, message: Message, now: Instant) {
        match message {
            Message::Response(response) => {
                let call = response
                    .id
                    .as_raw()
                    .parse::<u64>()
                    .ok()
                    .and_then(|id| Some((id, self.calls.take(id).ok()?)));
                match call {
                    Some((id, call)) => self.response(id, call, response.outcome, now),
                    None => self.event(AcpEvent::Unmatched(response.id.as_raw().get().to_owned())),
                }
            }
            // Stdin is closed: there is no way to answer.
            Message::Request(request) if matches!(self.phase, Phase::Closed) => {
                self.event(AcpEvent::Unexpected(format!(
                    "{} after the session ended",
                    request.method
                )));
            }
            Message::Request(request) if request.method == REQUEST_PERMISSION => {
                self.permission(&request.id, request.params.as_ref());
            }
            Message::Request(request) => {
                let error = RpcError::new(
                    METHOD_NOT_FOUND,
                    format!("method not found: {}", request.method),
                );
                self.answer_error(&request.id, &error);
                self.event(AcpEvent::UnknownRequest(request.method));
            }
            Message::Notification(n) if n.method == SESSION_UPDATE => {
                self.update(n.params.as_ref());
            }
            Message::Notification(n) => self.event(AcpEvent::Unexpected(n.method)),
        }
    }

    fn update(&mut self, params: Option<&RawJson>) {
        let params: Value = params.and_then(|p| p.parse().ok()).unwrap_or(Value::Null);
        let ours = match (&self.phase, params["sessionId"].as_str()) {
            (Phase::Running { session_id }, Some(id)) => session_id == id,
            _ => false,
        };
        let Some(kind) = params["update"]["sessionUpdate"].as_str().filter(|_| ours) else {
            return self.event(AcpEvent::Unexpected(format!(
                "{SESSION_UPDATE} that is not for our session: {}",
                truncated(&params.to_string())
            )));
        };
        let update = &params["update"];
        if let (Some(id), Some(title)) = (update["toolCallId"].as_str(), update["title"].as_str()) {
            self.remember_title(id, title);
        }
        self.event(AcpEvent::Update(kind.to_owned()));
    }

    fn remember_title(&mut self, id: &str, title: &str) {
        if let Some(at) = self.titles.iter().position(|(i, _)| i == id) {
            self.titles.remove(at);
        }
        if self.titles.len() == TOOL_TITLES {
            self.titles.pop_front();
        }
        self.titles.push_back((id.to_owned(), title.to_owned()));
    }

    fn permission(&mut self, id: &Id, params: Option<&RawJson>) {
        let request = params.and_then(|p| p.parse::<PermissionRequest>().ok());
        let ours = |r: &PermissionRequest| match &self.phase {
            Phase::Running { session_id } => *session_id == r.session_id,
            _ => false,
        };
        let Some(request) = request.filter(ours) else {
            let error = RpcError::new(
                INVALID_PARAMS,
                "session/request_permission needs the sessionId of our session, a toolCall and options",
            );
            self.answer_error(id, &error);
            return self.event(AcpEvent::Unexpected(format!(
                "{REQUEST_PERMISSION} with bad params: {}",
                truncated(params.map_or("", RawJson::get))
            )));
        };
        let call_id = request.tool_call["toolCallId"].as_str().unwrap_or_default();
        let title = request.tool_call["title"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| {
                self.titles
                    .iter()
                    .find(|(i, _)| i == call_id)
                    .map(|(_, t)| t.clone())
            })
            .unwrap_or_default();
        let allowed = match self.config.permission {
            PermissionPolicy::Allow => true,
            PermissionPolicy::Deny => false,
            PermissionPolicy::Ac7Tools => is_ac7_tool(&title),
        };
        let wanted: &[&str] = if allowed {
            &["allow_once", "allow_always"]
        } else {
            &["reject_once", "reject_always"]
        };
        let option = wanted.iter().find_map(|kind| {
            request
                .options
                .iter()
                .find(|o| o.kind == *kind)
                .map(|o| o.option_id.clone())
        });
        let result = match &option {
            Some(option) => json!({"outcome": {"outcome": "selected", "optionId": option}}),
            None => json!({"outcome": {"outcome": "cancelled"}}),
        };
        let mut line = Vec::new();
        let result = RawJson::from_value(&result).expect("JSON values serialize");
        jsonrpc::encode_response(&mut line, id, &result);
        self.out.push_back(AcpOutput::Transmit(line));
        self.event(AcpEvent::Permission {
            title,
            allowed,
            option,
        });
    }

    fn answer_error(&mut self, id: &Id, error: &RpcError) {
        let mut line = Vec::new();
        jsonrpc::encode_error(&mut line, Some(id), error);
        self.out.push_back(AcpOutput::Transmit(line));
    }

    fn response(&mut self, id: u64, call: Call, outcome: Outcome, now: Instant) {
        let result = match outcome {
            Outcome::Result(result) => Ok(result.parse::<Value>().unwrap_or(Value::Null)),
            Outcome::Error(error) => Err(error),
        };
        match call {
            Call::Initialize => {
                self.setup_deadline = None;
                match result {
                    Ok(result) => self.initialized(&result, now),
                    Err(error) => self.fail(format!(
                        "the agent refused initialize: {}",
                        error_text(&error)
                    )),
                }
            }
            Call::NewSession => {
                self.setup_deadline = None;
                match result {
                    Ok(result) => match result["sessionId"].as_str() {
                        Some(session_id) => {
                            self.phase = Phase::Running {
                                session_id: session_id.to_owned(),
                            };
                            self.out.push_back(AcpOutput::Ready {
                                session_id: session_id.to_owned(),
                                agent: self.agent_info.take().unwrap_or_default(),
                            });
                            if !self.bundle.is_gathering() {
                                self.flush(now);
                            }
                        }
                        None => self.fail("the agent answered session/new without a sessionId".into()),
                    },
                    Err(error) if error.code == AUTH_REQUIRED => self.fail(format!(
                        "the agent wants a login first ({}): log in with the agent itself, then start again",
                        error_text(&error)
                    )),
                    Err(error) => self.fail(format!(
                        "the agent refused session/new: {}",
                        error_text(&error)
                    )),
                }
            }
            Call::Prompt => {
                let Some(turn) = self.turn.take_if(|t| t.id == id) else {
                    return;
                };
                let (stop_reason, failure) = match result {
                    _ if turn.cancelled => (
                        None,
                        Some(format!(
                            "the turn ran past {} s and was cancelled",
                            self.config.turn_timeout.as_secs()
                        )),
                    ),
                    Ok(result) => {
                        let stop = result["stopReason"].as_str().map(str::to_owned);
                        let failure = (stop.as_deref() == Some("refusal"))
                            .then(|| "the agent refused to go on".to_owned());
                        (stop, failure)
                    }
                    Err(error) if matches!(error.code, INVALID_REQUEST | INVALID_PARAMS) => {
                        self.out.push_back(AcpOutput::TurnEnded {
                            turn: turn.id,
                            stop_reason: None,
                        });
                        let reason = error_text(&error);
                        self.refuse(turn.events, &reason);
                        return self.flush(now);
                    }
                    Err(error) => (None, Some(error_text(&error))),
                };
                if failure.is_none() && turn.briefing {
                    self.briefed = true;
                }
                self.end_turn(turn, stop_reason, failure, now);
            }
        }
    }

    fn initialized(&mut self, result: &Value, now: Instant) {
        match result["protocolVersion"].as_u64() {
            Some(PROTOCOL_VERSION) => {}
            Some(other) => {
                return self.fail(format!(
                    "the agent speaks ACP version {other}; ac7 speaks version {PROTOCOL_VERSION}"
                ));
            }
            None => {
                return self.fail(format!(
                    "the agent's initialize answer has no protocolVersion: {}",
                    truncated(&result.to_string())
                ));
            }
        }
        let info = &result["agentInfo"];
        self.agent_info = Some(AgentInfo {
            name: info["name"].as_str().map(str::to_owned),
            title: info["title"].as_str().map(str::to_owned),
            version: info["version"].as_str().map(str::to_owned),
        });
        self.phase = Phase::CreatingSession;
        let servers: Vec<Value> = self
            .config
            .mcp_servers
            .iter()
            .map(|s| {
                let env: Vec<Value> = s
                    .env
                    .iter()
                    .map(|(name, value)| json!({"name": name, "value": value}))
                    .collect();
                json!({"name": s.name, "command": s.command, "args": s.args, "env": env})
            })
            .collect();
        let params = json!({"cwd": self.config.cwd, "mcpServers": servers});
        self.request_call(SESSION_NEW, &params, Call::NewSession);
        self.setup_deadline = Some(now + self.config.setup_timeout);
    }

    /// Sends what is buffered as a turn, if none runs.
    fn flush(&mut self, now: Instant) {
        if self.turn.is_some() || self.bundle.is_empty() {
            return;
        }
        let Phase::Running { session_id } = &self.phase else {
            return;
        };
        let events = self.bundle.take();
        let texts: Vec<&str> = events.iter().map(|e| e.text.as_str()).collect();
        let briefing = !self.briefed && !self.config.briefing.is_empty();
        let mut prompt = Vec::new();
        if briefing {
            prompt.push(json!({"type": "text", "text": self.config.briefing}));
        }
        prompt.push(json!({"type": "text", "text": texts.join("\n")}));
        let params = json!({"sessionId": session_id, "prompt": prompt});
        let id = self.request_call(SESSION_PROMPT, &params, Call::Prompt);
        self.out.push_back(AcpOutput::TurnStarted {
            turn: id,
            events: events.len(),
        });
        self.turn = Some(Turn {
            id,
            events,
            briefing,
            deadline: now + self.config.turn_timeout,
            cancelled: false,
        });
    }

    fn end_turn(
        &mut self,
        turn: Turn,
        stop_reason: Option<String>,
        failure: Option<String>,
        now: Instant,
    ) {
        self.out.push_back(AcpOutput::TurnEnded {
            turn: turn.id,
            stop_reason,
        });
        if let Some(reason) = failure {
            let (failure, notices) = turn_failure(turn.id.to_string(), reason, &turn.events);
            self.out.push_back(AcpOutput::TurnFailed(failure));
            self.out
                .extend(notices.into_iter().map(AcpOutput::Undelivered));
        }
        // What waited for this turn's end goes now (or when its window is over).
        if !self.bundle.is_gathering() {
            self.flush(now);
        }
    }

    fn cancel_turn(&mut self) {
        if let Phase::Running { session_id } = &self.phase {
            let params = RawJson::from_value(&json!({"sessionId": session_id}))
                .expect("JSON values serialize");
            let mut line = Vec::new();
            jsonrpc::encode_notification(&mut line, SESSION_CANCEL, Some(&params));
            self.out.push_back(AcpOutput::Transmit(line));
        }
    }

    fn request_call(&mut self, method: &str, params: &Value, call: Call) -> u64 {
        let id = self.calls.insert(call);
        let params = RawJson::from_value(params).expect("JSON values serialize");
        let mut line = Vec::new();
        jsonrpc::encode_request(&mut line, &Id::number(id), method, Some(&params));
        self.out.push_back(AcpOutput::Transmit(line));
        id
    }

    fn fail(&mut self, reason: String) {
        self.phase = Phase::Failed;
        self.setup_deadline = None;
        self.out.push_back(AcpOutput::Failed(reason));
        let left = self.bundle.take();
        self.bundle.close_window();
        if !left.is_empty() {
            self.refuse(left, "the agent did not start");
        }
    }

    /// Events the agent did not take: logged, and their senders told.
    fn refuse(&mut self, events: Vec<SinkEvent>, reason: &str) {
        self.event(AcpEvent::Dropped {
            events: events.len(),
            reason: reason.to_owned(),
        });
        self.out.extend(
            notices(&events, reason, NoticeKind::Refused)
                .into_iter()
                .map(AcpOutput::Undelivered),
        );
    }

    fn event(&mut self, event: AcpEvent) {
        self.out.push_back(AcpOutput::Event(event));
    }
}

/// An error's message, with its `data` when it has some.
fn error_text(error: &RpcError) -> String {
    match &error.data {
        Some(data) if !data.is_null() => {
            let data = data
                .parse::<Value>()
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_else(|| data.get().to_owned());
            format!("{} ({})", error.message, truncated(&data))
        }
        _ => error.message.clone(),
    }
}

/// At most 300 characters of `text`, for log lines.
fn truncated(text: &str) -> String {
    match text.char_indices().nth(300) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests;
