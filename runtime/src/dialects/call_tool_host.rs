//! The parent's side of the `call_tool` dialect: async Rust functions served as tools
//! to `ac7 mcp-bridge --dialect call-tool`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ac7_runtime::dialects::call_tool_host::HostError> {
//! use ac7_protocol::dialect::call_tool::ToolSchema;
//! use ac7_protocol::dialect::mcp;
//! use ac7_runtime::dialects::call_tool_host::{CallToolHost, HostPaths};
//! use serde_json::json;
//!
//! let mut host = CallToolHost::new();
//! host.tool(
//!     ToolSchema {
//!         name: "echo".into(),
//!         description: "Echoes its text.".into(),
//!         input_schema: json!({"type": "object", "properties": {"text": {"type": "string"}}}),
//!     },
//!     |args: serde_json::Value| async move {
//!         Ok(mcp::tool_text(args["text"].as_str().unwrap_or_default()))
//!     },
//! );
//! let running = host.start(HostPaths::in_dir("/run/user/1000/my-app"))?;
//! // Start the bridge with --schema-file running.schema_path() --socket running.socket_path().
//! running.stop().await; // or drop it: both files are removed either way
//! # Ok(()) }
//! ```
//!
//! [`CallToolHost::start`] writes the schema file (0600, atomically: a private temporary file
//! renamed into place) before anything can start the bridge, and binds the socket (0600,
//! race-free, see [`crate::sys::unix_socket`]). Each connection is served by its own task, strictly
//! request/response: the next request is read after the reply is written. Requests are decoded
//! with [`decode_call`]: bytes that cannot be trusted (bad framing, invalid UTF-8 or JSON, not an
//! object) close the connection without a reply; a malformed request gets a `ValueError` reply;
//! an unknown tool `ToolNotFoundError`; a tool's [`ToolError`] an error reply with its type; a
//! result too large for a frame an `IPCMessageSizeError` reply, and the connection stays. A
//! request that arrives before the previous reply is written is counted
//! ([`RunningHost::pipelined_requests`]) and answered in order, after that reply: the bridge
//! sends one when its agent cancels the call in flight (it discards the reply to the cancelled
//! call), and a tool that is cancelled still runs to its end.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ac7_protocol::codec::json::RawJson;
use ac7_protocol::codec::length_prefixed::{self, LpDecoder, MAX_PAYLOAD_BYTES};
use ac7_protocol::dialect::call_tool::{
    BadRequest, CallTool, Reply, TOOL_NOT_FOUND, ToolSchema, decode_call, encode_reply,
};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::task::JoinSet;

use crate::sys::unix_socket::{BindError, SocketFile, bind_private};

/// `type` of the error reply for a result too large for a frame.
pub const MESSAGE_SIZE_ERROR: &str = "IPCMessageSizeError";

/// `type` of the error reply for a tool that panicked.
pub const RUNTIME_ERROR: &str = "RuntimeError";

/// A tool's failure, sent to the bridge as `{"error": {"message", "type"}}` (the agent sees
/// `"<message> (type: <type>)"`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (type: {error_type})")]
pub struct ToolError {
    /// What went wrong, actionable.
    pub message: String,
    /// The error's class name, e.g. `ValueError`.
    pub error_type: String,
}

impl ToolError {
    /// An error of type `error_type`.
    pub fn new(error_type: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            error_type: error_type.into(),
        }
    }
}

/// What a tool returns: an MCP `CallToolResult` (see [`ac7_protocol::dialect::mcp::tool_text`] and
/// [`ac7_protocol::dialect::mcp::tool_error`]), or an error.
pub type ToolResult = Result<RawJson, ToolError>;

type ToolFuture = Pin<Box<dyn Future<Output = ToolResult> + Send>>;
type ToolFn = Arc<dyn Fn(Value) -> ToolFuture + Send + Sync>;

/// Why the host could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The schema file could not be written.
    #[error("cannot write the tool-schema file {}: {source}", path.display())]
    SchemaFile {
        /// The path.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// A tool's `input_schema` is not a usable JSON Schema (the bridge would refuse the file).
    #[error("{0}")]
    Schema(ac7_protocol::dialect::schema::CompileError),
    /// The socket could not be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
}

/// Where the host puts its two files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    /// The tool-schema file (`--schema-file`).
    pub schema: PathBuf,
    /// The socket (`--socket`).
    pub socket: PathBuf,
}

