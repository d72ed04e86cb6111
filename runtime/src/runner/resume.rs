//! The resume hint of `ac7 claude-code`: after Claude Code exits, the command that resumes its
//! session with ac7 around it.
//!
//! Claude Code ends a session that has a conversation with `Resume this session with:` and
//! `claude --resume <session id>`; resumed that way it has no ac7 (no team tools, no events). So
//! the runner prints one line after it: `ac7 claude-code -- --resume <session id>` (with the
//! `--url` options it was given when they are not the default).
//!
//! The session id is found without touching the agent's terminal. While it runs, Claude Code
//! keeps `<config>/sessions/<pid>.json` (`{"pid":…,"sessionId":…,"cwd":…,…}`; `<config>` is
//! `$CLAUDE_CONFIG_DIR`, else `$HOME/.claude`), rewrites it whenever its session changes
//! (`/clear`, `/resume`) and removes it when it exits. The runner reads the files of the processes
//! in the agent's tree every [`POLL`] while the agent runs (the agent's own first). When the
//! agent has exited, the last id seen is the one, if its transcript
//! (`<config>/projects/<project>/<id>.jsonl`) holds a conversation (a `user` or `assistant`
//! entry): Claude Code prints its hint on the same condition, and `--resume` refuses a session
//! without one.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

use crate::runner::peer::descends_from;

/// How often the session files are read while the agent runs.
pub const POLL: Duration = Duration::from_millis(500);

/// Claude Code's configuration directory: `$CLAUDE_CONFIG_DIR`, else `$HOME/.claude`.
pub fn claude_config_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CLAUDE_CONFIG_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|home| PathBuf::from(home).join(".claude"))
}

/// Follows the session of the Claude Code process `agent` (and its descendants).
#[derive(Debug)]
pub struct SessionWatch {
    config: PathBuf,
    agent: u32,
    last: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl SessionWatch {
    /// Starts reading `<config>/sessions/` every [`POLL`].
    pub fn start(config: PathBuf, agent: u32) -> Self {
        let last = Arc::new(Mutex::new(None));
        let task = {
            let (config, last) = (config.clone(), Arc::clone(&last));
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(POLL).await;
                    let dir = config.join("sessions");
                    let found = tokio::task::spawn_blocking(move || current_session(&dir, agent))
                        .await
                        .ok()
                        .flatten();
                    if let Some(id) = found
                        && let Ok(mut last) = last.lock()
                    {
                        *last = Some(id);
                    }
                }
            })
        };
        Self {
            config,
            agent,
            last,
            task,
        }
    }

    /// After the agent exited: the session to resume, if it has a conversation.
    pub fn finish(self) -> Option<String> {
        self.task.abort();
        // The agent may have left its file behind (killed): it is the latest word.
        let latest = current_session(&self.config.join("sessions"), self.agent);
        let id = latest.or_else(|| self.last.lock().ok()?.clone())?;
        has_conversation(&self.config, &id).then_some(id)
    }
}

#[derive(Deserialize)]
struct SessionFile {
    #[serde(rename = "sessionId")]
    session_id: Option<String>,
}

/// The session id in the session file of `agent`, or else of a process in its tree.
fn current_session(dir: &Path, agent: u32) -> Option<String> {
    let read = |pid: u32| -> Option<String> {
        let text = std::fs::read_to_string(dir.join(format!("{pid}.json"))).ok()?;
        let file: SessionFile = serde_json::from_str(&text).ok()?;
        file.session_id.filter(|id| is_session_id(id))
    };
    if let Some(id) = read(agent) {
        return Some(id);
    }
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json")?.parse().ok())
        .filter(|pid| *pid != agent && descends_from(*pid, agent))
        .find_map(read)
}

/// A session id as Claude Code makes them (a UUID): safe in a file name and on a command line.
fn is_session_id(id: &str) -> bool {
    id.len() == 36
        && id.chars().enumerate().all(|(i, c)| {
            matches!(i, 8 | 13 | 18 | 23) == (c == '-') && (c == '-' || c.is_ascii_hexdigit())
        })
}

#[derive(Deserialize)]
struct Entry {
    #[serde(rename = "type")]
    kind: Option<String>,
}

