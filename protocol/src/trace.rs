//! Activity and traces, the protocol core: what the runner's trace host turns decrypted model API
//! traffic into, and what the broker stores.
//!
//! - [`activity`]: the event types (`objective_open`, `objective_close` with `done`,
//!   `cancelled`, `reassigned` or `runner_shutdown`, `llm_exchange`, `opaque_http`) in the
//!   wire shape of `POST /members/:name/activity`;
//! - [`http`]: the HTTP/1.1 exchange assembler fed the bytes of each proxied connection;
//! - [`anthropic`], [`openai`]: request and response bodies of the Messages and Responses APIs
//!   → one `llm_exchange` in the Anthropic Messages shape;
//! - [`redact`]: credential scrubbing and capped previews.
//!
//! [`Tracer`] puts them together in one machine: feed it connection bytes, drain
//! [`TraceOutput`]s (one [`ActivityEvent`] per finished exchange, redacted). A host that wants
//! decoding off its relay path drives the [`HttpAssembler`] itself and calls [`exchange_event`]
//! elsewhere (the runner's proxy does, on its own thread); the result is the same. Feed client bytes
//! before they are forwarded upstream (with `rewrite_accept_encoding` the forwarded bytes come
//! out of the tracer anyway), so a response is never seen before its request. Every exchange is
//! classified: `POST` to `/v1/messages` on an `anthropic.com` host is an
//! Anthropic exchange; `POST` to a path ending in `/responses` on an `openai.com`,
//! `openai.azure.com` or `chatgpt.com` host is a Responses exchange; everything else is
//! `opaque_http` with redacted headers and body previews of at most `preview_chars`
//! characters (`…[truncated]` appended when cut).

pub mod activity;
pub mod anthropic;
pub mod busy;
pub mod http;
pub mod markers;
pub mod openai;
pub mod redact;
pub mod reminder;
pub mod uploader;

use crate::EpochMs;
use std::collections::BTreeMap;

use serde_json::Value;

use activity::{
    ActivityEvent, LlmApi, LlmEntry, LlmEntryKind, LlmRequest, LlmResponse, OpaqueEntryKind,
    OpaqueHttpEntry, Truncated,
};
use http::{Body, Exchange, HttpAssembler, HttpConfig, HttpOutput, ProxyConnId};
use redact::{preview, redact_header, redact_json};

/// The trace host's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceConfig {
    /// The assembler's caps and options.
    pub http: HttpConfig,
    /// Longest opaque body preview, header value and URL recorded, in characters. Default 4096.
    pub preview_chars: usize,
}

impl Default for TraceConfig {
    fn default() -> Self {
        Self {
            http: HttpConfig::default(),
            preview_chars: 4096,
        }
    }
}

/// Something for the trace host.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TraceOutput {
    /// Bytes to write to the server (only with `rewrite_accept_encoding`).
    Transmit {
        /// The connection.
        to: ProxyConnId,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// A request was fully sent (the member is busy until its event comes out).
    RequestSent {
        /// The connection.
        conn: ProxyConnId,
    },
    /// A finished exchange as an activity event, redacted.
    Event {
        /// The connection.
        conn: ProxyConnId,
        /// The event.
        event: Box<ActivityEvent>,
    },
    /// The connection is relayed but no longer traced.
    Untraced {
        /// The connection.
        conn: ProxyConnId,
        /// Why, for the log.
        reason: String,
    },
}

/// The trace host's machine: [`HttpAssembler`] plus classification, decoding and redaction.
///
/// Contract: every input takes `now` (epoch ms) last — `handle_open`, `handle_client_bytes`,
/// `handle_server_bytes`, `handle_server_eof`, `handle_closed`. Outputs are drained from
/// [`poll_output`](Self::poll_output): [`TraceOutput::Transmit`] `{ to, bytes }` (only when
/// rewriting `accept-encoding`), `RequestSent`, `Event`s and `Untraced`.
#[derive(Debug, Default)]
pub struct Tracer {
    http: HttpAssembler,
    preview_chars: usize,
}

impl Tracer {
    /// A tracer with these settings.
    pub fn new(config: TraceConfig) -> Self {
        Self {
            http: HttpAssembler::new(config.http),
            preview_chars: config.preview_chars,
        }
    }

    /// A decrypted connection to `host` begins.
    pub fn handle_open(&mut self, conn: ProxyConnId, host: &str, now: EpochMs) {
        self.http.handle_open(conn, host, now);
    }

