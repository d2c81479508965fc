//! Tracing events and, with the `metrics` feature, metrics (listed in the
//! crate docs).

use tollgate_limiter::{Decision, Error, Key};

#[cfg(feature = "metrics")]
fn count(limiter: &str, outcome: &'static str) {
    metrics::counter!("tollgate_requests_total", "limiter" => limiter.to_owned(), "outcome" => outcome)
        .increment(1);
}

#[cfg(not(feature = "metrics"))]
fn count(_: &str, _: &'static str) {}

pub(crate) fn allowed(limiter: &str) {
    count(limiter, "allowed");
}

pub(crate) fn denied(limiter: &str, key: &Key, d: &Decision) {
    tracing::debug!(limiter, %key, retry_after = ?d.retry_after(), "rate limited");
    count(limiter, "denied");
}

pub(crate) fn denied_cost(limiter: &str, error: &Error) {
    let error: &dyn std::error::Error = error;
    tracing::debug!(limiter, error, "cost above the limit: refused");
    count(limiter, "too_costly");
}

pub(crate) fn backend_failed(limiter: &str, closed: bool, error: &Error) {
    // The limiter already logs backend failures at warn level, throttled;
    // this says what became of the request.
    let error: &dyn std::error::Error = error;
    if closed {
        tracing::debug!(
            limiter,
            error,
            "rate-limit backend failed: refused (fail-closed)"
        );
    } else {
        tracing::debug!(
            limiter,
            error,
            "rate-limit backend failed: let through (fail-open)"
        );
    }
    count(limiter, if closed { "unavailable" } else { "failed_open" });
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "tollgate_backend_failures_total",
        "limiter" => limiter.to_owned(),
        "fail_mode" => if closed { "closed" } else { "open" }
    )
    .increment(1);
}

pub(crate) fn missing_key(limiter: &str, allowed: bool) {
    tracing::debug!(limiter, allowed, "request without a rate-limit key");
    count(
        limiter,
        if allowed {
            "missing_key_allowed"
        } else {
            "missing_key_rejected"
        },
    );
}

/// Times one limiter call (a no-op without the `metrics` feature).
pub(crate) struct Timer {
    #[cfg(feature = "metrics")]
    start: std::time::Instant,
}

impl Timer {
    pub(crate) fn start() -> Self {
        Self {
            #[cfg(feature = "metrics")]
            start: std::time::Instant::now(),
        }
    }

    pub(crate) fn record(self, _limiter: &str) {
        #[cfg(feature = "metrics")]
        metrics::histogram!("tollgate_backend_duration_seconds", "limiter" => _limiter.to_owned())
            .record(self.start.elapsed().as_secs_f64());
    }
}
