use std::fmt;
use std::mem;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use http::{Request, Response};
use tollgate_limiter::aimd::{AimdLimiter, Outcome};
use tollgate_limiter::{Backend, Key};
use tower_service::Service;

use super::future::{BoxFuture, Gate, ResponseFuture};
use super::layer::Classify;
use crate::extract::KeyExtractor;

/// Waits for a token of the call's scope before calling the inner HTTP
/// client, then feeds the response back to the [`AimdLimiter`]: a `429` or
/// `503` cuts the scope's rate (and its `Retry-After` holds the scope), a
/// success lets it grow.
///
/// Unlike an inbound limit, this one waits rather than refuses: slowing
/// down is what a client of a rate-limited source wants. `poll_ready`
/// delegates to the inner service; the wait happens in the response
/// future, once the scope is known. What the inner service reserved by
/// being ready (a slot of a `Buffer`, a permit of a `ConcurrencyLimit`)
/// is given back for the wait, and the call waits for the inner service
/// to be ready again once it has its token: a call held by one source's
/// `Retry-After` never keeps a call to another source from going out. A
/// call whose scope the source put on hold since its token was granted
/// (another call's answer, while this one waited for the inner service)
/// gives the inner service back again and waits the hold out for a new
/// token rather than go out inside the hold. Calls that waited for a
/// busy inner service with their tokens do go out back to back as it
/// frees up: the spacing of the tokens is then the inner service's, and
/// the source may see a burst above the rate (its refusal then cuts and
/// holds the scope, and the calls still waiting wait the hold out). Keep
/// the inner service's own limits (a `ConcurrencyLimit`, a `Buffer`)
/// above what the scopes' rates need, as a pooled HTTP client is; see
/// `docs/harvester.md` ("Limitations") for why tokens are not taken
/// again.
///
/// It waits on tokio's timers: driven outside a tokio runtime, a call
/// goes out without waiting for its token (the limit fails open; an error
/// is logged once), and its answer is still reported.
///
/// Bound it with a timeout layer if a caller cannot wait for a long
/// `Retry-After`: the report of a response runs as a task of its own, so
/// a caller that gives up once the source has answered does not lose what
/// it said.
///
/// Made by [`AdaptiveLayer`](super::AdaptiveLayer).
pub struct Adaptive<S, B, E> {
    inner: S,
    limiter: AimdLimiter<B>,
    scope: E,
    classify: Classify,
}

impl<S, B, E> Adaptive<S, B, E> {
    pub(crate) fn new(inner: S, limiter: AimdLimiter<B>, scope: E, classify: Classify) -> Self {
        Self {
            inner,
            limiter,
            scope,
            classify,
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The limiter.
    pub fn limiter(&self) -> &AimdLimiter<B> {
        &self.limiter
    }
}

impl<S: Clone, B, E: Clone> Clone for Adaptive<S, B, E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            scope: self.scope.clone(),
            classify: self.classify,
        }
    }
}

impl<S: fmt::Debug, B, E> fmt::Debug for Adaptive<S, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Adaptive")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter)
            .field("scope", &std::any::type_name::<E>())
            .finish_non_exhaustive()
    }
}

impl<S, B, E, ReqBody, ResBody> Service<Request<ReqBody>> for Adaptive<S, B, E>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    B: Backend,
    E: KeyExtractor<Request<ReqBody>>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Request<ReqBody>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The service that was polled ready is the one called; a clone
        // takes its place.
        let clone = self.inner.clone();
        let mut inner = mem::replace(&mut self.inner, clone);
        let Some(scope) = self.scope.extract(&req) else {
            return ResponseFuture::unlimited(inner.call(req));
        };
        // The wait for a token may last a whole hold: what the ready
        // service reserved goes back now, not held away from the calls of
        // other scopes; a clone is made ready once the token is granted.
        drop(inner);
        let gate = Box::new(ScopeGate {
            limiter: self.limiter.clone(),
            scope,
        });
        ResponseFuture::waiting(self.inner.clone(), req, gate, self.classify)
    }
}

/// Logs, once per process, that calls go out unlimited: driven outside a
/// tokio runtime, no call can wait for its token, and the adaptive limit
/// fails open (as when its backend fails) rather than fail every call.
fn no_runtime(e: &tollgate_limiter::aimd::AcquireError) {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    if !LOGGED.swap(true, Ordering::Relaxed) {
        tracing::error!(
            error = %e,
            "outbound adaptive layer outside a tokio runtime: calls go out unlimited"
        );
    }
}

/// A call's scope at an [`AimdLimiter`].
struct ScopeGate<B> {
    limiter: AimdLimiter<B>,
    scope: Key,
}

impl<B: Backend> Gate for ScopeGate<B> {
    fn token(&self) -> BoxFuture<()> {
        let (limiter, scope) = (self.limiter.clone(), self.scope.clone());
        Box::pin(async move {
            if let Err(e) = limiter.acquire(&scope).await {
                no_runtime(&e);
            }
        })
    }

    fn held(&self) -> bool {
        self.limiter.held(&self.scope).is_some()
    }

    fn report(&self, outcome: Outcome) -> BoxFuture<()> {
        let (limiter, scope) = (self.limiter.clone(), self.scope.clone());
        Box::pin(async move { limiter.feedback(&scope, outcome).await })
    }
}
