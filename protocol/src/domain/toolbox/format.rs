//! The text of tool results, as the TypeScript runner formats them. Broker responses are read
//! leniently, as JSON values or (the roster) straight from the bytes into a lenient view: a
//! missing field prints as empty rather than failing the tool.

use std::borrow::Cow;
use std::fmt::Write as _;

use crate::EpochMs;
use serde::de::MapAccess;
use serde_json::Value;

use super::lenient::{self, Shape};

use crate::domain::channel::format_ts;

pub(super) fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// `just now`, `<m>m ago`, `<h>h ago`, `<d>d ago`, or `future`.
pub(super) fn age(ts_ms: EpochMs, now_ms: EpochMs) -> String {
    let secs = (now_ms - ts_ms).div_euclid(1000);
    match secs {
        s if s < 0 => "future".to_owned(),
        s if s < 60 => "just now".to_owned(),
        s if s < 3600 => format!("{}m ago", s / 60),
        s if s < 86_400 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86_400),
    }
}

pub(super) fn when(v: &Value, now_ms: EpochMs) -> String {
    let ts = v.as_i64().unwrap_or_default();
    format!("{} ({})", format_ts(ts), age(ts, now_ms))
}

/// One file-space entry: `d  <path>/  owner=<owner>` or `f  <path>  <size>B  <mime>  owner=<owner>`.
pub(super) fn entry(e: &Value) -> String {
    if s(&e["kind"]) == "directory" {
        format!("d  {}/  owner={}", s(&e["path"]), s(&e["owner"]))
    } else {
        let size = e["size"].as_u64().map_or("?".to_owned(), |n| n.to_string());
        let mime = e["mimeType"].as_str().unwrap_or("unknown");
        format!(
            "f  {}  {size}B  {mime}  owner={}",
            s(&e["path"]),
            s(&e["owner"])
        )
    }
}

pub(super) fn entries(header: &str, list: &[Value], empty: String) -> String {
    if list.is_empty() {
        return empty;
    }
    let mut text = header.to_owned();
    for e in list {
        text.push_str("\n  ");
        text.push_str(&entry(e));
    }
    text
}

/// `GET /roster`, as much of it as the tool's text shows.
#[derive(Debug, Default)]
pub(super) struct RosterView<'a> {
    teammates: Vec<TeammateView<'a>>,
    connected: Vec<PresenceView<'a>>,
}

#[derive(Debug, Default)]
struct TeammateView<'a> {
    name: Cow<'a, str>,
    title: Cow<'a, str>,
    permissions: Vec<Cow<'a, str>>,
}

#[derive(Debug, Default)]
struct PresenceView<'a> {
    name: Cow<'a, str>,
    connected: u64,
}

/// A role: only its title shows.
#[derive(Debug, Default)]
struct Title<'a>(Cow<'a, str>);

impl<'de> Shape<'de> for RosterView<'de> {
    fn map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        let mut r = RosterView::default();
        lenient::entries(map, |key, map| {
            match key {
                "teammates" => r.teammates = lenient::value(map)?,
                "connected" => r.connected = lenient::value(map)?,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(r)
    }
}

impl<'de> Shape<'de> for TeammateView<'de> {
    fn map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        let mut t = TeammateView::default();
        lenient::entries(map, |key, map| {
            match key {
                "name" => t.name = lenient::value(map)?,
                "role" => t.title = lenient::value::<Title, _>(map)?.0,
                "permissions" => t.permissions = lenient::value(map)?,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(t)
    }
}

impl<'de> Shape<'de> for Title<'de> {
    fn map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        let mut title = Title::default();
        lenient::entries(map, |key, map| {
            if key != "title" {
                return Ok(false);
            }
            title.0 = lenient::value(map)?;
            Ok(true)
        })?;
        Ok(title)
    }
}

