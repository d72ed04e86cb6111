//! Administration tools: the team, its permission presets and its members.

use serde_json::{Map, Value, json};

use super::defs::{Prop, string, string_array};
use super::format::s;
use super::registry::{Def, Listing, Tool};
use super::tools::{call, fail, get, json_body, ok, string_list, strings, text};
use super::{Body, Context, Method, Plan, encode_component};
use crate::domain::permission::Permission;

/// Team and member administration; listed to `team.manage` and `members.manage`.
pub(super) const TOOLS: &[Tool] = &[
    Tool {
        name: "team_get",
        gate: &[Permission::TeamManage],
        def: team_get_def,
        plan: team_get,
    },
    Tool {
        name: "team_update",
        gate: &[Permission::TeamManage],
        def: team_update_def,
        plan: team_update,
    },
    Tool {
        name: "presets_list",
        gate: &[Permission::TeamManage],
        def: presets_list_def,
        plan: presets_list,
    },
    Tool {
        name: "presets_set",
        gate: &[Permission::TeamManage],
        def: presets_set_def,
        plan: presets_set,
    },
    Tool {
        name: "presets_delete",
        gate: &[Permission::TeamManage],
        def: presets_delete_def,
        plan: presets_delete,
    },
    Tool {
        name: "members_add",
        gate: &[Permission::MembersManage],
        def: members_add_def,
        plan: members_add,
    },
    Tool {
        name: "members_update",
        gate: &[Permission::MembersManage],
        def: members_update_def,
        plan: members_update,
    },
    Tool {
        name: "members_remove",
        gate: &[Permission::MembersManage],
        def: members_remove_def,
        plan: members_remove,
    },
];

fn team_get_def(l: &Listing) -> Def {
    let Listing { team, .. } = l;
    (
        format!("Show team {team}: name, directive, context and permission presets."),
        vec![],
        &[],
    )
}

fn team_get(_ctx: Context, _args: &Map<String, Value>) -> Plan {
    get("/team".into(), |body| {
        let team = &body["team"];
        ok(team_text(team))
    })
}

fn team_update_def(l: &Listing) -> Def {
    let Listing { team, .. } = l;
    (
        format!("Change team {team}'s name, directive or context."),
        vec![
            ("name", string("New team name.")),
            ("directive", string("New directive.")),
            ("context", string("New context.")),
        ],
        &[],
    )
}

fn team_update(_ctx: Context, args: &Map<String, Value>) -> Plan {
    let mut fields = Map::new();
    for key in ["name", "directive", "context"] {
        if let Some(Value::String(v)) = args.get(key) {
            fields.insert(key.to_owned(), json!(v));
        }
    }
    if fields.is_empty() {
        return fail("team_update: pass at least one of name, directive, context");
    }
    let keys: Vec<String> = fields.keys().cloned().collect();
    call(
        Method::Patch,
        "/team".into(),
        json_body(Value::Object(fields)),
        move |body| {
            ok(format!(
                "team_update applied: fields={} name='{}'\nnote: live MCP sessions still see the OLD briefing until the runner restarts.",
                keys.join(","),
                s(&body["team"]["name"])
            ))
        },
    )
}

fn presets_list_def(_: &Listing) -> Def {
    ("List the permission presets.".to_owned(), vec![], &[])
}

fn presets_list(_ctx: Context, _args: &Map<String, Value>) -> Plan {
    get("/team/presets".into(), |body| {
        let presets = body["presets"].as_object().cloned().unwrap_or_default();
        if presets.is_empty() {
            return ok("(no presets)");
        }
        let lines: Vec<String> = presets
            .iter()
            .map(|(name, leaves)| format!("- {name}: {}", string_list(leaves).join(", ")))
            .collect();
        ok(lines.join("\n"))
    })
}

fn presets_set_def(_: &Listing) -> Def {
    (
        "Create or replace a permission preset.".to_owned(),
        vec![
            ("name", string("Preset name.")),
            ("permissions", string_array("Leaf permissions.")),
        ],
        &["name", "permissions"],
    )
}

fn presets_set(_ctx: Context, args: &Map<String, Value>) -> Plan {
    let name = text(args, "name");
    if name.is_empty() {
        return fail("presets_set: `name` is required");
    }
    let Some(Value::Array(perms)) = args.get("permissions") else {
        return fail("presets_set: `permissions` must be an array of leaf strings");
    };
    let body = json_body(json!({ "permissions": perms }));
    let path = format!("/team/presets/{}", encode_component(&name));
    call(Method::Put, path, body, move |body| {
        let leaves = string_list(&body["preset"]["permissions"]);
        ok(format!("preset '{name}' set: {}", leaves.join(", ")))
    })
}

