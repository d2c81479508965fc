//! The AIMD limiter against a simulated remote source, on tokio's paused
//! clock: every test runs hours of simulated time in milliseconds, and its
//! figures are deterministic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tollgate_limiter::aimd::{AcquireError, AimdConfig, AimdLimiter, Outcome};
use tollgate_limiter::time::micros;
use tollgate_limiter::{Clock, Key, Timestamp};
use tollgate_memory::MemoryBackend;

/// A clock for the backend that follows tokio's: with time paused, the
/// backend's buckets refill exactly as the limiter's sleeps advance.
#[derive(Debug, Clone)]
struct TokioClock {
    origin: Instant,
    base: Timestamp,
}

impl TokioClock {
    fn new() -> Self {
        Self {
            origin: Instant::now(),
            base: 1_767_225_600_000_000,
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.base + micros(self.origin.elapsed())
    }
}

type Backend = MemoryBackend<TokioClock>;

fn backend() -> Backend {
    MemoryBackend::with_clock(TokioClock::new())
}

fn config() -> AimdConfig {
    AimdConfig {
        initial_rate: 1.0,
        min_rate: 0.1,
        max_rate: 200.0,
        increase: 2.0,
        decrease: 0.75,
        reaction_window: Duration::from_millis(500),
        ..AimdConfig::default()
    }
}

fn limiter(config: AimdConfig, backend: Backend) -> AimdLimiter<Backend> {
    AimdLimiter::new("harvester", config, backend).unwrap()
}

/// The remote source: a token bucket of capacity 1 at a hidden rate that
/// the test may change, refusing with 429 above it.
#[derive(Debug)]
struct Remote {
    state: Mutex<(f64, Option<Instant>)>,
    retry_after: Option<Duration>,
    served: AtomicU64,
    refused: AtomicU64,
}

impl Remote {
    fn new(rate: f64) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new((rate, None)),
            retry_after: None,
            served: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        })
    }

    fn set_rate(&self, rate: f64) {
        self.state.lock().unwrap().0 = rate;
    }

    fn hit(&self) -> Outcome {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        let interval = Duration::from_secs_f64(1.0 / state.0);
        let tat = state.1.map_or(now, |t| t.max(now));
        if tat <= now {
            state.1 = Some(tat + interval);
            self.served.fetch_add(1, Ordering::SeqCst);
            Outcome::Success
        } else {
            self.refused.fetch_add(1, Ordering::SeqCst);
            Outcome::Refused {
                retry_after: self.retry_after,
            }
        }
    }
}

/// Runs `tasks` concurrent crawling loops of one worker until `until`:
/// take a token, spend 50 ms on the wire, report the answer.
fn crawl(
    limiter: &AimdLimiter<Backend>,
    remote: &Arc<Remote>,
    scope: &Key,
    tasks: usize,
    until: Instant,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..tasks)
        .map(|_| {
            let (limiter, remote, scope) = (limiter.clone(), Arc::clone(remote), scope.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    limiter.acquire(&scope).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let outcome = remote.hit();
                    limiter.feedback(&scope, outcome).await;
                }
            })
        })
        .collect()
}

