//! Device-code enrollment (`ac7 connect`, RFC 8628 style): the store behind `POST /enroll`,
//! `POST /enroll/poll`, the pending list and approve/deny in the web app.
//!
//! Contract (time is `now`, unix seconds, passed in; randomness is passed in as bytes):
//! * [`EnrollStore::create`] takes 32 random bytes for the device code (sent only to the device:
//!   `ac7-dc_` + base64url, 256 bits) and 8 for the user code (8 characters of [`USER_ALPHABET`],
//!   Crockford's base32 — digits and letters without `I L O U` — shown `XXXX-XXXX`; 32
//!   symbols, so each byte maps without bias). It refuses when the client address already holds
//!   [`EnrollConfig::max_pending_per_address`] live enrollments or the store holds
//!   [`EnrollConfig::max_pending`] ([`CreateError::TooMany`], with `retry_after`); a denied
//!   enrollment (kept only to tell its device) counts toward neither. It also refuses when the
//!   user code (or device code) is already live ([`CreateError::CodeTaken`]: draw new bytes and
//!   call again) — user codes are unique among live enrollments. The enrollment lives
//!   [`EnrollConfig::ttl`] seconds (expired when `now >= expires_at`).
//! * [`EnrollStore::poll`] (by device code): unknown or expired → [`PollOutcome::Expired`];
//!   denied → [`PollOutcome::Denied`] once, then unknown; approved → [`PollOutcome::Approved`]
//!   with the member and the grant (the token) exactly once, then unknown; pending →
//!   [`PollOutcome::SlowDown`] when polled less than [`EnrollConfig::interval`] seconds after
//!   the previous poll, else [`PollOutcome::Pending`].
//! * [`EnrollStore::approve`] / [`EnrollStore::deny`] (by user code, normalised by
//!   [`normalize_user_code`]) need an approver holding `members.manage`; they refuse an unknown,
//!   expired or already decided enrollment. Nothing is approved after expiry.
//! * A grant that will never be handed over — approved, then expired before the device polled —
//!   comes out of [`EnrollStore::poll_output`] as [`EnrollOutput::Revoke`], so the caller revokes
//!   that token instead of leaving it live. [`EnrollStore::handle_timeout`] expires entries at
//!   [`EnrollStore::poll_timeout`]; `create` and `poll` expire lazily too.

use crate::UnixSecs;
use crate::domain::permission::{Permission, PermissionSet};
use std::collections::{BTreeMap, VecDeque};

/// The user-code alphabet: Crockford's base32, digits and upper-case letters without `I`, `L`,
/// `O`, `U`.
pub const USER_ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
/// Random bytes for a device code.
pub const DEVICE_RANDOM_BYTES: usize = 32;
/// Random bytes (= characters) for a user code.
pub const USER_RANDOM_BYTES: usize = 8;
/// Prefix of every device code.
pub const DEVICE_CODE_PREFIX: &str = "ac7-dc_";

/// Limits and timings of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnrollConfig {
    /// Seconds an enrollment lives.
    pub ttl: u64,
    /// Seconds the device waits between polls.
    pub interval: u64,
    /// Live enrollments one client address may hold.
    pub max_pending_per_address: usize,
    /// Live enrollments the store holds at most.
    pub max_pending: usize,
}

impl Default for EnrollConfig {
    /// 5 minutes to approve (as in the TypeScript ac7), 5 s poll interval, 3 per address, 1000 in
    /// all.
    fn default() -> Self {
        EnrollConfig {
            ttl: 300,
            interval: 5,
            max_pending_per_address: 3,
            max_pending: 1000,
        }
    }
}

/// A new enrollment, as `POST /enroll` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// The device's secret (`ac7-dc_…`).
    pub device_code: String,
    /// The code a human types into the web app (`XXXX-XXXX`).
    pub user_code: String,
    /// Unix seconds at which it expires.
    pub expires_at: UnixSecs,
    /// Seconds between polls.
    pub interval: u64,
}

