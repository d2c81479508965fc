//! The `metrics` feature: limit refusals and backend failures are counted
//! apart, and every decision's latency is recorded.

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
    assert_eq!(
        count("tollgate_requests_total{limiter=closed,outcome=allowed}"),
        1.0
    );
    assert_eq!(
        count("tollgate_requests_total{limiter=closed,outcome=denied}"),
        1.0
    );
    assert_eq!(
        count("tollgate_requests_total{limiter=closed,outcome=missing_key_rejected}"),
        1.0
    );
    assert_eq!(
        count("tollgate_requests_total{limiter=closed,outcome=unavailable}"),
        1.0
    );
    assert_eq!(
        count("tollgate_requests_total{limiter=open,outcome=failed_open}"),
        1.0
    );
    assert_eq!(
        count("tollgate_backend_failures_total{fail_mode=closed,limiter=closed}"),
        1.0
    );
    assert_eq!(
        count("tollgate_backend_failures_total{fail_mode=open,limiter=open}"),
        1.0
    );
    // Every decision that asked the limiter was timed (not the keyless one).
    assert_eq!(
        count("tollgate_backend_duration_seconds{limiter=closed}"),
        3.0
    );
    assert_eq!(
        count("tollgate_backend_duration_seconds{limiter=open}"),
        1.0
    );
}
