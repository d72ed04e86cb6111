//! Each tool as a plan: validate, call the broker, format (runner.md §13.3; error texts from the
//! seeds and runner.md).

use serde_json::{Map, Value, json};

use super::format::{self, s};
use super::{Body, Context, Method, Plan, Request, Response, ToolText, encode_component};
use crate::base64;

const LEVELS: &str = "debug, info, notice, warning, error, critical";
const STATUSES: [&str; 4] = ["active", "blocked", "done", "cancelled"];

/// Starts the tool `name` with `args` (a JSON object; anything else is read as `{}`).
pub fn plan(ctx: &Context, name: &str, args: &Value) -> Plan {
    let empty = Map::new();
    let args = args.as_object().unwrap_or(&empty);
    let ctx = ctx.clone();
    match name {
        "roster" => get("/roster".into(), move |body| {
            ok(format::roster(&ctx.briefing.team.name, ctx.me(), &body))
        }),
        "broadcast" => push("broadcast", args, None),
        "send" => push("send", args, None),
        "channels_list" => get("/channels".into(), move |body| {
            ok(format::channels(&ctx.briefing.team.name, &body))
        }),
        "channels_post" => channels_post(args),
        "recent" => recent(ctx, args),
        "objectives_list" => objectives_list(ctx, args),
        "objectives_view" => {
            let id = text(args, "id");
            if id.is_empty() {
                return fail("objectives_view: `id` is required");
            }
            get(
                format!("/objectives/{}", encode_component(&id)),
                move |body| ok(format::objective_view(&body, ctx.now_ms)),
            )
        }
        "objectives_update" => objectives_update(args),
        "objectives_discuss" => objectives_discuss(args),
        "objectives_complete" => {
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
        "objectives_create" => objectives_create(ctx, args),
        "objectives_cancel" => objectives_cancel(ctx, args),
        "objectives_watchers" => objectives_watchers(ctx, args),
        "objectives_reassign" => objectives_reassign(ctx, args),
        "fs_ls" => {
            let path = Some(text(args, "path"))
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| format!("/{}", ctx.me()));
            get(
                format!("/fs/ls?path={}", encode_component(&path)),
                move |body| {
                    let list = body["entries"].as_array().cloned().unwrap_or_default();
                    ok(format::entries(
                        &format!("{path}:"),
                        &list,
                        format!("{path}: (empty)"),
                    ))
                },
            )
        }
        "fs_stat" => {
            let path = text(args, "path");
            if path.is_empty() {
                return fail("fs_stat: `path` is required");
            }
            request(
                Method::Get,
                stat_path(&path),
                Body::Empty,
                move |resp| match resp.status {
                    404 => ok(format!("{path}: not found")),
                    _ => match broker_json(&resp) {
                        Ok(body) => ok(format::entry(&body["entry"])),
                        Err(error) => Plan::Done(error),
                    },
                },
            )
        }
        "fs_read" => fs_read(args),
        "fs_write" => fs_write(args),
        "fs_mkdir" => {
            let path = text(args, "path");
            if path.is_empty() {
                return fail("fs_mkdir: `path` is required");
            }
            let recursive = args.get("recursive") == Some(&Value::Bool(true));
            let body = json_body(json!({"path": path, "recursive": recursive}));
            call(Method::Post, "/fs/mkdir".into(), body, |body| {
                let e = &body["entry"];
                ok(format!(
                    "mkdir {} (owner={})",
                    s(&e["path"]),
                    s(&e["owner"])
                ))
            })
        }
        "fs_rm" => {
            let path = text(args, "path");
            if path.is_empty() {
                return fail("fs_rm: `path` is required");
            }
            let recursive = args.get("recursive") == Some(&Value::Bool(true));
            let mut url = format!("/fs/rm?path={}", encode_component(&path));
            if recursive {
                url.push_str("&recursive=true");
            }
            call(Method::Delete, url, Body::Empty, move |_| {
                ok(format!(
                    "rm {path}{}",
                    if recursive { " (recursive)" } else { "" }
                ))
            })
        }
        "fs_mv" => {
            let (from, to) = (text(args, "from"), text(args, "to"));
            if from.is_empty() || to.is_empty() {
                return fail("fs_mv: both `from` and `to` are required");
            }
            let body = json_body(json!({"from": from, "to": to}));
            call(Method::Post, "/fs/mv".into(), body, move |body| {
                ok(format!("mv {from} → {}", s(&body["entry"]["path"])))
            })
        }
        "fs_shared" => get("/fs/shared".into(), |body| {
            let list = body["entries"].as_array().cloned().unwrap_or_default();
            ok(format::entries(
                "files shared with you:",
                &list,
                "no files currently shared with you".into(),
            ))
        }),
        "team_get" => get("/team".into(), |body| {
            let team = &body["team"];
            ok(team_text(team))
        }),
        "team_update" => {
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
        "presets_list" => get("/team/presets".into(), |body| {
            let presets = body["presets"].as_object().cloned().unwrap_or_default();
            if presets.is_empty() {
                return ok("(no presets)");
            }
            let lines: Vec<String> = presets
                .iter()
                .map(|(name, leaves)| format!("- {name}: {}", string_list(leaves).join(", ")))
                .collect();
            ok(lines.join("\n"))
        }),
        "presets_set" => {
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
        "presets_delete" => {
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
        "members_add" => {
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
        "members_update" => {
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
        "members_remove" => {
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
        other => fail(format!("unknown tool: {other}")),
    }
}

// ---- plans with several steps ----

/// `broadcast` and `send`: validate, resolve attachments, push.
fn push(tool: &'static str, args: &Map<String, Value>, thread: Option<(String, String)>) -> Plan {
    let body = text(args, "body");
    let to = (tool == "send").then(|| text(args, "to"));
    match (&to, body.is_empty()) {
        (Some(to), _) if to.is_empty() => return fail("send: `to` and `body` are required"),
        (Some(_), true) => return fail("send: `to` and `body` are required"),
        (None, true) => return fail(format!("{tool}: `body` is required")),
        _ => {}
    }
    let level = match level(tool, args) {
        Ok(level) => level,
        Err(error) => return Plan::Done(error),
    };
    let paths = match attachment_paths(tool, args) {
        Ok(paths) => paths,
        Err(error) => return Plan::Done(error),
    };
    let title = Some(text(args, "title")).filter(|t| !t.is_empty());
    resolve_attachments(tool, paths, move |attachments| {
        let mut payload = json!({"body": body, "level": level});
        if let Some(to) = &to {
            payload["to"] = json!(to);
        }
        if let Some(title) = title {
            payload["title"] = json!(title);
        }
        if let Some((_, id)) = &thread {
            payload["data"] = json!({ "thread": format!("chan:{id}") });
        }
        let count = attachments.len();
        if count > 0 {
            payload["attachments"] = Value::Array(attachments);
        }
        call(
            Method::Post,
            "/push".into(),
            json_body(payload),
            move |result| {
                let delivery = &result["delivery"];
                let stats = format!(
                    "live={} targets={} msg={}",
                    delivery["live"].as_u64().unwrap_or(0),
                    delivery["targets"].as_u64().unwrap_or(0),
                    s(&result["message"]["id"])
                );
                let head = match (&to, &thread) {
                    (Some(to), _) => format!("delivered to {to}"),
                    (None, Some((slug, _))) => format!("posted to #{slug}"),
                    (None, None) => "broadcast delivered".to_owned(),
                };
                let files = if count > 0 {
                    format!(" attachments={count}")
                } else {
                    String::new()
                };
                ok(format!("{head}: {stats}{files}"))
            },
        )
    })
}

fn channels_post(args: &Map<String, Value>) -> Plan {
    let slug = text(args, "channel");
    if slug.is_empty() {
        return fail("channels_post: `channel` is required (the channel slug)");
    }
    if text(args, "body").is_empty() {
        return fail("channels_post: `body` is required");
    }
    if let Err(error) = level("channels_post", args).and(attachment_paths("channels_post", args)) {
        return Plan::Done(error);
    }
    let args = args.clone();
    let path = format!("/channels/{}", encode_component(&slug));
    request(Method::Get, path, Body::Empty, move |resp| {
        if resp.status == 404 {
            return fail(format!(
                "channels_post: no channel '{slug}'. Use `channels_list` to see available channels."
            ));
        }
        let body = match broker_json(&resp) {
            Ok(body) => body,
            Err(error) => return Plan::Done(error),
        };
        if body["channel"]["joined"].as_bool() != Some(true) {
            return fail(format!(
                "channels_post: you are not a member of #{slug}. Ask a director to add you, or use `broadcast` for the general channel."
            ));
        }
        let id = s(&body["channel"]["id"]).to_owned();
        push("channels_post", &args, Some((slug, id)))
    })
}

fn recent(ctx: Context, args: &Map<String, Value>) -> Plan {
    let with = text(args, "with");
    let channel = text(args, "channel");
    if !with.is_empty() && !channel.is_empty() {
        return fail("recent: pass `with` OR `channel`, not both");
    }
    let limit = args
        .get("limit")
        .and_then(Value::as_f64)
        .filter(|l| l.is_finite())
        .map_or(50, |l| (l.floor() as i64).clamp(1, 500));
    let team = ctx.briefing.team.name.clone();
    let history = move |query: String, scope: String, header: String| {
        let path = format!("/history?{query}limit={limit}");
        get(path, move |body| {
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            if messages.is_empty() {
                return ok(format!("recent: no messages in {scope}"));
            }
            let mut text = format!("{header} ({}):", messages.len());
            for m in &messages {
                text.push('\n');
                text.push_str(&format::message_line(m));
            }
            ok(text)
        })
    };
    if !channel.is_empty() {
        let path = format!("/channels/{}", encode_component(&channel));
        return request(Method::Get, path, Body::Empty, move |resp| {
            if resp.status == 404 {
                return fail(format!(
                    "recent: no channel '{channel}'. Use `channels_list` to see available channels."
                ));
            }
            match broker_json(&resp) {
                Ok(body) => history(
                    format!("channel={}&", encode_component(s(&body["channel"]["id"]))),
                    format!("channel #{channel}"),
                    format!("recent #{channel}"),
                ),
                Err(error) => Plan::Done(error),
            }
        });
    }
    if !with.is_empty() {
        return history(
            format!("with={}&", encode_component(&with)),
            format!("DM with {with}"),
            format!("recent DMs with {with}"),
        );
    }
    history(
        String::new(),
        format!("{team} team channel"),
        format!("recent {team} team chat"),
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

fn objectives_update(args: &Map<String, Value>) -> Plan {
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

fn objectives_discuss(args: &Map<String, Value>) -> Plan {
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

fn fs_read(args: &Map<String, Value>) -> Plan {
    let path = text(args, "path");
    if path.is_empty() {
        return fail("fs_read: `path` is required");
    }
    request(Method::Get, stat_path(&path), Body::Empty, move |resp| {
        if resp.status == 404 {
            return fail(format!("fs_read: not found: {path}"));
        }
        let entry = match broker_json(&resp) {
            Ok(body) => body["entry"].clone(),
            Err(error) => return Plan::Done(error),
        };
        if s(&entry["kind"]) == "directory" {
            return fail(format!("fs_read: not a file: {path}"));
        }
        let segments: Vec<String> = s(&entry["path"])
            .split('/')
            .filter(|seg| !seg.is_empty())
            .map(encode_component)
            .collect();
        let url = format!("/fs/read/{}", segments.join("/"));
        request(Method::Get, url, Body::Empty, move |resp| {
            if !(200..300).contains(&resp.status) {
                return Plan::Done(broker_error(&resp));
            }
            let mime = entry["mimeType"]
                .as_str()
                .unwrap_or("application/octet-stream")
                .to_owned();
            let size = entry["size"].as_u64().unwrap_or(0);
            let head = format!("path={}\nsize={size}\nmime={mime}", s(&entry["path"]));
            ok(if is_text_mime(&mime) {
                format!("{head}\ntext:\n{}", String::from_utf8_lossy(&resp.body))
            } else {
                format!("{head}\nbase64:\n{}", base64::encode(&resp.body))
            })
        })
    })
}

fn fs_write(args: &Map<String, Value>) -> Plan {
    let (path, mime) = (text(args, "path"), text(args, "mimeType"));
    if path.is_empty() || mime.is_empty() {
        return fail("fs_write: `path` and `mimeType` are required");
    }
    let bytes = match (args.get("text"), args.get("base64")) {
        (Some(Value::String(text)), None) => text.clone().into_bytes(),
        (None, Some(Value::String(b64))) => base64::decode_lenient(b64),
        _ => return fail("fs_write: provide exactly one of `text` or `base64`"),
    };
    let collide = match args.get("collide") {
        None | Some(Value::Null) => "error".to_owned(),
        Some(Value::String(c)) if ["error", "suffix", "overwrite"].contains(&c.as_str()) => {
            c.clone()
        }
        Some(other) => {
            let shown = other
                .as_str()
                .map_or_else(|| other.to_string(), str::to_owned);
            return fail(format!("fs_write: invalid collide strategy '{shown}'"));
        }
    };
    let len = bytes.len();
    let url = format!(
        "/fs/write?path={}&mime={}&collide={collide}",
        encode_component(&path),
        encode_component(&mime)
    );
    let body = Body::Bytes {
        bytes,
        content_type: mime,
    };
    call(Method::Post, url, body, move |body| {
        let e = &body["entry"];
        let final_path = s(&e["path"]);
        let renamed = if body["renamed"].as_bool() == Some(true) {
            format!(" (renamed to {final_path})")
        } else {
            String::new()
        };
        ok(format!(
            "wrote {final_path}{renamed}: size={} mime={}",
            e["size"].as_u64().unwrap_or(len as u64),
            s(&e["mimeType"])
        ))
    })
}

// ---- shared steps ----

/// The paths of `attachments`, validated: absent or null → none.
fn attachment_paths(tool: &str, args: &Map<String, Value>) -> Result<Vec<String>, ToolText> {
    match args.get("attachments") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(p) if !p.is_empty() => Ok(p.clone()),
                _ => Err(ToolText::error(format!(
                    "{tool}: `attachments` entries must be non-empty path strings"
                ))),
            })
            .collect(),
        Some(_) => Err(ToolText::error(format!(
            "{tool}: `attachments` must be an array of paths"
        ))),
    }
}

/// Looks each path up with `GET /fs/stat`, in order, and hands the attachment objects to `then`.
fn resolve_attachments(
    tool: &'static str,
    mut paths: Vec<String>,
    then: impl FnOnce(Vec<Value>) -> Plan + Send + 'static,
) -> Plan {
    paths.reverse();
    resolve_next(tool, paths, Vec::new(), Box::new(then))
}

type Then = Box<dyn FnOnce(Vec<Value>) -> Plan + Send>;

fn resolve_next(
    tool: &'static str,
    mut rest: Vec<String>,
    mut done: Vec<Value>,
    then: Then,
) -> Plan {
    let Some(path) = rest.pop() else {
        return then(done);
    };
    request(Method::Get, stat_path(&path), Body::Empty, move |resp| {
        if resp.status == 404 {
            return fail(format!("{tool}: attachment not found: {path}"));
        }
        let entry = match broker_json(&resp) {
            Ok(body) => body["entry"].clone(),
            Err(error) => {
                return fail(format!(
                    "{tool}: attachment lookup failed for {path}: {}",
                    error.text
                ));
            }
        };
        if s(&entry["kind"]) == "directory" {
            return fail(format!("{tool}: attachment is a directory: {path}"));
        }
        let (Some(size), Some(mime)) = (entry["size"].as_u64(), entry["mimeType"].as_str()) else {
            return fail(format!("{tool}: attachment is corrupt: {path}"));
        };
        done.push(
            json!({"path": entry["path"], "name": entry["name"], "size": size, "mimeType": mime}),
        );
        resolve_next(tool, rest, done, then)
    })
}

fn level(tool: &str, args: &Map<String, Value>) -> Result<String, ToolText> {
    match args.get("level") {
        None | Some(Value::Null) => Ok("info".to_owned()),
        Some(Value::String(l)) if crate::message::LogLevel::parse(l).is_some() => Ok(l.clone()),
        Some(other) => {
            let shown = other
                .as_str()
                .map_or_else(|| other.to_string(), str::to_owned);
            Err(ToolText::error(format!(
                "{tool}: unknown level '{shown}'. Must be one of: {LEVELS}."
            )))
        }
    }
}

/// A string argument; anything that is not a string reads as `""`.
fn text(args: &Map<String, Value>, key: &str) -> String {
    args.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// The strings of an array argument (other items are skipped).
fn strings(args: &Map<String, Value>, key: &str) -> Vec<String> {
    args.get(key)
        .map(string_list)
        .unwrap_or_default()
        .into_iter()
        .map(str::to_owned)
        .collect()
}

fn string_list(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
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

fn is_text_mime(mime: &str) -> bool {
    let mime = mime.to_ascii_lowercase();
    let word_end = |rest: &str| {
        rest.is_empty() || !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_')
    };
    mime.starts_with("text/")
        || mime.strip_prefix("application/json").is_some_and(word_end)
        || mime.strip_prefix("application/xml").is_some_and(word_end)
}

fn stat_path(path: &str) -> String {
    format!("/fs/stat?path={}", encode_component(path))
}

fn json_body(value: Value) -> Body {
    Body::Json(value)
}

fn ok(text: impl Into<String>) -> Plan {
    Plan::Done(ToolText::ok(text))
}

fn fail(text: impl Into<String>) -> Plan {
    Plan::Done(ToolText::error(text))
}

fn request(
    method: Method,
    path: String,
    body: Body,
    then: impl FnOnce(Response) -> Plan + Send + 'static,
) -> Plan {
    Plan::Request(Request { method, path, body }, Box::new(then))
}

/// A request whose 2xx JSON answer goes to `then`; anything else ends the tool with the broker
/// error.
fn call(
    method: Method,
    path: String,
    body: Body,
    then: impl FnOnce(Value) -> Plan + Send + 'static,
) -> Plan {
    request(method, path, body, move |resp| match broker_json(&resp) {
        Ok(value) => then(value),
        Err(error) => Plan::Done(error),
    })
}

fn get(path: String, then: impl FnOnce(Value) -> Plan + Send + 'static) -> Plan {
    call(Method::Get, path, Body::Empty, then)
}

/// The JSON of a 2xx response (`null` for an empty body), or the tool error for anything else.
fn broker_json(resp: &Response) -> Result<Value, ToolText> {
    if !(200..300).contains(&resp.status) {
        return Err(broker_error(resp));
    }
    if resp.body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&resp.body)
        .map_err(|e| ToolText::error(format!("broker sent a response that is not JSON: {e}")))
}

/// `broker error <status>: <body, or the status text when the body is empty>`.
fn broker_error(resp: &Response) -> ToolText {
    let body = String::from_utf8_lossy(&resp.body);
    let detail = if body.trim().is_empty() {
        reason_phrase(resp.status).to_owned()
    } else {
        body.into_owned()
    };
    ToolText::error(format!("broker error {}: {detail}", resp.status))
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "",
    }
}
