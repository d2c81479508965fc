use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use tollgate_limiter::Mode as LimiterMode;
use tollgate_limiter::{FailMode, Policy};
use tower_service::Service;

use super::future::{Mode, Pass, ResponseFuture, Ticket};
use super::hooks::{Classify, Cost, MissingKey, SelectLimiter};
use crate::extract::KeyExtractor;
use crate::respond::{Refusal, Respond};
use crate::telemetry;

/// What the service needs before the request is handed on.
pub(crate) struct Shared<L, K, C> {
    pub(crate) limiter: L,
    pub(crate) extractor: K,
    pub(crate) cost: C,
    pub(crate) missing: MissingKey,
}

/// What the response future needs after.
pub(crate) struct Post<R, V> {
    pub(crate) responder: R,
    pub(crate) classify: V,
}

/// A keyed rate limit in front of a service. Made by
/// [`RateLimitLayer`](super::RateLimitLayer).
///
/// `poll_ready` is the inner service's: the key is only known in `call`,
/// so a limit is never backpressure; a refusal is a response (429, a gRPC
/// status) and the inner service is not called.
pub struct RateLimit<S, L, K, R, C, V> {
    inner: S,
    shared: Arc<Shared<L, K, C>>,
    post: Arc<Post<R, V>>,
}

impl<S, L, K, R, C, V> RateLimit<S, L, K, R, C, V> {
    pub(crate) fn from_parts(
        inner: S,
        shared: Arc<Shared<L, K, C>>,
        post: Arc<Post<R, V>>,
    ) -> Self {
        Self {
            inner,
            shared,
            post,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, L, K, R, C, V> Clone for RateLimit<S, L, K, R, C, V> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            post: Arc::clone(&self.post),
        }
    }
}

impl<S: fmt::Debug, L: fmt::Debug, K, R: fmt::Debug, C, V> fmt::Debug
    for RateLimit<S, L, K, R, C, V>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.limiter)
            .field("extractor", &std::any::type_name::<K>())
            .field("responder", &self.post.responder)
            .field("missing", &self.shared.missing)
            .finish()
    }
}

impl<S, L, K, R, C, V, Req> Service<Req> for RateLimit<S, L, K, R, C, V>
where
    S: Service<Req> + Clone,
    L: SelectLimiter<Req>,
    K: KeyExtractor<Req>,
    C: Cost<Req>,
    R: Respond<S::Response>,
    V: Classify<S::Response>,
{
    type Response = R::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S, Req, L::Backend, R, V>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = &*self.shared;
        let limiter = shared.limiter.select(&req);
        let key = match shared.extractor.extract(&req) {
            Some(key) => key,
            None => match &shared.missing {
                MissingKey::Fallback(key) => key.clone(),
                MissingKey::Allow if limiter.fail_mode() == FailMode::Open => {
                    telemetry::missing_key(limiter.name(), true);
                    // `self.inner` is the service polled ready: call it.
                    let fut = self.inner.call(req);
                    return ResponseFuture::pass(fut, Pass::Bare, Arc::clone(&self.post));
                }
                // Shadow mode never refuses: what enforcement would have
                // answered goes with the response, as for a refusal by
                // the limit.
                _ if limiter.mode() == LimiterMode::Shadow => {
                    telemetry::missing_key(limiter.name(), true);
                    let pass = Pass::shadow_missing_key(limiter.name());
                    let fut = self.inner.call(req);
                    return ResponseFuture::pass(fut, pass, Arc::clone(&self.post));
                }
                // Reject, or Allow on a fail-closed limiter: dropping a
                // header must not switch a security control off.
                _ => {
                    telemetry::missing_key(limiter.name(), false);
                    let refusal = Refusal::MissingKey {
                        limiter: limiter.name(),
                    };
                    let response = self.post.responder.refused(&refusal);
                    return ResponseFuture::rejected(response, Arc::clone(&self.post));
                }
            },
        };
        let cost = shared.cost.cost(&req, limiter.cost());
        let mode = match (self.post.classify.reserves(), V::UPFRONT) {
            // A concurrency slot is held while the request runs, whatever
            // the classifier: charged after the response (or reserved),
            // it would be a slot taken when the request is over, which
            // only its lease frees.
            _ if matches!(limiter.policy(), Policy::Concurrency(_)) => Mode::Hold,
            (true, _) => Mode::Reserve,
            (false, true) => Mode::Upfront,
            (false, false) => Mode::Peek,
        };
        let ticket = Ticket {
            limiter,
            key,
            cost,
            reservation: None,
            permit: None,
        };
        if mode == Mode::Upfront
            && let Some(verdict) = ticket.limiter.check_cost_now(&ticket.key, cost)
        {
            // Decided in-process: no future to box, and the service polled
            // ready is called now (no clone to take its place).
            let post = Arc::clone(&self.post);
            return ResponseFuture::decided(verdict, ticket, &mut self.inner, req, post);
        }
        // The ready service is the one that will be called, once the
        // limiter has answered; a fresh clone takes its place here.
        let clone = self.inner.clone();
        let inner = mem::replace(&mut self.inner, clone);
        ResponseFuture::checking(ticket, mode, inner, req, Arc::clone(&self.post))
    }
}
