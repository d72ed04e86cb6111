//! The oracle of the `decode_lp` fuzz target: length-prefixed frames through an [`LpDecoder`](crate::codec::length_prefixed::LpDecoder).

use super::Input;
use crate::codec::length_prefixed;
use crate::codec::length_prefixed::LpDecoder;

/// `decode_lp`: arbitrary bytes in arbitrary chunks through an [`LpDecoder`].
///
/// Oracles: chunked decoding yields the same payloads and the same fatal error as decoding the
/// whole stream at once; nothing comes out after a fatal error; each payload re-encodes to exactly
/// the bytes it came from; a drained decoder holds at most one partial frame.
pub fn decode_lp(data: &[u8]) {
    let mut input = Input::new(data);
    let max = usize::from(input.byte()) * 2;
    let mut seed = u32::from(input.byte()) | 1;
    let stream = &data[input.pos.min(data.len())..];

    let run = |chunks: &mut dyn FnMut() -> Option<usize>| {
        let mut decoder = LpDecoder::new(max);
        let mut payloads = Vec::new();
        let mut rest = stream;
        let mut failure = None;
        while failure.is_none() && !rest.is_empty() {
            let len = chunks().unwrap_or(rest.len()).clamp(1, rest.len());
            let (chunk, tail) = rest.split_at(len);
            rest = tail;
            decoder.push(chunk);
            loop {
                match decoder.decode() {
                    Ok(Some(payload)) => payloads.push(payload),
                    Ok(None) => {
                        assert!(
                            decoder.buffered_len() < 4 + max,
                            "more than one partial frame held"
                        );
                        break;
                    }
                    Err(error) => {
                        failure = Some(error);
                        break;
                    }
                }
            }
        }
        if failure.is_none() {
            failure = decoder.decode_eof().err();
        }
        (payloads, failure)
    };
    let whole = run(&mut || None);
    let chunked = run(&mut || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        Some(seed as usize % (2 * max + 8))
    });
    assert_eq!(whole, chunked, "chunking changed the outcome");
    let mut reencoded = Vec::new();
    for payload in &whole.0 {
        length_prefixed::encode(payload, &mut reencoded, max).expect("a decoded payload fits");
    }
    assert_eq!(
        &stream[..reencoded.len()],
        &reencoded[..],
        "payloads re-encode to their bytes"
    );
}
