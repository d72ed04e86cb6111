//! How a broker message reaches an agent: the self-echo rule, the
//! `notifications/claude/channel` params for Claude Code, and the `<channel>` text for Codex
//! (thread values `general`, `chan:<id>`, `obj:<id>`, `dm`).
//!
//! Meta is a flat string → string map (clients drop a push whose meta values are not strings), in
//! the order the TypeScript runner sends them in: `msg_id`, `level`, `ts` (`MM/DD/YY HH:MM:SS
//! UTC`), `ts_ms`, `thread` (`general`, `chan:<id>`, `obj:<id>` or `dm`), `from` and `title` when
//! non-empty, `target` for DMs, `channel` (the id) for a named channel's thread, then every `data`
//! key that survives sanitising (characters outside `[A-Za-z0-9_]` become `_`; empty keys, keys
//! starting with a digit and the reserved keys [`RESERVED_META_KEYS`] are skipped; strings are
//! copied, numbers and booleans stringified, nulls, objects and arrays dropped), in `data`'s own
//! order. As in the TypeScript runner, a surviving key that is already present (`channel`, or two
//! `data` keys that sanitise alike) overwrites the earlier value in its place. Attachments are
//! listed in the content.
//!
//! Codex gets one `<channel ATTRS>\nCONTENT\n</channel>` text per message ([`codex_text`]).
//! Attribute values escape `\`, `"` and line breaks with a backslash; values and content both
//! escape `&`, `<` and `>` as `&amp;`, `&lt;`, `&gt;` (as XML does), so the only `<` in the text
//! are the event's own two tags: whatever a body, title or data value holds, the text reads back
//! as exactly one event with that body and those attributes — nothing can close the element
//! early or open a forged second one.

use crate::EpochMs;
use std::borrow::Cow;
use std::fmt::Write as _;

use serde_json::Value;

use crate::civil::UtcDateTime;
use crate::codec::json::RawJson;
use crate::domain::message::Message;

/// Meta keys the runner sets itself; a `data` key with one of these names is skipped
/// (as in the TypeScript runner). `channel` is not among them: a `data.channel` overwrites it.
pub const RESERVED_META_KEYS: [&str; 8] = [
    "msg_id", "level", "ts", "ts_ms", "thread", "from", "title", "target",
];

/// The thread a message belongs to, as the agent sees it.
pub fn thread_of(message: &Message) -> &str {
    if message.to.is_some() {
        return "dm";
    }
    match message.data.get("thread").and_then(Value::as_str) {
        Some("chan:general") | None => "general",
        Some(thread) if thread.starts_with("chan:") || thread.starts_with("obj:") => thread,
        Some(_) => "general",
    }
}

/// Whether the message is an objective lifecycle event (`data.kind == "objective"`).
pub fn is_objective_event(message: &Message) -> bool {
    message.data.get("kind").and_then(Value::as_str) == Some("objective")
}

/// Self-echo rule: chat-shaped messages the agent sent itself are not delivered
/// back to it; objective lifecycle events are, even when the agent caused them.
pub fn suppress_self_echo(message: &Message, me: &str) -> bool {
    message.from.as_deref() == Some(me) && !is_objective_event(message)
}

/// `MM/DD/YY HH:MM:SS UTC` for epoch milliseconds.
pub fn format_ts(ms: EpochMs) -> String {
    let t = UtcDateTime::from_epoch_ms(ms);
    // Every field is below 100 (the year is taken modulo 100): two digits each, written
    // without the formatting machinery (this runs once per message an agent gets).
    let year = u32::try_from(t.year.rem_euclid(100)).unwrap_or(0);
    let mut out = String::with_capacity(21);
    for (n, after) in [
        (t.month, '/'),
        (t.day, '/'),
        (year, ' '),
        (t.hour, ':'),
        (t.minute, ':'),
        (t.second, ' '),
    ] {
        out.push(char::from(b'0' + (n / 10 % 10) as u8));
        out.push(char::from(b'0' + (n % 10) as u8));
        out.push(after);
    }
    out.push_str("UTC");
    out
}

/// One meta entry: its key and value, borrowed from the message where they can be.
pub type MetaEntry<'a> = (Cow<'a, str>, Cow<'a, str>);

