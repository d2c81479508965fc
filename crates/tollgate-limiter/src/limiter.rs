//! The `Limiter`: one named limit, its policy, and what to do when the
//! backend fails.

use std::fmt;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::backend::{Backend, Request, Scope};
use crate::breaker::BreakerConfig;
use crate::config::{ConfigError, FieldError, check_name};
use crate::decision::Decision;
use crate::deny_cache::{Carry, Charge, DenyCache};
use crate::error::{BackendError, Error, ErrorReason};
use crate::guard::{Admitted, Deadline, Guard, LogThrottle};
use crate::key::Key;
use crate::lease::{Leases, Take};
use crate::metrics::{Agreement, Call, CandidateMeter, Local, Outcome};
use crate::model::{Op, Receipt};
use crate::permit::Permit;
use crate::policy::{Policy, PolicyError};
use crate::reserve::Reservation;
use crate::shadow::{Mode, SHADOW_LOG_PERIOD};

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

/// A per-decision timeout must be above zero: at zero every decision
/// would fail. The rule of [`LimiterBuilder::try_build`] and of
/// configuration's `timeout`, a limiter's or the defaults'.
pub(crate) fn check_timeout(timeout: Duration) -> Result<(), FieldError> {
    match timeout.is_zero() {
        true => Err(("timeout", "must be above zero".into())),
        false => Ok(()),
    }
}

/// A cost setting (`field`: the limiter's `min_cost`, or configuration's
/// default `cost`) must be at least 1 and grantable by the policy and by
/// the candidate measured for enforcement: otherwise every request is
/// refused as impossible, whatever the fail mode.
pub(crate) fn check_cost(
    field: &'static str,
    cost: u64,
    policy: &Policy,
    candidate: Option<&Policy>,
) -> Result<(), FieldError> {
    if cost == 0 {
        return Err((field, "must be at least 1".into()));
    }
    policy.check_cost(cost).map_err(|e| (field, e.reason))?;
    if let Some(Err(e)) = candidate.map(|c| c.check_cost(cost)) {
        let reason = format!("candidate.cost: {} (the limiter's {field})", e.reason);
        return Err(("candidate", reason));
    }
    Ok(())
}

/// The default bound of each of a limiter's local maps (cached refusals,
/// leases), in keys; see [`LimiterBuilder::local_capacity`].
pub const DEFAULT_LOCAL_CAPACITY: usize = 100_000;

/// The outcome of asking a [`Limiter`].
///
/// Deliberately exhaustive: a new outcome (shadow mode added one) is a
/// breaking change, so that every `match` — ours and yours — is made to
/// decide what it means rather than fall into a wildcard that passes or
/// refuses it by accident. Code that only needs pass / refuse should call
/// [`is_allowed`](Self::is_allowed), which answers for every outcome.
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
    /// The limiter is in [shadow mode](crate::shadow): the request passes,
    /// though enforcement would have refused it as the [`Denied`] says (by
    /// the limit, a cost the policy can never grant, or a fail-closed
    /// backend failure).
    Shadowed(Box<Denied>),
}

impl Verdict {
    /// Whether the request may pass.
    pub fn is_allowed(&self) -> bool {
        match self {
            Self::Decided(d) => d.is_allowed(),
            Self::FailedOpen(_) | Self::Shadowed(_) => true,
            Self::FailedClosed(..) => false,
        }
    }

    /// Whether shadow mode let through a request that enforcement would
    /// have refused.
    pub fn is_shadowed(&self) -> bool {
        matches!(self, Self::Shadowed(_))
    }

    /// The backend's decision, if it made one (for a shadowed refusal,
    /// the refusal).
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Self::Decided(d) => Some(d),
            Self::Shadowed(denied) => denied.decision.as_ref(),
            _ => None,
        }
    }

    /// The backend failure, if any.
    pub fn error(&self) -> Option<&Error> {
        match self {
            Self::Decided(_) => None,
            Self::FailedOpen(e) | Self::FailedClosed(e, _) => Some(e),
            Self::Shadowed(denied) => denied.error.as_ref(),
        }
    }

    /// The verdict as a `Result`, the form internal consumers use:
    /// `Ok` carries the decision (`None` when a fail-open limiter let the
    /// request through without one; a shadowed refusal's decision, which
    /// says denied, when shadow mode let it through), `Err` a typed
    /// [`Denied`].
    pub fn into_result(self) -> Result<Option<Decision>, Denied> {
        match self {
            Self::Decided(d) if d.is_allowed() => Ok(Some(d)),
            Self::Decided(d) => Err(Denied {
                retry_after: d.retry_after(),
                decision: Some(d),
                error: None,
            }),
            Self::FailedOpen(_) => Ok(None),
            Self::Shadowed(denied) => Ok(denied.decision),
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
///
/// Made by the limiter ([`Verdict::into_result`]), never by its users: it
/// may gain fields, so match it with `..`.
///
/// ```compile_fail
/// # use std::time::Duration;
/// let denied = tollgate_limiter::Denied {
///     retry_after: Duration::from_secs(1),
///     decision: None,
///     error: None,
/// };
/// ```
#[derive(Debug, thiserror::Error)]
#[error("rate limited; retry after {retry_after:?}")]
#[non_exhaustive]
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
    local_capacity: usize,
    cost: u64,
    min_cost: u64,
    mode: Mode,
    candidate: Option<Policy>,
}

impl<B> LimiterBuilder<B> {
    /// A builder with the defaults; [`Limiter::builder`] for a backend,
    /// and [`LimiterConfig`](crate::LimiterConfig) with none, to check its
    /// settings.
    pub(crate) fn new(name: String, policy: Policy, backend: B) -> Self {
        Self {
            name,
            policy,
            backend,
            fail_mode: FailMode::default(),
            timeout: DEFAULT_TIMEOUT,
            breaker: BreakerConfig::default(),
            local_denials: None,
            lease: None,
            local_capacity: DEFAULT_LOCAL_CAPACITY,
            cost: 1,
            min_cost: 1,
            mode: Mode::default(),
            candidate: None,
        }
    }

    /// Evaluates `policy` beside the enforced one on every charge and peek
    /// the backend decides, in the same round trip (see
    /// [`Backend::decide_with_candidate`]), and counts where the two
    /// disagree (`tollgate_candidate_decisions_total`, see
    /// [`metrics`](crate::metrics)); the candidate never changes a verdict.
    /// How a team rolls out a new limit: measure who it would refuse
    /// before enforcing it.
    ///
    /// The candidate keeps its own state under the limiter name
    /// `<name>:candidate` (limiter names cannot hold `:`), as if
    /// it alone were enforced on every request: it is charged when it
    /// would pass, and [`reset`](Limiter::reset) with the enforced key.
    /// Overrides of the limiter do not apply to it. Requests
    /// answered locally ([`local_denials`](Self::local_denials),
    /// [`lease`](Self::lease)) are not shown to it, and a lease's batch is
    /// charged to it as one request of that cost: it is exact without
    /// them. A concurrency limit takes no candidate (nor is one):
    /// [`try_build`](Self::try_build) refuses the pair.
    pub fn candidate(mut self, policy: impl Into<Policy>) -> Self {
        self.candidate = Some(policy.into());
        self
    }

    /// Enforce (the default) or [shadow](crate::shadow): decide and
    /// record, but let every request pass.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The cost of a request whose caller names none (default 1):
    /// what [`Limiter::check`] charges and [`Limiter::peek`] asks about,
    /// and what a tower layer without a cost function charges; `cost` in
    /// configuration. [`try_build`](Self::try_build) refuses 0 and a cost
    /// the policy (or the candidate) can never grant.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// The least cost any charging call takes (default 1): a request
    /// asking for less (a cost function answering 0) is charged this much,
    /// so no request passes uncounted. Peeks ask whether at least this much
    /// fits. [`try_build`](Self::try_build) refuses 0, as configuration
    /// does.
    pub fn min_cost(mut self, min_cost: u64) -> Self {
        self.min_cost = min_cost;
        self
    }

    /// Answers repeated requests on a key that is over its limit locally,
    /// without a round trip, until the refusal's retry-after (at most
    /// `max_ttl`): a flood on one key does not become a backend storm.
    ///
    /// Only refusals the backend would repeat are cached. For a sliding
    /// window that penalises refusals, the cost of each request refused
    /// locally is kept and recorded on the backend by the key's next call
    /// (one more round trip then), so the flood is still penalised: never
    /// more admissions than without the cache. `max_ttl` bounds how long
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
    /// A worker asks for one batch per key at a time: requests of the key
    /// that find no units while its batch is on its way ask for their own
    /// cost.
    ///
    /// Near the limit, when a whole batch no longer fits, the request asks
    /// for its own cost only, so the backend never grants more than its
    /// policy allows. A key whose policy in force (an override) can never
    /// grant a batch asks for its requests' own cost, one round trip each,
    /// for `ttl` (then it tries a batch again; at once after this worker's
    /// own override of the key). But units are counted when leased and spent later:
    /// each worker may hold up to `batch - 1` units leased earlier, and
    /// spend them while the backend grants its full limit again. The bound
    /// for one key across `W` workers sharing one backend:
    ///
    /// * token bucket: a burst admits at most
    ///   `capacity + W × (batch − 1)` (over a period `T`, at most
    ///   `capacity + refill × T / period + W × (batch − 1)`);
    /// * sliding window: at most `limit + W × (batch − 1)` in any
    ///   window-long interval;
    /// * calendar quota: at most `limit + W × (batch − 1)` in one calendar
    ///   window (units leased before a boundary, spent within `ttl` after
    ///   it).
    ///
    /// Leases expire after `ttl`, so choosing `ttl` shorter than the time
    /// the backend takes to grant `W × (batch − 1)` units again (its refill
    /// or window) keeps the excess from adding up over time. Units leased
    /// and not spent within `ttl` are lost to every worker, as are those a
    /// worker holds when it stops (a crash, a restart): the backend counted
    /// them, nobody spends them (at most `batch − 1` per key it held a
    /// lease for, until the policy grants them again). A zero `ttl`
    /// keeps none, and [`try_build`](Self::try_build) refuses it. Off by default;
    /// ignored for progressive delays and concurrency limits (whose units
    /// are failures and slots, not a rate), and for sliding windows that
    /// penalise refusals: there a batch that no longer fits would be
    /// recorded as a refusal of the client (and refill the window on each
    /// request near the limit), though the client asked for less. (An
    /// override that turns the penalty on for a leasing limiter does
    /// that: keep leases to policies that do not penalise.)
    pub fn lease(mut self, batch: u64, ttl: Duration) -> Self {
        self.lease = (batch > 1).then_some((batch, ttl));
        self
    }

    /// Bounds each local map (cached refusals of
    /// [`local_denials`](Self::local_denials), leases of
    /// [`lease`](Self::lease)) to `entries` keys (default:
    /// [`DEFAULT_LOCAL_CAPACITY`]), so that a flood of distinct keys cannot
    /// grow this worker's memory. When a map is full, expired entries make
    /// room; failing that, the key is simply not cached and its requests
    /// are decided by the backend, as without the map. (Making room looks
    /// at every entry of a part of the map: after a look that freed
    /// little, the next waits for a few more keys to ask, so that no
    /// pattern of expiries makes every request pay for one.) 0 turns both
    /// off.
    pub fn local_capacity(mut self, entries: usize) -> Self {
        self.local_capacity = entries;
        self
    }

    /// What to answer when the backend fails (default: closed).
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.fail_mode = mode;
        self
    }

    /// How long one decision may wait for the backend in all before it
    /// counts as a failure (default: 50 ms).
    ///
    /// The bound is per call of the limiter ([`Limiter::check_cost`] and
    /// the other methods): a deadline is taken when the call first waits
    /// for its backend and every backend call it makes shares it, so lease mode's two round
    /// trips near the limit wait no longer than one. A consumer that makes
    /// a second decision for one request (such as a layer that charges by
    /// outcome after the response, in its own task) gets a second deadline
    /// for it: a request that waits for both (that layer's response waits
    /// for its charge) waits at most two timeouts.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Circuit-breaker settings.
    pub fn breaker(mut self, breaker: BreakerConfig) -> Self {
        self.breaker = breaker;
        self
    }

    /// Every rule [`try_build`](Self::try_build) checks, in one place:
    /// configuration runs it too, on the builder its limiter is built
    /// with, so that the two refuse the same settings. The field is named
    /// as configuration spells it.
    pub(crate) fn check(&self) -> Result<(), FieldError> {
        check_name(&self.name)?;
        check_timeout(self.timeout)?;
        if let Some(misread) = self.breaker.misread() {
            return Err(misread);
        }
        check_cost("cost", self.cost, &self.policy, self.candidate.as_ref())?;
        check_cost(
            "min_cost",
            self.min_cost,
            &self.policy,
            self.candidate.as_ref(),
        )?;
        let concurrency = |p: &Policy| matches!(p, Policy::Concurrency(_));
        if self
            .candidate
            .as_ref()
            .is_some_and(|c| concurrency(c) || concurrency(&self.policy))
        {
            return Err((
                "candidate",
                "a concurrency limit neither takes nor is a candidate".into(),
            ));
        }
        if self.lease.is_some_and(|(_, ttl)| ttl.is_zero()) {
            return Err((
                "lease",
                "a ttl of zero keeps nothing: every request would take a whole batch and \
                 lose the rest"
                    .into(),
            ));
        }
        Ok(())
    }
}

