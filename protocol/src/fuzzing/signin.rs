//! The oracle of the `signin` fuzz target: base32, TOTP and device enrollment.

use std::collections::BTreeSet;

/// Sign-in pieces under arbitrary input: base32 text, TOTP codes and a sequence of enrollment
/// operations. Format: byte 0 splits the rest into a text part (`data[1..1 + byte0]`, fed to
/// [`crate::signin::totp::base32_decode`] and as a code to `verify`) and an op part, read in
/// 3-byte ops `[kind, a, b]` on an [`crate::signin::enroll::EnrollStore`].
///
/// Oracles: nothing panics; a decodable base32 text re-encodes to a text decoding to the same
/// bytes; an accepted TOTP step is after the last one; every approved grant leaves the store
/// exactly once (handed to the device or revoked), never from an expired enrollment; user codes
/// stay unique among live enrollments and no address holds more than its bound.
pub fn signin_ops(data: &[u8]) {
    use crate::domain::permission::PermissionSet;
    use crate::signin::enroll::{EnrollConfig, EnrollOutput, EnrollStore, PollOutcome};
    use crate::signin::totp;

    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let (text, ops) = rest.split_at(usize::from(split).min(rest.len()));
    let text = String::from_utf8_lossy(text);
    if let Ok(bytes) = totp::base32_decode(&text) {
        assert_eq!(
            totp::base32_decode(&totp::base32_encode(&bytes)).as_deref(),
            Ok(&bytes[..])
        );
        if let Ok(step) = totp::verify(&bytes, &text, 1_700_000_000, Some(56_666_666)) {
            assert!(step > 56_666_666);
        }
    }

    let config = EnrollConfig::default();
    let mut store: EnrollStore<u32> = EnrollStore::new(config);
    let mut now = 1_700_000_000u64;
    // (device code, user code, expires_at) of every creation, newest last.
    let mut created: Vec<(String, String, u64)> = Vec::new();
    let mut approved: BTreeSet<u32> = BTreeSet::new();
    let mut left: Vec<u32> = Vec::new();
    let mut next_grant = 0u32;
    let mut next_device = 0u8;
    let live_expiry = |created: &[(String, String, u64)],
                       pick: &dyn Fn(&(String, String, u64)) -> bool| {
        created.iter().rev().find(|c| pick(c)).map(|c| c.2)
    };
    for op in ops.chunks_exact(3) {
        let (kind, a, b) = (op[0] % 6, op[1], op[2]);
        let pick = created.get(usize::from(a) % created.len().max(1)).cloned();
        match (kind, pick) {
            (0, _) => {
                next_device = next_device.wrapping_add(1);
                let address = format!("10.0.0.{}", b % 4);
                if let Ok(c) = store.create(&[next_device; 32], &[a % 8; 8], &address, "l", now) {
                    created.push((c.device_code, c.user_code, c.expires_at));
                }
            }
            (1, Some((device, _, _))) => {
                if let PollOutcome::Approved { grant, .. } = store.poll(&device, now) {
                    let exp = live_expiry(&created, &|c| c.0 == device);
                    assert!(
                        exp.is_some_and(|e| now < e),
                        "grant handed over after expiry"
                    );
                    left.push(grant);
                }
            }
            (2, Some((_, user, _))) => {
                next_grant += 1;
                let perms = if b % 8 == 0 {
                    PermissionSet::default()
                } else {
                    PermissionSet::all()
                };
                if store.approve(&user, perms, "m", next_grant, now).is_ok() {
                    assert!(b % 8 != 0, "approved without members.manage");
                    let exp = live_expiry(&created, &|c| c.1 == user);
                    assert!(exp.is_some_and(|e| now < e), "approved after expiry");
                    approved.insert(next_grant);
                }
            }
            (3, Some((_, user, _))) => {
                let _ = store.deny(&user, PermissionSet::all(), "no", now);
            }
            (4, _) => now += u64::from(a) * u64::from(b % 8),
            _ => store.handle_timeout(now),
        }
        while let Some(EnrollOutput::Revoke { grant, .. }) = store.poll_output() {
            left.push(grant);
        }
        let pending = store.pending(now);
        let codes: BTreeSet<&String> = pending.iter().map(|p| &p.user_code).collect();
        assert_eq!(codes.len(), pending.len(), "duplicate user code");
        for addr in 0..4 {
            let address = format!("10.0.0.{addr}");
            let held = pending.iter().filter(|p| p.address == address).count();
            assert!(held <= config.max_pending_per_address);
        }
    }
    store.handle_timeout(u64::MAX);
    while let Some(EnrollOutput::Revoke { grant, .. }) = store.poll_output() {
        left.push(grant);
    }
    let unique: BTreeSet<u32> = left.iter().copied().collect();
    assert_eq!(unique.len(), left.len(), "a grant left twice");
    assert_eq!(unique, approved, "an approved grant never left");
}
