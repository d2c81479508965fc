//! The layer against a simulated source, on tokio's paused clock.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tollgate_limiter::aimd::{AimdConfig, AimdLimiter, Outcome};
use tollgate_limiter::time::micros;
use tollgate_limiter::{Clock, Key, Timestamp};
use tollgate_memory::MemoryBackend;
use tower::{Service, ServiceExt, service_fn};

use super::AdaptiveLayer;
use tower_layer::Layer;

/// A backend clock that follows tokio's paused clock.
#[derive(Debug, Clone)]
struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        1_767_225_600_000_000 + micros(self.0.elapsed())
    }
}

type Backend = MemoryBackend<TokioClock>;

fn limiter(initial_rate: f64) -> AimdLimiter<Backend> {
    let config = AimdConfig {
        initial_rate,
        min_rate: 0.1,
        max_rate: 200.0,
        increase: 2.0,
        reaction_window: Duration::from_millis(500),
        ..AimdConfig::default()
    };
    let backend = MemoryBackend::with_clock(TokioClock(Instant::now()));
    AimdLimiter::new("harvester", config, backend).unwrap()
}

/// Reports that `host` refused a call with a `Retry-After` of `secs`.
async fn refused(limiter: &AimdLimiter<Backend>, host: &str, secs: u64) {
    let retry_after = Some(Duration::from_secs(secs));
    limiter
        .feedback(&Key::new(host), Outcome::Refused { retry_after })
        .await;
}

/// A source serving `rate` requests per second (capacity 1) and answering
/// 429 with `Retry-After: 1` above it.
#[derive(Debug)]
struct Source {
    rate: f64,
    next: Mutex<Option<Instant>>,
    served: AtomicU64,
    refused: AtomicU64,
}

impl Source {
    fn new(rate: f64) -> Arc<Self> {
        Arc::new(Self {
            rate,
            next: Mutex::new(None),
            served: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        })
    }

    fn answer(&self) -> Response<&'static str> {
        let now = Instant::now();
        let mut next = self.next.lock().unwrap();
        if next.is_none_or(|t| t <= now) {
            *next =
                Some(next.map_or(now, |t| t.max(now)) + Duration::from_secs_f64(1.0 / self.rate));
            self.served.fetch_add(1, Ordering::SeqCst);
            Response::new("page")
        } else {
            self.refused.fetch_add(1, Ordering::SeqCst);
            Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .header("retry-after", "1")
                .body("slow down")
                .unwrap()
        }
    }
}

fn client(
    source: &Arc<Source>,
) -> impl Service<Request<()>, Response = Response<&'static str>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    let source = Arc::clone(source);
    service_fn(move |_req: Request<()>| {
        let source = Arc::clone(&source);
        async move {
            // Time on the wire.
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, Infallible>(source.answer())
        }
    })
}