/// Samples the shared rate every 100 ms until `until`.
fn sample(
    limiter: &AimdLimiter<Backend>,
    scope: &Key,
    until: Instant,
) -> tokio::task::JoinHandle<Vec<(f64, f64)>> {
    let (limiter, scope) = (limiter.clone(), scope.clone());
    tokio::spawn(async move {
        let start = Instant::now();
        let mut samples = Vec::new();
        while Instant::now() < until {
            let rate = limiter.shared_rate(&scope).await.unwrap();
            samples.push((start.elapsed().as_secs_f64(), rate));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        samples
    })
}

fn mean_between(samples: &[(f64, f64)], from: f64, to: f64) -> f64 {
    let window: Vec<f64> = samples
        .iter()
        .filter(|(t, _)| (from..to).contains(t))
        .map(|&(_, r)| r)
        .collect();
    assert!(!window.is_empty());
    window.iter().sum::<f64>() / window.len() as f64
}

async fn join(handles: Vec<tokio::task::JoinHandle<()>>) {
    for h in handles {
        h.await.unwrap();
    }
}

fn within(value: f64, target: f64, tolerance: f64) -> bool {
    (value - target).abs() <= tolerance * target
}

#[tokio::test(start_paused = true)]
async fn converges_to_the_hidden_rate() {
    let limiter = limiter(config(), backend());
    let remote = Remote::new(20.0);
    let scope = Key::new("example.org");
    let until = Instant::now() + Duration::from_secs(120);
    let sampler = sample(&limiter, &scope, until);
    join(crawl(&limiter, &remote, &scope, 4, until)).await;
    let samples = sampler.await.unwrap();

    // Past the ramp-up, the rate saws around the hidden rate.
    let mean = mean_between(&samples, 30.0, 120.0);
    assert!(within(mean, 20.0, 0.2), "mean rate {mean}");
    let peak = samples.iter().map(|&(_, r)| r).fold(0.0, f64::max);
    assert!(peak < 20.0 * 1.5, "peak rate {peak}");
    // The source served close to its limit, and refused a small share.
    let served = remote.served.load(Ordering::SeqCst) as f64;
    let refused = remote.refused.load(Ordering::SeqCst) as f64;
    assert!(served / 120.0 > 20.0 * 0.7, "served {served}");
    assert!(refused < served * 0.1, "served {served}, refused {refused}");
}

#[tokio::test(start_paused = true)]
async fn recovers_when_the_source_allows_more() {
    let limiter = limiter(config(), backend());
    let remote = Remote::new(10.0);
    let scope = Key::new("example.org");
    let start = Instant::now();
    let until = start + Duration::from_secs(120);
    let sampler = sample(&limiter, &scope, until);
    let crawlers = crawl(&limiter, &remote, &scope, 8, until);
    tokio::time::sleep_until(start + Duration::from_secs(60)).await;
    remote.set_rate(40.0);
    join(crawlers).await;
    let samples = sampler.await.unwrap();

    let before = mean_between(&samples, 30.0, 60.0);
    assert!(within(before, 10.0, 0.2), "rate before the rise {before}");
    let after = mean_between(&samples, 90.0, 120.0);
    assert!(within(after, 40.0, 0.2), "rate after the rise {after}");
}

#[tokio::test(start_paused = true)]
async fn two_workers_share_one_rate() {
    let backend = backend();
    let a = limiter(config(), backend.clone());
    let b = limiter(config(), backend);
    let remote = Remote::new(20.0);
    let scope = Key::new("example.org");
    let until = Instant::now() + Duration::from_secs(120);
    let sampler = sample(&a, &scope, until);
    let mut crawlers = crawl(&a, &remote, &scope, 3, until);
    crawlers.extend(crawl(&b, &remote, &scope, 3, until));
    join(crawlers).await;
    let samples = sampler.await.unwrap();

    // One shared bucket: together the workers converge on the source's
    // rate. Two independent limiters would each offer it, and half of
    // their requests would be refused.
    let mean = mean_between(&samples, 30.0, 120.0);
    assert!(within(mean, 20.0, 0.2), "mean rate {mean}");
    let served = remote.served.load(Ordering::SeqCst) as f64;
    let refused = remote.refused.load(Ordering::SeqCst) as f64;
    assert!(refused < served * 0.1, "served {served}, refused {refused}");
    // Each worker's view follows the shared rate.
    let shared = a.shared_rate(&scope).await.unwrap();
    b.acquire(&scope).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    b.acquire(&scope).await.unwrap();
    assert_eq!(b.rate(&scope), shared);
}

#[tokio::test(start_paused = true)]
async fn two_workers_spend_one_bucket() {
    let backend = backend();
    let config = AimdConfig {
        initial_rate: 10.0,
        ..config()
    };
    let a = limiter(config.clone(), backend.clone());
    let b = limiter(config, backend);
    let scope = Key::new("example.org");
    let granted = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(10);
    let handles: Vec<_> = [a, b]
        .into_iter()
        .map(|limiter| {
            let (scope, granted) = (scope.clone(), Arc::clone(&granted));
            tokio::spawn(async move {
                while Instant::now() < until {
                    assert!(!limiter.acquire(&scope).await.unwrap().is_local());
                    granted.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    join(handles).await;
    // 10 s at 10/s, plus the first token: the workers took turns.
    let granted = granted.load(Ordering::SeqCst);
    assert!((100..=102).contains(&granted), "granted {granted}");
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_refusals_cuts_once_per_window() {
    let backend = backend();
    let config = AimdConfig {
        initial_rate: 16.0,
        ..config()
    };
    let a = limiter(config.clone(), backend.clone());
    let b = limiter(config, backend);
    let scope = Key::new("example.org");

    // Ten in-flight requests, spread over two workers, refused together.
    let refused = Outcome::Refused { retry_after: None };
    let handles: Vec<_> = (0..10)
        .map(|i| {
            let (limiter, scope) = (
                if i % 2 == 0 { a.clone() } else { b.clone() },
                scope.clone(),
            );
            tokio::spawn(async move { limiter.feedback(&scope, refused).await })
        })
        .collect();
    join(handles).await;
    assert_eq!(a.shared_rate(&scope).await.unwrap(), 12.0);

    // Late refusals of the same burst, still within the window: no cut.
    tokio::time::sleep(Duration::from_millis(400)).await;
    b.feedback(&scope, refused).await;
    assert_eq!(a.shared_rate(&scope).await.unwrap(), 12.0);

    // A refusal in the next window is a new signal.
    tokio::time::sleep(Duration::from_millis(100)).await;
    b.feedback(&scope, refused).await;
    assert_eq!(a.shared_rate(&scope).await.unwrap(), 9.0);
    // No step up in the window after a cut, whoever succeeds.
    a.feedback(&scope, Outcome::Success).await;
    assert_eq!(a.shared_rate(&scope).await.unwrap(), 9.0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.feedback(&scope, Outcome::Success).await;
    assert_eq!(a.shared_rate(&scope).await.unwrap(), 11.0);
    // And one step up per window across workers.
    b.feedback(&scope, Outcome::Success).await;
    assert_eq!(a.shared_rate(&scope).await.unwrap(), 11.0);
    // Other failures say nothing about the rate.
    a.feedback(&scope, Outcome::Failed).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    b.feedback(&scope, Outcome::Failed).await;
    assert_eq!(a.shared_rate(&scope).await.unwrap(), 11.0);
}

#[tokio::test(start_paused = true)]
async fn rate_stays_within_bounds() {
    let config = AimdConfig {
        initial_rate: 2.0,
        min_rate: 1.0,
        max_rate: 5.0,
        ..config()
    };
    let limiter = limiter(config, backend());
    let scope = Key::new("example.org");
    for _ in 0..10 {
        limiter
            .feedback(&scope, Outcome::Refused { retry_after: None })
            .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(limiter.shared_rate(&scope).await.unwrap(), 1.0);
    for _ in 0..10 {
        limiter.feedback(&scope, Outcome::Success).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(limiter.shared_rate(&scope).await.unwrap(), 5.0);
}

#[tokio::test(start_paused = true)]
async fn retry_after_holds_the_scope_for_every_worker() {
    let backend = backend();
    let config = AimdConfig {
        initial_rate: 100.0,
        max_hold: Duration::from_secs(60),
        ..config()
    };
    let a = limiter(config.clone(), backend.clone());
    let b = limiter(config, backend);
    let scope = Key::new("example.org");
    let other = Key::new("example.com");
    a.acquire(&scope).await.unwrap();
    b.acquire(&scope).await.unwrap();

    a.feedback(
        &scope,
        Outcome::Refused {
            retry_after: Some(Duration::from_secs(5)),
        },
    )
    .await;
    let start = Instant::now();
    b.acquire(&scope).await.unwrap();
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(5), "b waited {waited:?}");
    assert!(waited < Duration::from_secs(6), "b waited {waited:?}");
    // Other scopes are not held.
    let start = Instant::now();
    b.acquire(&other).await.unwrap();
    assert!(start.elapsed() < Duration::from_secs(1));

    // An absurd Retry-After is capped at max_hold.
    b.feedback(
        &scope,
        Outcome::Refused {
            retry_after: Some(Duration::from_secs(86_400)),
        },
    )
    .await;
    let start = Instant::now();
    a.acquire(&scope).await.unwrap();
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(60), "a waited {waited:?}");
    assert!(waited < Duration::from_secs(61), "a waited {waited:?}");
}

#[tokio::test(start_paused = true)]
async fn fails_open_at_the_last_known_rate() {
    let backend = backend();
    let config = AimdConfig {
        initial_rate: 5.0,
        increase: 1.0,
        ..config()
    };
    let limiter = limiter(config, backend.clone());
    let scope = Key::new("example.org");
    // Healthy: a few steps up.
    for _ in 0..5 {
        assert!(!limiter.acquire(&scope).await.unwrap().is_local());
        limiter.feedback(&scope, Outcome::Success).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let known = limiter.shared_rate(&scope).await.unwrap();
    assert_eq!(known, 10.0);

    // The backend dies: requests keep flowing, from the local bucket, at
    // the last known rate, without ramping up.
    backend.set_failing(true);
    let start = Instant::now();
    let mut granted = 0;
    while start.elapsed() < Duration::from_secs(10) {
        let grant = limiter.acquire(&scope).await.unwrap();
        if start.elapsed() > Duration::from_secs(1) {
            assert!(grant.is_local());
        }
        granted += 1;
        limiter.feedback(&scope, Outcome::Success).await;
    }
    assert!(
        within(granted as f64, known * 10.0, 0.1),
        "granted {granted}"
    );
    assert_eq!(limiter.rate(&scope), known);

    // Refusals still cut (locally) and Retry-After still holds.
    limiter
        .feedback(
            &scope,
            Outcome::Refused {
                retry_after: Some(Duration::from_secs(3)),
            },
        )
        .await;
    assert_eq!(limiter.rate(&scope), known * 0.75);
    let start = Instant::now();
    limiter.acquire(&scope).await.unwrap();
    assert!(start.elapsed() >= Duration::from_secs(3));

    // The backend comes back: after the breaker's back-off, the shared
    // bucket decides again.
    backend.set_failing(false);
    tokio::time::sleep(Duration::from_secs(60)).await;
    limiter.acquire(&scope).await.unwrap();
    assert!(!limiter.acquire(&scope).await.unwrap().is_local());
}

#[tokio::test(start_paused = true)]
async fn an_idle_scope_forgets_its_rate() {
    let limiter = limiter(config(), backend());
    let scope = Key::new("example.org");
    limiter.acquire(&scope).await.unwrap();
    for _ in 0..3 {
        limiter.feedback(&scope, Outcome::Success).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(limiter.shared_rate(&scope).await.unwrap(), 7.0);

    // Still remembered after an hour of silence.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    limiter.acquire(&scope).await.unwrap();
    assert_eq!(limiter.rate(&scope), 7.0);
    // Forgotten after idle_expiry (6 h) without a request, by a fresh
    // worker as well as by this one.
    tokio::time::sleep(Duration::from_secs(6 * 3600)).await;
    let fresh = limiter_on(&limiter);
    fresh.acquire(&scope).await.unwrap();
    assert_eq!(fresh.rate(&scope), 1.0);
    assert_eq!(limiter.shared_rate(&scope).await.unwrap(), 1.0);
}

/// The adapted rate is an override that expires `idle_expiry` after its
/// last write, so the backend holds no key forever; a step at `max_rate`
/// renews it.
#[tokio::test(start_paused = true)]
async fn the_stored_rate_expires_after_idle_expiry() {
    use tollgate_limiter::{Backend as _, Scope};
    let config = AimdConfig {
        max_rate: 3.0,
        ..config()
    };
    let idle = config.idle_expiry;
    let limiter = limiter(config, backend());
    let scope = Key::new("example.org");
    let stored = |l: &AimdLimiter<Backend>| {
        let backend = l.backend().clone();
        let scope = scope.clone();
        async move {
            backend
                .get_override(Scope::Key("harvester", &scope))
                .await
                .unwrap()
        }
    };
    limiter.acquire(&scope).await.unwrap();
    limiter.feedback(&scope, Outcome::Success).await;
    assert_eq!(limiter.shared_rate(&scope).await.unwrap(), 3.0);
    // At max_rate, further successes rewrite the override, renewing it.
    tokio::time::sleep(idle / 2).await;
    limiter.feedback(&scope, Outcome::Success).await;
    tokio::time::sleep(idle - idle / 2).await;
    assert!(stored(&limiter).await.is_some(), "renewed at max_rate");
    tokio::time::sleep(idle / 2 - Duration::from_millis(1)).await;
    assert!(stored(&limiter).await.is_some());
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(stored(&limiter).await, None, "expired idle_expiry after");
    assert_eq!(limiter.shared_rate(&scope).await.unwrap(), 1.0);
    // A cut writes it with the same TTL.
    limiter
        .feedback(&scope, Outcome::Refused { retry_after: None })
        .await;
    assert!(stored(&limiter).await.is_some());
    tokio::time::sleep(idle).await;
    assert_eq!(stored(&limiter).await, None);
}

/// The memory backend, whose override reads fail while `fail_reads` is
/// set (every other call answers), and whose override reads and writes
/// take `override_delay` ms (as Redis round trips do; its decisions take
/// the memory backend's injected delay).
#[derive(Debug, Clone)]
struct FlakyReads {
    inner: Backend,
    fail_reads: Arc<std::sync::atomic::AtomicBool>,
    override_delay: Arc<AtomicU64>,
}

impl FlakyReads {
    fn new() -> Self {
        Self {
            inner: backend(),
            fail_reads: Arc::default(),
            override_delay: Arc::default(),
        }
    }

    /// Every call takes `delay`.
    fn set_delay(&self, delay: Duration) {
        self.inner.set_delay(delay);
        let ms = u64::try_from(delay.as_millis()).unwrap();
        self.override_delay.store(ms, Ordering::SeqCst);
    }

    async fn round_trip(&self) {
        let ms = self.override_delay.load(Ordering::SeqCst);
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}

impl tollgate_limiter::Backend for FlakyReads {
    type Error = tollgate_memory::MemoryError;

    fn decide(
        &self,
        req: tollgate_limiter::Request<'_>,
    ) -> impl Future<Output = Result<tollgate_limiter::Decision, Self::Error>> + Send {
        self.inner.decide(req)
    }

    fn set_override(
        &self,
        scope: tollgate_limiter::Scope<'_>,
        policy: Option<&tollgate_limiter::Policy>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.set_override(scope, policy)
    }

    async fn set_expiring_override(
        &self,
        scope: tollgate_limiter::Scope<'_>,
        policy: &tollgate_limiter::Policy,
        ttl: Duration,
    ) -> Result<(), Self::Error> {
        self.round_trip().await;
        self.inner.set_expiring_override(scope, policy, ttl).await
    }

    async fn replace_override(
        &self,
        scope: tollgate_limiter::Scope<'_>,
        current: Option<&tollgate_limiter::Policy>,
        policy: &tollgate_limiter::Policy,
        ttl: Duration,
    ) -> Result<bool, Self::Error> {
        self.round_trip().await;
        self.inner
            .replace_override(scope, current, policy, ttl)
            .await
    }

    async fn get_override(
        &self,
        scope: tollgate_limiter::Scope<'_>,
    ) -> Result<Option<tollgate_limiter::Policy>, Self::Error> {
        self.round_trip().await;
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(tollgate_memory::MemoryError::Injected);
        }
        self.inner.get_override(scope).await
    }
}

/// Three workers of one adaptive limiter (8 req/s, cuts halve it) on a
/// backend whose override reads fail on demand.
fn flaky_workers() -> (FlakyReads, [AimdLimiter<FlakyReads>; 3]) {
    let backend = FlakyReads::new();
    let config = AimdConfig {
        initial_rate: 8.0,
        decrease: 0.5,
        ..config()
    };
    let worker = || AimdLimiter::new("harvester", config.clone(), backend.clone()).unwrap();
    let workers = [worker(), worker(), worker()];
    (backend, workers)
}

/// A cut never raises the shared rate. When the stored rate could not be
/// read, a worker cut from the rate it last knew, which may be far above
/// the shared one (other workers cut it since), and wrote that: a refusal
/// from the source raised the rate every worker sends at (1 -> 4 req/s
/// below). It cuts its own rate only, as when the gate cannot be asked.
#[tokio::test(start_paused = true)]
async fn a_cut_whose_rate_read_fails_never_raises_the_shared_rate() {
    let (backend, [a, b, _]) = flaky_workers();
    let scope = Key::new("example.org");
    // b learns the rate, then a cuts it three times: 8 -> 1.
    b.acquire(&scope).await.unwrap();
    assert_eq!(b.rate(&scope), 8.0);
    for _ in 0..3 {
        a.feedback(&scope, Outcome::Refused { retry_after: None })
            .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(a.shared_rate(&scope).await.unwrap(), 1.0);
    // b is refused while the rate cannot be read.
    backend.fail_reads.store(true, Ordering::SeqCst);
    b.feedback(&scope, Outcome::Refused { retry_after: None })
        .await;
    backend.fail_reads.store(false, Ordering::SeqCst);
    let shared = a.shared_rate(&scope).await.unwrap();
    assert!(shared <= 1.0, "a cut raised the shared rate to {shared}");
    assert_eq!(b.rate(&scope), 4.0, "b cuts its own rate");
}

/// A cut whose read of the shared rate fails leaves the cut gate to the
/// fleet: it took the gate, so the next refusal of the window, seen by a
/// worker that can read, found it empty and the shared rate was not cut
/// at all (8 req/s below, for every worker, after a refusal).
#[tokio::test(start_paused = true)]
async fn a_cut_whose_rate_read_fails_leaves_the_gate_to_the_fleet() {
    let (backend, [a, b, c]) = flaky_workers();
    let scope = Key::new("example.org");
    a.acquire(&scope).await.unwrap();
    b.acquire(&scope).await.unwrap();
    // b is refused while the rate cannot be read: its own cut only.
    backend.fail_reads.store(true, Ordering::SeqCst);
    b.feedback(&scope, Outcome::Refused { retry_after: None })
        .await;
    backend.fail_reads.store(false, Ordering::SeqCst);
    assert_eq!(b.rate(&scope), 4.0, "b cuts its own rate");
    assert_eq!(a.shared_rate(&scope).await.unwrap(), 8.0);
    // a is refused in the same reaction window, and can read: it cuts the
    // shared rate.
    a.feedback(&scope, Outcome::Refused { retry_after: None })
        .await;
    assert_eq!(a.shared_rate(&scope).await.unwrap(), 4.0, "no shared cut");
    assert_eq!(a.rate(&scope), 4.0);
    // Still one cut per window: a third refusal in it changes nothing.
    c.feedback(&scope, Outcome::Refused { retry_after: None })
        .await;
    assert_eq!(
        a.shared_rate(&scope).await.unwrap(),
        4.0,
        "two cuts in a window"
    );
}

fn limiter_on(other: &AimdLimiter<Backend>) -> AimdLimiter<Backend> {
    limiter(other.config().clone(), other.backend().clone())
}

mod invariants {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone, Copy)]
    enum Step {
        Feedback { worker: usize, outcome: Outcome },
        Wait(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        let outcome = prop_oneof![
            Just(Outcome::Success),
            Just(Outcome::Failed),
            Just(Outcome::Refused { retry_after: None }),
            (0u64..3).prop_map(|s| Outcome::Refused {
                retry_after: Some(Duration::from_secs(s))
            }),
        ];
        prop_oneof![
            (0usize..2, outcome).prop_map(|(worker, outcome)| Step::Feedback { worker, outcome }),
            (1u64..1500).prop_map(Step::Wait),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever two workers report, the shared rate stays within its
        /// bounds, falls only on a refusal, at most once per reaction
        /// window, and rises only on a success, by one step, never within
        /// a window of a cut.
        #[test]
        fn cuts_and_steps_keep_their_rules(steps in prop::collection::vec(step(), 1..60)) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let backend = backend();
                let config = AimdConfig { initial_rate: 10.0, min_rate: 2.0, max_rate: 16.0, ..config() };
                let window = config.reaction_window;
                let workers = [limiter(config.clone(), backend.clone()), limiter(config.clone(), backend)];
                let scope = Key::new("example.org");
                let mut rate = workers[0].shared_rate(&scope).await.unwrap();
                let mut last_cut: Option<Instant> = None;
                for step in steps {
                    let (worker, outcome) = match step {
                        Step::Wait(ms) => {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            continue;
                        }
                        Step::Feedback { worker, outcome } => (worker, outcome),
                    };
                    workers[worker].feedback(&scope, outcome).await;
                    let now_rate = workers[0].shared_rate(&scope).await.unwrap();
                    prop_assert!((config.min_rate..=config.max_rate).contains(&now_rate));
                    if now_rate < rate {
                        prop_assert!(matches!(outcome, Outcome::Refused { .. }), "cut by {outcome:?}");
                        prop_assert!((now_rate - (rate * config.decrease).max(config.min_rate)).abs() < 0.001);
                        let now = Instant::now();
                        if let Some(t) = last_cut {
                            prop_assert!(now - t >= window, "two cuts {:?} apart", now - t);
                        }
                        last_cut = Some(now);
                    } else if now_rate > rate {
                        prop_assert_eq!(outcome, Outcome::Success);
                        prop_assert!((now_rate - (rate + config.increase).min(config.max_rate)).abs() < 0.001);
                        prop_assert!(last_cut.is_none_or(|t| Instant::now() - t >= window));
                    }
                    rate = now_rate;
                }
                Ok(())
            })?;
        }
    }
}

/// A refusal reported by a caller that gives up before the report is
/// done (a timeout or a `select!` around the crawl step, a shutdown) is
/// still reported whole: the cut happens. Before, the report stopped at
/// its first backend call, and the worker had already marked the window
/// as cut: the cut was lost, and this worker's next refusals of the
/// window were skipped too, so the scope kept its rate. (With Redis, the
/// report could stop between taking the fleet's cut gate and writing the
/// rate: the whole fleet then skipped that cut.)
#[tokio::test(start_paused = true)]
async fn a_refusal_reported_by_a_caller_that_gives_up_still_cuts() {
    let backend = backend();
    let config = AimdConfig {
        initial_rate: 16.0,
        ..config()
    };
    let limiter = limiter(config, backend.clone());
    let scope = Key::new("example.org");
    let refused = Outcome::Refused { retry_after: None };
    // Every backend call takes 10 ms: the report is given up during its
    // first one.
    backend.set_delay(Duration::from_millis(10));
    let gave_up =
        tokio::time::timeout(Duration::from_millis(5), limiter.feedback(&scope, refused)).await;
    assert!(
        gave_up.is_err(),
        "the report ended before the caller gave up"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    backend.clear_faults();
    // Another refusal of the same burst, reported in full.
    limiter.feedback(&scope, refused).await;
    assert_eq!(limiter.shared_rate(&scope).await.unwrap(), 12.0);
    assert_eq!(limiter.rate(&scope), 12.0);
}

/// A request given up during its refresh of the scope's rate (a timeout
/// or a `select!` around `acquire`) leaves the refresh due: the next
/// request makes it. Before, the scope was marked refreshed before the
/// backend was asked, so this worker went on at its old rate for a
/// reaction window, however far the fleet had cut it meanwhile.
#[tokio::test(start_paused = true)]
async fn a_refresh_given_up_by_its_caller_is_made_by_the_next_request() {
    let backend = backend();
    let config = AimdConfig {
        initial_rate: 16.0,
        ..config()
    };
    let worker = limiter(config, backend.clone());
    let other = limiter_on(&worker);
    let scope = Key::new("example.org");
    assert!(worker.try_acquire(&scope).await.is_ok());
    // A reaction window later, a refresh is due; the fleet has cut the
    // rate meanwhile.
    tokio::time::sleep(Duration::from_secs(1)).await;
    other
        .feedback(&scope, Outcome::Refused { retry_after: None })
        .await;
    assert_eq!(other.shared_rate(&scope).await.unwrap(), 12.0);
    // Every backend call takes 10 ms: the request is given up during its
    // refresh.
    backend.set_delay(Duration::from_millis(10));
    let gave_up = tokio::time::timeout(Duration::from_millis(5), worker.try_acquire(&scope)).await;
    assert!(
        gave_up.is_err(),
        "the request ended before its caller gave up"
    );
    backend.clear_faults();
    let _ = worker.try_acquire(&scope).await;
    assert_eq!(worker.rate(&scope), 12.0, "the refresh was skipped");
}

/// A scope waiting for the remote is in use, not idle. Held for
/// `max_hold` (a remote's `Retry-After: 1000000000000` is capped to it),
/// or waiting one request's interval at `min_rate`, it came back at
/// `initial_rate` when `idle_expiry` did not outlast the wait by a
/// reaction window, and such configurations were accepted:
/// `idle_expiry = max_hold` took a rate of 5.25 back to 1 after the hold,
/// and `min_rate` 0.005/s (a request per 200 s) with `idle_expiry` 120 s
/// took 0.005 back to 1 after each request. They are refused, naming the
/// field; with the shortest `idle_expiry` accepted, the rate survives
/// both waits.
#[tokio::test(start_paused = true)]
async fn a_scope_waiting_for_the_remote_keeps_its_rate() {
    let window = Duration::from_millis(500);
    let held = |idle_expiry| AimdConfig {
        max_hold: Duration::from_secs(600),
        idle_expiry,
        ..config()
    };
    let slow = |idle_expiry| AimdConfig {
        min_rate: 0.005,
        decrease: 0.5,
        max_hold: Duration::from_secs(60),
        idle_expiry,
        ..config()
    };
    for bad in [
        held(Duration::from_secs(600)),
        held(Duration::from_secs(600) + window),
        slow(Duration::from_secs(120)),
        slow(Duration::from_secs(200) + window),
    ] {
        let e = AimdLimiter::new("harvester", bad.clone(), backend())
            .map(|_| "accepted".to_owned())
            .unwrap_or_else(|e| e.to_string());
        assert!(e.contains("adaptive.harvester.idle_expiry"), "{bad:?}: {e}");
    }
    let just = Duration::from_millis(1);
    let scope = Key::new("example.org");

    // Held for max_hold by an absurd Retry-After.
    let worker = limiter(held(Duration::from_secs(600) + window + just), backend());
    worker.acquire(&scope).await.unwrap();
    for _ in 0..3 {
        worker.feedback(&scope, Outcome::Success).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    worker.acquire(&scope).await.unwrap();
    let forever = Some(Duration::from_secs(1_000_000_000_000));
    worker
        .feedback(
            &scope,
            Outcome::Refused {
                retry_after: forever,
            },
        )
        .await;
    assert_eq!(worker.rate(&scope), 5.25);
    let start = Instant::now();
    worker.acquire(&scope).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(600));
    assert_eq!(worker.rate(&scope), 5.25);
    assert_eq!(worker.shared_rate(&scope).await.unwrap(), 5.25);

    // Cut to min_rate by a source that refuses every request, then
    // waiting a request's interval.
    let slow_worker = limiter(slow(Duration::from_secs(200) + window + just), backend());
    let refused = Outcome::Refused { retry_after: None };
    slow_worker.acquire(&scope).await.unwrap();
    for _ in 0..10 {
        slow_worker.feedback(&scope, refused).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(slow_worker.rate(&scope), 0.005);
    slow_worker.acquire(&scope).await.unwrap();
    slow_worker.feedback(&scope, refused).await;
    let start = Instant::now();
    slow_worker.acquire(&scope).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(200));
    assert_eq!(slow_worker.rate(&scope), 0.005);
    assert_eq!(slow_worker.shared_rate(&scope).await.unwrap(), 0.005);
}

/// A refusal and a success reported together by one worker (two in-flight
/// requests answered at once: the source's first 429 beside a 200) cut
/// the rate; the step up does not undo the cut. Before, the step read the
/// rate while the cut was under way and wrote its step after the cut:
/// with every backend call a 10 ms round trip, 16 req/s went to 18 on a
/// refusal, and the cut gate, taken, kept the fleet from cutting again for
/// the window. (Across workers the race remains, as documented.)
#[tokio::test(start_paused = true)]
async fn a_step_up_beside_a_cut_in_one_worker_does_not_undo_it() {
    let backend = FlakyReads::new();
    let config = AimdConfig {
        initial_rate: 16.0,
        ..config()
    };
    let worker = AimdLimiter::new("harvester", config, backend.clone()).unwrap();
    let scope = Key::new("example.org");
    worker.acquire(&scope).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    backend.set_delay(Duration::from_millis(10));
    let report = |outcome| {
        let (worker, scope) = (worker.clone(), scope.clone());
        tokio::spawn(async move { worker.feedback(&scope, outcome).await })
    };
    let cut = report(Outcome::Refused { retry_after: None });
    // The success arrives while the cut asks its gate.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let step = report(Outcome::Success);
    cut.await.unwrap();
    step.await.unwrap();
    assert_eq!(worker.shared_rate(&scope).await.unwrap(), 12.0);
    assert_eq!(worker.rate(&scope), 12.0);
}

/// A step up on one worker never undoes a cut made on another. The step
/// read the shared rate, the other worker's cut wrote its cut, and the
/// step wrote its own over it: with every backend call a 10 ms round
/// trip, a refusal took 16 req/s to 18 (and the cut gate, taken, kept the
/// fleet from cutting again for the window). A step now applies only if
/// the rate is still the one it read.
#[tokio::test(start_paused = true)]
async fn a_step_up_on_one_worker_does_not_undo_a_cut_on_another() {
    let backend = FlakyReads::new();
    let config = AimdConfig {
        initial_rate: 16.0,
        ..config()
    };
    let stepper = AimdLimiter::new("harvester", config.clone(), backend.clone()).unwrap();
    let cutter = AimdLimiter::new("harvester", config, backend.clone()).unwrap();
    let scope = Key::new("example.org");
    stepper.acquire(&scope).await.unwrap();
    cutter.acquire(&scope).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    backend.set_delay(Duration::from_millis(10));
    let report = |worker: &AimdLimiter<FlakyReads>, outcome| {
        let (worker, scope) = (worker.clone(), scope.clone());
        tokio::spawn(async move { worker.feedback(&scope, outcome).await })
    };
    // The cut looks at its gate (done at 10 ms), reads the rate (20 ms),
    // takes the gate (30 ms) and writes 12 (40 ms); the step takes its
    // gate (18 ms), finds the cut gate still open (28 ms), reads 16
    // (38 ms) and writes after the cut (48 ms).
    let cut = report(&cutter, Outcome::Refused { retry_after: None });
    tokio::time::sleep(Duration::from_millis(8)).await;
    let step = report(&stepper, Outcome::Success);
    cut.await.unwrap();
    step.await.unwrap();
    backend.set_delay(Duration::ZERO);
    assert_eq!(stepper.shared_rate(&scope).await.unwrap(), 12.0);
    assert_eq!(cutter.rate(&scope), 12.0);
}

/// A cut is made from the rate in force. A step up on another worker
/// that read the rate before the cut and wrote it after the cut's read
/// (16 -> 18 below) is cut in turn: the cut's write, made only over the
/// rate it read, finds the step, reads again and cuts 18 to 13.5, where a
/// plain write would have set 12 from a rate no longer in force.
#[tokio::test(start_paused = true)]
async fn a_cut_racing_a_step_up_on_another_worker_cuts_the_rate_in_force() {
    let backend = FlakyReads::new();
    let config = AimdConfig {
        initial_rate: 16.0,
        ..config()
    };
    let stepper = AimdLimiter::new("harvester", config.clone(), backend.clone()).unwrap();
    let cutter = AimdLimiter::new("harvester", config, backend.clone()).unwrap();
    let scope = Key::new("example.org");
    stepper.acquire(&scope).await.unwrap();
    cutter.acquire(&scope).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    backend.set_delay(Duration::from_millis(10));
    let report = |worker: &AimdLimiter<FlakyReads>, outcome| {
        let (worker, scope) = (worker.clone(), scope.clone());
        tokio::spawn(async move { worker.feedback(&scope, outcome).await })
    };
    // The step takes its gate (10 ms), finds the cut gate open (20 ms),
    // reads 16 (30 ms) and writes 18 (40 ms); the cut looks at its gate
    // (15 ms), reads 16 (25 ms), takes the gate (35 ms), finds 18 in
    // place of 16 (45 ms), reads it (55 ms) and writes its cut (65 ms).
    let step = report(&stepper, Outcome::Success);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let cut = report(&cutter, Outcome::Refused { retry_after: None });
    step.await.unwrap();
    cut.await.unwrap();
    backend.set_delay(Duration::ZERO);
    assert_eq!(stepper.shared_rate(&scope).await.unwrap(), 13.5);
    assert_eq!(cutter.rate(&scope), 13.5);
}

/// The rate stored for a scope obeys the settings in force. Lowering
/// `max_rate` (a source complained; the crawler is redeployed) left each
/// scope's stored rate where the old settings had taken it, and the
/// shared bucket spends at the stored rate: the scope went on at 52 req/s
/// under `max_rate = 10` (while `rate()` said 10) until a success stepped
/// it, and a scope bringing no signal (only failures) kept it for
/// `idle_expiry`. A refresh finds it out of bounds and writes it back
/// within them; a stored rate within bounds is left alone.
#[tokio::test(start_paused = true)]
async fn a_stored_rate_outside_the_settings_in_force_is_brought_within_them() {
    use tollgate_limiter::{Backend as _, Scope};
    let backend = backend();
    let old = AimdConfig {
        initial_rate: 50.0,
        ..config()
    };
    let before = limiter(old, backend.clone());
    let scope = Key::new("example.org");
    before.acquire(&scope).await.unwrap();
    before.feedback(&scope, Outcome::Success).await;
    assert_eq!(before.shared_rate(&scope).await.unwrap(), 52.0);

    let lowered = AimdConfig {
        initial_rate: 5.0,
        max_rate: 10.0,
        ..config()
    };
    let after = limiter(lowered, backend.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let start = Instant::now();
    let mut granted = 0;
    while start.elapsed() < Duration::from_secs(2) {
        after.acquire(&scope).await.unwrap();
        granted += 1;
        // No signal: the source's answers are 5xx.
        after.feedback(&scope, Outcome::Failed).await;
    }
    assert!(granted <= 21, "{granted} grants in 2 s at max_rate 10/s");
    let stored = backend
        .get_override(Scope::Key("harvester", &scope))
        .await
        .unwrap();
    let Some(tollgate_limiter::Policy::TokenBucket(stored)) = stored else {
        panic!("stored {stored:?}");
    };
    assert_eq!(stored.refill() as f64 / stored.period().as_secs_f64(), 10.0);
    assert_eq!(after.rate(&scope), 10.0);
}

/// The rate stored for the shared bucket, in requests per second.
async fn stored_rate(limiter: &AimdLimiter<Backend>, scope: &Key) -> Option<f64> {
    use tollgate_limiter::{Backend as _, Scope};
    let stored = limiter
        .backend()
        .get_override(Scope::Key(limiter.name(), scope))
        .await
        .unwrap();
    match stored {
        Some(tollgate_limiter::Policy::TokenBucket(tb)) => {
            Some(tb.refill() as f64 / tb.period().as_secs_f64())
        }
        _ => None,
    }
}

/// Rates are stored to 0.001 request/s, rounded to the nearest: a
/// `max_rate` between two steps was stored as the step above it, and the
/// shared bucket spent faster than the ceiling (`max_rate` 0.0015/s
/// stored as 0.002/s, a third more; `7/h` as 7.2/h), and a `min_rate`
/// between two steps below it. A stored rate is rounded into the bounds;
/// where no step lies between them, the ceiling wins.
#[tokio::test(start_paused = true)]
async fn a_stored_rate_is_rounded_into_the_bounds() {
    let scope = Key::new("example.org");
    let settings = AimdConfig {
        initial_rate: 0.001,
        min_rate: 0.001,
        max_rate: 0.0015,
        increase: 0.001,
        ..config()
    };
    let worker = limiter(settings, backend());
    worker.acquire(&scope).await.unwrap();
    worker.feedback(&scope, Outcome::Success).await;
    let stored = stored_rate(&worker, &scope).await;
    assert!(stored.is_some_and(|r| r <= 0.0015), "stored {stored:?}");

    let settings = AimdConfig {
        initial_rate: 0.0025,
        min_rate: 0.0015,
        max_rate: 0.003,
        decrease: 0.5,
        ..config()
    };
    let worker = limiter(settings, backend());
    worker.acquire(&scope).await.unwrap();
    worker
        .feedback(&scope, Outcome::Refused { retry_after: None })
        .await;
    let stored = stored_rate(&worker, &scope).await;
    assert!(stored.is_some_and(|r| r >= 0.0015), "stored {stored:?}");

    // No step between min_rate and max_rate: never above the ceiling.
    let settings = AimdConfig {
        initial_rate: 0.0015,
        min_rate: 0.0015,
        max_rate: 0.0015,
        ..config()
    };
    let worker = limiter(settings, backend());
    worker.acquire(&scope).await.unwrap();
    worker
        .feedback(&scope, Outcome::Refused { retry_after: None })
        .await;
    let stored = stored_rate(&worker, &scope).await;
    assert!(stored.is_some_and(|r| r <= 0.0015), "stored {stored:?}");
}

/// A request waiting for its token holds up no other request of its
/// scope while its caller is busy elsewhere. Waiters queued on a lock
/// held through the whole wait: a request polled once, then parked in a
/// `select!` whose other branch awaits a request of the same scope (a
/// crawler's loop: a page in flight, a timer that fetches another), kept
/// the lock while nobody polled it, and both waited for ever (a 30 s
/// bound elapsed on paused time; the first token was 1 s away).
#[tokio::test(start_paused = true)]
async fn a_parked_request_holds_up_no_other_of_its_scope() {
    let settings = AimdConfig {
        initial_rate: 1.0,
        ..config()
    };
    let limiter = limiter(settings, backend());
    let scope = Key::new("example.org");
    // The token is spent: the next one is a second away.
    limiter.acquire(&scope).await.unwrap();
    let mut parked = Box::pin(limiter.acquire(&scope));
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.tick().await;
    let start = Instant::now();
    let other = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            tokio::select! {
                _ = &mut parked => {}
                _ = tick.tick() => {
                    // Another request of the scope, awaited in the branch:
                    // `parked` is not polled meanwhile.
                    limiter.acquire(&scope).await.unwrap();
                    return start.elapsed();
                }
            }
        }
    })
    .await;
    let waited = other.expect("the other request waited for ever");
    // It waited for a token (the parked request's, given up by nobody,
    // or the next), not for the parked request's caller.
    assert!(waited <= Duration::from_secs(2), "waited {waited:?}");
    // The parked request is served in turn once polled again.
    tokio::time::timeout(Duration::from_secs(5), parked)
        .await
        .expect("the parked request is served")
        .unwrap();
}

/// Waiters of a scope are served in the order they came; one that gives
/// up is passed over, its place and tokens going to those behind it, and
/// the queue, once empty, leaves nothing behind.
#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_turn_and_one_that_gives_up_is_passed_over() {
    let settings = AimdConfig {
        initial_rate: 1.0,
        ..config()
    };
    let limiter = limiter(settings, backend());
    let scope = Key::new("example.org");
    limiter.acquire(&scope).await.unwrap();
    let start = Instant::now();
    let served = Arc::new(Mutex::new(Vec::new()));
    let waiter = |name: &'static str| {
        let (limiter, scope, served) = (limiter.clone(), scope.clone(), Arc::clone(&served));
        tokio::spawn(async move {
            limiter.acquire(&scope).await.unwrap();
            served.lock().unwrap().push((name, start.elapsed()));
        })
    };
    let a = waiter("a");
    tokio::time::sleep(Duration::from_millis(10)).await;
    let gives_up = waiter("gives up");
    tokio::time::sleep(Duration::from_millis(10)).await;
    let c = waiter("c");
    tokio::time::sleep(Duration::from_millis(10)).await;
    gives_up.abort();
    a.await.unwrap();
    c.await.unwrap();
    let served = served.lock().unwrap().clone();
    let names: Vec<_> = served.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, ["a", "c"]);
    // One token a second: c is served a second after a, not two.
    assert_eq!(served[1].1 - served[0].1, Duration::from_secs(1));
    // The queue is gone: a request a while later is served at once.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let start = Instant::now();
    limiter.acquire(&scope).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// `forget` while requests of the scope wait in its queue keeps the
/// queue: a request made after it waits behind them. It dropped the
/// worker's record of the queue's pacer, so the next request started a
/// second one beside it; with the backend down, that request was served
/// at once from the fresh fallback bucket, before the two that had waited
/// since (served: c, a, b).
#[tokio::test(start_paused = true)]
async fn forget_keeps_the_queue_of_waiting_requests() {
    let backend = backend();
    let settings = AimdConfig {
        initial_rate: 1.0,
        ..config()
    };
    let limiter = limiter(settings, backend.clone());
    let scope = Key::new("example.org");
    backend.set_failing(true);
    // From the fallback bucket: the next token is a second away.
    assert!(limiter.acquire(&scope).await.unwrap().is_local());
    let served = Arc::new(Mutex::new(Vec::new()));
    let waiter = |name: &'static str| {
        let (limiter, scope, served) = (limiter.clone(), scope.clone(), Arc::clone(&served));
        tokio::spawn(async move {
            limiter.acquire(&scope).await.unwrap();
            served.lock().unwrap().push(name);
        })
    };
    let a = waiter("a");
    tokio::time::sleep(Duration::from_millis(10)).await;
    let b = waiter("b");
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The backend is down: only this worker's state is forgotten.
    assert!(limiter.forget(&scope).await.is_err());
    let c = waiter("c");
    for waiter in [a, b, c] {
        waiter.await.unwrap();
    }
    assert_eq!(*served.lock().unwrap(), ["a", "b", "c"]);
}

/// A request is never queued to a pacer that runs on another runtime,
/// which may not be driven while it waits. Two threads, each with a
/// current-thread runtime (a sync program calling `block_on` per request),
/// share the limiter: the second thread's request joined the queue of the
/// pacer the first thread's wait had started; once the first request was
/// served, its thread went on with other work, its runtime left alone, and
/// the second request was served by nobody (a 3 s bound elapsed; its token
/// was 0.5 s away).
#[test]
fn a_request_is_served_while_another_runtime_sleeps() {
    let settings = AimdConfig {
        initial_rate: 4.0,
        burst: 1,
        ..config()
    };
    let limiter = limiter(settings, backend());
    let scope = Key::new("example.org");
    let current = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let (queued, wait_queued) = std::sync::mpsc::channel();
    let first = {
        let (limiter, scope) = (limiter.clone(), scope.clone());
        std::thread::spawn(move || {
            let runtime = current();
            runtime.block_on(async {
                limiter.acquire(&scope).await.unwrap();
                queued.send(()).unwrap();
                // Waits for the next token, on a pacer of this runtime.
                limiter.acquire(&scope).await.unwrap();
            });
            // Other work, the runtime kept but not driven.
            std::thread::sleep(Duration::from_secs(4));
        })
    };
    wait_queued.recv().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let start = std::time::Instant::now();
    let second = current().block_on(async {
        tokio::time::timeout(Duration::from_secs(3), limiter.acquire(&scope))
            .await
            .unwrap()
    });
    let waited = start.elapsed();
    first.join().unwrap();
    assert!(second.is_ok(), "not served within 3 s");
    assert!(waited < Duration::from_secs(2), "waited {waited:?}");
}

/// Polls `future` to completion on this thread, outside any tokio runtime
/// (as a program driven by another executor does).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}

/// Outside a tokio runtime, `acquire` cannot wait for a token (a wait
/// runs on tokio's timers): it answers an error the caller can match, not
/// a panic. It panicked ("there is no reactor running") as soon as a
/// request had to wait: the second of a scope at 1 req/s.
#[test]
fn acquire_outside_a_runtime_is_an_error_not_a_panic() {
    let settings = AimdConfig {
        initial_rate: 1.0,
        ..config()
    };
    let limiter = AimdLimiter::new("harvester", settings, MemoryBackend::new()).unwrap();
    let scope = Key::new("example.org");
    let answers = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        [
            block_on(limiter.acquire(&scope)),
            block_on(limiter.acquire(&scope)),
        ]
    }));
    assert!(answers.is_ok(), "acquire panicked outside a runtime");
    for answer in answers.unwrap() {
        assert_eq!(answer, Err(AcquireError::NoRuntime));
    }
    // try_acquire never waits: with an in-process backend it answers here.
    assert!(block_on(limiter.try_acquire(&scope)).is_ok());
    assert!(block_on(limiter.try_acquire(&scope)).is_err());
    let e = AcquireError::NoRuntime.to_string();
    assert!(e.contains("outside a tokio runtime"), "{e}");
}
