//! `GET /subscribe?name=<me>`: the live stream, as SSE for a plain GET and as
//! WebSocket for an upgrade request.
//!
//! SSE: `id: <message id>`, `event: message`, one `data:` line with the Message
//! JSON; a `:` comment every keepalive interval (15 s by default).
//! WebSocket: one Message JSON per text frame; a ping every keepalive interval;
//! client frames are ignored, and one over 64 KiB closes the socket.
//!
//! Each stream reads from its hub queue (bounded in frames and bytes; see
//! [`crate::broker::hub`]) and remembers the token it authenticated with, so that
//! revoking the token ends it, and where its runner runs when the request says so
//! (`X-AC7-Runner: host=…;pid=…`, shown as `runners` on `/roster`). SSE responses carry `Connection: close`: when the
//! broker ends a stream, the connection goes with it.
//!
//! Browser notices: the streams of session-cookie callers (browsers) also get `event:
//! presence` whenever a member's stream opens or closes on this broker or its busy report
//! starts or ends, and `event: channels` when the channel list changes
//! ([`crate::broker::notices`]). Bearer callers never get them.
//!
//! Replay: with `Last-Event-ID` (header) or `lastEventId` (query), every message
//! the caller may see that was logged after that id is sent first, oldest first,
//! then live traffic, with no gap and no duplicate. The subscription is taken
//! together with the log's head position under the store lock that every push
//! delivers under, so a message is either at or below the head (logged and
//! delivered before: replayed) or above it (delivered later: in the subscriber's
//! queue, which holds live frames while the replay runs). The replay is read
//! from a read connection in pages of [`REPLAY_PAGE`] up to the head, so memory
//! stays bounded whatever the gap. (Live frames that overflow the queue during a
//! long replay end the stream as any overflow does; the client resumes from the
//! last id it got.) Every response says `X-AC7-Replay: 1` (the runner backfills
//! from `/history` only from brokers that lack it).
//!
//! Reset: an id the log does not have (another database, a restored backup, an
//! id from the future) cannot be placed, so nothing can be replayed from it.
//! The broker says so first, then goes live: SSE `event: reset` with one `data:`
//! line, WebSocket one text frame, both holding
//! `{"type":"reset","reason":"unknown-last-event-id","lastEventId":"<id>","detail":"…"}`
//! ([`ac7_protocol::session::live::Reset`]; a Message never has a `type` key). A client
//! backfills from `/history` (the runner does).

use std::convert::Infallible;
use std::sync::Arc;

use super::{ApiError, Caller, Shared};
use crate::broker::hub::{Closed, Frame, Receiver, StreamError, SubscribeError};
use crate::broker::messages::LogStart;
use crate::broker::{AppState, messages, notices, now_ms};
use ac7_protocol::domain::permission::Permission;
use axum::body::{Body, Bytes};
use axum::extract::ws::{CloseFrame, Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt};

use ac7_protocol::session::live::{REPLAY_HEADER, RESET_EVENT, RUNNER_HEADER, Reset, RunnerId};

/// Deregisters the subscriber when the stream or socket task ends.
struct Guard {
    state: Arc<AppState>,
    name: String,
    id: u64,
    /// Registered on [`AppState::activity_hub`] rather than [`AppState::hub`].
    activity: bool,
    /// A browser session's stream (the web app's).
    browser: bool,
}

impl Guard {
    /// Notes that message `id` was written to this member's stream (activity streams carry no
    /// messages; notices have no id).
    fn delivered(&self, id: &str) {
        if !self.activity && !id.is_empty() {
            self.state.cursors.note(&self.name, id);
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let hub = if self.activity {
            &self.state.activity_hub
        } else {
            &self.state.hub
        };
        hub.unsubscribe(&self.name, self.id);
        if !self.activity {
            if let Some(replica) = &self.state.replica {
                replica.stream_closed(&self.name, self.browser);
            }
            notices::presence_changed(&self.state, &self.name);
        }
    }
}

fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    super::query_bytes(query, key).map(|b| String::from_utf8_lossy(&b).into_owned())
}

