//! A circuit breaker that keeps callers from waiting on a dead backend.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Circuit-breaker settings.
///
/// After `threshold` consecutive failures the breaker opens: decisions are
/// answered from the fail mode at once for `backoff`, then one probe is let
/// through. A failed probe doubles the back-off (up to `max_backoff`); a
/// successful one closes the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker; 0 disables it.
    pub threshold: u32,
    /// The first back-off.
    pub backoff: Duration,
    /// The longest back-off.
    pub max_backoff: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            threshold: 5,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
        }
    }
}

#[derive(Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant, backoff: Duration },
    Probing { backoff: Duration },
}

/// The breaker's state machine. Uses tokio's clock, so tests can pause time.
#[derive(Debug)]
pub(crate) struct Breaker {
    config: BreakerConfig,
    /// True while the state is `Closed { failures: 0 }`: the hot path reads
    /// only this flag and never takes the lock.
    healthy: AtomicBool,
    state: Mutex<State>,
}

/// What the breaker lets a caller do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Ask the backend.
    Yes,
    /// Ask the backend: this call is the probe after a back-off.
    Probe,
    /// Do not ask; the breaker reopens in this long at most.
    No(Duration),
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            healthy: AtomicBool::new(true),
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a few plain values: a panic elsewhere cannot leave
        // it half-written, so a poisoned lock is safe to reuse.
        crate::lock(&self.state)
    }

    pub(crate) fn admit(&self) -> Admit {
        if self.config.threshold == 0 || self.healthy.load(Ordering::Acquire) {
            return Admit::Yes;
        }
        let mut state = self.lock();
        match *state {
            State::Closed { .. } => Admit::Yes,
            State::Open { until, backoff } => {
                let now = Instant::now();
                if now >= until {
                    *state = State::Probing { backoff };
                    Admit::Probe
                } else {
                    Admit::No(until - now)
                }
            }
            State::Probing { backoff } => Admit::No(backoff),
        }
    }

    pub(crate) fn on_success(&self) {
        if self.config.threshold == 0 || self.healthy.load(Ordering::Acquire) {
            return;
        }
        let mut state = self.lock();
        *state = State::Closed { failures: 0 };
        self.healthy.store(true, Ordering::Release);
    }

    /// Records a failure; returns true when this failure opened the breaker.
    pub(crate) fn on_failure(&self) -> bool {
        if self.config.threshold == 0 {
            return false;
        }
        let mut state = self.lock();
        self.healthy.store(false, Ordering::Release);
        let (open, backoff) = match *state {
            State::Closed { failures } if failures + 1 >= self.config.threshold => {
                (true, self.config.backoff)
            }
            State::Closed { failures } => {
                *state = State::Closed {
                    failures: failures + 1,
                };
                (false, Duration::ZERO)
            }
            State::Probing { backoff } => (true, (backoff * 2).min(self.config.max_backoff)),
            // A call admitted before the breaker opened failed late.
            State::Open { .. } => (false, Duration::ZERO),
        };
        if open {
            *state = State::Open {
                until: Instant::now() + backoff,
                backoff,
            };
        }
        open
    }

    /// Whether the breaker is open (not counting a probe in flight).
    pub(crate) fn is_open(&self) -> bool {
        !self.healthy.load(Ordering::Acquire) && !matches!(*self.lock(), State::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn opens_probes_and_backs_off() {
        let b = Breaker::new(BreakerConfig {
            threshold: 2,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(3),
        });
        assert_eq!(b.admit(), Admit::Yes);
        assert!(!b.on_failure());
        assert!(b.on_failure());
        assert!(matches!(b.admit(), Admit::No(_)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(b.admit(), Admit::Probe);
        // Only one probe at a time.
        assert!(matches!(b.admit(), Admit::No(_)));
        assert!(b.on_failure());
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert!(matches!(b.admit(), Admit::No(_)));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(b.admit(), Admit::Probe);
        b.on_failure();
        // Capped at max_backoff.
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(b.admit(), Admit::Probe);
        b.on_success();
        assert_eq!(b.admit(), Admit::Yes);
        assert!(!b.is_open());
    }
}
