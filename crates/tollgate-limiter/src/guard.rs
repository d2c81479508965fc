//! The one path every backend call takes: circuit breaker, deadline, a
//! throttled warning on failure, and the limiter's metrics. Shared by
//! [`Limiter`](crate::Limiter) and [`AimdLimiter`](crate::AimdLimiter).

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use crate::breaker::{Breaker, BreakerConfig, Permit};
use crate::error::{BackendError, Error, ErrorReason};
use crate::metrics::{BreakerMeter, Meter, Stopwatch};

/// Runs backend calls under a deadline and a breaker, and logs failures.
///
/// One breaker per failure domain of the backend
/// ([`Backend::failure_domains`](crate::Backend::failure_domains)): a call is
/// admitted by, and reports to, its domain's breaker only, so a Redis
/// Cluster master's failures open the breaker of its slots and not the
/// limiter's keys on the other masters.
#[derive(Debug)]
pub(crate) struct Guard {
    /// The limiter's name, for the logs.
    name: String,
    timeout: Duration,
    /// Domain 0's breaker, inline: with one domain (a memory or a single
    /// Redis backend) a decision reads it as it did before domains, with no
    /// slice to index.
    breaker: Breaker,
    /// The breakers of domains 1 and up.
    more: Box<[Breaker]>,
    log: LogThrottle,
    meter: Meter,
}

/// The longest wait the guard arms (about 30 years, tokio's own "far
/// future"): a longer timeout or back-off (a configuration's `"1000y"`,
/// humantime reads up to 584 billion years) means the same, and adding it
/// to an `Instant` would overflow and panic the decision.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(86_400 * 365 * 30);

impl Guard {
    /// A guard with one breaker for each of `domains` failure domains (at
    /// least one).
    pub(crate) fn new(
        name: String,
        timeout: Duration,
        breaker: BreakerConfig,
        domains: usize,
    ) -> Self {
        let timeout = timeout.min(MAX_WAIT);
        let domains = domains.max(1);
        let breaker_meter = Arc::new(BreakerMeter::new(&name, domains));
        // A probe silent for longer than any call may take has failed.
        let new = |domain| Breaker::new(breaker, timeout, Arc::clone(&breaker_meter), domain);
        Self {
            timeout,
            breaker: new(0),
            more: (1..domains).map(new).collect(),
            log: LogThrottle::new(Duration::from_secs(10)),
            meter: Meter::new(&name),
            name,
        }
    }

    /// The limiter's metrics.
    pub(crate) fn meter(&self) -> &Meter {
        &self.meter
    }

    /// The per-decision timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The breaker of failure domain `domain`; domain 0's for one out of
    /// range (a backend's mistake must not panic a decision).
    #[inline(always)]
    fn breaker(&self, domain: usize) -> &Breaker {
        if domain == 0 {
            return &self.breaker;
        }
        self.more.get(domain - 1).unwrap_or(&self.breaker)
    }

    /// The deadline of a decision starting now: every backend call of the
    /// decision shares it.
    pub(crate) fn deadline(&self) -> Deadline {
        Deadline {
            timeout: self.timeout,
            at: OnceLock::new(),
        }
    }

