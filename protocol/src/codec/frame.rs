//! The five ac7 IPC frame kinds between runner and bridge, their decoder and their encoder.
//!
//! Wire form: one compact JSON object per line, discriminated by `kind`:
//!
//! ```text
//! {"kind":"mcp_request","id":1,"method":"tools/list"}
//! {"kind":"mcp_response","id":1,"result":{"tools":[]}}
//! {"kind":"mcp_notification","method":"notifications/claude/channel","params":{…}}
//! {"kind":"mcp_notification","method":"notifications/claude/channel","params":{…},"seq":7}
//! {"kind":"ack","seq":7}
//! {"kind":"shutdown","reason":"displaced-by-new-bridge"}
//! {"kind":"error","message":"runner already attached"}
//! ```
//!
//! Decoding is lenient: [`FrameDecoder`] turns each non-blank line into exactly one
//! [`Decoded`]: a [`Frame`], or a [`Dropped`] line with its [`DropReason`]. A frame of a known
//! kind with missing or mistyped fields is dropped as [`DropReason::InvalidFields`] carrying the
//! `id` when one can be read, so the runner can answer it. Blank lines are skipped silently.
//!
//! Encoding ([`encode_frame`]) writes compact JSON plus `\n` and refuses a frame over the cap
//! with [`FrameTooLarge`]; the output never holds a raw newline.

use std::fmt;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::codec::json::{
    NotObject, RawJson, object_text, present, write_int, write_raw, write_str,
};
use crate::codec::jsonrpc::{Outcome, RpcError, write_error_object};
use crate::codec::line::{DEFAULT_MAX_LINE_BYTES, Line, LineDecoder};

/// `MAX_FRAME_BYTES`: the largest frame, trailing newline included (1 MiB).
pub const MAX_FRAME_BYTES: usize = DEFAULT_MAX_LINE_BYTES;

/// The line a bridge sends first and alone, with its stdin and its stdout attached as
/// descriptors (`SCM_RIGHTS`, in that order), when it hands the agent's stdio over to the
/// runner: from then on the runner reads the agent's requests and writes its answers and
/// notifications itself, and the socket only carries the end of the session (a `shutdown` frame
/// either way). Not a [`Frame`]: a runner that does not take the descriptors reads it as a line
/// of an unknown kind, which it drops.
pub const STDIO_HANDOFF: &[u8] = b"{\"kind\":\"stdio_handoff\"}\n";

/// One IPC frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// bridge → runner: an MCP request from the agent.
    McpRequest(McpRequest),
    /// runner → bridge: the answer to an `mcp_request`.
    McpResponse(McpResponse),
    /// runner → bridge: an MCP notification for the agent.
    McpNotification(McpNotification),
    /// either direction: courtesy teardown.
    Shutdown(Shutdown),
    /// either direction: a protocol-level error, optionally about one request.
    Error(ErrorFrame),
    /// bridge → runner: the notification numbered `seq` was written to the agent (`seq` 0, sent
    /// on connect: this bridge acknowledges what it writes).
    Ack(Ack),
}

/// `ack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// The notification's `seq`, or 0 for "I acknowledge".
    pub seq: u64,
}

/// `mcp_request`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpRequest {
    /// The bridge's correlation id (not the agent's JSON-RPC id).
    pub id: u64,
    /// MCP method, e.g. `tools/call`.
    pub method: String,
    /// MCP params verbatim; the key is absent when `None` (as for `tools/list`).
    pub params: Option<RawJson>,
}

/// `mcp_response`: `result` xor `error`, by type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpResponse {
    /// The id of the `mcp_request` it answers.
    pub id: u64,
    /// The result or the JSON-RPC error.
    pub outcome: Outcome,
}

/// `mcp_notification`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpNotification {
    /// MCP method, e.g. `notifications/claude/channel`.
    pub method: String,
    /// Params verbatim; absent when `None`.
    pub params: Option<RawJson>,
    /// The runner's number for it, which a bridge that acknowledges sends back in an `ack` once
    /// it wrote it to the agent (absent from runners that do not ask).
    pub seq: Option<u64>,
}

/// `shutdown`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Shutdown {
    /// Free-form reason, for logs.
    pub reason: Option<String>,
}

