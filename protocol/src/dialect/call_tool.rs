//! The `call_tool` dialect: length-prefixed JSON between a bridge and its parent.
//!
//! ```text
//! bridge → parent  {"method":"call_tool","params":{"name":"echo","arguments":{"text":"hi"}}}
//! parent → bridge  {"result":{"content":[{"type":"text","text":"hi"}],"isError":false}}
//! parent → bridge  {"error":{"message":"Unknown tool: nope","type":"ToolNotFoundError"}}
//! ```
//!
//! One call awaited at a time per connection. [`CallToolClient`] (the bridge's side) queues
//! further calls in order, connects lazily on the first call, fails the call in flight with a clear
//! error when the parent drops, and reconnects for the next one. Bytes the parent sends with a
//! reply or while nothing is awaited answer nothing: they drop the link. Correlation is by
//! order, kept in the shared [`Pending`] table.
//!
//! Each call on the wire has a deadline (the client's call timeout from the moment it was sent):
//! a call the parent has not answered by then fails with [`CallError::TimedOut`] and the link is
//! dropped, since a parent that does not answer one call would hold every later call on that
//! connection too; the next call reconnects. A call cancelled while queued is removed; one
//! cancelled while on the wire frees the queue at once: the next call is sent on the same
//! connection, and the reply the parent still owes the cancelled call is read by its length
//! prefix and discarded, unparsed, when it comes (replies come in request order, so it is the
//! first frame after the cancel). A parent that owes more than [`MAX_LATE_REPLIES`] such replies
//! is dropped instead. The parent's side decodes requests with
//! [`decode_call`], which separates what must close the connection ([`Fatal`]: framing or JSON
//! can no longer be trusted) from what gets an error reply (unknown method, bad params).
//!
//! The tool-schema file the parent writes (0600) for the bridge is [`parse_schema_file`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::codec::json::{NotObject, RawJson, object_text, present};
use crate::codec::length_prefixed::{self, LpDecoder, LpError, PayloadTooLarge};
use crate::session::pending::Pending;

/// How long a call may wait for the parent's reply unless the bridge is told otherwise.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Replies a connection may owe to calls cancelled on the wire before the link is dropped
/// instead (each one is a request the parent still works on before it reads the next).
pub const MAX_LATE_REPLIES: usize = 8;

/// The only method.
pub const CALL_TOOL: &str = "call_tool";
/// `type` of the error for a tool name the parent does not have.
pub const TOOL_NOT_FOUND: &str = "ToolNotFoundError";
/// `type` of the error for a malformed request.
pub const VALUE_ERROR: &str = "ValueError";

/// One entry of the tool-schema file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSchema {
    /// Tool name.
    pub name: String,
    /// What it does.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of its arguments.
    pub input_schema: Value,
}

/// The schema file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid tool-schema file: {0}")]
pub struct SchemaFileError(pub String);

/// Parses the tool-schema file: a JSON array of `{name, description, input_schema}`, each
/// `input_schema` a JSON Schema object that compiles (see [`crate::dialect::schema`]).
pub fn parse_schema_file(text: &str) -> Result<Vec<ToolSchema>, SchemaFileError> {
    let file: Vec<Value> = match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(file)) => file,
        Ok(other) => {
            return Err(SchemaFileError(format!(
                "the file must hold a JSON array of tools [{{\"name\", \"description\", \
                 \"input_schema\"}}], not {}",
                a_kind(&other)
            )));
        }
        Err(e) => return Err(SchemaFileError(format!("not valid JSON: {e}"))),
    };
    let mut tools = Vec::with_capacity(file.len());
    for (i, tool) in file.into_iter().enumerate() {
        if !tool.is_object() {
            return Err(SchemaFileError(format!(
                "tool {i} is {}, not an object {{\"name\", \"description\", \"input_schema\"}}",
                a_kind(&tool)
            )));
        }
        // On an object, serde's messages name the JSON field and the JSON type expected.
        let tool: ToolSchema =
            serde_json::from_value(tool).map_err(|e| SchemaFileError(format!("tool {i}: {e}")))?;
        tools.push(tool);
    }
    let mut seen = std::collections::BTreeSet::new();
    for tool in &tools {
        if tool.name.is_empty() {
            return Err(SchemaFileError("a tool has an empty name".into()));
        }
        if !seen.insert(tool.name.as_str()) {
            return Err(SchemaFileError(format!(
                "tool '{}' is listed twice",
                tool.name
            )));
        }
        if !tool.input_schema.is_object() {
            return Err(SchemaFileError(format!(
                "tool '{}': input_schema must be an object",
                tool.name
            )));
        }
    }
    crate::dialect::schema::ArgumentCheck::compile(
        tools.iter().map(|t| (t.name.as_str(), &t.input_schema)),
    )
    .map_err(|e| SchemaFileError(e.to_string()))?;
    Ok(tools)
}

