//! The backend conformance suite.
//!
//! Every check is a generic async function over any [`Backend`] that takes
//! its time from a [`MockClock`] (the caller-time mode of the Redis backend,
//! `MemoryBackend::with_clock` for the memory one). A backend's test crate
//! runs the whole suite with one line (this is
//! `crates/tollgate-memory/tests/conformance.rs`):
//!
//! ```text
//! tollgate_testkit::conformance_tests!(async {
//!     let clock = tollgate_limiter::MockClock::new();
//!     (tollgate_memory::MemoryBackend::with_clock(clock.clone()), clock)
//! });
//! ```
//!
//! Checks use limiter names unique to the process, so one backend (one
//! Redis server) can serve every check at once.
//!
//! The heart of the suite is [`agrees_with_model`]: thousands of random
//! traces (requests of random cost on a few keys, time steps, peeks,
//! penalties, resets, runtime overrides) replayed through the backend and through the
//! core's reference [`Model`], comparing every decision.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use tollgate_limiter::model::{Model, Receipt};
use tollgate_limiter::{
    Backend, Calendar, Clock, Composite, Concurrency, Decision, Key, Limiter, MockClock, Op,
    Period, Policy, ProgressiveDelay, Request, Scope, SlidingWindow, Timestamp, TokenBucket,
    Verdict,
};

const S: Duration = Duration::from_secs(1);

/// A limiter name no other check in this process uses.
pub fn unique_name(base: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{base}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Asserts that a limiter's fail mode held for a verdict: a fail-closed
/// limiter admits only on a decision from its backend, a fail-open one
/// refuses only on one (for fault and failover tests).
pub fn assert_fail_mode_held(mode: tollgate_limiter::FailMode, v: &tollgate_limiter::Verdict) {
    use tollgate_limiter::FailMode;
    match mode {
        FailMode::Closed if v.is_allowed() => {
            assert!(v.decision().is_some(), "fail-closed admitted on {v:?}")
        }
        FailMode::Open if !v.is_allowed() => {
            assert!(v.decision().is_some(), "fail-open refused on {v:?}")
        }
        _ => {}
    }
}

/// How long a [`patient`] limiter waits for each decision.
pub const PATIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// A limiter that waits up to [`PATIENT_TIMEOUT`] for each decision,
/// instead of the default 50 ms: for tests of what a backend decides, not
/// how fast. On a loaded test machine (two cores running two tests and the
/// servers) a round trip to Redis, with a script's first load, can take
/// longer than 50 ms, and the default would answer a timeout in place of
/// the decision under test.
pub fn patient<B: Backend>(
    name: impl Into<String>,
    policy: impl Into<Policy>,
    backend: B,
) -> Limiter<B> {
    Limiter::builder(name, policy, backend)
        .timeout(PATIENT_TIMEOUT)
        .build()
}

fn limiter<B: Backend>(base: &str, policy: impl Into<Policy>, backend: B) -> Limiter<B> {
    // Conformance is about verdicts, not latency.
    patient(unique_name(base), policy, backend)
}

async fn decide<B: Backend>(l: &Limiter<B>, key: &Key, cost: u64) -> Decision {
    l.try_acquire(key, cost)
        .await
        .unwrap_or_else(|e| panic!("backend failed: {e:?}"))
}

/// The backend's decision on `op`, asked directly (no limiter: no local
/// cache, no breaker, no fail mode in the way).
async fn raw_op<B: Backend>(
    backend: &B,
    limiter: &str,
    key: &Key,
    policy: &Policy,
    op: Op,
) -> Decision {
    let req = Request {
        limiter,
        key,
        policy,
        op,
    };
    backend.decide(req).await.expect("decided")
}

async fn peek<B: Backend>(l: &Limiter<B>, key: &Key, cost: u64) -> Decision {
    match l.peek_cost(key, cost).await {
        tollgate_limiter::Verdict::Decided(d) => d,
        other => panic!("peek failed: {other:?}"),
    }
}

/// A new key starts full, a burst of `capacity` passes, the next request is
/// refused with the exact wait, consumes nothing, and tokens drip back at
/// the refill rate up to capacity and no further.
pub async fn token_bucket_burst_and_refill<B: Backend>(backend: B, clock: MockClock) {
    let l = limiter("tb", TokenBucket::new(5, 1, S).unwrap(), backend);
    let k = Key::new("burst");
    for left in (0..5).rev() {
        let d = decide(&l, &k, 1).await;
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), left);
        assert_eq!(d.limit(), 5);
    }
    let d = decide(&l, &k, 1).await;
    assert!(d.is_denied());
    assert_eq!(d.retry_after(), S);
    assert_eq!(d.reset_after(), 5 * S);
    // Refused requests consume nothing: still exactly one second to wait.
    for _ in 0..3 {
        assert_eq!(decide(&l, &k, 1).await.retry_after(), S);
    }
    clock.advance(Duration::from_millis(999));
    assert!(decide(&l, &k, 1).await.is_denied());
    clock.advance(Duration::from_millis(1));
    assert!(decide(&l, &k, 1).await.is_allowed());
    // Never more than capacity.
    clock.advance(Duration::from_secs(3600));
    let d = peek(&l, &k, 1).await;
    assert_eq!(d.remaining(), 5);
    assert_eq!(d.reset_after(), Duration::ZERO);
}

/// A request of cost `n` waits for `n` tokens, and a refused costly request
/// does not block cheaper ones.
pub async fn token_bucket_cost<B: Backend>(backend: B, clock: MockClock) {
    let l = limiter("tbc", TokenBucket::new(10, 2, S).unwrap(), backend);
    let k = Key::new("llm");
    assert!(decide(&l, &k, 7).await.is_allowed());
    let d = decide(&l, &k, 5).await;
    assert!(d.is_denied());
    assert_eq!(d.remaining(), 3);
    // 2 missing tokens at 2 per second.
    assert_eq!(d.retry_after(), S);
    assert!(decide(&l, &k, 3).await.is_allowed());
    clock.advance(Duration::from_millis(2500));
    let d = decide(&l, &k, 5).await;
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
    // Cost above capacity is refused before the backend is asked.
    assert!(l.try_acquire(&k, 11).await.is_err());
}

/// The window is exact: events leave it exactly `window` after they
/// happened, and the retry-after is the moment the blocking ones leave.
pub async fn sliding_window_exact<B: Backend>(backend: B, clock: MockClock) {
    let l = limiter("sw", SlidingWindow::new(3, 10 * S).unwrap(), backend);
    let k = Key::new("203.0.113.9");
    assert!(decide(&l, &k, 1).await.is_allowed());
    clock.advance(2 * S);
    assert!(decide(&l, &k, 1).await.is_allowed());
    clock.advance(2 * S);
    let d = decide(&l, &k, 1).await;
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
    assert_eq!(d.reset_after(), 10 * S);
    clock.advance(S);
    let d = decide(&l, &k, 1).await;
    assert!(d.is_denied());
    assert_eq!(d.retry_after(), 5 * S);
    clock.advance(5 * S - Duration::from_micros(1));
    assert!(decide(&l, &k, 1).await.is_denied());
    clock.advance(Duration::from_micros(1));
    assert!(decide(&l, &k, 1).await.is_allowed());
    // Cost 2 needs the events of t=2s and t=4s gone: 4s from now (t=10s).
    let d = decide(&l, &k, 2).await;
    assert!(d.is_denied());
    assert_eq!(d.retry_after(), 4 * S);
    assert_eq!(d.remaining(), 0);
}

/// With "penalise refused", refusals are logged too: a client that keeps
/// hammering stays out; one that stops gets back in.
pub async fn sliding_window_penalise<B: Backend>(backend: B, clock: MockClock) {
    let policy = SlidingWindow::new(2, 10 * S)
        .unwrap()
        .penalise_refused(true);
    let l = limiter("swp", policy, backend);
    let k = Key::new("flood");
    assert!(decide(&l, &k, 1).await.is_allowed());
    assert!(decide(&l, &k, 1).await.is_allowed());
    for _ in 0..5 {
        clock.advance(3 * S);
        assert!(decide(&l, &k, 1).await.is_denied());
    }
    clock.advance(10 * S);
    assert!(decide(&l, &k, 1).await.is_allowed());
}

/// Failures beyond the free attempts block for growing, capped delays;
/// a success clears the key; state is forgotten after `forget_after`.
pub async fn progressive_delay<B: Backend>(backend: B, clock: MockClock) {
    let p = ProgressiveDelay::new(2, S, 2, 5 * S, 60 * S).unwrap();
    let l = limiter("pd", p, backend);
    let k = Key::new("victim@example.com");
    assert!(peek(&l, &k, 1).await.is_allowed());
    assert!(decide(&l, &k, 1).await.is_allowed());
    let d = decide(&l, &k, 1).await;
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
    let mut expected = [1, 2, 4, 5, 5].into_iter().map(|s| s * S);
    for _ in 0..5 {
        let d = decide(&l, &k, 1).await;
        let want = expected.next().unwrap();
        assert!(d.is_denied());
        assert_eq!(d.retry_after(), want);
        assert!(peek(&l, &k, 1).await.is_denied());
        clock.advance(want);
        assert!(
            peek(&l, &k, 1).await.is_allowed(),
            "a delay, not a lock-out"
        );
    }
    // A success (reset) clears everything.
    l.reset(&k).await.unwrap();
    let d = decide(&l, &k, 1).await;
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 1);
    // Forgotten 60s after the last failure.
    clock.advance(60 * S);
    assert_eq!(peek(&l, &k, 1).await.remaining(), 2);
}

/// A progressive delay's reservations, login attempts taken up front
/// (`tollgate_limiter::model::ProgressiveDelayState::reserve`): attempts
/// in flight together see each other, so of those made while the key is
/// free, the free ones and the one that starts the delay pass and every
/// later one is refused; a refused one records nothing (knocking does not
/// lengthen the delay); a refund (`Reservation::refund`) takes back the
/// attempt's own failure only, within the key's life, and leaves the delay
/// it started; a kept failure stays; a success (reset) clears the key and
/// a settle after it refunds nothing.
pub async fn progressive_delay_reservations<B: Backend + Clone>(backend: B, clock: MockClock) {
    let p = ProgressiveDelay::new(2, 10 * S, 2, 60 * S, 600 * S).unwrap();
    let l = limiter("pdr", p, backend);
    let k = Key::new("victim@example.com");
    let reserve = || l.reserve(&k, 1);
    // Six attempts in flight together: two free, the third starts 10 s.
    let mut held = Vec::new();
    let mut passed = 0;
    for _ in 0..6 {
        let (v, r) = reserve().await;
        if v.is_allowed() {
            passed += 1;
            assert_eq!(r.units(), 1);
        } else {
            let d = v.decision().expect("decided");
            assert_eq!(d.retry_after(), 10 * S);
            assert!(r.is_empty());
        }
        held.push(r);
    }
    assert_eq!(passed, 3, "the free attempts and one more pass");
    // Knocking while blocked records nothing: the delay ends as it was
    // set, and the next attempt is only the fourth failure (20 s).
    clock.advance(9 * S);
    for _ in 0..5 {
        assert!(!reserve().await.0.is_allowed());
    }
    let d = peek(&l, &k, 1).await;
    assert_eq!((d.retry_after(), d.remaining()), (S, 0));
    // The first two attempts were no failed logins (a 5xx): refunded;
    // the third's failure is kept. The delay it started stays.
    let third = held.remove(2);
    let mut held = held.into_iter();
    for want in [0, 1] {
        let d = held.next().unwrap().refund().await.unwrap().unwrap();
        assert_eq!(d.remaining(), want);
        assert_eq!(d.retry_after(), S, "the started delay stays");
    }
    assert!(third.settle(1).await.unwrap().is_some());
    clock.advance(S);
    // One failure left of three: two more attempts pass, the second
    // starting the delay again.
    assert!(reserve().await.0.is_allowed());
    let (v, last) = reserve().await;
    assert!(v.is_allowed());
    let (v, _) = reserve().await;
    assert_eq!(v.decision().map(|d| d.retry_after()), Some(10 * S));
    // A success clears the key; the refund of an attempt made before it
    // gives back nothing of the new life's failures.
    clock.advance(10 * S);
    l.reset(&k).await.unwrap();
    assert!(reserve().await.0.is_allowed());
    let d = last.refund().await.unwrap().unwrap();
    assert_eq!(d.remaining(), 1, "a refund crosses no reset");
    // A refund never takes more than its own failure, even if every
    // attempt of the life is refunded: the key is then as fresh.
    let k2 = Key::new("other@example.com");
    let (_, r) = l.reserve(&k2, 1).await;
    let d = r.refund().await.unwrap().unwrap();
    assert_eq!((d.is_allowed(), d.remaining()), (true, 2));
}

/// A progressive delay records whatever number of failures a call
/// reports (a cost is never impossible there: a layer whose cost comes
/// from the request lets the client pick it), and a key stays blocked
/// however many it adds up: each decision equals the reference model's,
/// whose count saturates. In the Redis script the count grew by 2^53 a
/// call (a cost above it is sent as 2^53) and was written with
/// `string.format('%d')`, which turns a number past 2^63 into a negative
/// one: from the 1,025th call on, the key reported billions of billions
/// of free attempts, and once the last delay ran out, no failure blocked
/// it again.
pub async fn progressive_delay_failures_saturate<B: Backend>(backend: B, clock: MockClock) {
    let policy = Policy::from(ProgressiveDelay::new(2, S, 2, 60 * S, 3600 * S).unwrap());
    let name = unique_name("pd-huge");
    let k = Key::new("victim@example.com");
    let mut model = Model::new();
    for i in 0..1_100 {
        // A peek now and then, and, past the 1,024th failure report, a
        // wait for the block to end: a key blocked by the model must stay
        // so.
        let op = match i % 100 {
            99 => Op::PEEK,
            _ => Op::Acquire(u64::MAX),
        };
        if i == 1_050 {
            clock.advance(61 * S);
        }
        let now = clock.now();
        let req = Request {
            limiter: &name,
            key: &k,
            policy: &policy,
            op,
        };
        let got = backend
            .decide(req)
            .await
            .unwrap_or_else(|e| panic!("call {i}: backend failed: {}", chain(&e)));
        let want = model.apply(&name, k.as_str(), now, &policy, op);
        assert_eq!(Some(got), want, "call {i} ({op:?})");
        assert!(got.is_denied(), "call {i} ({op:?}): {got:?}");
        clock.advance_micros(1_000);
    }
}