#[tokio::test(start_paused = true)]
async fn converges_on_the_source_rate_through_the_layer() {
    let limiter = limiter(1.0);
    let source = Source::new(20.0);
    let layer = AdaptiveLayer::new(limiter.clone());
    let scope = Key::new("source.test");
    let until = Instant::now() + Duration::from_secs(120);
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let svc = layer.layer(client(&source));
            tokio::spawn(async move {
                while Instant::now() < until {
                    let req = Request::get("http://source.test/page").body(()).unwrap();
                    svc.clone().oneshot(req).await.unwrap();
                }
            })
        })
        .collect();
    let mut samples = Vec::new();
    let start = Instant::now();
    while Instant::now() < until {
        if start.elapsed() > Duration::from_secs(30) {
            samples.push(limiter.shared_rate(&scope).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    assert!((mean - 20.0).abs() <= 0.2 * 20.0, "mean rate {mean}");
    // Each refusal held the site for its Retry-After, so refusals stay rare.
    let served = source.served.load(Ordering::SeqCst);
    let refused = source.refused.load(Ordering::SeqCst);
    assert!(refused * 10 < served, "served {served}, refused {refused}");
}

#[tokio::test(start_paused = true)]
async fn a_refusal_cuts_the_rate_and_holds_the_host() {
    let limiter = limiter(10.0);
    let source = Source::new(1.0);
    let mut svc = AdaptiveLayer::new(limiter.clone()).layer(client(&source));
    let scope = Key::new("source.test");
    let get = || Request::get("http://source.test/").body(()).unwrap();

    let ok = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(limiter.shared_rate(&scope).await.unwrap(), 12.0);
    let refused = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limiter.shared_rate(&scope).await.unwrap(), 12.0 * 0.75);

    // The next call waits out the Retry-After before leaving.
    let start = Instant::now();
    let ok = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn other_hosts_and_scopeless_calls_are_not_held() {
    let limiter = limiter(1.0);
    let source = Source::new(1.0);
    let svc = AdaptiveLayer::new(limiter.clone()).layer(client(&source));
    refused(&limiter, "source.test", 30).await;
    let start = Instant::now();
    let req = Request::get("http://other.test/").body(()).unwrap();
    svc.clone().oneshot(req).await.unwrap();
    let req = Request::get("/relative-without-host").body(()).unwrap();
    svc.clone().oneshot(req).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn transport_errors_leave_the_rate_alone() {
    let limiter = limiter(4.0);
    let failing =
        service_fn(|_req: Request<()>| async { Err::<Response<()>, _>("connection reset") });
    let svc = AdaptiveLayer::new(limiter.clone())
        .scope(|_: &Request<()>| Some(Key::new("account-7")))
        .layer(failing);
    for _ in 0..3 {
        let req = Request::get("http://source.test/").body(()).unwrap();
        assert!(svc.clone().oneshot(req).await.is_err());
    }
    assert_eq!(
        limiter.shared_rate(&Key::new("account-7")).await.unwrap(),
        4.0
    );
}

/// A caller that gives up once the source has answered (a timeout layer
/// around the client, as the docs advise for long `Retry-After`s) must not
/// lose the source's refusal: the report is the fleet's only signal to
/// slow down, and the cut's local gate, once set, keeps this worker from
/// cutting again for a whole reaction window.
#[tokio::test(start_paused = true)]
async fn a_refusal_is_reported_even_if_the_caller_goes_away() {
    let backend = MemoryBackend::with_clock(TokioClock(Instant::now()));
    let config = AimdConfig {
        initial_rate: 10.0,
        decrease: 0.5,
        reaction_window: Duration::from_secs(5),
        ..AimdConfig::default()
    };
    let limiter = AimdLimiter::new("harvester", config, backend.clone()).unwrap();
    let scope = Key::new("source.test");
    let slow_backend = backend.clone();
    let svc = AdaptiveLayer::new(limiter.clone()).layer(service_fn(move |_req: Request<()>| {
        // The backend slows down while the refusal is reported.
        slow_backend.set_delay(Duration::from_millis(20));
        async {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .body("slow down")
                    .unwrap(),
            )
        }
    }));
    let req = || Request::get("http://source.test/page").body(()).unwrap();
    // The caller's deadline passes while the refusal is being reported.
    let gone = tokio::time::timeout(Duration::from_millis(10), svc.clone().oneshot(req())).await;
    assert!(gone.is_err(), "the report was to outlast the caller");
    backend.clear_faults();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(limiter.rate(&scope), 5.0, "the refusal was not reported");
    // Another refusal in the same window: one cut per window, not none.
    backend.clear_faults();
    let res = AdaptiveLayer::new(limiter.clone())
        .layer(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .body("slow down")
                    .unwrap(),
            )
        }))
        .oneshot(req())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limiter.rate(&scope), 5.0);
}

