//! Paths of the team's shared file space.
//!
//! A path is absolute, `/`-separated, at most [`MAX_PATH_LEN`] bytes, made of
//! segments of 1–255 characters from `[A-Za-z0-9._- ]` (no leading or trailing
//! space, not `.` or `..`). [`FsPath::parse`] normalises a single trailing slash
//! away and rejects everything else that could smuggle a traversal: `..`, `.`,
//! empty segments (`//`), NUL and other control characters, and (via
//! [`FsPath::from_bytes`]) bytes that are not UTF-8.
//!
//! Scopes: `/<member>/…` is a member's home (owner = the member);
//! `/objectives/<id>/…` belongs to an objective (owner `obj:<id>`).

use std::fmt;

/// Longest accepted path, in bytes.
pub const MAX_PATH_LEN: usize = 1024;
/// Longest accepted segment, in bytes.
pub const MAX_SEGMENT_LEN: usize = 255;

/// Why a path was refused. Each message says what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// The path is empty.
    #[error("path is empty")]
    Empty,
    /// The path does not start with `/`.
    #[error("path must be absolute (start with /): {0}")]
    NotAbsolute(String),
    /// The path is longer than [`MAX_PATH_LEN`].
    #[error("path is longer than {MAX_PATH_LEN} bytes")]
    TooLong,
    /// The path contains `//`.
    #[error("path contains an empty segment (//): {0}")]
    EmptySegment(String),
    /// The path contains `.` or `..`.
    #[error("path may not contain . or .. segments: {0}")]
    Traversal(String),
    /// The path contains NUL or another control character.
    #[error("path contains a control character")]
    ControlCharacter,
    /// The path is not valid UTF-8.
    #[error("path is not valid UTF-8")]
    NotUtf8,
    /// A segment has a character outside `[A-Za-z0-9._- ]`.
    #[error("path segment {segment:?} has a character outside [A-Za-z0-9._- ]")]
    BadCharacter {
        /// The offending segment.
        segment: String,
    },
    /// A segment starts or ends with a space.
    #[error("path segment {0:?} may not start or end with a space")]
    EdgeSpace(String),
    /// A segment is longer than [`MAX_SEGMENT_LEN`].
    #[error("path segment is longer than {MAX_SEGMENT_LEN} bytes")]
    SegmentTooLong,
}

/// A validated, normalised path (`/` or `/a/b`, never a trailing slash).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FsPath(String);

/// Which namespace a path belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope<'a> {
    /// `/` itself.
    Root,
    /// `/objectives`, the container of objective namespaces.
    ObjectivesRoot,
    /// Under `/objectives/<id>`.
    Objective {
        /// The objective id.
        id: &'a str,
    },
    /// Under `/<member>`.
    Home {
        /// The member whose home it is.
        member: &'a str,
    },
}

impl FsPath {
    /// The root path `/`.
    pub fn root() -> FsPath {
        FsPath("/".to_owned())
    }

    /// Validates raw bytes (e.g. a percent-decoded query value).
    pub fn from_bytes(raw: &[u8]) -> Result<FsPath, PathError> {
        let s = std::str::from_utf8(raw).map_err(|_| PathError::NotUtf8)?;
        FsPath::parse(s)
    }

    /// Validates and normalises `raw`.
    pub fn parse(raw: &str) -> Result<FsPath, PathError> {
        if raw.is_empty() {
            return Err(PathError::Empty);
        }
        if raw.chars().any(char::is_control) {
            return Err(PathError::ControlCharacter);
        }
        if !raw.starts_with('/') {
            return Err(PathError::NotAbsolute(raw.to_owned()));
        }
        if raw.len() > MAX_PATH_LEN {
            return Err(PathError::TooLong);
        }
        if raw == "/" {
            return Ok(FsPath::root());
        }
        let body = raw.strip_prefix('/').unwrap_or(raw);
        let body = body.strip_suffix('/').unwrap_or(body);
        for segment in body.split('/') {
            check_segment(segment, raw)?;
        }
        Ok(FsPath(format!("/{body}")))
    }

