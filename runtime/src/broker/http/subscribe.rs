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
//! revoking the token ends it. SSE responses carry `Connection: close`: when the
//! broker ends a stream, the connection goes with it.
//!
//! Replay: with `Last-Event-ID` (header) or `lastEventId` (query), the messages the
//! caller may see that were logged after that id are sent first (at most 1,000,
//! the newest ones), then live traffic, with no gap and no duplicate: the replay
//! query and the subscription happen under the same store lock that pushes take.
//! An unknown id replays nothing.

use std::convert::Infallible;
use std::sync::Arc;

use super::{ApiError, Caller, Shared};
use crate::broker::hub::{Closed, Frame, Receiver, SubscribeError};
use crate::broker::{AppState, messages, now_ms};
use ac7_protocol::permission::Permission;
use axum::body::{Body, Bytes};
use axum::extract::ws::{CloseFrame, Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt};

/// Deregisters the subscriber when the stream or socket task ends.
struct Guard {
    state: Arc<AppState>,
    name: String,
    id: u64,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.state.hub.unsubscribe(&self.name, self.id);
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
    let last_id = parts
        .headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| query_param(query, "lastEventId"))
        .filter(|s| !s.is_empty());
    let is_upgrade = parts
        .headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let upgrade = if is_upgrade {
        Some(
            WebSocketUpgrade::from_request_parts(&mut parts, &state)
                .await
                .map_err(|e| ApiError::bad_request(format!("bad WebSocket upgrade: {e}")))?
                // The broker ignores what clients send: keep their frames small.
                .max_frame_size(WS_MAX_CLIENT_MESSAGE)
                .max_message_size(WS_MAX_CLIENT_MESSAGE),
        )
    } else {
        None
    };

    let now = now_ms();
    let (replay, sub) = state.store.with(|conn| -> Result<_, ApiError> {
        let replay = match &last_id {
            Some(id) => {
                let scope = messages::viewer_scope(
                    conn,
                    &caller.name,
                    caller.has(Permission::MembersManage),
                )?;
                messages::replay_after(conn, &caller.name, &scope, id)?
            }
            None => Vec::new(),
        };
        if !state.hub.has_member(&caller.name)
            && let Some(m) = crate::broker::team::member_get(conn, &caller.name)?
        {
            // Added offline (`ac7 member add`) while the broker was running.
            state.hub.register_member(&m.name, m.role, now);
        }
        // A token revoked since this request authenticated (the auth cache) gets no stream.
        if !crate::broker::team::token_id_exists(conn, &caller.token_id)? {
            return Err(ApiError::unauthorized("unknown token"));
        }
        let sub = state
            .hub
            .subscribe(&caller.name, &caller.token_id, now)
            .map_err(|e| match e {
                SubscribeError::UnknownMember => ApiError::unauthorized(e.to_string()),
                SubscribeError::TooMany { limit, .. } => {
                    ApiError::new(axum::http::StatusCode::TOO_MANY_REQUESTS, e.to_string())
                        .with("code", serde_json::json!("too_many_subscriptions"))
                        .with("limit", serde_json::json!(limit))
                }
            })?;
        Ok((replay, sub))
    })?;
    let mut frames = Vec::with_capacity(replay.len());
    for m in replay {
        let json = serde_json::to_string(&m).map_err(crate::broker::db::StoreError::from)?;
        frames.push(Arc::new(Frame::new(m.id, json)));
    }
    let guard = Guard {
        state: Arc::clone(&state),
        name: sub.name,
        id: sub.id,
    };
    let keepalive = state.config.keepalive;
    match upgrade {
        Some(ws) => {
            Ok(ws.on_upgrade(move |socket| run_socket(socket, frames, sub.rx, guard, keepalive)))
        }
        None => Ok((
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
                // When the broker ends the stream (revocation, overflow), the connection goes too.
                (header::CONNECTION, "close"),
            ],
            Body::from_stream(sse_stream(frames, sub.rx, guard, keepalive)),
        )
            .into_response()),
    }
}

/// Largest frame or message the broker accepts from a WebSocket client (it reads
/// only close, ping and pong; anything larger closes that socket).
const WS_MAX_CLIENT_MESSAGE: usize = 64 * 1024;

/// The SSE body: the replay, then live frames, with a `:` comment whenever
/// nothing was sent for `keepalive`. Ends when the hub closes the subscriber
/// (the hub logs why).
fn sse_stream(
    replay: Vec<Arc<Frame>>,
    rx: Receiver,
    guard: Guard,
    keepalive: std::time::Duration,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let live = stream::unfold((rx, guard), move |(mut rx, guard)| async move {
        match tokio::time::timeout(keepalive, rx.recv()).await {
            Ok(Ok(frame)) => Some((frame.sse.clone(), (rx, guard))),
            Ok(Err(_closed)) => None,
            Err(_) => Some((Bytes::from_static(b":\n\n"), (rx, guard))),
        }
    });
    stream::iter(replay.into_iter().map(|f| f.sse.clone()))
        .chain(live)
        .map(Ok)
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
    replay: Vec<Arc<Frame>>,
    mut rx: Receiver,
    guard: Guard,
    keepalive: std::time::Duration,
) {
    for f in replay {
        if socket.send(WsMessage::Text(f.json.clone())).await.is_err() {
            return;
        }
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
