//! The `metrics` feature: what each kind of decision records, read back
//! from a recording recorder, on tokio's paused clock; and the Grafana
//! dashboard under docs/ queries only metrics the limiters emit.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, Snapshotter};
use tollgate_limiter::aimd::{AimdConfig, AimdLimiter, Outcome};
use tollgate_limiter::{
    Backend, BackendError, BreakerConfig, Decision, ErrorReason, FailMode, Key, Limiter, MockClock,
    Mode, Policy, Request, Scope, TokenBucket, metrics,
};
use tollgate_memory::MemoryBackend;

mod support;
use support::recorded;

/// A snapshot by `name{label=value,...}` (labels sorted).
type Values = BTreeMap<String, DebugValue>;

/// The values recorded since the last snapshot (a snapshot resets them).
fn take(snapshotter: &Snapshotter) -> Values {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            (format!("{}{{{}}}", key.name(), labels.join(",")), value)
        })
        .collect()
}

fn counter(values: &Values, name: &str) -> u64 {
    match values.get(name) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{name}: {other:?} in {values:#?}"),
    }
}

fn gauge(values: &Values, name: &str) -> f64 {
    match values.get(name) {
        Some(DebugValue::Gauge(g)) => g.0,
        other => panic!("{name}: {other:?} in {values:#?}"),
    }
}

fn samples(values: &Values, name: &str) -> Vec<f64> {
    match values.get(name) {
        Some(DebugValue::Histogram(h)) => h.iter().map(|f| f.0).collect(),
        other => panic!("{name}: {other:?} in {values:#?}"),
    }
}

fn decisions(values: &Values, limiter: &str, op: &str, outcome: &str) -> u64 {
    counter(
        values,
        &format!("tollgate_decisions_total{{limiter={limiter},op={op},outcome={outcome}}}"),
    )
}

fn bucket(capacity: u64) -> TokenBucket {
    TokenBucket::new(capacity, 1, Duration::from_secs(60)).unwrap()
}

#[test]
fn decisions_are_counted_by_outcome_and_backend_calls_timed() {
    recorded(|snapshotter| async move {
        let backend = MemoryBackend::with_clock(MockClock::new());
        let closed = Limiter::new("api", bucket(1), backend.clone());
        let open = Limiter::builder("api_open", bucket(1), backend.clone())
            .fail_mode(FailMode::Open)
            .build();
        let k = Key::new("k");
        assert!(closed.check(&k).await.is_allowed());
        assert!(!closed.check(&k).await.is_allowed());
        assert!(!closed.peek(&k).await.is_allowed());
        // A cost the policy can never grant is a refusal, not a failure.
        assert!(!closed.check_cost(&Key::new("big"), 5).await.is_allowed());
        // Latency is the backend call's, on tokio's clock.
        backend.set_delay(Duration::from_millis(3));
        assert!(closed.peek(&Key::new("other")).await.is_allowed());
        backend.set_delay(Duration::from_millis(100));
        assert!(!closed.check(&Key::new("slow")).await.is_allowed());
        backend.set_delay(Duration::ZERO);
        backend.set_failing(true);
        assert!(!closed.check(&k).await.is_allowed());
        assert!(open.check(&k).await.is_allowed());

        let got = take(&snapshotter);
        assert_eq!(decisions(&got, "api", "check", "allowed"), 1);
        assert_eq!(decisions(&got, "api", "check", "refused"), 2);
        assert_eq!(decisions(&got, "api", "check", "failed_closed"), 2);
        assert_eq!(decisions(&got, "api", "check", "failed_open"), 0);
        assert_eq!(decisions(&got, "api", "peek", "refused"), 1);
        assert_eq!(decisions(&got, "api", "peek", "allowed"), 1);
        assert_eq!(decisions(&got, "api_open", "check", "failed_open"), 1);
        assert_eq!(decisions(&got, "api_open", "check", "allowed"), 0);
        let latency = samples(&got, "tollgate_backend_latency_seconds{limiter=api}");
        // Every call that waited for the backend is timed; the three the
        // memory backend answered at once (the two checks of `k` and the
        // impossible cost) took no round trip and are not.
        assert_eq!(latency.len(), 4, "{latency:?}");
        assert!(latency.contains(&0.003), "{latency:?}");
        // The timed-out call is timed at the timeout.
        assert!(latency.contains(&0.05), "{latency:?}");
        let errors = |limiter: &str, reason: &str| {
            counter(
                &got,
                &format!("tollgate_backend_errors_total{{limiter={limiter},reason={reason}}}"),
            )
        };
        assert_eq!(errors("api", "timeout"), 1);
        assert_eq!(errors("api", "error"), 1);
        assert_eq!(errors("api", "breaker_open"), 0);
        assert_eq!(errors("api_open", "error"), 1);
        // The breaker never opened (5 failures in a row open it).
        assert_eq!(gauge(&got, "tollgate_breaker_state{limiter=api}"), 0.0);
        assert_eq!(
            counter(
                &got,
                "tollgate_breaker_transitions_total{limiter=api,to=open}"
            ),
            0
        );
    });
}