impl<'de> Shape<'de> for PresenceView<'de> {
    fn map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        let mut p = PresenceView::default();
        lenient::entries(map, |key, map| {
            match key {
                "name" => p.name = lenient::value(map)?,
                "connected" => p.connected = lenient::value(map)?,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(p)
    }
}

/// `team <team> roster:` and a line per teammate: role title, authority, whether connected.
pub(super) fn roster(team: &str, me: &str, body: &RosterView<'_>) -> String {
    if body.teammates.is_empty() {
        return "team roster: (no slots defined)".to_owned();
    }
    let connected = |name: &str| {
        body.connected
            .iter()
            .find(|p| p.name == name)
            .map_or(0, |p| p.connected)
    };
    let mut text = format!("team {team} roster:");
    for t in &body.teammates {
        let name = &*t.name;
        let has = |p: &str| t.permissions.iter().any(|q| q == p);
        let auth = if has("members.manage") {
            " [admin]"
        } else if has("objectives.create") {
            " [operator]"
        } else {
            ""
        };
        let you = if name == me { " (you)" } else { "" };
        let _ = write!(text, "\n- {name}{you} [{}]{auth} ", t.title);
        match connected(name) {
            0 => text.push_str("offline"),
            n => {
                let _ = write!(text, "connected={n}");
            }
        }
    }
    text
}

pub(super) fn channels(team: &str, body: &Value) -> String {
    let all = body["channels"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if all.is_empty() {
        return format!("team {team}: no channels defined.");
    }
    let (joined, other): (Vec<&Value>, Vec<&Value>) = all
        .iter()
        .partition(|c| c["joined"].as_bool() == Some(true));
    let mut sections = Vec::new();
    if !joined.is_empty() {
        let mut text = format!("channels you belong to ({}):", joined.len());
        for c in joined {
            let role = c["myRole"]
                .as_str()
                .map(|r| format!(" [{r}]"))
                .unwrap_or_default();
            let archived = if c["archivedAt"].is_null() {
                ""
            } else {
                " (archived)"
            };
            text.push_str(&format!(
                "\n- #{}{role}{archived}  members={}",
                s(&c["slug"]),
                c["memberCount"].as_u64().unwrap_or(0)
            ));
        }
        sections.push(text);
    }
    if !other.is_empty() {
        let mut text = format!(
            "other visible channels ({}, post requires joining first):",
            other.len()
        );
        for c in other {
            text.push_str(&format!(
                "\n- #{}  members={}",
                s(&c["slug"]),
                c["memberCount"].as_u64().unwrap_or(0)
            ));
        }
        sections.push(text);
    }
    sections.join("\n\n")
}

pub(super) fn message_line(m: &Value) -> String {
    let from = m["from"].as_str().unwrap_or("?");
    let to = m["to"]
        .as_str()
        .map(|t| format!(" → {t}"))
        .unwrap_or_default();
    let title = m["title"]
        .as_str()
        .filter(|t| !t.is_empty())
        .map(|t| format!(" [{t}]"))
        .unwrap_or_default();
    format!(
        "  {} {from}{to}{title}: {}",
        format_ts(m["ts"].as_i64().unwrap_or_default()),
        s(&m["body"])
    )
}

pub(super) fn objectives(me: &str, status: Option<&str>, body: &Value, now_ms: EpochMs) -> String {
    let list = body["objectives"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if list.is_empty() {
        return match status {
            Some(status) => format!("no {status} objectives assigned to {me}"),
            None => format!("no objectives assigned to {me}"),
        };
    }
    let mut text = format!("objectives for {me}:");
    for o in list {
        text.push_str(&format!(
            "\n- {} [{}] {}\n    outcome: {}\n    updated: {}",
            s(&o["id"]),
            s(&o["status"]),
            s(&o["title"]),
            s(&o["outcome"]),
            when(&o["updatedAt"], now_ms)
        ));
    }
    text
}

pub(super) fn objective_view(body: &Value, now_ms: EpochMs) -> String {
    let o = &body["objective"];
    let mut lines = vec![
        format!("{} [{}] {}", s(&o["id"]), s(&o["status"]), s(&o["title"])),
        format!(
            "assignee: {}  originator: {}",
            s(&o["assignee"]),
            s(&o["originator"])
        ),
        format!("outcome: {}", s(&o["outcome"])),
        format!("created: {}", when(&o["createdAt"], now_ms)),
        format!("updated: {}", when(&o["updatedAt"], now_ms)),
    ];
    if !o["completedAt"].is_null() {
        lines.push(format!("completed: {}", when(&o["completedAt"], now_ms)));
    }
    let watchers: Vec<&str> = o["watchers"]
        .as_array()
        .map(|w| w.iter().map(s).collect())
        .unwrap_or_default();
    if !watchers.is_empty() {
        lines.push(format!("watchers: {}", watchers.join(", ")));
    }
    for (label, key) in [
        ("body", "body"),
        ("block reason", "blockReason"),
        ("result", "result"),
    ] {
        if let Some(v) = o[key].as_str().filter(|v| !v.is_empty()) {
            lines.push(format!("{label}: {v}"));
        }
    }
    let attachments: Vec<&str> = o["attachments"]
        .as_array()
        .map(|a| a.iter().map(|a| s(&a["path"])).collect())
        .unwrap_or_default();
    if !attachments.is_empty() {
        lines.push(format!("attachments: {}", attachments.join(", ")));
    }
    lines.push("events:".to_owned());
    for e in body["events"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        lines.push(format!(
            "  {} {} {} {}",
            when(&e["ts"], now_ms),
            s(&e["actor"]),
            s(&e["kind"]),
            e["payload"]
        ));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The roster text read through `Value` indexing, the leniency the typed reading keeps.
    fn roster_by_value(team: &str, me: &str, body: &Value) -> String {
        let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
        let teammates = list(&body["teammates"]);
        if teammates.is_empty() {
            return "team roster: (no slots defined)".to_owned();
        }
        let mut text = format!("team {team} roster:");
        for t in &teammates {
            let name = s(&t["name"]);
            let perms: Vec<&str> = t["permissions"]
                .as_array()
                .map(|p| p.iter().map(s).collect())
                .unwrap_or_default();
            let auth = match () {
                () if perms.contains(&"members.manage") => " [admin]",
                () if perms.contains(&"objectives.create") => " [operator]",
                () => "",
            };
            let n = list(&body["connected"])
                .iter()
                .find(|p| s(&p["name"]) == name)
                .and_then(|p| p["connected"].as_u64())
                .unwrap_or(0);
            let state = if n == 0 {
                "offline".to_owned()
            } else {
                format!("connected={n}")
            };
            let you = if name == me { " (you)" } else { "" };
            text.push_str(&format!(
                "\n- {name}{you} [{}]{auth} {state}",
                s(&t["role"]["title"])
            ));
        }
        text
    }

    /// Any JSON value, small.
    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e3f64..1e3).prop_map(Value::from),
            prop::sample::select(vec![
                "ann",
                "bob",
                "",
                "members.manage",
                "objectives.create",
                "a\"b"
            ])
            .prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::vec(
                    (prop::sample::select(vec!["name", "title", "x"]), inner),
                    0..3
                )
                .prop_map(|kv| Value::Object(
                    kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
                )),
            ]
        })
    }

    /// A roster-like answer whose every field may be missing or of any kind.
    fn roster_json() -> impl Strategy<Value = Value> {
        let name = prop_oneof![
            prop::sample::select(vec!["ann", "bob", "cy", "a\"b", "é"]).prop_map(Value::from),
            any_json(),
        ];
        let count = prop_oneof![
            (-2i64..4).prop_map(Value::from),
            Just(json!(2.0)),
            any_json()
        ];
        let perms = prop_oneof![
            prop::collection::vec(
                prop_oneof![
                    prop::sample::select(vec!["members.manage", "objectives.create", "fs.read"])
                        .prop_map(Value::from),
                    any_json()
                ],
                0..3
            )
            .prop_map(Value::from),
            any_json(),
        ];
        let role = prop_oneof![
            prop::sample::select(vec!["lead", "qa", ""])
                .prop_map(|t| json!({"title": t, "description": "d"})),
            any_json(),
        ];
        let mate = (name.clone(), role, perms, any::<u8>()).prop_map(|(n, r, p, drop)| {
            let mut m = serde_json::Map::new();
            for (i, (k, v)) in [("name", n), ("role", r), ("permissions", p)]
                .into_iter()
                .enumerate()
            {
                if drop & (1 << i) == 0 {
                    m.insert(k.to_owned(), v);
                }
            }
            Value::Object(m)
        });
        let presence = (name, count).prop_map(|(n, c)| json!({"name": n, "connected": c}));
        prop_oneof![
            4 => (
                prop_oneof![prop::collection::vec(mate, 0..4).prop_map(Value::from), any_json()],
                prop_oneof![prop::collection::vec(presence, 0..6).prop_map(Value::from), any_json()],
            )
                .prop_map(|(t, c)| json!({"teammates": t, "connected": c, "extra": [1, {"x": null}]})),
            1 => any_json(),
        ]
    }

    proptest! {
        #![proptest_config(crate::test_support::proptest_config("toolbox_roster"))]
        #[test]
        fn the_typed_roster_reads_as_leniently_as_a_value(body in roster_json()) {
            let bytes = serde_json::to_vec(&body).unwrap();
            let view: RosterView = lenient::read(&bytes).unwrap();
            prop_assert_eq!(roster("demo", "bob", &view), roster_by_value("demo", "bob", &body));
        }
    }

    #[test]
    fn ages() {
        let now = 10_000_000;
        assert_eq!(age(now + 5_000, now), "future");
        assert_eq!(age(now - 59_999, now), "just now");
        assert_eq!(age(now - 60_000, now), "1m ago");
        assert_eq!(age(now - 3_600_000, now), "1h ago");
        assert_eq!(age(now - 86_400_000 * 3, now), "3d ago");
    }
}
