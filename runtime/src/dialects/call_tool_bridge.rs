//! `ac7 mcp-bridge --dialect call-tool`: MCP on the agent's stdio, length-prefixed `call_tool`
//! requests to a parent process on a Unix socket.
//!
//! All protocol decisions are made by [`CallToolBridge`]; `Relay` (`dialects/relay.rs`) (shared with
//! the ac7 dialect) pumps the bytes, connects when the session asks (`Connect`) and drops the
//! connection when it says so (`Disconnect`).
//!
//! The tool-schema file must be readable by its owner only (the parent writes it 0600); a file
//! readable by group or others is refused, as is one that is missing or not a valid schema list.
//! The connection is made lazily, on the first `tools/call`, and again after the parent drops it.
//! Each call sent gets `--call-timeout` seconds (default 120) for its reply; the session machine
//! keeps the deadline and the relay only sleeps until it.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ac7_protocol::dialect::call_tool::{ToolSchema, parse_schema_file};
use ac7_protocol::dialect::call_tool_bridge::{
    CallToolBridge, CallToolBridgeConfig, CallToolBridgeEvent, CallToolBridgeOutput, CallToolPeer,
};

use crate::dialects::relay::{Relay, RelayOutput, RelaySession};
use crate::dialects::stdio::AgentStdin;

/// The environment variable naming the parent's socket when `--socket` is not given.
pub const CALL_TOOL_SOCKET_ENV: &str = "AC7_CALL_TOOL_SOCKET";

/// The environment variable setting the call timeout in milliseconds (tests), as the hidden
/// `--call-timeout-ms` does.
pub const CALL_TIMEOUT_MS_ENV: &str = "AC7_CALL_TOOL_TIMEOUT_MS";

/// Why the call-tool bridge could not start.
#[derive(Debug, thiserror::Error)]
pub enum CallToolBridgeError {
    /// `--schema-file` is missing.
    #[error("--dialect call-tool needs --schema-file PATH (the tool-schema file the parent wrote)")]
    NoSchemaFile,
    /// Neither `--socket` nor `AC7_CALL_TOOL_SOCKET`.
    #[error(
        "--dialect call-tool needs the parent's socket: pass --socket PATH or set {CALL_TOOL_SOCKET_ENV}"
    )]
    NoSocket,
    /// The schema file could not be read.
    #[error("cannot read the tool-schema file {}: {source}", path.display())]
    ReadSchema {
        /// The path.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The schema file is readable by group or others.
    #[error(
        "the tool-schema file {} has mode {mode:04o}: it must be readable by its owner only \
         (the parent creates it 0600; chmod 600 {} if you wrote it yourself)",
        path.display(),
        path.display()
    )]
    SchemaPermissions {
        /// The path.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The schema file is not a valid list of tools.
    #[error("{} is not a valid tool-schema file: {}", path.display(), source.0)]
    InvalidSchema {
        /// The path.
        path: PathBuf,
        /// What is wrong.
        source: ac7_protocol::dialect::call_tool::SchemaFileError,
    },
    /// The async runtime could not be started.
    #[error("could not start: {0}")]
    Start(io::Error),
}

/// Loads the tool-schema file: owner-only permissions, then a valid list of tools.
pub fn load_schema_file(path: &Path) -> Result<Vec<ToolSchema>, CallToolBridgeError> {
    let read_error = |source| CallToolBridgeError::ReadSchema {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read_error)?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(CallToolBridgeError::SchemaPermissions {
            path: path.to_owned(),
            mode,
        });
    }
    let text = std::fs::read_to_string(path).map_err(read_error)?;
    parse_schema_file(&text).map_err(|source| CallToolBridgeError::InvalidSchema {
        path: path.to_owned(),
        source,
    })
}

/// Runs the call-tool bridge; returns the exit code (0 after a normal teardown, 1 when it could
/// not start; the reason is printed on stderr as one line).
pub(crate) fn run(
    schema_file: Option<PathBuf>,
    socket: Option<PathBuf>,
    call_timeout: Duration,
) -> i32 {
    match run_bridge(schema_file, socket, call_timeout) {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("ac7 mcp-bridge: {err}");
            1
        }
    }
}