impl<B: Backend> LimiterBuilder<B> {
    /// The limiter.
    ///
    /// # Panics
    ///
    /// On a setting [`try_build`](Self::try_build) refuses, with its
    /// message. Settings written in code are wrong on every start, so the
    /// first start says so; settings read at run time belong in
    /// [`try_build`](Self::try_build) or [`Config`](crate::Config).
    #[track_caller]
    pub fn build(self) -> Limiter<B> {
        match self.try_build() {
            Ok(limiter) => limiter,
            Err(e) => panic!("{e}"),
        }
    }

    /// The limiter, or the setting that cannot work, named as
    /// configuration names it (`limiters.<name>.<field>`). These are the
    /// rules [`Config`](crate::Config) checks, by the same code:
    ///
    /// * `name`: empty, or holding `{`, `}` or `:`. `:` separates a key's
    ///   parts and `<name>:candidate` is a candidate's namespace, so
    ///   `api:candidate` would count in `api`'s candidate; the braces are
    ///   the cluster hash tag; or with white space at either end or a
    ///   control character (`"api "` would count apart from `"api"`);
    /// * `timeout`: zero (every decision would fail);
    /// * `breaker_backoff` of zero, or `breaker_max_backoff` below it;
    /// * `cost` and `min_cost`: 0, or a [cost](Self::cost) or
    ///   [minimum cost](Self::min_cost) the policy can never grant
    ///   (`candidate`: that the [candidate](Self::candidate) can never
    ///   grant);
    /// * `candidate`: beside a concurrency limit, or one itself;
    /// * `lease`: a [lease](Self::lease) of a zero `ttl`.
    ///
    /// Configuration checks one rule more, on purpose not here: a
    /// progressive delay that forgets its failures by the end of its
    /// longest block
    /// ([`ProgressiveDelay::forgets_by_its_longest_block`](crate::ProgressiveDelay::forgets_by_its_longest_block)),
    /// which gives a login's free attempts back. Code may build one: the
    /// adaptive limiter's hold is such a delay, a block that must end
    /// when it is forgotten.
    pub fn try_build(self) -> Result<Limiter<B>, ConfigError> {
        match self.check() {
            Ok(()) => Ok(self.assemble()),
            Err((field, reason)) => Err(ConfigError::invalid(&self.name, field, reason)),
        }
    }

    fn assemble(self) -> Limiter<B> {
        let candidate = self.candidate.map(|c| Candidate {
            name: format!("{}:candidate", self.name),
            meter: CandidateMeter::new(&self.name),
            policy: c,
        });
        // One map for both, so that a request looks at a key's refusal and
        // lease under one lock (see `sharded::Locals`).
        let maps = (self.local_denials.is_some() || self.lease.is_some())
            .then(|| Arc::new(crate::sharded::Locals::maps(self.local_capacity)));
        let denials = self
            .local_denials
            .zip(maps.clone())
            .map(|(ttl, maps)| DenyCache::new(ttl, maps));
        // Not where a batch that no longer fits would be recorded as the
        // client's refusal (see `lease`).
        let penalised = matches!(self.policy, Policy::SlidingWindow(w) if w.penalises_refused());
        let leases = self
            .lease
            .zip(maps)
            .filter(|_| self.policy.max_cost().is_some() && !penalised)
            .map(|((batch, ttl), maps)| {
                // A batch above what the policy can ever grant would never
                // be granted.
                let batch = batch.min(self.policy.max_cost().unwrap_or(batch));
                Leases::new(batch, ttl, maps)
            });
        let plain =
            denials.is_none() && leases.is_none() && !matches!(self.policy, Policy::Concurrency(_));
        Limiter {
            inner: Arc::new(Inner {
                guard: Guard::new(
                    self.name.clone(),
                    self.timeout,
                    self.breaker,
                    self.backend.failure_domains(),
                ),
                name: self.name,
                policy: self.policy,
                backend: self.backend,
                fail_mode: self.fail_mode,
                cost: self.cost,
                min_cost: self.min_cost,
                mode: self.mode,
                shadow_log: LogThrottle::new(SHADOW_LOG_PERIOD),
                candidate,
                denials,
                leases,
                plain,
            }),
        }
    }
}

/// One named limit over a backend.
///
/// A limiter is cheap to clone; clones share the breaker and the backend.
/// Every decision is one backend round trip (at most three: a sliding
/// window's [local refusals](LimiterBuilder::local_denials) carried first,
/// then, in [lease mode](LimiterBuilder::lease) near the limit, a batch
/// and the request's own cost), bounded in all by one [timeout](LimiterBuilder::timeout), behind a
/// circuit breaker; when the backend fails, the [`FailMode`] decides. No
/// caller can leave the breaker stuck: a decision dropped at any point (a
/// client gone, an outer timeout, a panic) gives its probe back.
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
    cost: u64,
    min_cost: u64,
    mode: Mode,
    shadow_log: LogThrottle,
    candidate: Option<Candidate>,
    guard: Guard,
    denials: Option<DenyCache>,
    leases: Option<Leases>,
    /// No local map and not a concurrency limit: a charge is one backend
    /// decision (two with a candidate, in one call)
    /// (see [`Limiter::check_cost`]'s short path).
    plain: bool,
}

