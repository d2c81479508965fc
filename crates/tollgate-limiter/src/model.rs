//! The reference model: each strategy as a pure function of
//! (state, now, policy, operation).
//!
//! The memory backend runs these functions directly; the Redis Lua scripts
//! implement the same arithmetic (integer microseconds, in the same order),
//! and the conformance suite checks every backend against them decision by
//! decision. Read this module to know exactly what a limiter does.

use std::collections::VecDeque;

use crate::composite::CompositeState;
use crate::decision::Decision;
use crate::policy::{Policy, ProgressiveDelay, SlidingWindow, TokenBucket};
use crate::time::Timestamp;

/// What a request does to a key's state.
///
/// Every charging operation charges at least one unit: `Acquire(0)` is
/// `Acquire(1)`, never a free look (a cost function answering 0 must not
/// make a request uncounted). Looking is its own operation, [`Op::Peek`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Take `cost` units (tokens, window slots, or recorded failures for a
    /// progressive delay); a cost of 0 counts as 1.
    Acquire(u64),
    /// Would `cost` units fit now? Changes nothing; answers what a refused
    /// [`Op::Acquire`] of that cost would answer, or the numbers before the
    /// charge when it would fit. A cost of 0 counts as 1. A progressive
    /// delay ignores the cost: it reports whether the key is blocked.
    Peek(u64),
    /// Record `units` refused units now, whatever they would get: the
    /// refusals a [local denial cache](crate::LimiterBuilder::local_denials)
    /// answered for a sliding window that penalises refusals, carried to the
    /// backend on the key's next call. Records nothing under any other
    /// policy. At most `limit` units are recorded: by the trimming rule of
    /// [`SlidingWindowState`], an entry of `limit` units blocks exactly as
    /// long as a larger one. Answers as `Peek(1)` would afterwards.
    Penalise(u64),
    /// Forget the key: it becomes a fresh key (for a progressive delay, a
    /// successful login). Answers as `Peek(1)` would afterwards.
    Reset,
}

impl Op {
    /// Looks whether one unit would fit, without consuming.
    pub const PEEK: Op = Op::Peek(1);
}

/// State of one token-bucket key: its theoretical arrival time (GCRA).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenBucketState {
    /// When the bucket will be full again; 0 for a fresh key.
    pub tat: Timestamp,
}

impl TokenBucketState {
    /// Takes `cost` tokens at `now` (a cost of 0 counts as 1).
    pub fn acquire(&mut self, now: Timestamp, p: &TokenBucket, cost: u64) -> Decision {
        self.decide(now, p, cost, true)
    }

    /// Whether `cost` tokens would be taken at `now`; changes nothing.
    pub fn peek(&self, now: Timestamp, p: &TokenBucket, cost: u64) -> Decision {
        let mut copy = *self;
        copy.decide(now, p, cost, false)
    }

    fn decide(&mut self, now: Timestamp, p: &TokenBucket, cost: u64, charge: bool) -> Decision {
        let cost = cost.max(1);
        let t = p.interval_micros();
        let tau = p.capacity() * t;
        let tat = self.tat.max(now);
        let debt = tat - now;
        // The debt can exceed tau when an override shrank the bucket: then
        // nothing remains (never a negative count).
        let remaining = tau.saturating_sub(debt) / t;
        if cost > p.capacity() {
            return Decision::impossible(p.capacity(), remaining, debt);
        }
        // cost <= capacity, so this cannot overflow what tau holds.
        let new_debt = debt + cost * t;
        if new_debt > tau {
            return Decision::from_micros(false, p.capacity(), remaining, new_debt - tau, debt);
        }
        if !charge {
            return Decision::from_micros(true, p.capacity(), remaining, 0, debt);
        }
        self.tat = now + new_debt;
        Decision::from_micros(true, p.capacity(), (tau - new_debt) / t, 0, new_debt)
    }

    /// When this state becomes equal to a fresh key's.
    pub fn expires_at(&self) -> Timestamp {
        self.tat
    }
}

