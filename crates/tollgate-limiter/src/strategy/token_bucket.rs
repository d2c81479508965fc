//! Token bucket (GCRA): its policy and its state in the reference model.

use std::time::Duration;

use crate::decision::Decision;
use crate::policy::{MAX_SPAN_MICROS, PolicyError, span};
use crate::strategy::reservation::Mark;
use crate::time::Timestamp;

/// Token bucket: `capacity` is the peak burst, `refill` tokens per `period`
/// the average rate.
///
/// A new key starts full; a request takes `cost` tokens if there are enough
/// and is refused, consuming nothing, otherwise. It is implemented as GCRA
/// over whole microseconds: the time one token takes to drip back (the
/// *interval*, `period / refill`) is rounded up to a whole microsecond.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::TokenBucket;
///
/// let tb = TokenBucket::new(10, 60, Duration::from_secs(60))?;
/// assert_eq!(tb.interval(), Duration::from_secs(1));
/// # Ok::<(), tollgate_limiter::PolicyError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    capacity: u64,
    refill: u64,
    period: Duration,
    interval_us: u64,
}

impl TokenBucket {
    /// A bucket of `capacity` tokens refilled at `refill` tokens per `period`.
    pub fn new(capacity: u64, refill: u64, period: Duration) -> Result<Self, PolicyError> {
        if capacity == 0 {
            return Err(PolicyError::new("capacity", "must be at least 1"));
        }
        if refill == 0 {
            return Err(PolicyError::new("refill", "must be at least 1"));
        }
        let period_us = span("period", period)?;
        if refill > period_us {
            return Err(PolicyError::new(
                "refill",
                "at most one token per microsecond can be refilled",
            ));
        }
        let interval_us = period_us.div_ceil(refill);
        match capacity.checked_mul(interval_us) {
            Some(tau) if tau <= MAX_SPAN_MICROS => {}
            _ => {
                return Err(PolicyError::new(
                    "capacity",
                    "a full refill of the bucket must take at most 10 years",
                ));
            }
        }
        Ok(Self {
            capacity,
            refill,
            period,
            interval_us,
        })
    }

    /// A bucket that refills `per_second` tokens a second.
    pub fn per_second(capacity: u64, per_second: u64) -> Result<Self, PolicyError> {
        Self::new(capacity, per_second, Duration::from_secs(1))
    }

    /// The peak burst.
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Tokens refilled per [`period`](Self::period).
    pub fn refill(&self) -> u64 {
        self.refill
    }

    /// The refill period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The time one token takes to drip back, rounded up to a microsecond.
    pub fn interval(&self) -> Duration {
        Duration::from_micros(self.interval_us)
    }

    /// [`interval`](Self::interval) in microseconds.
    #[inline]
    pub fn interval_micros(&self) -> u64 {
        self.interval_us
    }

    /// The time to refill the whole bucket, in microseconds (GCRA's tau):
    /// the window a decision carries.
    #[inline]
    pub(crate) fn window_micros(&self) -> u64 {
        self.capacity * self.interval_us
    }
}

/// State of one token-bucket key: its theoretical arrival time (GCRA).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenBucketState {
    /// When the bucket will be full again; 0 for a fresh key.
    pub tat: Timestamp,
    /// This life of the key, as a reservation names it: when its first
    /// reservation was made (see [reservations](crate::strategy::reservation));
    /// 0 until then. Named by the first reservation, not the first charge,
    /// so that a life no reservation touches keeps nothing but `tat` (the
    /// Redis script stores such a life as one number).
    pub born: Timestamp,
    /// How far the refunds of this life have moved the arrival time back,
    /// in microseconds (see [reservations](crate::strategy::reservation)).
    /// 0 in a new life.
    pub refunded: u64,
    /// The refunds of this life that a later settle must tell apart: those
    /// of reservations whose units may still sit above another
    /// reservation's (at most [`MAX_RECENT_REFUNDS`], in the order made).
    /// Every other refund counts for every settle.
    pub recent: Vec<Refund>,
}

