//! The Ash bridge protocol: newline-delimited JSON between a host and a bridge that
//! runs an agent inside a sandbox.
//!
//! Commands (host → bridge) are discriminated by `cmd`, events (bridge → host) by `ev`:
//!
//! ```text
//! {"cmd":"query","prompt":"hi","sessionId":"s1"}      {"ev":"ready"}
//! {"cmd":"resume","sessionId":"s1"}                   {"ev":"message","data":{…agent message…}}
//! {"cmd":"interrupt"}                                 {"ev":"error","error":"…"}
//! {"cmd":"shutdown"}                                  {"ev":"done","sessionId":"s1"}
//! {"cmd":"exec","command":"ls","timeout":30000}       {"ev":"exec_result","exitCode":0,"stdout":"…","stderr":""}
//! ```
//!
//! Validation ([`decode_command`], [`decode_event`]): a plain object with exactly one of
//! `cmd`/`ev` and a known value, no `__proto__` / `constructor` / `prototype` keys, and each
//! message's required fields. Unknown extra fields are accepted; a query's extra fields are agent
//! options and travel on verbatim. An agent message (`data`) is passed through unchanged.
//!
//! The per-connection bridge machine is [`bridge::AshConnection`]; the host's is
//! [`host::AshHost`].

use std::collections::BTreeMap;

use serde_json::value::RawValue;

use crate::codec::json::{NotObject, RawJson, object_text, write_int, write_raw, write_str};

pub mod bridge;
pub mod host;

/// The default `exec` timeout.
pub const DEFAULT_EXEC_TIMEOUT_MS: u64 = 30_000;

/// A command from the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Send a prompt to the agent and stream its messages back.
    Query(Query),
    /// Resume a session. Without a prompt the next `query` for the session
    /// continues it; with one (`turn`, our extension: a query's fields under `cmd: "resume"`) a
    /// turn runs on the resumed session at once.
    Resume {
        /// The session.
        session_id: String,
        /// The turn to run on it, when the command carried a `prompt`.
        turn: Option<Query>,
    },
    /// Stop the current turn.
    Interrupt,
    /// Stop the bridge.
    Shutdown,
    /// Run a shell command in the sandbox.
    Exec {
        /// The command line.
        command: String,
        /// Time limit in milliseconds.
        timeout_ms: u64,
    },
}

/// `query`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// A string or content blocks, verbatim.
    pub prompt: RawJson,
    /// The conversation this turn belongs to.
    pub session_id: String,
    /// Whether the agent's partial stream events are wanted too.
    pub include_partial_messages: bool,
    /// Every other field (model, maxTurns, allowedTools, …), verbatim, for the agent's options.
    pub options: BTreeMap<String, RawJson>,
}

/// An event from the bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The bridge accepted the connection and takes commands.
    Ready,
    /// One message of the agent, unchanged.
    Message {
        /// The agent's message.
        data: RawJson,
    },
    /// Something failed.
    Error {
        /// What.
        error: String,
    },
    /// The turn (or exec) is over.
    Done {
        /// The session (`""` after `exec`).
        session_id: String,
    },
    /// The outcome of `exec`.
    ExecResult {
        /// Exit code (`-1` when it did not exit normally).
        exit_code: i64,
        /// Standard output.
        stdout: String,
        /// Standard error.
        stderr: String,
    },
}

/// Why a line is not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

const FORBIDDEN_KEYS: [&str; 3] = ["__proto__", "constructor", "prototype"];

/// Reads a line as a flat map of raw fields, refusing what no valid message is.
fn fields(line: &[u8]) -> Result<BTreeMap<String, &RawValue>, Invalid> {
    let text = object_text(line).map_err(|why| match why {
        NotObject::InvalidUtf8 { .. } => Invalid("not valid UTF-8".into()),
        NotObject::InvalidJson(detail) => Invalid(format!("not valid JSON: {detail}")),
        NotObject::NotAnObject { .. } => Invalid("not a JSON object".into()),
    })?;
    let map: BTreeMap<String, &RawValue> =
        serde_json::from_str(text).map_err(|e| Invalid(format!("not valid JSON: {e}")))?;
    if let Some(key) = FORBIDDEN_KEYS.iter().find(|k| map.contains_key(**k)) {
        return Err(Invalid(format!("forbidden key {key:?}")));
    }
    Ok(map)
}

