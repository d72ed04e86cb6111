//! Objective tools: the ones every member has on their own objectives, and the managing ones
//! listed to members whose permissions allow them.

use serde_json::{Map, Value, json};

use super::defs::{attachments, open_objectives_summary, string, string_array};
use super::format::{self, s};
use super::registry::{Def, Listing, Tool};
use super::tools::{
    attachment_paths, call, fail, get, json_body, ok, resolve_attachments, string_list, strings,
    text,
};
use super::{Context, Method, Plan, ToolText, encode_component};
use crate::domain::permission::Permission;
const STATUSES: [&str; 4] = ["active", "blocked", "done", "cancelled"];

/// Working on one's own objectives; listed to everyone.
pub(super) const OWN: &[Tool] = &[
    Tool {
        name: "objectives_list",
        gate: &[],
        def: objectives_list_def,
        plan: objectives_list,
    },
    Tool {
        name: "objectives_view",
        gate: &[],
        def: objectives_view_def,
        plan: objectives_view,
    },
    Tool {
        name: "objectives_update",
        gate: &[],
        def: objectives_update_def,
        plan: objectives_update,
    },
    Tool {
        name: "objectives_discuss",
        gate: &[],
        def: objectives_discuss_def,
        plan: objectives_discuss,
    },
    Tool {
        name: "objectives_complete",
        gate: &[],
        def: objectives_complete_def,
        plan: objectives_complete,
    },
];

/// Creating and steering objectives; listed by permission.
pub(super) const MANAGING: &[Tool] = &[
    Tool {
        name: "objectives_create",
        gate: &[Permission::ObjectivesCreate],
        def: objectives_create_def,
        plan: objectives_create,
    },
    Tool {
        name: "objectives_cancel",
        gate: &[Permission::ObjectivesCancel, Permission::ObjectivesCreate],
        def: objectives_cancel_def,
        plan: objectives_cancel,
    },
    Tool {
        name: "objectives_watchers",
        gate: &[Permission::ObjectivesWatch, Permission::ObjectivesCreate],
        def: objectives_watchers_def,
        plan: objectives_watchers,
    },
    Tool {
        name: "objectives_reassign",
        gate: &[Permission::MembersManage, Permission::ObjectivesReassign],
        def: objectives_reassign_def,
        plan: objectives_reassign,
    },
];

fn objectives_list_def(l: &Listing) -> Def {
    let Listing { team, open, .. } = l;
    (
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
    )
}

fn objectives_list(ctx: Context, args: &Map<String, Value>) -> Plan {
    let status = match args.get("status") {
        None | Some(Value::Null) => None,
        Some(Value::String(st)) if STATUSES.contains(&st.as_str()) => Some(st.clone()),
        Some(other) => {
            let shown = other
                .as_str()
                .map_or_else(|| other.to_string(), str::to_owned);
            return fail(format!(
                "objectives_list: invalid status '{shown}'. Must be one of: active, blocked, done, cancelled."
            ));
        }
    };
    let mut path = format!("/objectives?assignee={}", encode_component(ctx.me()));
    if let Some(status) = &status {
        path.push_str(&format!("&status={status}"));
    }
    get(path, move |body| {
        ok(format::objectives(
            ctx.me(),
            status.as_deref(),
            &body,
            ctx.now_ms,
        ))
    })
}

fn objectives_view_def(_: &Listing) -> Def {
    (
        "Show one objective in full: title, outcome, status, people, body, block reason, result and its audit log.".to_owned(),
        vec![("id", string("The objective id (e.g. obj-xxxxx-y)."))],
        &["id"],
    )
}

fn objectives_view(ctx: Context, args: &Map<String, Value>) -> Plan {
    let id = text(args, "id");
    if id.is_empty() {
        return fail("objectives_view: `id` is required");
    }
    get(
        format!("/objectives/{}", encode_component(&id)),
        move |body| ok(format::objective_view(&body, ctx.now_ms)),
    )
}

fn objectives_update_def(_: &Listing) -> Def {
    (
        "Move an objective you are assigned between active and blocked; blocking needs a reason. Use \
         objectives_discuss for progress notes and objectives_complete to finish it."
            .to_owned(),
        vec![
            ("id", string("The objective id.")),
            ("status", json!({"type": "string", "enum": ["active", "blocked"], "description": "The new status."})),
            ("blockReason", string("What blocks you (required when status is blocked).")),
        ],
        &["id", "status"],
    )
}

