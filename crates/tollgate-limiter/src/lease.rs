//! Leases: a batch of units taken in one round trip and spent locally.

use std::sync::atomic::{AtomicU64, Ordering};
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
///
/// A batch asked for before this worker forgets a lease (a reset, an
/// override) and answered after may have been granted under what was
/// undone: its rest is not kept, whichever key it is for (see
/// [`keep`](Self::keep); resets and overrides are rare, a lost batch only
/// lowers what is admitted).
#[derive(Debug)]
pub(crate) struct Leases {
    pub(crate) batch: u64,
    ttl: Duration,
    map: Sharded<Lease>,
    /// How many times leases were forgotten.
    forgotten: AtomicU64,
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
            forgotten: AtomicU64::new(0),
        }
    }

    /// Marks a batch about to be asked for: hand it to [`keep`](Self::keep).
    pub(crate) fn asking(&self) -> u64 {
        self.forgotten.load(Ordering::SeqCst)
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

    /// Keeps `left` units of a batch the backend granted with `decision`,
    /// asked for at `asked` (from [`asking`](Self::asking)); dropped if
    /// leases were forgotten since, or if the map filled up since
    /// [`has_room`](Self::has_room): lost units only lower what is
    /// admitted.
    ///
    /// Units still left of the key's live lease (fewer than the cost of
    /// the request that took this batch) are added, not dropped: they
    /// were counted by the backend, and a limiter whose cost is above 1
    /// would otherwise lose them on every batch. At most `batch - 1` are
    /// held, the bound [`LimiterBuilder::lease`](crate::LimiterBuilder::lease)
    /// documents (batches taken at once for one key lose the excess).
    pub(crate) fn keep(&self, key: &Key, left: u64, decision: &Decision, asked: u64) {
        let now = Instant::now();
        let mut shard = self.map.shard(key);
        let kept = shard
            .get(key)
            .filter(|old| now < old.until)
            .map_or(0, |old| old.left);
        let lease = Lease {
            left: left.saturating_add(kept).min(self.batch - 1),
            until: now + self.ttl,
            decision: *decision,
        };
        // Read under the shard's lock: a `forget` that counts after this
        // read removes the lease once this lock is released.
        if self.forgotten.load(Ordering::SeqCst) == asked {
            shard.insert(key, lease, now);
        }
    }

    pub(crate) fn forget(&self, key: &Key) {
        self.forgotten.fetch_add(1, Ordering::SeqCst);
        self.map.forget(key);
    }

    /// The number of keys held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn clear(&self) {
        self.forgotten.fetch_add(1, Ordering::SeqCst);
        self.map.clear();
    }
}
