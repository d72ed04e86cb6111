//! The team config file that creates a team on first start.
//!
//! JSON, for example:
//!
//! ```json
//! {
//!   "team": { "name": "demo", "directive": "Ship the payment service.", "context": "" },
//!   "members": [
//!     { "name": "director", "role": { "title": "director", "description": "Leads." },
//!       "permissions": ["admin"] },
//!     { "name": "builder", "role": { "title": "engineer" }, "instructions": "Own the backend." }
//!   ]
//! }
//! ```
//!
//! `team.permissionPresets` is optional; the presets `admin` (every permission) and
//! `operator` (`objectives.create`, `objectives.cancel`, `objectives.reassign`) are
//! always available unless the file redefines them. Member `permissions` may name
//! leaves or presets. Errors name the file, the place and the shape expected.

use std::path::Path;

use ac7_protocol::domain::permission::Presets;
use serde::Deserialize;

use super::team::Role;

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamConfig {
    /// The team.
    pub team: TeamSection,
    /// Its members.
    pub members: Vec<MemberSection>,
}

/// `team`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamSection {
    /// Team name (1–128 characters).
    pub name: String,
    /// What the team is for (1–512 characters).
    pub directive: String,
    /// Background (≤4096 characters).
    #[serde(default)]
    pub context: String,
    /// Extra or redefined presets.
    #[serde(rename = "permissionPresets", default)]
    pub permission_presets: Presets,
}

/// One entry of `members`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberSection {
    /// Unique name (`[A-Za-z0-9._-]`, 1–128).
    pub name: String,
    /// Role.
    pub role: Role,
    /// Private instructions.
    #[serde(default)]
    pub instructions: String,
    /// Leaves and preset names.
    #[serde(default)]
    pub permissions: Vec<String>,
}

/// Why a team config could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Unreadable file.
    #[error("cannot read team config {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not the expected JSON.
    #[error("team config {path} is not valid: {}", plain(.error))]
    Parse {
        /// The file.
        path: String,
        /// The JSON error (its text is in the message, in the file's words).
        error: serde_json::Error,
    },
    /// A value breaks a rule.
    #[error("team config: {0}")]
    Invalid(String),
}

/// A JSON error in the words of the file's format: the shapes it expected, never the names
/// of the types that read it.
fn plain(e: &serde_json::Error) -> String {
    const SHAPES: [(&str, &str); 6] = [
        (
            "struct TeamConfig",
            "an object {\"team\": {…}, \"members\": […]}",
        ),
        (
            "struct TeamSection",
            "an object {\"name\", \"directive\", \"context\"}",
        ),
        (
            "struct MemberSection",
            "an object {\"name\", \"role\", \"instructions\", \"permissions\"}",
        ),
        (
            "struct Role",
            "an object {\"title\": …, \"description\": …}",
        ),
        ("a sequence", "a list […]"),
        ("a map", "an object {…}"),
    ];
    SHAPES
        .iter()
        .fold(e.to_string(), |text, (rust, json)| text.replace(rust, json))
}

impl TeamConfig {
    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<TeamConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|error| ConfigError::Parse {
            path: path.display().to_string(),
            error,
        })
    }
}
