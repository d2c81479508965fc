//! The per-request choices of a [`RateLimitLayer`](super::RateLimitLayer):
//! which limiter, what cost, whether a response counts, and what to do
//! without a key.

use std::fmt;
use std::marker::PhantomData;

use tollgate_limiter::{Backend, Key, Limiter};

/// Chooses the limiter that decides a request.
///
/// A [`Limiter`] chooses itself. [`PerRequest`] wraps a closure
/// `Fn(&Req) -> Limiter<B>` for per-role (per-plan, per-tenant) quotas:
/// each quota is its own named limiter, built from configuration like any
/// other, and the closure picks one. Counters are kept per limiter, so a
/// key that changes role starts afresh under its new quota.
pub trait SelectLimiter<Req> {
    /// The backend of the limiters chosen from.
    type Backend: Backend;

    /// The limiter for `req` (limiters are cheap to clone).
    fn select(&self, req: &Req) -> Limiter<Self::Backend>;
}

impl<B: Backend, Req> SelectLimiter<Req> for Limiter<B> {
    type Backend = B;

    fn select(&self, _: &Req) -> Limiter<B> {
        self.clone()
    }
}

/// A policy resolver: a closure choosing the limiter per request. See
/// [`RateLimitLayer::per_request`](super::RateLimitLayer::per_request).
pub struct PerRequest<F, B> {
    f: F,
    _backend: PhantomData<fn() -> B>,
}

impl<F, B> PerRequest<F, B> {
    /// Wraps `f`.
    pub fn new(f: F) -> Self {
        Self {
            f,
            _backend: PhantomData,
        }
    }
}

impl<F: Clone, B> Clone for PerRequest<F, B> {
    fn clone(&self) -> Self {
        Self::new(self.f.clone())
    }
}

impl<F, B> fmt::Debug for PerRequest<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerRequest")
            .field("f", &std::any::type_name::<F>())
            .finish()
    }
}

impl<F, B, Req> SelectLimiter<Req> for PerRequest<F, B>
where
    F: Fn(&Req) -> Limiter<B>,
    B: Backend,
{
    type Backend = B;

    fn select(&self, req: &Req) -> Limiter<B> {
        (self.f)(req)
    }
}

/// The cost of a request: by default the limiter's own
/// ([`LimiterCost`]: `cost` in configuration, 1 unless set), or a fixed
/// `u64`, or a closure `Fn(&Req) -> u64` (weighted endpoints, LLM calls
/// charged by tokens).
///
/// A cost the policy in force (an override, if one is set) can never grant
/// is refused with `413 Payload Too Large` (fail-closed, whatever the fail
/// mode): a request cannot escape a limit by claiming an impossible cost.
/// A cost below the limiter's
/// [minimum cost](tollgate_limiter::LimiterBuilder::min_cost) (a cost
/// function answering 0) is charged the minimum: no request passes
/// uncounted.
pub trait Cost<Req> {
    /// The units `req` takes, under a limiter whose own cost
    /// ([`Limiter::cost`](tollgate_limiter::Limiter::cost)) is `limiter`.
    fn cost(&self, req: &Req, limiter: u64) -> u64;
}

/// The limiter's own cost of a request
/// ([`LimiterBuilder::cost`](tollgate_limiter::LimiterBuilder::cost),
/// `cost` in configuration; 1 unless set): the layers' default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimiterCost;

impl<Req> Cost<Req> for LimiterCost {
    fn cost(&self, _: &Req, limiter: u64) -> u64 {
        limiter
    }
}

impl<Req> Cost<Req> for u64 {
    fn cost(&self, _: &Req, _: u64) -> u64 {
        *self
    }
}

impl<F, Req> Cost<Req> for F
where
    F: Fn(&Req) -> u64,
{
    fn cost(&self, req: &Req, _: u64) -> u64 {
        self(req)
    }
}