/// A backend whose every call fails for the reason it holds, as a
/// refusing server would.
#[derive(Debug)]
struct Refusing(std::sync::Mutex<ErrorReason>);

#[derive(Debug, thiserror::Error)]
#[error("refused: {0}")]
struct Refused(ErrorReason);

impl BackendError for Refused {
    fn reason(&self) -> ErrorReason {
        self.0
    }
}

impl Refusing {
    fn fail(&self) -> Refused {
        Refused(*self.0.lock().unwrap())
    }
}

impl Backend for Refusing {
    type Error = Refused;

    async fn decide(&self, _: Request<'_>) -> Result<Decision, Refused> {
        Err(self.fail())
    }

    async fn set_override(&self, _: Scope<'_>, _: Option<&Policy>) -> Result<(), Refused> {
        Err(self.fail())
    }

    async fn get_override(&self, _: Scope<'_>) -> Result<Option<Policy>, Refused> {
        Err(self.fail())
    }
}

#[test]
fn backend_errors_are_counted_by_the_reason_the_backend_names() {
    recorded(|snapshotter| async move {
        let backend = std::sync::Arc::new(Refusing(std::sync::Mutex::new(ErrorReason::Error)));
        let limiter = Limiter::builder("store", bucket(10), backend.clone())
            // Never open: every call reaches the backend.
            .breaker(BreakerConfig {
                threshold: u32::MAX,
                ..BreakerConfig::default()
            })
            .build();
        let errors = |values: &Values, reason: &str| {
            counter(
                values,
                &format!("tollgate_backend_errors_total{{limiter=store,reason={reason}}}"),
            )
        };
        // Every reason's series exists once the limiter is built, before
        // any failure: the handles are registered with it.
        let built = take(&snapshotter);
        for reason in ErrorReason::ALL {
            assert_eq!(errors(&built, reason.label()), 0, "{reason}");
        }
        let k = Key::new("k");
        for (i, reason) in ErrorReason::ALL.into_iter().enumerate() {
            *backend.0.lock().unwrap() = reason;
            // i + 1 calls for the i-th reason, so a count in the wrong
            // series shows.
            for _ in 0..=i {
                assert!(!limiter.check(&k).await.is_allowed());
            }
        }
        // An override call fails like a decision, for the same reason.
        *backend.0.lock().unwrap() = ErrorReason::OutOfMemory;
        assert!(limiter.set_override(None, None).await.is_err());

        let got = take(&snapshotter);
        assert_eq!(errors(&got, "error"), 1);
        assert_eq!(errors(&got, "out_of_memory"), 2 + 1);
        assert_eq!(errors(&got, "persistence_failed"), 3);
        assert_eq!(errors(&got, "not_enough_replicas"), 4);
        assert_eq!(errors(&got, "busy"), 5);
        assert_eq!(errors(&got, "loading"), 6);
        assert_eq!(errors(&got, "invalid_policy"), 7);
        assert_eq!(errors(&got, "timeout"), 0);
        assert_eq!(errors(&got, "breaker_open"), 0);
        assert_eq!(decisions(&got, "store", "check", "failed_closed"), 28);
        // A failed call is timed like any other.
        assert_eq!(
            samples(&got, "tollgate_backend_latency_seconds{limiter=store}").len(),
            29
        );
    });
}