/// A refund a token bucket remembers (see [`TokenBucketState::recent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refund {
    /// The refunded reservation's [`Mark::at`].
    pub at: Timestamp,
    /// How far the refund moved the arrival time back, in microseconds.
    pub amount: u64,
    /// Where the top of that reservation's units was right after (at
    /// most: they only move down): once it is past, no reservation of
    /// this life below them can refund anything, and the refund counts
    /// for every settle.
    pub top: Timestamp,
}

/// The most a life's [`refunded`](TokenBucketState::refunded) counts
/// (2^51 µs, 71 years): a refund that would pass it renews the life
/// instead (outstanding reservations then refund nothing), so the count
/// and a mark stay exact in a Lua number (below 2^53).
pub const MAX_REFUNDED: u64 = 1 << 51;

/// How many refunds [`TokenBucketState::recent`] remembers; the oldest
/// reservation's is then forgotten (it counts for every settle: a
/// reservation below it refunds less, never more).
pub const MAX_RECENT_REFUNDS: usize = 8;

impl TokenBucketState {
    /// Takes `cost` tokens at `now` (a cost of 0 counts as 1).
    #[inline]
    pub fn acquire(&mut self, now: Timestamp, p: &TokenBucket, cost: u64) -> Decision {
        let (decision, tat) = Self::charge(self.tat, now, p, cost);
        if let Some(tat) = tat {
            if self.tat <= now {
                self.renew();
            }
            self.tat = tat;
        }
        decision
    }

    /// A new life begins (a charge or an excess on a full bucket, or
    /// refunds past [`MAX_REFUNDED`]): unnamed until its first reservation.
    #[inline]
    fn renew(&mut self) {
        self.born = 0;
        self.refunded = 0;
        self.recent.clear();
    }

    /// A reservation was just charged at `now`: the life is named by the
    /// first one (at least 1: 0 is "unnamed", which no mark matches).
    #[inline]
    pub fn reserved(&mut self, now: Timestamp) {
        if self.born == 0 {
            self.born = now.max(1);
        }
    }

    /// [`acquire`](Self::acquire) on the arrival time alone: the decision,
    /// and the new arrival time when `cost` tokens are taken (`born`
    /// becomes 0 when `tat <= now`: a new life begins). For a backend
    /// that keeps `tat` in one atomic word and swaps it.
    #[inline]
    pub fn charge(
        tat: Timestamp,
        now: Timestamp,
        p: &TokenBucket,
        cost: u64,
    ) -> (Decision, Option<Timestamp>) {
        Self::decide(tat, now, p, cost, true)
    }

    /// Whether `cost` tokens would be taken at `now`; changes nothing.
    #[inline]
    pub fn peek(&self, now: Timestamp, p: &TokenBucket, cost: u64) -> Decision {
        Self::decide(self.tat, now, p, cost, false).0
    }

    #[inline]
    fn decide(
        tat: Timestamp,
        now: Timestamp,
        p: &TokenBucket,
        cost: u64,
        charge: bool,
    ) -> (Decision, Option<Timestamp>) {
        let cost = cost.max(1);
        let t = p.interval_micros();
        let tau = p.window_micros();
        let debt = tat.max(now) - now;
        // The debt can exceed tau when an override shrank the bucket: then
        // nothing remains (never a negative count). Computed only by the
        // answers that report it (a division: a charge computes its own),
        // and not for less than a token's room, the common refusal (a
        // 64-bit division is the slowest instruction of the path).
        let remaining = || match tau.saturating_sub(debt) {
            room if room < t => 0,
            room => room / t,
        };
        if cost > p.capacity() {
            return (Decision::impossible(p.capacity(), remaining(), debt), None);
        }
        // cost <= capacity, so this cannot overflow what tau holds.
        let new_debt = debt + cost * t;
        if new_debt > tau {
            let d = Decision::from_micros(false, p.capacity(), remaining(), new_debt - tau, debt);
            return (d, None);
        }
        if !charge {
            return (
                Decision::from_micros(true, p.capacity(), remaining(), 0, debt),
                None,
            );
        }
        let d = Decision::from_micros(true, p.capacity(), (tau - new_debt) / t, 0, new_debt);
        (d, Some(now + new_debt))
    }

