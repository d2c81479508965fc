//! Bounded maps of keys split over mutex-guarded shards, for the
//! `Limiter`'s local state (cached refusals, leases).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard, OnceLock};

use tokio::time::Instant;

use crate::deny_cache::Entry;
use crate::key::Key;
use crate::lease::Lease;

const SHARDS: usize = 16;

/// A local entry that is worthless after an instant.
pub(crate) trait Expiring {
    /// When the entry stops being of use.
    fn until(&self) -> Instant;
}

/// Keys split over mutex-guarded shards, each a `T` (one bounded
/// [`Shard`] map, or a [`Locals`] pair of them).
#[derive(Debug)]
pub(crate) struct Sharded<T> {
    shards: Box<[Mutex<T>]>,
}

/// The local maps of one limiter, in one shard: a key's cached refusal
/// and its lease sit under one lock, so that a request looking at both
/// takes it once. Each map keeps its own bound.
#[derive(Debug)]
pub(crate) struct Locals {
    pub(crate) denials: Shard<Entry>,
    pub(crate) leases: Shard<Lease>,
}

impl Locals {
    /// A limiter's local maps, each of at most `capacity` keys.
    pub(crate) fn maps(capacity: usize) -> Sharded<Locals> {
        Sharded::new(capacity, |cap| Locals {
            denials: Shard::new(cap),
            leases: Shard::new(cap),
        })
    }
}

/// Keys mapped to expiring entries, never more than a capacity.
///
/// Local state is an optimisation, and forgetting an entry costs only a
/// round trip: when a shard is full, expired entries are dropped, and if
/// none has expired the new entry is not kept. A sweep that freed less than
/// an eighth of the shard delays the next one by an eighth of the shard's
/// requests for room, which are turned down meanwhile: a sweep's work is
/// bounded per request, however the entries expire.
#[derive(Debug)]
pub(crate) struct Shard<V> {
    map: HashMap<Key, V>,
    cap: usize,
    /// No entry expires before this: sweeping earlier would free nothing,
    /// so a full shard under a flood of new keys is not rescanned per key.
    next_expiry: Option<Instant>,
    /// Requests for room a full shard has turned down since its last sweep
    /// that freed little (see `make_room`), up to `quota()`.
    asks: usize,
    /// Entries a sweep has looked at, in all.
    #[cfg(test)]
    visited: usize,
}

impl<T> Sharded<T> {
    /// Shards for at most `capacity` keys (none with 0), each made by
    /// `shard` from its part of the capacity.
    pub(crate) fn new(capacity: usize, shard: impl Fn(usize) -> T) -> Self {
        // Fewer shards than keys so that the shards' caps sum to at most
        // the capacity.
        let shards = SHARDS.min(capacity.max(1));
        let cap = capacity / shards;
        Self {
            shards: (0..shards).map(|_| Mutex::new(shard(cap))).collect(),
        }
    }

    /// The shard holding `key`, locked.
    pub(crate) fn shard(&self, key: &Key) -> MutexGuard<'_, T> {
        // One hasher for the process: only the spread matters.
        static HASHER: OnceLock<RandomState> = OnceLock::new();
        let h = HASHER.get_or_init(RandomState::new).hash_one(key);
        crate::lock(&self.shards[h as usize % self.shards.len()])
    }

    /// Calls `f` on every shard, locked in turn.
    pub(crate) fn each(&self, mut f: impl FnMut(&mut T)) {
        for s in &*self.shards {
            f(&mut crate::lock(s));
        }
    }
}

impl<V: Expiring> Shard<V> {
    /// An empty map of at most `cap` keys.
    fn new(cap: usize) -> Self {
        Self {
            map: HashMap::new(),
            cap,
            next_expiry: None,
            asks: usize::MAX,
            #[cfg(test)]
            visited: 0,
        }
    }