/// A peek changes nothing and asks about its own cost; a reset makes the
/// key fresh.
pub async fn peek_and_reset<B: Backend>(backend: B, _clock: MockClock) {
    let l = limiter("pr", TokenBucket::new(2, 1, 60 * S).unwrap(), backend);
    let k = Key::new("peek");
    for _ in 0..5 {
        let d = peek(&l, &k, 1).await;
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 2);
        assert!(peek(&l, &k, 2).await.is_allowed());
    }
    assert!(decide(&l, &k, 1).await.is_allowed());
    // One token left: a peek of 1 fits, a peek of 2 is told the exact wait.
    assert!(peek(&l, &k, 1).await.is_allowed());
    let d = peek(&l, &k, 2).await;
    assert!(d.is_denied());
    assert_eq!(d.remaining(), 1);
    assert_eq!(d.retry_after(), 60 * S);
    assert!(decide(&l, &k, 1).await.is_allowed());
    let d = peek(&l, &k, 1).await;
    assert!(d.is_denied());
    assert_eq!(d.retry_after(), 60 * S);
    // A peek of a cost above the capacity is the impossible-cost error.
    assert!(!l.peek_cost(&k, 3).await.is_allowed());
    let d = l.reset(&k).await.unwrap();
    assert_eq!(d.remaining(), 2);
    assert!(decide(&l, &k, 2).await.is_allowed());
}

/// A cost of 0 is not a free request: the backend charges at least one
/// unit, and a limiter charges at least its minimum cost.
pub async fn zero_cost_is_charged<B: Backend + Clone>(backend: B, _clock: MockClock) {
    let policy = Policy::from(SlidingWindow::new(3, 60 * S).unwrap());
    let l = limiter("zero", policy, backend.clone());
    let k = Key::new("free-rider");
    for left in [2, 1, 0] {
        let d = decide(&l, &k, 0).await;
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), left);
    }
    assert!(decide(&l, &k, 0).await.is_denied());
    // Straight to the backend: Op::Acquire(0) charges 1 too.
    let name = unique_name("zero-raw");
    let raw = |op| {
        backend.decide(Request {
            limiter: &name,
            key: &k,
            policy: &policy,
            op,
        })
    };
    for _ in 0..3 {
        assert!(raw(Op::Acquire(0)).await.is_ok_and(|d| d.is_allowed()));
    }
    assert!(raw(Op::Acquire(0)).await.is_ok_and(|d| d.is_denied()));
    // A limiter whose minimum cost is 2 charges 2 for a cost of 0 or 1.
    let l = Limiter::builder(unique_name("min"), policy, backend)
        .timeout(5 * S)
        .min_cost(2)
        .build();
    assert_eq!(decide(&l, &k, 0).await.remaining(), 1);
    assert!(
        peek(&l, &k, 0).await.is_denied(),
        "a peek asks for the minimum"
    );
    assert!(decide(&l, &k, 1).await.is_denied());
}

/// A cost is judged against the policy in force: an override raising the
/// limit lets a larger cost pass, one shrinking it below a cost makes that
/// cost impossible (the limiter's policy error, not a refusal with a wait
/// that can never be met), and decisions carry the window of the policy in
/// force.
pub async fn cost_under_overrides<B: Backend + Clone>(backend: B, _clock: MockClock) {
    let l = limiter(
        "cost-ovr",
        TokenBucket::new(5, 1, S).unwrap(),
        backend.clone(),
    );
    let (big, small) = (Key::new("big"), Key::new("small"));
    assert!(matches!(
        l.try_acquire(&big, 8).await,
        Err(tollgate_limiter::Error::Policy(_))
    ));
    let d = peek(&l, &big, 1).await;
    assert_eq!(d.window(), 5 * S, "configured: 5 tokens at 1/s");
    let raised = Policy::from(TokenBucket::new(10, 1, 2 * S).unwrap());
    l.set_override(Some(&big), Some(raised)).await.unwrap();
    let d = decide(&l, &big, 8).await;
    assert!(d.is_allowed(), "the override's capacity rules: {d:?}");
    assert_eq!(d.limit(), 10);
    assert_eq!(d.window(), 20 * S);
    assert!(peek(&l, &big, 2).await.is_allowed());
    let shrunk = Policy::from(TokenBucket::new(2, 1, S).unwrap());
    l.set_override(Some(&small), Some(shrunk)).await.unwrap();
    assert!(decide(&l, &small, 2).await.is_allowed());
    let e = l.try_acquire(&small, 3).await.unwrap_err();
    assert!(matches!(e, tollgate_limiter::Error::Policy(_)), "{e:?}");
    assert!(!e.is_unavailable());
    assert!(matches!(
        l.peek_cost(&small, 3).await,
        tollgate_limiter::Verdict::FailedClosed(tollgate_limiter::Error::Policy(_), _)
    ));
    let d = decide(&l, &small, 1).await;
    assert!(d.is_denied());
    assert_eq!((d.limit(), d.window()), (2, 2 * S));
    // The window of a sliding-window override, too.
    let w = limiter(
        "cost-ovr-w",
        SlidingWindow::new(2, 10 * S).unwrap(),
        backend,
    );
    let wide = Policy::from(SlidingWindow::new(4, 30 * S).unwrap());
    w.set_override(None, Some(wide)).await.unwrap();
    let d = decide(&w, &big, 4).await;
    assert!(d.is_allowed());
    assert_eq!((d.limit(), d.window()), (4, 30 * S));
}

/// One client floods one key of a penalised sliding window with `requests`
/// requests of cost 1 at 1 ms intervals (and a few peeks and costlier
/// requests); every decision must equal the reference model's. Returns the
/// limiter's name, the key and the limit, so the caller can check how many
/// events the backend keeps for the key (at most `limit + 1`).
pub async fn penalised_flood<B: Backend>(
    backend: &B,
    clock: &MockClock,
    requests: u64,
) -> (String, Key, u64) {
    let limit = 10;
    let policy = Policy::from(
        SlidingWindow::new(limit, 60 * S)
            .unwrap()
            .penalise_refused(true),
    );
    let name = unique_name("flood");
    let key = Key::new("flooder");
    let mut model = Model::new();
    for i in 0..requests {
        let op = match i % 100 {
            50 => Op::Peek(3),
            99 => Op::Acquire(4),
            _ => Op::Acquire(1),
        };
        let now = clock.now();
        let got = backend
            .decide(Request {
                limiter: &name,
                key: &key,
                policy: &policy,
                op,
            })
            .await
            .unwrap_or_else(|e| panic!("backend failed: {e}"));
        let want = model.apply(&name, key.as_str(), now, &policy, op);
        assert_eq!(Some(got), want, "request {i} ({op:?})");
        clock.advance(Duration::from_millis(1));
    }
    (name, key, limit)
}

/// Keys and limiters count apart.
pub async fn isolation<B: Backend + Clone>(backend: B, _clock: MockClock) {
    let policy = SlidingWindow::new(1, 60 * S).unwrap();
    let a = limiter("iso", policy, backend.clone());
    let b = limiter("iso", policy, backend);
    let (x, y) = (Key::new("x"), Key::new("y"));
    assert!(decide(&a, &x, 1).await.is_allowed());
    assert!(decide(&a, &x, 1).await.is_denied());
    assert!(decide(&a, &y, 1).await.is_allowed());
    assert!(decide(&b, &x, 1).await.is_allowed());
}

/// Runtime overrides: limiter-wide, per key (which wins), cleared; an
/// override of another strategy is refused.
pub async fn overrides<B: Backend>(backend: B, _clock: MockClock) {
    let l = limiter("ovr", SlidingWindow::new(1, 60 * S).unwrap(), backend);
    let (vip, other) = (Key::new("vip"), Key::new("other"));
    assert_eq!(l.get_override(None).await.unwrap(), None);
    let three = Policy::from(SlidingWindow::new(3, 60 * S).unwrap());
    let five = Policy::from(SlidingWindow::new(5, 60 * S).unwrap());
    l.set_override(None, Some(three)).await.unwrap();
    l.set_override(Some(&vip), Some(five)).await.unwrap();
    assert_eq!(l.get_override(None).await.unwrap(), Some(three));
    assert_eq!(l.get_override(Some(&vip)).await.unwrap(), Some(five));
    assert_eq!(l.get_override(Some(&other)).await.unwrap(), None);
    let mut n = 0;
    while decide(&l, &vip, 1).await.is_allowed() {
        n += 1;
    }
    assert_eq!(n, 5);
    assert_eq!(peek(&l, &vip, 1).await.limit(), 5);
    let mut n = 0;
    while decide(&l, &other, 1).await.is_allowed() {
        n += 1;
    }
    assert_eq!(n, 3);
    // Cleared: back to the configured limit of 1 (already used up).
    l.set_override(None, None).await.unwrap();
    l.set_override(Some(&vip), None).await.unwrap();
    assert_eq!(l.get_override(None).await.unwrap(), None);
    let fresh = Key::new("fresh");
    assert!(decide(&l, &fresh, 1).await.is_allowed());
    let d = decide(&l, &fresh, 1).await;
    assert!(d.is_denied());
    assert_eq!(d.limit(), 1);
    let wrong = Policy::from(TokenBucket::new(1, 1, S).unwrap());
    assert!(l.set_override(None, Some(wrong)).await.is_err());
}

/// Overrides set for a time (`set_override_for`): in force and reported
/// with the time they have left, then gone, the limiter-wide override (or
/// the configuration) in force again; set again without a time, kept. A
/// time under a millisecond is refused, naming the field. The memory
/// backend expires on its clock, Redis on its own: the test moves the one
/// and waits out the other.
pub async fn expiring_overrides<B: Backend>(backend: B, clock: MockClock) {
    let l = limiter("expovr", SlidingWindow::new(1, 60 * S).unwrap(), backend);
    let (long, short) = (Key::new("long"), Key::new("short"));
    let window = |n| Policy::from(SlidingWindow::new(n, 60 * S).unwrap());
    let e = l
        .set_override_for(Some(&long), window(5), Duration::from_micros(999))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, tollgate_limiter::Error::Policy(p) if p.field == "ttl"),
        "{e:?}"
    );
    assert_eq!(l.get_override_and_ttl(Some(&long)).await.unwrap(), None);

    l.set_override(None, Some(window(3))).await.unwrap();
    assert_eq!(
        l.get_override_and_ttl(None).await.unwrap(),
        Some((window(3), None)),
        "kept until cleared: no time left to report"
    );
    let hour = Duration::from_secs(3600);
    l.set_override_for(Some(&long), window(5), hour)
        .await
        .unwrap();
    let (p, left) = l.get_override_and_ttl(Some(&long)).await.unwrap().unwrap();
    assert_eq!(p, window(5));
    let left = left.expect("an override set for a time reports what is left");
    assert!(
        left <= hour && left > hour - Duration::from_secs(600),
        "{left:?} left of an hour"
    );
    assert_eq!(l.get_override(Some(&long)).await.unwrap(), Some(window(5)));
    assert_eq!(peek(&l, &long, 1).await.limit(), 5);

    let ttl = Duration::from_millis(300);
    l.set_override_for(Some(&short), window(7), ttl)
        .await
        .unwrap();
    assert_eq!(decide(&l, &short, 1).await.limit(), 7);
    clock.advance(ttl);
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    assert_eq!(l.get_override_and_ttl(Some(&short)).await.unwrap(), None);
    assert_eq!(l.get_override(Some(&short)).await.unwrap(), None);
    let d = decide(&l, &short, 1).await;
    assert_eq!(d.limit(), 3, "the limiter-wide override again");
    assert!(d.is_allowed(), "one of three used: {d:?}");

    // Set again without a time: kept, no time left.
    l.set_override(Some(&long), Some(window(6))).await.unwrap();
    assert_eq!(
        l.get_override_and_ttl(Some(&long)).await.unwrap(),
        Some((window(6), None))
    );
}

/// Runtime overrides set through one worker (`writer`) reach another
/// (`reader`, a second client of the same store), both caching what they
/// know of a limiter's overrides for at most `cache_ttl`: the writer decides
/// under its own change at once, the reader within `cache_ttl`. Per key and
/// limiter-wide, set and cleared; clearing one key's override keeps the
/// other keys'. Not part of [`conformance_tests!`](crate::conformance_tests) (it takes two clients).
pub async fn overrides_reach_other_workers<B: Backend>(writer: B, reader: B, cache_ttl: Duration) {
    let name = unique_name("workers");
    let hour = 3600 * S;
    let w = patient(&name, TokenBucket::new(1, 1, hour).unwrap(), writer);
    let r = patient(&name, TokenBucket::new(1, 1, hour).unwrap(), reader);
    let bucket = |n| Some(Policy::from(TokenBucket::new(n, 1, hour).unwrap()));
    let (k1, k2, k3) = (Key::new("k1"), Key::new("k2"), Key::new("k3"));
    let later = cache_ttl + Duration::from_millis(50);
    // Both workers know the limiter without overrides.
    assert_eq!(peek(&w, &k1, 1).await.limit(), 1);
    assert_eq!(peek(&r, &k1, 1).await.limit(), 1);

    w.set_override(Some(&k1), bucket(5)).await.unwrap();
    w.set_override(Some(&k2), bucket(7)).await.unwrap();
    assert_eq!(peek(&w, &k1, 1).await.limit(), 5, "the writer: at once");
    tokio::time::sleep(later).await;
    assert_eq!(peek(&r, &k1, 1).await.limit(), 5, "others: within the TTL");
    assert_eq!(peek(&r, &k2, 1).await.limit(), 7);
    assert_eq!(peek(&r, &k3, 1).await.limit(), 1, "other keys keep theirs");

    // Clearing one key's override keeps the other's.
    w.set_override(Some(&k1), None).await.unwrap();
    assert_eq!(peek(&w, &k1, 1).await.limit(), 1);
    tokio::time::sleep(later).await;
    assert_eq!(peek(&r, &k1, 1).await.limit(), 1);
    assert_eq!(peek(&r, &k2, 1).await.limit(), 7);

    // Limiter-wide: under a key's own override, which wins.
    w.set_override(None, bucket(3)).await.unwrap();
    assert_eq!(peek(&w, &k3, 1).await.limit(), 3);
    tokio::time::sleep(later).await;
    assert_eq!(peek(&r, &k3, 1).await.limit(), 3);
    assert_eq!(peek(&r, &k2, 1).await.limit(), 7);
    w.set_override(None, None).await.unwrap();
    w.set_override(Some(&k2), None).await.unwrap();
    assert_eq!(peek(&w, &k3, 1).await.limit(), 1);
    assert_eq!(peek(&w, &k2, 1).await.limit(), 1);
    tokio::time::sleep(later).await;
    assert_eq!(peek(&r, &k3, 1).await.limit(), 1);
    assert_eq!(peek(&r, &k2, 1).await.limit(), 1);
}

