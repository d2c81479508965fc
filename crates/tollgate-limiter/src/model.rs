//! The reference model: each strategy as a pure function of
//! (state, now, policy, operation).
//!
//! The memory backend runs these functions directly; the Redis Lua scripts
//! implement the same arithmetic (integer microseconds, in the same order),
//! and the conformance suite checks every backend against them decision by
//! decision. Read this module to know exactly what a limiter does.

use crate::decision::Decision;
use crate::policy::{Policy, Strategy};
use crate::time::Timestamp;

pub use crate::strategy::calendar::CalendarState;
pub use crate::strategy::composite::CompositeState;
pub use crate::strategy::concurrency::ConcurrencyState;
pub use crate::strategy::progressive_delay::ProgressiveDelayState;
pub use crate::strategy::reservation::{Mark, Receipt, SETTLED_FOR, SETTLED_MAX, Settled};
pub use crate::strategy::sliding_window::SlidingWindowState;
pub use crate::strategy::token_bucket::TokenBucketState;

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
    /// Settle a reservation (see [`Slot::reserve`] and
    /// [reservations](crate::strategy::reservation)) whose real cost was
    /// `actual`: refund the unused units still held, or charge the excess
    /// (under a progressive delay, the units are failures: see
    /// [`ProgressiveDelayState::settle`]). Answers as `Peek(1)` would
    /// afterwards.
    ///
    /// A settle whose [`Receipt::id`] the key remembers is a replay: it
    /// changes nothing and answers as `Peek(1)` (see [`Slot::settled`]);
    /// one whose `actual` is its units changes nothing either way, and is
    /// not remembered. A
    /// receipt with id 0 is settled every time, refunding (or charging)
    /// again within what the state still holds.
    /// [`Reservation::settle`](crate::Reservation::settle) consumes its
    /// reservation, so a `Limiter` cannot settle one twice.
    Settle {
        /// What the reservation took, as its backend reported it.
        receipt: Receipt,
        /// The real cost (0 refunds the whole reservation).
        actual: u64,
    },
    /// Take the [concurrency](crate::Concurrency) slot of this id (drawn at
    /// random by the caller), or renew its lease if the key holds it
    /// already. Under any other policy: answers as `Peek(1)`, records
    /// nothing.
    Hold(u64),
    /// Give back the [concurrency](crate::Concurrency) slot of this id (if
    /// the key holds it); answers as `Peek(1)` would afterwards. Under any
    /// other policy: answers as `Peek(1)`, records nothing.
    Release(u64),
    /// [`Release`](Self::Release), by a caller that does not know whether
    /// its hold (or renewal) of this id landed, or will land, after this:
    /// it gave up waiting for the answer, or the answer was lost (and a
    /// cluster client may send the call again). The id is remembered for
    /// one lease, and a hold of it is refused meanwhile: a late hold takes
    /// nothing (see [`concurrency`](crate::concurrency)). Under any other
    /// policy: answers as `Peek(1)`, records nothing.
    Withdraw(u64),
}

impl Op {
    /// Looks whether one unit would fit, without consuming.
    pub const PEEK: Op = Op::Peek(1);
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
    /// See [`CalendarState`].
    Calendar(CalendarState),
    /// See [`ConcurrencyState`].
    Concurrency(ConcurrencyState),
}

impl State {
    /// A fresh key's state under `policy`.
    #[inline]
    pub fn fresh(policy: &Policy) -> Self {
        match policy {
            Policy::TokenBucket(_) => Self::TokenBucket(TokenBucketState::default()),
            Policy::SlidingWindow(_) => Self::SlidingWindow(SlidingWindowState::default()),
            Policy::ProgressiveDelay(_) => Self::ProgressiveDelay(ProgressiveDelayState::default()),
            Policy::Composite(_) => Self::Composite(CompositeState::default()),
            Policy::Calendar(_) => Self::Calendar(CalendarState::default()),
            Policy::Concurrency(_) => Self::Concurrency(ConcurrencyState::default()),
        }
    }