/// Why `create` refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CreateError {
    /// Too many live enrollments for this address (or in all).
    #[error("too many pending enrollments; try again in {retry_after} s")]
    TooMany {
        /// Seconds until the oldest of them expires.
        retry_after: u64,
    },
    /// The drawn code is already live: draw new random bytes and try again.
    #[error("enrollment code collision; draw new codes")]
    CodeTaken,
}

/// Why `approve` or `deny` refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// The approver lacks `members.manage`.
    #[error("approving enrollments needs members.manage")]
    Forbidden,
    /// No live enrollment has this user code.
    #[error("no such enrollment")]
    NotFound,
    /// The enrollment expired.
    #[error("enrollment expired")]
    Expired,
    /// Already approved.
    #[error("enrollment already approved")]
    AlreadyApproved,
    /// Already denied.
    #[error("enrollment already denied")]
    AlreadyDenied,
}

/// What a device's poll gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollOutcome<G> {
    /// Not decided yet (`authorization_pending`).
    Pending,
    /// Polled too soon after the previous poll (`slow_down`).
    SlowDown,
    /// Approved: the member and the grant, handed over this once.
    Approved {
        /// The member the device is bound to.
        member: String,
        /// What the approver minted for the device (its token).
        grant: G,
    },
    /// Denied by an approver (`access_denied`).
    Denied {
        /// The approver's reason.
        reason: String,
    },
    /// Unknown, expired or already collected (`expired_token`).
    Expired,
}

/// Work for the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EnrollOutput<G> {
    /// An approved grant expired before the device collected it: revoke it.
    Revoke {
        /// The member it was bound to.
        member: String,
        /// The grant to revoke.
        grant: G,
    },
}

/// A live, undecided enrollment as the approval screen lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingView {
    /// `XXXX-XXXX`.
    pub user_code: String,
    /// The client address that created it.
    pub address: String,
    /// The device's label hint.
    pub label: String,
    /// Unix seconds of creation.
    pub created_at: UnixSecs,
    /// Unix seconds of expiry.
    pub expires_at: UnixSecs,
}

/// Where an enrollment stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnrollState<G> {
    /// Waiting for an approver; the device last polled at `last_poll`.
    Pending {
        /// Unix seconds of the device's last poll.
        last_poll: Option<UnixSecs>,
    },
    /// Approved for `member`; `grant` waits for the device's next poll.
    Approved {
        /// The member the device is bound to.
        member: String,
        /// What the device collects.
        grant: G,
    },
    /// Denied, with the approver's reason.
    Denied {
        /// Why.
        reason: String,
    },
}

/// One live enrollment, as a store outside the process keeps it (see
/// [`EnrollStore::records`] and [`EnrollStore::restore`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnrollRecord<G> {
    /// The user code in its stored form (`XXXXXXXX`, see [`normalize_user_code`]).
    pub user_code: String,
    /// The client address that created it.
    pub address: String,
    /// The device's label hint.
    pub label: String,
    /// Unix seconds of creation.
    pub created_at: UnixSecs,
    /// Unix seconds of expiry.
    pub expires_at: UnixSecs,
    /// Where it stands.
    pub state: EnrollState<G>,
}

type State<G> = EnrollState<G>;
type Entry<G> = EnrollRecord<G>;

/// Live enrollments, keyed by device code, with an index by user code.
#[derive(Debug, Clone)]
pub struct EnrollStore<G> {
    config: EnrollConfig,
    entries: BTreeMap<String, Entry<G>>,
    by_user_code: BTreeMap<String, String>,
    output: VecDeque<EnrollOutput<G>>,
}

/// Upper-cases and strips spaces and hyphens: what a human typed → the stored form
/// (`XXXXXXXX`). As Crockford's base32 decodes, the letters a code never holds are read as the
/// digits they look like: `O` as `0`, `I` and `L` as `1`.
pub fn normalize_user_code(typed: &str) -> String {
    typed
        .chars()
        .filter(|c| *c != '-' && !c.is_whitespace())
        .flat_map(char::to_uppercase)
        .map(|c| match c {
            'O' => '0',
            'I' | 'L' => '1',
            c => c,
        })
        .collect()
}

