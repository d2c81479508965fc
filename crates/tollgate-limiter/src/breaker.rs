//! A circuit breaker that keeps callers from waiting on a dead backend.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::metrics::{BreakerMeter, BreakerState};

/// Circuit-breaker settings.
///
/// After `threshold` consecutive failures the breaker opens: decisions are
/// answered from the fail mode at once for `backoff`, then one probe is let
/// through. A failed probe doubles the back-off (up to `max_backoff`); a
/// successful one closes the breaker.
///
/// A probe whose caller gives up (its future dropped, a panic) hands the
/// probe to the next caller at once; a probe that neither answers nor is
/// dropped counts as failed after the per-decision timeout. No caller can
/// leave the breaker waiting for a report that never comes.
///
/// A limiter keeps one breaker with these settings per failure domain of
/// its backend ([`Backend::failure_domains`](crate::Backend::failure_domains):
/// the slot ranges of a Redis Cluster, one for a single server or the
/// memory backend). Each counts only its own domain's failures, and opens,
/// backs off and probes on its own: a dead cluster master answers its own
/// keys from the fail mode, not the limiter's keys on the other masters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker; 0 disables it.
    pub threshold: u32,
    /// The first back-off.
    pub backoff: Duration,
    /// The longest back-off.
    pub max_backoff: Duration,
}

impl BreakerConfig {
    /// What, loaded from configuration, would mean something else than it
    /// says: the field, and why. A back-off of 0 probes on every call (a
    /// threshold of 0 is how to turn the breaker off), and a longest
    /// back-off below the first shortens the first.
    pub(crate) fn misread(&self) -> Option<(&'static str, String)> {
        if self.backoff.is_zero() {
            return Some((
                "breaker_backoff",
                "must be longer than 0 (breaker_threshold = 0 turns the breaker off)".into(),
            ));
        }
        if self.max_backoff < self.backoff {
            return Some((
                "breaker_max_backoff",
                format!(
                    "must be at least breaker_backoff ({:?}), not {:?}",
                    self.backoff, self.max_backoff
                ),
            ));
        }
        None
    }
}

/// The defaults: open after 5 failures, back off from 500 ms up to 1 s.
///
/// A short `max_backoff` bounds recovery whatever the length of the outage
/// (decisions resume at most about 1 s after the backend answers again),
/// and a probe costs one decision per limiter per worker per second (see
/// docs/redis.md, "Recovery, and the breaker's back-off").
impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            threshold: 5,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(1),
        }
    }
}

#[derive(Debug)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
        backoff: Duration,
    },
    /// One call is probing the backend; `id` tells its report from a
    /// stale probe's.
    Probing {
        id: u64,
        since: Instant,
        backoff: Duration,
    },
}

/// The breaker's state machine. Uses tokio's clock, so tests can pause time.
#[derive(Debug)]
pub(crate) struct Breaker {
    config: BreakerConfig,
    /// How long a probe may stay silent before it counts as failed.
    probe_timeout: Duration,
    /// True while the state is `Closed { failures: 0 }`: the hot path reads
    /// only this flag and never takes the lock. A breaker that is off
    /// (threshold 0) records no failure, so it stays true.
    healthy: AtomicBool,
    state: Mutex<(State, u64)>,
    /// Reports each state change (under the lock, so in order), shared by
    /// the limiter's breakers of every failure domain.
    meter: Arc<BreakerMeter>,
    /// This breaker's failure domain (see `Backend::failure_domains`).
    domain: usize,
}

/// Leave to call the backend, given by [`Breaker::admit`].
///
/// A probe must report its outcome; one dropped unreported (the caller's
/// future dropped at any await point, a panic) gives the probe back, so the
/// next caller probes at once.
#[derive(Debug)]
#[must_use = "a permit reports the call's outcome"]
pub(crate) struct Permit<'a> {
    breaker: &'a Breaker,
    /// The probe's id, if this call is the probe after a back-off.
    probe: Option<u64>,
}

impl<'a> Permit<'a> {
    /// The breaker that gave it.
    #[inline(always)]
    pub(crate) fn breaker(&self) -> &'a Breaker {
        self.breaker
    }

    /// Whether this call is the probe after a back-off.
    #[inline]
    pub(crate) fn is_probe(&self) -> bool {
        self.probe.is_some()
    }

    /// The call succeeded: the breaker closes. True when it was open (or
    /// probing) until now: the backend has recovered.
    #[inline]
    pub(crate) fn success(mut self) -> bool {
        self.probe = None;
        self.breaker.on_success()
    }

    /// The call failed; returns true when this failure opened the breaker.
    pub(crate) fn failure(mut self) -> bool {
        let probe = self.probe.take();
        self.breaker.on_failure(probe)
    }
}