    /// Applies `op` at `now` under `policy`.
    ///
    /// A state of another strategy than the policy's (the policy was
    /// replaced by one of a different kind) counts as fresh. The decision
    /// carries the policy's [window](Decision::window).
    #[inline]
    pub fn apply(&mut self, now: Timestamp, policy: &Policy, op: Op) -> Decision {
        if op == Op::Reset {
            *self = Self::fresh(policy);
            return self.apply(now, policy, Op::PEEK);
        }
        let decision = match (&mut *self, policy, op) {
            (Self::TokenBucket(s), Policy::TokenBucket(p), Op::Acquire(c)) => s.acquire(now, p, c),
            (Self::TokenBucket(s), Policy::TokenBucket(p), Op::Peek(c)) => s.peek(now, p, c),
            (Self::TokenBucket(s), Policy::TokenBucket(p), Op::Settle { receipt, actual }) => {
                s.settle(now, p, receipt.marks[0], receipt.units, actual)
            }
            (Self::TokenBucket(s), Policy::TokenBucket(p), _) => s.peek(now, p, 1),
            (Self::SlidingWindow(s), Policy::SlidingWindow(p), Op::Acquire(c)) => {
                s.acquire(now, p, c)
            }
            (Self::SlidingWindow(s), Policy::SlidingWindow(p), Op::Peek(c)) => s.peek(now, p, c),
            (Self::SlidingWindow(s), Policy::SlidingWindow(p), Op::Penalise(n)) => {
                s.penalise(now, p, n)
            }
            (Self::SlidingWindow(s), Policy::SlidingWindow(p), Op::Settle { receipt, actual }) => {
                s.settle(now, p, receipt.marks[0], receipt.units, actual)
            }
            (Self::SlidingWindow(s), Policy::SlidingWindow(p), _) => s.peek(now, p, 1),
            (Self::ProgressiveDelay(s), Policy::ProgressiveDelay(p), Op::Acquire(c)) => {
                s.acquire(now, p, c)
            }
            (
                Self::ProgressiveDelay(s),
                Policy::ProgressiveDelay(p),
                Op::Settle { receipt, actual },
            ) => s.settle(now, p, receipt.marks[0], receipt.units, actual),
            (Self::ProgressiveDelay(s), Policy::ProgressiveDelay(p), _) => s.peek(now, p),
            // The parts' decisions carry their own windows.
            (Self::Composite(s), Policy::Composite(c), op) => return s.apply(now, c, op),
            // The current window's length, which daylight saving and
            // months vary.
            (Self::Calendar(s), Policy::Calendar(p), Op::Acquire(c)) => {
                return s.acquire(now, p, c);
            }
            (Self::Calendar(s), Policy::Calendar(p), Op::Peek(c)) => return s.peek(now, p, c),
            (Self::Calendar(s), Policy::Calendar(p), Op::Settle { receipt, actual }) => {
                return s.settle(now, p, receipt.marks[0], receipt.units, actual);
            }
            (Self::Calendar(s), Policy::Calendar(p), _) => return s.peek(now, p, 1),
            (Self::Concurrency(s), Policy::Concurrency(p), op) => s.apply(now, p, op),
            _ => {
                *self = Self::fresh(policy);
                return self.apply(now, policy, op);
            }
        };
        decision.with_window_micros(policy.window_micros())
    }

    /// Where the last charge, made under `policy`, sits (see
    /// [`Receipt`]): the first part of a token bucket, a sliding window or
    /// a calendar quota; each part of a composite.
    pub fn marks(&self, policy: &Policy) -> [Option<Mark>; crate::composite::MAX_PARTS] {
        match (self, policy) {
            (Self::Composite(c), Policy::Composite(p)) => c.marks(p),
            (other, _) => {
                let mut marks = [None; crate::composite::MAX_PARTS];
                marks[0] = other.mark(policy);
                marks
            }
        }
    }

    /// A reservation was just charged at `now`: a token bucket's life (each
    /// token-bucket part's, in a composite) is named by its first one (see
    /// [`TokenBucketState::born`]).
    pub(crate) fn reserved(&mut self, now: Timestamp) {
        match self {
            Self::TokenBucket(s) => s.reserved(now),
            Self::Composite(c) => c.parts.iter_mut().for_each(|p| p.reserved(now)),
            _ => {}
        }
    }

    /// Where the last charge of a single policy, made under `policy`, sits.
    pub(crate) fn mark(&self, policy: &Policy) -> Option<Mark> {
        match self {
            Self::TokenBucket(s) => Some(s.mark(match policy {
                Policy::TokenBucket(b) => b.interval_micros(),
                // Not the policy it was charged under: counted at the
                // interval in force when settled.
                _ => 0,
            })),
            Self::SlidingWindow(s) => s.mark(),
            Self::Calendar(s) => Some(s.mark()),
            Self::ProgressiveDelay(s) => Some(s.mark()),
            _ => None,
        }
    }

