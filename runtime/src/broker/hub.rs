//! The in-process fanout hub: live subscribers per member, and presence.
//!
//! Each subscriber owns a queue bounded both in frames and in bytes. Delivery
//! never waits: a message goes into each recipient's queue at once; a subscriber
//! whose queue would pass either bound is disconnected (its queue is emptied on
//! the spot, so the memory comes back at once; its stream ends, and the client
//! reconnects with `Last-Event-ID` to replay the rest). So one slow reader never
//! blocks the others and memory stays bounded by `queue_bytes × subscribers`.
//!
//! A [`Frame`] is rendered once per message and shared (`Arc`) by every queue:
//! the SSE text is one buffer and the WebSocket text is a slice of that same
//! buffer, so a frame costs its size once however many subscribers hold it.
//!
//! Subscribers remember the token they authenticated with: revoking a token
//! ([`Hub::close_token`]), rotating or removing a member ([`Hub::close_member`])
//! ends those streams at once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use ac7_protocol::domain::message::Audience;
use ac7_protocol::session::live::RunnerId;
use axum::body::Bytes;
use serde::Serialize;
use tokio::sync::Notify;

use super::team::Role;

/// One message ready to send, rendered once for every subscriber: its id, its
/// SSE event, and its JSON (a WebSocket text frame) as a slice of the SSE event.
#[derive(Debug)]
pub struct Frame {
    /// The message id (SSE `id:`).
    pub id: String,
    /// The message JSON (shares the buffer of `sse`).
    pub json: axum::extract::ws::Utf8Bytes,
    /// `id: <id>\nevent: message\ndata: <json>\n\n`.
    pub sse: Bytes,
}

impl Frame {
    /// Renders a frame from a message id and its JSON (which holds no raw newline).
    pub fn new(id: String, json: String) -> Frame {
        Frame::event(id, "message", json)
    }

    /// Renders a frame whose SSE event is named `event` (`message`, `activity`).
    pub fn event(id: String, event: &str, json: String) -> Frame {
        let mut sse = String::with_capacity(4 + id.len() + 16 + event.len() + json.len() + 2);
        sse.push_str("id: ");
        sse.push_str(&id);
        sse.push_str("\nevent: ");
        sse.push_str(event);
        sse.push_str("\ndata: ");
        let start = sse.len();
        sse.push_str(&json);
        let end = sse.len();
        sse.push_str("\n\n");
        drop(json);
        let sse = Bytes::from(sse);
        let json = axum::extract::ws::Utf8Bytes::try_from(sse.slice(start..end))
            .unwrap_or_else(|_| unreachable!("a slice of a String at char boundaries is UTF-8"));
        Frame { id, json, sse }
    }

    /// A frame that is no message: an SSE event without `id:` (so a client's resume position
    /// stays the last message), its JSON a WebSocket text frame with a `type` key (a Message
    /// never has one). Its `id` is empty.
    pub fn notice(event: &str, json: String) -> Frame {
        let sse = Bytes::from(format!("event: {event}\ndata: {json}\n\n"));
        let start = "event: ".len() + event.len() + "\ndata: ".len();
        let end = start + json.len();
        let json = axum::extract::ws::Utf8Bytes::try_from(sse.slice(start..end))
            .unwrap_or_else(|_| unreachable!("a slice of a String at char boundaries is UTF-8"));
        Frame {
            id: String::new(),
            json,
            sse,
        }
    }

    /// Bytes this frame costs a queue holding it.
    pub fn cost(&self) -> usize {
        self.sse.len() + self.id.len()
    }
}

/// Why the hub ended a subscriber's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// Its queue passed the frame or byte bound (it read too slowly).
    Overflow,
    /// The token it authenticated with was revoked (rotated or deleted).
    Revoked,
    /// Its member was removed.
    Removed,
    /// The broker is shutting down.
    Shutdown,
    /// The receiving side went away.
    Gone,
}

impl Closed {
    /// A short explanation, for logs and WebSocket close frames.
    pub fn reason(self) -> &'static str {
        match self {
            Closed::Overflow => "subscriber fell too far behind; reconnect with Last-Event-ID",
            Closed::Revoked => "token revoked",
            Closed::Removed => "member removed",
            Closed::Shutdown => "broker shutting down; reconnect with Last-Event-ID",
            Closed::Gone => "subscriber gone",
        }
    }
}

