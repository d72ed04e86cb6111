//! A local stand-in for the Anthropic Messages API, for tests running the real Claude Code:
//! `POST /v1/messages` answers a streamed SSE message (`message_start`, `content_block_start`,
//! `content_block_delta`, `content_block_stop`, `message_delta`, `message_stop`) whose text is
//! `hello from the stand-in` (usage: 5 input, 5 output tokens, stop reason `end_turn`), or a 400
//! error when the last text the user sent contains `please fail`.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// What the stand-in saw: per `/v1/messages` request with tools (a turn of the agent), the
/// number of messages in the conversation it carried.
pub type Seen = Arc<Mutex<Vec<usize>>>;

pub fn sse(model: &str) -> String {
    let events = [
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_standin", "type": "message",
                "role": "assistant", "model": model, "content": [], "stop_reason": null,
                "stop_sequence": null, "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "hello from the stand-in"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn",
                "stop_sequence": null}, "usage": {"output_tokens": 5}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect()
}

pub async fn messages(seen: Seen, body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or_default();
    // The text the user sent last (claude merges a failed turn's prompt with the next one).
    let content = request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .map(|m| m["content"].clone())
        .unwrap_or_default();
    let last = match &content {
        Value::Array(blocks) => blocks
            .iter()
            .rev()
            .find_map(|b| b["text"].as_str())
            .unwrap_or_default()
            .to_owned(),
        other => other.as_str().unwrap_or_default().to_owned(),
    };
    if request["tools"].as_array().is_some_and(|t| !t.is_empty()) {
        seen.lock()
            .unwrap()
            .push(request["messages"].as_array().map_or(0, Vec::len));
    }
    if last.contains("please fail") {
        let error = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "the stand-in refuses this prompt"}});
        return (StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    }
    let model = request["model"].as_str().unwrap_or("claude-stand-in");
    if request["stream"] == true {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
        (headers, sse(model)).into_response()
    } else {
        axum::Json(
            json!({"id": "msg_standin", "type": "message", "role": "assistant",
            "model": model, "content": [{"type": "text", "text": "hello from the stand-in"}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 5, "output_tokens": 5}}),
        )
        .into_response()
    }
}

/// The stand-in's routes: `POST /v1/messages` ([`messages`]), `/` (200, claude's connectivity
/// probe), anything else a 404 in the API's error shape.
pub fn router(seen: Seen) -> axum::Router {
    axum::Router::new()
        .route(
            "/v1/messages",
            axum::routing::post(move |body: Bytes| messages(seen.clone(), body)),
        )
        .route("/", axum::routing::any(|| async { StatusCode::OK }))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                axum::Json(json!({"type": "error", "error": {"type": "not_found_error",
                    "message": "not served by the stand-in"}})),
            )
        })
}
