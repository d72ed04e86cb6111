//! The bridge session of the `call_tool` dialect: MCP on the agent's stdio, length-prefixed
//! `call_tool` requests to a parent process.
//!
//! - `initialize` and `ping` are answered locally; `tools/list` comes from the tool-schema file and
//!   never touches the socket.
//! - `tools/call` arguments are checked against the tool's `input_schema` (full JSON Schema, compiled
//!   once, see [`crate::dialect::schema`]) first; a violation is an
//!   `isError` result `Input validation error: …`. Unknown tool names are forwarded (the parent
//!   answers `ToolNotFoundError`).
//! - Calls go to the parent one at a time through [`CallToolClient`] (lazy connect, reconnect after
//!   a drop). Each has [`CallToolBridgeConfig::call_timeout`] for its reply once sent; past that
//!   the agent gets an `isError` result naming the timeout, the connection is dropped and the
//!   next call reconnects.
//! - `notifications/cancelled` for a queued call removes it; for the call on the wire it frees
//!   the queue at once (the next call is sent) and the parent's reply to the cancelled call is
//!   discarded by its length prefix when it comes. A cancelled request is not answered. A parent error `{message, type}` becomes an `isError` result `"<message> (type:
//!   <type>)"`; a valid parent result is passed through unchanged, `isError: true` included; one
//!   that is not a valid `CallToolResult` ([`validate_tool_result`]: e.g. `{}`, or `content`
//!   empty or not a list) becomes an `isError` result naming the problem.
//! - Every failure without a reply is an `isError` result too (MCP reports tool failures as
//!   results, as the dialect has the bridge return them to the agent), never a JSON-RPC error: a request too
//!   large to send, a parent that cannot be reached, drops the connection mid-call, or sends bad
//!   framing, invalid JSON or a reply over the cap. The text says what failed and that the next
//!   call reconnects (it does).
//! - Other methods get `-32601`. Teardown (agent EOF, signal) answers what is pending and exits.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::codec::json::RawJson;
use crate::codec::jsonrpc::{INVALID_PARAMS, Id, METHOD_NOT_FOUND, RpcError};
use crate::codec::length_prefixed::MAX_PAYLOAD_BYTES;
use crate::codec::line::LineDecoder;
use crate::dialect::call_tool::{
    CallError, CallTool, CallToolClient, Cancelled, ClientOutput, DEFAULT_CALL_TIMEOUT, Reply,
    ToolSchema, a_kind, seconds, validate_tool_result,
};
use crate::dialect::mcp;
use crate::dialect::mcp_face::{AgentLine, McpFace, error_line, result_line};
use crate::dialect::schema;

/// Limits and identity of a `call_tool` bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallToolBridgeConfig {
    /// Cap on a payload to or from the parent.
    pub max_payload_bytes: usize,
    /// Cap on one line from the agent.
    pub max_agent_line_bytes: usize,
    /// `serverInfo.name`.
    pub server_name: String,
    /// `serverInfo.version`.
    pub server_version: String,
    /// How long a call sent to the parent may wait for its reply.
    pub call_timeout: Duration,
}

impl Default for CallToolBridgeConfig {
    fn default() -> Self {
        Self {
            max_payload_bytes: MAX_PAYLOAD_BYTES,
            max_agent_line_bytes: 2 * MAX_PAYLOAD_BYTES,
            server_name: mcp::SERVER_NAME.to_owned(),
            server_version: "0.0.0-dev".to_owned(),
            call_timeout: DEFAULT_CALL_TIMEOUT,
        }
    }
}

/// The bridge's two peers: where a [`CallToolBridgeOutput::Transmit`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallToolPeer {
    /// The agent, on stdout: one JSON-RPC line.
    Agent,
    /// The parent, on the socket: one length-prefixed frame.
    Parent,
}

/// Something for the driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallToolBridgeOutput {
    /// Write these bytes to a peer, in order.
    Transmit {
        /// Where the bytes go.
        to: CallToolPeer,
        /// One line for the agent, or one frame for the parent.
        bytes: Vec<u8>,
    },
    /// Connect to the parent; report with `handle_connected` / `handle_connect_failed`.
    Connect,
    /// Close the connection to the parent.
    Disconnect,
    /// Something worth logging.
    Event(CallToolBridgeEvent),
    /// Teardown is complete: flush and exit 0. Always last.
    Exit,
}

