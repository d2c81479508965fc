//! Concurrency limits: at most `max_in_flight` requests of one key running
//! at once, across every worker sharing the backend.
//!
//! A request takes a *slot* ([`Op::Hold`] with a slot id
//! the caller draws at random) in its decision's round trip, and gives it
//! back ([`Op::Release`]) when it ends. Each slot is a
//! lease: it expires `lease` after it was taken (or last renewed, by holding
//! the same id again), so the slots of a worker that died, or whose release
//! was lost, come back by themselves. Choose `lease` above the longest
//! request, or renew long ones ([`Permit::renew`](crate::Permit::renew), or
//! in the background with [`Permit::keep_alive`](crate::Permit::keep_alive),
//! as the tower layers do): a slot that expires while its request still
//! runs lets one more in.
//!
//! # What a concurrency limit answers
//!
//! * `limit` is `max_in_flight`, `remaining` the free slots after the
//!   decision;
//! * a refusal's retry-after is the time until the earliest lease expires,
//!   capped at [`RETRY_CAP`] (1 s): a slot is usually released when its
//!   request ends, long before its lease runs out, so a longer hint would
//!   only slow a well-behaved client down;
//! * `reset_after` is the time until the last lease expires (every slot
//!   free even if no holder releases);
//! * the window ([`Decision::window`]) is the lease.
//!
//! # A hold that lands after its caller gave up
//!
//! A caller that gives up a hold before its answer (a timeout, its future
//! dropped), or whose answer was lost, gives the slot back at once, on
//! another connection: the hold may still be queued (a Redis stalled by a
//! fork or an fsync), or be sent again (a cluster client re-sends a call
//! whose connection broke), and land after it. So that caller sends
//! [`Op::Withdraw`], not [`Op::Release`]: it frees the slot if it is held,
//! and remembers the id for one lease, during which a hold of it is
//! refused. A late hold takes nothing, instead of a slot nobody would give
//! back before its lease ran out. (The same for a renewal with no answer:
//! a [`Permit`](crate::Permit) withdraws it.) A refused hold's retry-after
//! is the time until the id is forgotten, capped as above. At most
//! [`WITHDRAWN_MAX`] ids are remembered (the earliest to be forgotten go
//! first), so a key's memory stays bounded whatever its clients do. A
//! release, the common case, remembers nothing and costs nothing more.
//!
//! Cost plays no part: one request holds one slot. [`Op::Acquire`] and
//! [`Op::Peek`] look without taking a slot (a [`Limiter`](crate::Limiter)
//! takes slots through [`Limiter::hold`](crate::Limiter::hold), and
//! [`check`](crate::Limiter::check) holds one that only its lease frees);
//! [`Op::Penalise`] records nothing; [`Op::Reset`] frees every slot.
//!
//! The work of a decision is bounded by the slots the key holds, so by
//! `max_in_flight`, never by how many requests a client sends.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tollgate_limiter::{model::{Op, State}, Concurrency, Policy};
//!
//! let policy = Policy::from(Concurrency::new(2, Duration::from_secs(30))?);
//! let mut key = State::fresh(&policy);
//! assert!(key.apply(0, &policy, Op::Hold(1)).is_allowed());
//! assert!(key.apply(0, &policy, Op::Hold(2)).is_allowed());
//! let refused = key.apply(0, &policy, Op::Hold(3));
//! assert!(refused.is_denied());
//! assert_eq!(refused.retry_after(), Duration::from_secs(1));
//! // The first request ends: its slot is free again.
//! key.apply(0, &policy, Op::Release(1));
//! assert!(key.apply(0, &policy, Op::Hold(3)).is_allowed());
//! // A dead worker's slot comes back when its lease expires.
//! assert!(key.apply(30_000_000, &policy, Op::Hold(4)).is_allowed());
//! # Ok::<(), tollgate_limiter::PolicyError>(())
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use crate::decision::Decision;
use crate::model::Op;
use crate::policy::{PolicyError, span};
use crate::time::Timestamp;

/// The most slots one key may allow: bounds the work of a decision.
pub const MAX_IN_FLIGHT: u64 = 1_000_000;