    /// The path as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is `/`.
    pub fn is_root(&self) -> bool {
        self.0 == "/"
    }

    /// The segments, outermost first (empty for `/`).
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|s| !s.is_empty())
    }

    /// The last segment (`""` for `/`).
    pub fn name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or("")
    }

    /// The parent directory; `None` for `/`.
    pub fn parent(&self) -> Option<FsPath> {
        if self.is_root() {
            return None;
        }
        match self.0.rfind('/') {
            Some(0) | None => Some(FsPath::root()),
            Some(i) => Some(FsPath(self.0[..i].to_owned())),
        }
    }

    /// Appends one segment, validating it.
    pub fn join(&self, segment: &str) -> Result<FsPath, PathError> {
        check_segment(segment, segment)?;
        let joined = if self.is_root() {
            format!("/{segment}")
        } else {
            format!("{}/{segment}", self.0)
        };
        if joined.len() > MAX_PATH_LEN {
            return Err(PathError::TooLong);
        }
        Ok(FsPath(joined))
    }

    /// Whether `self` is `other` or lies below it.
    pub fn is_within(&self, other: &FsPath) -> bool {
        other.is_root()
            || self.0 == other.0
            || (self.0.starts_with(&other.0) && self.0.as_bytes().get(other.0.len()) == Some(&b'/'))
    }

    /// Every ancestor directory from the outermost (excluding `/` and `self`).
    pub fn ancestors(&self) -> Vec<FsPath> {
        let mut out = Vec::new();
        let mut cur = self.parent();
        while let Some(p) = cur {
            if p.is_root() {
                break;
            }
            cur = p.parent();
            out.push(p);
        }
        out.reverse();
        out
    }

    /// The sibling name used for the `n`-th collision: `report.pdf` -> `report-1.pdf`,
    /// `notes` -> `notes-1`, `.env` -> `.env-1`.
    pub fn with_suffix(&self, n: u32) -> Result<FsPath, PathError> {
        let name = self.name();
        let (stem, ext) = match name.rfind('.') {
            Some(i) if i > 0 => (&name[..i], &name[i..]),
            _ => (name, ""),
        };
        let parent = self.parent().unwrap_or_else(FsPath::root);
        parent.join(&format!("{stem}-{n}{ext}"))
    }

    /// The namespace this path lies in.
    pub fn scope(&self) -> Scope<'_> {
        let mut segs = self.segments();
        match (segs.next(), segs.next()) {
            (None, _) => Scope::Root,
            (Some("objectives"), None) => Scope::ObjectivesRoot,
            (Some("objectives"), Some(id)) => Scope::Objective { id },
            (Some(member), _) => Scope::Home { member },
        }
    }

    /// The owner string reported in entries: the member, `obj:<id>`, `objectives`, or `""` for `/`.
    pub fn owner(&self) -> String {
        match self.scope() {
            Scope::Root => String::new(),
            Scope::ObjectivesRoot => "objectives".to_owned(),
            Scope::Objective { id } => format!("obj:{id}"),
            Scope::Home { member } => member.to_owned(),
        }
    }
}

