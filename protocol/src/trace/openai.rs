//! The OpenAI Responses API (`POST …/responses`, what Codex speaks) mapped onto the Anthropic
//! Messages shape of an `llm_exchange` (`entry.api` is `openai_responses`).
//!
//! Request:
//!
//! | Responses | llm_exchange |
//! |---|---|
//! | `model`, `temperature` | `model`, `temperature` |
//! | `max_output_tokens` | `maxTokens` |
//! | `instructions` (string) | `system` (string) |
//! | `input` string | one `user` message with one text block |
//! | `input[]` `message` items (`role`, `content` string or `input_text`/`output_text`/`refusal` parts, `input_image`) | a message with that role (`user`, `assistant`, `developer`, `system`) with text / image blocks |
//! | `function_call` / `custom_tool_call` / `local_shell_call` (`call_id`, `name`, `arguments` JSON text or `input`) | an `assistant` `tool_use` block (`id` = `call_id`, `input` = the parsed arguments, or the text when not JSON) |
//! | `function_call_output` / `custom_tool_call_output` / `local_shell_call_output` (`call_id`, `output`) | a `user` `tool_result` block (`isError` false) |
//! | `reasoning` (`summary[].text`) | an `assistant` `thinking` block (encrypted content is not kept) |
//! | any other item | an `unknown` block with the whole item, in an `assistant` message |
//! | `tools[]` (`name` or else `type`, `description`, `parameters` or else `format`) | `tools` (`inputSchema`) |
//!
//! Consecutive items with the same role share one message, as in the Messages API.
//!
//! Response (JSON, or the event stream: `response.created`, `response.output_item.added`,
//! `response.output_text.delta`, `response.function_call_arguments.delta`,
//! `response.reasoning_summary_text.delta`, `response.output_item.done`, `response.completed`
//! / `response.incomplete` / `response.failed`, `error`): the output items become one
//! `assistant` message mapped as above. `stopReason`: `tool_use` when the output has a tool
//! call, else `end_turn` for `completed`; `max_tokens` for `incomplete` because of
//! `max_output_tokens`, else the incomplete reason; `error` for `failed` or an `error` event
//! (with `response.error`). Usage: `inputTokens` = `input_tokens` − `cached_tokens` (Anthropic
//! counts cached input apart), `cacheReadInputTokens` = `input_tokens_details.cached_tokens`,
//! `outputTokens` = `output_tokens` (reasoning included), `cacheCreationInputTokens` is `null`
//! (the API does not report it).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::activity::{Block, LlmMessage, LlmRequest, LlmResponse, LlmTool, SystemPrompt, Usage};
use super::anthropic::{BodyKind, append_str, body_kind, for_each_sse_event};
use super::redact::{redact_json, redact_text};

fn string(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn number(v: &Value, key: &str) -> Option<serde_json::Number> {
    match v.get(key) {
        Some(Value::Number(n)) => Some(n.clone()),
        _ => None,
    }
}

fn arguments(text: Option<&Value>) -> Value {
    match text {
        Some(Value::String(s)) => {
            serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
        }
        Some(other) => other.clone(),
        None => Value::Null,
    }
}

/// One content part of a message item.
fn part(v: &Value) -> Block {
    match v.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text") => Block::Text {
            text: string(v, "text").unwrap_or_default(),
        },
        Some("refusal") => Block::Text {
            text: string(v, "refusal").unwrap_or_default(),
        },
        Some("input_image") => Block::Image { media_type: None },
        _ => Block::Unknown { raw: v.clone() },
    }
}