fn objectives_update(_ctx: Context, args: &Map<String, Value>) -> Plan {
    let id = text(args, "id");
    if id.is_empty() {
        return fail("objectives_update: `id` is required");
    }
    let status = text(args, "status");
    if status != "active" && status != "blocked" {
        return fail(
            "objectives_update: status is required and must be 'active' or 'blocked' (use objectives_complete for 'done' and objectives_discuss for progress notes)",
        );
    }
    let reason = args
        .get("blockReason")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if status == "blocked" && reason.as_deref().is_none_or(|r| r.trim().is_empty()) {
        return fail("objectives_update: blockReason is required when status=blocked");
    }
    let mut body = json!({ "status": status });
    if let Some(reason) = reason {
        body["blockReason"] = json!(reason);
    }
    let path = format!("/objectives/{}", encode_component(&id));
    call(Method::Patch, path, json_body(body), move |o| {
        let mut text = format!("updated {id}: status={}", s(&o["status"]));
        if let Some(r) = o["blockReason"].as_str().filter(|r| !r.is_empty()) {
            text.push_str(&format!(" blockReason=\"{r}\""));
        }
        Plan::Done(ToolText::ok(text).changing_objectives())
    })
}

fn objectives_discuss_def(_: &Listing) -> Def {
    (
        "Post in an objective's discussion thread; its originator, assignee, watchers and managers all receive it.".to_owned(),
        vec![
            ("id", string("The objective id.")),
            ("body", string("The message to post into the objective thread.")),
            ("title", string("Optional short title.")),
            ("attachments", attachments()),
        ],
        &["id", "body"],
    )
}

fn objectives_discuss(_ctx: Context, args: &Map<String, Value>) -> Plan {
    let (id, body) = (text(args, "id"), text(args, "body"));
    if id.is_empty() || body.is_empty() {
        return fail("objectives_discuss: both `id` and `body` are required");
    }
    let paths = match attachment_paths("objectives_discuss", args) {
        Ok(paths) => paths,
        Err(error) => return Plan::Done(error),
    };
    let title = Some(text(args, "title")).filter(|t| !t.is_empty());
    resolve_attachments("objectives_discuss", paths, move |attachments| {
        let count = attachments.len();
        let mut payload = json!({ "body": body });
        if let Some(title) = title {
            payload["title"] = json!(title);
        }
        if count > 0 {
            payload["attachments"] = Value::Array(attachments);
        }
        let path = format!("/objectives/{}/discuss", encode_component(&id));
        call(Method::Post, path, json_body(payload), move |message| {
            let files = if count > 0 {
                format!(" attachments={count}")
            } else {
                String::new()
            };
            ok(format!(
                "posted to objective {id} thread: msg={}{files} (fanned out to thread members)",
                s(&message["id"])
            ))
        })
    })
}

fn objectives_complete_def(_: &Listing) -> Def {
    (
        "Mark an objective you are assigned as done, with the result that meets its outcome. The originator is told.".to_owned(),
        vec![
            ("id", string("The objective id.")),
            ("result", string("What was delivered, stated against the outcome.")),
        ],
        &["id", "result"],
    )
}

fn objectives_complete(_ctx: Context, args: &Map<String, Value>) -> Plan {
    let (id, result) = (text(args, "id"), text(args, "result"));
    if id.is_empty() || result.is_empty() {
        return fail("objectives_complete: both `id` and `result` are required");
    }
    let path = format!("/objectives/{}/complete", encode_component(&id));
    call(
        Method::Post,
        path,
        json_body(json!({ "result": result })),
        move |_| {
            Plan::Done(
                ToolText::ok(format!(
                    "completed {id}. Result recorded and originator notified."
                ))
                .changing_objectives(),
            )
        },
    )
}

fn objectives_create_def(l: &Listing) -> Def {
    let Listing {
        team, me, mates, ..
    } = l;
    (
        format!(
            "Create an objective on team {team} and assign it. The outcome is a contract: state the tangible, \
             checkable result, not an intention. You ({me}) become its originator. Teammates: {mates}."
        ),
        vec![
            ("title", string("Short title.")),
            ("outcome", string("The verifiable result that means done.")),
            ("body", string("Optional details.")),
            ("assignee", string("Who does it.")),
            (
                "watchers",
                string_array("Optional teammates who follow the thread."),
            ),
            ("attachments", attachments()),
        ],
        &["title", "outcome", "assignee"],
    )
}

fn objectives_create(ctx: Context, args: &Map<String, Value>) -> Plan {
    if !ctx.has("objectives.create") {
        return fail("objectives_create: requires director or manager authority on the team");
    }
    let title = text(args, "title").trim().to_owned();
    let outcome = text(args, "outcome").trim().to_owned();
    let assignee = text(args, "assignee");
    for (value, name) in [
        (&title, "title"),
        (&outcome, "outcome"),
        (&assignee, "assignee"),
    ] {
        if value.is_empty() {
            return fail(format!("objectives_create: `{name}` is required"));
        }
    }
    let paths = match attachment_paths("objectives_create", args) {
        Ok(paths) => paths,
        Err(error) => return Plan::Done(error),
    };
    let watchers = strings(args, "watchers");
    let body = text(args, "body");
    resolve_attachments("objectives_create", paths, move |attachments| {
        let mut payload = json!({"title": title, "outcome": outcome, "assignee": assignee});
        if !body.is_empty() {
            payload["body"] = json!(body);
        }
        if !watchers.is_empty() {
            payload["watchers"] = json!(watchers);
        }
        if !attachments.is_empty() {
            payload["attachments"] = Value::Array(attachments);
        }
        call(
            Method::Post,
            "/objectives".into(),
            json_body(payload),
            |o| {
                let watchers = string_list(&o["watchers"]);
                let mut text = format!(
                    "created {} assigned to {}: {}\noutcome: {}\nwatchers: {}",
                    s(&o["id"]),
                    s(&o["assignee"]),
                    s(&o["title"]),
                    s(&o["outcome"]),
                    if watchers.is_empty() {
                        "(none)".to_owned()
                    } else {
                        watchers.join(", ")
                    }
                );
                let files: Vec<&str> = o["attachments"]
                    .as_array()
                    .map(|a| a.iter().map(|a| s(&a["path"])).collect())
                    .unwrap_or_default();
                if !files.is_empty() {
                    text.push_str(&format!("\nattachments: {}", files.join(", ")));
                }
                Plan::Done(ToolText::ok(text).changing_objectives())
            },
        )
    })
}

