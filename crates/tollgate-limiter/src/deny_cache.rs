//! Local answers to a flood: keys known to be refused until an instant.

use std::time::Duration;

use tokio::time::Instant;

use crate::decision::Decision;
use crate::key::Key;
use crate::model::Op;
use crate::policy::Policy;
use crate::sharded::{SHARD_CAPACITY, Sharded};

#[derive(Debug, Clone, Copy)]
struct Entry {
    until: Instant,
    at: Instant,
    cost: u64,
    decision: Decision,
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
/// worker sees a reset or an override made by another worker.
#[derive(Debug)]
pub(crate) struct DenyCache {
    max_ttl: Duration,
    map: Sharded<Entry>,
}

impl DenyCache {
    pub(crate) fn new(max_ttl: Duration) -> Self {
        Self {
            max_ttl,
            map: Sharded::new(),
        }
    }

    /// Whether refusals of `policy` for `op` can be answered locally.
    pub(crate) fn applies(policy: &Policy, op: Op) -> bool {
        match (policy, op) {
            (_, Op::Peek(_)) => true,
            (Policy::TokenBucket(_), Op::Acquire(_)) => true,
            (Policy::SlidingWindow(p), Op::Acquire(_)) => !p.penalises_refused(),
            _ => false,
        }
    }

    /// The remembered refusal that answers a peek of `cost`.
    pub(crate) fn peek(&self, key: &Key, cost: u64) -> Option<Decision> {
        self.get(key, cost)
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
        let mut shard = self.map.shard(key);
        if shard.len() >= SHARD_CAPACITY && !shard.contains_key(key) {
            shard.retain(|_, e| e.until > at);
            if shard.len() >= SHARD_CAPACITY {
                shard.clear();
            }
        }
        let entry = Entry {
            until: at + ttl,
            at,
            cost,
            decision: *decision,
        };
        shard
            .entry(key.clone())
            .and_modify(|e| {
                // Keep the smallest refused cost: it answers more requests.
                if cost <= e.cost || e.until <= at {
                    *e = entry;
                }
            })
            .or_insert(entry);
    }

    pub(crate) fn forget(&self, key: &Key) {
        self.map.forget(key);
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
        let c = DenyCache::new(Duration::from_secs(10));
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
        let c = DenyCache::new(Duration::from_millis(100));
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
        assert!(DenyCache::applies(&w.into(), Op::Acquire(1)));
        assert!(!DenyCache::applies(
            &w.penalise_refused(true).into(),
            Op::Acquire(1)
        ));
        let tb = TokenBucket::per_second(1, 1).unwrap();
        assert!(DenyCache::applies(&tb.into(), Op::Acquire(3)));
    }
}
