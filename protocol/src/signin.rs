//! Sign-in and enrollment pieces for the web app and `ac7 connect`,
//! sans-IO: every input carries the time (`now`), nothing here reads a clock, draws random bytes
//! or touches storage — the caller passes random bytes in and persists what it must.
//!
//! * [`totp`]: RFC 6238 TOTP (HMAC-SHA-1, 6 digits, 30 s, ±1 step) with replay refusal, RFC 4648
//!   base32 secrets and the `otpauth://` URI.
//! * [`limiter`]: failed-attempt limiting with doubling lockouts, and the sign-in guard (per
//!   client address, per member, and one team-wide budget for attempts without a name).
//! * [`enroll`]: the device-code enrollment store behind `POST /enroll`, `/enroll/poll` and the
//!   approval screen.

pub mod enroll;
pub mod limiter;
pub mod totp;
