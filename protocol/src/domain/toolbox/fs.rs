//! File-space tools: listing, reading, writing and moving files in the shared file space.

use serde_json::{Map, Value, json};

use super::defs::string;
use super::format::{self, s};
use super::registry::{Def, Listing, Tool};
use super::tools::{
    broker_error, broker_json, call, fail, get, json_body, ok, request, stat_path, text,
};
use super::{Body, Context, Method, Plan, encode_component};
use crate::codec::base64;

/// The shared file space; listed to everyone.
pub(super) const TOOLS: &[Tool] = &[
    Tool {
        name: "fs_ls",
        gate: &[],
        def: fs_ls_def,
        plan: fs_ls,
    },
    Tool {
        name: "fs_stat",
        gate: &[],
        def: fs_stat_def,
        plan: fs_stat,
    },
    Tool {
        name: "fs_read",
        gate: &[],
        def: fs_read_def,
        plan: fs_read,
    },
    Tool {
        name: "fs_write",
        gate: &[],
        def: fs_write_def,
        plan: fs_write,
    },
    Tool {
        name: "fs_mkdir",
        gate: &[],
        def: fs_mkdir_def,
        plan: fs_mkdir,
    },
    Tool {
        name: "fs_rm",
        gate: &[],
        def: fs_rm_def,
        plan: fs_rm,
    },
    Tool {
        name: "fs_mv",
        gate: &[],
        def: fs_mv_def,
        plan: fs_mv,
    },
    Tool {
        name: "fs_shared",
        gate: &[],
        def: fs_shared_def,
        plan: fs_shared,
    },
];

fn fs_ls_def(l: &Listing) -> Def {
    let Listing { home, .. } = l;
    (
        format!("List a directory in the shared file space. Defaults to your home ({home})."),
        vec![(
            "path",
            string(&format!(
                "Absolute path to list. Defaults to your home (\"{home}\")."
            )),
        )],
        &[],
    )
}

fn fs_ls(ctx: Context, args: &Map<String, Value>) -> Plan {
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

fn fs_stat_def(_: &Listing) -> Def {
    (
        "Show one file or directory entry: kind, size, type, owner.".to_owned(),
        vec![("path", string("Absolute path."))],
        &["path"],
    )
}

fn fs_stat(_ctx: Context, args: &Map<String, Value>) -> Plan {
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

fn fs_read_def(_: &Listing) -> Def {
    (
        "Read a file. Text (text/*, application/json, application/xml) comes back as UTF-8, anything else as base64.".to_owned(),
        vec![("path", string("Absolute path of the file."))],
        &["path"],
    )
}

fn fs_read(_ctx: Context, args: &Map<String, Value>) -> Plan {
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

fn fs_write_def(l: &Listing) -> Def {
    let Listing { me, home, .. } = l;
    (
        format!(
            "Write a file ({me}: your home is {home}). Give exactly one of text or base64; parent directories are created."
        ),
        vec![
            (
                "path",
                string(&format!("Absolute path, e.g. {home}/notes.md.")),
            ),
            (
                "mimeType",
                string("The file's MIME type, e.g. text/markdown."),
            ),
            ("text", string("The content as text.")),
            ("base64", string("The content as base64.")),
            (
                "collide",
                json!({"type": "string", "enum": ["error", "suffix", "overwrite"], "description": "What to do if the file exists (default error)."}),
            ),
        ],
        &["path", "mimeType"],
    )
}

fn fs_write(_ctx: Context, args: &Map<String, Value>) -> Plan {
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

fn fs_mkdir_def(l: &Listing) -> Def {
    let Listing { me, home, .. } = l;
    (
        format!("Create a directory ({me}: your home is {home})."),
        vec![
            ("path", string("Absolute path of the new directory.")),
            (
                "recursive",
                json!({"type": "boolean", "description": "Create missing parents too (default false)."}),
            ),
        ],
        &["path"],
    )
}

fn fs_mkdir(_ctx: Context, args: &Map<String, Value>) -> Plan {
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

fn fs_rm_def(_: &Listing) -> Def {
    (
        "Remove a file or directory; a directory with content needs recursive.".to_owned(),
        vec![
            ("path", string("Absolute path.")),
            (
                "recursive",
                json!({"type": "boolean", "description": "Remove a directory and everything in it."}),
            ),
        ],
        &["path"],
    )
}

fn fs_rm(_ctx: Context, args: &Map<String, Value>) -> Plan {
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

fn fs_mv_def(_: &Listing) -> Def {
    (
        "Move or rename a file (directories cannot be moved yet).".to_owned(),
        vec![
            ("from", string("Current absolute path.")),
            ("to", string("New absolute path.")),
        ],
        &["from", "to"],
    )
}

fn fs_mv(_ctx: Context, args: &Map<String, Value>) -> Plan {
    let (from, to) = (text(args, "from"), text(args, "to"));
    if from.is_empty() || to.is_empty() {
        return fail("fs_mv: both `from` and `to` are required");
    }
    let body = json_body(json!({"from": from, "to": to}));
    call(Method::Post, "/fs/mv".into(), body, move |body| {
        ok(format!("mv {from} → {}", s(&body["entry"]["path"])))
    })
}

fn fs_shared_def(_: &Listing) -> Def {
    (
        "List the files others shared with you by attaching them to messages or objectives."
            .to_owned(),
        vec![],
        &[],
    )
}

fn fs_shared(_ctx: Context, _args: &Map<String, Value>) -> Plan {
    get("/fs/shared".into(), |body| {
        let list = body["entries"].as_array().cloned().unwrap_or_default();
        ok(format::entries(
            "files shared with you:",
            &list,
            "no files currently shared with you".into(),
        ))
    })
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
