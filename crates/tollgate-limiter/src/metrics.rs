//! Metrics of every limiter, through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`).
//!
//! Every consumer reports the same series, whether it is a tower layer, a
//! stream, an [`AimdLimiter`](crate::AimdLimiter) or a direct
//! [`Limiter`](crate::Limiter) call (the repository's `docs/metrics.md`
//! has the details and a Grafana dashboard). The label `limiter` is the limiter's
//! name; a key (an IP, an account, an API key) is never a label, so the
//! number of series is bounded by the number of limiters.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | [`tollgate_decisions_total`](DECISIONS) | counter | `limiter`, `op`, `outcome` | verdicts: `op` is `check` (a charge: [`check`](crate::Limiter::check), [`check_cost`](crate::Limiter::check_cost), [`reserve`](crate::Limiter::reserve), an adaptive [`try_acquire`](crate::AimdLimiter::try_acquire), each attempt of [`acquire`](crate::AimdLimiter::acquire)) or `peek` ([`peek`](crate::Limiter::peek), [`peek_cost`](crate::Limiter::peek_cost)); a limiter's [`try_acquire`](crate::Limiter::try_acquire) and [`try_peek`](crate::Limiter::try_peek) apply no fail mode and are not counted; `outcome` is `allowed`, `refused` (by the limit, or a cost the policy can never grant), `failed_open` or `failed_closed` (the backend failed and the [`FailMode`](crate::FailMode) answered), or `shadow` (a limiter in [shadow mode](crate::shadow) let through what it would have refused or failed closed on); a [`hold`](crate::Limiter::hold) counts as a `check` |
//! | [`tollgate_backend_latency_seconds`](BACKEND_LATENCY) | histogram | `limiter` | the time of each backend call that waits (a round trip to Redis), failed or not; answers given locally, and those an in-process backend (the memory backend) gives at once, are not timed |
//! | [`tollgate_backend_errors_total`](BACKEND_ERRORS) | counter | `limiter`, `reason` | backend calls that gave no answer: `reason` is `timeout`, `breaker_open` (not attempted), a condition the backend's error names ([`ErrorReason`] through [`reason`](crate::BackendError::reason): `out_of_memory`, `persistence_failed`, `not_enough_replicas`, `busy`, `loading`, the refusals of a running Redis; `invalid_policy`, a stored override that is no policy), or `error` (any other failure); a fixed set, all registered with the limiter |
//! | [`tollgate_breaker_transitions_total`](BREAKER_TRANSITIONS) | counter | `limiter`, `to` | circuit-breaker state changes, by the state entered: `open`, `half_open` (a probe goes through), `closed`; summed over the limiter's breakers (one per failure domain) |
//! | [`tollgate_breaker_state`](BREAKER_STATE) | gauge | `limiter` | `0` closed, `1` half-open, `2` open; the worst over the limiter's breakers, one per [failure domain](crate::Backend::failure_domains) of its backend (a Redis Cluster's slot ranges): `2` while any of them is open, so a part of the keys may still be decided |
//! | [`tollgate_local_hits_total`](LOCAL_HITS) | counter | `limiter`, `kind` | decisions answered without a round trip: `denial` (a key known to be over its limit, [`local_denials`](crate::LimiterBuilder::local_denials), or an adaptive scope on hold), `lease` (a unit of a [lease](crate::LimiterBuilder::lease)) |
//! | [`tollgate_candidate_decisions_total`](CANDIDATE_DECISIONS) | counter | `limiter`, `verdict` | a limiter's [candidate policy](crate::LimiterBuilder::candidate) beside the enforced one, per backend decision: `verdict` is `both_allowed`, `both_refused`, `candidate_refuses` (enforced allows, the candidate would refuse), `candidate_allows` (enforced refuses, the candidate would allow) or `candidate_failed` (no candidate decision); registered only for limiters with a candidate |
//! | [`tollgate_aimd_rate_changes_total`](AIMD_RATE_CHANGES) | counter | `limiter`, `change` | adaptive rate changes made by this worker: `cut` (after a refusal), `step` (up, after successes) |
//! | [`tollgate_aimd_rate`](AIMD_RATE) | gauge | `limiter` | the rate, in requests per second, this worker most recently set or read for any of the limiter's scopes (the initial rate until then) |
//!
//! Each limiter registers its series when it is built and keeps the
//! handles, so a decision costs a few atomic increments and never
//! allocates. **Install the recorder (an exporter) before building the
//! limiters**: a limiter built before holds handles that record nothing.
//! Limiters sharing a name share their series. Without the feature,
//! nothing is recorded and nothing is compiled in.
//!
//! The latency histogram's buckets are the exporter's choice;
//! [`LATENCY_BUCKETS`] suits a Redis on the same network, e.g. for
//! `metrics-exporter-prometheus`:
//!
//! ```no_run
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! PrometheusBuilder::new()
//!     .set_buckets_for_metric(
//!         Matcher::Full(tollgate_limiter::metrics::BACKEND_LATENCY.into()),
//!         tollgate_limiter::metrics::LATENCY_BUCKETS,
//!     )?
//!     .install_recorder()?;
//! # Ok(())
//! # }
//! ```

