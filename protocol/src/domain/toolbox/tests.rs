use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::test_support::snapshots;

const NOW: i64 = 1_795_314_650_000;

fn briefing(name: &str, permissions: &[&str]) -> Briefing {
    serde_json::from_value(json!({
        "name": name,
        "role": {"title": if name == "director" { "lead" } else { "engineer" }, "description": "Ships code."},
        "permissions": permissions,
        "instructions": "prose",
        "team": {"name": "demo", "directive": "Ship it", "context": "", "permissionPresets": {}},
        "teammates": [
            {"name": "director", "role": {"title": "lead", "description": ""}, "permissions": ["members.manage"]},
            {"name": "builder", "role": {"title": "engineer", "description": ""}, "permissions": []},
            {"name": "reviewer", "role": {"title": "qa", "description": ""}, "permissions": ["objectives.create"]}
        ],
        "openObjectives": []
    }))
    .unwrap()
}

const ALL: [&str; 7] = [
    "team.manage",
    "members.manage",
    "objectives.create",
    "objectives.cancel",
    "objectives.reassign",
    "objectives.watch",
    "activity.read",
];

fn ctx(name: &str, permissions: &[&str]) -> Context {
    Context {
        briefing: Arc::new(briefing(name, permissions)),
        now_ms: NOW,
    }
}

fn objective(id: &str, status: &str) -> Value {
    json!({"id": id, "title": "Ship feature Y", "body": "see spec", "outcome": "Y merged", "status": status,
           "assignee": "builder", "originator": "director", "watchers": ["reviewer"],
           "createdAt": NOW - 400_000, "updatedAt": NOW - 300_000, "completedAt": null, "result": null,
           "blockReason": if status == "blocked" { json!("waiting on CI") } else { json!(null) }, "attachments": []})
}

fn ok(body: Value) -> Response {
    Response {
        status: 200,
        body: serde_json::to_vec(&body).unwrap(),
    }
}

fn status(code: u16, body: &str) -> Response {
    Response {
        status: code,
        body: body.as_bytes().to_vec(),
    }
}

/// Runs a plan against canned responses; returns the transcript.
fn run(ctx: &Context, tool: &str, args: Value, responses: Vec<Response>) -> (String, ToolText) {
    let mut responses: VecDeque<Response> = responses.into();
    let mut transcript = String::new();
    let mut plan = plan(ctx, tool, &args);
    loop {
        match plan {
            Plan::Done(text) => {
                assert!(
                    responses.is_empty(),
                    "{tool}: unused responses {responses:?}"
                );
                let _ = writeln!(
                    transcript,
                    "=> {}{}",
                    if text.is_error { "isError: " } else { "" },
                    text.text
                );
                return (transcript, text);
            }
            Plan::Request(request, next) => {
                let body = match &request.body {
                    Body::Empty => String::new(),
                    Body::Json(v) => format!(" {v}"),
                    Body::Bytes {
                        bytes,
                        content_type,
                    } => format!(" <{} bytes {content_type}>", bytes.len()),
                };
                let _ = writeln!(
                    transcript,
                    "{} {}{body}",
                    request.method.as_str(),
                    request.path
                );
                let response = responses
                    .pop_front()
                    .unwrap_or_else(|| panic!("{tool}: no response for {request:?}"));
                plan = next(response);
            }
        }
    }
}

