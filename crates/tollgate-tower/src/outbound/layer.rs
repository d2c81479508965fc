use std::fmt;

use http::{HeaderMap, StatusCode};
use tollgate_limiter::aimd::{AimdLimiter, Outcome};
use tower_layer::Layer;

use super::classify::{Host, classify};
use super::service::Adaptive;

/// How a response is read as feedback for the limiter.
pub(crate) type Classify = fn(StatusCode, &HeaderMap) -> Outcome;

/// Applies [`Adaptive`] to an HTTP client service: each call waits for a
/// token of its scope from an [`AimdLimiter`], then reports the response
/// to it.
///
/// The scope comes from an [extractor](crate::extract::KeyExtractor), by
/// default [`Host`] (one adaptive rate per remote host and port); a call
/// without a scope is not limited. Responses are read by [`classify`]
/// unless [`classify_with`](Self::classify_with) says otherwise.
///
/// The layer is cheap to clone. Its limiter is shared: every service made
/// from the layer, and every clone of it, spends the same tokens, and so do
/// other workers over the same backend.
///
/// See the [module docs](super) for an example.
#[must_use]
pub struct AdaptiveLayer<B, E = Host> {
    limiter: AimdLimiter<B>,
    scope: E,
    classify: Classify,
}

impl<B> AdaptiveLayer<B, Host> {
    /// Limits calls per remote host with `limiter`.
    pub fn new(limiter: AimdLimiter<B>) -> Self {
        Self {
            limiter,
            scope: Host,
            classify,
        }
    }
}

impl<B, E> AdaptiveLayer<B, E> {
    /// Takes each call's scope (an account, a site) from `scope`, a
    /// [`KeyExtractor`](crate::extract::KeyExtractor) such as a closure
    /// `Fn(&http::Request<_>) -> Option<Key>`.
    pub fn scope<E2>(self, scope: E2) -> AdaptiveLayer<B, E2> {
        AdaptiveLayer {
            limiter: self.limiter,
            scope,
            classify: self.classify,
        }
    }

    /// Reads responses with `classify` instead of the default
    /// [`classify`](super::classify()).
    pub fn classify_with(mut self, classify: fn(StatusCode, &HeaderMap) -> Outcome) -> Self {
        self.classify = classify;
        self
    }
}

impl<B, E: Clone> Clone for AdaptiveLayer<B, E> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            scope: self.scope.clone(),
            classify: self.classify,
        }
    }
}

impl<B, E> fmt::Debug for AdaptiveLayer<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLayer")
            .field("limiter", &self.limiter)
            .field("scope", &std::any::type_name::<E>())
            .finish_non_exhaustive()
    }
}

impl<S, B, E: Clone> Layer<S> for AdaptiveLayer<B, E> {
    type Service = Adaptive<S, B, E>;

    fn layer(&self, inner: S) -> Self::Service {
        Adaptive::new(
            inner,
            self.limiter.clone(),
            self.scope.clone(),
            self.classify,
        )
    }
}
