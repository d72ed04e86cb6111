//! The Ash bridge's map from the host's session ids to the agent's (claude's) session UUIDs.
//!
//! The host names its sessions freely (`"s1"`, `"chat-42"`); claude wants a UUID for
//! `--session-id` and refuses one that already exists. So the two are kept apart: the first
//! query of a host session gets a fresh UUID (`--session-id <uuid>`); once claude has named that
//! session in a message it exists, and later queries continue it (`--resume <uuid>`), even after
//! the bridge restarts, because the map is kept in `<workspace>/.ac7-ash-sessions.json` (written
//! atomically, mode 0600, after every change). If claude reports another session id than the one
//! it was given, the map follows claude. A session whose first turn ended before claude named it
//! is forgotten, so the next query starts it afresh.
//!
//! File format: `{"version":1,"sessions":{"<host id>":{"agentSession":"<uuid>","started":true}}}`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The map's file name, in the workspace.
pub const SESSIONS_FILE: &str = ".ac7-ash-sessions.json";

/// One host session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSession {
    /// Claude's session UUID.
    pub agent_session: String,
    /// Whether claude has created it (named it in a message): `--resume` rather than
    /// `--session-id`.
    pub started: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    version: u32,
    sessions: BTreeMap<String, AgentSession>,
}

/// How a turn addresses claude's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionArgs {
    /// `--session-id` (new) or `--resume` (existing).
    pub flag: &'static str,
    /// Claude's session UUID.
    pub agent_session: String,
}

/// The map, with the file it is kept in.
#[derive(Debug)]
pub struct SessionMap {
    path: PathBuf,
    sessions: BTreeMap<String, AgentSession>,
}

impl SessionMap {
    /// Loads the map kept in `dir` (empty when there is none; an unreadable or corrupt file is
    /// logged, kept aside as `<file>.bad`, and the map starts empty).
    pub fn load(dir: &Path) -> Self {
        let path = dir.join(SESSIONS_FILE);
        let sessions = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<File>(&bytes) {
                Ok(file) => file.sessions,
                Err(err) => {
                    let aside = path.with_extension("json.bad");
                    tracing::warn!(
                        path = %path.display(),
                        aside = %aside.display(),
                        error = %err,
                        "the Ash session map is not valid; keeping it aside and starting empty"
                    );
                    let _ = std::fs::rename(&path, &aside);
                    BTreeMap::new()
                }
            },
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err, "cannot read the Ash session map; starting empty");
                BTreeMap::new()
            }
        };
        Self { path, sessions }
    }

    /// The file the map is kept in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entry of a host session.
    pub fn get(&self, host_session: &str) -> Option<&AgentSession> {
        self.sessions.get(host_session)
    }

    /// How the next turn of `host_session` addresses claude: `--resume` for a started session,
    /// `--session-id` with its UUID (a fresh one for a session never seen) otherwise.
    pub fn for_turn(&mut self, host_session: &str) -> SessionArgs {
        if let Some(entry) = self.sessions.get(host_session) {
            return SessionArgs {
                flag: if entry.started {
                    "--resume"
                } else {
                    "--session-id"
                },
                agent_session: entry.agent_session.clone(),
            };
        }
        let agent_session = uuid::Uuid::new_v4().to_string();
        self.sessions.insert(
            host_session.to_owned(),
            AgentSession {
                agent_session: agent_session.clone(),
                started: false,
            },
        );
        self.save();
        SessionArgs {
            flag: "--session-id",
            agent_session,
        }
    }

    /// Claude named `agent_session` during a turn of `host_session`: it exists.
    pub fn started(&mut self, host_session: &str, agent_session: &str) {
        let entry = AgentSession {
            agent_session: agent_session.to_owned(),
            started: true,
        };
        if self.sessions.get(host_session) != Some(&entry) {
            self.sessions.insert(host_session.to_owned(), entry);
            self.save();
        }
    }

    /// A turn of `host_session` ended without claude naming a session: a session that never
    /// started is forgotten (the next query gets a fresh UUID).
    pub fn unnamed(&mut self, host_session: &str) {
        if self
            .sessions
            .get(host_session)
            .is_some_and(|entry| !entry.started)
        {
            self.sessions.remove(host_session);
            self.save();
        }
    }

    /// `resume`: a session this bridge has started resumes as it is; a UUID it does not know is
    /// taken as a claude session made elsewhere and adopted (the next query resumes it). Anything
    /// else cannot be resumed.
    pub fn resume(&mut self, host_session: &str) -> Result<(), String> {
        match self.sessions.get(host_session) {
            Some(entry) if entry.started => Ok(()),
            _ if uuid::Uuid::parse_str(host_session).is_ok() => {
                self.started(host_session, host_session);
                Ok(())
            }
            _ => Err(format!(
                "cannot resume session {host_session:?}: this bridge has no conversation for it \
                 (send a query to start one, or resume a claude session by its UUID)"
            )),
        }
    }

    fn save(&self) {
        let file = File {
            version: 1,
            sessions: self.sessions.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&file).expect("the map serializes");
        if let Err(err) = crate::sys::fsutil::write_atomic(&self.path, &bytes) {
            tracing::warn!(
                path = %self.path.display(),
                error = %err,
                "cannot save the Ash session map; a restarted bridge will not resume these sessions"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_map_persists_adopts_forgets_and_survives_a_corrupt_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SESSIONS_FILE), b"{not json").unwrap();
        let mut map = SessionMap::load(dir.path());
        assert!(map.get("a").is_none(), "a corrupt map starts empty");
        assert!(dir.path().join(".ac7-ash-sessions.json.bad").exists());

        let first = map.for_turn("a");
        assert_eq!(first.flag, "--session-id");
        assert!(uuid::Uuid::parse_str(&first.agent_session).is_ok());
        let mode = std::fs::metadata(map.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            map.for_turn("a"),
            first,
            "not started yet: the same UUID again"
        );
        map.started("a", &first.agent_session);

        // Another bridge reads what this one wrote.
        let mut again = SessionMap::load(dir.path());
        assert_eq!(
            again.for_turn("a"),
            SessionArgs {
                flag: "--resume",
                agent_session: first.agent_session.clone()
            }
        );
        assert_eq!(again.resume("a"), Ok(()));
        assert!(
            again
                .resume("b")
                .unwrap_err()
                .starts_with("cannot resume session \"b\"")
        );
        let elsewhere = "0b4f6d5e-7c0a-4f3e-9d1b-2a6c8e0f1a2b";
        assert_eq!(again.resume(elsewhere), Ok(()));
        assert_eq!(again.for_turn(elsewhere).flag, "--resume");
        // A first turn that never named its session is forgotten.
        again.for_turn("c");
        again.unnamed("c");
        assert!(SessionMap::load(dir.path()).get("c").is_none());
        again.unnamed("a");
        assert!(
            SessionMap::load(dir.path()).get("a").is_some(),
            "started sessions stay"
        );
    }
}