    /// The number of keys held (expired or not).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn clear(&mut self) {
        self.map.clear();
    }

    pub(crate) fn get(&self, key: &Key) -> Option<&V> {
        self.map.get(key)
    }

    pub(crate) fn get_mut(&mut self, key: &Key) -> Option<&mut V> {
        self.map.get_mut(key)
    }

    pub(crate) fn remove(&mut self, key: &Key) {
        self.map.remove(key);
    }

    /// Whether `key` has, or could be given, a place at `now`.
    pub(crate) fn has_room(&mut self, key: &Key, now: Instant) -> bool {
        self.map.contains_key(key) || self.make_room(now)
    }

    /// Stores `value` for `key`, unless the shard is full of live entries;
    /// returns whether it was stored.
    pub(crate) fn insert(&mut self, key: &Key, value: V, now: Instant) -> bool {
        if !self.has_room(key, now) {
            return false;
        }
        let until = value.until();
        self.next_expiry = Some(self.next_expiry.map_or(until, |t| t.min(until)));
        self.map.insert(key.clone(), value);
        true
    }

    fn make_room(&mut self, now: Instant) -> bool {
        if self.map.len() < self.cap {
            return true;
        }
        if self.next_expiry.is_some_and(|t| t > now) {
            return false;
        }
        // A sweep looks at every entry, under the lock every request of
        // the shard's keys takes. One that frees at least a quota is paid
        // for by the entries it frees (each stored once); after one that
        // frees less, the next waits for a quota of requests for room, so
        // that entries expiring one at a time (an attacker's, of short
        // ttls) cannot make every request sweep the whole shard.
        let quota = (self.cap / 8).max(1);
        if self.asks < quota {
            self.asks += 1;
            return false;
        }
        let before = self.map.len();
        #[cfg(test)]
        {
            self.visited += before;
        }
        self.map.retain(|_, v| v.until() > now);
        self.next_expiry = self.map.values().map(Expiring::until).min();
        self.asks = if before - self.map.len() >= quota {
            usize::MAX
        } else {
            0
        };
        self.map.len() < self.cap
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    impl Expiring for Instant {
        fn until(&self) -> Instant {
            *self
        }
    }

    /// The number of keys `m` holds (expired or not).
    fn len(m: &Sharded<Shard<Instant>>) -> usize {
        let mut n = 0;
        m.each(|s| n += s.len());
        n
    }

    #[tokio::test(start_paused = true)]
    async fn holds_at_most_its_capacity_and_reuses_expired_places() {
        for capacity in [0, 1, 5, 16, 100, 1000] {
            let m = Sharded::new(capacity, Shard::<Instant>::new);
            let now = Instant::now();
            let mut kept = 0;
            for i in 0..capacity * 3 + 20 {
                let k = Key::new(format!("k{i}"));
                kept += usize::from(m.shard(&k).insert(&k, now + Duration::from_secs(1), now));
            }
            assert!(len(&m) <= capacity, "{capacity}: {}", len(&m));
            assert_eq!(kept, len(&m));
            // Once the entries have expired, new keys take their places.
            tokio::time::advance(Duration::from_secs(1)).await;
            let now = Instant::now();
            let mut fresh = 0;
            for i in 0..capacity * 3 + 20 {
                let k = Key::new(format!("n{i}"));
                fresh += usize::from(m.shard(&k).insert(&k, now + Duration::from_secs(1), now));
            }
            // Expired entries stay in a shard that never filled up (they
            // are swept only when room is needed), so the map may hold
            // more than the new keys; never more than its capacity.
            assert!(len(&m) <= capacity);
            assert!(fresh <= len(&m), "{capacity}: {fresh} > {}", len(&m));
            assert!(
                capacity < SHARDS * 4 || fresh >= capacity / 2,
                "{capacity}: {fresh}"
            );
        }
    }

    /// A full shard whose entries expire one at a time (an attacker's
    /// keys, each refused or leased with a short ttl, beside long-lived
    /// ones) must not be swept whole for every new key: a sweep looks at
    /// every entry under the shard's lock, which every request of its
    /// keys takes. Sweeps are paid for by the requests that ask for room,
    /// a bounded number of entries each.
    #[tokio::test(start_paused = true)]
    async fn a_full_shard_is_not_swept_whole_for_every_new_key() {
        let m = Sharded::new(1600, Shard::<Instant>::new);
        let mut s = crate::lock(&m.shards[0]);
        let cap = s.cap;
        let start = Instant::now();
        let hour = start + Duration::from_secs(3600);
        for i in 0..cap - 1 {
            assert!(s.insert(&Key::new(format!("long{i}")), hour, start));
        }
        let asks = 10_000;
        for i in 0..asks {
            let now = start + Duration::from_micros(i);
            let k = Key::new(format!("short{i}"));
            let _ = s.insert(&k, now + Duration::from_micros(1), now);
        }
        assert!(
            s.visited <= 20 * asks as usize,
            "{} entries looked at for {asks} new keys (a shard of {cap})",
            s.visited
        );
    }
}