/// The MCP `tools/list` result for these tools: `{"tools":[{name, description, inputSchema}]}`.
pub fn tools_list_result(tools: &[ToolSchema]) -> RawJson {
    let tools: Vec<Value> = tools
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name,
                "description": t.description,
                "inputSchema": t.input_schema,
            })
        })
        .collect();
    RawJson::from_value(&serde_json::json!({ "tools": tools })).expect("JSON values serialize")
}

/// A `call_tool` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallTool {
    /// Tool name.
    pub name: String,
    /// Arguments object, verbatim.
    pub arguments: RawJson,
}

/// The parent's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `{"result": …}`: an MCP `CallToolResult` (`content`, optional `isError`), verbatim.
    Result(RawJson),
    /// `{"error": {"message", "type"}}`.
    Error {
        /// Actionable description.
        message: String,
        /// The exception class name, e.g. `ToolNotFoundError`.
        error_type: String,
    },
}

/// The payload of a request (no length prefix).
pub fn encode_call(call: &CallTool) -> Vec<u8> {
    let mut out = Vec::with_capacity(call.arguments.get().len() + call.name.len() + 48);
    out.extend_from_slice(b"{\"method\":\"call_tool\",\"params\":{\"name\":");
    crate::codec::json::write_str(&mut out, &call.name);
    out.extend_from_slice(b",\"arguments\":");
    crate::codec::json::write_raw(&mut out, &call.arguments);
    out.extend_from_slice(b"}}");
    out
}

/// The payload of a reply (no length prefix).
pub fn encode_reply(reply: &Reply) -> Vec<u8> {
    let mut out = Vec::new();
    match reply {
        Reply::Result(result) => {
            out.extend_from_slice(b"{\"result\":");
            crate::codec::json::write_raw(&mut out, result);
            out.push(b'}');
        }
        Reply::Error {
            message,
            error_type,
        } => {
            out.extend_from_slice(b"{\"error\":{\"message\":");
            crate::codec::json::write_str(&mut out, message);
            out.extend_from_slice(b",\"type\":");
            crate::codec::json::write_str(&mut out, error_type);
            out.extend_from_slice(b"}}");
        }
    }
    out
}

/// The stream can no longer be trusted: close the connection without answering.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Fatal {
    /// Bad framing.
    #[error(transparent)]
    Framing(#[from] LpError),
    /// The payload is not UTF-8.
    #[error("payload is not valid UTF-8")]
    InvalidUtf8,
    /// The payload is empty.
    #[error("empty payload")]
    Empty,
    /// The payload is not JSON.
    #[error("payload is not valid JSON: {0}")]
    InvalidJson(String),
    /// The payload is JSON but not an object.
    #[error("payload is not a JSON object")]
    NotAnObject,
    /// A reply that is neither `{"result"}` nor `{"error": {message, type}}`, or one nobody asked for.
    #[error("unexpected reply: {0}")]
    UnexpectedReply(String),
}

/// Why a request payload was not a call: close the connection, or answer with an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadRequest {
    /// Close the connection.
    Fatal(Fatal),
    /// Answer with this error reply and keep the connection.
    Reject(Reply),
}

/// The top-level fields of a payload, kept raw.
#[derive(Deserialize)]
struct WirePayload<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    method: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct WireParams<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    name: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    arguments: Option<&'a RawValue>,
}

fn first_byte(raw: &RawValue) -> u8 {
    raw.get().as_bytes().first().copied().unwrap_or(b' ')
}

