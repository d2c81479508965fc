//! Progressive delay: its policy and its state in the reference model.

use std::time::Duration;

use crate::decision::Decision;
use crate::policy::{PolicyError, count, span};
use crate::strategy::reservation::Mark;
use crate::time::Timestamp;

/// Where a key's failure count saturates: 2^53, above any
/// `free_attempts` ([`MAX_COUNT`](crate::policy::MAX_COUNT)), so a
/// saturated count blocks; and an exact integer in a Lua number, so the
/// Redis script counts (and refunds) the same.
pub const MAX_FAILURES: u64 = 1 << 53;

/// Progressive delay: failures are recorded; once a key has more than
/// `free_attempts`, each further failure blocks it for
/// `base_delay * factor^(n - free_attempts - 1)`, capped at `max_delay`.
///
/// State is forgotten `forget_after` the last failure (or when the block
/// ends, whichever is later) and cleared by a success. It is a delay, never a
/// permanent lock-out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProgressiveDelay {
    free_attempts: u64,
    base_delay_us: u64,
    factor: u64,
    max_delay_us: u64,
    forget_after_us: u64,
}

impl ProgressiveDelay {
    /// A progressive delay.
    ///
    /// `factor` is a whole number (1 keeps the delay constant, 2 doubles it)
    /// so that Rust and Lua compute exactly the same delays;
    /// `free_attempts` is at most [`MAX_COUNT`](crate::policy::MAX_COUNT).
    pub fn new(
        free_attempts: u64,
        base_delay: Duration,
        factor: u64,
        max_delay: Duration,
        forget_after: Duration,
    ) -> Result<Self, PolicyError> {
        let free_attempts = count("free_attempts", free_attempts)?;
        let base_delay_us = span("base_delay", base_delay)?;
        let max_delay_us = span("max_delay", max_delay)?;
        let forget_after_us = span("forget_after", forget_after)?;
        if factor == 0 {
            return Err(PolicyError::new("factor", "must be at least 1"));
        }
        if max_delay_us < base_delay_us {
            return Err(PolicyError::new("max_delay", "must be at least base_delay"));
        }
        Ok(Self {
            free_attempts,
            base_delay_us,
            factor,
            max_delay_us,
            forget_after_us,
        })
    }

    /// Failures allowed before the first delay.
    pub fn free_attempts(&self) -> u64 {
        self.free_attempts
    }

    /// The first delay.
    pub fn base_delay(&self) -> Duration {
        Duration::from_micros(self.base_delay_us)
    }

    /// The growth factor of successive delays.
    pub fn factor(&self) -> u64 {
        self.factor
    }

    /// The longest delay.
    pub fn max_delay(&self) -> Duration {
        Duration::from_micros(self.max_delay_us)
    }

    /// How long after the last failure the state is forgotten.
    pub fn forget_after(&self) -> Duration {
        Duration::from_micros(self.forget_after_us)
    }

    /// The delay imposed by the `n`-th failure (1-based), in microseconds:
    /// zero within the free attempts.
    pub fn delay_micros(&self, n: u64) -> u64 {
        if n <= self.free_attempts {
            return 0;
        }
        // Multiply step by step with a cap, exactly as the Lua script does,
        // so neither side overflows nor rounds differently. A factor of 1
        // never grows the delay: no step (else one per failure, and the
        // failures are the client's to multiply).
        let mut d = self.base_delay_us;
        let mut k = n - self.free_attempts - 1;
        while k > 0 && d < self.max_delay_us && self.factor > 1 {
            d = d.saturating_mul(self.factor);
            k -= 1;
        }
        d.min(self.max_delay_us)
    }

    /// [`base_delay`](Self::base_delay) in microseconds.
    pub fn base_delay_micros(&self) -> u64 {
        self.base_delay_us
    }

    /// [`max_delay`](Self::max_delay) in microseconds.
    pub fn max_delay_micros(&self) -> u64 {
        self.max_delay_us
    }

    /// [`forget_after`](Self::forget_after) in microseconds.
    pub fn forget_after_micros(&self) -> u64 {
        self.forget_after_us
    }