/// What the inner client reserves by being ready (a `ConcurrencyLimit`'s
/// permit, a `Buffer`'s slot) must not be held while a call waits out its
/// host's `Retry-After`: a call to another host would wait for it, the
/// whole crawler stalled behind one host's hold.
#[tokio::test(start_paused = true)]
async fn a_held_host_keeps_no_slot_of_the_inner_client() {
    let limiter = limiter(1.0);
    let source = Source::new(100.0);
    let svc = AdaptiveLayer::new(limiter.clone())
        .layer(tower::limit::ConcurrencyLimit::new(client(&source), 1));
    refused(&limiter, "held.test", 60).await;
    let req = Request::get("http://held.test/").body(()).unwrap();
    let held = tokio::spawn(svc.clone().oneshot(req));
    // The held call is now waiting for its token.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let req = Request::get("http://other.test/").body(()).unwrap();
    let other = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    assert!(
        !held.is_finished(),
        "the call to another host went out only after the held one"
    );
    // The held call goes out once its hold is over.
    assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// A call granted its token while the inner client was busy (a
/// `ConcurrencyLimit`, a `Buffer` full) waits for it after the token; if
/// the host answers another call with a `Retry-After` meanwhile, the
/// waiting call must not go out during the hold. Before, every call
/// holding a token went out as soon as the client was ready, inside the
/// hold the source had just asked for.
#[tokio::test(start_paused = true)]
async fn a_call_ready_during_a_hold_waits_it_out() {
    let limiter = limiter(10.0);
    let start = Instant::now();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&sent);
    let inner = service_fn(move |req: Request<()>| {
        let log = Arc::clone(&log);
        async move {
            log.lock()
                .unwrap()
                .push((req.uri().path().to_owned(), start.elapsed()));
            if req.uri().path() == "/slow" {
                // The first call: answered after a second, with a hold.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let res = Response::builder()
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .header("retry-after", "60")
                    .body("slow down")
                    .unwrap();
                return Ok::<_, Infallible>(res);
            }
            Ok(Response::new("page"))
        }
    });
    let svc =
        AdaptiveLayer::new(limiter.clone()).layer(tower::limit::ConcurrencyLimit::new(inner, 1));
    let call = |path: &str| {
        let req = Request::get(format!("http://held.test{path}"))
            .body(())
            .unwrap();
        tokio::spawn(svc.clone().oneshot(req))
    };
    // The host's token is spent: every call waits for its own, at 10/s.
    limiter.acquire(&Key::new("held.test")).await.unwrap();
    let slow = call("/slow");
    // Ready at once (what a ready client reserved goes back while a call
    // waits for its token), granted their tokens, then waiting for the
    // client, which the slow call keeps.
    let waiting: Vec<_> = (0..5).map(|i| call(&format!("/page/{i}"))).collect();
    assert_eq!(
        slow.await.unwrap().unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    for call in waiting {
        assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    let sent = sent.lock().unwrap().clone();
    let slow_sent = sent.iter().find(|(path, _)| path == "/slow").unwrap().1;
    let slow_answered = slow_sent + Duration::from_secs(1);
    let during_hold: Vec<_> = sent
        .iter()
        .filter(|(_, at)| *at >= slow_answered && *at < slow_answered + Duration::from_secs(60))
        .collect();
    assert!(
        during_hold.is_empty(),
        "sent during the hold: {during_hold:?}"
    );
}

/// A call whose token was granted while its caller held it unpolled (a
/// `select!` busy with another branch) does not go out inside a hold the
/// source asked for meanwhile.
#[tokio::test(start_paused = true)]
async fn a_call_granted_before_a_hold_waits_it_out() {
    let limiter = limiter(1.0);
    let source = Source::new(100.0);
    let mut svc = AdaptiveLayer::new(limiter.clone()).layer(client(&source));
    limiter.acquire(&Key::new("held.test")).await.unwrap();
    let req = Request::get("http://held.test/").body(()).unwrap();
    let mut call = Box::pin(svc.ready().await.unwrap().call(req));
    // Polled once: queued for the next token, a second away.
    let polled = tokio::time::timeout(Duration::from_millis(1), &mut call).await;
    assert!(polled.is_err());
    // The token is granted while nobody polls the call; then the source
    // asks for a minute's hold.
    tokio::time::sleep(Duration::from_secs(2)).await;
    refused(&limiter, "held.test", 60).await;
    let start = Instant::now();
    assert_eq!(call.await.unwrap().status(), StatusCode::OK);
    assert!(
        start.elapsed() >= Duration::from_secs(60),
        "went out {:?} into the hold",
        start.elapsed()
    );
}

/// Polls `future` to completion on this thread, outside any tokio runtime.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}

/// Driven outside a tokio runtime (another executor), the layer cannot
/// wait for a token: the call goes out unlimited, as the adaptive limit
/// fails open, and its answer is still reported. It panicked ("there is
/// no reactor running") at the first call that had to wait.
#[test]
fn outside_a_runtime_calls_go_out_unlimited() {
    let config = AimdConfig {
        initial_rate: 1.0,
        ..AimdConfig::default()
    };
    let limiter = AimdLimiter::new("harvester", config, MemoryBackend::new()).unwrap();
    let served = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&served);
    let svc = AdaptiveLayer::new(limiter).layer(service_fn(move |_req: Request<()>| {
        count.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new("page")) }
    }));
    let calls = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..3 {
            let req = Request::get("http://source.test/").body(()).unwrap();
            let res = block_on(svc.clone().oneshot(req)).unwrap();
            assert_eq!(res.status(), StatusCode::OK);
        }
    }));
    assert!(calls.is_ok(), "the layer panicked outside a runtime");
    assert_eq!(served.load(Ordering::SeqCst), 3);
}