/// Decisions by limiter, operation and outcome (counter).
pub const DECISIONS: &str = "tollgate_decisions_total";
/// The time of each backend call, in seconds (histogram).
pub const BACKEND_LATENCY: &str = "tollgate_backend_latency_seconds";
/// Backend calls that gave no answer, by reason (counter).
pub const BACKEND_ERRORS: &str = "tollgate_backend_errors_total";
/// Circuit-breaker state changes, by the state entered (counter).
pub const BREAKER_TRANSITIONS: &str = "tollgate_breaker_transitions_total";
/// The circuit breaker's state: 0 closed, 1 half-open, 2 open, the worst
/// over the limiter's failure domains (gauge).
pub const BREAKER_STATE: &str = "tollgate_breaker_state";
/// Decisions answered without a round trip, by kind (counter).
pub const LOCAL_HITS: &str = "tollgate_local_hits_total";
/// A candidate policy's verdicts beside the enforced one's (counter).
pub const CANDIDATE_DECISIONS: &str = "tollgate_candidate_decisions_total";
/// Adaptive rate changes, by change (counter).
pub const AIMD_RATE_CHANGES: &str = "tollgate_aimd_rate_changes_total";
/// The adaptive rate most recently set or read, in requests per second
/// (gauge).
pub const AIMD_RATE: &str = "tollgate_aimd_rate";

/// Every metric the limiters emit.
pub const NAMES: &[&str] = &[
    DECISIONS,
    BACKEND_LATENCY,
    BACKEND_ERRORS,
    BREAKER_TRANSITIONS,
    BREAKER_STATE,
    LOCAL_HITS,
    CANDIDATE_DECISIONS,
    AIMD_RATE_CHANGES,
    AIMD_RATE,
];

/// Histogram buckets for [`BACKEND_LATENCY`], in seconds: 100 µs to 250 ms,
/// around the default 50 ms timeout.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];

use crate::error::{Error, ErrorReason};
use crate::limiter::Verdict;

/// Which limiter call a decision answers (the `op` label).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Call {
    Check = 0,
    Peek = 1,
}

/// What a decision answered (the `outcome` label).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    Allowed = 0,
    Refused = 1,
    FailedOpen = 2,
    FailedClosed = 3,
    Shadowed = 4,
}

impl Outcome {
    /// A backend's decision.
    #[inline]
    pub(crate) fn of_decision(d: &crate::Decision) -> Self {
        match d.is_allowed() {
            true => Self::Allowed,
            false => Self::Refused,
        }
    }

    pub(crate) fn of(verdict: &Verdict) -> Self {
        match verdict {
            Verdict::Decided(d) => Self::of_decision(d),
            Verdict::FailedOpen(_) => Self::FailedOpen,
            // A cost that can never pass is refused by the policy, not by
            // a failing backend.
            Verdict::FailedClosed(e, _) if !e.is_unavailable() => Self::Refused,
            Verdict::FailedClosed(..) => Self::FailedClosed,
            Verdict::Shadowed(_) => Self::Shadowed,
        }
    }
}

