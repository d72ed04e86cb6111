//! Credential redaction for traced exchanges.
//!
//! [`redact_text`] replaces, anywhere in a string, with `[REDACTED]`:
//!
//! - API keys: `sk-…` (covers `sk-ant-…`, `sk-proj-…`, `sk-svcacct-…`; 20+ key characters),
//!   AWS `AKIA…`, GitHub `ghp_`/`gho_`/`ghu_`/`ghs_`/`ghr_`/`github_pat_…`, Slack `xox?-…`;
//! - JWTs (`eyJ….….…`, e.g. OAuth access and id tokens);
//! - the token after `Bearer ` / `Basic ` (the scheme word is kept);
//! - the values of credential query or form parameters (`key=`, `api_key=`, `token=`,
//!   `access_token=`, `refresh_token=`, `client_secret=`, `password=`, …) after `?`, `&`, `;`,
//!   whitespace or the start of the string;
//! - the string values of credential keys written as JSON text (`"access_token": "…"`), which
//!   catches them in bodies too large or too broken to parse.
//!
//! Key patterns only match at a word start (the character before is not a letter or digit), so
//! `task-0123…` is not mistaken for a key. [`redact_json`] applies [`redact_text`] to every string
//! of a JSON value and replaces the whole value of a credential key (`password`, `api_key`,
//! `refresh_token`, …). [`redact_header`] replaces the value of credential headers
//! (`authorization`, `x-api-key`, `cookie`, …, and any name containing `token`, `secret`,
//! `auth`, `session`, `password` or `api-key`) and scrubs the others.
//!
//! Unlike the TypeScript runner this is applied to every part of a record (system prompts, tool
//! definitions, URLs too), and previews are redacted before they are cut, so a key straddling
//! the cut cannot survive in part.

use std::borrow::Cow;

use serde_json::Value;

/// What a secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// What is appended to a cut preview.
pub const TRUNCATED_MARK: &str = "…[truncated]";

/// Header names whose whole value is a credential (lower case).
const SECRET_HEADERS: [&str; 8] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "x-anthropic-api-key",
    "x-goog-api-key",
    "cookie",
    "set-cookie",
];

/// A header whose name contains one of these is a credential too.
const SECRET_HEADER_PARTS: [&str; 6] =
    ["token", "secret", "auth", "session", "password", "api-key"];

/// Query, form and JSON keys whose value is a credential (lower case, `-` read as `_`).
const SECRET_KEYS: [&str; 22] = [
    "key",
    "api_key",
    "apikey",
    "x_api_key",
    "token",
    "access_token",
    "refresh_token",
    "id_token",
    "auth_token",
    "session_token",
    "bearer_token",
    "auth",
    "authorization",
    "client_secret",
    "secret",
    "secret_key",
    "private_key",
    "password",
    "passwd",
    "code",
    "sig",
    "signature",
];

fn is_secret_key(key: &str) -> bool {
    key.len() <= 32
        && SECRET_KEYS.iter().any(|k| {
            k.len() == key.len()
                && k.bytes().zip(key.bytes()).all(|(a, b)| {
                    let b = b.to_ascii_lowercase();
                    a == b || (a == b'_' && b == b'-')
                })
        })
}

/// Keys that name a credential in a URL or a form but are ordinary words elsewhere.
fn is_ambiguous_key(key: &str) -> bool {
    ["code", "sig", "signature", "key", "auth"]
        .iter()
        .any(|k| k.eq_ignore_ascii_case(key))
}

/// Whether a JSON object key holds a credential (the ambiguous ones do not).
fn is_secret_json_key(key: &str) -> bool {
    is_secret_key(key) && !is_ambiguous_key(key)
}

/// Whether a header's value is a credential as a whole.
pub fn is_secret_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_HEADERS.contains(&name.as_str()) || SECRET_HEADER_PARTS.iter().any(|p| name.contains(p))
}

/// A header value as recorded: `[REDACTED]` for credential headers, else scrubbed.
pub fn redact_header(name: &str, value: &str) -> String {
    if is_secret_header(name) {
        REDACTED.to_owned()
    } else {
        redact_text(value).into_owned()
    }
}

/// Replaces every credential in `text` (see the module docs).
pub fn redact_text(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some((keep, end)) = secret_at(bytes, i) {
            let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
            out.push_str(&text[copied..i + keep]);
            out.push_str(REDACTED);
            copied = end;
            i = end;
        } else {
            i += 1;
        }
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut out) => {
            out.push_str(&text[copied..]);
            Cow::Owned(out)
        }
    }
}

fn is_key_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

fn run(bytes: &[u8], from: usize, pred: impl Fn(u8) -> bool) -> usize {
    bytes[from.min(bytes.len())..]
        .iter()
        .take_while(|b| pred(**b))
        .count()
}

fn starts_with_ci(bytes: &[u8], at: usize, prefix: &[u8]) -> bool {
    bytes
        .get(at..at + prefix.len())
        .is_some_and(|s| s.eq_ignore_ascii_case(prefix))
}