    /// Runs one backend call on failure domain `domain`, to be answered by
    /// `deadline`.
    ///
    /// The call is made only once the domain's breaker admits it: a backend
    /// may start its work when the future is created. Dropping the returned
    /// future at any point (or a panic in the backend) cannot leave the
    /// breaker waiting for a probe's report: see
    /// [`Permit`](crate::breaker::Permit).
    pub(crate) async fn run<T, E, F, Fut>(
        &self,
        domain: usize,
        deadline: &Deadline,
        call: F,
    ) -> Result<T, Error>
    where
        E: BackendError,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let admitted = self.admit(domain)?;
        self.wait(admitted, deadline, call()).await
    }

    /// The leave of `domain`'s breaker for one backend call (counted as
    /// refused when it is open): hand it to [`report`](Self::report) with
    /// the call's answer, or to [`wait`](Self::wait) with the call's
    /// future. The call is made only once admitted.
    #[inline]
    pub(crate) fn admit(&self, domain: usize) -> Result<Admitted<'_>, Error> {
        Ok(self.admit_at_once(domain)?.waiting(&self.meter))
    }

    /// [`admit`](Self::admit) for a call an in-process backend may answer
    /// at once ([`Backend::decide_now`](crate::Backend::decide_now)): its
    /// stopwatch starts only if the call has to wait after all
    /// ([`Admitted::waiting`]); an answer at once is recorded as taking no
    /// time (see the metrics' `Meter::unstarted`).
    #[inline]
    pub(crate) fn admit_at_once(&self, domain: usize) -> Result<Admitted<'_>, Error> {
        self.admitted(self.breaker(domain).admit())
    }

    /// [`admit_at_once`](Self::admit_at_once) for a caller that answers
    /// only what it can at once, and gives the leave back otherwise
    /// ([`Limiter::check_cost_now`](crate::Limiter::check_cost_now)):
    /// `None` when the call would be the domain's probe, which is left to
    /// the caller that waits (see [`Breaker::admit_unless_probe`]).
    #[inline]
    pub(crate) fn admit_unless_probe(&self, domain: usize) -> Option<Result<Admitted<'_>, Error>> {
        Some(self.admitted(self.breaker(domain).admit_unless_probe()?))
    }

    /// The breaker's answer as the guard's.
    #[inline(always)]
    fn admitted<'a>(&'a self, leave: Result<Permit<'a>, Duration>) -> Result<Admitted<'a>, Error> {
        let Ok(permit) = leave else {
            self.meter.breaker_open();
            return Err(Error::BreakerOpen);
        };
        Ok(Admitted {
            permit,
            watch: self.meter.unstarted(),
        })
    }

    /// Waits for an admitted call's future, to be answered by `deadline`,
    /// and reports its outcome.
    ///
    /// Dropping the returned future at any point (or a panic in the
    /// backend) cannot leave the breaker waiting for a probe's report: see
    /// [`Permit`](crate::breaker::Permit).
    pub(crate) async fn wait<T, E, Fut>(
        &self,
        admitted: Admitted<'_>,
        deadline: &Deadline,
        fut: Fut,
    ) -> Result<T, Error>
    where
        E: BackendError,
        Fut: Future<Output = Result<T, E>>,
    {
        // Poll once before reading the clock and arming the timer: an
        // in-process backend answers at once, and a clock read and a timer
        // cost more than its decision.
        let mut fut = std::pin::pin!(fut);
        let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        let answer = match first {
            Poll::Ready(r) => Ok(r),
            Poll::Pending => tokio::time::timeout_at(deadline.at(), fut)
                .await
                .map_err(|_| Error::Timeout(self.timeout)),
        };
        self.report(admitted, answer)
    }

    /// Reports an admitted call's outcome (its answer, or the error that
    /// ended the wait) to the breaker, the metrics and the log.
    #[inline]
    pub(crate) fn report<T, E>(
        &self,
        admitted: Admitted<'_>,
        answer: Result<Result<T, E>, Error>,
    ) -> Result<T, Error>
    where
        E: BackendError,
    {
        let e = match answer {
            Ok(Ok(v)) => {
                self.succeeded(admitted);
                return Ok(v);
            }
            // The reason is read before the error is boxed: the backend's
            // type, which knows it, is gone after.
            Ok(Err(e)) => {
                let reason = e.reason();
                (Error::Backend(Box::new(e)), reason)
            }
            Err(e) => (e, ErrorReason::Error),
        };
        self.failed(admitted, e)
    }

    /// Out of line: only a failed call pays for it.
    #[cold]
    #[inline(never)]
    fn failed<T>(
        &self,
        admitted: Admitted<'_>,
        (e, reason): (Error, ErrorReason),
    ) -> Result<T, Error> {
        self.meter.failed_call(admitted.watch, &e, reason);
        let breaker = admitted.permit.breaker();
        // A failed probe opens its breaker again: the outage goes on, which
        // the throttle's count says. Only a breaker that opens from closed
        // is news worth a line past the throttle: with a breaker per
        // failure domain, forcing every failed probe's line logged one per
        // domain per back-off (16 a second for a whole cluster's outage).
        let probe = admitted.permit.is_probe();
        let opened = match reason {
            // The backend answered: a bad stored policy says nothing of its
            // health (see `ErrorReason::InvalidPolicy`).
            ErrorReason::InvalidPolicy => {
                if admitted.permit.success() {
                    self.recovered(breaker);
                }
                false
            }
            _ => admitted.permit.failure(),
        };
        self.log
            .warn(&self.name, breaker.domain(), &e, opened, opened && !probe);
        Err(e)
    }

    /// Reports that an admitted call answered (what [`report`](Self::report)
    /// does with an `Ok`, for a caller that keeps the answer).
    #[inline(always)]
    pub(crate) fn succeeded(&self, admitted: Admitted<'_>) {
        self.meter.answered(admitted.watch);
        // The reference, not the domain: the healthy path reads nothing.
        let breaker = admitted.permit.breaker();
        if admitted.permit.success() {
            self.recovered(breaker);
        }
    }

    /// Out of line: the log macro kept [`succeeded`](Self::succeeded), on
    /// every decision's path, from being inlined (a measured 21
    /// instructions of a call where its healthy case needs a load).
    #[cold]
    #[inline(never)]
    fn recovered(&self, breaker: &Breaker) {
        tracing::info!(
            limiter = %self.name,
            domain = breaker.domain(),
            "rate-limit backend recovered"
        );
    }
}

