//! Leases: a batch of units taken in one round trip and spent locally.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::decision::Decision;
use crate::key::Key;
use crate::sharded::{Expiring, Locals, Shard, Sharded};

/// A key's leased units.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease {
    left: u64,
    until: Instant,
    decision: Decision,
    /// When the backend granted the batch with `decision`.
    at: Instant,
    /// The batch this worker is asking the backend for, for this key, if
    /// one is on its way (its [`Fetch`]'s id).
    fetching: Option<u64>,
    /// The policy in force for the key (an override) can never grant a
    /// batch: its requests ask for their own cost until `until`.
    unbatched: bool,
}

impl Lease {
    /// The decision of a request spent from it, which left it `left`
    /// units: the batch's figures aged to `now`, as a cached refusal's
    /// are.
    fn spent(&self, now: Instant) -> Decision {
        let d = self.decision;
        let reset_after = d.reset_after().saturating_sub(now - self.at);
        Decision::allowed(d.limit(), d.remaining() + self.left, reset_after)
            .with_window(d.window())
            .with_part(d.part())
    }
}

impl Expiring for Lease {
    fn until(&self) -> Instant {
        self.until
    }
}

/// What a request does under lease mode (see [`Leases::take`]).
pub(crate) enum Take<'a> {
    /// Spent from the key's lease: the request is admitted.
    Spent(Decision),
    /// Ask the backend for a whole batch, and [keep](Fetch::keep) its rest.
    Batch(Fetch<'a>),
    /// Ask the backend for the request's own cost.
    Own,
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
/// One batch per key is asked for at a time: a request that finds its
/// key's lease short while a batch for the key is on its way asks for its
/// own cost. Each taking a batch of its own, concurrent requests of a key
/// took one batch each, of which at most `batch − 1` units can be kept:
/// the rest was counted by the backend and never spent.
///
/// A batch asked for before this worker forgets a lease (a reset, an
/// override) and answered after may have been granted under what was
/// undone: its rest is not kept, whichever key it is for (see
/// [`Fetch::keep`]; resets and overrides are rare, a lost batch only
/// lowers what is admitted).
#[derive(Debug)]
pub(crate) struct Leases {
    pub(crate) batch: u64,
    ttl: Duration,
    /// Shared with the limiter's deny cache (see [`Locals`]).
    map: Arc<Sharded<Locals>>,
    /// How many times leases were forgotten.
    forgotten: AtomicU64,
    /// The last [`Fetch`]'s id.
    fetches: AtomicU64,
}

impl Leases {
    /// Leases kept in `map`'s [`Locals::leases`].
    pub(crate) fn new(batch: u64, ttl: Duration, map: Arc<Sharded<Locals>>) -> Self {
        Self {
            batch,
            // A longer ttl ("for ever", `Duration::MAX`) means the same, and
            // would overflow the lease's end (an `Instant`): a panic on
            // every batch.
            ttl: ttl.min(crate::guard::MAX_WAIT),
            map,
            forgotten: AtomicU64::new(0),
            fetches: AtomicU64::new(0),
        }
    }

    /// Spends `cost` from the key's lease if it holds enough; else tells
    /// the request whether to ask for a batch (none is on its way for the
    /// key, the batch is above `cost` and the map has room for its rest)
    /// or for its own cost.
    pub(crate) fn take<'a>(&'a self, key: &'a Key, cost: u64) -> Take<'a> {
        self.take_in(&mut self.map.shard(key).leases, key, cost)
    }

    /// `key`'s shard of the local maps, locked (for
    /// [`take_in`](Self::take_in) and the deny cache's
    /// [`charge_in`](crate::deny_cache::DenyCache::charge_in) under one
    /// lock).
    pub(crate) fn lock(&self, key: &Key) -> std::sync::MutexGuard<'_, Locals> {
        self.map.shard(key)
    }

    /// [`take`](Self::take) under the lock of `key`'s shard, held by the
    /// caller (`shard`: its leases). A returned [`Fetch`] must outlive
    /// that lock: dropped, it takes it.
    pub(crate) fn take_in<'a>(
        &'a self,
        shard: &mut Shard<Lease>,
        key: &'a Key,
        cost: u64,
    ) -> Take<'a> {
        let now = Instant::now();
        let fetch = |id| {
            Take::Batch(Fetch {
                leases: self,
                key,
                id,
                // Read under the shard's lock, as in `keep`.
                asked: self.forgotten.load(Ordering::SeqCst),
                armed: true,
            })
        };
        if let Some(lease) = shard.get_mut(key) {
            if now < lease.until {
                if lease.left >= cost {
                    lease.left -= cost;
                    return Take::Spent(lease.spent(now));
                }
                // A batch is worth taking only if it serves more than this
                // request, one at a time, and can be granted.
                if self.batch <= cost || lease.fetching.is_some() || lease.unbatched {
                    return Take::Own;
                }
                let id = self.fetches.fetch_add(1, Ordering::Relaxed) + 1;
                lease.fetching = Some(id);
                return fetch(id);
            }
            shard.remove(key);
        }
        if self.batch <= cost {
            return Take::Own;
        }
        let id = self.fetches.fetch_add(1, Ordering::Relaxed) + 1;
        // Nothing to spend yet: it marks the batch on its way. Not kept
        // when the map is full: the batch's rest could not be kept either.
        let marker = Lease {
            left: 0,
            until: now + self.ttl,
            decision: Decision::allowed(0, 0, Duration::ZERO),
            at: now,
            fetching: Some(id),
            unbatched: false,
        };
        if shard.insert(key, marker, now) {
            fetch(id)
        } else {
            Take::Own
        }
    }

    /// What a request of `cost` would be answered from the key's lease,
    /// spending nothing: allowed if the lease holds `cost` units (a peek
    /// says what the next check would), else `None` (the backend answers).
    pub(crate) fn peek(&self, key: &Key, cost: u64) -> Option<Decision> {
        let now = Instant::now();
        let local = self.map.shard(key);
        let lease = local.leases.get(key)?;
        (now < lease.until && lease.left >= cost).then(|| {
            let after = Lease {
                left: lease.left - cost,
                ..*lease
            };
            after.spent(now)
        })
    }

    pub(crate) fn forget(&self, key: &Key) {
        self.forgotten.fetch_add(1, Ordering::SeqCst);
        self.map.shard(key).leases.remove(key);
    }

    /// The number of keys held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let mut n = 0;
        self.map.each(|local| n += local.leases.len());
        n
    }

    pub(crate) fn clear(&self) {
        self.forgotten.fetch_add(1, Ordering::SeqCst);
        self.map.each(|local| local.leases.clear());
    }
}

