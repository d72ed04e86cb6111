//! Activity events: the wire shapes of `POST /members/:name/activity`.
//!
//! The TypeScript runner's uploads deserialize into these types (unknown keys are ignored, as the
//! public broker's schema drops them). What we emit is a superset of that shape:
//!
//! - `request.system` keeps the array form Claude Code sends (a list of blocks) instead of
//!   turning it into `null`; [`LlmRequest::context_text`] gives the text either way;
//! - `entry.api` says which API the exchange spoke (`anthropic_messages` or
//!   `openai_responses`; absent in TypeScript uploads);
//! - `response.error` keeps the error text of a failed call;
//! - `entry.truncated` lists the parts cut by a size cap (absent when nothing was cut).

use crate::EpochMs;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

/// Most events one upload may carry.
pub const MAX_UPLOAD_EVENTS: usize = 500;

/// One event of a member's activity stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum ActivityEvent {
    /// The member started working on an objective.
    ObjectiveOpen {
        /// Epoch milliseconds (runner clock).
        ts: EpochMs,
        /// The objective.
        objective_id: String,
    },
    /// The member stopped working on an objective.
    ObjectiveClose {
        /// Epoch milliseconds (runner clock).
        ts: EpochMs,
        /// The objective.
        objective_id: String,
        /// Why it closed.
        result: CloseReason,
    },
    /// One call to a model API, in the Anthropic Messages shape.
    LlmExchange {
        /// Epoch milliseconds when the request was fully sent.
        ts: EpochMs,
        /// Milliseconds from request sent to response complete.
        duration: u64,
        /// The exchange.
        entry: LlmEntry,
    },
    /// Any other HTTP exchange on a traced connection.
    OpaqueHttp {
        /// Epoch milliseconds when the request was fully sent.
        ts: EpochMs,
        /// Milliseconds from request sent to response complete.
        duration: u64,
        /// The exchange.
        entry: OpaqueHttpEntry,
    },
    /// An agent's turn failed (a Codex turn that `turn/completed` reported `failed`).
    TurnFailed {
        /// Epoch milliseconds (runner clock) when the failure was reported.
        ts: EpochMs,
        /// The agent's id of the turn.
        turn_id: String,
        /// Why it failed, as the agent said.
        reason: String,
        /// The messages the turn carried whose senders were told, in push order.
        #[serde(default)]
        msg_ids: Vec<String>,
    },
}

/// The event kinds, as `kind` spells them (for filters).
pub const ACTIVITY_KINDS: [&str; 5] = [
    "objective_open",
    "objective_close",
    "llm_exchange",
    "opaque_http",
    "turn_failed",
];

impl ActivityEvent {
    /// The `kind` on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ObjectiveOpen { .. } => ACTIVITY_KINDS[0],
            Self::ObjectiveClose { .. } => ACTIVITY_KINDS[1],
            Self::LlmExchange { .. } => ACTIVITY_KINDS[2],
            Self::OpaqueHttp { .. } => ACTIVITY_KINDS[3],
            Self::TurnFailed { .. } => ACTIVITY_KINDS[4],
        }
    }

    /// The event's time (epoch milliseconds).
    pub fn ts(&self) -> EpochMs {
        match self {
            Self::ObjectiveOpen { ts, .. }
            | Self::ObjectiveClose { ts, .. }
            | Self::LlmExchange { ts, .. }
            | Self::OpaqueHttp { ts, .. }
            | Self::TurnFailed { ts, .. } => *ts,
        }
    }

    /// Checks what serde does not: objective ids are not empty.
    pub fn validate(&self) -> Result<(), ActivityError> {
        match self {
            Self::ObjectiveOpen { objective_id, .. }
            | Self::ObjectiveClose { objective_id, .. }
                if objective_id.is_empty() =>
            {
                Err(ActivityError::EmptyObjectiveId)
            }
            _ => Ok(()),
        }
    }
}

/// Why an objective marker closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CloseReason {
    /// The objective was completed.
    Done,
    /// The objective was cancelled.
    Cancelled,
    /// The objective went to another member.
    Reassigned,
    /// The runner stopped while the objective was open.
    RunnerShutdown,
}

/// The body of `POST /members/:name/activity`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActivityUpload {
    /// 1 to [`MAX_UPLOAD_EVENTS`] events.
    pub events: Vec<ActivityEvent>,
}

impl ActivityUpload {
    /// Parses and validates an upload body.
    pub fn parse(body: &[u8]) -> Result<Self, ActivityError> {
        let upload: Self =
            serde_json::from_slice(body).map_err(|e| ActivityError::Json(e.to_string()))?;
        if upload.events.is_empty() || upload.events.len() > MAX_UPLOAD_EVENTS {
            return Err(ActivityError::EventCount(upload.events.len()));
        }
        upload.events.iter().try_for_each(ActivityEvent::validate)?;
        Ok(upload)
    }
}

