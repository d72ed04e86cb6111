//! Web Push subscriptions: `GET /push/vapid-public-key`, `POST /push/subscriptions`,
//! `DELETE /push/subscriptions/:id` (see [`crate::broker::webpush`]).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{ApiError, Body, Caller, Issues, Shared, obj, parse_json, reply};
use crate::broker::now_ms;
use crate::broker::webpush::{self, MAX_ENDPOINT, MAX_KEY, PushError};

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
    let refused = |e: PushError| ApiError::bad_request(e.to_string());
    webpush::endpoint_origin(&b.endpoint, state.push.network()).map_err(refused)?;
    webpush::check_keys(&b.keys.p256dh, &b.keys.auth).map_err(refused)?;
    let now = now_ms();
    let sub = state.store.tx(|c| {
        webpush::subscription_upsert(
            c,
            &caller.name,
            &b.endpoint,
            &b.keys.p256dh,
            &b.keys.auth,
            now,
        )
    })?;
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
    if state
        .store
        .tx(|c| webpush::subscription_delete(c, &caller.name, id))?
    {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found(format!("no such subscription: {id}")))
    }
}