/// [`Backend::replace_override`] is a compare-and-set: it writes only
/// over the override the caller read (none included), per key and
/// limiter-wide; what it writes is the override in force; of many
/// replacements made from one read, exactly one is written.
pub async fn replace_override_compares_and_sets<B: Backend + Clone>(backend: B, _clock: MockClock) {
    let hour = 3600 * S;
    let bucket = |n| Policy::from(TokenBucket::new(n, 1, hour).unwrap());
    let (one, two, three) = (bucket(1), bucket(2), bucket(3));
    let l = limiter("cas", one, backend.clone());
    let name = l.name().to_owned();
    let key = Key::new("k");
    for keyed in [true, false] {
        // Owned, so that racing writers can be tasks of their own.
        let replace = |current: Option<&Policy>, policy: &Policy| {
            let (backend, name, key) = (backend.clone(), name.clone(), key.clone());
            let (current, policy) = (current.copied(), *policy);
            async move {
                let scope = match keyed {
                    true => Scope::Key(&name, &key),
                    false => Scope::Limiter(&name),
                };
                backend
                    .replace_override(scope, current.as_ref(), &policy, hour)
                    .await
                    .expect("replace_override")
            }
        };
        let scope = match keyed {
            true => Scope::Key(&name, &key),
            false => Scope::Limiter(&name),
        };
        let stored = || async { backend.get_override(scope).await.expect("get_override") };
        assert!(!replace(Some(&one), &two).await, "{scope:?}: none stored");
        assert_eq!(stored().await, None);
        assert!(replace(None, &two).await, "{scope:?}: none, as read");
        assert_eq!(stored().await, Some(two));
        assert!(!replace(None, &three).await, "{scope:?}: one stored since");
        assert!(!replace(Some(&three), &three).await, "{scope:?}: another");
        assert_eq!(stored().await, Some(two));
        assert!(replace(Some(&two), &three).await, "{scope:?}: as read");
        assert_eq!(stored().await, Some(three));
        assert_eq!(peek(&l, &key, 1).await.limit(), 3, "{scope:?}: in force");
        // Many writers from one read: one wins, the others find its write.
        let racing: Vec<_> = (4..12)
            .map(|n| tokio::spawn(replace(Some(&three), &bucket(n))))
            .collect();
        let mut won = Vec::new();
        for (n, task) in (4..12).zip(racing) {
            if task.await.expect("task panicked") {
                won.push(n);
            }
        }
        assert_eq!(won.len(), 1, "{scope:?}: written by {won:?}");
        assert_eq!(stored().await, Some(bucket(won[0])));
        backend.set_override(scope, None).await.expect("clear");
    }
}

