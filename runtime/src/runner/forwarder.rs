//! The live stream: broker → runner. Subscribes to `GET /subscribe?name=<me>` and hands every
//! message to a sink, in order, once.
//!
//! - `--stream sse` reads `text/event-stream` ([`SseParser`]); `ws` reads one Message per
//!   WebSocket text frame; `auto` (the default) tries SSE and switches to WebSocket for good when
//!   the broker does not answer with an event stream (the TypeScript ac7 broker serves only that).
//! - Reconnects with exponential backoff: 1 s doubling to 30 s, ±20 % jitter, back to 1 s after a
//!   connection that delivered a message or stayed up 10 s. No keepalive for 45 s counts as a
//!   dead connection.
//! - Nothing is lost across a reconnect: the last message id goes back as `Last-Event-ID` (SSE)
//!   or `lastEventId` (WebSocket) and the broker replays what came after it; against a WebSocket
//!   broker that cannot replay, the general feed is backfilled from `/history`. A bounded set of
//!   recent ids keeps any message from being delivered twice.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use ac7_protocol::message::Message;
use ac7_protocol::sse::{SseItem, SseParser};
use futures_util::StreamExt;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite;

use super::broker::{BrokerClient, describe};

/// Which transport to use for the live stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum StreamMode {
    /// SSE first, WebSocket when the broker does not serve SSE.
    #[default]
    Auto,
    /// Server-sent events only.
    Sse,
    /// WebSocket only.
    Ws,
}

const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const HEALTHY_AFTER: Duration = Duration::from_secs(10);
const SILENCE_LIMIT: Duration = Duration::from_secs(45);
const REMEMBERED_IDS: usize = 4096;

/// Where delivered messages go.
pub type Sink = Box<dyn FnMut(Message) + Send>;

/// The forwarder's state between connections.
pub struct Forwarder {
    client: BrokerClient,
    me: String,
    mode: StreamMode,
    sink: Sink,
    last_id: Option<String>,
    last_ts: i64,
    seen: BTreeSet<String>,
    seen_order: VecDeque<String>,
    connected_once: bool,
}

enum Ended {
    /// The stream ended or failed after `delivered` messages.
    Closed { delivered: usize, reason: String },
    /// The broker does not serve SSE here.
    NotSse(String),
    /// Shutting down.
    Shutdown,
}

impl Forwarder {
    /// A forwarder for member `me`.
    pub fn new(client: BrokerClient, me: String, mode: StreamMode, sink: Sink) -> Self {
        Self {
            client,
            me,
            mode,
            sink,
            last_id: None,
            last_ts: 0,
            seen: BTreeSet::new(),
            seen_order: VecDeque::new(),
            connected_once: false,
        }
    }

