//! Local denials in front of a sliding window that penalises refusals: a
//! flood answered locally is still recorded, and the cache never admits
//! more than the backend alone would. A refusal decided before this
//! worker's reset or override and answered after it is not cached.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::oneshot;
use tollgate_limiter::{
    Backend, Decision, Key, Limiter, MockClock, Op, Policy, Request, Reservation, Scope,
    SlidingWindow, TokenBucket,
};
use tollgate_memory::{MemoryBackend, MemoryError};

const S: Duration = Duration::from_secs(1);

/// The two ends of a held answer: told when the backend has decided,
/// then waiting to be let go.
type Gate = (oneshot::Sender<()>, oneshot::Receiver<()>);

/// A backend counting the decisions it is asked for; the answer of the
/// next charge can be held (see [`Counting::hold_next`]).
#[derive(Clone)]
struct Counting {
    inner: MemoryBackend<MockClock>,
    calls: Arc<AtomicU64>,
    gate: Arc<Mutex<Option<Gate>>>,
    /// Holds the next settle before it is decided.
    settle_gate: Arc<Mutex<Option<Gate>>>,
    /// Overrides take a second (of tokio's clock) to arrive.
    slow_overrides: Arc<std::sync::atomic::AtomicBool>,
}

impl Counting {
    fn new(inner: &MemoryBackend<MockClock>) -> Self {
        Self {
            inner: inner.clone(),
            calls: Arc::default(),
            gate: Arc::default(),
            settle_gate: Arc::default(),
            slow_overrides: Arc::default(),
        }
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Decides the next charge at once and holds its answer, as a round
    /// trip whose reply is still on its way: the receiver says it was
    /// decided, the sender lets the answer go.
    fn hold_next(&self) -> (oneshot::Receiver<()>, oneshot::Sender<()>) {
        let (decided_tx, decided_rx) = oneshot::channel();
        let (release_tx, release_rx) = oneshot::channel();
        *self.gate.lock().unwrap() = Some((decided_tx, release_rx));
        (decided_rx, release_tx)
    }

    /// Holds the next settle before it is decided, as a call still on its
    /// way to the server: the receiver says it arrived, the sender lets it
    /// be decided.
    fn hold_next_settle(&self) -> (oneshot::Receiver<()>, oneshot::Sender<()>) {
        let (arrived_tx, arrived_rx) = oneshot::channel();
        let (release_tx, release_rx) = oneshot::channel();
        *self.settle_gate.lock().unwrap() = Some((arrived_tx, release_rx));
        (arrived_rx, release_tx)
    }
}

impl Backend for Counting {
    type Error = MemoryError;

    fn decide(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<Decision, MemoryError>> + Send {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let gate = match req.op {
            Op::Acquire(_) => self.gate.lock().unwrap().take(),
            _ => None,
        };
        let settle_gate = match req.op {
            Op::Settle { .. } => self.settle_gate.lock().unwrap().take(),
            _ => None,
        };
        let (inner, held) = (self.inner.clone(), settle_gate.is_some());
        let owned = (req.limiter.to_owned(), req.key.clone(), *req.policy, req.op);
        // The memory backend decides when asked, not when polled.
        let decided = (!held).then(|| self.inner.decide(req));
        async move {
            if let Some((arrived, release)) = settle_gate {
                let _ = arrived.send(());
                let _ = release.await;
                let (limiter, key, policy, op) = owned;
                let req = Request {
                    limiter: &limiter,
                    key: &key,
                    policy: &policy,
                    op,
                };
                return inner.decide(req).await;
            }
            let answer = decided.expect("decided when asked").await;
            if let Some((decided, release)) = gate {
                let _ = decided.send(());
                let _ = release.await;
            }
            answer
        }
    }

    // Forwarded, not counted: the trait's default answers a receipt that
    // refunds nothing.
    fn reserve(
        &self,
        req: Request<'_>,
    ) -> impl Future<
        Output = Result<(Decision, tollgate_limiter::strategy::reservation::Receipt), MemoryError>,
    > + Send {
        self.inner.reserve(req)
    }

    fn set_override(
        &self,
        scope: Scope<'_>,
        policy: Option<&Policy>,
    ) -> impl Future<Output = Result<(), MemoryError>> + Send {
        let slow = self.slow_overrides.load(Ordering::SeqCst);
        let set = self.inner.set_override(scope, policy);
        async move {
            if slow {
                tokio::time::sleep(S).await;
            }
            set.await
        }
    }

    fn get_override(
        &self,
        scope: Scope<'_>,
    ) -> impl Future<Output = Result<Option<Policy>, MemoryError>> + Send {
        self.inner.get_override(scope)
    }
}

/// The same window twice on one backend: once behind a local denial cache,
/// once without.
struct Pair {
    clock: MockClock,
    cached: Limiter<Counting>,
    plain: Limiter<Counting>,
}

impl Pair {
    fn new(policy: Policy) -> Self {
        let clock = MockClock::new();
        let backend = MemoryBackend::with_clock(clock.clone());
        let cached = Limiter::builder("cached", policy, Counting::new(&backend))
            .local_denials(Duration::from_secs(60))
            .build();
        let plain = Limiter::new("plain", policy, Counting::new(&backend));
        Self {
            clock,
            cached,
            plain,
        }
    }

