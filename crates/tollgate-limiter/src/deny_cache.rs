//! Local answers to a flood: keys known to be refused until an instant.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::decision::Decision;
use crate::key::Key;
use crate::model::Op;
use crate::policy::Policy;
use crate::sharded::{Expiring, Locals, Shard, Sharded};

/// A key's cached refusal.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    until: Instant,
    at: Instant,
    cost: u64,
    decision: Decision,
    /// Units refused locally (sliding windows) not yet carried to the
    /// backend, and when the last of them was refused.
    pending: u64,
    pending_at: Instant,
}

/// What the cache answers to a charging request.
pub(crate) enum Charge<'a> {
    /// Refused locally, as the backend would refuse it.
    Refused(Decision),
    /// Ask the backend; first record the [units](Carry::units) refused
    /// locally ([`Op::Penalise`]), so that the flood is counted.
    Ask(Carry<'a>),
}

impl Expiring for Entry {
    fn until(&self) -> Instant {
        self.until
    }
}

/// Refusals remembered per key, so that a storm of requests on a key that
/// is over its limit is answered without asking the backend.
///
/// Only refusals that the backend would repeat are cached: a request of at
/// least the refused cost cannot pass before the refusal's retry-after
/// under a token bucket or a sliding window, nor can a check of a blocked
/// progressive delay (whose failures must all be recorded, so only peeks
/// are answered locally).
///
/// **Penalised sliding windows.** There every refusal must be recorded, so
/// a charging request refused locally is not forgotten: its cost is added
/// to the key's *pending* units, and the key's next backend call first
/// records them ([`Op::Penalise`], one more round trip) and then asks for
/// its own cost. The flood is thus recorded, only later (at the carry, not
/// at each refusal), so its units leave the window later: the limiter is
/// stricter than or as strict as without the cache, never laxer, and never
/// admits more. This is done for every sliding window (the policy in force
/// may be an override that penalises; the backend records nothing where it
/// does not). Two things are advisory only: a local refusal reports the
/// cached retry-after, which the carried penalty may push further out; and
/// pending units are dropped once a window (of the policy that refused)
/// has passed since the last of them (they would have left the window
/// anyway), when the key is reset or overridden through this limiter, when
/// the call carrying them fails (the fail mode then rules that request; a
/// call dropped before it answered gives them back, for the key's next call
/// to carry, unless the key was reset or overridden meanwhile), and when a full shard drops the expired entry holding them
/// (memory stays bounded).
///
/// An entry answers for at most `max_ttl`, which bounds how late this
/// worker sees a reset or an override made by another worker. This
/// worker's own take effect at once: a refusal the backend decided before
/// one of them and answered after is not kept (see
/// [`insert`](Self::insert)). At most
/// `capacity` keys are held: when full, a refusal is not cached unless an
/// expired entry makes room (it is then answered by the backend, as without
/// a cache).
#[derive(Debug)]
pub(crate) struct DenyCache {
    max_ttl: Duration,
    /// Shared with the limiter's leases (see [`Locals`]).
    map: Arc<Sharded<Locals>>,
    /// How many times entries were forgotten (a reset, an override, a
    /// refund made through this worker), by the keys' hash: a forget
    /// counts on its key's counter, a clear on all of them. Keys that
    /// share a counter share forgets (their refusals in flight are not
    /// kept: the safe side); keys that do not, do not, so that the settle
    /// of every request (a layer charging by the real cost) does not keep
    /// a flood's refusals on another key from being cached.
    forgotten: Box<[AtomicU64]>,
    hasher: RandomState,
}

/// How many forget counters a cache keeps.
const FORGET_COUNTERS: usize = 64;

impl DenyCache {
    /// A cache keeping its refusals in `map`'s [`Locals::denials`].
    pub(crate) fn new(max_ttl: Duration, map: Arc<Sharded<Locals>>) -> Self {
        Self {
            max_ttl,
            map,
            forgotten: (0..FORGET_COUNTERS).map(|_| AtomicU64::new(0)).collect(),
            hasher: RandomState::new(),
        }
    }