/// `error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorFrame {
    /// What went wrong.
    pub message: String,
    /// The request it is about, if any.
    pub id: Option<u64>,
}

/// The `kind` discriminator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrameKind {
    /// `mcp_request`
    McpRequest,
    /// `mcp_response`
    McpResponse,
    /// `mcp_notification`
    McpNotification,
    /// `shutdown`
    Shutdown,
    /// `error`
    Error,
    /// `ack`
    Ack,
}

impl FrameKind {
    /// Every kind.
    pub const ALL: [FrameKind; 6] = [
        Self::McpRequest,
        Self::McpResponse,
        Self::McpNotification,
        Self::Shutdown,
        Self::Error,
        Self::Ack,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::McpRequest => "mcp_request",
            Self::McpResponse => "mcp_response",
            Self::McpNotification => "mcp_notification",
            Self::Shutdown => "shutdown",
            Self::Error => "error",
            Self::Ack => "ack",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    fn from_quoted(raw: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|k| raw.len() == k.as_str().len() + 2 && &raw[1..raw.len() - 1] == k.as_str())
    }
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Frame {
    /// This frame's kind.
    pub fn kind(&self) -> FrameKind {
        match self {
            Self::McpRequest(_) => FrameKind::McpRequest,
            Self::McpResponse(_) => FrameKind::McpResponse,
            Self::McpNotification(_) => FrameKind::McpNotification,
            Self::Shutdown(_) => FrameKind::Shutdown,
            Self::Error(_) => FrameKind::Error,
            Self::Ack(_) => FrameKind::Ack,
        }
    }
}

/// Why a line was dropped instead of becoming a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DropReason {
    /// Longer than the cap; its bytes were never buffered whole.
    Oversized,
    /// Not UTF-8.
    InvalidUtf8 {
        /// Length of the valid prefix.
        valid_up_to: usize,
    },
    /// Not JSON.
    InvalidJson {
        /// What the parser said.
        detail: String,
    },
    /// JSON, but not an object.
    NotAnObject,
    /// An object without a string `kind`.
    MissingKind,
    /// A `kind` that is not one of the six.
    UnknownKind {
        /// The kind as sent.
        kind: String,
    },
    /// A known kind with missing or mistyped fields.
    InvalidFields {
        /// The kind.
        kind: FrameKind,
        /// The frame's `id`, when it could be read as a correlation id.
        id: Option<u64>,
        /// What is wrong.
        detail: String,
    },
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Oversized => f.write_str("line exceeds the frame size limit"),
            Self::InvalidUtf8 { valid_up_to } => {
                write!(f, "invalid UTF-8 after {valid_up_to} bytes")
            }
            Self::InvalidJson { detail } => write!(f, "invalid JSON: {detail}"),
            Self::NotAnObject => f.write_str("frame is not a JSON object"),
            Self::MissingKind => f.write_str("frame has no string \"kind\""),
            Self::UnknownKind { kind } => write!(f, "unknown frame kind {kind:?}"),
            Self::InvalidFields { kind, detail, .. } => write!(f, "invalid {kind} frame: {detail}"),
        }
    }
}

/// A line the decoder dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// Length of the line in bytes (for an oversized line, every byte of it, newline included).
    pub len: usize,
    /// Why it was dropped.
    pub reason: DropReason,
}

/// One decoder outcome: one per non-blank line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A well-formed frame.
    Frame(Frame),
    /// A line that is not one.
    Dropped(Dropped),
}

/// Incremental frame decoder: a [`LineDecoder`] plus [`decode_frame`].
#[derive(Debug, Clone, Default)]
pub struct FrameDecoder {
    lines: LineDecoder,
}

impl FrameDecoder {
    /// A decoder whose lines may be at most `max_frame_bytes` long, newline included.
    pub fn new(max_frame_bytes: usize) -> Self {
        Self {
            lines: LineDecoder::new(max_frame_bytes),
        }
    }

    /// Appends bytes read from the socket; drain with [`decode`](Self::decode).
    pub fn push(&mut self, bytes: &[u8]) {
        self.lines.push(bytes);
    }

    /// The next outcome, or `None` when more bytes are needed.
    pub fn decode(&mut self) -> Option<Decoded> {
        loop {
            let decoded = outcome(self.lines.decode()?);
            if decoded.is_some() {
                return decoded;
            }
        }
    }

