//! Incremental `text/event-stream` parser with a size cap, for the runner's live stream.
//!
//! Feed bytes with [`SseParser::push`]; drain [`SseParser::decode`] until `None`. Follows the
//! WHATWG event-stream rules: `field: value` lines (one leading space of the value removed),
//! `data` lines joined with `\n`, a blank line dispatches the event, lines starting with `:` are
//! comments (keepalives), an `id` without NUL sets the last event id (kept across events, sent
//! back as `Last-Event-ID` on reconnect), `retry` with only digits sets the reconnection delay,
//! a leading byte-order mark is ignored, and an event with no data is not dispatched.
//!
//! Lines end with `\n` or `\r\n` (the shared [`LineDecoder`]); a bare `\r` does not end a line.
//! An event whose lines or data exceed the cap is dropped whole, with bounded memory, and
//! reported once as [`SseItem::Oversized`].

use crate::codec::line::{Line, LineDecoder};

/// Default cap on one line and on one event's data: 4 MiB.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The event type (`message` when the stream gave none).
    pub event: String,
    /// The data lines joined with `\n`.
    pub data: String,
    /// The last event id in force when this event was dispatched, if any.
    pub id: Option<String>,
}

/// One parser outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseItem {
    /// An event.
    Event(SseEvent),
    /// An event too large to keep, dropped whole. `len` counts the bytes of its lines.
    Oversized {
        /// Bytes dropped.
        len: usize,
    },
    /// Bytes that are not UTF-8 were replaced in a line; the event is kept as decoded.
    InvalidUtf8,
}

/// Parser state for one connection.
#[derive(Debug, Clone)]
pub struct SseParser {
    lines: LineDecoder,
    max_event_bytes: usize,
    started: bool,
    event: String,
    data: String,
    has_data: bool,
    /// `Some(len)` while dropping an oversized event.
    dropping: Option<usize>,
    last_event_id: Option<String>,
    retry_ms: Option<u64>,
}

