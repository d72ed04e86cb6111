//! The live stream: broker → runner. Subscribes to `GET /subscribe?name=<me>` and hands every
//! message to a sink, in order, once.
//!
//! A thin driver of [`ac7_protocol::session::live::LiveStream`], which decides everything (reconnect
//! backoff with jitter, the silence watchdog, the last event id, dedupe, when and what to
//! backfill from `/history` after a reset): this file opens connections, reads frames, runs
//! `/history` requests and keeps the time.
//!
//! - `--stream sse` reads `text/event-stream` ([`SseParser`]); `ws` reads one frame per
//!   WebSocket text frame; `auto` (the default) tries SSE and switches to WebSocket for good when
//!   the broker does not answer with an event stream (the TypeScript ac7 broker serves only that).
//! - Every subscription says where this runner runs (`X-AC7-Runner: host=…;pid=…`), which the
//!   broker shows on `/roster`; a 401 on a connect, and the end of an open stream, make the
//!   client's token watch check whether the token was revoked ([`super::revocation`]).
//! - `AC7_RECONNECT_BASE_MS` (undocumented, for tests) replaces the 1 s first reconnect delay;
//!   the longest delay stays 30 times the first.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use ac7_protocol::codec::sse::{SseItem, SseParser};
use ac7_protocol::domain::message::Message;
use ac7_protocol::session::live::{
    HistoryQuery, LiveConfig, LiveFrame, LiveOutput, LiveStream, REPLAY_HEADER, RUNNER_HEADER,
};
use futures_util::StreamExt;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::sys::clock::sleep_until;
use tokio_tungstenite::tungstenite;

use crate::client::broker::{BrokerClient, describe};

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

/// The environment variable that sets the first reconnect delay in milliseconds (tests).
pub const RECONNECT_BASE_ENV: &str = "AC7_RECONNECT_BASE_MS";

/// Where delivered messages go.
pub type Sink = Box<dyn FnMut(Message) + Send>;

/// What every agent does with a live message: objective events wake the objectives tracker,
/// the member's own chat is not echoed back, everything else goes to `forward` (which renders it
/// for the agent: a Claude channel notification, a Codex turn). The Claude Code and Codex
/// runners both route through here.
pub fn agent_sink(
    me: String,
    tracker: super::tracker::TrackerHandle,
    mut forward: impl FnMut(&Message) + Send + 'static,
) -> Sink {
    use ac7_protocol::domain::channel;
    Box::new(move |message| {
        if channel::is_objective_event(&message) {
            tracker.trigger();
        }
        if !channel::suppress_self_echo(&message, &me) {
            forward(&message);
        }
    })
}

type WsStream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One open connection.
enum Conn {
    Sse(Box<(reqwest::Response, SseParser)>),
    /// An event stream from a plain `http://` broker, read off its socket without the general
    /// client (its connection task and body channel cost a wake-up of their own per event).
    PlainSse(Box<(crate::client::plain::Streaming, SseParser)>),
    Ws(Box<WsStream>),
}

type Opening =
    Pin<Box<dyn Future<Output = (StreamMode, Result<(Conn, bool, Option<i64>), String>)> + Send>>;
type Fetching = Pin<Box<dyn Future<Output = (u64, Result<Vec<Message>, String>)> + Send>>;

/// Where a runner that starts picks up: after the last message the broker delivered to its
/// member (the durable cursor), at most `cap` of what came since handed to the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    /// The id of the last message delivered to any of the member's live streams; `None`: from
    /// the log's first message (nothing was ever delivered to the member).
    pub after_id: Option<String>,
    /// Missed messages handed on at most; one notice counts the rest.
    pub cap: usize,
}

/// The most missed messages read at start (ten pages).
const MISSED_MAX: usize = 1000;

/// The forwarder: the machine, its driver state, and the sink.
pub struct Forwarder {
    client: BrokerClient,
    me: String,
    mode: StreamMode,
    sink: Sink,
    config: LiveConfig,
    resume: Option<Resume>,
}

