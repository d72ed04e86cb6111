//! The HTTP client for the broker that the runners and the operator verbs share: bearer token
//! and `X-AC7-Protocol: 1` on every request; executes the toolbox's [`Request`]s.
//!
//! **Several brokers.** A client may be given several URLs (replicas of one team, `--url`
//! repeated or `AC7_URL=a,b,c`). It sends to the current one; when the connection is refused
//! (nothing reached that broker) or the broker answers 502, 503 or 504 (a proxy without a
//! backend, a replica without its database: nothing was done), it moves to the next URL and
//! sends the same request there, trying each URL at most once per request. Every clone of a
//! client shares where it is, so the live stream, the tools and the activity uploads of a runner
//! all move together. A timeout or a 500 is not retried elsewhere: the request may have been
//! carried out.
//!
//! **Toolbox requests** ([`BrokerClient::execute`]) to an `http://` broker go over the
//! client's own kept-alive HTTP/1.1 connections; everything else, and every request
//! to an `https://` broker, through reqwest.
//!
//! **A revoked token.** A runner's client carries a [`TokenWatch`]
//! ([`BrokerClient::with_token_watch`]): every 401 it gets makes the watch check the token (see
//! [`super::token_watch`]).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ac7_protocol::domain::toolbox::{Body, Briefing, Method, Request, Response};

use super::plain::{self, Plain};
use super::token_watch::TokenWatch;

