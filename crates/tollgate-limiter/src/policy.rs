//! Policies: what a limiter allows.
//!
//! Every constructor validates its input, so a [`Policy`] value is always
//! one that can be enforced: no zero capacity, no zero window, no refill
//! faster than one token per microsecond, no count above [`MAX_COUNT`].

use std::fmt;
use std::time::Duration;

use crate::time::micros;

pub use crate::strategy::calendar::{Calendar, Period, Zone};
pub use crate::strategy::composite::Composite;
pub use crate::strategy::concurrency::Concurrency;
pub use crate::strategy::progressive_delay::ProgressiveDelay;
pub use crate::strategy::sliding_window::SlidingWindow;
pub use crate::strategy::token_bucket::TokenBucket;

/// The longest span any policy may cover: ten years, in microseconds.
///
/// Bounding spans keeps every timestamp a limiter stores below 2^53, the
/// range in which a Lua number is an exact integer.
pub const MAX_SPAN_MICROS: u64 = 10 * 365 * 24 * 3600 * 1_000_000;

/// The largest count any policy may hold (a window's limit, a calendar
/// quota, free attempts): 2^53 − 1.
///
/// Every count is then an exact integer in a Lua number, so the Redis
/// scripts compute with it exactly, and a cost above it (which the Redis
/// backend sends as 2^53) can never fit. What a key counts saturates at
/// it too: a sliding window's total and a calendar quota's count, which
/// settled excesses (and a penalised window's refusals) can carry beyond
/// the limit, stop at 2^53 − 1. A token bucket's capacity is
/// bounded further by its refill (a full refill within
/// [`MAX_SPAN_MICROS`]).
pub const MAX_COUNT: u64 = (1 << 53) - 1;

/// A policy value that cannot be enforced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
#[non_exhaustive]
pub struct PolicyError {
    /// The offending field, as it is spelled in configuration.
    pub field: &'static str,
    /// Why the value is refused.
    pub reason: String,
}

impl PolicyError {
    /// An error naming `field` (as configuration spells it) and why its
    /// value is refused.
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }
}

pub(crate) fn span(field: &'static str, d: Duration) -> Result<u64, PolicyError> {
    let us = micros(d);
    if us == 0 {
        return Err(PolicyError::new(field, "must be at least 1µs"));
    }
    if us > MAX_SPAN_MICROS {
        return Err(PolicyError::new(field, "must be at most 10 years"));
    }
    Ok(us)
}

/// `n`, or an error naming `field` when it is above [`MAX_COUNT`].
pub(crate) fn count(field: &'static str, n: u64) -> Result<u64, PolicyError> {
    if n > MAX_COUNT {
        return Err(PolicyError::new(
            field,
            format!(
                "must be at most {MAX_COUNT} (2^53 - 1, the exact integers of the Redis scripts)"
            ),
        ));
    }
    Ok(n)
}

/// The strategy of a [`Policy`], without its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// [`TokenBucket`].
    TokenBucket,
    /// [`SlidingWindow`].
    SlidingWindow,
    /// [`ProgressiveDelay`].
    ProgressiveDelay,
    /// [`Composite`]: several token buckets and sliding windows at once.
    Composite,
    /// [`Calendar`]: a quota per calendar day, week or month of a time zone.
    Calendar,
    /// [`Concurrency`]: requests in flight.
    Concurrency,
}

impl Strategy {
    /// The name used in configuration.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::TokenBucket => "token_bucket",
            Self::SlidingWindow => "sliding_window",
            Self::ProgressiveDelay => "progressive_delay",
            Self::Composite => "composite",
            Self::Calendar => "calendar",
            Self::Concurrency => "concurrency",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a limiter allows: one of the strategies with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Policy {
    /// See [`TokenBucket`].
    TokenBucket(TokenBucket),
    /// See [`SlidingWindow`].
    SlidingWindow(SlidingWindow),
    /// See [`ProgressiveDelay`].
    ProgressiveDelay(ProgressiveDelay),
    /// See [`Composite`].
    Composite(Composite),
    /// See [`Calendar`].
    Calendar(Calendar),
    /// See [`Concurrency`].
    Concurrency(Concurrency),
}

impl Policy {
    /// The strategy.
    pub fn strategy(&self) -> Strategy {
        match self {
            Self::TokenBucket(_) => Strategy::TokenBucket,
            Self::SlidingWindow(_) => Strategy::SlidingWindow,
            Self::ProgressiveDelay(_) => Strategy::ProgressiveDelay,
            Self::Composite(_) => Strategy::Composite,
            Self::Calendar(_) => Strategy::Calendar,
            Self::Concurrency(_) => Strategy::Concurrency,
        }
    }

    /// The headline number: capacity, window limit, free attempts, or
    /// quota per calendar window, or requests in flight (for a composite,
    /// the largest cost every part grants).
    pub fn limit(&self) -> u64 {
        match self {
            Self::TokenBucket(p) => p.capacity(),
            Self::SlidingWindow(p) => p.limit(),
            Self::ProgressiveDelay(p) => p.free_attempts(),
            Self::Composite(c) => c.max_cost(),
            Self::Calendar(p) => p.limit(),
            Self::Concurrency(p) => p.max_in_flight(),
        }
    }