    /// Lets time pass on the backend's clock and on tokio's (the cache's).
    async fn advance(&self, d: Duration) {
        self.clock.advance(d);
        tokio::time::advance(d).await;
    }

    /// One request of `cost` on each limiter: (cached allowed, plain allowed).
    async fn request(&self, cost: u64) -> (bool, bool) {
        let k = Key::new("flooder");
        let cached = self.cached.check_cost(&k, cost).await.is_allowed();
        let plain = self.plain.check_cost(&k, cost).await.is_allowed();
        (cached, plain)
    }
}

fn penalised(limit: u64, window: Duration) -> Policy {
    SlidingWindow::new(limit, window)
        .unwrap()
        .penalise_refused(true)
        .into()
}

#[tokio::test(start_paused = true)]
async fn a_flood_answered_locally_is_still_penalised() {
    let pair = Pair::new(penalised(1, 10 * S));
    let mut admitted = (Vec::new(), Vec::new());
    // A flood, one request a second for 12 s, then a few stragglers.
    let times: Vec<u64> = (0..12).chain([15, 21, 22, 26, 40]).collect();
    let mut now = 0;
    for t in times {
        pair.advance(Duration::from_secs(t - now)).await;
        now = t;
        let (cached, plain) = pair.request(1).await;
        if cached {
            admitted.0.push(t);
        }
        if plain {
            admitted.1.push(t);
        }
    }
    // Without carrying the local refusals, the cached limiter would admit
    // at t=11: the only events the backend saw (t=0, t=1) have left.
    assert_eq!(admitted.1, [0, 40]);
    assert_eq!(admitted.0, admitted.1);
    assert!(
        pair.cached.backend().calls() < pair.plain.backend().calls() / 2,
        "the flood was answered locally: {} backend calls against {}",
        pair.cached.backend().calls(),
        pair.plain.backend().calls()
    );
}

#[tokio::test(start_paused = true)]
async fn local_denials_never_admit_more_than_the_backend_alone() {
    // Random traces (a small xorshift, so every run checks the same ones).
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for _ in 0..200 {
        let limit = 1 + next(4);
        let pair = Pair::new(penalised(
            limit,
            Duration::from_millis(500 + 500 * next(20)),
        ));
        let (mut cached, mut plain) = (0, 0);
        for _ in 0..200 {
            pair.advance(Duration::from_millis(next(1500))).await;
            let (c, p) = pair.request(1 + next(limit)).await;
            cached += u64::from(c);
            plain += u64::from(p);
            assert!(
                cached <= plain,
                "{cached} admitted with the cache, {plain} without"
            );
        }
    }
}

/// A request that was to carry a flood's local refusals to the backend,
/// and whose caller went away before the backend answered, leaves them to
/// the key's next request: dropped with it, the flood would go unrecorded,
/// and the cache admit what the backend alone refuses.
#[tokio::test(start_paused = true)]
async fn refusals_a_dropped_request_was_carrying_are_carried_by_the_next() {
    let pair = Pair::new(penalised(1, 10 * S));
    assert_eq!(pair.request(1).await, (true, true));
    // t = 1 s: refused (and recorded) by the backend, cached until 11 s;
    // t = 2..10 s: the cached limiter refuses locally, the plain one
    // records each.
    for _ in 1..=10 {
        pair.advance(S).await;
        assert_eq!(pair.request(1).await, (false, false));
    }
    // t = 11 s: the requests wait for the backend (the memory backend
    // decides after its delay) and their callers go away.
    pair.advance(S).await;
    let backend = &pair.cached.backend().inner;
    backend.set_delay(Duration::from_secs(3600));
    let k = Key::new("flooder");
    for l in [&pair.cached, &pair.plain] {
        let mut check = std::pin::pin!(l.check(&k));
        let pending = std::future::poll_fn(|cx| Poll::Ready(check.as_mut().poll(cx).is_pending()));
        assert!(pending.await);
    }
    backend.clear_faults();
    // Still 11 s: the events the backend saw from the cached limiter (0 s,
    // 1 s) have left the window; the flood it refused locally had not.
    assert_eq!(pair.request(1).await, (false, false));
}

/// One token an hour: nothing drips back within a test.
const HOUR: Duration = Duration::from_secs(3600);

/// A limiter of one token an hour with local denials over a [`Counting`]
/// backend, its token taken by the returned reservation.
async fn one_token_reserved() -> (Counting, Limiter<Counting>, Key, Reservation<Counting>) {
    let one = Policy::from(TokenBucket::new(1, 1, HOUR).unwrap());
    let backend = Counting::new(&MemoryBackend::with_clock(MockClock::new()));
    let limiter = Limiter::builder("held", one, backend.clone())
        .local_denials(Duration::from_secs(60))
        .timeout(Duration::from_secs(30))
        .build();
    let key = Key::new("k");
    let (taken, reservation) = limiter.reserve(&key, 1).await;
    assert!(taken.is_allowed());
    (backend, limiter, key, reservation)
}

/// A refusal the backend decided before this worker's reset, override or
/// refund, and whose answer arrives after it, is not cached: each takes
/// effect at once, as `LimiterBuilder::local_denials`
/// promises for this worker's own calls.
#[tokio::test]
async fn a_refusal_answered_after_this_workers_reset_or_override_is_not_cached() {
    let two = Policy::from(TokenBucket::new(2, 1, HOUR).unwrap());
    for undo in ["reset", "override", "refund"] {
        // The token is taken by a reservation, which "refund" gives back.
        let (backend, limiter, key, reservation) = one_token_reserved().await;
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
            "override" => limiter.set_override(Some(&key), Some(two)).await.unwrap(),
            _ => drop(reservation.refund().await.unwrap()),
        }
        release.send(()).unwrap();
        assert!(!refused.await.unwrap(), "{undo}");
        // The backend would admit the key now: the refusal decided before
        // must not answer for it.
        let after = limiter.check(&key).await;
        assert!(after.is_allowed(), "{undo}: {after:?}");
    }
}

/// A refusal asked after this worker began a refund, decided before the
/// refund reached the backend and answered after it, is not cached either:
/// the refund forgets the key once it is answered, as a reset does.
#[tokio::test]
async fn a_refusal_decided_while_a_refund_is_on_its_way_is_not_cached() {
    let (backend, limiter, key, reservation) = one_token_reserved().await;
    // The refund is on its way to the backend.
    let (arrived, let_settle) = backend.hold_next_settle();
    let refund = tokio::spawn(async move { reservation.refund().await });
    arrived.await.unwrap();
    // Meanwhile a check is refused (the token is still out), its answer
    // on its way.
    let (decided, let_answer) = backend.hold_next();
    let refused = tokio::spawn({
        let (limiter, key) = (limiter.clone(), key.clone());
        async move { limiter.check(&key).await.is_allowed() }
    });
    decided.await.unwrap();
    // The refund is decided and answered, then the refusal.
    let_settle.send(()).unwrap();
    let refunded = refund.await.unwrap().unwrap().expect("a held reservation");
    assert!(refunded.is_allowed(), "{refunded:?}");
    let_answer.send(()).unwrap();
    assert!(!refused.await.unwrap());
    // The backend admits the key again: the refusal must not answer for it.
    let after = limiter.check(&key).await;
    assert!(after.is_allowed(), "{after:?}");
}

/// A settle forgets the refusals cached for its own key, not those of
/// every key: a refusal answered while another client's reservation was
/// settled is cached all the same. Behind a layer that settles every
/// request (charging LLM calls by their real cost), a settle overlapped
/// nearly every refusal's round trip, so a flood's refusals were never
/// cached and each asked the backend: the storm the cache is for.
#[tokio::test]
async fn a_settle_of_another_key_leaves_a_refusal_cached() {
    let (backend, limiter, key, _) = one_token_reserved().await;
    let other = Key::new("other");
    let (taken, reservation) = limiter.reserve(&other, 1).await;
    assert!(taken.is_allowed());
    // The flooder's refusal is on its way while the other key settles.
    let (decided, release) = backend.hold_next();
    let refused = tokio::spawn({
        let (limiter, key) = (limiter.clone(), key.clone());
        async move { limiter.check(&key).await.is_allowed() }
    });
    decided.await.unwrap();
    assert!(reservation.settle(1).await.unwrap().is_some());
    release.send(()).unwrap();
    assert!(!refused.await.unwrap());
    // The flood goes on: answered locally, the backend left alone.
    let calls = backend.calls();
    for _ in 0..10 {
        assert!(!limiter.check(&key).await.is_allowed());
    }
    assert_eq!(
        backend.calls() - calls,
        0,
        "refusals that asked the backend"
    );
}

/// A reset or an override given up by its caller (a timeout around it) may
/// still have been applied by the backend (Redis runs a script it has
/// received): the refusals this worker cached are forgotten all the same,
/// and the next request asks the backend. They were kept until they
/// expired (here a minute).
#[tokio::test(start_paused = true)]
async fn a_reset_or_override_given_up_by_its_caller_forgets_cached_refusals() {
    let backend = MemoryBackend::with_clock(MockClock::new());
    let counting = Counting::new(&backend);
    let policy = Policy::from(TokenBucket::new(1, 1, 3600 * S).unwrap());
    let limiter = Limiter::builder("cached", policy, counting.clone())
        .local_denials(60 * S)
        .build();
    let k = Key::new("k");
    for given_up in ["reset", "override"] {
        let _ = limiter.check(&k).await;
        assert!(!limiter.check(&k).await.is_allowed(), "{given_up}");
        backend.set_delay(S);
        counting.slow_overrides.store(true, Ordering::SeqCst);
        let call = async {
            match given_up {
                "reset" => limiter.reset(&k).await.map(|_| ()),
                _ => limiter.set_override(Some(&k), Some(policy)).await,
            }
        };
        assert!(
            tokio::time::timeout(Duration::from_millis(10), call)
                .await
                .is_err(),
            "{given_up} answered before the delay"
        );
        backend.clear_faults();
        counting.slow_overrides.store(false, Ordering::SeqCst);
        let asked = counting.calls();
        let _ = limiter.check(&k).await;
        assert_eq!(
            counting.calls(),
            asked + 1,
            "after a {given_up} given up, a refusal cached before it answered"
        );
    }
}

/// A request carrying a flood's local refusals whose caller goes away
/// gives them back to the key (see above), but not across this worker's
/// reset of the key made meanwhile: they were refused before it, and the
/// reset forgets them. Given back, the key's next request recorded them
/// on the fresh key, and a user a reset had just unblocked was refused.
#[tokio::test(start_paused = true)]
async fn refusals_given_back_after_a_reset_are_not_carried() {
    let pair = Pair::new(penalised(1, 10 * S));
    assert_eq!(pair.request(1).await, (true, true));
    for _ in 1..=10 {
        pair.advance(S).await;
        assert_eq!(pair.request(1).await, (false, false));
    }
    // t = 11 s: a request carries the flood and waits for the backend.
    pair.advance(S).await;
    let backend = &pair.cached.backend().inner;
    backend.set_delay(HOUR);
    let k = Key::new("flooder");
    let mut check = Box::pin(pair.cached.check(&k));
    let pending = std::future::poll_fn(|cx| Poll::Ready(check.as_mut().poll(cx).is_pending()));
    assert!(pending.await);
    backend.clear_faults();
    // The key is reset meanwhile; then the caller goes away.
    for l in [&pair.cached, &pair.plain] {
        l.reset(&k).await.unwrap();
    }
    drop(check);
    assert_eq!(pair.request(1).await, (true, true));
}

/// A peek says what a check would say next. Right after a cached refusal
/// of a penalised window expired, the flood it refused locally is still
/// to be carried: the key's next check records it and is refused, so a
/// peek must say refused too. It asked the backend, which had not seen
/// the flood, and said allowed: a client polling with peeks was told to
/// go ahead, then refused.
#[tokio::test(start_paused = true)]
async fn a_peek_after_a_cached_refusal_expires_says_what_a_check_would() {
    let pair = Pair::new(penalised(1, 10 * S));
    assert_eq!(pair.request(1).await, (true, true));
    // t = 1 s: refused (and recorded) by the backend, cached until 11 s;
    // t = 2..10 s: refused locally by the cached limiter.
    for _ in 1..=10 {
        pair.advance(S).await;
        assert_eq!(pair.request(1).await, (false, false));
    }
    // t = 11 s: the cached refusal has expired.
    pair.advance(S).await;
    let k = Key::new("flooder");
    let peeks = (
        pair.cached.peek(&k).await.is_allowed(),
        pair.plain.peek(&k).await.is_allowed(),
    );
    assert_eq!(peeks, (false, false), "peeks (cached, plain)");
    // And the checks that follow say the same.
    assert_eq!(pair.request(1).await, (false, false));
}
