//! Chat tools: the roster, messages to the team, a teammate or a channel, and reading them back.

use serde_json::{Map, Value, json};

use super::defs::{attachments, level_schema, string};
use super::format::{self, s};
use super::registry::{Def, Listing, Tool};
use super::tools::{
    attachment_paths, broker_json, broker_shape, call, fail, get, json_body, ok, request,
    resolve_attachments, text,
};
use super::{Body, Context, Method, Plan, ToolText, encode_component};
use crate::domain::message::LogLevel;

/// Talking to the team; listed to everyone.
pub(super) const TOOLS: &[Tool] = &[
    Tool {
        name: "roster",
        gate: &[],
        def: roster_def,
        plan: roster,
    },
    Tool {
        name: "broadcast",
        gate: &[],
        def: broadcast_def,
        plan: broadcast,
    },
    Tool {
        name: "send",
        gate: &[],
        def: send_def,
        plan: send,
    },
    Tool {
        name: "channels_list",
        gate: &[],
        def: channels_list_def,
        plan: channels_list,
    },
    Tool {
        name: "channels_post",
        gate: &[],
        def: channels_post_def,
        plan: channels_post,
    },
    Tool {
        name: "recent",
        gate: &[],
        def: recent_def,
        plan: recent,
    },
];

fn roster_def(l: &Listing) -> Def {
    let Listing { team, identity, .. } = l;
    (
        format!(
            "List everyone on team {team} with their role, authority and whether they are connected. You are {identity}."
        ),
        vec![],
        &[],
    )
}

fn roster(ctx: Context, _args: &Map<String, Value>) -> Plan {
    request(
        Method::Get,
        "/roster".into(),
        Body::Empty,
        move |resp| match broker_shape::<format::RosterView>(&resp) {
            Ok(view) => ok(format::roster(&ctx.briefing.team.name, ctx.me(), &view)),
            Err(error) => Plan::Done(error),
        },
    )
}

fn broadcast_def(l: &Listing) -> Def {
    let Listing {
        team,
        identity,
        mates,
        home,
        ..
    } = l;
    (
        format!(
            "Post a message to team {team}'s general channel; every teammate sees it at once. You are {identity}. \
             Teammates: {mates}. Attach files from your home ({home}/...) by path."
        ),
        vec![
            (
                "body",
                string("The message everyone on the team will read."),
            ),
            ("title", string("Optional short title.")),
            ("level", level_schema()),
            ("attachments", attachments()),
        ],
        &["body"],
    )
}

fn broadcast(_ctx: Context, args: &Map<String, Value>) -> Plan {
    push("broadcast", args, None)
}

fn send_def(l: &Listing) -> Def {
    let Listing {
        team,
        identity,
        mates,
        ..
    } = l;
    (
        format!(
            "Send a direct message to one teammate on team {team}; only the two of you see it. You are {identity}. Teammates: {mates}."
        ),
        vec![
            ("to", string("The teammate's name.")),
            ("body", string("The message.")),
            ("title", string("Optional short title.")),
            ("level", level_schema()),
            ("attachments", attachments()),
        ],
        &["to", "body"],
    )
}

fn send(_ctx: Context, args: &Map<String, Value>) -> Plan {
    push("send", args, None)
}

fn channels_list_def(l: &Listing) -> Def {
    let Listing { team, .. } = l;
    (
        format!(
            "List team {team}'s channels: the ones you belong to first (general always), then the ones you could join."
        ),
        vec![],
        &[],
    )
}

fn channels_list(ctx: Context, _args: &Map<String, Value>) -> Plan {
    get("/channels".into(), move |body| {
        ok(format::channels(&ctx.briefing.team.name, &body))
    })
}

fn channels_post_def(l: &Listing) -> Def {
    let Listing { team, identity, .. } = l;
    (
        format!(
            "Post a message in one of team {team}'s named channels, by slug. You must be a member of it. You are {identity}."
        ),
        vec![
            (
                "channel",
                string("The channel's slug, e.g. frontend (see channels_list)."),
            ),
            ("body", string("The message.")),
            ("title", string("Optional short title.")),
            ("level", level_schema()),
            ("attachments", attachments()),
        ],
        &["channel", "body"],
    )
}

fn channels_post(_ctx: Context, args: &Map<String, Value>) -> Plan {
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

fn recent_def(l: &Listing) -> Def {
    let Listing { team, identity, .. } = l;
    (
        format!(
            "Read recent messages, newest first: team {team}'s general channel by default, a direct conversation \
             (with) or a named channel (channel) — not both. You are {identity}. Default 50 messages, at most 500."
        ),
        vec![
            (
                "with",
                string("A teammate's name: your direct messages with them."),
            ),
            ("channel", string("A channel slug.")),
            (
                "limit",
                json!({"type": "number", "description": "Max messages to return (default 50, max 500)."}),
            ),
        ],
        &[],
    )
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

fn level(tool: &str, args: &Map<String, Value>) -> Result<String, ToolText> {
    match args.get("level") {
        None | Some(Value::Null) => Ok("info".to_owned()),
        Some(Value::String(l)) if LogLevel::parse(l).is_some() => Ok(l.clone()),
        Some(other) => {
            let shown = other
                .as_str()
                .map_or_else(|| other.to_string(), str::to_owned);
            let levels = LogLevel::ALL.map(LogLevel::as_str).join(", ");
            Err(ToolText::error(format!(
                "{tool}: unknown level '{shown}'. Must be one of: {levels}."
            )))
        }
    }
}