    /// Where a charge just made at interval `t` (µs, the policy's
    /// [`interval_micros`](TokenBucket::interval_micros)) sits: this life,
    /// the arrival time after it plus this life's refunds so far (the
    /// arrival time had no refund been made: a later settle subtracts the
    /// refunds made since), and `t`, which a refund counts in.
    pub fn mark(&self, t: u64) -> Mark {
        Mark {
            born: self.born,
            at: self.tat + self.refunded,
            per: t,
        }
    }

    /// Settles a reservation of `units` that cost `actual` (see
    /// [reservations](crate::strategy::reservation)): refunds the unused
    /// units that have not dripped back yet, in this life only (counting
    /// the refunds made since the mark, which may have moved them down),
    /// or charges the excess (at most `capacity`, and a debt of at most two
    /// full refills). Answers as a peek of 1 afterwards.
    pub fn settle(
        &mut self,
        now: Timestamp,
        p: &TokenBucket,
        mark: Option<Mark>,
        units: u64,
        actual: u64,
    ) -> Decision {
        let t = p.interval_micros();
        if actual < units {
            if let Some(m) = mark
                // An unnamed life (0) has no reservation: no mark names
                // it (a release before lives were named by their first
                // reservation marked some 0).
                && self.born != 0
                && m.born == self.born
                && self.tat > now
            {
                // The units' top: where the mark left it, less the
                // refunds made since of reservations below it, which moved
                // them down. Those are every refund of this life (the mark
                // holds the count when it was made) but the remembered
                // ones of reservations above it (a forgotten one counts:
                // the safe side).
                let above: u64 = self
                    .recent
                    .iter()
                    .filter(|r| r.at > m.at)
                    .map(|r| r.amount)
                    .sum();
                let top = (m.at + above).saturating_sub(self.refunded);
                // At the interval the units were charged at: an override
                // may have slowed the refill since.
                let per = if m.per > 0 { m.per } else { t };
                let refund = (units - actual)
                    .saturating_mul(per)
                    .min(top.saturating_sub(now));
                let tat = self.tat.saturating_sub(refund).max(now);
                let amount = self.tat - tat;
                self.tat = tat;
                if amount > 0 {
                    self.remember(now, m.at, amount, top - amount);
                }
            }
        } else if actual > units {
            let excess = (actual - units).min(p.capacity());
            let tau = p.capacity() * t;
            if self.tat <= now {
                self.renew();
            }
            // Never lowers an arrival time already beyond the bound (an
            // override shrank the bucket).
            self.tat = (self.tat.max(now) + excess * t)
                .min(now + 2 * tau)
                .max(self.tat);
        }
        self.peek(now, p, 1)
    }

    /// Counts a refund of `amount` of the reservation marked `at`, whose
    /// units' top is then `top`: remembered while a reservation below it
    /// may still refund (its top is after `now`), and renewing the life
    /// past [`MAX_REFUNDED`].
    fn remember(&mut self, now: Timestamp, at: Timestamp, amount: u64, top: Timestamp) {
        self.refunded += amount;
        if self.refunded > MAX_REFUNDED {
            self.renew();
            return;
        }
        self.recent.retain(|r| r.top > now);
        if top <= now {
            return;
        }
        if self.recent.len() == MAX_RECENT_REFUNDS
            && let Some(lowest) = (0..self.recent.len()).min_by_key(|&i| self.recent[i].at)
        {
            self.recent.remove(lowest);
        }
        self.recent.push(Refund { at, amount, top });
    }

    /// When this state becomes equal to a fresh key's.
    #[inline]
    pub fn expires_at(&self) -> Timestamp {
        self.tat
    }
}
