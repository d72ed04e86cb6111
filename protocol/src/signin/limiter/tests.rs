use super::*;

const T0: u64 = 1_700_000_000;

fn fail<K: Ord>(l: &mut AttemptLimiter<K>, key: K, now: u64) -> Result<(), Locked> {
    l.record_failure(key, now).map_err(Locked::from)
}

#[test]
fn locks_at_the_fifth_failure_until_the_window_closes() {
    let mut l = AttemptLimiter::new(SIGN_IN);
    for i in 0..4 {
        assert_eq!(l.check(&"alice", T0 + i), Ok(()));
        assert_eq!(fail(&mut l, "alice", T0 + i), Ok(()), "failure {i}");
    }
    assert_eq!(l.check(&"alice", T0 + 10), Ok(()));
    assert_eq!(
        fail(&mut l, "alice", T0 + 10),
        Err(Locked { retry_after: 890 })
    );
    assert_eq!(l.check(&"alice", T0 + 10), Err(Locked { retry_after: 890 }));
    // Last second of the window: still locked, 1 s to go.
    assert_eq!(l.check(&"alice", T0 + 899), Err(Locked { retry_after: 1 }));
    // The window closes at its first failure + 15 min.
    assert_eq!(l.check(&"alice", T0 + 900), Ok(()));
    // And the key starts a new window: one failure does not lock it again.
    assert_eq!(fail(&mut l, "alice", T0 + 900), Ok(()));
    assert_eq!(l.check(&"alice", T0 + 901), Ok(()));
    // Other keys were never affected.
    assert_eq!(l.check(&"bob", T0 + 10), Ok(()));
}

#[test]
fn four_failures_spread_over_windows_never_lock() {
    let mut l = AttemptLimiter::new(SIGN_IN);
    for i in 0..4 {
        assert_eq!(fail(&mut l, "a", T0 + i), Ok(()));
    }
    // The fifth failure falls just after the window: a new window opens.
    assert_eq!(fail(&mut l, "a", T0 + 900), Ok(()));
    assert_eq!(l.check(&"a", T0 + 900), Ok(()));
}

#[test]
fn success_clears_the_key() {
    let mut l = AttemptLimiter::new(SIGN_IN);
    for i in 0..4 {
        fail(&mut l, "a", T0 + i).expect("not locked yet");
    }
    l.record_success(&"a", T0 + 5);
    for i in 0..4 {
        assert_eq!(fail(&mut l, "a", T0 + 10 + i), Ok(()));
    }
}

#[test]
fn attempts_while_locked_do_not_extend_the_lock() {
    let mut l = AttemptLimiter::new(SIGN_IN);
    for _ in 0..5 {
        let _ = l.record_failure("a", T0);
    }
    assert_eq!(
        l.record_failure("a", T0 + 500),
        Err(Lockout {
            retry_after: 400,
            strikes: 1,
            new: false
        })
    );
    assert_eq!(l.check(&"a", T0 + 900), Ok(()));
}

#[test]
fn handle_timeout_frees_closed_windows() {
    let mut l = AttemptLimiter::new(SIGN_IN);
    fail(&mut l, "a", T0).expect("first");
    fail(&mut l, "b", T0 + 100).expect("first");
    assert_eq!(l.poll_timeout(), Some(T0 + 900));
    l.handle_timeout(T0 + 899);
    assert_eq!(l.len(), 2);
    l.handle_timeout(T0 + 900);
    assert_eq!(l.len(), 1);
    assert_eq!(l.poll_timeout(), Some(T0 + 1000));
    l.handle_timeout(T0 + 1000);
    assert!(l.is_empty());
}

/// Fails `key` until it locks, starting at `now`; returns the lockout.
fn lock_now<K: Ord + Clone>(l: &mut AttemptLimiter<K>, key: &K, now: u64) -> Lockout {
    for _ in 0..l.config().max_failures {
        if let Err(lockout) = l.record_failure(key.clone(), now) {
            return lockout;
        }
    }
    panic!("max_failures failures did not lock the key");
}

#[test]
fn each_further_lock_lasts_twice_as_long_up_to_a_day() {
    let mut l = AttemptLimiter::new(SIGN_IN);
    let mut now = T0;
    let mut locks = Vec::new();
    for _ in 0..9 {
        let lockout = lock_now(&mut l, &"a", now);
        assert!(lockout.new);
        locks.push(lockout.retry_after);
        // Locked for exactly that long, not a second less.
        assert!(l.check(&"a", now + lockout.retry_after - 1).is_err());
        now += lockout.retry_after;
        assert_eq!(l.check(&"a", now), Ok(()));
    }
    assert_eq!(
        locks,
        [
            900, 1800, 3600, 7200, 14_400, 28_800, 57_600, 86_400, 86_400
        ]
    );
}