pub(super) async fn subscribe(
    State(state): State<Shared>,
    req: Request,
) -> Result<Response, ApiError> {
    let (mut parts, _body) = req.into_parts();
    let caller = Caller::from_request_parts(&mut parts, &state).await?;
    let query = parts.uri.query();
    let Some(name) = query_param(query, "name").filter(|n| !n.is_empty()) else {
        return Err(ApiError::bad_request("name query parameter is required"));
    };
    if name != caller.name {
        return Err(ApiError::forbidden(format!(
            "user '{}' cannot subscribe to '{name}'; the name query parameter must equal the caller's authenticated name",
            caller.name
        )));
    }
    let (last_id, upgrade) = stream_request(&mut parts, &state).await?;

    let (start, sub) = messages::open_subscription(
        &state,
        &caller.name,
        caller.has(Permission::MembersManage),
        &caller.token_id,
        last_id.as_deref(),
        now_ms(),
    )?;
    let opening = match start {
        LogStart::Live => Opening::Live,
        LogStart::Replay {
            cursor,
            head,
            scope,
        } => Opening::Replay(Replay {
            state: Arc::clone(&state),
            source: Source::Messages {
                viewer: caller.name.clone(),
                scope: Arc::new(scope),
            },
            cursor,
            head,
        }),
        LogStart::Unknown => Opening::Reset(Reset::unknown_id(last_id.as_deref().unwrap_or(""))),
    };
    if let Some(runner) = parts
        .headers
        .get(RUNNER_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(RunnerId::parse)
    {
        state.hub.set_runner(&sub.name, sub.id, runner);
    }
    notices::presence_changed(&state, &sub.name);
    Ok(respond(&state, upgrade, opening, sub, false))
}

impl From<StreamError> for ApiError {
    fn from(e: StreamError) -> Self {
        match e {
            StreamError::UnknownToken => ApiError::unauthorized(e.to_string()),
            StreamError::Refused(e) => subscribe_error(e),
            StreamError::Store(e) => e.into(),
        }
    }
}

/// A refused subscription as an answer.
pub(super) fn subscribe_error(e: SubscribeError) -> ApiError {
    match e {
        SubscribeError::UnknownMember => ApiError::unauthorized(e.to_string()),
        SubscribeError::TooMany { limit, .. } => {
            ApiError::new(axum::http::StatusCode::TOO_MANY_REQUESTS, e.to_string())
                .with("code", serde_json::json!("too_many_subscriptions"))
                .with("limit", serde_json::json!(limit))
        }
    }
}

/// What a stream request asks for: the last event id it saw (`Last-Event-ID`
/// header, else `lastEventId` query), and the WebSocket upgrade if it is one.
pub(super) async fn stream_request(
    parts: &mut Parts,
    state: &Shared,
) -> Result<(Option<String>, Option<WebSocketUpgrade>), ApiError> {
    let last_id = parts
        .headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| query_param(parts.uri.query(), "lastEventId"))
        .filter(|s| !s.is_empty());
    let is_upgrade = parts
        .headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let upgrade = if is_upgrade {
        Some(
            WebSocketUpgrade::from_request_parts(parts, state)
                .await
                .map_err(|e| ApiError::bad_request(format!("bad WebSocket upgrade: {e}")))?
                // The broker ignores what clients send: keep their frames small.
                .max_frame_size(WS_MAX_CLIENT_MESSAGE)
                .max_message_size(WS_MAX_CLIENT_MESSAGE)
                // Each read attempt zeroes up to this much of the read buffer first: with the
                // default (128 KiB) every frame sent cost a 128 KiB memset, since the socket is
                // polled for client frames between sends.
                .read_buffer_size(WS_READ_BUFFER),
        )
    } else {
        None
    };
    Ok((last_id, upgrade))
}