async fn hammer<B: Backend + Clone>(l: Limiter<B>, tasks: usize, tries: usize) -> u64 {
    let l = Arc::new(l);
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let l = Arc::clone(&l);
            tokio::spawn(async move {
                let k = Key::new("hot");
                let mut ok = 0u64;
                for _ in 0..tries {
                    if decide(&l, &k, 1).await.is_allowed() {
                        ok += 1;
                    }
                }
                ok
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h.await.expect("task panicked");
    }
    total
}

/// Many concurrent tasks on one key, time frozen: exactly `capacity`
/// requests pass, no more, no fewer.
pub async fn concurrent_token_bucket<B: Backend + Clone>(backend: B, _clock: MockClock) {
    let l = limiter("ctb", TokenBucket::new(100, 1, 3600 * S).unwrap(), backend);
    assert_eq!(hammer(l, 32, 10).await, 100);
}

/// Many concurrent tasks on one key, time frozen: exactly `limit` requests
/// enter the window.
pub async fn concurrent_sliding_window<B: Backend + Clone>(backend: B, _clock: MockClock) {
    let l = limiter("csw", SlidingWindow::new(77, 60 * S).unwrap(), backend);
    assert_eq!(hammer(l, 32, 10).await, 77);
}

/// Many concurrent tasks on one key, time frozen: a composite admits
/// exactly what its tightest part allows, and charges the others only for
/// those.
pub async fn concurrent_composite<B: Backend + Clone>(backend: B, _clock: MockClock) {
    let policy = Composite::new([
        Policy::from(TokenBucket::new(100, 1, 3600 * S).unwrap()),
        Policy::from(SlidingWindow::new(45, 60 * S).unwrap()),
    ])
    .unwrap();
    let l = limiter("ccomp", policy, backend);
    let key = Key::new("hot");
    assert_eq!(hammer(l.clone(), 32, 10).await, 45);
    let d = peek(&l, &key, 1).await;
    assert_eq!((d.part(), d.remaining()), (1, 0));
    // The bucket was charged 45 times, not 320.
    l.set_override(
        Some(&key),
        Some(
            Composite::new([Policy::from(TokenBucket::new(100, 1, 3600 * S).unwrap())])
                .unwrap()
                .into(),
        ),
    )
    .await
    .unwrap();
    assert_eq!(peek(&l, &key, 1).await.remaining(), 55);
}

/// A concurrency limit through [`Limiter::hold`]: at most `max_in_flight`
/// permits at once; a released or dropped permit frees its slot; a slot
/// nobody releases (a dead worker) frees when its lease expires; a renewed
/// one does not.
pub async fn concurrency_slots<B: Backend + Clone>(backend: B, clock: MockClock) {
    let l = limiter("conc", Concurrency::new(2, 10 * S).unwrap(), backend);
    let k = Key::new("export");
    let (v1, p1) = l.hold(&k).await;
    let (v2, p2) = l.hold(&k).await;
    assert!(v1.is_allowed() && v2.is_allowed());
    let (p1, p2) = (p1.expect("a permit"), p2.expect("a permit"));
    assert_ne!(p1.id(), p2.id());
    let (v3, p3) = l.hold(&k).await;
    let d = *v3.decision().expect("decided");
    assert!(d.is_denied() && p3.is_none());
    assert_eq!((d.limit(), d.remaining(), d.retry_after()), (2, 0, S));
    // Another key has its own slots.
    assert!(l.hold(&Key::new("other")).await.0.is_allowed());
    // An explicit release frees a slot at once.
    assert!(p1.release().await.expect("released").is_allowed());
    let (v, p) = l.hold(&k).await;
    assert!(v.is_allowed());
    // A dropped permit releases in a spawned task.
    drop(p);
    let mut freed = false;
    for _ in 0..500 {
        if peek(&l, &k, 1).await.remaining() == 1 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(freed, "the dropped permit's slot was not released");
    // A dead worker: a slot taken and never released (its permit leaked).
    let (_, lost) = l.hold(&k).await;
    std::mem::forget(lost.expect("a permit"));
    assert_eq!(peek(&l, &k, 1).await.remaining(), 0);
    clock.advance(6 * S);
    assert!(p2.renew().await.expect("renewed").is_allowed());
    clock.advance(4 * S);
    // The leaked slot's lease is over; p2's was renewed at 6 s.
    let d = peek(&l, &k, 1).await;
    assert_eq!(d.remaining(), 1);
    assert_eq!(d.reset_after(), 6 * S);
    clock.advance(6 * S);
    assert_eq!(peek(&l, &k, 1).await.remaining(), 2);
    // The renewal of an expired slot takes a free one again.
    assert!(p2.renew().await.expect("renewed").is_allowed());
    p2.release().await.expect("released");
    assert_eq!(peek(&l, &k, 1).await.remaining(), 2);
}

/// A withdrawal that reaches the backend before its hold (a caller gave
/// up the hold while a stalled server still had it queued), or before the
/// hold is sent again (a cluster client's re-send), is remembered for one
/// lease: the hold, landing after it, takes nothing, so no slot is left
/// that nobody releases. A release remembers nothing.
pub async fn a_hold_withdrawn_before_it_lands_takes_nothing<B: Backend>(
    backend: B,
    clock: MockClock,
) {
    let policy = Policy::from(Concurrency::new(1, 10 * S).unwrap());
    let key = Key::new("late");
    let op = |op| raw_op(&backend, "late", &key, &policy, op);
    // The withdrawal lands first, then its hold.
    assert!(op(Op::Withdraw(41)).await.is_allowed());
    let late = op(Op::Hold(41)).await;
    assert!(late.is_denied(), "{late:?}");
    assert_eq!((late.remaining(), late.retry_after()), (1, S));
    // The slot is free: another request takes it; withdrawn, it is free
    // again, and the hold sent again is refused.
    assert!(op(Op::Hold(43)).await.is_allowed());
    assert!(op(Op::Withdraw(43)).await.is_allowed());
    assert!(op(Op::Hold(43)).await.is_denied());
    // Released: nothing remembered, held or not (it could hold again).
    assert!(op(Op::Hold(42)).await.is_allowed());
    assert!(op(Op::Release(42)).await.is_allowed());
    assert!(op(Op::Release(44)).await.is_allowed());
    assert!(op(Op::Hold(42)).await.is_allowed());
    assert!(op(Op::Release(42)).await.is_allowed());
    assert!(op(Op::Hold(44)).await.is_allowed());
    assert!(op(Op::Release(44)).await.is_allowed());
    // 41 is remembered for one lease from its withdrawal, no longer.
    clock.advance(9 * S + S / 2);
    let late = op(Op::Hold(41)).await;
    assert_eq!((late.is_denied(), late.retry_after()), (true, S / 2));
    clock.advance(S / 2);
    assert!(op(Op::Hold(41)).await.is_allowed());
}

/// A clock that steps back (a failover to a server whose clock is
/// behind, workers with skewed clocks under caller time) past the instant
/// the key's remembered ids were forgotten, after a look forgot them:
/// they stay forgotten, as in the model, and the slots held are counted
/// as they are, so no request more than the limit gets in.
pub async fn a_clock_stepping_back_counts_the_slots_held<B: Backend>(backend: B, clock: MockClock) {
    let name = unique_name("stepped-back");
    let policy = Policy::from(Concurrency::new(1, 10 * S).unwrap());
    let key = Key::new("k");
    let mut model = Model::new();
    let start = clock.now();
    let steps = [
        (Duration::ZERO, Op::Withdraw(7)),
        (5 * S, Op::Hold(1)),
        // 7 is forgotten (at 10 s), by a look.
        (11 * S, Op::Peek(1)),
        // Back before 10 s: slot 1 is still held, and the only one.
        (9 * S, Op::Hold(2)),
        (9 * S, Op::Peek(1)),
    ];
    for (at, op) in steps {
        clock.set(start + at.as_micros() as u64);
        let got = raw_op(&backend, &name, &key, &policy, op).await;
        let want = model.apply(&name, key.as_str(), clock.now(), &policy, op);
        assert_eq!(Some(got), want, "{op:?} at {at:?}");
    }
}

/// A look, then a clock that steps back before the instants it found
/// past: what the look found expired (a lease, a remembered id, the
/// whole key) is forgotten, as in the model, whose every decision drops
/// what has expired; a hold refused is refused as the model refuses it.
pub async fn a_look_forgets_what_expired_before_a_clock_steps_back<B: Backend>(
    backend: B,
    clock: MockClock,
) {
    let name = unique_name("look-stepped-back");
    let policy = Policy::from(Concurrency::new(2, 10 * S).unwrap());
    let (live, gone) = (Key::new("live"), Key::new("gone"));
    let mut model = Model::new();
    let start = clock.now();
    let steps = [
        // `live`: 7 remembered until 10 s, 3 held until 10.5 s, 1 until
        // 15 s.
        (&live, Duration::ZERO, Op::Withdraw(7)),
        (&live, Duration::from_millis(500), Op::Hold(3)),
        (&live, 5 * S, Op::Hold(1)),
        // `gone`: 1 held until 10 s, the key's last lease.
        (&gone, Duration::ZERO, Op::Hold(1)),
        // Looks after 10.5 s: 7 and 3 forgotten, `gone` fresh.
        (&live, 11 * S, Op::Peek(1)),
        (&gone, 11 * S, Op::Peek(1)),
        // Back at 9 s.
        (&live, 9 * S, Op::Peek(1)),
        (&live, 9 * S, Op::Hold(7)),
        (&gone, 9 * S, Op::Peek(1)),
        // Refusals look too (1 and 7 hold `live`'s two slots).
        (&live, 9 * S, Op::Hold(8)),
        (&live, 11 * S, Op::Hold(9)),
        (&live, 10 * S, Op::Peek(1)),
    ];
    for (key, at, op) in steps {
        clock.set(start + at.as_micros() as u64);
        let got = raw_op(&backend, &name, key, &policy, op).await;
        let want = model.apply(&name, key.as_str(), clock.now(), &policy, op);
        assert_eq!(Some(got), want, "{op:?} on {} at {at:?}", key.as_str());
    }
}

/// An override across the concurrency boundary from the limiter's
/// configured policy (a concurrency override of a token bucket, a token
/// bucket override of a concurrency limit), per key and limiter-wide, set
/// on the backend ([`Limiter::set_override`] refuses a change of
/// strategy; a stored override may come from another tool or an old
/// client) is no policy: every decision it governs fails with the
/// backend's "invalid policy" error, answered by the limiter's fail mode
/// (fail-closed refuses, fail-open passes), never a look that charges
/// nothing and admits; the breaker does not count it; cleared, the
/// configured policy rules again, nothing charged meanwhile.
pub async fn an_override_across_the_concurrency_boundary_is_no_policy<B: Backend + Clone>(
    backend: B,
    _clock: MockClock,
) {
    use tollgate_limiter::{BackendError as _, Error, ErrorReason, FailMode};
    let bucket = Policy::from(TokenBucket::new(2, 2, 3600 * S).unwrap());
    let slots = Policy::from(Concurrency::new(1, 3600 * S).unwrap());
    for (configured, across) in [(bucket, slots), (slots, bucket)] {
        let holds = matches!(configured, Policy::Concurrency(_));
        for per_key in [true, false] {
            for mode in [FailMode::Closed, FailMode::Open] {
                let l = Limiter::builder(unique_name("across"), configured, backend.clone())
                    .timeout(5 * S)
                    .fail_mode(mode)
                    .build();
                let k = Key::new("k");
                let scope = match per_key {
                    true => Scope::Key(l.name(), &k),
                    false => Scope::Limiter(l.name()),
                };
                let what = format!("{configured:?} under {across:?}, per key {per_key}, {mode:?}");
                backend
                    .set_override(scope, Some(&across))
                    .await
                    .expect("set_override");
                // More than the breaker's threshold: none opens it.
                for i in 0..20 {
                    let v = hold_or_check(&l, &k, holds).await;
                    assert!(v.decision().is_none(), "{what}, call {i}: decided: {v:?}");
                    match (mode, &v) {
                        (FailMode::Closed, Verdict::FailedClosed(Error::Backend(_), _))
                        | (FailMode::Open, Verdict::FailedOpen(Error::Backend(_))) => {}
                        _ => panic!("{what}, call {i}: not the fail mode's answer: {v:?}"),
                    }
                }
                // The backend's own answer, to every operation: its
                // invalid-policy error.
                let ops = match holds {
                    true => [Op::Hold(7), Op::Release(7), Op::PEEK],
                    false => [Op::Acquire(1), Op::PEEK, Op::Reset],
                };
                for op in ops {
                    let req = Request {
                        limiter: l.name(),
                        key: &k,
                        policy: &configured,
                        op,
                    };
                    let e = backend
                        .decide(req)
                        .await
                        .expect_err(&format!("{what}: {op:?} decided"));
                    assert_eq!(e.reason(), ErrorReason::InvalidPolicy, "{what}: {op:?}");
                }
                if !holds {
                    let req = Request {
                        limiter: l.name(),
                        key: &k,
                        policy: &configured,
                        op: Op::Acquire(1),
                    };
                    let e = backend
                        .reserve(req)
                        .await
                        .expect_err(&format!("{what}: reserve decided"));
                    assert_eq!(e.reason(), ErrorReason::InvalidPolicy, "{what}: reserve");
                }
                // Cleared: the configured policy, from a full key.
                backend.set_override(scope, None).await.expect("clear");
                let mut admitted = 0;
                for _ in 0..5 {
                    let v = hold_or_check(&l, &k, holds).await;
                    assert!(v.decision().is_some(), "{what}, cleared: {v:?}");
                    admitted += u64::from(v.is_allowed());
                }
                assert_eq!(admitted, configured.limit(), "{what}, cleared");
            }
        }
    }
}

/// A hold of `key` (its slot kept: nobody releases) when `holds`, else a
/// check of one unit.
async fn hold_or_check<B: Backend>(l: &Limiter<B>, key: &Key, holds: bool) -> Verdict {
    if !holds {
        return l.check(key).await;
    }
    let (v, permit) = l.hold(key).await;
    std::mem::forget(permit);
    v
}

/// At most `max_in_flight` of many concurrent holders pass at once.
pub async fn concurrent_holds<B: Backend + Clone>(backend: B, _clock: MockClock) {
    let l = limiter("chold", Concurrency::new(5, 3600 * S).unwrap(), backend);
    let handles: Vec<_> = (0..32)
        .map(|_| {
            let l = l.clone();
            tokio::spawn(async move {
                let (v, p) = l.hold(&Key::new("hot")).await;
                // Keep the slot: nobody releases.
                std::mem::forget(p);
                v.is_allowed()
            })
        })
        .collect();
    let mut passed = 0;
    for h in handles {
        passed += u64::from(h.await.expect("task panicked"));
    }
    assert_eq!(passed, 5);
}

/// Two stacked limiters charge the first even when the second refuses; a
/// composite of the same two policies charges nothing on a refusal.
pub async fn composite_charges_nothing_on_refusal<B: Backend + Clone>(
    backend: B,
    _clock: MockClock,
) {
    let bucket = TokenBucket::new(5, 1, 3600 * S).unwrap();
    let window = SlidingWindow::new(2, 3600 * S).unwrap();
    let key = Key::new("k");

    let first = limiter("stack1", bucket, backend.clone());
    let second = limiter("stack2", window, backend.clone());
    for _ in 0..5 {
        if decide(&first, &key, 1).await.is_allowed() {
            decide(&second, &key, 1).await;
        }
    }
    // Three of the five were refused by the window, yet took a token each.
    assert_eq!(peek(&first, &key, 1).await.remaining(), 0);

    let both = Composite::new([Policy::from(bucket), Policy::from(window)]).unwrap();
    let l = limiter("composite", both, backend);
    let verdicts: Vec<bool> = acquire_each(&l, &key, 5).await;
    assert_eq!(verdicts, [true, true, false, false, false]);
    let d = decide(&l, &key, 1).await;
    assert_eq!(d.part(), 1, "the window binds");
    assert_eq!(d.retry_after(), 3600 * S);
    // The bucket lost only the two admitted tokens: a window override
    // raising its limit lets the remaining three through, and no more.
    let raised = Composite::new([
        Policy::from(bucket),
        Policy::from(SlidingWindow::new(100, 3600 * S).unwrap()),
    ])
    .unwrap();
    l.set_override(Some(&key), Some(raised.into()))
        .await
        .unwrap();
    let d = peek(&l, &key, 1).await;
    assert_eq!((d.part(), d.remaining()), (0, 3));
    assert!(decide(&l, &key, 3).await.is_allowed());
    assert!(decide(&l, &key, 1).await.is_denied());
}

/// µs since the epoch of a civil time in `tz`.
fn civil(tz: &str, (y, m, d): (i16, i8, i8), (h, min): (i8, i8)) -> Timestamp {
    let zdt = jiff::civil::date(y, m, d)
        .at(h, min, 0, 0)
        .to_zoned_datetime(tollgate_limiter::Zone::get(tz).unwrap().time_zone().clone())
        .expect("a valid civil time");
    u64::try_from(zdt.timestamp().as_microsecond()).expect("after 1970")
}

/// A calendar quota per Berlin day counts from zero at local midnight,
/// including across the 23-hour day of the spring change; a refusal waits
/// for the next boundary; decisions carry the current window's length.
pub async fn calendar_day_across_daylight_saving<B: Backend>(backend: B, clock: MockClock) {
    let berlin = "Europe/Berlin";
    // Saturday 28 March 2026, 22:00 in Berlin.
    clock.set(civil(berlin, (2026, 3, 28), (22, 0)));
    let l = limiter(
        "cal-day",
        Calendar::new(3, Period::Day, berlin).unwrap(),
        backend,
    );
    let k = Key::new("plan");
    let d = decide(&l, &k, 2).await;
    assert!(d.is_allowed());
    assert_eq!((d.remaining(), d.reset_after()), (1, 2 * 3600 * S));
    assert_eq!(d.window(), 24 * 3600 * S);
    let d = decide(&l, &k, 2).await;
    assert!(d.is_denied());
    assert_eq!(d.retry_after(), 2 * 3600 * S, "the next boundary");
    assert!(decide(&l, &k, 1).await.is_allowed());
    clock.advance(2 * 3600 * S - Duration::from_micros(1));
    assert!(decide(&l, &k, 1).await.is_denied());
    clock.advance(Duration::from_micros(1));
    // Midnight: a fresh window of 23 hours.
    let d = decide(&l, &k, 3).await;
    assert!(d.is_allowed());
    assert_eq!(d.window(), 23 * 3600 * S);
    assert_eq!(d.reset_after(), 23 * 3600 * S);
    let d = peek(&l, &k, 1).await;
    assert_eq!((d.remaining(), d.retry_after()), (0, 23 * 3600 * S));
    // A cost above the quota is impossible, never a wait.
    assert!(l.try_acquire(&k, 4).await.is_err());
}

/// A monthly quota in a composite with a token bucket: the bucket binds
/// within a second, the month binds when spent, and nothing is charged on
/// a refusal; February ends at Berlin midnight, not UTC's.
pub async fn calendar_month_in_a_composite<B: Backend>(backend: B, clock: MockClock) {
    let berlin = "Europe/Berlin";
    clock.set(civil(berlin, (2026, 2, 28), (23, 0)));
    let policy = Composite::new([
        Policy::from(TokenBucket::new(2, 2, S).unwrap()),
        Policy::from(Calendar::new(5, Period::Month, berlin).unwrap()),
    ])
    .unwrap();
    let l = limiter("cal-month", policy, backend);
    let k = Key::new("tenant");
    assert_eq!(acquire_each(&l, &k, 3).await, [true, true, false]);
    let d = decide(&l, &k, 1).await;
    assert_eq!((d.part(), d.retry_after()), (0, Duration::from_millis(500)));
    clock.advance(S);
    assert_eq!(acquire_each(&l, &k, 3).await, [true, true, false]);
    clock.advance(S);
    assert!(decide(&l, &k, 1).await.is_allowed());
    clock.advance(S);
    // Five used: the month binds until 1 March, 00:00 in Berlin.
    let d = decide(&l, &k, 1).await;
    assert!(d.is_denied());
    assert_eq!(d.part(), 1);
    assert_eq!(d.retry_after(), 3600 * S - 3 * S);
    assert_eq!(d.window(), 28 * 86_400 * S);
    // The bucket was not charged by the refusal: it is full again.
    clock.set(civil(berlin, (2026, 3, 1), (0, 0)));
    assert_eq!(acquire_each(&l, &k, 3).await, [true, true, false]);
    let d = peek(&l, &k, 1).await;
    assert_eq!(d.part(), 0);
}

/// Reserve, then settle, through the [`Limiter`]: the estimate is taken
/// atomically, a settle refunds the unused units or charges the excess,
/// an unsettled reservation stays charged, a refund after a reset mints
/// nothing; on a token bucket, a sliding window and a composite.
pub async fn reserve_and_settle<B: Backend + Clone>(backend: B, clock: MockClock) {
    let ms = Duration::from_millis(1);
    let policies: [Policy; 3] = [
        TokenBucket::new(1_000, 10, S).unwrap().into(),
        SlidingWindow::new(1_000, 60 * S).unwrap().into(),
        Composite::new([
            TokenBucket::new(1_000, 10, S).unwrap().into(),
            SlidingWindow::new(5_000, 3600 * S).unwrap().into(),
        ])
        .unwrap()
        .into(),
    ];
    for policy in policies {
        let l = limiter("rs", policy, backend.clone());
        let k = Key::new("tenant");
        let remaining = |v: &tollgate_limiter::Verdict| v.decision().map(|d| d.remaining());
        let (v, r) = l.reserve(&k, 800).await;
        assert_eq!((remaining(&v), r.units()), (Some(200), 800), "{policy:?}");
        // What is reserved is taken: a second estimate does not fit.
        let (v, empty) = l.reserve(&k, 300).await;
        assert!(!v.is_allowed() && empty.is_empty(), "{policy:?}");
        assert!(matches!(empty.settle(0).await, Ok(None)));
        clock.advance(ms);
        let d = r.settle(300).await.unwrap().unwrap();
        assert_eq!(d.remaining(), 700, "{policy:?}");
        // The excess is charged.
        let (_, r) = l.reserve(&k, 100).await;
        let d = r.settle(250).await.unwrap().unwrap();
        assert_eq!(d.remaining(), 450, "{policy:?}");
        // Dropped unsettled: the whole estimate stays charged.
        let (v, r) = l.reserve(&k, 400).await;
        assert!(v.is_allowed());
        drop(r);
        assert_eq!(peek(&l, &k, 1).await.remaining(), 50, "{policy:?}");
        // A refund after a reset gives back nothing the reset did not.
        l.reset(&k).await.unwrap();
        let (_, r) = l.reserve(&k, 1_000).await;
        l.reset(&k).await.unwrap();
        clock.advance(ms);
        assert!(decide(&l, &k, 1_000).await.is_allowed());
        clock.advance(ms);
        let d = r.settle(0).await.unwrap().unwrap();
        assert_eq!(d.remaining(), 0, "{policy:?}");
        // A call that reports no usage still costs the minimum (1).
        let quiet = Key::new("quiet");
        let (_, r) = l.reserve(&quiet, 5).await;
        assert_eq!(r.settle(0).await.unwrap().unwrap().remaining(), 999);
        // An estimate no wait can grant is refused as a check is.
        let (v, r) = l.reserve(&Key::new("big"), 100_000).await;
        assert!(matches!(
            v.error(),
            Some(tollgate_limiter::Error::Policy(_))
        ));
        assert!(r.is_empty());
    }
}

/// A settle sent again with the same receipt id, as the Redis Cluster
/// client re-sends a call whose reply its dropped connection lost,
/// changes nothing: the refund is made once, the excess charged once; on a
/// token bucket, a sliding window, a calendar quota and a composite. Two
/// reservations of one instant (a window entry, a calendar count: the same
/// mark) each still settle, once.
pub async fn a_replayed_settle_changes_nothing<B: Backend>(backend: B, clock: MockClock) {
    clock.set(civil("UTC", (2026, 2, 10), (12, 0)));
    let policies: [Policy; 4] = [
        TokenBucket::new(1_000, 10, S).unwrap().into(),
        SlidingWindow::new(1_000, 60 * S).unwrap().into(),
        Calendar::new(1_000, Period::Day, "UTC").unwrap().into(),
        Composite::new([
            TokenBucket::new(1_000, 10, S).unwrap().into(),
            SlidingWindow::new(5_000, 3600 * S).unwrap().into(),
        ])
        .unwrap()
        .into(),
    ];
    let mut next_id = 0;
    for policy in policies {
        let name = unique_name("replay");
        let key = Key::new("tenant");
        let req = |op| Request {
            limiter: &name,
            key: &key,
            policy: &policy,
            op,
        };
        let mut reserve = async |units| {
            let (d, mut receipt) = backend.reserve(req(Op::Acquire(units))).await.unwrap();
            assert!(d.is_allowed(), "{policy:?}");
            next_id += 1;
            receipt.id = next_id;
            receipt
        };
        let big = reserve(800).await;
        let small = reserve(100).await;
        // Two reservations in one microsecond: one mark, but for a token
        // bucket's (its arrival time moved).
        let (a, b) = (reserve(10).await, reserve(10).await);
        let shared = matches!(policy, Policy::SlidingWindow(_) | Policy::Calendar(_));
        assert_eq!(a.marks == b.marks, shared, "{policy:?}");
        clock.advance(Duration::from_millis(1));
        let remaining = async |op| backend.decide(req(op)).await.unwrap().remaining();
        let refund = Op::Settle {
            receipt: big,
            actual: 300,
        };
        let excess = Op::Settle {
            receipt: small,
            actual: 250,
        };
        let cases = [
            (refund, 80 + 500),
            (excess, 580 - 150),
            (
                Op::Settle {
                    receipt: a,
                    actual: 0,
                },
                430 + 10,
            ),
            (
                Op::Settle {
                    receipt: b,
                    actual: 0,
                },
                440 + 10,
            ),
        ];
        for (op, left) in cases {
            assert_eq!(remaining(op).await, left, "{op:?} under {policy:?}");
            for _ in 0..2 {
                assert_eq!(remaining(op).await, left, "again: {op:?} under {policy:?}");
            }
        }
        // Still remembered through a reset: what was settled is not
        // settled again in the key's next life.
        let _ = remaining(Op::Reset).await;
        assert_eq!(remaining(excess).await, 1_000, "{policy:?}");
    }
}

/// A key remembers at most [`SETTLED_MAX`](tollgate_limiter::model::SETTLED_MAX)
/// settles, the latest: a refunded client settles as fast as it asks.
/// The backend forgets the same ones as the model, in the same order
/// (the earliest to be forgotten first, the smaller id first among those
/// of one microsecond: ids 9 and 10 settled together, 9 forgotten, which
/// a Redis sorted set of plain decimal members would not do), and each
/// settle and replay answers as the model's.
pub async fn a_key_remembers_the_latest_settles<B: Backend>(backend: B, clock: MockClock) {
    use tollgate_limiter::model::SETTLED_MAX;
    let policy: Policy = TokenBucket::new(10_000, 10, S).unwrap().into();
    let name = unique_name("latest");
    let key = Key::new("tenant");
    let mut model = Model::new();
    let n = SETTLED_MAX as u64 + 9;
    let mut receipts = Vec::new();
    for id in 1..=n {
        let req = Request {
            limiter: &name,
            key: &key,
            policy: &policy,
            op: Op::Acquire(2),
        };
        let (d, mut got) = backend.reserve(req).await.unwrap();
        let (want_d, want) = model
            .reserve(&name, key.as_str(), clock.now(), &policy, 2)
            .unwrap();
        assert_eq!((d, got), (want_d, want), "reserve {id}");
        got.id = id;
        receipts.push(got);
        clock.advance(Duration::from_micros(1));
    }
    let settle = async |model: &mut Model, receipt: Receipt, what: &str| {
        // An excess: applied again, it charges again (a refund may find
        // nothing left to give back).
        let op = Op::Settle { receipt, actual: 3 };
        let req = Request {
            limiter: &name,
            key: &key,
            policy: &policy,
            op,
        };
        let d = backend.decide(req).await.unwrap();
        let want = model
            .apply(&name, key.as_str(), clock.now(), &policy, op)
            .unwrap();
        assert_eq!(d, want, "{what} {}", receipt.id);
    };
    // Four settles a microsecond: 9 to 12 together.
    for chunk in receipts.chunks(4) {
        for &r in chunk {
            settle(&mut model, r, "settle").await;
        }
        clock.advance(Duration::from_micros(1));
    }
    // 10 kept, 9 forgotten (applied again, as the model does), the
    // latest kept; then the earliest, each remembered again in turn.
    let order = [9, 8, n as usize - 1, n as usize - 2, 0, 1, 2];
    for i in order {
        settle(&mut model, receipts[i], "replay").await;
    }
}

/// Refunds on a token bucket, alone and as a composite's part, when
/// reservations overlap: a refund of an earlier reservation moves a later
/// one's units down, so the later one refunds only what is still out (the
/// case the property test `interleaved_reservations_never_give_more_than_their_actual_costs`
/// found), while a refund of one above it does not (settled top-down,
/// all refund everything, up to the refunds a bucket remembers); and once
/// a life's refunds pass their bound
/// (`MAX_REFUNDED`), the life renews and what is outstanding refunds
/// nothing.
pub async fn overlapping_reservations_refund_what_is_out<B: Backend + Clone>(
    backend: B,
    clock: MockClock,
) {
    let sw = SlidingWindow::new(100, 60 * S).unwrap().into();
    let policies: [Policy; 2] = [
        TokenBucket::new(11, 1, S).unwrap().into(),
        Composite::new([TokenBucket::new(11, 1, S).unwrap().into(), sw])
            .unwrap()
            .into(),
    ];
    for policy in policies {
        let l = limiter("overlap", policy, backend.clone());
        let k = Key::new("tenant");
        let (_, first) = l.reserve(&k, 2).await;
        let (_, second) = l.reserve(&k, 7).await;
        let d = first.settle(1).await.unwrap().unwrap();
        assert_eq!(d.remaining(), 3, "{policy:?}");
        clock.advance(3 * S);
        assert!(decide(&l, &k, 1).await.is_allowed());
        // Charged only their actual costs (1, 1 for a call that reports
        // none, then 1 three seconds later), 10 tokens would be left: of
        // its 6 unused, the second refunds the 5 not yet dripped back, not
        // 6 (where its mark alone puts them, before the first refund moved
        // them down): that left 11.
        let d = second.settle(0).await.unwrap().unwrap();
        assert_eq!(d.remaining(), 10, "{policy:?}");
    }

    // Settled from the top down, each refund is of a reservation above
    // the ones still out: all of them give back everything unused while
    // a bucket remembers the refunds above (8)...
    for (n, left) in [(9, 100 - 9), (10, 100 - 10 - 1)] {
        let l = limiter(
            "top-down",
            TokenBucket::new(100, 1, S).unwrap(),
            backend.clone(),
        );
        let k = Key::new(format!("tenant-{n}"));
        let mut held = Vec::new();
        for _ in 0..n {
            let (v, r) = l.reserve(&k, 3).await;
            assert!(v.is_allowed());
            held.push(r);
        }
        while let Some(r) = held.pop() {
            r.settle(1).await.unwrap().unwrap();
        }
        // ...and past that, the oldest refund counts as one below: the
        // lowest reservation gets 1 of its 2 unused back (never more).
        assert_eq!(peek(&l, &k, 1).await.remaining(), left, "{n} reservations");
    }

    // Ten years to refill 1,000 tokens, one token 3.65 days: a life that
    // lasts (one token stays out), and 15 refunds of 499 and 479 (a call
    // costs at least 1) pass 2^51 µs.
    let policy = TokenBucket::new(1_000, 1, 315_360 * S).unwrap();
    let l = limiter("renew", policy, backend);
    let k = Key::new("tenant");
    assert!(decide(&l, &k, 1).await.is_allowed());
    for spent in 2..16 {
        clock.advance(Duration::from_millis(1));
        let (v, r) = l.reserve(&k, 500).await;
        assert!(v.is_allowed());
        let d = r.settle(0).await.unwrap().unwrap();
        assert_eq!(d.remaining(), 1_000 - spent);
    }
    clock.advance(Duration::from_millis(1));
    let (_, below) = l.reserve(&k, 480).await;
    let (_, above) = l.reserve(&k, 480).await;
    // The fifteenth refund renews the life...
    let d = below.settle(0).await.unwrap().unwrap();
    assert_eq!(d.remaining(), 1_000 - 16 - 480);
    clock.advance(Duration::from_millis(1));
    // ...so the reservation above it, of the old life, refunds nothing.
    let d = above.settle(0).await.unwrap().unwrap();
    assert_eq!(d.remaining(), 1_000 - 16 - 480);
}

/// Reserve, then settle, on calendar quotas: in a composite with a token
/// bucket, both parts refund; a settle after the month rolled refunds
/// nothing (the new month owes the old one nothing) and charges an excess
/// to the new month; a plain calendar limiter reserves and settles.
pub async fn reserve_and_settle_a_calendar_quota<B: Backend + Clone>(backend: B, clock: MockClock) {
    clock.set(civil("UTC", (2026, 2, 10), (12, 0)));
    let policy = Composite::new([
        Policy::from(TokenBucket::new(1_000, 10, S).unwrap()),
        Policy::from(Calendar::new(1_000, Period::Month, "UTC").unwrap()),
    ])
    .unwrap();
    let l = limiter("rs-cal", policy, backend.clone());
    let k = Key::new("tenant");
    let (v, r) = l.reserve(&k, 800).await;
    assert_eq!(v.decision().map(|d| d.remaining()), Some(200));
    let d = r.settle(300).await.unwrap().unwrap();
    assert_eq!(d.remaining(), 700, "both parts refund");
    clock.advance(2 * S);
    // The bucket refilled 20; the month holds 300 used.
    let d = peek(&l, &k, 1).await;
    assert_eq!((d.remaining(), d.part()), (700, 1));
    assert!(decide(&l, &k, 700).await.is_allowed());
    assert!(decide(&l, &k, 1).await.is_denied());

    // Settled after the month rolled: nothing refunded, not even to the
    // bucket's share that dripped back; the excess is March's.
    clock.set(civil("UTC", (2026, 2, 28), (23, 59)));
    let k = Key::new("late");
    let (_, r) = l.reserve(&k, 600).await;
    clock.set(civil("UTC", (2026, 3, 1), (0, 2)));
    assert!(decide(&l, &k, 100).await.is_allowed());
    clock.advance(S);
    // (A settle of 0 charges the minimum, 1: no excess either.)
    let d = r.settle(0).await.unwrap().unwrap();
    assert_eq!(
        (d.remaining(), d.part()),
        (900, 1),
        "March owes February nothing"
    );
    let (_, r) = l.reserve(&k, 50).await;
    let d = r.settle(150).await.unwrap().unwrap();
    assert_eq!((d.remaining(), d.part()), (750, 1), "the excess is March's");

    // A plain calendar limiter.
    let day = Calendar::new(1_000, Period::Day, "Europe/Berlin").unwrap();
    let l = limiter("rs-day", day, backend);
    let k = Key::new("tenant");
    let (v, r) = l.reserve(&k, 800).await;
    assert_eq!(v.decision().map(|d| d.remaining()), Some(200));
    let (v, empty) = l.reserve(&k, 300).await;
    assert!(!v.is_allowed() && empty.is_empty());
    clock.advance(ms(1));
    assert_eq!(r.settle(300).await.unwrap().unwrap().remaining(), 700);
    let (_, r) = l.reserve(&k, 100).await;
    assert_eq!(r.settle(250).await.unwrap().unwrap().remaining(), 450);
    // A reset, then the same day counts afresh: an older refund mints
    // nothing.
    let (_, r) = l.reserve(&k, 400).await;
    l.reset(&k).await.unwrap();
    clock.advance(ms(1));
    assert!(decide(&l, &k, 1_000).await.is_allowed());
    assert_eq!(r.settle(0).await.unwrap().unwrap().remaining(), 0);
    // Berlin's next midnight: a fresh day, nothing to refund.
    let (_, r) = l.reserve(&Key::new("night"), 1_000).await;
    clock.set(civil("Europe/Berlin", (2026, 3, 2), (0, 0)));
    let d = r.settle(0).await.unwrap().unwrap();
    assert_eq!(d.remaining(), 1_000);
}

/// An excess settled into a sliding window trims the log (the newest
/// entries alone then hold the limit), but a refund of a kept reservation
/// afterwards must not free what the trimmed entries still held: the
/// window still holds 17 units of 10, nothing passes until the oldest
/// leave it. While a dropped entry is in the window a refund gives nothing
/// back. (Alone and as a composite's part.)
pub async fn a_refund_never_frees_what_an_excess_trimmed<B: Backend + Clone>(
    backend: B,
    clock: MockClock,
) {
    let policies: [Policy; 2] = [
        SlidingWindow::new(10, 60 * S).unwrap().into(),
        Composite::new([
            TokenBucket::new(1_000, 1_000, S).unwrap().into(),
            SlidingWindow::new(10, 60 * S).unwrap().into(),
        ])
        .unwrap()
        .into(),
    ];
    for policy in policies {
        let l = limiter("sw-trim", policy, backend.clone());
        let k = Key::new("tenant");
        let (v, first) = l.reserve(&k, 8).await;
        assert!(v.is_allowed(), "{policy:?}");
        clock.advance(S);
        let (v, second) = l.reserve(&k, 2).await;
        assert!(v.is_allowed(), "{policy:?}");
        clock.advance(S);
        // The first call really cost 16: 8 more, charged into overdraft.
        first.settle(16).await.unwrap().unwrap();
        clock.advance(S);
        // The second cost 1 (of 2): one unit back. 8 + 8 + 1 = 17 units
        // were spent in the last 3 s.
        let d = second.settle(1).await.unwrap().unwrap();
        assert!(d.is_denied(), "{policy:?}: {d:?}");
        assert_eq!(d.remaining(), 0, "{policy:?}");
        assert!(decide(&l, &k, 1).await.is_denied(), "{policy:?}");
        // The refund was withheld (the safe side): the second call's 2
        // units stay counted until they leave the window, at 61 s.
        clock.advance(57 * S);
        assert!(decide(&l, &k, 1).await.is_denied(), "{policy:?}");
        clock.advance(S);
        assert!(decide(&l, &k, 2).await.is_allowed(), "{policy:?}");
        assert!(decide(&l, &k, 1).await.is_denied(), "{policy:?}");
    }
}

/// A reservation settled after an override slowed the bucket's refill
/// leaves what charging its actual cost would have: reserving 10 and
/// settling 5 gives no more than taking 5 outright, under the same
/// override (the refund is the unused units' share of the time the
/// reservation took, not the unused units at the new, longer interval).
///
/// Counted at the interval in force (`min(unused x new interval, top -
/// now)`), the refund left 10 tokens against 7: at a longer interval it
/// also gave back the time of the units actually used. The receipt's mark
/// now carries the interval the units were charged at
/// ([`Mark::per`](tollgate_limiter::strategy::reservation::Mark::per)).
pub async fn a_settle_under_a_slower_refill_refunds_only_the_unused<B: Backend + Clone>(
    backend: B,
    clock: MockClock,
) {
    let bucket = |period| Policy::from(TokenBucket::new(10, 1, period).unwrap());
    // In a composite, beside a window that never binds.
    let composite = |period| {
        Policy::from(
            Composite::new([bucket(period), SlidingWindow::new(100, S).unwrap().into()]).unwrap(),
        )
    };
    for (name, policy, slower) in [
        ("tb-slow", bucket(S), bucket(2 * S)),
        ("tb-slow-c", composite(S), composite(2 * S)),
    ] {
        let l = limiter(name, policy, backend.clone());
        let (reserved, charged) = (Key::new("reserved"), Key::new("charged"));
        let (v, r) = l.reserve(&reserved, 10).await;
        assert!(v.is_allowed());
        assert!(decide(&l, &charged, 5).await.is_allowed());
        // The rate is halved (an operator, or the AIMD controller's cut).
        l.set_override(None, Some(slower)).await.unwrap();
        clock.advance(ms(1));
        // The call really cost 5 of its 10.
        let settled = r.settle(5).await.unwrap().unwrap();
        let outright = peek(&l, &charged, 1).await;
        assert!(
            settled.remaining() <= outright.remaining(),
            "{name}: reserve 10 then settle 5 left {} tokens, charging 5 left {}",
            settled.remaining(),
            outright.remaining()
        );
        // And the refund was made: not the whole estimate kept.
        assert_eq!(settled.remaining(), outright.remaining(), "{name}");
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An error and its sources, for a failure message.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

async fn acquire_each<B: Backend>(l: &Limiter<B>, key: &Key, n: usize) -> Vec<bool> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(decide(l, key, 1).await.is_allowed());
    }
    out
}

/// One step of a random trace.
#[derive(Debug, Clone)]
pub enum Step {
    /// Let time pass (microseconds).
    Advance(u64),
    /// Ask for `cost` on key number `key` (0 counts as 1).
    Acquire {
        /// Which of the trace's keys.
        key: usize,
        /// The cost.
        cost: u64,
    },
    /// Peek whether `cost` would fit on key number `key`.
    Peek {
        /// Which of the trace's keys.
        key: usize,
        /// The cost.
        cost: u64,
    },
    /// Record `units` refused units on key number `key` (a local denial
    /// cache's carried penalty).
    Penalise {
        /// Which of the trace's keys.
        key: usize,
        /// The units.
        units: u64,
    },
    /// Reset key number `key`.
    Reset(usize),
    /// Reserve `cost` on key number `key`; the receipt is kept for a
    /// later [`Step::Settle`].
    Reserve {
        /// Which of the trace's keys.
        key: usize,
        /// The estimate.
        cost: u64,
    },
    /// Settle the receipt of an earlier reservation (number `which`,
    /// modulo the reservations made so far; none made: nothing happens)
    /// with the real cost `actual`. A receipt may be settled more than
    /// once: the backend must still agree with the model. Every other
    /// receipt carries an id (a second settle is a replay, which changes
    /// nothing), the others none (settled again).
    Settle {
        /// Which reservation.
        which: usize,
        /// The real cost.
        actual: u64,
    },
    /// Hold (or renew) concurrency slot `id` on key number `key`.
    Hold {
        /// Which of the trace's keys.
        key: usize,
        /// The slot id.
        id: u64,
    },
    /// Release concurrency slot `id` on key number `key`.
    Release {
        /// Which of the trace's keys.
        key: usize,
        /// The slot id.
        id: u64,
    },
    /// Withdraw concurrency slot `id` on key number `key`.
    Withdraw {
        /// Which of the trace's keys.
        key: usize,
        /// The slot id.
        id: u64,
    },
    /// Set (`Some`) or clear an override, on the limiter (`key = None`) or
    /// one key. The policy is a variant of the trace's strategy.
    Override(Option<usize>, Option<Policy>),
}

const KEYS: usize = 3;

fn durations() -> impl Strategy<Value = u64> {
    // Microseconds: from 1µs to 20s, weighted towards the scales that make
    // limits bite.
    prop_oneof![1u64..1_000, 1_000u64..2_000_000, 2_000_000u64..20_000_000]
}

/// Random policies of every strategy, small enough that traces hit the
/// limits often.
pub fn policies() -> impl Strategy<Value = Policy> {
    prop_oneof![
        token_buckets(),
        (sliding_windows(), any::<bool>()).prop_map(|(p, penalise)| match p {
            Policy::SlidingWindow(w) => Policy::from(w.penalise_refused(penalise)),
            other => other,
        }),
        proptest::collection::vec(parts(), 1..=3)
            .prop_map(|parts| { Policy::from(Composite::new(parts).unwrap()) }),
        calendars(),
        (1u64..5, 1u64..8_000_000).prop_map(|(max, lease)| {
            Policy::from(Concurrency::new(max, Duration::from_micros(lease)).unwrap())
        }),
        progressive_delays(),
    ]
}

fn progressive_delays() -> impl Strategy<Value = Policy> {
    (0u64..3, 1u64..1_000_000, 1u64..4, 1u64..4, 1u64..10_000_000).prop_map(
        |(free, base, factor, max_mult, forget)| {
            Policy::from(
                ProgressiveDelay::new(
                    free,
                    Duration::from_micros(base),
                    factor,
                    Duration::from_micros(base * max_mult),
                    Duration::from_micros(forget),
                )
                .unwrap(),
            )
        },
    )
}

/// Random parts of a composite: token buckets, sliding windows that do not
/// penalise refusals, and calendar quotas.
fn parts() -> impl Strategy<Value = Policy> {
    prop_oneof![token_buckets(), sliding_windows(), calendars()]
}

/// Zones with daylight saving (Berlin, New York, Lord Howe's half hour,
/// Sao Paulo's old midnight change), without (UTC, Kathmandu's +05:45).
const ZONES: [&str; 6] = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "America/Sao_Paulo",
    "Asia/Kathmandu",
];

fn calendars() -> impl Strategy<Value = Policy> {
    (
        1u64..8,
        prop_oneof![Just(Period::Day), Just(Period::Week), Just(Period::Month)],
        proptest::sample::select(&ZONES[..]),
    )
        .prop_map(|(limit, period, zone)| Policy::from(Calendar::new(limit, period, zone).unwrap()))
}

fn token_buckets() -> impl Strategy<Value = Policy> {
    // A period of at least `refill` µs: a token a microsecond at most, or
    // `new` refuses it, and a shrinking period (towards 1) reached that
    // and panicked the run, hiding the case that failed.
    (1u64..8, 1u64..5, 1u64..4_000_000).prop_map(|(cap, refill, period)| {
        Policy::from(
            TokenBucket::new(cap, refill, Duration::from_micros(period.max(refill))).unwrap(),
        )
    })
}

fn sliding_windows() -> impl Strategy<Value = Policy> {
    (1u64..8, 1u64..6_000_000).prop_map(|(limit, window)| {
        Policy::from(SlidingWindow::new(limit, Duration::from_micros(window)).unwrap())
    })
}

/// A policy of the same strategy as `base`, with other parameters.
fn variant(base: &Policy) -> BoxedStrategy<Policy> {
    let kind = base.strategy();
    policies()
        .prop_filter("same strategy", move |p| p.strategy() == kind)
        .boxed()
}

/// A random trace: a policy and up to `len` steps.
pub fn traces(len: usize) -> impl Strategy<Value = (Policy, Vec<Step>)> {
    traces_overridden_by(len, false)
}

/// A random trace whose overrides may switch the strategy: like
/// [`traces`], but an override is any policy, so a key's state meets a
/// script (a model step) of another strategy, in every operation. An
/// override across the concurrency boundary is no policy
/// (`tollgate_limiter::model::in_force`): the model answers `None`, and
/// the backend must fail the decisions it governs with its
/// "invalid policy" error.
pub fn cross_strategy_traces(len: usize) -> impl Strategy<Value = (Policy, Vec<Step>)> {
    traces_overridden_by(len, true)
}

/// [`traces`], its overrides of the trace's strategy only, or of any
/// (`cross`, three times as often).
fn traces_overridden_by(len: usize, cross: bool) -> impl Strategy<Value = (Policy, Vec<Step>)> {
    policies().prop_flat_map(move |policy| {
        let max = policy.max_cost().unwrap_or(3);
        let (overrides, weight) = if cross {
            (policies().boxed(), 3)
        } else {
            (variant(&policy), 1)
        };
        let step = prop_oneof![
            4 => durations().prop_map(Step::Advance),
            // Costs up to one above the configured maximum: impossible ones
            // too, and overrides move the maximum.
            8 => (0..KEYS, 0..=max + 1).prop_map(|(key, cost)| Step::Acquire { key, cost }),
            3 => (0..KEYS, 0..=max + 1).prop_map(|(key, cost)| Step::Peek { key, cost }),
            1 => (0..KEYS, 0..=2 * max).prop_map(|(key, units)| Step::Penalise { key, units }),
            1 => (0..KEYS).prop_map(Step::Reset),
            3 => (0..KEYS, 0..=max + 1).prop_map(|(key, cost)| Step::Reserve { key, cost }),
            3 => (0..8usize, 0..=2 * max + 1)
                .prop_map(|(which, actual)| Step::Settle { which, actual }),
            // A few ids, so that holds renew and releases find their slot;
            // under other strategies these look.
            6 => (0..KEYS, 0..6u64).prop_map(|(key, id)| Step::Hold { key, id }),
            2 => (0..KEYS, 0..6u64).prop_map(|(key, id)| Step::Release { key, id }),
            2 => (0..KEYS, 0..6u64).prop_map(|(key, id)| Step::Withdraw { key, id }),
            weight => (proptest::option::of(0..KEYS), proptest::option::of(overrides))
                .prop_map(|(k, p)| Step::Override(k, p)),
        ];
        (Just(policy), proptest::collection::vec(step, 1..len))
    })
}

/// Replays `cases` random [cross-strategy traces](cross_strategy_traces)
/// through the backend and the reference model.
pub fn overrides_across_strategies_agree_with_model<B, F, Fut>(setup: F, cases: u32)
where
    B: Backend,
    F: FnOnce() -> Fut,
    Fut: Future<Output = (B, MockClock)>,
{
    replay_traces(setup, cases, cross_strategy_traces(60));
}

/// A random trace of overlapping reservations on one key: a token bucket
/// roomy enough to hold many at once (alone, or in a composite with a
/// sliding window or a second bucket), reservations settled in any order
/// (twice, sometimes) between charges and short waits, so that refunds of
/// reservations above and below one another, the refunds a bucket
/// remembers and those it forgets (see
/// `tollgate_limiter::strategy::reservation`) are replayed on the backend
/// step by step. Or a progressive delay: attempts reserved up front,
/// refused while blocked, refunded (`actual` 0), kept or charged an excess
/// in any order, across delays and forgotten lives.
pub fn reservation_traces(len: usize) -> impl Strategy<Value = (Policy, Vec<Step>)> {
    let bucket = (8u64..40, 1u64..5, 1_000_000u64..60_000_000).prop_map(|(cap, refill, period)| {
        Policy::from(TokenBucket::new(cap, refill, Duration::from_micros(period)).unwrap())
    });
    let policy = prop_oneof![
        3 => bucket.clone(),
        1 => (bucket, prop_oneof![token_buckets(), sliding_windows()])
            .prop_map(|(b, other)| Policy::from(Composite::new([b, other]).unwrap())),
        1 => progressive_delays(),
    ];
    policy.prop_flat_map(move |policy| {
        // Small reservations, so that many are out at once: more than the
        // refunds a bucket remembers (8).
        let max = policy.max_cost().unwrap_or(3).min(3);
        let step = prop_oneof![
            2 => prop_oneof![1u64..1_000, 1_000u64..3_000_000].prop_map(Step::Advance),
            1 => (0..=max).prop_map(|cost| Step::Acquire { key: 0, cost }),
            6 => (1..=max).prop_map(|cost| Step::Reserve { key: 0, cost }),
            6 => (0..40usize, 0..=max + 1).prop_map(|(which, actual)| Step::Settle { which, actual }),
            1 => Just(Step::Peek { key: 0, cost: 1 }),
        ];
        (Just(policy), proptest::collection::vec(step, 1..len))
    })
}

/// Instants around which calendar traces start: daylight-saving changes,
/// the ends of February, of a year and of an ISO week, in several zones.
fn calendar_anchors() -> Vec<Timestamp> {
    vec![
        civil("Europe/Berlin", (2026, 3, 29), (3, 0)),
        civil("Europe/Berlin", (2026, 10, 25), (2, 0)),
        civil("Europe/Berlin", (2026, 3, 1), (0, 0)),
        civil("Europe/Berlin", (2028, 3, 1), (0, 0)),
        civil("Europe/Berlin", (2027, 1, 1), (0, 0)),
        civil("Europe/Berlin", (2026, 1, 5), (0, 0)),
        civil("America/New_York", (2026, 3, 8), (3, 0)),
        civil("America/New_York", (2026, 11, 1), (1, 0)),
        civil("Australia/Lord_Howe", (2026, 4, 5), (2, 0)),
        civil("America/Sao_Paulo", (2018, 11, 4), (1, 0)),
        civil("UTC", (2026, 6, 1), (0, 0)),
    ]
}

/// A random trace for a calendar quota (alone or in a composite): a start
/// instant near a boundary, and up to `len` steps whose time steps cross
/// day, week and month boundaries.
pub fn calendar_traces(len: usize) -> impl Strategy<Value = (Timestamp, Policy, Vec<Step>)> {
    let policy = prop_oneof![
        calendars(),
        (calendars(), proptest::collection::vec(parts(), 0..=2)).prop_map(|(c, mut more)| {
            more.insert(0, c);
            Policy::from(Composite::new(more).unwrap())
        }),
    ];
    let start = (
        proptest::sample::select(calendar_anchors()),
        0u64..3 * 86_400_000_000,
    )
        .prop_map(|(anchor, before)| anchor - before);
    (start, policy).prop_flat_map(move |(start, policy)| {
        let max = policy.max_cost().unwrap_or(3);
        let kind = policy.strategy();
        let variant = prop_oneof![
            calendars(),
            (calendars(), proptest::collection::vec(parts(), 0..=2)).prop_map(|(c, mut more)| {
                more.insert(0, c);
                Policy::from(Composite::new(more).unwrap())
            }),
        ]
        .prop_filter("same strategy", move |p| p.strategy() == kind);
        let hour = 3_600_000_000u64;
        let step = prop_oneof![
            2 => durations().prop_map(Step::Advance),
            3 => (hour / 60..6 * hour).prop_map(Step::Advance),
            2 => (6 * hour..4 * 24 * hour).prop_map(Step::Advance),
            1 => (4 * 24 * hour..12 * 24 * hour).prop_map(Step::Advance),
            8 => (0..KEYS, 0..=max + 1).prop_map(|(key, cost)| Step::Acquire { key, cost }),
            3 => (0..KEYS, 0..=max + 1).prop_map(|(key, cost)| Step::Peek { key, cost }),
            1 => (0..KEYS, 0..=2 * max).prop_map(|(key, units)| Step::Penalise { key, units }),
            1 => (0..KEYS).prop_map(Step::Reset),
            3 => (0..KEYS, 0..=max + 1).prop_map(|(key, cost)| Step::Reserve { key, cost }),
            3 => (0..8usize, 0..=2 * max + 1)
                .prop_map(|(which, actual)| Step::Settle { which, actual }),
            1 => (proptest::option::of(0..KEYS), proptest::option::of(variant))
                .prop_map(|(k, p)| Step::Override(k, p)),
        ];
        (
            Just(start),
            Just(policy),
            proptest::collection::vec(step, 1..len),
        )
    })
}

/// Replays `cases` random [calendar traces](calendar_traces) through the
/// backend and the reference model, each from its own start instant (the
/// clock is set back and forth between traces; each uses its own limiter).
pub fn calendars_agree_with_model<B, F, Fut>(setup: F, cases: u32)
where
    B: Backend,
    F: FnOnce() -> Fut,
    Fut: Future<Output = (B, MockClock)>,
{
    run_traces(
        setup,
        cases,
        calendar_traces(60),
        |backend, clock, (start, policy, steps)| {
            clock.set(start);
            Box::pin(async move { replay(backend, clock, &policy, &steps).await })
        },
    );
}

/// A token bucket's life is named by its first reservation
/// (`TokenBucketState::born`), on every backend as in the model: two traces
/// the random replays found when the Redis script named a life begun by a
/// plain acquire otherwise. One where a full refund empties the bucket and
/// a charge in the same microsecond begins the next life, reserved later;
/// one where a life begun by an acquire is reserved, reset, and reserved
/// again in the same microsecond. Each receipt and decision is the model's.
pub async fn a_life_is_named_by_its_first_reservation<B: Backend>(backend: B, clock: MockClock) {
    let us = Duration::from_micros;
    let traces: [(Policy, Vec<Step>); 2] = [
        (
            TokenBucket::new(16, 1, us(25_407_722)).unwrap().into(),
            vec![
                Step::Reserve { key: 0, cost: 1 },
                Step::Settle {
                    which: 0,
                    actual: 0,
                },
                Step::Acquire { key: 0, cost: 0 },
                Step::Advance(956_919),
                Step::Reserve { key: 0, cost: 3 },
                Step::Settle {
                    which: 0,
                    actual: 0,
                },
                Step::Settle {
                    which: 1,
                    actual: 1,
                },
                Step::Acquire { key: 0, cost: 16 },
            ],
        ),
        (
            TokenBucket::new(5, 1, us(467_665)).unwrap().into(),
            vec![
                Step::Acquire { key: 1, cost: 0 },
                Step::Advance(561),
                Step::Reserve { key: 1, cost: 0 },
                Step::Acquire { key: 0, cost: 0 },
                Step::Reset(1),
                Step::Reserve { key: 1, cost: 0 },
                Step::Settle {
                    which: 0,
                    actual: 0,
                },
                Step::Acquire { key: 1, cost: 5 },
            ],
        ),
    ];
    for (policy, steps) in traces {
        replay(&backend, &clock, &policy, &steps)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Replays one trace through `backend` and the model; the first decision
/// that differs fails the case.
pub async fn replay<B: Backend>(
    backend: &B,
    clock: &MockClock,
    policy: &Policy,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    replay_with_candidate(backend, clock, policy, None, steps).await
}

/// [`replay`], with a candidate policy decided beside every acquire and
/// peek ([`Backend::decide_with_candidate`], under the limiter name
/// `<name>:candidate`): both decisions must equal the model's, so the
/// candidate never touches the enforced counters and vice versa.
pub async fn replay_with_candidate<B: Backend>(
    backend: &B,
    clock: &MockClock,
    policy: &Policy,
    candidate: Option<&Policy>,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let name = unique_name("model");
    let beside = format!("{name}:candidate");
    let keys: Vec<Key> = (0..KEYS).map(|i| Key::new(format!("k{i}"))).collect();
    let mut model = Model::new();
    let mut receipts: Vec<(usize, Receipt)> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let (key, op) = match step {
            Step::Reserve { key, cost } => {
                let now = clock.now();
                let req = Request {
                    limiter: &name,
                    key: &keys[*key],
                    policy,
                    op: Op::Acquire(*cost),
                };
                let got = backend.reserve(req).await;
                let want = model.reserve(&name, keys[*key].as_str(), now, policy, *cost);
                let Some(want) = no_policy_agrees(got, want, i, steps)? else {
                    continue;
                };
                // Every other one with an id: settled again, a receipt
                // with one is a replay, one without is settled again.
                let id = if receipts.len().is_multiple_of(2) {
                    receipts.len() as u64 + 1
                } else {
                    0
                };
                receipts.push((*key, Receipt { id, ..want.1 }));
                continue;
            }
            Step::Settle { which, actual } => {
                let Some(&(key, receipt)) = receipts.get(which % receipts.len().max(1)) else {
                    continue;
                };
                (
                    key,
                    Op::Settle {
                        receipt,
                        actual: *actual,
                    },
                )
            }
            Step::Advance(us) => {
                clock.advance_micros(*us);
                continue;
            }
            Step::Override(key, p) => {
                let scope = match key {
                    Some(k) => Scope::Key(&name, &keys[*k]),
                    None => Scope::Limiter(&name),
                };
                backend
                    .set_override(scope, p.as_ref())
                    .await
                    .map_err(|e| TestCaseError::fail(format!("set_override failed: {e}")))?;
                model.set_override(&name, key.map(|k| keys[k].as_str()), *p);
                continue;
            }
            Step::Acquire { key, cost } => (*key, Op::Acquire(*cost)),
            Step::Peek { key, cost } => (*key, Op::Peek(*cost)),
            Step::Penalise { key, units } => (*key, Op::Penalise(*units)),
            Step::Reset(key) => (*key, Op::Reset),
            Step::Hold { key, id } => (*key, Op::Hold(*id)),
            Step::Release { key, id } => (*key, Op::Release(*id)),
            Step::Withdraw { key, id } => (*key, Op::Withdraw(*id)),
        };
        let now = clock.now();
        let req = Request {
            limiter: &name,
            key: &keys[key],
            policy,
            op,
        };
        let got = match (candidate, op) {
            (Some(c), Op::Acquire(_) | Op::Peek(_)) => {
                let cand = Request {
                    limiter: &beside,
                    key: &keys[key],
                    policy: c,
                    op,
                };
                match backend.decide_with_candidate(req, cand).await {
                    Ok((got, got_c)) => {
                        let want_c = model.apply(&beside, keys[key].as_str(), now, c, op);
                        prop_assert_eq!(
                            got_c,
                            want_c,
                            "candidate, step {} ({:?} on k{}) of {:?}",
                            i,
                            op,
                            key,
                            steps
                        );
                        Ok(got)
                    }
                    Err(e) => Err(e),
                }
            }
            _ => backend.decide(req).await,
        };
        let want = model.apply(&name, keys[key].as_str(), now, policy, op);
        no_policy_agrees(got, want, i, steps)
            .map_err(|e| TestCaseError::fail(format!("{e} ({op:?} on k{key})")))?;
    }
    Ok(())
}

/// A backend's answer `got` to step `i` of `steps`, against the model's
/// `want`: equal decisions, or, where the model has no policy (an override
/// across the concurrency boundary, see `tollgate_limiter::model::in_force`),
/// the backend's "invalid policy" error (`None`).
fn no_policy_agrees<T, E>(
    got: Result<T, E>,
    want: Option<T>,
    i: usize,
    steps: &[Step],
) -> Result<Option<T>, TestCaseError>
where
    T: PartialEq + std::fmt::Debug,
    E: tollgate_limiter::BackendError,
{
    match (got, want) {
        (Ok(got), Some(want)) => {
            prop_assert_eq!(&got, &want, "step {} of {:?}", i, steps);
            Ok(Some(want))
        }
        (Err(e), None) if e.reason() == tollgate_limiter::ErrorReason::InvalidPolicy => Ok(None),
        (Err(e), _) => Err(TestCaseError::fail(format!(
            "step {i}: backend failed: {} (reason {}) of {steps:?}",
            chain(&e),
            e.reason()
        ))),
        (Ok(got), None) => Err(TestCaseError::fail(format!(
            "step {i}: backend decided {got:?} under an override across the concurrency \
             boundary (no policy) of {steps:?}"
        ))),
    }
}

/// Replays `cases` random traces through the backend and the reference
/// model (call from a plain `#[test]`, not inside a runtime).
///
/// `setup` builds the backend once; each trace uses its own limiter name.
pub fn agrees_with_model<B, F, Fut>(setup: F, cases: u32)
where
    B: Backend,
    F: FnOnce() -> Fut,
    Fut: Future<Output = (B, MockClock)>,
{
    replay_traces(setup, cases, traces(60));
}

/// [`replay`]s `cases` traces drawn from `traces`.
fn replay_traces<B, F, Fut>(
    setup: F,
    cases: u32,
    traces: impl Strategy<Value = (Policy, Vec<Step>)>,
) where
    B: Backend,
    F: FnOnce() -> Fut,
    Fut: Future<Output = (B, MockClock)>,
{
    run_traces(setup, cases, traces, |backend, clock, (policy, steps)| {
        Box::pin(async move { replay(backend, clock, &policy, &steps).await })
    });
}

/// Overlapping reservations on one key ([`reservation_traces`]) replayed
/// on the backend and the model, decision by decision and receipt by
/// receipt: the refund bookkeeping of a token bucket agrees.
pub fn reservations_agree_with_model<B, F, Fut>(setup: F, cases: u32)
where
    B: Backend,
    F: FnOnce() -> Fut,
    Fut: Future<Output = (B, MockClock)>,
{
    replay_traces(setup, cases, reservation_traces(100));
}

/// Like [`agrees_with_model`], each trace with a candidate policy decided
/// beside the enforced one (see [`replay_with_candidate`]).
pub fn candidate_agrees_with_model<B, F, Fut>(setup: F, cases: u32)
where
    B: Backend,
    F: FnOnce() -> Fut,
    Fut: Future<Output = (B, MockClock)>,
{
    let not_concurrency = |p: &Policy| !matches!(p, Policy::Concurrency(_));
    let traces = (
        traces(60).prop_filter("no candidate for concurrency", move |(p, _)| {
            not_concurrency(p)
        }),
        policies().prop_filter("a concurrency limit is no candidate", not_concurrency),
    );
    run_traces(
        setup,
        cases,
        traces,
        |backend, clock, ((policy, steps), candidate)| {
            Box::pin(async move {
                replay_with_candidate(backend, clock, &policy, Some(&candidate), &steps).await
            })
        },
    );
}

/// Builds the backend once (`setup`, in a current-thread runtime), then
/// runs `cases` values of `strategy` through `check`, failing on the first
/// disagreement with the reference model.
fn run_traces<B, F, Fut, S>(
    setup: F,
    cases: u32,
    strategy: S,
    check: impl for<'a> Fn(
        &'a B,
        &'a MockClock,
        S::Value,
    )
        -> std::pin::Pin<Box<dyn Future<Output = Result<(), TestCaseError>> + 'a>>,
) where
    B: Backend,
    F: FnOnce() -> Fut,
    Fut: Future<Output = (B, MockClock)>,
    S: Strategy,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (backend, clock) = rt.block_on(setup());
    let mut runner = TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&strategy, |value| {
            rt.block_on(check(&backend, &clock, value))
        })
        .unwrap_or_else(|e| panic!("backend disagrees with the reference model: {e}"));
}