/// State of one sliding-window key: the log of admitted (and, if
/// penalised, refused) events, oldest first.
///
/// **Bounded log.** Whenever a decision records an event, the oldest
/// events are dropped while the newer ones alone still hold at least
/// `limit` units (`total - head_cost >= limit`). Events leave the window
/// oldest first, so as long as any kept event is in the window every
/// dropped one is too, and the kept ones alone already refuse every
/// request: the verdict, `remaining` (0) and the exact retry-after
/// (`needed = total + want - limit >= want > 0` is reached inside the kept
/// events) are the same as with the whole log. Without a penalty the log
/// never holds more than `limit` units, so this only ever trims penalised
/// windows under a flood: a key keeps at most `limit` events (each costs at
/// least 1) and a decision's work is bounded by the limit, never by how
/// many requests a client sent.
///
/// The one observable consequence: an override *raising* the limit while a
/// trimmed log is in the window sees only the kept units (at least the old
/// limit), not every refused request of the flood.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingWindowState {
    /// `(timestamp, cost)`, timestamps non-decreasing.
    pub events: VecDeque<(Timestamp, u64)>,
    /// Sum of the costs in `events`.
    pub total: u64,
}

/// What a sliding-window decision may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    /// An acquire: record the cost if it fits or the window penalises.
    Charge,
    /// Nothing.
    Peek,
    /// Record the units if the window penalises, and answer a peek.
    Penalty,
}

impl SlidingWindowState {
    /// Takes `cost` units at `now` (a cost of 0 counts as 1).
    ///
    /// `now` is clamped to the newest event, so a clock that steps back
    /// cannot reorder the log.
    pub fn acquire(&mut self, now: Timestamp, p: &SlidingWindow, cost: u64) -> Decision {
        self.decide(now, p, cost, Record::Charge)
    }

    /// Whether `cost` units would be taken at `now`; records nothing
    /// (events that left the window are dropped, which changes no answer).
    pub fn peek(&mut self, now: Timestamp, p: &SlidingWindow, cost: u64) -> Decision {
        self.decide(now, p, cost, Record::Peek)
    }

    /// Records `units` refused units at `now` if the window penalises
    /// refusals (see [`Op::Penalise`]), then answers a peek of 1.
    pub fn penalise(&mut self, now: Timestamp, p: &SlidingWindow, units: u64) -> Decision {
        self.decide(now, p, units, Record::Penalty)
    }

    fn decide(&mut self, now: Timestamp, p: &SlidingWindow, cost: u64, rec: Record) -> Decision {
        let w = p.window_micros();
        let now = self.events.back().map_or(now, |&(ts, _)| now.max(ts));
        while let Some(&(ts, c)) = self.events.front() {
            if ts + w > now {
                break;
            }
            self.total -= c;
            self.events.pop_front();
        }
        let limit = p.limit();
        let record = |s: &mut Self, cost: u64| {
            match s.events.back_mut() {
                Some((ts, c)) if *ts == now => *c += cost,
                _ => s.events.push_back((now, cost)),
            }
            s.total += cost;
            s.trim(limit);
        };
        let want = match rec {
            Record::Penalty => {
                let units = cost.min(limit);
                if units > 0 && p.penalises_refused() {
                    record(self, units);
                }
                1
            }
            Record::Charge | Record::Peek => cost.max(1),
        };
        let reset = |s: &Self| s.events.back().map_or(0, |&(ts, _)| ts + w - now);
        if want > limit {
            return Decision::impossible(limit, limit.saturating_sub(self.total), reset(self));
        }
        let fits = self.total + want <= limit;
        if rec == Record::Charge && (fits || p.penalises_refused()) {
            record(self, want);
        }
        let retry = if fits {
            0
        } else {
            self.retry_after(now, w, limit, want)
        };
        let remaining = limit.saturating_sub(self.total);
        Decision::from_micros(fits, limit, remaining, retry, reset(self))
    }