impl Drop for Permit<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(id) = self.probe {
            self.breaker.abandon(id);
        }
    }
}

impl Breaker {
    /// A closed breaker for failure domain `domain`, reporting its state
    /// changes to `meter`.
    pub(crate) fn new(
        config: BreakerConfig,
        probe_timeout: Duration,
        meter: Arc<BreakerMeter>,
        domain: usize,
    ) -> Self {
        // Bounded, so that `Instant::now() + backoff` and `backoff * 2`
        // cannot overflow (and panic a decision) whatever was configured.
        let bounded = |d: Duration| d.min(crate::guard::MAX_WAIT);
        let config = BreakerConfig {
            backoff: bounded(config.backoff),
            max_backoff: bounded(config.max_backoff),
            ..config
        };
        Self {
            config,
            probe_timeout: bounded(probe_timeout),
            healthy: AtomicBool::new(true),
            state: Mutex::new((State::Closed { failures: 0 }, 0)),
            meter,
            domain,
        }
    }

    /// Its failure domain (see `Backend::failure_domains`).
    pub(crate) fn domain(&self) -> usize {
        self.domain
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (State, u64)> {
        // The state is a few plain values: a panic elsewhere cannot leave
        // it half-written, so a poisoned lock is safe to reuse.
        crate::lock(&self.state)
    }

    /// Lets a call through, or says how long until the next probe at most.
    #[inline]
    pub(crate) fn admit(&self) -> Result<Permit<'_>, Duration> {
        // Healthy (or off): one atomic load, no lock.
        if self.healthy.load(Ordering::Acquire) {
            return Ok(Permit {
                breaker: self,
                probe: None,
            });
        }
        // Asked to probe, it always answers.
        self.admit_unhealthy(true).unwrap_or(Err(Duration::ZERO))
    }

