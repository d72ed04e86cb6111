//! A revoked token: the runner notices, tells the agent and the user, and stops.
//!
//! Rotating a member's token (`ac7 member rotate-token`, `POST /members/<name>/rotate-token`),
//! deleting the token, or removing the member ends the runner's live stream, and every request
//! with the old token gets 401 from then on. Without this watch the runner would retry for ever
//! with backoff, its agent deaf and every tool failing.
//!
//! - Every 401 the runner's broker client gets (the live stream, a tool call, an upload), and
//!   the end of an open live stream (the broker ends a revoked token's streams at once), makes
//!   the [`TokenWatch`](crate::client::token_watch::TokenWatch) confirm with `GET /briefing`, one check at a time: a 401 there means the
//!   token is revoked; any other answer (200, a 5xx, a network error, no answer within
//!   [`CHECK_TIMEOUT`](crate::client::token_watch::CHECK_TIMEOUT)) means it is not, and the 401 is left to the usual retries (a later 401
//!   checks again).
//! - Once revoked, the runner tells the agent (a channel notification for Claude Code and
//!   `ac7 run`, a turn for Codex; every tool call answers with [`revoked_text`]), prints one line
//!   on stderr ([`revoked_line`]), stops the agent as it does on SIGTERM (the agent's process
//!   group, SIGKILL after the grace), cleans up as on every exit, and exits with
//!   [`EXIT_REVOKED`].

use std::time::Duration;

use ac7_protocol::domain::message::{LogLevel, Message};

/// The runner's exit code after its token was revoked (sysexits' `EX_NOPERM`: not the agent's
/// usual codes, nor 1, 2, or 128 + a signal).
pub const EXIT_REVOKED: i32 = 77;

/// How long the agent has to see the notice before it is stopped.
pub const NOTICE_TIME: Duration = Duration::from_secs(2);

/// What to do about it, for people: the two ways to a working token.
fn remedy(member: &str, url: &str) -> String {
    format!(
        "run `ac7 connect --url {url}` to get a new token for this device, or start the runner again with a new token (an admin can issue one: `ac7 member rotate-token {member}`)"
    )
}

/// The one stderr line.
pub fn revoked_line(member: &str, url: &str) -> String {
    format!(
        "ac7: the token of member {member} was revoked at {url} (rotated, deleted, or the member removed); stopping the agent and exiting with code {EXIT_REVOKED}. To rejoin, {}.",
        remedy(member, url)
    )
}

/// What every tool call answers once the token is revoked.
pub fn revoked_text(member: &str, url: &str) -> String {
    format!(
        "ac7: {member}'s token was revoked (rotated, deleted, or the member removed): the broker at {url} refuses it, so no ac7 tool works and no message reaches you any more. This session is ending. Tell the user: {}.",
        remedy(member, url)
    )
}

/// The notice the agent gets as a live event, from `ac7`.
pub fn revoked_notice(member: &str, url: &str) -> Message {
    Message {
        id: "ac7-token-revoked".into(),
        ts: crate::sys::clock::now_ms(),
        to: Some(member.to_owned()),
        from: Some("ac7".into()),
        title: Some("token revoked".into()),
        body: revoked_text(member, url),
        level: LogLevel::Error,
        data: Default::default(),
        attachments: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_texts_name_the_member_and_the_way_back() {
        let line = revoked_line("builder", "http://b:1");
        assert!(!line.contains('\n'));
        for text in [line, revoked_text("builder", "http://b:1")] {
            assert!(text.contains("builder"), "{text}");
            assert!(text.contains("ac7 connect --url http://b:1"), "{text}");
            assert!(text.contains("ac7 member rotate-token builder"), "{text}");
        }
    }
}
