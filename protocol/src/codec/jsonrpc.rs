//! The small JSON-RPC 2.0 layer MCP rides on.
//!
//! Parsing ([`parse_message`]) classifies one line as a request, a notification or a response,
//! or says why it is not one ([`Invalid`]: the caller answers `-32700` or `-32600`). Ids, params
//! and results stay [`RawJson`] so a relay reproduces them byte for byte, `_meta` included.
//! Encoding ([`encode_response`], [`encode_error`], [`encode_notification`], [`encode_request`])
//! writes one compact line ending in `\n`.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::codec::json::{
    NotObject, RawJson, object_text, present, write_int, write_raw, write_str,
};

/// `-32700`: the line is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// `-32600`: JSON, but not a valid request object.
pub const INVALID_REQUEST: i64 = -32600;
/// `-32601`: the method is not handled.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// `-32602`: invalid method parameters.
pub const INVALID_PARAMS: i64 = -32602;
/// `-32603`: the handler failed.
pub const INTERNAL_ERROR: i64 = -32603;

/// A JSON-RPC request id: a number or a string, kept exactly as sent (`0` is a valid id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Id(RawJson);

impl Id {
    /// An integer id.
    pub fn number(n: u64) -> Self {
        Self(RawJson::from_value(&n).expect("an integer always serializes"))
    }

    /// A string id.
    pub fn string(s: &str) -> Self {
        Self(RawJson::from_value(s).expect("a string always serializes"))
    }

    /// Reads an id from raw JSON: a string or a number; anything else (null included) is `None`.
    pub fn from_raw(raw: &RawJson) -> Option<Self> {
        Self::from_value_text(raw.get()).then(|| Self(raw.clone()))
    }

    /// The id's JSON text (`7`, `"abc"`).
    pub fn as_raw(&self) -> &RawJson {
        &self.0
    }

    fn from_value_text(text: &str) -> bool {
        match text.as_bytes().first() {
            Some(b'"') => true,
            Some(b'-' | b'0'..=b'9') => serde_json::from_str::<serde_json::Number>(text).is_ok(),
            _ => false,
        }
    }
}

/// A JSON-RPC error object: `{code, message, data?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcError {
    /// Error code (`-32601` method not found, `-32603` internal error, ...).
    pub code: i64,
    /// Human-readable message.
    pub message: String,
    /// Extra data, relayed verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<RawJson>,
}

impl RpcError {
    /// An error with a code and a message and no data.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }
}

/// How a request ended: a result xor an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Success; the result verbatim.
    Result(RawJson),
    /// Failure.
    Error(RpcError),
}

/// A request: it expects exactly one response with the same id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The caller's id.
    pub id: Id,
    /// The method name.
    pub method: String,
    /// Params verbatim; `None` when absent.
    pub params: Option<RawJson>,
}

/// A notification: no id, no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The method name.
    pub method: String,
    /// Params verbatim; `None` when absent.
    pub params: Option<RawJson>,
}

/// A response to a request this side sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The id of the request it answers.
    pub id: Id,
    /// Result or error.
    pub outcome: Outcome,
}

/// One JSON-RPC message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A request.
    Request(Request),
    /// A notification.
    Notification(Notification),
    /// A response.
    Response(Response),
}

/// Why a line is not a JSON-RPC message; the answer is [`Invalid::to_error`] under
/// [`Invalid::id`] (or a `null` id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalid {
    /// Not JSON at all (or not UTF-8): answer `-32700`.
    Parse {
        /// What the JSON parser said.
        detail: String,
    },
    /// JSON, but not a valid message: answer `-32600`.
    Request {
        /// The id, when one could be read.
        id: Option<Id>,
        /// What is wrong.
        detail: String,
    },
}

impl Invalid {
    /// The id to answer under, if one could be read.
    pub fn id(&self) -> Option<&Id> {
        match self {
            Self::Parse { .. } => None,
            Self::Request { id, .. } => id.as_ref(),
        }
    }

    /// The error object to answer with.
    pub fn to_error(&self) -> RpcError {
        match self {
            Self::Parse { detail } => RpcError::new(PARSE_ERROR, format!("Parse error: {detail}")),
            Self::Request { detail, .. } => {
                RpcError::new(INVALID_REQUEST, format!("Invalid Request: {detail}"))
            }
        }
    }
}

#[derive(Deserialize)]
struct WireMessage<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    jsonrpc: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    method: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

