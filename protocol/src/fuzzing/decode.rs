//! The oracle of the `decode` fuzz target: IPC frames through a [`FrameDecoder`](crate::codec::frame::FrameDecoder).

use super::{Input, MAX_POLLS};
use crate::codec::frame::{
    Decoded, DropReason, Dropped, FrameDecoder, decode_frame, encode_frame_vec,
};

/// `decode`: arbitrary bytes in arbitrary chunks through a [`FrameDecoder`].
///
/// Oracles: the buffer never exceeds cap + chunk (and is under the cap once drained); the
/// outcomes equal decoding the stream line by line (so each complete line yields exactly one
/// outcome, blank lines none); every decoded frame re-encodes and decodes to the same value.
pub fn decode_chunks(data: &[u8]) {
    let mut input = Input::new(data);
    let cap = 8 + usize::from(input.byte()) * 4;
    let mut seed = u32::from(input.byte()) | 1;
    let stream = &data[input.pos.min(data.len())..];

    let mut decoder = FrameDecoder::new(cap);
    let mut got = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        // xorshift picks chunk sizes from 1 to 2 * cap.
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let len = (seed as usize % (2 * cap)).clamp(1, rest.len());
        let (chunk, tail) = rest.split_at(len);
        rest = tail;
        decoder.push(chunk);
        assert!(
            decoder.buffered_len() <= cap + chunk.len(),
            "buffer exceeds cap + chunk"
        );
        let mut polls = 0;
        while let Some(decoded) = decoder.decode() {
            got.push(decoded);
            polls += 1;
            assert!(polls <= MAX_POLLS);
        }
        assert!(
            decoder.buffered_len() < cap,
            "drained buffer holds less than the cap"
        );
    }
    got.extend(decoder.decode_eof());

    let mut expected = Vec::new();
    let mut lines: Vec<&[u8]> = stream.split(|b| *b == b'\n').collect();
    let tail = lines.pop().unwrap_or_default();
    for line in lines.into_iter().chain((!tail.is_empty()).then_some(tail)) {
        if line.len() + 1 > cap {
            expected.push(Decoded::Dropped(Dropped {
                len: line.len() + 1,
                reason: DropReason::Oversized,
            }));
            continue;
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        expected.push(match decode_frame(line) {
            Ok(frame) => Decoded::Frame(frame),
            Err(reason) => Decoded::Dropped(Dropped {
                len: line.len(),
                reason,
            }),
        });
    }
    // A final unterminated oversized line reports its length without a newline.
    if !tail.is_empty()
        && tail.len() + 1 > cap
        && let Some(Decoded::Dropped(d)) = expected.last_mut()
    {
        d.len = tail.len();
    }
    assert_eq!(
        got, expected,
        "chunked decoding differs from line-by-line decoding"
    );

    for decoded in &got {
        if let Decoded::Frame(frame) = decoded {
            let bytes = encode_frame_vec(frame, usize::MAX).expect("no cap");
            assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 1);
            let again = decode_frame(&bytes[..bytes.len() - 1]).expect("re-encoded frame decodes");
            assert_eq!(&again, frame, "re-encoded frame decodes to the same value");
        }
    }
}