    /// Marks a backend call for `key` about to be made: hand it to
    /// [`insert`](Self::insert) with the call's refusal.
    pub(crate) fn asking(&self, key: &Key) -> u64 {
        self.forgotten(key).load(Ordering::SeqCst)
    }

    /// The forget counter of `key`.
    fn forgotten(&self, key: &Key) -> &AtomicU64 {
        let h = self.hasher.hash_one(key);
        &self.forgotten[h as usize % self.forgotten.len()]
    }

    /// Whether refusals of `policy` for `op` can be answered locally (for
    /// a sliding window's acquire, with its cost kept pending).
    pub(crate) fn applies(policy: &Policy, op: Op) -> bool {
        matches!(
            (policy, op),
            (
                Policy::TokenBucket(_)
                    | Policy::SlidingWindow(_)
                    | Policy::Composite(_)
                    | Policy::Calendar(_)
                    | Policy::ProgressiveDelay(_),
                Op::Peek(_)
            ) | (
                Policy::TokenBucket(_)
                    | Policy::SlidingWindow(_)
                    | Policy::Composite(_)
                    | Policy::Calendar(_),
                Op::Acquire(_)
            )
        )
    }

    /// The remembered refusal for `key` and `cost`, aged to now. (A peek
    /// asks [`charge`](Self::charge), which carries what is pending.)
    #[cfg(test)]
    pub(crate) fn get(&self, key: &Key, cost: u64) -> Option<Decision> {
        let now = Instant::now();
        let local = self.map.shard(key);
        let e = local.denials.get(key)?;
        if now >= e.until || cost < e.cost {
            return None;
        }
        Some(aged(e, now))
    }

    /// The answer to a charging request of `cost` for `key`: a local
    /// refusal (whose cost becomes pending when `pending` counts, for a
    /// sliding window), or the pending units to carry to the backend
    /// before asking it, taken out of the entry.
    ///
    /// Taken, not copied: the returned [`Carry`] gives them back to the
    /// key's entry if it is dropped before [`done`](Carry::done), so that
    /// a caller that goes away before the carrying call answered (it may
    /// not have reached the backend) leaves them to the key's next call
    /// rather than drop the flood's penalty (unless the key is reset or
    /// overridden through this limiter meanwhile, which drops them).
    /// Carried twice, they are recorded twice: stricter, never laxer.
    ///
    /// A peek asks too, with `pending` false: it adds nothing, and carries
    /// what is pending, so that the backend answers it as it will answer
    /// the key's next check.
    pub(crate) fn charge<'a>(&'a self, key: &'a Key, cost: u64, pending: bool) -> Charge<'a> {
        self.charge_in(&mut self.map.shard(key).denials, key, cost, pending)
    }

