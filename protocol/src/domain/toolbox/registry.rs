//! The toolbox registry: every tool declared once, as a [`Tool`] row — its name, who sees it, its
//! `tools/list` definition and its plan — in the area files (`chat`, `objectives`, `fs`, `admin`).
//! [`tool_list`] and [`plan`] read the same rows, so a tool cannot be listed without a plan or
//! planned under a name it is not listed by.
//!
//! The gate only decides what `tools/list` shows; the broker enforces permissions, so [`plan`]
//! runs a gated tool for anyone who calls it by name and reports the broker's answer.

use serde_json::{Map, Value, json};

use super::defs::{Prop, teammate_list, tool};
use super::tools::fail;
use super::{Context, Plan, admin, chat, fs, objectives};
use crate::domain::objective::Objective;
use crate::domain::permission::Permission;

/// One tool.
pub(super) struct Tool {
    /// The name the agent calls it by.
    pub(super) name: &'static str,
    /// Listed only to an agent holding one of these leaves; empty: listed to everyone.
    pub(super) gate: &'static [Permission],
    /// Its `tools/list` definition for this agent.
    pub(super) def: fn(&Listing<'_>) -> Def,
    /// Starts the tool with its arguments.
    pub(super) plan: fn(Context, &Map<String, Value>) -> Plan,
}

/// A definition: `(description, properties, required property names)`.
pub(super) type Def = (String, Vec<Prop>, &'static [&'static str]);

/// What definitions are composed from: the briefing, and the names and texts several of them share.
pub(super) struct Listing<'a> {
    /// The agent's context (its permissions decide some descriptions).
    pub(super) ctx: &'a Context,
    /// The agent's open objectives.
    pub(super) open: &'a [Objective],
    /// The team's name.
    pub(super) team: &'a str,
    /// The agent's name.
    pub(super) me: &'a str,
    /// `<me> (role: <title>)`.
    pub(super) identity: String,
    /// The other teammates, `name (title)`, comma-separated.
    pub(super) mates: String,
    /// The agent's home directory, `/<me>`.
    pub(super) home: String,
}

/// Every tool, in `tools/list` order.
fn registry() -> impl Iterator<Item = &'static Tool> {
    [
        chat::TOOLS,
        objectives::OWN,
        fs::TOOLS,
        objectives::MANAGING,
        admin::TOOLS,
    ]
    .into_iter()
    .flatten()
}

/// The `tools/list` result for this agent: `{"tools": […]}`.
pub fn tool_list(ctx: &Context, open: &[Objective]) -> Value {
    let b = &ctx.briefing;
    let listing = Listing {
        ctx,
        open,
        team: &b.team.name,
        me: &b.name,
        identity: format!("{} (role: {})", b.name, b.role.title),
        mates: teammate_list(b),
        home: format!("/{}", b.name),
    };
    let tools: Vec<Value> = registry()
        .filter(|t| t.gate.is_empty() || t.gate.iter().any(|p| ctx.has(p.as_str())))
        .map(|t| {
            let (description, props, required) = (t.def)(&listing);
            tool(t.name, description, props, required)
        })
        .collect();
    json!({ "tools": tools })
}

/// Starts the tool `name` with `args` (a JSON object; anything else is read as `{}`).
pub fn plan(ctx: &Context, name: &str, args: &Value) -> Plan {
    let empty = Map::new();
    let args = args.as_object().unwrap_or(&empty);
    match registry().find(|t| t.name == name) {
        Some(t) => (t.plan)(ctx.clone(), args),
        None => fail(format!("unknown tool: {name}")),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::registry;

    #[test]
    fn every_tool_is_declared_once() {
        let mut seen = BTreeSet::new();
        for t in registry() {
            assert!(seen.insert(t.name), "{} is declared twice", t.name);
        }
        assert_eq!(seen.len(), 31);
    }
}
