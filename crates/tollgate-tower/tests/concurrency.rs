//! The concurrency layer and shadow mode in front of plain tower services,
//! on the memory backend with a mock clock.

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tollgate_limiter::{Concurrency, Key, Limiter, MockClock, Mode, SlidingWindow};
use tollgate_memory::MemoryBackend;
use tollgate_tower::RateLimitLayer;
use tollgate_tower::concurrency::ConcurrencyLimitLayer;
use tollgate_tower::respond::ShadowRefusal;
use tower::{Layer, Service, ServiceExt, service_fn};

fn tenant(_: &Request<String>) -> Option<Key> {
    Some(Key::new("tenant-1"))
}

fn limiter(max: u64) -> (Limiter<MemoryBackend<MockClock>>, MockClock) {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let policy = Concurrency::new(max, Duration::from_secs(60)).unwrap();
    (Limiter::new("exports", policy, backend), clock)
}

async fn free_slots(l: &Limiter<MemoryBackend<MockClock>>) -> u64 {
    l.try_peek(&Key::new("tenant-1"), 1)
        .await
        .unwrap()
        .remaining()
}

/// Lets the spawned releases run, then reads the free slots.
async fn settled_free_slots(l: &Limiter<MemoryBackend<MockClock>>, want: u64) -> u64 {
    for _ in 0..1000 {
        if free_slots(l).await == want {
            break;
        }
        tokio::task::yield_now().await;
    }
    free_slots(l).await
}

/// Two leases (60 s each) in steps of 10 s, the backend's clock and the
/// runtime's in step (renewals run on the runtime's timer, every third of
/// the lease), with the one slot held: a request at each step is refused.
async fn refused_for_two_leases<S, Bd>(svc: &mut S, clock: &MockClock)
where
    S: Service<Request<String>, Response = Response<Bd>>,
    S::Error: std::fmt::Debug,
{
    for step in 1..=12 {
        clock.advance(Duration::from_secs(10));
        tokio::time::sleep(Duration::from_secs(10)).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let refused = send(svc).await;
        assert_eq!(
            refused.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{} s in, a second request passed",
            step * 10
        );
    }
}

/// One request through `svc`, once it is ready.
async fn send<S>(svc: &mut S) -> S::Response
where
    S: Service<Request<String>>,
    S::Error: std::fmt::Debug,
{
    svc.ready()
        .await
        .unwrap()
        .call(Request::default())
        .await
        .unwrap()
}

fn ok_service()
-> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
+ Clone
+ Send {
    service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::from("export")))
    })
}

/// Choosing the responder of a layer that was cloned, or already applied
/// to a service, gives a layer on the same slots (it panicked).
#[tokio::test]
async fn a_shared_layer_can_still_choose_its_responder() {
    let (l, _clock) = limiter(1);
    let http = ConcurrencyLimitLayer::new(l.clone(), tenant);
    let mut first = http.layer(ok_service());
    let _kept = http.clone();
    let mut grpc = http.grpc().layer(ok_service());
    let held = send(&mut first).await;
    let refused = send(&mut grpc).await;
    assert_eq!(refused.status(), StatusCode::OK);
    assert_eq!(refused.headers()["grpc-status"], "8");
    drop(held);
}

#[tokio::test]
async fn a_slot_is_held_until_the_body_ends_then_429_is_lifted() {
    let (l, _clock) = limiter(2);
    let mut svc = ConcurrencyLimitLayer::new(l.clone(), tenant).layer(ok_service());
    let a = send(&mut svc).await;
    let b = send(&mut svc).await;
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    assert_eq!(
        a.headers()["ratelimit-policy"].to_str().unwrap(),
        "\"exports\";q=2;w=60"
    );
    let refused = send(&mut svc).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(free_slots(&l).await, 0);
    // The first body is sent to its end: its slot is given back.
    let body = a.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"export");
    assert_eq!(settled_free_slots(&l, 1).await, 1);
    // The second client leaves before its body is sent: dropped, released.
    drop(b);
    assert_eq!(settled_free_slots(&l, 2).await, 2);
}