fn display_user_code(code: &str) -> String {
    format!("{}-{}", &code[..4], &code[4..])
}

fn device_code(random: &[u8; DEVICE_RANDOM_BYTES]) -> String {
    let b64 = crate::codec::base64::encode(random);
    let url: String = b64
        .trim_end_matches('=')
        .chars()
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect();
    format!("{DEVICE_CODE_PREFIX}{url}")
}

impl<G> EnrollStore<G> {
    /// An empty store.
    pub fn new(config: EnrollConfig) -> Self {
        EnrollStore {
            config,
            entries: BTreeMap::new(),
            by_user_code: BTreeMap::new(),
            output: VecDeque::new(),
        }
    }

    /// Starts an enrollment for the device at `address` (the peer address, or the client address
    /// a trusted proxy reports — never a header an untrusted client sets). `label` is cut to 64
    /// characters.
    pub fn create(
        &mut self,
        device_random: &[u8; DEVICE_RANDOM_BYTES],
        user_random: &[u8; USER_RANDOM_BYTES],
        address: &str,
        label: &str,
        now: UnixSecs,
    ) -> Result<Created, CreateError> {
        self.handle_timeout(now);
        let retry_after = |entries: &mut dyn Iterator<Item = &Entry<G>>| {
            entries
                .map(|e| e.expires_at.saturating_sub(now))
                .min()
                .unwrap_or(1)
                .max(1)
        };
        // A denied enrollment stays only until its device hears so: it holds no place.
        let live = self
            .entries
            .values()
            .filter(|e| !matches!(e.state, State::Denied { .. }));
        if live.clone().count() >= self.config.max_pending {
            return Err(CreateError::TooMany {
                retry_after: retry_after(&mut live.clone()),
            });
        }
        let mut mine = live.filter(|e| e.address == address);
        if mine.clone().count() >= self.config.max_pending_per_address {
            return Err(CreateError::TooMany {
                retry_after: retry_after(&mut mine),
            });
        }
        let user_code: String = user_random
            .iter()
            .map(|b| USER_ALPHABET[usize::from(b % 32)] as char)
            .collect();
        let device_code = device_code(device_random);
        if self.by_user_code.contains_key(&user_code) || self.entries.contains_key(&device_code) {
            return Err(CreateError::CodeTaken);
        }
        let expires_at = now.saturating_add(self.config.ttl);
        self.by_user_code
            .insert(user_code.clone(), device_code.clone());
        self.entries.insert(
            device_code.clone(),
            Entry {
                user_code: user_code.clone(),
                address: address.to_owned(),
                label: label.chars().take(64).collect(),
                created_at: now,
                expires_at,
                state: State::Pending { last_poll: None },
            },
        );
        Ok(Created {
            device_code,
            user_code: display_user_code(&user_code),
            expires_at,
            interval: self.config.interval,
        })
    }

    fn remove(&mut self, device_code: &str) -> Option<Entry<G>> {
        let entry = self.entries.remove(device_code)?;
        self.by_user_code.remove(&entry.user_code);
        Some(entry)
    }

    /// Drops `entry` for expiry, queueing the revocation of an uncollected grant.
    fn expire(&mut self, entry: Entry<G>) {
        if let State::Approved { member, grant } = entry.state {
            self.output
                .push_back(EnrollOutput::Revoke { member, grant });
        }
    }

