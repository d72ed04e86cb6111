//! [`KeyCache`]: the names, thread keys and audiences of `message_keys` already looked up or
//! added, so that a page of history resolves them, and a push finds its sender and recipient,
//! without a query each.
//!
//! A `message_keys` row never changes and is never deleted, so an id and its key, once read
//! from a committed state, stay true for the life of the database. A read transaction
//! ([`super::super::db::Store::view`] sees committed rows alone) adds the rows it reads at
//! once; a write transaction's rows wait until it has committed: a key a writer adds in a
//! transaction that is then rolled back could hand its id to another key on SQLite, and it
//! never reaches the cache. A key not found is not remembered (it may be added
//! later). The cache is bounded: past [`MAX_KEYS`] entries it starts again empty.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Most keys remembered (each a name, a thread key or an audience list).
pub const MAX_KEYS: usize = 50_000;

/// Both directions of the `message_keys` rows read so far.
#[derive(Debug, Default)]
pub struct KeyCache {
    inner: RwLock<Maps>,
}

#[derive(Debug, Default)]
struct Maps {
    by_key: HashMap<Arc<str>, i64>,
    by_id: HashMap<i64, Arc<str>>,
}

impl KeyCache {
    /// The id of `key`, if it was read before.
    pub fn id(&self, key: &str) -> Option<i64> {
        self.inner.read().ok()?.by_key.get(key).copied()
    }

    /// The key of `id`, if it was read before.
    pub fn key(&self, id: i64) -> Option<Arc<str>> {
        self.inner.read().ok()?.by_id.get(&id).cloned()
    }

    /// Remembers a row read from a committed state.
    pub fn remember(&self, id: i64, key: &str) {
        let Ok(mut maps) = self.inner.write() else {
            return;
        };
        if maps.by_id.contains_key(&id) {
            return;
        }
        if maps.by_id.len() >= MAX_KEYS {
            *maps = Maps::default();
        }
        let key: Arc<str> = Arc::from(key);
        maps.by_key.insert(key.clone(), id);
        maps.by_id.insert(id, key);
    }

    /// Remembers the rows a write transaction read or added (waiting in `rows`), once it has
    /// committed. Not inlined: every kind of store transaction calls it.
    #[inline(never)]
    pub fn remember_committed(&self, rows: &RefCell<Vec<(i64, String)>>) {
        for (id, key) in rows.take() {
            self.remember(id, &key);
        }
    }

    /// How many keys it holds.
    pub fn len(&self) -> usize {
        self.inner.read().map_or(0, |m| m.by_id.len())
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_directions_and_the_bound() {
        let cache = KeyCache::default();
        assert_eq!(cache.id("alice"), None);
        cache.remember(3, "alice");
        cache.remember(3, "alice");
        assert_eq!(cache.id("alice"), Some(3));
        assert_eq!(cache.key(3).as_deref(), Some("alice"));
        assert_eq!(cache.len(), 1);
        for i in 0..MAX_KEYS as i64 {
            cache.remember(100 + i, &format!("k{i}"));
        }
        // Full: it started again, holding the last one added.
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.id("alice"), None);
        assert_eq!(
            cache.key(100 + MAX_KEYS as i64 - 1).as_deref(),
            Some("k49999")
        );
    }
}
