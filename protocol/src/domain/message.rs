//! Messages: the wire shapes, the reserved `data` keys, thread keys and the
//! visibility rule shared by live fanout and `/history`.
//!
//! # Routing
//!
//! A message is routed by `to` first and `data.thread` second ([`Route::of`]):
//!
//! | `to`   | `data.thread`              | route                | who sees it                                   |
//! |--------|----------------------------|----------------------|-----------------------------------------------|
//! | a name | anything                   | [`Route::Direct`]    | sender and recipient                          |
//! | null   | absent or `chan:general`   | [`Route::General`]   | every member                                  |
//! | null   | `chan:<id>`                | [`Route::Channel`]   | the channel's members (and the sender)        |
//! | null   | `obj:<id>`                 | [`Route::Objective`] | the objective's thread members (and the sender)|
//!
//! The same rule is written twice on purpose: [`audience`] is how the broker fans a
//! message out (starting from the thread's member list), [`matches_viewer`] is how it
//! filters history and replay for one viewer (starting from the viewer's memberships).
//! A property test keeps the two in agreement.

use crate::EpochMs;
use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Longest message body, in characters.
pub const MAX_BODY_CHARS: usize = 65_536;
/// Longest title, in characters.
pub const MAX_TITLE_CHARS: usize = 200;
/// Most attachments on one message.
pub const MAX_ATTACHMENTS: usize = 64;
/// Longest member name, in characters.
pub const MAX_NAME_CHARS: usize = 128;

/// `data` keys the broker owns: a push may not set them; they are removed on receipt.
pub const RESERVED_DATA_KEYS: [&str; 7] =
    ["from", "ts", "msg_id", "level", "title", "target", "ts_ms"];

/// Severity of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// `debug`
    Debug,
    /// `info` (the default)
    #[default]
    Info,
    /// `notice`
    Notice,
    /// `warning`
    Warning,
    /// `error`
    Error,
    /// `critical`
    Critical,
}

impl LogLevel {
    /// Every level, least severe first.
    pub const ALL: [LogLevel; 6] = [
        LogLevel::Debug,
        LogLevel::Info,
        LogLevel::Notice,
        LogLevel::Warning,
        LogLevel::Error,
        LogLevel::Critical,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Notice => "notice",
            LogLevel::Warning => "warning",
            LogLevel::Error => "error",
            LogLevel::Critical => "critical",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<LogLevel> {
        LogLevel::ALL.into_iter().find(|l| l.as_str() == s)
    }
}

/// A reference to a file in the shared file space.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    /// Absolute file path.
    pub path: String,
    /// File name (last path segment).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// MIME type.
    #[serde(rename = "mimeType")]
    pub mime_type: String,
}

/// A message as stored and delivered. Key order matches the ac7 wire format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Opaque id stamped by the broker.
    pub id: String,
    /// Epoch milliseconds, stamped by the broker.
    pub ts: EpochMs,
    /// Recipient of a DM, or `None` for broadcasts, channel and objective threads.
    pub to: Option<String>,
    /// Sender, stamped by the broker from the authenticated caller (`ac7` for system notices).
    pub from: Option<String>,
    /// Optional title.
    pub title: Option<String>,
    /// The text.
    pub body: String,
    /// Severity.
    pub level: LogLevel,
    /// Free-form metadata (reserved keys stripped).
    pub data: Map<String, Value>,
    /// File references; always present.
    pub attachments: Vec<Attachment>,
}

/// What a client sends to `POST /push`. Unknown keys (such as a forged `from`) are ignored.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct PushPayload {
    /// DM recipient; absent or null for a broadcast or thread post.
    #[serde(default)]
    pub to: Option<String>,
    /// Optional title.
    #[serde(default)]
    pub title: Option<String>,
    /// The text (required).
    pub body: String,
    /// Severity; `info` when absent.
    #[serde(default)]
    pub level: Option<LogLevel>,
    /// Metadata.
    #[serde(default)]
    pub data: Option<Map<String, Value>>,
    /// File references.
    #[serde(default)]
    pub attachments: Option<Vec<Attachment>>,
}

/// Removes the reserved keys from `data`; returns the keys that were present.
pub fn strip_reserved(data: &mut Map<String, Value>) -> Vec<&'static str> {
    RESERVED_DATA_KEYS
        .into_iter()
        .filter(|k| crate::codec::json::remove_keeping_order(data, k).is_some())
        .collect()
}

/// Whether `name` is a valid member name: 1–128 characters of `[A-Za-z0-9._-]`.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A parsed `data.thread` value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Thread {
    /// Absent, or `chan:general`.
    General,
    /// `chan:<id>` (an id, not a slug).
    Channel(String),
    /// `obj:<id>`.
    Objective(String),
}

/// Why a `data.thread` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ThreadError {
    /// `data.thread` is not a string.
    #[error("data.thread must be a string")]
    NotString,
    /// The string is not `chan:<id>` or `obj:<id>`.
    #[error("invalid data.thread {0:?}: expected chan:<channel id> or obj:<objective id>")]
    Unknown(String),
}

