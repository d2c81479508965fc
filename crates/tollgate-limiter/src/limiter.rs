//! The `Limiter`: one named limit, its policy, and what to do when the
//! backend fails.

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::Mutex;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, Request, Scope};
use crate::breaker::{Admit, Breaker, BreakerConfig};
use crate::decision::Decision;
use crate::deny_cache::DenyCache;
use crate::error::Error;
use crate::key::Key;
use crate::lease::Leases;
use crate::model::Op;
use crate::policy::{Policy, PolicyError};

/// What a limiter answers when its backend cannot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum FailMode {
    /// Refuse the request (the default): the limit is a security control.
    #[default]
    Closed,
    /// Let the request pass: the limit is only a rate optimisation.
    Open,
}

impl FromStr for FailMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "closed" => Ok(Self::Closed),
            "open" => Ok(Self::Open),
            other => Err(format!("expected \"open\" or \"closed\", found {other:?}")),
        }
    }
}

impl fmt::Display for FailMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Closed => "closed",
            Self::Open => "open",
        })
    }
}

/// The default per-decision timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// The outcome of asking a [`Limiter`].
#[derive(Debug)]
#[must_use]
pub enum Verdict {
    /// The backend decided.
    Decided(Decision),
    /// The backend failed and the limiter is fail-open: the request passes.
    FailedOpen(Error),
    /// The backend failed and the limiter is fail-closed: the request is
    /// refused; retry after the given (short) delay.
    FailedClosed(Error, Duration),
}

impl Verdict {
    /// Whether the request may pass.
    pub fn is_allowed(&self) -> bool {
        match self {
            Self::Decided(d) => d.is_allowed(),
            Self::FailedOpen(_) => true,
            Self::FailedClosed(..) => false,
        }
    }

    /// The backend's decision, if it made one.
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Self::Decided(d) => Some(d),
            _ => None,
        }
    }

    /// The backend failure, if any.
    pub fn error(&self) -> Option<&Error> {
        match self {
            Self::Decided(_) => None,
            Self::FailedOpen(e) | Self::FailedClosed(e, _) => Some(e),
        }
    }

    /// The verdict as a `Result`, the form internal consumers use:
    /// `Ok` carries the decision (`None` when a fail-open limiter let the
    /// request through without one), `Err` a typed [`Denied`].
    pub fn into_result(self) -> Result<Option<Decision>, Denied> {
        match self {
            Self::Decided(d) if d.is_allowed() => Ok(Some(d)),
            Self::Decided(d) => Err(Denied {
                retry_after: d.retry_after(),
                decision: Some(d),
                error: None,
            }),
            Self::FailedOpen(_) => Ok(None),
            Self::FailedClosed(e, retry_after) => Err(Denied {
                retry_after,
                decision: None,
                error: Some(e),
            }),
        }
    }
}

/// A refusal, as an error value for internal consumers: the signal to slow
/// down.
#[derive(Debug, thiserror::Error)]
#[error("rate limited; retry after {retry_after:?}")]
pub struct Denied {
    /// How long to wait before trying again.
    pub retry_after: Duration,
    /// The backend's decision; `None` when the refusal comes from a
    /// fail-closed limiter whose backend failed.
    pub decision: Option<Decision>,
    /// The backend failure behind a fail-closed refusal.
    #[source]
    pub error: Option<Error>,
}

/// Builds a [`Limiter`].
#[derive(Debug)]
#[must_use]
pub struct LimiterBuilder<B> {
    name: String,
    policy: Policy,
    backend: B,
    fail_mode: FailMode,
    timeout: Duration,
    breaker: BreakerConfig,
    local_denials: Option<Duration>,
    lease: Option<(u64, Duration)>,
}

