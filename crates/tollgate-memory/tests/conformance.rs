//! The memory backend against the conformance suite and the reference model.

use tollgate_limiter::MockClock;
use tollgate_memory::MemoryBackend;

tollgate_testkit::conformance_tests!(
    async {
        let clock = MockClock::new();
        (MemoryBackend::with_clock(clock.clone()), clock)
    },
    cases = 3000
);

/// A penalised flood keeps the log bounded by the limit and agrees with the
/// model decision by decision.
#[tokio::test]
async fn penalised_flood_keeps_the_log_bounded() {
    let clock = tollgate_limiter::MockClock::new();
    let backend = tollgate_memory::MemoryBackend::with_clock(clock.clone());
    let (name, key, limit) =
        tollgate_testkit::conformance::penalised_flood(&backend, &clock, 20_000).await;
    let kept = backend.log_len(&name, &key);
    assert!(kept >= 1 && kept as u64 <= limit + 1, "{kept} events kept");
}
