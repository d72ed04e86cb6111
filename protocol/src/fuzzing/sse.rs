//! The oracle of the `sse` fuzz target: event streams through an [`SseParser`](crate::codec::sse::SseParser).

use super::{Input, MAX_POLLS};

/// Splits `stream` into chunks whose sizes follow a small generator seeded by `seed` (1 to 64
/// bytes, so chunk borders fall inside `\r\n`, inside UTF-8 sequences and inside fields).
fn chunked(stream: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut state = u32::from(seed) | 1;
    let mut chunks = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let size = ((state >> 16) as usize % 64 + 1).min(rest.len());
        let (chunk, tail) = rest.split_at(size);
        chunks.push(chunk);
        rest = tail;
    }
    chunks
}

/// Everything an [`SseParser`] yields for `chunks`, then its last event id and retry.
fn sse_parse(
    cap: usize,
    chunks: &[&[u8]],
) -> (Vec<crate::codec::sse::SseItem>, Option<String>, Option<u64>) {
    let mut parser = crate::codec::sse::SseParser::new(cap);
    let mut items = Vec::new();
    for chunk in chunks {
        parser.push(chunk);
        while let Some(item) = parser.decode() {
            items.push(item);
            assert!(items.len() <= MAX_POLLS, "next() does not terminate");
        }
    }
    (
        items,
        parser.last_event_id().map(str::to_owned),
        parser.retry_ms(),
    )
}

/// Printable ASCII for a field value built from fuzzer bytes (no line ends, no NUL).
fn printable(bytes: &[u8]) -> String {
    bytes.iter().map(|b| char::from(b' ' + b % 95)).collect()
}

/// `sse`: fuzzer bytes through an [`crate::codec::sse::SseParser`]. Byte 0 picks the mode. Even: the
/// rest is a raw stream (byte 1 the cap: `16 + 4 * byte1`; byte 2 the chunking). Odd: the rest
/// describes events (name, data lines, id, comments, `\n` or `\r\n` line ends) that are
/// encoded as `text/event-stream` and parsed under a cap they never reach.
///
/// Oracles: raw — the items, last event id and retry are the same however the stream is
/// chunked; no event's data exceeds the cap; ids hold no NUL; there are no more dispatches (events
/// and oversized drops) than line ends. Encoded — exactly the encoded events come out, in order,
/// with the id in force, whole or chunked.
pub fn sse_stream(data: &[u8]) {
    let mut input = Input::new(data);
    if input.byte().is_multiple_of(2) {
        let cap = 16 + 4 * usize::from(input.byte());
        let seed = input.byte();
        let stream = &data[data.len().min(3)..];
        let whole = sse_parse(cap, &[stream]);
        let parts = sse_parse(cap, &chunked(stream, seed));
        assert_eq!(whole, parts, "chunking changed what the parser saw");
        let line_ends = stream.iter().filter(|b| **b == b'\n').count();
        assert!(whole.0.len() <= line_ends, "more items than line ends");
        for item in &whole.0 {
            if let crate::codec::sse::SseItem::Event(event) = item {
                assert!(event.data.len() <= cap, "event data over the cap");
                assert!(!event.event.is_empty());
                assert!(event.id.as_ref().is_none_or(|id| !id.contains('\0')));
            }
        }
        return;
    }
    let mut stream = String::new();
    let mut expected = Vec::new();
    let mut id: Option<String> = None;
    let seed = input.byte();
    let mut events = 0;
    while !input.is_empty() && events < 64 {
        events += 1;
        let eol = if input.byte().is_multiple_of(2) {
            "\n"
        } else {
            "\r\n"
        };
        let flags = input.byte();
        if flags & 1 != 0 {
            stream.push_str(&format!(":{}{eol}", printable(input.bytes(8))));
        }
        let name = printable(input.bytes(8));
        if flags & 2 != 0 {
            stream.push_str(&format!("event: {name}{eol}"));
        }
        if flags & 4 != 0 {
            let value = printable(input.bytes(8));
            stream.push_str(&format!("id: {value}{eol}"));
            id = (!value.is_empty()).then_some(value);
        }
        let lines: Vec<String> = (0..input.below(4))
            .map(|_| printable(input.bytes(16)))
            .collect();
        for line in &lines {
            stream.push_str(&format!("data: {line}{eol}"));
        }
        stream.push_str(eol);
        if !lines.is_empty() {
            expected.push(crate::codec::sse::SseItem::Event(
                crate::codec::sse::SseEvent {
                    event: if flags & 2 != 0 && !name.is_empty() {
                        name
                    } else {
                        "message".to_owned()
                    },
                    data: lines.join("\n"),
                    id: id.clone(),
                },
            ));
        }
    }
    let cap = crate::codec::sse::DEFAULT_MAX_EVENT_BYTES;
    let whole = sse_parse(cap, &[stream.as_bytes()]);
    assert_eq!(whole.0, expected, "stream:\n{stream}");
    assert_eq!(whole.1, id);
    let parts = sse_parse(cap, &chunked(stream.as_bytes(), seed));
    assert_eq!(parts, whole, "chunking changed what the parser saw");
}
