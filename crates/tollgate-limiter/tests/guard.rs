//! The guard every backend call goes through, seen from a `Limiter` and an
//! `AimdLimiter`: no caller behaviour (a future dropped at any await point,
//! never polled, kept but never polled again, a panic) leaves the breaker
//! stuck, and a decision waits at most its timeout, lease mode included.
//! Driven on tokio's paused clock with the memory backend's fault injection.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tollgate_limiter::aimd::{AimdConfig, AimdLimiter};
use tollgate_limiter::{
    Backend, BreakerConfig, Decision, Error, FailMode, Key, Limiter, Policy, Request, Scope,
    TokenBucket, Verdict,
};
use tollgate_memory::{MemoryBackend, MemoryError};

const TIMEOUT: Duration = Duration::from_millis(50);
const BACKOFF: Duration = Duration::from_secs(1);
const STEP: Duration = Duration::from_millis(10);

const BREAKER: BreakerConfig = BreakerConfig {
    threshold: 1,
    backoff: BACKOFF,
    max_backoff: Duration::from_secs(8),
};

/// The memory backend, plus a panic on demand inside `decide`.
#[derive(Clone, Default)]
struct Panicky {
    inner: MemoryBackend,
    panic_next: std::sync::Arc<AtomicBool>,
}

impl Backend for Panicky {
    type Error = MemoryError;

    fn decide(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<Decision, MemoryError>> + Send {
        let panic = self.panic_next.swap(false, Ordering::SeqCst);
        let fut = self.inner.decide(req);
        async move {
            // Panics while polled, as a buggy backend or consumer would.
            tokio::task::yield_now().await;
            assert!(!panic, "backend panicked");
            fut.await
        }
    }

    fn set_override(
        &self,
        scope: Scope<'_>,
        policy: Option<&Policy>,
    ) -> impl Future<Output = Result<(), MemoryError>> + Send {
        self.inner.set_override(scope, policy)
    }

    fn get_override(
        &self,
        scope: Scope<'_>,
    ) -> impl Future<Output = Result<Option<Policy>, MemoryError>> + Send {
        self.inner.get_override(scope)
    }
}

fn limiter(backend: &Panicky, lease: bool) -> Limiter<Panicky> {
    let b = Limiter::builder(
        "api",
        TokenBucket::new(1000, 1, Duration::from_secs(1)).unwrap(),
        backend.clone(),
    )
    .fail_mode(FailMode::Closed)
    .timeout(TIMEOUT)
    .breaker(BREAKER);
    if lease {
        b.lease(4, BACKOFF).build()
    } else {
        b.build()
    }
}

/// Opens the breaker, and makes the backend hang (each call takes longer
/// than the timeout) once the back-off is over.
async fn open_then_hang(backend: &Panicky, l: &Limiter<Panicky>, k: &Key) {
    backend.inner.set_failing(true);
    assert!(matches!(
        l.check(k).await,
        Verdict::FailedClosed(Error::Backend(_), _)
    ));
    assert!(matches!(
        l.check(k).await,
        Verdict::FailedClosed(Error::BreakerOpen, _)
    ));
    backend.inner.clear_faults();
    backend.inner.set_delay(Duration::from_secs(3600));
    tokio::time::advance(BACKOFF).await;
}

/// Polls `fut` `polls` times, advancing the clock by `STEP` between
/// polls; returns whether it finished.
async fn poll_n<F: Future>(mut fut: Pin<&mut F>, polls: usize) -> bool {
    for i in 0..polls {
        if i > 0 {
            tokio::time::advance(STEP).await;
        }
        let ready = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_ready())).await;
        if ready {
            return true;
        }
    }
    false
}

