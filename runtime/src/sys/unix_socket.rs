//! Unix sockets a process serves on: bound race-free with mode 0600, stale sockets replaced, live
//! ones refused, the path unlinked when the owner stops.
//!
//! The socket never exists at its final path with wider permissions: it is bound inside a fresh
//! private directory (mode 0700, created next to the final path, so on the same file system),
//! chmod-ed to 0600 there, and only then hard-linked into the final path. `link(2)` refuses to
//! overwrite, so a path that exists is examined instead: a socket nobody accepts on (connection
//! refused) is stale and is removed before linking again; a socket someone accepts on belongs to
//! a live process and binding fails with [`BindError::InUse`]; anything that is not a socket is
//! left alone ([`BindError::NotASocket`]).
//!
//! Before any of that, the binder takes an exclusive lock on `<path>.lock` (0600) and holds it while
//! it serves. A second process finding the lock held is refused at once, without connecting to the
//! socket — a probe connection would look like a new bridge to a live runner and displace its real
//! one. The connect-probe is left for sockets nobody holds the lock for (stale ones, or a server
//! that does not lock).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Longest socket path that fits `sockaddr_un.sun_path` (108 bytes on Linux, NUL included).
pub const MAX_SOCKET_PATH_BYTES: usize = 107;

/// Why the socket could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The path does not fit in a Unix socket address.
    #[error(
        "socket path {} is {len} bytes, more than the {max} a Unix socket allows: \
         choose a shorter path (or a shorter TMPDIR)",
        path.display()
    )]
    PathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A live process (another runner, another bridge) is listening on the path.
    #[error(
        "another {owner} is already listening on {}: stop it, or use another socket path",
        path.display()
    )]
    InUse {
        /// The path.
        path: PathBuf,
        /// What kind of process the socket is for ("runner", "ash-bridge").
        owner: &'static str,
    },
    /// Something that is not a socket exists at the path.
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A file-system or socket call failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What was attempted.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
}

/// Binds `path` as described in the [module docs](self); `owner` names the kind of process in the
/// "already listening" error. The listener is non-blocking; the returned [`SocketFile`] unlinks
/// the path when dropped.
pub(crate) fn bind_private(
    path: &Path,
    owner: &'static str,
) -> Result<(std::os::unix::net::UnixListener, SocketFile), BindError> {
    let path = path.to_owned();
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH_BYTES {
        return Err(BindError::PathTooLong {
            path,
            len,
            max: MAX_SOCKET_PATH_BYTES,
        });
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let lock = PathLock::acquire(&path, owner)?;
    let private = PrivateDir::create(&parent)?;
    let staged = private.path.join("s");
    let listener =
        std::os::unix::net::UnixListener::bind(&staged).map_err(|source| BindError::Io {
            op: "bind a socket at",
            path: staged.clone(),
            source,
        })?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600)).map_err(
        |source| BindError::Io {
            op: "chmod 0600",
            path: staged.clone(),
            source,
        },
    )?;
    publish(&staged, &path, owner)?;
    drop(private);
    let mut socket = SocketFile::new(path)?;
    socket.lock = Some(lock);

    listener
        .set_nonblocking(true)
        .map_err(|source| BindError::Io {
            op: "configure the socket at",
            path: socket.path.clone(),
            source,
        })?;
    Ok((listener, socket))
}

/// The socket path this server owns, identified by device and inode so that stopping never
/// unlinks a successor's socket.
#[derive(Debug)]
pub(crate) struct SocketFile {
    pub(crate) path: PathBuf,
    dev: u64,
    ino: u64,
    /// Released (and its file removed) after the socket is unlinked.
    lock: Option<PathLock>,
}

impl SocketFile {
    pub(crate) fn new(path: PathBuf) -> Result<Self, BindError> {
        let meta = std::fs::symlink_metadata(&path).map_err(|source| BindError::Io {
            op: "stat",
            path: path.clone(),
            source,
        })?;
        Ok(Self {
            path,
            dev: meta.dev(),
            ino: meta.ino(),
            lock: None,
        })
    }
}

/// An exclusive advisory lock on `<socket path>.lock`, held while the socket is served.
#[derive(Debug)]
struct PathLock {
    path: PathBuf,
    _file: std::fs::File,
}