impl Thread {
    /// The thread key for a channel id (`general` maps to [`Thread::General`]).
    pub fn channel(id: &str) -> Thread {
        if id == "general" {
            Thread::General
        } else {
            Thread::Channel(id.to_owned())
        }
    }

    /// Parses a thread key string.
    pub fn parse(s: &str) -> Result<Thread, ThreadError> {
        if let Some(id) = s.strip_prefix("chan:").filter(|id| !id.is_empty()) {
            return Ok(Thread::channel(id));
        }
        if let Some(id) = s.strip_prefix("obj:").filter(|id| !id.is_empty()) {
            return Ok(Thread::Objective(id.to_owned()));
        }
        Err(ThreadError::Unknown(s.to_owned()))
    }

    /// Reads `data.thread` (absent = general).
    pub fn from_data(data: &Map<String, Value>) -> Result<Thread, ThreadError> {
        match data.get("thread") {
            None => Ok(Thread::General),
            Some(Value::String(s)) => Thread::parse(s),
            Some(_) => Err(ThreadError::NotString),
        }
    }

    /// The wire key (`chan:general`, `chan:<id>`, `obj:<id>`).
    pub fn key(&self) -> String {
        match self {
            Thread::General => "chan:general".to_owned(),
            Thread::Channel(id) => format!("chan:{id}"),
            Thread::Objective(id) => format!("obj:{id}"),
        }
    }
}

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// A DM.
    Direct {
        /// The recipient.
        to: String,
    },
    /// The general channel (everyone).
    General,
    /// A named channel.
    Channel(String),
    /// An objective thread.
    Objective(String),
    /// A stored message whose thread cannot be parsed: only the sender sees it.
    Unroutable,
}

impl Route {
    /// Routes by `to` first, then `data.thread`.
    pub fn of(to: Option<&str>, data: &Map<String, Value>) -> Route {
        if let Some(to) = to {
            return Route::Direct { to: to.to_owned() };
        }
        match Thread::from_data(data) {
            Ok(Thread::General) => Route::General,
            Ok(Thread::Channel(id)) => Route::Channel(id),
            Ok(Thread::Objective(id)) => Route::Objective(id),
            Err(_) => Route::Unroutable,
        }
    }

    /// Routes a stored message.
    pub fn of_message(message: &Message) -> Route {
        Route::of(message.to.as_deref(), &message.data)
    }
}

/// A viewer's memberships, as needed by [`matches_viewer`].
pub trait Membership {
    /// Whether the viewer belongs to channel `channel_id`.
    fn in_channel(&self, channel_id: &str) -> bool;
    /// Whether the viewer is a member of objective `objective_id`'s thread
    /// (assignee, originator, watcher, or a `members.manage` holder).
    fn in_objective_thread(&self, objective_id: &str) -> bool;
}

/// Whether `viewer` may see a message from `from` with `route`: the rule for
/// `/history`, `Last-Event-ID` replay and live fanout alike. Senders always see
/// their own messages.
pub fn matches_viewer(
    from: Option<&str>,
    route: &Route,
    viewer: &str,
    membership: &impl Membership,
) -> bool {
    if from == Some(viewer) {
        return true;
    }
    match route {
        Route::Direct { to } => to == viewer,
        Route::General => true,
        Route::Channel(id) => membership.in_channel(id),
        Route::Objective(id) => membership.in_objective_thread(id),
        Route::Unroutable => false,
    }
}

/// The members a message is fanned out to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Audience {
    /// Every member.
    Everyone,
    /// Exactly these names.
    Only(BTreeSet<String>),
}

impl Audience {
    /// Whether `name` is in the audience.
    pub fn includes(&self, name: &str) -> bool {
        match self {
            Audience::Everyone => true,
            Audience::Only(names) => names.contains(name),
        }
    }
}