    /// When this state becomes equal to a fresh key's under `policy`: a
    /// stored key may be dropped from then on (its TTL).
    #[inline]
    pub fn expires_at(&self, policy: &Policy) -> Timestamp {
        match (self, policy) {
            (Self::TokenBucket(s), _) => s.expires_at(),
            (Self::SlidingWindow(s), Policy::SlidingWindow(p)) => s.expires_at(p),
            (Self::ProgressiveDelay(s), Policy::ProgressiveDelay(p)) => s.expires_at(p),
            (Self::Composite(s), Policy::Composite(c)) => s.expires_at(c),
            (Self::Calendar(s), _) => s.expires_at(),
            (Self::Concurrency(s), _) => s.expires_at(),
            _ => 0,
        }
    }
}

/// Whether `op`, answered with `decision` under `policy`, recorded
/// something in the key's state (tokens taken, an event logged, a failure
/// counted). Only such writes set a key's expiry: reads and refusals leave
/// it as it was.
#[inline]
pub fn records(policy: &Policy, op: Op, decision: &Decision) -> bool {
    if decision.is_impossible() {
        return false;
    }
    match (op, policy) {
        (Op::Peek(_) | Op::Reset, _) => false,
        // Taking, renewing or giving back a slot; any other operation only
        // looks at a concurrency limit.
        (Op::Hold(_), Policy::Concurrency(_)) => decision.is_allowed(),
        (Op::Release(_) | Op::Withdraw(_), Policy::Concurrency(_)) => true,
        (Op::Hold(_) | Op::Release(_) | Op::Withdraw(_), _) => false,
        (_, Policy::Concurrency(_)) => false,
        // A refund or an excess: the expiry follows the state either way.
        (Op::Settle { .. }, _) => true,
        (Op::Penalise(n), Policy::SlidingWindow(p)) => n > 0 && p.penalises_refused(),
        (Op::Penalise(_), _) => false,
        (Op::Acquire(_), Policy::TokenBucket(_)) => decision.is_allowed(),
        (Op::Acquire(_), Policy::SlidingWindow(p)) => {
            decision.is_allowed() || p.penalises_refused()
        }
        (Op::Acquire(_), Policy::ProgressiveDelay(_)) => true,
        // Every part is charged, or none.
        (Op::Acquire(_), Policy::Composite(_)) => decision.is_allowed(),
        (Op::Acquire(_), Policy::Calendar(_)) => decision.is_allowed(),
    }
}

/// The policy in force for a key of a limiter configured with `configured`,
/// whose own override is `key` and whose limiter's is `limiter`: the key's
/// override, else the limiter's, else the configured policy.
///
/// `None`, no policy, when either override lies across the concurrency
/// boundary from the configured policy (a [concurrency](crate::Concurrency)
/// override of a rate limiter, or a rate override of a concurrency
/// limiter): its operations are not the configured policy's (a hold under
/// a token bucket, an acquire under a concurrency limit, only look), so
/// enforcing it would admit every request. A limiter-wide one is no policy
/// for every key of the limiter, its own override or not, as a Redis
/// limiter-wide override that does not decode. A backend fails such a
/// decision with its "invalid policy" error
/// ([`ErrorReason::InvalidPolicy`](crate::ErrorReason::InvalidPolicy)): the
/// limiter's fail mode answers it, and its breaker does not count it.
/// Overrides from one rate strategy to another (token bucket, sliding
/// window, calendar quota, composite, progressive delay) are in force.
#[inline]
pub fn in_force<'a>(
    configured: &'a Policy,
    key: Option<&'a Policy>,
    limiter: Option<&'a Policy>,
) -> Option<&'a Policy> {
    let across = |o: Option<&Policy>| {
        o.is_some_and(|o| across_concurrency_boundary(configured.strategy(), o.strategy()))
    };
    if across(key) || across(limiter) {
        return None;
    }
    Some(key.or(limiter).unwrap_or(configured))
}

