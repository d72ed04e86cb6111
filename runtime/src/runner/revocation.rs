//! A revoked token: the runner notices, tells the agent and the user, and stops.
//!
//! Rotating a member's token (`ac7 member rotate-token`, `POST /members/<name>/rotate-token`),
//! deleting the token, or removing the member ends the runner's live stream, and every request
//! with the old token gets 401 from then on. Without this watch the runner would retry for ever
//! with backoff, its agent deaf and every tool failing.
//!
//! - Every 401 the runner's broker client gets (the live stream, a tool call, an upload), and
//!   the end of an open live stream (the broker ends a revoked token's streams at once), makes
//!   the [`TokenWatch`] confirm with `GET /briefing`, one check at a time: a 401 there means the
//!   token is revoked; any other answer (200, a 5xx, a network error, no answer within
//!   [`CHECK_TIMEOUT`]) means it is not, and the 401 is left to the usual retries (a later 401
//!   checks again).
//! - Once revoked, the runner tells the agent (a channel notification for Claude Code and
//!   `ac7 run`, a turn for Codex; every tool call answers with [`revoked_text`]), prints one line
//!   on stderr ([`revoked_line`]), stops the agent as it does on SIGTERM (the agent's process
//!   group, SIGKILL after the grace), cleans up as on every exit, and exits with
//!   [`EXIT_REVOKED`].

use std::sync::Arc;
use std::time::Duration;

use ac7_protocol::domain::message::{LogLevel, Message};
use ac7_protocol::domain::toolbox::{Body, Method, Request};
use tokio::sync::watch;

use super::broker::BrokerClient;

/// The runner's exit code after its token was revoked (sysexits' `EX_NOPERM`: not the agent's
/// usual codes, nor 1, 2, or 128 + a signal).
pub const EXIT_REVOKED: i32 = 77;

/// How long a confirming `GET /briefing` may take before it counts as "not revoked".
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the agent has to see the notice before it is stopped.
pub const NOTICE_TIME: Duration = Duration::from_secs(2);

/// What the runner knows about its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenState {
    /// Accepted, as far as anyone knows.
    Valid,
    /// A 401 came back; `GET /briefing` is asking.
    Checking,
    /// `GET /briefing` answered 401: the token no longer works.
    Revoked,
}

/// Shared by every clone of a runner's [`BrokerClient`] (see the module docs).
#[derive(Debug, Clone)]
pub struct TokenWatch {
    state: Arc<watch::Sender<TokenState>>,
}

impl Default for TokenWatch {
    fn default() -> Self {
        Self {
            state: Arc::new(watch::Sender::new(TokenState::Valid)),
        }
    }
}

impl TokenWatch {
    /// Changes of the state.
    pub fn subscribe(&self) -> watch::Receiver<TokenState> {
        self.state.subscribe()
    }

    /// Whether the token is known to be revoked.
    pub fn is_revoked(&self) -> bool {
        *self.state.borrow() == TokenState::Revoked
    }

    /// A 401 came back from `client`'s broker: starts a check, unless one is running or the
    /// token is already known to be revoked. Needs a tokio runtime (without one, nothing
    /// happens).
    pub(crate) fn suspect(&self, client: &BrokerClient) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let started = self.state.send_if_modified(|state| {
            if *state == TokenState::Valid {
                *state = TokenState::Checking;
                true
            } else {
                false
            }
        });
        if !started {
            return;
        }
        let state = self.state.clone();
        let client = client.clone();
        runtime.spawn(async move {
            let verdict = check(&client).await;
            if verdict == TokenState::Revoked {
                tracing::warn!("GET /briefing answered 401: the token was revoked");
            } else {
                tracing::info!("a 401 came back, but GET /briefing accepts the token");
            }
            state.send_replace(verdict);
        });
    }

    /// After a 401 from `client`'s broker: whether the token is revoked, once a check says so
    /// (starting one if none runs; bounded by [`CHECK_TIMEOUT`] and a little).
    pub(crate) async fn confirm(&self, client: &BrokerClient) -> bool {
        self.suspect(client);
        let mut rx = self.subscribe();
        let settled = tokio::time::timeout(
            CHECK_TIMEOUT + Duration::from_secs(1),
            rx.wait_for(|s| *s != TokenState::Checking),
        )
        .await;
        matches!(settled, Ok(Ok(state)) if *state == TokenState::Revoked)
    }
}

/// `GET /briefing` with the client's token: [`TokenState::Revoked`] on 401, else
/// [`TokenState::Valid`].
async fn check(client: &BrokerClient) -> TokenState {
    let request = Request {
        method: Method::Get,
        path: "/briefing".into(),
        body: Body::Empty,
    };
    match tokio::time::timeout(CHECK_TIMEOUT, client.execute(&request)).await {
        Ok(Ok(response)) if response.status == 401 => TokenState::Revoked,
        Ok(Ok(response)) => {
            tracing::debug!(status = response.status, "token check");
            TokenState::Valid
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot check the token (the broker is unreachable)");
            TokenState::Valid
        }
        Err(_) => {
            tracing::warn!("cannot check the token (GET /briefing did not answer in time)");
            TokenState::Valid
        }
    }
}

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
        ts: crate::clock::now_ms(),
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
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// An HTTP server on 127.0.0.1 answering every request with `status`; counts requests.
    async fn serve(status: u16) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = count.clone();
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = listener.accept().await.unwrap();
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
                );
                let _ = conn.write_all(reply.as_bytes()).await;
            }
        });
        (url, count)
    }

    #[tokio::test]
    async fn only_a_401_from_the_briefing_means_revoked() {
        let (url, count) = serve(401).await;
        let client = BrokerClient::new(&url, "t").unwrap().with_token_watch();
        let watch = client.token_watch().unwrap().clone();
        assert!(watch.confirm(&client).await);
        assert!(watch.is_revoked());
        // Known: no more checks.
        let before = count.load(std::sync::atomic::Ordering::SeqCst);
        assert!(watch.confirm(&client).await);
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), before);

        for status in [200, 500, 503] {
            let (url, _) = serve(status).await;
            let client = BrokerClient::new(&url, "t").unwrap().with_token_watch();
            let watch = client.token_watch().unwrap().clone();
            assert!(!watch.confirm(&client).await, "{status}");
            assert_eq!(*watch.subscribe().borrow(), TokenState::Valid);
        }
        // Nobody listening: not revoked either.
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let client = BrokerClient::new(&url, "t").unwrap().with_token_watch();
        assert!(!client.token_watch().unwrap().confirm(&client).await);
    }

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
