use std::fmt;
use std::sync::Arc;

use tollgate_limiter::{Backend, Limiter};
use tower_layer::Layer;

use super::service::{ConcurrencyLimit, Shared};
use crate::respond::{Grpc, Http};

/// Applies [`ConcurrencyLimit`] to a service: at most the limiter's
/// `max_in_flight` requests of each key an extractor finds, across every
/// worker sharing the backend (see the [module docs](super)).
///
/// The limiter should hold a [`Concurrency`](tollgate_limiter::Concurrency)
/// policy; under any other policy a request is charged as by
/// [`RateLimitLayer`](crate::RateLimitLayer) and holds nothing.
///
/// The layer is cheap to clone; every service made from it, and every
/// clone, counts against the same slots. A request without a key is
/// refused (400, or `INVALID_ARGUMENT`); a limiter in shadow mode, which
/// refuses nothing, lets it pass holding no slot.
#[must_use]
pub struct ConcurrencyLimitLayer<B, K, R = Http> {
    shared: Arc<Shared<B, K, R>>,
}

impl<B: Backend, K> ConcurrencyLimitLayer<B, K> {
    /// Limits the requests in flight of each key `extractor` finds; HTTP
    /// answers.
    pub fn new(limiter: Limiter<B>, extractor: K) -> Self {
        Self {
            shared: Arc::new(Shared {
                limiter,
                extractor,
                responder: Http::default(),
            }),
        }
    }
}

impl<B: Backend, K: Clone, R> ConcurrencyLimitLayer<B, K, R> {
    /// Answers with `responder` (e.g. [`Grpc`] for tonic services). The
    /// new layer counts against the same slots as this one; its clones and
    /// the services already made from it keep their responder.
    pub fn responder<R2>(self, responder: R2) -> ConcurrencyLimitLayer<B, K, R2> {
        let (limiter, extractor) = match Arc::try_unwrap(self.shared) {
            Ok(shared) => (shared.limiter, shared.extractor),
            // Cloned, or already applied to a service: they keep theirs.
            Err(shared) => (shared.limiter.clone(), shared.extractor.clone()),
        };
        ConcurrencyLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                extractor,
                responder,
            }),
        }
    }

    /// gRPC answers.
    pub fn grpc(self) -> ConcurrencyLimitLayer<B, K, Grpc> {
        self.responder(Grpc::default())
    }
}

impl<B, K, R> Clone for ConcurrencyLimitLayer<B, K, R> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<B, K, R: fmt::Debug> fmt::Debug for ConcurrencyLimitLayer<B, K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("limiter", &self.shared.limiter)
            .field("extractor", &std::any::type_name::<K>())
            .field("responder", &self.shared.responder)
            .finish()
    }
}

impl<S, B, K, R> Layer<S> for ConcurrencyLimitLayer<B, K, R> {
    type Service = ConcurrencyLimit<S, B, K, R>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit::from_parts(inner, Arc::clone(&self.shared))
    }
}