/// Classifies one line (without its newline).
pub fn parse_message(line: &[u8]) -> Result<Message, Invalid> {
    let text = object_text(line).map_err(|why| match why {
        NotObject::InvalidUtf8 { valid_up_to } => Invalid::Parse {
            detail: format!("invalid UTF-8 at byte {valid_up_to}"),
        },
        NotObject::InvalidJson(detail) => Invalid::Parse { detail },
        NotObject::NotAnObject { array: true } => Invalid::Request {
            id: None,
            detail: "batch requests are not supported".into(),
        },
        NotObject::NotAnObject { array: false } => Invalid::Request {
            id: None,
            detail: "a message must be a JSON object".into(),
        },
    })?;
    let wire: WireMessage<'_> = serde_json::from_str(text).map_err(|e| Invalid::Parse {
        detail: e.to_string(),
    })?;
    let raw_id = wire.id.map(RawJson::from_raw);
    let id = raw_id.as_ref().and_then(Id::from_raw);
    let error_id = id.clone();
    let invalid = |detail: &str| Invalid::Request {
        id: error_id.clone(),
        detail: detail.to_owned(),
    };
    // Lenient on receipt: `codex app-server` leaves `jsonrpc` out; a different version is refused.
    if wire.jsonrpc.is_some_and(|v| v.get() != "\"2.0\"") {
        return Err(invalid("\"jsonrpc\" must be \"2.0\""));
    }
    if raw_id.is_some() && id.is_none() {
        return Err(invalid("\"id\" must be a string or a number"));
    }
    let params = wire
        .params
        .filter(|p| p.get() != "null")
        .map(RawJson::from_raw);
    if let Some(method) = wire.method {
        let method: String = serde_json::from_str(method.get())
            .map_err(|_| invalid("\"method\" must be a string"))?;
        if let Some(p) = &params
            && !matches!(p.get().as_bytes().first(), Some(b'{' | b'['))
        {
            return Err(invalid("\"params\" must be an object or an array"));
        }
        return Ok(match id {
            Some(id) => Message::Request(Request { id, method, params }),
            None => Message::Notification(Notification { method, params }),
        });
    }
    let Some(id) = id else {
        return Err(invalid("a message needs a \"method\" or an \"id\""));
    };
    let error = wire.error.filter(|e| e.get() != "null");
    // `"result": null` beside an error is read as absent.
    let result = wire
        .result
        .filter(|r| error.is_none() || r.get() != "null")
        .map(RawJson::from_raw);
    let outcome = match (result, error) {
        (Some(result), None) => Outcome::Result(result),
        (None, Some(error)) => Outcome::Error(
            serde_json::from_str(error.get())
                .map_err(|_| invalid("\"error\" must be {code, message, data?}"))?,
        ),
        (Some(_), Some(_)) => {
            return Err(invalid("a response has \"result\" or \"error\", not both"));
        }
        (None, None) => return Err(invalid("a response needs \"result\" or \"error\"")),
    };
    Ok(Message::Response(Response { id, outcome }))
}

/// Appends a success response line.
pub fn encode_response(out: &mut Vec<u8>, id: &Id, result: &RawJson) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    write_raw(out, id.as_raw());
    out.extend_from_slice(b",\"result\":");
    write_raw(out, result);
    out.extend_from_slice(b"}\n");
}

/// Appends an error response line; `id` is `None` when the request's id could not be read.
pub fn encode_error(out: &mut Vec<u8>, id: Option<&Id>, error: &RpcError) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    match id {
        Some(id) => write_raw(out, id.as_raw()),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"error\":");
    write_error_object(out, error);
    out.extend_from_slice(b"}\n");
}

/// Appends a response line for either outcome.
pub fn encode_outcome(out: &mut Vec<u8>, id: &Id, outcome: &Outcome) {
    match outcome {
        Outcome::Result(result) => encode_response(out, id, result),
        Outcome::Error(error) => encode_error(out, Some(id), error),
    }
}

/// Appends a notification line; params are omitted when `None`.
pub fn encode_notification(out: &mut Vec<u8>, method: &str, params: Option<&RawJson>) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":");
    write_str(out, method);
    if let Some(params) = params {
        out.extend_from_slice(b",\"params\":");
        write_raw(out, params);
    }
    out.extend_from_slice(b"}\n");
}

/// Appends a request line; params are omitted when `None`.
pub fn encode_request(out: &mut Vec<u8>, id: &Id, method: &str, params: Option<&RawJson>) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    write_raw(out, id.as_raw());
    out.extend_from_slice(b",\"method\":");
    write_str(out, method);
    if let Some(params) = params {
        out.extend_from_slice(b",\"params\":");
        write_raw(out, params);
    }
    out.extend_from_slice(b"}\n");
}