fn presets_delete_def(_: &Listing) -> Def {
    (
        "Delete a permission preset.".to_owned(),
        vec![("name", string("Preset name."))],
        &["name"],
    )
}

fn presets_delete(_ctx: Context, args: &Map<String, Value>) -> Plan {
    let name = text(args, "name");
    if name.is_empty() {
        return fail("presets_delete: `name` is required");
    }
    let path = format!("/team/presets/{}", encode_component(&name));
    call(Method::Delete, path, Body::Empty, |body| {
        let refs = string_list(&body["referencedBy"]);
        let mut text = format!("preset '{}' deleted", s(&body["deleted"]));
        if !refs.is_empty() {
            text.push_str(&format!("; still referenced by: {}", refs.join(", ")));
        }
        ok(text)
    })
}

/// The properties `members_add` and `members_update` share.
fn member_props() -> Vec<Prop> {
    vec![
        ("name", string("Member name.")),
        ("title", string("Role title.")),
        ("description", string("Role description.")),
        ("instructions", string("Personal instructions.")),
        ("permissions", string_array("Permissions or preset names.")),
    ]
}

fn members_add_def(l: &Listing) -> Def {
    let Listing { team, .. } = l;
    (
        format!("Add a member to team {team}; prints their bearer token once."),
        member_props(),
        &["name", "title"],
    )
}

fn members_add(_ctx: Context, args: &Map<String, Value>) -> Plan {
    let (name, title) = (text(args, "name"), text(args, "title"));
    if name.is_empty() || title.is_empty() {
        return fail("members_add: `name` and `title` are required");
    }
    let body = json_body(json!({
        "name": name,
        "role": {"title": title, "description": text(args, "description")},
        "instructions": text(args, "instructions"),
        "permissions": strings(args, "permissions"),
    }));
    call(Method::Post, "/members".into(), body, move |body| {
        ok(format!(
            "member '{name}' created.\nbearer token (capture now — not shown again):\n  {}",
            s(&body["token"])
        ))
    })
}

fn members_update_def(l: &Listing) -> Def {
    let Listing { team, .. } = l;
    (
        format!("Change a member of team {team}."),
        member_props(),
        &["name"],
    )
}

fn members_update(_ctx: Context, args: &Map<String, Value>) -> Plan {
    let name = text(args, "name");
    if name.is_empty() {
        return fail("members_update: `name` is required");
    }
    let mut fields = Map::new();
    if args.get("title").is_some_and(Value::is_string)
        || args.get("description").is_some_and(Value::is_string)
    {
        fields.insert(
            "role".into(),
            json!({"title": text(args, "title"), "description": text(args, "description")}),
        );
    }
    if let Some(Value::String(i)) = args.get("instructions") {
        fields.insert("instructions".into(), json!(i));
    }
    if args.get("permissions").is_some_and(Value::is_array) {
        fields.insert("permissions".into(), json!(strings(args, "permissions")));
    }
    if fields.is_empty() {
        return fail(
            "members_update: nothing to update (title, description, instructions, permissions)",
        );
    }
    let keys: Vec<String> = fields.keys().cloned().collect();
    let path = format!("/members/{}", encode_component(&name));
    call(
        Method::Patch,
        path,
        json_body(Value::Object(fields)),
        move |_| {
            ok(format!(
                "member '{name}' updated: fields={}\nnote: instruction changes apply to that member's NEXT MCP session, not the live one.",
                keys.join(",")
            ))
        },
    )
}

fn members_remove_def(l: &Listing) -> Def {
    let Listing { team, .. } = l;
    (
        format!("Remove a member from team {team} and revoke their tokens."),
        vec![("name", string("Member name."))],
        &["name"],
    )
}

fn members_remove(_ctx: Context, args: &Map<String, Value>) -> Plan {
    let name = text(args, "name");
    if name.is_empty() {
        return fail("members_remove: `name` is required");
    }
    let path = format!("/members/{}", encode_component(&name));
    call(Method::Delete, path, Body::Empty, move |_| {
        ok(format!(
            "member '{name}' removed; all bearer tokens revoked."
        ))
    })
}

fn team_text(team: &Value) -> String {
    let presets: Vec<&String> = team["permissionPresets"]
        .as_object()
        .map(|p| p.keys().collect())
        .unwrap_or_default();
    let context = s(&team["context"]);
    format!(
        "team: {}\ndirective: {}\ncontext: {}\npresets: {}",
        s(&team["name"]),
        s(&team["directive"]),
        if context.is_empty() {
            "(empty)"
        } else {
            context
        },
        if presets.is_empty() {
            "(none)".to_owned()
        } else {
            presets
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        }
    )
}