    /// The device polls with its device code.
    pub fn poll(&mut self, device_code: &str, now: UnixSecs) -> PollOutcome<G> {
        let Some(entry) = self.entries.get_mut(device_code) else {
            return PollOutcome::Expired;
        };
        if now >= entry.expires_at {
            if let Some(entry) = self.remove(device_code) {
                self.expire(entry);
            }
            return PollOutcome::Expired;
        }
        if let State::Pending { last_poll } = &mut entry.state {
            let too_soon = last_poll.is_some_and(|t| now < t.saturating_add(self.config.interval));
            *last_poll = Some(now);
            return if too_soon {
                PollOutcome::SlowDown
            } else {
                PollOutcome::Pending
            };
        }
        match self.remove(device_code).map(|e| e.state) {
            Some(State::Approved { member, grant }) => PollOutcome::Approved { member, grant },
            Some(State::Denied { reason }) => PollOutcome::Denied { reason },
            _ => PollOutcome::Expired,
        }
    }

    fn decide(
        &mut self,
        user_code: &str,
        approver: PermissionSet,
        now: UnixSecs,
        state: State<G>,
    ) -> Result<(), DecideError> {
        if !approver.contains(Permission::MembersManage) {
            return Err(DecideError::Forbidden);
        }
        let device_code = self
            .by_user_code
            .get(&normalize_user_code(user_code))
            .ok_or(DecideError::NotFound)?
            .clone();
        let entry = self
            .entries
            .get_mut(&device_code)
            .ok_or(DecideError::NotFound)?;
        if now >= entry.expires_at {
            return Err(DecideError::Expired);
        }
        match entry.state {
            State::Pending { .. } => {
                entry.state = state;
                Ok(())
            }
            State::Approved { .. } => Err(DecideError::AlreadyApproved),
            State::Denied { .. } => Err(DecideError::AlreadyDenied),
        }
    }

    /// An approver (`members.manage`) binds the enrollment to `member` with `grant` (the token
    /// minted for the device), handed over on the device's next poll.
    pub fn approve(
        &mut self,
        user_code: &str,
        approver: PermissionSet,
        member: &str,
        grant: G,
        now: UnixSecs,
    ) -> Result<(), DecideError> {
        let member = member.to_owned();
        self.decide(user_code, approver, now, State::Approved { member, grant })
    }

    /// An approver (`members.manage`) refuses the enrollment; `reason` is cut to 256 characters.
    pub fn deny(
        &mut self,
        user_code: &str,
        approver: PermissionSet,
        reason: &str,
        now: UnixSecs,
    ) -> Result<(), DecideError> {
        let reason = reason.chars().take(256).collect();
        self.decide(user_code, approver, now, State::Denied { reason })
    }

    /// The live, undecided enrollments, oldest first (ties by user code).
    pub fn pending(&self, now: UnixSecs) -> Vec<PendingView> {
        let mut list: Vec<PendingView> = self
            .entries
            .values()
            .filter(|e| now < e.expires_at && matches!(e.state, State::Pending { .. }))
            .map(|e| PendingView {
                user_code: display_user_code(&e.user_code),
                address: e.address.clone(),
                label: e.label.clone(),
                created_at: e.created_at,
                expires_at: e.expires_at,
            })
            .collect();
        list.sort_by(|a, b| (a.created_at, &a.user_code).cmp(&(b.created_at, &b.user_code)));
        list
    }

    /// The earliest expiry among live enrollments.
    pub fn poll_timeout(&self) -> Option<UnixSecs> {
        self.entries.values().map(|e| e.expires_at).min()
    }