#[tokio::test]
async fn a_panicking_or_failing_service_gives_its_slot_back() {
    let (l, _clock) = limiter(1);
    let panicking = service_fn(|_req: Request<String>| async {
        if true {
            panic!("handler bug");
        }
        Ok::<Response<String>, Infallible>(Response::new(String::new()))
    });
    let svc = ConcurrencyLimitLayer::new(l.clone(), tenant).layer(panicking);
    let joined = tokio::spawn(svc.oneshot(Request::default())).await;
    assert!(joined.unwrap_err().is_panic());
    assert_eq!(settled_free_slots(&l, 1).await, 1);

    let failing = service_fn(|_req: Request<String>| async {
        Err::<Response<String>, _>(std::io::Error::other("upstream down"))
    });
    let svc = ConcurrencyLimitLayer::new(l.clone(), tenant).layer(failing);
    assert!(svc.oneshot(Request::default()).await.is_err());
    assert_eq!(settled_free_slots(&l, 1).await, 1);
}

/// A worker that dies mid-response never gives its slot back, nor renews
/// it: the slot comes back when its lease runs out.
#[test]
fn a_slot_whose_release_is_lost_comes_back_with_its_lease() {
    let (l, clock) = limiter(1);
    let mut svc = ConcurrencyLimitLayer::new(l, tenant).layer(ok_service());
    let worker = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The body is never dropped; the runtime, with the renewing task, is
    // gone (the release a dropped permit spawns is lost with it).
    std::mem::forget(worker.block_on(send(&mut svc)));
    drop(worker);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let refused = send(&mut svc).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        clock.advance(Duration::from_secs(60));
        let res = send(&mut svc).await;
        assert_eq!(res.status(), StatusCode::OK);
    });
}

/// A client that reads its response slowly decides how long the body
/// lasts: the slot's lease is renewed while it does, so that its slot is
/// not freed under it and a request more let in (two leases here; before,
/// the second request passed once the first lease ran out). Dropped, the
/// body gives the slot back.
#[tokio::test(start_paused = true)]
async fn a_body_read_slowly_keeps_its_slot_past_its_lease() {
    let (l, clock) = limiter(1);
    let mut svc = ConcurrencyLimitLayer::new(l.clone(), tenant).layer(ok_service());
    let held = send(&mut svc).await;
    refused_for_two_leases(&mut svc, &clock).await;
    drop(held);
    assert_eq!(settled_free_slots(&l, 1).await, 1);
    assert_eq!(send(&mut svc).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn shadow_mode_lets_refusals_through_with_an_extension_and_no_headers() {
    let backend = MemoryBackend::with_clock(MockClock::new());
    let policy = SlidingWindow::new(1, Duration::from_secs(60)).unwrap();
    let l = Limiter::builder("new-limit", policy, backend)
        .mode(Mode::Shadow)
        .build();
    let mut svc = RateLimitLayer::new(l, tenant).layer(ok_service());
    let first = send(&mut svc).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert!(first.extensions().get::<ShadowRefusal>().is_none());
    assert!(first.headers().contains_key("ratelimit"));
    let second = send(&mut svc).await;
    assert_eq!(second.status(), StatusCode::OK);
    assert!(!second.headers().contains_key("ratelimit"));
    assert!(!second.headers().contains_key("retry-after"));
    let shadow = second
        .extensions()
        .get::<ShadowRefusal>()
        .expect("shadowed");
    assert_eq!(shadow.limiter, "new-limit");
    assert_eq!(shadow.retry_after, Duration::from_secs(60));
    assert!(shadow.decision.is_some_and(|d| d.is_denied()));
}

#[tokio::test]
async fn a_shadowed_concurrency_limit_holds_nothing_beyond_its_slots() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock);
    let policy = Concurrency::new(1, Duration::from_secs(60)).unwrap();
    let l = Limiter::builder("exports", policy, backend)
        .mode(Mode::Shadow)
        .build();
    let mut svc = ConcurrencyLimitLayer::new(l.clone(), tenant).layer(ok_service());
    let a = send(&mut svc).await;
    let b = send(&mut svc).await;
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    assert!(b.extensions().get::<ShadowRefusal>().is_some());
    // Only the first holds a slot: dropping the second frees nothing.
    drop(b);
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(free_slots(&l).await, 0);
    drop(a);
    assert_eq!(settled_free_slots(&l, 1).await, 1);
}