/// Things worth logging.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallToolBridgeEvent {
    /// A malformed agent line, answered with an error.
    AgentLineInvalid {
        /// Line length.
        len: usize,
        /// Error code sent.
        code: i64,
        /// What was wrong.
        detail: String,
    },
    /// Arguments did not match the tool's schema; nothing was sent.
    InvalidArguments {
        /// Tool name.
        tool: String,
        /// The mismatch.
        detail: String,
    },
    /// A call finished.
    Completed {
        /// Tool name.
        tool: String,
        /// Why it failed, if it did without a reply.
        error: Option<CallError>,
    },
    /// The parent's result was not a valid `CallToolResult`; the agent got an `isError` result.
    InvalidResult {
        /// Tool name.
        tool: String,
        /// What was wrong.
        detail: String,
    },
    /// The agent cancelled a call; it will not be answered.
    Cancelled {
        /// Tool name.
        tool: String,
        /// Whether it was on the wire (the parent's reply to it will be discarded) or queued.
        on_wire: bool,
    },
    /// The parent's reply to a call cancelled on the wire arrived and was discarded.
    LateReplyDiscarded {
        /// Its payload's length.
        len: usize,
    },
    /// A notification from the agent the bridge does not act on.
    AgentNotificationIgnored {
        /// Its method.
        method: String,
    },
}

#[derive(Debug, Clone)]
struct Token {
    agent_id: Id,
    tool: String,
}

/// The session. See the [module docs](self).
///
/// Contract: inputs are `handle_*(…, now)` and never read a clock: agent bytes / EOF, the parent
/// connection's life (`handle_connected`, `handle_connect_failed`, `handle_parent_bytes`,
/// `handle_parent_closed`), `handle_terminate`, and `handle_timeout` once
/// [`poll_timeout`](Self::poll_timeout) (the deadline of the call on the wire) has passed.
/// Outputs are drained from [`poll_output`](Self::poll_output):
/// [`CallToolBridgeOutput::Transmit`] `{ to, bytes }`, `Connect` / `Disconnect` for the parent
/// socket, `Event`s for the log, and `Exit` last.
#[derive(Debug)]
pub struct CallToolBridge {
    face: McpFace,
    check: schema::ArgumentCheck,
    tools_list: RawJson,
    agent: LineDecoder,
    client: CallToolClient<Token>,
    closed: bool,
    out: VecDeque<CallToolBridgeOutput>,
}

impl CallToolBridge {
    /// A session serving `tools` (from the schema file).
    pub fn new(config: CallToolBridgeConfig, tools: Vec<ToolSchema>) -> Self {
        Self {
            face: McpFace {
                server_name: config.server_name,
                server_version: config.server_version,
                capabilities: r#"{"tools":{}}"#.to_owned(),
                max_line_bytes: config.max_agent_line_bytes,
            },
            tools_list: crate::dialect::call_tool::tools_list_result(&tools),
            check: schema::ArgumentCheck::compile_lenient(
                tools.iter().map(|t| (t.name.as_str(), &t.input_schema)),
            ),
            agent: LineDecoder::new(config.max_agent_line_bytes),
            client: CallToolClient::new(config.max_payload_bytes, config.call_timeout),
            closed: false,
            out: VecDeque::new(),
        }
    }

    /// Bytes from the agent.
    pub fn handle_agent_bytes(&mut self, bytes: &[u8], now: Instant) {
        if self.closed {
            return;
        }
        let mut agent = std::mem::take(&mut self.agent);
        agent.push(bytes);
        while let Some(line) = agent.decode() {
            let line = self.face.classify(line);
            self.agent_line(line, now);
        }
        self.agent = agent;
        self.pump();
    }

    /// The agent closed stdin: answer what is pending, disconnect, exit.
    pub fn handle_agent_eof(&mut self, now: Instant) {
        if self.closed {
            return;
        }
        if let Some(line) = self.agent.decode_eof() {
            let line = self.face.classify(line);
            self.agent_line(line, now);
        }
        self.teardown(now);
    }

    /// SIGINT/SIGTERM: the same teardown.
    pub fn handle_terminate(&mut self, now: Instant) {
        if !self.closed {
            self.teardown(now);
        }
    }

    /// The connection to the parent is open.
    pub fn handle_connected(&mut self, now: Instant) {
        if self.closed {
            return;
        }
        self.client.handle_connected(now);
        self.pump();
    }