fn run_bridge(
    schema_file: Option<PathBuf>,
    socket: Option<PathBuf>,
    call_timeout: Duration,
) -> Result<(), CallToolBridgeError> {
    let schema_file = schema_file.ok_or(CallToolBridgeError::NoSchemaFile)?;
    let socket = socket
        .filter(|s| !s.as_os_str().is_empty())
        .ok_or(CallToolBridgeError::NoSocket)?;
    let tools = load_schema_file(&schema_file)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(CallToolBridgeError::Start)?;
    runtime.block_on(async {
        crate::logging::init(crate::logging::DEFAULT_LEVEL);
        let mut stdin = AgentStdin::open().map_err(CallToolBridgeError::Start)?;
        let config = CallToolBridgeConfig {
            server_version: env!("CARGO_PKG_VERSION").to_owned(),
            call_timeout,
            ..CallToolBridgeConfig::default()
        };
        Relay::new(CallToolBridge::new(config, tools), socket, None)
            .run(&mut stdin)
            .await;
        stdin.restore();
        Ok(())
    })
}

impl RelaySession for CallToolBridge {
    type Event = CallToolBridgeEvent;
    type Exit = ();

    fn handle_agent_bytes(&mut self, bytes: &[u8], now: Instant) {
        CallToolBridge::handle_agent_bytes(self, bytes, now);
    }
    fn handle_agent_eof(&mut self, now: Instant) {
        CallToolBridge::handle_agent_eof(self, now);
    }
    fn handle_connected(&mut self, now: Instant) {
        CallToolBridge::handle_connected(self, now);
    }
    fn handle_connect_failed(&mut self, reason: &str, now: Instant) {
        CallToolBridge::handle_connect_failed(self, reason, now);
    }
    fn handle_parent_bytes(&mut self, bytes: &[u8], now: Instant) {
        CallToolBridge::handle_parent_bytes(self, bytes, now);
    }
    fn handle_parent_closed(&mut self, now: Instant) {
        CallToolBridge::handle_parent_closed(self, now);
    }
    fn handle_terminate(&mut self, now: Instant) {
        CallToolBridge::handle_terminate(self, now);
    }
    fn poll_timeout(&self) -> Option<Instant> {
        CallToolBridge::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Instant) {
        CallToolBridge::handle_timeout(self, now);
    }
    fn poll_output(&mut self) -> Option<RelayOutput<CallToolBridgeEvent, ()>> {
        loop {
            return Some(match CallToolBridge::poll_output(self)? {
                CallToolBridgeOutput::Transmit {
                    to: CallToolPeer::Agent,
                    bytes,
                } => RelayOutput::ToAgent(bytes),
                CallToolBridgeOutput::Connect => RelayOutput::Connect,
                CallToolBridgeOutput::Transmit {
                    to: CallToolPeer::Parent,
                    bytes,
                } => RelayOutput::ToParent(bytes),
                CallToolBridgeOutput::Disconnect => RelayOutput::Disconnect,
                CallToolBridgeOutput::Event(event) => RelayOutput::Event(event),
                CallToolBridgeOutput::Exit => RelayOutput::Exit(()),
                other => {
                    tracing::warn!(
                        ?other,
                        "call_tool bridge: an output this version does not handle"
                    );
                    continue;
                }
            });
        }
    }
    fn log_event(event: &CallToolBridgeEvent) {
        log_event(event);
    }
}

fn log_event(event: &CallToolBridgeEvent) {
    match event {
        CallToolBridgeEvent::AgentLineInvalid { len, code, detail } => {
            tracing::warn!(
                len,
                code,
                detail,
                "invalid line from the agent answered with an error"
            );
        }
        CallToolBridgeEvent::InvalidArguments { tool, detail } => {
            tracing::info!(tool, detail, "arguments refused by the tool's input schema");
        }
        CallToolBridgeEvent::Completed { tool, error: None } => {
            tracing::debug!(tool, "call answered by the parent");
        }
        CallToolBridgeEvent::Completed {
            tool,
            error: Some(error),
        } => {
            tracing::warn!(tool, error = %error, "call failed without a reply");
        }
        CallToolBridgeEvent::InvalidResult { tool, detail } => {
            tracing::warn!(
                tool,
                detail,
                "the parent's result is not a valid MCP tool result; answered with isError"
            );
        }
        CallToolBridgeEvent::Cancelled { tool, on_wire } => {
            tracing::debug!(
                tool,
                on_wire,
                "call cancelled by the agent; not answered (a reply to it is discarded)"
            );
        }
        CallToolBridgeEvent::LateReplyDiscarded { len } => {
            tracing::debug!(len, "the parent's reply to a cancelled call discarded");
        }
        CallToolBridgeEvent::AgentNotificationIgnored { method } => {
            tracing::debug!(method, "notification from the agent ignored");
        }
        other => tracing::debug!(?other, "call_tool bridge event"),
    }
}
