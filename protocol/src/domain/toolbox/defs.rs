//! The pieces tool definitions for `tools/list` are made of: property schemas, the teammate list and
//! the open-objectives summary.
//!
//! Names, property names, types, enums and `required` lists are exact (as the reference runner serves them);
//! `title` is accepted on `broadcast`, `send`, `channels_post` and `objectives_discuss`
//! (our choice). Descriptions are ours; they name the agent, its role, team and teammates, and
//! `objectives_list`'s carries the live open objectives so the agent sees what it is working on
//! after its context is compacted.

use serde_json::{Map, Value, json};

use super::Briefing;
use crate::domain::message::LogLevel;
use crate::domain::objective::Objective;

/// One property: `(name, schema)`.
pub(super) type Prop = (&'static str, Value);

pub(super) fn string(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

pub(super) fn string_array(description: &str) -> Value {
    json!({"type": "array", "items": {"type": "string"}, "description": description})
}

pub(super) fn level_schema() -> Value {
    json!({"type": "string", "enum": LogLevel::ALL.map(LogLevel::as_str), "description": "Optional severity; defaults to 'info'."})
}

pub(super) fn attachments() -> Value {
    string_array(
        "Optional files to attach: paths in the shared file space (e.g. /you/notes.md). Each must \
         exist; recipients get read access.",
    )
}

pub(super) fn tool(name: &str, description: String, props: Vec<Prop>, required: &[&str]) -> Value {
    let properties: Map<String, Value> =
        props.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let mut schema = json!({"type": "object", "properties": properties});
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    json!({"name": name, "description": description, "inputSchema": schema})
}

pub(super) fn teammate_list(b: &Briefing) -> String {
    let others: Vec<String> = b
        .teammates
        .iter()
        .filter(|t| t.name != b.name)
        .map(|t| format!("{} ({})", t.name, t.role.title))
        .collect();
    if others.is_empty() {
        "(no other teammates yet)".to_owned()
    } else {
        others.join(", ")
    }
}

pub(super) fn open_objectives_summary(open: &[Objective]) -> String {
    if open.is_empty() {
        return "You have no open objectives right now.".to_owned();
    }
    let mut text = format!("Your open objectives ({}):", open.len());
    for o in open {
        text.push_str(&format!(
            "\n- {} [{}] {} — outcome: {}",
            o.id,
            o.status.as_str(),
            o.title,
            o.outcome
        ));
    }
    text
}
