//! TOTP (RFC 6238) over HOTP (RFC 4226) with HMAC-SHA-1, base32 secrets (RFC 4648) and the
//! `otpauth://totp/…` enrollment URI.
//!
//! Contract:
//! * Production parameters are [`DIGITS`] = 6, [`PERIOD`] = 30 s, [`WINDOW`] = ±1 step, SHA-1.
//! * [`verify`]`(secret, code, now, last_step)` takes `now` in unix seconds and the last time step
//!   this member had a code accepted at (`None` after (re-)enrollment; the caller persists it). It
//!   returns `Ok(step)` — the step to persist as the new `last_step` — when `code` is the code of
//!   one of the steps `floor(now / 30) - 1 ..= floor(now / 30) + 1` **and** that step is after
//!   `last_step`; a code at or before `last_step` is refused as [`TotpError::Replayed`], so a code
//!   seen once (shoulder, proxy log) never signs in twice, and neither does an older one.
//! * Codes are compared in constant time ([`constant_time_eq`]): every candidate step is computed
//!   and compared, whichever matches.
//! * A code that is not exactly six ASCII digits is [`TotpError::Malformed`] (a 400, not a counted
//!   failure, is the caller's choice); a wrong code is [`TotpError::Invalid`].
//! * Secrets: [`new_secret`] takes the caller's 20 random bytes (RFC 4226 §4 recommends 160 bits)
//!   and encodes them in base32 without padding; [`base32_decode`] accepts lower case, spaces and
//!   hyphens (as authenticator apps show and users retype them) and trailing `=`.

use crate::UnixSecs;
use sha1::{Digest, Sha1};
use std::fmt::Write as _;

/// Digits of a production code.
pub const DIGITS: u32 = 6;
/// Length of a time step in seconds.
pub const PERIOD: u64 = 30;
/// Steps accepted either side of the current one (clock skew, typing time).
pub const WINDOW: u64 = 1;
/// Bytes of secret the caller should draw (160 bits, RFC 4226 §4).
pub const SECRET_BYTES: usize = 20;

/// Why a code was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TotpError {
    /// Not exactly [`DIGITS`] ASCII digits.
    #[error("a TOTP code is {DIGITS} digits")]
    Malformed,
    /// No step in the window has this code.
    #[error("invalid code")]
    Invalid,
    /// The code matches a step at or before the last accepted one: it was used already.
    #[error("code already used; wait for the next code")]
    Replayed,
}

/// A base32 text that does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid base32 character {0:?} in the secret")]
pub struct Base32Error(pub char);