/// A candidate beside an enforced limit, through a [`Limiter`]: the
/// enforced verdicts are the enforced policy's alone, and the candidate's
/// state (read under `<name>:candidate`) is the candidate's alone.
pub async fn candidate_beside_enforced<B: Backend + Clone>(backend: B, _clock: MockClock) {
    let name = unique_name("cand");
    let l = Limiter::builder(
        &name,
        TokenBucket::new(3, 1, 3600 * S).unwrap(),
        backend.clone(),
    )
    .candidate(SlidingWindow::new(2, 3600 * S).unwrap())
    .timeout(Duration::from_secs(5))
    .build();
    let (&candidate, beside) = l.candidate().expect("a candidate");
    assert_eq!(beside, format!("{name}:candidate"));
    // Read straight from the backend: no limiter may be named
    // `<name>:candidate` (the builder refuses a name holding ':').
    let shadow = |key| looked(&backend, beside, &candidate, key);
    let k = Key::new("k");
    let passed: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..5 {
            v.push(decide(&l, &k, 1).await.is_allowed());
        }
        v
    };
    // The enforced bucket alone decides: 3 pass, whatever the candidate.
    assert_eq!(passed, [true, true, true, false, false]);
    // The candidate counted its own 2 passes, and refused the rest.
    let d = shadow(&k).await;
    assert_eq!((d.limit(), d.remaining()), (2, 0));
    assert!(d.is_denied());
    // A reset of the key resets the candidate's state too, as it would
    // have been reset were the candidate enforced.
    l.reset(&k).await.expect("reset");
    let d = shadow(&k).await;
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!((d.limit(), d.remaining()), (2, 2));
    // The next decisions agree again: both pass.
    assert!(decide(&l, &k, 1).await.is_allowed());
    assert_eq!(shadow(&k).await.remaining(), 1);
}