#[test]
fn breaker_opens_probes_and_closes() {
    recorded(|snapshotter| async move {
        let backend = MemoryBackend::with_clock(MockClock::new());
        let limiter = Limiter::builder("db", bucket(100), backend.clone())
            .breaker(BreakerConfig {
                threshold: 2,
                backoff: Duration::from_secs(1),
                max_backoff: Duration::from_secs(4),
            })
            .build();
        let k = Key::new("k");
        backend.set_failing(true);
        for _ in 0..3 {
            assert!(!limiter.check(&k).await.is_allowed());
        }
        let open = take(&snapshotter);
        let transitions = |values: &Values, to: &str| {
            counter(
                values,
                &format!("tollgate_breaker_transitions_total{{limiter=db,to={to}}}"),
            )
        };
        assert_eq!(transitions(&open, "open"), 1);
        assert_eq!(transitions(&open, "half_open"), 0);
        assert_eq!(gauge(&open, "tollgate_breaker_state{limiter=db}"), 2.0);
        assert_eq!(decisions(&open, "db", "check", "failed_closed"), 3);
        assert_eq!(
            counter(
                &open,
                "tollgate_backend_errors_total{limiter=db,reason=breaker_open}"
            ),
            1
        );
        // The third call never reached the backend: not timed.
        assert_eq!(
            samples(&open, "tollgate_backend_latency_seconds{limiter=db}").len(),
            2
        );

        // A failed probe reopens it; a good one closes it.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!limiter.check(&k).await.is_allowed());
        let reopened = take(&snapshotter);
        assert_eq!(transitions(&reopened, "half_open"), 1);
        assert_eq!(transitions(&reopened, "open"), 1);
        assert_eq!(gauge(&reopened, "tollgate_breaker_state{limiter=db}"), 2.0);
        backend.set_failing(false);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(limiter.check(&k).await.is_allowed());
        let closed = take(&snapshotter);
        assert_eq!(transitions(&closed, "half_open"), 1);
        assert_eq!(transitions(&closed, "closed"), 1);
        assert_eq!(transitions(&closed, "open"), 0);
        assert_eq!(gauge(&closed, "tollgate_breaker_state{limiter=db}"), 0.0);
        assert_eq!(decisions(&closed, "db", "check", "allowed"), 1);
    });
}

#[test]
fn local_denials_and_leases_are_hits_without_a_round_trip() {
    recorded(|snapshotter| async move {
        let backend = MemoryBackend::with_clock(MockClock::new());
        let flood = Limiter::builder("flood", bucket(1), backend.clone())
            .local_denials(Duration::from_secs(60))
            .build();
        let leased = Limiter::builder("leased", bucket(10), backend.clone())
            .fail_mode(FailMode::Open)
            .lease(4, Duration::from_secs(60))
            .build();
        let k = Key::new("k");
        assert!(flood.check(&k).await.is_allowed());
        // Refused by the backend, then from the local cache.
        for _ in 0..3 {
            assert!(!flood.check(&k).await.is_allowed());
        }
        assert!(!flood.peek(&k).await.is_allowed());
        // One round trip takes a batch of 4; three requests spend it.
        for _ in 0..4 {
            assert!(leased.check(&k).await.is_allowed());
        }

        let got = take(&snapshotter);
        let hits = |limiter: &str, kind: &str| {
            counter(
                &got,
                &format!("tollgate_local_hits_total{{kind={kind},limiter={limiter}}}"),
            )
        };
        assert_eq!(hits("flood", "denial"), 3);
        assert_eq!(hits("flood", "lease"), 0);
        assert_eq!(decisions(&got, "flood", "check", "refused"), 3);
        assert_eq!(decisions(&got, "flood", "peek", "refused"), 1);
        assert_eq!(
            samples(&got, "tollgate_backend_latency_seconds{limiter=flood}").len(),
            2
        );
        assert_eq!(hits("leased", "lease"), 3);
        assert_eq!(decisions(&got, "leased", "check", "allowed"), 4);
        assert_eq!(
            samples(&got, "tollgate_backend_latency_seconds{limiter=leased}").len(),
            1
        );
    });
}