/// One input or output item → `(role, blocks)`.
fn item(v: &Value) -> (String, Vec<Block>) {
    let kind = v.get("type").and_then(Value::as_str);
    let call_id = || {
        string(v, "call_id")
            .or_else(|| string(v, "id"))
            .unwrap_or_default()
    };
    match kind {
        Some("message") | None if v.get("role").is_some() => {
            let role = string(v, "role").unwrap_or_else(|| "unknown".into());
            let blocks = match v.get("content") {
                Some(Value::String(text)) => vec![Block::Text { text: text.clone() }],
                Some(Value::Array(parts)) => parts.iter().map(part).collect(),
                _ => Vec::new(),
            };
            (role, blocks)
        }
        Some("function_call" | "custom_tool_call" | "local_shell_call") => (
            "assistant".into(),
            vec![Block::ToolUse {
                id: call_id(),
                name: string(v, "name").unwrap_or_else(|| kind.unwrap_or_default().to_owned()),
                input: if v.get("arguments").is_some() {
                    arguments(v.get("arguments"))
                } else {
                    v.get("input")
                        .or_else(|| v.get("action"))
                        .cloned()
                        .unwrap_or(Value::Null)
                },
            }],
        ),
        Some("function_call_output" | "custom_tool_call_output" | "local_shell_call_output") => (
            "user".into(),
            vec![Block::ToolResult {
                tool_use_id: call_id(),
                content: v.get("output").cloned().unwrap_or(Value::Null),
                is_error: false,
            }],
        ),
        Some("reasoning") => {
            let text = v
                .get("summary")
                .and_then(Value::as_array)
                .map(|parts| {
                    parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .unwrap_or_default();
            ("assistant".into(), vec![Block::Thinking { text }])
        }
        _ => ("assistant".into(), vec![Block::Unknown { raw: v.clone() }]),
    }
}

/// Items → messages, consecutive items of one role merged.
fn messages(items: &[Value]) -> Vec<LlmMessage> {
    let mut out: Vec<LlmMessage> = Vec::new();
    for v in items.iter().filter(|v| v.is_object()) {
        let (role, blocks) = item(v);
        match out.last_mut() {
            Some(last) if last.role == role => last.content.extend(blocks),
            _ => out.push(LlmMessage {
                role,
                content: blocks,
            }),
        }
    }
    out
}

/// A request body (already parsed as JSON) → the request side of an exchange.
pub fn request(body: &Value) -> LlmRequest {
    let mut body = body.clone();
    redact_json(&mut body);
    let messages = match body.get("input") {
        Some(Value::String(text)) => vec![LlmMessage {
            role: "user".into(),
            content: vec![Block::Text { text: text.clone() }],
        }],
        Some(Value::Array(items)) => messages(items),
        _ => Vec::new(),
    };
    let tools = body.get("tools").and_then(Value::as_array).map(|tools| {
        tools
            .iter()
            .map(|t| LlmTool {
                name: string(t, "name")
                    .or_else(|| string(t, "type"))
                    .unwrap_or_default(),
                description: string(t, "description"),
                input_schema: t
                    .get("parameters")
                    .or_else(|| t.get("format"))
                    .cloned()
                    .unwrap_or(Value::Null),
            })
            .collect()
    });
    LlmRequest {
        model: string(&body, "model"),
        max_tokens: number(&body, "max_output_tokens"),
        temperature: number(&body, "temperature"),
        system: string(&body, "instructions").map(SystemPrompt::Text),
        messages,
        tools,
    }
}

/// A Responses `usage` object in the Anthropic sense (see the module docs).
pub fn usage(v: Option<&Value>) -> Option<Usage> {
    let v = v?;
    let input = v.get("input_tokens").and_then(Value::as_u64);
    let cached = v
        .get("input_tokens_details")
        .and_then(|d| d.get("cached_tokens"))
        .and_then(Value::as_u64);
    let usage = Usage {
        input_tokens: input.map(|i| i.saturating_sub(cached.unwrap_or(0))),
        output_tokens: v.get("output_tokens").and_then(Value::as_u64),
        cache_creation_input_tokens: None,
        cache_read_input_tokens: cached,
    };
    (usage != Usage::default()).then_some(usage)
}

fn error_of(v: &Value) -> Option<String> {
    let e = v.get("error").filter(|e| !e.is_null())?;
    let code = e
        .get("code")
        .or_else(|| e.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("error");
    let text = match e.get("message").and_then(Value::as_str) {
        Some(m) => format!("{code}: {m}"),
        None => code.to_owned(),
    };
    Some(redact_text(&text).into_owned())
}

/// A response object (`{"object":"response", "status", "output", "usage", …}`) → the response
/// side.
pub fn response_from_object(response: &Value, status: u16) -> LlmResponse {
    let mut response = response.clone();
    redact_json(&mut response);
    let items = response
        .get("output")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut content = Vec::new();
    for v in items.iter().filter(|v| v.is_object()) {
        content.extend(item(v).1);
    }
    let has_tool_call = content.iter().any(|b| matches!(b, Block::ToolUse { .. }));
    let error = error_of(&response);
    let stop_reason = match response.get("status").and_then(Value::as_str) {
        _ if error.is_some() => Some("error".to_owned()),
        Some("failed") => Some("error".to_owned()),
        Some("incomplete") => Some(
            match response
                .get("incomplete_details")
                .and_then(|d| d.get("reason"))
                .and_then(Value::as_str)
            {
                Some("max_output_tokens") | None => "max_tokens".to_owned(),
                Some(other) => other.to_owned(),
            },
        ),
        Some("completed") if has_tool_call => Some("tool_use".to_owned()),
        Some("completed") => Some("end_turn".to_owned()),
        Some(other) => Some(other.to_owned()),
        None => None,
    };
    LlmResponse {
        stop_reason,
        stop_sequence: None,
        messages: if content.is_empty() {
            Vec::new()
        } else {
            vec![LlmMessage {
                role: "assistant".into(),
                content,
            }]
        },
        usage: usage(response.get("usage")),
        status: Some(status),
        error,
    }
}

/// Most content or summary parts a streamed item may grow to (indices beyond are ignored).
const MAX_PARTS: u64 = 256;

/// The object at `item[key][index]`, creating parts of type `kind` up to it; `None` when the
/// item or the part is not an object or the index is out of bounds.
fn nth_part<'a>(
    item: &'a mut Value,
    key: &str,
    index: u64,
    kind: &str,
) -> Option<&'a mut serde_json::Map<String, Value>> {
    if index >= MAX_PARTS {
        return None;
    }
    let parts = item
        .as_object_mut()?
        .entry(key)
        .or_insert_with(|| json!([]));
    let parts = parts.as_array_mut()?;
    while parts.len() as u64 <= index {
        parts.push(json!({"type": kind, "text": ""}));
    }
    parts[index as usize].as_object_mut()
}

/// Reassembles a Responses event stream into one response object.
#[derive(Debug, Default)]
pub struct ResponseStream {
    response: Option<Value>,
    items: BTreeMap<u64, Value>,
    finished: bool,
    error: Option<Value>,
}

impl ResponseStream {
    /// Takes one event's data (its `type` field names it, else `event`).
    pub fn push(&mut self, event: &str, data: &str) {
        let Ok(data) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let kind = data.get("type").and_then(Value::as_str).unwrap_or(event);
        let index = data.get("output_index").and_then(Value::as_u64);
        let append = |items: &mut BTreeMap<u64, Value>,
                      index: Option<u64>,
                      f: &dyn Fn(&mut Value, &str)| {
            if let (Some(index), Some(delta)) = (index, data.get("delta").and_then(Value::as_str))
                && let Some(item) = items.get_mut(&index)
            {
                f(item, delta);
            }
        };
        match kind {
            "response.created" | "response.in_progress" if !self.finished => {
                self.response = data.get("response").cloned();
            }
            "response.output_item.added" | "response.output_item.done" => {
                if let (Some(index), Some(item)) = (index, data.get("item")) {
                    self.items.insert(index, item.clone());
                }
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                let content_index = data
                    .get("content_index")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                append(&mut self.items, index, &|item, delta| {
                    let Some(part) = nth_part(item, "content", content_index, "output_text") else {
                        return;
                    };
                    let key = if part.get("type").and_then(Value::as_str) == Some("refusal") {
                        "refusal"
                    } else {
                        "text"
                    };
                    append_str(part, key, delta);
                });
            }
            "response.function_call_arguments.delta" | "response.custom_tool_call_input.delta" => {
                let key = if kind.starts_with("response.function") {
                    "arguments"
                } else {
                    "input"
                };
                append(&mut self.items, index, &|item, delta| {
                    if let Some(item) = item.as_object_mut() {
                        append_str(item, key, delta);
                    }
                });
            }
            "response.reasoning_summary_text.delta" => {
                let summary_index = data
                    .get("summary_index")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                append(&mut self.items, index, &|item, delta| {
                    if let Some(part) = nth_part(item, "summary", summary_index, "summary_text") {
                        append_str(part, "text", delta);
                    }
                });
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                self.finished = true;
                self.response = data.get("response").cloned();
            }
            "error" => self.error = Some(data.get("error").unwrap_or(&data).clone()),
            _ => {}
        }
    }

    /// The reassembled response object, `None` when the stream had neither a response nor an
    /// error.
    pub fn finish(self) -> Option<Value> {
        if self.response.is_none() && self.error.is_none() && self.items.is_empty() {
            return None;
        }
        let mut response = self.response.unwrap_or_else(|| json!({}));
        if !response.is_object() {
            response = json!({});
        }
        let final_output = response
            .get("output")
            .and_then(Value::as_array)
            .is_some_and(|o| !o.is_empty());
        if !final_output {
            response["output"] = Value::Array(self.items.into_values().collect());
        }
        if let Some(error) = self.error {
            response["error"] = error;
            response["status"] = json!("failed");
        }
        Some(response)
    }
}

/// A response body → the response side (`None` for an empty body).
pub fn response(body: &[u8], status: u16) -> Option<LlmResponse> {
    match body_kind(body) {
        BodyKind::Empty => return None,
        // An error body is `{"error": {…}}`.
        BodyKind::Json(value) => return Some(response_from_object(&value, status)),
        BodyKind::EventStream => {
            let mut stream = ResponseStream::default();
            for_each_sse_event(body, |event, data| stream.push(event, data));
            if let Some(object) = stream.finish() {
                return Some(response_from_object(&object, status));
            }
        }
        BodyKind::Other => {}
    }
    Some(LlmResponse {
        status: Some(status),
        ..LlmResponse::default()
    })
}
