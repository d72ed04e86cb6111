//! Tool definitions for `tools/list`, composed from the briefing and the open objectives.
//!
//! Names, property names, types, enums and `required` lists are exact (seed 002, the captures);
//! `title` is accepted on `broadcast`, `send`, `channels_post` and `objectives_discuss`
//! (DECISIONS.md). Descriptions are ours; they name the agent, its role, team and teammates, and
//! `objectives_list`'s carries the live open objectives so the agent sees what it is working on
//! after its context is compacted.

use serde_json::{Map, Value, json};

use super::{Briefing, Context};
use crate::objective::Objective;

const LEVELS: [&str; 6] = ["debug", "info", "notice", "warning", "error", "critical"];

/// One property: `(name, schema)`.
type Prop = (&'static str, Value);

fn string(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

fn strings(description: &str) -> Value {
    json!({"type": "array", "items": {"type": "string"}, "description": description})
}

fn level() -> Value {
    json!({"type": "string", "enum": LEVELS, "description": "Optional severity; defaults to 'info'."})
}

fn attachments() -> Value {
    strings(
        "Optional files to attach: paths in the shared file space (e.g. /you/notes.md). Each must \
         exist; recipients get read access.",
    )
}

fn tool(name: &str, description: String, props: Vec<Prop>, required: &[&str]) -> Value {
    let properties: Map<String, Value> =
        props.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let mut schema = json!({"type": "object", "properties": properties});
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    json!({"name": name, "description": description, "inputSchema": schema})
}

fn teammate_list(b: &Briefing) -> String {
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

fn open_objectives_summary(open: &[Objective]) -> String {
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

/// The `tools/list` result for this agent: `{"tools": […]}`.
pub fn tool_list(ctx: &Context, open: &[Objective]) -> Value {
    let b = &ctx.briefing;
    let me = &b.name;
    let team = &b.team.name;
    let identity = format!("{me} (role: {})", b.role.title);
    let mates = teammate_list(b);
    let home = format!("/{me}");
    let mut tools = vec![
        tool(
            "roster",
            format!("List everyone on team {team} with their role, authority and whether they are connected. You are {identity}."),
            vec![],
            &[],
        ),
        tool(
            "broadcast",
            format!(
                "Post a message to team {team}'s general channel; every teammate sees it at once. You are {identity}. \
                 Teammates: {mates}. Attach files from your home ({home}/...) by path."
            ),
            vec![
                ("body", string("The message everyone on the team will read.")),
                ("title", string("Optional short title.")),
                ("level", level()),
                ("attachments", attachments()),
            ],
            &["body"],
        ),
        tool(
            "send",
            format!("Send a direct message to one teammate on team {team}; only the two of you see it. You are {identity}. Teammates: {mates}."),
            vec![
                ("to", string("The teammate's name.")),
                ("body", string("The message.")),
                ("title", string("Optional short title.")),
                ("level", level()),
                ("attachments", attachments()),
            ],
            &["to", "body"],
        ),
        tool(
            "channels_list",
            format!("List team {team}'s channels: the ones you belong to first (general always), then the ones you could join."),
            vec![],
            &[],
        ),
        tool(
            "channels_post",
            format!("Post a message in one of team {team}'s named channels, by slug. You must be a member of it. You are {identity}."),
            vec![
                ("channel", string("The channel's slug, e.g. frontend (see channels_list).")),
                ("body", string("The message.")),
                ("title", string("Optional short title.")),
                ("level", level()),
                ("attachments", attachments()),
            ],
            &["channel", "body"],
        ),
        tool(
            "recent",
            format!(
                "Read recent messages, newest first: team {team}'s general channel by default, a direct conversation \
                 (with) or a named channel (channel) — not both. You are {identity}. Default 50 messages, at most 500."
            ),
            vec![
                ("with", string("A teammate's name: your direct messages with them.")),
                ("channel", string("A channel slug.")),
                ("limit", json!({"type": "number", "description": "Max messages to return (default 50, max 500)."})),
            ],
            &[],
        ),
        tool(
            "objectives_list",
            format!(
                "List the objectives on team {team} that concern you, optionally by status. Use objectives_view for \
                 the full record, watchers and history.\n\n{}",
                open_objectives_summary(open)
            ),
            vec![(
                "status",
                json!({"type": "string", "enum": ["active", "blocked", "done", "cancelled"], "description": "Only objectives in this status."}),
            )],
            &[],
        ),
        tool(
            "objectives_view",
            "Show one objective in full: title, outcome, status, people, body, block reason, result and its audit log.".to_owned(),
            vec![("id", string("The objective id (e.g. obj-xxxxx-y)."))],
            &["id"],
        ),
        tool(
            "objectives_update",
            "Move an objective you are assigned between active and blocked; blocking needs a reason. Use \
             objectives_discuss for progress notes and objectives_complete to finish it."
                .to_owned(),
            vec![
                ("id", string("The objective id.")),
                ("status", json!({"type": "string", "enum": ["active", "blocked"], "description": "The new status."})),
                ("blockReason", string("What blocks you (required when status is blocked).")),
            ],
            &["id", "status"],
        ),
        tool(
            "objectives_discuss",
            "Post in an objective's discussion thread; its originator, assignee, watchers and managers all receive it.".to_owned(),
            vec![
                ("id", string("The objective id.")),
                ("body", string("The message to post into the objective thread.")),
                ("title", string("Optional short title.")),
                ("attachments", attachments()),
            ],
            &["id", "body"],
        ),
        tool(
            "objectives_complete",
            "Mark an objective you are assigned as done, with the result that meets its outcome. The originator is told.".to_owned(),
            vec![
                ("id", string("The objective id.")),
                ("result", string("What was delivered, stated against the outcome.")),
            ],
            &["id", "result"],
        ),
        tool(
            "fs_ls",
            format!("List a directory in the shared file space. Defaults to your home ({home})."),
            vec![("path", string(&format!("Absolute path to list. Defaults to your home (\"{home}\").")))],
            &[],
        ),
        tool(
            "fs_stat",
            "Show one file or directory entry: kind, size, type, owner.".to_owned(),
            vec![("path", string("Absolute path."))],
            &["path"],
        ),
        tool(
            "fs_read",
            "Read a file. Text (text/*, application/json, application/xml) comes back as UTF-8, anything else as base64.".to_owned(),
            vec![("path", string("Absolute path of the file."))],
            &["path"],
        ),
        tool(
            "fs_write",
            format!("Write a file ({me}: your home is {home}). Give exactly one of text or base64; parent directories are created."),
            vec![
                ("path", string(&format!("Absolute path, e.g. {home}/notes.md."))),
                ("mimeType", string("The file's MIME type, e.g. text/markdown.")),
                ("text", string("The content as text.")),
                ("base64", string("The content as base64.")),
                ("collide", json!({"type": "string", "enum": ["error", "suffix", "overwrite"], "description": "What to do if the file exists (default error)."})),
            ],
            &["path", "mimeType"],
        ),
        tool(
            "fs_mkdir",
            format!("Create a directory ({me}: your home is {home})."),
            vec![
                ("path", string("Absolute path of the new directory.")),
                ("recursive", json!({"type": "boolean", "description": "Create missing parents too (default false)."})),
            ],
            &["path"],
        ),
        tool(
            "fs_rm",
            "Remove a file or directory; a directory with content needs recursive.".to_owned(),
            vec![
                ("path", string("Absolute path.")),
                ("recursive", json!({"type": "boolean", "description": "Remove a directory and everything in it."})),
            ],
            &["path"],
        ),
        tool(
            "fs_mv",
            "Move or rename a file (directories cannot be moved yet).".to_owned(),
            vec![("from", string("Current absolute path.")), ("to", string("New absolute path."))],
            &["from", "to"],
        ),
        tool(
            "fs_shared",
            "List the files others shared with you by attaching them to messages or objectives.".to_owned(),
            vec![],
            &[],
        ),
    ];
    if ctx.has("objectives.create") {
        tools.push(tool(
            "objectives_create",
            format!(
                "Create an objective on team {team} and assign it. The outcome is a contract: state the tangible, \
                 checkable result, not an intention. You ({me}) become its originator. Teammates: {mates}."
            ),
            vec![
                ("title", string("Short title.")),
                ("outcome", string("The verifiable result that means done.")),
                ("body", string("Optional details.")),
                ("assignee", string("Who does it.")),
                ("watchers", strings("Optional teammates who follow the thread.")),
                ("attachments", attachments()),
            ],
            &["title", "outcome", "assignee"],
        ));
    }
    if ctx.has("objectives.cancel") || ctx.has("objectives.create") {
        let scope = if ctx.has("objectives.cancel") {
            "You may cancel any objective."
        } else {
            "You may cancel objectives you originated."
        };
        tools.push(tool(
            "objectives_cancel",
            format!("Cancel an objective for good (create a new one if priorities change again). {scope}"),
            vec![("id", string("The objective id.")), ("reason", string("Why it is cancelled."))],
            &["id"],
        ));
    }
    if ctx.has("objectives.watch") || ctx.has("objectives.create") {
        let scope = if ctx.has("objectives.watch") {
            "You may change the watchers of any objective."
        } else {
            "You may change the watchers of objectives you originated."
        };
        tools.push(tool(
            "objectives_watchers",
            format!("Add or remove watchers of an objective's thread. {scope}"),
            vec![
                ("id", string("The objective id.")),
                ("add", strings("Names to add.")),
                ("remove", strings("Names to remove.")),
            ],
            &["id"],
        ));
    }
    if ctx.has("members.manage") || ctx.has("objectives.reassign") {
        tools.push(tool(
            "objectives_reassign",
            format!("Give an open objective to another teammate. Teammates: {mates}."),
            vec![
                ("id", string("The objective id.")),
                ("to", string("The new assignee.")),
                ("note", string("Optional note for the thread.")),
            ],
            &["id", "to"],
        ));
    }
    if ctx.has("team.manage") {
        tools.extend([
            tool(
                "team_get",
                format!("Show team {team}: name, directive, context and permission presets."),
                vec![],
                &[],
            ),
            tool(
                "team_update",
                format!("Change team {team}'s name, directive or context."),
                vec![
                    ("name", string("New team name.")),
                    ("directive", string("New directive.")),
                    ("context", string("New context.")),
                ],
                &[],
            ),
            tool(
                "presets_list",
                "List the permission presets.".to_owned(),
                vec![],
                &[],
            ),
            tool(
                "presets_set",
                "Create or replace a permission preset.".to_owned(),
                vec![
                    ("name", string("Preset name.")),
                    ("permissions", strings("Leaf permissions.")),
                ],
                &["name", "permissions"],
            ),
            tool(
                "presets_delete",
                "Delete a permission preset.".to_owned(),
                vec![("name", string("Preset name."))],
                &["name"],
            ),
        ]);
    }
    if ctx.has("members.manage") {
        let member_props = || {
            vec![
                ("name", string("Member name.")),
                ("title", string("Role title.")),
                ("description", string("Role description.")),
                ("instructions", string("Personal instructions.")),
                ("permissions", strings("Permissions or preset names.")),
            ]
        };
        tools.extend([
            tool(
                "members_add",
                format!("Add a member to team {team}; prints their bearer token once."),
                member_props(),
                &["name", "title"],
            ),
            tool(
                "members_update",
                format!("Change a member of team {team}."),
                member_props(),
                &["name"],
            ),
            tool(
                "members_remove",
                format!("Remove a member from team {team} and revoke their tokens."),
                vec![("name", string("Member name."))],
                &["name"],
            ),
        ]);
    }
    json!({ "tools": tools })
}
