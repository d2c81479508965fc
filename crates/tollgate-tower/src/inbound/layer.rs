use std::fmt;
use std::sync::Arc;

use tollgate_limiter::{Backend, Limiter};
use tower_layer::Layer;

use super::hooks::{LimiterCost, MissingKey, PerRequest, Upfront};
use super::service::{Post, RateLimit, Shared};
use crate::respond::{Grpc, Http};

/// Applies [`RateLimit`] to a service: a keyed limit, decided by a
/// [`Limiter`] for the key an extractor finds in each request.
///
/// Type parameters, each with a default or a constructor that sets it:
/// `L` chooses the limiter ([`Limiter`] or [`PerRequest`]), `K` extracts
/// the key, `R` answers ([`Http`] or [`Grpc`]), `C` is the cost, `V`
/// classifies responses ([`Upfront`] counts every admitted request).
///
/// The layer is cheap to clone. Its limiters share their backend and
/// breaker: every service made from the layer, and every clone of it,
/// counts against the same limits.
///
/// Under a [concurrency](tollgate_limiter::Concurrency) limiter, each
/// request holds a slot ([`Limiter::hold`]) from its decision until its
/// response, or until its future is dropped (a client gone, a timeout
/// above), whatever the classifier: there is nothing to charge after. To
/// hold the slot until an HTTP response's body has been sent, use
/// [`ConcurrencyLimitLayer`](crate::concurrency::ConcurrencyLimitLayer).
///
/// See the [module docs](super) for an example.
#[must_use]
pub struct RateLimitLayer<L, K, R = Http, C = LimiterCost, V = Upfront> {
    limiter: L,
    extractor: K,
    responder: R,
    cost: C,
    classify: V,
    missing: MissingKey,
}

impl<B: Backend, K> RateLimitLayer<Limiter<B>, K> {
    /// Limits each key `extractor` finds with `limiter`; HTTP answers,
    /// the limiter's [cost](Limiter::cost) a request, every admitted request
    /// counts, keyless requests refused.
    pub fn new(limiter: Limiter<B>, extractor: K) -> Self {
        Self::with_limiter(limiter, extractor)
    }
}

impl<F, B: Backend, K> RateLimitLayer<PerRequest<F, B>, K> {
    /// Like [`new`](RateLimitLayer::new), with the limiter chosen per
    /// request by `resolver` (per-role quotas: one configured limiter per
    /// role).
    ///
    /// Choose from what the service knows of the key (its role in your
    /// records), never from what the client sends beside it (a plan
    /// header): any client would pick the largest quota, and, counters
    /// being kept per limiter, get every quota's budget by switching.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use std::collections::HashSet;
    /// # use tollgate_limiter::{Limiter, TokenBucket};
    /// # use tollgate_memory::MemoryBackend;
    /// use tollgate_tower::{RateLimitLayer, extract::{ApiKey, KeyHasher}};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = MemoryBackend::new();
    /// let free = Limiter::new("api_free", TokenBucket::per_second(10, 1)?, backend.clone());
    /// let pro = Limiter::new("api_pro", TokenBucket::per_second(100, 10)?, backend);
    ///
    /// let api_key = ApiKey::bearer(KeyHasher::new("the fleet's secret, 16+ bytes")?);
    /// // The keys on the pro plan, from the service's own records.
    /// let pro_keys: HashSet<String> = HashSet::from(["sk_pro_1".to_owned()]);
    /// let plan_of = api_key.clone();
    /// let layer = RateLimitLayer::per_request(
    ///     move |req: &http::Request<()>| {
    ///         let is_pro = plan_of.credential(req).is_some_and(|k| pro_keys.contains(k));
    ///         if is_pro { pro.clone() } else { free.clone() }
    ///     },
    ///     api_key,
    /// );
    /// # Ok(())
    /// # }
    /// ```
    pub fn per_request<Req>(resolver: F, extractor: K) -> Self
    where
        F: Fn(&Req) -> Limiter<B>,
    {
        Self::with_limiter(PerRequest::new(resolver), extractor)
    }
}

