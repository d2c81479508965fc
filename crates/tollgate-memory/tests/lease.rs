//! Lease mode: a batch per round trip, spent locally, never more admitted
//! than the backend grants.

use std::time::Duration;

use tollgate_limiter::{FailMode, Key, Limiter, MockClock, SlidingWindow, TokenBucket};
use tollgate_memory::MemoryBackend;

fn worker(backend: &MemoryBackend<MockClock>, batch: u64) -> Limiter<MemoryBackend<MockClock>> {
    Limiter::builder(
        "api",
        TokenBucket::new(7, 1, Duration::from_secs(60)).unwrap(),
        backend.clone(),
    )
    .fail_mode(FailMode::Open)
    .lease(batch, Duration::from_secs(1))
    .build()
}

#[tokio::test(start_paused = true)]
async fn a_lease_takes_a_batch_and_the_limit_stays_exact() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let a = worker(&backend, 5);
    let plain = Limiter::new(
        "api",
        TokenBucket::new(7, 1, Duration::from_secs(60)).unwrap(),
        backend.clone(),
    );
    let k = Key::new("key-1");
    // One request leases five units: the shared counter shows them gone.
    assert!(a.check(&k).await.is_allowed());
    assert_eq!(plain.peek(&k).await.decision().unwrap().remaining(), 2);
    // The next four are served from the lease without touching the counter.
    backend.set_failing(true);
    for _ in 0..4 {
        let v = a.check(&k).await;
        assert!(v.decision().is_some_and(|d| d.is_allowed()), "{v:?}");
    }
    assert_eq!(backend.faulty_calls(), 0);
    backend.clear_faults();
    // Near the limit a whole batch no longer fits: one unit at a time, and
    // exactly the capacity is admitted in all.
    assert!(a.check(&k).await.is_allowed());
    assert!(a.check(&k).await.is_allowed());
    let v = a.check(&k).await;
    assert!(v.decision().is_some_and(|d| d.is_denied()), "{v:?}");
}

#[tokio::test(start_paused = true)]
async fn unspent_units_expire_and_a_reset_drops_the_lease() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let a = worker(&backend, 3);
    let k = Key::new("key-2");
    assert!(a.check(&k).await.is_allowed());
    // After the lease's ttl its two units are gone: the next request asks
    // the backend (which is failing: fail-open lets it through, undecided).
    tokio::time::advance(Duration::from_secs(1)).await;
    backend.set_failing(true);
    assert!(a.check(&k).await.decision().is_none());
    backend.clear_faults();
    assert!(a.check(&k).await.is_allowed());
    a.reset(&k).await.unwrap();
    backend.set_failing(true);
    assert!(
        a.check(&k).await.decision().is_none(),
        "the lease was dropped"
    );
}

/// The documented bound: across `W` workers with batch `b`, a burst on one
/// key admits at most `capacity + W × (b − 1)` (units leased earlier, spent
/// while the bucket is full again), and a burst from a fresh key exactly
/// `capacity`.
#[tokio::test(start_paused = true)]
async fn a_burst_across_workers_admits_at_most_capacity_plus_leased_units() {
    const CAPACITY: u64 = 10;
    const W: u64 = 3;
    const BATCH: u64 = 4;
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let workers: Vec<_> = (0..W)
        .map(|_| {
            Limiter::builder(
                "burst",
                TokenBucket::new(CAPACITY, CAPACITY, Duration::from_secs(1)).unwrap(),
                backend.clone(),
            )
            .fail_mode(FailMode::Open)
            .lease(BATCH, Duration::from_secs(60))
            .build()
        })
        .collect();
    // Admitted in one burst (no time passing), round robin until every
    // worker refuses.
    async fn burst(workers: &[Limiter<MemoryBackend<MockClock>>], k: &Key) -> u64 {
        let mut admitted = 0;
        let mut refusing = 0;
        for w in workers.iter().cycle() {
            let v = w.check(k).await;
            assert!(v.decision().is_some(), "decided: {v:?}");
            if v.is_allowed() {
                admitted += 1;
                refusing = 0;
            } else {
                refusing += 1;
                if refusing == workers.len() {
                    return admitted;
                }
            }
        }
        unreachable!()
    }
    assert_eq!(burst(&workers, &Key::new("fresh")).await, CAPACITY);
    // The worst case: each worker leases a batch and spends one unit,
    // while the bucket refills between them; then a burst with the bucket
    // full.
    let k = Key::new("worst");
    for w in &workers {
        assert!(w.check(&k).await.is_allowed());
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(burst(&workers, &k).await, CAPACITY + W * (BATCH - 1));
}

/// Near the limit of a sliding window that penalises refusals, a batch
/// that no longer fits must not be recorded as a refusal: it was the
/// worker's guess, not the client's request. Recorded, it filled the
/// window, so the request's own cost was refused too, and every later
/// request's batch refilled it: a client within its limit was held off
/// for as long as it kept asking.
#[tokio::test(start_paused = true)]
async fn a_batch_that_no_longer_fits_a_penalised_window_is_not_a_refusal() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let minute = Duration::from_secs(60);
    let window = SlidingWindow::new(7, minute)
        .unwrap()
        .penalise_refused(true);
    let leased = Limiter::builder("penalised", window, backend.clone())
        .fail_mode(FailMode::Open)
        .lease(5, minute)
        .build();
    let k = Key::new("key-3");
    // Seven requests in the window pass, as without leases; the eighth
    // is refused.
    for i in 0..7 {
        let v = leased.check(&k).await;
        assert!(v.is_allowed(), "request {i}: {v:?}");
        clock.advance(Duration::from_secs(1));
    }
    assert!(!leased.check(&k).await.is_allowed());
    // A client that then keeps within its limit (one request every nine
    // seconds, seven a minute at most) is admitted again once the window
    // has moved on.
    clock.advance(minute);
    tokio::time::advance(minute).await;
    let mut admitted = 0;
    for _ in 0..7 {
        admitted += u64::from(leased.check(&k).await.is_allowed());
        clock.advance(Duration::from_secs(9));
        tokio::time::advance(Duration::from_secs(9)).await;
    }
    assert_eq!(admitted, 7);
}

