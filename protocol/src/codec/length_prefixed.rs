//! Length-prefixed framing (the `call_tool` dialect's): a 4-byte big-endian payload length, then the payload.
//!
//! The cap is inclusive (a payload of exactly [`MAX_PAYLOAD_BYTES`] is accepted) and is checked
//! on the prefix, before any of the payload is waited for or stored. Unlike line framing there
//! is no way to resynchronise after a bad prefix, so an over-cap prefix — and a stream that ends
//! inside a frame — is a fatal [`LpError`] for the connection.

/// 10,485,760 bytes: the largest payload.
pub const MAX_PAYLOAD_BYTES: usize = 10 * 1024 * 1024;

/// The stream can no longer be trusted; close the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LpError {
    /// A length prefix over the cap.
    #[error("frame length {len} exceeds the {max}-byte limit")]
    TooLarge {
        /// The announced payload length.
        len: usize,
        /// The cap.
        max: usize,
    },
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame ({got} of {expected} bytes)")]
    Truncated {
        /// Bytes the frame needed (prefix included).
        expected: usize,
        /// Bytes that arrived.
        got: usize,
    },
}

/// The encoder refused a payload over the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("payload of {len} bytes exceeds the {max}-byte limit")]
pub struct PayloadTooLarge {
    /// Payload length.
    pub len: usize,
    /// The cap.
    pub max: usize,
}

