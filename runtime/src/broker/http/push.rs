//! Web Push subscriptions: `GET /push/vapid-public-key`, `POST /push/subscriptions`,
//! `DELETE /push/subscriptions/:id` (see [`crate::broker::webpush`]).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{ApiError, Body, Caller, Issues, Shared, obj, parse_json, reply};
use crate::broker::now_ms;
use crate::broker::webpush::{self, MAX_ENDPOINT, MAX_KEY, SubscriptionError};

impl From<SubscriptionError> for ApiError {
    fn from(e: SubscriptionError) -> Self {
        match e {
            SubscriptionError::Refused(e) => ApiError::bad_request(e.to_string()),
            SubscriptionError::NotFound(_) => ApiError::not_found(e.to_string()),
            SubscriptionError::Store(e) => e.into(),
        }
    }
}

/// The team's VAPID public key, for `PushManager.subscribe` (no sign-in needed: it is public).
pub(super) async fn vapid_public_key(State(state): State<Shared>) -> Response {
    reply(
        StatusCode::OK,
        &obj! {"publicKey" => state.push.public_key()},
    )
}

#[derive(Deserialize)]
pub(super) struct SubscriptionBody {
    endpoint: String,
    keys: Keys,
}

#[derive(Deserialize)]
struct Keys {
    p256dh: String,
    auth: String,
}

/// Stores the caller's browser subscription (or re-binds one of the same endpoint to them).
pub(super) async fn subscribe(
    State(state): State<Shared>,
    caller: Caller,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let b: SubscriptionBody = parse_json(&body, "push subscription")?;
    Issues::default()
        .len("endpoint", &b.endpoint, 1, MAX_ENDPOINT)
        .len("keys.p256dh", &b.keys.p256dh, 1, MAX_KEY)
        .len("keys.auth", &b.keys.auth, 1, MAX_KEY)
        .finish("push subscription")?;
    let sub = webpush::subscribe_browser(
        &state,
        &caller.name,
        &b.endpoint,
        &b.keys.p256dh,
        &b.keys.auth,
        now_ms(),
    )?;
    Ok(reply(
        StatusCode::OK,
        &obj! {"id" => &sub.id, "endpoint" => &sub.endpoint, "createdAt" => &sub.created_at},
    ))
}

/// Deletes one of the caller's subscriptions.
pub(super) async fn unsubscribe(
    State(state): State<Shared>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = id
        .parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| ApiError::bad_request("invalid subscription id"))?;
    webpush::unsubscribe_browser(&state.store, &caller.name, id)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
