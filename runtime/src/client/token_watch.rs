//! Whether a client's token still works: every 401 makes the [`TokenWatch`] confirm with
//! `GET /briefing`, one check at a time. A 401 there means the token is revoked (rotated,
//! deleted, or its member removed); any other answer (200, a 5xx, a network error, no answer
//! within [`CHECK_TIMEOUT`]) means it is not, and the 401 is left to the usual retries (a later
//! 401 checks again). What a runner does once its token is revoked is in
//! `runner::revocation`.

use std::sync::Arc;
use std::time::Duration;

use ac7_protocol::domain::toolbox::{Body, Method, Request};
use tokio::sync::watch;

use super::broker::BrokerClient;

/// How long a confirming `GET /briefing` may take before it counts as "not revoked".
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// What a client knows about its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenState {
    /// Accepted, as far as anyone knows.
    Valid,
    /// A 401 came back; `GET /briefing` is asking.
    Checking,
    /// `GET /briefing` answered 401: the token no longer works.
    Revoked,
}

/// Shared by every clone of a [`BrokerClient`] made with
/// [`BrokerClient::with_token_watch`] (see the module docs).
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
}