fn parse_payload(payload: &[u8]) -> Result<WirePayload<'_>, Fatal> {
    if payload.is_empty() {
        return Err(Fatal::Empty);
    }
    let text = object_text(payload).map_err(|why| match why {
        NotObject::InvalidUtf8 { .. } => Fatal::InvalidUtf8,
        NotObject::InvalidJson(detail) => Fatal::InvalidJson(detail),
        NotObject::NotAnObject { .. } => Fatal::NotAnObject,
    })?;
    serde_json::from_str(text).map_err(|e| Fatal::InvalidJson(e.to_string()))
}

fn reject(message: String) -> BadRequest {
    BadRequest::Reject(Reply::Error {
        message,
        error_type: VALUE_ERROR.to_owned(),
    })
}

/// Decodes a request payload on the parent's side. The arguments are kept verbatim.
pub fn decode_call(payload: &[u8]) -> Result<CallTool, BadRequest> {
    let wire = parse_payload(payload).map_err(BadRequest::Fatal)?;
    let method = wire.method.map(|m| serde_json::from_str::<String>(m.get()));
    match method {
        Some(Ok(m)) if m == CALL_TOOL => {}
        Some(Ok(m)) => return Err(reject(format!("Unknown method: {m}"))),
        Some(Err(_)) => {
            let raw = wire.method.map(RawValue::get).unwrap_or_default();
            return Err(reject(format!("Unknown method: {raw}")));
        }
        None => return Err(reject("Unknown method: (missing)".into())),
    }
    let params = match wire.params {
        Some(p) if first_byte(p) == b'{' => serde_json::from_str::<WireParams<'_>>(p.get())
            .map_err(|e| BadRequest::Fatal(Fatal::InvalidJson(e.to_string())))?,
        _ => return Err(reject("Invalid params: expected dict".into())),
    };
    let Some(Ok(name)) = params.name.map(|n| serde_json::from_str::<String>(n.get())) else {
        return Err(reject("Invalid tool name: expected string".into()));
    };
    let arguments = match params.arguments {
        None => RawJson::from_text("{}").expect("valid JSON"),
        Some(a) if a.get() == "null" => RawJson::from_text("{}").expect("valid JSON"),
        Some(a) if first_byte(a) == b'{' => RawJson::from_raw(a),
        Some(_) => return Err(reject("Invalid arguments: expected dict".into())),
    };
    Ok(CallTool { name, arguments })
}

#[derive(Deserialize)]
struct WireError {
    message: String,
    #[serde(rename = "type")]
    error_type: String,
}

/// Decodes a reply payload on the bridge's side. A result is kept verbatim.
pub fn decode_reply(payload: &[u8]) -> Result<Reply, Fatal> {
    let wire = parse_payload(payload)?;
    let result = wire.result.filter(|r| r.get() != "null");
    let error = wire.error.filter(|e| e.get() != "null");
    match (result, error) {
        (Some(result), None) if first_byte(result) == b'{' => {
            Ok(Reply::Result(RawJson::from_raw(result)))
        }
        (Some(_), None) => Err(Fatal::UnexpectedReply("result is not an object".into())),
        (None, Some(error)) if first_byte(error) != b'{' => Err(Fatal::UnexpectedReply(format!(
            "\"error\" must be an object {{\"message\": <string>, \"type\": <string>}}, not {}",
            a_kind_raw(error)
        ))),
        (None, Some(error)) => {
            // On an object, serde's messages name the JSON field and the JSON type expected.
            let error: WireError = serde_json::from_str(error.get())
                .map_err(|e| Fatal::UnexpectedReply(format!("bad error object: {e}")))?;
            Ok(Reply::Error {
                message: error.message,
                error_type: error.error_type,
            })
        }
        (Some(_), Some(_)) => Err(Fatal::UnexpectedReply("both result and error".into())),
        (None, None) => Err(Fatal::UnexpectedReply("neither result nor error".into())),
    }
}

/// Why a parent's `result` is not an MCP `CallToolResult` an agent can accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidResult(pub String);

/// The content block types of MCP, each with its required fields and their JSON types.
const CONTENT_TYPES: [(&str, &[(&str, &str)]); 5] = [
    ("text", &[("text", "string")]),
    ("image", &[("data", "string"), ("mimeType", "string")]),
    ("audio", &[("data", "string"), ("mimeType", "string")]),
    ("resource_link", &[("uri", "string"), ("name", "string")]),
    ("resource", &[("resource", "object")]),
];

