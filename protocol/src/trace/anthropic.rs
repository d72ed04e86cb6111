//! The Anthropic Messages API (`POST /v1/messages`): request and response bodies → the
//! [`LlmRequest`] / [`LlmResponse`] of an `llm_exchange`.
//!
//! Requests map as the TypeScript runner maps them, except that an array `system` is kept (as
//! blocks). Responses are a JSON message or a stream of server-sent events (parsed by
//! [`crate::codec::sse`]), reassembled as the TypeScript runner reassembles them, with these
//! differences: an `error` event is reported in `response.error` (with `stopReason: "error"`)
//! also after `message_start`; blocks other than
//! text, tool_use and thinking (`redacted_thinking`, `server_tool_use`, …) are kept whole as
//! `unknown` blocks; a stream cut short still yields what arrived. Every value is redacted
//! ([`redact_json`]) before it is mapped.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::activity::{Block, LlmMessage, LlmRequest, LlmResponse, LlmTool, SystemPrompt, Usage};
use super::redact::{redact_json, redact_text};
use crate::codec::sse::{SseItem, SseParser};

fn string(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn finite_number(v: &Value, key: &str) -> Option<serde_json::Number> {
    match v.get(key) {
        Some(Value::Number(n)) => Some(n.clone()),
        _ => None,
    }
}

/// One content block.
pub fn block(v: &Value) -> Block {
    let text_of = |key: &str| string(v, key);
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Block::Text {
            text: text_of("text").unwrap_or_default(),
        },
        Some("tool_use") => Block::ToolUse {
            id: text_of("id").unwrap_or_default(),
            name: text_of("name").unwrap_or_default(),
            input: v.get("input").cloned().unwrap_or(Value::Null),
        },
        Some("tool_result") => Block::ToolResult {
            tool_use_id: text_of("tool_use_id").unwrap_or_default(),
            content: v.get("content").cloned().unwrap_or(Value::Null),
            is_error: v.get("is_error") == Some(&Value::Bool(true)),
        },
        Some("image") => Block::Image {
            media_type: v
                .get("source")
                .and_then(|s| s.get("media_type"))
                .and_then(Value::as_str)
                .map(str::to_owned),
        },
        Some("thinking") => Block::Thinking {
            text: text_of("thinking")
                .or_else(|| text_of("text"))
                .unwrap_or_default(),
        },
        _ => Block::Unknown { raw: v.clone() },
    }
}

/// A message's `content`: a string is one text block.
pub fn content(v: Option<&Value>) -> Vec<Block> {
    match v {
        Some(Value::String(text)) => vec![Block::Text { text: text.clone() }],
        Some(Value::Array(items)) => items.iter().map(block).collect(),
        _ => Vec::new(),
    }
}

/// A request body (already parsed as JSON) → the request side of an exchange.
pub fn request(body: &Value) -> LlmRequest {
    let mut body = body.clone();
    redact_json(&mut body);
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter(|m| m.is_object())
                .map(|m| LlmMessage {
                    role: string(m, "role").unwrap_or_else(|| "unknown".to_owned()),
                    content: content(m.get("content")),
                })
                .collect()
        })
        .unwrap_or_default();
    let system = match body.get("system") {
        Some(Value::String(s)) => Some(SystemPrompt::Text(s.clone())),
        Some(Value::Array(items)) => Some(SystemPrompt::Blocks(items.iter().map(block).collect())),
        _ => None,
    };
    let tools = body.get("tools").and_then(Value::as_array).map(|tools| {
        tools
            .iter()
            .map(|t| LlmTool {
                name: string(t, "name").unwrap_or_default(),
                description: string(t, "description"),
                input_schema: t.get("input_schema").cloned().unwrap_or(Value::Null),
            })
            .collect()
    });
    LlmRequest {
        model: string(&body, "model"),
        max_tokens: finite_number(&body, "max_tokens"),
        temperature: finite_number(&body, "temperature"),
        system,
        messages,
        tools,
    }
}