/// Whether a policy of strategy `in_force` lies across the concurrency
/// boundary from a limiter configured with one of strategy `configured`:
/// then it is no policy (see [`in_force`]). For a backend that learns the
/// strategy in force without the policy (a script's redirect).
#[inline]
pub fn across_concurrency_boundary(configured: Strategy, in_force: Strategy) -> bool {
    (configured == Strategy::Concurrency) != (in_force == Strategy::Concurrency)
}

/// What [`Slot::apply`] answers to an [`Op::Acquire`] of `cost` under the
/// token bucket `p`, for a key in the token-bucket state whose arrival time
/// is `tat` and whose expiry is `tat` (as every admitted charge leaves it),
/// with the arrival time after the charge when it is admitted (the state's
/// `born` then becomes `now` if `tat <= now`: a new life).
///
/// For a backend that keeps a bucket's arrival time in one atomic word and
/// swaps it; everything else goes through [`Slot::apply`].
#[inline]
pub fn charge_bucket(
    tat: Timestamp,
    now: Timestamp,
    p: &crate::policy::TokenBucket,
    cost: u64,
) -> (Decision, Option<Timestamp>) {
    let (decision, tat) = TokenBucketState::charge(tat, now, p, cost);
    (decision.with_window_micros(p.window_micros()), tat)
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
    /// The settles (by [`Receipt::id`]) the key refuses to apply again,
    /// each for [`SETTLED_FOR`] after the first, the latest
    /// [`SETTLED_MAX`] at most: beside the state, kept
    /// through its expiry and resets (Redis: a key of their own, see
    /// [reservations](crate::strategy::reservation)).
    pub settled: Settled,
}

impl Slot {
    /// A fresh key under `policy`.
    #[inline]
    pub fn fresh(policy: &Policy) -> Self {
        Self {
            state: State::fresh(policy),
            expires_at: 0,
            settled: Settled::default(),
        }
    }