fn json_kind(raw: &RawValue) -> &'static str {
    match first_byte(raw) {
        b'"' => "string",
        b'{' => "object",
        b'[' => "array",
        b't' | b'f' => "boolean",
        b'n' => "null",
        _ => "number",
    }
}

/// The JSON type of `value` with its article: "a string", "an object", ...
pub(crate) fn a_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn a_kind_raw(raw: &RawValue) -> &'static str {
    match json_kind(raw) {
        "null" => "null",
        "object" => "an object",
        "array" => "an array",
        "string" => "a string",
        "boolean" => "a boolean",
        _ => "a number",
    }
}

/// Checks a parent's `result` the way an MCP client will: an object whose `content` is a
/// non-empty list (`content` must hold at least one element) of content blocks,
/// each with a known `type` and that type's required fields; `isError`, when present, a
/// boolean; `_meta`, when present, an object. Unknown extra fields are allowed. Nothing is
/// copied: fields are looked at raw.
pub fn validate_tool_result(result: &RawJson) -> Result<(), InvalidResult> {
    let bad = |s: String| Err(InvalidResult(s));
    let fields: std::collections::BTreeMap<&str, &RawValue> = match result.parse() {
        Ok(fields) if result.get().trim_start().starts_with('{') => fields,
        _ => return bad("the result is not a JSON object".into()),
    };
    let content = match fields.get("content") {
        None => return bad("the result has no \"content\" list".into()),
        Some(c) if first_byte(c) != b'[' => {
            return bad(format!("\"content\" is {}, not a list", json_kind(c)));
        }
        Some(c) => serde_json::from_str::<Vec<&RawValue>>(c.get())
            .map_err(|e| InvalidResult(format!("\"content\" is not a list: {e}")))?,
    };
    if content.is_empty() {
        return bad("\"content\" is empty; it must hold at least one content block".into());
    }
    for (i, item) in content.iter().enumerate() {
        if first_byte(item) != b'{' {
            return bad(format!(
                "content[{i}] is {}, not an object",
                json_kind(item)
            ));
        }
        let item: std::collections::BTreeMap<&str, &RawValue> = serde_json::from_str(item.get())
            .map_err(|e| InvalidResult(format!("content[{i}] is not an object: {e}")))?;
        let Some(kind) = item.get("type") else {
            return bad(format!("content[{i}] has no \"type\""));
        };
        let kind = serde_json::from_str::<String>(kind.get()).unwrap_or_default();
        let Some((_, required)) = CONTENT_TYPES.iter().find(|(name, _)| *name == kind) else {
            return bad(format!(
                "content[{i}] has type {}, which is none of text, image, audio, resource_link, \
                 resource",
                item["type"].get()
            ));
        };
        for (field, want) in *required {
            match item.get(field) {
                Some(v) if json_kind(v) == *want => {}
                Some(v) => {
                    let article = if *want == "object" { "an" } else { "a" };
                    return bad(format!(
                        "content[{i}] ({kind}): \"{field}\" is {}, not {article} {want}",
                        json_kind(v)
                    ));
                }
                None => return bad(format!("content[{i}] ({kind}) has no \"{field}\"")),
            }
        }
        if kind == "resource" {
            let resource: std::collections::BTreeMap<&str, &RawValue> =
                serde_json::from_str(item["resource"].get())
                    .map_err(|e| InvalidResult(format!("content[{i}].resource: {e}")))?;
            let string = |key: &str| resource.get(key).is_some_and(|v| first_byte(v) == b'"');
            if !string("uri") {
                return bad(format!("content[{i}].resource has no \"uri\" string"));
            }
            if !string("text") && !string("blob") {
                return bad(format!(
                    "content[{i}].resource has neither a \"text\" nor a \"blob\" string"
                ));
            }
        }
    }
    if let Some(v) = fields.get("isError")
        && json_kind(v) != "boolean"
    {
        return bad(format!("\"isError\" is {}, not a boolean", json_kind(v)));
    }
    if let Some(v) = fields.get("_meta")
        && !matches!(json_kind(v), "object" | "null")
    {
        return bad(format!("\"_meta\" is {}, not an object", json_kind(v)));
    }
    Ok(())
}