/// Computes the fanout audience. `thread_members` is the member list of the
/// channel or objective thread the route names (ignored for other routes).
pub fn audience(from: Option<&str>, route: &Route, thread_members: &BTreeSet<String>) -> Audience {
    let mut names = match route {
        Route::General => return Audience::Everyone,
        Route::Direct { to } => BTreeSet::from([to.clone()]),
        Route::Channel(_) | Route::Objective(_) => thread_members.clone(),
        Route::Unroutable => BTreeSet::new(),
    };
    if let Some(from) = from {
        names.insert(from.to_owned());
    }
    Audience::Only(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    #[test]
    fn message_serialises_in_wire_order() {
        let m = Message {
            id: "m1".into(),
            ts: 5,
            to: None,
            from: Some("alice".into()),
            title: None,
            body: "hi".into(),
            level: LogLevel::Info,
            data: Map::new(),
            attachments: vec![],
        };
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"id":"m1","ts":5,"to":null,"from":"alice","title":null,"body":"hi","level":"info","data":{},"attachments":[]}"#
        );
    }

    #[test]
    fn push_payload_ignores_forged_from_and_rejects_bad_level() {
        let p: PushPayload = serde_json::from_value(json!({"body":"x","from":"mallory"})).unwrap();
        assert_eq!(p.body, "x");
        assert!(serde_json::from_value::<PushPayload>(json!({"body":"x","level":"loud"})).is_err());
        assert!(serde_json::from_value::<PushPayload>(json!({"to":"a"})).is_err());
    }

    #[test]
    fn reserved_keys_are_stripped() {
        let mut data = json!({"from":"x","ts":1,"msg_id":"m","level":"l","title":"t","target":"g","ts_ms":"1","thread":"chan:general","k":"v"})
            .as_object()
            .unwrap()
            .clone();
        let removed = strip_reserved(&mut data);
        assert_eq!(removed.len(), 7);
        assert_eq!(
            Value::Object(data),
            json!({"thread":"chan:general","k":"v"})
        );
    }

    #[test]
    fn thread_keys() {
        assert_eq!(Thread::parse("chan:general"), Ok(Thread::General));
        assert_eq!(Thread::parse("chan:abc"), Ok(Thread::Channel("abc".into())));
        assert_eq!(
            Thread::parse("obj:o-1"),
            Ok(Thread::Objective("o-1".into()))
        );
        assert!(Thread::parse("chan:").is_err());
        assert!(Thread::parse("dm").is_err());
        let data = json!({"thread": 3}).as_object().unwrap().clone();
        assert_eq!(Thread::from_data(&data), Err(ThreadError::NotString));
        assert_eq!(Thread::Objective("x".into()).key(), "obj:x");
        assert_eq!(Thread::General.key(), "chan:general");
    }

    #[test]
    fn names() {
        assert!(is_valid_name("a.b_c-9"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("bad name"));
        assert!(is_valid_name(&"a".repeat(128)));
        assert!(!is_valid_name(&"a".repeat(129)));
    }

    #[test]
    fn dm_takes_precedence_over_thread() {
        let data = json!({"thread":"chan:x"}).as_object().unwrap().clone();
        assert_eq!(
            Route::of(Some("bob"), &data),
            Route::Direct { to: "bob".into() }
        );
    }

    /// A tiny team directory: channel and objective-thread member lists.
    #[derive(Debug, Clone)]
    struct Directory {
        channels: BTreeMap<String, BTreeSet<String>>,
        objectives: BTreeMap<String, BTreeSet<String>>,
    }

    struct ViewerOf<'a>(&'a Directory, &'a str);

    impl Membership for ViewerOf<'_> {
        fn in_channel(&self, id: &str) -> bool {
            self.0.channels.get(id).is_some_and(|m| m.contains(self.1))
        }
        fn in_objective_thread(&self, id: &str) -> bool {
            self.0
                .objectives
                .get(id)
                .is_some_and(|m| m.contains(self.1))
        }
    }

    const PEOPLE: [&str; 5] = ["ann", "bob", "cat", "dan", "eve"];

    fn member_set() -> impl Strategy<Value = BTreeSet<String>> {
        proptest::collection::btree_set(
            proptest::sample::select(PEOPLE.to_vec()).prop_map(str::to_owned),
            0..5,
        )
    }

    fn directory() -> impl Strategy<Value = Directory> {
        (
            proptest::collection::btree_map("c[0-2]", member_set(), 0..3),
            proptest::collection::btree_map("o[0-2]", member_set(), 0..3),
        )
            .prop_map(|(channels, objectives)| Directory {
                channels,
                objectives,
            })
    }

    fn thread_value() -> impl Strategy<Value = Option<Value>> {
        prop_oneof![
            Just(None),
            Just(Some(json!("chan:general"))),
            "c[0-3]".prop_map(|c| Some(json!(format!("chan:{c}")))),
            "o[0-3]".prop_map(|o| Some(json!(format!("obj:{o}")))),
            Just(Some(json!("bogus"))),
            Just(Some(json!(7))),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct(
                concat!(env!("CARGO_MANIFEST_DIR"), "/../proptest-regressions/message.txt"),
            ))),
            ..ProptestConfig::default()
        })]

        /// History visibility equals live fanout, for every viewer.
        #[test]
        fn history_visibility_equals_fanout(
            dir in directory(),
            from in proptest::option::of(proptest::sample::select(PEOPLE.to_vec())),
            to in proptest::option::of(proptest::sample::select(PEOPLE.to_vec())),
            thread in thread_value(),
        ) {
            let mut data = Map::new();
            if let Some(t) = thread {
                data.insert("thread".into(), t);
            }
            let route = Route::of(to, &data);
            let empty = BTreeSet::new();
            let members = match &route {
                Route::Channel(id) => dir.channels.get(id).unwrap_or(&empty),
                Route::Objective(id) => dir.objectives.get(id).unwrap_or(&empty),
                Route::Direct { .. } | Route::General | Route::Unroutable => &empty,
            };
            let fanout = audience(from, &route, members);
            for viewer in PEOPLE {
                prop_assert_eq!(
                    fanout.includes(viewer),
                    matches_viewer(from, &route, viewer, &ViewerOf(&dir, viewer)),
                    "viewer {} route {:?}", viewer, route
                );
            }
        }
    }
}