impl Forwarder {
    /// A forwarder for member `me`, resuming where `resume` says (else from now).
    pub fn new(
        client: BrokerClient,
        me: String,
        mode: StreamMode,
        sink: Sink,
        resume: Option<Resume>,
    ) -> Self {
        let mut config = LiveConfig::default();
        if let Some(ms) = std::env::var(RECONNECT_BASE_ENV)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|ms| *ms > 0)
        {
            config.backoff_start = Duration::from_millis(ms);
            config.backoff_max = config.backoff_start * 30;
        }
        let mut seed = [0u8; 8];
        let _ = getrandom::fill(&mut seed);
        config.seed = u64::from_le_bytes(seed);
        Self {
            client,
            me,
            mode,
            sink,
            config,
            resume,
        }
    }

    /// Hands the agent what the member missed since `resume.after_id` (the oldest `cap` of it,
    /// then a notice counting the rest); returns the id the live stream resumes after (`None`
    /// when it resumed from the start and the log had nothing for it).
    async fn catch_up(&mut self, resume: Resume) -> Option<String> {
        use ac7_protocol::domain::channel;
        let mut after = resume.after_id.clone();
        let mut missed: Vec<Message> = Vec::new();
        let mut full = false;
        loop {
            let query = HistoryQuery {
                id: 0,
                before_ts: None,
                // From the start: every message has a positive timestamp.
                after_ts: after.is_none().then_some(0),
                after_id: after.clone(),
                limit: 100,
            };
            match fetch(self.client.clone(), query).await {
                (_, Ok(page)) => {
                    let short = page.len() < 100;
                    if let Some(last) = page.last() {
                        after = Some(last.id.clone());
                    }
                    missed.extend(page);
                    if missed.len() >= MISSED_MAX {
                        full = true;
                        break;
                    }
                    if short {
                        break;
                    }
                }
                (_, Err(reason)) => {
                    // The live stream's replay still brings them, uncapped.
                    tracing::warn!(reason, "cannot read the messages missed while away");
                    return resume.after_id;
                }
            }
        }
        let for_agent: Vec<Message> = missed
            .into_iter()
            .filter(|m| !channel::suppress_self_echo(m, &self.me))
            .collect();
        let total = for_agent.len();
        let rest = total.saturating_sub(resume.cap);
        for message in for_agent.into_iter().take(resume.cap) {
            (self.sink)(message);
        }
        if rest > 0 || full {
            let more = if full {
                format!("{rest} or more")
            } else {
                rest.to_string()
            };
            let body = format!(
                "{more} more messages reached you while no runner was live; call `recent` to read them."
            );
            (self.sink)(Message {
                id: format!("missed-{}", after.as_deref().unwrap_or_default()),
                ts: crate::sys::clock::now_ms(),
                to: Some(self.me.clone()),
                from: Some("ac7".to_owned()),
                title: Some("missed messages".to_owned()),
                body,
                level: ac7_protocol::domain::message::LogLevel::Notice,
                data: serde_json::Map::new(),
                attachments: Vec::new(),
            });
        }
        if total > 0 {
            tracing::info!(
                from = resume
                    .after_id
                    .as_deref()
                    .map_or("the start".to_owned(), |id| format!("after_id={id}")),
                delivered = total.min(resume.cap),
                more = rest,
                "handed the agent what its member missed while no runner was live"
            );
        }
        after
    }

    /// Runs until `shutdown` turns true.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        if let Some(resume) = self.resume.take() {
            self.config.resume_from = self.catch_up(resume).await;
        }
        let mut machine = LiveStream::new(self.config.clone(), Instant::now().into_std());
        let mut conn: Option<Conn> = None;
        let mut opening: Option<Opening> = None;
        let mut fetching: Option<Fetching> = None;
        loop {
            while let Some(output) = machine.poll_output() {
                match output {
                    LiveOutput::Deliver(message) => (self.sink)(message),
                    LiveOutput::Connect { last_event_id } => {
                        opening = Some(Box::pin(open(
                            self.client.clone(),
                            self.me.clone(),
                            self.mode,
                            last_event_id,
                        )));
                    }
                    LiveOutput::Disconnect { reason } => {
                        tracing::warn!(reason, "dropping the live stream");
                        close(conn.take()).await;
                        opening = None;
                        fetching = None;
                    }
                    LiveOutput::Fetch(query) => {
                        fetching = Some(Box::pin(fetch(self.client.clone(), query)));
                    }
                    LiveOutput::Backfilled { from, delivered } => {
                        tracing::info!(from, delivered, "backfilled the live stream from /history");
                    }
                    LiveOutput::Backoff { delay, reason } => {
                        tracing::warn!(
                            reason,
                            delay_ms = delay.as_millis() as u64,
                            "live stream ended; reconnecting"
                        );
                        close(conn.take()).await;
                        fetching = None;
                    }
                    other => tracing::warn!(
                        ?other,
                        "live stream: an output this version does not handle"
                    ),
                }
            }
            let deadline = machine.poll_timeout().map(Instant::from_std);
            tokio::select! {
                () = stopping(&mut shutdown) => {
                    machine.shutdown(Instant::now().into_std());
                    close(conn.take()).await;
                    return;
                }
                () = sleep_until(deadline) => machine.handle_timeout(Instant::now().into_std()),
                (mode, result) = maybe(&mut opening) => {
                    opening = None;
                    if mode != self.mode {
                        tracing::info!("broker does not serve SSE; using WebSocket");
                        self.mode = mode;
                    }
                    let now = Instant::now().into_std();
                    match result {
                        Ok((opened, replays, broker_ms)) => {
                            conn = Some(opened);
                            machine.handle_connected(replays, broker_ms, now);
                        }
                        Err(reason) => machine.handle_closed(&reason, now),
                    }
                }
                (query, result) = maybe(&mut fetching) => {
                    fetching = None;
                    let now = Instant::now().into_std();
                    match result {
                        Ok(messages) => machine.handle_history(query, messages, now),
                        Err(reason) => machine.handle_history_failed(query, &reason, now),
                    }
                }
                result = next_frames(&mut conn) => {
                    let now = Instant::now().into_std();
                    match result {
                        Ok(frames) => {
                            for frame in frames {
                                if let LiveFrame::Reset(reset) = &frame {
                                    tracing::info!(
                                        last_event_id = reset.last_event_id,
                                        reason = ?reset.reason,
                                        detail = reset.detail,
                                        "the broker reset the live stream: it cannot replay after the last event id, so the runner backfills from /history"
                                    );
                                }
                                machine.handle_frame(frame, now);
                            }
                        }
                        Err(reason) => {
                            conn = None;
                            // Revoking a token ends its streams at once: check it now rather
                            // than at the next connect, which may be up to 30 s away.
                            self.client.check_token();
                            machine.handle_closed(&reason, now);
                        }
                    }
                }
            }
        }
    }
}