    /// [`charge`](Self::charge) under the lock of `key`'s shard, held by
    /// the caller (`shard`: its cached refusals). The returned [`Carry`]
    /// must outlive that lock: dropped, it may take it.
    pub(crate) fn charge_in<'a>(
        &'a self,
        shard: &mut Shard<Entry>,
        key: &'a Key,
        cost: u64,
        pending: bool,
    ) -> Charge<'a> {
        let now = Instant::now();
        let carry = |units, window| {
            Charge::Ask(Carry {
                cache: self,
                key,
                units,
                window,
                // Read under the shard's lock, as in `insert`.
                asked: self.asking(key),
            })
        };
        let Some(e) = shard.get_mut(key) else {
            return carry(0, Duration::ZERO);
        };
        if now < e.until && cost >= e.cost {
            if pending {
                e.pending = e.pending.saturating_add(cost);
                e.pending_at = now;
            }
            return Charge::Refused(aged(e, now));
        }
        // Units refused more than a window ago would have left it.
        let window = e.decision.window();
        let carried = if now - e.pending_at < window {
            std::mem::take(&mut e.pending)
        } else {
            0
        };
        if now >= e.until {
            shard.remove(key);
        } else {
            e.pending = 0;
        }
        carry(carried, window)
    }

    /// Puts `units` back as pending for `key`, refused now under a
    /// refusal of `window`: in the key's entry, or (it was dropped when it
    /// expired) in an expired one that refuses nothing. Not if the key's
    /// entries were forgotten since they were taken, at `asked` (from
    /// [`asking`](Self::asking)): a reset or an override made meanwhile
    /// drops them, as it drops units still pending.
    fn restore(&self, key: &Key, units: u64, window: Duration, asked: u64) {
        let now = Instant::now();
        let mut local = self.map.shard(key);
        let shard = &mut local.denials;
        // Read under the shard's lock: a `forget` that counts after this
        // read removes the entry once this lock is released.
        if self.asking(key) != asked {
            return;
        }
        if let Some(e) = shard.get_mut(key) {
            e.pending = e.pending.saturating_add(units);
            e.pending_at = now;
            return;
        }
        let refused = Decision::denied(0, 0, Duration::ZERO, Duration::ZERO).with_window(window);
        let entry = Entry {
            until: now,
            at: now,
            cost: u64::MAX,
            decision: refused,
            pending: units,
            pending_at: now,
        };
        shard.insert(key, entry, now);
    }

    /// Remembers a refusal of a request of `cost`, from a backend call
    /// made at `asked` (from [`asking`](Self::asking)): not if the key's
    /// entries were forgotten since, as the refusal may have been decided
    /// before the reset, override or refund that made it stale (or
    /// another key's sharing its counter: a refusal not kept costs only a
    /// round trip).
    pub(crate) fn insert(&self, key: &Key, cost: u64, decision: &Decision, asked: u64) {
        let ttl = decision.retry_after().min(self.max_ttl);
        if ttl.is_zero() {
            return;
        }
        let at = Instant::now();
        let entry = Entry {
            until: at + ttl,
            at,
            cost,
            decision: *decision,
            pending: 0,
            pending_at: at,
        };
        let mut local = self.map.shard(key);
        let shard = &mut local.denials;
        // Read under the shard's lock: a `forget` that counts after this
        // read removes the entry once this lock is released.
        if self.asking(key) != asked {
            return;
        }
        let entry = match shard.get(key) {
            // Keep the smallest refused cost: it answers more requests.
            Some(e) if cost > e.cost && e.until > at => return,
            // Units still pending stay pending.
            Some(e) => Entry {
                pending: e.pending,
                pending_at: e.pending_at,
                ..entry
            },
            None => entry,
        };
        shard.insert(key, entry, at);
    }

    pub(crate) fn forget(&self, key: &Key) {
        self.forgotten(key).fetch_add(1, Ordering::SeqCst);
        self.map.shard(key).denials.remove(key);
    }

    /// The number of keys held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let mut n = 0;
        self.map.each(|local| n += local.denials.len());
        n
    }

    /// Forgets every key: each counter counts it before any shard is
    /// cleared (see [`insert`](Self::insert)).
    pub(crate) fn clear(&self) {
        for counter in &self.forgotten {
            counter.fetch_add(1, Ordering::SeqCst);
        }
        self.map.each(|local| local.denials.clear());
    }
}

/// Pending units on their way to the backend (see [`DenyCache::charge`]).
#[must_use = "dropped, the units go back to the cache"]
pub(crate) struct Carry<'a> {
    cache: &'a DenyCache,
    key: &'a Key,
    units: u64,
    /// The window of the refusal they were refused by (for `restore`).
    window: Duration,
    /// The key's forget count when they were taken (for `restore`).
    asked: u64,
}

impl Carry<'_> {
    /// The units to carry (0 for none).
    pub(crate) fn units(&self) -> u64 {
        self.units
    }

    /// The carrying call answered, or failed (the units are then dropped:
    /// the fail mode rules that request).
    pub(crate) fn done(mut self) {
        self.units = 0;
    }
}

impl Drop for Carry<'_> {
    fn drop(&mut self) {
        if self.units > 0 {
            self.cache
                .restore(self.key, self.units, self.window, self.asked);
        }
    }
}

