//! MCP specifics the bridge and runner share: method names, protocol-version negotiation, the
//! `initialize` result and `CallToolResult` shapes.

use serde::Deserialize;

use crate::codec::json::{RawJson, write_str};

/// `initialize`: answered by the bridge itself.
pub const INITIALIZE: &str = "initialize";
/// `ping`: answered by the bridge itself with `{}`.
pub const PING: &str = "ping";
/// `tools/list`.
pub const TOOLS_LIST: &str = "tools/list";
/// `tools/call`.
pub const TOOLS_CALL: &str = "tools/call";
/// `notifications/initialized`.
pub const INITIALIZED: &str = "notifications/initialized";
/// `notifications/cancelled`: the client gave up on a request.
pub const CANCELLED: &str = "notifications/cancelled";
/// `notifications/claude/channel`: a broker event for the agent.
pub const CLAUDE_CHANNEL: &str = "notifications/claude/channel";
/// `notifications/tools/list_changed`: re-fetch `tools/list`.
pub const TOOLS_LIST_CHANGED: &str = "notifications/tools/list_changed";

/// The `clientInfo.name` Claude Code sends in `initialize`.
pub const CLAUDE_CODE_CLIENT: &str = "claude-code";

/// MCP protocol versions the bridge speaks, newest first.
pub const SUPPORTED_PROTOCOL_VERSIONS: [&str; 4] =
    ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The server name in `initialize`'s `serverInfo` (and the `.mcp.json` key).
pub const SERVER_NAME: &str = "ac7";

/// The version to answer `initialize` with: the client's when supported, else the newest.
pub fn negotiate_protocol_version(requested: Option<&str>) -> &'static str {
    SUPPORTED_PROTOCOL_VERSIONS
        .into_iter()
        .find(|v| Some(*v) == requested)
        .unwrap_or(SUPPORTED_PROTOCOL_VERSIONS[0])
}

#[derive(Deserialize)]
struct InitializeParams {
    #[serde(rename = "protocolVersion")]
    protocol_version: Option<String>,
}

#[derive(Deserialize)]
struct InitializeClient {
    #[serde(rename = "clientInfo")]
    client_info: Option<ClientInfo>,
}

#[derive(Deserialize)]
struct ClientInfo {
    name: Option<String>,
}

/// The client's `clientInfo.name` in `initialize` params, when it gives one.
pub fn client_name(params: Option<&RawJson>) -> Option<String> {
    params?.parse::<InitializeClient>().ok()?.client_info?.name
}

/// ac7's server capabilities: channel pushes and a tool list that changes.
pub const AC7_CAPABILITIES: &str =
    r#"{"experimental":{"claude/channel":{}},"tools":{"listChanged":true}}"#;

/// The `initialize` result of the ac7 bridge for the given request params:
/// `{"protocolVersion":…,"capabilities":{"experimental":{"claude/channel":{}},"tools":{"listChanged":true}},"serverInfo":{"name":"ac7","version":…}}`.
pub fn initialize_result(params: Option<&RawJson>, server_version: &str) -> RawJson {
    initialize_result_for(params, SERVER_NAME, server_version, AC7_CAPABILITIES)
}

/// An `initialize` result with the given server name and capabilities (a JSON object's text).
pub fn initialize_result_for(
    params: Option<&RawJson>,
    server_name: &str,
    server_version: &str,
    capabilities: &str,
) -> RawJson {
    let requested = params
        .and_then(|p| p.parse::<InitializeParams>().ok())
        .and_then(|p| p.protocol_version);
    let version = negotiate_protocol_version(requested.as_deref());
    let mut out = Vec::with_capacity(192);
    out.extend_from_slice(b"{\"protocolVersion\":");
    write_str(&mut out, version);
    out.extend_from_slice(b",\"capabilities\":");
    out.extend_from_slice(capabilities.as_bytes());
    out.extend_from_slice(b",\"serverInfo\":{\"name\":");
    write_str(&mut out, server_name);
    out.extend_from_slice(b",\"version\":");
    write_str(&mut out, server_version);
    out.extend_from_slice(b"}}");
    raw_from_writer(out)
}

