use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use tollgate_limiter::{Backend, Limiter, Mode};
use tower_service::Service;

use super::body::PermitBody;
use super::future::ResponseFuture;
use crate::extract::KeyExtractor;
use crate::inbound::future::Pass;
use crate::respond::{Refusal, Respond};
use crate::telemetry;

pub(crate) struct Shared<B, K, R> {
    pub(crate) limiter: Limiter<B>,
    pub(crate) extractor: K,
    pub(crate) responder: R,
}

/// A keyed, distributed concurrency limit in front of a service. Made by
/// [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer).
///
/// `poll_ready` is the inner service's: the key is only known in `call`,
/// so a full key is never backpressure; a refusal is a response.
pub struct ConcurrencyLimit<S, B, K, R> {
    inner: S,
    shared: Arc<Shared<B, K, R>>,
}

impl<S, B, K, R> ConcurrencyLimit<S, B, K, R> {
    pub(crate) fn from_parts(inner: S, shared: Arc<Shared<B, K, R>>) -> Self {
        Self { inner, shared }
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

impl<S: Clone, B, K, R> Clone for ConcurrencyLimit<S, B, K, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, B, K, R: fmt::Debug> fmt::Debug for ConcurrencyLimit<S, B, K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.limiter)
            .field("extractor", &std::any::type_name::<K>())
            .field("responder", &self.shared.responder)
            .finish()
    }
}

impl<S, B, K, R, Req, ResB> Service<Req> for ConcurrencyLimit<S, B, K, R>
where
    S: Service<Req, Response = http::Response<ResB>> + Clone,
    B: Backend,
    K: KeyExtractor<Req>,
    R: Respond<http::Response<PermitBody<ResB, B>>>,
{
    type Response = R::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S, Req, B, K, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        let Some(key) = shared.extractor.extract(&req) else {
            let name = shared.limiter.name();
            if shared.limiter.mode() == Mode::Shadow {
                // Shadow mode never refuses (see `RateLimit`).
                telemetry::missing_key(name, true);
                let pass = Pass::shadow_missing_key(name);
                return ResponseFuture::passed(self.inner.call(req), pass, shared);
            }
            telemetry::missing_key(name, false);
            let response = shared
                .responder
                .refused(&Refusal::MissingKey { limiter: name });
            return ResponseFuture::rejected(response, shared);
        };
        // The ready service is the one called once a slot is held.
        let clone = self.inner.clone();
        let inner = mem::replace(&mut self.inner, clone);
        ResponseFuture::holding(key, inner, req, shared)
    }
}