impl PathLock {
    fn acquire(socket: &Path, owner: &'static str) -> Result<Self, BindError> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut name = socket.file_name().unwrap_or_default().to_owned();
        name.push(".lock");
        let path = socket.with_file_name(name);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|source| BindError::Io {
                op: "open the lock file",
                path: path.clone(),
                source,
            })?;
        match file.try_lock() {
            Ok(()) => Ok(Self { path, _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(BindError::InUse {
                path: socket.to_owned(),
                owner,
            }),
            Err(std::fs::TryLockError::Error(source)) => Err(BindError::Io {
                op: "lock",
                path,
                source,
            }),
        }
    }
}

impl Drop for PathLock {
    fn drop(&mut self) {
        // Removed while still held; the lock goes with the file handle right after.
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino);
        if ours && let Err(err) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %err, "cannot unlink the socket");
        }
    }
}

/// A mode-0700 directory that is removed (with its contents) when dropped.
pub(crate) struct PrivateDir {
    pub(crate) path: PathBuf,
}

impl PrivateDir {
    pub(crate) fn create(parent: &Path) -> Result<Self, BindError> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = parent.join(format!(".ac7-{pid}-{n}"));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(Self { path }),
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(source) => {
                    return Err(BindError::Io {
                        op: "create a private directory in",
                        path: parent.to_owned(),
                        source,
                    });
                }
            }
        }
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Hard-links the staged socket into `path`, replacing a stale socket and refusing a live one.
fn publish(staged: &Path, path: &Path, owner: &'static str) -> Result<(), BindError> {
    const ATTEMPTS: usize = 4;
    for _ in 0..ATTEMPTS {
        let err = match std::fs::hard_link(staged, path) {
            Ok(()) => return Ok(()),
            Err(err) => err,
        };
        if err.kind() != io::ErrorKind::AlreadyExists {
            return Err(BindError::Io {
                op: "link the socket to",
                path: path.to_owned(),
                source: err,
            });
        }
        let meta = match std::fs::symlink_metadata(path) {
            Ok(meta) => meta,
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(BindError::Io {
                    op: "stat",
                    path: path.to_owned(),
                    source,
                });
            }
        };
        if !meta.file_type().is_socket() {
            return Err(BindError::NotASocket {
                path: path.to_owned(),
            });
        }
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(BindError::InUse {
                    path: path.to_owned(),
                    owner,
                });
            }
            Err(err) if err.kind() == io::ErrorKind::ConnectionRefused => {
                tracing::info!(path = %path.display(), owner, "replacing a stale socket");
                match std::fs::remove_file(path) {
                    Ok(()) => {}
                    Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                    Err(source) => {
                        return Err(BindError::Io {
                            op: "remove the stale socket",
                            path: path.to_owned(),
                            source,
                        });
                    }
                }
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(BindError::Io {
                    op: "probe the existing socket",
                    path: path.to_owned(),
                    source,
                });
            }
        }
    }
    Err(BindError::Io {
        op: "claim",
        path: path.to_owned(),
        source: io::Error::other("the path kept being recreated by someone else"),
    })
}

/// A connected Unix stream socket watched by the event loop for reading only.
///
/// When a process reads from a Unix stream socket, the kernel tells the peer's socket that its
/// send buffer has room again, and wakes every epoll waiter registered there for writability —
/// once per read, even when the writer never filled its buffer. A socket registered for both
/// directions (as `tokio::net::UnixStream` is) therefore wakes its process for nothing each time
/// the other side takes a message: on a request–reply link that is one extra sleep and wake per
/// message on each side. This socket is registered for reading only; writes go straight to the
/// non-blocking socket, and only a write that found the buffer full waits, on a duplicate of the
/// descriptor registered for writability while it waits.
pub(crate) type PeerStream = Watched<std::os::unix::net::UnixStream>;

/// A pipe end or a socket another process handed over (an agent's stdin or stdout), watched the
/// way [`PeerStream`] is: for reading only, writes straight to the non-blocking descriptor.
pub(crate) type WatchedFd = Watched<std::fs::File>;

/// A non-blocking descriptor registered with the event loop for reading only; see
/// [`PeerStream`].
#[derive(Debug)]
pub(crate) struct Watched<T: AsRawFd> {
    fd: tokio::io::unix::AsyncFd<T>,
}