    /// Drops the oldest events while the newer ones alone hold at least
    /// `limit` units (see the type's docs for why no answer changes).
    fn trim(&mut self, limit: u64) {
        while let Some(&(_, c)) = self.events.front() {
            if self.total - c < limit {
                break;
            }
            self.total -= c;
            self.events.pop_front();
        }
    }

    /// The exact moment a request of `cost` fits: when the oldest events
    /// that block it leave the window.
    fn retry_after(&self, now: Timestamp, w: u64, limit: u64, cost: u64) -> u64 {
        let needed = (self.total + cost).saturating_sub(limit);
        let mut freed = 0;
        for &(ts, c) in &self.events {
            freed += c;
            if freed >= needed {
                return ts + w - now;
            }
        }
        // Unreachable: a cost above the limit is answered as impossible.
        w
    }

    /// When this state becomes equal to a fresh key's.
    pub fn expires_at(&self, p: &SlidingWindow) -> Timestamp {
        self.events
            .back()
            .map_or(0, |&(ts, _)| ts + p.window_micros())
    }
}

/// State of one progressive-delay key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgressiveDelayState {
    /// Failures recorded since the key was last fresh.
    pub failures: u64,
    /// The key is blocked before this instant.
    pub blocked_until: Timestamp,
    /// The last recorded failure.
    pub last_failure: Timestamp,
}

impl ProgressiveDelayState {
    /// Records `failures` failures at `now` (0 counts as 1).
    pub fn acquire(&mut self, now: Timestamp, p: &ProgressiveDelay, failures: u64) -> Decision {
        self.decide(now, p, failures.max(1))
    }

    /// Whether the key is blocked at `now`; records nothing (a forgotten
    /// key is made fresh, which changes no answer).
    pub fn peek(&mut self, now: Timestamp, p: &ProgressiveDelay) -> Decision {
        self.decide(now, p, 0)
    }

    fn decide(&mut self, now: Timestamp, p: &ProgressiveDelay, failures: u64) -> Decision {
        if self.failures > 0 && self.expires_at(p) <= now {
            *self = Self::default();
        }
        if failures > 0 {
            self.failures = self.failures.saturating_add(failures);
            self.last_failure = now;
            let delay = p.delay_micros(self.failures);
            if delay > 0 {
                self.blocked_until = self.blocked_until.max(now + delay);
            }
        }
        let allowed = now >= self.blocked_until;
        let retry = self.blocked_until.saturating_sub(now);
        let reset = self.expires_at(p).saturating_sub(now);
        let remaining = p.free_attempts().saturating_sub(self.failures);
        Decision::from_micros(allowed, p.free_attempts(), remaining, retry, reset)
    }

    /// When this state becomes equal to a fresh key's.
    pub fn expires_at(&self, p: &ProgressiveDelay) -> Timestamp {
        if self.failures == 0 {
            return 0;
        }
        (self.last_failure + p.forget_after_micros()).max(self.blocked_until)
    }
}

/// The state of one key under any strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// See [`TokenBucketState`].
    TokenBucket(TokenBucketState),
    /// See [`SlidingWindowState`].
    SlidingWindow(SlidingWindowState),
    /// See [`ProgressiveDelayState`].
    ProgressiveDelay(ProgressiveDelayState),
    /// See [`CompositeState`].
    Composite(CompositeState),
}

impl State {
    /// A fresh key's state under `policy`.
    pub fn fresh(policy: &Policy) -> Self {
        match policy {
            Policy::TokenBucket(_) => Self::TokenBucket(TokenBucketState::default()),
            Policy::SlidingWindow(_) => Self::SlidingWindow(SlidingWindowState::default()),
            Policy::ProgressiveDelay(_) => Self::ProgressiveDelay(ProgressiveDelayState::default()),
            Policy::Composite(_) => Self::Composite(CompositeState::default()),
        }
    }