/// Appends one frame (prefix + payload) to `out` if the payload fits the cap.
pub fn encode(payload: &[u8], out: &mut Vec<u8>, max: usize) -> Result<(), PayloadTooLarge> {
    let len = payload.len();
    if len > max || u32::try_from(len).is_err() {
        return Err(PayloadTooLarge { len, max });
    }
    out.reserve(4 + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// Incremental decoder of length-prefixed frames.
#[derive(Debug, Clone)]
pub struct LpDecoder {
    buf: Vec<u8>,
    start: usize,
    max: usize,
    failed: Option<LpError>,
}

impl LpDecoder {
    /// A decoder accepting payloads up to `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            max,
            failed: None,
        }
    }

    /// Appends bytes read from the stream (ignored once the stream has failed).
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed.is_none() {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// The next payload, `Ok(None)` when more bytes are needed, or the fatal error (repeated on
    /// every later call).
    pub fn decode(&mut self) -> Result<Option<Vec<u8>>, LpError> {
        if let Some(error) = self.failed {
            return Err(error);
        }
        let available = &self.buf[self.start..];
        let Some(prefix) = available.first_chunk::<4>() else {
            self.compact();
            return Ok(None);
        };
        let len = u32::from_be_bytes(*prefix) as usize;
        if len > self.max {
            return Err(self.fail(LpError::TooLarge { len, max: self.max }));
        }
        if available.len() < 4 + len {
            self.compact();
            return Ok(None);
        }
        let payload = available[4..4 + len].to_vec();
        self.start += 4 + len;
        Ok(Some(payload))
    }

    /// The stream ended: an error if it stopped inside a frame. Call after `decode` gave `Ok(None)`.
    pub fn decode_eof(&mut self) -> Result<(), LpError> {
        if let Some(error) = self.failed {
            return Err(error);
        }
        let got = self.buf.len() - self.start;
        if got == 0 {
            return Ok(());
        }
        let expected = match self.buf[self.start..].first_chunk::<4>() {
            Some(prefix) => 4 + u32::from_be_bytes(*prefix) as usize,
            None => 4,
        };
        Err(self.fail(LpError::Truncated { expected, got }))
    }

    /// Bytes held.
    pub fn buffered_len(&self) -> usize {
        self.buf.len() - self.start
    }

    fn fail(&mut self, error: LpError) -> LpError {
        self.failed = Some(error);
        self.buf = Vec::new();
        self.start = 0;
        error
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }
}

impl Default for LpDecoder {
    fn default() -> Self {
        Self::new(MAX_PAYLOAD_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::test_support::proptest_config;

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(payload, &mut out, usize::MAX).unwrap();
        out
    }

    #[test]
    fn cap_is_inclusive_and_checked_on_the_prefix() {
        let max = 16;
        for (len, ok) in [(max - 1, true), (max, true), (max + 1, false)] {
            let payload = vec![b'x'; len];
            let mut out = Vec::new();
            assert_eq!(encode(&payload, &mut out, max).is_ok(), ok, "encode {len}");
            let mut dec = LpDecoder::new(max);
            dec.push(&frame(&payload));
            match dec.decode() {
                Ok(Some(p)) => assert!(ok && p == payload),
                Err(LpError::TooLarge { len: l, max: m }) => assert!(!ok && l == len && m == max),
                other => panic!("{other:?}"),
            }
        }
        // The prefix alone is enough to refuse: nothing of the payload is awaited.
        let mut dec = LpDecoder::new(max);
        dec.push(&((max as u32) + 1).to_be_bytes());
        assert_eq!(dec.decode(), Err(LpError::TooLarge { len: max + 1, max }));
        assert_eq!(dec.buffered_len(), 0);
        dec.push(b"more");
        assert_eq!(
            dec.decode(),
            Err(LpError::TooLarge { len: max + 1, max }),
            "fatal stays fatal"
        );
    }

    #[test]
    fn the_default_cap_is_ten_mebibytes() {
        let mut dec = LpDecoder::default();
        dec.push(&(10_485_760u32).to_be_bytes());
        assert_eq!(
            dec.decode(),
            Ok(None),
            "exactly the cap is accepted and awaited"
        );
        let mut dec = LpDecoder::default();
        dec.push(&(10_485_761u32).to_be_bytes());
        assert!(matches!(dec.decode(), Err(LpError::TooLarge { .. })));
    }

    #[test]
    fn truncated_stream_and_empty_frames() {
        let mut dec = LpDecoder::new(64);
        dec.push(&frame(b""));
        dec.push(&frame(b"abc")[..5]);
        assert_eq!(dec.decode(), Ok(Some(Vec::new())));
        assert_eq!(dec.decode(), Ok(None));
        assert_eq!(
            dec.decode_eof(),
            Err(LpError::Truncated {
                expected: 7,
                got: 5
            })
        );
        let mut dec = LpDecoder::new(64);
        dec.push(&[0, 0]);
        assert_eq!(dec.decode(), Ok(None));
        assert_eq!(
            dec.decode_eof(),
            Err(LpError::Truncated {
                expected: 4,
                got: 2
            })
        );
        let mut dec = LpDecoder::new(64);
        assert_eq!(dec.decode_eof(), Ok(()));
    }

    proptest! {
        #![proptest_config(proptest_config("length_prefixed"))]

        #[test]
        fn any_chunking_yields_the_same_payloads(
            payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 0..10),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let stream: Vec<u8> = payloads.iter().flat_map(|p| frame(p)).collect();
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
            points.sort_unstable();
            points.push(stream.len());
            let mut dec = LpDecoder::new(64);
            let mut got = Vec::new();
            let mut last = 0;
            let mut failed = None;
            for p in points {
                dec.push(&stream[last..p]);
                last = p;
                loop {
                    match dec.decode() {
                        Ok(Some(payload)) => got.push(payload),
                        Ok(None) => break,
                        Err(e) => { failed = Some(e); break; }
                    }
                }
                // Drained: at most one partial frame is held.
                prop_assert!(dec.buffered_len() < 4 + 64);
            }
            // Everything before the first over-cap payload comes out, then the stream fails.
            let ok: Vec<Vec<u8>> = payloads.iter().take_while(|p| p.len() <= 64).cloned().collect();
            prop_assert_eq!(&got, &ok);
            prop_assert_eq!(failed.is_some(), ok.len() < payloads.len());
            if failed.is_none() {
                prop_assert_eq!(dec.decode_eof(), Ok(()));
            }
        }
    }
}