#[test]
fn an_adaptive_limiter_counts_its_grants_waits_and_rate_changes() {
    recorded(|snapshotter| async move {
        let clock = MockClock::new();
        let backend = MemoryBackend::with_clock(clock.clone());
        let config = AimdConfig {
            initial_rate: 10.0,
            min_rate: 1.0,
            max_rate: 50.0,
            increase: 1.0,
            decrease: 0.5,
            reaction_window: Duration::from_secs(1),
            ..AimdConfig::default()
        };
        let harvester = AimdLimiter::new("crawler", config, backend.clone()).unwrap();
        // A new limiter's rate is the initial one.
        let built = take(&snapshotter);
        assert_eq!(gauge(&built, "tollgate_aimd_rate{limiter=crawler}"), 10.0);
        let site = Key::new("example.org");
        let advance = |by: Duration| {
            clock.advance(by);
            tokio::time::advance(by)
        };
        assert!(harvester.try_acquire(&site).await.is_ok());
        // The bucket (burst 1) has no second token yet.
        assert!(harvester.try_acquire(&site).await.is_err());
        harvester
            .feedback(&site, Outcome::Refused { retry_after: None })
            .await;
        let first = take(&snapshotter);
        let changes = |values: &Values, change: &str| {
            counter(
                values,
                &format!("tollgate_aimd_rate_changes_total{{change={change},limiter=crawler}}"),
            )
        };
        assert_eq!(changes(&first, "cut"), 1);
        assert_eq!(gauge(&first, "tollgate_aimd_rate{limiter=crawler}"), 5.0);

        advance(Duration::from_secs(2)).await;
        harvester.feedback(&site, Outcome::Success).await;
        let step = take(&snapshotter);
        assert_eq!(changes(&step, "step"), 1);
        assert_eq!(gauge(&step, "tollgate_aimd_rate{limiter=crawler}"), 6.0);

        // A hold is answered locally.
        advance(Duration::from_secs(2)).await;
        harvester
            .feedback(
                &site,
                Outcome::Refused {
                    retry_after: Some(Duration::from_secs(10)),
                },
            )
            .await;
        assert!(harvester.try_acquire(&site).await.is_err());
        // Without the backend, the fallback bucket grants.
        advance(Duration::from_secs(11)).await;
        backend.set_failing(true);
        let grant = harvester.try_acquire(&site).await.unwrap();
        assert!(grant.is_local());

        let last = take(&snapshotter);
        assert_eq!(changes(&last, "cut"), 1);
        assert_eq!(
            counter(
                &last,
                "tollgate_local_hits_total{kind=denial,limiter=crawler}"
            ),
            1
        );
        assert_eq!(decisions(&first, "crawler", "check", "allowed"), 1);
        assert_eq!(decisions(&first, "crawler", "check", "refused"), 1);
        assert_eq!(decisions(&last, "crawler", "check", "refused"), 1);
        assert_eq!(decisions(&last, "crawler", "check", "failed_open"), 1);
        assert!(
            counter(
                &last,
                "tollgate_backend_errors_total{limiter=crawler,reason=error}"
            ) >= 1
        );
        assert!(!samples(&first, "tollgate_backend_latency_seconds{limiter=crawler}").is_empty());
    });
}