    /// Applies `op` at `now` under `policy`.
    ///
    /// A state of another strategy than the policy's (the policy was
    /// replaced by one of a different kind) counts as fresh. The decision
    /// carries the policy's [window](Decision::window).
    pub fn apply(&mut self, now: Timestamp, policy: &Policy, op: Op) -> Decision {
        if op == Op::Reset {
            *self = Self::fresh(policy);
            return self.apply(now, policy, Op::PEEK);
        }
        let decision = match (&mut *self, policy, op) {
            (Self::TokenBucket(s), Policy::TokenBucket(p), Op::Acquire(c)) => s.acquire(now, p, c),
            (Self::TokenBucket(s), Policy::TokenBucket(p), Op::Peek(c)) => s.peek(now, p, c),
            (Self::TokenBucket(s), Policy::TokenBucket(p), _) => s.peek(now, p, 1),
            (Self::SlidingWindow(s), Policy::SlidingWindow(p), Op::Acquire(c)) => {
                s.acquire(now, p, c)
            }
            (Self::SlidingWindow(s), Policy::SlidingWindow(p), Op::Peek(c)) => s.peek(now, p, c),
            (Self::SlidingWindow(s), Policy::SlidingWindow(p), Op::Penalise(n)) => {
                s.penalise(now, p, n)
            }
            (Self::SlidingWindow(s), Policy::SlidingWindow(p), Op::Reset) => s.peek(now, p, 1),
            (Self::ProgressiveDelay(s), Policy::ProgressiveDelay(p), Op::Acquire(c)) => {
                s.acquire(now, p, c)
            }
            (Self::ProgressiveDelay(s), Policy::ProgressiveDelay(p), _) => s.peek(now, p),
            // The parts' decisions carry their own windows.
            (Self::Composite(s), Policy::Composite(c), op) => return s.apply(now, c, op),
            _ => {
                *self = Self::fresh(policy);
                return self.apply(now, policy, op);
            }
        };
        decision.with_window(window_of(policy))
    }

    /// When this state becomes equal to a fresh key's under `policy`: a
    /// stored key may be dropped from then on (its TTL).
    pub fn expires_at(&self, policy: &Policy) -> Timestamp {
        match (self, policy) {
            (Self::TokenBucket(s), _) => s.expires_at(),
            (Self::SlidingWindow(s), Policy::SlidingWindow(p)) => s.expires_at(p),
            (Self::ProgressiveDelay(s), Policy::ProgressiveDelay(p)) => s.expires_at(p),
            (Self::Composite(s), Policy::Composite(c)) => s.expires_at(c),
            _ => 0,
        }
    }
}

/// Whether `op`, answered with `decision` under `policy`, recorded
/// something in the key's state (tokens taken, an event logged, a failure
/// counted). Only such writes set a key's expiry: reads and refusals leave
/// it as it was.
pub fn records(policy: &Policy, op: Op, decision: &Decision) -> bool {
    if decision.is_impossible() {
        return false;
    }
    match (op, policy) {
        (Op::Peek(_) | Op::Reset, _) => false,
        (Op::Penalise(n), Policy::SlidingWindow(p)) => n > 0 && p.penalises_refused(),
        (Op::Penalise(_), _) => false,
        (Op::Acquire(_), Policy::TokenBucket(_)) => decision.is_allowed(),
        (Op::Acquire(_), Policy::SlidingWindow(p)) => {
            decision.is_allowed() || p.penalises_refused()
        }
        (Op::Acquire(_), Policy::ProgressiveDelay(_)) => true,
        // Every part is charged, or none.
        (Op::Acquire(_), Policy::Composite(_)) => decision.is_allowed(),
    }
}

/// The span `policy`'s limit is expressed over, as the backends compute it
/// (whole microseconds): what a [`Decision::window`] carries.
pub fn window_of(policy: &Policy) -> std::time::Duration {
    let us = match policy {
        Policy::TokenBucket(p) => p.capacity() * p.interval_micros(),
        Policy::SlidingWindow(p) => p.window_micros(),
        Policy::ProgressiveDelay(p) => p.forget_after_micros(),
        Policy::Composite(c) => return c.window(),
    };
    std::time::Duration::from_micros(us)
}

