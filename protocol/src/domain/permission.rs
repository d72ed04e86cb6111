//! Member permissions: the seven leaf permissions and preset expansion.
//!
//! A member carries a resolved set of leaves. Clients may send preset names
//! (`admin`, `operator`, or any preset the team defines) mixed with leaves;
//! [`resolve`] expands presets one level deep, rejects unknown entries and
//! returns the leaves de-duplicated in canonical order.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One leaf permission. The declaration order is the canonical order used on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    /// `team.manage`: edit the team and its presets.
    TeamManage,
    /// `members.manage`: member and token administration, every file, every objective thread.
    MembersManage,
    /// `objectives.create`: create objectives, list and view any objective.
    ObjectivesCreate,
    /// `objectives.cancel`: cancel or update any objective.
    ObjectivesCancel,
    /// `objectives.reassign`: reassign any objective.
    ObjectivesReassign,
    /// `objectives.watch`: edit the watchers of any objective.
    ObjectivesWatch,
    /// `activity.read`: read any member's activity.
    ActivityRead,
}

impl Permission {
    /// Every leaf, in canonical order.
    pub const ALL: [Permission; 7] = [
        Permission::TeamManage,
        Permission::MembersManage,
        Permission::ObjectivesCreate,
        Permission::ObjectivesCancel,
        Permission::ObjectivesReassign,
        Permission::ObjectivesWatch,
        Permission::ActivityRead,
    ];

    /// The wire name, e.g. `objectives.create`.
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::TeamManage => "team.manage",
            Permission::MembersManage => "members.manage",
            Permission::ObjectivesCreate => "objectives.create",
            Permission::ObjectivesCancel => "objectives.cancel",
            Permission::ObjectivesReassign => "objectives.reassign",
            Permission::ObjectivesWatch => "objectives.watch",
            Permission::ActivityRead => "activity.read",
        }
    }

    /// Parses a wire name; `None` for anything that is not a leaf.
    pub fn parse(s: &str) -> Option<Permission> {
        Permission::ALL.into_iter().find(|p| p.as_str() == s)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of leaf permissions. Serialises as a JSON array in canonical order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct PermissionSet(u8);

impl PermissionSet {
    /// The empty set.
    pub const EMPTY: PermissionSet = PermissionSet(0);

    /// All seven leaves.
    pub fn all() -> PermissionSet {
        Permission::ALL.into_iter().collect()
    }

    /// Whether `p` is in the set.
    pub fn contains(self, p: Permission) -> bool {
        self.0 & p.bit() != 0
    }

    /// Adds `p`.
    pub fn insert(&mut self, p: Permission) {
        self.0 |= p.bit();
    }

    /// Removes `p`.
    pub fn remove(&mut self, p: Permission) {
        self.0 &= !p.bit();
    }

    /// The leaves in canonical order.
    pub fn iter(self) -> impl Iterator<Item = Permission> {
        Permission::ALL
            .into_iter()
            .filter(move |p| self.contains(*p))
    }

    /// The wire names in canonical order.
    pub fn names(self) -> Vec<&'static str> {
        self.iter().map(Permission::as_str).collect()
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl FromIterator<Permission> for PermissionSet {
    fn from_iter<I: IntoIterator<Item = Permission>>(iter: I) -> Self {
        let mut set = PermissionSet::EMPTY;
        for p in iter {
            set.insert(p);
        }
        set
    }
}

impl Serialize for PermissionSet {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter().map(Permission::as_str))
    }
}

impl<'de> Deserialize<'de> for PermissionSet {
    /// Accepts leaves only (presets must be resolved with [`resolve`] first).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(deserializer)?;
        names
            .iter()
            .map(|n| {
                Permission::parse(n)
                    .ok_or_else(|| serde::de::Error::custom(format!("unknown permission '{n}'")))
            })
            .collect()
    }
}

/// A team's named presets: preset name -> leaf names.
pub type Presets = BTreeMap<String, Vec<String>>;

/// The presets a new team starts with: `admin` (every leaf) and `operator`
/// (`objectives.create`, `objectives.cancel`, `objectives.reassign`).
pub fn default_presets() -> Presets {
    let mut presets = Presets::new();
    presets.insert(
        "admin".to_owned(),
        PermissionSet::all()
            .names()
            .into_iter()
            .map(str::to_owned)
            .collect(),
    );
    presets.insert(
        "operator".to_owned(),
        [
            Permission::ObjectivesCreate,
            Permission::ObjectivesCancel,
            Permission::ObjectivesReassign,
        ]
        .iter()
        .map(|p| p.as_str().to_owned())
        .collect(),
    );
    presets
}

