//! Policies: what a limiter allows.
//!
//! Every constructor validates its input, so a [`Policy`] value is always
//! one that can be enforced: no zero capacity, no zero window, no refill
//! faster than one token per microsecond.

use std::fmt;
use std::time::Duration;

use crate::composite::Composite;
use crate::time::micros;

/// The longest span any policy may cover: ten years, in microseconds.
///
/// Bounding spans keeps every timestamp a limiter stores below 2^53, the
/// range in which a Lua number is an exact integer.
pub const MAX_SPAN_MICROS: u64 = 10 * 365 * 24 * 3600 * 1_000_000;

/// A policy value that cannot be enforced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct PolicyError {
    /// The offending field, as it is spelled in configuration.
    pub field: &'static str,
    /// Why the value is refused.
    pub reason: String,
}

impl PolicyError {
    pub(crate) fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }
}

fn span(field: &'static str, d: Duration) -> Result<u64, PolicyError> {
    let us = micros(d);
    if us == 0 {
        return Err(PolicyError::new(field, "must be at least 1µs"));
    }
    if us > MAX_SPAN_MICROS {
        return Err(PolicyError::new(field, "must be at most 10 years"));
    }
    Ok(us)
}

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
    pub fn interval_micros(&self) -> u64 {
        self.interval_us
    }
}

/// Exact sliding window: at most `limit` units of cost in any
/// `window`-long interval, counted from a log of events.
///
/// A refused request is not recorded unless
/// [`penalise_refused`](Self::penalise_refused) is set, which makes a flood
/// keep itself locked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingWindow {
    limit: u64,
    window: Duration,
    window_us: u64,
    penalise_refused: bool,
}

impl SlidingWindow {
    /// At most `limit` units of cost per `window`.
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        if limit == 0 {
            return Err(PolicyError::new("limit", "must be at least 1"));
        }
        let window_us = span("window", window)?;
        Ok(Self {
            limit,
            window,
            window_us,
            penalise_refused: false,
        })
    }

    /// Records refused requests too, so that a client that keeps hammering
    /// stays refused.
    #[must_use]
    pub fn penalise_refused(mut self, yes: bool) -> Self {
        self.penalise_refused = yes;
        self
    }

    /// The most cost admitted in any window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// [`window`](Self::window) in microseconds.
    pub fn window_micros(&self) -> u64 {
        self.window_us
    }

    /// Whether refused requests are recorded.
    pub fn penalises_refused(&self) -> bool {
        self.penalise_refused
    }
}

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
    /// so that Rust and Lua compute exactly the same delays.
    pub fn new(
        free_attempts: u64,
        base_delay: Duration,
        factor: u64,
        max_delay: Duration,
        forget_after: Duration,
    ) -> Result<Self, PolicyError> {
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
        // so neither side overflows nor rounds differently.
        let mut d = self.base_delay_us;
        let mut k = n - self.free_attempts - 1;
        while k > 0 && d < self.max_delay_us {
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
}

impl Strategy {
    /// The name used in configuration.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::TokenBucket => "token_bucket",
            Self::SlidingWindow => "sliding_window",
            Self::ProgressiveDelay => "progressive_delay",
            Self::Composite => "composite",
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
}

impl Policy {
    /// The strategy.
    pub fn strategy(&self) -> Strategy {
        match self {
            Self::TokenBucket(_) => Strategy::TokenBucket,
            Self::SlidingWindow(_) => Strategy::SlidingWindow,
            Self::ProgressiveDelay(_) => Strategy::ProgressiveDelay,
            Self::Composite(_) => Strategy::Composite,
        }
    }

    /// The headline number: capacity, window limit, or free attempts (for
    /// a composite, the largest cost every part grants).
    pub fn limit(&self) -> u64 {
        match self {
            Self::TokenBucket(p) => p.capacity,
            Self::SlidingWindow(p) => p.limit,
            Self::ProgressiveDelay(p) => p.free_attempts,
            Self::Composite(c) => c.max_cost(),
        }
    }

    /// The time span the limit is expressed over, for `RateLimit-Policy`'s
    /// `w` parameter: the time to refill the whole bucket, the window, or the
    /// forget-after period (for a composite, the longest of its parts').
    pub fn window(&self) -> Duration {
        match self {
            Self::TokenBucket(p) => Duration::from_micros(p.capacity * p.interval_us),
            Self::SlidingWindow(p) => p.window,
            Self::ProgressiveDelay(p) => p.forget_after(),
            Self::Composite(c) => c.window(),
        }
    }

    /// The largest cost one request can ever be granted, or `None` when cost
    /// is not bounded by the policy (progressive delay counts failures).
    pub fn max_cost(&self) -> Option<u64> {
        match self {
            Self::TokenBucket(p) => Some(p.capacity),
            Self::SlidingWindow(p) => Some(p.limit),
            Self::ProgressiveDelay(_) => None,
            Self::Composite(c) => Some(c.max_cost()),
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
