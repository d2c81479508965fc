//! What a `Limiter` answers when its backend fails: fail modes, timeout,
//! circuit breaker, and quiet logging. Driven by the memory backend's fault
//! injection on tokio's paused clock.

use std::time::Duration;

use tokio::time::Instant;
use tollgate_limiter::{BreakerConfig, Error, FailMode, Key, Limiter, TokenBucket, Verdict};
use tollgate_memory::MemoryBackend;

fn limiter(
    backend: &MemoryBackend,
    mode: FailMode,
    breaker: BreakerConfig,
) -> Limiter<MemoryBackend> {
    Limiter::builder(
        "api",
        TokenBucket::new(10, 1, Duration::from_secs(1)).unwrap(),
        backend.clone(),
    )
    .fail_mode(mode)
    .timeout(Duration::from_millis(50))
    .breaker(breaker)
    .build()
}

const NO_BREAKER: BreakerConfig = BreakerConfig {
    threshold: 0,
    backoff: Duration::from_secs(1),
    max_backoff: Duration::from_secs(1),
};

#[tokio::test(start_paused = true)]
async fn fail_closed_is_the_default_and_refuses() {
    let backend = MemoryBackend::new();
    let l = Limiter::new(
        "login",
        TokenBucket::new(10, 1, Duration::from_secs(1)).unwrap(),
        backend.clone(),
    );
    assert_eq!(l.fail_mode(), FailMode::Closed);
    backend.fail_next(1);
    let v = l.check(&Key::new("a")).await;
    assert!(!v.is_allowed());
    assert!(matches!(v, Verdict::FailedClosed(Error::Backend(_), _)));
    let denied = v.into_result().unwrap_err();
    assert!(denied.decision.is_none());
    assert!(denied.error.is_some());
    assert!(denied.retry_after > Duration::ZERO);
    // The injected failure is spent: the next call is decided.
    assert!(matches!(l.check(&Key::new("a")).await, Verdict::Decided(d) if d.is_allowed()));
}

#[tokio::test(start_paused = true)]
async fn fail_open_lets_requests_through() {
    let backend = MemoryBackend::new();
    let l = limiter(&backend, FailMode::Open, NO_BREAKER);
    backend.set_failing(true);
    for _ in 0..20 {
        let v = l.check(&Key::new("a")).await;
        assert!(v.is_allowed());
        assert!(matches!(v, Verdict::FailedOpen(Error::Backend(_))));
        assert_eq!(v.into_result().unwrap(), None);
    }
}

#[tokio::test(start_paused = true)]
async fn slow_backend_times_out_at_the_deadline() {
    let backend = MemoryBackend::new();
    let l = limiter(&backend, FailMode::Closed, NO_BREAKER);
    backend.set_delay(Duration::from_secs(5));
    let start = Instant::now();
    let v = l.check(&Key::new("a")).await;
    assert!(
        matches!(v, Verdict::FailedClosed(Error::Timeout(t), _) if t == Duration::from_millis(50))
    );
    // Paused clock: this is the timeout logic, not a speed measurement.
    assert_eq!(start.elapsed(), Duration::from_millis(50));
    backend.clear_faults();
    assert!(l.check(&Key::new("a")).await.is_allowed());
}

#[tokio::test(start_paused = true)]
async fn breaker_stops_calling_a_dead_backend_and_probes() {
    let backend = MemoryBackend::new();
    let breaker = BreakerConfig {
        threshold: 3,
        backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(4),
    };
    let l = limiter(&backend, FailMode::Closed, breaker);
    let k = Key::new("a");
    backend.set_failing(true);
    for _ in 0..3 {
        assert!(matches!(
            l.check(&k).await,
            Verdict::FailedClosed(Error::Backend(_), _)
        ));
    }
    assert_eq!(backend.faulty_calls(), 3);
    // Open: answered at once from the fail mode, the backend is left alone.
    for _ in 0..100 {
        assert!(matches!(
            l.check(&k).await,
            Verdict::FailedClosed(Error::BreakerOpen, _)
        ));
    }
    assert_eq!(backend.faulty_calls(), 3);
    // After the back-off one probe goes through; it fails, the back-off doubles.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(matches!(
        l.check(&k).await,
        Verdict::FailedClosed(Error::Backend(_), _)
    ));
    assert_eq!(backend.faulty_calls(), 4);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(matches!(
        l.check(&k).await,
        Verdict::FailedClosed(Error::BreakerOpen, _)
    ));
    assert_eq!(backend.faulty_calls(), 4);
    // The backend recovers; the next probe closes the breaker.
    backend.clear_faults();
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(matches!(l.check(&k).await, Verdict::Decided(_)));
    for _ in 0..5 {
        assert!(matches!(l.check(&k).await, Verdict::Decided(_)));
    }
}