/// How long one broker request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A broker (or several replicas of one, see the module docs) reachable with `token`.
#[derive(Debug, Clone)]
pub struct BrokerClient {
    http: reqwest::Client,
    urls: Arc<[String]>,
    /// The same, parsed once (`None` for one that does not parse: requests to it fail as
    /// they would have).
    bases: Arc<[Option<reqwest::Url>]>,
    /// The kept-alive connections of each `http://` URL, for toolbox requests (none when the
    /// token cannot go into a header as it is: reqwest refuses it with its own error).
    plain: Arc<[Option<Plain>]>,
    current: Arc<AtomicUsize>,
    token: String,
    /// A runner's: every 401 makes it check whether the token was revoked.
    token_watch: Option<TokenWatch>,
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
    /// do about it, naming `AC7_CA_CERT` ([`crate::sys::tls_client::certificate_problem`]).
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
        Self::with_urls(&[url.to_owned()], token)
    }

    /// A client for the replicas at `urls`, tried in that order (see the module docs).
    pub fn with_urls(urls: &[String], token: &str) -> Result<Self, TransportError> {
        if urls.is_empty() {
            return Err(TransportError::Setup("no broker URL given".into()));
        }
        let http = crate::sys::tls_client::builder()
            .map_err(|e| TransportError::Setup(e.to_string()))?
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| TransportError::Setup(e.to_string()))?;
        let urls: Arc<[String]> = urls
            .iter()
            .map(|u| u.trim_end_matches('/').to_owned())
            .collect();
        let bases: Arc<[Option<reqwest::Url>]> =
            urls.iter().map(|u| reqwest::Url::parse(u).ok()).collect();
        Ok(Self {
            http,
            plain: bases
                .iter()
                .map(|base| {
                    base.as_ref()
                        .filter(|_| plain::header_safe(token))
                        .and_then(Plain::for_base)
                })
                .collect(),
            bases,
            urls,
            current: Arc::new(AtomicUsize::new(0)),
            token: token.to_owned(),
            token_watch: None,
        })
    }

    /// This client, and every clone made of it from now on, with a [`TokenWatch`]: a 401 from
    /// the broker makes it check whether the token was revoked (see
    /// [`super::token_watch`]).
    pub fn with_token_watch(mut self) -> Self {
        self.token_watch = Some(TokenWatch::default());
        self
    }

    /// The token watch, when [`BrokerClient::with_token_watch`] set one.
    pub fn token_watch(&self) -> Option<&TokenWatch> {
        self.token_watch.as_ref()
    }

    /// A 401 came back, or the live stream ended (the broker ends the streams of a revoked
    /// token at once): the token watch (if any) checks the token.
    pub(crate) fn check_token(&self) {
        if let Some(watch) = &self.token_watch {
            watch.suspect(self);
        }
    }

    /// The base URL requests go to now.
    pub fn url(&self) -> &str {
        &self.urls[self.current.load(Ordering::Relaxed) % self.urls.len()]
    }

    /// Every URL the client knows, in order.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// Moves on from URL number `from` to the next (unless another request already did).
    pub(crate) fn fail_over(&self, from: usize) {
        let n = self.urls.len();
        if n < 2 {
            return;
        }
        let to = (from + 1) % n;
        if self
            .current
            .compare_exchange(from, to, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::warn!(
                from = %self.urls[from],
                to = %self.urls[to],
                "broker not answering; moving to the next URL"
            );
        }
    }

    /// Moves on from the URL requests go to now.
    pub(crate) fn fail_over_current(&self) {
        self.fail_over(self.current.load(Ordering::Relaxed) % self.urls.len());
    }

    /// Sends a request built by `build` from a fresh `method path` request, failing over to
    /// the next URL as the module docs say; the last URL's answer or error is returned.
    pub(crate) async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        build: impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, reqwest::Error> {
        self.failing_over(
            |i| build(self.request_to(i, method.clone(), path)).send(),
            |response| response.status().as_u16(),
            reqwest::Error::is_connect,
        )
        .await
    }

    /// Sends a `GET path` with `headers` whose answer is read as it arrives (a live stream),
    /// without the general client: `None` when that cannot be (a URL that is not plain
    /// `http://`, a proxy, a header that cannot go out as it is), for the caller to use
    /// [`send`](Self::send). Fails over as [`send`](Self::send) does; the answer's head is
    /// awaited at most [`REQUEST_TIMEOUT`].
    pub(crate) async fn open_plain(
        &self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Option<Result<(plain::ResponseHead, plain::Streaming), String>> {
        if self.plain.iter().any(Option::is_none)
            || !headers.iter().all(|(_, v)| plain::header_safe(v))
        {
            return None;
        }
        let opened = self
            .failing_over(
                |i| async move {
                    let plain = self.plain[i].as_ref().expect("every URL is plain");
                    let target = plain.target(path, || {
                        join(
                            self.bases[i].as_ref().expect("a plain URL was parsed"),
                            path,
                        )
                    });
                    let outgoing = plain::Outgoing {
                        method: "GET",
                        target: &target,
                        token: &self.token,
                        headers,
                        body: None,
                    };
                    plain
                        .open(&outgoing, REQUEST_TIMEOUT)
                        .await
                        .map_err(|failure| (i, failure))
                },
                |(head, _)| head.status,
                |(_, failure)| matches!(failure, plain::Failure::Connect(_)),
            )
            .await;
        Some(opened.map_err(|(i, failure)| format!("GET {}{path}: {failure}", self.urls[i])))
    }

    /// Runs `attempt` on the current URL's number, and again on the next URL's while the
    /// answer (`status`) or the error (`refused`: nothing reached the broker) says that broker
    /// did nothing, each URL at most once; a 401 makes the token watch check the token.
    async fn failing_over<T, E, F: Future<Output = Result<T, E>>>(
        &self,
        attempt: impl Fn(usize) -> F,
        status: impl Fn(&T) -> u16,
        refused: impl Fn(&E) -> bool,
    ) -> Result<T, E> {
        let n = self.urls.len();
        let mut tries = 0;
        loop {
            tries += 1;
            let i = self.current.load(Ordering::Relaxed) % n;
            let last = tries >= n;
            match attempt(i).await {
                Ok(answer) if !last && matches!(status(&answer), 502..=504) => self.fail_over(i),
                Err(e) if !last && refused(&e) => self.fail_over(i),
                other => {
                    if matches!(&other, Ok(answer) if status(answer) == 401) {
                        self.check_token();
                    }
                    return other;
                }
            }
        }
    }

    /// The bearer token.
    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// A request builder with the auth and protocol headers, to the current URL.
    pub(crate) fn builder(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.request_to(
            self.current.load(Ordering::Relaxed) % self.urls.len(),
            method,
            path,
        )
    }

    fn request_to(&self, i: usize, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let builder = match &self.bases[i] {
            Some(base) => self.http.request(method, join(base, path)),
            None => self.http.request(method, format!("{}{path}", self.urls[i])),
        };
        builder
            .bearer_auth(&self.token)
            .header("X-AC7-Protocol", "1")
    }

    /// Performs a toolbox request.
    pub async fn execute(&self, request: &Request) -> Result<Response, TransportError> {
        self.failing_over(
            |i| self.execute_on(i, request),
            |response| response.status,
            |failed| failed.refused,
        )
        .await
        .map_err(|failed| failed.error)
    }

    /// One try of a toolbox request, on URL number `i`.
    async fn execute_on(&self, i: usize, request: &Request) -> Result<Response, Failed> {
        let Some(plain) = &self.plain[i] else {
            return self.execute_general(i, request).await;
        };
        if let Body::Bytes { content_type, .. } = &request.body
            && !plain::header_safe(content_type)
        {
            // reqwest refuses it with its own error.
            return self.execute_general(i, request).await;
        }
        let target = plain.target(&request.path, || {
            join(
                self.bases[i].as_ref().expect("a plain URL was parsed"),
                &request.path,
            )
        });
        let json;
        let body = match &request.body {
            Body::Empty => None,
            Body::Json(value) => {
                json = serde_json::to_vec(value).expect("a JSON value serializes");
                Some((json.as_slice(), "application/json"))
            }
            Body::Bytes {
                bytes,
                content_type,
            } => Some((bytes.as_slice(), content_type.as_str())),
        };
        let outgoing = plain::Outgoing {
            method: request.method.as_str(),
            target: &target,
            token: &self.token,
            headers: &[],
            body,
        };
        let url = &self.urls[i];
        match plain.send(&outgoing, REQUEST_TIMEOUT).await {
            Ok((status, body)) => Ok(Response { status, body }),
            Err(failure) => {
                let refused = matches!(failure, plain::Failure::Connect(_));
                let text = format!("{} {url}{}: {failure}", outgoing.method, request.path);
                Err(Failed {
                    refused,
                    error: match failure {
                        plain::Failure::Answer(_) => TransportError::Interrupted(text),
                        _ => TransportError::Unreachable(text),
                    },
                })
            }
        }
    }

    /// One try of a toolbox request through reqwest (an `https://` broker, or a proxy).
    async fn execute_general(&self, i: usize, request: &Request) -> Result<Response, Failed> {
        let method = match request.method {
            Method::Get => reqwest::Method::GET,
            Method::Post => reqwest::Method::POST,
            Method::Patch => reqwest::Method::PATCH,
            Method::Put => reqwest::Method::PUT,
            Method::Delete => reqwest::Method::DELETE,
        };
        let builder = self.request_to(i, method, &request.path);
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
        let response = builder.send().await.map_err(|e| Failed {
            refused: e.is_connect(),
            error: unreachable(&e),
        })?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|e| Failed {
            refused: false,
            error: TransportError::Interrupted(describe(&e)),
        })?;
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
            .send(reqwest::Method::POST, &path, |b| {
                b.header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
            })
            .await
            .map_err(|e| unreachable(&e))?;
        Ok(response.status().as_u16())
    }

    /// `POST /presence/busy {"busy": busy}`; the status. `timeout` bounds the whole request.
    pub async fn set_busy(&self, busy: bool, timeout: Duration) -> Result<u16, TransportError> {
        let response = self
            .send(reqwest::Method::POST, "/presence/busy", |b| {
                b.timeout(timeout)
                    .json(&serde_json::json!({ "busy": busy }))
            })
            .await
            .map_err(|e| unreachable(&e))?;
        Ok(response.status().as_u16())
    }
}