fn string(map: &BTreeMap<String, &RawValue>, key: &str) -> Result<String, Invalid> {
    map.get(key)
        .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())
        .ok_or_else(|| Invalid(format!("\"{key}\" must be a string")))
}

fn discriminator(
    map: &BTreeMap<String, &RawValue>,
    want: &str,
    other: &str,
) -> Result<String, Invalid> {
    match (map.contains_key(want), map.contains_key(other)) {
        (true, true) => Err(Invalid(format!("has both \"{want}\" and \"{other}\""))),
        (false, true) => Err(Invalid(format!(
            "has \"{other}\" where \"{want}\" is expected"
        ))),
        _ => string(map, want),
    }
}

/// Decodes a command line (without its newline).
pub fn decode_command(line: &[u8]) -> Result<Command, Invalid> {
    let map = fields(line)?;
    let cmd = discriminator(&map, "cmd", "ev")?;
    Ok(match cmd.as_str() {
        "query" => Command::Query(query(map)?),
        "resume" if map.contains_key("prompt") => {
            let turn = query(map)?;
            Command::Resume {
                session_id: turn.session_id.clone(),
                turn: Some(turn),
            }
        }
        "resume" => Command::Resume {
            session_id: string(&map, "sessionId")?,
            turn: None,
        },
        "interrupt" => Command::Interrupt,
        "shutdown" => Command::Shutdown,
        "exec" => Command::Exec {
            command: string(&map, "command")?,
            timeout_ms: match map.get("timeout") {
                None => DEFAULT_EXEC_TIMEOUT_MS,
                Some(raw) if raw.get() == "null" => DEFAULT_EXEC_TIMEOUT_MS,
                Some(raw) => serde_json::from_str::<f64>(raw.get())
                    .ok()
                    .filter(|t| t.is_finite() && *t > 0.0)
                    .map(|t| t as u64)
                    .ok_or_else(|| Invalid("\"timeout\" must be a positive number".into()))?,
            },
        },
        other => return Err(Invalid(format!("unknown command {other:?}"))),
    })
}

/// The fields of a `query` (or of a `resume` with a prompt).
fn query(mut map: BTreeMap<String, &RawValue>) -> Result<Query, Invalid> {
    let prompt = match map.get("prompt") {
        Some(p) if matches!(p.get().as_bytes().first(), Some(b'"' | b'[')) => RawJson::from_raw(p),
        _ => {
            return Err(Invalid(
                "\"prompt\" must be a string or content blocks".into(),
            ));
        }
    };
    let session_id = string(&map, "sessionId")?;
    let include_partial_messages = match map.get("includePartialMessages") {
        None => false,
        Some(raw) => match raw.get() {
            "true" => true,
            "false" | "null" => false,
            _ => {
                return Err(Invalid(
                    "\"includePartialMessages\" must be a boolean".into(),
                ));
            }
        },
    };
    for key in ["cmd", "prompt", "sessionId", "includePartialMessages"] {
        map.remove(key);
    }
    let options = map
        .into_iter()
        .map(|(k, v)| (k, RawJson::from_raw(v)))
        .collect();
    Ok(Query {
        prompt,
        session_id,
        include_partial_messages,
        options,
    })
}

