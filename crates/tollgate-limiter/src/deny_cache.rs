//! Local answers to a flood: keys known to be refused until an instant.

use std::time::Duration;

use tokio::time::Instant;

use crate::decision::Decision;
use crate::key::Key;
use crate::policy::Policy;
use crate::sharded::{Expiring, Sharded};

#[derive(Debug, Clone, Copy)]
struct Entry {
    until: Instant,
    at: Instant,
    cost: u64,
    decision: Decision,
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
/// under a token bucket or a sliding window (a refusal records nothing
/// there), nor can a check of a blocked progressive delay. A sliding window
/// that penalises refusals must record each one, so it is never answered
/// locally. An entry lives at most `max_ttl`, which bounds how late this
/// worker sees a reset or an override made by another worker. At most
/// `capacity` keys are held: when full, a refusal is not cached unless an
/// expired entry makes room (it is then answered by the backend, as without
/// a cache).
#[derive(Debug)]
pub(crate) struct DenyCache {
    max_ttl: Duration,
    map: Sharded<Entry>,
}

impl DenyCache {
    pub(crate) fn new(max_ttl: Duration, capacity: usize) -> Self {
        Self {
            max_ttl,
            map: Sharded::new(capacity),
        }
    }

    /// Whether refusals of `policy` for a request of `cost` can be cached.
    pub(crate) fn applies(policy: &Policy, cost: u64) -> bool {
        match policy {
            Policy::TokenBucket(_) => true,
            Policy::SlidingWindow(p) => !p.penalises_refused(),
            Policy::ProgressiveDelay(_) => cost == 0,
        }
    }

    /// The remembered refusal for `key` and `cost`, aged to now.
    pub(crate) fn get(&self, key: &Key, cost: u64) -> Option<Decision> {
        let now = Instant::now();
        let mut shard = self.map.shard(key);
        let e = *shard.get(key)?;
        if now >= e.until {
            shard.remove(key);
            return None;
        }
        if cost < e.cost {
            return None;
        }
        let elapsed = now - e.at;
        let d = e.decision;
        Some(Decision::denied(
            d.limit(),
            d.remaining(),
            d.retry_after().saturating_sub(elapsed),
            d.reset_after().saturating_sub(elapsed),
        ))
    }

    /// Remembers a refusal of a request of `cost`.
    pub(crate) fn insert(&self, key: &Key, cost: u64, decision: &Decision) {
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
        };
        let mut shard = self.map.shard(key);
        // Keep the smallest refused cost: it answers more requests.
        if let Some(e) = shard.get(key)
            && cost > e.cost
            && e.until > at
        {
            return;
        }
        shard.insert(key, entry, at);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{SlidingWindow, TokenBucket};

    #[tokio::test(start_paused = true)]
    async fn answers_until_the_retry_after_and_ages_the_numbers() {
        let c = DenyCache::new(Duration::from_secs(10), 100);
        let k = Key::new("k");
        let d = Decision::denied(5, 0, Duration::from_secs(2), Duration::from_secs(3));
        c.insert(&k, 2, &d);
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
        let c = DenyCache::new(Duration::from_millis(100), 100);
        let k = Key::new("k");
        c.insert(
            &k,
            1,
            &Decision::denied(1, 0, Duration::from_secs(60), Duration::ZERO),
        );
        assert!(c.get(&k, 1).is_some());
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(c.get(&k, 1).is_none());
    }

    #[test]
    fn penalising_windows_are_never_cached() {
        let w = SlidingWindow::new(1, Duration::from_secs(1)).unwrap();
        assert!(DenyCache::applies(&w.into(), 1));
        assert!(!DenyCache::applies(&w.penalise_refused(true).into(), 1));
        let tb = TokenBucket::per_second(1, 1).unwrap();
        assert!(DenyCache::applies(&tb.into(), 3));
    }
}