/// A toolbox request that got no answer from one URL.
struct Failed {
    /// Nothing reached that broker: the next URL may be tried.
    refused: bool,
    error: TransportError,
}

/// `base` with `path` (and its query, if any) after its own path: what parsing the two
/// written one after the other gives, without parsing the scheme and host again on every
/// request.
pub(super) fn join(base: &reqwest::Url, path: &str) -> reqwest::Url {
    let (path, query) = match path.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path, None),
    };
    let mut url = base.clone();
    url.set_path(&format!("{}{path}", base.path().trim_end_matches('/')));
    url.set_query(query);
    url
}

/// A request that could not be sent: [`TransportError::Certificate`] when the broker's
/// certificate was refused, else [`TransportError::Unreachable`].
fn unreachable(error: &reqwest::Error) -> TransportError {
    match crate::sys::tls_client::certificate_problem(error) {
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

    use super::{BriefingError, BrokerClient, TransportError, join};

    #[test]
    fn a_joined_url_is_the_one_parsing_base_and_path_gives() {
        let bases = [
            "http://127.0.0.1:8717",
            "https://broker.example:443",
            "https://example.org/ac7",
            "http://[::1]:9000/team/a",
        ];
        let paths = [
            "/roster",
            "/history?with=bob&limit=50",
            "/fs/read/home/ann/a%20b.txt",
            "/fs/ls?path=%2Fhome%2Fann",
            "/objectives?assignee=ann%2Bco&status=active",
            "/objectives/obj-1/discuss",
            "/members/ann",
            "/fs/read/d\u{e9}j\u{e0}/caf\u{e9} 1.txt",
            "/history?q=a b&x=\u{e9}",
        ];
        for base in bases {
            for path in paths {
                let parsed = reqwest::Url::parse(&format!("{base}{path}")).unwrap();
                let joined = join(&reqwest::Url::parse(base).unwrap(), path);
                assert_eq!(joined.as_str(), parsed.as_str(), "{base} + {path}");
            }
        }
    }

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
