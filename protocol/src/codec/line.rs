//! Capped newline-delimited line splitting, the framing shared by every NDJSON dialect.
//!
//! [`LineDecoder`] is fed arbitrary byte chunks with [`LineDecoder::push`] and drained with
//! [`LineDecoder::decode`] until it returns `None`. Every complete line comes out exactly once,
//! in order, either as its bytes or as a report that it was too long.
//!
//! # The cap
//!
//! `max_line_bytes` bounds a whole line **including its terminating `\n`**, the same measure the
//! encoders use for a frame, so anything an encoder emits under a cap is accepted by a decoder with
//! the same cap. A line whose content (everything before the `\n`, a trailing `\r` included) is
//! `max_line_bytes - 1` bytes long is accepted; one byte more and it is reported as
//! [`Line::Oversized`].
//!
//! Memory stays bounded: once the unterminated tail of the buffer reaches the cap, those bytes are
//! thrown away and the decoder discards until the next `\n`, counting what it skipped. Between a
//! `push` and the `decode` that returns `None`, the buffer holds at most the cap plus the pushed
//! chunk; once drained it holds less than the cap.

use memchr::memchr;

/// The default cap: 1 MiB per line, newline included (`MAX_FRAME_BYTES` of the ac7 IPC protocol).
pub const DEFAULT_MAX_LINE_BYTES: usize = 1024 * 1024;

/// One item out of [`LineDecoder::decode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line<'a> {
    /// A complete line without its `\n` and without one trailing `\r`. May be empty.
    Complete(&'a [u8]),
    /// A line longer than the cap. Its bytes were discarded; `len` counts all of them, the
    /// terminating `\n` included.
    Oversized {
        /// Length of the discarded line in bytes, newline included.
        len: usize,
    },
}

/// Incremental, capped splitter of a byte stream into `\n`-terminated lines.
#[derive(Debug, Clone)]
pub struct LineDecoder {
    buf: Vec<u8>,
    /// First byte of `buf` not yet handed out.
    start: usize,
    /// `buf[start..scanned]` is known to hold no `\n`.
    scanned: usize,
    max_line_bytes: usize,
    /// `Some(n)` while skipping an oversized line of which `n` bytes were already thrown away.
    discarding: Option<usize>,
}

impl LineDecoder {
    /// A decoder with the given cap (bytes per line, newline included; at least 1).
    pub fn new(max_line_bytes: usize) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            max_line_bytes: max_line_bytes.max(1),
            discarding: None,
        }
    }

    /// The cap this decoder enforces.
    pub fn max_line_bytes(&self) -> usize {
        self.max_line_bytes
    }

    /// Appends bytes read from the stream. Drain with [`decode`](Self::decode) afterwards.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete line, or `None` when more bytes are needed.
    pub fn decode(&mut self) -> Option<Line<'_>> {
        if let Some(skipped) = self.discarding {
            return match memchr(b'\n', &self.buf[self.start..]) {
                Some(i) => {
                    self.discarding = None;
                    self.start += i + 1;
                    self.scanned = self.start;
                    Some(Line::Oversized {
                        len: skipped.saturating_add(i + 1),
                    })
                }
                None => {
                    let more = self.buf.len() - self.start;
                    self.discarding = Some(skipped.saturating_add(more));
                    self.reset();
                    None
                }
            };
        }
        match memchr(b'\n', &self.buf[self.scanned..]) {
            Some(i) => {
                let newline = self.scanned + i;
                let begin = self.start;
                let len = newline - begin + 1;
                self.start = newline + 1;
                self.scanned = self.start;
                if len > self.max_line_bytes {
                    return Some(Line::Oversized { len });
                }
                let mut end = newline;
                if end > begin && self.buf[end - 1] == b'\r' {
                    end -= 1;
                }
                Some(Line::Complete(&self.buf[begin..end]))
            }
            None => {
                let tail = self.buf.len() - self.start;
                if tail >= self.max_line_bytes {
                    // Even with a newline next, this line is over the cap: stop buffering it.
                    self.discarding = Some(tail);
                    self.reset();
                } else {
                    self.compact();
                    self.scanned = self.buf.len();
                }
                None
            }
        }
    }

    /// Ends the stream: an unterminated last line is handed out as if it had ended with `\n`
    /// (an oversized one as [`Line::Oversized`]), then the decoder is empty.
    ///
    /// Call after [`decode`](Self::decode) has returned `None`.
    pub fn decode_eof(&mut self) -> Option<Line<'_>> {
        if let Some(skipped) = self.discarding.take() {
            let more = self.buf.len() - self.start;
            self.reset();
            return Some(Line::Oversized {
                len: skipped.saturating_add(more),
            });
        }
        if self.start == self.buf.len() {
            self.reset();
            return None;
        }
        // Terminate the tail and read it as an ordinary line.
        self.buf.push(b'\n');
        let line = self.decode();
        line.map(|line| match line {
            Line::Complete(bytes) => Line::Complete(bytes),
            Line::Oversized { len } => Line::Oversized { len: len - 1 },
        })
    }

    /// Bytes currently held (complete lines not yet drained plus the unterminated tail).
    pub fn buffered_len(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Whether an oversized line is being skipped.
    pub fn is_discarding(&self) -> bool {
        self.discarding.is_some()
    }

    fn reset(&mut self) {
        self.buf.clear();
        self.start = 0;
        self.scanned = 0;
    }

    fn compact(&mut self) {
        if self.start == self.buf.len() {
            self.reset();
        } else if self.start > 0 {
            self.buf.drain(..self.start);
            self.scanned -= self.start;
            self.start = 0;
        }
    }
}

