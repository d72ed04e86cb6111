//! `ac7 mcp-bridge --dialect call-tool`: MCP on the agent's stdio, length-prefixed `call_tool`
//! requests (seed 001) to a parent process on a Unix socket.
//!
//! All protocol decisions are made by [`CallToolBridge`]; this driver only pumps bytes:
//!
//! ```text
//!   stdin ────────────▶ handle_agent_bytes / handle_agent_eof ──┐
//!   connect result ───▶ handle_connected / handle_connect_failed ┤
//!   socket read ──────▶ handle_parent_bytes / handle_parent_closed ┤ CallToolBridge
//!   SIGINT/SIGTERM ───▶ handle_terminate ────────────────────────┘
//!        poll_output: Transmit{Agent} -> stdout, Connect -> start connecting, Transmit{Parent} -> socket buffer,
//!                     Disconnect -> drop the socket, Event -> stderr log, Exit -> exit 0
//! ```
//!
//! The tool-schema file must be readable by its owner only (the parent writes it 0600); a file
//! readable by group or others is refused, as is one that is missing or not a valid schema list.
//! The connection is made lazily, on the first `tools/call`, and again after the parent drops it.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use ac7_protocol::call_tool::{ToolSchema, parse_schema_file};
use ac7_protocol::call_tool_bridge::{
    CallToolBridge, CallToolBridgeConfig, CallToolBridgeEvent, CallToolBridgeOutput, Peer,
};
use tokio::net::UnixStream;
use tokio::signal::unix::{SignalKind, signal};

use crate::dialects::mcp_bridge::CONNECT_TIMEOUT;
use crate::dialects::stdio::{
    AgentRead, AgentStdin, READ_CHUNK, append, recv_signal, write_stdout,
};
use crate::unix_socket::SendBuf;

/// The environment variable naming the parent's socket when `--socket` is not given.
pub const CALL_TOOL_SOCKET_ENV: &str = "AC7_CALL_TOOL_SOCKET";

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
    #[error("{} is not a valid tool-schema file: {source}", path.display())]
    InvalidSchema {
        /// The path.
        path: PathBuf,
        /// What is wrong.
        source: ac7_protocol::call_tool::SchemaFileError,
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
pub(crate) fn run(schema_file: Option<PathBuf>, socket: Option<PathBuf>) -> i32 {
    match run_bridge(schema_file, socket) {
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
            ..CallToolBridgeConfig::default()
        };
        Driver::new(CallToolBridge::new(config, tools), socket)
            .run(&mut stdin)
            .await;
        stdin.restore();
        Ok(())
    })
}

type Connecting = Pin<Box<dyn Future<Output = io::Result<UnixStream>>>>;

struct Driver {
    session: CallToolBridge,
    path: PathBuf,
    connecting: Option<Connecting>,
    socket: Option<UnixStream>,
    to_parent: SendBuf,
    to_agent: Vec<u8>,
    stdout_open: bool,
}

impl Driver {
    fn new(session: CallToolBridge, path: PathBuf) -> Self {
        Self {
            session,
            path,
            connecting: None,
            socket: None,
            to_parent: SendBuf::default(),
            to_agent: Vec::new(),
            stdout_open: true,
        }
    }

