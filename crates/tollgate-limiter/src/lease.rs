//! Leases: a batch of units taken in one round trip and spent locally.

use std::time::Duration;

use tokio::time::Instant;

use crate::decision::Decision;
use crate::key::Key;
use crate::sharded::{SHARD_CAPACITY, Sharded};

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
    map: Sharded<Lease>,
}

impl Leases {
    pub(crate) fn new(batch: u64, ttl: Duration) -> Self {
        Self {
            batch,
            ttl,
            map: Sharded::new(),
        }
    }

    /// Spends `cost` from the key's lease, if it holds enough.
    pub(crate) fn spend(&self, key: &Key, cost: u64) -> Option<Decision> {
        let now = Instant::now();
        let mut shard = self.map.shard(key);
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
        let mut shard = self.map.shard(key);
        if shard.len() >= SHARD_CAPACITY {
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
        self.map.forget(key);
    }

    pub(crate) fn clear(&self) {
        self.map.clear();
    }
}