/// The stream's response: the WebSocket upgrade, or an SSE body; `activity`
/// says which hub `sub` is registered on.
pub(super) fn respond(
    state: &Shared,
    upgrade: Option<WebSocketUpgrade>,
    opening: Opening,
    sub: crate::broker::hub::Subscription,
    activity: bool,
) -> Response {
    let guard = Guard {
        state: Arc::clone(state),
        name: sub.name,
        id: sub.id,
        activity,
        browser: sub.browser,
    };
    let (rx, keepalive) = (sub.rx, state.config.keepalive);
    match upgrade {
        Some(ws) => {
            let mut response =
                ws.on_upgrade(move |socket| run_socket(socket, opening, rx, guard, keepalive));
            response
                .headers_mut()
                .insert(REPLAY_HEADER, header::HeaderValue::from_static("1"));
            response
        }
        None => (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
                (header::HeaderName::from_static(REPLAY_HEADER), "1"),
                // When the broker ends the stream (revocation, overflow), the connection goes too.
                (header::CONNECTION, "close"),
            ],
            Body::from_stream(sse_stream(opening, rx, guard, keepalive)),
        )
            .into_response(),
    }
}

/// Messages logged per replay page.
pub(super) const REPLAY_PAGE: usize = 500;

/// What goes out before live frames.
pub(super) enum Opening {
    /// Nothing: no last event id.
    Live,
    /// The log after the last event id.
    Replay(Replay),
    /// The last event id cannot be placed.
    Reset(Reset),
}

/// A replay in progress: the log after `cursor` up to `head`, paged.
pub(super) struct Replay {
    pub(super) state: Arc<AppState>,
    pub(super) source: Source,
    /// The last position sent.
    pub(super) cursor: i64,
    /// The log's head when the subscription was taken.
    pub(super) head: i64,
}

/// What a replay reads.
pub(super) enum Source {
    /// The message log as `viewer` sees it (`/subscribe`).
    Messages {
        viewer: String,
        scope: Arc<messages::ViewerScope>,
    },
    /// One member's activity rows (`/members/:name/activity/stream`).
    Activity { member: String },
}

