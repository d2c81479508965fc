//! Tracing events and, with the `metrics` feature, the one metric only a
//! layer can see (listed in the crate docs). Decisions, latency and
//! backend failures are counted by the limiter itself
//! ([`tollgate_limiter::metrics`]), once, whatever asked it.

use tollgate_limiter::{Decision, Error, Key};

pub(crate) fn denied(limiter: &str, key: &Key, d: &Decision) {
    tracing::debug!(limiter, %key, retry_after = ?d.retry_after(), "rate limited");
}

pub(crate) fn shadowed(limiter: &str, key: &Key, denied: &tollgate_limiter::Denied) {
    // The limiter logs shadowed refusals at info level, throttled.
    tracing::debug!(limiter, %key, retry_after = ?denied.retry_after, "shadow mode: let through");
}

pub(crate) fn denied_cost(limiter: &str, error: &Error) {
    let error: &dyn std::error::Error = error;
    tracing::debug!(limiter, error, "cost above the limit: refused");
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
}

/// A request (or stream item) without a key: the limiter is never asked,
/// so only the layer can count it. Rare (a malformed request), so the
/// label is built per call.
pub(crate) fn missing_key(limiter: &str, allowed: bool) {
    tracing::debug!(limiter, allowed, "request without a rate-limit key");
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "tollgate_missing_key_total",
        "limiter" => limiter.to_owned(),
        "outcome" => if allowed { "allowed" } else { "rejected" }
    )
    .increment(1);
}