impl HostPaths {
    /// `<dir>/tools.json` and `<dir>/call_tool.sock`.
    pub fn in_dir(dir: impl AsRef<Path>) -> Self {
        let dir = dir.as_ref();
        Self {
            schema: dir.join("tools.json"),
            socket: dir.join("call_tool.sock"),
        }
    }
}

/// Tools being registered. See the [module docs](self).
#[derive(Default)]
pub struct CallToolHost {
    schemas: Vec<ToolSchema>,
    tools: BTreeMap<String, ToolFn>,
}

impl std::fmt::Debug for CallToolHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallToolHost")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl CallToolHost {
    /// A host with no tools.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a tool (a later registration of the same name replaces it). `run` receives the
    /// arguments object, already checked against `schema.input_schema` by the bridge.
    pub fn tool<F, Fut>(&mut self, schema: ToolSchema, run: F) -> &mut Self
    where
        F: Fn(Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ToolResult> + Send + 'static,
    {
        let name = schema.name.clone();
        self.schemas.retain(|s| s.name != name);
        self.schemas.push(schema);
        let run: ToolFn = Arc::new(move |args| Box::pin(run(args)));
        self.tools.insert(name, run);
        self
    }

    /// Checks that every tool's `input_schema` compiles, writes the schema file, binds the socket
    /// and serves on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(self, paths: HostPaths) -> Result<RunningHost, HostError> {
        ac7_protocol::dialect::schema::ArgumentCheck::compile(
            self.schemas
                .iter()
                .map(|t| (t.name.as_str(), &t.input_schema)),
        )
        .map_err(HostError::Schema)?;
        let schema = SchemaFile::write(&paths.schema, &self.schemas)?;
        let (listener, socket) = bind_private(&paths.socket, "call_tool parent")?;
        let listener =
            tokio::net::UnixListener::from_std(listener).map_err(|source| BindError::Io {
                op: "register the socket",
                path: paths.socket.clone(),
                source,
            })?;
        let stats = Arc::new(Stats::default());
        let tools = Arc::new(self.tools);
        let task = tokio::spawn(serve(listener, tools, Arc::clone(&stats)));
        Ok(RunningHost {
            paths,
            stats,
            task,
            _socket: socket,
            _schema: schema,
        })
    }
}

/// A serving host. Dropping it stops serving at once (every connection closes) and removes the
/// socket and the schema file.
#[derive(Debug)]
pub struct RunningHost {
    paths: HostPaths,
    stats: Arc<Stats>,
    task: tokio::task::JoinHandle<()>,
    _socket: SocketFile,
    _schema: SchemaFile,
}

#[derive(Debug, Default)]
struct Stats {
    calls: AtomicU64,
    pipelined: AtomicU64,
}

impl RunningHost {
    /// The schema file (`--schema-file`).
    pub fn schema_path(&self) -> &Path {
        &self.paths.schema
    }

    /// The socket (`--socket`).
    pub fn socket_path(&self) -> &Path {
        &self.paths.socket
    }

    /// Requests answered so far (tool calls and error replies).
    pub fn requests(&self) -> u64 {
        self.stats.calls.load(Ordering::Relaxed)
    }

    /// Requests that arrived on a connection before the previous request's reply was written (a
    /// bridge whose agent cancelled the call in flight, or one breaking the one-at-a-time rule).
    pub fn pipelined_requests(&self) -> u64 {
        self.stats.pipelined.load(Ordering::Relaxed)
    }