    /// The connection to the parent could not be made.
    pub fn handle_connect_failed(&mut self, reason: &str, now: Instant) {
        if self.closed {
            return;
        }
        self.client.handle_connect_failed(reason, now);
        self.pump();
    }

    /// Bytes from the parent.
    pub fn handle_parent_bytes(&mut self, bytes: &[u8], now: Instant) {
        if self.closed {
            return;
        }
        self.client.handle_bytes(bytes, now);
        self.pump();
    }

    /// The parent closed the connection.
    pub fn handle_parent_closed(&mut self, now: Instant) {
        if self.closed {
            return;
        }
        self.client.handle_closed(now);
        self.pump();
    }

    /// When [`handle_timeout`](Self::handle_timeout) is due: the deadline of the call on the
    /// wire, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.closed {
            return None;
        }
        self.client.poll_timeout()
    }

    /// A call on the wire whose deadline has passed is answered with an `isError` result naming
    /// the timeout; the connection is dropped and the next call reconnects.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.closed {
            return;
        }
        self.client.handle_timeout(now);
        self.pump();
    }

    /// The next thing to do, until `None`.
    pub fn poll_output(&mut self) -> Option<CallToolBridgeOutput> {
        self.out.pop_front()
    }

    /// Whether the session has exited.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    fn agent_line(&mut self, line: AgentLine, now: Instant) {
        match line {
            AgentLine::Blank | AgentLine::Response => {}
            AgentLine::Invalid {
                answer,
                len,
                code,
                detail,
            } => {
                self.out.push_back(CallToolBridgeOutput::Transmit {
                    to: CallToolPeer::Agent,
                    bytes: answer,
                });
                self.event(CallToolBridgeEvent::AgentLineInvalid { len, code, detail });
            }
            AgentLine::Answered(answer) | AgentLine::Initialize { answer, .. } => {
                self.out.push_back(CallToolBridgeOutput::Transmit {
                    to: CallToolPeer::Agent,
                    bytes: answer,
                });
            }
            AgentLine::Cancelled(id) => {
                // What the client did before the cancel comes out before it.
                self.pump();
                if let Some((token, cancelled)) = self.client.cancel(|t| t.agent_id == id, now) {
                    self.event(CallToolBridgeEvent::Cancelled {
                        tool: token.tool,
                        on_wire: cancelled == Cancelled::OnWire,
                    });
                }
            }
            AgentLine::Notification(method) => {
                self.event(CallToolBridgeEvent::AgentNotificationIgnored { method })
            }
            AgentLine::Request(req) => match req.method.as_str() {
                mcp::TOOLS_LIST => self.send_agent(result_line(&req.id, &self.tools_list)),
                mcp::TOOLS_CALL => self.call(req.id, req.params.as_ref(), now),
                other => {
                    let error =
                        RpcError::new(METHOD_NOT_FOUND, format!("Method not found: {other}"));
                    self.send_agent(error_line(Some(&req.id), &error));
                }
            },
        }
    }

    fn call(&mut self, agent_id: Id, params: Option<&RawJson>, now: Instant) {
        const NEEDS: &str = "tools/call needs params {\"name\": <tool name>, \"arguments\": {…}}";
        let mut params = match params.map(RawJson::parse::<Value>) {
            None => {
                return self
                    .invalid_params(&agent_id, format!("{NEEDS}; the request has no params"));
            }
            Some(Ok(Value::Object(params))) => params,
            Some(Ok(other)) => {
                return self
                    .invalid_params(&agent_id, format!("{NEEDS}; params is {}", a_kind(&other)));
            }
            Some(Err(e)) => {
                return self.invalid_params(&agent_id, format!("{NEEDS}; params: {e}"));
            }
        };
        let name = match params.remove("name") {
            Some(Value::String(name)) => name,
            None => {
                let why = "tools/call needs params.name (a string): it is missing";
                return self.invalid_params(&agent_id, why.to_owned());
            }
            Some(other) => {
                let why = format!(
                    "tools/call needs params.name (a string): it is {}",
                    a_kind(&other)
                );
                return self.invalid_params(&agent_id, why);
            }
        };
        let arguments = match params.remove("arguments") {
            None | Some(Value::Null) => Value::Object(Default::default()),
            Some(arguments) => arguments,
        };
        let check = self.check.check(&name, &arguments);
        if let Err(mismatch) = check {
            let text = format!("Input validation error: {mismatch}");
            self.send_agent(result_line(&agent_id, &mcp::tool_error(&text)));
            self.event(CallToolBridgeEvent::InvalidArguments {
                tool: name,
                detail: mismatch.to_string(),
            });
            return;
        }
        let call = CallTool {
            name: name.clone(),
            arguments: RawJson::from_value(&arguments).expect("JSON values serialize"),
        };
        self.client.request(
            &call,
            Token {
                agent_id,
                tool: name,
            },
            now,
        );
    }

    /// Moves the client's outputs out as the session's.
    fn pump(&mut self) {
        while let Some(output) = self.client.poll_output() {
            match output {
                ClientOutput::Connect => self.out.push_back(CallToolBridgeOutput::Connect),
                ClientOutput::Transmit(bytes) => {
                    self.out.push_back(CallToolBridgeOutput::Transmit {
                        to: CallToolPeer::Parent,
                        bytes,
                    })
                }
                ClientOutput::Disconnect => self.out.push_back(CallToolBridgeOutput::Disconnect),
                ClientOutput::Completed { token, outcome } => self.completed(token, outcome),
                ClientOutput::LateReplyDiscarded { len } => {
                    self.event(CallToolBridgeEvent::LateReplyDiscarded { len });
                }
            }
        }
    }

    fn completed(&mut self, token: Token, outcome: Result<Reply, CallError>) {
        let tool = &token.tool;
        let (result, invalid) = match &outcome {
            Ok(Reply::Result(result)) => match validate_tool_result(result) {
                Ok(()) => (result.clone(), None),
                Err(invalid) => {
                    let text = format!(
                        "{tool}: the parent returned an invalid tool result ({invalid}); \
                         a tool result needs a non-empty \"content\" list of content blocks"
                    );
                    (mcp::tool_error(&text), Some(invalid))
                }
            },
            Ok(Reply::Error {
                message,
                error_type,
            }) => (
                mcp::tool_error(&format!("{message} (type: {error_type})")),
                None,
            ),
            Err(error) => (mcp::tool_error(&failure_text(tool, error)), None),
        };
        self.send_agent(result_line(&token.agent_id, &result));
        if let Some(invalid) = invalid {
            self.event(CallToolBridgeEvent::InvalidResult {
                tool: token.tool.clone(),
                detail: invalid.0,
            });
        }
        self.event(CallToolBridgeEvent::Completed {
            tool: token.tool,
            error: outcome.err(),
        });
    }

    fn teardown(&mut self, now: Instant) {
        self.client.shutdown(now);
        self.pump();
        self.closed = true;
        self.out.push_back(CallToolBridgeOutput::Exit);
    }

    /// Answers `-32602` with `message`.
    fn invalid_params(&mut self, agent_id: &Id, message: String) {
        let error = RpcError::new(INVALID_PARAMS, message);
        self.send_agent(error_line(Some(agent_id), &error));
    }

    fn send_agent(&mut self, line: Vec<u8>) {
        self.out.push_back(CallToolBridgeOutput::Transmit {
            to: CallToolPeer::Agent,
            bytes: line,
        });
    }

    fn event(&mut self, event: CallToolBridgeEvent) {
        self.out.push_back(CallToolBridgeOutput::Event(event));
    }
}

/// The text of the `isError` result for a call that got no reply: what failed, whether the call
/// may have run, and what the next call does.
fn failure_text(tool: &str, error: &CallError) -> String {
    match error {
        CallError::TooLarge(too_large) => format!(
            "{tool}: request too large ({too_large}); it was not sent. Send smaller arguments."
        ),
        CallError::ConnectFailed(reason) => format!(
            "{tool}: cannot connect to the parent process ({reason}); the call was not sent. \
             Check that the parent is running; the next call tries to connect again."
        ),
        CallError::ConnectionLost => format!(
            "{tool}: the parent closed the connection before replying; the call may or may not \
             have run. The next call reconnects."
        ),
        CallError::Protocol(fatal) => format!(
            "{tool}: protocol error from the parent ({fatal}); the connection was dropped and \
             the call may or may not have run. The next call reconnects."
        ),
        CallError::TimedOut { after } => format!(
            "{tool}: the parent did not reply within {} (the bridge's call timeout); the call may \
             or may not have run, and may still be running. The connection was dropped; the next \
             call reconnects.",
            seconds(*after)
        ),
        CallError::Shutdown => {
            format!("{tool}: the bridge is shutting down; the call was not completed.")
        }
    }
}

#[cfg(test)]
mod tests;
