//! `GET /subscribe?name=<me>`: the live stream, as SSE for a plain GET and as
//! WebSocket for an upgrade request.
//!
//! SSE: `id: <message id>`, `event: message`, one `data:` line with the Message
//! JSON; a `:` comment every keepalive interval (15 s by default).
//! WebSocket: one Message JSON per text frame; a ping every keepalive interval;
//! client frames are ignored.
//!
//! Replay: with `Last-Event-ID` (header) or `lastEventId` (query), the messages the
//! caller may see that were logged after that id are sent first (at most 1,000,
//! the newest ones), then live traffic, with no gap and no duplicate: the replay
//! query and the subscription happen under the same store lock that pushes take.
//! An unknown id replays nothing.

use std::convert::Infallible;
use std::sync::Arc;

use ac7_protocol::permission::Permission;
use axum::body::{Body, Bytes};
use axum::extract::ws::{CloseFrame, Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt};
use tokio::sync::mpsc;

use super::{ApiError, Caller, Shared};
use crate::broker::hub::Frame;
use crate::broker::{AppState, messages, now_ms};

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
                .map_err(|e| ApiError::bad_request(format!("bad WebSocket upgrade: {e}")))?,
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
        let sub = state
            .hub
            .subscribe(&caller.name, now)
            .ok_or_else(|| ApiError::unauthorized("token references unknown member"))?;
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
            ],
            Body::from_stream(sse_stream(frames, sub.rx, guard, keepalive)),
        )
            .into_response()),
    }
}

/// The SSE body: the replay, then live frames, with a `:` comment whenever
/// nothing was sent for `keepalive`. Ends when the hub drops the subscriber.
fn sse_stream(
    replay: Vec<Arc<Frame>>,
    rx: mpsc::Receiver<Arc<Frame>>,
    guard: Guard,
    keepalive: std::time::Duration,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let live = stream::unfold((rx, guard), move |(mut rx, guard)| async move {
        match tokio::time::timeout(keepalive, rx.recv()).await {
            Ok(Some(frame)) => Some((frame.sse.clone(), (rx, guard))),
            Ok(None) => None,
            Err(_) => Some((Bytes::from_static(b":\n\n"), (rx, guard))),
        }
    });
    stream::iter(replay.into_iter().map(|f| f.sse.clone()))
        .chain(live)
        .map(Ok)
}

async fn run_socket(
    mut socket: WebSocket,
    replay: Vec<Arc<Frame>>,
    mut rx: mpsc::Receiver<Arc<Frame>>,
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
                Some(f) => {
                    if socket.send(WsMessage::Text(f.json.clone())).await.is_err() {
                        break;
                    }
                }
                None => {
                    // Dropped by the hub (queue overflow or shutdown): tell the client to reconnect.
                    let _ = socket
                        .send(WsMessage::Close(Some(CloseFrame {
                            code: 1013,
                            reason: "stream closed by the broker; reconnect with Last-Event-ID".into(),
                        })))
                        .await;
                    break;
                }
            },
            incoming = socket.recv() => match incoming {
                Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => break,
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
