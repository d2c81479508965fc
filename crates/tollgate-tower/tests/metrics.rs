//! The `metrics` feature: a layer's decisions are counted by the limiter,
//! once, limit refusals and backend failures apart; the layer adds the
//! requests without a key, which the limiter never sees.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use tollgate_limiter::{FailMode, Limiter, SlidingWindow};
use tollgate_memory::MemoryBackend;
use tollgate_tower::RateLimitLayer;
use tollgate_tower::extract::{ApiKey, KeyHasher};
use tower::{Layer, ServiceExt, service_fn};

type Store = Arc<Mutex<BTreeMap<String, f64>>>;

/// Counters and histograms (as sample counts), by name and labels.
#[derive(Default)]
struct Capture {
    store: Store,
}

struct Cell {
    name: String,
    store: Store,
}

impl CounterFn for Cell {
    fn increment(&self, value: u64) {
        *self
            .store
            .lock()
            .unwrap()
            .entry(self.name.clone())
            .or_default() += value as f64;
    }
    fn absolute(&self, value: u64) {
        self.store
            .lock()
            .unwrap()
            .insert(self.name.clone(), value as f64);
    }
}

impl HistogramFn for Cell {
    fn record(&self, _value: f64) {
        *self
            .store
            .lock()
            .unwrap()
            .entry(self.name.clone())
            .or_default() += 1.0;
    }
}

impl Capture {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let mut labels: Vec<_> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        Arc::new(Cell {
            name: format!("{}{{{}}}", key.name(), labels.join(",")),
            store: Arc::clone(&self.store),
        })
    }
}

impl Recorder for Capture {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.cell(key))
    }
}

#[test]
fn refusals_and_backend_failures_are_counted_apart() {
    let capture = Capture::default();
    let store = Arc::clone(&capture.store);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The local recorder applies to this thread, where the runtime runs.
    metrics::with_local_recorder(&capture, || {
        rt.block_on(async {
            let backend = MemoryBackend::new();
            let closed = Limiter::new(
                "closed",
                SlidingWindow::new(1, Duration::from_secs(60)).unwrap(),
                backend.clone(),
            );
            let open = Limiter::builder(
                "open",
                SlidingWindow::new(1, Duration::from_secs(60)).unwrap(),
                backend.clone(),
            )
            .fail_mode(FailMode::Open)
            .build();
            let ok = service_fn(|_: Request<()>| async {
                Ok::<_, Infallible>(Response::new(String::new()))
            });
            let closed =
                RateLimitLayer::new(closed, ApiKey::bearer(KeyHasher::unkeyed())).layer(ok);
            let open = RateLimitLayer::new(open, ApiKey::bearer(KeyHasher::unkeyed())).layer(ok);
            let req = |key: Option<&str>| {
                let mut b = Request::builder();
                if let Some(k) = key {
                    b = b.header("authorization", format!("Bearer {k}"));
                }
                b.body(()).unwrap()
            };
            let status = |res: Result<Response<_>, Infallible>| res.unwrap().status();
            assert_eq!(
                status(closed.clone().oneshot(req(Some("k"))).await),
                StatusCode::OK
            );
            assert_eq!(
                status(closed.clone().oneshot(req(Some("k"))).await),
                StatusCode::TOO_MANY_REQUESTS
            );
            assert_eq!(
                status(closed.clone().oneshot(req(None)).await),
                StatusCode::BAD_REQUEST
            );
            backend.set_failing(true);
            assert_eq!(
                status(closed.clone().oneshot(req(Some("k"))).await),
                StatusCode::SERVICE_UNAVAILABLE
            );
            assert_eq!(
                status(open.clone().oneshot(req(Some("k"))).await),
                StatusCode::OK
            );
        });
    });
    let got = store.lock().unwrap().clone();
    let count = |name: &str| got.get(name).copied().unwrap_or(0.0);
    let decisions = |limiter: &str, outcome: &str| {
        count(&format!(
            "tollgate_decisions_total{{limiter={limiter},op=check,outcome={outcome}}}"
        ))
    };
    // The limiter counts what the layer asked it, once.
    assert_eq!(decisions("closed", "allowed"), 1.0);
    assert_eq!(decisions("closed", "refused"), 1.0);
    assert_eq!(decisions("closed", "failed_closed"), 1.0);
    assert_eq!(decisions("open", "failed_open"), 1.0);
    assert_eq!(decisions("open", "allowed"), 0.0);
    // The layer counts only what the limiter never saw.
    assert_eq!(
        count("tollgate_missing_key_total{limiter=closed,outcome=rejected}"),
        1.0
    );
    assert_eq!(
        count("tollgate_backend_errors_total{limiter=closed,reason=error}"),
        1.0
    );
    assert_eq!(
        count("tollgate_backend_errors_total{limiter=open,reason=error}"),
        1.0
    );
    // Every backend call that waited was timed: the failed one. Not the
    // two the memory backend answered at once (no round trip), nor the
    // keyless request.
    assert_eq!(
        count("tollgate_backend_latency_seconds{limiter=closed}"),
        1.0
    );
    assert_eq!(count("tollgate_backend_latency_seconds{limiter=open}"), 1.0);
    // No second count of the same decisions under another name.
    let decided: f64 = got
        .iter()
        .filter(|(name, _)| !name.starts_with("tollgate_backend_latency_seconds"))
        .filter(|(name, _)| !name.starts_with("tollgate_backend_errors_total"))
        .filter(|(name, _)| !name.starts_with("tollgate_missing_key_total"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(decided, 4.0, "{got:#?}");
}