#[derive(Debug, Default)]
struct QueueState {
    frames: VecDeque<Arc<Frame>>,
    bytes: usize,
    closed: Option<Closed>,
}

/// One subscriber's queue, shared by the hub (sending side) and the stream (receiving side).
#[derive(Debug, Default)]
struct Queue {
    state: Mutex<QueueState>,
    notify: Notify,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes the queue (first reason wins) and frees what it held.
    fn close(&self, why: Closed) {
        let mut q = self.lock();
        if q.closed.is_none() {
            q.closed = Some(why);
        }
        q.frames = VecDeque::new();
        q.bytes = 0;
        drop(q);
        self.notify.notify_one();
    }

    fn is_closed(&self) -> bool {
        self.lock().closed.is_some()
    }
}

/// The receiving end of a subscriber's queue.
#[derive(Debug)]
pub struct Receiver {
    queue: Arc<Queue>,
}

impl Receiver {
    /// The next frame, or why the stream ended (after the frames queued before it).
    pub async fn recv(&mut self) -> Result<Arc<Frame>, Closed> {
        loop {
            if let Some(next) = self.try_recv() {
                return next;
            }
            // One receiver per queue: `notify_one` stores a permit if we are not waiting yet.
            self.queue.notify.notified().await;
        }
    }

    /// The next frame if one is queued, the end if closed, `None` if nothing yet.
    pub fn try_recv(&mut self) -> Option<Result<Arc<Frame>, Closed>> {
        let mut q = self.queue.lock();
        if let Some(frame) = q.frames.pop_front() {
            q.bytes -= frame.cost();
            return Some(Ok(frame));
        }
        q.closed.map(Err)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.queue.close(Closed::Gone);
    }
}

/// Bounds on live subscribers.
#[derive(Debug, Clone, Copy)]
pub struct HubLimits {
    /// Frames a subscriber may have queued.
    pub queue_frames: usize,
    /// Bytes a subscriber may have queued (a lone frame larger than this still goes through).
    pub queue_bytes: usize,
    /// Live subscriptions one member may hold.
    pub per_member: usize,
}

/// Why a subscription was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscribeError {
    /// No such member.
    #[error("token references unknown member")]
    UnknownMember,
    /// The member already holds the maximum number of live subscriptions.
    #[error(
        "'{name}' already has {limit} live subscriptions (the broker's limit); close one first"
    )]
    TooMany {
        /// Member name.
        name: String,
        /// The limit.
        limit: usize,
    },
}

/// A presence entry as served by `/roster`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Presence {
    /// Member name.
    pub name: String,
    /// Live subscriber count.
    pub connected: usize,
    /// When the broker first saw the member (boot or creation).
    pub created_at: i64,
    /// Last delivery to, or registration of, the member.
    pub last_seen: i64,
    /// The member's role.
    pub role: Option<Role>,
    /// Present (as `true`) while a runner reports busy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busy: Option<bool>,
    /// Where the live streams on this broker come from, for those whose runner said so
    /// (`X-AC7-Runner`); left out when none did.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub runners: Vec<RunnerId>,
}

#[derive(Debug)]
struct Sub {
    id: u64,
    /// Id of the token the stream authenticated with.
    token: String,
    /// The member holding the stream (the entry's own name on `/subscribe`; the
    /// watcher on a hub of watched streams, see [`Hub::watch`]).
    owner: String,
    /// Where the stream's runner runs, when it said so.
    runner: Option<RunnerId>,
    queue: Arc<Queue>,
}

#[derive(Debug)]
struct Entry {
    created_at: i64,
    last_seen: i64,
    busy_until: i64,
    role: Role,
    subs: Vec<Sub>,
}

#[derive(Debug, Default)]
struct Inner {
    members: HashMap<String, Entry>,
    next_id: u64,
}

/// The hub. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Hub {
    inner: Mutex<Inner>,
    limits: HubLimits,
}

/// One member's live streams on a hub ([`Hub::live_counts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveCount {
    /// Member name.
    pub name: String,
    /// Live streams.
    pub streams: usize,
    /// Of them, those of browser sessions.
    pub browsers: usize,
    /// When the member was last seen.
    pub last_seen: ac7_protocol::EpochMs,
}