/// What a response does to the count. See [`Classify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Charge the request's cost.
    Count,
    /// Charge nothing (a 5xx the client is not to blame for; a successful
    /// login when only failures count).
    Ignore,
    /// Forget the key: it becomes a fresh key (a successful login clears
    /// a progressive delay).
    Reset,
}

/// Response-based counting: decides from the inner service's response
/// whether the request counts.
///
/// With the default, [`Upfront`], the cost is taken atomically before the
/// request is handed on, and every admitted request counts. With a
/// classifier (any closure `Fn(&Res) -> Outcome`) the layer instead
/// *checks* before whether the request's whole cost fits (a key without
/// room for it is refused without reaching the service) and *charges
/// after*, once the response says whether the
/// request counts; the response is returned once the charge is recorded,
/// so the client's next request sees it. A refusal of a sliding window
/// that [penalises refusals](tollgate_limiter::SlidingWindow::penalise_refused)
/// is charged at once (recorded, as an upfront layer records it): the
/// look alone records nothing.
///
/// Checking and charging are two backend calls rather than one atomic
/// one, so concurrent requests of one key may all pass the check before
/// any is charged: at most the number of requests in flight can exceed
/// the limit. A response the inner service failed to produce (`Err`) is
/// charged as [`on_error`](Self::on_error) says ([`Outcome::Count`] unless
/// the classifier says otherwise). A request handed on whose response
/// never comes (its future dropped: a client gone mid-request) is charged
/// its cost, as
/// [`Outcome::Count`]: otherwise a client dropping each connection before
/// the answer would never be counted. The charge runs as a task of its
/// own (on the tokio runtime), so it is recorded even if the client goes
/// away while it is in flight.
///
/// A classifier that [reserves](Self::reserves) avoids the overshoot: the
/// cost is taken up front, atomically, and the outcome keeps, refunds or
/// resets it. Login protection counts this way
/// ([`FailedLogins`](crate::login::FailedLogins): each attempt is a failure
/// until its response says otherwise).
pub trait Classify<Res> {
    /// Whether the cost is taken before the request is handed on (and
    /// [`classify`](Self::classify) never called).
    const UPFRONT: bool = false;

    /// Whether the cost is an estimate, *reserved* before the request is
    /// handed on and settled with [`usage`](Self::usage) after (see
    /// [`SettleWith`]); the default of [`reserves`](Self::reserves).
    const RESERVE: bool = false;

    /// Whether this classifier, as configured, reserves (see
    /// [`RESERVE`](Self::RESERVE), the default answer). When it does, the
    /// response settles the reservation by its outcome:
    /// [`Outcome::Count`] settles with [`usage`](Self::usage) (`None`
    /// keeps the whole reservation), [`Outcome::Ignore`] refunds it all
    /// (the request was not to be counted, as with
    /// [`Reservation::refund`](tollgate_limiter::Reservation::refund)),
    /// [`Outcome::Reset`] forgets the key. A response that never comes
    /// (the request's future dropped: a client gone) keeps the
    /// reservation; an `Err` from the inner service does what
    /// [`on_error`](Self::on_error) says.
    fn reserves(&self) -> bool {
        Self::RESERVE
    }

    /// What the inner service failing (`Err`, no response: a timeout or
    /// load-shedding layer inside this one) does to the count:
    /// [`Outcome::Count`] (the default) charges it, as a response
    /// classified `Count` is (a reservation is kept), [`Outcome::Ignore`]
    /// does not (a reservation is refunded), [`Outcome::Reset`] forgets
    /// the key (a reservation is kept, as with `Count`). In a task of its own: the error is
    /// answered without waiting. Counted by default so that a request made
    /// to fail (slow enough to time out) is not free.
    fn on_error(&self) -> Outcome {
        Outcome::Count
    }

    /// What `response` does to the count.
    fn classify(&self, response: &Res) -> Outcome;

    /// The real cost `response` reports, for a reserving classifier;
    /// `None` keeps the whole estimate charged.
    fn usage(&self, response: &Res) -> Option<u64> {
        let _ = response;
        None
    }
}