impl SseParser {
    /// A parser capping lines and event data at `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            lines: LineDecoder::new(max_event_bytes),
            max_event_bytes,
            started: false,
            event: String::new(),
            data: String::new(),
            has_data: false,
            dropping: None,
            last_event_id: None,
            retry_ms: None,
        }
    }

    /// Appends bytes from the response body.
    pub fn push(&mut self, bytes: &[u8]) {
        self.lines.push(bytes);
    }

    /// The next item, or `None` when more bytes are needed.
    pub fn decode(&mut self) -> Option<SseItem> {
        loop {
            let item = match self.lines.decode()? {
                Line::Oversized { len } => {
                    self.start_dropping(len);
                    None
                }
                Line::Complete(bytes) => {
                    let mut bytes = bytes;
                    if !self.started {
                        self.started = true;
                        bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
                    }
                    let (line, lossy) = match std::str::from_utf8(bytes) {
                        Ok(line) => (std::borrow::Cow::Borrowed(line), false),
                        Err(_) => (String::from_utf8_lossy(bytes), true),
                    };
                    let line = line.into_owned();
                    let dispatched = self.line(&line);
                    if lossy && dispatched.is_none() {
                        Some(SseItem::InvalidUtf8)
                    } else {
                        dispatched
                    }
                }
            };
            if item.is_some() {
                return item;
            }
        }
    }

    /// The id to send as `Last-Event-ID` when reconnecting.
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref()
    }

    /// The reconnection delay the server asked for, in milliseconds.
    pub fn retry_ms(&self) -> Option<u64> {
        self.retry_ms
    }

    /// Forgets a partly received event (the connection dropped); keeps the last event id.
    pub fn reset_connection(&mut self) {
        let last_event_id = self.last_event_id.take();
        let retry_ms = self.retry_ms;
        *self = Self::new(self.max_event_bytes);
        self.last_event_id = last_event_id;
        self.retry_ms = retry_ms;
    }

    fn line(&mut self, line: &str) -> Option<SseItem> {
        if line.is_empty() {
            return self.dispatch();
        }
        if let Some(dropped) = &mut self.dropping {
            *dropped += line.len() + 1;
            return None;
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = value.to_owned(),
            "data" => {
                if self.data.len() + value.len() + 1 > self.max_event_bytes {
                    let len = self.data.len() + value.len() + 1;
                    self.start_dropping(len);
                    return None;
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "id" if !value.contains('\0') => {
                self.last_event_id = (!value.is_empty()).then(|| value.to_owned());
            }
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry_ms = value.parse().ok();
            }
            _ => {}
        }
        None
    }

    fn start_dropping(&mut self, len: usize) {
        let before = self.data.len() + self.event.len();
        self.event.clear();
        self.data.clear();
        self.has_data = false;
        let so_far = self.dropping.unwrap_or(before);
        self.dropping = Some(so_far + len);
    }

    fn dispatch(&mut self) -> Option<SseItem> {
        let event = std::mem::take(&mut self.event);
        let data = std::mem::take(&mut self.data);
        let has_data = std::mem::replace(&mut self.has_data, false);
        if let Some(len) = self.dropping.take() {
            return Some(SseItem::Oversized { len });
        }
        if !has_data {
            return None;
        }
        Some(SseItem::Event(SseEvent {
            event: if event.is_empty() {
                "message".to_owned()
            } else {
                event
            },
            data,
            id: self.last_event_id.clone(),
        }))
    }
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_EVENT_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::test_support::proptest_config;

    fn parse(chunks: &[&[u8]], cap: usize) -> Vec<SseItem> {
        let mut p = SseParser::new(cap);
        let mut out = Vec::new();
        for chunk in chunks {
            p.push(chunk);
            out.extend(std::iter::from_fn(|| p.decode()));
        }
        out
    }

    fn event(event: &str, data: &str, id: Option<&str>) -> SseItem {
        SseItem::Event(SseEvent {
            event: event.into(),
            data: data.into(),
            id: id.map(str::to_owned),
        })
    }

    #[test]
    fn the_broker_stream_shape() {
        let stream = b": keepalive\n\nid: m-1\nevent: message\ndata: {\"id\":\"m-1\",\"body\":\"hi\"}\n\n:\n\nid: m-2\ndata: {\"id\":\"m-2\"}\n\n";
        assert_eq!(
            parse(&[stream], 1024),
            vec![
                event("message", "{\"id\":\"m-1\",\"body\":\"hi\"}", Some("m-1")),
                event("message", "{\"id\":\"m-2\"}", Some("m-2")),
            ]
        );
    }

    #[test]
    fn spec_details() {
        let stream = "\u{feff}data:a\ndata:  b\r\ndata\nretry: 2500\nretry: x\nevent: ping\nignored: field\n\nid\ndata: c\n\nevent: empty\n\n".as_bytes();
        let mut p = SseParser::new(1024);
        p.push(stream);
        let items: Vec<_> = std::iter::from_fn(|| p.decode()).collect();
        assert_eq!(
            items,
            vec![event("ping", "a\n b\n", None), event("message", "c", None)]
        );
        assert_eq!(p.retry_ms(), Some(2500));
        // An id persists across events; a NUL in it is ignored; an event without data is not
        // dispatched.
        let mut p = SseParser::new(1024);
        p.push(b"id: 7\ndata: x\n\ndata: y\n\nid: a\0b\ndata: z\n\nid: 8\n\n");
        let items: Vec<_> = std::iter::from_fn(|| p.decode()).collect();
        assert_eq!(
            items,
            vec![
                event("message", "x", Some("7")),
                event("message", "y", Some("7")),
                event("message", "z", Some("7"))
            ]
        );
        assert_eq!(p.last_event_id(), Some("8"));
        p.push(b"data: partial");
        p.reset_connection();
        p.push(b"\n\ndata: fresh\n\n");
        let items: Vec<_> = std::iter::from_fn(|| p.decode()).collect();
        assert_eq!(
            items,
            vec![event("message", "fresh", Some("8"))],
            "a reconnect drops the partial event"
        );
    }

    #[test]
    fn oversized_events_are_dropped_whole_with_bounded_memory() {
        let cap = 64;
        let mut p = SseParser::new(cap);
        p.push(b"data: ok\n\n");
        assert_eq!(p.decode(), Some(event("message", "ok", None)));
        p.push(b"id: big\ndata: ");
        for _ in 0..1000 {
            p.push(&[b'x'; 100]);
            assert!(p.decode().is_none());
            assert!(p.lines.buffered_len() < cap);
        }
        p.push(b"\ndata: more\n\ndata: after\n\n");
        let items: Vec<_> = std::iter::from_fn(|| p.decode()).collect();
        assert_eq!(items.len(), 2);
        assert!(matches!(items[0], SseItem::Oversized { len } if len > 100_000));
        assert_eq!(items[1], event("message", "after", Some("big")));

        // Many small data lines that add up past the cap.
        let mut p = SseParser::new(cap);
        for _ in 0..10 {
            p.push(b"data: 0123456789\n");
        }
        p.push(b"\ndata: next\n\n");
        let items: Vec<_> = std::iter::from_fn(|| p.decode()).collect();
        assert!(matches!(items[0], SseItem::Oversized { .. }));
        assert_eq!(items[1], event("message", "next", None));
    }

    proptest! {
        #![proptest_config(proptest_config("sse"))]

        #[test]
        fn chunking_never_changes_the_events(
            events in proptest::collection::vec(("[a-z]{0,6}", proptest::collection::vec("[ -~]{0,30}", 1..4)), 0..8),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let mut stream = String::new();
            for (kind, lines) in &events {
                if !kind.is_empty() {
                    stream.push_str(&format!("event: {kind}\n"));
                }
                for line in lines {
                    stream.push_str(&format!("data: {line}\n"));
                }
                stream.push_str(": keepalive\n\n");
            }
            let bytes = stream.as_bytes();
            let whole = parse(&[bytes], 4096);
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
            points.sort_unstable();
            let mut chunks = Vec::new();
            let mut last = 0;
            for p in points {
                chunks.push(&bytes[last..p]);
                last = p;
            }
            chunks.push(&bytes[last..]);
            prop_assert_eq!(parse(&chunks, 4096), whole.clone());
            let expected: Vec<SseItem> = events
                .iter()
                .map(|(kind, lines)| event(if kind.is_empty() { "message" } else { kind }, &lines.join("\n"), None))
                .collect();
            prop_assert_eq!(whole, expected);
        }
    }
}