impl Replay {
    /// The next page, `Ok(None)` once the head is reached.
    async fn next_page(&mut self) -> Result<Option<Vec<Arc<Frame>>>, String> {
        if self.cursor >= self.head {
            return Ok(None);
        }
        let state = Arc::clone(&self.state);
        let (cursor, head) = (self.cursor, self.head);
        let page = match &self.source {
            Source::Messages { viewer, scope } => {
                let (viewer, scope) = (viewer.clone(), Arc::clone(scope));
                let reader = viewer.clone();
                let page = tokio::task::spawn_blocking(move || {
                    messages::replay_page(&state.store, &reader, &scope, cursor, head, REPLAY_PAGE)
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|r| (r.seq, Frame::new(r.id, r.json)))
                .collect::<Vec<_>>();
                // Replayed to the viewer's stream: delivered, as a live message would be.
                if let Some((_, last)) = page.last() {
                    self.state.cursors.note(&viewer, &last.id);
                }
                page
            }
            Source::Activity { member } => {
                let member = member.clone();
                tokio::task::spawn_blocking(move || {
                    crate::broker::activity::replay_page(
                        &state.store,
                        &member,
                        cursor,
                        head,
                        REPLAY_PAGE,
                    )
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?
                .iter()
                .map(|r| {
                    let seq = i64::try_from(r.id).unwrap_or(i64::MAX);
                    crate::broker::activity::frame(r).map(|f| (seq, f))
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?
            }
        };
        if page.len() < REPLAY_PAGE {
            self.cursor = self.head;
        }
        let Some((last, _)) = page.last() else {
            return Ok(None);
        };
        self.cursor = self.cursor.max(*last);
        Ok(Some(page.into_iter().map(|(_, f)| Arc::new(f)).collect()))
    }
}

/// The opening frames as a stream (SSE bytes); `Err` ends the response (a
/// replay that cannot be completed must not be followed by live frames).
fn opening_sse(opening: Opening) -> impl Stream<Item = Result<Bytes, ()>> {
    stream::unfold(Some(opening), |opening| async move {
        match opening? {
            Opening::Live => None,
            Opening::Reset(reset) => {
                let sse = format!("event: {RESET_EVENT}\ndata: {}\n\n", reset.to_json());
                Some((vec![Ok(Bytes::from(sse))], Some(Opening::Live)))
            }
            Opening::Replay(mut replay) => match replay.next_page().await {
                Ok(Some(frames)) => Some((
                    frames.into_iter().map(|f| Ok(f.sse.clone())).collect(),
                    Some(Opening::Replay(replay)),
                )),
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!(error = %e, "replay failed; closing the stream");
                    Some((vec![Err(())], None))
                }
            },
        }
    })
    .flat_map(stream::iter)
}

/// The WebSocket read buffer: what one read takes at most (client frames are small; a larger one
/// takes several reads).
const WS_READ_BUFFER: usize = 4 * 1024;

/// Largest frame or message the broker accepts from a WebSocket client (it reads
/// only close, ping and pong; anything larger closes that socket).
const WS_MAX_CLIENT_MESSAGE: usize = 64 * 1024;

/// The SSE body: the opening (reset or replay), then live frames, with a `:`
/// comment whenever nothing was sent for `keepalive`. Ends when the hub closes
/// the subscriber (the hub logs why).
fn sse_stream(
    opening: Opening,
    rx: Receiver,
    guard: Guard,
    keepalive: std::time::Duration,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let live = stream::unfold((rx, guard), move |(mut rx, guard)| async move {
        match tokio::time::timeout(keepalive, rx.recv()).await {
            Ok(Ok(frame)) => {
                guard.delivered(&frame.id);
                Some((frame.sse.clone(), (rx, guard)))
            }
            Ok(Err(_closed)) => None,
            Err(_) => Some((Bytes::from_static(b":\n\n"), (rx, guard))),
        }
    });
    opening_sse(opening)
        .chain(live.map(Ok))
        .take_while(|item| std::future::ready(item.is_ok()))
        .map(|item| Ok(item.unwrap_or_default()))
}

/// The WebSocket close code for a stream the hub ended.
fn close_code(why: Closed) -> u16 {
    match why {
        // Policy violation: the credentials are gone; reconnecting with them fails.
        Closed::Revoked | Closed::Removed => 1008,
        // Try again later: reconnect with Last-Event-ID.
        Closed::Overflow | Closed::Shutdown | Closed::Gone => 1013,
    }
}

async fn run_socket(
    mut socket: WebSocket,
    opening: Opening,
    mut rx: Receiver,
    guard: Guard,
    keepalive: std::time::Duration,
) {
    match opening {
        Opening::Live => {}
        Opening::Reset(reset) => {
            if socket
                .send(WsMessage::Text(reset.to_json().into()))
                .await
                .is_err()
            {
                return;
            }
        }
        Opening::Replay(mut replay) => loop {
            match replay.next_page().await {
                Ok(Some(frames)) => {
                    for f in frames {
                        if socket.send(WsMessage::Text(f.json.clone())).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "replay failed; closing the stream");
                    let _ = socket
                        .send(WsMessage::Close(Some(CloseFrame {
                            code: 1011,
                            reason: "replay failed; reconnect with lastEventId".into(),
                        })))
                        .await;
                    return;
                }
            }
        },
    }
    let mut ping = tokio::time::interval(keepalive);
    ping.tick().await;
    loop {
        tokio::select! {
            frame = rx.recv() => match frame {
                Ok(f) => {
                    if socket.send(WsMessage::Text(f.json.clone())).await.is_err() {
                        break;
                    }
                    guard.delivered(&f.id);
                }
                Err(why) => {
                    // Closed by the hub: tell the client why (and to reconnect, where it may).
                    let _ = socket
                        .send(WsMessage::Close(Some(CloseFrame {
                            code: close_code(why),
                            reason: why.reason().into(),
                        })))
                        .await;
                    break;
                }
            },
            incoming = socket.recv() => match incoming {
                Some(Ok(WsMessage::Close(_))) | None => break,
                Some(Err(e)) => {
                    tracing::debug!(member = %guard.name, error = %e, "closing WebSocket after a bad client frame");
                    break;
                }
                Some(Ok(_)) => {}
            },
            _ = ping.tick() => {
                if socket.send(WsMessage::Ping(Vec::new().into())).await.is_err() {
                    break;
                }
            }
        }
    }
    drop(guard);
}
