//! Failure domains: a limiter keeps one circuit breaker per failure domain
//! of its backend (a Redis Cluster's slot ranges), so one part's failures
//! answer only that part's keys from the fail mode. Driven on tokio's
//! paused clock with a backend of three "masters" (memory backends with
//! fault injection): keys starting with `b` on the second, the
//! limiter-wide override on the third, every other key on the first.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use metrics_util::debugging::DebugValue;
use tollgate_limiter::{
    Backend, BreakerConfig, Decision, Error, FailMode, Key, Limiter, Policy, Request, Scope,
    TokenBucket, Verdict,
};
use tollgate_memory::{MemoryBackend, MemoryError};

mod support;
use support::recorded;

const BACKOFF: Duration = Duration::from_secs(1);

/// Three masters that fail apart, one failure domain each.
#[derive(Clone, Default)]
struct Masters([MemoryBackend; 3]);

impl Masters {
    fn domain(scope: Scope<'_>) -> usize {
        match scope {
            Scope::Key(_, k) if k.as_str().starts_with('b') => 1,
            Scope::Key(..) => 0,
            Scope::Limiter(_) => 2,
        }
    }

    fn master(&self, scope: Scope<'_>) -> &MemoryBackend {
        &self.0[Self::domain(scope)]
    }

    fn of(&self, req: &Request<'_>) -> &MemoryBackend {
        self.master(Scope::Key(req.limiter, req.key))
    }
}

impl Backend for Masters {
    type Error = MemoryError;

