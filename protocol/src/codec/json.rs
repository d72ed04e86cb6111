//! Raw JSON values kept byte-exact, and the small JSON writing helpers every encoder shares.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// A JSON value kept as the exact text it arrived as, so relaying it is byte-exact.
///
/// Two `RawJson` are equal when their texts are equal.
#[derive(Clone)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    /// Parses and keeps `text` (which must be one valid JSON value) verbatim.
    pub fn from_text(text: &str) -> Result<Self, serde_json::Error> {
        RawValue::from_string(text.to_owned()).map(Self)
    }

    /// Serializes `value` compactly.
    pub fn from_value<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(Self)
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Whether this is the literal `null`.
    pub fn is_null(&self) -> bool {
        self.get() == "null"
    }

    /// Deserializes the value into `T`.
    pub fn parse<'a, T: Deserialize<'a>>(&'a self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.get())
    }

    /// Keeps a value read from the wire. Line breaks between tokens (a bare `\r` is one to
    /// Node's readline) are removed here, so a decoded value re-encodes byte for byte.
    pub(crate) fn from_raw(raw: &RawValue) -> Self {
        if memchr::memchr2(b'\n', b'\r', raw.get().as_bytes()).is_none() {
            return Self(raw.to_owned());
        }
        let mut compact = Vec::with_capacity(raw.get().len());
        strip_whitespace(&mut compact, raw.get().as_bytes());
        let text = String::from_utf8(compact).expect("removing ASCII whitespace keeps UTF-8");
        Self::from_text(&text).expect("removing whitespace between tokens keeps JSON valid")
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for RawJson {}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl fmt::Display for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(Self)
    }
}

/// The JSON type of a value, as users read it: `null`, `boolean`, `number`, `string`, `array`,
/// `object`.
pub fn kind_name(value: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Why some bytes are not one JSON object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NotObject {
    /// Not UTF-8.
    InvalidUtf8 {
        /// Length of the valid prefix.
        valid_up_to: usize,
    },
    /// Not JSON.
    InvalidJson(String),
    /// JSON, but not an object; `array` tells an array apart.
    NotAnObject {
        /// Whether it is an array.
        array: bool,
    },
}

/// The text of `bytes` if it is UTF-8 that opens a JSON object (after whitespace); otherwise
/// why not, telling text that is not JSON from JSON that is not an object. The caller parses the
/// object itself (and reports a malformed object as invalid JSON).
pub(crate) fn object_text(bytes: &[u8]) -> Result<&str, NotObject> {
    let text = std::str::from_utf8(bytes).map_err(|e| NotObject::InvalidUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    let first = text.trim_start().as_bytes().first().copied();
    if first == Some(b'{') {
        return Ok(text);
    }
    match serde_json::from_str::<serde::de::IgnoredAny>(text) {
        Ok(_) => Err(NotObject::NotAnObject {
            array: first == Some(b'['),
        }),
        Err(e) => Err(NotObject::InvalidJson(e.to_string())),
    }
}

/// Deserializes a field that is present as `Some(raw)`, even when its value is `null`.
/// Used with `#[serde(default, borrow, deserialize_with = "present")]`.
pub(crate) fn present<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(deserializer).map(Some)
}

/// Appends `s` as a JSON string literal.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[run..i]);
        run = i + 1;
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(escape);
        }
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

/// Appends a raw JSON value with every byte of whitespace outside strings removed when it holds
/// a line break (`\n` or `\r`), so the result is guaranteed to stay on one line. Values without
/// one are copied unchanged (the common, byte-exact case).
pub(crate) fn write_raw(out: &mut Vec<u8>, raw: &RawJson) {
    let text = raw.get().as_bytes();
    if memchr::memchr2(b'\n', b'\r', text).is_none() {
        out.extend_from_slice(text);
    } else {
        strip_whitespace(out, text);
    }
}

/// Copies JSON text without the whitespace between tokens. Raw line breaks can only be such
/// whitespace: JSON strings cannot hold them.
fn strip_whitespace(out: &mut Vec<u8>, text: &[u8]) {
    let mut in_string = false;
    let mut escaped = false;
    for &b in text {
        if in_string {
            out.push(b);
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            if b == b'"' {
                in_string = true;
            }
            out.push(b);
        }
    }
}

/// Appends a decimal integer.
pub(crate) fn write_int(out: &mut Vec<u8>, n: impl fmt::Display) {
    use std::io::Write as _;
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{n}");
}

/// Removes `key` from `map` keeping the other keys in their order, whether or not serde_json's
/// `preserve_order` feature is on (`Map::remove` may reorder an insertion-ordered map;
/// `shift_remove` exists only with the feature). Returns the value that was there.
pub fn remove_keeping_order(
    map: &mut serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Option<serde_json::Value> {
    let mut removed = None;
    if map.contains_key(key) {
        map.retain(|k, v| {
            if k == key {
                removed = Some(std::mem::take(v));
                false
            } else {
                true
            }
        });
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_str_matches_serde_json() {
        for s in [
            "",
            "plain",
            "quote\" back\\ nl\n cr\r tab\t",
            "\u{0}\u{1f}\u{7f}",
            "é→😀",
        ] {
            let mut out = Vec::new();
            write_str(&mut out, s);
            let expected = serde_json::to_string(s).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), expected);
        }
    }

    #[test]
    fn write_raw_removes_line_breaks_outside_strings_only() {
        let raw = RawJson::from_text("{\n  \"a\": \"x y\\n\",\r\n  \"b\": [1, 2]\n}").unwrap();
        let mut out = Vec::new();
        write_raw(&mut out, &raw);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":"x y\n","b":[1,2]}"#
        );

        let compact = RawJson::from_text(r#"{"a": 1}"#).unwrap();
        let mut out = Vec::new();
        write_raw(&mut out, &compact);
        assert_eq!(out, br#"{"a": 1}"#);
    }
}