/// What is wrong with an activity upload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ActivityError {
    /// Not JSON, or not the event shape.
    #[error("invalid activity payload: {0}")]
    Json(String),
    /// Too few or too many events.
    #[error("an upload carries 1 to 500 events, not {0}")]
    EventCount(usize),
    /// An objective marker without an id.
    #[error("objectiveId must not be empty")]
    EmptyObjectiveId,
}

/// A stored event as the broker returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivityRow {
    /// The broker's row id.
    pub id: u64,
    /// Whose activity it is.
    pub member_name: String,
    /// The event.
    pub event: ActivityEvent,
    /// Broker clock at append (epoch milliseconds).
    pub created_at: EpochMs,
}

/// `entry.kind` of an LLM exchange (always `anthropic_messages`: the shape, not the API).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LlmEntryKind {
    /// The Anthropic Messages shape.
    #[default]
    AnthropicMessages,
}

/// Which API an exchange spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LlmApi {
    /// Anthropic `POST /v1/messages`.
    AnthropicMessages,
    /// OpenAI `POST /v1/responses` (what Codex speaks), mapped to the Messages shape.
    OpenaiResponses,
}

/// One model call (`AnthropicMessagesEntry`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LlmEntry {
    /// Always `anthropic_messages`.
    pub kind: LlmEntryKind,
    /// Which API was spoken (absent in TypeScript uploads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<LlmApi>,
    /// When the request was fully sent (epoch milliseconds).
    pub started_at: EpochMs,
    /// When the response was complete (epoch milliseconds).
    pub ended_at: EpochMs,
    /// The request.
    pub request: LlmRequest,
    /// The response; `null` when there was none or its body was empty.
    pub response: Option<LlmResponse>,
    /// Parts cut by a size cap or an interrupted connection.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub truncated: Vec<Truncated>,
}

/// A part of an exchange that is not complete in the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Truncated {
    /// The request body exceeded the body cap; what was kept could not be decoded whole.
    RequestBody,
    /// The response body exceeded the body cap.
    ResponseBody,
    /// The connection closed before the response was complete.
    ResponseInterrupted,
    /// A body was content-encoded (compressed) and is not decoded.
    Encoded,
}

/// The request side of an [`LlmEntry`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LlmRequest {
    /// The model asked for.
    pub model: Option<String>,
    /// `max_tokens` (`max_output_tokens` for Responses).
    pub max_tokens: Option<Number>,
    /// The sampling temperature.
    pub temperature: Option<Number>,
    /// The system prompt (`instructions` for Responses), as a string or a list of blocks.
    pub system: Option<SystemPrompt>,
    /// The conversation.
    pub messages: Vec<LlmMessage>,
    /// The tool definitions.
    pub tools: Option<Vec<LlmTool>>,
}

impl LlmRequest {
    /// The system prompt's text plus every text of the request's messages, joined with spaces
    /// (what the broker searches for objective ids).
    pub fn context_text(&self) -> String {
        let mut parts: Vec<&str> = Vec::new();
        match &self.system {
            Some(SystemPrompt::Text(text)) => parts.push(text),
            Some(SystemPrompt::Blocks(blocks)) => {
                parts.extend(blocks.iter().filter_map(Block::text))
            }
            None => {}
        }
        for message in &self.messages {
            parts.extend(message.content.iter().filter_map(Block::text));
        }
        parts.join(" ")
    }
}

/// A system prompt: a string, or the array of blocks the API also accepts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SystemPrompt {
    /// `"system": "…"`.
    Text(String),
    /// `"system": [{"type":"text","text":"…"}, …]`.
    Blocks(Vec<Block>),
}

/// The response side of an [`LlmEntry`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LlmResponse {
    /// Why the model stopped (`end_turn`, `tool_use`, `max_tokens`, …; `error` for a failed call).
    pub stop_reason: Option<String>,
    /// The stop sequence that matched, if any.
    pub stop_sequence: Option<String>,
    /// `[{"role":"assistant","content":[…]}]`, or `[]` without content.
    pub messages: Vec<LlmMessage>,
    /// Token counts.
    pub usage: Option<Usage>,
    /// The HTTP status.
    pub status: Option<u16>,
    /// The error the API reported (`<type>: <message>`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Token counts in the Anthropic sense: `input_tokens` excludes cached input.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Uncached input tokens.
    pub input_tokens: Option<u64>,
    /// Output tokens.
    pub output_tokens: Option<u64>,
    /// Input tokens written to the prompt cache.
    pub cache_creation_input_tokens: Option<u64>,
    /// Input tokens read from the prompt cache.
    pub cache_read_input_tokens: Option<u64>,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmMessage {
    /// `user`, `assistant`, … (`unknown` when the request had none).
    pub role: String,
    /// The content blocks.
    pub content: Vec<Block>,
}