pub(crate) fn write_error_object(out: &mut Vec<u8>, error: &RpcError) {
    out.extend_from_slice(b"{\"code\":");
    write_int(out, error.code);
    out.extend_from_slice(b",\"message\":");
    write_str(out, &error.message);
    if let Some(data) = &error.data {
        out.extend_from_slice(b",\"data\":");
        write_raw(out, data);
    }
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> RawJson {
        RawJson::from_text(text).unwrap()
    }

    #[test]
    fn requests_keep_id_and_params_byte_exact() {
        let line = br#"{"jsonrpc":"2.0","id":0,"method":"tools/call","params":{"name":"roster","arguments":{},"_meta":{"progressToken":"p 1"}}}"#;
        let Ok(Message::Request(req)) = parse_message(line) else {
            panic!("not a request")
        };
        assert_eq!(req.id.as_raw().get(), "0");
        assert_eq!(req.method, "tools/call");
        assert_eq!(
            req.params.unwrap().get(),
            r#"{"name":"roster","arguments":{},"_meta":{"progressToken":"p 1"}}"#
        );
        let Ok(Message::Request(req)) =
            parse_message(br#"{"jsonrpc":"2.0","id":"a\"b","method":"tools/list"}"#)
        else {
            panic!("not a request")
        };
        assert_eq!(req.id, Id::string("a\"b"));
        assert_eq!(req.params, None);
    }

    #[test]
    fn notifications_and_responses() {
        assert_eq!(
            parse_message(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Ok(Message::Notification(Notification {
                method: "notifications/initialized".into(),
                params: None
            }))
        );
        assert_eq!(
            parse_message(
                br#"{"jsonrpc":"2.0","id":3,"result":null,"error":{"code":-1,"message":"m"}}"#
            ),
            Ok(Message::Response(Response {
                id: Id::number(3),
                outcome: Outcome::Error(RpcError::new(-1, "m"))
            }))
        );
        assert_eq!(
            parse_message(br#"{"jsonrpc":"2.0","id":3,"result":{"x":1}}"#),
            Ok(Message::Response(Response {
                id: Id::number(3),
                outcome: Outcome::Result(raw(r#"{"x":1}"#))
            }))
        );
    }

    #[test]
    fn malformed_lines_are_classified() {
        let parse = |l: &[u8]| parse_message(l).unwrap_err();
        assert!(matches!(parse(b"{nope"), Invalid::Parse { .. }));
        assert!(matches!(parse(b"\xff\xfe"), Invalid::Parse { .. }));
        assert!(matches!(parse(b""), Invalid::Parse { .. }));
        assert_eq!(parse(b"42").id(), None);
        assert_eq!(parse(b"42").to_error().code, INVALID_REQUEST);
        assert_eq!(parse(b"[1]").to_error().code, INVALID_REQUEST);
        let wrong_version = parse(br#"{"jsonrpc":"1.0","id":9,"method":"x"}"#);
        assert_eq!(wrong_version.id(), Some(&Id::number(9)));
        assert_eq!(wrong_version.to_error().code, INVALID_REQUEST);
        // Without `jsonrpc` (as codex app-server writes) a message is still read.
        assert!(matches!(
            parse_message(br#"{"id":1,"result":{"userAgent":"codex"}}"#),
            Ok(Message::Response(_))
        ));
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","id":null,"method":"x"}"#).id(),
            None
        );
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","id":"k","method":7}"#).id(),
            Some(&Id::string("k"))
        );
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":1,"method":"x","params":3}"#),
            Invalid::Request { .. }
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":1}"#),
            Invalid::Request { .. }
        ));
    }

    #[test]
    fn encoders_write_one_compact_line() {
        let mut out = Vec::new();
        encode_response(&mut out, &Id::number(0), &raw("{\n\"a\": 1\n}"));
        encode_error(
            &mut out,
            None,
            &RpcError::new(PARSE_ERROR, "Parse error: x"),
        );
        encode_notification(&mut out, "notifications/tools/list_changed", None);
        encode_request(&mut out, &Id::string("r"), "ping", Some(&raw("{}")));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            concat!(
                "{\"jsonrpc\":\"2.0\",\"id\":0,\"result\":{\"a\":1}}\n",
                "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,\"message\":\"Parse error: x\"}}\n",
                "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n",
                "{\"jsonrpc\":\"2.0\",\"id\":\"r\",\"method\":\"ping\",\"params\":{}}\n",
            )
        );
    }
}
