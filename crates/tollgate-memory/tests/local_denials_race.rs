//! A refusal the backend decided before this worker's reset or override,
//! and whose answer arrives after it, is not cached: the reset or the
//! override takes effect at once, as `LimiterBuilder::local_denials`
//! promises for this worker's own calls.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tollgate_limiter::{
    Backend, Decision, Key, Limiter, MockClock, Op, Policy, Request, Scope, TokenBucket,
};
use tollgate_memory::{MemoryBackend, MemoryError};

/// The two ends of a held answer: told when the backend has decided,
/// then waiting to be let go.
type Gate = (oneshot::Sender<()>, oneshot::Receiver<()>);

/// A backend whose next charge is decided at once and its answer held
/// until released: a round trip whose reply is still on its way.
#[derive(Clone)]
struct Held {
    inner: MemoryBackend<MockClock>,
    gate: Arc<Mutex<Option<Gate>>>,
}

impl Held {
    /// Holds the answer of the next charge: the first receiver says it
    /// was decided, the sender lets it go.
    fn hold_next(&self) -> (oneshot::Receiver<()>, oneshot::Sender<()>) {
        let (decided_tx, decided_rx) = oneshot::channel();
        let (release_tx, release_rx) = oneshot::channel();
        *self.gate.lock().unwrap() = Some((decided_tx, release_rx));
        (decided_rx, release_tx)
    }
}

impl Backend for Held {
    type Error = MemoryError;

    fn decide(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<Decision, MemoryError>> + Send {
        let gate = match req.op {
            Op::Acquire(_) => self.gate.lock().unwrap().take(),
            _ => None,
        };
        // The memory backend decides when asked, not when polled.
        let decided = self.inner.decide(req);
        async move {
            let answer = decided.await;
            if let Some((decided, release)) = gate {
                let _ = decided.send(());
                let _ = release.await;
            }
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

#[tokio::test]
async fn a_refusal_answered_after_this_workers_reset_or_override_is_not_cached() {
    // One token an hour: nothing drips back within the test.
    let hour = Duration::from_secs(3600);
    let one = Policy::from(TokenBucket::new(1, 1, hour).unwrap());
    let two = Policy::from(TokenBucket::new(2, 1, hour).unwrap());
    for undo in ["reset", "override"] {
        let backend = Held {
            inner: MemoryBackend::with_clock(MockClock::new()),
            gate: Arc::default(),
        };
        let limiter = Limiter::builder("held", one, backend.clone())
            .local_denials(Duration::from_secs(60))
            .timeout(Duration::from_secs(30))
            .build();
        let key = Key::new("k");
        assert!(limiter.check(&key).await.is_allowed());
        // Refused by the backend; the answer is on its way.
        let (decided, release) = backend.hold_next();
        let refused = tokio::spawn({
            let (limiter, key) = (limiter.clone(), key.clone());
            async move { limiter.check(&key).await.is_allowed() }
        });
        decided.await.unwrap();
        // This worker unblocks the key meanwhile.
        match undo {
            "reset" => drop(limiter.reset(&key).await.unwrap()),
            _ => limiter.set_override(Some(&key), Some(two)).await.unwrap(),
        }
        release.send(()).unwrap();
        assert!(!refused.await.unwrap(), "{undo}");
        // The backend would admit the key now: the refusal decided before
        // must not answer for it.
        let after = limiter.check(&key).await;
        assert!(after.is_allowed(), "{undo}: {after:?}");
    }
}