/// A backend call the breaker let through (see [`Guard::admit`]).
#[derive(Debug)]
#[must_use = "an admitted call reports its outcome"]
pub(crate) struct Admitted<'a> {
    permit: Permit<'a>,
    watch: Stopwatch,
}

impl Admitted<'_> {
    /// A call admitted by [`Guard::admit_at_once`] that waits for its
    /// backend after all: its stopwatch starts now, before the call.
    pub(crate) fn waiting(self, meter: &Meter) -> Self {
        Self {
            watch: meter.start(),
            ..self
        }
    }
}

/// The deadline of one decision, shared by its backend calls. It is taken
/// when the decision first waits for its backend, not when it starts: a
/// decision answered at once (an in-process backend) never reads the clock,
/// and a network backend's first poll (building and writing the command)
/// takes microseconds, not a share of the timeout worth a clock read.
#[derive(Debug)]
pub(crate) struct Deadline {
    timeout: Duration,
    at: OnceLock<Instant>,
}

impl Deadline {
    /// The instant the decision's waiting ends, fixed on first use.
    fn at(&self) -> Instant {
        *self.at.get_or_init(|| Instant::now() + self.timeout)
    }
}

/// Lets a log line through at most once per period (per limiter: each
/// limiter holds its own), counting the ones kept quiet. Backend failures
/// and shadow-mode refusals both go through one.
#[derive(Debug)]
pub(crate) struct LogThrottle {
    period: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogThrottle {
    pub(crate) fn new(period: Duration) -> Self {
        Self {
            period,
            state: Mutex::new((None, 0)),
        }
    }

    /// Whether a line may be logged now (always when `force`), with the
    /// number of lines kept quiet since the last one; `None` counts this
    /// one as kept quiet.
    pub(crate) fn due(&self, force: bool) -> Option<u64> {
        let now = Instant::now();
        let mut state = crate::lock(&self.state);
        let due = state
            .0
            .is_none_or(|last| now.duration_since(last) >= self.period);
        if !(due || force) {
            state.1 += 1;
            return None;
        }
        state.0 = Some(now);
        Some(std::mem::take(&mut state.1))
    }

    /// A backend failure on failure domain `domain`; `opened`: the
    /// failure opened the domain's breaker (or, a probe's, opened it
    /// again); `force`: logged whatever the throttle says (the breaker
    /// opened from closed).
    fn warn(&self, limiter: &str, domain: usize, error: &Error, opened: bool, force: bool) {
        let Some(suppressed) = self.due(force) else {
            return;
        };
        let error: &dyn std::error::Error = error;
        tracing::warn!(
            limiter,
            domain,
            error,
            suppressed,
            breaker_opened = opened,
            "rate-limit backend failure"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_log_throttle_lets_one_line_per_period_and_counts_the_rest() {
        let t = LogThrottle::new(Duration::from_secs(10));
        assert_eq!(t.due(false), Some(0));
        assert_eq!(t.due(false), None);
        assert_eq!(t.due(false), None);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(t.due(false), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(t.due(false), Some(3));
        // A forced line (the breaker opened) always goes out.
        assert_eq!(t.due(true), Some(0));
    }
}
