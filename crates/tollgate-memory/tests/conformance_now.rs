//! The memory backend's in-process answers (`Backend::decide_now`, what
//! `Limiter::check_cost_now` and the limiter's short path take) against
//! the conformance suite and the reference model: every decision is asked
//! of `decide_now` first, and of `decide` only when it gives no answer.
//! `decide_now` builds the decision without an override on a path of its
//! own, which the suite run through `decide` does not take.

use std::time::Duration;

use tollgate_limiter::{Backend, Decision, MockClock, Policy, Receipt, Request, Scope};
use tollgate_memory::{MemoryBackend, MemoryError};

/// The memory backend, asked `decide_now` before `decide`.
#[derive(Clone, Debug)]
struct NowFirst(MemoryBackend<MockClock>);

impl Backend for NowFirst {
    type Error = MemoryError;

    fn decide(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<Decision, MemoryError>> + Send {
        // Asked now, as the limiter asks; `None` changed nothing.
        let now = self.0.decide_now(&req);
        let later = now.is_none().then(|| self.0.decide(req));
        async move {
            match (now, later) {
                (Some(d), _) => Ok(d),
                (None, Some(later)) => later.await,
                (None, None) => unreachable!("asked of decide when decide_now did not answer"),
            }
        }
    }

    fn reserve(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<(Decision, Receipt), MemoryError>> + Send {
        self.0.reserve(req)
    }

    fn set_override(
        &self,
        scope: Scope<'_>,
        policy: Option<&Policy>,
    ) -> impl Future<Output = Result<(), MemoryError>> + Send {
        self.0.set_override(scope, policy)
    }

    fn set_expiring_override(
        &self,
        scope: Scope<'_>,
        policy: &Policy,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), MemoryError>> + Send {
        self.0.set_expiring_override(scope, policy, ttl)
    }

    fn replace_override(
        &self,
        scope: Scope<'_>,
        current: Option<&Policy>,
        policy: &Policy,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, MemoryError>> + Send {
        self.0.replace_override(scope, current, policy, ttl)
    }

    fn get_override(
        &self,
        scope: Scope<'_>,
    ) -> impl Future<Output = Result<Option<Policy>, MemoryError>> + Send {
        self.0.get_override(scope)
    }

    fn get_override_and_ttl(
        &self,
        scope: Scope<'_>,
    ) -> impl Future<Output = Result<Option<(Policy, Option<Duration>)>, MemoryError>> + Send {
        self.0.get_override_and_ttl(scope)
    }
}

tollgate_testkit::conformance_tests!(
    async {
        let clock = MockClock::new();
        (NowFirst(MemoryBackend::with_clock(clock.clone())), clock)
    },
    cases = 1000
);
