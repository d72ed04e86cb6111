//! The runner's HTTP client for the broker: bearer token and `X-AC7-Protocol: 1` on every
//! request; executes the toolbox's [`Request`]s.

use std::time::Duration;

use ac7_protocol::domain::toolbox::{Body, Briefing, Method, Request, Response};

/// How long one broker request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A broker reachable at `url` with `token`.
#[derive(Debug, Clone)]
pub struct BrokerClient {
    http: reqwest::Client,
    url: String,
    token: String,
}

/// Why a broker request failed before any HTTP status came back, split by where the fault
/// lies (each carries the whole error chain in one line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// Ours or the local setup: the HTTP client could not be built (TLS roots, `AC7_CA_CERT`).
    #[error("{0}")]
    Setup(String),
    /// The network or the broker: the request could not be sent (refused, DNS, timeout).
    #[error("{0}")]
    Unreachable(String),
    /// The broker's TLS certificate was refused (not trusted, or not for this host): what to
    /// do about it, naming `AC7_CA_CERT` ([`crate::tls_client::certificate_problem`]).
    #[error("{0}")]
    Certificate(String),
    /// The broker: the answer broke off or could not be read.
    #[error("{0}")]
    Interrupted(String),
}

/// Why `GET /briefing` gave no briefing, split by where the fault lies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BriefingError {
    /// The broker could not be asked (see [`TransportError`]).
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The broker refused (most often the token: unknown, revoked, or for another broker).
    #[error("the broker answered {status}: {body}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The broker's body, as text.
        body: String,
    },
    /// The broker sent something that is not a briefing.
    #[error("the briefing is not what ac7 sends: {0}")]
    Malformed(String),
}

impl BrokerClient {
    /// A client for the broker at `url` (no trailing slash needed).
    pub fn new(url: &str, token: &str) -> Result<Self, TransportError> {
        let http = crate::tls_client::builder()
            .map_err(|e| TransportError::Setup(e.to_string()))?
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| TransportError::Setup(e.to_string()))?;
        Ok(Self {
            http,
            url: url.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
        })
    }

    /// The broker's base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The bearer token.
    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// A request builder with the auth and protocol headers.
    pub(crate) fn builder(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .header("X-AC7-Protocol", "1")
    }

    /// Performs a toolbox request.
    pub async fn execute(&self, request: &Request) -> Result<Response, TransportError> {
        let method = match request.method {
            Method::Get => reqwest::Method::GET,
            Method::Post => reqwest::Method::POST,
            Method::Patch => reqwest::Method::PATCH,
            Method::Put => reqwest::Method::PUT,
            Method::Delete => reqwest::Method::DELETE,
        };
        let builder = self.builder(method, &request.path);
        let builder = match &request.body {
            Body::Empty => builder,
            Body::Json(value) => builder.json(value),
            Body::Bytes {
                bytes,
                content_type,
            } => builder
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(bytes.clone()),
        };
        let response = builder.send().await.map_err(|e| unreachable(&e))?;
        let status = response.status().as_u16();
        let body = response
            .bytes()
            .await
            .map_err(|e| TransportError::Interrupted(describe(&e)))?;
        Ok(Response {
            status,
            body: body.to_vec(),
        })
    }

    /// `GET /briefing`.
    pub async fn briefing(&self) -> Result<Briefing, BriefingError> {
        let response = self
            .execute(&Request {
                method: Method::Get,
                path: "/briefing".into(),
                body: Body::Empty,
            })
            .await?;
        if response.status != 200 {
            return Err(BriefingError::Refused {
                status: response.status,
                body: String::from_utf8_lossy(&response.body).into_owned(),
            });
        }
        serde_json::from_slice(&response.body).map_err(|e| BriefingError::Malformed(e.to_string()))
    }
}

impl BrokerClient {
    /// `POST /members/<member>/activity` with an upload body (`{"events":[…]}`); the status.
    pub async fn post_activity(&self, member: &str, body: Vec<u8>) -> Result<u16, TransportError> {
        let path = format!(
            "/members/{}/activity",
            ac7_protocol::domain::toolbox::encode_component(member)
        );
        let response = self
            .builder(reqwest::Method::POST, &path)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| unreachable(&e))?;
        Ok(response.status().as_u16())
    }

    /// `POST /presence/busy {"busy": busy}`; the status. `timeout` bounds the whole request.
    pub async fn set_busy(&self, busy: bool, timeout: Duration) -> Result<u16, TransportError> {
        let response = self
            .builder(reqwest::Method::POST, "/presence/busy")
            .timeout(timeout)
            .json(&serde_json::json!({ "busy": busy }))
            .send()
            .await
            .map_err(|e| unreachable(&e))?;
        Ok(response.status().as_u16())
    }
}

/// A request that could not be sent: [`TransportError::Certificate`] when the broker's
/// certificate was refused, else [`TransportError::Unreachable`].
fn unreachable(error: &reqwest::Error) -> TransportError {
    match crate::tls_client::certificate_problem(error) {
        Some(problem) => TransportError::Certificate(problem),
        None => TransportError::Unreachable(describe(error)),
    }
}

/// The error chain in one line (reqwest's top-level message alone hides the cause).
pub(crate) fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::{BriefingError, BrokerClient, TransportError};

    /// A one-shot HTTP server on 127.0.0.1 that answers `reply` to the first request.
    async fn serve_once(reply: &'static str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).await;
            let _ = conn.write_all(reply.as_bytes()).await;
        });
        url
    }

    #[tokio::test]
    async fn briefing_errors_say_whose_fault_it_is() {
        // Nobody listening: the broker cannot be reached.
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let err = BrokerClient::new(&url, "t")
            .unwrap()
            .briefing()
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                BriefingError::Transport(TransportError::Unreachable(_))
            ),
            "{err:?}"
        );
        // The broker refuses the token.
        let url = serve_once(
            "HTTP/1.1 401 Unauthorized\r\ncontent-length: 27\r\nconnection: close\r\n\r\n{\"error\":\"unknown token\"}\n\n",
        )
        .await;
        let err = BrokerClient::new(&url, "t")
            .unwrap()
            .briefing()
            .await
            .unwrap_err();
        assert_eq!(
            err,
            BriefingError::Refused {
                status: 401,
                body: "{\"error\":\"unknown token\"}\n\n".into()
            }
        );
        assert_eq!(
            err.to_string(),
            "the broker answered 401: {\"error\":\"unknown token\"}\n\n"
        );
        // Something that is not a broker.
        let url =
            serve_once("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi").await;
        let err = BrokerClient::new(&url, "t")
            .unwrap()
            .briefing()
            .await
            .unwrap_err();
        assert!(matches!(err, BriefingError::Malformed(_)), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("the briefing is not what ac7 sends: ")
        );
    }
}
