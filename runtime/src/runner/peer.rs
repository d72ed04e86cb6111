//! Who is on the other end of the runner's socket: the agent's own bridge, another process of the
//! agent's tree, or an outsider.
//!
//! The kernel records the connecting process's pid with every Unix-socket connection
//! (`SO_PEERCRED`). A bridge of the agent's is the agent process itself or one of its
//! descendants; the runner walks the parent chain in `/proc/<pid>/stat` from the peer up to the
//! agent (or to pid 1). Anything else — `claude mcp list` checking its servers' health from
//! another terminal, a stray `ac7 mcp-bridge` — is an [`Origin::Outsider`]: the runner serves its
//! requests but never lets it displace the agent's bridge or receive events.
//!
//! Inside the tree the bridge's parent says which MCP client started it: the agent itself
//! ([`Origin::Agent`]), or another process ([`Origin::Client`] with its pid) — `claude mcp list`
//! run by the agent's shell tool starts a bridge of its own to check it. The runner session
//! decides what such a bridge may do ([`ac7_protocol::session::runner`]).
//!
//! A peer whose pid is unknown, or that exited before it could be looked up, is an outsider;
//! so is every connection before the agent's pid is known.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use ac7_protocol::session::runner::Origin;

/// Parent links followed at most (a process tree is never this deep; it bounds the walk).
const MAX_DEPTH: usize = 4096;

/// The agent's pid, set once the runner has spawned it. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct AgentPid(Arc<AtomicU32>);

impl AgentPid {
    /// Records the agent's pid.
    pub fn set(&self, pid: u32) {
        self.0.store(pid, Ordering::SeqCst);
    }

    /// The agent's pid, once set.
    pub fn get(&self) -> Option<u32> {
        Some(self.0.load(Ordering::SeqCst)).filter(|pid| *pid != 0)
    }

    /// Where a connection from process `peer` comes from.
    pub fn classify(&self, peer: Option<u32>) -> Origin {
        match (peer, self.get()) {
            (Some(peer), Some(agent)) if peer == agent => Origin::Agent,
            (Some(peer), Some(agent)) if descends_from(peer, agent) => match parent_of(peer) {
                Some(parent) if parent == agent => Origin::Agent,
                Some(parent) => Origin::Client(parent),
                None => Origin::Outsider,
            },
            _ => Origin::Outsider,
        }
    }
}

/// Whether `pid` is `ancestor` or one of its descendants (per `/proc`).
pub fn descends_from(pid: u32, ancestor: u32) -> bool {
    let mut current = pid;
    for _ in 0..MAX_DEPTH {
        if current == ancestor {
            return true;
        }
        match parent_of(current) {
            // Pid 1 (init) and 0 (the kernel) end the walk.
            Some(parent) if parent > 1 && parent != current => current = parent,
            _ => return false,
        }
    }
    false
}

/// The parent pid of `pid`, from `/proc/<pid>/stat` (`pid (comm) state ppid …`; `comm` may hold
/// spaces and parentheses, so parsing starts after the last `)`).
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_ppid(&stat)
}

fn parse_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_parent_even_with_odd_command_names() {
        assert_eq!(parse_ppid("42 (a b) c) S 17 42 42 0"), Some(17));
        assert_eq!(parse_ppid("42 (sh) R 1 1 1"), Some(1));
        assert_eq!(parse_ppid("garbage"), None);
    }

    #[test]
    fn this_process_descends_from_its_parent_and_not_from_a_child() {
        let me = std::process::id();
        let parent = std::os::unix::process::parent_id();
        assert!(descends_from(me, me));
        assert!(descends_from(me, parent));
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert!(descends_from(child.id(), me));
        assert!(!descends_from(me, child.id()));
        child.kill().unwrap();
        child.wait().unwrap();

        let agent = AgentPid::default();
        assert_eq!(agent.classify(Some(me)), Origin::Outsider, "no agent yet");
        agent.set(parent);
        assert_eq!(agent.classify(Some(me)), Origin::Agent);
        assert_eq!(agent.classify(None), Origin::Outsider);
        agent.set(me);
        assert_eq!(agent.classify(Some(parent)), Origin::Outsider);
        assert_eq!(agent.classify(Some(me)), Origin::Agent, "the agent itself");
    }

    #[test]
    fn a_grandchild_is_the_client_its_parent_is() {
        // sh (our child) starts sleep: sleep's parent is sh, not us.
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(sh.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let sleep: u32 = line.trim().parse().unwrap();
        let agent = AgentPid::default();
        agent.set(std::process::id());
        assert_eq!(agent.classify(Some(sh.id())), Origin::Agent);
        assert_eq!(agent.classify(Some(sleep)), Origin::Client(sh.id()));
        let _ = std::process::Command::new("kill")
            .arg(sleep.to_string())
            .status();
        sh.wait().unwrap();
    }
}