    /// Bytes from the client (`now`: epoch milliseconds).
    pub fn handle_client_bytes(&mut self, conn: ProxyConnId, bytes: &[u8], now: EpochMs) {
        self.http.handle_client_bytes(conn, bytes, now);
    }

    /// Bytes from the server.
    pub fn handle_server_bytes(&mut self, conn: ProxyConnId, bytes: &[u8], now: EpochMs) {
        self.http.handle_server_bytes(conn, bytes, now);
    }

    /// The server will send nothing more.
    pub fn handle_server_eof(&mut self, conn: ProxyConnId, now: EpochMs) {
        self.http.handle_server_eof(conn, now);
    }

    /// The connection is gone.
    pub fn handle_closed(&mut self, conn: ProxyConnId, now: EpochMs) {
        self.http.handle_closed(conn, now);
    }

    /// The next output.
    pub fn poll_output(&mut self) -> Option<TraceOutput> {
        Some(match self.http.poll_output()? {
            HttpOutput::Transmit { to, bytes } => TraceOutput::Transmit { to, bytes },
            HttpOutput::RequestSent { conn } => TraceOutput::RequestSent { conn },
            HttpOutput::Untraced { conn, reason } => TraceOutput::Untraced { conn, reason },
            HttpOutput::Exchange(exchange) => TraceOutput::Event {
                conn: exchange.conn,
                event: Box::new(exchange_event(&exchange, self.preview_chars)),
            },
        })
    }

    /// The assembler (for its counters).
    pub fn assembler(&self) -> &HttpAssembler {
        &self.http
    }
}

/// The path of a request target (origin or absolute form), without the query.
fn path_of(target: &str) -> &str {
    let without_scheme = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("https://"));
    let path = match without_scheme {
        Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    };
    path.split(['?', '#']).next().unwrap_or(path)
}

fn host_is(host: &str, domain: &str) -> bool {
    host == domain
        || host
            .strip_suffix(domain)
            .is_some_and(|rest| rest.ends_with('.'))
}

/// Which model API an exchange speaks, if any.
pub fn llm_api(method: &str, host: &str, target: &str) -> Option<LlmApi> {
    if !method.eq_ignore_ascii_case("POST") {
        return None;
    }
    let host = host.to_ascii_lowercase();
    let path = path_of(target);
    if host_is(&host, "anthropic.com") && path == "/v1/messages" {
        return Some(LlmApi::AnthropicMessages);
    }
    let openai = ["openai.com", "openai.azure.com", "chatgpt.com"]
        .iter()
        .any(|d| host_is(&host, d));
    (openai && path.ends_with("/responses")).then_some(LlmApi::OpenaiResponses)
}

/// Which model API an exchange with a model endpoint the agent is configured with (a gateway
/// speaking `api`, under any path prefix) speaks: `POST …/v1/messages` is the Anthropic
/// Messages API, `POST …/responses` the OpenAI Responses API; other requests, none.
pub fn endpoint_api(method: &str, target: &str, api: LlmApi) -> Option<LlmApi> {
    if !method.eq_ignore_ascii_case("POST") {
        return None;
    }
    let path = path_of(target);
    let speaks = match api {
        LlmApi::AnthropicMessages => path.ends_with("/v1/messages"),
        LlmApi::OpenaiResponses => path.ends_with("/responses"),
    };
    speaks.then_some(api)
}

/// One finished exchange → its activity event (redacted, capped).
pub fn exchange_event(exchange: &Exchange, preview_chars: usize) -> ActivityEvent {
    exchange_event_at(exchange, preview_chars, None)
}

/// [`exchange_event`] for an exchange with a model endpoint the agent is configured with, which
/// speaks `endpoint` ([`endpoint_api`]) whatever its host is called.
pub fn exchange_event_at(
    exchange: &Exchange,
    preview_chars: usize,
    endpoint: Option<LlmApi>,
) -> ActivityEvent {
    let ts = exchange.started_at;
    // A wall clock set back mid-exchange reads as no time at all.
    let duration =
        u64::try_from(exchange.ended_at.saturating_sub(exchange.started_at)).unwrap_or(0);
    let host = exchange.host();
    let request = &exchange.request;
    let api = llm_api(&request.method, &host, &request.target)
        .or_else(|| endpoint.and_then(|api| endpoint_api(&request.method, &request.target, api)));
    match api {
        Some(api) => ActivityEvent::LlmExchange {
            ts,
            duration,
            entry: llm_entry(exchange, api),
        },
        None => ActivityEvent::OpaqueHttp {
            ts,
            duration,
            entry: opaque_entry(exchange, &host, preview_chars),
        },
    }
}