    async fn run(mut self, stdin: &mut AgentStdin) {
        let mut sigterm = signal(SignalKind::terminate())
            .inspect_err(|err| tracing::warn!(error = %err, "cannot handle SIGTERM"))
            .ok();
        let mut sigint = signal(SignalKind::interrupt())
            .inspect_err(|err| tracing::warn!(error = %err, "cannot handle SIGINT"))
            .ok();
        let mut stdin_open = true;
        let mut stdin_buf = vec![0u8; READ_CHUNK];
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            let write_socket = self.socket.is_some() && self.to_parent.pending() > 0;
            tokio::select! {
                input = stdin.read(&mut stdin_buf), if stdin_open => match input {
                    AgentRead::Data(n) => self.session.handle_agent_bytes(&stdin_buf[..n]),
                    AgentRead::Failed(err) => {
                        tracing::warn!(error = %err, "reading stdin failed; treating it as closed");
                        stdin_open = false;
                        self.session.handle_agent_eof();
                    }
                    AgentRead::Eof => {
                        stdin_open = false;
                        self.session.handle_agent_eof();
                    }
                },
                connected = connect_result(&mut self.connecting) => {
                    self.connecting = None;
                    match connected {
                        Ok(stream) => {
                            tracing::debug!(path = %self.path.display(), "connected to the parent");
                            self.socket = Some(stream);
                            self.session.handle_connected();
                        }
                        Err(err) => {
                            tracing::warn!(path = %self.path.display(), error = %err, "cannot connect to the parent");
                            let reason = format!("{}: {err}", self.path.display());
                            self.session.handle_connect_failed(&reason);
                        }
                    }
                }
                ready = readable(self.socket.as_ref()) => {
                    let read = ready.and_then(|()| match &self.socket {
                        Some(socket) => socket.try_read(&mut buf),
                        None => Err(io::ErrorKind::WouldBlock.into()),
                    });
                    match read {
                        Ok(0) => self.parent_gone(None),
                        Ok(n) => self.session.handle_parent_bytes(&buf[..n]),
                        Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                        Err(err) => self.parent_gone(Some(err)),
                    }
                }
                ready = writable(self.socket.as_ref()), if write_socket => {
                    match ready {
                        Ok(()) => self.write_socket(),
                        Err(err) => self.parent_gone(Some(err)),
                    }
                }
                Some(()) = recv_signal(&mut sigterm) => {
                    tracing::info!("SIGTERM");
                    self.session.handle_terminate();
                }
                Some(()) = recv_signal(&mut sigint) => {
                    tracing::info!("SIGINT");
                    self.session.handle_terminate();
                }
            }
            if self.pump() {
                return;
            }
        }
    }

    /// The connection to the parent closed or failed.
    fn parent_gone(&mut self, err: Option<io::Error>) {
        if let Some(err) = err {
            tracing::warn!(error = %err, "the parent socket failed");
        }
        self.socket = None;
        self.to_parent.clear();
        self.session.handle_parent_closed();
    }

    fn write_socket(&mut self) {
        if let Some(socket) = &self.socket
            && let Err(err) = self.to_parent.write_to(socket)
        {
            self.parent_gone(Some(err));
        }
    }

    /// Drains the session's outputs and performs them; true once it has exited.
    fn pump(&mut self) -> bool {
        let mut exit = false;
        loop {
            let mut any = false;
            while let Some(output) = self.session.poll_output() {
                any = true;
                match output {
                    CallToolBridgeOutput::Transmit {
                        to: Peer::Agent,
                        bytes,
                    } => append(&mut self.to_agent, bytes),
                    CallToolBridgeOutput::Connect => {
                        let path = self.path.clone();
                        self.connecting = Some(Box::pin(async move {
                            match tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(&path))
                                .await
                            {
                                Ok(result) => result,
                                Err(_) => Err(io::Error::new(
                                    io::ErrorKind::TimedOut,
                                    format!("timeout after {}ms", CONNECT_TIMEOUT.as_millis()),
                                )),
                            }
                        }));
                    }
                    CallToolBridgeOutput::Transmit {
                        to: Peer::Parent,
                        bytes,
                    } => self.to_parent.push(bytes),
                    CallToolBridgeOutput::Disconnect => {
                        self.socket = None;
                        self.connecting = None;
                        self.to_parent.clear();
                    }
                    CallToolBridgeOutput::Event(event) => log_event(&event),
                    CallToolBridgeOutput::Exit => exit = true,
                }
            }
            if !any {
                return exit;
            }
            self.write_socket();
            let bytes = std::mem::take(&mut self.to_agent);
            if !bytes.is_empty()
                && self.stdout_open
                && let Err(err) = write_stdout(&bytes)
            {
                tracing::warn!(error = %err, "writing to stdout failed; the agent is gone");
                self.stdout_open = false;
                self.session.handle_agent_eof();
            }
        }
    }
}

async fn connect_result(connecting: &mut Option<Connecting>) -> io::Result<UnixStream> {
    match connecting {
        Some(fut) => fut.await,
        None => std::future::pending().await,
    }
}

async fn readable(socket: Option<&UnixStream>) -> io::Result<()> {
    match socket {
        Some(socket) => socket.readable().await,
        None => std::future::pending().await,
    }
}

async fn writable(socket: Option<&UnixStream>) -> io::Result<()> {
    match socket {
        Some(socket) => socket.writable().await,
        None => std::future::pending().await,
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
        CallToolBridgeEvent::AgentNotificationIgnored { method } => {
            tracing::debug!(method, "notification from the agent ignored");
        }
    }
}
