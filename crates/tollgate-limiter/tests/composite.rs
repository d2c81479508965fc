//! A composite limiter with the limiter's local machinery: leases take
//! their batch from every part at once, local denials answer until the
//! latest part's retry-after.

use std::time::Duration;

use tollgate_limiter::{Composite, Key, Limiter, MockClock, Policy, SlidingWindow, TokenBucket};
use tollgate_memory::MemoryBackend;

const H: Duration = Duration::from_secs(3600);

fn plan() -> Composite {
    Composite::new([
        Policy::from(TokenBucket::new(100, 1, H).unwrap()),
        Policy::from(SlidingWindow::new(10, H).unwrap()),
    ])
    .unwrap()
}

/// One worker leasing batches of 4: exactly the window's 10 pass, and the
/// bucket is charged those 10, not more.
#[tokio::test]
async fn leases_charge_every_part() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let l = Limiter::builder("leased", plan(), backend.clone())
        .lease(4, H)
        .build();
    let k = Key::new("k");
    let mut passed = 0;
    for _ in 0..30 {
        let v = l.check(&k).await;
        passed += u64::from(v.is_allowed());
        // Spent locally or not, the answer names the binding part.
        assert_eq!(v.decision().map(|d| d.part()), Some(1), "{v:?}");
    }
    assert_eq!(passed, 10);
    // Read the bucket alone through a plain limiter on the same keys.
    let probe = Limiter::new("leased", plan(), backend);
    let bucket_only = Composite::new([plan().policy(0).unwrap()]).unwrap();
    probe
        .set_override(Some(&k), Some(bucket_only.into()))
        .await
        .unwrap();
    assert_eq!(probe.try_peek(&k, 1).await.unwrap().remaining(), 90);
}

/// Local denials hold a composite's refusal until its retry-after, the
/// latest of the parts'.
#[tokio::test]
async fn local_denials_last_until_the_latest_part() {
    let clock = MockClock::new();
    let backend = MemoryBackend::with_clock(clock.clone());
    let l = Limiter::builder("denials", plan(), backend)
        .local_denials(2 * H)
        .build();
    let k = Key::new("k");
    for _ in 0..10 {
        assert!(l.check(&k).await.is_allowed());
    }
    for _ in 0..5 {
        let v = l.check(&k).await;
        let d = v.decision().expect("a decision");
        assert!(d.is_denied());
        assert_eq!(d.part(), 1);
    }
}