/// The longest retry-after a refusal advises (see the [module docs](self)).
pub const RETRY_CAP: Duration = Duration::from_secs(1);

/// The most withdrawn ids a key remembers at once (see the
/// [module docs](self)).
pub const WITHDRAWN_MAX: usize = 1024;

const RETRY_CAP_US: u64 = 1_000_000;

/// At most `max_in_flight` requests of one key at once; each slot a lease
/// of `lease` (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Concurrency {
    max_in_flight: u64,
    lease: Duration,
    lease_us: u64,
}

impl Concurrency {
    /// At most `max_in_flight` requests in flight (1 to
    /// [`MAX_IN_FLIGHT`]), each slot expiring `lease` after it was taken or
    /// renewed.
    pub fn new(max_in_flight: u64, lease: Duration) -> Result<Self, PolicyError> {
        if max_in_flight == 0 {
            return Err(PolicyError::new("max_in_flight", "must be at least 1"));
        }
        if max_in_flight > MAX_IN_FLIGHT {
            return Err(PolicyError::new(
                "max_in_flight",
                format!("must be at most {MAX_IN_FLIGHT}"),
            ));
        }
        let lease_us = span("lease", lease)?;
        Ok(Self {
            max_in_flight,
            lease,
            lease_us,
        })
    }

    /// The most requests in flight.
    pub fn max_in_flight(&self) -> u64 {
        self.max_in_flight
    }

    /// How long a slot lives unless released or renewed.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// [`lease`](Self::lease) in microseconds.
    pub fn lease_micros(&self) -> u64 {
        self.lease_us
    }
}

/// State of one key under a concurrency limit: the slots held, by id, with
/// the instant each lease expires, and the ids withdrawn.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConcurrencyState {
    /// Slot id → lease expiry (µs). Expired slots may linger until the
    /// next decision drops them; they count for nothing.
    pub slots: BTreeMap<u64, Timestamp>,
    /// Ids withdrawn ([`Op::Withdraw`]) → when they are forgotten (µs): a
    /// hold of one is refused until then (see the [module docs](self)). At
    /// most [`WITHDRAWN_MAX`].
    pub withdrawn: BTreeMap<u64, Timestamp>,
}

impl ConcurrencyState {
    /// Applies `op` at `now` under `p`.
    pub fn apply(&mut self, now: Timestamp, p: &Concurrency, op: Op) -> Decision {
        // Expired leases free their slots first.
        self.slots.retain(|_, exp| *exp > now);
        self.withdrawn.retain(|_, until| *until > now);
        match op {
            Op::Hold(id) => {
                if let Some(&until) = self.withdrawn.get(&id) {
                    // Withdrawn first: this hold's caller is gone.
                    return self.reply(now, p, false, (until - now).min(RETRY_CAP_US));
                }
                if let Some(exp) = self.slots.get_mut(&id) {
                    // Holding a slot again renews its lease.
                    *exp = now + p.lease_us;
                } else if (self.slots.len() as u64) < p.max_in_flight {
                    self.slots.insert(id, now + p.lease_us);
                } else {
                    return self.answer(now, p, false);
                }
                self.answer(now, p, true)
            }
            Op::Release(id) => {
                self.slots.remove(&id);
                self.look(now, p)
            }
            Op::Withdraw(id) => {
                self.slots.remove(&id);
                self.remember_withdrawn(id, now + p.lease_us);
                self.look(now, p)
            }
            Op::Reset => {
                self.slots.clear();
                self.withdrawn.clear();
                self.look(now, p)
            }
            Op::Acquire(_) | Op::Peek(_) | Op::Penalise(_) | Op::Settle { .. } => self.look(now, p),
        }
    }

    /// Remembers `id`, withdrawn, until `until`; beyond
    /// [`WITHDRAWN_MAX`], the earliest to be forgotten goes (the smallest
    /// id among those forgotten at the same instant: a Redis sorted set's
    /// order, its members the ids in 20 digits).
    fn remember_withdrawn(&mut self, id: u64, until: Timestamp) {
        self.withdrawn.insert(id, until);
        if self.withdrawn.len() > WITHDRAWN_MAX
            && let Some((&first, _)) = self.withdrawn.iter().min_by_key(|(id, u)| (**u, **id))
        {
            self.withdrawn.remove(&first);
        }
    }