/// The meta map, in the TypeScript runner's order (see the [module docs](self)).
pub fn meta(message: &Message) -> Vec<MetaEntry<'_>> {
    let thread = thread_of(message);
    let mut meta: Vec<MetaEntry<'_>> = Vec::with_capacity(9 + message.data.len());
    for (key, value) in [
        ("msg_id", Cow::Borrowed(message.id.as_str())),
        ("level", Cow::Borrowed(message.level.as_str())),
        ("ts", Cow::Owned(format_ts(message.ts))),
        ("ts_ms", Cow::Owned(message.ts.to_string())),
        ("thread", Cow::Borrowed(thread)),
    ] {
        meta.push((Cow::Borrowed(key), value));
    }
    if let Some(from) = message.from.as_deref().filter(|f| !f.is_empty()) {
        meta.push((Cow::Borrowed("from"), Cow::Borrowed(from)));
    }
    if let Some(title) = message.title.as_deref().filter(|t| !t.is_empty()) {
        meta.push((Cow::Borrowed("title"), Cow::Borrowed(title)));
    }
    if let Some(to) = &message.to {
        meta.push((Cow::Borrowed("target"), Cow::Borrowed(to.as_str())));
    }
    if let Some(channel) = thread.strip_prefix("chan:") {
        meta.push((Cow::Borrowed("channel"), Cow::Borrowed(channel)));
    }
    for (key, value) in &message.data {
        let value = match value {
            Value::String(s) => Cow::Borrowed(s.as_str()),
            Value::Number(n) => Cow::Owned(n.to_string()),
            Value::Bool(b) => Cow::Borrowed(if *b { "true" } else { "false" }),
            Value::Null | Value::Array(_) | Value::Object(_) => continue,
        };
        let clean = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let key: Cow<'_, str> = if key.chars().all(clean) {
            Cow::Borrowed(key.as_str())
        } else {
            Cow::Owned(
                key.chars()
                    .map(|c| if clean(c) { c } else { '_' })
                    .collect(),
            )
        };
        if key.is_empty()
            || key.starts_with(|c: char| c.is_ascii_digit())
            || RESERVED_META_KEYS.contains(&key.as_ref())
        {
            continue;
        }
        // A later key overwrites an earlier entry in its place, as assigning to a JS object does.
        match meta.iter_mut().find(|(k, _)| *k == key) {
            Some((_, old)) => *old = value,
            None => meta.push((key, value)),
        }
    }
    meta
}

/// The body, followed by a list of the attachments when there are any (the body itself, not a
/// copy, when there are none).
pub fn content(message: &Message) -> Cow<'_, str> {
    if message.attachments.is_empty() {
        return Cow::Borrowed(&message.body);
    }
    let mut content = message.body.clone();
    content.push_str("\n\nattachments:");
    for a in &message.attachments {
        let _ = write!(
            content,
            "\n- {} ({}, {} bytes, {})",
            a.path, a.name, a.size, a.mime_type
        );
    }
    Cow::Owned(content)
}

/// `notifications/claude/channel` params: `{"content": …, "meta": {…}}`, written straight from
/// the parts (no intermediate JSON tree: this runs once per message a Claude Code agent gets).
pub fn claude_channel_params(message: &Message) -> RawJson {
    struct Meta<'a>(&'a [MetaEntry<'a>]);
    impl serde::Serialize for Meta<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap as _;
            let mut map = s.serialize_map(Some(self.0.len()))?;
            for (k, v) in self.0 {
                map.serialize_entry(k.as_ref(), v.as_ref())?;
            }
            map.end()
        }
    }
    struct Params<'a> {
        content: &'a str,
        meta: Meta<'a>,
    }
    impl serde::Serialize for Params<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeStruct as _;
            let mut params = s.serialize_struct("Params", 2)?;
            params.serialize_field("content", self.content)?;
            params.serialize_field("meta", &self.meta)?;
            params.end()
        }
    }
    let meta = meta(message);
    let content = content(message);
    RawJson::from_value(&Params {
        content: &content,
        meta: Meta(&meta),
    })
    .expect("strings serialize")
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
    let mut ordered: Vec<&MetaEntry<'_>> = CODEX_ORDER
        .iter()
        .filter_map(|name| meta.iter().find(|(k, _)| k == name))
        .collect();
    ordered.extend(
        meta.iter()
            .filter(|(k, _)| !CODEX_ORDER.contains(&k.as_ref())),
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
