//! How a broker message reaches an agent: the self-echo rule, the
//! `notifications/claude/channel` params for Claude Code, and the `<channel>` text for Codex
//! (seed 004, with the thread values of `../shared/spec/DECISIONS.md`).
//!
//! Meta is a flat string → string map (clients drop a push whose meta values are not strings):
//! `from`, `thread` (`general`, `chan:<id>`, `obj:<id>` or `dm`), `level`, `msg_id`, `ts`
//! (`MM/DD/YY HH:MM:SS UTC`), `ts_ms`, `title` when set, `target` for DMs, then every `data` key
//! that survives sanitising (characters outside `[A-Za-z0-9_]` become `_`; empty keys, keys
//! starting with a digit, reserved keys and `thread` are skipped; strings are copied, numbers and
//! booleans stringified, nulls, objects and arrays dropped). Attachments are listed in the content.
//!
//! Codex gets one `<channel ATTRS>\nCONTENT\n</channel>` text per message ([`codex_text`]).
//! Attribute values escape `\`, `"` and line breaks with a backslash; values and content both
//! escape `&`, `<` and `>` as `&amp;`, `&lt;`, `&gt;` (as XML does), so the only `<` in the text
//! are the event's own two tags: whatever a body, title or data value holds, the text reads back
//! as exactly one event with that body and those attributes — nothing can close the element
//! early or open a forged second one.

use std::fmt::Write as _;

use serde_json::Value;

use crate::json::RawJson;
use crate::message::Message;

/// Meta keys the runner sets itself; a `data` key with one of these names is skipped.
pub const RESERVED_META_KEYS: [&str; 9] = [
    "msg_id", "level", "ts", "ts_ms", "thread", "from", "title", "target", "channel",
];

/// The thread a message belongs to, as the agent sees it.
pub fn thread_of(message: &Message) -> String {
    if message.to.is_some() {
        return "dm".to_owned();
    }
    match message.data.get("thread").and_then(Value::as_str) {
        Some("chan:general") | None => "general".to_owned(),
        Some(thread) if thread.starts_with("chan:") || thread.starts_with("obj:") => {
            thread.to_owned()
        }
        Some(_) => "general".to_owned(),
    }
}

/// Whether the message is an objective lifecycle event (`data.kind == "objective"`).
pub fn is_objective_event(message: &Message) -> bool {
    message.data.get("kind").and_then(Value::as_str) == Some("objective")
}

/// Self-echo rule (seed 004): chat-shaped messages the agent sent itself are not delivered
/// back to it; objective lifecycle events are, even when the agent caused them.
pub fn suppress_self_echo(message: &Message, me: &str) -> bool {
    message.from.as_deref() == Some(me) && !is_objective_event(message)
}

/// `MM/DD/YY HH:MM:SS UTC` for epoch milliseconds.
pub fn format_ts(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{month:02}/{day:02}/{:02} {:02}:{:02}:{:02} UTC",
        year.rem_euclid(100),
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The meta map, in order (see the [module docs](self)).
pub fn meta(message: &Message) -> Vec<(String, String)> {
    let mut meta = Vec::new();
    if let Some(from) = message.from.as_deref().filter(|f| !f.is_empty()) {
        meta.push(("from".to_owned(), from.to_owned()));
    }
    meta.push(("thread".to_owned(), thread_of(message)));
    meta.push(("level".to_owned(), message.level.as_str().to_owned()));
    meta.push(("msg_id".to_owned(), message.id.clone()));
    meta.push(("ts".to_owned(), format_ts(message.ts)));
    meta.push(("ts_ms".to_owned(), message.ts.to_string()));
    if let Some(title) = message.title.as_deref().filter(|t| !t.is_empty()) {
        meta.push(("title".to_owned(), title.to_owned()));
    }
    if let Some(to) = &message.to {
        meta.push(("target".to_owned(), to.clone()));
    }
    for (key, value) in &message.data {
        let value = match value {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null | Value::Array(_) | Value::Object(_) => continue,
        };
        let key: String = key
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if key.is_empty()
            || key.starts_with(|c: char| c.is_ascii_digit())
            || RESERVED_META_KEYS.contains(&key.as_str())
            || meta.iter().any(|(k, _)| *k == key)
        {
            continue;
        }
        meta.push((key, value));
    }
    meta
}

/// The body, followed by a list of the attachments when there are any.
pub fn content(message: &Message) -> String {
    let mut content = message.body.clone();
    if !message.attachments.is_empty() {
        content.push_str("\n\nattachments:");
        for a in &message.attachments {
            let _ = write!(
                content,
                "\n- {} ({}, {} bytes, {})",
                a.path, a.name, a.size, a.mime_type
            );
        }
    }
    content
}

/// `notifications/claude/channel` params: `{"content": …, "meta": {…}}`.
pub fn claude_channel_params(message: &Message) -> RawJson {
    let meta: serde_json::Map<String, Value> = meta(message)
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    let params = serde_json::json!({ "content": content(message), "meta": meta });
    RawJson::from_value(&params).expect("JSON values serialize")
}

/// Attributes that come first in the `<channel>` tag, in this order; the rest follow as met.
const CODEX_ORDER: [&str; 8] = [
    "kind", "from", "thread", "title", "target", "level", "ts", "msg_id",
];

/// The text Codex receives for one message:
///
/// ```text
/// <channel from="alice" thread="dm" target="builder" level="info" ts="04/15/26 14:23:45 UTC" msg_id="…" ts_ms="…">
/// please rebase
/// </channel>
/// ```
///
/// Attribute values escape `\` as `\\`, `"` as `\"` and line breaks as `\n` / `\r`, so a value
/// can never end the tag or leave its line. Values and the content (body and attachment list)
/// escape `&`, `<` and `>` as `&amp;`, `&lt;` and `&gt;`, as XML does, so nothing can close the
/// element or open another one: the only `<` in the text are those of the event's own two tags.
pub fn codex_text(message: &Message) -> String {
    let meta = meta(message);
    let mut ordered: Vec<&(String, String)> = CODEX_ORDER
        .iter()
        .filter_map(|name| meta.iter().find(|(k, _)| k == name))
        .collect();
    ordered.extend(
        meta.iter()
            .filter(|(k, _)| !CODEX_ORDER.contains(&k.as_str())),
    );
    let mut text = String::from("<channel");
    for (key, value) in ordered {
        if value.is_empty() {
            continue;
        }
        let _ = write!(text, " {key}=\"");
        for c in value.chars() {
            match c {
                '\\' => text.push_str("\\\\"),
                '"' => text.push_str("\\\""),
                '\n' => text.push_str("\\n"),
                '\r' => text.push_str("\\r"),
                c => push_xml_char(&mut text, c),
            }
        }
        text.push('"');
    }
    text.push_str(">\n");
    for c in content(message).chars() {
        push_xml_char(&mut text, c);
    }
    text.push_str("\n</channel>");
    text
}

/// `c`, with `&`, `<` and `>` as XML entities.
fn push_xml_char(text: &mut String, c: char) {
    match c {
        '&' => text.push_str("&amp;"),
        '<' => text.push_str("&lt;"),
        '>' => text.push_str("&gt;"),
        c => text.push(c),
    }
}

#[cfg(test)]
mod tests;
