//! Composite limits: several policies on one key, decided all-or-nothing.
//!
//! A [`Composite`] holds up to [`MAX_PARTS`] token buckets, sliding
//! windows and calendar quotas (for example 10 per second AND 1,000 per day
//! AND 100 in any 15 minutes, or 10 per second AND 10,000 per calendar
//! month). A request passes only if every part would pass it, and when
//! any part refuses, **no** part is charged: one decision, one backend round
//! trip (one Lua script, every part's state under the key's hash tag, so one
//! Redis Cluster slot). Two stacked layers cannot do this: the first charges
//! even when the second refuses.
//!
//! # What a composite answers
//!
//! The [`Decision`] is the one of the *binding* part, whose index
//! [`Decision::part`] carries:
//!
//! * a cost some part can never grant: the first such part's impossible
//!   decision (nothing charged);
//! * a refusal: of the refusing parts, the one with the latest retry-after
//!   (the first on ties), so `Retry-After` is the latest of the refusals:
//!   waiting that long satisfies every part, since a part that is not
//!   charged only frees up with time;
//! * a pass: every part is charged; of their decisions, the one with the
//!   fewest units remaining (the first on ties).
//!
//! # Which policies compose
//!
//! Token buckets, sliding windows that do not penalise refusals, and
//! [calendar quotas](crate::calendar).
//! Progressive delay counts failures, not requests, and blocks by itself:
//! composing it would mean charging a failure only if some other limit
//! passed, which no login flow wants; it is refused at construction (and at
//! configuration load). A penalised window records refused requests, which
//! contradicts "nothing is charged when any part refuses"; it is refused too.
//!
//! # With the rest of the limiter
//!
//! * **Overrides** of a composite limiter are composites too (the override
//!   replaces the whole list). A part whose strategy changed under an
//!   override starts fresh; parts beyond the new list are forgotten.
//! * **Peeks** peek every part and combine as above, charging nothing.
//! * **Local denials** work unchanged: a refusal holds until its
//!   retry-after, which is the latest of the parts'.
//! * **Leases** take a batch from every part at once (the batch is capped by
//!   the smallest part).
//! * **Penalties** record nothing (no part penalises).
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tollgate_limiter::{model::{Op, State}, Composite, Policy, SlidingWindow, TokenBucket};
//!
//! let policy = Policy::from(Composite::new([
//!     Policy::from(TokenBucket::new(10, 10, Duration::from_secs(1))?),
//!     Policy::from(SlidingWindow::new(2, Duration::from_secs(60))?),
//! ])?);
//! let mut key = State::fresh(&policy);
//! assert!(key.apply(0, &policy, Op::Acquire(1)).is_allowed());
//! assert!(key.apply(0, &policy, Op::Acquire(1)).is_allowed());
//! let refused = key.apply(0, &policy, Op::Acquire(1));
//! // The window binds: it refuses for 60 s; the bucket had tokens left,
//! // and none was taken.
//! assert_eq!(refused.part(), 1);
//! assert_eq!(refused.retry_after(), Duration::from_secs(60));
//! assert_eq!(key.apply(0, &policy, Op::PEEK).remaining(), 0);
//! # Ok::<(), tollgate_limiter::PolicyError>(())
//! ```

use std::time::Duration;

use crate::decision::Decision;
use crate::model::{Op, State};
use crate::policy::{Calendar, Policy, PolicyError, SlidingWindow, TokenBucket};
use crate::time::Timestamp;

/// The most policies one composite holds.
pub const MAX_PARTS: usize = 4;

/// One policy of a [`Composite`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    /// See [`TokenBucket`].
    TokenBucket(TokenBucket),
    /// See [`SlidingWindow`] (never penalising).
    SlidingWindow(SlidingWindow),
    /// See [`Calendar`].
    Calendar(Calendar),
}

impl From<Part> for Policy {
    fn from(p: Part) -> Self {
        match p {
            Part::TokenBucket(p) => Policy::TokenBucket(p),
            Part::SlidingWindow(p) => Policy::SlidingWindow(p),
            Part::Calendar(p) => Policy::Calendar(p),
        }
    }
}