fn count(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

/// The four counters of an Anthropic `usage` object; `None` when none is present.
pub fn usage(v: Option<&Value>) -> Option<Usage> {
    let v = v?;
    let usage = Usage {
        input_tokens: count(v, "input_tokens"),
        output_tokens: count(v, "output_tokens"),
        cache_creation_input_tokens: count(v, "cache_creation_input_tokens"),
        cache_read_input_tokens: count(v, "cache_read_input_tokens"),
    };
    (usage != Usage::default()).then_some(usage)
}

/// `<type>: <message>` of an API error object (`{"type":"error","error":{…}}`).
pub fn error_text(v: &Value) -> Option<String> {
    let e = v.get("error")?;
    let kind = e.get("type").and_then(Value::as_str).unwrap_or("error");
    let text = match e.get("message").and_then(Value::as_str) {
        Some(message) => format!("{kind}: {message}"),
        None => kind.to_owned(),
    };
    Some(redact_text(&text).into_owned())
}

/// A complete message object (a JSON response, or a reassembled stream) → the response side.
pub fn response_from_message(message: &Value, status: u16) -> LlmResponse {
    let mut message = message.clone();
    redact_json(&mut message);
    if message.get("type").and_then(Value::as_str) == Some("error") {
        return LlmResponse {
            stop_reason: Some("error".into()),
            status: Some(status),
            error: error_text(&message),
            ..LlmResponse::default()
        };
    }
    let messages = match message.get("content") {
        Some(c) => vec![LlmMessage {
            role: "assistant".into(),
            content: content(Some(c)),
        }],
        None => Vec::new(),
    };
    LlmResponse {
        stop_reason: string(&message, "stop_reason"),
        stop_sequence: string(&message, "stop_sequence"),
        messages,
        usage: usage(message.get("usage")),
        status: Some(status),
        error: None,
    }
}

/// Appends `piece` to the string at `key` (created when missing or not a string), in place.
pub(crate) fn append_str(object: &mut Map<String, Value>, key: &str, piece: &str) {
    match object.get_mut(key) {
        Some(Value::String(text)) => text.push_str(piece),
        _ => {
            object.insert(key.to_owned(), Value::String(piece.to_owned()));
        }
    }
}

/// Reassembles a Messages event stream into one message object plus the error it reported.
#[derive(Debug, Default)]
pub struct MessageStream {
    message: Option<Map<String, Value>>,
    blocks: BTreeMap<u64, (Map<String, Value>, String)>,
    usage: Map<String, Value>,
    stop_reason: Option<Value>,
    stop_sequence: Option<Value>,
    error: Option<String>,
}

impl MessageStream {
    /// Takes one event's data (its `type` field names it, else `event`).
    pub fn push(&mut self, event: &str, data: &str) {
        let Ok(data) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let kind = data.get("type").and_then(Value::as_str).unwrap_or(event);
        let index = data.get("index").and_then(Value::as_u64);
        match kind {
            "message_start" => {
                if let Some(Value::Object(m)) = data.get("message") {
                    if let Some(Value::Object(u)) = m.get("usage") {
                        self.usage.extend(u.clone());
                    }
                    self.message = Some(m.clone());
                }
            }
            "content_block_start" => {
                if let (Some(index), Some(Value::Object(block))) =
                    (index, data.get("content_block"))
                {
                    let mut block = block.clone();
                    if matches!(
                        block.get("type").and_then(Value::as_str),
                        Some("tool_use" | "server_tool_use")
                    ) && block.get("input") == Some(&Value::Object(Map::new()))
                    {
                        crate::codec::json::remove_keeping_order(&mut block, "input");
                    }
                    self.blocks.insert(index, (block, String::new()));
                }
            }
            "content_block_delta" => {
                let (Some(index), Some(delta)) = (index, data.get("delta")) else {
                    return;
                };
                let Some((block, json)) = self.blocks.get_mut(&index) else {
                    return;
                };
                let append = |block: &mut Map<String, Value>, key: &str, field: &str| {
                    if let Some(piece) = delta.get(field).and_then(Value::as_str) {
                        append_str(block, key, piece);
                    }
                };
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => append(block, "text", "text"),
                    Some("thinking_delta") => append(block, "thinking", "thinking"),
                    Some("signature_delta") => append(block, "signature", "signature"),
                    Some("input_json_delta") => {
                        if let Some(piece) = delta.get("partial_json").and_then(Value::as_str) {
                            json.push_str(piece);
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(delta) = data.get("delta") {
                    if let Some(reason) = delta.get("stop_reason").filter(|v| v.is_string()) {
                        self.stop_reason = Some(reason.clone());
                    }
                    if let Some(seq) = delta
                        .get("stop_sequence")
                        .filter(|v| v.is_string() || v.is_null())
                    {
                        self.stop_sequence = Some(seq.clone());
                    }
                }
                if let Some(Value::Object(u)) = data.get("usage") {
                    self.usage.extend(u.clone());
                }
            }
            "error" => self.error = error_text(&data).or(Some("error".into())),
            _ => {}
        }
    }

    /// The reassembled message (`None` when the stream never started a message and reported no
    /// error) and the error text, if any.
    pub fn finish(self) -> Option<(Value, Option<String>)> {
        let Some(mut message) = self.message else {
            let error = self.error?;
            let message = serde_json::json!({"type": "message", "role": "assistant",
                "content": [], "stop_reason": "error", "stop_sequence": null});
            return Some((message, Some(error)));
        };
        let content = self
            .blocks
            .into_values()
            .map(|(mut block, json)| {
                let is_tool = matches!(
                    block.get("type").and_then(Value::as_str),
                    Some("tool_use" | "server_tool_use")
                );
                if is_tool {
                    let input = if json.trim().is_empty() {
                        block
                            .get("input")
                            .cloned()
                            .unwrap_or(Value::Object(Map::new()))
                    } else {
                        serde_json::from_str(&json)
                            .unwrap_or_else(|_| serde_json::json!({"__raw_partial_json": json}))
                    };
                    block.insert("input".into(), input);
                }
                Value::Object(block)
            })
            .collect();
        message.insert("content".into(), Value::Array(content));
        message.insert(
            "usage".into(),
            if self.usage.is_empty() {
                Value::Null
            } else {
                Value::Object(self.usage)
            },
        );
        if let Some(reason) = self.stop_reason {
            message.insert("stop_reason".into(), reason);
        }
        if let Some(seq) = self.stop_sequence {
            message.insert("stop_sequence".into(), seq);
        }
        if self.error.is_some() {
            message.insert("stop_reason".into(), Value::String("error".into()));
        }
        Some((Value::Object(message), self.error))
    }
}

/// Feeds an event-stream body through the shared SSE parser into `push`.
pub(crate) fn for_each_sse_event(body: &[u8], mut push: impl FnMut(&str, &str)) {
    let mut parser = SseParser::new(body.len().max(1));
    parser.push(body);
    // A stream cut short may lack the final blank line: end it.
    parser.push(b"\n\n");
    while let Some(item) = parser.decode() {
        if let SseItem::Event(event) = item {
            push(&event.event, &event.data);
        }
    }
}

/// What a response body holds.
pub(crate) enum BodyKind {
    /// Nothing but whitespace.
    Empty,
    /// One JSON value.
    Json(Value),
    /// Server-sent events.
    EventStream,
    /// Anything else.
    Other,
}

/// Sniffs a response body the way the TypeScript runner does: JSON if it parses, else an event
/// stream if it starts like one.
pub(crate) fn body_kind(body: &[u8]) -> BodyKind {
    let text = String::from_utf8_lossy(body);
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return BodyKind::Empty;
    }
    if trimmed.starts_with('{')
        && let Ok(value) = serde_json::from_str::<Value>(trimmed)
    {
        return BodyKind::Json(value);
    }
    if trimmed.starts_with("event:") || trimmed.starts_with("data:") || trimmed.starts_with(':') {
        return BodyKind::EventStream;
    }
    BodyKind::Other
}

/// A response body → the response side (`None` for an empty body).
pub fn response(body: &[u8], status: u16) -> Option<LlmResponse> {
    match body_kind(body) {
        BodyKind::Empty => return None,
        BodyKind::Json(value) => return Some(response_from_message(&value, status)),
        BodyKind::EventStream => {
            let mut stream = MessageStream::default();
            for_each_sse_event(body, |event, data| stream.push(event, data));
            if let Some((message, error)) = stream.finish() {
                let mut response = response_from_message(&message, status);
                response.error = error;
                return Some(response);
            }
        }
        BodyKind::Other => {}
    }
    Some(LlmResponse {
        status: Some(status),
        ..LlmResponse::default()
    })
}