impl Default for LineDecoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_LINE_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(dec: &mut LineDecoder) -> Vec<Result<Vec<u8>, usize>> {
        let mut out = Vec::new();
        while let Some(line) = dec.decode() {
            out.push(match line {
                Line::Complete(b) => Ok(b.to_vec()),
                Line::Oversized { len } => Err(len),
            });
        }
        out
    }

    #[test]
    fn splits_lines_and_strips_one_cr() {
        let mut dec = LineDecoder::new(64);
        dec.push(b"a\nbc\r\n\n\r\r\nrest");
        assert_eq!(
            drain(&mut dec),
            vec![
                Ok(b"a".to_vec()),
                Ok(b"bc".to_vec()),
                Ok(b"".to_vec()),
                Ok(b"\r".to_vec())
            ]
        );
        assert_eq!(dec.buffered_len(), 4);
        dec.push(b"!\n");
        assert_eq!(drain(&mut dec), vec![Ok(b"rest!".to_vec())]);
        assert_eq!(dec.buffered_len(), 0);
    }

    #[test]
    fn boundary_at_cap_minus_one_cap_and_cap_plus_one() {
        let cap = 16;
        for (content, expect) in [
            (cap - 2, Ok(cap - 2)),
            (cap - 1, Ok(cap - 1)),
            (cap, Err(cap + 1)),
            (cap + 1, Err(cap + 2)),
        ] {
            // Whole line in one chunk.
            let mut dec = LineDecoder::new(cap);
            let mut bytes = vec![b'x'; content];
            bytes.push(b'\n');
            dec.push(&bytes);
            let got: Vec<_> = drain(&mut dec)
                .into_iter()
                .map(|r| r.map(|l| l.len()))
                .collect();
            assert_eq!(got, vec![expect], "content {content}, one chunk");
            // Byte by byte.
            let mut dec = LineDecoder::new(cap);
            let mut got = Vec::new();
            for b in &bytes {
                dec.push(std::slice::from_ref(b));
                got.extend(drain(&mut dec).into_iter().map(|r| r.map(|l| l.len())));
                assert!(dec.buffered_len() < cap, "buffer stays under the cap");
            }
            assert_eq!(got, vec![expect], "content {content}, byte by byte");
        }
    }

    #[test]
    fn oversized_line_is_discarded_with_bounded_memory() {
        let cap = 1024;
        let mut dec = LineDecoder::new(cap);
        let mut got = Vec::new();
        for _ in 0..3 * 1024 {
            dec.push(&[b'y'; 1024]);
            got.extend(drain(&mut dec));
            assert!(dec.buffered_len() < cap);
        }
        assert!(dec.is_discarding());
        dec.push(b"tail\nok\n");
        got.extend(drain(&mut dec));
        assert_eq!(got, vec![Err(3 * 1024 * 1024 + 5), Ok(b"ok".to_vec())]);
        assert!(!dec.is_discarding());
    }

    #[test]
    fn finish_yields_the_unterminated_tail() {
        let mut dec = LineDecoder::new(8);
        dec.push(b"one\ntwo");
        assert_eq!(drain(&mut dec), vec![Ok(b"one".to_vec())]);
        assert_eq!(dec.decode_eof(), Some(Line::Complete(b"two")));
        assert_eq!(dec.decode_eof(), None);

        let mut dec = LineDecoder::new(8);
        dec.push(b"0123456789");
        assert_eq!(drain(&mut dec), vec![]);
        assert_eq!(dec.decode_eof(), Some(Line::Oversized { len: 10 }));
        assert_eq!(dec.buffered_len(), 0);

        // Seven bytes fit a cap of 8 once terminated; eight do not.
        let mut dec = LineDecoder::new(8);
        dec.push(b"0123456");
        assert_eq!(drain(&mut dec), vec![]);
        assert_eq!(dec.decode_eof(), Some(Line::Complete(b"0123456")));
    }

    #[test]
    fn utf8_split_across_chunks_is_reassembled() {
        let text = "héllo → wörld\n".as_bytes();
        for split in 0..text.len() {
            let mut dec = LineDecoder::new(64);
            dec.push(&text[..split]);
            let mut got = drain(&mut dec);
            dec.push(&text[split..]);
            got.extend(drain(&mut dec));
            assert_eq!(got, vec![Ok("héllo → wörld".as_bytes().to_vec())]);
        }
    }
}