    /// Applies `op` at `now` under `policy`.
    #[inline]
    pub fn apply(&mut self, now: Timestamp, policy: &Policy, op: Op) -> Decision {
        // The common case, a token bucket's charge, dispatched at once: the
        // same steps as below (expiry, `State::apply`, `records`), for
        // one strategy and one operation.
        if let (State::TokenBucket(s), Policy::TokenBucket(p), Op::Acquire(cost)) =
            (&mut self.state, policy, op)
        {
            if self.expires_at <= now {
                *s = TokenBucketState::default();
                self.expires_at = 0;
            }
            let decision = s.acquire(now, p, cost);
            // `records`: an admitted charge (an impossible cost never is).
            if decision.is_allowed() {
                self.expires_at = s.expires_at();
            }
            return decision.with_window_micros(policy.window_micros());
        }
        // A replayed settle (after the common case: it costs a charge
        // nothing). One at the estimate changes nothing: not remembered.
        if let Op::Settle { receipt, actual } = op
            && actual != receipt.units
            && self.settled.replayed(receipt.id, now)
        {
            return self.apply(now, policy, Op::PEEK);
        }
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

    /// Reserves `units` at `now` under `policy` (see
    /// [reservations](crate::strategy::reservation)): exactly an
    /// [`Op::Acquire`] of `units`, answered with the [`Receipt`] a later
    /// [`Op::Settle`] needs ([`Receipt::NONE`] when refused). Under a
    /// progressive delay, [`ProgressiveDelayState::reserve`]: a blocked key
    /// refuses and records nothing, a free one records the failures and
    /// allows.
    pub fn reserve(&mut self, now: Timestamp, policy: &Policy, units: u64) -> (Decision, Receipt) {
        let decision = match policy {
            Policy::ProgressiveDelay(p) => {
                // An expired key, or another strategy's state, is fresh.
                let mut s = match &self.state {
                    State::ProgressiveDelay(s) if self.expires_at > now => *s,
                    _ => ProgressiveDelayState::default(),
                };
                let decision = s.reserve(now, p, units);
                // Refused: the key is blocked, its state live and kept.
                if decision.is_allowed() {
                    self.state = State::ProgressiveDelay(s);
                    self.expires_at = s.expires_at(p);
                }
                decision.with_window_micros(policy.window_micros())
            }
            _ => self.apply(now, policy, Op::Acquire(units)),
        };
        if !decision.is_allowed() {
            return (decision, Receipt::NONE);
        }
        self.state.reserved(now);
        let receipt = Receipt {
            units: units.max(1),
            marks: self.state.marks(policy),
            // Backends answer none: the caller draws one.
            id: 0,
        };
        (decision, receipt)
    }

    /// Whether the key still holds state at `now` (a backend may drop it
    /// otherwise).
    #[inline]
    pub fn is_live(&self, now: Timestamp) -> bool {
        self.expires_at > now || self.settled.is_live(now)
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
    /// `None` when the override in force lies across the concurrency
    /// boundary (see [`in_force`]): no policy, a backend fails the
    /// decision, and the key's state is left as it was.
    pub fn apply(
        &mut self,
        limiter: &str,
        key: &str,
        now: Timestamp,
        policy: &Policy,
        op: Op,
    ) -> Option<Decision> {
        self.with_slot(limiter, key, policy, |slot, p| slot.apply(now, p, op))
    }

    /// Reserves `units` on `key` of `limiter` at `now` (see
    /// [`Slot::reserve`]); `None` as [`Model::apply`].
    pub fn reserve(
        &mut self,
        limiter: &str,
        key: &str,
        now: Timestamp,
        policy: &Policy,
        units: u64,
    ) -> Option<(Decision, Receipt)> {
        self.with_slot(limiter, key, policy, |slot, p| slot.reserve(now, p, units))
    }

    /// Runs `f` on the key's slot (a fresh one if new) under the policy in
    /// force ([`in_force`]); `None`, `f` not run, when there is none.
    fn with_slot<T>(
        &mut self,
        limiter: &str,
        key: &str,
        configured: &Policy,
        f: impl FnOnce(&mut Slot, &Policy) -> T,
    ) -> Option<T> {
        let k = (limiter.to_owned(), key.to_owned());
        let policy = *in_force(
            configured,
            self.key_overrides.get(&k),
            self.limiter_overrides.get(limiter),
        )?;
        let slot = self.keys.entry(k).or_insert_with(|| Slot::fresh(&policy));
        Some(f(slot, &policy))
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
    use crate::policy::{ProgressiveDelay, SlidingWindow, TokenBucket};
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
    fn an_override_across_the_concurrency_boundary_is_no_policy() {
        let bucket = Policy::from(TokenBucket::new(2, 1, Duration::from_secs(3600)).unwrap());
        let window = Policy::from(SlidingWindow::new(1, Duration::from_secs(60)).unwrap());
        let slots = Policy::from(crate::Concurrency::new(1, Duration::from_secs(60)).unwrap());
        assert_eq!(in_force(&bucket, None, None), Some(&bucket));
        assert_eq!(in_force(&bucket, None, Some(&window)), Some(&window));
        assert_eq!(in_force(&bucket, Some(&window), None), Some(&window));
        assert_eq!(in_force(&slots, Some(&slots), None), Some(&slots));
        assert_eq!(in_force(&bucket, Some(&slots), None), None);
        assert_eq!(in_force(&bucket, None, Some(&slots)), None);
        assert_eq!(in_force(&slots, Some(&bucket), None), None);
        assert_eq!(in_force(&slots, None, Some(&bucket)), None);
        // A limiter-wide one is no policy for a key with its own, too.
        assert_eq!(in_force(&bucket, Some(&window), Some(&slots)), None);
        let mut m = Model::new();
        for scope in [Some("k"), None] {
            m.set_override("l", scope, Some(slots));
            assert_eq!(m.apply("l", "k", 0, &bucket, Op::Acquire(1)), None);
            assert_eq!(m.reserve("l", "k", 0, &bucket, 1), None);
            m.set_override("l", scope, None);
            m.set_override("c", scope, Some(bucket));
            assert_eq!(m.apply("c", "k", 0, &slots, Op::Hold(1)), None);
            m.set_override("c", scope, None);
        }
        // Cleared: the configured policies, nothing charged meanwhile.
        let steps = [
            ("l", &bucket, Op::Acquire(1), true),
            ("l", &bucket, Op::Acquire(1), true),
            ("l", &bucket, Op::Acquire(1), false),
            ("c", &slots, Op::Hold(1), true),
            ("c", &slots, Op::Hold(2), false),
        ];
        for (limiter, policy, op, allowed) in steps {
            let d = m.apply(limiter, "k", 0, policy, op).unwrap();
            assert_eq!(d.is_allowed(), allowed, "{limiter} {op:?}");
        }
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