    /// The time span the limit is expressed over, for `RateLimit-Policy`'s
    /// `w` parameter: the time to refill the whole bucket, the window, or the
    /// forget-after period, the nominal calendar period (1, 7 or 31 days:
    /// a decision carries the actual window's length), or a concurrency
    /// slot's lease; for a composite, the longest of its parts'.
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.window_micros())
    }

    /// [`window`](Self::window) in whole microseconds (what a decision
    /// keeps), computed without a `Duration` where the strategy keeps
    /// microseconds.
    #[inline]
    pub(crate) fn window_micros(&self) -> u64 {
        match self {
            Self::TokenBucket(p) => p.window_micros(),
            Self::SlidingWindow(p) => p.window_micros(),
            Self::ProgressiveDelay(p) => p.forget_after_micros(),
            Self::Composite(c) => crate::time::micros(c.window()),
            Self::Calendar(p) => crate::time::micros(p.window()),
            Self::Concurrency(p) => p.lease_micros(),
        }
    }

    /// The largest cost one request can ever be granted, or `None` when cost
    /// is not bounded by the policy (progressive delay counts failures; a
    /// concurrency limit counts requests, whatever their cost).
    pub fn max_cost(&self) -> Option<u64> {
        match self {
            Self::TokenBucket(p) => Some(p.capacity()),
            Self::SlidingWindow(p) => Some(p.limit()),
            Self::ProgressiveDelay(_) | Self::Concurrency(_) => None,
            Self::Composite(c) => Some(c.max_cost()),
            Self::Calendar(p) => Some(p.limit()),
        }
    }

    /// The policies a decision checks: the parts of a composite, else the
    /// policy itself.
    pub fn parts(&self) -> Vec<Policy> {
        match self {
            Self::Composite(c) => c.policies().collect(),
            other => vec![*other],
        }
    }

    /// Checks that a request of `cost` can ever pass this policy.
    pub fn check_cost(&self, cost: u64) -> Result<(), PolicyError> {
        match self.max_cost() {
            Some(max) if cost > max => Err(PolicyError::new(
                "cost",
                format!("a cost of {cost} can never pass a limit of {max}"),
            )),
            _ => Ok(()),
        }
    }
}

impl From<TokenBucket> for Policy {
    fn from(p: TokenBucket) -> Self {
        Self::TokenBucket(p)
    }
}

impl From<SlidingWindow> for Policy {
    fn from(p: SlidingWindow) -> Self {
        Self::SlidingWindow(p)
    }
}

impl From<Composite> for Policy {
    fn from(p: Composite) -> Self {
        Self::Composite(p)
    }
}

impl From<Calendar> for Policy {
    fn from(p: Calendar) -> Self {
        Self::Calendar(p)
    }
}

impl From<Concurrency> for Policy {
    fn from(p: Concurrency) -> Self {
        Self::Concurrency(p)
    }
}

impl From<ProgressiveDelay> for Policy {
    fn from(p: ProgressiveDelay) -> Self {
        Self::ProgressiveDelay(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_bucket_rejects_zero_and_too_fast() {
        let s = Duration::from_secs(1);
        assert_eq!(TokenBucket::new(0, 1, s).unwrap_err().field, "capacity");
        assert_eq!(TokenBucket::new(1, 0, s).unwrap_err().field, "refill");
        assert_eq!(
            TokenBucket::new(1, 2_000_000, s).unwrap_err().field,
            "refill"
        );
        assert_eq!(
            TokenBucket::new(1, 1, Duration::ZERO).unwrap_err().field,
            "period"
        );
        assert_eq!(
            TokenBucket::new(u64::MAX / 2, 1, s).unwrap_err().field,
            "capacity"
        );
    }

    #[test]
    fn interval_rounds_up() {
        let tb = TokenBucket::new(1, 7, Duration::from_secs(60)).unwrap();
        assert_eq!(tb.interval_micros(), 8_571_429);
    }

    #[test]
    fn progressive_delays_grow_and_cap() {
        let p = ProgressiveDelay::new(
            3,
            Duration::from_secs(1),
            2,
            Duration::from_secs(10),
            Duration::from_secs(900),
        )
        .unwrap();
        let d: Vec<u64> = (1..=9).map(|n| p.delay_micros(n) / 1_000_000).collect();
        assert_eq!(d, [0, 0, 0, 1, 2, 4, 8, 10, 10]);
        assert_eq!(p.delay_micros(u64::MAX), 10_000_000);
    }

    #[test]
    fn cost_above_limit_is_refused() {
        let p = Policy::from(SlidingWindow::new(5, Duration::from_secs(1)).unwrap());
        assert!(p.check_cost(5).is_ok());
        assert_eq!(p.check_cost(6).unwrap_err().field, "cost");
    }
}
