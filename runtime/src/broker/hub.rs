//! The in-process fanout hub: live subscribers per member, and presence.
//!
//! Each subscriber owns a bounded queue. Delivery never waits: a message goes
//! into each recipient's queue with `try_send`; a subscriber whose queue is full
//! is dropped (its stream ends after draining what it has, and the client
//! reconnects with `Last-Event-ID` to replay the rest). So one slow reader never
//! blocks the others and memory stays bounded by `capacity × subscribers`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use ac7_protocol::message::Audience;
use serde::Serialize;
use tokio::sync::mpsc;

use super::team::Role;

/// One message ready to send, rendered once for every subscriber: its id, its
/// JSON (a WebSocket text frame) and its SSE event.
#[derive(Debug)]
pub struct Frame {
    /// The message id (SSE `id:`).
    pub id: String,
    /// The message JSON.
    pub json: axum::extract::ws::Utf8Bytes,
    /// `id: <id>\nevent: message\ndata: <json>\n\n`.
    pub sse: axum::body::Bytes,
}

impl Frame {
    /// Renders a frame from a message id and its JSON (which holds no raw newline).
    pub fn new(id: String, json: String) -> Frame {
        let sse = format!("id: {id}\nevent: message\ndata: {json}\n\n");
        Frame {
            id,
            json: json.into(),
            sse: sse.into(),
        }
    }
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
}

#[derive(Debug)]
struct Sub {
    id: u64,
    tx: mpsc::Sender<Arc<Frame>>,
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
    capacity: usize,
}

/// A registered subscriber: where frames arrive, and how to deregister.
#[derive(Debug)]
pub struct Subscription {
    /// Member name.
    pub name: String,
    /// Subscriber id within the hub.
    pub id: u64,
    /// The queue.
    pub rx: mpsc::Receiver<Arc<Frame>>,
}

impl Hub {
    /// A hub whose subscriber queues hold `capacity` frames.
    pub fn new(capacity: usize) -> Hub {
        Hub {
            inner: Mutex::new(Inner::default()),
            capacity: capacity.max(1),
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
        self.lock().members.remove(name);
    }

    /// Whether `name` has a presence entry.
    pub fn has_member(&self, name: &str) -> bool {
        self.lock().members.contains_key(name)
    }

    /// Number of presence entries.
    pub fn member_count(&self) -> usize {
        self.lock().members.len()
    }

    /// Registers a subscriber for `name`.
    pub fn subscribe(&self, name: &str, now: i64) -> Option<Subscription> {
        let (tx, rx) = mpsc::channel(self.capacity);
        let mut inner = self.lock();
        inner.next_id += 1;
        let id = inner.next_id;
        let entry = inner.members.get_mut(name)?;
        entry.last_seen = now;
        entry.subs.push(Sub { id, tx });
        Some(Subscription {
            name: name.to_owned(),
            id,
            rx,
        })
    }

    /// Deregisters a subscriber.
    pub fn unsubscribe(&self, name: &str, id: u64) {
        if let Some(entry) = self.lock().members.get_mut(name) {
            entry.subs.retain(|s| s.id != id);
        }
    }

    /// Delivers `frame` to every subscriber in `audience`; returns how many queues took it.
    pub fn deliver(&self, audience: &Audience, frame: &Arc<Frame>, now: i64) -> usize {
        let mut inner = self.lock();
        let mut live = 0;
        let mut deliver_to = |entry: &mut Entry| {
            entry.last_seen = now;
            entry
                .subs
                .retain(|sub| match sub.tx.try_send(Arc::clone(frame)) {
                    Ok(()) => {
                        live += 1;
                        true
                    }
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        tracing::warn!(
                            subscriber = sub.id,
                            "subscriber queue full; disconnecting it (it can replay on reconnect)"
                        );
                        false
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                });
        };
        match audience {
            Audience::Everyone => inner.members.values_mut().for_each(&mut deliver_to),
            Audience::Only(names) => {
                for name in names {
                    if let Some(entry) = inner.members.get_mut(name) {
                        deliver_to(entry);
                    }
                }
            }
        }
        live
    }

    /// Drops every subscriber (their streams end); used on shutdown.
    pub fn close_all(&self) {
        for entry in self.lock().members.values_mut() {
            entry.subs.clear();
        }
    }

    /// Marks `name` busy until `until` (or clears it with 0).
    pub fn set_busy(&self, name: &str, until: i64) {
        if let Some(entry) = self.lock().members.get_mut(name) {
            entry.busy_until = until;
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
                    connected: e.subs.iter().filter(|s| !s.tx.is_closed()).count(),
                    created_at: e.created_at,
                    last_seen: e.last_seen,
                    role: Some(e.role.clone()),
                    busy: (e.busy_until > now).then_some(true),
                })
            })
            .collect()
    }
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

    #[test]
    fn full_queue_disconnects_only_the_slow_subscriber() {
        let hub = Hub::new(2);
        hub.register_member("a", role(), 0);
        hub.register_member("b", role(), 0);
        let mut slow = hub.subscribe("a", 0).unwrap();
        let mut fast = hub.subscribe("b", 0).unwrap();
        for i in 0..3 {
            let live = hub.deliver(&Audience::Everyone, &frame(&i.to_string()), 1);
            assert_eq!(live, if i < 2 { 2 } else { 1 }, "round {i}");
            assert_eq!(fast.rx.try_recv().unwrap().id, i.to_string());
        }
        // the slow one got its two frames, then its stream ends
        assert_eq!(slow.rx.try_recv().unwrap().id, "0");
        assert_eq!(slow.rx.try_recv().unwrap().id, "1");
        assert!(matches!(
            slow.rx.try_recv(),
            Err(mpsc::error::TryRecvError::Disconnected)
        ));
        assert_eq!(
            hub.presence(["a", "b"], 1)
                .iter()
                .map(|p| p.connected)
                .collect::<Vec<_>>(),
            vec![0, 1]
        );
    }

    #[test]
    fn audience_only_reaches_named_members() {
        let hub = Hub::new(4);
        hub.register_member("a", role(), 0);
        hub.register_member("b", role(), 0);
        let mut a = hub.subscribe("a", 0).unwrap();
        let mut b = hub.subscribe("b", 0).unwrap();
        let live = hub.deliver(
            &Audience::Only(BTreeSet::from(["a".to_owned(), "ghost".to_owned()])),
            &frame("x"),
            5,
        );
        assert_eq!(live, 1);
        assert!(a.rx.try_recv().is_ok());
        assert!(b.rx.try_recv().is_err());
        assert_eq!(hub.presence(["a"], 5)[0].last_seen, 5);
        hub.unsubscribe("a", a.id);
        assert_eq!(hub.presence(["a"], 5)[0].connected, 0);
        assert!(hub.subscribe("ghost", 0).is_none());
    }
}
