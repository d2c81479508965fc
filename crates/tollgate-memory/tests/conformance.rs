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
