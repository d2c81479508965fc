//! Costs through the layer, on the memory backend and on a real Redis:
//! counting by outcome takes the whole cost into account and overshoots by
//! at most the requests in flight, a cost of 0 is charged, and the cost limit and `RateLimit-Policy` follow overrides.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tollgate_limiter::{Backend, Key, Limiter, MockClock, Policy, TokenBucket};
use tollgate_memory::MemoryBackend;
use tollgate_redis::{Durability, RedisBackend};
use tollgate_testkit::conformance::{patient, unique_name};
use tollgate_testkit::redis_server::RedisServer;
use tollgate_tower::{Outcome, RateLimitLayer};
use tower::{Layer, ServiceExt, service_fn};

const HOUR: Duration = Duration::from_secs(3600);

fn memory() -> MemoryBackend<MockClock> {
    MemoryBackend::with_clock(MockClock::new())
}

async fn redis() -> RedisBackend {
    let url = RedisServer::shared_url().expect("these tests need redis-server");
    RedisBackend::builder(url)
        .prefix(unique_name("tower-cost"))
        // Time stands still: no token drips back during a test.
        .caller_time(MockClock::new())
        .min_ttl(Duration::from_secs(600))
        .durability(Durability::Skip)
        .build()
        .await
        .expect("connect to redis")
}

/// Requests for `key` costing the `x-tokens` header (1 without one).
fn req(key: &str, tokens: Option<u64>) -> Request<String> {
    let mut b = Request::builder().header("x-key", key);
    if let Some(t) = tokens {
        b = b.header("x-tokens", t);
    }
    b.body(String::new()).unwrap()
}

/// The `x-key` header in clear, so a test can set an override for it.
fn key(req: &Request<String>) -> Option<Key> {
    Some(Key::new(req.headers().get("x-key")?.to_str().ok()?))
}

fn tokens(req: &Request<String>) -> u64 {
    req.headers()
        .get("x-tokens")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// Sends `req` through a layer on `limiter`, counting the inner service's
/// calls; the layer counts by outcome when `by_outcome`.
async fn send<B: Backend>(
    limiter: &Limiter<B>,
    by_outcome: bool,
    calls: &Arc<AtomicUsize>,
    req: Request<String>,
) -> Response<tollgate_tower::ResponseBody<String>> {
    let calls = Arc::clone(calls);
    let inner = service_fn(move |_: Request<String>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(String::new())) }
    });
    let layer = RateLimitLayer::new(limiter.clone(), key).cost(tokens);
    if by_outcome {
        let layer = layer.classify(|_: &Response<String>| Outcome::Count);
        layer.layer(inner).oneshot(req).await.unwrap()
    } else {
        layer.layer(inner).oneshot(req).await.unwrap()
    }
}

/// A bucket of `capacity` refilled over an hour (none refills during a
/// test), and a counter for the inner service's calls.
fn hourly<B: Backend>(base: &str, capacity: u64, backend: B) -> (Limiter<B>, Arc<AtomicUsize>) {
    let policy = TokenBucket::new(capacity, capacity, HOUR).unwrap();
    let limiter = patient(unique_name(base), policy, backend);
    (limiter, Arc::new(AtomicUsize::new(0)))
}