impl<B: Backend> LimiterBuilder<B> {
    /// Answers repeated requests on a key that is over its limit locally,
    /// without a round trip, until the refusal's retry-after (at most
    /// `max_ttl`): a flood on one key does not become a backend storm.
    ///
    /// Only refusals the backend would repeat are cached (never those of a
    /// sliding window that penalises refusals). `max_ttl` bounds how long
    /// this worker may miss a reset or an override made by another worker;
    /// its own [`Limiter::reset`] and [`Limiter::set_override`] take effect
    /// at once. Off by default.
    pub fn local_denials(mut self, max_ttl: Duration) -> Self {
        self.local_denials = Some(max_ttl);
        self
    }

    /// Lease mode, for fail-open consumers that trade exactness for
    /// throughput (API keys, a crawler): a request that finds no local
    /// units takes `batch` units from the backend in one round trip and
    /// keeps the rest for this key's next requests, for at most `ttl`.
    ///
    /// Near the limit, when a whole batch no longer fits, the request asks
    /// for its own cost only, so no more is admitted than the backend
    /// grants. The costs: units leased and not spent within `ttl` are lost
    /// to every worker, and under a sliding window a leased unit is counted
    /// when leased, not when spent (up to `batch - 1` units per worker admitted
    /// after the window would have refused them). Off by default; ignored
    /// for progressive delays.
    pub fn lease(mut self, batch: u64, ttl: Duration) -> Self {
        self.lease = (batch > 1).then_some((batch, ttl));
        self
    }

    /// What to answer when the backend fails (default: closed).
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.fail_mode = mode;
        self
    }

    /// How long one decision may take before it counts as a failure
    /// (default: 50 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Circuit-breaker settings.
    pub fn breaker(mut self, breaker: BreakerConfig) -> Self {
        self.breaker = breaker;
        self
    }

    /// The limiter.
    pub fn build(self) -> Limiter<B> {
        Limiter {
            inner: Arc::new(Inner {
                name: self.name,
                policy: self.policy,
                backend: self.backend,
                fail_mode: self.fail_mode,
                timeout: self.timeout,
                breaker: Breaker::new(self.breaker),
                log: LogThrottle::new(Duration::from_secs(10)),
                denials: self.local_denials.map(DenyCache::new),
                leases: self.lease.filter(|_| self.policy.max_cost().is_some()).map(
                    |(batch, ttl)| {
                        // A batch above what the policy can ever grant
                        // would never be granted.
                        let batch = batch.min(self.policy.max_cost().unwrap_or(batch));
                        Leases::new(batch, ttl)
                    },
                ),
            }),
        }
    }
}

/// One named limit over a backend.
///
/// A limiter is cheap to clone; clones share the breaker and the backend.
/// Every decision is one backend round trip, bounded by a timeout, behind a
/// circuit breaker; when the backend fails, the [`FailMode`] decides.
///
/// # Examples
///
/// ```
/// # async fn example<B: tollgate_limiter::Backend>(backend: B) {
/// use std::time::Duration;
/// use tollgate_limiter::{FailMode, Key, Limiter, TokenBucket};
///
/// let limiter = Limiter::builder(
///     "api",
///     TokenBucket::new(100, 60, Duration::from_secs(60)).unwrap(),
///     backend,
/// )
/// .fail_mode(FailMode::Open)
/// .build();
///
/// let verdict = limiter.check(&Key::new("account-123")).await;
/// if !verdict.is_allowed() {
///     // answer 429
/// }
/// # }
/// ```
pub struct Limiter<B> {
    inner: Arc<Inner<B>>,
}

struct Inner<B> {
    name: String,
    policy: Policy,
    backend: B,
    fail_mode: FailMode,
    timeout: Duration,
    breaker: Breaker,
    log: LogThrottle,
    denials: Option<DenyCache>,
    leases: Option<Leases>,
}

impl<B> Clone for Limiter<B> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<B> fmt::Debug for Limiter<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("name", &self.inner.name)
            .field("policy", &self.inner.policy)
            .field("fail_mode", &self.inner.fail_mode)
            .field("timeout", &self.inner.timeout)
            .field("backend", &std::any::type_name::<B>())
            .finish()
    }
}

