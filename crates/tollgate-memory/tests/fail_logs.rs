//! The limiter's warnings when its backend fails: one line, then quiet
//! with a count. Its own test binary: tracing caches each callsite's
//! interest process-wide, and a test in the same process hitting the same
//! `warn!` from another thread, with no subscriber, could leave it cached
//! as uninteresting before this test's scoped subscriber sees it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_limiter::{BreakerConfig, FailMode, Key, Limiter, TokenBucket};
use tollgate_memory::MemoryBackend;

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

#[tokio::test(start_paused = true)]
async fn failures_are_logged_without_flooding() {
    use tracing_subscriber::layer::SubscriberExt;
    let warnings = Warnings::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let backend = MemoryBackend::new();
    let l = Limiter::builder(
        "api",
        TokenBucket::new(10, 1, Duration::from_secs(1)).unwrap(),
        backend.clone(),
    )
    .fail_mode(FailMode::Open)
    .timeout(Duration::from_millis(50))
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
