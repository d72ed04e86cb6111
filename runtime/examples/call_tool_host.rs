//! A `call_tool` parent hosting two tools, `echo` and `add`, until Ctrl-C.
//!
//! ```text
//! cargo run -p ac7-runtime --example call_tool_host -- /tmp/my-tools
//! ```
//!
//! prints the schema-file and socket paths (in the given directory, default: a fresh one in
//! `/tmp`) and the command line that starts a bridge against them.

use std::io::Write;

use ac7_protocol::dialect::call_tool::ToolSchema;
use ac7_protocol::dialect::mcp;
use ac7_runtime::dialects::call_tool_host::{CallToolHost, HostPaths, ToolError};
use serde_json::{Value, json};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let dir = match std::env::args_os().nth(1) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => std::env::temp_dir().join(format!("ac7-call-tool-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let mut host = CallToolHost::new();
    host.tool(
        ToolSchema {
            name: "echo".into(),
            description: "Returns its text unchanged.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            }),
        },
        |args: Value| async move { Ok(mcp::tool_text(args["text"].as_str().unwrap_or_default())) },
    );
    host.tool(
        ToolSchema {
            name: "add".into(),
            description: "Adds two integers.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            }),
        },
        |args: Value| async move {
            let (Some(a), Some(b)) = (args["a"].as_i64(), args["b"].as_i64()) else {
                return Err(ToolError::new("ValueError", "a and b must be integers"));
            };
            match a.checked_add(b) {
                Some(sum) => Ok(mcp::tool_text(&sum.to_string())),
                None => Err(ToolError::new(
                    "OverflowError",
                    format!("{a} + {b} overflows"),
                )),
            }
        },
    );
    let running = host.start(HostPaths::in_dir(&dir))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "schema file: {}", running.schema_path().display())?;
    writeln!(out, "socket:      {}", running.socket_path().display())?;
    writeln!(
        out,
        "bridge:      ac7 mcp-bridge --dialect call-tool --schema-file {} --socket {}",
        running.schema_path().display(),
        running.socket_path().display()
    )?;
    out.flush()?;
    drop(out);
    tokio::signal::ctrl_c().await?;
    running.stop().await;
    Ok(())
}