/// Requests of one key that find no lease while this worker's batch for
/// it is on its way must not each take a batch: each batch's rest beyond
/// `batch − 1` is dropped, so ten concurrent first requests took ten
/// batches (the whole window) to admit ten and keep nine. They ask for
/// their own cost instead; and a fetch whose caller gave up leaves nothing
/// behind that would keep the key from leasing again.
#[tokio::test(start_paused = true)]
async fn concurrent_requests_of_one_key_take_one_batch() {
    const LIMIT: u64 = 100;
    const BATCH: u64 = 10;
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let window = SlidingWindow::new(LIMIT, Duration::from_secs(60)).unwrap();
    let leased = Limiter::builder("race", window, backend.clone())
        .fail_mode(FailMode::Open)
        .lease(BATCH, Duration::from_secs(60))
        .build();
    let plain = Limiter::new("race", window, backend.clone());
    let k = Key::new("hot");
    backend.set_delay(Duration::from_millis(1));
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let (l, k) = (leased.clone(), k.clone());
        requests.spawn(async move { l.check(&k).await.is_allowed() });
    }
    let mut admitted = 0;
    while let Some(allowed) = requests.join_next().await {
        admitted += u64::from(allowed.unwrap());
    }
    backend.clear_faults();
    let remaining = plain.peek(&k).await.decision().unwrap().remaining();
    let taken = LIMIT - remaining;
    assert_eq!(admitted, 10);
    assert!(
        taken - admitted < BATCH,
        "{admitted} admitted, {taken} units taken from the backend"
    );

    // A caller that gives up while its batch is on its way.
    let k = Key::new("given-up");
    backend.set_delay(Duration::from_millis(10));
    let gave_up = tokio::time::timeout(Duration::from_millis(1), leased.check(&k)).await;
    assert!(gave_up.is_err(), "answered: {gave_up:?}");
    backend.clear_faults();
    // The next request takes a batch, whose rest serves the next ones.
    assert!(leased.check(&k).await.is_allowed());
    backend.set_failing(true);
    for i in 1..BATCH {
        let v = leased.check(&k).await;
        assert!(v.decision().is_some_and(|d| d.is_allowed()), "{i}: {v:?}");
    }
}

/// A peek says what a check would say next: a worker holding enough
/// leased units for the key would spend them, so its peek says allowed,
/// even when the backend, whose units this worker and others have taken,
/// has none left. It asked the backend only, and said refused while the
/// key's next check was admitted.
#[tokio::test(start_paused = true)]
async fn a_peek_sees_the_units_a_check_would_spend() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let a = worker(&backend, 5);
    let b = worker(&backend, 5);
    let k = Key::new("key-peek");
    // `a` leases five units (four kept), `b` two: the backend has none.
    assert!(a.check(&k).await.is_allowed());
    assert!(b.check(&k).await.is_allowed());
    assert!(b.check(&k).await.is_allowed());
    assert!(!b.check(&k).await.is_allowed());
    let peek = a.peek(&k).await;
    assert!(peek.is_allowed(), "{peek:?}");
    let check = a.check(&k).await;
    assert!(check.is_allowed(), "{check:?}");
    // What the peek reported is what the check then left.
    assert_eq!(
        peek.decision().unwrap().remaining(),
        check.decision().unwrap().remaining()
    );
    // Beyond the units held, the backend answers: refused.
    let peek = a.peek_cost(&k, 4).await;
    assert!(!peek.is_allowed(), "{peek:?}");
}