    /// Runs until `shutdown` turns true.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut backoff = BACKOFF_START;
        loop {
            let started = Instant::now();
            let ended = match self.mode {
                StreamMode::Auto | StreamMode::Sse => self.sse_once(&mut shutdown).await,
                StreamMode::Ws => self.ws_once(&mut shutdown).await,
            };
            let delivered = match ended {
                Ended::Shutdown => return,
                Ended::NotSse(why) if self.mode == StreamMode::Auto => {
                    tracing::info!(why, "broker does not serve SSE; using WebSocket");
                    self.mode = StreamMode::Ws;
                    continue;
                }
                Ended::NotSse(reason) => {
                    tracing::warn!(reason, "live stream refused");
                    0
                }
                Ended::Closed { delivered, reason } => {
                    tracing::warn!(reason, delivered, "live stream ended; reconnecting");
                    delivered
                }
            };
            if delivered > 0 || started.elapsed() >= HEALTHY_AFTER {
                backoff = BACKOFF_START;
            }
            let delay = jitter(backoff);
            backoff = (backoff * 2).min(BACKOFF_MAX);
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = stopping(&mut shutdown) => return,
            }
        }
    }

    async fn sse_once(&mut self, shutdown: &mut watch::Receiver<bool>) -> Ended {
        let mut request = self
            .client
            .builder(
                reqwest::Method::GET,
                &format!(
                    "/subscribe?name={}",
                    ac7_protocol::toolbox::encode_component(&self.me)
                ),
            )
            .header(reqwest::header::ACCEPT, "text/event-stream")
            // A live stream has no end: only the keepalive watchdog below bounds it.
            .timeout(Duration::from_secs(365 * 24 * 3600));
        if let Some(id) = &self.last_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = tokio::select! {
            r = request.send() => r,
            () = stopping(shutdown) => return Ended::Shutdown,
        };
        let mut response = match response {
            Ok(r) => r,
            Err(e) => {
                return Ended::Closed {
                    delivered: 0,
                    reason: describe(e).0,
                };
            }
        };
        let is_sse = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !response.status().is_success() || !is_sse {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            let reason = format!("GET /subscribe answered {status}: {}", body.trim());
            return match status.as_u16() {
                401 | 403 => Ended::Closed {
                    delivered: 0,
                    reason,
                },
                _ => Ended::NotSse(reason),
            };
        }
        self.connected_once = true;
        let mut parser = SseParser::default();
        let mut delivered = 0;
        loop {
            let chunk = tokio::select! {
                c = tokio::time::timeout(SILENCE_LIMIT, response.chunk()) => c,
                () = stopping(shutdown) => return Ended::Shutdown,
            };
            let bytes = match chunk {
                Err(_) => {
                    return Ended::Closed {
                        delivered,
                        reason: "no keepalive for 45 s".into(),
                    };
                }
                Ok(Err(e)) => {
                    return Ended::Closed {
                        delivered,
                        reason: describe(e).0,
                    };
                }
                Ok(Ok(None)) => {
                    return Ended::Closed {
                        delivered,
                        reason: "stream ended".into(),
                    };
                }
                Ok(Ok(Some(bytes))) => bytes,
            };
            parser.push(&bytes);
            while let Some(item) = parser.next() {
                match item {
                    SseItem::Event(event) if event.event == "message" => {
                        match serde_json::from_str::<Message>(&event.data) {
                            Ok(message) => {
                                if self.deliver(message) {
                                    delivered += 1;
                                }
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "dropped a live event that is not a Message")
                            }
                        }
                    }
                    SseItem::Event(_) => {}
                    SseItem::Oversized { len } => {
                        tracing::warn!(len, "dropped an oversized live event")
                    }
                    SseItem::InvalidUtf8 => tracing::warn!("live event with invalid UTF-8"),
                }
            }
        }
    }

    async fn ws_once(&mut self, shutdown: &mut watch::Receiver<bool>) -> Ended {
        let base = self.client.url().replacen("http", "ws", 1);
        let mut url = format!(
            "{base}/subscribe?name={}",
            ac7_protocol::toolbox::encode_component(&self.me)
        );
        if let Some(id) = &self.last_id {
            url.push_str(&format!(
                "&lastEventId={}",
                ac7_protocol::toolbox::encode_component(id)
            ));
        }
        let request =
            match tungstenite::client::IntoClientRequest::into_client_request(url.as_str()) {
                Ok(mut request) => {
                    let headers = request.headers_mut();
                    if let Ok(v) = format!("Bearer {}", self.client.token()).parse() {
                        headers.insert("Authorization", v);
                    }
                    if let Ok(v) = "1".parse() {
                        headers.insert("X-AC7-Protocol", v);
                    }
                    request
                }
                Err(e) => {
                    return Ended::Closed {
                        delivered: 0,
                        reason: e.to_string(),
                    };
                }
            };
        let connected = tokio::select! {
            c = tokio_tungstenite::connect_async(request) => c,
            () = stopping(shutdown) => return Ended::Shutdown,
        };
        let mut socket = match connected {
            Ok((socket, _)) => socket,
            Err(e) => {
                return Ended::Closed {
                    delivered: 0,
                    reason: e.to_string(),
                };
            }
        };
        let mut delivered = 0;
        if self.connected_once {
            delivered += self.backfill().await;
        }
        self.connected_once = true;
        loop {
            let frame = tokio::select! {
                f = tokio::time::timeout(SILENCE_LIMIT, socket.next()) => f,
                () = stopping(shutdown) => {
                    let _ = socket.close(None).await;
                    return Ended::Shutdown;
                }
            };
            match frame {
                Err(_) => {
                    return Ended::Closed {
                        delivered,
                        reason: "no frame or ping for 45 s".into(),
                    };
                }
                Ok(None) => {
                    return Ended::Closed {
                        delivered,
                        reason: "stream ended".into(),
                    };
                }
                Ok(Some(Err(e))) => {
                    return Ended::Closed {
                        delivered,
                        reason: e.to_string(),
                    };
                }
                Ok(Some(Ok(tungstenite::Message::Text(text)))) => {
                    match serde_json::from_str::<Message>(&text) {
                        Ok(message) => {
                            if self.deliver(message) {
                                delivered += 1;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "dropped a live frame that is not a Message")
                        }
                    }
                }
                Ok(Some(Ok(tungstenite::Message::Close(_)))) => {
                    return Ended::Closed {
                        delivered,
                        reason: "closed by the broker".into(),
                    };
                }
                Ok(Some(Ok(_))) => {}
            }
        }
    }

    /// After a WebSocket reconnect: the general feed newer than the last message seen.
    async fn backfill(&mut self) -> usize {
        let request = ac7_protocol::toolbox::Request {
            method: ac7_protocol::toolbox::Method::Get,
            path: "/history?limit=100".into(),
            body: ac7_protocol::toolbox::Body::Empty,
        };
        let Ok(response) = self.client.execute(&request).await else {
            return 0;
        };
        #[derive(serde::Deserialize)]
        struct History {
            messages: Vec<Message>,
        }
        let Ok(history) = serde_json::from_slice::<History>(&response.body) else {
            return 0;
        };
        let last_ts = self.last_ts;
        let mut missed: Vec<Message> = history
            .messages
            .into_iter()
            .filter(|m| m.ts >= last_ts)
            .collect();
        missed.reverse();
        missed
            .into_iter()
            .filter(|m| self.deliver(m.clone()))
            .count()
    }

    /// Hands a message to the sink unless it was delivered before.
    fn deliver(&mut self, message: Message) -> bool {
        self.last_id = Some(message.id.clone());
        self.last_ts = self.last_ts.max(message.ts);
        if !self.seen.insert(message.id.clone()) {
            return false;
        }
        self.seen_order.push_back(message.id.clone());
        if self.seen_order.len() > REMEMBERED_IDS
            && let Some(old) = self.seen_order.pop_front()
        {
            self.seen.remove(&old);
        }
        (self.sink)(message);
        true
    }
}

/// Resolves once shutdown is requested (without holding the watch guard).
async fn stopping(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// `delay` ±20 %.
fn jitter(delay: Duration) -> Duration {
    let mut byte = [0u8; 1];
    let _ = getrandom::fill(&mut byte);
    let factor = 0.8 + 0.4 * f64::from(byte[0]) / 255.0;
    delay.mul_f64(factor)
}