/// What a peek of one unit answers for `key` of `limiter` under `policy`,
/// asked of the backend itself.
async fn looked<B: Backend>(backend: &B, limiter: &str, policy: &Policy, key: &Key) -> Decision {
    let req = Request {
        limiter,
        key,
        policy,
        op: Op::PEEK,
    };
    backend
        .decide(req)
        .await
        .unwrap_or_else(|e| panic!("backend failed: {e:?}"))
}

/// Fixed traces at the edges of the numbers a backend is sent, replayed
/// against the model decision by decision: limits at
/// [`MAX_COUNT`](tollgate_limiter::policy::MAX_COUNT), costs and settled
/// amounts of 0 and `u64::MAX` (the Redis backend sends at most 2^53),
/// a token bucket refilled once in ten years, a progressive delay with a
/// factor of `u64::MAX`, and concurrency slot ids above 2^53 (a Lua
/// number would merge 2^53 and 2^53 + 1).
pub async fn extreme_values_agree_with_model<B: Backend>(backend: B, clock: MockClock) {
    use tollgate_limiter::policy::MAX_COUNT;
    let max = MAX_COUNT;
    let ten_years = Duration::from_secs(10 * 365 * 86_400);
    let ten_years_us = tollgate_limiter::policy::MAX_SPAN_MICROS;
    // The largest capacity: a token a µs, a full refill in 10 years.
    let bucket = || Policy::from(TokenBucket::new(ten_years_us, ten_years_us, ten_years).unwrap());
    let four_parts = || -> Policy {
        Composite::new([
            bucket(),
            Policy::from(SlidingWindow::new(max, 10 * S).unwrap()),
            Policy::from(SlidingWindow::new(max, 10 * S).unwrap()),
            Policy::from(Calendar::new(max, Period::Day, "UTC").unwrap()),
        ])
        .unwrap()
        .into()
    };
    // Key 0 reserves 5 and settles u64::MAX (an excess the Redis client
    // sends as at most 2^53); key 1 reserves the whole limit and settles 0.
    let overdrawn = || {
        vec![
            Step::Reserve { key: 0, cost: 5 },
            Step::Settle {
                which: 0,
                actual: u64::MAX,
            },
            Step::Peek { key: 0, cost: 1 },
        ]
    };
    let refunded_whole = || {
        vec![
            Step::Reserve { key: 1, cost: max },
            Step::Settle {
                which: 1,
                actual: 0,
            },
            Step::Peek { key: 1, cost: max },
        ]
    };
    let traces: Vec<(&str, Policy, Vec<Step>)> = vec![
        (
            "a calendar quota of MAX_COUNT",
            Calendar::new(max, Period::Day, "UTC").unwrap().into(),
            [
                overdrawn(),
                refunded_whole(),
                vec![
                    Step::Acquire {
                        key: 1,
                        cost: u64::MAX,
                    },
                    Step::Acquire {
                        key: 2,
                        cost: max - 1,
                    },
                    Step::Acquire { key: 2, cost: 1 },
                    Step::Acquire { key: 2, cost: 1 },
                ],
            ]
            .concat(),
        ),
        (
            "a sliding window of MAX_COUNT",
            SlidingWindow::new(max, 10 * S).unwrap().into(),
            [
                overdrawn(),
                vec![Step::Advance(10_000_000), Step::Peek { key: 0, cost: 1 }],
                refunded_whole(),
                vec![
                    Step::Acquire {
                        key: 2,
                        cost: max - 1,
                    },
                    Step::Acquire { key: 2, cost: 1 },
                    Step::Acquire { key: 2, cost: 1 },
                ],
            ]
            .concat(),
        ),
        (
            "a composite of MAX_COUNT parts",
            Composite::new([
                Policy::from(Calendar::new(max, Period::Month, "Europe/Berlin").unwrap()),
                Policy::from(SlidingWindow::new(max, 10 * S).unwrap()),
            ])
            .unwrap()
            .into(),
            [overdrawn(), refunded_whole()].concat(),
        ),
        (
            // An excess past 2^53: a Lua number rounds the total (2 +
            // 2^53 - 1), and a refusal then waited for other events.
            "a sliding window of MAX_COUNT overdrawn past 2^53",
            SlidingWindow::new(max, 10 * S).unwrap().into(),
            vec![
                Step::Acquire { key: 1, cost: 0 },
                Step::Reserve { key: 1, cost: 0 },
                Step::Advance(1),
                Step::Settle {
                    which: 0,
                    actual: 1 << 53,
                },
                Step::Peek { key: 1, cost: 1 },
                Step::Advance(9_999_999),
                Step::Peek { key: 1, cost: 1 },
            ],
        ),
        (
            // An odd count past 2^53 (MAX_COUNT + 2^52), then a refund.
            "a calendar quota of MAX_COUNT overdrawn past 2^53",
            Calendar::new(max, Period::Day, "UTC").unwrap().into(),
            vec![
                Step::Reserve {
                    key: 0,
                    cost: max - 1,
                },
                Step::Reserve { key: 0, cost: 1 },
                Step::Settle {
                    which: 1,
                    actual: (1 << 52) + 1,
                },
                Step::Settle {
                    which: 0,
                    actual: 0,
                },
                Step::Peek { key: 0, cost: 1 },
            ],
        ),
        (
            "a composite of MAX_COUNT parts overdrawn past 2^53",
            Composite::new([
                Policy::from(SlidingWindow::new(max, 10 * S).unwrap()),
                Policy::from(Calendar::new(max, Period::Day, "UTC").unwrap()),
            ])
            .unwrap()
            .into(),
            vec![
                Step::Reserve {
                    key: 0,
                    cost: max - 1,
                },
                Step::Reserve { key: 0, cost: 1 },
                Step::Advance(1),
                Step::Settle {
                    which: 1,
                    actual: (1 << 52) + 1,
                },
                Step::Settle {
                    which: 0,
                    actual: 0,
                },
                Step::Peek { key: 0, cost: 1 },
                Step::Acquire { key: 1, cost: 0 },
                Step::Reserve { key: 1, cost: 0 },
                Step::Advance(1),
                Step::Settle {
                    which: 2,
                    actual: 1 << 53,
                },
                Step::Peek { key: 1, cost: 1 },
            ],
        ),
        (
            // Four parts (the most a composite has; the random traces
            // make at most three) at the edges: a bucket refilling a
            // token a µs for 10 years (the largest capacity), two windows
            // of MAX_COUNT over one window, a calendar quota of
            // MAX_COUNT. A cost that fits the windows and the quota but
            // not the bucket's room charges none of them; the bucket
            // emptied in one charge; an excess past 2^53 settled on
            // every part; a replayed settle; an override that drops a
            // part, then one that changes a part's strategy, mid-life.
            "a composite of four parts at the edges",
            four_parts(),
            vec![
                Step::Acquire {
                    key: 0,
                    cost: u64::MAX,
                },
                Step::Peek {
                    key: 0,
                    cost: ten_years_us,
                },
                Step::Reserve {
                    key: 0,
                    cost: ten_years_us,
                },
                Step::Acquire { key: 0, cost: 1 },
                Step::Peek { key: 0, cost: 1 },
                Step::Advance(1),
                Step::Settle {
                    which: 0,
                    actual: 1 << 53,
                },
                Step::Peek { key: 0, cost: 1 },
                Step::Settle {
                    which: 0,
                    actual: 0,
                },
                Step::Reserve { key: 1, cost: 7 },
                Step::Settle {
                    which: 1,
                    actual: 2,
                },
                Step::Settle {
                    which: 1,
                    actual: 2,
                },
                Step::Peek { key: 1, cost: 1 },
                Step::Override(
                    Some(1),
                    Some(
                        Composite::new([
                            bucket(),
                            Policy::from(SlidingWindow::new(max, 10 * S).unwrap()),
                            Policy::from(SlidingWindow::new(max, 10 * S).unwrap()),
                        ])
                        .unwrap()
                        .into(),
                    ),
                ),
                Step::Acquire { key: 1, cost: 3 },
                Step::Override(
                    Some(1),
                    Some(
                        Composite::new([
                            bucket(),
                            Policy::from(Calendar::new(max, Period::Day, "UTC").unwrap()),
                            Policy::from(SlidingWindow::new(max, 10 * S).unwrap()),
                        ])
                        .unwrap()
                        .into(),
                    ),
                ),
                Step::Acquire { key: 1, cost: max },
                Step::Override(Some(1), None),
                Step::Peek { key: 1, cost: 1 },
                Step::Advance(10_000_000),
                Step::Peek { key: 1, cost: 1 },
                Step::Acquire { key: 1, cost: 1 },
            ],
        ),
        (
            // A usage figure above 2^53: its excess over the units is
            // above the limit, so a whole limit is charged (the Redis
            // backend sent the figure as 2^53, an excess of MAX_COUNT - 1).
            "a sliding window of MAX_COUNT settled with u64::MAX",
            SlidingWindow::new(max, 10 * S).unwrap().into(),
            vec![
                Step::Reserve { key: 0, cost: 2 },
                Step::Advance(10_000_000),
                Step::Settle {
                    which: 0,
                    actual: u64::MAX,
                },
                Step::Peek { key: 0, cost: 1 },
                Step::Reserve { key: 1, cost: 2 },
                Step::Settle {
                    which: 1,
                    actual: u64::MAX,
                },
                Step::Peek { key: 1, cost: 1 },
            ],
        ),
        (
            // A count saturated by a reservation of 2^53 failures, then
            // refunded: the script's count stops at 2^53, the model's
            // went on.
            "a progressive delay refunded after its count saturated",
            ProgressiveDelay::new(0, S, 2, 10 * S, 100 * S)
                .unwrap()
                .into(),
            vec![
                Step::Reserve {
                    key: 0,
                    cost: 1 << 53,
                },
                Step::Acquire { key: 0, cost: 1 },
                Step::Settle {
                    which: 0,
                    actual: 0,
                },
                Step::Peek { key: 0, cost: 1 },
                Step::Reserve {
                    key: 1,
                    cost: u64::MAX,
                },
                Step::Settle {
                    which: 1,
                    actual: 5,
                },
                Step::Peek { key: 1, cost: 1 },
            ],
        ),
        (
            "a token bucket refilled once in ten years",
            TokenBucket::new(1, 1, ten_years).unwrap().into(),
            vec![
                Step::Reserve { key: 0, cost: 1 },
                Step::Settle {
                    which: 0,
                    actual: u64::MAX,
                },
                Step::Peek { key: 0, cost: 1 },
                Step::Settle {
                    which: 0,
                    actual: 0,
                },
                Step::Peek { key: 0, cost: 1 },
            ],
        ),
        (
            "zero costs and zero settles",
            SlidingWindow::new(3, 10 * S).unwrap().into(),
            vec![
                Step::Acquire { key: 0, cost: 0 },
                Step::Reserve { key: 0, cost: 0 },
                Step::Settle {
                    which: 0,
                    actual: 0,
                },
                Step::Penalise { key: 0, units: 0 },
                Step::Peek { key: 0, cost: 0 },
                Step::Reserve { key: 1, cost: 0 },
                Step::Settle {
                    which: 1,
                    actual: 1,
                },
                Step::Peek { key: 1, cost: 0 },
            ],
        ),
        (
            "concurrency slot ids above 2^53",
            Concurrency::new(2, 10 * S).unwrap().into(),
            vec![
                Step::Hold {
                    key: 0,
                    id: u64::MAX,
                },
                Step::Hold {
                    key: 0,
                    id: u64::MAX - 1,
                },
                Step::Hold { key: 0, id: 0 },
                Step::Release {
                    key: 0,
                    id: u64::MAX,
                },
                Step::Hold {
                    key: 0,
                    id: (1 << 53) + 1,
                },
                Step::Hold {
                    key: 0,
                    id: 1 << 53,
                },
                Step::Release {
                    key: 0,
                    id: 1 << 53,
                },
                Step::Peek { key: 0, cost: 1 },
                Step::Withdraw {
                    key: 0,
                    id: u64::MAX - 1,
                },
                Step::Hold {
                    key: 0,
                    id: u64::MAX - 1,
                },
                Step::Hold {
                    key: 0,
                    id: (1 << 53) + 2,
                },
            ],
        ),
        (
            "more withdrawn ids than a key remembers, all at one instant",
            Concurrency::new(1, 10 * S).unwrap().into(),
            std::iter::once(Step::Withdraw {
                key: 0,
                id: u64::MAX,
            })
            .chain(
                (1..=tollgate_limiter::concurrency::WITHDRAWN_MAX as u64)
                    .map(|id| Step::Withdraw { key: 0, id }),
            )
            .chain([
                // The earliest forgotten, the smallest id first, went.
                Step::Hold { key: 0, id: 1 },
                Step::Release { key: 0, id: 1 },
                Step::Hold { key: 0, id: 2 },
                Step::Hold {
                    key: 0,
                    id: u64::MAX,
                },
                Step::Advance(10_000_000),
                Step::Hold { key: 0, id: 2 },
            ])
            .collect(),
        ),
        (
            "a progressive delay charged u64::MAX failures",
            ProgressiveDelay::new(0, S, u64::MAX, 100 * S, 1000 * S)
                .unwrap()
                .into(),
            vec![
                Step::Acquire { key: 0, cost: 1 },
                Step::Acquire {
                    key: 0,
                    cost: u64::MAX,
                },
                Step::Peek { key: 0, cost: 1 },
                Step::Advance(200_000_000),
                Step::Peek { key: 0, cost: 1 },
                Step::Reserve {
                    key: 1,
                    cost: u64::MAX,
                },
                Step::Settle {
                    which: 0,
                    actual: 0,
                },
                Step::Peek { key: 1, cost: 1 },
            ],
        ),
    ];
    let mut failed = Vec::new();
    for (what, policy, steps) in traces {
        if let Err(e) = replay(&backend, &clock, &policy, &steps).await {
            failed.push(format!("{what}: {e}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Generates the whole suite as `#[tokio::test]`s in a module named
/// `conformance`.
///
/// `$setup` is an `async` expression evaluating to `(backend, MockClock)`,
/// the backend taking its time from that clock. The optional `cases` is the
/// number of random traces checked against the model (default 1000).
#[macro_export]
macro_rules! conformance_tests {
    ($setup:expr) => {
        $crate::conformance_tests!($setup, cases = 1000);
    };
    ($setup:expr, cases = $cases:expr) => {
        mod conformance {
            #[allow(unused_imports)]
            use super::*;

            $crate::conformance_tests!(@each $setup;
                token_bucket_burst_and_refill, token_bucket_cost, sliding_window_exact,
                sliding_window_penalise, progressive_delay, progressive_delay_failures_saturate,
                peek_and_reset, zero_cost_is_charged,
                cost_under_overrides, isolation, overrides, expiring_overrides,
                concurrent_token_bucket, a_life_is_named_by_its_first_reservation,
                concurrent_sliding_window, concurrent_composite,
                composite_charges_nothing_on_refusal, calendar_day_across_daylight_saving,
                calendar_month_in_a_composite, reserve_and_settle,
                progressive_delay_reservations,
                reserve_and_settle_a_calendar_quota, overlapping_reservations_refund_what_is_out,
                a_replayed_settle_changes_nothing, a_key_remembers_the_latest_settles,
                a_settle_under_a_slower_refill_refunds_only_the_unused,
                a_refund_never_frees_what_an_excess_trimmed,
                concurrency_slots, concurrent_holds, a_hold_withdrawn_before_it_lands_takes_nothing,
                a_clock_stepping_back_counts_the_slots_held,
                a_look_forgets_what_expired_before_a_clock_steps_back,
                an_override_across_the_concurrency_boundary_is_no_policy,
                replace_override_compares_and_sets,
                candidate_beside_enforced, extreme_values_agree_with_model);

            #[test]
            fn agrees_with_model() {
                $crate::conformance::agrees_with_model(|| $setup, $cases);
            }

            #[test]
            fn calendars_agree_with_model() {
                $crate::conformance::calendars_agree_with_model(|| $setup, ($cases / 3).max(50));
            }

            #[test]
            fn reservations_agree_with_model() {
                $crate::conformance::reservations_agree_with_model(|| $setup, $cases / 3 + 1);
            }

            #[test]
            fn overrides_across_strategies_agree_with_model() {
                $crate::conformance::overrides_across_strategies_agree_with_model(
                    || $setup,
                    $cases / 3 + 1,
                );
            }

            #[test]
            fn candidate_agrees_with_model() {
                $crate::conformance::candidate_agrees_with_model(|| $setup, $cases / 3 + 1);
            }
        }
    };
    (@each $setup:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let (backend, clock) = $setup.await;
                $crate::conformance::$name(backend, clock).await;
            }
        )*
    };
}
