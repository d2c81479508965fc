//! `Limiter::check_cost_now`: the memory backend's decisions without a
//! future, as a tower layer asks for them first.

use std::time::Duration;

use tollgate_limiter::{Error, FailMode, Key, Limiter, TokenBucket, Verdict};
use tollgate_memory::MemoryBackend;

fn bucket(capacity: u64) -> TokenBucket {
    // One token back an hour: no refill within a test.
    TokenBucket::new(capacity, 1, Duration::from_secs(3_600)).unwrap()
}

#[tokio::test]
async fn answers_in_process_exactly_as_check_cost() {
    let limiter = Limiter::new("now", bucket(2), MemoryBackend::new());
    let key = Key::new("k");
    for remaining in [1, 0] {
        match limiter.check_cost_now(&key, 1) {
            Some(Verdict::Decided(d)) => {
                assert!(d.is_allowed());
                assert_eq!(d.remaining(), remaining);
            }
            other => panic!("expected an admission, got {other:?}"),
        }
    }
    match limiter.check_cost_now(&key, 1) {
        Some(Verdict::Decided(d)) => assert!(d.is_denied()),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The same bucket through the future path: empty too.
    assert!(!limiter.check(&key).await.is_allowed());
}

#[tokio::test]
async fn a_backend_that_must_wait_is_left_to_check_cost_and_charged_nothing() {
    let backend = MemoryBackend::new();
    let limiter = Limiter::builder("now", bucket(3), backend.clone())
        .timeout(Duration::from_secs(5))
        .build();
    let key = Key::new("k");
    backend.set_delay(Duration::from_millis(5));
    assert!(limiter.check_cost_now(&key, 1).is_none());
    assert!(limiter.check_cost_now(&key, 1).is_none());
    backend.clear_faults();
    // Nothing was charged by the two calls above.
    assert_eq!(limiter.try_peek(&key, 1).await.unwrap().remaining(), 3);
    backend.set_delay(Duration::from_millis(5));
    assert!(limiter.check_cost(&key, 1).await.is_allowed());
    backend.clear_faults();
    assert_eq!(limiter.try_peek(&key, 1).await.unwrap().remaining(), 2);
}

/// Once the failures `fail_next` injected are spent, no fault is set: the
/// backend answers in process again, and its calls are no longer counted
/// as faulty. It stayed armed: every later decision took the future path,
/// and `faulty_calls` counted each, so a test reading it to see that a
/// breaker left the backend alone saw calls that no fault governed.
#[tokio::test]
async fn spent_injected_failures_leave_no_fault_set() {
    let backend = MemoryBackend::new();
    let limiter = Limiter::builder("now", bucket(10), backend.clone())
        .fail_mode(FailMode::Open)
        .build();
    let key = Key::new("k");
    backend.fail_next(1);
    assert!(matches!(
        limiter.check(&key).await,
        Verdict::FailedOpen(Error::Backend(_))
    ));
    assert_eq!(backend.faulty_calls(), 1);
    for _ in 0..3 {
        let v = limiter.check_cost_now(&key, 1);
        assert!(matches!(v, Some(Verdict::Decided(_))), "{v:?}");
        assert!(limiter.check(&key).await.is_allowed());
    }
    assert_eq!(backend.faulty_calls(), 1);
}

#[tokio::test]
async fn limiters_with_local_maps_always_take_the_future_path() {
    let limiter = Limiter::builder("now", bucket(3), MemoryBackend::new())
        .local_denials(Duration::from_secs(1))
        .build();
    let key = Key::new("k");
    assert!(limiter.check_cost_now(&key, 1).is_none());
    assert_eq!(limiter.try_peek(&key, 1).await.unwrap().remaining(), 3);
}

#[tokio::test]
async fn an_open_breaker_answers_at_once_and_a_probe_given_back_probes_next() {
    let backend = MemoryBackend::new();
    let limiter = Limiter::builder("now", bucket(100), backend.clone())
        .fail_mode(FailMode::Open)
        .build();
    let key = Key::new("k");
    backend.set_failing(true);
    // A failing backend injects its fault from a future: not answered now.
    assert!(limiter.check_cost_now(&key, 1).is_none());
    // Fail (fail-open: passes without a decision) until the breaker opens.
    for _ in 0..5 {
        assert!(matches!(limiter.check(&key).await, Verdict::FailedOpen(_)));
    }
    // Open: answered at once, from the fail mode, without the backend.
    let calls = backend.faulty_calls();
    assert!(matches!(
        limiter.check_cost_now(&key, 1),
        Some(Verdict::FailedOpen(Error::BreakerOpen))
    ));
    assert_eq!(backend.faulty_calls(), calls);
    backend.clear_faults();
    // Once the back-off ends, a delayed backend hands the probe back
    // (None): the next decision probes, succeeds and closes the breaker.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    backend.set_delay(Duration::from_millis(1));
    assert!(limiter.check_cost_now(&key, 1).is_none());
    backend.clear_faults();
    match limiter.check(&key).await {
        Verdict::Decided(d) => assert!(d.is_allowed()),
        other => panic!("the probe did not reach the backend: {other:?}"),
    }
}