/// Bucket of 10, cost 3, counted by outcome: a sequential client gets
/// exactly floor(10 / 3) = 3 requests served, then 429s; the check before
/// the response looks for the whole cost, so the last unit cannot let
/// every further request through with a refused charge.
async fn count_by_outcome_charges_the_whole_cost<B: Backend>(backend: B) {
    let (limiter, calls) = hourly("outcome", 10, backend);
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let res = send(&limiter, true, &calls, req("k", Some(3))).await;
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429]);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// Counting by outcome checks before the response and charges after it, so
/// requests in flight together can all pass the check: the overshoot is
/// bounded by the requests in flight, and it does not last (the charges
/// that did land leave the key refused afterwards).
async fn count_by_outcome_overshoot_is_bounded_by_requests_in_flight<B: Backend>(backend: B) {
    const IN_FLIGHT: usize = 8;
    let (limiter, calls) = hourly("in-flight", 10, backend);
    // Every request is held in the handler until all are in flight.
    let barrier = Arc::new(tokio::sync::Barrier::new(IN_FLIGHT));
    let inner = {
        let calls = Arc::clone(&calls);
        service_fn(move |_: Request<String>| {
            let (calls, barrier) = (Arc::clone(&calls), Arc::clone(&barrier));
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::timeout(Duration::from_secs(5), barrier.wait())
                    .await
                    .expect("every request reaches the handler");
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        })
    };
    let svc = RateLimitLayer::new(limiter.clone(), key)
        .cost(tokens)
        .classify(|_: &Response<String>| Outcome::Count)
        .layer(inner);
    let wave = (0..IN_FLIGHT).map(|_| svc.clone().oneshot(req("k", Some(3))));
    let statuses: Vec<_> = futures_util::future::join_all(wave)
        .await
        .into_iter()
        .map(|r| r.unwrap().status())
        .collect();
    let served = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    // floor(10 / 3) = 3 sequentially; at most IN_FLIGHT together.
    assert!(served <= 3 + IN_FLIGHT, "{statuses:?}");
    assert_eq!(served, calls.load(Ordering::SeqCst));
    // The charges run after the responses, in their own tasks.
    let k = Key::new("k");
    for _ in 0..200 {
        if limiter.try_peek(&k, 3).await.unwrap().is_denied() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Three charges of 3 landed; one unit is left: no more requests of 3.
    let d = limiter.try_peek(&k, 1).await.unwrap();
    assert_eq!(d.remaining(), 1, "{d:?}");
    for _ in 0..3 {
        let res = send(&limiter, true, &calls, req("k", Some(3))).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    }
}

/// A cost of 0 (a cost function answering 0) is charged the minimum cost.
async fn zero_cost_is_counted<B: Backend>(backend: B) {
    let (limiter, calls) = hourly("zero", 3, backend);
    for by_outcome in [false, true] {
        let key = if by_outcome { "outcome" } else { "upfront" };
        let mut served = 0;
        for _ in 0..6 {
            let res = send(&limiter, by_outcome, &calls, req(key, Some(0))).await;
            served += usize::from(res.status() == StatusCode::OK);
        }
        assert_eq!(served, 3, "by outcome: {by_outcome}");
    }
}

/// Overrides `key`'s policy with a bucket of `capacity` refilling `refill`
/// a minute.
async fn per_minute_override<B: Backend>(
    limiter: &Limiter<B>,
    key: &str,
    capacity: u64,
    refill: u64,
) {
    let p = Policy::from(TokenBucket::new(capacity, refill, Duration::from_secs(60)).unwrap());
    let key = Key::new(key);
    limiter.set_override(Some(&key), Some(p)).await.unwrap();
}

/// The cost limit and `RateLimit-Policy` come from the policy in force: an
/// override raising the capacity lets a larger cost through (and the header
/// announces the override's quota and window); an override shrinking it
/// below a cost makes that cost a 413, not a 429 with an unmeetable
/// Retry-After.
async fn cost_limit_follows_overrides<B: Backend>(backend: B) {
    let name = unique_name("ovr");
    // 5 tokens, 1 per 12 s: the whole bucket in 60 s.
    let limiter = patient(
        &*name,
        TokenBucket::new(5, 5, 60 * Duration::from_secs(1)).unwrap(),
        backend,
    );
    let calls = Arc::new(AtomicUsize::new(0));
    for by_outcome in [false, true] {
        let (vip, small) = (format!("vip-{by_outcome}"), format!("small-{by_outcome}"));
        let res = send(&limiter, by_outcome, &calls, req(&vip, Some(8))).await;
        assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
        // 20 tokens, 1 per 30 s: the whole bucket in 600 s.
        per_minute_override(&limiter, &vip, 20, 2).await;
        let res = send(&limiter, by_outcome, &calls, req(&vip, Some(8))).await;
        assert_eq!(res.status(), StatusCode::OK, "by outcome: {by_outcome}");
        let policy = res.headers()["ratelimit-policy"].to_str().unwrap();
        assert_eq!(policy, format!("\"{name}\";q=20;w=600"));

        // 2 tokens, 2 a minute.
        per_minute_override(&limiter, &small, 2, 2).await;
        let res = send(&limiter, by_outcome, &calls, req(&small, Some(3))).await;
        assert_eq!(
            res.status(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "by outcome: {by_outcome}"
        );
        assert!(res.headers().get("retry-after").is_none());
        let res = send(&limiter, by_outcome, &calls, req(&small, Some(2))).await;
        assert_eq!(res.status(), StatusCode::OK);
        let res = send(&limiter, by_outcome, &calls, req(&small, Some(1))).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        let policy = res.headers()["ratelimit-policy"].to_str().unwrap();
        assert_eq!(policy, format!("\"{name}\";q=2;w=60"));
    }
}

/// Reserve, then settle, with requests in flight together: unlike
/// counting by outcome, a reservation takes the estimate atomically, so
/// concurrent requests never admit more estimates than fit; once settled,
/// the key has been charged exactly what the responses reported.
async fn reservations_in_flight_never_overspend<B: Backend>(backend: B) {
    const IN_FLIGHT: usize = 8;
    let (limiter, calls) = hourly("reserve", 10, backend);
    // Admitted requests are held in the handler until every request has
    // been decided (admitted, or refused and answered).
    let (open, gate) = tokio::sync::watch::channel(false);
    let inner = {
        let calls = Arc::clone(&calls);
        service_fn(move |_: Request<String>| {
            let (calls, mut gate) = (Arc::clone(&calls), gate.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                gate.wait_for(|open| *open).await.expect("the gate opens");
                let mut res = Response::new(String::new());
                res.headers_mut().insert("x-used", 1.into());
                Ok::<_, Infallible>(res)
            }
        })
    };
    let svc = RateLimitLayer::new(limiter.clone(), key)
        .cost(tokens)
        .settle(|res: &Response<String>| {
            res.headers()
                .get("x-used")
                .and_then(|v| v.to_str().ok()?.parse().ok())
        })
        .layer(inner);
    let answered = Arc::new(AtomicUsize::new(0));
    let wave: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let (svc, answered) = (svc.clone(), Arc::clone(&answered));
            tokio::spawn(async move {
                let res = svc.oneshot(req("k", Some(3))).await;
                answered.fetch_add(1, Ordering::SeqCst);
                res
            })
        })
        .collect();
    tokio::time::timeout(Duration::from_secs(10), async {
        while calls.load(Ordering::SeqCst) + answered.load(Ordering::SeqCst) < IN_FLIGHT {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("every request is decided");
    open.send(true).unwrap();
    let statuses: Vec<_> = futures_util::future::join_all(wave)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap().status())
        .collect();
    let served = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    // floor(10 / 3) = 3 estimates fit, however many are in flight.
    assert_eq!(served, 3, "{statuses:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // Each used 1 of its 3: 10 - 3 left.
    let left = limiter.try_peek(&Key::new("k"), 1).await.unwrap();
    assert_eq!(left.remaining(), 7);
}

macro_rules! on_both_backends {
    ($($name:ident),*) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::memory()).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::redis().await).await;
                }
            )*
        }
    };
}

on_both_backends!(
    count_by_outcome_charges_the_whole_cost,
    count_by_outcome_overshoot_is_bounded_by_requests_in_flight,
    zero_cost_is_counted,
    cost_limit_follows_overrides,
    reservations_in_flight_never_overspend
);