/// A candidate policy, evaluated beside the enforced one.
struct Candidate {
    /// Its namespace: `<limiter>:candidate`.
    name: String,
    policy: Policy,
    meter: CandidateMeter,
}

impl Candidate {
    /// Its request beside the enforced `req`: the same key and operation.
    fn request<'a>(&'a self, req: &Request<'a>) -> Request<'a> {
        Request {
            limiter: &self.name,
            key: req.key,
            policy: &self.policy,
            op: req.op,
        }
    }
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
            .field("mode", &self.inner.mode)
            .field(
                "candidate",
                &self.inner.candidate.as_ref().map(|c| c.policy),
            )
            .field("timeout", &self.inner.guard.timeout())
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
        LimiterBuilder::new(name.into(), policy.into(), backend)
    }

    /// A fail-closed limiter with the default timeout and breaker.
    ///
    /// # Panics
    ///
    /// When `name` is empty, holds `{`, `}`, `:` or a control character,
    /// or has white space at either end; see
    /// [`LimiterBuilder::try_build`] for the fallible form.
    #[track_caller]
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

    /// The cost of a request whose caller names none (see
    /// [`LimiterBuilder::cost`]).
    pub fn cost(&self) -> u64 {
        self.inner.cost
    }

    /// The least cost a request is charged (see
    /// [`LimiterBuilder::min_cost`]).
    pub fn min_cost(&self) -> u64 {
        self.inner.min_cost
    }

    /// The fail mode.
    pub fn fail_mode(&self) -> FailMode {
        self.inner.fail_mode
    }

    /// Enforce or shadow.
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// The [candidate policy](LimiterBuilder::candidate) evaluated beside
    /// the enforced one, and the limiter name its state lives under.
    pub fn candidate(&self) -> Option<(&Policy, &str)> {
        self.inner
            .candidate
            .as_ref()
            .map(|c| (&c.policy, c.name.as_str()))
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// Asks for the limiter's [cost](LimiterBuilder::cost) of a request
    /// (one unit unless configured otherwise; at least the
    /// [minimum cost](LimiterBuilder::min_cost)) for `key`.
    pub fn check<'a>(&'a self, key: &'a Key) -> impl Future<Output = Verdict> + Send + 'a {
        // Not an `async fn`: a layer of future less on the hot path.
        self.check_cost(key, self.inner.cost)
    }

    /// Asks for `cost` units for `key` (for a progressive delay: records
    /// `cost` failures; for a [concurrency](crate::Concurrency) limit:
    /// takes a slot that only its lease frees, so use [`hold`](Self::hold)
    /// there). A cost below the
    /// [minimum cost](LimiterBuilder::min_cost) is charged the minimum:
    /// every call charges.
    ///
    /// A cost the policy in force (an override, if one is set) can never
    /// grant is refused with [`Error::Policy`], whatever the fail mode; the
    /// backend decides that, as it knows the policy in force. When the
    /// backend cannot answer, a cost the configured policy can never grant
    /// is refused the same way.
    ///
    /// The whole decision waits at most the configured
    /// [timeout](LimiterBuilder::timeout), even when it asks the backend
    /// more than once (lease mode near the limit, local refusals carried to
    /// a penalised window): every backend call of one decision shares one
    /// deadline, taken when the decision first waits. The bound is on waiting: a
    /// backend that blocks its caller's thread without yielding cannot be
    /// interrupted (tollgate's backends never do).
    pub fn check_cost<'a>(
        &'a self,
        key: &'a Key,
        cost: u64,
    ) -> impl Future<Output = Verdict> + Send + 'a {
        Check {
            start: Some((self, key, cost)),
            wait: None,
        }
    }

    /// [`check_cost`](Self::check_cost)'s first poll: the verdict, when
    /// the short path answers at once, else the first poll of the rest of
    /// the decision, kept in `wait`. Every step returns the next one's
    /// `Poll` as it is, in tail position: the verdict is written once, in
    /// the caller's slot, instead of copied from one wrapper to the next.
    #[inline]
    fn check_start<'a>(
        &'a self,
        key: &'a Key,
        cost: u64,
        wait: &mut Option<Waiting<'a>>,
        cx: &mut Context<'_>,
    ) -> Poll<Verdict> {
        if !self.inner.plain {
            return wait
                .insert(Box::pin(self.check_general(key, cost)))
                .as_mut()
                .poll(cx);
        }
        // The short path (no local map, not a concurrency limit): one
        // backend call (with a candidate beside).
        let cost = cost.max(self.inner.min_cost);
        let req = self.request(key, Op::Acquire(cost));
        // The closure holds `req` by reference: built on every call, it
        // would otherwise copy the request in, to use it only when waiting.
        let req = &req;
        let admitted = self.inner.guard.admit_at_once(self.domain(req.key));
        self.plain_now(req, cost, admitted, move |admitted| {
            let admitted = admitted.waiting(self.inner.guard.meter());
            let req = *req;
            let rest = wait.insert(Box::pin(async move {
                let guard = &self.inner.guard;
                let fut = self.decide_op(req);
                let result = guard.wait(admitted, &guard.deadline(), fut).await;
                self.plain_verdict(result, cost)
            }));
            rest.as_mut().poll(cx)
        })
    }

    /// [`check_cost`](Self::check_cost) when it can answer without
    /// waiting: `Some` is exactly what it would answer (charged, counted);
    /// `None` changed nothing, call `check_cost`.
    ///
    /// It answers when the limiter has no local map and is not a
    /// concurrency limit, and the backend decides in-process
    /// ([`Backend::decide_now`]), or when its breaker is open; not when
    /// the breaker's probe is due, which `check_cost` makes. A tower
    /// layer asks this first: an in-process decision then costs no future,
    /// and the inner service is called at once.
    ///
    /// `Some` has been charged: dropping it unread is a mistake the
    /// compiler reports.
    ///
    /// ```compile_fail
    /// #![deny(unused_must_use)]
    /// # use std::time::Duration;
    /// # use tollgate_limiter::{Key, Limiter, SlidingWindow};
    /// # let limiter = Limiter::new(
    /// #     "doc",
    /// #     SlidingWindow::new(1, Duration::from_secs(1)).unwrap(),
    /// #     tollgate_memory::MemoryBackend::new(),
    /// # );
    /// limiter.check_cost_now(&Key::new("k"), 1);
    /// ```
    #[inline]
    #[must_use = "`Some` is a verdict already charged"]
    pub fn check_cost_now(&self, key: &Key, cost: u64) -> Option<Verdict> {
        if !self.inner.plain {
            return None;
        }
        let cost = cost.max(self.inner.min_cost);
        let req = self.request(key, Op::Acquire(cost));
        // A probe due is left to `check_cost`: taken here and given back
        // when the backend cannot answer at once (a Redis backend, always),
        // it would count a `half_open` and an `open` transition for
        // nothing before `check_cost` probed.
        let admitted = self.inner.guard.admit_unless_probe(self.domain(key))?;
        // Nothing was asked when it is pending: dropping the breaker's
        // leave (never a probe) changes nothing.
        match self.plain_now(&req, cost, admitted, |_| Poll::Pending) {
            Poll::Ready(verdict) => Some(verdict),
            Poll::Pending => None,
        }
    }

    /// The short path up to the backend's answer: decided, when the
    /// breaker refused (`admitted`, its answer for the key's domain) or the
    /// backend answered at once; else what `pending` makes of the
    /// breaker's leave, to wait for [`Backend::decide`].
    #[inline]
    fn plain_now<'a>(
        &'a self,
        req: &Request<'_>,
        cost: u64,
        admitted: Result<Admitted<'a>, Error>,
        pending: impl FnOnce(Admitted<'a>) -> Poll<Verdict>,
    ) -> Poll<Verdict> {
        let guard = &self.inner.guard;
        let admitted = match admitted {
            Ok(admitted) => admitted,
            Err(e) => return Poll::Ready(self.plain_verdict(Err(e), cost)),
        };
        let answer = self.inner.backend.decide_now(req);
        // The common answer, read where the backend wrote it and copied
        // once, into the verdict: a possible cost, no candidate to decide
        // beside it, and nothing for shadow mode to turn. Everything else
        // is out of line, so that this path keeps no copy of its own.
        if let Some(d) = &answer
            && !d.is_impossible()
            && self.inner.candidate.is_none()
            && (d.is_allowed() || self.inner.mode != Mode::Shadow)
        {
            guard.succeeded(admitted);
            guard.meter().decision(Call::Check, Outcome::of_decision(d));
            // Copied field by field (see `Decision::copied`): the backend
            // has just written it field by field.
            return Poll::Ready(Verdict::Decided(d.copied()));
        }
        self.plain_answer(req, answer, admitted, cost, pending)
    }

    /// [`plain_now`](Self::plain_now) for every other answer: a candidate
    /// beside it, an impossible cost, shadow mode's refusal, a backend
    /// failure, or no answer yet.
    #[inline(never)]
    fn plain_answer<'a>(
        &'a self,
        req: &Request<'_>,
        answer: Option<Decision>,
        admitted: Admitted<'a>,
        cost: u64,
        pending: impl FnOnce(Admitted<'a>) -> Poll<Verdict>,
    ) -> Poll<Verdict> {
        let guard = &self.inner.guard;
        match answer {
            Some(d) => {
                if let Some(c) = &self.inner.candidate {
                    // Beside it, as `decide_with_candidate` would; an
                    // in-process backend that cannot answer it now (a
                    // fault injected in between) counts as its failure.
                    let cd = self.inner.backend.decide_now(&c.request(req));
                    c.meter.record(Agreement::of(&d, cd.as_ref()));
                }
                if d.is_impossible() {
                    let result = guard.report(admitted, Ok(Ok::<_, B::Error>(d)));
                    return Poll::Ready(self.plain_verdict(result, cost));
                }
                // An in-process backend decided: no future.
                guard.succeeded(admitted);
                Poll::Ready(self.counted(Call::Check, Verdict::Decided(d)))
            }
            None => pending(admitted),
        }
    }

    /// The short path's verdict on a backend call's result.
    fn plain_verdict(&self, result: Result<Decision, Error>, cost: u64) -> Verdict {
        let result = match result {
            Ok(d) if d.is_impossible() => Err(impossible(Op::Acquire(cost), &d)),
            result => result,
        };
        self.counted(Call::Check, self.settle(result, cost))
    }

    /// [`check_cost`](Self::check_cost) with local maps or a concurrency
    /// limit.
    async fn check_general(&self, key: &Key, cost: u64) -> Verdict {
        let deadline = self.inner.guard.deadline();
        let cost = cost.max(self.inner.min_cost);
        let op = self.charge(cost);
        let cache = self.local_denials(op);
        // Before the backend is asked (see `DenyCache::insert`).
        let asked = cache.map_or(0, |c| c.asking(key));
        // A sliding window's local refusals are carried to the backend
        // (penalised windows must record them; see DenyCache).
        let window = matches!(self.inner.policy, Policy::SlidingWindow(_));
        let leases = self.inner.leases.as_ref();
        // A key's cached refusal and its lease share a lock: a request
        // that finds no refusal and none to carry takes from the lease
        // under the same lock (a leased key's hot path: one lock).
        let mut take = None;
        let charge = cache.map(|c| match leases {
            Some(l) => {
                let mut local = l.lock(key);
                let charge = c.charge_in(&mut local.denials, key, cost, window);
                if matches!(&charge, Charge::Ask(carry) if carry.units() == 0) {
                    take = Some(l.take_in(&mut local.leases, key, cost));
                }
                // Released here, before `charge` or `take` can be dropped
                // (their drops may take it).
                drop(local);
                charge
            }
            None => c.charge(key, cost, window),
        });
        match self.local_first(charge) {
            Err(denied) => return self.counted(Call::Check, Verdict::Decided(denied)),
            Ok(Some(carry)) => self.carry(carry, key, &deadline).await,
            Ok(None) => {}
        }
        let result = match leases {
            Some(l) => match take.unwrap_or_else(|| l.take(key, cost)) {
                // The hot path, answered here: no future for the rest.
                Take::Spent(d) => {
                    self.inner.guard.meter().local_hit(Local::Lease);
                    Ok(d)
                }
                take => self.leased(l, take, key, cost, &deadline).await,
            },
            None => self.try_op(key, op, &deadline).await,
        };
        self.counted(Call::Check, self.finish(cache, asked, key, cost, result))
    }

    /// Takes a [concurrency](crate::Concurrency) slot for `key` in one
    /// round trip: an allowed verdict comes with the [`Permit`] that gives
    /// it back (when released or dropped; its lease frees it otherwise).
    ///
    /// Refused, failed (even fail-open) or shadowed verdicts hold no slot.
    /// A hold whose answer never arrives (a timeout or a broken
    /// connection, after which the backend may have taken the slot all the
    /// same, or this future dropped while waiting) gives its slot back,
    /// best effort, as a dropped [`Permit`] does, withdrawing it
    /// ([`Op::Withdraw`]): if the hold reaches the backend after that, or
    /// again, the backend refuses it (see
    /// [`concurrency`](crate::concurrency)). A hold the server refused
    /// (an [`ErrorReason`] other than [`ErrorReason::Error`]: out of
    /// memory, loading, ...) took nothing, and sends nothing back.
    /// Under any other policy this is [`check`](Self::check), with no
    /// permit.
    pub async fn hold(&self, key: &Key) -> (Verdict, Option<Permit<B>>) {
        if !matches!(self.inner.policy, Policy::Concurrency(_)) {
            return (self.check(key).await, None);
        }
        let id = crate::permit::slot_id();
        // Armed before the round trip: the backend may take the slot and its
        // answer never reach this caller (a timeout, a connection lost on
        // the way back, this future dropped while waiting). Such a slot is
        // given back as a dropped permit's is, rather than left taken, and
        // the key refused, until its lease expires.
        let pending = Permit::in_flight(self.clone(), key.clone(), id);
        // Whether the server refused the call (out of memory, a failed
        // save, loading, ...): a refusal comes at the script's first write
        // at the latest, before the slot is taken.
        let refused = std::sync::atomic::AtomicBool::new(false);
        let req = self.request(key, Op::Hold(id));
        let result = self
            .inner
            .guard
            .run(self.domain(key), &self.inner.guard.deadline(), || async {
                let answer = self.inner.backend.decide(req).await;
                if let Err(e) = &answer
                    && e.reason() != ErrorReason::Error
                {
                    refused.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                answer
            })
            .await;
        let held = matches!(&result, Ok(d) if d.is_allowed());
        let permit = match &result {
            Ok(d) if held => Some(pending.landed(d.window())),
            // Refused, or never sent: no slot was taken. (Nor withdrawn:
            // a withdrawal is a write, which a server refusing writes
            // would refuse too.)
            Ok(_) | Err(Error::BreakerOpen | Error::Policy(_)) => {
                pending.disarm();
                None
            }
            Err(_) if refused.into_inner() => {
                pending.disarm();
                None
            }
            // Taken or not, nobody can tell: dropped armed, it withdraws.
            Err(_) => None,
        };
        let verdict = self.counted(Call::Check, self.settle(result, 1));
        (verdict, permit)
    }

    /// How long one decision may wait for the backend (for [`Permit`]).
    pub(crate) fn decision_timeout(&self) -> Duration {
        self.inner.guard.timeout()
    }

    /// Renews or gives back a slot (for [`Permit`]).
    pub(crate) async fn slot_op(&self, key: &Key, op: Op) -> Result<Decision, Error> {
        self.try_op(key, op, &self.inner.guard.deadline()).await
    }

    /// What the deny cache's [`charge`](DenyCache::charge) leaves a
    /// request to do before it asks the backend: `Err`, its cached refusal
    /// (counted as a local answer); `Ok`, the local refusals to
    /// [carry](Self::carry) first, if any (a sliding window's: see
    /// [`DenyCache`]).
    #[inline(always)]
    fn local_first<'a>(&self, charge: Option<Charge<'a>>) -> Result<Option<Carry<'a>>, Decision> {
        match charge {
            Some(Charge::Refused(denied)) => {
                self.inner.guard.meter().local_hit(Local::Denial);
                Err(denied)
            }
            Some(Charge::Ask(carry)) if carry.units() > 0 => Ok(Some(carry)),
            _ => Ok(None),
        }
    }

    /// Records local refusals on the backend ([`Op::Penalise`]), before
    /// the request that carries them is decided, as they were refused
    /// before it. A failure here is the next call's to report; a drop
    /// gives them back (see [`DenyCache::charge`]).
    async fn carry(&self, carry: Carry<'_>, key: &Key, deadline: &Deadline) {
        let _ = self
            .try_op(key, Op::Penalise(carry.units()), deadline)
            .await;
        carry.done();
    }

    /// One request under lease mode (`take`: its [take](Leases::take)): up
    /// to two backend calls, under one deadline.
    async fn leased(
        &self,
        leases: &Leases,
        take: Take<'_>,
        key: &Key,
        cost: u64,
        deadline: &Deadline,
    ) -> Result<Decision, Error> {
        match take {
            Take::Spent(d) => {
                self.inner.guard.meter().local_hit(Local::Lease);
                return Ok(d);
            }
            Take::Batch(fetch) => {
                match self.try_op(key, Op::Acquire(leases.batch), deadline).await {
                    Ok(d) if d.is_allowed() => {
                        fetch.keep(leases.batch - cost, &d);
                        return Ok(d);
                    }
                    Ok(_) => {}
                    // A batch above what the policy in force (an override)
                    // can grant is impossible, not an error of this
                    // request: ask for its cost, and for the key's next
                    // requests ask for theirs at once.
                    Err(Error::Policy(_)) => fetch.impossible(),
                    Err(e) => return Err(e),
                }
            }
            Take::Own => {}
        }
        // Near the limit, or a batch for the key already on its way: ask
        // for exactly this request's cost.
        self.try_op(key, Op::Acquire(cost), deadline).await
    }

    /// Reserves `estimate` units for `key` (at least the
    /// [minimum cost](LimiterBuilder::min_cost)), for a cost known only
    /// afterwards (an LLM call: its prompt plus `max_tokens`); settle the
    /// [`Reservation`] with the real cost once known.
    ///
    /// The estimate is taken atomically, in one round trip, and refused or
    /// admitted exactly as [`check_cost`](Self::check_cost) would (fail
    /// mode, timeout, breaker, impossible costs, local denials). The
    /// reservation holds something only when the backend admitted it: a
    /// refusal, or a pass under fail-open while the backend is down,
    /// answers an empty one, whose settle does nothing. Lease mode does not
    /// apply: a reservation always asks the backend, as leased units could
    /// not be refunded.
    ///
    /// Token buckets, sliding windows, calendar quotas and composites of
    /// them; and progressive delays, whose units are failures taken up
    /// front (a login attempt recorded as failed before the handler runs,
    /// refunded by [`Reservation::refund`] if it was no failed login; a
    /// blocked key refuses and records nothing: see
    /// [`ProgressiveDelayState::reserve`](crate::model::ProgressiveDelayState::reserve)).
    /// A concurrency limit refuses with [`Error::Policy`]. The rules of
    /// refunds, excess and unsettled reservations:
    /// [`strategy::reservation`](crate::strategy::reservation).
    ///
    /// # Examples
    ///
    /// ```
    /// # async fn example<B: tollgate_limiter::Backend>(limiter: tollgate_limiter::Limiter<B>) {
    /// use tollgate_limiter::Key;
    ///
    /// let key = Key::new("tenant-7");
    /// let (verdict, reservation) = limiter.reserve(&key, 400 + 1_000).await;
    /// if !verdict.is_allowed() {
    ///     // answer 429 (or 503 when fail-closed and the backend is down)
    ///     return;
    /// }
    /// let used = 612; // what the model reports
    /// let _ = reservation.settle(used).await;
    /// # }
    /// ```
    pub async fn reserve(&self, key: &Key, estimate: u64) -> (Verdict, Reservation<B>) {
        let deadline = self.inner.guard.deadline();
        let cost = estimate.max(self.inner.min_cost);
        if matches!(self.inner.policy, Policy::Concurrency(_)) {
            let e = Error::from(PolicyError::new(
                "strategy",
                format!(
                    "limiter {:?} is a {}: reservations need a token bucket, a sliding \
                     window, a calendar quota, a composite or a progressive delay",
                    self.inner.name,
                    self.inner.policy.strategy()
                ),
            ));
            let verdict = Verdict::FailedClosed(e, Duration::from_secs(1));
            return (self.counted(Call::Check, verdict), Reservation::empty());
        }
        let cache = self.local_denials(Op::Acquire(cost));
        let asked = cache.map_or(0, |c| c.asking(key));
        let window = matches!(self.inner.policy, Policy::SlidingWindow(_));
        match self.local_first(cache.map(|c| c.charge(key, cost, window))) {
            Err(denied) => {
                let verdict = Verdict::Decided(denied);
                return (self.counted(Call::Check, verdict), Reservation::empty());
            }
            Ok(Some(carry)) => self.carry(carry, key, &deadline).await,
            Ok(None) => {}
        }
        let result = self.try_reserve(key, cost, &deadline).await;
        let mut receipt = result.as_ref().map_or(Receipt::NONE, |(_, r)| *r);
        // Its settle's identity: the key refuses a replay of it (a call
        // the cluster client re-sent), the same 64 bits.
        receipt.id = crate::permit::slot_id().max(1);
        let verdict = self.finish(cache, asked, key, cost, result.map(|(d, _)| d));
        let held = matches!(&verdict, Verdict::Decided(d) if d.is_allowed()) && receipt.units > 0;
        let reservation = match held {
            true => Reservation::held(self.clone(), key.clone(), receipt),
            false => Reservation::empty(),
        };
        (self.counted(Call::Check, verdict), reservation)
    }

    /// One backend reservation, under the guard and `deadline`; an
    /// impossible cost becomes [`Error::Policy`] as in `try_op`.
    async fn try_reserve(
        &self,
        key: &Key,
        cost: u64,
        deadline: &Deadline,
    ) -> Result<(Decision, Receipt), Error> {
        let (d, receipt) = self
            .inner
            .guard
            .run(self.domain(key), deadline, || {
                self.inner
                    .backend
                    .reserve(self.request(key, Op::Acquire(cost)))
            })
            .await?;
        if d.is_impossible() {
            return Err(Error::from(PolicyError::new(
                "cost",
                format!("a cost of {cost} can never pass a limit of {}", d.limit()),
            )));
        }
        Ok((d, receipt))
    }

    /// Settles `receipt` with its real cost: one backend call under the
    /// timeout and the breaker (see [`Reservation::settle`]).
    /// `actual` is taken as is: [`Reservation::settle`] raises it to the
    /// minimum cost, [`Reservation::refund`] gives everything back.
    pub(crate) async fn settle_receipt(
        &self,
        key: &Key,
        receipt: Receipt,
        actual: u64,
    ) -> Result<Decision, Error> {
        let op = Op::Settle { receipt, actual };
        let result = self.try_op(key, op, &self.inner.guard.deadline()).await;
        // Refunds free units: refusals cached before are stale. After the
        // call, as `reset` does: a refusal decided before the refund and
        // answered after it is not kept either.
        if let Some(cache) = &self.inner.denials {
            cache.forget(key);
        }
        result
    }

    /// Reports whether a request of the limiter's
    /// [cost](LimiterBuilder::cost) (at least the
    /// [minimum cost](LimiterBuilder::min_cost)) would pass now, consuming
    /// nothing (for a progressive delay: whether the key is blocked).
    pub async fn peek(&self, key: &Key) -> Verdict {
        self.peek_cost(key, self.inner.cost).await
    }

    /// Reports whether a request of `cost` (at least the
    /// [minimum cost](LimiterBuilder::min_cost)) would pass now, consuming
    /// nothing. A cost that can never pass is refused as
    /// [`check_cost`](Self::check_cost) refuses it.
    ///
    /// It says what a check of `cost` would say next: a refusal this worker
    /// cached answers it locally, and refusals of a sliding window answered
    /// locally and not yet recorded (see
    /// [`local_denials`](LimiterBuilder::local_denials)) are recorded first,
    /// as the key's next check would record them (one more round trip);
    /// units this worker [leased](LimiterBuilder::lease) for the key, if
    /// they cover `cost`, answer it locally too (allowed: the next check
    /// would spend them).
    pub async fn peek_cost(&self, key: &Key, cost: u64) -> Verdict {
        let deadline = self.inner.guard.deadline();
        let cost = cost.max(self.inner.min_cost);
        let op = Op::Peek(cost);
        let cache = self.local_denials(op);
        let asked = cache.map_or(0, |c| c.asking(key));
        // A peek adds nothing to the flood, but carries it: asked without
        // it, the backend would answer for a key it has not seen refused.
        match self.local_first(cache.map(|c| c.charge(key, cost, false))) {
            Err(denied) => return self.counted(Call::Peek, Verdict::Decided(denied)),
            Ok(Some(carry)) => self.carry(carry, key, &deadline).await,
            Ok(None) => {}
        }
        if let Some(d) = self.inner.leases.as_ref().and_then(|l| l.peek(key, cost)) {
            self.inner.guard.meter().local_hit(Local::Lease);
            return self.counted(Call::Peek, Verdict::Decided(d));
        }
        let result = self.try_op(key, op, &deadline).await;
        self.counted(Call::Peek, self.finish(cache, asked, key, cost, result))
    }

    /// Forgets `key`: it becomes a fresh key (unblocks a user after a false
    /// positive; a successful login for a progressive delay).
    ///
    /// This worker forgets its local answers for the key (cached refusals,
    /// leased units, refusals still to carry) once the reset is answered or
    /// given up. Another worker may still answer from its own, as after an
    /// [override](Self::set_override): a refusal it cached, for at most
    /// [`max_ttl`](LimiterBuilder::local_denials), or at most `batch − 1`
    /// units it [leased](LimiterBuilder::lease) before, which the fresh
    /// key's limit does not count.
    pub async fn reset(&self, key: &Key) -> Result<Decision, Error> {
        let _forget = ForgetLocal(self, Some(key));
        self.try_op(key, Op::Reset, &self.inner.guard.deadline())
            .await
    }

    /// Forgets what this worker keeps of `key` (of every key, with
    /// `None`): its cached refusals and its lease batches. Called after a
    /// reset or an override is answered or given up ([`ForgetLocal`]), so
    /// that a refusal or a batch decided before it is not kept, even if
    /// its answer comes after.
    fn forget_local(&self, key: Option<&Key>) {
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
    }

    /// Asks the backend for `cost` units (at least the
    /// [minimum cost](LimiterBuilder::min_cost)), with timeout and breaker
    /// but without applying the fail mode. For a
    /// [concurrency](crate::Concurrency) limit, takes a slot that only its
    /// lease frees, as [`check_cost`](Self::check_cost) does.
    pub async fn try_acquire(&self, key: &Key, cost: u64) -> Result<Decision, Error> {
        let op = self.charge(cost.max(self.inner.min_cost));
        self.try_op(key, op, &self.inner.guard.deadline()).await
    }

    /// The operation charging `cost` under the configured policy: a
    /// concurrency limit's is a slot nobody releases, its lease frees it
    /// (see [`hold`](Self::hold)); an acquire, where a slot only looks.
    fn charge(&self, cost: u64) -> Op {
        match self.inner.policy {
            Policy::Concurrency(_) => Op::Hold(crate::permit::slot_id()),
            _ => Op::Acquire(cost),
        }
    }

    /// Asks the backend whether `cost` units (at least the
    /// [minimum cost](LimiterBuilder::min_cost)) would be granted now,
    /// consuming nothing, with timeout and breaker but without applying
    /// the fail mode (what an operator's "inspect" wants).
    pub async fn try_peek(&self, key: &Key, cost: u64) -> Result<Decision, Error> {
        let cost = cost.max(self.inner.min_cost);
        self.try_op(key, Op::Peek(cost), &self.inner.guard.deadline())
            .await
    }

    /// Sets (`Some`) or clears (`None`) a runtime override of this
    /// limiter's policy, for one key or (`key = None`) for all of them.
    /// Every worker sharing the backend sees it on its next decision that
    /// asks the backend. This worker forgets its local answers for the key
    /// once the override is written; another worker may still answer from
    /// its own: a refusal it cached
    /// ([`local_denials`](LimiterBuilder::local_denials), for at most
    /// `max_ttl`) or units it leased before
    /// ([`lease`](LimiterBuilder::lease), at most `batch − 1`, spent
    /// within `ttl`).
    ///
    /// The override must use the limiter's strategy, and be able to grant
    /// the limiter's [minimum cost](LimiterBuilder::min_cost) and
    /// [cost](LimiterBuilder::cost) (as the configuration requires of a
    /// limiter's policy).
    pub async fn set_override(
        &self,
        key: Option<&Key>,
        policy: Option<Policy>,
    ) -> Result<(), Error> {
        if let Some(p) = &policy {
            self.check_override(p)?;
        }
        // Refusals and batches were decided under the old policy.
        let _forget = ForgetLocal(self, key);
        self.on_scope(key, |scope| {
            self.inner.backend.set_override(scope, policy.as_ref())
        })
        .await
    }

    /// Sets a runtime override, as [`set_override`](Self::set_override)
    /// does, that the backend forgets `ttl` from now: a limit raised for an
    /// incident or a launch returns to what was in force before (the
    /// configuration, or the limiter-wide override under a key's) without
    /// anyone having to remember to clear it. Setting the scope again, with
    /// or without a ttl, replaces it.
    ///
    /// When it expires, a worker that cached refusals or leased units under
    /// it answers from them for at most their own ttl, as after
    /// `set_override`. `ttl` must be at least one millisecond (Redis keeps
    /// expiries in milliseconds; a shorter one is rounded up).
    pub async fn set_override_for(
        &self,
        key: Option<&Key>,
        policy: Policy,
        ttl: Duration,
    ) -> Result<(), Error> {
        self.check_override(&policy)?;
        if ttl < Duration::from_millis(1) {
            return Err(Error::from(PolicyError::new(
                "ttl",
                format!("an override must last at least 1ms, not {ttl:?}"),
            )));
        }
        let _forget = ForgetLocal(self, key);
        self.on_scope(key, |scope| {
            self.inner
                .backend
                .set_expiring_override(scope, &policy, ttl)
        })
        .await
    }

    /// An override must use the limiter's strategy and grant its costs, as
    /// the configuration requires of the limiter's own policy.
    fn check_override(&self, p: &Policy) -> Result<(), Error> {
        if p.strategy() != self.inner.policy.strategy() {
            return Err(Error::from(PolicyError::new(
                "strategy",
                format!(
                    "an override of limiter {:?} must be a {}, not a {}",
                    self.inner.name,
                    self.inner.policy.strategy(),
                    p.strategy()
                ),
            )));
        }
        for (field, cost) in [("min_cost", self.inner.min_cost), ("cost", self.inner.cost)] {
            p.check_cost(cost)
                .map_err(|e| PolicyError::new(field, e.reason))?;
        }
        Ok(())
    }

    /// The override in force for exactly this key (or, with `None`, the
    /// limiter-wide one).
    pub async fn get_override(&self, key: Option<&Key>) -> Result<Option<Policy>, Error> {
        self.on_scope(key, |scope| self.inner.backend.get_override(scope))
            .await
    }

    /// The override set for exactly this key (or, with `None`, the
    /// limiter-wide one) and, for one set with
    /// [`set_override_for`](Self::set_override_for), the time it has left.
    pub async fn get_override_and_ttl(
        &self,
        key: Option<&Key>,
    ) -> Result<Option<(Policy, Option<Duration>)>, Error> {
        self.on_scope(key, |scope| self.inner.backend.get_override_and_ttl(scope))
            .await
    }

    /// `op` on the override scope of `key` (the limiter-wide one with
    /// `None`), through the guard of the scope's failure domain.
    async fn on_scope<'a, T, E, Fut>(
        &'a self,
        key: Option<&'a Key>,
        op: impl FnOnce(Scope<'a>) -> Fut,
    ) -> Result<T, Error>
    where
        E: BackendError,
        Fut: Future<Output = Result<T, E>>,
    {
        let scope = self.scope(key);
        let domain = self.inner.backend.failure_domain(scope);
        let guard = &self.inner.guard;
        guard.run(domain, &guard.deadline(), || op(scope)).await
    }

    fn scope<'a>(&'a self, key: Option<&'a Key>) -> Scope<'a> {
        match key {
            Some(k) => Scope::Key(&self.inner.name, k),
            None => Scope::Limiter(&self.inner.name),
        }
    }

    /// One backend decision, under the guard and `deadline`. The backend
    /// knows the policy in force, so it decides whether a cost can ever
    /// fit; such a refusal becomes [`Error::Policy`] here.
    async fn try_op(&self, key: &Key, op: Op, deadline: &Deadline) -> Result<Decision, Error> {
        let req = self.request(key, op);
        let d = self
            .inner
            .guard
            .run(self.domain(key), deadline, || self.decide_op(req))
            .await?;
        if d.is_impossible() {
            return Err(impossible(op, &d));
        }
        Ok(d)
    }

    /// The backend's failure domain of `key`: the breaker its calls go
    /// through. A constant 0 for a backend of one domain (the default
    /// [`Backend::failure_domain`], inlined), so the memory backend's path
    /// reads nothing more than before domains.
    #[inline(always)]
    fn domain(&self, key: &Key) -> usize {
        self.inner
            .backend
            .failure_domain(Scope::Key(&self.inner.name, key))
    }

    /// This limiter's request for `op` on `key`, under its configured policy.
    #[inline]
    fn request<'a>(&'a self, key: &'a Key, op: Op) -> Request<'a> {
        Request {
            limiter: &self.inner.name,
            key,
            policy: &self.inner.policy,
            op,
        }
    }

    /// The backend's decision on `req`; for a charge or a look, with the
    /// candidate deciding beside it in the same call, their agreement
    /// counted. A reset resets the candidate's state too: the candidate
    /// measures what enforcing it would do, and a key unblocked by hand,
    /// or a progressive delay reset by a successful login, would be reset
    /// under it as well (kept, it refused the user the reset had just let
    /// in, counted as a disagreement). Its failure fails no reset.
    async fn decide_op(&self, req: Request<'_>) -> Result<Decision, B::Error> {
        match (&self.inner.candidate, req.op) {
            (Some(c), Op::Reset) => {
                let beside = c.request(&req);
                let (d, _) = self
                    .inner
                    .backend
                    .decide_with_candidate(req, beside)
                    .await?;
                Ok(d)
            }
            (Some(c), Op::Acquire(_) | Op::Peek(_)) => {
                let beside = c.request(&req);
                let (d, cd) = self
                    .inner
                    .backend
                    .decide_with_candidate(req, beside)
                    .await?;
                c.meter.record(Agreement::of(&d, cd.as_ref()));
                Ok(d)
            }
            // Always under the limiter's timeout (a decision's calls share
            // one deadline, at most the timeout away): the backend may leave
            // a timeout of its own out.
            _ => {
                let within = self.inner.guard.timeout();
                self.inner.backend.decide_within(req, within).await
            }
        }
    }

    /// The local denial cache, if it answers `op` under the configured
    /// policy.
    fn local_denials(&self, op: Op) -> Option<&DenyCache> {
        self.inner
            .denials
            .as_ref()
            .filter(|_| DenyCache::applies(&self.inner.policy, op))
    }

    /// Counts a verdict in the decision metrics, after shadow mode let
    /// through what it would refuse.
    #[inline]
    fn counted(&self, call: Call, verdict: Verdict) -> Verdict {
        let verdict = self.shadowed(verdict);
        self.inner
            .guard
            .meter()
            .decision(call, Outcome::of(&verdict));
        verdict
    }

    /// In shadow mode, a refusal becomes [`Verdict::Shadowed`], logged at
    /// a throttled rate.
    #[inline]
    fn shadowed(&self, verdict: Verdict) -> Verdict {
        if self.inner.mode != Mode::Shadow || verdict.is_allowed() {
            return verdict;
        }
        let Err(denied) = verdict.into_result() else {
            unreachable!("a refused verdict is an Err")
        };
        if let Some(suppressed) = self.inner.shadow_log.due(false) {
            tracing::info!(
                limiter = %self.inner.name,
                retry_after = ?denied.retry_after,
                failed = denied.error.is_some(),
                suppressed,
                "shadow mode: let through a request the limiter would refuse"
            );
        }
        Verdict::Shadowed(Box::new(denied))
    }

    /// Remembers a refusal in `cache` (of a backend call made at `asked`,
    /// see [`DenyCache::asking`]), then settles the verdict.
    fn finish(
        &self,
        cache: Option<&DenyCache>,
        asked: u64,
        key: &Key,
        cost: u64,
        result: Result<Decision, Error>,
    ) -> Verdict {
        if let (Some(cache), Ok(d)) = (cache, &result)
            && d.is_denied()
        {
            cache.insert(key, cost, d, asked);
        }
        self.settle(result, cost)
    }

    /// Turns a request of `cost` into a verdict. When the backend could not
    /// say whether `cost` can ever fit, the configured policy answers
    /// that: an impossible cost is never let through by a fail-open mode.
    #[inline]
    fn settle(&self, result: Result<Decision, Error>, cost: u64) -> Verdict {
        let result = result.map_err(|e| match self.inner.policy.check_cost(cost) {
            Err(p) if e.is_unavailable() => Error::from(p),
            _ => e,
        });
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

/// The rest of a decision that waits for its backend.
type Waiting<'a> = Pin<Box<dyn Future<Output = Verdict> + Send + 'a>>;

/// The future of [`Limiter::check_cost`]: it decides on its first poll,
/// and an in-process answer is returned from that poll as it is, with no
/// state machine to move the verdict through (a measured ~70 instructions
/// of a ~550-instruction check). Only a decision that waits for its
/// backend is boxed: one allocation against a round trip.
struct Check<'a, B> {
    start: Option<(&'a Limiter<B>, &'a Key, u64)>,
    wait: Option<Waiting<'a>>,
}

