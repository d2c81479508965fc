//! Clocks: where a decision's "now" comes from.
//!
//! Time is a [`Timestamp`]: whole microseconds since the Unix epoch. The
//! unit is chosen so that every instant a limiter works with fits in the
//! 53-bit integer range of a Lua number, which lets the Redis scripts and the
//! Rust model compute bit-for-bit the same results.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
pub type Timestamp = u64;

/// Converts a duration to whole microseconds, saturating.
#[inline]
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A source of the current time.
///
/// Backends take their time from a clock, so tests can drive time by hand
/// with a [`MockClock`] and the Redis and memory backends can be checked
/// against the reference model event by event.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(micros)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to. Clones share the same time.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{Clock, MockClock};
///
/// let clock = MockClock::new();
/// let start = clock.now();
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(clock.now() - start, 2_000_000);
/// ```
#[derive(Debug, Clone)]
pub struct MockClock {
    now: Arc<AtomicU64>,
}

impl MockClock {
    /// A mock clock starting at a fixed, realistic instant (2026-01-01 UTC),
    /// so timestamps have the magnitude real ones have.
    pub fn new() -> Self {
        Self::starting_at(1_767_225_600_000_000)
    }

    /// A mock clock starting at `now`.
    pub fn starting_at(now: Timestamp) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(now)),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(micros(by), Ordering::SeqCst);
    }

    /// Moves the clock forward by `us` microseconds.
    pub fn advance_micros(&self, us: u64) {
        self.now.fetch_add(us, Ordering::SeqCst);
    }

    /// Sets the clock to `now` (which may be earlier than the current time).
    pub fn set(&self, now: Timestamp) {
        self.now.store(now, Ordering::SeqCst);
    }
}

impl Default for MockClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MockClock {
    fn now(&self) -> Timestamp {
        self.now.load(Ordering::SeqCst)
    }
}