/// A batch on its way for a key (see [`Leases::take`]). Dropped, kept or
/// not, it lets the key's next request ask for a batch again, so that a
/// caller that gives up mid-call (its future dropped) leaves nothing
/// behind.
#[must_use = "dropped, the batch's rest is not kept"]
pub(crate) struct Fetch<'a> {
    leases: &'a Leases,
    key: &'a Key,
    id: u64,
    /// The forget count when the batch was asked for.
    asked: u64,
    /// Whether dropping it still has to clear its mark (`keep` and
    /// `impossible` clear it under the lock they take).
    armed: bool,
}

impl Fetch<'_> {
    /// Keeps `left` units of the batch, which the backend granted with
    /// `decision`; dropped if leases were forgotten since the batch was
    /// asked for, or if the map is full: lost units only lower what is
    /// admitted.
    ///
    /// Units still left of the key's live lease (fewer than the cost of
    /// the request that took this batch) are added, not dropped: they
    /// were counted by the backend, and a limiter whose cost is above 1
    /// would otherwise lose them on every batch. At most `batch - 1` are
    /// held, the bound [`LimiterBuilder::lease`](crate::LimiterBuilder::lease)
    /// documents.
    pub(crate) fn keep(mut self, left: u64, decision: &Decision) {
        self.armed = false;
        let leases = self.leases;
        let now = Instant::now();
        let mut local = leases.map.shard(self.key);
        let shard = &mut local.leases;
        let old = shard.get(self.key).filter(|old| now < old.until);
        let lease = Lease {
            left: left
                .saturating_add(old.map_or(0, |old| old.left))
                .min(leases.batch - 1),
            until: now + leases.ttl,
            decision: *decision,
            at: now,
            // Another fetch's mark (this one's was forgotten) stays.
            fetching: old.and_then(|old| old.fetching).filter(|&id| id != self.id),
            unbatched: false,
        };
        // Read under the shard's lock: a `forget` that counts after this
        // read removes the lease once this lock is released.
        if leases.forgotten.load(Ordering::SeqCst) == self.asked {
            shard.insert(self.key, lease, now);
        } else {
            unmark(shard, self.key, self.id);
        }
    }

    /// The batch can never be granted under the policy in force for the
    /// key (an override below the batch): its requests ask for their own
    /// cost, one round trip each, until the key's lease would have expired
    /// (at most `ttl`), rather than a batch refused and then their cost,
    /// two round trips each. Not kept if leases were forgotten since the
    /// batch was asked for (this worker's override may have lifted it).
    pub(crate) fn impossible(mut self) {
        self.armed = false;
        let leases = self.leases;
        let now = Instant::now();
        let mut local = leases.map.shard(self.key);
        let shard = &mut local.leases;
        if leases.forgotten.load(Ordering::SeqCst) != self.asked {
            unmark(shard, self.key, self.id);
            return;
        }
        match shard.get_mut(self.key).filter(|l| now < l.until) {
            Some(lease) => {
                lease.unbatched = true;
                if lease.fetching == Some(self.id) {
                    lease.fetching = None;
                }
            }
            None => {
                let lease = Lease {
                    left: 0,
                    until: now + leases.ttl,
                    decision: Decision::allowed(0, 0, Duration::ZERO),
                    at: now,
                    fetching: None,
                    unbatched: true,
                };
                shard.insert(self.key, lease, now);
            }
        }
    }
}

/// Clears fetch `id`'s mark on `key`'s lease, dropping a lease left with
/// nothing to spend or to say.
fn unmark(shard: &mut Shard<Lease>, key: &Key, id: u64) {
    if let Some(lease) = shard.get_mut(key)
        && lease.fetching == Some(id)
    {
        lease.fetching = None;
        if lease.left == 0 && !lease.unbatched {
            shard.remove(key);
        }
    }
}

impl Drop for Fetch<'_> {
    fn drop(&mut self) {
        if self.armed {
            unmark(
                &mut self.leases.map.shard(self.key).leases,
                self.key,
                self.id,
            );
        }
    }
}
