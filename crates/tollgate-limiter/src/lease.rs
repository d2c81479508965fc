//! Leases: a batch of units taken in one round trip and spent locally.

use std::time::Duration;

use tokio::time::Instant;

use crate::decision::Decision;
use crate::key::Key;
use crate::sharded::{Expiring, Sharded};

#[derive(Debug, Clone, Copy)]
struct Lease {
    left: u64,
    until: Instant,
    decision: Decision,
}

impl Expiring for Lease {
    fn until(&self) -> Instant {
        self.until
    }
}

/// Units taken from the backend ahead of need, per key.
///
/// A lease lives at most `ttl`; units not spent by then are dropped (they
/// were already counted by the backend). Leased units are counted when
/// leased and spent later, so across `W` workers up to `W × (batch − 1)`
/// units granted earlier can be spent on top of what the backend grants in
/// any instant: see [`LimiterBuilder::lease`](crate::LimiterBuilder::lease)
/// for the bound. At most `capacity` keys hold a lease; when full, a request
/// asks for its own cost only, as without leases.
#[derive(Debug)]
pub(crate) struct Leases {
    pub(crate) batch: u64,
    ttl: Duration,
    map: Sharded<Lease>,
}

impl Leases {
    pub(crate) fn new(batch: u64, ttl: Duration, capacity: usize) -> Self {
        Self {
            batch,
            // A longer ttl ("for ever", `Duration::MAX`) means the same, and
            // would overflow the lease's end (an `Instant`): a panic on
            // every batch.
            ttl: ttl.min(crate::guard::MAX_WAIT),
            map: Sharded::new(capacity),
        }
    }

    /// Whether a lease for `key` could be kept now.
    pub(crate) fn has_room(&self, key: &Key) -> bool {
        self.map.shard(key).has_room(key, Instant::now())
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
        Some(
            Decision::allowed(d.limit(), d.remaining() + lease.left, d.reset_after())
                .with_window(d.window())
                .with_part(d.part()),
        )
    }

    /// Keeps `left` units of a batch the backend granted with `decision`
    /// (dropped if the map filled up since [`has_room`](Self::has_room):
    /// lost units only lower what is admitted).
    pub(crate) fn keep(&self, key: &Key, left: u64, decision: &Decision) {
        let now = Instant::now();
        let lease = Lease {
            left,
            until: now + self.ttl,
            decision: *decision,
        };
        self.map.shard(key).insert(key, lease, now);
    }

    pub(crate) fn forget(&self, key: &Key) {
        self.map.forget(key);
    }

    /// The number of keys held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn clear(&self) {
        self.map.clear();
    }
}