/// Why a permission list could not be resolved. The message is what the API returns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PermissionError {
    /// An entry is neither a leaf nor a preset name (or, in a preset definition, not a leaf:
    /// presets may not nest). The text is the TypeScript broker's, byte for byte.
    #[error(
        "{context}: unknown permission or preset '{entry}'. Valid leaves: {leaves}. Presets: {presets}."
    )]
    Unknown {
        /// Where the list came from (e.g. `member 'alice'`).
        context: String,
        /// The offending entry.
        entry: String,
        /// Comma-separated leaf names.
        leaves: String,
        /// Comma-separated preset names (or `(none)`).
        presets: String,
    },
}

/// Expands `entries` (leaves and preset names) into a leaf set.
///
/// `context` prefixes the error message so the caller can tell which list failed.
pub fn resolve<S: AsRef<str>>(
    entries: &[S],
    presets: &Presets,
    context: &str,
) -> Result<PermissionSet, PermissionError> {
    let mut set = PermissionSet::EMPTY;
    for entry in entries {
        let entry = entry.as_ref();
        if let Some(p) = Permission::parse(entry) {
            set.insert(p);
        } else if let Some(leaves) = presets.get(entry) {
            for leaf in leaves {
                // A stored preset only ever holds leaves; skip anything else defensively.
                if let Some(p) = Permission::parse(leaf) {
                    set.insert(p);
                }
            }
        } else {
            return Err(unknown(context, entry, presets));
        }
    }
    Ok(set)
}

fn unknown(context: &str, entry: &str, presets: &Presets) -> PermissionError {
    PermissionError::Unknown {
        context: context.to_owned(),
        entry: entry.to_owned(),
        leaves: PermissionSet::all().names().join(", "),
        presets: if presets.is_empty() {
            "(none)".to_owned()
        } else {
            presets.keys().cloned().collect::<Vec<_>>().join(", ")
        },
    }
}

/// Validates a preset definition: leaves only (presets may not nest). Returns the canonical
/// leaf set. An entry that is not a leaf fails with the same text as [`resolve`], context
/// `preset '<name>'`; `presets` are the team's presets the text lists.
pub fn resolve_preset<S: AsRef<str>>(
    preset: &str,
    entries: &[S],
    presets: &Presets,
) -> Result<PermissionSet, PermissionError> {
    entries
        .iter()
        .map(|e| {
            Permission::parse(e.as_ref())
                .ok_or_else(|| unknown(&format!("preset '{preset}'"), e.as_ref(), presets))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_round_trip_in_canonical_order() {
        for p in Permission::ALL {
            assert_eq!(Permission::parse(p.as_str()), Some(p));
        }
        let set: PermissionSet = [Permission::ActivityRead, Permission::TeamManage]
            .into_iter()
            .collect();
        assert_eq!(
            serde_json::to_string(&set).unwrap(),
            r#"["team.manage","activity.read"]"#
        );
        let back: PermissionSet =
            serde_json::from_str(r#"["activity.read","team.manage"]"#).unwrap();
        assert_eq!(back, set);
        assert!(serde_json::from_str::<PermissionSet>(r#"["admin"]"#).is_err());
    }

    #[test]
    fn presets_expand_and_deduplicate() {
        let presets = default_presets();
        let set = resolve(
            &["operator", "objectives.create", "activity.read"],
            &presets,
            "x",
        )
        .unwrap();
        assert_eq!(
            set.names(),
            vec![
                "objectives.create",
                "objectives.cancel",
                "objectives.reassign",
                "activity.read"
            ]
        );
        assert_eq!(
            resolve(&["admin"], &presets, "x").unwrap(),
            PermissionSet::all()
        );
        assert_eq!(
            resolve::<&str>(&[], &presets, "x").unwrap(),
            PermissionSet::EMPTY
        );
    }

    #[test]
    fn unknown_entry_names_leaves_and_presets() {
        let err = resolve(&["boss"], &default_presets(), "member 'a'").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with(
            "member 'a': unknown permission or preset 'boss'. Valid leaves: team.manage, "
        ));
        assert_eq!(
            text,
            "member 'a': unknown permission or preset 'boss'. Valid leaves: team.manage, \
             members.manage, objectives.create, objectives.cancel, objectives.reassign, \
             objectives.watch, activity.read. Presets: admin, operator."
        );
    }

    #[test]
    fn presets_may_not_nest() {
        let presets = default_presets();
        assert_eq!(
            resolve_preset("p", &["admin"], &presets)
                .unwrap_err()
                .to_string(),
            "preset 'p': unknown permission or preset 'admin'. Valid leaves: team.manage, \
             members.manage, objectives.create, objectives.cancel, objectives.reassign, \
             objectives.watch, activity.read. Presets: admin, operator."
        );
        assert_eq!(
            resolve_preset("p", &["objectives.watch"], &presets)
                .unwrap()
                .names(),
            vec!["objectives.watch"]
        );
    }
}
