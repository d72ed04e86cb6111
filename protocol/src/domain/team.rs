//! The team and a member's role, as the broker serves them and the runner reads them.

use serde::{Deserialize, Serialize};

use crate::domain::permission::Presets;

/// A member's role.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Role {
    /// Short title, e.g. `engineer`.
    pub title: String,
    /// What the role does (may be empty).
    #[serde(default)]
    pub description: String,
}

/// The team record.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Team {
    /// Team name.
    pub name: String,
    /// What the team is for.
    pub directive: String,
    /// Background (may be empty).
    #[serde(default)]
    pub context: String,
    /// Named permission presets.
    #[serde(rename = "permissionPresets", default)]
    pub permission_presets: Presets,
}