/// Why a call failed without a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The request does not fit in a frame; it was never sent.
    #[error(transparent)]
    TooLarge(#[from] PayloadTooLarge),
    /// The connection to the parent could not be made.
    #[error("cannot connect to the parent: {0}")]
    ConnectFailed(String),
    /// The parent dropped the connection while this call was in flight.
    #[error("the parent closed the connection before replying")]
    ConnectionLost,
    /// The parent broke the protocol; the connection was dropped.
    #[error("protocol error from the parent: {0}")]
    Protocol(Fatal),
    /// The parent did not reply within the call timeout; the connection was dropped.
    #[error("no reply from the parent within {}", seconds(*after))]
    TimedOut {
        /// The call timeout.
        after: Duration,
    },
    /// The client was shut down.
    #[error("the bridge is shutting down")]
    Shutdown,
}

/// A duration as people read it: `120 s`, `1.5 s`, `250 ms`.
pub fn seconds(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        let text = format!("{:.3}", d.as_secs_f64());
        format!("{} s", text.trim_end_matches('0'))
    }
}

/// Where a cancelled call was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// Not sent yet: removed from the queue.
    Queued,
    /// On the wire: the parent's reply to it will be discarded.
    OnWire,
}

/// Something for the driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientOutput<T> {
    /// Open the connection; report with `handle_connected` or `handle_connect_failed`.
    Connect,
    /// Write these bytes (one frame).
    Transmit(Vec<u8>),
    /// Close the connection (framing was lost); no `handle_closed` is needed for it.
    Disconnect,
    /// A call finished.
    Completed {
        /// The caller's token.
        token: T,
        /// The parent's reply, or why there is none.
        outcome: Result<Reply, CallError>,
    },
    /// The reply to a call cancelled on the wire arrived and was discarded unread.
    LateReplyDiscarded {
        /// Its payload's length.
        len: usize,
    },
}

/// The call on the wire that a reply will answer.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    id: u64,
    deadline: Instant,
}

/// The connection to the parent. Only a connected link has a decoder and calls on the wire.
#[derive(Debug, Clone)]
enum Link {
    Disconnected,
    Connecting,
    Connected {
        decoder: LpDecoder,
        /// Replies owed to calls cancelled on the wire: the next frames, discarded.
        late: usize,
        /// The call awaited, if any (after the `late` replies); the protocol is sequential.
        in_flight: Option<InFlight>,
    },
}

#[derive(Debug, Clone)]
struct Queued<T> {
    token: T,
    frame: Vec<u8>,
}

/// The bridge's side of the dialect. See the [module docs](self).
///
/// Contract: inputs take the time they happen (`now`, last) and never read a clock. The
/// application issues calls with [`request`](Self::request) and withdraws them with
/// [`cancel`](Self::cancel); the driver reports the connection's life with `handle_connected` /
/// `handle_connect_failed` / `handle_bytes` / `handle_closed`, calls
/// [`handle_timeout`](Self::handle_timeout) once [`poll_timeout`](Self::poll_timeout) has passed,
/// and drains [`poll_output`](Self::poll_output): [`ClientOutput::Connect`],
/// [`ClientOutput::Transmit`], [`ClientOutput::Disconnect`], one [`ClientOutput::Completed`] per
/// call not cancelled, and [`ClientOutput::LateReplyDiscarded`] for the log.
#[derive(Debug, Clone)]
pub struct CallToolClient<T> {
    max_payload_bytes: usize,
    call_timeout: Duration,
    link: Link,
    calls: Pending<Queued<T>>,
    out: VecDeque<ClientOutput<T>>,
}

impl<T> CallToolClient<T> {
    /// A client not yet connected; each call gets `call_timeout` for its reply once sent.
    pub fn new(max_payload_bytes: usize, call_timeout: Duration) -> Self {
        Self {
            max_payload_bytes,
            call_timeout,
            link: Link::Disconnected,
            calls: Pending::new(),
            out: VecDeque::new(),
        }
    }

    /// Queues a call; it goes on the wire when every earlier one is answered or cancelled.
    pub fn request(&mut self, call: &CallTool, token: T, now: Instant) {
        let mut frame = Vec::new();
        match length_prefixed::encode(&encode_call(call), &mut frame, self.max_payload_bytes) {
            Ok(()) => {
                self.calls.insert(Queued { token, frame });
                self.pump(now);
            }
            Err(too_large) => self.out.push_back(ClientOutput::Completed {
                token,
                outcome: Err(CallError::TooLarge(too_large)),
            }),
        }
    }

