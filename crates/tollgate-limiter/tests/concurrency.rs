//! A concurrency limit through every charging call of the limiter: each
//! one that passes takes a slot.

use std::future::Future;
use std::time::Duration;

use tollgate_limiter::{
    Backend, Concurrency, Decision, Key, Limiter, MockClock, Op, Policy, Request, Scope,
};
use tollgate_memory::{MemoryBackend, MemoryError};

/// `try_acquire` is `check_cost` without the fail mode: on a concurrency
/// limit it takes a slot, as `check` does. It only looked: every call
/// passed while a slot was free, so any number of requests ran at once.
#[tokio::test]
async fn try_acquire_takes_a_slot_as_check_does() {
    let backend = MemoryBackend::with_clock(MockClock::new());
    let policy = Concurrency::new(2, Duration::from_secs(60)).unwrap();
    let l = Limiter::new("exports", policy, backend);
    let k = Key::new("tenant-1");
    let mut passed = 0;
    for _ in 0..10 {
        passed += usize::from(l.try_acquire(&k, 1).await.unwrap().is_allowed());
    }
    assert_eq!(passed, 2, "{passed} of 10 passed a limit of 2 in flight");
    // And the slots taken are the ones `check` and `hold` count.
    assert!(!l.check(&k).await.is_allowed());
    assert!(l.hold(&k).await.1.is_none());
}

/// The memory backend behind a busy connection for holds only: a hold is
/// applied `late` after it was sent, whether or not its caller still
/// waits (it is on its way), while any other call is applied at once, as
/// a second pooled connection would carry it. When its answer is `lost`,
/// a hold is also applied at once, and answered with an error (the
/// connection broke after the server ran it): the late one is the copy a
/// cluster client sends again.
#[derive(Clone)]
struct LateHolds {
    inner: MemoryBackend,
    late: Duration,
    lost: bool,
}

const HOLD_LATE: Duration = Duration::from_millis(30);

fn late_holds(late: Duration) -> LateHolds {
    LateHolds {
        inner: MemoryBackend::new(),
        late,
        lost: false,
    }
}

impl Backend for LateHolds {
    type Error = MemoryError;