    /// [`admit`](Self::admit) for a caller that would give a probe back
    /// unused (one that answers only what it can at once): `None` when
    /// this call would be the probe, which is left to a caller that waits
    /// for the backend. Taken and given back, a probe would count a
    /// `half_open` and an `open` transition for nothing.
    #[inline]
    pub(crate) fn admit_unless_probe(&self) -> Option<Result<Permit<'_>, Duration>> {
        if self.healthy.load(Ordering::Acquire) {
            return Some(Ok(Permit {
                breaker: self,
                probe: None,
            }));
        }
        self.admit_unhealthy(false)
    }

    /// [`admit`](Self::admit) after a failure: under the lock. `None`
    /// when a probe is due and `probe` is false.
    #[cold]
    fn admit_unhealthy(&self, probe: bool) -> Option<Result<Permit<'_>, Duration>> {
        let permit = |probe| Permit {
            breaker: self,
            probe,
        };
        let mut guard = self.lock();
        let (state, next_id) = &mut *guard;
        let now = Instant::now();
        let backoff = match *state {
            State::Closed { .. } => return Some(Ok(permit(None))),
            State::Open { until, .. } if now < until => return Some(Err(until - now)),
            State::Probing { since, .. } if now < since + self.probe_timeout => {
                return Some(Err(since + self.probe_timeout - now));
            }
            _ if !probe => return None,
            State::Open { backoff, .. } => backoff,
            // The probe never reported: it failed, and a new one may go.
            State::Probing { backoff, .. } => self.next_backoff(backoff),
        };
        *next_id += 1;
        *state = State::Probing {
            id: *next_id,
            since: now,
            backoff,
        };
        self.meter.transition(self.domain, BreakerState::HalfOpen);
        Some(Ok(permit(Some(*next_id))))
    }

    fn next_backoff(&self, backoff: Duration) -> Duration {
        (backoff * 2).min(self.config.max_backoff)
    }

    /// A success: true when it closed an open (or probing) breaker.
    #[inline]
    fn on_success(&self) -> bool {
        if self.healthy.load(Ordering::Acquire) {
            return false;
        }
        self.close()
    }

    /// A success after failures: the breaker closes. True when it was open
    /// (or probing), not only counting failures.
    #[cold]
    fn close(&self) -> bool {
        let mut guard = self.lock();
        let was_open = !matches!(guard.0, State::Closed { .. });
        if was_open {
            self.meter.transition(self.domain, BreakerState::Closed);
        }
        guard.0 = State::Closed { failures: 0 };
        self.healthy.store(true, Ordering::Release);
        was_open
    }

    /// Records a failure of the probe `probe`, or of an ordinary call.
    fn on_failure(&self, probe: Option<u64>) -> bool {
        if self.config.threshold == 0 {
            return false;
        }
        let mut guard = self.lock();
        let state = &mut guard.0;
        self.healthy.store(false, Ordering::Release);
        let backoff = match *state {
            State::Closed { failures } if failures + 1 >= self.config.threshold => {
                self.config.backoff
            }
            State::Closed { failures } => {
                *state = State::Closed {
                    failures: failures + 1,
                };
                return false;
            }
            State::Probing { id, backoff, .. } if probe == Some(id) => self.next_backoff(backoff),
            // A call admitted before the breaker opened, or a stale probe,
            // failed late: the current state already accounts for it.
            State::Probing { .. } | State::Open { .. } => return false,
        };
        *state = State::Open {
            until: Instant::now() + backoff,
            backoff,
        };
        self.meter.transition(self.domain, BreakerState::Open);
        true
    }

    /// The probe `id` was dropped before it reported: the breaker stays
    /// open but the next caller probes at once. Its caller gave up, which
    /// says nothing about the backend, so the back-off does not grow.
    fn abandon(&self, id: u64) {
        let mut guard = self.lock();
        if let State::Probing {
            id: current,
            backoff,
            ..
        } = guard.0
            && current == id
        {
            guard.0 = State::Open {
                until: Instant::now(),
                backoff,
            };
            self.meter.transition(self.domain, BreakerState::Open);
        }
    }

    /// Whether the breaker is open (not counting a probe in flight).
    #[cfg(test)]
    fn is_open(&self) -> bool {
        !self.healthy.load(Ordering::Acquire) && !matches!(self.lock().0, State::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(50);

    fn breaker() -> Breaker {
        Breaker::new(
            BreakerConfig {
                threshold: 2,
                backoff: Duration::from_secs(1),
                max_backoff: Duration::from_secs(3),
            },
            TIMEOUT,
            Arc::new(BreakerMeter::new("test", 1)),
            0,
        )
    }

    /// A breaker opened by failures, at the end of its first back-off.
    async fn due_for_a_probe() -> Breaker {
        let b = breaker();
        b.admit().unwrap().failure();
        assert!(b.admit().unwrap().failure());
        tokio::time::advance(Duration::from_secs(1)).await;
        b
    }

    fn probe(b: &Breaker) -> Permit<'_> {
        let p = b.admit().expect("admitted");
        assert!(p.is_probe());
        p
    }

    #[test]
    fn a_success_says_recovered_only_when_it_closes_an_open_breaker() {
        let b = breaker();
        assert!(!b.admit().unwrap().success(), "healthy");
        // One failure of two: counted, not open.
        assert!(!b.admit().unwrap().failure());
        assert!(!b.admit().unwrap().success(), "closed, failures counted");
        assert!(b.admit().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn opens_probes_and_backs_off() {
        let b = breaker();
        assert!(!b.admit().unwrap().is_probe());
        assert!(!b.admit().unwrap().failure());
        assert!(b.admit().unwrap().failure());
        assert!(b.admit().is_err());
        tokio::time::advance(Duration::from_secs(1)).await;
        let p = probe(&b);
        // Only one probe at a time.
        assert!(b.admit().is_err());
        assert!(p.failure());
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert!(b.admit().is_err());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(probe(&b).failure());
        // Capped at max_backoff.
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(probe(&b).success());
        assert!(!b.admit().unwrap().is_probe());
        assert!(!b.is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_probe_hands_over_at_once() {
        let b = due_for_a_probe().await;
        drop(probe(&b));
        // The next caller probes without waiting, at the same back-off.
        assert!(probe(&b).failure());
        assert_eq!(b.admit().unwrap_err(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_probe_fails_after_the_timeout() {
        let b = due_for_a_probe().await;
        let silent = probe(&b);
        tokio::time::advance(TIMEOUT - Duration::from_millis(1)).await;
        assert_eq!(b.admit().unwrap_err(), Duration::from_millis(1));
        tokio::time::advance(Duration::from_millis(1)).await;
        let next = probe(&b);
        // The stale probe's late reports change nothing.
        assert!(!silent.failure());
        assert!(b.admit().is_err());
        // The new probe failing doubles the back-off of the silent one's
        // (itself counted as failed).
        assert!(next.failure());
        assert_eq!(b.admit().unwrap_err(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_probe_dropped_late_does_not_reopen() {
        let b = due_for_a_probe().await;
        let stale = probe(&b);
        tokio::time::advance(TIMEOUT).await;
        let current = probe(&b);
        drop(stale);
        assert!(
            b.admit().is_err(),
            "the current probe is still the only one"
        );
        current.success();
        assert!(!b.is_open());
    }
}