impl<B: Backend> Limiter<B> {
    /// Starts building a limiter named `name` (the namespace of its keys).
    pub fn builder(
        name: impl Into<String>,
        policy: impl Into<Policy>,
        backend: B,
    ) -> LimiterBuilder<B> {
        LimiterBuilder {
            name: name.into(),
            policy: policy.into(),
            backend,
            fail_mode: FailMode::default(),
            timeout: DEFAULT_TIMEOUT,
            breaker: BreakerConfig::default(),
            local_denials: None,
            lease: None,
        }
    }

    /// A fail-closed limiter with the default timeout and breaker.
    pub fn new(name: impl Into<String>, policy: impl Into<Policy>, backend: B) -> Self {
        Self::builder(name, policy, backend).build()
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The configured policy (a runtime override may be in force).
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// The fail mode.
    pub fn fail_mode(&self) -> FailMode {
        self.inner.fail_mode
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// Asks for one unit for `key`.
    pub async fn check(&self, key: &Key) -> Verdict {
        self.check_cost(key, 1).await
    }

    /// Asks for `cost` units for `key` (for a progressive delay: records
    /// `cost` failures; 0 only checks).
    ///
    /// A cost the policy can never grant is refused without asking the
    /// backend, whatever the fail mode.
    pub async fn check_cost(&self, key: &Key, cost: u64) -> Verdict {
        let cache = self
            .inner
            .denials
            .as_ref()
            .filter(|_| DenyCache::applies(&self.inner.policy, cost));
        if let Some(denied) = cache.and_then(|c| c.get(key, cost)) {
            return Verdict::Decided(denied);
        }
        let result = match &self.inner.leases {
            Some(leases) if cost > 0 => self.leased(leases, key, cost).await,
            _ => self.try_op(key, Op::Acquire(cost)).await,
        };
        if let (Some(cache), Ok(d)) = (cache, &result)
            && d.is_denied()
        {
            cache.insert(key, cost, d);
        }
        self.settle(result)
    }

    /// One request under lease mode.
    async fn leased(&self, leases: &Leases, key: &Key, cost: u64) -> Result<Decision, Error> {
        if let Some(d) = leases.spend(key, cost) {
            return Ok(d);
        }
        if leases.batch > cost {
            let d = self.try_op(key, Op::Acquire(leases.batch)).await?;
            if d.is_allowed() {
                leases.keep(key, leases.batch - cost, &d);
                return Ok(d);
            }
        }
        // Near the limit: ask for exactly this request's cost.
        self.try_op(key, Op::Acquire(cost)).await
    }

    /// Reports whether one unit is available, consuming nothing.
    pub async fn peek(&self, key: &Key) -> Verdict {
        self.check_cost(key, 0).await
    }

    /// Forgets `key`: it becomes a fresh key (unblocks a user after a false
    /// positive; a successful login for a progressive delay).
    pub async fn reset(&self, key: &Key) -> Result<Decision, Error> {
        if let Some(cache) = &self.inner.denials {
            cache.forget(key);
        }
        if let Some(leases) = &self.inner.leases {
            leases.forget(key);
        }
        self.try_op(key, Op::Reset).await
    }

    /// Asks the backend, with timeout and breaker but without applying the
    /// fail mode.
    pub async fn try_acquire(&self, key: &Key, cost: u64) -> Result<Decision, Error> {
        self.try_op(key, Op::Acquire(cost)).await
    }

    /// Sets (`Some`) or clears (`None`) a runtime override of this
    /// limiter's policy, for one key or (`key = None`) for all of them.
    /// Every worker sharing the backend sees it on its next decision.
    ///
    /// The override must use the limiter's strategy.
    pub async fn set_override(
        &self,
        key: Option<&Key>,
        policy: Option<Policy>,
    ) -> Result<(), Error> {
        if let Some(p) = &policy
            && p.strategy() != self.inner.policy.strategy()
        {
            return Err(Error::Policy(PolicyError::new(
                "strategy",
                format!(
                    "an override of limiter {:?} must be a {}, not a {}",
                    self.inner.name,
                    self.inner.policy.strategy(),
                    p.strategy()
                ),
            )));
        }
        let scope = self.scope(key);
        let result = self
            .guard(|| self.inner.backend.set_override(scope, policy.as_ref()))
            .await;
        // Cached refusals were decided under the old policy.
        if let Some(cache) = &self.inner.denials {
            match key {
                Some(k) => cache.forget(k),
                None => cache.clear(),
            }
        }
        if let Some(leases) = &self.inner.leases {
            match key {
                Some(k) => leases.forget(k),
                None => leases.clear(),
            }
        }
        result
    }

    /// The override in force for exactly this key (or, with `None`, the
    /// limiter-wide one).
    pub async fn get_override(&self, key: Option<&Key>) -> Result<Option<Policy>, Error> {
        let scope = self.scope(key);
        self.guard(|| self.inner.backend.get_override(scope)).await
    }

    fn scope<'a>(&'a self, key: Option<&'a Key>) -> Scope<'a> {
        match key {
            Some(k) => Scope::Key(&self.inner.name, k),
            None => Scope::Limiter(&self.inner.name),
        }
    }

    async fn try_op(&self, key: &Key, op: Op) -> Result<Decision, Error> {
        if let Op::Acquire(cost) = op {
            self.inner.policy.check_cost(cost)?;
        }
        self.guard(|| {
            self.inner.backend.decide(Request {
                limiter: &self.inner.name,
                key,
                policy: &self.inner.policy,
                op,
            })
        })
        .await
    }

    /// Runs one backend call under the timeout and the breaker. The call is
    /// made only once the breaker admits it: a backend may start its work
    /// when the future is created.
    async fn guard<T, F, Fut>(&self, call: F) -> Result<T, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, B::Error>>,
    {
        let inner = &*self.inner;
        if let Admit::No(_) = inner.breaker.admit() {
            return Err(Error::BreakerOpen);
        }
        // Poll once before arming the timer: an in-process backend answers
        // at once, and a timer costs more than its decision.
        let mut fut = std::pin::pin!(call());
        let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        let answer = match first {
            Poll::Ready(r) => Ok(r),
            Poll::Pending => tokio::time::timeout(inner.timeout, fut).await,
        };
        let result = match answer {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Error::Backend(Box::new(e))),
            Err(_) => Err(Error::Timeout(inner.timeout)),
        };
        match &result {
            Ok(_) => {
                if inner.breaker.is_open() {
                    tracing::info!(limiter = %inner.name, "rate-limit backend recovered");
                }
                inner.breaker.on_success();
            }
            Err(e) => {
                let opened = inner.breaker.on_failure();
                inner.log.warn(&inner.name, e, opened);
            }
        }
        result
    }

    fn settle(&self, result: Result<Decision, Error>) -> Verdict {
        match result {
            Ok(d) => Verdict::Decided(d),
            Err(e @ Error::Policy(_)) => Verdict::FailedClosed(e, Duration::from_secs(1)),
            Err(e) => match self.inner.fail_mode {
                FailMode::Open => Verdict::FailedOpen(e),
                FailMode::Closed => Verdict::FailedClosed(e, Duration::from_secs(1)),
            },
        }
    }
}

/// Logs backend failures at warn level, at most once per period per
/// limiter, with a count of the ones kept quiet.
#[derive(Debug)]
struct LogThrottle {
    period: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogThrottle {
    fn new(period: Duration) -> Self {
        Self {
            period,
            state: Mutex::new((None, 0)),
        }
    }

    fn warn(&self, limiter: &str, error: &Error, opened: bool) {
        let now = Instant::now();
        let suppressed = {
            let mut state = crate::lock(&self.state);
            let due = state
                .0
                .is_none_or(|last| now.duration_since(last) >= self.period);
            if !(due || opened) {
                state.1 += 1;
                return;
            }
            state.0 = Some(now);
            std::mem::take(&mut state.1)
        };
        let error: &dyn std::error::Error = error;
        tracing::warn!(
            limiter,
            error,
            suppressed,
            breaker_opened = opened,
            "rate-limit backend failure"
        );
    }
}