/// The empty result `{}` (the answer to `ping`).
pub fn empty_result() -> RawJson {
    raw_from_writer(b"{}".to_vec())
}

/// A successful `CallToolResult` with one text block: `{"content":[{"type":"text","text":…}]}`.
pub fn tool_text(text: &str) -> RawJson {
    tool_result(text, false)
}

/// A failed `CallToolResult`: `{"content":[{"type":"text","text":…}],"isError":true}`.
pub fn tool_error(text: &str) -> RawJson {
    tool_result(text, true)
}

fn tool_result(text: &str, is_error: bool) -> RawJson {
    let mut out = Vec::with_capacity(text.len() + 64);
    out.extend_from_slice(b"{\"content\":[{\"type\":\"text\",\"text\":");
    write_str(&mut out, text);
    out.extend_from_slice(b"}]");
    if is_error {
        out.extend_from_slice(b",\"isError\":true");
    }
    out.push(b'}');
    raw_from_writer(out)
}

#[derive(Deserialize)]
struct CancelledParams {
    #[serde(rename = "requestId")]
    request_id: RawJson,
}

/// The `requestId` of a `notifications/cancelled`, if its params carry one.
pub fn cancelled_request_id(params: Option<&RawJson>) -> Option<crate::codec::jsonrpc::Id> {
    let params: CancelledParams = params?.parse().ok()?;
    crate::codec::jsonrpc::Id::from_raw(&params.request_id)
}

#[derive(Deserialize)]
struct ToolCallParams {
    name: Option<serde_json::Value>,
}

/// The tool name of a `tools/call`'s params (`""` when absent or not a string).
pub fn tool_call_name(params: Option<&RawJson>) -> String {
    params
        .and_then(|p| p.parse::<ToolCallParams>().ok())
        .and_then(|p| p.name)
        .and_then(|n| n.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Wraps JSON text our own writers produced.
fn raw_from_writer(bytes: Vec<u8>) -> RawJson {
    let text = String::from_utf8(bytes).expect("our JSON writers emit UTF-8");
    RawJson::from_text(&text).expect("our JSON writers emit valid JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_negotiation() {
        assert_eq!(negotiate_protocol_version(Some("2025-06-18")), "2025-06-18");
        assert_eq!(negotiate_protocol_version(Some("2024-11-05")), "2024-11-05");
        assert_eq!(negotiate_protocol_version(Some("1999-01-01")), "2025-11-25");
        assert_eq!(negotiate_protocol_version(None), "2025-11-25");
    }

    #[test]
    fn initialize_result_matches_the_capture() {
        let params = RawJson::from_text(
            r#"{"protocolVersion":"2025-06-18","capabilities":{"experimental":{"claude/channel":{}}},"clientInfo":{"name":"fake-claude","version":"0.0.1"}}"#,
        )
        .unwrap();
        let got: serde_json::Value = initialize_result(Some(&params), "0.0.0-dev")
            .parse()
            .unwrap();
        let capture: serde_json::Value =
            serde_json::from_str(include_str!("../../testdata/mcp-initialize-result.json"))
                .unwrap();
        assert_eq!(got, capture["result"]);
    }

    #[test]
    fn tool_results_and_params() {
        assert_eq!(
            tool_error("x: \"y\"").get(),
            r#"{"content":[{"type":"text","text":"x: \"y\""}],"isError":true}"#
        );
        assert_eq!(
            tool_text("ok").get(),
            r#"{"content":[{"type":"text","text":"ok"}]}"#
        );
        let p = RawJson::from_text(r#"{"requestId":0,"reason":"user"}"#).unwrap();
        assert_eq!(
            cancelled_request_id(Some(&p)),
            Some(crate::codec::jsonrpc::Id::number(0))
        );
        let p = RawJson::from_text(r#"{"name":"roster","arguments":{}}"#).unwrap();
        assert_eq!(tool_call_name(Some(&p)), "roster");
        assert_eq!(tool_call_name(None), "");
    }
}