impl PeerStream {
    /// Takes over a connected socket (it is deregistered from its own registration first).
    pub(crate) fn new(stream: tokio::net::UnixStream) -> io::Result<Self> {
        let stream = stream.into_std()?;
        stream.set_nonblocking(true)?;
        Ok(Self {
            fd: watch(stream, tokio::io::Interest::READABLE)?,
        })
    }

    /// Reads like [`read`](Self::read), and takes the descriptors that came with the bytes
    /// (`SCM_RIGHTS`, at most `max_fds`; more are closed by the kernel). Cancel-safe.
    pub(crate) async fn read_with_fds(
        &self,
        buf: &mut [u8],
        max_fds: usize,
    ) -> io::Result<(usize, Vec<OwnedFd>)> {
        use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
        let mut space =
            vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(max_fds))];
        loop {
            let mut ready = self.fd.readable().await?;
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let received = ready.try_io(|socket| {
                let mut iov = [io::IoSliceMut::new(buf)];
                recvmsg(
                    socket.get_ref(),
                    &mut iov,
                    &mut control,
                    RecvFlags::CMSG_CLOEXEC,
                )
                .map_err(io::Error::from)
            });
            match received {
                Ok(Err(err)) if err.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(err)) => return Err(err),
                Ok(Ok(msg)) => {
                    let mut fds = Vec::new();
                    for message in control.drain() {
                        if let RecvAncillaryMessage::ScmRights(received) = message {
                            fds.extend(received);
                        }
                    }
                    return Ok((msg.bytes, fds));
                }
                Err(_would_block) => {}
            }
        }
    }

    /// Sends all of `bytes` with `fds` attached to them (`SCM_RIGHTS`), waiting whenever the
    /// socket is full. Not cancel-safe.
    pub(crate) async fn send_with_fds(
        &self,
        bytes: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> io::Result<()> {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
        let mut space =
            vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
        loop {
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !control.push(SendAncillaryMessage::ScmRights(fds)) {
                return Err(io::Error::other("too many descriptors for one message"));
            }
            let iov = [io::IoSlice::new(bytes)];
            match sendmsg(self.fd.get_ref(), &iov, &mut control, SendFlags::NOSIGNAL) {
                // The descriptors went with the first byte; the rest is plain bytes.
                Ok(n) => return self.write_all(&bytes[n..]).await,
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => self.writable().await?,
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// Ends the write direction: the peer reads EOF once it has taken what was sent.
    pub(crate) fn shutdown_write(&self) -> io::Result<()> {
        self.fd.get_ref().shutdown(std::net::Shutdown::Write)
    }
}

impl WatchedFd {
    /// Takes over a pipe end or a socket: puts its open file description in non-blocking mode
    /// (shared with every other holder of the description: [`into_blocking`](Self::into_blocking)
    /// puts it back).
    pub(crate) fn new(fd: OwnedFd) -> io::Result<Self> {
        rustix::io::ioctl_fionbio(&fd, true)?;
        Ok(Self {
            fd: watch(std::fs::File::from(fd), tokio::io::Interest::READABLE)?,
        })
    }

    /// Deregisters the descriptor and puts its description back in blocking mode.
    pub(crate) fn into_blocking(self) {
        let file = self.fd.into_inner();
        let _ = rustix::io::ioctl_fionbio(&file, false);
    }
}

impl<T> Watched<T>
where
    T: AsRawFd + AsFd + From<OwnedFd>,
    for<'a> &'a T: io::Read + io::Write,
{
    /// Reads what has arrived into `buf`, waiting until something has; `Ok(0)` at EOF.
    /// Cancel-safe.
    ///
    /// A read that fills less than `buf` took all there was: the readiness it was told of is
    /// cleared then, so the next call waits for news instead of asking the descriptor again
    /// only to hear `EAGAIN` (a readiness that came meanwhile is newer and stays).
    pub(crate) async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut ready = self.fd.readable().await?;
            match ready.try_io(|inner| io::Read::read(&mut inner.get_ref(), buf)) {
                Ok(Err(err)) if err.kind() == io::ErrorKind::Interrupted => {}
                Ok(Ok(n)) => {
                    if n > 0 && n < buf.len() {
                        ready.clear_ready();
                    }
                    return Ok(n);
                }
                Ok(read) => return read,
                Err(_would_block) => {}
            }
        }
    }

    /// Writes what the descriptor takes now, without waiting (`WouldBlock` when it takes
    /// nothing).
    pub(crate) fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        io::Write::write(&mut self.fd.get_ref(), bytes)
    }

    /// Waits until the descriptor takes bytes again. Cancel-safe.
    pub(crate) async fn writable(&self) -> io::Result<()> {
        let duplicate = watch(
            T::from(self.fd.get_ref().as_fd().try_clone_to_owned()?),
            tokio::io::Interest::WRITABLE,
        )?;
        let _ready = duplicate.writable().await?;
        Ok(())
    }

    /// Writes all of `bytes`, waiting whenever the descriptor is full. Not cancel-safe.
    pub(crate) async fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            match self.try_write(bytes) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => bytes = &bytes[n..],
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => self.writable().await?,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }
}