impl fmt::Display for FsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn check_segment(segment: &str, whole: &str) -> Result<(), PathError> {
    if segment.is_empty() {
        return Err(PathError::EmptySegment(whole.to_owned()));
    }
    if segment == "." || segment == ".." {
        return Err(PathError::Traversal(whole.to_owned()));
    }
    if segment.len() > MAX_SEGMENT_LEN {
        return Err(PathError::SegmentTooLong);
    }
    if !segment
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b' '))
    {
        if segment.chars().any(char::is_control) {
            return Err(PathError::ControlCharacter);
        }
        return Err(PathError::BadCharacter {
            segment: segment.to_owned(),
        });
    }
    if segment.starts_with(' ') || segment.ends_with(' ') {
        return Err(PathError::EdgeSpace(segment.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_and_normalises() {
        assert_eq!(FsPath::parse("/").unwrap().as_str(), "/");
        assert_eq!(FsPath::parse("/alice/").unwrap().as_str(), "/alice");
        assert_eq!(
            FsPath::parse("/alice/my notes/a.txt").unwrap().name(),
            "a.txt"
        );
        assert_eq!(
            FsPath::parse("/alice/x/y")
                .unwrap()
                .parent()
                .unwrap()
                .as_str(),
            "/alice/x"
        );
        assert_eq!(
            FsPath::parse("/alice").unwrap().parent().unwrap(),
            FsPath::root()
        );
    }

    #[test]
    fn rejects_traversal_and_junk() {
        for bad in [
            "",
            "alice",
            "/alice/../bob",
            "/..",
            "/alice/.",
            "//alice",
            "/alice//x",
            "/a\0b",
            "/a/\n",
            "/a/b*c",
            "/a/ b",
            "/a/b ",
            "/a/é",
        ] {
            assert!(FsPath::parse(bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(FsPath::from_bytes(b"/a/\xff"), Err(PathError::NotUtf8));
        assert_eq!(FsPath::parse("/a/\0"), Err(PathError::ControlCharacter));
    }

    #[test]
    fn length_boundaries() {
        let seg = "a".repeat(MAX_SEGMENT_LEN);
        assert!(FsPath::parse(&format!("/{seg}")).is_ok());
        assert_eq!(
            FsPath::parse(&format!("/{seg}a")),
            Err(PathError::SegmentTooLong)
        );
        // 1024 bytes exactly: "/" + 4 segments of 255 + 3 slashes = 1024
        let max = format!("/{seg}/{seg}/{seg}/{seg}");
        assert_eq!(max.len(), 1024);
        assert!(FsPath::parse(&max).is_ok());
        assert_eq!(FsPath::parse(&format!("{max}a")), Err(PathError::TooLong));
    }

    #[test]
    fn scopes_and_owners() {
        let p = FsPath::parse("/objectives/obj-1/a.txt").unwrap();
        assert_eq!(p.scope(), Scope::Objective { id: "obj-1" });
        assert_eq!(p.owner(), "obj:obj-1");
        assert_eq!(FsPath::parse("/objectives").unwrap().owner(), "objectives");
        assert_eq!(FsPath::parse("/bob/x").unwrap().owner(), "bob");
        assert_eq!(FsPath::root().scope(), Scope::Root);
    }

    #[test]
    fn suffixes() {
        let p = FsPath::parse("/a/report.pdf").unwrap();
        assert_eq!(p.with_suffix(1).unwrap().as_str(), "/a/report-1.pdf");
        assert_eq!(
            FsPath::parse("/a/notes")
                .unwrap()
                .with_suffix(2)
                .unwrap()
                .as_str(),
            "/a/notes-2"
        );
        assert_eq!(
            FsPath::parse("/a/.env")
                .unwrap()
                .with_suffix(1)
                .unwrap()
                .as_str(),
            "/a/.env-1"
        );
    }

    #[test]
    fn within_and_ancestors() {
        let p = FsPath::parse("/a/b/c").unwrap();
        assert!(p.is_within(&FsPath::parse("/a").unwrap()));
        assert!(
            !FsPath::parse("/ab")
                .unwrap()
                .is_within(&FsPath::parse("/a").unwrap())
        );
        let anc: Vec<_> = p.ancestors().into_iter().map(|p| p.0).collect();
        assert_eq!(anc, vec!["/a", "/a/b"]);
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct(
                concat!(env!("CARGO_MANIFEST_DIR"), "/../proptest-regressions/vfs.txt"),
            ))),
            ..ProptestConfig::default()
        })]

        /// Whatever is accepted is normalised, re-parses to itself and contains no traversal.
        #[test]
        fn accepted_paths_are_canonical(raw in "(/[a-z. \\-]{0,4}){0,5}/?") {
            if let Ok(p) = FsPath::parse(&raw) {
                prop_assert_eq!(FsPath::parse(p.as_str()).unwrap(), p.clone());
                prop_assert!(!p.as_str().contains("//"));
                prop_assert!(p.segments().all(|s| s != ".." && s != "."));
                prop_assert!(p.is_root() || !p.as_str().ends_with('/'));
            }
        }
    }
}
