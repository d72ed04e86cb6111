//! The MCP server face every bridge shows the agent on stdio: what one line from the agent
//! means, with the answers a bridge gives by itself already written.
//!
//! [`McpFace::classify`] answers malformed lines (`-32700` / `-32600`), `initialize` (saying who
//! the client is) and `ping`, and hands everything else back to the bridge: requests to serve, the
//! id of a request the agent cancelled, notifications and responses it may ignore.

use crate::codec::json::RawJson;
use crate::codec::jsonrpc::{self, INVALID_REQUEST, Id, Message, Request, RpcError};
use crate::codec::line::Line;
use crate::dialect::mcp;

/// Who the server says it is in `initialize`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct McpFace {
    pub(crate) server_name: String,
    pub(crate) server_version: String,
    /// The `capabilities` object's JSON text.
    pub(crate) capabilities: String,
    /// The agent's line cap (for the error text of an oversized line).
    pub(crate) max_line_bytes: usize,
}

/// What one agent line means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AgentLine {
    /// A blank line: nothing to do.
    Blank,
    /// Not a valid message: send `answer`, then log.
    Invalid {
        answer: Vec<u8>,
        len: usize,
        code: i64,
        detail: String,
    },
    /// Answered by the face itself (`ping`): send it.
    Answered(Vec<u8>),
    /// `initialize`, answered by the face itself: send `answer`. `client` is the client's
    /// `clientInfo.name`, when it gave one.
    Initialize {
        answer: Vec<u8>,
        client: Option<String>,
    },
    /// A request for the bridge to serve.
    Request(Request),
    /// `notifications/cancelled` for this request id.
    Cancelled(Id),
    /// Another notification (method); nothing to answer.
    Notification(String),
    /// A response: the bridges never ask the agent anything.
    Response,
}

impl McpFace {
    pub(crate) fn classify(&self, line: Line<'_>) -> AgentLine {
        let bytes = match line {
            Line::Oversized { len } => {
                let detail = format!(
                    "message of {len} bytes exceeds the {}-byte limit",
                    self.max_line_bytes
                );
                return invalid(None, RpcError::new(INVALID_REQUEST, detail), len);
            }
            Line::Complete(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => {
                return AgentLine::Blank;
            }
            Line::Complete(bytes) => bytes,
        };
        match jsonrpc::parse_message(bytes) {
            Err(bad) => invalid(bad.id(), bad.to_error(), bytes.len()),
            Ok(Message::Request(req)) => match req.method.as_str() {
                mcp::INITIALIZE => {
                    let result = mcp::initialize_result_for(
                        req.params.as_ref(),
                        &self.server_name,
                        &self.server_version,
                        &self.capabilities,
                    );
                    AgentLine::Initialize {
                        answer: result_line(&req.id, &result),
                        client: mcp::client_name(req.params.as_ref()),
                    }
                }
                mcp::PING => AgentLine::Answered(result_line(&req.id, &mcp::empty_result())),
                _ => AgentLine::Request(req),
            },
            Ok(Message::Notification(n)) if n.method == mcp::CANCELLED => {
                match mcp::cancelled_request_id(n.params.as_ref()) {
                    Some(id) => AgentLine::Cancelled(id),
                    None => AgentLine::Notification(n.method),
                }
            }
            Ok(Message::Notification(n)) => AgentLine::Notification(n.method),
            Ok(Message::Response(_)) => AgentLine::Response,
        }
    }
}

fn invalid(id: Option<&Id>, error: RpcError, len: usize) -> AgentLine {
    AgentLine::Invalid {
        answer: error_line(id, &error),
        len,
        code: error.code,
        detail: error.message,
    }
}

/// One JSON-RPC success line.
pub(crate) fn result_line(id: &Id, result: &RawJson) -> Vec<u8> {
    let mut line = Vec::new();
    jsonrpc::encode_response(&mut line, id, result);
    line
}

/// One JSON-RPC error line.
pub(crate) fn error_line(id: Option<&Id>, error: &RpcError) -> Vec<u8> {
    let mut line = Vec::new();
    jsonrpc::encode_error(&mut line, id, error);
    line
}