    fn decide(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<Decision, MemoryError>> + Send {
        self.of(&req).decide(req)
    }

    // The limiter's short path asks this first: domains must hold there too.
    fn decide_now(&self, req: &Request<'_>) -> Option<Decision> {
        self.of(req).decide_now(req)
    }

    fn set_override(
        &self,
        scope: Scope<'_>,
        policy: Option<&Policy>,
    ) -> impl Future<Output = Result<(), MemoryError>> + Send {
        self.master(scope).set_override(scope, policy)
    }

    fn get_override(
        &self,
        scope: Scope<'_>,
    ) -> impl Future<Output = Result<Option<Policy>, MemoryError>> + Send {
        self.master(scope).get_override(scope)
    }

    fn failure_domains(&self) -> usize {
        3
    }

    fn failure_domain(&self, scope: Scope<'_>) -> usize {
        Self::domain(scope)
    }
}

fn limiter(backend: &Masters) -> Limiter<Masters> {
    Limiter::builder(
        "api",
        TokenBucket::new(1000, 1, Duration::from_secs(1)).unwrap(),
        backend.clone(),
    )
    .fail_mode(FailMode::Closed)
    .timeout(Duration::from_millis(50))
    .breaker(BreakerConfig {
        threshold: 2,
        backoff: BACKOFF,
        max_backoff: Duration::from_secs(8),
    })
    .build()
}

/// Whether the backend decided (`Ok`), or why not.
async fn check(l: &Limiter<Masters>, key: &str) -> Result<(), String> {
    match l.check(&Key::new(key)).await {
        Verdict::Decided(_) => Ok(()),
        Verdict::FailedClosed(Error::BreakerOpen, _) => Err("breaker open".into()),
        Verdict::FailedClosed(Error::Backend(_), _) => Err("backend".into()),
        other => panic!("{other:?}"),
    }
}

/// Fails `master` and checks `key` on it until its breaker opens.
async fn open(backend: &Masters, l: &Limiter<Masters>, master: usize, key: &str) {
    backend.0[master].set_failing(true);
    assert_eq!(check(l, key).await, Err("backend".into()));
    assert_eq!(check(l, key).await, Err("backend".into()));
    assert_eq!(check(l, key).await, Err("breaker open".into()));
}

#[tokio::test(start_paused = true)]
async fn failures_in_one_domain_open_its_breaker_only() {
    let backend = Masters::default();
    let l = limiter(&backend);
    open(&backend, &l, 0, "a1").await;
    // Every key of the domain is refused by its breaker, not only the
    // failing one: the breaker is the master's, not the key's.
    assert_eq!(check(&l, "a2").await, Err("breaker open".into()));
    let calls = backend.0[0].faulty_calls();
    // The other domains keep deciding, through the short path and the
    // general one, and their limiter-wide override is reachable.
    assert_eq!(check(&l, "b1").await, Ok(()));
    let now = l
        .check_cost_now(&Key::new("b2"), 1)
        .expect("decided at once");
    assert!(matches!(now, Verdict::Decided(_)), "{now:?}");
    assert!(l.try_peek(&Key::new("b1"), 1).await.is_ok());
    assert!(l.get_override(None).await.is_ok());
    assert_eq!(
        backend.0[0].faulty_calls(),
        calls,
        "the open domain was not called"
    );
    // A per-key override is in its key's domain: refused at once there.
    let key = Key::new("a3");
    assert!(matches!(
        l.get_override(Some(&key)).await,
        Err(Error::BreakerOpen)
    ));
}

#[tokio::test(start_paused = true)]
async fn each_domain_probes_on_its_own() {
    let backend = Masters::default();
    let l = limiter(&backend);
    open(&backend, &l, 0, "a1").await;
    tokio::time::advance(BACKOFF / 2).await;
    open(&backend, &l, 1, "b1").await;

    // Domain 0's back-off is over: its probe goes through and hangs (the
    // master is back but slow). It is domain 0's only call in flight...
    tokio::time::advance(BACKOFF / 2).await;
    backend.0[0].clear_faults();
    backend.0[0].set_delay(Duration::from_secs(3600));
    let a1 = Key::new("a1");
    let mut probe = pin!(l.check(&a1));
    let first = std::future::poll_fn(|cx| Poll::Ready(probe.as_mut().poll(cx).is_pending()));
    assert!(first.await, "the probe waits for its master");
    assert_eq!(check(&l, "a2").await, Err("breaker open".into()));
    // ...and domain 1, half a back-off younger, is still open.
    assert_eq!(check(&l, "b2").await, Err("breaker open".into()));

    // Domain 1's back-off ends while domain 0's probe is in flight: it
    // probes too, fails, and backs off twice as long, on its own.
    tokio::time::advance(BACKOFF / 2 - Duration::from_millis(1)).await;
    assert_eq!(check(&l, "b2").await, Err("breaker open".into()));
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(check(&l, "b2").await, Err("backend".into()), "probed");
    assert_eq!(check(&l, "b2").await, Err("breaker open".into()));

    // Domain 0's probe timed out long ago (50 ms); its master answers
    // again: the next caller probes, succeeds and closes domain 0 only.
    let timed_out = probe.await;
    assert!(
        matches!(timed_out, Verdict::FailedClosed(Error::Timeout(_), _)),
        "{timed_out:?}"
    );
    for master in &backend.0 {
        master.clear_faults();
    }
    assert_eq!(check(&l, "b1").await, Err("breaker open".into()));
    tokio::time::advance(2 * BACKOFF).await;
    for key in ["a1", "a2", "b1"] {
        assert_eq!(check(&l, key).await, Ok(()), "{key}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_limiter_wide_override_fails_in_its_own_domain() {
    let backend = Masters::default();
    let l = limiter(&backend);
    backend.0[2].set_failing(true);
    let policy = Policy::from(TokenBucket::new(10, 1, Duration::from_secs(1)).unwrap());
    for _ in 0..2 {
        let e = l.set_override(None, Some(policy)).await.unwrap_err();
        assert!(matches!(e, Error::Backend(_)), "{e:?}");
    }
    assert!(matches!(
        l.get_override(None).await,
        Err(Error::BreakerOpen)
    ));
    // The keys' domains were not charged with its failures.
    assert_eq!(check(&l, "a1").await, Ok(()));
    assert_eq!(check(&l, "b1").await, Ok(()));
    assert!(
        l.set_override(Some(&Key::new("a1")), Some(policy))
            .await
            .is_ok()
    );
}

/// The breaker-state gauge is the worst state over the domains.
#[test]
fn the_breaker_gauge_is_the_worst_domain() {
    recorded(|snapshotter| async move {
        let gauge = || {
            let values = snapshotter.snapshot().into_vec();
            let (.., value) = values
                .into_iter()
                .find(|(k, ..)| k.key().name() == "tollgate_breaker_state")
                .expect("registered");
            match value {
                DebugValue::Gauge(g) => g.0,
                other => panic!("{other:?}"),
            }
        };
        let backend = Masters::default();
        let l = limiter(&backend);
        assert_eq!(gauge(), 0.0);
        open(&backend, &l, 0, "a1").await;
        assert_eq!(gauge(), 2.0);
        open(&backend, &l, 1, "b1").await;
        // Domain 0 closes; domain 1 is still open.
        backend.0[0].clear_faults();
        tokio::time::advance(BACKOFF).await;
        assert_eq!(check(&l, "a1").await, Ok(()));
        assert_eq!(gauge(), 2.0, "domain 1 is still open");
        // Domain 1 probes (half-open while it waits), then closes.
        backend.0[1].clear_faults();
        backend.0[1].set_delay(Duration::from_millis(10));
        let b1 = Key::new("b1");
        let mut probe = pin!(l.check(&b1));
        let first = std::future::poll_fn(|cx| Poll::Ready(probe.as_mut().poll(cx).is_pending()));
        assert!(first.await);
        assert_eq!(gauge(), 1.0, "the worst is now a probe");
        assert!(matches!(probe.await, Verdict::Decided(_)));
        assert_eq!(gauge(), 0.0);
    });
}

/// The short path a tower layer asks first (`check_cost_now`) never takes
/// a probe it would give back: a backend that cannot answer at once (a
/// Redis one; here, a failing master) left it to `check_cost`, which
/// probed again, and each probe counted two `half_open` transitions and a
/// spurious `open` in between, and the gauge flickered.
#[test]
fn the_short_path_leaves_a_due_probe_to_the_decision_that_waits() {
    recorded(|snapshotter| async move {
        // The transitions since the last call (a snapshot resets them), by
        // the state entered: [open, half_open, closed].
        let transitions = || -> [u64; 3] {
            let mut by = [0; 3];
            for (k, .., v) in snapshotter.snapshot().into_vec() {
                if k.key().name() != "tollgate_breaker_transitions_total" {
                    continue;
                }
                let to = k.key().labels().find(|l| l.key() == "to").unwrap();
                let i = ["open", "half_open", "closed"]
                    .iter()
                    .position(|s| *s == to.value())
                    .unwrap();
                by[i] += match v {
                    DebugValue::Counter(c) => c,
                    other => panic!("{other:?}"),
                };
            }
            by
        };
        let backend = Masters::default();
        let l = limiter(&backend);
        open(&backend, &l, 0, "a1").await;
        assert_eq!(transitions(), [1, 0, 0]);
        // Open: the short path answers from the fail mode at once.
        let a1 = Key::new("a1");
        let now = l.check_cost_now(&a1, 1).expect("answered at once");
        assert!(
            matches!(now, Verdict::FailedClosed(Error::BreakerOpen, _)),
            "{now:?}"
        );
        tokio::time::advance(BACKOFF).await;
        // A probe is due: the layer's short path leaves it to
        // `check`, which probes once (and fails: the master is down).
        assert!(l.check_cost_now(&a1, 1).is_none(), "no answer at once");
        assert_eq!(check(&l, "a1").await, Err("backend".into()));
        // One probe, whose failure opened the breaker again.
        assert_eq!(transitions(), [1, 1, 0]);
        // A probe due on a master that answers at once is left to
        // the waiting path too, and closes the breaker there.
        backend.0[0].clear_faults();
        tokio::time::advance(2 * BACKOFF).await;
        assert!(l.check_cost_now(&a1, 1).is_none());
        assert_eq!(check(&l, "a1").await, Ok(()));
        assert_eq!(transitions(), [0, 1, 1]);
        let now = l.check_cost_now(&a1, 1).expect("closed: decided at once");
        assert!(matches!(now, Verdict::Decided(_)), "{now:?}");
    });
}