/// `e`'s refusal, its figures aged to `now`.
fn aged(e: &Entry, now: Instant) -> Decision {
    let elapsed = now - e.at;
    let d = e.decision;
    Decision::denied(
        d.limit(),
        d.remaining(),
        d.retry_after().saturating_sub(elapsed),
        d.reset_after().saturating_sub(elapsed),
    )
    .with_window(d.window())
    .with_part(d.part())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{SlidingWindow, TokenBucket};

    #[tokio::test(start_paused = true)]
    async fn answers_until_the_retry_after_and_ages_the_numbers() {
        let c = DenyCache::new(Duration::from_secs(10), Arc::new(Locals::maps(100)));
        let k = Key::new("k");
        let d = Decision::denied(5, 0, Duration::from_secs(2), Duration::from_secs(3));
        c.insert(&k, 2, &d, c.asking(&k));
        assert!(c.get(&k, 1).is_none(), "a cheaper request may pass");
        tokio::time::advance(Duration::from_millis(500)).await;
        let aged = c.get(&k, 2).unwrap();
        assert_eq!(aged.retry_after(), Duration::from_millis(1500));
        assert_eq!(aged.reset_after(), Duration::from_millis(2500));
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert!(c.get(&k, 2).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn entries_live_at_most_max_ttl() {
        let c = DenyCache::new(Duration::from_millis(100), Arc::new(Locals::maps(100)));
        let k = Key::new("k");
        c.insert(
            &k,
            1,
            &Decision::denied(1, 0, Duration::from_secs(60), Duration::ZERO),
            c.asking(&k),
        );
        assert!(c.get(&k, 1).is_some());
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(c.get(&k, 1).is_none());
    }

    #[test]
    fn which_refusals_are_answered_locally() {
        let w = SlidingWindow::new(1, Duration::from_secs(1)).unwrap();
        assert!(DenyCache::applies(&w.into(), Op::Acquire(1)));
        assert!(DenyCache::applies(
            &w.penalise_refused(true).into(),
            Op::Acquire(1)
        ));
        let tb = TokenBucket::per_second(1, 1).unwrap();
        assert!(DenyCache::applies(&tb.into(), Op::Acquire(3)));
        let pd = crate::policy::ProgressiveDelay::new(
            1,
            Duration::from_secs(1),
            2,
            Duration::from_secs(4),
            Duration::from_secs(60),
        )
        .unwrap();
        assert!(!DenyCache::applies(&pd.into(), Op::Acquire(1)));
        assert!(DenyCache::applies(&pd.into(), Op::Peek(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn local_refusals_are_carried_to_the_next_backend_call() {
        let c = DenyCache::new(Duration::from_secs(60), Arc::new(Locals::maps(100)));
        let k = Key::new("k");
        let d = Decision::denied(3, 0, Duration::from_secs(2), Duration::from_secs(10))
            .with_window(Duration::from_secs(10));
        c.insert(&k, 1, &d, c.asking(&k));
        for _ in 0..3 {
            assert!(matches!(c.charge(&k, 2, true), Charge::Refused(_)));
        }
        assert!(matches!(c.charge(&k, 1, false), Charge::Refused(_)));
        // A peek is answered and adds nothing.
        assert!(c.get(&k, 1).is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(carried(c.charge(&k, 1, true)), 6);
        assert_eq!(carried(c.charge(&k, 1, true)), 0);
        // A cheaper request than the refused one carries them too.
        c.insert(&k, 2, &d, c.asking(&k));
        assert!(matches!(c.charge(&k, 2, true), Charge::Refused(_)));
        assert_eq!(carried(c.charge(&k, 1, true)), 2);
        // Units refused a whole window ago would have left it: dropped.
        assert!(matches!(c.charge(&k, 2, true), Charge::Refused(_)));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(carried(c.charge(&k, 2, true)), 0);
    }

    /// The units a charge asks to carry, carried.
    fn carried(charge: Charge<'_>) -> u64 {
        match charge {
            Charge::Ask(carry) => {
                let units = carry.units();
                carry.done();
                units
            }
            Charge::Refused(d) => panic!("refused: {d:?}"),
        }
    }
}