/// Decodes an event line (without its newline).
pub fn decode_event(line: &[u8]) -> Result<Event, Invalid> {
    let map = fields(line)?;
    let ev = discriminator(&map, "ev", "cmd")?;
    Ok(match ev.as_str() {
        "ready" => Event::Ready,
        "message" => Event::Message {
            data: map
                .get("data")
                .map(|d| RawJson::from_raw(d))
                .ok_or_else(|| Invalid("missing \"data\"".into()))?,
        },
        "error" => Event::Error {
            error: string(&map, "error")?,
        },
        "done" => Event::Done {
            session_id: string(&map, "sessionId")?,
        },
        "exec_result" => Event::ExecResult {
            exit_code: map
                .get("exitCode")
                .and_then(|raw| serde_json::from_str::<i64>(raw.get()).ok())
                .ok_or_else(|| Invalid("\"exitCode\" must be an integer".into()))?,
            stdout: string(&map, "stdout")?,
            stderr: string(&map, "stderr")?,
        },
        other => return Err(Invalid(format!("unknown event {other:?}"))),
    })
}

/// Appends a command as one line.
pub fn encode_command(command: &Command, out: &mut Vec<u8>) {
    match command {
        Command::Query(q) | Command::Resume { turn: Some(q), .. } => {
            let cmd: &[u8] = if matches!(command, Command::Query(_)) {
                b"{\"cmd\":\"query\",\"prompt\":"
            } else {
                b"{\"cmd\":\"resume\",\"prompt\":"
            };
            out.extend_from_slice(cmd);
            write_raw(out, &q.prompt);
            out.extend_from_slice(b",\"sessionId\":");
            write_str(out, &q.session_id);
            if q.include_partial_messages {
                out.extend_from_slice(b",\"includePartialMessages\":true");
            }
            for (key, value) in &q.options {
                out.push(b',');
                write_str(out, key);
                out.push(b':');
                write_raw(out, value);
            }
            out.push(b'}');
        }
        Command::Resume {
            session_id,
            turn: None,
        } => {
            out.extend_from_slice(b"{\"cmd\":\"resume\",\"sessionId\":");
            write_str(out, session_id);
            out.push(b'}');
        }
        Command::Interrupt => out.extend_from_slice(b"{\"cmd\":\"interrupt\"}"),
        Command::Shutdown => out.extend_from_slice(b"{\"cmd\":\"shutdown\"}"),
        Command::Exec {
            command,
            timeout_ms,
        } => {
            out.extend_from_slice(b"{\"cmd\":\"exec\",\"command\":");
            write_str(out, command);
            out.extend_from_slice(b",\"timeout\":");
            write_int(out, timeout_ms);
            out.push(b'}');
        }
    }
    out.push(b'\n');
}

/// Appends an event as one line.
pub fn encode_event(event: &Event, out: &mut Vec<u8>) {
    match event {
        Event::Ready => out.extend_from_slice(b"{\"ev\":\"ready\"}"),
        Event::Message { data } => {
            out.extend_from_slice(b"{\"ev\":\"message\",\"data\":");
            write_raw(out, data);
            out.push(b'}');
        }
        Event::Error { error } => {
            out.extend_from_slice(b"{\"ev\":\"error\",\"error\":");
            write_str(out, error);
            out.push(b'}');
        }
        Event::Done { session_id } => {
            out.extend_from_slice(b"{\"ev\":\"done\",\"sessionId\":");
            write_str(out, session_id);
            out.push(b'}');
        }
        Event::ExecResult {
            exit_code,
            stdout,
            stderr,
        } => {
            out.extend_from_slice(b"{\"ev\":\"exec_result\",\"exitCode\":");
            write_int(out, exit_code);
            out.extend_from_slice(b",\"stdout\":");
            write_str(out, stdout);
            out.extend_from_slice(b",\"stderr\":");
            write_str(out, stderr);
            out.push(b'}');
        }
    }
    out.push(b'\n');
}

/// One event as a fresh line.
pub fn event_line(event: &Event) -> Vec<u8> {
    let mut out = Vec::new();
    encode_event(event, &mut out);
    out
}

/// One command as a fresh line.
pub fn command_line(command: &Command) -> Vec<u8> {
    let mut out = Vec::new();
    encode_command(command, &mut out);
    out
}

#[cfg(test)]
mod tests;
