//! The agent-facing stdio of a bridge process: stdin read without blocking the event loop,
//! stdout written as complete lines with a flush, and the small helpers every bridge driver
//! shares (signals, output buffers).
//!
//! - stdin, when it is a pipe or a socket (what agents pass), is read on the runtime thread itself;
//!   otherwise by one small dedicated thread into a bounded channel (tokio's own stdin would go
//!   through the blocking pool), which the process does not join at exit, since it may be
//!   blocked in `read`; blocking mode is put back at exit ([`AgentStdin::restore`]);
//! - stdout gets plain blocking writes of complete lines followed by a flush, so a slow agent
//!   applies backpressure.

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// Bytes read per `read` call, from stdin and from the socket.
pub(crate) const READ_CHUNK: usize = 64 * 1024;

/// Stdin chunks buffered between the reader thread and the relay (bounds memory to
/// `STDIN_QUEUE * READ_CHUNK`).
const STDIN_QUEUE: usize = 8;

/// The agent's stdin.
///
/// Agents give their MCP server a pipe (Node: a socketpair) as stdin; either is read on the
/// runtime's own thread, which saves a thread hop per request. Anything else (a terminal, a
/// file) is read by a small dedicated thread. The async readers need `O_NONBLOCK`, which lives
/// on the open file description shared with whoever else holds it, so
/// [`restore`](Self::restore) puts blocking mode back before the bridge exits; a stdin that is
/// also the bridge's stdout stays blocking and goes through the thread.
pub(crate) enum AgentStdin {
    Pipe(tokio::net::unix::pipe::Receiver),
    Socket(UnixStream),
    Thread(mpsc::Receiver<StdinInput>),
}

/// What reading stdin produced.
pub(crate) enum AgentRead {
    /// This many bytes, at the start of the read buffer.
    Data(usize),
    Eof,
    Failed(io::Error),
}

impl AgentStdin {
    pub(crate) fn open() -> io::Result<Self> {
        let fd = io::stdin().as_fd().try_clone_to_owned()?;
        let meta = std::fs::File::from(fd.try_clone()?).metadata()?;
        let file_type = meta.file_type();
        // A stdin that is also stdout (one socket for both) must stay blocking: stdout writes
        // are plain blocking writes.
        let shared_with_stdout = io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .and_then(|out| std::fs::File::from(out).metadata())
            .is_ok_and(|out| out.dev() == meta.dev() && out.ino() == meta.ino());
        if shared_with_stdout {
            // Read by the thread below.
        } else if file_type.is_fifo() {
            if let Ok(pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) {
                return Ok(Self::Pipe(pipe));
            }
        } else if file_type.is_socket() {
            let socket = std::os::unix::net::UnixStream::from(fd);
            if socket.set_nonblocking(true).is_ok() {
                match UnixStream::from_std(socket) {
                    Ok(socket) => return Ok(Self::Socket(socket)),
                    Err(_) => Self::restore_socket_fd(),
                }
            }
        }
        spawn_stdin_reader().map(Self::Thread)
    }

    /// Reads the next chunk into `buf` (which must keep its length for the async readers).
    /// Cancel-safe: nothing is lost when the future is dropped before completing.
    pub(crate) async fn read(&mut self, buf: &mut Vec<u8>) -> AgentRead {
        let read = match self {
            Self::Pipe(pipe) => pipe.read(buf).await,
            Self::Socket(socket) => socket.read(buf).await,
            Self::Thread(chunks) => {
                return match chunks.recv().await {
                    Some(StdinInput::Bytes(bytes)) => {
                        let n = bytes.len();
                        *buf = bytes;
                        AgentRead::Data(n)
                    }
                    Some(StdinInput::Failed(err)) => AgentRead::Failed(err),
                    Some(StdinInput::Eof) | None => AgentRead::Eof,
                };
            }
        };
        match read {
            Ok(0) => AgentRead::Eof,
            Ok(n) => AgentRead::Data(n),
            Err(err) => AgentRead::Failed(err),
        }
    }

    /// Puts stdin back in blocking mode (the description may outlive this process).
    pub(crate) fn restore(self) {
        match self {
            Self::Pipe(pipe) => drop(pipe.into_blocking_fd()),
            Self::Socket(socket) => {
                if let Ok(socket) = socket.into_std() {
                    let _ = socket.set_nonblocking(false);
                }
            }
            Self::Thread(_) => {}
        }
    }

    fn restore_socket_fd() {
        if let Ok(fd) = io::stdin().as_fd().try_clone_to_owned() {
            let _ = std::os::unix::net::UnixStream::from(fd).set_nonblocking(false);
        }
    }
}

/// What the stdin thread reports.
pub(crate) enum StdinInput {
    Bytes(Vec<u8>),
    Eof,
    Failed(io::Error),
}

/// Reads stdin on a dedicated thread. The thread ends at EOF, on a read error, or when the relay
/// is gone; the process does not wait for it (it may be blocked in `read`).
fn spawn_stdin_reader() -> io::Result<mpsc::Receiver<StdinInput>> {
    let (tx, rx) = mpsc::channel(STDIN_QUEUE);
    std::thread::Builder::new()
        .name("ac7-stdin".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut stdin = io::stdin().lock();
            let mut buf = vec![0u8; READ_CHUNK];
            loop {
                let input = match stdin.read(&mut buf) {
                    Ok(0) => StdinInput::Eof,
                    Ok(n) => StdinInput::Bytes(buf[..n].to_vec()),
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                    Err(err) => StdinInput::Failed(err),
                };
                let last = !matches!(input, StdinInput::Bytes(_));
                if tx.blocking_send(input).is_err() || last {
                    return;
                }
            }
        })?;
    Ok(rx)
}

/// Waits for a signal when its handler is installed; never resolves otherwise.
pub(crate) async fn recv_signal(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

/// One blocking write of complete lines, then a flush: stdout carries only protocol lines.
pub(crate) fn write_stdout(bytes: &[u8]) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    stdout.write_all(bytes)?;
    stdout.flush()
}