/// Shadow mode refuses nothing: a request without a key passes (holding
/// no slot), with what enforcement would have answered in its extensions,
/// instead of a 400 from a limiter that was to refuse nothing.
#[tokio::test]
async fn shadow_mode_lets_a_request_without_a_key_pass() {
    let backend = MemoryBackend::new();
    let policy = Concurrency::new(1, Duration::from_secs(60)).unwrap();
    let l = Limiter::builder("exports", policy, backend)
        .mode(Mode::Shadow)
        .build();
    let keyless = |_: &Request<String>| None;
    let mut svc = ConcurrencyLimitLayer::new(l, keyless).layer(ok_service());
    let res = send(&mut svc).await;
    assert_eq!(res.status(), StatusCode::OK);
    let shadowed = res
        .extensions()
        .get::<ShadowRefusal>()
        .expect("the refusal");
    assert_eq!(
        (shadowed.limiter.as_str(), shadowed.decision),
        ("exports", None)
    );
}

/// A concurrency limiter behind the generic `RateLimitLayer` (a
/// configuration that turned a limiter's strategy to `concurrency`, or a
/// `Service` of events with the `Typed` responder) holds each request's
/// slot while the request runs and gives it back with the response, or
/// when the request is dropped (a client gone, a timeout above), in every
/// counting mode. Before, each passed request took a slot that only its
/// lease (here 60 s) freed, so one request a minute got through; counting
/// by outcome took it after the response.
#[tokio::test]
async fn a_rate_limit_layer_over_a_concurrency_limit_frees_each_slot_with_its_response() {
    use std::sync::Arc;

    use tokio::sync::Notify;
    use tollgate_tower::Outcome;

    for by_outcome in [false, true] {
        let (l, _clock) = limiter(1);
        let gate = Arc::new(Notify::new());
        let waiting = Arc::clone(&gate);
        // Answers at once, or (a request for `/hang`) never.
        let svc = service_fn(move |req: Request<String>| {
            let waiting = Arc::clone(&waiting);
            async move {
                if req.uri().path() == "/hang" {
                    waiting.notified().await;
                }
                Ok::<_, Infallible>(Response::new(String::from("export")))
            }
        });
        let layer = RateLimitLayer::new(l.clone(), tenant);
        let mut svc = if by_outcome {
            tower::util::BoxCloneService::new(
                layer
                    .classify(|_: &Response<String>| Outcome::Count)
                    .layer(svc),
            )
        } else {
            tower::util::BoxCloneService::new(layer.layer(svc))
        };
        for i in 0..3 {
            let res = send(&mut svc).await;
            assert_eq!(
                res.status(),
                StatusCode::OK,
                "request {i}, by outcome {by_outcome}"
            );
            assert_eq!(
                settled_free_slots(&l, 1).await,
                1,
                "request {i}, by outcome {by_outcome}"
            );
        }
        // A request in flight holds the slot; dropped, it gives it back.
        let hang = Request::get("/hang").body(String::new()).unwrap();
        let in_flight = tokio::spawn(svc.clone().oneshot(hang));
        assert_eq!(
            settled_free_slots(&l, 0).await,
            0,
            "by outcome {by_outcome}"
        );
        let refused = send(&mut svc).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        in_flight.abort();
        assert!(in_flight.await.unwrap_err().is_cancelled());
        assert_eq!(
            settled_free_slots(&l, 1).await,
            1,
            "by outcome {by_outcome}"
        );
        assert_eq!(send(&mut svc).await.status(), StatusCode::OK);
        drop(gate);
    }
}

/// Under `RateLimitLayer` too, a request that runs longer than its lease
/// (a client sending its body slowly decides how long) keeps its slot: the
/// lease is renewed while the request runs. Before, a second request
/// passed once the first lease ran out.
#[tokio::test(start_paused = true)]
async fn a_rate_limit_layer_keeps_a_slow_requests_slot_past_its_lease() {
    use std::sync::Arc;

    use tokio::sync::Notify;

    let (l, clock) = limiter(1);
    let gate = Arc::new(Notify::new());
    let waiting = Arc::clone(&gate);
    let svc = service_fn(move |req: Request<String>| {
        let waiting = Arc::clone(&waiting);
        async move {
            if req.uri().path() == "/slow" {
                waiting.notified().await;
            }
            Ok::<_, Infallible>(Response::new(String::from("export")))
        }
    });
    let mut svc = RateLimitLayer::new(l.clone(), tenant).layer(svc);
    let slow = Request::get("/slow").body(String::new()).unwrap();
    let slow = tokio::spawn(svc.clone().oneshot(slow));
    tokio::task::yield_now().await;
    assert_eq!(settled_free_slots(&l, 0).await, 0);
    refused_for_two_leases(&mut svc, &clock).await;
    gate.notify_one();
    assert_eq!(slow.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(settled_free_slots(&l, 1).await, 1);
}