/// Whether `<config>/projects/*/<id>.jsonl` holds a `user` or `assistant` entry.
fn has_conversation(config: &Path, id: &str) -> bool {
    let Ok(projects) = std::fs::read_dir(config.join("projects")) else {
        return false;
    };
    projects.flatten().any(|project| {
        let Ok(file) = std::fs::File::open(project.path().join(format!("{id}.jsonl"))) else {
            return false;
        };
        std::io::BufReader::new(file).lines().any(|line| {
            line.ok()
                .and_then(|l| serde_json::from_str::<Entry>(&l).ok())
                .and_then(|e| e.kind)
                .is_some_and(|k| k == "user" || k == "assistant")
        })
    })
}

/// The line the runner prints: `ac7 claude-code [--url U]… -- --resume <id>`; `urls` are the
/// broker URLs the runner was given, left out when they are just the default.
pub fn hint(urls: &[String], id: &str) -> String {
    let mut line = String::from("ac7 claude-code");
    if urls != [crate::client::DEFAULT_URL] {
        for url in urls {
            line.push_str(" --url ");
            line.push_str(&shell_word(url));
        }
    }
    line.push_str(" -- --resume ");
    line.push_str(id);
    line
}

/// `word` as one shell word: as is when it has nothing a shell would read differently, else in
/// single quotes.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "7d9d5680-fbe0-4810-88bb-f3506407ba97";

    #[test]
    fn the_hint_keeps_the_broker_urls_unless_default() {
        assert_eq!(
            hint(&[crate::client::DEFAULT_URL.to_owned()], ID),
            format!("ac7 claude-code -- --resume {ID}")
        );
        assert_eq!(
            hint(
                &["https://a.example:8717".into(), "http://b/x y".into()],
                ID
            ),
            format!(
                "ac7 claude-code --url https://a.example:8717 --url 'http://b/x y' -- --resume {ID}"
            )
        );
    }

    #[test]
    fn session_ids_are_uuids() {
        assert!(is_session_id(ID));
        assert!(!is_session_id("7d9d5680-fbe0-4810-88bb-f3506407ba9"));
        assert!(!is_session_id("7d9d5680-fbe0-4810-88bb-f3506407ba9; rm"));
        assert!(!is_session_id("../../../../etc/passwd-aaaaaaaaaaaaaaaaaa"));
    }

    #[test]
    fn a_session_counts_once_it_has_a_conversation() {
        let config = tempfile::tempdir().unwrap();
        let project = config.path().join("projects/-work-x");
        std::fs::create_dir_all(&project).unwrap();
        let transcript = project.join(format!("{ID}.jsonl"));
        assert!(!has_conversation(config.path(), ID), "no transcript");
        std::fs::write(
            &transcript,
            format!("{{\"type\":\"mode\",\"sessionId\":\"{ID}\"}}\nnot json\n"),
        )
        .unwrap();
        assert!(!has_conversation(config.path(), ID), "no conversation yet");
        std::fs::write(
            &transcript,
            format!(
                "{{\"type\":\"mode\",\"sessionId\":\"{ID}\"}}\n{{\"type\":\"user\",\"message\":{{}}}}\n"
            ),
        )
        .unwrap();
        assert!(has_conversation(config.path(), ID));
    }

    #[test]
    fn the_agents_file_or_else_one_of_its_tree() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let parent = std::os::unix::process::parent_id();
        let file = |pid: u32, id: &str| {
            std::fs::write(
                dir.path().join(format!("{pid}.json")),
                format!("{{\"pid\":{pid},\"sessionId\":\"{id}\",\"cwd\":\"/x\"}}"),
            )
            .unwrap();
        };
        let other = "11111111-2222-3333-4444-555555555555";
        // A process outside the tree (our parent, seen from us as the agent) does not count.
        file(parent, other);
        assert_eq!(current_session(dir.path(), me), None);
        // One inside it does (the agent behind a wrapper).
        assert_eq!(current_session(dir.path(), parent), Some(other.to_owned()));
        file(me, ID);
        assert_eq!(current_session(dir.path(), me), Some(ID.to_owned()));
        assert_eq!(
            current_session(dir.path(), parent),
            Some(other.to_owned()),
            "the agent's own file first"
        );
    }
}