    /// Ends the stream: decodes an unterminated last line, if any. Call after `decode` is `None`.
    pub fn decode_eof(&mut self) -> Option<Decoded> {
        self.lines.decode_eof().and_then(outcome)
    }

    /// Bytes currently buffered.
    pub fn buffered_len(&self) -> usize {
        self.lines.buffered_len()
    }
}

fn outcome(line: Line<'_>) -> Option<Decoded> {
    match line {
        Line::Oversized { len } => Some(Decoded::Dropped(Dropped {
            len,
            reason: DropReason::Oversized,
        })),
        Line::Complete(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => None,
        Line::Complete(bytes) => Some(match decode_frame(bytes) {
            Ok(frame) => Decoded::Frame(frame),
            Err(reason) => Decoded::Dropped(Dropped {
                len: bytes.len(),
                reason,
            }),
        }),
    }
}

#[derive(Deserialize)]
struct WireFrame<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    kind: Option<&'a RawValue>,
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
    #[serde(default, borrow, deserialize_with = "present")]
    reason: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    message: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    seq: Option<&'a RawValue>,
}

/// Decodes one line (without its newline) into a frame.
pub fn decode_frame(line: &[u8]) -> Result<Frame, DropReason> {
    let text = object_text(line).map_err(|why| match why {
        NotObject::InvalidUtf8 { valid_up_to } => DropReason::InvalidUtf8 { valid_up_to },
        NotObject::InvalidJson(detail) => DropReason::InvalidJson { detail },
        NotObject::NotAnObject { .. } => DropReason::NotAnObject,
    })?;
    let wire: WireFrame<'_> = serde_json::from_str(text).map_err(|e| DropReason::InvalidJson {
        detail: e.to_string(),
    })?;
    let kind = wire.kind.ok_or(DropReason::MissingKind)?.get();
    let kind = match FrameKind::from_quoted(kind) {
        Some(kind) => kind,
        None => {
            let name: String = serde_json::from_str(kind).map_err(|_| DropReason::MissingKind)?;
            FrameKind::from_name(&name).ok_or(DropReason::UnknownKind { kind: name })?
        }
    };
    let id = wire.id.map(|raw| serde_json::from_str::<u64>(raw.get()));
    let readable_id = id.as_ref().and_then(|r| r.as_ref().ok().copied());
    let invalid = |detail: &str| DropReason::InvalidFields {
        kind,
        id: readable_id,
        detail: detail.to_owned(),
    };
    let required_id = || match &id {
        Some(Ok(id)) => Ok(*id),
        Some(Err(_)) => Err(invalid("\"id\" must be a non-negative integer")),
        None => Err(invalid("missing \"id\"")),
    };
    let method = || match wire.method {
        Some(raw) => serde_json::from_str::<String>(raw.get())
            .map_err(|_| invalid("\"method\" must be a string")),
        None => Err(invalid("missing \"method\"")),
    };
    let params = wire
        .params
        .filter(|p| p.get() != "null")
        .map(RawJson::from_raw);
    let optional_string = |raw: Option<&RawValue>, name: &str| match raw {
        None => Ok(None),
        Some(raw) if raw.get() == "null" => Ok(None),
        Some(raw) => serde_json::from_str::<String>(raw.get())
            .map(Some)
            .map_err(|_| invalid(&format!("\"{name}\" must be a string"))),
    };
    Ok(match kind {
        FrameKind::McpRequest => Frame::McpRequest(McpRequest {
            id: required_id()?,
            method: method()?,
            params,
        }),
        FrameKind::McpNotification => Frame::McpNotification(McpNotification {
            method: method()?,
            params,
            seq: match wire.seq {
                None => None,
                Some(raw) if raw.get() == "null" => None,
                Some(raw) => Some(
                    serde_json::from_str::<u64>(raw.get())
                        .map_err(|_| invalid("\"seq\" must be a non-negative integer"))?,
                ),
            },
        }),
        FrameKind::Ack => Frame::Ack(Ack {
            seq: match wire.seq {
                Some(raw) => serde_json::from_str::<u64>(raw.get())
                    .map_err(|_| invalid("\"seq\" must be a non-negative integer"))?,
                None => return Err(invalid("missing \"seq\"")),
            },
        }),
        FrameKind::McpResponse => {
            let id = required_id()?;
            let error = wire.error.filter(|e| e.get() != "null");
            // `"result": null` beside an error is read as absent.
            let result = wire.result.filter(|r| error.is_none() || r.get() != "null");
            let outcome = match (result, error) {
                (Some(result), None) => Outcome::Result(RawJson::from_raw(result)),
                (None, Some(error)) => {
                    Outcome::Error(serde_json::from_str::<RpcError>(error.get()).map_err(|_| {
                        invalid("\"error\" must be {code: integer, message: string, data?}")
                    })?)
                }
                (Some(_), Some(_)) => return Err(invalid("both \"result\" and \"error\"")),
                (None, None) => return Err(invalid("neither \"result\" nor \"error\"")),
            };
            Frame::McpResponse(McpResponse { id, outcome })
        }
        FrameKind::Shutdown => Frame::Shutdown(Shutdown {
            reason: optional_string(wire.reason, "reason")?,
        }),
        FrameKind::Error => Frame::Error(ErrorFrame {
            message: optional_string(wire.message, "message")?
                .ok_or_else(|| invalid("missing \"message\""))?,
            id: match &id {
                None => None,
                Some(_) if wire.id.is_some_and(|raw| raw.get() == "null") => None,
                Some(_) => Some(required_id()?),
            },
        }),
    })
}