const B32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// RFC 4648 base32, upper case, without `=` padding.
pub fn base32_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(B32[((acc >> bits) & 31) as usize] as char);
        }
        acc &= (1 << bits) - 1;
    }
    if bits > 0 {
        out.push(B32[((acc << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// RFC 4648 base32 decode: case-insensitive; spaces, hyphens and trailing `=` are ignored;
/// leftover bits of a partial last character are dropped.
pub fn base32_decode(text: &str) -> Result<Vec<u8>, Base32Error> {
    let mut out = Vec::with_capacity(text.len() * 5 / 8);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.trim_end_matches('=').chars() {
        let v = match c {
            'A'..='Z' => c as u32 - 'A' as u32,
            'a'..='z' => c as u32 - 'a' as u32,
            '2'..='7' => c as u32 - '2' as u32 + 26,
            ' ' | '-' => continue,
            _ => return Err(Base32Error(c)),
        };
        acc = (acc << 5) | v;
        bits += 5;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

/// Encodes the caller's random bytes as a secret (base32, no padding).
pub fn new_secret(random: &[u8; SECRET_BYTES]) -> String {
    base32_encode(random)
}

/// HMAC-SHA-1 (RFC 2104) of `msg` under `key`.
fn hmac_sha1(key: &[u8], msg: &[u8]) -> [u8; 20] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..20].copy_from_slice(&Sha1::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| k.map(|b| b ^ byte);
    let inner = Sha1::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha1::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// HOTP (RFC 4226 §5.3): the `digits`-digit code of `counter`, as a number.
pub fn hotp(key: &[u8], counter: u64, digits: u32) -> u32 {
    let mac = hmac_sha1(key, &counter.to_be_bytes());
    let offset = usize::from(mac[19] & 0x0f);
    let bin = u32::from_be_bytes([
        mac[offset] & 0x7f,
        mac[offset + 1],
        mac[offset + 2],
        mac[offset + 3],
    ]);
    bin % 10u32.pow(digits)
}

/// The time step of `now` (unix seconds).
pub fn step_of(now: UnixSecs) -> u64 {
    now / PERIOD
}

/// The `digits`-digit TOTP code at `now` (unix seconds), zero-padded.
pub fn code_at(key: &[u8], now: UnixSecs, digits: u32) -> String {
    format!(
        "{:0width$}",
        hotp(key, step_of(now), digits),
        width = digits as usize
    )
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Verifies a production code (6 digits); see the module docs for the contract.
pub fn verify(
    key: &[u8],
    code: &str,
    now: UnixSecs,
    last_step: Option<u64>,
) -> Result<u64, TotpError> {
    verify_digits(key, code, now, last_step, DIGITS)
}

/// [`verify`] with a chosen number of digits (the RFC vectors use 8).
pub fn verify_digits(
    key: &[u8],
    code: &str,
    now: UnixSecs,
    last_step: Option<u64>,
    digits: u32,
) -> Result<u64, TotpError> {
    if code.len() != digits as usize || !code.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TotpError::Malformed);
    }
    let current = step_of(now);
    let mut matched: Option<u64> = None;
    // Every candidate is computed and compared, whichever matches, so timing tells nothing
    // about which step (if any) matched.
    for step in current.saturating_sub(WINDOW)..=current.saturating_add(WINDOW) {
        let expected = format!(
            "{:0width$}",
            hotp(key, step, digits),
            width = digits as usize
        );
        if constant_time_eq(expected.as_bytes(), code.as_bytes()) {
            matched = Some(matched.map_or(step, |m: u64| m.max(step)));
        }
    }
    let step = matched.ok_or(TotpError::Invalid)?;
    match last_step {
        Some(last) if step <= last => Err(TotpError::Replayed),
        _ => Ok(step),
    }
}

/// Everything but RFC 3986's unreserved characters (letters, digits, `-._~`).
const NOT_UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(s: &str, out: &mut String) {
    out.extend(percent_encoding::utf8_percent_encode(s, NOT_UNRESERVED));
}

/// The `otpauth://totp/<issuer>:<account>?secret=…&issuer=…&algorithm=SHA1&digits=6&period=30`
/// URI an authenticator app reads (from a QR code or pasted). Issuer and account are
/// percent-encoded (a `:` or space inside either stays part of it); `secret` is base32.
pub fn otpauth_uri(issuer: &str, account: &str, secret_b32: &str) -> String {
    let mut uri = String::from("otpauth://totp/");
    percent_encode(issuer, &mut uri);
    uri.push(':');
    percent_encode(account, &mut uri);
    uri.push_str("?secret=");
    percent_encode(secret_b32, &mut uri);
    uri.push_str("&issuer=");
    percent_encode(issuer, &mut uri);
    let _ = write!(uri, "&algorithm=SHA1&digits={DIGITS}&period={PERIOD}");
    uri
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RFC_KEY: &[u8] = b"12345678901234567890";

    #[test]
    fn rfc4226_appendix_d_hotp_vectors() {
        let expected = [
            755224, 287082, 359152, 969429, 338314, 254676, 287922, 162583, 399871, 520489,
        ];
        for (counter, code) in expected.iter().enumerate() {
            assert_eq!(hotp(RFC_KEY, counter as u64, 6), *code, "counter {counter}");
        }
    }

    #[test]
    fn rfc4226_appendix_d_hmac_values() {
        // The intermediate HMAC-SHA-1 of counter 0 and 1 (Appendix D table).
        let hex = |m: [u8; 20]| m.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(
            hex(hmac_sha1(RFC_KEY, &0u64.to_be_bytes())),
            "cc93cf18508d94934c64b65d8ba7667fb7cde4b0"
        );
        assert_eq!(
            hex(hmac_sha1(RFC_KEY, &1u64.to_be_bytes())),
            "75a48a19d4cbe100644e8ac1397eea747a2d33ab"
        );
    }

    #[test]
    fn hmac_with_key_longer_than_a_block() {
        // RFC 2202 test case 6: 80-byte key of 0xaa.
        let mac = hmac_sha1(
            &[0xaa; 80],
            b"Test Using Larger Than Block-Size Key - Hash Key First",
        );
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "aa4ae5e15272d00e95705637ce8a3b55ed402112");
    }

    #[test]
    fn rfc6238_appendix_b_sha1_vectors() {
        let vectors = [
            (59, "94287082"),
            (1111111109, "07081804"),
            (1111111111, "14050471"),
            (1234567890, "89005924"),
            (2000000000, "69279037"),
            (20000000000, "65353130"),
        ];
        for (t, code) in vectors {
            assert_eq!(code_at(RFC_KEY, t, 8), code, "T = {t}");
            assert_eq!(verify_digits(RFC_KEY, code, t, None, 8), Ok(t / 30));
        }
    }

    #[test]
    fn window_boundaries() {
        let now = 1_700_000_000u64; // step 56666666, 20 s into it
        let step = step_of(now) as i64;
        for (delta, accepted) in [(-2i64, false), (-1, true), (0, true), (1, true), (2, false)] {
            let code = code_at(RFC_KEY, ((step + delta) as u64) * PERIOD, DIGITS);
            let got = verify(RFC_KEY, &code, now, None);
            if accepted {
                assert_eq!(got, Ok((step + delta) as u64), "delta {delta}");
            } else {
                assert_eq!(got, Err(TotpError::Invalid), "delta {delta}");
            }
        }
        // The first and last second of a step see the same window.
        let start = step_of(now) * PERIOD;
        let prev = code_at(RFC_KEY, start - PERIOD, DIGITS);
        assert!(verify(RFC_KEY, &prev, start, None).is_ok());
        assert!(verify(RFC_KEY, &prev, start + PERIOD - 1, None).is_ok());
        assert_eq!(
            verify(RFC_KEY, &prev, start + PERIOD, None),
            Err(TotpError::Invalid)
        );
    }

    #[test]
    fn replay_is_refused() {
        let now = 1_700_000_000u64;
        let code = code_at(RFC_KEY, now, DIGITS);
        let step = verify(RFC_KEY, &code, now, None).expect("first use");
        assert_eq!(
            verify(RFC_KEY, &code, now, Some(step)),
            Err(TotpError::Replayed)
        );
        // Still refused a step later, while it is inside the window as "previous".
        assert_eq!(
            verify(RFC_KEY, &code, now + PERIOD, Some(step)),
            Err(TotpError::Replayed)
        );
        // An older code, still in the window, is refused too.
        let older = code_at(RFC_KEY, now - PERIOD, DIGITS);
        assert_eq!(
            verify(RFC_KEY, &older, now, Some(step)),
            Err(TotpError::Replayed)
        );
        // The next step's code is accepted.
        let next = code_at(RFC_KEY, now + PERIOD, DIGITS);
        assert_eq!(
            verify(RFC_KEY, &next, now + PERIOD, Some(step)),
            Ok(step + 1)
        );
    }

    #[test]
    fn malformed_codes() {
        for code in ["", "12345", "1234567", "12a456", " 123456", "１２３４５６"] {
            assert_eq!(
                verify(RFC_KEY, code, 59, None),
                Err(TotpError::Malformed),
                "{code:?}"
            );
        }
    }

    #[test]
    fn constant_time_comparison() {
        assert!(constant_time_eq(b"123456", b"123456"));
        assert!(!constant_time_eq(b"123456", b"123457"));
        assert!(!constant_time_eq(b"923456", b"123456"));
        assert!(!constant_time_eq(b"12345", b"123456"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn base32_rfc4648_vectors() {
        let vectors = [
            ("", ""),
            ("f", "MY"),
            ("fo", "MZXQ"),
            ("foo", "MZXW6"),
            ("foob", "MZXW6YQ"),
            ("fooba", "MZXW6YTB"),
            ("foobar", "MZXW6YTBOI"),
        ];
        for (plain, enc) in vectors {
            assert_eq!(base32_encode(plain.as_bytes()), enc);
            assert_eq!(base32_decode(enc).as_deref(), Ok(plain.as_bytes()));
        }
        assert_eq!(
            base32_decode("mzxw6ytboi======").as_deref(),
            Ok(&b"foobar"[..])
        );
        assert_eq!(base32_decode("MZXW 6YTB-OI").as_deref(), Ok(&b"foobar"[..]));
        assert_eq!(base32_decode("MZXW1"), Err(Base32Error('1')));
        assert_eq!(new_secret(&[0; SECRET_BYTES]).len(), 32);
    }

    #[test]
    fn otpauth_uri_is_percent_encoded() {
        assert_eq!(
            otpauth_uri("ac7-my team", "al:ice@x", "JBSWY3DPEHPK3PXP"),
            "otpauth://totp/ac7-my%20team:al%3Aice%40x?secret=JBSWY3DPEHPK3PXP\
             &issuer=ac7-my%20team&algorithm=SHA1&digits=6&period=30"
        );
        assert_eq!(
            otpauth_uri("é&=", "a/b?", "AB"),
            "otpauth://totp/%C3%A9%26%3D:a%2Fb%3F?secret=AB&issuer=%C3%A9%26%3D\
             &algorithm=SHA1&digits=6&period=30"
        );
    }

    proptest! {
        #![proptest_config(crate::test_support::proptest_config("signin_totp"))]

        #[test]
        fn base32_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let enc = base32_encode(&bytes);
            prop_assert!(!enc.contains('='));
            prop_assert_eq!(base32_decode(&enc), Ok(bytes.clone()));
            prop_assert_eq!(base32_decode(&enc.to_ascii_lowercase()), Ok(bytes));
        }

        #[test]
        fn accepted_step_is_always_after_last(now in 0u64..40_000_000_000, last in 0u64..1_400_000_000, delta in 0u64..3) {
            let step = (step_of(now) + delta).saturating_sub(1);
            let code = code_at(RFC_KEY, step * PERIOD, DIGITS);
            if let Ok(accepted) = verify(RFC_KEY, &code, now, Some(last)) {
                prop_assert!(accepted > last);
            }
        }
    }
}