/// Several policies on one key, all of which must pass (see the [module
/// docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Composite {
    parts: [Option<Part>; MAX_PARTS],
}

impl Composite {
    /// A composite of `parts`: 1 to [`MAX_PARTS`] token buckets, sliding
    /// windows that do not penalise refusals, and calendar quotas. The error's field is
    /// `policies`, its reason names the offending part.
    pub fn new(parts: impl IntoIterator<Item = Policy>) -> Result<Self, PolicyError> {
        let mut out = [None; MAX_PARTS];
        let mut n = 0;
        for (i, p) in parts.into_iter().enumerate() {
            if i >= MAX_PARTS {
                return Err(PolicyError::new(
                    "policies",
                    format!("at most {MAX_PARTS} policies"),
                ));
            }
            out[i] = Some(match p {
                Policy::TokenBucket(p) => Part::TokenBucket(p),
                Policy::SlidingWindow(p) if !p.penalises_refused() => Part::SlidingWindow(p),
                Policy::Calendar(p) => Part::Calendar(p),
                Policy::SlidingWindow(_) => {
                    return Err(PolicyError::new(
                        "policies",
                        format!(
                            "policies[{i}]: a sliding window that penalises refusals cannot be \
                             part of a composite (a refusal charges nothing)"
                        ),
                    ));
                }
                other => {
                    return Err(PolicyError::new(
                        "policies",
                        format!(
                            "policies[{i}]: a {} cannot be part of a composite (only \
                             token_bucket, sliding_window and calendar)",
                            other.strategy()
                        ),
                    ));
                }
            });
            n += 1;
        }
        if n == 0 {
            return Err(PolicyError::new("policies", "at least one policy"));
        }
        Ok(Self { parts: out })
    }

    /// The parts, in order.
    pub fn parts(&self) -> impl ExactSizeIterator<Item = Part> + '_ {
        self.parts[..self.len()].iter().map(|p| p.expect("dense"))
    }

    /// The parts as policies, in order.
    pub fn policies(&self) -> impl ExactSizeIterator<Item = Policy> + '_ {
        self.parts().map(Policy::from)
    }

    /// How many parts.
    pub fn len(&self) -> usize {
        self.parts.iter().take_while(|p| p.is_some()).count()
    }

    /// Always false: a composite has at least one part.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The part at `index`, as a policy.
    pub fn policy(&self, index: usize) -> Option<Policy> {
        self.parts.get(index).copied().flatten().map(Policy::from)
    }

    /// The largest cost every part can grant: the smallest capacity or
    /// window limit.
    pub fn max_cost(&self) -> u64 {
        self.policies()
            .filter_map(|p| p.max_cost())
            .min()
            .expect("a composite has parts")
    }

    /// The longest span of its parts.
    pub fn window(&self) -> Duration {
        self.policies()
            .map(|p| p.window())
            .max()
            .expect("a composite has parts")
    }
}

/// State of one composite key: one state per part, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompositeState {
    /// Each part's state; a part of another strategy than its policy's
    /// counts as fresh.
    pub parts: Vec<State>,
}

impl CompositeState {
    /// Applies `op` at `now` under `c`: every part decides, and nothing is
    /// charged unless all pass.
    pub fn apply(&mut self, now: Timestamp, c: &Composite, op: Op) -> Decision {
        // Parts beyond the policy's list are forgotten; new ones are fresh.
        self.parts.truncate(c.len());
        for p in c.policies().skip(self.parts.len()) {
            self.parts.push(State::fresh(&p));
        }
        // Each part settles its own share of a reservation.
        if let Op::Settle { receipt, actual } = op {
            let settled: Vec<Decision> = self
                .parts
                .iter_mut()
                .zip(c.policies())
                .enumerate()
                .map(|(i, (s, p))| {
                    let receipt = receipt.part(i);
                    s.apply(now, &p, Op::Settle { receipt, actual })
                })
                .collect();
            return combine(&settled);
        }
        // No part penalises: a penalty records nothing and answers a peek.
        let look = match op {
            Op::Acquire(cost) | Op::Peek(cost) => Op::Peek(cost),
            Op::Penalise(_)
            | Op::Reset
            | Op::Settle { .. }
            | Op::Hold(_)
            | Op::Release(_)
            | Op::Withdraw(_) => Op::PEEK,
        };
        let peeks: Vec<Decision> = self
            .parts
            .iter_mut()
            .zip(c.policies())
            .map(|(s, p)| s.apply(now, &p, look))
            .collect();
        let charge = matches!(op, Op::Acquire(_)) && peeks.iter().all(Decision::is_allowed);
        if !charge {
            return combine(&peeks);
        }
        let taken: Vec<Decision> = self
            .parts
            .iter_mut()
            .zip(c.policies())
            .map(|(s, p)| s.apply(now, &p, op))
            .collect();
        combine(&taken)
    }