/// A key prefix, the fewest key characters after it, and which characters those are.
type KeyPattern = (&'static [u8], usize, fn(u8) -> bool);

/// A secret starting at `i`: `(bytes to keep before the replaced part, end of the secret)`.
fn secret_at(bytes: &[u8], i: usize) -> Option<(usize, usize)> {
    let word_start = i == 0 || !bytes[i - 1].is_ascii_alphanumeric();
    let b = bytes[i];
    if word_start {
        // API keys with a known prefix and a minimum number of key characters after it.
        let prefixed: [KeyPattern; 5] = [
            (b"sk-", 20, is_key_char),
            (b"github_pat_", 20, |c| {
                c.is_ascii_alphanumeric() || c == b'_'
            }),
            (b"AKIA", 16, |c| {
                c.is_ascii_uppercase() || c.is_ascii_digit()
            }),
            (b"xox", 12, |c| c.is_ascii_alphanumeric() || c == b'-'),
            (b"gh", 22, |c| c.is_ascii_alphanumeric() || c == b'_'),
        ];
        for (prefix, min, pred) in prefixed {
            if bytes[i..].starts_with(prefix) {
                let n = run(bytes, i + prefix.len(), pred);
                let ok = match prefix {
                    b"xox" => {
                        n >= min
                            && matches!(bytes[i + 3], b'b' | b'a' | b'p' | b'r' | b's')
                            && bytes.get(i + 4) == Some(&b'-')
                    }
                    b"gh" => {
                        n >= min
                            && matches!(bytes[i + 2], b'p' | b'o' | b'u' | b's' | b'r')
                            && bytes.get(i + 3) == Some(&b'_')
                    }
                    _ => n >= min,
                };
                if ok {
                    return Some((0, i + prefix.len() + n));
                }
            }
        }
        if bytes[i..].starts_with(b"eyJ")
            && let Some(end) = jwt_end(bytes, i)
        {
            return Some((0, end));
        }
        for scheme in [&b"bearer"[..], b"basic"] {
            if starts_with_ci(bytes, i, scheme) {
                let spaces = run(bytes, i + scheme.len(), |c| c == b' ' || c == b'\t');
                let start = i + scheme.len() + spaces;
                let n = run(bytes, start, |c| {
                    c.is_ascii_alphanumeric() || b"._~+/=-".contains(&c)
                });
                // A token has a digit or is long: `bearer instrument` is prose.
                let token = &bytes[start..start + n];
                if spaces > 0 && n >= 8 && (n >= 24 || token.iter().any(u8::is_ascii_digit)) {
                    return Some((scheme.len() + spaces, start + n));
                }
            }
        }
    }
    // `name=value` after `?`, `&`, `;`, whitespace or the start; the ambiguous names
    // (`code=`, `key=`, …) only in a query or form (after `?`, `&` or `;`).
    let in_query = i > 0 && matches!(bytes[i - 1], b'?' | b'&' | b';');
    let param_start = in_query || i == 0 || matches!(bytes[i - 1], b' ' | b'\t' | b'\n');
    if param_start && b.is_ascii_alphabetic() {
        let name_len = run(bytes, i, is_key_char);
        if bytes.get(i + name_len) == Some(&b'=')
            && let Ok(name) = std::str::from_utf8(&bytes[i..i + name_len])
            && is_secret_key(name)
            && (in_query || !is_ambiguous_key(name))
        {
            let start = i + name_len + 1;
            let n = run(bytes, start, |c| {
                !c.is_ascii_whitespace() && !b"&#\"'<>;".contains(&c)
            });
            if n > 0 && !bytes[start..].starts_with(REDACTED.as_bytes()) {
                return Some((name_len + 1, start + n));
            }
        }
    }
    // `"secret_key": "value"` in JSON text.
    if b == b'"' {
        let name_len = run(bytes, i + 1, is_key_char);
        if bytes.get(i + 1 + name_len) == Some(&b'"')
            && let Ok(name) = std::str::from_utf8(&bytes[i + 1..i + 1 + name_len])
            && is_secret_json_key(name)
        {
            let mut j = i + 2 + name_len;
            j += run(bytes, j, |c| c.is_ascii_whitespace());
            if bytes.get(j) == Some(&b':') {
                j += 1;
                j += run(bytes, j, |c| c.is_ascii_whitespace());
                if bytes.get(j) == Some(&b'"') {
                    let start = j + 1;
                    let mut k = start;
                    while k < bytes.len() && bytes[k] != b'"' {
                        k += if bytes[k] == b'\\' { 2 } else { 1 };
                    }
                    let end = k.min(bytes.len());
                    if end > start && !bytes[start..].starts_with(REDACTED.as_bytes()) {
                        return Some((start - i, end));
                    }
                }
            }
        }
    }
    None
}

/// The end of a JWT starting at `i` (three base64url segments, the first two of 5+ characters).
fn jwt_end(bytes: &[u8], i: usize) -> Option<usize> {
    let b64 = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
    let first = run(bytes, i, b64);
    if first < 5 || bytes.get(i + first) != Some(&b'.') {
        return None;
    }
    let second_start = i + first + 1;
    let second = run(bytes, second_start, b64);
    if second < 5 || bytes.get(second_start + second) != Some(&b'.') {
        return None;
    }
    let third_start = second_start + second + 1;
    Some(third_start + run(bytes, third_start, b64))
}

/// Redacts every string of `value` in place, and the whole value of credential keys.
pub fn redact_json(value: &mut Value) {
    match value {
        Value::String(s) => {
            if let Cow::Owned(redacted) = redact_text(s) {
                *s = redacted;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_json),
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if is_secret_json_key(key) && !v.is_null() && !v.is_object() && !v.is_array() {
                    *v = Value::String(REDACTED.to_owned());
                } else {
                    redact_json(v);
                }
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// `text` redacted, then cut to at most `max_chars` characters with [`TRUNCATED_MARK`]
/// appended when cut.
pub fn preview(text: &str, max_chars: usize) -> String {
    let redacted = redact_text(text);
    match redacted.char_indices().nth(max_chars) {
        None => redacted.into_owned(),
        Some((cut, _)) => {
            let mut out = redacted[..cut].to_owned();
            out.push_str(TRUNCATED_MARK);
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn patterns() {
        let cases = [
            (
                "key sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123",
                "key [REDACTED]",
            ),
            ("x=sk-proj-ABCDEFGHIJ_klmnopqrst-0123456789", "x=[REDACTED]"),
            (
                "task-0123456789abcdefghijklmnop stays",
                "task-0123456789abcdefghijklmnop stays",
            ),
            ("sk-short", "sk-short"),
            (
                "Authorization: Bearer abc.def-123456",
                "Authorization: Bearer [REDACTED]",
            ),
            ("bearer of news", "bearer of news"),
            ("the bearer instrument", "the bearer instrument"),
            ("a basic understanding", "a basic understanding"),
            ("Bearer abcdefghijklmnopqrstuvwxyzABCD", "Bearer [REDACTED]"),
            ("exit code=1 token=t0k", "exit code=1 token=[REDACTED]"),
            ("GET /x?key=AIzaSy123&b=2", "GET /x?key=[REDACTED]&b=2"),
            ("/cb?code=abc&state=s", "/cb?code=[REDACTED]&state=s"),
            (
                "grant_type=refresh_token&refresh_token=rt_1.2&client_id=c",
                "grant_type=refresh_token&refresh_token=[REDACTED]&client_id=c",
            ),
            ("monkey=1", "monkey=1"),
            ("AKIAIOSFODNN7EXAMPLE!", "[REDACTED]!"),
            ("ghp_0123456789abcdefghijABCDEFGHIJ", "[REDACTED]"),
            ("xoxb-1234567890-abcdefghij", "[REDACTED]"),
            (
                "t eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig_nature-x end",
                "t [REDACTED] end",
            ),
            (
                "{\"access_token\": \"opaque-value\", \"n\": 1}",
                "{\"access_token\": \"[REDACTED]\", \"n\": 1}",
            ),
            ("{\"password\":\"a\\\"b\"}", "{\"password\":\"[REDACTED]\"}"),
        ];
        for (input, expected) in cases {
            assert_eq!(redact_text(input), expected, "{input}");
        }
        // Idempotent.
        for (input, _) in cases {
            let once = redact_text(input).into_owned();
            assert_eq!(redact_text(&once), once);
        }
    }

    #[test]
    fn json_and_headers() {
        let mut value = json!({"a": ["sk-ant-api03-abcdefghijklmnopqrstuvwxyz"], "refresh_token": "rt",
            "password": 1234, "code": "print()", "nested": {"apiKey": "k", "api-key": "k2"}});
        redact_json(&mut value);
        assert_eq!(
            value,
            json!({"a": ["[REDACTED]"], "refresh_token": "[REDACTED]", "password": "[REDACTED]",
                "code": "print()", "nested": {"apiKey": "[REDACTED]", "api-key": "[REDACTED]"}})
        );
        assert_eq!(redact_header("X-Api-Key", "anything"), REDACTED);
        assert_eq!(redact_header("x-amz-security-token", "v"), REDACTED);
        assert_eq!(
            redact_header("user-agent", "ua sk-abcdefghijklmnopqrstuvwx"),
            "ua [REDACTED]"
        );
    }

    #[test]
    fn previews_are_redacted_before_the_cut() {
        let text = format!("{}sk-ant-api03-{}", "a ".repeat(10), "z".repeat(40));
        let p = preview(&text, 25);
        assert!(!p.contains("sk-ant"), "{p}");
        assert!(p.ends_with(TRUNCATED_MARK));
        assert_eq!(preview("short", 25), "short");
        assert_eq!(preview("ééé", 2), format!("éé{TRUNCATED_MARK}"));
    }
}