#[test]
fn a_key_quiet_for_a_day_after_its_lock_starts_afresh() {
    let mut l = AttemptLimiter::new(SIGN_IN);
    let first = lock_now(&mut l, &"a", T0);
    let second = lock_now(&mut l, &"a", T0 + first.retry_after);
    assert_eq!((first.strikes, second.strikes), (1, 2));
    let ended = T0 + first.retry_after + second.retry_after;
    // A day less a second after the lock ended: the strikes are remembered.
    let third = lock_now(&mut l, &"a", ended + DAY - 1);
    assert_eq!((third.strikes, third.retry_after), (3, 3600));
    let ended = ended + DAY - 1 + third.retry_after;
    // A full day of quiet: a fresh start (a first lock lasts the window).
    let fresh = lock_now(&mut l, &"a", ended + DAY);
    assert_eq!((fresh.strikes, fresh.retry_after), (1, 900));
    // And memory follows: the key is dropped once its strikes are forgotten.
    let forget = ended + DAY + fresh.retry_after + DAY;
    l.handle_timeout(forget - 1);
    assert_eq!(l.len(), 1);
    l.handle_timeout(forget);
    assert!(l.is_empty());
}

#[test]
fn no_doubling_when_the_longest_lock_is_the_window() {
    let hourly = LimiterConfig {
        max_failures: 2,
        window: 3600,
        max_lock: 3600,
    };
    let mut l = AttemptLimiter::new(hourly);
    let mut now = T0;
    for _ in 0..4 {
        let lockout = lock_now(&mut l, &"a", now);
        assert_eq!(lockout.retry_after, 3600);
        now += 3600;
    }
}

const ALICE_ADDR: &str = "192.0.2.1";