    /// Where a charge just made under `c` sits, part by part.
    pub fn marks(&self, c: &Composite) -> [Option<crate::strategy::reservation::Mark>; MAX_PARTS] {
        let mut marks = [None; MAX_PARTS];
        for ((m, s), p) in marks.iter_mut().zip(&self.parts).zip(c.policies()) {
            *m = s.mark(&p);
        }
        marks
    }

    /// When this state becomes equal to a fresh key's: the latest of its
    /// parts'.
    pub fn expires_at(&self, c: &Composite) -> Timestamp {
        self.parts
            .iter()
            .zip(c.policies())
            .map(|(s, p)| s.expires_at(&p))
            .max()
            .unwrap_or(0)
    }
}

/// The binding decision among the parts' (see the [module docs](self)).
pub fn combine(decisions: &[Decision]) -> Decision {
    let pick = |i: usize| decisions[i].with_part(i);
    if let Some(i) = decisions.iter().position(Decision::is_impossible) {
        return pick(i);
    }
    let mut best: Option<usize> = None;
    if decisions.iter().all(Decision::is_allowed) {
        for (i, d) in decisions.iter().enumerate() {
            if best.is_none_or(|b| d.remaining() < decisions[b].remaining()) {
                best = Some(i);
            }
        }
    } else {
        for (i, d) in decisions.iter().enumerate() {
            if d.is_denied() && best.is_none_or(|b| d.retry_after() > decisions[b].retry_after()) {
                best = Some(i);
            }
        }
    }
    pick(best.expect("a composite has parts"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ProgressiveDelay;

    const S: u64 = 1_000_000;

    fn tb(cap: u64, per_sec: u64) -> Policy {
        TokenBucket::per_second(cap, per_sec).unwrap().into()
    }

    fn sw(limit: u64, secs: u64) -> Policy {
        SlidingWindow::new(limit, Duration::from_secs(secs))
            .unwrap()
            .into()
    }

    fn part() -> impl proptest::strategy::Strategy<Value = Policy> {
        use proptest::prelude::*;
        prop_oneof![
            (1u64..6, 1u64..4, 1u64..3_000_000).prop_map(|(c, r, p)| {
                Policy::from(TokenBucket::new(c, r, Duration::from_micros(p)).unwrap())
            }),
            (1u64..6, 1u64..5_000_000).prop_map(|(l, w)| {
                Policy::from(SlidingWindow::new(l, Duration::from_micros(w)).unwrap())
            }),
            (1u64..6).prop_map(|l| {
                let period = crate::Period::Day;
                Policy::from(crate::Calendar::new(l, period, "UTC").unwrap())
            }),
        ]
    }

    proptest::proptest! {
        /// All or nothing: each part's state is exactly what that policy
        /// alone would hold had it seen only the requests the composite
        /// admitted; a refusal is some part's refusal, and a pass every
        /// part's.
        #[test]
        fn each_part_sees_only_what_the_composite_admitted(
            parts in proptest::collection::vec(part(), 1..=MAX_PARTS),
            steps in proptest::collection::vec(
                (proptest::prop_oneof![0u64..2_000_000, 0u64..30_000_000_000], 0u64..7, proptest::bool::ANY),
                1..80,
            ),
        ) {
            let c = Composite::new(parts.clone()).unwrap();
            let mut composite = CompositeState::default();
            let mut alone: Vec<State> = parts.iter().map(State::fresh).collect();
            let mut now = 0;
            for (dt, cost, peek) in steps {
                now += dt;
                let op = if peek { Op::Peek(cost) } else { Op::Acquire(cost) };
                let d = composite.apply(now, &c, op);
                let verdicts: Vec<Decision> = alone
                    .iter()
                    .zip(&parts)
                    .map(|(s, p)| s.clone().apply(now, p, Op::Peek(cost)))
                    .collect();
                proptest::prop_assert_eq!(
                    d.is_allowed(),
                    verdicts.iter().all(Decision::is_allowed)
                );
                if d.is_denied() {
                    proptest::prop_assert!(verdicts[d.part()].is_denied());
                    let latest = verdicts.iter().map(|v| v.retry_after()).max().unwrap();
                    proptest::prop_assert!(d.is_impossible() || d.retry_after() == latest);
                }
                if d.is_allowed() && !peek {
                    for (s, p) in alone.iter_mut().zip(&parts) {
                        s.apply(now, p, op);
                    }
                }
                for (i, (s, p)) in alone.iter().zip(&parts).enumerate() {
                    let mine = composite.parts[i].clone().apply(now, p, Op::PEEK);
                    proptest::prop_assert_eq!(mine, s.clone().apply(now, p, Op::PEEK));
                }
            }
        }
    }

    #[test]
    fn refuses_what_does_not_compose() {
        assert!(Composite::new([]).is_err());
        let pd = ProgressiveDelay::new(
            1,
            Duration::from_secs(1),
            2,
            Duration::from_secs(2),
            Duration::from_secs(3),
        )
        .unwrap();
        let e = Composite::new([tb(1, 1), pd.into()]).unwrap_err();
        assert_eq!(e.field, "policies");
        assert!(e.reason.contains("policies[1]"), "{e}");
        let pen = SlidingWindow::new(1, Duration::from_secs(1))
            .unwrap()
            .penalise_refused(true);
        assert!(Composite::new([pen.into()]).is_err());
        assert!(Composite::new([tb(1, 1); 5]).is_err());
        assert_eq!(Composite::new([tb(5, 1), sw(3, 9)]).unwrap().max_cost(), 3);
    }

    #[test]
    fn a_refusal_charges_no_part() {
        let c = Composite::new([tb(3, 1), sw(2, 60)]).unwrap();
        let mut s = CompositeState::default();
        assert!(s.apply(0, &c, Op::Acquire(1)).is_allowed());
        assert!(s.apply(0, &c, Op::Acquire(1)).is_allowed());
        for _ in 0..5 {
            let d = s.apply(0, &c, Op::Acquire(1));
            assert!(d.is_denied());
            assert_eq!(d.part(), 1);
        }
        // The bucket still holds its third token.
        let tb_state = &s.parts[0];
        assert_eq!(
            tb_state
                .clone()
                .apply(0, &c.policy(0).unwrap(), Op::PEEK)
                .remaining(),
            1
        );
    }

    #[test]
    fn retry_after_is_the_latest_refusal() {
        let c = Composite::new([tb(1, 1), sw(1, 10)]).unwrap();
        let mut s = CompositeState::default();
        assert!(s.apply(0, &c, Op::Acquire(1)).is_allowed());
        let d = s.apply(0, &c, Op::Acquire(1));
        assert_eq!(d.retry_after(), Duration::from_secs(10));
        assert_eq!(d.part(), 1);
        // After 1 s the bucket passes, the window still refuses.
        assert!(s.apply(S, &c, Op::Acquire(1)).is_denied());
        assert!(s.apply(10 * S, &c, Op::Acquire(1)).is_allowed());
    }

    #[test]
    fn allowed_binds_on_fewest_remaining_and_impossible_wins() {
        let c = Composite::new([tb(10, 1), sw(3, 10)]).unwrap();
        let mut s = CompositeState::default();
        let d = s.apply(0, &c, Op::Acquire(2));
        assert_eq!((d.part(), d.remaining()), (1, 1));
        let d = s.apply(0, &c, Op::Acquire(4));
        assert!(d.is_impossible());
        assert_eq!(d.part(), 1);
    }
}