    /// Whether a block at its longest ends with the failures forgotten
    /// (`forget_after` no longer than the longest delay): each such block
    /// then gives the free attempts back, and no longer delay ever holds.
    /// Login protection needs the opposite (configuration and
    /// `LoginLayer` refuse it); a one-block hold wants exactly this.
    pub fn forgets_by_its_longest_block(&self) -> bool {
        self.forget_after_us <= self.delay_micros(u64::MAX)
    }
}

/// State of one progressive-delay key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgressiveDelayState {
    /// Failures recorded since the key was last fresh (reserved attempts
    /// included, until a settle refunds them).
    pub failures: u64,
    /// The key is blocked before this instant.
    pub blocked_until: Timestamp,
    /// The last recorded failure.
    pub last_failure: Timestamp,
    /// When this life of the key began: its first failure since it was
    /// fresh (0 for a state stored before this field, whose life goes on
    /// as one). A [reservation](crate::strategy::reservation)'s
    /// [`Mark::born`]: a settle refunds only within the life it was
    /// reserved in.
    pub born: Timestamp,
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

    /// Reserves an attempt of `failures` failures (0 counts as 1) at `now`:
    /// the failures are taken *up front*, before the outcome is known,
    /// so that attempts in flight together see each other.
    ///
    /// * A key blocked at `now` refuses and records **nothing** (as a
    ///   [`peek`](Self::peek)): knocking on a delayed account does not
    ///   lengthen its delay.
    /// * Otherwise the failures are recorded now, exactly as an
    ///   [`acquire`](Self::acquire) records them (the attempt that brings
    ///   the count past the free attempts starts the delay, so every later
    ///   attempt is refused until it ends), and the attempt is **allowed**
    ///   (retry-after 0): it is the one the delay was started for.
    ///
    /// An allowed reservation's [`mark`](Self::mark) identifies this life
    /// of the key; [`settle`](Self::settle) keeps or refunds the failures.
    pub fn reserve(&mut self, now: Timestamp, p: &ProgressiveDelay, failures: u64) -> Decision {
        self.forget_if_expired(now, p);
        if now < self.blocked_until {
            return self.decide(now, p, 0);
        }
        let d = self.decide(now, p, failures.max(1));
        Decision::from_micros(
            true,
            d.limit(),
            d.remaining(),
            0,
            self.expires_at(p).saturating_sub(now),
        )
    }

    /// Where the last recorded failure sits: this life (`born`) and the
    /// instant of the failure (`at`, informative: a settle does not read
    /// it).
    pub fn mark(&self) -> Mark {
        Mark {
            born: self.born,
            at: self.last_failure,
            per: 0,
        }
    }

    /// Settles a reservation of `units` failures whose outcome counts
    /// `actual` failures (a failed login: `actual = units`; an attempt that
    /// was no failed login, a 5xx or a 400: `actual = 0`):
    ///
    /// * **refund** (`actual < units`): `failures` goes down by
    ///   `units - actual`, never below zero, and only if `mark` names this
    ///   life of the key (an expiry or a reset since gave everything back
    ///   already: nothing is refunded). The block and the last failure's
    ///   instant are left as they are: a delay already started runs its
    ///   course (the safe side: undoing it exactly could shorten a delay
    ///   another failure set). Each reservation refunds only what it
    ///   recorded, so the count never drops below what the other attempts
    ///   of this life recorded (settle each receipt once);
    /// * **excess** (`actual > units`): the further failures are recorded
    ///   now, as an [`acquire`](Self::acquire) of them would, whatever the
    ///   mark (an unmarked receipt charges an excess too);
    /// * `actual = units`: nothing changes.
    ///
    /// Answers as a [`peek`](Self::peek) afterwards.
    pub fn settle(
        &mut self,
        now: Timestamp,
        p: &ProgressiveDelay,
        mark: Option<Mark>,
        units: u64,
        actual: u64,
    ) -> Decision {
        self.forget_if_expired(now, p);
        if actual > units {
            return self.decide(now, p, actual - units);
        }
        if let Some(m) = mark
            && m.born == self.born
            && self.failures > 0
        {
            self.failures = self.failures.saturating_sub(units - actual);
        }
        self.decide(now, p, 0)
    }

    fn forget_if_expired(&mut self, now: Timestamp, p: &ProgressiveDelay) {
        if self.failures > 0 && self.expires_at(p) <= now {
            *self = Self::default();
        }
    }

    fn decide(&mut self, now: Timestamp, p: &ProgressiveDelay, failures: u64) -> Decision {
        self.forget_if_expired(now, p);
        if failures > 0 {
            if self.failures == 0 {
                // A new life: its first failure.
                self.born = now;
            }
            // Saturated at 2^53, as the Redis script's count is (an exact
            // Lua number): a refund after it then agrees.
            self.failures = self.failures.saturating_add(failures).min(MAX_FAILURES);
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

    /// When this state becomes equal to a fresh key's: `forget_after` the
    /// last failure, or the end of the block if later. A state whose
    /// failures were all refunded keeps only the block they left (see
    /// [`settle`](Self::settle)).
    pub fn expires_at(&self, p: &ProgressiveDelay) -> Timestamp {
        if self.failures == 0 {
            return self.blocked_until;
        }
        (self.last_failure + p.forget_after_micros()).max(self.blocked_until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With a factor of 1 (a constant delay below its cap) the delay of
    /// the n-th failure must not take n steps: a key's failures grow with
    /// every request an attacker sends (and a failure count of `cost`
    /// arrives in one request), and the memory backend computes this under
    /// its shard's exclusive lock.
    #[test]
    fn a_constant_delay_costs_no_step_per_failure() {
        let p = ProgressiveDelay::new(
            3,
            Duration::from_secs(1),
            1,
            Duration::from_secs(60),
            Duration::from_secs(3600),
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut s = ProgressiveDelayState::default();
            let d = s.acquire(0, &p, u64::MAX / 2);
            let _ = tx.send((p.delay_micros(u64::MAX), d.retry_after()));
        });
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the delay of a huge failure count is computed at once");
        assert_eq!(got, (1_000_000, Duration::from_secs(1)));
    }

    const S: u64 = 1_000_000;

    fn policy() -> ProgressiveDelay {
        // Two free failures, then 10 s, 20 s, ... up to 60 s; forgotten
        // after 600 s.
        ProgressiveDelay::new(
            2,
            Duration::from_secs(10),
            2,
            Duration::from_secs(60),
            Duration::from_secs(600),
        )
        .unwrap()
    }

    fn model_slot() -> (crate::policy::Policy, crate::model::Slot) {
        let p = crate::policy::Policy::from(policy());
        let slot = crate::model::Slot::fresh(&p);
        (p, slot)
    }

    /// Attempts reserved together while the key is free see each other:
    /// the free ones and the one that starts the delay pass, every later
    /// one is refused, and a refused one records nothing (the delay is
    /// the one the third failure started, not lengthened by knocking).
    #[test]
    fn concurrent_reservations_pass_one_past_the_free_attempts() {
        use crate::model::Receipt;
        let (p, mut slot) = model_slot();
        let now = 1_000 * S;
        let verdicts: Vec<_> = (0..6)
            .map(|_| slot.reserve(now, &p, 1))
            .map(|(d, r)| (d.is_allowed(), r.units))
            .collect();
        assert_eq!(
            verdicts,
            [
                (true, 1),
                (true, 1),
                (true, 1),
                (false, 0),
                (false, 0),
                (false, 0)
            ]
        );
        let crate::model::State::ProgressiveDelay(s) = slot.state else {
            panic!("{:?}", slot.state)
        };
        assert_eq!(s.failures, 3);
        assert_eq!(s.blocked_until, now + 10 * S);
        // Knocking while blocked records nothing.
        let (d, r) = slot.reserve(now + 9 * S, &p, 1);
        assert!(d.is_denied());
        assert_eq!(d.retry_after(), Duration::from_secs(1));
        assert_eq!(r, Receipt::NONE);
        // The delay over: exactly one more attempt, which starts the next.
        let (d, _) = slot.reserve(now + 10 * S, &p, 1);
        assert!(d.is_allowed());
        assert!(slot.reserve(now + 10 * S, &p, 1).0.is_denied());
        assert_eq!(
            slot.apply(now + 10 * S, &p, crate::model::Op::PEEK)
                .retry_after(),
            Duration::from_secs(20)
        );
    }

    /// A refund takes back the attempt's own failure, never one another
    /// attempt recorded, and leaves a started delay in place; a kept
    /// failure (actual = units) changes nothing; an excess is recorded.
    #[test]
    fn a_settle_refunds_its_own_failure_and_leaves_the_block() {
        use crate::model::Op;
        let (p, mut slot) = model_slot();
        let now = 1_000 * S;
        let (_, a) = slot.reserve(now, &p, 1);
        let (_, b) = slot.reserve(now, &p, 1);
        let (_, c) = slot.reserve(now + S, &p, 1);
        let failures = |slot: &crate::model::Slot| match slot.state {
            crate::model::State::ProgressiveDelay(s) => s.failures,
            _ => panic!(),
        };
        assert_eq!(failures(&slot), 3);
        // `c` started a 10 s delay; refunding it leaves the delay.
        let d = slot.apply(
            now + 2 * S,
            &p,
            Op::Settle {
                receipt: c,
                actual: 0,
            },
        );
        assert_eq!(failures(&slot), 2);
        assert!(d.is_denied());
        assert_eq!(d.retry_after(), Duration::from_secs(9));
        // `a` failed: kept.
        slot.apply(
            now + 2 * S,
            &p,
            Op::Settle {
                receipt: a,
                actual: 1,
            },
        );
        assert_eq!(failures(&slot), 2);
        // `b` errored: refunded, and a second settle of it (not allowed,
        // but the model does not remember receipts) never goes below zero.
        for _ in 0..3 {
            slot.apply(
                now + 2 * S,
                &p,
                Op::Settle {
                    receipt: b,
                    actual: 0,
                },
            );
        }
        assert_eq!(failures(&slot), 0);
        // The block stays until it ends, and the key is then as fresh.
        assert!(slot.apply(now + 11 * S - 1, &p, Op::PEEK).is_denied());
        assert!(slot.is_live(now + 11 * S - 1));
        assert!(!slot.is_live(now + 11 * S));
        assert_eq!(slot.apply(now + 11 * S, &p, Op::PEEK).remaining(), 2);
        // An excess is recorded as failures.
        let (_, e) = slot.reserve(now + 20 * S, &p, 1);
        let d = slot.apply(
            now + 20 * S,
            &p,
            Op::Settle {
                receipt: e,
                actual: 3,
            },
        );
        assert_eq!(failures(&slot), 3);
        assert_eq!(d.retry_after(), Duration::from_secs(10));
    }

    /// A settle after the key was reset or forgotten refunds nothing: the
    /// failures of the new life are not the reservation's.
    #[test]
    fn a_settle_refunds_nothing_in_another_life() {
        use crate::model::Op;
        let (p, mut slot) = model_slot();
        let now = 1_000 * S;
        let (_, old) = slot.reserve(now, &p, 1);
        slot.apply(now, &p, Op::Reset);
        slot.reserve(now + 1, &p, 1);
        let settle = |slot: &mut crate::model::Slot, at| {
            slot.apply(
                at,
                &p,
                Op::Settle {
                    receipt: old,
                    actual: 0,
                },
            )
        };
        assert_eq!(settle(&mut slot, now + 2).remaining(), 1);
        // Forgotten 600 s after the last failure: a new life again.
        slot.reserve(now + 700 * S, &p, 1);
        let (_, new) = slot.reserve(now + 700 * S, &p, 1);
        assert_eq!(settle(&mut slot, now + 700 * S).remaining(), 0);
        let d = slot.apply(
            now + 700 * S,
            &p,
            Op::Settle {
                receipt: new,
                actual: 0,
            },
        );
        assert_eq!(d.remaining(), 1);
    }

    /// A state stored before `born` (0) goes on as one life: its
    /// reservations carry 0 and are refunded.
    #[test]
    fn a_state_without_born_settles_in_its_life() {
        let p = policy();
        let mut s = ProgressiveDelayState {
            failures: 1,
            blocked_until: 0,
            last_failure: 5 * S,
            born: 0,
        };
        assert!(s.reserve(6 * S, &p, 1).is_allowed());
        let mark = s.mark();
        assert_eq!(mark.born, 0);
        s.settle(6 * S, &p, Some(mark), 1, 0);
        assert_eq!(s.failures, 1);
    }
}
