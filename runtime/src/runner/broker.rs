//! The runner's HTTP client for the broker: bearer token and `X-AC7-Protocol: 1` on every
//! request; executes the toolbox's [`Request`]s.

use std::time::Duration;

use ac7_protocol::toolbox::{Body, Briefing, Method, Request, Response};

/// How long one broker request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A broker reachable at `url` with `token`.
#[derive(Debug, Clone)]
pub struct BrokerClient {
    http: reqwest::Client,
    url: String,
    token: String,
}

/// Why a broker request failed before any HTTP status came back.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TransportError(pub String);

impl BrokerClient {
    /// A client for the broker at `url` (no trailing slash needed).
    pub fn new(url: &str, token: &str) -> Result<Self, TransportError> {
        let http = crate::tls_client::builder()
            .map_err(|e| TransportError(e.to_string()))?
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| TransportError(e.to_string()))?;
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
        let response = builder.send().await.map_err(describe)?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(describe)?;
        Ok(Response {
            status,
            body: body.to_vec(),
        })
    }

    /// `GET /briefing`.
    pub async fn briefing(&self) -> Result<Briefing, String> {
        let response = self
            .execute(&Request {
                method: Method::Get,
                path: "/briefing".into(),
                body: Body::Empty,
            })
            .await
            .map_err(|e| e.0)?;
        if response.status != 200 {
            return Err(format!(
                "the broker answered {}: {}",
                response.status,
                String::from_utf8_lossy(&response.body)
            ));
        }
        serde_json::from_slice(&response.body)
            .map_err(|e| format!("the briefing is not what ac7 sends: {e}"))
    }
}

impl BrokerClient {
    /// `POST /members/<member>/activity` with an upload body (`{"events":[…]}`); the status.
    pub async fn post_activity(&self, member: &str, body: Vec<u8>) -> Result<u16, TransportError> {
        let path = format!(
            "/members/{}/activity",
            ac7_protocol::toolbox::encode_component(member)
        );
        let response = self
            .builder(reqwest::Method::POST, &path)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(describe)?;
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
            .map_err(describe)?;
        Ok(response.status().as_u16())
    }
}

/// The error chain in one line (reqwest's top-level message alone hides the cause).
pub(crate) fn describe(error: reqwest::Error) -> TransportError {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    TransportError(text)
}
