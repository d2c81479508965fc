//! Leases: a batch of units taken in one round trip and spent locally.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::decision::Decision;
use crate::key::Key;

const SHARDS: usize = 16;

#[derive(Debug, Clone, Copy)]
struct Lease {
    left: u64,
    until: Instant,
    decision: Decision,
}

/// Units taken from the backend ahead of need, per key.
///
/// A lease lives at most `ttl`; units not spent by then are dropped (they
/// were already counted by the backend: a lease can only ever lower what
/// the fleet admits under a token bucket, and under a sliding window it
/// admits at most `batch - 1` units per worker later than the window says).
#[derive(Debug)]
pub(crate) struct Leases {
    pub(crate) batch: u64,
    ttl: Duration,
    shards: Box<[Mutex<HashMap<Key, Lease>>]>,
}

impl Leases {
    pub(crate) fn new(batch: u64, ttl: Duration) -> Self {
        Self {
            batch,
            ttl,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, key: &Key) -> std::sync::MutexGuard<'_, HashMap<Key, Lease>> {
        use std::hash::{BuildHasher, RandomState};
        static HASHER: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
        let h = HASHER.get_or_init(RandomState::new).hash_one(key);
        self.shards[h as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Spends `cost` from the key's lease, if it holds enough.
    pub(crate) fn spend(&self, key: &Key, cost: u64) -> Option<Decision> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        let lease = shard.get_mut(key)?;
        if now >= lease.until {
            shard.remove(key);
            return None;
        }
        if lease.left < cost {
            return None;
        }
        lease.left -= cost;
        let d = lease.decision;
        Some(Decision::allowed(
            d.limit(),
            d.remaining() + lease.left,
            d.reset_after(),
        ))
    }

    /// Keeps `left` units of a batch the backend granted with `decision`.
    pub(crate) fn keep(&self, key: &Key, left: u64, decision: &Decision) {
        let mut shard = self.shard(key);
        if shard.len() >= 4096 {
            let now = Instant::now();
            shard.retain(|_, l| l.until > now);
        }
        shard.insert(
            key.clone(),
            Lease {
                left,
                until: Instant::now() + self.ttl,
                decision: *decision,
            },
        );
    }

    pub(crate) fn forget(&self, key: &Key) {
        self.shard(key).remove(key);
    }

    pub(crate) fn clear(&self) {
        for s in &*self.shards {
            s.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }
}
