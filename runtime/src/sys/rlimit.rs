//! The open-file limit of `ac7` processes that hold many sockets: `ac7 serve` (one descriptor per
//! connection) and the runners (the trace proxy's listener takes whatever local process connects).

use std::sync::OnceLock;

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// The soft limit this process started with, saved by the first [`raise_fd_limit`].
static STARTED_WITH: OnceLock<Rlimit> = OnceLock::new();

/// Raises this process's open-file soft limit to its hard limit and returns the
/// limit now in force (`None` if unlimited or unknown).
pub fn raise_fd_limit() -> Option<u64> {
    let limit = getrlimit(Resource::Nofile);
    let _ = STARTED_WITH.set(limit);
    if limit.current < limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return limit.maximum;
        }
    }
    limit.current
}

/// Makes `command`'s process start with the soft limit this process started with (before
/// [`raise_fd_limit`]), so programs that still use `select(2)` and break on descriptors past
/// 1024 see the limit they were given. A no-op when the limit was never raised.
pub fn restore_fd_limit_in_child(command: &mut tokio::process::Command) {
    let Some(&started) = STARTED_WITH.get() else {
        return;
    };
    if started.current == getrlimit(Resource::Nofile).current {
        return;
    }
    // SAFETY: the closure runs between fork and exec; it makes one setrlimit(2) system call
    // (async-signal-safe), allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            // Lowering the soft limit cannot fail while it stays under the hard one; if it
            // does, the agent runs with the raised limit, which is no worse.
            let _ = setrlimit(Resource::Nofile, started);
            Ok(())
        });
    }
}