/// One stored key: its state and the instant it expires.
///
/// This is how every backend stores a key. The expiry (a Redis TTL) is set,
/// under the policy in force, whenever a request [`records`] something; from
/// then on the key reads as fresh. With an unchanged policy the expiry is
/// exactly when the state becomes equal to a fresh key's, so it changes no
/// verdict; when an override changes the policy mid-life, the expiry set by
/// the last write still rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The key's state.
    pub state: State,
    /// The key reads as fresh from this instant on.
    pub expires_at: Timestamp,
}

impl Slot {
    /// A fresh key under `policy`.
    pub fn fresh(policy: &Policy) -> Self {
        Self {
            state: State::fresh(policy),
            expires_at: 0,
        }
    }

    /// Applies `op` at `now` under `policy`.
    pub fn apply(&mut self, now: Timestamp, policy: &Policy, op: Op) -> Decision {
        if self.expires_at <= now {
            self.state = State::fresh(policy);
            self.expires_at = 0;
        }
        let decision = self.state.apply(now, policy, op);
        if op == Op::Reset {
            self.expires_at = 0;
        } else if records(policy, op, &decision) {
            self.expires_at = self.state.expires_at(policy);
        }
        decision
    }

    /// Whether the key still holds state at `now` (a backend may drop it
    /// otherwise).
    pub fn is_live(&self, now: Timestamp) -> bool {
        self.expires_at > now
    }
}

/// The reference model for a whole key space: what an ideal backend
/// answers, runtime overrides included. The conformance suite replays
/// random traces through it and through a backend, and compares every
/// decision.
#[derive(Debug, Clone, Default)]
pub struct Model {
    keys: std::collections::HashMap<(String, String), Slot>,
    limiter_overrides: std::collections::HashMap<String, Policy>,
    key_overrides: std::collections::HashMap<(String, String), Policy>,
}

impl Model {
    /// An empty model.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies `op` to `key` of `limiter` at `now`; `policy` is the
    /// limiter's configured policy, which overrides take precedence over.
    pub fn apply(
        &mut self,
        limiter: &str,
        key: &str,
        now: Timestamp,
        policy: &Policy,
        op: Op,
    ) -> Decision {
        let k = (limiter.to_owned(), key.to_owned());
        let policy = *self
            .key_overrides
            .get(&k)
            .or_else(|| self.limiter_overrides.get(limiter))
            .unwrap_or(policy);
        self.keys
            .entry(k)
            .or_insert_with(|| Slot::fresh(&policy))
            .apply(now, &policy, op)
    }