impl<L, K> RateLimitLayer<L, K> {
    fn with_limiter(limiter: L, extractor: K) -> Self {
        Self {
            limiter,
            extractor,
            responder: Http::new(),
            cost: LimiterCost,
            classify: Upfront,
            missing: MissingKey::Reject,
        }
    }
}

impl<L, K, R, C, V> RateLimitLayer<L, K, R, C, V> {
    /// Answers with `responder` (see [`respond`](crate::respond)).
    pub fn responder<R2>(self, responder: R2) -> RateLimitLayer<L, K, R2, C, V> {
        RateLimitLayer {
            limiter: self.limiter,
            extractor: self.extractor,
            responder,
            cost: self.cost,
            classify: self.classify,
            missing: self.missing,
        }
    }

    /// Answers as a gRPC server: [`Grpc`].
    pub fn grpc(self) -> RateLimitLayer<L, K, Grpc, C, V> {
        self.responder(Grpc::new())
    }

    /// The cost of each request: a fixed `u64` or a closure
    /// `Fn(&Req) -> u64` (see [`Cost`](super::Cost)).
    pub fn cost<C2>(self, cost: C2) -> RateLimitLayer<L, K, R, C2, V> {
        RateLimitLayer {
            limiter: self.limiter,
            extractor: self.extractor,
            responder: self.responder,
            cost,
            classify: self.classify,
            missing: self.missing,
        }
    }

    /// Counts requests by their response: `classify` (a closure
    /// `Fn(&Res) -> Outcome`) says whether each one counts. See
    /// [`Classify`](super::Classify) for what changes.
    pub fn classify<V2>(self, classify: V2) -> RateLimitLayer<L, K, R, C, V2> {
        RateLimitLayer {
            limiter: self.limiter,
            extractor: self.extractor,
            responder: self.responder,
            cost: self.cost,
            classify,
            missing: self.missing,
        }
    }

    /// Reserve, then settle: each request's [cost](Self::cost) is an
    /// estimate, reserved before the request is handed on and settled with
    /// the real cost that `usage` (a closure `Fn(&Res) -> Option<u64>`)
    /// reads from the response. See [`SettleWith`](super::SettleWith).
    pub fn settle<F>(self, usage: F) -> RateLimitLayer<L, K, R, C, super::SettleWith<F>> {
        self.classify(super::SettleWith(usage))
    }

    /// What to do with a request that has no key (default: reject).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.missing = missing;
        self
    }
}

impl<L: Clone, K: Clone, R: Clone, C: Clone, V: Clone> Clone for RateLimitLayer<L, K, R, C, V> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            extractor: self.extractor.clone(),
            responder: self.responder.clone(),
            cost: self.cost.clone(),
            classify: self.classify.clone(),
            missing: self.missing.clone(),
        }
    }
}

impl<L: fmt::Debug, K, R: fmt::Debug, C, V> fmt::Debug for RateLimitLayer<L, K, R, C, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .field("extractor", &std::any::type_name::<K>())
            .field("responder", &self.responder)
            .field("cost", &std::any::type_name::<C>())
            .field("classify", &std::any::type_name::<V>())
            .field("missing", &self.missing)
            .finish()
    }
}

impl<S, L, K, R, C, V> Layer<S> for RateLimitLayer<L, K, R, C, V>
where
    L: Clone,
    K: Clone,
    R: Clone,
    C: Clone,
    V: Clone,
{
    type Service = RateLimit<S, L, K, R, C, V>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::from_parts(
            inner,
            Arc::new(Shared {
                limiter: self.limiter.clone(),
                extractor: self.extractor.clone(),
                cost: self.cost.clone(),
                missing: self.missing.clone(),
            }),
            Arc::new(Post {
                responder: self.responder.clone(),
                classify: self.classify.clone(),
            }),
        )
    }
}