    fn decide(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<Decision, MemoryError>> + Send {
        let hold = matches!(req.op, Op::Hold(_));
        let (inner, late, lost) = (self.inner.clone(), self.late, self.lost && hold);
        let (limiter, key, policy, op) =
            (req.limiter.to_owned(), req.key.clone(), *req.policy, req.op);
        let apply = move |after: Option<Duration>| {
            let (inner, limiter, key) = (inner.clone(), limiter.clone(), key.clone());
            tokio::spawn(async move {
                if let Some(after) = after {
                    tokio::time::sleep(after).await;
                }
                let req = Request {
                    limiter: &limiter,
                    key: &key,
                    policy: &policy,
                    op,
                };
                inner.decide(req).await
            })
        };
        async move {
            if !lost {
                return apply(hold.then_some(late)).await.expect("the call's task");
            }
            let _ = apply(None).await;
            apply(Some(late));
            Err(MemoryError::Injected)
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

/// A hold whose caller gave up (its timeout) before the answer may reach
/// the backend after the withdrawal the dropped permit sent (another
/// pooled connection): the slot was then taken by nobody until its lease
/// ran out (a minute here). The backend remembers the withdrawal, and
/// refuses the hold when it lands within a lease: here after the two
/// releases a dropped hold used to send (at its timeout, and a timeout
/// later), as a Redis stalled by a fork or an fsync would deliver it.
#[tokio::test(start_paused = true)]
async fn a_hold_that_lands_after_its_releases_takes_nothing() {
    for late in [HOLD_LATE, Duration::from_millis(500)] {
        let backend = late_holds(late);
        let policy = Concurrency::new(2, Duration::from_secs(60)).unwrap();
        let l = Limiter::builder("exports", policy, backend)
            .timeout(Duration::from_millis(20))
            .build();
        let k = Key::new("tenant-1");
        let (verdict, permit) = l.hold(&k).await;
        assert!(verdict.error().is_some(), "timed out: {verdict:?}");
        assert!(permit.is_none());
        // The hold lands after the release (at 20 ms).
        tokio::time::sleep(late + Duration::from_millis(100)).await;
        let d = l.try_peek(&k, 1).await.unwrap();
        assert_eq!(
            d.remaining(),
            2,
            "landing {late:?} late, a slot is taken: {d:?}"
        );
    }
}

/// A renewal given up before its answer renews a slot held: a release
/// that lands before it finds the slot and frees it, and the renewal, on
/// its way, took one again, for a lease (a minute here). A permit whose
/// renewal has no answer withdraws its slot: the renewal, landing later,
/// takes nothing.
#[tokio::test(start_paused = true)]
async fn a_renewal_that_lands_after_its_release_takes_nothing() {
    let backend = late_holds(HOLD_LATE);
    let policy = Concurrency::new(2, Duration::from_secs(60)).unwrap();
    let l = Limiter::builder("exports", policy, backend)
        .timeout(Duration::from_millis(50))
        .build();
    let k = Key::new("tenant-1");
    let (verdict, permit) = l.hold(&k).await;
    assert!(verdict.is_allowed(), "{verdict:?}");
    let permit = permit.expect("a permit");
    // The caller gives up on its renewal before the answer.
    let renewal = tokio::time::timeout(Duration::from_millis(10), permit.renew()).await;
    assert!(renewal.is_err(), "given up: {renewal:?}");
    // Released at once, before the renewal lands (at 30 ms).
    assert!(permit.release().await.is_ok());
    assert_eq!(l.try_peek(&k, 1).await.unwrap().remaining(), 2);
    tokio::time::sleep(HOLD_LATE + Duration::from_millis(100)).await;
    let d = l.try_peek(&k, 1).await.unwrap();
    assert_eq!(d.remaining(), 2, "the renewal's slot is still taken: {d:?}");
}

/// A release that failed (the backend's one failure, a broken pooled
/// connection) leaves the permit armed: dropped, it sends the release once
/// more. It was disarmed, and the slot stayed taken until its lease ran out
/// (a minute here).
#[tokio::test]
async fn a_release_that_failed_is_sent_again() {
    let backend = MemoryBackend::with_clock(MockClock::new());
    let policy = Concurrency::new(1, Duration::from_secs(60)).unwrap();
    let l = Limiter::new("exports", policy, backend.clone());
    let k = Key::new("tenant-1");
    let (verdict, permit) = l.hold(&k).await;
    assert!(verdict.is_allowed());
    backend.fail_next(1);
    assert!(permit.unwrap().release().await.is_err());
    // The second release is a task of its own.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let d = l.try_peek(&k, 1).await.unwrap();
    assert_eq!(d.remaining(), 1, "the slot is still taken: {d:?}");
}

/// A kept permit is renewed within the lease of the policy in force, from
/// its first renewal: under a key's override of 3 s (the limiter's own
/// lease a minute), every second. Paced by the configured lease, the first
/// renewal came 20 s in, the slot had run out at 3 s, and a request more
/// got in.
#[tokio::test(start_paused = true)]
async fn a_kept_permit_is_renewed_within_an_overridden_lease() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let policy = Concurrency::new(1, Duration::from_secs(60)).unwrap();
    let l = Limiter::new("exports", policy, backend);
    let k = Key::new("tenant-1");
    let short = Concurrency::new(1, Duration::from_secs(3)).unwrap();
    l.set_override(Some(&k), Some(short.into())).await.unwrap();
    let (verdict, permit) = l.hold(&k).await;
    assert!(verdict.is_allowed(), "{verdict:?}");
    let kept = permit.expect("a permit").keep_alive();
    // The backend's clock and the runtime's, in step.
    for step in 1..=10 {
        clock.advance(Duration::from_secs(1));
        tokio::time::sleep(Duration::from_secs(1)).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let d = l.try_peek(&k, 1).await.unwrap();
        assert_eq!(d.remaining(), 0, "{step} s in, the slot ran out: {d:?}");
    }
    drop(kept);
}

/// A hold whose answer was lost (the connection broke after the server ran
/// it) is sent again by a cluster client, maybe after the permit gave the
/// slot back: the first copy's slot is freed, and the second copy takes
/// nothing. Before, the release found the first copy's slot and freed it,
/// and the second copy took one for a lease (a minute here).
#[tokio::test(start_paused = true)]
async fn a_hold_sent_again_after_its_answer_was_lost_takes_nothing() {
    let backend = LateHolds {
        lost: true,
        ..late_holds(HOLD_LATE)
    };
    let policy = Concurrency::new(2, Duration::from_secs(60)).unwrap();
    let l = Limiter::new("exports", policy, backend);
    let k = Key::new("tenant-1");
    let (verdict, permit) = l.hold(&k).await;
    assert!(
        verdict.error().is_some(),
        "the answer was lost: {verdict:?}"
    );
    assert!(permit.is_none());
    tokio::time::sleep(HOLD_LATE + Duration::from_millis(100)).await;
    let d = l.try_peek(&k, 1).await.unwrap();
    assert_eq!(d.remaining(), 2, "the hold sent again took a slot: {d:?}");
}