    /// Withdraws the first pending call whose token matches: removed from the queue, or, on the
    /// wire, no longer awaited (the next call goes out at once and the parent's reply to this
    /// one is discarded when it comes). It will not complete. `None` when no pending call
    /// matches (answered already, or never made).
    pub fn cancel(
        &mut self,
        mut matches: impl FnMut(&T) -> bool,
        now: Instant,
    ) -> Option<(T, Cancelled)> {
        let id = self.calls.find(|queued| matches(&queued.token))?;
        let queued = self.calls.remove(id)?;
        let on_wire = match &mut self.link {
            Link::Connected {
                late, in_flight, ..
            } if in_flight.is_some_and(|f| f.id == id) => {
                *in_flight = None;
                *late += 1;
                true
            }
            Link::Disconnected | Link::Connecting | Link::Connected { .. } => false,
        };
        if on_wire && matches!(self.link, Link::Connected { late, .. } if late > MAX_LATE_REPLIES) {
            self.link = Link::Disconnected;
            self.out.push_back(ClientOutput::Disconnect);
        }
        self.pump(now);
        let cancelled = if on_wire {
            Cancelled::OnWire
        } else {
            Cancelled::Queued
        };
        Some((queued.token, cancelled))
    }

    /// The connection is open.
    pub fn handle_connected(&mut self, now: Instant) {
        if matches!(self.link, Link::Connecting) {
            self.link = Link::Connected {
                decoder: LpDecoder::new(self.max_payload_bytes),
                late: 0,
                in_flight: None,
            };
            self.pump(now);
        }
    }

    /// The connection could not be opened: every queued call fails with the reason.
    pub fn handle_connect_failed(&mut self, reason: &str, _now: Instant) {
        if !matches!(self.link, Link::Connecting) {
            return;
        }
        self.link = Link::Disconnected;
        for (_, queued) in self.calls.fail_all() {
            self.out.push_back(ClientOutput::Completed {
                token: queued.token,
                outcome: Err(CallError::ConnectFailed(reason.to_owned())),
            });
        }
    }

    /// Bytes from the parent.
    pub fn handle_bytes(&mut self, bytes: &[u8], now: Instant) {
        let Link::Connected { decoder, .. } = &mut self.link else {
            return;
        };
        decoder.push(bytes);
        loop {
            let Link::Connected {
                decoder,
                late,
                in_flight,
            } = &mut self.link
            else {
                return;
            };
            let payload = match decoder.decode() {
                Ok(None) => return,
                Ok(Some(payload)) => payload,
                Err(error) => {
                    self.drop_link(Fatal::Framing(error), now);
                    return;
                }
            };
            if *late > 0 {
                // The first frame owed is the cancelled call's reply: its content is never
                // looked at, whatever it holds.
                *late -= 1;
                self.out
                    .push_back(ClientOutput::LateReplyDiscarded { len: payload.len() });
            } else {
                let Some(InFlight { id, .. }) = *in_flight else {
                    self.drop_link(
                        Fatal::UnexpectedReply("a reply nobody asked for".into()),
                        now,
                    );
                    return;
                };
                match decode_reply(&payload) {
                    Ok(reply) => {
                        *in_flight = None;
                        self.complete(id, Ok(reply));
                    }
                    Err(fatal) => {
                        self.drop_link(fatal, now);
                        return;
                    }
                }
            }
            // Bytes that came behind the last reply owed were sent before the parent could see
            // a next request: they cannot answer it.
            if let Link::Connected {
                decoder,
                late: 0,
                in_flight: None,
            } = &self.link
                && decoder.buffered_len() > 0
            {
                self.drop_link(
                    Fatal::UnexpectedReply("bytes after a reply, before the next request".into()),
                    now,
                );
                return;
            }
            self.pump(now);
        }
    }

    /// The parent closed the connection (ignored unless connected: a connection attempt that
    /// fails is reported with `handle_connect_failed`).
    pub fn handle_closed(&mut self, now: Instant) {
        let (mut decoder, in_flight) = match std::mem::replace(&mut self.link, Link::Disconnected) {
            Link::Connected {
                decoder, in_flight, ..
            } => (decoder, in_flight),
            unconnected @ (Link::Disconnected | Link::Connecting) => {
                self.link = unconnected;
                return;
            }
        };
        if let Some(InFlight { id, .. }) = in_flight {
            let outcome = match decoder.decode_eof() {
                Err(error) => Err(CallError::Protocol(Fatal::Framing(error))),
                Ok(()) => Err(CallError::ConnectionLost),
            };
            self.complete(id, outcome);
        }
        self.pump(now);
    }

