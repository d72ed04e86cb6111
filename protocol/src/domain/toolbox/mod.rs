//! The toolbox the runner serves to its agent: definitions composed from the briefing,
//! argument validation with the TypeScript runner's error texts, and each tool as a small plan.
//!
//! A plan is pure: [`plan`] validates the arguments and returns either the finished text or the
//! first broker request together with what to do with its response. The runner performs the
//! request, feeds the response to the continuation, and repeats until [`Plan::Done`]. Time (for
//! "5m ago") is part of the [`Context`]. Every outcome is a `CallToolResult` text: failures —
//! validation, a broker error (`broker error <status>: <body>`), a local permission check — are
//! `isError` results, never JSON-RPC errors.
//!
//! ```text
//! plan(ctx, "send", args) ─▶ Request(POST /push, next) ─▶ runner does HTTP ─▶ next(response)
//!                                                                               └▶ Done(text)
//! ```

mod admin;
mod chat;
mod defs;
mod format;
mod fs;
mod lenient;
mod objectives;
mod registry;
mod tools;

use crate::EpochMs;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

pub use registry::{plan, tool_list};

use crate::domain::objective::Objective;
pub use crate::domain::team::{Role, Team};

/// A teammate, as the briefing and roster show them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TeammateInfo {
    /// Name.
    pub name: String,
    /// Role.
    pub role: Role,
    /// Resolved leaf permissions.
    #[serde(default)]
    pub permissions: Vec<String>,
}

/// `GET /briefing`: who the agent is, fetched once at start-up.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Briefing {
    /// The agent's member name.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// Its resolved leaf permissions.
    #[serde(default)]
    pub permissions: Vec<String>,
    /// The briefing prose (system prompt / developer instructions).
    #[serde(default)]
    pub instructions: String,
    /// The team.
    pub team: Team,
    /// Every member, the agent included.
    #[serde(default)]
    pub teammates: Vec<TeammateInfo>,
    /// The agent's open objectives at start-up.
    #[serde(default)]
    pub open_objectives: Vec<Objective>,
    /// The last message the broker wrote to any of the member's live streams (brokers that keep
    /// no such cursor leave it out): a runner that starts resumes after it.
    #[serde(default)]
    pub delivered_through: Option<String>,
    /// Nothing in the log has been delivered to the member yet (it never had a live stream) and
    /// nothing it may see was logged before it joined: a runner that starts resumes from the log's
    /// first message.
    #[serde(default)]
    pub delivered_nothing: bool,
}

/// What a plan needs to know besides its arguments.
#[derive(Debug, Clone)]
pub struct Context {
    /// The briefing.
    pub briefing: Arc<Briefing>,
    /// Now, in epoch milliseconds (for ages such as "5m ago").
    pub now_ms: EpochMs,
}

impl Context {
    /// Whether the agent holds the permission `leaf`.
    pub fn has(&self, leaf: &str) -> bool {
        self.briefing.permissions.iter().any(|p| p == leaf)
    }

    fn me(&self) -> &str {
        &self.briefing.name
    }
}

/// HTTP methods the tools use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// POST
    Post,
    /// PATCH
    Patch,
    /// PUT
    Put,
    /// DELETE
    Delete,
}

impl Method {
    /// The method name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Post => "POST",
            Self::Patch => "PATCH",
            Self::Put => "PUT",
            Self::Delete => "DELETE",
        }
    }
}

/// A request body.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// No body.
    Empty,
    /// A JSON body.
    Json(Value),
    /// Raw bytes (`POST /fs/write`).
    Bytes {
        /// The bytes.
        bytes: Vec<u8>,
        /// Their `Content-Type`.
        content_type: String,
    },
}

/// A broker request a plan wants made (with the agent's bearer token).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Method.
    pub method: Method,
    /// Path and query, already percent-encoded (e.g. `/objectives?assignee=builder`).
    pub path: String,
    /// Body.
    pub body: Body,
}

/// The broker's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// A tool's final text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolText {
    /// The text block.
    pub text: String,
    /// Whether it is an `isError` result.
    pub is_error: bool,
    /// Whether the agent's open objectives may have changed (trigger the objectives tracker).
    pub objectives_changed: bool,
}

impl ToolText {
    fn ok(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            is_error: false,
            objectives_changed: false,
        }
    }

    fn error(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            is_error: true,
            objectives_changed: false,
        }
    }

    fn changing_objectives(mut self) -> Self {
        self.objectives_changed = !self.is_error;
        self
    }

    /// The MCP `CallToolResult`.
    pub fn to_result(&self) -> crate::codec::json::RawJson {
        if self.is_error {
            crate::dialect::mcp::tool_error(&self.text)
        } else {
            crate::dialect::mcp::tool_text(&self.text)
        }
    }
}

/// What to do with a response.
pub type Next = Box<dyn FnOnce(Response) -> Plan + Send>;

/// The state of a tool call.
pub enum Plan {
    /// Make this request, then call the continuation with the response.
    Request(Request, Next),
    /// Finished.
    Done(ToolText),
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Request(request, _) => f.debug_tuple("Request").field(request).finish(),
            Self::Done(text) => f.debug_tuple("Done").field(text).finish(),
        }
    }
}

/// What `encodeURIComponent` leaves as it is: ASCII letters, digits and `-_.!~*'()`.
const COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'!')
    .remove(b'~')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')');

/// Percent-encodes a query value or path segment (like `encodeURIComponent`).
pub fn encode_component(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, COMPONENT).to_string()
}

#[cfg(test)]
mod tests;