/// Reserve, then settle from the response: the request's [`Cost`] is an
/// estimate (an LLM call's prompt plus `max_tokens`), reserved atomically
/// before the request is handed on (refused as an upfront charge would
/// be), and settled with the real cost the closure reads from the response
/// (`Fn(&Res) -> Option<u64>`): the unused units come back, an excess is
/// charged. Made by
/// [`RateLimitLayer::settle`](super::RateLimitLayer::settle).
///
/// The closure answering `None`, or the inner service failing (`Err`),
/// keeps the whole estimate charged: the safe side, as does a request
/// dropped before its response (a client gone). The settle runs as a task
/// of its own (on the tokio runtime), so a client gone while it is in
/// flight does not skip it; the response waits for it, and its `RateLimit`
/// fields show the figures after the settle. The rules of refunds and excess:
/// [`tollgate_limiter::strategy::reservation`].
///
/// A handler that knows the usage can put it in the response's extensions
/// for the closure to read:
///
/// ```
/// # use tollgate_limiter::{Limiter, TokenBucket};
/// # use tollgate_memory::MemoryBackend;
/// use tollgate_tower::{RateLimitLayer, extract::{ApiKey, KeyHasher}};
///
/// /// The tokens a completion really used, set by the handler.
/// #[derive(Clone, Copy)]
/// struct Usage(u64);
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let limiter = Limiter::new("llm", TokenBucket::per_second(10_000, 100)?, MemoryBackend::new());
/// let layer = RateLimitLayer::new(limiter, ApiKey::bearer(KeyHasher::new("the fleet's secret, 16+ bytes")?))
///     .cost(|_req: &http::Request<String>| 4_000) // prompt + max_tokens, from the request
///     .settle(|res: &http::Response<String>| res.extensions().get::<Usage>().map(|u| u.0));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy)]
pub struct SettleWith<F>(pub(crate) F);

impl<F> fmt::Debug for SettleWith<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SettleWith")
            .field(&std::any::type_name::<F>())
            .finish()
    }
}

impl<F, Res> Classify<Res> for SettleWith<F>
where
    F: Fn(&Res) -> Option<u64>,
{
    const UPFRONT: bool = true;
    const RESERVE: bool = true;

    fn classify(&self, _: &Res) -> Outcome {
        Outcome::Count
    }

    fn usage(&self, response: &Res) -> Option<u64> {
        (self.0)(response)
    }
}

/// Every admitted request counts, charged atomically before it is handed
/// on (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct Upfront;

impl<Res> Classify<Res> for Upfront {
    const UPFRONT: bool = true;

    fn classify(&self, _: &Res) -> Outcome {
        Outcome::Count
    }
}

impl<F, Res> Classify<Res> for F
where
    F: Fn(&Res) -> Outcome,
{
    fn classify(&self, response: &Res) -> Outcome {
        self(response)
    }
}

/// What to do with a request whose extractor found no key.
///
/// Whatever the choice, a request without a key never escapes a
/// fail-closed limiter: [`Allow`](Self::Allow) only applies to fail-open
/// ones. A limiter in [shadow mode](tollgate_limiter::shadow), which
/// refuses nothing, lets it pass uncounted whatever the choice (but
/// [`Fallback`](Self::Fallback), which counts it), with the
/// [`ShadowRefusal`](crate::respond::ShadowRefusal) enforcement would
/// have answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Refuse it (HTTP 400, gRPC `INVALID_ARGUMENT`). The default.
    #[default]
    Reject,
    /// Let it through uncounted, if the limiter is fail-open (a rate
    /// optimisation, where anonymous requests are limited elsewhere). A
    /// fail-closed limiter is a security control that dropping a header
    /// must not switch off: there, the request is rejected as with
    /// [`Reject`](Self::Reject).
    Allow,
    /// Count it under this shared key: every keyless request shares one
    /// budget.
    Fallback(Key),
}