    /// Drops every enrollment expired at `now` (queueing revocations of uncollected grants).
    pub fn handle_timeout(&mut self, now: UnixSecs) {
        let expired: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| now >= e.expires_at)
            .map(|(k, _)| k.clone())
            .collect();
        for device_code in expired {
            if let Some(entry) = self.remove(&device_code) {
                self.expire(entry);
            }
        }
    }

    /// The next piece of work for the caller.
    pub fn poll_output(&mut self) -> Option<EnrollOutput<G>> {
        self.output.pop_front()
    }

    /// Every enrollment held, by the key it is polled with (its device code as created, or
    /// whatever key [`EnrollStore::restore`] gave it).
    pub fn records(&self) -> impl Iterator<Item = (&str, &EnrollRecord<G>)> {
        self.entries.iter().map(|(k, e)| (k.as_str(), e))
    }

    /// Puts back an enrollment kept outside the process, polled from now on by `key` (a store
    /// may keep a hash of the device code and poll with the same hash). A record whose user
    /// code is already held under another key replaces nothing and is dropped.
    pub fn restore(&mut self, key: String, record: EnrollRecord<G>) {
        if self
            .by_user_code
            .get(&record.user_code)
            .is_some_and(|k| *k != key)
        {
            return;
        }
        self.by_user_code
            .insert(record.user_code.clone(), key.clone());
        self.entries.insert(key, record);
    }

    /// Live enrollments held (any state).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const T0: u64 = 1_700_000_000;

    fn admin() -> PermissionSet {
        PermissionSet::all()
    }

    fn store() -> EnrollStore<u32> {
        EnrollStore::new(EnrollConfig::default())
    }

    fn make(s: &mut EnrollStore<u32>, seed: u8, addr: &str, now: UnixSecs) -> Created {
        s.create(&[seed; 32], &[seed; 8], addr, "laptop", now)
            .expect("created")
    }

    #[test]
    fn codes_have_the_documented_shape() {
        let mut s = store();
        let c = s
            .create(
                &[0xfb; 32],
                &[0, 1, 7, 8, 23, 24, 31, 255],
                "10.0.0.1",
                "l",
                T0,
            )
            .expect("created");
        assert_eq!(c.user_code, "0178-QRZZ");
        assert_eq!(
            c.device_code,
            format!("ac7-dc_{}", "-_v7".repeat(10) + "-_s")
        );
        assert_eq!(c.device_code.len(), DEVICE_CODE_PREFIX.len() + 43);
        assert_eq!((c.expires_at, c.interval), (T0 + 300, 5));
        for b in USER_ALPHABET {
            assert!(!b"ILOU".contains(b), "{}", char::from(*b));
        }
        let distinct: BTreeSet<&u8> = USER_ALPHABET.iter().collect();
        assert_eq!(distinct.len(), 32);
        assert_eq!(normalize_user_code(" 0178-qrzz "), "0178QRZZ");
        // Letters a code never holds read as the digits they look like.
        assert_eq!(normalize_user_code("o1li-qrzz"), "0111QRZZ");
    }

    #[test]
    fn approve_then_poll_hands_the_grant_over_once() {
        let mut s = store();
        let c = make(&mut s, 1, "a", T0);
        assert_eq!(s.poll(&c.device_code, T0 + 5), PollOutcome::Pending);
        assert_eq!(s.pending(T0 + 5).len(), 1);
        s.approve(&c.user_code.to_lowercase(), admin(), "bob", 42, T0 + 6)
            .expect("approved");
        assert!(s.pending(T0 + 6).is_empty());
        assert_eq!(
            s.approve(&c.user_code, admin(), "eve", 43, T0 + 7),
            Err(DecideError::AlreadyApproved)
        );
        assert_eq!(
            s.poll(&c.device_code, T0 + 10),
            PollOutcome::Approved {
                member: "bob".into(),
                grant: 42
            }
        );
        assert_eq!(s.poll(&c.device_code, T0 + 15), PollOutcome::Expired);
        assert!(s.is_empty());
        assert_eq!(s.poll_output(), None);
    }

    #[test]
    fn slow_down_when_polled_inside_the_interval() {
        let mut s = store();
        let c = make(&mut s, 1, "a", T0);
        assert_eq!(s.poll(&c.device_code, T0), PollOutcome::Pending);
        assert_eq!(s.poll(&c.device_code, T0 + 4), PollOutcome::SlowDown);
        // The too-early poll counts: the next must wait a full interval after it.
        assert_eq!(s.poll(&c.device_code, T0 + 8), PollOutcome::SlowDown);
        assert_eq!(s.poll(&c.device_code, T0 + 13), PollOutcome::Pending);
    }

    #[test]
    fn deny_then_poll() {
        let mut s = store();
        let c = make(&mut s, 1, "a", T0);
        assert_eq!(
            s.deny(&c.user_code, PermissionSet::default(), "no", T0),
            Err(DecideError::Forbidden)
        );
        s.deny(&c.user_code, admin(), "not ours", T0)
            .expect("denied");
        assert_eq!(
            s.approve(&c.user_code, admin(), "bob", 1, T0),
            Err(DecideError::AlreadyDenied)
        );
        assert_eq!(
            s.poll(&c.device_code, T0 + 5),
            PollOutcome::Denied {
                reason: "not ours".into()
            }
        );
        assert_eq!(s.poll(&c.device_code, T0 + 10), PollOutcome::Expired);
    }

    #[test]
    fn expiry_boundaries() {
        let mut s = store();
        let c = make(&mut s, 1, "a", T0);
        let d = make(&mut s, 2, "a", T0);
        // Last second: still approvable.
        s.approve(&c.user_code, admin(), "bob", 7, T0 + 299)
            .expect("in time");
        assert_eq!(
            s.approve(&d.user_code, admin(), "bob", 8, T0 + 300),
            Err(DecideError::Expired)
        );
        assert_eq!(s.poll_timeout(), Some(T0 + 300));
        // Approved but never collected: expiry revokes the grant.
        s.handle_timeout(T0 + 300);
        assert_eq!(
            s.poll_output(),
            Some(EnrollOutput::Revoke {
                member: "bob".into(),
                grant: 7
            })
        );
        assert_eq!(s.poll_output(), None);
        assert_eq!(s.poll(&c.device_code, T0 + 300), PollOutcome::Expired);
        assert_eq!(
            s.approve(&d.user_code, admin(), "bob", 8, T0 + 300),
            Err(DecideError::NotFound)
        );
    }

    #[test]
    fn approved_then_polled_after_expiry_is_revoked_not_handed_over() {
        let mut s = store();
        let c = make(&mut s, 1, "a", T0);
        s.approve(&c.user_code, admin(), "bob", 7, T0 + 1)
            .expect("approved");
        assert_eq!(s.poll(&c.device_code, T0 + 300), PollOutcome::Expired);
        assert_eq!(
            s.poll_output(),
            Some(EnrollOutput::Revoke {
                member: "bob".into(),
                grant: 7
            })
        );
    }

    #[test]
    fn bounded_per_address_and_collisions() {
        let mut s = store();
        for seed in 0..3 {
            make(&mut s, seed, "10.0.0.1", T0 + u64::from(seed));
        }
        assert_eq!(
            s.create(&[9; 32], &[9; 8], "10.0.0.1", "l", T0 + 10),
            Err(CreateError::TooMany { retry_after: 290 })
        );
        // Another address is not affected; a colliding user code is refused.
        make(&mut s, 9, "10.0.0.2", T0 + 10);
        assert_eq!(
            s.create(&[10; 32], &[9; 8], "10.0.0.3", "l", T0 + 10),
            Err(CreateError::CodeTaken)
        );
        // Once the oldest expires the address may enroll again.
        make(&mut s, 11, "10.0.0.1", T0 + 300);
    }

    #[test]
    fn denied_enrollments_hold_no_place() {
        let mut s = store();
        let codes: Vec<Created> = (0..3)
            .map(|seed| make(&mut s, seed, "10.0.0.1", T0))
            .collect();
        assert!(matches!(
            s.create(&[9; 32], &[9; 8], "10.0.0.1", "l", T0 + 1),
            Err(CreateError::TooMany { .. })
        ));
        s.deny(&codes[0].user_code, admin(), "no", T0 + 2)
            .expect("denied");
        // The denied one is still there for its device to hear, but no longer counts.
        make(&mut s, 9, "10.0.0.1", T0 + 3);
        assert_eq!(
            s.poll(&codes[0].device_code, T0 + 4),
            PollOutcome::Denied {
                reason: "no".into()
            }
        );
        // An approved one still counts until its device collects it.
        s.approve(&codes[1].user_code, admin(), "bob", 1, T0 + 5)
            .expect("approved");
        assert!(matches!(
            s.create(&[10; 32], &[10; 8], "10.0.0.1", "l", T0 + 6),
            Err(CreateError::TooMany { .. })
        ));
        // The overall bound ignores denied ones too.
        let mut all = EnrollStore::<u32>::new(EnrollConfig {
            max_pending: 1,
            ..EnrollConfig::default()
        });
        let first = make(&mut all, 1, "a", T0);
        all.deny(&first.user_code, admin(), "no", T0)
            .expect("denied");
        make(&mut all, 2, "b", T0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Create { seed: u8, addr: u8 },
        Poll { which: usize },
        Approve { which: usize, manager: bool },
        Deny { which: usize },
        Tick { secs: u64 },
        Timeout,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..12, 0u8..3).prop_map(|(seed, addr)| Op::Create { seed, addr }),
            (0usize..16).prop_map(|which| Op::Poll { which }),
            (0usize..16, prop::bool::weighted(0.9))
                .prop_map(|(which, manager)| Op::Approve { which, manager }),
            (0usize..16).prop_map(|which| Op::Deny { which }),
            (0u64..200).prop_map(|secs| Op::Tick { secs }),
            Just(Op::Timeout),
        ]
    }

    proptest! {
        #![proptest_config(crate::test_support::proptest_config("signin_enroll"))]

        /// Every approved grant leaves exactly once — handed to the device or revoked — and
        /// never after expiry; user codes are unique among live enrollments; limits hold.
        #[test]
        fn model(ops in prop::collection::vec(op(), 1..80)) {
            let mut s: EnrollStore<u32> = store();
            let mut now = T0;
            let mut created: Vec<Created> = Vec::new();
            let mut approved: BTreeSet<u32> = BTreeSet::new();
            let mut left: Vec<u32> = Vec::new();
            let mut next_grant = 0u32;
            let mut next_device = 0u8;
            for op in ops {
                match op {
                    Op::Create { seed, addr } => {
                        let addr = format!("10.0.0.{addr}");
                        // Device codes differ, user codes repeat: collisions are exercised.
                        next_device = next_device.wrapping_add(1);
                        if let Ok(c) = s.create(&[next_device; 32], &[seed; 8], &addr, "l", now) {
                            created.push(c);
                        }
                        let undecided = s.entries.values().filter(|e| !matches!(e.state, State::Denied { .. })).count();
                        prop_assert!(undecided <= 3 * 3);
                    }
                    Op::Poll { which } => {
                        let Some(c) = created.get(which) else { continue };
                        if let PollOutcome::Approved { grant, .. } = s.poll(&c.device_code, now) {
                            let live = created.iter().rev().find(|x| x.device_code == c.device_code);
                            prop_assert!(live.is_some_and(|l| now < l.expires_at));
                            left.push(grant);
                        }
                    }
                    Op::Approve { which, manager } => {
                        let Some(c) = created.get(which) else { continue };
                        let perms = if manager { admin() } else { PermissionSet::default() };
                        next_grant += 1;
                        let r = s.approve(&c.user_code, perms, "m", next_grant, now);
                        if r.is_ok() {
                            prop_assert!(manager);
                            let live = created.iter().rev().find(|x| x.user_code == c.user_code);
                            prop_assert!(live.is_some_and(|l| now < l.expires_at), "approved after expiry");
                            approved.insert(next_grant);
                        }
                    }
                    Op::Deny { which } => {
                        let Some(c) = created.get(which) else { continue };
                        let _ = s.deny(&c.user_code, admin(), "no", now);
                    }
                    Op::Tick { secs } => now += secs,
                    Op::Timeout => s.handle_timeout(now),
                }
                while let Some(EnrollOutput::Revoke { grant, .. }) = s.poll_output() {
                    left.push(grant);
                }
                let live: Vec<&String> = s.by_user_code.keys().collect();
                let unique: BTreeSet<&String> = live.iter().copied().collect();
                prop_assert_eq!(live.len(), unique.len());
                let shown: Vec<String> = s.pending(now).into_iter().map(|p| p.user_code).collect();
                prop_assert_eq!(shown.iter().collect::<BTreeSet<_>>().len(), shown.len());
                prop_assert_eq!(s.by_user_code.len(), s.entries.len());
            }
            s.handle_timeout(now + 10_000);
            while let Some(EnrollOutput::Revoke { grant, .. }) = s.poll_output() {
                left.push(grant);
            }
            let mut sorted = left.clone();
            sorted.sort_unstable();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), left.len(), "a grant left twice");
            prop_assert_eq!(sorted.into_iter().collect::<BTreeSet<_>>(), approved);
        }

        /// A store rebuilt before every step from the records the last step left (as brokers
        /// sharing a database do) answers exactly as one long-lived store.
        #[test]
        fn a_store_rebuilt_from_its_records_answers_the_same(ops in prop::collection::vec(op(), 1..80)) {
            let mut long: EnrollStore<u32> = store();
            let mut kept: Vec<(String, EnrollRecord<u32>)> = Vec::new();
            let mut now = T0;
            let mut created: Vec<Created> = Vec::new();
            let mut next = 0u8;
            for (i, op) in ops.into_iter().enumerate() {
                let mut short: EnrollStore<u32> = store();
                for (k, r) in kept.drain(..) {
                    short.restore(k, r);
                }
                let grant = u32::try_from(i).unwrap_or(0);
                let (a, b) = match op {
                    Op::Create { seed, addr } => {
                        let addr = format!("10.0.0.{addr}");
                        next = next.wrapping_add(1);
                        let a = long.create(&[next; 32], &[seed; 8], &addr, "l", now);
                        let b = short.create(&[next; 32], &[seed; 8], &addr, "l", now);
                        if let Ok(c) = &a {
                            created.push(c.clone());
                        }
                        (format!("{a:?}"), format!("{b:?}"))
                    }
                    Op::Poll { which } => {
                        let Some(c) = created.get(which).cloned() else {
                            kept = short.records().map(|(k, r)| (k.to_owned(), r.clone())).collect();
                            continue;
                        };
                        (format!("{:?}", long.poll(&c.device_code, now)), format!("{:?}", short.poll(&c.device_code, now)))
                    }
                    Op::Approve { which, manager } => {
                        let Some(c) = created.get(which).cloned() else {
                            kept = short.records().map(|(k, r)| (k.to_owned(), r.clone())).collect();
                            continue;
                        };
                        let perms = if manager { admin() } else { PermissionSet::default() };
                        (
                            format!("{:?}", long.approve(&c.user_code, perms, "m", grant, now)),
                            format!("{:?}", short.approve(&c.user_code, perms, "m", grant, now)),
                        )
                    }
                    Op::Deny { which } => {
                        let Some(c) = created.get(which).cloned() else {
                            kept = short.records().map(|(k, r)| (k.to_owned(), r.clone())).collect();
                            continue;
                        };
                        (format!("{:?}", long.deny(&c.user_code, admin(), "no", now)), format!("{:?}", short.deny(&c.user_code, admin(), "no", now)))
                    }
                    Op::Tick { secs } => {
                        now += secs;
                        (String::new(), String::new())
                    }
                    Op::Timeout => {
                        long.handle_timeout(now);
                        short.handle_timeout(now);
                        (String::new(), String::new())
                    }
                };
                prop_assert_eq!(a, b);
                let out = |s: &mut EnrollStore<u32>| std::iter::from_fn(|| s.poll_output()).collect::<Vec<_>>();
                prop_assert_eq!(out(&mut long), out(&mut short));
                prop_assert_eq!(long.pending(now), short.pending(now));
                kept = short.records().map(|(k, r)| (k.to_owned(), r.clone())).collect();
                let now_held: Vec<(String, EnrollRecord<u32>)> = long.records().map(|(k, r)| (k.to_owned(), r.clone())).collect();
                prop_assert_eq!(&kept, &now_held);
            }
        }
    }
}
