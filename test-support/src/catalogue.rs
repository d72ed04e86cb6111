//! A `tools/list` fixture shaped like a director's catalogue (31 tools, about 18 KB), for the
//! scripted runners of the bridge tests and the `bridge*` scenarios of `ac7-bench`.

use ac7_protocol::codec::json::RawJson;
use ac7_protocol::domain::message::LogLevel;
use serde_json::json;

/// Names of the 31 tools of a director's catalogue.
pub const TOOL_NAMES: [&str; 31] = [
    "roster",
    "broadcast",
    "send",
    "channels_list",
    "channels_post",
    "recent",
    "objectives_list",
    "objectives_view",
    "objectives_update",
    "objectives_discuss",
    "objectives_complete",
    "fs_ls",
    "fs_stat",
    "fs_read",
    "fs_write",
    "fs_mkdir",
    "fs_rm",
    "fs_mv",
    "fs_shared",
    "objectives_create",
    "objectives_cancel",
    "objectives_watchers",
    "objectives_reassign",
    "team_get",
    "team_update",
    "presets_list",
    "presets_set",
    "presets_delete",
    "members_add",
    "members_update",
    "members_remove",
];

/// A `tools/list` result shaped like a director's catalogue: 31 tools, about 18 KB.
pub fn tools_list_result() -> RawJson {
    let tools: Vec<_> = TOOL_NAMES
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let description = format!(
                "{name}: tool {i} of the director's catalogue. It reaches the broker on the \
                 agent's behalf and answers with plain text; real descriptions carry the briefing \
                 and the open objectives."
            );
            json!({
                "name": name,
                "description": description,
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "description": "The id this tool acts on."},
                        "body": {"type": "string", "description": "The message or note."},
                        "level": {"type": "string", "enum": LogLevel::ALL.map(LogLevel::as_str), "description": "Optional severity; defaults to info."}
                    },
                    "required": ["id"]
                }
            })
        })
        .collect();
    RawJson::from_value(&json!({ "tools": tools })).expect("a JSON value always serializes")
}
