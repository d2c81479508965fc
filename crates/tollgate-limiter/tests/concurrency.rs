//! A concurrency limit through every charging call of the limiter: each
//! one that passes takes a slot.

use std::time::Duration;

use tollgate_limiter::{Concurrency, Key, Limiter, MockClock};
use tollgate_memory::MemoryBackend;

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