#[test]
fn tool_lists_match_the_capture_and_gate_by_permission() {
    let capture: Value = serde_json::from_str(include_str!(
        "../../../testdata/mcp-tools-list-result-director.json"
    ))
    .unwrap();
    let captured = capture["result"]["tools"].as_array().unwrap();
    let ours = tool_list(&ctx("director", &ALL), &[]);
    let ours = ours["tools"].as_array().unwrap();
    let names = |tools: &[Value]| {
        tools
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(ours), names(captured));
    for (mine, theirs) in ours.iter().zip(captured) {
        let name = mine["name"].as_str().unwrap();
        let strip = |schema: &Value| {
            let mut props = schema["properties"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            for p in props.values_mut() {
                crate::codec::json::remove_keeping_order(p.as_object_mut().unwrap(), "description");
            }
            props
        };
        let mut expected = strip(&theirs["inputSchema"]);
        if ["broadcast", "send", "channels_post", "objectives_discuss"].contains(&name) {
            expected.insert("title".into(), json!({"type": "string"}));
        }
        assert_eq!(strip(&mine["inputSchema"]), expected, "{name}: properties");
        assert_eq!(
            mine["inputSchema"]["required"], theirs["inputSchema"]["required"],
            "{name}: required"
        );
        assert_eq!(mine["inputSchema"]["type"], "object");
        assert!(
            mine["inputSchema"]["properties"]
                .as_object()
                .unwrap()
                .values()
                .all(|p| p["description"].is_string())
        );
    }

    let member = tool_list(
        &ctx("builder", &[]),
        &[serde_json::from_value(objective("obj-1", "active")).unwrap()],
    );
    let member_names = names(member["tools"].as_array().unwrap());
    assert_eq!(member_names.len(), 19);
    assert!(
        !member_names
            .iter()
            .any(|n| n.starts_with("objectives_c") && n != "objectives_complete")
    );
    let list = member["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "objectives_list")
        .unwrap();
    assert!(
        list["description"]
            .as_str()
            .unwrap()
            .contains("obj-1 [active] Ship feature Y — outcome: Y merged")
    );
    let watch_only = names(
        tool_list(&ctx("builder", &["objectives.watch"]), &[])["tools"]
            .as_array()
            .unwrap(),
    );
    assert!(watch_only.contains(&"objectives_watchers".to_owned()));
    assert!(!watch_only.contains(&"objectives_create".to_owned()));
    snapshots(|| insta::assert_json_snapshot!("toolbox_tools_list_member", member));
}

#[test]
fn validation_errors() {
    let me = ctx("builder", &[]);
    let boss = ctx("director", &ALL);
    let cases: Vec<(&Context, &str, Value)> = vec![
        (&me, "broadcast", json!({})),
        (&me, "broadcast", json!({"body": "x", "level": "loud"})),
        (
            &me,
            "broadcast",
            json!({"body": "x", "attachments": "a.txt"}),
        ),
        (&me, "broadcast", json!({"body": "x", "attachments": [""]})),
        (&me, "send", json!({"body": "x"})),
        (&me, "channels_post", json!({"body": "x"})),
        (&me, "channels_post", json!({"channel": "ops"})),
        (&me, "recent", json!({"with": "a", "channel": "b"})),
        (&me, "objectives_list", json!({"status": "open"})),
        (&me, "objectives_view", json!({})),
        (&me, "objectives_update", json!({"status": "active"})),
        (
            &me,
            "objectives_update",
            json!({"id": "o", "status": "done"}),
        ),
        (
            &me,
            "objectives_update",
            json!({"id": "o", "status": "blocked", "blockReason": "  "}),
        ),
        (&me, "objectives_discuss", json!({"id": "o"})),
        (&me, "objectives_complete", json!({"id": "o"})),
        (
            &me,
            "objectives_create",
            json!({"title": "t", "outcome": "o", "assignee": "a"}),
        ),
        (
            &boss,
            "objectives_create",
            json!({"title": " ", "outcome": "o", "assignee": "a"}),
        ),
        (
            &boss,
            "objectives_create",
            json!({"title": "t", "assignee": "a"}),
        ),
        (
            &boss,
            "objectives_create",
            json!({"title": "t", "outcome": "o"}),
        ),
        (&me, "objectives_cancel", json!({"id": "o"})),
        (&boss, "objectives_cancel", json!({})),
        (&me, "objectives_watchers", json!({"id": "o"})),
        (
            &boss,
            "objectives_watchers",
            json!({"id": "o", "add": [1, 2]}),
        ),
        (&me, "objectives_reassign", json!({"id": "o", "to": "x"})),
        (&boss, "objectives_reassign", json!({"id": "o"})),
        (&me, "fs_stat", json!({})),
        (&me, "fs_read", json!({"path": 5})),
        (&me, "fs_write", json!({"path": "/builder/a"})),
        (
            &me,
            "fs_write",
            json!({"path": "/builder/a", "mimeType": "text/plain"}),
        ),
        (
            &me,
            "fs_write",
            json!({"path": "/builder/a", "mimeType": "text/plain", "text": "x", "base64": "eA=="}),
        ),
        (
            &me,
            "fs_write",
            json!({"path": "/builder/a", "mimeType": "text/plain", "text": "x", "collide": "merge"}),
        ),
        (&me, "fs_mkdir", json!({})),
        (&me, "fs_rm", json!({})),
        (&me, "fs_mv", json!({"from": "/a"})),
        (&boss, "team_update", json!({})),
        (
            &boss,
            "presets_set",
            json!({"name": "ops", "permissions": "all"}),
        ),
        (&boss, "members_add", json!({"name": "x"})),
        (&boss, "members_update", json!({"name": "x"})),
        (&me, "nope", json!({})),
    ];
    let mut out = String::new();
    for (ctx, tool, args) in cases {
        let (transcript, text) = run(ctx, tool, args.clone(), vec![]);
        assert!(text.is_error, "{tool} {args}");
        let _ = write!(out, "{tool} {args}\n{transcript}");
    }
    snapshots(|| insta::assert_snapshot!("toolbox_validation_errors", out));
}

#[test]
fn every_tool_against_canned_broker_answers() {
    let me = ctx("builder", &[]);
    let boss = ctx("director", &ALL);
    let entry = |path: &str, kind: &str| {
        json!({"path": path, "name": path.rsplit('/').next().unwrap(), "kind": kind, "owner": "builder",
               "size": if kind == "file" { json!(12) } else { json!(null) },
               "mimeType": if kind == "file" { json!("text/plain") } else { json!(null) },
               "hash": null, "createdAt": NOW, "createdBy": "builder", "updatedAt": NOW})
    };
    let message = |id: &str, from: &str, to: Option<&str>, title: Option<&str>, body: &str| {
        json!({"id": id, "ts": NOW - 60_000, "to": to, "from": from, "title": title, "body": body,
               "level": "info", "data": {}, "attachments": []})
    };
    let pushed = ok(
        json!({"delivery": {"live": 2, "targets": 3}, "message": message("m-1", "builder", None, None, "hi")}),
    );
    let cases: Vec<(&Context, &str, Value, Vec<Response>)> = vec![
        (
            &me,
            "roster",
            json!({}),
            vec![ok(json!({
            "teammates": [
                {"name": "director", "role": {"title": "lead", "description": ""}, "permissions": ["members.manage"]},
                {"name": "builder", "role": {"title": "engineer", "description": ""}, "permissions": []},
                {"name": "reviewer", "role": {"title": "qa", "description": ""}, "permissions": ["objectives.create"]}],
            "connected": [{"name": "builder", "connected": 1}, {"name": "director", "connected": 0}]}))],
        ),
        (
            &me,
            "broadcast",
            json!({"body": "hi", "title": "news", "attachments": ["/builder/a.txt"]}),
            vec![
                ok(json!({"entry": entry("/builder/a.txt", "file")})),
                pushed.clone(),
            ],
        ),
        (
            &me,
            "broadcast",
            json!({"body": "hi", "attachments": ["/builder/gone.txt"]}),
            vec![status(
                404,
                r#"{"error":"no such path: /builder/gone.txt"}"#,
            )],
        ),
        (
            &me,
            "broadcast",
            json!({"body": "hi", "attachments": ["/builder/dir"]}),
            vec![ok(json!({"entry": entry("/builder/dir", "directory")}))],
        ),
        (
            &me,
            "broadcast",
            json!({"body": "hi", "attachments": ["/director/secret"]}),
            vec![status(403, r#"{"error":"forbidden","code":"forbidden"}"#)],
        ),
        (
            &me,
            "send",
            json!({"to": "director", "body": "done", "level": "notice"}),
            vec![pushed.clone()],
        ),
        (
            &me,
            "send",
            json!({"to": "ghost", "body": "x"}),
            vec![status(404, r#"{"error":"no such agent: ghost"}"#)],
        ),
        (
            &me,
            "channels_list",
            json!({}),
            vec![ok(json!({"channels": [
            {"id": "c2", "slug": "review-room", "createdBy": "reviewer", "createdAt": NOW, "archivedAt": null, "joined": false, "myRole": null, "memberCount": 2},
            {"id": "c1", "slug": "frontend", "createdBy": "director", "createdAt": NOW, "archivedAt": null, "joined": true, "myRole": "admin", "memberCount": 4},
            {"id": "general", "slug": "general", "createdBy": "__system__", "createdAt": 0, "archivedAt": null, "joined": true, "myRole": "member", "memberCount": 3}]}))],
        ),
        (
            &me,
            "channels_list",
            json!({}),
            vec![ok(json!({"channels": []}))],
        ),
        (
            &me,
            "channels_post",
            json!({"channel": "frontend", "body": "shipped"}),
            vec![
                ok(
                    json!({"channel": {"id": "c1", "slug": "frontend", "joined": true}, "members": []}),
                ),
                pushed.clone(),
            ],
        ),
        (
            &me,
            "channels_post",
            json!({"channel": "review-room", "body": "x"}),
            vec![ok(
                json!({"channel": {"id": "c2", "slug": "review-room", "joined": false}, "members": []}),
            )],
        ),
        (
            &me,
            "channels_post",
            json!({"channel": "nope", "body": "x"}),
            vec![status(404, r#"{"error":"no such channel: nope"}"#)],
        ),
        (
            &me,
            "recent",
            json!({"limit": 2.7}),
            vec![ok(json!({"messages": [
            message("m-2", "director", None, Some("plan"), "line one\nline two"), message("m-1", "ac7", Some("builder"), None, "online")]}))],
        ),
        (
            &me,
            "recent",
            json!({"with": "director", "limit": 9000}),
            vec![ok(json!({"messages": []}))],
        ),
        (
            &me,
            "recent",
            json!({"channel": "frontend"}),
            vec![
                ok(json!({"channel": {"id": "c1"}, "members": []})),
                ok(json!({"messages": []})),
            ],
        ),
        (
            &me,
            "objectives_list",
            json!({}),
            vec![ok(
                json!({"objectives": [objective("obj-1", "active"), objective("obj-2", "blocked")]}),
            )],
        ),
        (
            &me,
            "objectives_list",
            json!({"status": "done"}),
            vec![ok(json!({"objectives": []}))],
        ),
        (
            &me,
            "objectives_view",
            json!({"id": "obj-2"}),
            vec![ok(
                json!({"objective": objective("obj-2", "blocked"), "events": [
            {"objectiveId": "obj-2", "ts": NOW - 400_000, "actor": "director", "kind": "assigned", "payload": {"title": "Ship feature Y", "outcome": "Y merged", "assignee": "builder"}},
            {"objectiveId": "obj-2", "ts": NOW - 300_000, "actor": "builder", "kind": "blocked", "payload": {"reason": "waiting on CI"}}]}),
            )],
        ),
        (
            &me,
            "objectives_view",
            json!({"id": "nope"}),
            vec![status(404, r#"{"error":"no such objective: nope"}"#)],
        ),
        (
            &me,
            "objectives_update",
            json!({"id": "obj-2", "status": "blocked", "blockReason": "waiting on CI"}),
            vec![ok(objective("obj-2", "blocked"))],
        ),
        (
            &me,
            "objectives_discuss",
            json!({"id": "obj-1", "body": "any blockers?"}),
            vec![ok(message("m-9", "builder", None, None, "any blockers?"))],
        ),
        (
            &me,
            "objectives_complete",
            json!({"id": "obj-1", "result": "merged in #42"}),
            vec![ok(objective("obj-1", "done"))],
        ),
        (
            &me,
            "objectives_complete",
            json!({"id": "obj-9", "result": "x"}),
            vec![status(
                403,
                r#"{"error":"only the assignee may complete this objective"}"#,
            )],
        ),
        (
            &boss,
            "objectives_create",
            json!({"title": " Ship feature Y ", "outcome": "Y merged", "assignee": "builder", "watchers": ["reviewer", 3], "body": ""}),
            vec![ok(objective("obj-3", "active"))],
        ),
        (
            &boss,
            "objectives_cancel",
            json!({"id": "obj-3", "reason": "descoped"}),
            vec![ok(objective("obj-3", "cancelled"))],
        ),
        (
            &boss,
            "objectives_watchers",
            json!({"id": "obj-3", "remove": ["reviewer"]}),
            vec![ok(json!({"id": "obj-3", "watchers": []}))],
        ),
        (
            &boss,
            "objectives_reassign",
            json!({"id": "obj-3", "to": "reviewer", "note": "swap"}),
            vec![ok(
                json!({"id": "obj-3", "assignee": "reviewer", "title": "Ship feature Y"}),
            )],
        ),
        (
            &me,
            "fs_ls",
            json!({}),
            vec![ok(
                json!({"entries": [entry("/builder/notes", "directory"), entry("/builder/a.txt", "file")]}),
            )],
        ),
        (
            &me,
            "fs_ls",
            json!({"path": "/builder/empty dir"}),
            vec![ok(json!({"entries": []}))],
        ),
        (
            &me,
            "fs_stat",
            json!({"path": "/builder/a.txt"}),
            vec![ok(json!({"entry": entry("/builder/a.txt", "file")}))],
        ),
        (
            &me,
            "fs_stat",
            json!({"path": "/builder/none"}),
            vec![status(404, "")],
        ),
        (
            &me,
            "fs_read",
            json!({"path": "/builder/a.txt"}),
            vec![
                ok(json!({"entry": entry("/builder/a.txt", "file")})),
                Response {
                    status: 200,
                    body: b"hello\nworld\n".to_vec(),
                },
            ],
        ),
        (
            &me,
            "fs_read",
            json!({"path": "/builder/img.png"}),
            vec![
                ok(
                    json!({"entry": {"path": "/builder/img.png", "kind": "file", "size": 4, "mimeType": "image/png", "owner": "builder"}}),
                ),
                Response {
                    status: 200,
                    body: vec![0x89, b'P', b'N', b'G'],
                },
            ],
        ),
        (
            &me,
            "fs_read",
            json!({"path": "/builder/notes"}),
            vec![ok(json!({"entry": entry("/builder/notes", "directory")}))],
        ),
        (
            &me,
            "fs_write",
            json!({"path": "/builder/a.txt", "mimeType": "text/plain", "text": "hello", "collide": "suffix"}),
            vec![ok(
                json!({"entry": entry("/builder/a-1.txt", "file"), "renamed": true}),
            )],
        ),
        (
            &me,
            "fs_write",
            json!({"path": "/builder/b.bin", "mimeType": "application/octet-stream", "base64": "AAEC"}),
            vec![ok(
                json!({"entry": {"path": "/builder/b.bin", "size": 3, "mimeType": "application/octet-stream"}, "renamed": false}),
            )],
        ),
        (
            &me,
            "fs_write",
            json!({"path": "/builder/big", "mimeType": "text/plain", "text": "x"}),
            vec![status(
                413,
                r#"{"error":"file too large","code":"too_large"}"#,
            )],
        ),
        (
            &me,
            "fs_mkdir",
            json!({"path": "/builder/new", "recursive": true}),
            vec![ok(json!({"entry": entry("/builder/new", "directory")}))],
        ),
        (
            &me,
            "fs_rm",
            json!({"path": "/builder/new", "recursive": true}),
            vec![Response {
                status: 204,
                body: vec![],
            }],
        ),
        (
            &me,
            "fs_mv",
            json!({"from": "/builder/a.txt", "to": "/builder/b.txt"}),
            vec![ok(json!({"entry": entry("/builder/b.txt", "file")}))],
        ),
        (
            &me,
            "fs_shared",
            json!({}),
            vec![ok(json!({"entries": []}))],
        ),
        (
            &boss,
            "team_get",
            json!({}),
            vec![ok(
                json!({"team": {"name": "demo", "directive": "Ship it", "context": "", "permissionPresets": {"admin": [], "operator": []}}}),
            )],
        ),
        (
            &boss,
            "team_update",
            json!({"directive": "Ship it faster", "bogus": 1}),
            vec![ok(json!({"team": {"name": "demo"}}))],
        ),
        (
            &boss,
            "presets_list",
            json!({}),
            vec![ok(
                json!({"presets": {"operator": ["objectives.create", "objectives.cancel"]}}),
            )],
        ),
        (
            &boss,
            "presets_set",
            json!({"name": "ops", "permissions": ["objectives.watch"]}),
            vec![ok(
                json!({"preset": {"name": "ops", "permissions": ["objectives.watch"]}}),
            )],
        ),
        (
            &boss,
            "presets_delete",
            json!({"name": "ops"}),
            vec![ok(json!({"deleted": "ops", "referencedBy": ["scout"]}))],
        ),
        (
            &boss,
            "members_add",
            json!({"name": "scout", "title": "scout", "permissions": ["operator", 7]}),
            vec![ok(
                json!({"member": {"name": "scout"}, "token": "ac7_<token>"}),
            )],
        ),
        (
            &boss,
            "members_update",
            json!({"name": "scout", "instructions": "look around"}),
            vec![ok(json!({"name": "scout"}))],
        ),
        (
            &boss,
            "members_remove",
            json!({"name": "scout"}),
            vec![Response {
                status: 204,
                body: vec![],
            }],
        ),
    ];
    let mut out = String::new();
    let mut changing = Vec::new();
    for (ctx, tool, args, responses) in cases {
        let (transcript, text) = run(ctx, tool, args.clone(), responses);
        if text.objectives_changed {
            changing.push(tool);
        }
        let _ = write!(out, "## {tool} {args}\n{transcript}\n");
    }
    assert_eq!(
        changing,
        [
            "objectives_update",
            "objectives_complete",
            "objectives_create",
            "objectives_cancel",
            "objectives_reassign"
        ]
    );
    snapshots(|| insta::assert_snapshot!("toolbox_outputs", out));
}

#[test]
fn components_are_percent_encoded() {
    assert_eq!(encode_component("a b/c?d=é"), "a%20b%2Fc%3Fd%3D%C3%A9");
    assert_eq!(encode_component("obj-1_x.y~!*'()"), "obj-1_x.y~!*'()");
}

/// `tools/list` and `plan` read the same registry: every tool an agent with every leaf is shown
/// has a plan, and a name nobody lists has none.
#[test]
fn every_listed_tool_has_a_plan() {
    let all: Vec<&str> = crate::domain::permission::Permission::ALL
        .into_iter()
        .map(crate::domain::permission::Permission::as_str)
        .collect();
    let ctx = ctx("director", &all);
    let list = tool_list(&ctx, &[]);
    let names: Vec<&str> = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 31);
    for name in names {
        if let Plan::Done(text) = plan(&ctx, name, &json!({})) {
            assert!(
                !text.text.starts_with("unknown tool"),
                "{name}: {}",
                text.text
            );
        }
    }
    let Plan::Done(text) = plan(&ctx, "objectives_frobnicate", &json!({})) else {
        panic!("an unknown tool must not reach the broker");
    };
    assert_eq!(text.text, "unknown tool: objectives_frobnicate");
    assert!(text.is_error);
}