fn objectives_cancel_def(l: &Listing) -> Def {
    let scope = if l.ctx.has("objectives.cancel") {
        "You may cancel any objective."
    } else {
        "You may cancel objectives you originated."
    };
    (
        format!(
            "Cancel an objective for good (create a new one if priorities change again). {scope}"
        ),
        vec![
            ("id", string("The objective id.")),
            ("reason", string("Why it is cancelled.")),
        ],
        &["id"],
    )
}

fn objectives_cancel(ctx: Context, args: &Map<String, Value>) -> Plan {
    if !ctx.has("objectives.cancel") && !ctx.has("objectives.create") {
        return fail("objectives_cancel: requires director or manager authority on the team");
    }
    let id = text(args, "id");
    if id.is_empty() {
        return fail("objectives_cancel: `id` is required");
    }
    let reason = text(args, "reason");
    let body = if reason.is_empty() {
        json!({})
    } else {
        json!({ "reason": reason })
    };
    let path = format!("/objectives/{}/cancel", encode_component(&id));
    call(Method::Post, path, json_body(body), move |o| {
        Plan::Done(
            ToolText::ok(format!("cancelled {id}: {}", s(&o["title"]))).changing_objectives(),
        )
    })
}

fn objectives_watchers_def(l: &Listing) -> Def {
    let scope = if l.ctx.has("objectives.watch") {
        "You may change the watchers of any objective."
    } else {
        "You may change the watchers of objectives you originated."
    };
    (
        format!("Add or remove watchers of an objective's thread. {scope}"),
        vec![
            ("id", string("The objective id.")),
            ("add", string_array("Names to add.")),
            ("remove", string_array("Names to remove.")),
        ],
        &["id"],
    )
}

fn objectives_watchers(ctx: Context, args: &Map<String, Value>) -> Plan {
    if !ctx.has("objectives.watch") && !ctx.has("objectives.create") {
        return fail("objectives_watchers: requires director or manager authority on the team");
    }
    let id = text(args, "id");
    if id.is_empty() {
        return fail("objectives_watchers: `id` is required");
    }
    let (add, remove) = (strings(args, "add"), strings(args, "remove"));
    if add.is_empty() && remove.is_empty() {
        return fail("objectives_watchers: must include at least one of `add` or `remove`");
    }
    let mut body = json!({});
    if !add.is_empty() {
        body["add"] = json!(add);
    }
    if !remove.is_empty() {
        body["remove"] = json!(remove);
    }
    let path = format!("/objectives/{}/watchers", encode_component(&id));
    call(Method::Post, path, json_body(body), move |o| {
        let watchers = string_list(&o["watchers"]);
        let list = if watchers.is_empty() {
            "(none)".to_owned()
        } else {
            watchers.join(", ")
        };
        ok(format!("updated {id} watchers: {list}"))
    })
}

fn objectives_reassign_def(l: &Listing) -> Def {
    let Listing { mates, .. } = l;
    (
        format!("Give an open objective to another teammate. Teammates: {mates}."),
        vec![
            ("id", string("The objective id.")),
            ("to", string("The new assignee.")),
            ("note", string("Optional note for the thread.")),
        ],
        &["id", "to"],
    )
}

fn objectives_reassign(ctx: Context, args: &Map<String, Value>) -> Plan {
    if !ctx.has("members.manage") && !ctx.has("objectives.reassign") {
        return fail("objectives_reassign: requires director authority on the team");
    }
    let (id, to) = (text(args, "id"), text(args, "to"));
    if id.is_empty() || to.is_empty() {
        return fail("objectives_reassign: both `id` and `to` are required");
    }
    let note = text(args, "note");
    let mut body = json!({ "to": to });
    if !note.is_empty() {
        body["note"] = json!(note);
    }
    let path = format!("/objectives/{}/reassign", encode_component(&id));
    call(Method::Post, path, json_body(body), move |o| {
        Plan::Done(
            ToolText::ok(format!(
                "reassigned {id} to {}: {}",
                s(&o["assignee"]),
                s(&o["title"])
            ))
            .changing_objectives(),
        )
    })
}