/// Once the backend is back, decisions resume within one back-off of
/// virtual time; returns how long it took.
async fn resumes(backend: &Panicky, l: &Limiter<Panicky>, k: &Key) -> Duration {
    backend.inner.clear_faults();
    let start = Instant::now();
    loop {
        if let Verdict::Decided(_) = l.check(k).await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < BACKOFF,
            "still refused by the breaker after one back-off"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_probe_dropped_at_any_await_point_does_not_stick() {
    for lease in [false, true] {
        // 0 polls: created and never polled; 1..=4 polls, STEP apart:
        // dropped at the first poll and later inside the probe's backend
        // call (in lease mode the probe is the batch call). A probe that
        // completes reports itself, so these are all the points at which
        // a caller can walk away from one.
        for polls in 0..=4 {
            let backend = Panicky::default();
            let l = limiter(&backend, lease);
            let k = Key::new("a");
            open_then_hang(&backend, &l, &k).await;
            {
                let probe = std::pin::pin!(l.check(&k));
                assert!(!poll_n(probe, polls).await, "the probe hangs");
            }
            let took = resumes(&backend, &l, &k).await;
            assert_eq!(took, Duration::ZERO, "lease={lease} polls={polls}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_probe_kept_but_never_polled_again_fails_after_the_timeout() {
    let backend = Panicky::default();
    let l = limiter(&backend, false);
    let k = Key::new("a");
    open_then_hang(&backend, &l, &k).await;
    let mut silent = Box::pin(l.check(&k));
    assert!(!poll_n(silent.as_mut(), 1).await);
    let took = resumes(&backend, &l, &k).await;
    assert_eq!(took, TIMEOUT);
    // Its late drop does not reopen the breaker.
    drop(silent);
    assert!(matches!(l.check(&k).await, Verdict::Decided(_)));
}

#[tokio::test(start_paused = true)]
async fn a_panic_around_or_inside_the_probe_does_not_stick() {
    for inside in [false, true] {
        let backend = Panicky::default();
        let l = limiter(&backend, false);
        let k = Key::new("a");
        open_then_hang(&backend, &l, &k).await;
        if inside {
            backend.inner.clear_faults();
            backend.panic_next.store(true, Ordering::SeqCst);
        }
        let (l2, k2) = (l.clone(), k.clone());
        let task = tokio::spawn(async move {
            let mut probe = std::pin::pin!(l2.check(&k2));
            let _ = poll_n(probe.as_mut(), 2).await;
            panic!("consumer panicked while holding the probe");
        });
        assert!(task.await.unwrap_err().is_panic());
        let took = resumes(&backend, &l, &k).await;
        assert_eq!(took, Duration::ZERO, "inside={inside}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_aimd_probe_dropped_mid_call_does_not_stick() {
    let backend = MemoryBackend::new();
    let config = AimdConfig {
        timeout: TIMEOUT,
        breaker: BREAKER,
        ..AimdConfig::default()
    };
    let aimd = AimdLimiter::new("crawler", config, backend.clone()).unwrap();
    let site = Key::new("example.org");
    backend.set_failing(true);
    // The backend fails: the token comes from the local fallback, and the
    // breaker opens.
    assert!(aimd.try_acquire(&site).await.unwrap().is_local());
    let before = backend.faulty_calls();
    backend.clear_faults();
    backend.set_delay(Duration::from_secs(3600));
    tokio::time::advance(BACKOFF).await;
    {
        let probe = std::pin::pin!(aimd.try_acquire(&site));
        assert!(!poll_n(probe, 2).await);
    }
    assert_eq!(backend.faulty_calls(), before + 1, "one probe went out");
    backend.clear_faults();
    // The next request asks the backend at once (the rate is fresh, the
    // bucket full): a shared grant, not a local one.
    tokio::time::advance(Duration::from_secs(1)).await;
    let grant = aimd.try_acquire(&site).await.unwrap();
    assert!(!grant.is_local());
}

/// A decision in lease mode may ask twice (a batch, then its own cost near
/// the limit); both calls share one deadline.
#[tokio::test(start_paused = true)]
async fn lease_mode_waits_at_most_the_timeout() {
    let backend = MemoryBackend::new();
    let policy = TokenBucket::new(10, 1, Duration::from_secs(3600)).unwrap();
    let l = Limiter::builder("api", policy, backend.clone())
        .fail_mode(FailMode::Open)
        .timeout(TIMEOUT)
        .lease(5, Duration::from_secs(60))
        .build();
    let plain = Limiter::new("api", policy, backend.clone());
    let k = Key::new("a");
    // 8 of 10 spent: a batch of 5 is refused, one unit would pass.
    assert!(plain.check_cost(&k, 8).await.is_allowed());
    // Each call takes 40 ms of the 50: two would take 80.
    backend.set_delay(Duration::from_millis(40));
    let start = Instant::now();
    let v = l.check(&k).await;
    assert_eq!(start.elapsed(), TIMEOUT);
    assert!(
        matches!(v, Verdict::FailedOpen(Error::Timeout(t)) if t == TIMEOUT),
        "{v:?}"
    );
    // Both calls were made: the second was cut short by the first's deadline.
    assert_eq!(backend.faulty_calls(), 2);
    // With calls well within the timeout, both run and the decision is made.
    backend.set_delay(Duration::from_millis(20));
    let start = Instant::now();
    assert!(matches!(l.check(&k).await, Verdict::Decided(d) if d.is_allowed()));
    assert_eq!(start.elapsed(), Duration::from_millis(40));
}

/// The memory backend answering late: each decision is made (its state
/// written) when the call is made, and its answer arrives `late` after, as
/// Redis runs a script on receipt and the reply can be held up on the way
/// back (a stalled network, a failover).
#[derive(Clone, Default)]
struct Late {
    inner: MemoryBackend,
    late: std::sync::Arc<std::sync::Mutex<Duration>>,
}

impl Backend for Late {
    type Error = MemoryError;

    fn decide(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<Decision, MemoryError>> + Send {
        let answer = Ok(self.inner.decide_now(&req).expect("no fault injected"));
        let late = *self.late.lock().unwrap();
        async move {
            tokio::time::sleep(late).await;
            answer
        }
    }

    fn set_override(
        &self,
        scope: Scope<'_>,
        policy: Option<&Policy>,
    ) -> impl Future<Output = Result<(), MemoryError>> + Send {
        self.inner.set_override(scope, policy)
    }

    fn get_override(
        &self,
        scope: Scope<'_>,
    ) -> impl Future<Output = Result<Option<Policy>, MemoryError>> + Send {
        self.inner.get_override(scope)
    }
}

/// A batch the backend granted before this worker reset the key (or
/// overrode its policy), whose answer came after, was granted under what
/// the reset or the override undid: its rest must not be kept as a lease,
/// or `batch - 1` more requests pass than the reset or the override allow.
#[tokio::test(start_paused = true)]
async fn a_batch_answered_after_a_reset_or_an_override_is_not_kept() {
    let backend = Late::default();
    let policy = TokenBucket::new(10, 1, Duration::from_secs(3600)).unwrap();
    let l = Limiter::builder("api", policy, backend.clone())
        .fail_mode(FailMode::Open)
        .lease(5, Duration::from_secs(60))
        .build();
    // Two tokens an hour: the five taken leave none for hours.
    let tighter = TokenBucket::new(2, 1, Duration::from_secs(3600)).unwrap();
    // A fresh key passes its 10; under the override, none passes.
    for (i, (undo, passes)) in [("reset", 10), ("override", 0)].into_iter().enumerate() {
        let k = Key::new(format!("k{i}"));
        // The batch is taken now; its answer comes 10 ms later.
        *backend.late.lock().unwrap() = Duration::from_millis(10);
        let batch = tokio::spawn({
            let (l, k) = (l.clone(), k.clone());
            async move { l.check(&k).await }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        *backend.late.lock().unwrap() = Duration::ZERO;
        if undo == "reset" {
            l.reset(&k).await.unwrap();
        } else {
            l.set_override(Some(&k), Some(tighter.into()))
                .await
                .unwrap();
        }
        assert!(batch.await.unwrap().is_allowed());
        let mut passed = 0;
        while l.check(&k).await.is_allowed() {
            passed += 1;
        }
        assert_eq!(passed, passes, "after the {undo}");
    }
}

/// A concurrency slot taken by a hold whose answer never came back (the
/// decision timed out, or its caller went away) is given back, as a
/// dropped permit's is: otherwise it stays taken, and the key refused,
/// until its lease expires (minutes), though nobody holds it.
#[tokio::test(start_paused = true)]
async fn a_hold_that_times_out_or_is_dropped_gives_its_slot_back() {
    let backend = Late::default();
    let policy = tollgate_limiter::Concurrency::new(1, Duration::from_secs(600)).unwrap();
    let l = Limiter::builder("exports", policy, backend.clone())
        .fail_mode(FailMode::Open)
        .timeout(TIMEOUT)
        .build();
    let k = Key::new("tenant-1");
    let free_slots = || async { l.try_peek(&k, 1).await.unwrap().remaining() };

    // The backend takes the slot; its answer comes after the timeout.
    *backend.late.lock().unwrap() = TIMEOUT * 2;
    let (v, permit) = l.hold(&k).await;
    assert!(matches!(v, Verdict::FailedOpen(Error::Timeout(_))), "{v:?}");
    assert!(permit.is_none());
    *backend.late.lock().unwrap() = Duration::ZERO;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(free_slots().await, 1, "a timed-out hold kept its slot");
    let (v, permit) = l.hold(&k).await;
    assert!(v.is_allowed() && permit.is_some(), "{v:?}");
    drop(permit);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(free_slots().await, 1);

    // The caller goes away while the answer is on its way back.
    *backend.late.lock().unwrap() = TIMEOUT / 2;
    {
        let hold = l.hold(&k);
        tokio::pin!(hold);
        assert!(!poll_n(hold.as_mut(), 1).await);
    }
    *backend.late.lock().unwrap() = Duration::ZERO;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(free_slots().await, 1, "a dropped hold kept its slot");

    // A refused hold took nothing, and frees nothing.
    let (v, held) = l.hold(&k).await;
    assert!(v.is_allowed());
    let (v, none) = l.hold(&k).await;
    assert!(!v.is_allowed() && none.is_none(), "{v:?}");
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        free_slots().await,
        0,
        "a refused hold released another's slot"
    );
    drop(held);
}

/// A release whose caller goes away before the backend answered (a
/// cancelled handler, a timeout around it) may not have reached the
/// backend: its permit gives the slot back, as a dropped permit does,
/// rather than leave it taken, and the key refused, until its lease
/// expires.
#[tokio::test(start_paused = true)]
async fn a_release_dropped_before_its_answer_still_gives_the_slot_back() {
    let backend = MemoryBackend::new();
    let policy = tollgate_limiter::Concurrency::new(1, Duration::from_secs(600)).unwrap();
    let l = Limiter::builder("exports", policy, backend.clone())
        .timeout(TIMEOUT)
        .build();
    let k = Key::new("tenant-1");
    let (v, permit) = l.hold(&k).await;
    assert!(v.is_allowed(), "{v:?}");
    let permit = permit.expect("a slot held");
    // The memory backend decides after its delay: a release dropped
    // during it never reached the backend.
    backend.set_delay(Duration::from_secs(3600));
    {
        let release = std::pin::pin!(permit.release());
        assert!(!poll_n(release, 1).await);
    }
    backend.clear_faults();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let free = l.try_peek(&k, 1).await.unwrap().remaining();
    assert_eq!(free, 1, "a dropped release kept its slot");
}
