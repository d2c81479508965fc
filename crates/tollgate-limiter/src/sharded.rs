//! A small map of keys split over mutex-guarded shards, for the
//! `Limiter`'s local state (cached refusals, leases).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::key::Key;

const SHARDS: usize = 16;
/// Entries a shard holds before expired ones are dropped: local state is
/// an optimisation, and forgetting costs only a round trip.
pub(crate) const SHARD_CAPACITY: usize = 4096;

#[derive(Debug)]
pub(crate) struct Sharded<V> {
    shards: Box<[Mutex<HashMap<Key, V>>]>,
}

impl<V> Sharded<V> {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    /// The shard holding `key`, locked.
    pub(crate) fn shard(&self, key: &Key) -> MutexGuard<'_, HashMap<Key, V>> {
        // One hasher for the process: only the spread matters.
        static HASHER: OnceLock<RandomState> = OnceLock::new();
        let h = HASHER.get_or_init(RandomState::new).hash_one(key);
        crate::lock(&self.shards[h as usize % SHARDS])
    }

    pub(crate) fn forget(&self, key: &Key) {
        self.shard(key).remove(key);
    }

    pub(crate) fn clear(&self) {
        for s in &*self.shards {
            crate::lock(s).clear();
        }
    }
}