/// Registers `inner` with the event loop for `interest`.
fn watch<T: AsRawFd>(
    inner: T,
    interest: tokio::io::Interest,
) -> io::Result<tokio::io::unix::AsyncFd<T>> {
    // SAFETY: `inner` owns its descriptor, and the `AsyncFd` owns `inner` until it is dropped,
    // so the descriptor stays open and names the same file while it is registered.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(inner, interest) }
        .map_err(|err| err.into_parts().1)
}

/// Bytes waiting to be written to a non-blocking socket, written as far as the socket takes
/// them without waiting.
#[derive(Debug, Default)]
pub(crate) struct SendBuf {
    buf: Vec<u8>,
    sent: usize,
}

impl SendBuf {
    /// Queues bytes after what is already waiting.
    pub(crate) fn push(&mut self, bytes: Vec<u8>) {
        super::append(&mut self.buf, bytes);
    }

    /// Bytes still to be written.
    pub(crate) fn pending(&self) -> usize {
        self.buf.len() - self.sent
    }

    /// Forgets everything waiting (the socket is gone).
    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.sent = 0;
    }

    /// Writes what `socket` takes now. `Ok` when everything went out or the socket is full; the
    /// error when the socket failed (the bytes stay queued; [`clear`](Self::clear) them).
    pub(crate) fn write_to<T>(&mut self, socket: &Watched<T>) -> io::Result<()>
    where
        T: AsRawFd + AsFd + From<OwnedFd>,
        for<'a> &'a T: io::Read + io::Write,
    {
        while self.pending() > 0 {
            match socket.try_write(&self.buf[self.sent..]) {
                Ok(n) => self.sent += n,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        self.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::WatchedFd;
    use std::io::Write as _;
    use std::time::Duration;

    #[tokio::test]
    async fn a_short_read_waits_for_what_comes_next_and_misses_none_of_it() {
        let (reader, writer) = std::io::pipe().unwrap();
        let reader = WatchedFd::new(std::os::fd::OwnedFd::from(reader)).unwrap();
        let mut writer = std::fs::File::from(std::os::fd::OwnedFd::from(writer));
        let mut buf = [0u8; 64];
        for (i, line) in ["one\n", "two\n", "three\n"].into_iter().enumerate() {
            if i == 1 {
                // Written while nobody waits: the next read must still see it.
                writer.write_all(line.as_bytes()).unwrap();
            } else {
                let line = line.to_owned();
                let mut late = writer.try_clone().unwrap();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(30));
                    late.write_all(line.as_bytes()).unwrap();
                });
            }
            let n = tokio::time::timeout(Duration::from_secs(5), reader.read(&mut buf))
                .await
                .expect("a read that sees what was written")
                .unwrap();
            assert_eq!(&buf[..n], line.as_bytes());
        }
        // A full buffer is not taken for all there was: the rest comes without new writes.
        writer.write_all(&[b'x'; 100]).unwrap();
        let mut total = 0;
        while total < 100 {
            total += tokio::time::timeout(Duration::from_secs(5), reader.read(&mut buf))
                .await
                .expect("the rest of a read that filled the buffer")
                .unwrap();
        }
        drop(writer);
        assert_eq!(reader.read(&mut buf).await.unwrap(), 0, "EOF");
    }
}