#[test]
fn addresses_are_keyed_by_ipv4_address_and_ipv6_slash_64() {
    let key = |s: &str| address_key(s.parse().expect("an address"));
    assert_eq!(key("192.0.2.7"), "192.0.2.7");
    assert_eq!(key("::ffff:192.0.2.7"), "192.0.2.7");
    assert_eq!(key("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
    assert_eq!(key("2001:db8:1:2:ffff:1:2:3"), key("2001:db8:1:2::9"));
    assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
    assert_eq!(key("::1"), "::/64");
}

#[test]
fn nameless_guesses_from_a_thousand_addresses_share_one_team_budget() {
    let mut g = SignInGuard::default();
    let mut evaluated = 0;
    let mut refused = None;
    for i in 0..1000u32 {
        let addr = format!("10.0.{}.{}", i / 256, i % 256);
        // A thousand guesses within 100 s, each from its own address.
        let now = T0 + u64::from(i) / 10;
        match g.check(&addr, Claim::AnyMember, now) {
            Ok(()) => {
                evaluated += 1;
                g.handle_failure(&addr, Claim::AnyMember, now);
            }
            Err(r) => {
                refused.get_or_insert(r);
            }
        }
    }
    assert_eq!(evaluated, NAMELESS.max_failures);
    let refusal = refused.expect("the team-wide budget refused the rest");
    assert_eq!(refusal.key, SignInKey::Nameless);
    assert_eq!(g.stats().nameless_failures, 10);
    assert_eq!(g.stats().refused, 990);
    assert_eq!(g.stats().lockouts, 1);
    // A member who names themselves still signs in: their own budget is untouched.
    assert_eq!(
        g.check(ALICE_ADDR, Claim::Member("alice"), T0 + 1000),
        Ok(())
    );
}

#[test]
fn a_locked_member_is_no_candidate_for_a_nameless_code() {
    let mut g = SignInGuard::default();
    for i in 0..5 {
        let addr = format!("198.51.100.{i}");
        g.check(&addr, Claim::Member("carol"), T0)
            .expect("not locked yet");
        g.handle_failure(&addr, Claim::Member("carol"), T0);
    }
    assert!(g.member_locked("carol", T0 + 1));
    assert!(!g.member_locked("alice", T0 + 1));
    // Named attempts for carol are refused from any address.
    let r = g
        .check("203.0.113.9", Claim::Member("carol"), T0 + 1)
        .expect_err("carol is locked");
    assert_eq!(r.key, SignInKey::Member("carol".into()));
}

#[test]
fn lockouts_are_reported_once_with_their_key() {
    let mut g = SignInGuard::default();
    let mut events = Vec::new();
    for _ in 0..5 {
        events.extend(g.handle_failure(ALICE_ADDR, Claim::Member("alice"), T0));
    }
    assert_eq!(
        events,
        [
            LockoutEvent {
                key: SignInKey::Address(ALICE_ADDR.into()),
                lock_secs: 900,
                strikes: 1
            },
            LockoutEvent {
                key: SignInKey::Member("alice".into()),
                lock_secs: 900,
                strikes: 1
            },
        ]
    );
    assert!(
        g.handle_failure(ALICE_ADDR, Claim::Member("alice"), T0 + 1)
            .is_empty()
    );
    assert_eq!(g.stats().lockouts, 2);
}

#[test]
fn success_clears_address_and_member_but_not_the_nameless_budget() {
    let mut g = SignInGuard::default();
    for _ in 0..4 {
        g.handle_failure(ALICE_ADDR, Claim::Member("alice"), T0);
    }
    for i in 0..9 {
        g.handle_failure(&format!("10.1.0.{i}"), Claim::AnyMember, T0);
    }
    g.handle_success(ALICE_ADDR, "alice", T0 + 1);
    // Alice's address and name start afresh: four more failures do not lock either.
    for _ in 0..4 {
        assert!(
            g.handle_failure(ALICE_ADDR, Claim::Member("alice"), T0 + 2)
                .is_empty()
        );
    }
    // The guesser's nameless budget was not refilled: one more failure locks it.
    let events = g.handle_failure("10.2.0.1", Claim::AnyMember, T0 + 2);
    assert!(events.iter().any(|e| e.key == SignInKey::Nameless));
}

/// The attacker's best strategy against the team-wide nameless budget: guess as soon as the
/// lock ends, from as many addresses as it likes. Over 30 days that is the budget of each
/// lock cycle, the cycles doubling to a day.
#[test]
fn the_best_nameless_attacker_gets_ten_guesses_a_day_after_the_first() {
    let mut g = SignInGuard::default();
    let mut now = T0;
    let end = T0 + 30 * DAY;
    let mut guesses = 0u64;
    let mut after_first_day = 0u64;
    let mut addr = 0u32;
    while now < end {
        addr += 1;
        let a = format!("10.{}.{}.{}", addr >> 16, (addr >> 8) & 255, addr & 255);
        match g.check(&a, Claim::AnyMember, now) {
            Ok(()) => {
                guesses += 1;
                if now >= T0 + 2 * DAY {
                    after_first_day += 1;
                }
                g.handle_failure(&a, Claim::AnyMember, now);
            }
            Err(r) => now += r.retry_after,
        }
    }
    // 8 cycles reach the day-long lock (15 min + 30 min + … + 16 h ≈ 32 h), then 10 a day.
    assert!(guesses <= 10 * (8 + 30), "{guesses} guesses in 30 days");
    assert!(
        after_first_day <= 10 * 28,
        "{after_first_day} after two days"
    );
}

/// One step of a sign-in workload: who tries, claiming what, whether the code was right, and
/// how many seconds passed before.
#[derive(Debug, Clone)]
struct Step {
    address: u8,
    claim: u8,
    good: bool,
    wait: u64,
}

fn steps() -> impl proptest::strategy::Strategy<Value = Vec<Step>> {
    use proptest::prelude::*;
    proptest::collection::vec(
        (
            0u8..4,
            0u8..5,
            proptest::bool::weighted(0.1),
            prop_oneof![Just(0u64), 1u64..120, 800u64..4000, 80_000u64..100_000,],
        )
            .prop_map(|(address, claim, good, wait)| Step {
                address,
                claim,
                good,
                wait,
            }),
        1..300,
    )
}

fn claim_of(n: u8) -> Claim<'static> {
    match n {
        0 => Claim::AnyMember,
        1 => Claim::NoMember,
        2 => Claim::Member("alice"),
        _ => Claim::Member("bob"),
    }
}

proptest::proptest! {
    /// A guard rebuilt for every attempt from the states of the keys it touches (as brokers
    /// sharing a database do) answers exactly as one long-lived guard.
    #[test]
    fn a_guard_rebuilt_per_attempt_from_stored_key_states_answers_the_same(steps in steps()) {
        let mut long = SignInGuard::default();
        let mut store: BTreeMap<SignInKey, KeyState> = BTreeMap::new();
        let mut now = T0;
        for s in steps {
            now += s.wait;
            let address = format!("10.0.0.{}", s.address);
            let claim = claim_of(s.claim);
            let mut keys = SignInGuard::keys(&address, claim);
            keys.push(SignInKey::Member("alice".into()));
            keys.push(SignInKey::Member("bob".into()));
            let mut short = SignInGuard::default();
            for k in &keys {
                short.restore(k.clone(), store.get(k).copied());
            }
            let a = long.check(&address, claim, now);
            let b = short.check(&address, claim, now);
            proptest::prop_assert_eq!(&a, &b);
            proptest::prop_assert_eq!(long.member_locked("alice", now), short.member_locked("alice", now));
            if a.is_ok() {
                let member = match claim {
                    Claim::Member(m) => m,
                    _ => "alice",
                };
                if s.good && !matches!(claim, Claim::NoMember) {
                    long.handle_success(&address, member, now);
                    short.handle_success(&address, member, now);
                } else {
                    let la = long.handle_failure(&address, claim, now);
                    let lb = short.handle_failure(&address, claim, now);
                    proptest::prop_assert_eq!(la, lb);
                }
            }
            for k in keys {
                match short.state(&k) {
                    Some(st) if now < short.expires(&k, &st) => {
                        store.insert(k, st);
                    }
                    _ => {
                        store.remove(&k);
                    }
                }
            }
        }
    }
}