    /// When [`handle_timeout`](Self::handle_timeout) is due: the deadline of the call on the
    /// wire, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.link {
            Link::Connected {
                in_flight: Some(f), ..
            } => Some(f.deadline),
            Link::Disconnected | Link::Connecting | Link::Connected { .. } => None,
        }
    }

    /// Fails the call on the wire if its deadline has passed ([`CallError::TimedOut`]), drops
    /// the link, and reconnects for what is still queued. Early calls change nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        let Some(deadline) = self.poll_timeout() else {
            return;
        };
        if now < deadline {
            return;
        }
        if let Link::Connected {
            in_flight: Some(InFlight { id, .. }),
            ..
        } = std::mem::replace(&mut self.link, Link::Disconnected)
        {
            self.complete(
                id,
                Err(CallError::TimedOut {
                    after: self.call_timeout,
                }),
            );
        }
        self.out.push_back(ClientOutput::Disconnect);
        self.pump(now);
    }

    /// Fails every queued and in-flight call (teardown); the tokens come out as `Completed`.
    pub fn shutdown(&mut self, _now: Instant) {
        let link = std::mem::replace(&mut self.link, Link::Disconnected);
        for (_, queued) in self.calls.fail_all() {
            self.out.push_back(ClientOutput::Completed {
                token: queued.token,
                outcome: Err(CallError::Shutdown),
            });
        }
        match link {
            Link::Disconnected => {}
            Link::Connecting | Link::Connected { .. } => {
                self.out.push_back(ClientOutput::Disconnect);
            }
        }
    }

    /// The next thing to do, until `None`.
    pub fn poll_output(&mut self) -> Option<ClientOutput<T>> {
        self.out.pop_front()
    }

    /// Calls queued or in flight (not those cancelled).
    pub fn pending_len(&self) -> usize {
        self.calls.len()
    }

    /// Whether a call on the wire awaits its reply.
    pub fn is_busy(&self) -> bool {
        matches!(
            self.link,
            Link::Connected {
                in_flight: Some(_),
                ..
            }
        )
    }

    /// Replies the connection owes to calls cancelled on the wire.
    pub fn late_replies(&self) -> usize {
        match self.link {
            Link::Connected { late, .. } => late,
            Link::Disconnected | Link::Connecting => 0,
        }
    }

    fn complete(&mut self, id: u64, outcome: Result<Reply, CallError>) {
        if let Ok(queued) = self.calls.take(id) {
            self.out.push_back(ClientOutput::Completed {
                token: queued.token,
                outcome,
            });
        }
    }

    /// Framing or the reply stream broke: fail the call in flight, close, and reconnect for what
    /// is still queued.
    fn drop_link(&mut self, fatal: Fatal, now: Instant) {
        if let Link::Connected {
            in_flight: Some(InFlight { id, .. }),
            ..
        } = std::mem::replace(&mut self.link, Link::Disconnected)
        {
            self.complete(id, Err(CallError::Protocol(fatal)));
        }
        self.out.push_back(ClientOutput::Disconnect);
        self.pump(now);
    }

    fn pump(&mut self, now: Instant) {
        match &mut self.link {
            Link::Disconnected if !self.calls.is_empty() => {
                self.link = Link::Connecting;
                self.out.push_back(ClientOutput::Connect);
            }
            Link::Connected {
                in_flight: in_flight @ None,
                ..
            } => {
                // The next call not yet sent: every pending call before it was sent and then
                // answered or cancelled, so the first pending one.
                let Some(id) = self.calls.ids().next() else {
                    return;
                };
                let Some(queued) = self.calls.get_mut(id) else {
                    return;
                };
                let frame = std::mem::take(&mut queued.frame);
                *in_flight = Some(InFlight {
                    id,
                    deadline: now + self.call_timeout,
                });
                self.out.push_back(ClientOutput::Transmit(frame));
            }
            Link::Disconnected | Link::Connecting | Link::Connected { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests;