impl<B: Backend> Future for Check<'_, B> {
    type Output = Verdict;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Verdict> {
        let this = &mut *self;
        if let Some((limiter, key, cost)) = this.start.take() {
            return limiter.check_start(key, cost, &mut this.wait, cx);
        }
        match &mut this.wait {
            Some(wait) => wait.as_mut().poll(cx),
            None => panic!("polled after completion"),
        }
    }
}

/// Forgets what the worker keeps of a key ([`Limiter::forget_local`]) when
/// dropped: when a reset or an override is answered, and also when its
/// caller gives up on it (a timeout, a `select!`), since the backend may
/// have applied it all the same (Redis runs a script it has received).
struct ForgetLocal<'a, B: Backend>(&'a Limiter<B>, Option<&'a Key>);

impl<B: Backend> Drop for ForgetLocal<'_, B> {
    fn drop(&mut self) {
        self.0.forget_local(self.1);
    }
}

/// The error of a decision refusing `op` as impossible: its cost can
/// never fit the policy in force.
#[cold]
fn impossible(op: Op, d: &Decision) -> Error {
    let cost = match op {
        Op::Acquire(c) | Op::Peek(c) | Op::Penalise(c) => c,
        Op::Reset | Op::Settle { .. } | Op::Hold(_) | Op::Release(_) | Op::Withdraw(_) => 0,
    };
    Error::from(PolicyError::new(
        "cost",
        format!("a cost of {cost} can never pass a limit of {}", d.limit()),
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::policy::TokenBucket;

    #[test]
    fn a_verdict_is_a_decision_wide() {
        // The rare variants are boxed and the tag lives in the decision's
        // spare values: a verdict, and the `Poll` and `Option` around it,
        // is the decision's 48 bytes, moved as they are (see `Decision`).
        assert_eq!(std::mem::size_of::<Verdict>(), 48);
        assert_eq!(std::mem::size_of::<Poll<Verdict>>(), 48);
        assert_eq!(std::mem::size_of::<Option<Result<Decision, Never>>>(), 48);
        let d = Decision::allowed(5, 4, Duration::from_secs(1));
        let verdict = Verdict::Decided(d);
        let Verdict::Decided(inside) = &verdict else {
            unreachable!()
        };
        assert_eq!(
            std::ptr::from_ref(inside).cast::<u8>(),
            std::ptr::from_ref(&verdict).cast::<u8>()
        );
    }

    /// A backend that answers every request alike and records the costs
    /// asked.
    #[derive(Debug, Default)]
    struct Fixed {
        allow: bool,
        /// A cost above it is impossible, as under an override of this
        /// capacity (none with 0).
        max_cost: u64,
        asked: Mutex<Vec<u64>>,
        peeked: Mutex<Vec<u64>>,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("unused")]
    struct Never;

    impl crate::BackendError for Never {}

    impl Backend for Fixed {
        type Error = Never;

        async fn decide(&self, req: Request<'_>) -> Result<Decision, Never> {
            match req.op {
                Op::Acquire(cost) => crate::lock(&self.asked).push(cost),
                Op::Peek(cost) => crate::lock(&self.peeked).push(cost),
                _ => {}
            }
            let minute = Duration::from_secs(60);
            if let Op::Acquire(cost) | Op::Peek(cost) = req.op
                && self.max_cost > 0
                && cost > self.max_cost
            {
                return Ok(Decision::impossible(self.max_cost, 0, 0));
            }
            Ok(if self.allow {
                Decision::allowed(100, 50, minute)
            } else {
                Decision::denied(100, 0, minute, minute)
            })
        }

        async fn set_override(&self, _: Scope<'_>, _: Option<&Policy>) -> Result<(), Never> {
            Ok(())
        }

        async fn get_override(&self, _: Scope<'_>) -> Result<Option<Policy>, Never> {
            Ok(None)
        }
    }

    fn builder(allow: bool) -> LimiterBuilder<Fixed> {
        let policy = TokenBucket::new(100, 1, Duration::from_secs(1)).unwrap();
        Limiter::builder(
            "flood",
            policy,
            Fixed {
                allow,
                ..Fixed::default()
            },
        )
        .local_capacity(1000)
    }

    /// What configuration refuses, the builder refuses too, naming the
    /// field: a limiter named `api:candidate` in code would otherwise count
    /// in the keys of `api`'s candidate.
    #[test]
    fn the_builder_refuses_what_configuration_refuses() {
        let refused = |b: LimiterBuilder<Fixed>| match b.try_build() {
            Err(ConfigError::Invalid { path, field, .. }) => (path, field),
            other => panic!("built: {other:?}"),
        };
        let policy = TokenBucket::new(100, 1, Duration::from_secs(1)).unwrap();
        let named = |name: &str| Limiter::builder(name, policy, Fixed::default());
        for name in ["api:candidate", "", "{api}", "a}b"] {
            assert_eq!(refused(named(name)).1, "name", "{name:?}");
        }
        assert_eq!(
            refused(builder(true).timeout(Duration::ZERO)),
            ("limiters.flood".to_string(), "timeout")
        );
        let breaker = |backoff, max_backoff| BreakerConfig {
            threshold: 3,
            backoff,
            max_backoff,
        };
        let second = Duration::from_secs(1);
        assert_eq!(
            refused(builder(true).breaker(breaker(Duration::ZERO, second))).1,
            "breaker_backoff"
        );
        assert_eq!(
            refused(builder(true).breaker(breaker(second, second / 2))).1,
            "breaker_max_backoff"
        );
        // A threshold of 0 (no breaker) is a setting, not a mistake.
        let off = BreakerConfig {
            threshold: 0,
            ..BreakerConfig::default()
        };
        assert!(builder(true).breaker(off).try_build().is_ok());
        // A minimum cost of 0 (it counted as 1 here, and was refused
        // there), and a concurrency limit beside a candidate (ignored here,
        // refused there).
        assert_eq!(refused(builder(true).min_cost(0)).1, "min_cost");
        let slots = crate::Concurrency::new(1, second).unwrap();
        assert_eq!(refused(builder(true).candidate(slots)).1, "candidate");
        let limit = Limiter::builder("api", slots, Fixed::default());
        assert_eq!(refused(limit.candidate(policy)).1, "candidate");
        assert_eq!(named("api").try_build().unwrap().name(), "api");
    }

    /// A request's cost, when its caller names none, is the limiter's:
    /// `check` charges it and `peek` asks about it; a cost of 0 or one the
    /// policy can never grant is refused, naming `cost`.
    #[tokio::test]
    async fn check_and_peek_take_the_limiters_cost() {
        let l = builder(true).cost(7).build();
        assert_eq!(l.cost(), 7);
        let k = Key::new("k");
        assert!(l.check(&k).await.is_allowed());
        assert!(l.peek(&k).await.is_allowed());
        assert_eq!(*crate::lock(&l.backend().asked), [7]);
        assert_eq!(*crate::lock(&l.backend().peeked), [7]);
        // At least the minimum cost.
        let l = builder(true).cost(2).min_cost(3).build();
        assert!(l.check(&k).await.is_allowed());
        assert_eq!(*crate::lock(&l.backend().asked), [3]);
        let refused = |b: LimiterBuilder<Fixed>| match b.try_build() {
            Err(ConfigError::Invalid { field, .. }) => field,
            Ok(_) => panic!("built"),
            Err(e) => panic!("{e}"),
        };
        assert_eq!(refused(builder(true).cost(0)), "cost");
        assert_eq!(refused(builder(true).cost(101)), "cost");
    }

    /// A lease that lives no time keeps none of its batch: every request
    /// took a whole batch from the backend and lost the rest, so a key
    /// got `capacity / batch` requests where its policy grants
    /// `capacity`. Refused, naming the setting.
    #[tokio::test(start_paused = true)]
    async fn a_lease_that_keeps_nothing_is_refused() {
        let l = builder(true).lease(4, Duration::ZERO).try_build();
        let Err(ConfigError::Invalid { field, .. }) = l else {
            let l = l.unwrap();
            let k = Key::new("k");
            for _ in 0..4 {
                let _ = l.check(&k).await;
            }
            let asked = crate::lock(&l.backend().asked).clone();
            panic!("built; four requests asked the backend for {asked:?}");
        };
        assert_eq!(field, "lease");
        // Any time at all keeps the batch's rest.
        let l = builder(true).lease(4, Duration::from_micros(1)).build();
        let k = Key::new("k");
        for _ in 0..4 {
            assert!(l.check(&k).await.is_allowed());
        }
        assert_eq!(*crate::lock(&l.backend().asked), [4]);
    }

    /// A lease that holds fewer units than a request's cost keeps them
    /// when the next batch comes: they were taken from the backend, and
    /// dropped they were counted and never spent. With a cost of 4 and
    /// batches of 10, five requests (20 units) must take two batches, not
    /// three (each new batch dropped the 2 units left of the last).
    #[tokio::test(start_paused = true)]
    async fn a_lease_short_of_the_cost_keeps_its_units_for_the_next_batch() {
        let l = builder(true)
            .cost(4)
            .lease(10, Duration::from_secs(60))
            .build();
        let k = Key::new("k");
        for _ in 0..5 {
            assert!(l.check(&k).await.is_allowed());
        }
        assert_eq!(*crate::lock(&l.backend().asked), [10, 10]);
    }

    /// A key whose policy in force (an override) is below the batch costs
    /// one round trip a request, not two: each request asked for a batch,
    /// refused as impossible, then for its own cost. The batch is tried
    /// again once the lease's ttl has passed, and at once after this
    /// worker's override of the key (either may have lifted it).
    #[tokio::test(start_paused = true)]
    async fn a_key_overridden_below_the_batch_asks_once_a_request() {
        let policy = TokenBucket::new(100, 1, Duration::from_secs(1)).unwrap();
        let backend = Fixed {
            allow: true,
            max_cost: 5,
            ..Fixed::default()
        };
        let l = Limiter::builder("flood", policy, backend)
            .lease(10, Duration::from_secs(60))
            .build();
        let k = Key::new("k");
        let asked = || std::mem::take(&mut *crate::lock(&l.backend().asked));
        for _ in 0..4 {
            assert!(l.check(&k).await.is_allowed());
        }
        assert_eq!(asked(), [10, 1, 1, 1, 1]);
        tokio::time::advance(Duration::from_secs(60)).await;
        for _ in 0..2 {
            assert!(l.check(&k).await.is_allowed());
        }
        assert_eq!(asked(), [10, 1, 1], "after the ttl");
        l.set_override(Some(&k), None).await.unwrap();
        for _ in 0..2 {
            assert!(l.check(&k).await.is_allowed());
        }
        assert_eq!(asked(), [10, 1, 1], "after an override");
    }

    /// A unit spent from a lease reports the batch's figures aged to now,
    /// as a cached refusal does: the batch's `reset_after` as it was when
    /// leased told a client (the `RateLimit` header's `t`) a full minute
    /// until the reset half a minute later.
    #[tokio::test(start_paused = true)]
    async fn a_unit_spent_from_a_lease_reports_the_reset_aged() {
        let l = builder(true).lease(4, Duration::from_secs(60)).build();
        let k = Key::new("k");
        let first = *l.check(&k).await.decision().unwrap();
        assert_eq!(first.reset_after(), Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(30)).await;
        let spent = *l.check(&k).await.decision().unwrap();
        assert_eq!(*crate::lock(&l.backend().asked), [4], "spent locally");
        assert_eq!(spent.reset_after(), Duration::from_secs(30));
    }

    /// A minimum cost the policy (or the candidate) can never grant is
    /// refused, naming the field, as configuration refuses it: built, it
    /// refused every request as impossible, whatever the fail mode.
    #[test]
    fn a_min_cost_the_policy_can_never_grant_is_refused() {
        let four = TokenBucket::new(4, 1, Duration::from_secs(1)).unwrap();
        let field = |b: LimiterBuilder<Fixed>| match b.try_build() {
            Err(ConfigError::Invalid { field, .. }) => field,
            Ok(l) => panic!("built: {l:?}"),
            Err(e) => panic!("{e}"),
        };
        let b = |policy: TokenBucket| Limiter::builder("api", policy, Fixed::default());
        assert_eq!(field(b(four).min_cost(5)), "min_cost");
        let ten = TokenBucket::new(10, 1, Duration::from_secs(1)).unwrap();
        assert_eq!(field(b(ten).min_cost(5).candidate(four)), "candidate");
        assert!(b(ten).min_cost(4).candidate(four).try_build().is_ok());
    }

    #[test]
    #[should_panic(expected = "limiters.api:candidate.name")]
    fn build_panics_on_what_try_build_refuses() {
        let policy = TokenBucket::new(100, 1, Duration::from_secs(1)).unwrap();
        let _ = Limiter::builder("api:candidate", policy, Fixed::default()).build();
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_distinct_keys_keeps_the_deny_cache_within_its_capacity() {
        let l = builder(false)
            .local_denials(Duration::from_secs(60))
            .build();
        for i in 0..10_000 {
            assert!(!l.check(&Key::new(format!("ip-{i}"))).await.is_allowed());
        }
        let cache = l.inner.denials.as_ref().unwrap();
        assert!((1..=1000).contains(&cache.len()), "{}", cache.len());
        // A key that found the cache full is still refused, by the backend.
        let asked = crate::lock(&l.backend().asked).len();
        assert_eq!(asked, 10_000);
        let uncached = (0..10_000)
            .map(|i| Key::new(format!("ip-{i}")))
            .find(|k| cache.get(k, 1).is_none())
            .expect("10 000 keys cannot all fit in 1000 places");
        assert!(!l.check(&uncached).await.is_allowed());
        assert_eq!(crate::lock(&l.backend().asked).len(), asked + 1);
        assert!(cache.len() <= 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_distinct_keys_keeps_the_leases_within_their_capacity() {
        let l = builder(true).lease(4, Duration::from_secs(60)).build();
        for i in 0..10_000 {
            assert!(l.check(&Key::new(format!("key-{i}"))).await.is_allowed());
        }
        let leases = l.inner.leases.as_ref().unwrap();
        assert!((1..=1000).contains(&leases.len()), "{}", leases.len());
        // Keys that found no room asked for their own cost, not a batch
        // whose rest would be lost.
        let asked = crate::lock(&l.backend().asked).clone();
        assert_eq!(asked.iter().filter(|&&c| c == 4).count(), leases.len());
        assert_eq!(
            asked.iter().filter(|&&c| c == 1).count(),
            10_000 - leases.len()
        );
        // Once the leases expire, their places are taken again.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(l.check(&Key::new("new")).await.is_allowed());
        assert_eq!(crate::lock(&l.backend().asked).last(), Some(&4));
        assert!(leases.len() <= 1000);
    }

    /// An override that can never grant the limiter's minimum cost is
    /// refused, naming the field, as the configuration refuses such a
    /// policy at start-up: it was stored, and every later request of the
    /// limiter (or the key) was refused as impossible, whatever the fail
    /// mode.
    #[tokio::test]
    async fn an_override_below_the_minimum_cost_is_refused() {
        let l = builder(true).min_cost(5).build();
        let small = Policy::from(TokenBucket::new(4, 1, Duration::from_secs(1)).unwrap());
        for key in [None, Some(&Key::new("k"))] {
            let e = l.set_override(key, Some(small)).await.unwrap_err();
            assert!(
                matches!(&e, Error::Policy(p) if p.field == "min_cost"),
                "{e:?}"
            );
        }
        let enough = Policy::from(TokenBucket::new(5, 1, Duration::from_secs(1)).unwrap());
        l.set_override(None, Some(enough)).await.unwrap();
    }

    /// As for the minimum cost, so for the limiter's cost: an override
    /// under which `check` could never pass is refused, naming `cost`.
    #[tokio::test]
    async fn an_override_below_the_limiters_cost_is_refused() {
        let l = builder(true).cost(5).build();
        let small = Policy::from(TokenBucket::new(4, 1, Duration::from_secs(1)).unwrap());
        let e = l.set_override(None, Some(small)).await.unwrap_err();
        assert!(matches!(&e, Error::Policy(p) if p.field == "cost"), "{e:?}");
        let enough = Policy::from(TokenBucket::new(5, 1, Duration::from_secs(1)).unwrap());
        l.set_override(None, Some(enough)).await.unwrap();
    }

    /// A lease asked to last for ever (`Duration::MAX`) leases like any
    /// other: its end must not overflow and panic the decision.
    #[tokio::test(start_paused = true)]
    async fn a_lease_for_ever_does_not_panic() {
        let l = builder(true).lease(4, Duration::MAX).build();
        let k = Key::new("k");
        for _ in 0..4 {
            assert!(l.check(&k).await.is_allowed());
        }
        // One batch, its three other units spent locally.
        assert_eq!(*crate::lock(&l.backend().asked), [4]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_capacity_of_zero_turns_the_local_maps_off() {
        let l = builder(false)
            .local_capacity(0)
            .local_denials(Duration::from_secs(60))
            .build();
        let k = Key::new("k");
        for _ in 0..3 {
            assert!(!l.check(&k).await.is_allowed());
        }
        assert_eq!(crate::lock(&l.backend().asked).len(), 3);
    }
}