/// A candidate's verdict beside the enforced one's (the `verdict` label).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Agreement {
    BothAllowed = 0,
    BothRefused = 1,
    CandidateRefuses = 2,
    CandidateAllows = 3,
    CandidateFailed = 4,
}

impl Agreement {
    pub(crate) fn of(enforced: &crate::Decision, candidate: Option<&crate::Decision>) -> Self {
        match (
            enforced.is_allowed(),
            candidate.map(crate::Decision::is_allowed),
        ) {
            (_, None) => Self::CandidateFailed,
            (true, Some(true)) => Self::BothAllowed,
            (false, Some(false)) => Self::BothRefused,
            (true, Some(false)) => Self::CandidateRefuses,
            (false, Some(true)) => Self::CandidateAllows,
        }
    }
}

/// What answered without a round trip (the `kind` label).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Local {
    Denial = 0,
    Lease = 1,
}

/// A circuit-breaker state (the `to` label; the gauge's value): ordered
/// from the best to the worst.
#[derive(Debug, Clone, Copy)]
pub(crate) enum BreakerState {
    Closed = 0,
    HalfOpen = 1,
    Open = 2,
}

/// An adaptive rate change (the `change` label).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Change {
    Cut = 0,
    Step = 1,
}

#[cfg(feature = "metrics")]
pub(crate) use on::{AimdMeter, BreakerMeter, CandidateMeter, Meter, Stopwatch};

#[cfg(not(feature = "metrics"))]
pub(crate) use off::{AimdMeter, BreakerMeter, CandidateMeter, Meter, Stopwatch};

#[cfg(feature = "metrics")]
mod on {
    use ::metrics::{
        Counter, Gauge, Histogram, Unit, counter, describe_counter, describe_gauge,
        describe_histogram, gauge, histogram,
    };
    use tokio::time::Instant;

    use super::*;

    const OPS: [&str; 2] = ["check", "peek"];
    const OUTCOMES: [&str; 5] = [
        "allowed",
        "refused",
        "failed_open",
        "failed_closed",
        "shadow",
    ];

    /// The limiter's own `reason`s of [`BACKEND_ERRORS`], at these indices
    /// of `Meter::errors`; the backend's ([`ErrorReason::ALL`]) follow.
    const OWN_REASONS: [&str; 2] = ["timeout", "breaker_open"];
    const TIMEOUT: usize = 0;
    const BREAKER_OPEN: usize = 1;

    // `ErrorReason::ALL[i]` is the reason of discriminant `i`: a reason's
    // handle is found by its discriminant.
    const _: () = {
        let mut i = 0;
        while i < ErrorReason::ALL.len() {
            assert!(ErrorReason::ALL[i] as usize == i);
            i += 1;
        }
    };

    /// A limiter's handles, registered once when it is built.
    #[derive(Debug)]
    pub(crate) struct Meter {
        decisions: [[Counter; 5]; 2],
        local: [Counter; 2],
        latency: Histogram,
        /// By [`OWN_REASONS`], then [`ErrorReason::ALL`]: registered with
        /// the limiter, so that a refusal, like any failure, looks up a
        /// handle and allocates nothing.
        errors: [Counter; OWN_REASONS.len() + ErrorReason::ALL.len()],
    }

    /// When a backend call started; `None` for an answer given at once,
    /// in-process, recorded as taking no time (see `Meter::unstarted`).
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Stopwatch(Option<Instant>);

    impl Meter {
        pub(crate) fn new(name: &str) -> Self {
            describe();
            let limiter = || name.to_owned();
            Self {
                decisions: OPS.map(|op| {
                    OUTCOMES.map(|outcome| {
                        counter!(DECISIONS, "limiter" => limiter(), "op" => op, "outcome" => outcome)
                    })
                }),
                local: ["denial", "lease"]
                    .map(|kind| counter!(LOCAL_HITS, "limiter" => limiter(), "kind" => kind)),
                latency: histogram!(BACKEND_LATENCY, "limiter" => limiter()),
                errors: std::array::from_fn(|i| {
                    let reason = OWN_REASONS.get(i).copied().unwrap_or_else(|| {
                        ErrorReason::ALL[i - OWN_REASONS.len()].label()
                    });
                    counter!(BACKEND_ERRORS, "limiter" => limiter(), "reason" => reason)
                }),
            }
        }