    /// Sets or clears an override for a limiter (`key = None`) or one key.
    pub fn set_override(&mut self, limiter: &str, key: Option<&str>, policy: Option<Policy>) {
        match (key, policy) {
            (Some(k), Some(p)) => {
                self.key_overrides
                    .insert((limiter.to_owned(), k.to_owned()), p);
            }
            (Some(k), None) => {
                self.key_overrides
                    .remove(&(limiter.to_owned(), k.to_owned()));
            }
            (None, Some(p)) => {
                self.limiter_overrides.insert(limiter.to_owned(), p);
            }
            (None, None) => {
                self.limiter_overrides.remove(limiter);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const S: u64 = 1_000_000;

    #[test]
    fn token_bucket_bursts_then_refills() {
        let p = TokenBucket::new(3, 1, Duration::from_secs(1)).unwrap();
        let mut s = TokenBucketState::default();
        let now = 1_000 * S;
        for left in [2, 1, 0] {
            let d = s.acquire(now, &p, 1);
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), left);
        }
        let d = s.acquire(now, &p, 1);
        assert!(d.is_denied());
        assert_eq!(d.retry_after(), Duration::from_secs(1));
        assert_eq!(d.reset_after(), Duration::from_secs(3));
        // A refused request consumed nothing: one token back after 1s.
        assert!(s.acquire(now + S, &p, 1).is_allowed());
        assert!(s.acquire(now + S, &p, 1).is_denied());
        // Tokens never exceed capacity.
        let d = s.peek(now + 100 * S, &p, 1);
        assert_eq!(d.remaining(), 3);
    }

    #[test]
    fn token_bucket_cost_waits_for_enough_tokens() {
        let p = TokenBucket::new(10, 1, Duration::from_secs(1)).unwrap();
        let mut s = TokenBucketState::default();
        assert!(s.acquire(0, &p, 8).is_allowed());
        let d = s.acquire(0, &p, 5);
        assert!(d.is_denied());
        assert_eq!(d.remaining(), 2);
        assert_eq!(d.retry_after(), Duration::from_secs(3));
    }

    #[test]
    fn sliding_window_is_exact() {
        let p = SlidingWindow::new(3, Duration::from_secs(10)).unwrap();
        let mut s = SlidingWindowState::default();
        assert!(s.acquire(0, &p, 1).is_allowed());
        assert!(s.acquire(2 * S, &p, 1).is_allowed());
        assert!(s.acquire(4 * S, &p, 1).is_allowed());
        let d = s.acquire(5 * S, &p, 1);
        assert!(d.is_denied());
        // The first event leaves the window at t=10s.
        assert_eq!(d.retry_after(), Duration::from_secs(5));
        assert!(s.acquire(10 * S - 1, &p, 1).is_denied());
        assert!(s.acquire(10 * S, &p, 1).is_allowed());
        // Cost 2 needs the events at 2s and 4s gone: at 14s.
        let d = s.acquire(10 * S, &p, 2);
        assert_eq!(d.retry_after(), Duration::from_secs(4));
    }

    #[test]
    fn sliding_window_penalises_when_asked() {
        let p = SlidingWindow::new(1, Duration::from_secs(10))
            .unwrap()
            .penalise_refused(true);
        let mut s = SlidingWindowState::default();
        assert!(s.acquire(0, &p, 1).is_allowed());
        assert!(s.acquire(9 * S, &p, 1).is_denied());
        // Without the penalty this would pass at 10s; the refused hits at
        // 9s and 10s are recorded too, so a quiet client passes at 20s.
        let d = s.acquire(10 * S, &p, 1);
        assert!(d.is_denied());
        assert_eq!(d.retry_after(), Duration::from_secs(10));
        assert!(s.acquire(20 * S, &p, 1).is_allowed());
    }

    #[test]
    fn progressive_delay_blocks_then_forgets() {
        let p = ProgressiveDelay::new(
            2,
            Duration::from_secs(1),
            2,
            Duration::from_secs(60),
            Duration::from_secs(600),
        )
        .unwrap();
        let mut s = ProgressiveDelayState::default();
        assert!(s.acquire(0, &p, 1).is_allowed());
        assert!(s.acquire(0, &p, 1).is_allowed());
        let d = s.acquire(0, &p, 1);
        assert!(d.is_denied());
        assert_eq!(d.retry_after(), Duration::from_secs(1));
        let d = s.acquire(S, &p, 1);
        assert_eq!(d.retry_after(), Duration::from_secs(2));
        assert!(s.peek(3 * S, &p).is_allowed());
        // Forgotten 600s after the last failure.
        assert_eq!(s.peek(601 * S, &p).remaining(), 2);
        assert_eq!(s.failures, 0);
    }

    #[test]
    fn reset_makes_a_fresh_key() {
        let p = Policy::from(TokenBucket::new(1, 1, Duration::from_secs(60)).unwrap());
        let mut s = State::fresh(&p);
        assert!(s.apply(0, &p, Op::Acquire(1)).is_allowed());
        assert!(s.apply(0, &p, Op::Acquire(1)).is_denied());
        assert!(s.apply(0, &p, Op::Reset).is_allowed());
        assert!(s.apply(0, &p, Op::Acquire(1)).is_allowed());
    }
}