/// Resolves once shutdown is requested (without holding the watch guard).
async fn stopping(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// The pending future's output; never resolves when there is none.
async fn maybe<T>(future: &mut Option<Pin<Box<dyn Future<Output = T> + Send>>>) -> T {
    match future {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

async fn close(conn: Option<Conn>) {
    if let Some(Conn::Ws(mut socket)) = conn {
        let _ = tokio::time::timeout(Duration::from_secs(1), socket.close(None)).await;
    }
}

/// Opens the stream with `mode` (falling back from SSE to WebSocket under `auto`); returns the
/// mode in use and the connection with whether the broker replays.
async fn open(
    client: BrokerClient,
    me: String,
    mode: StreamMode,
    last_id: Option<String>,
) -> (StreamMode, Result<(Conn, bool, Option<i64>), String>) {
    match mode {
        StreamMode::Ws => (mode, open_ws(&client, &me, last_id.as_deref()).await),
        StreamMode::Auto | StreamMode::Sse => {
            match open_sse(&client, &me, last_id.as_deref()).await {
                Err(Refused::NotSse(why)) if mode == StreamMode::Auto => {
                    tracing::debug!(why, "no SSE here");
                    (
                        StreamMode::Ws,
                        open_ws(&client, &me, last_id.as_deref()).await,
                    )
                }
                Err(Refused::NotSse(reason) | Refused::Failed(reason)) => (mode, Err(reason)),
                Ok(opened) => (mode, Ok(opened)),
            }
        }
    }
}

enum Refused {
    /// The broker does not serve SSE here.
    NotSse(String),
    /// Anything else.
    Failed(String),
}

/// The most bytes of a refusal's body kept for the log.
const REFUSAL_TEXT_MAX: usize = 4096;

async fn open_sse(
    client: &BrokerClient,
    me: &str,
    last_id: Option<&str>,
) -> Result<(Conn, bool, Option<i64>), Refused> {
    let path = format!(
        "/subscribe?name={}",
        ac7_protocol::domain::toolbox::encode_component(me)
    );
    let runner = super::lifecycle::this_runner().to_header();
    let mut headers = vec![
        ("accept", "text/event-stream"),
        (RUNNER_HEADER, runner.as_str()),
    ];
    if let Some(id) = last_id {
        headers.push(("last-event-id", id));
    }
    if let Some(opened) = client.open_plain(&path, &headers).await {
        let (head, stream) = opened.map_err(Refused::Failed)?;
        let found = |name: &str| ac7_protocol::codec::http1::header(&head.headers, name);
        let is_sse = found("content-type").is_some_and(|v| v.starts_with("text/event-stream"));
        if !(200..300).contains(&head.status) || !is_sse {
            let body = stream.text(REFUSAL_TEXT_MAX).await;
            return Err(refusal(head.status, &body));
        }
        return Ok((
            Conn::PlainSse(Box::new((stream, SseParser::default()))),
            found(REPLAY_HEADER).is_some(),
            found("date").and_then(date_ms),
        ));
    }
    let response = client
        .send(reqwest::Method::GET, &path, |mut request| {
            for (name, value) in &headers {
                request = request.header(*name, *value);
            }
            // A live stream has no end: only the machine's watchdog bounds it.
            request.timeout(Duration::from_secs(365 * 24 * 3600))
        })
        .await
        .map_err(|e| Refused::Failed(describe(&e)))?;
    let is_sse = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !response.status().is_success() || !is_sse {
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        return Err(refusal(status, &body));
    }
    let replays = response.headers().contains_key(REPLAY_HEADER);
    let broker_ms = response
        .headers()
        .get(reqwest::header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(date_ms);
    Ok((
        Conn::Sse(Box::new((response, SseParser::default()))),
        replays,
        broker_ms,
    ))
}

/// Why a `GET /subscribe` answered `status` (with `body`) is not a stream: refusals and a
/// broker (or every replica) that cannot serve now are failures to retry; anything else means
/// this broker does not stream SSE here.
fn refusal(status: u16, body: &str) -> Refused {
    let reason = match reqwest::StatusCode::from_u16(status) {
        Ok(code) => format!("GET /subscribe answered {code}: {}", body.trim()),
        Err(_) => format!("GET /subscribe answered {status}: {}", body.trim()),
    };
    match status {
        401 | 403 | 500..=599 => Refused::Failed(reason),
        _ => Refused::NotSse(reason),
    }
}

async fn open_ws(
    client: &BrokerClient,
    me: &str,
    last_id: Option<&str>,
) -> Result<(Conn, bool, Option<i64>), String> {
    let base = client.url().replacen("http", "ws", 1);
    let mut url = format!(
        "{base}/subscribe?name={}",
        ac7_protocol::domain::toolbox::encode_component(me)
    );
    if let Some(id) = last_id {
        url.push_str(&format!(
            "&lastEventId={}",
            ac7_protocol::domain::toolbox::encode_component(id)
        ));
    }
    let mut request = tungstenite::client::IntoClientRequest::into_client_request(url.as_str())
        .map_err(|e| e.to_string())?;
    let headers = request.headers_mut();
    if let Ok(v) = format!("Bearer {}", client.token()).parse() {
        headers.insert("Authorization", v);
    }
    if let Ok(v) = "1".parse() {
        headers.insert("X-AC7-Protocol", v);
    }
    if let Ok(v) = super::lifecycle::this_runner().to_header().parse() {
        headers.insert(RUNNER_HEADER, v);
    }
    let (socket, response) = match crate::sys::tls_client::connect_ws(request).await {
        Ok(opened) => opened,
        Err(e) => {
            // The next attempt goes to the next replica, if there is one: a socket that cannot
            // be opened, or a broker that cannot serve (5xx), says nothing good about this one.
            let unavailable = match &e {
                tungstenite::Error::Io(_) => true,
                tungstenite::Error::Http(r) => {
                    if r.status() == tungstenite::http::StatusCode::UNAUTHORIZED {
                        client.check_token();
                    }
                    r.status().is_server_error()
                }
                _ => false,
            };
            if unavailable {
                client.fail_over_current();
            }
            return Err(e.to_string());
        }
    };
    let replays = response.headers().contains_key(REPLAY_HEADER);
    let broker_ms = response
        .headers()
        .get(tungstenite::http::header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(date_ms);
    Ok((Conn::Ws(Box::new(socket)), replays, broker_ms))
}

/// A `Date` header's value as epoch ms.
fn date_ms(text: &str) -> Option<i64> {
    let at = httpdate::parse_http_date(text).ok()?;
    let since = at.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(since.as_millis()).ok()
}

/// The frames of the next chunk or WebSocket frame (a sign of life first); `Err` when the
/// connection ended. Never resolves without a connection.
async fn next_frames(conn: &mut Option<Conn>) -> Result<Vec<LiveFrame>, String> {
    match conn {
        None => std::future::pending().await,
        Some(Conn::Sse(sse)) => {
            let (response, parser) = &mut **sse;
            let bytes = match response.chunk().await {
                Ok(Some(bytes)) => bytes,
                Ok(None) => return Err("stream ended".into()),
                Err(e) => return Err(describe(&e)),
            };
            parser.push(&bytes);
            Ok(sse_frames(parser))
        }
        Some(Conn::PlainSse(sse)) => {
            let (stream, parser) = &mut **sse;
            match stream.next(&mut |bytes| parser.push(bytes)).await {
                Ok(true) => Ok(sse_frames(parser)),
                Ok(false) => Err("stream ended".into()),
                Err(e) => Err(format!("the live stream broke off: {e}")),
            }
        }
        Some(Conn::Ws(socket)) => match socket.next().await {
            None => Err("stream ended".into()),
            Some(Err(e)) => Err(e.to_string()),
            Some(Ok(tungstenite::Message::Text(text))) => match LiveFrame::from_ws_text(&text) {
                Ok(frame) => Ok(vec![frame]),
                Err(e) => {
                    tracing::warn!(error = %e, "dropped a live frame");
                    Ok(vec![LiveFrame::Alive])
                }
            },
            Some(Ok(tungstenite::Message::Close(_))) => Err("closed by the broker".into()),
            Some(Ok(_)) => Ok(vec![LiveFrame::Alive]),
        },
    }
}

/// A sign of life, then every whole event `parser` holds as a frame.
fn sse_frames(parser: &mut SseParser) -> Vec<LiveFrame> {
    let mut frames = vec![LiveFrame::Alive];
    while let Some(item) = parser.decode() {
        match item {
            SseItem::Event(event) => match LiveFrame::from_sse(&event.event, &event.data) {
                Ok(frame) => frames.push(frame),
                Err(e) => tracing::warn!(error = %e, "dropped a live event"),
            },
            SseItem::Oversized { len } => {
                tracing::warn!(len, "dropped an oversized live event")
            }
            SseItem::InvalidUtf8 => tracing::warn!("live event with invalid UTF-8"),
        }
    }
    frames
}

/// Runs one `/history` query of the machine.
async fn fetch(client: BrokerClient, query: HistoryQuery) -> (u64, Result<Vec<Message>, String>) {
    #[derive(serde::Deserialize)]
    struct History {
        messages: Vec<Message>,
    }
    let request = ac7_protocol::domain::toolbox::Request {
        method: ac7_protocol::domain::toolbox::Method::Get,
        path: query.path(),
        body: ac7_protocol::domain::toolbox::Body::Empty,
    };
    let result = match client.execute(&request).await {
        Err(e) => Err(e.to_string()),
        Ok(response) if response.status != 200 => Err(format!(
            "GET {} answered {}: {}",
            request.path,
            response.status,
            String::from_utf8_lossy(&response.body).trim()
        )),
        Ok(response) => serde_json::from_slice::<History>(&response.body)
            .map(|h| h.messages)
            .map_err(|e| {
                format!(
                    "GET {} answered JSON that is not a history: {e}",
                    request.path
                )
            }),
    };
    (query.id, result)
}

#[cfg(test)]
mod tests {
    use super::{Conn, StreamMode, open};
    use crate::client::BrokerClient;
    use crate::client::plain::tests::read_request_head;
    use tokio::io::AsyncWriteExt;

    /// A server on 127.0.0.1 that answers every request with `answer` and closes; the request
    /// heads it read.
    async fn answering(
        answer: &'static [u8],
    ) -> (
        String,
        std::sync::Arc<std::sync::Mutex<Vec<String>>>,
        tokio::task::JoinHandle<()>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = std::sync::Arc::clone(&seen);
        let server = tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                let head = read_request_head(&mut stream).await.unwrap_or_default();
                log.lock().unwrap().push(head);
                let _ = stream.write_all(answer).await;
            }
        });
        (url, seen, server)
    }

    #[tokio::test]
    async fn an_event_stream_from_a_plain_broker_is_read_off_its_socket() {
        let (url, seen, server) = answering(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-ac7-replay: 1\r\n\
              date: Tue, 01 Dec 2026 04:00:00 GMT\r\ntransfer-encoding: chunked\r\n\r\n",
        )
        .await;
        let client = BrokerClient::new(&url, "ac7_token").unwrap();
        let (mode, opened) = open(client, "ann".into(), StreamMode::Auto, Some("42".into())).await;
        assert_eq!(mode, StreamMode::Auto);
        let (conn, replays, broker_ms) = opened.unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(conn, Conn::PlainSse(_)));
        assert!(replays);
        assert_eq!(broker_ms, Some(1_796_097_600_000));
        let request = seen.lock().unwrap()[0].clone();
        for line in [
            "GET /subscribe?name=ann HTTP/1.1\r\n",
            "\r\nauthorization: Bearer ac7_token\r\n",
            "\r\naccept: text/event-stream\r\n",
            "\r\nlast-event-id: 42\r\n",
            "\r\nx-ac7-runner: host=",
        ] {
            assert!(request.contains(line), "{line:?} in {request}");
        }
        server.abort();
    }

    #[tokio::test]
    async fn a_broker_without_sse_moves_auto_to_websocket_and_a_refusal_is_retried() {
        let (url, seen, server) =
            answering(b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\n\r\nno stream").await;
        let client = BrokerClient::new(&url, "t").unwrap();
        let (mode, opened) = open(client, "ann".into(), StreamMode::Auto, None).await;
        // The WebSocket try that follows is refused by the same server.
        assert_eq!(mode, StreamMode::Ws);
        assert!(opened.is_err());
        let heads = seen.lock().unwrap().clone();
        assert!(heads[0].contains("accept: text/event-stream"), "{heads:?}");
        assert!(
            heads[1].to_ascii_lowercase().contains("upgrade: websocket"),
            "{heads:?}"
        );
        server.abort();

        for (answer, status) in [
            (
                &b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 7\r\n\r\nrevoked"[..],
                "401 Unauthorized: revoked",
            ),
            (
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n",
                "503 Service Unavailable",
            ),
        ] {
            let (url, _, server) = answering(answer).await;
            let client = BrokerClient::new(&url, "t").unwrap();
            let (mode, opened) = open(client, "ann".into(), StreamMode::Auto, None).await;
            assert_eq!(mode, StreamMode::Auto, "{status}: SSE is tried again later");
            let reason = opened.err().expect("a refusal");
            assert!(reason.contains(status), "{reason}");
            server.abort();
        }
    }
}
