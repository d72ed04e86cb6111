//! The pending-request table: correlation ids handed out monotonically, matched as answers
//! arrive in any order.
//!
//! Every entry leaves the table exactly once: answered ([`Pending::take`]), abandoned
//! ([`Pending::remove`]) or failed with the rest ([`Pending::fail_all`], in id order). An answer
//! for an id that is not pending is [`Unmatched`]: the caller logs and drops it.

use std::collections::BTreeMap;

/// An answer arrived for an id that is not pending (never sent, already answered, or
/// abandoned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no pending request with id {0}")]
pub struct Unmatched(pub u64);

/// Pending requests keyed by correlation id, each carrying the caller's context `T`.
#[derive(Debug, Clone)]
pub struct Pending<T> {
    next_id: u64,
    entries: BTreeMap<u64, T>,
}

impl<T> Pending<T> {
    /// An empty table whose first id is 1.
    pub fn new() -> Self {
        Self::starting_at(1)
    }

    /// An empty table whose first id is `first`.
    pub fn starting_at(first: u64) -> Self {
        Self {
            next_id: first,
            entries: BTreeMap::new(),
        }
    }

    /// The id the next [`insert`](Self::insert) will hand out.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Records a new pending request and returns its id.
    pub fn insert(&mut self, context: T) -> u64 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.entries.insert(id, context);
        id
    }

    /// Takes the entry an answer with `id` resolves.
    pub fn take(&mut self, id: u64) -> Result<T, Unmatched> {
        self.entries.remove(&id).ok_or(Unmatched(id))
    }

    /// Abandons the entry for `id` (cancelled by the caller); a late answer is then unmatched.
    pub fn remove(&mut self, id: u64) -> Option<T> {
        self.entries.remove(&id)
    }

    /// The context of a pending entry.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        self.entries.get_mut(&id)
    }

    /// Whether `id` is pending.
    pub fn contains(&self, id: u64) -> bool {
        self.entries.contains_key(&id)
    }

    /// The first pending entry for which `pred` holds.
    pub fn find(&self, mut pred: impl FnMut(&T) -> bool) -> Option<u64> {
        self.entries
            .iter()
            .find_map(|(id, ctx)| pred(ctx).then_some(*id))
    }

    /// Removes and returns every pending entry, in id order (the connection went away).
    pub fn fail_all(&mut self) -> Vec<(u64, T)> {
        std::mem::take(&mut self.entries).into_iter().collect()
    }

    /// Number of pending entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Pending ids in order.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.keys().copied()
    }
}

impl<T> Default for Pending<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn ids_are_monotonic_and_answers_match_out_of_order() {
        let mut p = Pending::new();
        let a = p.insert("a");
        let b = p.insert("b");
        let c = p.insert("c");
        assert_eq!((a, b, c), (1, 2, 3));
        assert_eq!(p.take(c), Ok("c"));
        assert_eq!(p.take(a), Ok("a"));
        assert_eq!(p.take(a), Err(Unmatched(1)));
        assert_eq!(p.take(99), Err(Unmatched(99)));
        assert_eq!(p.remove(b), Some("b"));
        assert_eq!(p.take(b), Err(Unmatched(2)));
        assert_eq!(p.insert("d"), 4);
    }

    #[test]
    fn fail_all_yields_each_entry_once_in_id_order() {
        let mut p = Pending::new();
        for ctx in ["x", "y", "z"] {
            p.insert(ctx);
        }
        p.take(2).unwrap();
        assert_eq!(p.fail_all(), vec![(1, "x"), (3, "z")]);
        assert!(p.is_empty());
        assert_eq!(p.fail_all(), vec![]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert,
        Take(u64),
        Remove(u64),
        FailAll,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Insert),
            2 => (0u64..40).prop_map(Op::Take),
            1 => (0u64..40).prop_map(Op::Remove),
            1 => Just(Op::FailAll),
        ]
    }

    proptest! {
        #![proptest_config(crate::test_support::proptest_config("pending"))]

        /// Every inserted id leaves the table exactly once, and nothing else ever does.
        #[test]
        fn never_loses_or_duplicates_an_id(ops in proptest::collection::vec(op(), 0..200)) {
            let mut p = Pending::new();
            let mut inserted = BTreeSet::new();
            let mut left: Vec<u64> = Vec::new();
            for op in ops {
                match op {
                    Op::Insert => {
                        let id = p.insert(());
                        prop_assert!(inserted.insert(id), "id {} handed out twice", id);
                    }
                    Op::Take(id) => {
                        if p.take(id).is_ok() { left.push(id); }
                    }
                    Op::Remove(id) => {
                        if p.remove(id).is_some() { left.push(id); }
                    }
                    Op::FailAll => {
                        let failed: Vec<u64> = p.fail_all().into_iter().map(|(id, ())| id).collect();
                        prop_assert!(failed.windows(2).all(|w| w[0] < w[1]), "fail_all is in id order");
                        left.extend(failed);
                    }
                }
            }
            left.extend(p.fail_all().into_iter().map(|(id, ())| id));
            left.sort_unstable();
            let inserted: Vec<u64> = inserted.into_iter().collect();
            prop_assert_eq!(left, inserted);
        }
    }
}