#[test]
fn shadow_refusals_are_counted_apart_and_a_candidate_counts_disagreements() {
    recorded(|snapshotter| async move {
        let backend = MemoryBackend::with_clock(MockClock::new());
        let shadow = Limiter::builder("new", bucket(1), backend.clone())
            .mode(Mode::Shadow)
            .build();
        let k = Key::new("k");
        assert!(shadow.check(&k).await.is_allowed());
        for _ in 0..3 {
            let v = shadow.check(&k).await;
            assert!(v.is_allowed() && v.is_shadowed());
            assert!(v.decision().is_some_and(|d| d.is_denied()));
        }
        // Failures a fail-closed limiter would refuse on pass too.
        backend.set_failing(true);
        let v = shadow.check(&k).await;
        assert!(v.is_allowed() && v.error().is_some());
        backend.set_failing(false);

        // Enforced 2, candidate 1: they disagree on the second request.
        let rollout = Limiter::builder("rollout", bucket(2), backend)
            .candidate(bucket(1))
            .build();
        let k = Key::new("k");
        for _ in 0..3 {
            let _ = rollout.check(&k).await;
        }
        assert!(!rollout.peek(&k).await.is_allowed());

        let got = take(&snapshotter);
        assert_eq!(decisions(&got, "new", "check", "allowed"), 1);
        assert_eq!(decisions(&got, "new", "check", "shadow"), 4);
        assert_eq!(decisions(&got, "new", "check", "refused"), 0);
        assert_eq!(decisions(&got, "new", "check", "failed_closed"), 0);
        let verdict = |v: &str| {
            counter(
                &got,
                &format!("tollgate_candidate_decisions_total{{limiter=rollout,verdict={v}}}"),
            )
        };
        assert_eq!(verdict("both_allowed"), 1);
        assert_eq!(verdict("candidate_refuses"), 1);
        // The third check and the peek: both refuse.
        assert_eq!(verdict("both_refused"), 2);
        assert_eq!(verdict("candidate_allows"), 0);
        assert_eq!(decisions(&got, "rollout", "check", "allowed"), 2);
    });
}

/// The names a limiter and an adaptive limiter register when built: every
/// name in [`metrics::NAMES`], each with its help text.
fn emitted() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let out = &mut names;
    recorded(|snapshotter| async move {
        let backend = MemoryBackend::new();
        let _limiter = Limiter::builder("a", bucket(1), backend.clone())
            .candidate(bucket(2))
            .build();
        let _adaptive = AimdLimiter::new("b", AimdConfig::default(), backend).unwrap();
        for (key, _, help, _) in snapshotter.snapshot().into_vec() {
            let name = key.key().name().to_owned();
            assert!(help.is_some(), "{name} has no help text");
            out.insert(name);
        }
    });
    names
}

#[test]
fn the_listed_names_are_the_emitted_ones() {
    let listed: BTreeSet<String> = metrics::NAMES.iter().map(|&n| n.to_owned()).collect();
    assert_eq!(emitted(), listed);
}

/// Every metric the shipped Grafana dashboard queries is one the limiters
/// emit (a histogram's `_bucket`, `_sum` and `_count` series included),
/// in its panels and in its `limiter` variable.
#[test]
fn the_grafana_dashboard_queries_emitted_metrics() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/grafana/tollgate.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 6, "{exprs:?}");
    let emitted = emitted();
    let mut queried = BTreeSet::new();
    for expr in &exprs {
        for name in metric_names(expr) {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| emitted.contains(*b)))
                .unwrap_or(&name)
                .to_owned();
            assert!(
                emitted.contains(&base),
                "the dashboard queries {name}, which no limiter emits: {expr}"
            );
            queried.insert(base);
        }
    }
    // The dashboard shows decisions, latency, the breaker and local hits.
    for name in [
        metrics::DECISIONS,
        metrics::BACKEND_LATENCY,
        metrics::BREAKER_STATE,
        metrics::LOCAL_HITS,
    ] {
        assert!(queried.contains(name), "the dashboard never shows {name}");
    }
}

fn collect_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match v {
                    // Panels' queries, and the limiter variable's.
                    serde_json::Value::String(s)
                        if ["expr", "query", "definition"].contains(&k.as_str()) =>
                    {
                        out.push(s.clone())
                    }
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// The `tollgate_*` identifiers of a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("tollgate_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}