/// A registered subscriber: where frames arrive, and how to deregister.
#[derive(Debug)]
pub struct Subscription {
    /// Member name.
    pub name: String,
    /// Subscriber id within the hub.
    pub id: u64,
    /// Whether it authenticated with a browser session (the web app's stream).
    pub browser: bool,
    /// The queue.
    pub rx: Receiver,
}

impl Hub {
    /// A hub with these bounds (each at least 1).
    pub fn new(limits: HubLimits) -> Hub {
        Hub {
            inner: Mutex::new(Inner::default()),
            limits: HubLimits {
                queue_frames: limits.queue_frames.max(1),
                queue_bytes: limits.queue_bytes.max(1),
                per_member: limits.per_member.max(1),
            },
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds (or refreshes the role of) a presence entry.
    pub fn register_member(&self, name: &str, role: Role, now: i64) {
        let mut inner = self.lock();
        inner
            .members
            .entry(name.to_owned())
            .and_modify(|e| e.role = role.clone())
            .or_insert(Entry {
                created_at: now,
                last_seen: now,
                busy_until: 0,
                role,
                subs: Vec::new(),
            });
    }

    /// Removes a member and closes its subscribers.
    pub fn remove_member(&self, name: &str) {
        if let Some(entry) = self.lock().members.remove(name) {
            close_subs(name, entry.subs, Closed::Removed);
        }
    }

    /// Closes every subscriber of `name` (e.g. its tokens were rotated).
    pub fn close_member(&self, name: &str, why: Closed) {
        if let Some(entry) = self.lock().members.get_mut(name) {
            close_subs(name, std::mem::take(&mut entry.subs), why);
        }
    }

    /// Closes the subscribers of `name` that authenticated with token `token_id`.
    pub fn close_token(&self, name: &str, token_id: &str) {
        if let Some(entry) = self.lock().members.get_mut(name) {
            let (gone, kept) = std::mem::take(&mut entry.subs)
                .into_iter()
                .partition(|s| s.token == token_id);
            entry.subs = kept;
            close_subs(name, gone, Closed::Revoked);
        }
    }

    /// Whether `name` has a presence entry.
    pub fn has_member(&self, name: &str) -> bool {
        self.lock().members.contains_key(name)
    }

    /// Number of presence entries.
    pub fn member_count(&self) -> usize {
        self.lock().members.len()
    }

    /// Registers a subscriber for `name`, authenticated with token `token_id`.
    pub fn subscribe(
        &self,
        name: &str,
        token_id: &str,
        now: i64,
    ) -> Result<Subscription, SubscribeError> {
        self.subscribe_as(name, name, token_id, now)
    }

    /// On a hub of watched streams (one entry per watched member, e.g. member
    /// activity): registers `owner`, authenticated with `token_id`, as a
    /// subscriber of `name`'s entry, creating the entry if needed. The limit per
    /// member applies per watched entry.
    pub fn watch(
        &self,
        name: &str,
        owner: &str,
        token_id: &str,
        now: i64,
    ) -> Result<Subscription, SubscribeError> {
        if !self.has_member(name) {
            self.register_member(name, Role::default(), now);
        }
        self.subscribe_as(name, owner, token_id, now)
    }

    /// Closes, in every entry, the subscribers held by `owner` (only those with
    /// token `token_id` when given): the watcher's token was revoked or the
    /// watcher removed.
    pub fn close_owner(&self, owner: &str, token_id: Option<&str>, why: Closed) {
        for (name, entry) in self.lock().members.iter_mut() {
            let (gone, kept) = std::mem::take(&mut entry.subs)
                .into_iter()
                .partition(|s| s.owner == owner && token_id.is_none_or(|t| s.token == t));
            entry.subs = kept;
            close_subs(name, gone, why);
        }
    }

    fn subscribe_as(
        &self,
        name: &str,
        owner: &str,
        token_id: &str,
        now: i64,
    ) -> Result<Subscription, SubscribeError> {
        let queue = Arc::new(Queue::default());
        let mut inner = self.lock();
        inner.next_id += 1;
        let id = inner.next_id;
        let entry = inner
            .members
            .get_mut(name)
            .ok_or(SubscribeError::UnknownMember)?;
        entry.subs.retain(|s| !s.queue.is_closed());
        if entry.subs.len() >= self.limits.per_member {
            return Err(SubscribeError::TooMany {
                name: name.to_owned(),
                limit: self.limits.per_member,
            });
        }
        entry.last_seen = now;
        entry.subs.push(Sub {
            id,
            token: token_id.to_owned(),
            owner: owner.to_owned(),
            runner: None,
            queue: Arc::clone(&queue),
        });
        Ok(Subscription {
            name: name.to_owned(),
            id,
            browser: crate::broker::sessions::is_browser(token_id),
            rx: Receiver { queue },
        })
    }

    /// Records where subscriber `id` of `name` runs (shown on the roster).
    pub fn set_runner(&self, name: &str, id: u64, runner: RunnerId) {
        if let Some(sub) = self
            .lock()
            .members
            .get_mut(name)
            .and_then(|e| e.subs.iter_mut().find(|s| s.id == id))
        {
            sub.runner = Some(runner);
        }
    }

    /// Deregisters a subscriber.
    pub fn unsubscribe(&self, name: &str, id: u64) {
        if let Some(entry) = self.lock().members.get_mut(name) {
            entry.subs.retain(|s| s.id != id);
        }
    }

    /// Delivers `frame` to every subscriber in `audience`; returns how many queues took it.
    pub fn deliver(&self, audience: &Audience, frame: &Arc<Frame>, now: i64) -> usize {
        let limits = self.limits;
        let cost = frame.cost();
        let mut inner = self.lock();
        let mut live = 0;
        let mut deliver_to = |name: &str, entry: &mut Entry| {
            entry.last_seen = now;
            entry.subs.retain(|sub| {
                let mut q = sub.queue.lock();
                if q.closed.is_some() {
                    return false;
                }
                let over_frames = q.frames.len() >= limits.queue_frames;
                let over_bytes = !q.frames.is_empty() && q.bytes + cost > limits.queue_bytes;
                if over_frames || over_bytes {
                    tracing::warn!(
                        member = name,
                        subscriber = sub.id,
                        queued_frames = q.frames.len(),
                        queued_bytes = q.bytes,
                        limit_frames = limits.queue_frames,
                        limit_bytes = limits.queue_bytes,
                        "subscriber is not reading fast enough; disconnecting it (it replays on reconnect with Last-Event-ID)"
                    );
                    drop(q);
                    sub.queue.close(Closed::Overflow);
                    return false;
                }
                q.frames.push_back(Arc::clone(frame));
                q.bytes += cost;
                drop(q);
                sub.queue.notify.notify_one();
                live += 1;
                true
            });
        };
        match audience {
            Audience::Everyone => inner
                .members
                .iter_mut()
                .for_each(|(name, entry)| deliver_to(name, entry)),
            Audience::Only(names) => {
                for name in names {
                    if let Some(entry) = inner.members.get_mut(name) {
                        deliver_to(name, entry);
                    }
                }
            }
        }
        live
    }

    /// Ends every subscriber's stream; used on shutdown.
    pub fn close_all(&self) {
        for (name, entry) in self.lock().members.iter_mut() {
            close_subs(name, std::mem::take(&mut entry.subs), Closed::Shutdown);
        }
    }

    /// Every member's live stream count and last-seen time, for sharing with other replicas.
    pub fn live_counts(&self) -> Vec<LiveCount> {
        self.lock()
            .members
            .iter()
            .map(|(name, e)| {
                let live = || e.subs.iter().filter(|s| !s.queue.is_closed());
                LiveCount {
                    name: name.clone(),
                    streams: live().count(),
                    browsers: live()
                        .filter(|s| crate::broker::sessions::is_browser(&s.token))
                        .count(),
                    last_seen: e.last_seen,
                }
            })
            .collect()
    }

    /// `name`'s live streams on this hub.
    pub fn live_count(&self, name: &str) -> usize {
        self.lock().members.get(name).map_or(0, |e| {
            e.subs.iter().filter(|s| !s.queue.is_closed()).count()
        })
    }

    /// `name`'s live streams on this hub signed in with a browser session (the web app's).
    pub fn browser_count(&self, name: &str) -> usize {
        self.lock().members.get(name).map_or(0, |e| {
            e.subs
                .iter()
                .filter(|s| !s.queue.is_closed() && crate::broker::sessions::is_browser(&s.token))
                .count()
        })
    }

    /// The tokens (by id) live streams authenticated with, per member, each once.
    pub fn live_tokens(&self) -> Vec<(String, String)> {
        let inner = self.lock();
        let mut out: Vec<(String, String)> = inner
            .members
            .iter()
            .flat_map(|(name, e)| {
                e.subs
                    .iter()
                    .filter(|s| !s.queue.is_closed())
                    .map(move |s| (name.clone(), s.token.clone()))
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// On a hub of watched streams: the tokens (by id) live streams authenticated with, per
    /// holder ([`Hub::watch`]'s `owner`), each once.
    pub fn live_owner_tokens(&self) -> Vec<(String, String)> {
        let inner = self.lock();
        let mut out: Vec<(String, String)> = inner
            .members
            .values()
            .flat_map(|e| {
                e.subs
                    .iter()
                    .filter(|s| !s.queue.is_closed())
                    .map(|s| (s.owner.clone(), s.token.clone()))
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Marks `name` busy until `until` (or clears it with 0); whether that changed whether
    /// `name` counts as busy at `now`.
    pub fn set_busy(&self, name: &str, until: i64, now: i64) -> bool {
        match self.lock().members.get_mut(name) {
            Some(entry) => {
                let was = entry.busy_until > now;
                entry.busy_until = until;
                was != (until > now)
            }
            None => false,
        }
    }

    /// Queues `frame` (a [`Frame::notice`]) for every live subscriber whose token id `wants`.
    /// A notice is advisory: a queue that is full skips it rather than being closed.
    pub fn notify(&self, frame: &Arc<Frame>, wants: impl Fn(&str) -> bool) {
        let limits = self.limits;
        let cost = frame.cost();
        let inner = self.lock();
        for sub in inner.members.values().flat_map(|e| e.subs.iter()) {
            if !wants(&sub.token) {
                continue;
            }
            let mut q = sub.queue.lock();
            if q.closed.is_some()
                || q.frames.len() >= limits.queue_frames
                || q.bytes + cost > limits.queue_bytes
            {
                continue;
            }
            q.frames.push_back(Arc::clone(frame));
            q.bytes += cost;
            drop(q);
            sub.queue.notify.notify_one();
        }
    }

    /// Presence entries for `names` (in that order) as of `now`.
    pub fn presence<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
        now: i64,
    ) -> Vec<Presence> {
        let inner = self.lock();
        names
            .into_iter()
            .filter_map(|name| {
                inner.members.get(name).map(|e| Presence {
                    name: name.to_owned(),
                    connected: e.subs.iter().filter(|s| !s.queue.is_closed()).count(),
                    created_at: e.created_at,
                    last_seen: e.last_seen,
                    role: Some(e.role.clone()),
                    busy: (e.busy_until > now).then_some(true),
                    runners: e
                        .subs
                        .iter()
                        .filter(|s| !s.queue.is_closed())
                        .filter_map(|s| s.runner.clone())
                        .collect(),
                })
            })
            .collect()
    }
}

fn close_subs(name: &str, subs: Vec<Sub>, why: Closed) {
    for sub in subs {
        if why != Closed::Shutdown {
            tracing::info!(
                member = name,
                subscriber = sub.id,
                reason = why.reason(),
                "closing live stream"
            );
        }
        sub.queue.close(why);
    }
}

/// Why a live stream (`/subscribe`, an activity stream) or an upload was refused.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The request's token was revoked since it authenticated.
    #[error("unknown token")]
    UnknownToken,
    /// The hub refused the subscription.
    #[error(transparent)]
    Refused(SubscribeError),
    /// Store failure.
    #[error(transparent)]
    Store(#[from] super::db::StoreError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn role() -> Role {
        Role {
            title: "t".into(),
            description: String::new(),
        }
    }

    fn frame(id: &str) -> Arc<Frame> {
        Arc::new(Frame::new(id.into(), "{}".into()))
    }

    fn hub_with(queue_frames: usize, queue_bytes: usize, per_member: usize) -> Hub {
        Hub::new(HubLimits {
            queue_frames,
            queue_bytes,
            per_member,
        })
    }

    fn next_id(rx: &mut Receiver) -> Result<String, Closed> {
        rx.try_recv()
            .expect("something queued")
            .map(|f| f.id.clone())
    }

    #[test]
    fn a_frame_is_rendered_once() {
        let f = Frame::new("m1".into(), r#"{"body":"é"}"#.into());
        assert_eq!(
            &f.sse[..],
            "id: m1\nevent: message\ndata: {\"body\":\"é\"}\n\n".as_bytes()
        );
        assert_eq!(f.json.as_str(), r#"{"body":"é"}"#);
        // the JSON is a view into the SSE buffer, not a second copy
        let sse = f.sse.as_ptr() as usize;
        let json = f.json.as_str().as_ptr() as usize;
        assert!(json > sse && json < sse + f.sse.len());
    }

    #[test]
    fn notices_carry_no_id_and_reach_only_the_streams_that_want_them() {
        let f = Arc::new(Frame::notice(
            "presence",
            r#"{"type":"presence","name":"é"}"#.into(),
        ));
        assert_eq!(
            &f.sse[..],
            "event: presence\ndata: {\"type\":\"presence\",\"name\":\"é\"}\n\n".as_bytes()
        );
        assert_eq!(f.json.as_str(), r#"{"type":"presence","name":"é"}"#);
        assert!(f.id.is_empty());
        let hub = Hub::new(HubLimits {
            queue_frames: 1,
            queue_bytes: 1 << 20,
            per_member: 4,
        });
        hub.register_member("ann", role(), 0);
        let browser = hub.subscribe("ann", "session:abc", 0).unwrap();
        let runner = hub.subscribe("ann", "tok-1", 0).unwrap();
        hub.notify(&f, |t| t.starts_with("session:"));
        assert_eq!(browser.rx.queue.lock().frames.len(), 1);
        assert_eq!(runner.rx.queue.lock().frames.len(), 0);
        // A full queue skips a notice instead of closing the stream.
        hub.notify(&f, |_| true);
        assert!(!browser.rx.queue.is_closed());
        assert_eq!(runner.rx.queue.lock().frames.len(), 1);
        // Busy changes are reported as changes only.
        assert!(hub.set_busy("ann", 100, 10));
        assert!(!hub.set_busy("ann", 200, 10));
        assert!(hub.set_busy("ann", 0, 10));
        assert!(!hub.set_busy("nobody", 100, 10));
    }

    #[test]
    fn full_queue_disconnects_only_the_slow_subscriber() {
        let hub = hub_with(2, usize::MAX, 8);
        hub.register_member("a", role(), 0);
        hub.register_member("b", role(), 0);
        let mut slow = hub.subscribe("a", "ta", 0).unwrap();
        let mut fast = hub.subscribe("b", "tb", 0).unwrap();
        for i in 0..3 {
            let live = hub.deliver(&Audience::Everyone, &frame(&i.to_string()), 1);
            assert_eq!(live, if i < 2 { 2 } else { 1 }, "round {i}");
            assert_eq!(next_id(&mut fast.rx), Ok(i.to_string()));
        }
        // the slow one is cut off: its queue is dropped at once and its stream ends
        assert_eq!(next_id(&mut slow.rx), Err(Closed::Overflow));
        assert_eq!(
            hub.presence(["a", "b"], 1)
                .iter()
                .map(|p| p.connected)
                .collect::<Vec<_>>(),
            vec![0, 1]
        );
    }

    #[test]
    fn the_queue_is_bounded_in_bytes() {
        let big = |id: &str| Arc::new(Frame::new(id.into(), format!("\"{}\"", "x".repeat(1000))));
        let cost = big("0").cost();
        let hub = hub_with(1024, cost * 3, 8);
        hub.register_member("a", role(), 0);
        hub.register_member("b", role(), 0);
        let mut slow = hub.subscribe("a", "ta", 0).unwrap();
        let mut fast = hub.subscribe("b", "tb", 0).unwrap();
        for i in 0..3 {
            assert_eq!(hub.deliver(&Audience::Everyone, &big(&i.to_string()), 1), 2);
            assert_eq!(next_id(&mut fast.rx), Ok(i.to_string()));
        }
        assert_eq!(hub.deliver(&Audience::Everyone, &big("3"), 1), 1);
        assert_eq!(next_id(&mut slow.rx), Err(Closed::Overflow));
        // a lone frame larger than the bound still reaches an empty queue
        let small = hub_with(1024, 10, 8);
        small.register_member("a", role(), 0);
        let mut s = small.subscribe("a", "ta", 0).unwrap();
        assert_eq!(small.deliver(&Audience::Everyone, &big("x"), 1), 1);
        assert_eq!(next_id(&mut s.rx), Ok("x".to_owned()));
    }

    #[test]
    fn revocation_closes_the_streams_of_that_token() {
        let hub = hub_with(16, usize::MAX, 8);
        hub.register_member("a", role(), 0);
        let mut old = hub.subscribe("a", "t1", 0).unwrap();
        let mut other = hub.subscribe("a", "t2", 0).unwrap();
        hub.deliver(&Audience::Everyone, &frame("queued"), 1);
        hub.close_token("a", "t1");
        assert_eq!(next_id(&mut old.rx), Err(Closed::Revoked));
        assert_eq!(next_id(&mut other.rx), Ok("queued".to_owned()));
        assert_eq!(hub.deliver(&Audience::Everyone, &frame("later"), 1), 1);
        hub.close_member("a", Closed::Revoked);
        assert_eq!(next_id(&mut other.rx), Err(Closed::Revoked));
        assert_eq!(hub.deliver(&Audience::Everyone, &frame("x"), 1), 0);
        let mut again = hub.subscribe("a", "t3", 0).unwrap();
        hub.remove_member("a");
        assert_eq!(next_id(&mut again.rx), Err(Closed::Removed));
    }

    #[test]
    fn subscriptions_per_member_are_capped() {
        let hub = hub_with(16, usize::MAX, 2);
        hub.register_member("a", role(), 0);
        let first = hub.subscribe("a", "t", 0).unwrap();
        let _second = hub.subscribe("a", "t", 0).unwrap();
        assert_eq!(
            hub.subscribe("a", "t", 0).unwrap_err(),
            SubscribeError::TooMany {
                name: "a".into(),
                limit: 2
            }
        );
        // a dropped receiver frees its slot even before it is unsubscribed
        drop(first);
        assert!(hub.subscribe("a", "t", 0).is_ok());
        assert_eq!(
            hub.subscribe("ghost", "t", 0).unwrap_err(),
            SubscribeError::UnknownMember
        );
    }

    #[test]
    fn the_roster_shows_where_live_streams_run() {
        let hub = hub_with(16, usize::MAX, 8);
        hub.register_member("a", role(), 0);
        let plain = hub.subscribe("a", "t", 0).unwrap();
        let runner = hub.subscribe("a", "t", 0).unwrap();
        let id = RunnerId {
            host: "box".into(),
            pid: Some(12),
        };
        hub.set_runner("a", runner.id, id.clone());
        let p = &hub.presence(["a"], 0)[0];
        assert_eq!((p.connected, p.runners.clone()), (2, vec![id]));
        drop(runner);
        let p = &hub.presence(["a"], 0)[0];
        assert_eq!((p.connected, p.runners.len()), (1, 0));
        let json = serde_json::to_value(p).unwrap();
        assert!(json.get("runners").is_none(), "left out when empty: {json}");
        drop(plain);
    }

    #[tokio::test]
    async fn recv_waits_for_a_frame() {
        let hub = Arc::new(hub_with(16, usize::MAX, 8));
        hub.register_member("a", role(), 0);
        let mut sub = hub.subscribe("a", "t", 0).unwrap();
        let h = Arc::clone(&hub);
        let task = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            h.deliver(&Audience::Everyone, &frame("late"), 1);
        });
        assert_eq!(sub.rx.recv().await.unwrap().id, "late");
        task.await.unwrap();
        // Closing drops what is still queued: the client replays it on reconnect.
        hub.deliver(&Audience::Everyone, &frame("dropped"), 1);
        hub.close_all();
        assert_eq!(sub.rx.recv().await.unwrap_err(), Closed::Shutdown);
    }

    #[test]
    fn audience_only_reaches_named_members() {
        let hub = hub_with(4, usize::MAX, 8);
        hub.register_member("a", role(), 0);
        hub.register_member("b", role(), 0);
        let mut a = hub.subscribe("a", "t", 0).unwrap();
        let mut b = hub.subscribe("b", "t", 0).unwrap();
        let live = hub.deliver(
            &Audience::Only(BTreeSet::from(["a".to_owned(), "ghost".to_owned()])),
            &frame("x"),
            5,
        );
        assert_eq!(live, 1);
        assert!(a.rx.try_recv().is_some());
        assert!(b.rx.try_recv().is_none());
        assert_eq!(hub.presence(["a"], 5)[0].last_seen, 5);
        hub.unsubscribe("a", a.id);
        assert_eq!(hub.presence(["a"], 5)[0].connected, 0);
    }
}