/// The encoder refused a frame: it would be longer than the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("frame of {len} bytes exceeds the {max}-byte limit")]
pub struct FrameTooLarge {
    /// Encoded length, newline included.
    pub len: usize,
    /// The cap.
    pub max: usize,
}

/// Appends `frame` as one line to `out` if it fits in `max` bytes (newline included).
/// On refusal `out` is left as it was.
pub fn encode_frame(frame: &Frame, out: &mut Vec<u8>, max: usize) -> Result<usize, FrameTooLarge> {
    let start = out.len();
    write_frame(frame, out);
    let len = out.len() - start;
    if len > max {
        out.truncate(start);
        return Err(FrameTooLarge { len, max });
    }
    Ok(len)
}

/// Encodes `frame` into a fresh buffer under `max`.
pub fn encode_frame_vec(frame: &Frame, max: usize) -> Result<Vec<u8>, FrameTooLarge> {
    let mut out = Vec::new();
    encode_frame(frame, &mut out, max).map(|_| out)
}

fn write_frame(frame: &Frame, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"kind\":\"");
    out.extend_from_slice(frame.kind().as_str().as_bytes());
    out.push(b'"');
    match frame {
        Frame::McpRequest(req) => {
            out.extend_from_slice(b",\"id\":");
            write_int(out, req.id);
            write_method_params(out, &req.method, req.params.as_ref());
        }
        Frame::McpResponse(resp) => {
            out.extend_from_slice(b",\"id\":");
            write_int(out, resp.id);
            match &resp.outcome {
                Outcome::Result(result) => {
                    out.extend_from_slice(b",\"result\":");
                    write_raw(out, result);
                }
                Outcome::Error(error) => {
                    out.extend_from_slice(b",\"error\":");
                    write_error_object(out, error);
                }
            }
        }
        Frame::McpNotification(n) => {
            write_method_params(out, &n.method, n.params.as_ref());
            if let Some(seq) = n.seq {
                out.extend_from_slice(b",\"seq\":");
                write_int(out, seq);
            }
        }
        Frame::Ack(a) => {
            out.extend_from_slice(b",\"seq\":");
            write_int(out, a.seq);
        }
        Frame::Shutdown(s) => {
            if let Some(reason) = &s.reason {
                out.extend_from_slice(b",\"reason\":");
                write_str(out, reason);
            }
        }
        Frame::Error(e) => {
            out.extend_from_slice(b",\"message\":");
            write_str(out, &e.message);
            if let Some(id) = e.id {
                out.extend_from_slice(b",\"id\":");
                write_int(out, id);
            }
        }
    }
    out.extend_from_slice(b"}\n");
}

fn write_method_params(out: &mut Vec<u8>, method: &str, params: Option<&RawJson>) {
    out.extend_from_slice(b",\"method\":");
    write_str(out, method);
    if let Some(params) = params {
        out.extend_from_slice(b",\"params\":");
        write_raw(out, params);
    }
}

#[cfg(test)]
mod tests;