/// One content block. Deserializing an unknown `type` gives [`Block::Unknown`] with the whole
/// object.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call.
    ToolUse {
        /// The call id.
        id: String,
        /// The tool.
        name: String,
        /// The arguments.
        input: Value,
    },
    /// A tool's answer.
    ToolResult {
        /// The call it answers.
        #[serde(rename = "toolUseId")]
        tool_use_id: String,
        /// The result (a string or blocks, verbatim).
        content: Value,
        /// Whether the tool failed.
        #[serde(rename = "isError")]
        is_error: bool,
    },
    /// An image (the data is not kept).
    Image {
        /// Its media type.
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
    },
    /// Model reasoning.
    Thinking {
        /// The reasoning text.
        text: String,
    },
    /// Anything else, kept whole.
    Unknown {
        /// The block as it arrived.
        raw: Value,
    },
}

impl Block {
    /// The block's text, for text and thinking blocks.
    pub fn text(&self) -> Option<&str> {
        match self {
            Self::Text { text } | Self::Thinking { text } => Some(text),
            _ => None,
        }
    }
}

/// The known block shapes, for deserializing.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum KnownBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        #[serde(default)]
        id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        input: Value,
    },
    ToolResult {
        #[serde(rename = "toolUseId", default)]
        tool_use_id: String,
        #[serde(default)]
        content: Value,
        #[serde(rename = "isError", default)]
        is_error: bool,
    },
    Image {
        #[serde(rename = "mediaType", default)]
        media_type: Option<String>,
    },
    Thinking {
        #[serde(default)]
        text: String,
    },
    Unknown {
        #[serde(default)]
        raw: Value,
    },
}

impl<'de> Deserialize<'de> for Block {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Ok(match KnownBlock::deserialize(&value) {
            Ok(KnownBlock::Text { text }) => Self::Text { text },
            Ok(KnownBlock::ToolUse { id, name, input }) => Self::ToolUse { id, name, input },
            Ok(KnownBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
            }) => Self::ToolResult {
                tool_use_id,
                content,
                is_error,
            },
            Ok(KnownBlock::Image { media_type }) => Self::Image { media_type },
            Ok(KnownBlock::Thinking { text }) => Self::Thinking { text },
            Ok(KnownBlock::Unknown { raw }) => Self::Unknown { raw },
            Err(_) => Self::Unknown { raw: value },
        })
    }
}

/// A tool definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LlmTool {
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// Its description.
    #[serde(default)]
    pub description: Option<String>,
    /// Its input JSON Schema (verbatim).
    #[serde(default)]
    pub input_schema: Value,
}

/// `entry.kind` of an opaque exchange.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpaqueEntryKind {
    /// Always `opaque_http`.
    #[default]
    OpaqueHttp,
}