        pub(crate) fn decision(&self, call: Call, outcome: Outcome) {
            self.decisions[call as usize][outcome as usize].increment(1);
        }

        pub(crate) fn local_hit(&self, kind: Local) {
            self.local[kind as usize].increment(1);
        }

        pub(crate) fn start(&self) -> Stopwatch {
            Stopwatch(Some(Instant::now()))
        }

        /// A stopwatch for a call an in-process backend may answer at once:
        /// such an answer is not timed (see [`answered`](Self::answered)),
        /// and [`start`](Self::start)s only when the call waits.
        pub(crate) fn unstarted(&self) -> Stopwatch {
            Stopwatch(None)
        }

        /// A backend call, started at `watch`, that answered. One answered
        /// at once by an in-process backend is not recorded: it took no
        /// round trip (well under a microsecond, always the first bucket),
        /// so the sample would say nothing, and recording it was ~170
        /// instructions of a ~900-instruction decision behind a tower layer
        /// (callgrind, the API-key example). The decision counter counts it.
        #[inline]
        pub(crate) fn answered(&self, watch: Stopwatch) {
            if let Some(at) = watch.0 {
                self.latency.record(at.elapsed().as_secs_f64());
            }
        }

        /// A backend call, started at `watch`, that gave no answer: `e`,
        /// for `reason` (read from the backend's error).
        pub(crate) fn failed_call(&self, watch: Stopwatch, e: &Error, reason: ErrorReason) {
            self.latency.record(Self::elapsed(watch));
            let i = match e {
                Error::Timeout(_) => TIMEOUT,
                Error::BreakerOpen => BREAKER_OPEN,
                _ => OWN_REASONS.len() + reason as usize,
            };
            self.errors[i].increment(1);
        }

        /// A call the open breaker did not let through.
        pub(crate) fn breaker_open(&self) {
            self.errors[BREAKER_OPEN].increment(1);
        }

        fn elapsed(watch: Stopwatch) -> f64 {
            watch.0.map_or(0.0, |at| at.elapsed().as_secs_f64())
        }
    }

    /// The handles of a limiter's breakers, one per failure domain.
    #[derive(Debug)]
    pub(crate) struct BreakerMeter {
        transitions: [Counter; 3],
        state: Gauge,
        /// Each domain's state: the gauge is the worst of them, set under
        /// this lock so that two domains changing at once cannot leave it
        /// at the one that computed first.
        domains: std::sync::Mutex<Box<[BreakerState]>>,
    }

    impl BreakerMeter {
        pub(crate) fn new(name: &str, domains: usize) -> Self {
            let state = gauge!(BREAKER_STATE, "limiter" => name.to_owned());
            state.set(f64::from(BreakerState::Closed as u8));
            Self {
                transitions: ["closed", "half_open", "open"].map(
                    |to| counter!(BREAKER_TRANSITIONS, "limiter" => name.to_owned(), "to" => to),
                ),
                state,
                domains: std::sync::Mutex::new(
                    vec![BreakerState::Closed; domains.max(1)].into_boxed_slice(),
                ),
            }
        }

        /// `domain`'s breaker entered `to` (rare: off the decisions' path).
        pub(crate) fn transition(&self, domain: usize, to: BreakerState) {
            self.transitions[to as usize].increment(1);
            let mut states = crate::lock(&self.domains);
            if let Some(s) = states.get_mut(domain) {
                *s = to;
            }
            let worst = states.iter().map(|&s| s as u8).max().unwrap_or(0);
            self.state.set(f64::from(worst));
        }
    }

    /// A candidate policy's handles.
    #[derive(Debug)]
    pub(crate) struct CandidateMeter {
        verdicts: [Counter; 5],
    }