fn llm_entry(exchange: &Exchange, api: LlmApi) -> LlmEntry {
    let mut truncated = Vec::new();
    let body = &exchange.request.body;
    if body.truncated {
        truncated.push(Truncated::RequestBody);
    }
    if body.encoding.is_some() {
        truncated.push(Truncated::Encoded);
    }
    let request = match (body.encoding.is_none())
        .then(|| serde_json::from_slice::<Value>(&body.bytes).ok())
        .flatten()
    {
        Some(json) => match api {
            LlmApi::AnthropicMessages => anthropic::request(&json),
            LlmApi::OpenaiResponses => openai::request(&json),
        },
        None => LlmRequest::default(),
    };
    let response = exchange.response.as_ref().and_then(|r| {
        if r.body.truncated {
            truncated.push(Truncated::ResponseBody);
        }
        if !r.complete {
            truncated.push(Truncated::ResponseInterrupted);
        }
        if r.body.encoding.is_some() {
            truncated.push(Truncated::Encoded);
            return Some(LlmResponse {
                status: Some(r.status),
                ..LlmResponse::default()
            });
        }
        match api {
            LlmApi::AnthropicMessages => anthropic::response(&r.body.bytes, r.status),
            LlmApi::OpenaiResponses => openai::response(&r.body.bytes, r.status),
        }
    });
    truncated.sort_unstable();
    truncated.dedup();
    LlmEntry {
        kind: LlmEntryKind::AnthropicMessages,
        api: Some(api),
        started_at: exchange.started_at,
        ended_at: exchange.ended_at,
        request,
        response,
        truncated,
    }
}

fn headers_map(headers: &http::Headers, preview_chars: usize) -> BTreeMap<String, String> {
    let mut map: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        let value = preview(&redact_header(&name, value), preview_chars);
        map.entry(name)
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert(value);
    }
    map
}

fn body_preview(body: &Body, preview_chars: usize) -> Option<String> {
    if body.len == 0 {
        return None;
    }
    if let Some(encoding) = &body.encoding {
        return Some(format!("[{} bytes, content-encoding {encoding}]", body.len));
    }
    let Ok(text) = std::str::from_utf8(&body.bytes) else {
        return Some(format!("[{} bytes of binary data]", body.len));
    };
    let trimmed = text.trim_start();
    if (trimmed.starts_with('{') || trimmed.starts_with('['))
        && let Ok(mut json) = serde_json::from_str::<Value>(trimmed)
    {
        redact_json(&mut json);
        return Some(preview(&json.to_string(), preview_chars));
    }
    let mut out = preview(text, preview_chars);
    if body.truncated && !out.ends_with(redact::TRUNCATED_MARK) {
        out.push_str(redact::TRUNCATED_MARK);
    }
    Some(out)
}

fn opaque_entry(exchange: &Exchange, host: &str, preview_chars: usize) -> OpaqueHttpEntry {
    let request = &exchange.request;
    let response = exchange.response.as_ref();
    let mut truncated = Vec::new();
    if request.body.truncated {
        truncated.push(Truncated::RequestBody);
    }
    if let Some(r) = response {
        if r.body.truncated {
            truncated.push(Truncated::ResponseBody);
        }
        if !r.complete {
            truncated.push(Truncated::ResponseInterrupted);
        }
    }
    OpaqueHttpEntry {
        kind: OpaqueEntryKind::OpaqueHttp,
        started_at: exchange.started_at,
        ended_at: exchange.ended_at,
        host: preview(host, preview_chars),
        method: preview(&request.method, preview_chars),
        url: preview(&request.target, preview_chars),
        status: response.map(|r| r.status),
        request_headers: headers_map(&request.headers, preview_chars),
        response_headers: response
            .map(|r| headers_map(&r.headers, preview_chars))
            .unwrap_or_default(),
        request_body_preview: body_preview(&request.body, preview_chars),
        response_body_preview: response.and_then(|r| body_preview(&r.body, preview_chars)),
        truncated,
    }
}

#[cfg(test)]
mod tests;