#[tokio::test(start_paused = true)]
async fn impossible_cost_is_refused_even_when_failing_open() {
    let backend = MemoryBackend::new();
    let l = limiter(&backend, FailMode::Open, NO_BREAKER);
    let v = l.check_cost(&Key::new("a"), 11).await;
    assert!(!v.is_allowed());
    assert!(matches!(v.error(), Some(Error::Policy(_))));
    assert!(!v.error().unwrap().is_unavailable());
    // The backend decides that cost against the policy in force; when it
    // cannot answer, the configured policy does, so an outage does not
    // open the door to an impossible cost.
    backend.set_failing(true);
    let v = l.check_cost(&Key::new("a"), 11).await;
    assert!(matches!(v.error(), Some(Error::Policy(_))), "{v:?}");
    assert!(matches!(
        l.peek_cost(&Key::new("a"), 11).await.error(),
        Some(Error::Policy(_))
    ));
    assert!(matches!(
        l.check_cost(&Key::new("a"), 10).await,
        Verdict::FailedOpen(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn local_denials_answer_a_flood_without_the_backend() {
    let backend = MemoryBackend::new();
    let l = Limiter::builder(
        "flood",
        tollgate_limiter::SlidingWindow::new(2, Duration::from_secs(60)).unwrap(),
        backend.clone(),
    )
    .local_denials(Duration::from_secs(1))
    .build();
    let k = Key::new("203.0.113.1");
    assert!(l.check(&k).await.is_allowed());
    assert!(l.check(&k).await.is_allowed());
    assert!(!l.check(&k).await.is_allowed());
    // From now on the backend would fail: answers still come, from the
    // cache, as real refusals, and the backend is not called.
    backend.set_failing(true);
    for _ in 0..1000 {
        let v = l.check(&k).await;
        assert!(matches!(v, Verdict::Decided(d) if d.is_denied()));
    }
    assert_eq!(backend.faulty_calls(), 0);
    // Another key is not affected by the cache.
    assert!(matches!(
        l.check(&Key::new("x")).await,
        Verdict::FailedClosed(..)
    ));
    // After max_ttl the backend is asked again.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(matches!(l.check(&k).await, Verdict::FailedClosed(..)));
    // A reset through this limiter is seen at once.
    backend.clear_faults();
    assert!(!l.check(&k).await.is_allowed());
    l.reset(&k).await.unwrap();
    assert!(l.check(&k).await.is_allowed());
}

#[tokio::test(start_paused = true)]
async fn a_reservation_follows_the_fail_mode_and_holds_nothing_without_the_backend() {
    for mode in [FailMode::Open, FailMode::Closed] {
        let backend = MemoryBackend::new();
        let l = limiter(&backend, mode, NO_BREAKER);
        let k = Key::new("a");
        backend.fail_next(1);
        let (v, r) = l.reserve(&k, 4).await;
        assert_eq!(v.is_allowed(), mode == FailMode::Open, "{mode}");
        assert!(v.error().is_some());
        // Nothing was taken, so nothing can be refunded or charged.
        assert!(r.is_empty());
        assert!(matches!(r.settle(0).await, Ok(None)));
        assert_eq!(l.try_peek(&k, 1).await.unwrap().remaining(), 10);
    }
}

#[tokio::test(start_paused = true)]
async fn a_settle_that_fails_or_times_out_keeps_the_estimate_charged() {
    let backend = MemoryBackend::new();
    let l = limiter(&backend, FailMode::Open, NO_BREAKER);
    let k = Key::new("a");
    let (_, r) = l.reserve(&k, 8).await;
    backend.fail_next(1);
    assert!(matches!(r.settle(0).await, Err(Error::Backend(_))));
    assert_eq!(l.try_peek(&k, 1).await.unwrap().remaining(), 2);
    let (_, r) = l.reserve(&k, 2).await;
    backend.set_delay(Duration::from_secs(1));
    assert!(matches!(r.settle(0).await, Err(Error::Timeout(_))));
    backend.clear_faults();
    assert_eq!(l.try_peek(&k, 1).await.unwrap().remaining(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_answers_a_reservation_at_once() {
    let backend = MemoryBackend::new();
    let breaker = BreakerConfig {
        threshold: 1,
        backoff: Duration::from_secs(10),
        max_backoff: Duration::from_secs(10),
    };
    let l = limiter(&backend, FailMode::Closed, breaker);
    backend.set_failing(true);
    let _ = l.check(&Key::new("a")).await;
    let calls = backend.faulty_calls();
    let (v, r) = l.reserve(&Key::new("a"), 1).await;
    assert!(!v.is_allowed() && r.is_empty());
    assert_eq!(
        backend.faulty_calls(),
        calls,
        "the breaker asked the backend"
    );
}