    impl CandidateMeter {
        pub(crate) fn new(name: &str) -> Self {
            describe_counter!(
                CANDIDATE_DECISIONS,
                "A candidate policy's verdicts beside the enforced policy's, by agreement"
            );
            Self {
                verdicts: [
                    "both_allowed",
                    "both_refused",
                    "candidate_refuses",
                    "candidate_allows",
                    "candidate_failed",
                ]
                .map(
                    |v| counter!(CANDIDATE_DECISIONS, "limiter" => name.to_owned(), "verdict" => v),
                ),
            }
        }

        pub(crate) fn record(&self, a: Agreement) {
            self.verdicts[a as usize].increment(1);
        }
    }

    /// An adaptive limiter's own handles.
    #[derive(Debug)]
    pub(crate) struct AimdMeter {
        changes: [Counter; 2],
        rate: Gauge,
    }

    impl AimdMeter {
        pub(crate) fn new(name: &str) -> Self {
            Self {
                changes: ["cut", "step"].map(
                    |change| counter!(AIMD_RATE_CHANGES, "limiter" => name.to_owned(), "change" => change),
                ),
                rate: gauge!(AIMD_RATE, "limiter" => name.to_owned()),
            }
        }

        pub(crate) fn change(&self, change: Change, rate: f64) {
            self.changes[change as usize].increment(1);
            self.rate(rate);
        }

        pub(crate) fn rate(&self, rate: f64) {
            self.rate.set(rate);
        }
    }

    /// Gives the exporter each metric's help text and unit.
    fn describe() {
        describe_counter!(
            DECISIONS,
            "Rate-limit decisions, by limiter, operation (check, peek) and outcome"
        );
        describe_histogram!(
            BACKEND_LATENCY,
            Unit::Seconds,
            "Time of each rate-limit backend call"
        );
        describe_counter!(
            BACKEND_ERRORS,
            "Rate-limit backend calls that gave no answer, by reason"
        );
        describe_counter!(
            BREAKER_TRANSITIONS,
            "Circuit-breaker state changes, by the state entered"
        );
        describe_gauge!(
            BREAKER_STATE,
            "Circuit-breaker state, the worst over the failure domains: 0 closed, 1 half-open, 2 open"
        );
        describe_counter!(
            LOCAL_HITS,
            "Rate-limit decisions answered without a backend round trip, by kind"
        );
        describe_counter!(
            AIMD_RATE_CHANGES,
            "Adaptive rate changes made by this worker (cut, step)"
        );
        describe_gauge!(
            AIMD_RATE,
            "Adaptive rate most recently set or read by this worker, requests per second"
        );
    }
}

/// Without the feature: the same calls, recording nothing.
#[cfg(not(feature = "metrics"))]
mod off {
    use super::*;

    #[derive(Debug)]
    pub(crate) struct Meter;

    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Stopwatch;

    impl Meter {
        pub(crate) fn new(_: &str) -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn decision(&self, _: Call, _: Outcome) {}
        #[inline(always)]
        pub(crate) fn local_hit(&self, _: Local) {}
        #[inline(always)]
        pub(crate) fn start(&self) -> Stopwatch {
            Stopwatch
        }
        #[inline(always)]
        pub(crate) fn unstarted(&self) -> Stopwatch {
            Stopwatch
        }
        #[inline(always)]
        pub(crate) fn answered(&self, _: Stopwatch) {}
        #[inline(always)]
        pub(crate) fn failed_call(&self, _: Stopwatch, _: &Error, _: ErrorReason) {}
        #[inline(always)]
        pub(crate) fn breaker_open(&self) {}
    }

    #[derive(Debug)]
    pub(crate) struct BreakerMeter;

    impl BreakerMeter {
        pub(crate) fn new(_: &str, _: usize) -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn transition(&self, _: usize, _: BreakerState) {}
    }

    #[derive(Debug)]
    pub(crate) struct CandidateMeter;

    impl CandidateMeter {
        pub(crate) fn new(_: &str) -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn record(&self, _: Agreement) {}
    }

    #[derive(Debug)]
    pub(crate) struct AimdMeter;

    impl AimdMeter {
        pub(crate) fn new(_: &str) -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn change(&self, _: Change, _: f64) {}
        #[inline(always)]
        pub(crate) fn rate(&self, _: f64) {}
    }
}