/// Any other HTTP exchange: headers and short previews, redacted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpaqueHttpEntry {
    /// Always `opaque_http`.
    pub kind: OpaqueEntryKind,
    /// When the request was fully sent.
    pub started_at: EpochMs,
    /// When the response was complete.
    pub ended_at: EpochMs,
    /// The host (from `Host`, else the CONNECT host).
    pub host: String,
    /// The request method.
    pub method: String,
    /// The request target as sent (query secrets redacted).
    pub url: String,
    /// The response status, if a response came.
    pub status: Option<u16>,
    /// Request headers, lower-case names, repeats joined with `, `, credentials redacted.
    pub request_headers: BTreeMap<String, String>,
    /// Response headers, the same way.
    pub response_headers: BTreeMap<String, String>,
    /// The start of the request body, redacted, `…[truncated]` when cut.
    pub request_body_preview: Option<String>,
    /// The start of the response body, the same way.
    pub response_body_preview: Option<String>,
    /// Parts cut by a size cap or an interrupted connection.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub truncated: Vec<Truncated>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A failed agent turn: its wire shape, read back as written.
    #[test]
    fn turn_failed_round_trips() {
        let body = json!({"events": [{"kind": "turn_failed", "ts": 5, "turnId": "t1",
            "reason": "unexpected status 500", "msgIds": ["m1", "m2"]}]});
        let upload = ActivityUpload::parse(body.to_string().as_bytes()).expect("valid upload");
        assert_eq!(
            upload.events,
            vec![ActivityEvent::TurnFailed {
                ts: 5,
                turn_id: "t1".into(),
                reason: "unexpected status 500".into(),
                msg_ids: vec!["m1".into(), "m2".into()],
            }]
        );
        assert_eq!(upload.events[0].kind(), "turn_failed");
        assert_eq!(serde_json::to_value(&upload).expect("serializes"), body);
    }

    /// What the TypeScript runner uploads deserializes and keeps its
    /// shape when written back.
    #[test]
    fn typescript_upload_shape_round_trips() {
        let body = json!({"events": [
            {"kind": "objective_open", "ts": 1, "objectiveId": "obj-1"},
            {"kind": "objective_close", "ts": 2, "objectiveId": "obj-1", "result": "reassigned"},
            {"kind": "llm_exchange", "ts": 3, "duration": 40, "entry": {
                "kind": "anthropic_messages", "startedAt": 3, "endedAt": 43,
                "request": {"model": "claude-x", "maxTokens": 1024, "temperature": null,
                    "system": "be brief",
                    "messages": [{"role": "user", "content": [
                        {"type": "text", "text": "hi"},
                        {"type": "tool_result", "toolUseId": "t1", "content": "ok", "isError": false},
                        {"type": "image", "mediaType": "image/png"},
                        {"type": "unknown", "raw": {"type": "document"}}]}],
                    "tools": [{"name": "t", "description": null, "inputSchema": {"type": "object"}}]},
                "response": {"stopReason": "tool_use", "stopSequence": null,
                    "messages": [{"role": "assistant", "content": [
                        {"type": "thinking", "text": "hmm"},
                        {"type": "tool_use", "id": "t2", "name": "t", "input": {"a": 1}}]}],
                    "usage": {"inputTokens": 5, "outputTokens": 6,
                        "cacheCreationInputTokens": null, "cacheReadInputTokens": 7},
                    "status": 200}}},
            {"kind": "opaque_http", "ts": 4, "duration": 0, "entry": {
                "kind": "opaque_http", "startedAt": 4, "endedAt": 4, "host": "api.anthropic.com",
                "method": "GET", "url": "/v1/models", "status": null,
                "requestHeaders": {"x-api-key": "[REDACTED]"}, "responseHeaders": {},
                "requestBodyPreview": null, "responseBodyPreview": null, "extra": 1}}
        ]});
        let upload = ActivityUpload::parse(body.to_string().as_bytes()).expect("valid upload");
        assert_eq!(upload.events.len(), 4);
        let mut back = serde_json::to_value(&upload).expect("serializes");
        // The unknown key is dropped; everything else is as uploaded.
        let mut expected = body.clone();
        crate::codec::json::remove_keeping_order(
            expected["events"][3]["entry"]
                .as_object_mut()
                .expect("object"),
            "extra",
        );
        assert_eq!(back, expected);
        assert_eq!(
            upload
                .events
                .iter()
                .map(ActivityEvent::kind)
                .collect::<Vec<_>>(),
            ACTIVITY_KINDS[..4],
            "the TypeScript runner's kinds"
        );
        back["events"][0]["objectiveId"] = json!("");
        assert_eq!(
            ActivityUpload::parse(back.to_string().as_bytes()),
            Err(ActivityError::EmptyObjectiveId)
        );
        assert_eq!(
            ActivityUpload::parse(br#"{"events":[]}"#),
            Err(ActivityError::EventCount(0))
        );
        assert!(matches!(
            ActivityUpload::parse(br#"{"events":[{"kind":"objective_close","ts":1,"objectiveId":"o","result":"later"}]}"#),
            Err(ActivityError::Json(_))
        ));
    }

    #[test]
    fn unknown_block_types_are_kept_whole() {
        let block: Block =
            serde_json::from_value(json!({"type": "redacted_thinking", "data": "x"}))
                .expect("any object is a block");
        assert_eq!(
            block,
            Block::Unknown {
                raw: json!({"type": "redacted_thinking", "data": "x"})
            }
        );
    }

    #[test]
    fn context_text_reads_both_system_forms() {
        let mut request = LlmRequest {
            system: Some(SystemPrompt::Blocks(vec![
                Block::Text {
                    text: "brief obj-1".into(),
                },
                Block::Unknown { raw: Value::Null },
            ])),
            messages: vec![LlmMessage {
                role: "user".into(),
                content: vec![Block::Text { text: "go".into() }],
            }],
            ..LlmRequest::default()
        };
        assert_eq!(request.context_text(), "brief obj-1 go");
        request.system = Some(SystemPrompt::Text("s".into()));
        assert_eq!(request.context_text(), "s go");
    }
}