    /// Whether one more slot would be granted now, taking none.
    fn look(&self, now: Timestamp, p: &Concurrency) -> Decision {
        let free = (self.slots.len() as u64) < p.max_in_flight;
        self.answer(now, p, free)
    }

    fn answer(&self, now: Timestamp, p: &Concurrency, allowed: bool) -> Decision {
        let retry = match allowed {
            true => 0,
            false => self
                .slots
                .values()
                .min()
                .map_or(0, |e| e - now)
                .min(RETRY_CAP_US),
        };
        self.reply(now, p, allowed, retry)
    }

    fn reply(&self, now: Timestamp, p: &Concurrency, allowed: bool, retry: u64) -> Decision {
        let held = self.slots.len() as u64;
        let remaining = p.max_in_flight.saturating_sub(held);
        let reset = self.slots.values().max().map_or(0, |e| e - now);
        Decision::from_micros(allowed, p.max_in_flight, remaining, retry, reset)
    }

    /// When every lease has expired and every withdrawn id is forgotten
    /// (0 with neither).
    pub fn expires_at(&self) -> Timestamp {
        self.slots
            .values()
            .chain(self.withdrawn.values())
            .copied()
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn p(max: u64, lease_s: u64) -> Concurrency {
        Concurrency::new(max, Duration::from_secs(lease_s)).unwrap()
    }

    #[test]
    fn refuses_zero_and_huge_limits() {
        let l = Duration::from_secs(1);
        assert_eq!(Concurrency::new(0, l).unwrap_err().field, "max_in_flight");
        assert_eq!(
            Concurrency::new(MAX_IN_FLIGHT + 1, l).unwrap_err().field,
            "max_in_flight"
        );
        assert_eq!(
            Concurrency::new(1, Duration::ZERO).unwrap_err().field,
            "lease"
        );
    }

    #[test]
    fn holding_again_renews_and_never_takes_a_second_slot() {
        let p = p(2, 10);
        let mut s = ConcurrencyState::default();
        assert_eq!(s.apply(0, &p, Op::Hold(7)).remaining(), 1);
        let d = s.apply(5 * S, &p, Op::Hold(7));
        assert_eq!(
            (d.remaining(), d.reset_after()),
            (1, Duration::from_secs(10))
        );
        // Renewed at 5 s: still held at 12 s, gone at 15 s.
        assert_eq!(s.apply(12 * S, &p, Op::PEEK).remaining(), 1);
        assert_eq!(s.apply(15 * S, &p, Op::PEEK).remaining(), 2);
        assert_eq!(s.expires_at(), 0);
    }

    #[test]
    fn a_refusal_waits_for_the_first_lease_at_most_one_second() {
        let p = p(1, 10);
        let mut s = ConcurrencyState::default();
        assert!(s.apply(0, &p, Op::Hold(1)).is_allowed());
        let d = s.apply(S, &p, Op::Hold(2));
        assert!(d.is_denied());
        assert_eq!(d.retry_after(), RETRY_CAP);
        let d = s.apply(9 * S + S / 2, &p, Op::Hold(2));
        assert_eq!(d.retry_after(), Duration::from_millis(500));
        // Releasing an id not held frees no slot.
        assert!(s.apply(9 * S, &p, Op::Release(9)).is_denied());
        assert!(s.apply(9 * S, &p, Op::Release(1)).is_allowed());
        assert!(s.apply(9 * S, &p, Op::Hold(2)).is_allowed());
    }

    #[test]
    fn a_hold_that_lands_after_its_withdrawal_takes_nothing() {
        let p = p(1, 10);
        let mut s = ConcurrencyState::default();
        // Withdrawn before it was held (its caller gave up; the hold was
        // still on its way).
        assert!(s.apply(0, &p, Op::Withdraw(5)).is_allowed());
        let d = s.apply(S / 2, &p, Op::Hold(5));
        assert!(d.is_denied());
        assert_eq!((d.remaining(), d.retry_after()), (1, RETRY_CAP));
        // The slot is free for others.
        assert!(s.apply(S, &p, Op::Hold(6)).is_allowed());
        // Withdrawn while held (the hold landed first, and may be sent
        // again): the slot is freed, and the id barred too.
        assert!(s.apply(S, &p, Op::Withdraw(6)).is_allowed());
        assert!(s.apply(S, &p, Op::Hold(6)).is_denied());
        // A release remembers nothing, held or not: the id may hold again.
        assert!(s.apply(S, &p, Op::Hold(7)).is_allowed());
        assert!(s.apply(S, &p, Op::Release(7)).is_allowed());
        assert!(s.apply(S, &p, Op::Release(8)).is_allowed());
        assert!(s.apply(S, &p, Op::Hold(8)).is_allowed());
        assert!(s.apply(S, &p, Op::Release(8)).is_allowed());
        // Remembered for one lease from its withdrawal.
        let d = s.apply(9 * S + S / 2, &p, Op::Hold(5));
        assert_eq!(d.retry_after(), Duration::from_millis(500));
        assert_eq!(s.expires_at(), 11 * S);
        assert!(s.apply(10 * S, &p, Op::Hold(5)).is_allowed());
        // A reset forgets them too.
        s.apply(10 * S, &p, Op::Withdraw(9));
        s.apply(10 * S, &p, Op::Reset);
        assert!(s.apply(10 * S, &p, Op::Hold(9)).is_allowed());
    }

    #[test]
    fn remembers_at_most_withdrawn_max_ids_the_earliest_forgotten_first() {
        let p = p(1, 3600);
        let mut s = ConcurrencyState::default();
        let n = WITHDRAWN_MAX as u64 + 1;
        // Two withdrawn in the same microsecond: the smaller id goes first.
        s.apply(0, &p, Op::Withdraw(n + 1));
        for id in 1..n {
            s.apply(0, &p, Op::Withdraw(id));
        }
        assert_eq!(s.withdrawn.len(), WITHDRAWN_MAX);
        assert!(s.apply(1, &p, Op::Hold(1)).is_allowed(), "forgotten");
        s.apply(1, &p, Op::Release(1));
        assert!(s.apply(1, &p, Op::Hold(2)).is_denied(), "remembered");
        assert!(s.apply(1, &p, Op::Hold(n + 1)).is_denied(), "remembered");
    }

    proptest::proptest! {
        /// Never more live slots than the limit; a hold passes exactly when
        /// its id is not withdrawn, and is live already or a slot is free.
        #[test]
        fn never_more_than_max_in_flight(
            max in 1u64..5,
            steps in proptest::collection::vec((0u64..3_000_000, 0u64..8, 0u8..4), 1..100),
        ) {
            let p = Concurrency::new(max, Duration::from_secs(2)).unwrap();
            let mut s = ConcurrencyState::default();
            let mut now = 0;
            for (dt, id, kind) in steps {
                now += dt;
                let live = s.slots.iter().filter(|(_, e)| **e > now).count() as u64;
                let held = s.slots.get(&id).is_some_and(|e| *e > now);
                let withdrawn = s.withdrawn.get(&id).is_some_and(|u| *u > now);
                let op = match kind {
                    0 | 1 => Op::Hold(id),
                    2 => Op::Release(id),
                    _ => Op::Withdraw(id),
                };
                let d = s.apply(now, &p, op);
                match op {
                    Op::Hold(_) => proptest::prop_assert_eq!(
                        d.is_allowed(),
                        !withdrawn && (held || live < max)
                    ),
                    // A release changes what is remembered in nothing; a
                    // withdrawal remembers.
                    Op::Release(_) => proptest::prop_assert_eq!(s.withdrawn.contains_key(&id), withdrawn),
                    _ => proptest::prop_assert!(s.withdrawn.contains_key(&id)),
                }
                proptest::prop_assert!(!(s.slots.contains_key(&id) && s.withdrawn.contains_key(&id)));
                proptest::prop_assert!(s.slots.len() as u64 <= max);
                proptest::prop_assert_eq!(d.remaining(), max - s.slots.len() as u64);
            }
        }
    }
}
