//! The limiter's warnings when its backend fails: one line, then quiet
//! with a count; with many failure domains (a Redis Cluster's 16 slot
//! ranges), a line for each domain's breaker opening, and the outage
//! after that no more often than one domain's, at most once per 10 s
//! (docs/harvester.md). Its own test binary: tracing caches each
//! callsite's interest process-wide, and a test in the same process
//! hitting the same `warn!` from another thread, with no subscriber, could
//! leave it cached as uninteresting before this test's scoped subscriber
//! sees it (each test here sets its subscriber before any failure).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_limiter::{
    Backend, BreakerConfig, Decision, FailMode, Key, Limiter, LimiterBuilder, Policy, Request,
    Scope, TokenBucket,
};
use tollgate_memory::{MemoryBackend, MemoryError};

/// Collects the warn events the limiter emits.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            struct Fields(String);
            impl tracing::field::Visit for Fields {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    self.0.push_str(&format!("{}={:?} ", f.name(), v));
                }
            }
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            self.0.lock().unwrap().push(fields.0);
        }
    }
}

/// Collects this thread's warnings while the guard lives.
fn collect_warnings() -> (Warnings, tracing::subscriber::DefaultGuard) {
    use tracing_subscriber::layer::SubscriberExt;
    let warnings = Warnings::default();
    let guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    (warnings, guard)
}

/// The limiter of these tests: fail-open, a 50 ms timeout.
fn limiter<B: Backend>(backend: B) -> LimiterBuilder<B> {
    let policy = TokenBucket::new(10, 1, Duration::from_secs(1)).unwrap();
    Limiter::builder("api", policy, backend)
        .fail_mode(FailMode::Open)
        .timeout(Duration::from_millis(50))
}

#[tokio::test(start_paused = true)]
async fn failures_are_logged_without_flooding() {
    let (warnings, _guard) = collect_warnings();
    let backend = MemoryBackend::new();
    let l = limiter(backend.clone())
        .breaker(BreakerConfig {
            threshold: 0,
            ..BreakerConfig::default()
        })
        .build();
    backend.set_failing(true);
    for _ in 0..100 {
        let _ = l.check(&Key::new("a")).await;
    }
    assert_eq!(warnings.0.lock().unwrap().len(), 1);
    tokio::time::advance(Duration::from_secs(10)).await;
    let _ = l.check(&Key::new("a")).await;
    let logged = warnings.0.lock().unwrap().clone();
    assert_eq!(logged.len(), 2);
    assert!(logged[1].contains("suppressed=99"), "{logged:?}");
    assert!(logged[1].contains("limiter=\"api\""), "{logged:?}");
}

const DOMAINS: usize = 16;

/// A memory backend split into 16 failure domains, key `k<n>` in domain
/// `n`: a whole cluster, as far as the limiter's breakers can tell.
#[derive(Clone, Default)]
struct Sixteen(MemoryBackend);

impl Backend for Sixteen {
    type Error = MemoryError;

    fn decide(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<Decision, MemoryError>> + Send {
        self.0.decide(req)
    }

    fn decide_now(&self, req: &Request<'_>) -> Option<Decision> {
        self.0.decide_now(req)
    }

    fn set_override(
        &self,
        scope: Scope<'_>,
        policy: Option<&Policy>,
    ) -> impl Future<Output = Result<(), MemoryError>> + Send {
        self.0.set_override(scope, policy)
    }

    fn get_override(
        &self,
        scope: Scope<'_>,
    ) -> impl Future<Output = Result<Option<Policy>, MemoryError>> + Send {
        self.0.get_override(scope)
    }

    fn failure_domains(&self) -> usize {
        DOMAINS
    }

    fn failure_domain(&self, scope: Scope<'_>) -> usize {
        match scope {
            Scope::Key(_, k) => k.as_str()[1..].parse().unwrap(),
            Scope::Limiter(_) => 0,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_whole_outage_of_many_domains_is_logged_without_flooding() {
    let (warnings, _guard) = collect_warnings();
    let backend = Sixteen::default();
    // The default breaker: open after 5 failures, probe every 0.5-1 s.
    let l = limiter(backend.clone()).build();
    backend.0.set_failing(true);
    let keys: Vec<Key> = (0..DOMAINS).map(|n| Key::new(format!("k{n}"))).collect();
    // A minute of outage, every key asked every 100 ms: each domain's
    // breaker probes about 60 times, and each probe fails.
    let minute = Duration::from_secs(60);
    let step = Duration::from_millis(100);
    for _ in 0..minute.as_millis() / step.as_millis() {
        for k in &keys {
            let _ = l.check(k).await;
        }
        tokio::time::advance(step).await;
    }
    let logged = warnings.0.lock().unwrap().clone();
    let opened: Vec<&String> = logged
        .iter()
        .filter(|l| l.contains("breaker_opened=true"))
        .collect();
    // Each domain's breaker opening is news: one line each, naming it.
    for d in 0..DOMAINS {
        let named = format!("domain={d} ");
        assert!(
            opened.iter().any(|l| l.contains(&named)),
            "no line for domain {d}'s breaker opening: {logged:#?}"
        );
    }
    // The rest of the outage: one line per 10 s (and the first failure).
    let most = DOMAINS + 1 + (minute.as_secs() / 10) as usize;
    assert!(
        logged.len() <= most,
        "{} warnings in a minute of outage (at most {most}), {} of them a breaker \
         (re)opening",
        logged.len(),
        opened.len()
    );
}