    /// Stops serving (connections close, running tools are dropped) and removes both files.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for RunningHost {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The schema file, removed on drop.
#[derive(Debug)]
struct SchemaFile {
    path: PathBuf,
}

impl SchemaFile {
    /// Writes `tools` to a fresh 0600 file next to `path`, then renames it into place, so the
    /// file at `path` is never partly written nor readable by others.
    fn write(path: &Path, tools: &[ToolSchema]) -> Result<Self, HostError> {
        let error = |source| HostError::SchemaFile {
            path: path.to_owned(),
            source,
        };
        let text = serde_json::to_vec_pretty(tools).map_err(|e| error(io::Error::other(e)))?;
        crate::sys::fsutil::write_atomic(path, &text).map_err(error)?;
        Ok(Self {
            path: path.to_owned(),
        })
    }
}

impl Drop for SchemaFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn serve(
    listener: tokio::net::UnixListener,
    tools: Arc<BTreeMap<String, ToolFn>>,
    stats: Arc<Stats>,
) {
    // Connections live in the set, so they are aborted with this task.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(connection(stream, Arc::clone(&tools), Arc::clone(&stats)));
                }
                Err(err) => {
                    tracing::warn!(error = %err, "accepting a call_tool connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Bytes read per `read` call.
const READ_CHUNK: usize = 64 * 1024;

/// One connection: read a request, answer it, repeat.
async fn connection(
    mut stream: UnixStream,
    tools: Arc<BTreeMap<String, ToolFn>>,
    stats: Arc<Stats>,
) {
    let mut decoder = LpDecoder::new(MAX_PAYLOAD_BYTES);
    let mut buf = vec![0u8; READ_CHUNK];
    let mut open = true;
    loop {
        let payload = match decoder.decode() {
            Ok(Some(payload)) => payload,
            Ok(None) if open => {
                match stream.read(&mut buf).await {
                    Ok(0) => open = false,
                    Ok(n) => decoder.push(&buf[..n]),
                    Err(err) => {
                        tracing::debug!(error = %err, "reading a call_tool connection failed");
                        return;
                    }
                }
                continue;
            }
            Ok(None) => {
                if let Err(err) = decoder.decode_eof() {
                    tracing::warn!(error = %err, "call_tool connection ended inside a frame");
                }
                return;
            }
            Err(err) => {
                tracing::warn!(error = %err, "bad framing from the bridge; closing the connection");
                return;
            }
        };
        let reply = match decode_call(&payload) {
            Ok(call) => {
                let running = run_tool(&tools, call);
                tokio::pin!(running);
                // Keep reading while the tool runs, to notice a request sent before this reply
                // (bounded: at most one frame's worth is buffered).
                loop {
                    let room = decoder.buffered_len() <= MAX_PAYLOAD_BYTES + 4;
                    tokio::select! {
                        reply = &mut running => break reply,
                        read = stream.read(&mut buf), if open && room => match read {
                            Ok(0) => open = false,
                            Ok(n) => decoder.push(&buf[..n]),
                            Err(err) => {
                                tracing::debug!(error = %err, "reading a call_tool connection failed");
                                return;
                            }
                        },
                    }
                }
            }
            Err(BadRequest::Reject(reply)) => reply,
            Err(BadRequest::Fatal(fatal)) => {
                tracing::warn!(error = %fatal, "undecodable request; closing the connection");
                return;
            }
        };
        if decoder.buffered_len() > 0 {
            stats.pipelined.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                "a request arrived before the previous reply (the bridge's agent cancelled that call)"
            );
        }
        stats.calls.fetch_add(1, Ordering::Relaxed);
        if let Err(err) = stream.write_all(&frame(&reply)).await {
            tracing::debug!(error = %err, "writing a call_tool reply failed");
            return;
        }
    }
}

/// The reply as one frame; a result too large for a frame becomes an error reply that fits.
fn frame(reply: &Reply) -> Vec<u8> {
    let mut out = Vec::new();
    match length_prefixed::encode(&encode_reply(reply), &mut out, MAX_PAYLOAD_BYTES) {
        Ok(()) => out,
        Err(too_large) => {
            let error = Reply::Error {
                message: format!("the tool's result is too large to send: {too_large}"),
                error_type: MESSAGE_SIZE_ERROR.to_owned(),
            };
            let mut out = Vec::new();
            length_prefixed::encode(&encode_reply(&error), &mut out, MAX_PAYLOAD_BYTES)
                .expect("a short error reply fits in a frame");
            out
        }
    }
}

async fn run_tool(tools: &BTreeMap<String, ToolFn>, call: CallTool) -> Reply {
    let Some(tool) = tools.get(&call.name) else {
        return Reply::Error {
            message: format!("Unknown tool: {}", call.name),
            error_type: TOOL_NOT_FOUND.to_owned(),
        };
    };
    let args = match call.arguments.parse::<Value>() {
        Ok(args) => args,
        Err(err) => {
            return Reply::Error {
                message: format!("Invalid arguments: {err}"),
                error_type: ac7_protocol::dialect::call_tool::VALUE_ERROR.to_owned(),
            };
        }
    };
    // A panicking tool fails its call, not the connection; a dropped call (the host stopped)
    // aborts the tool.
    let task = AbortOnDrop(tokio::spawn(tool(args)));
    match task.join().await {
        Ok(Ok(result)) => Reply::Result(result),
        Ok(Err(error)) => Reply::Error {
            message: error.message,
            error_type: error.error_type,
        },
        Err(err) => Reply::Error {
            message: format!("tool '{}' failed: {err}", call.name),
            error_type: RUNTIME_ERROR.to_owned(),
        },
    }
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    async fn join(mut self) -> Result<T, tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
