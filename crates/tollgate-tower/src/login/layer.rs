use std::fmt;
use std::sync::Arc;

use tollgate_core::{Backend, Limiter};
use tower_layer::Layer;

use super::classify::FailedLogins;
use crate::buffer_body::{BufferBody, Email, FromBody};
use crate::extract::ClientIp;
use crate::inbound::{RateLimit, Upfront};
use crate::respond::Http;
use crate::{BufferBodyLayer, RateLimitLayer};

/// The largest login body read by default: 16 KiB.
pub const DEFAULT_BODY_LIMIT: usize = 16 * 1024;

/// The service [`LoginLayer`] makes: per-IP limit, then body buffering,
/// then per-account delay, then the login handler `S`.
pub type Login<S, B> = RateLimit<
    BufferBody<RateLimit<S, Limiter<B>, FromBody, Http, u64, FailedLogins>, Email>,
    Limiter<B>,
    ClientIp,
    Http,
    u64,
    Upfront,
>;

/// Login protection in one layer; see the [module docs](super).
///
/// Cheap to clone; clones (and every service made from them) share the
/// two limiters, so they count against the same limits.
#[must_use]
pub struct LoginLayer<B> {
    per_ip: Limiter<B>,
    per_account: Limiter<B>,
    client_ip: ClientIp,
    email: Arc<str>,
    body_limit: usize,
    classify: FailedLogins,
}

impl<B: Backend> LoginLayer<B> {
    /// Limits each client (found by `client_ip`, which knows the trusted
    /// proxies) with `per_ip`, and each account with `per_account` (a
    /// [`ProgressiveDelay`](tollgate_core::ProgressiveDelay)), the account
    /// being the `email` field of a JSON or form body of at most 16 KiB,
    /// counted by response status ([`FailedLogins::by_status`]).
    pub fn new(per_ip: Limiter<B>, per_account: Limiter<B>, client_ip: ClientIp) -> Self {
        Self {
            per_ip,
            per_account,
            client_ip,
            email: Arc::from("email"),
            body_limit: DEFAULT_BODY_LIMIT,
            classify: FailedLogins::by_status(),
        }
    }
}

impl<B> LoginLayer<B> {
    /// The body field holding the email (default `email`).
    pub fn email_field(mut self, field: &str) -> Self {
        self.email = Arc::from(field);
        self
    }

    /// The largest body read (default 16 KiB); a larger one is refused
    /// with `413` before the handler (and before the account is known).
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.body_limit = limit;
        self
    }

    /// Whether failures and successes are read from the response status
    /// (the default) or reported by the handler through
    /// [`LoginAttempts`](super::LoginAttempts) (`false`).
    pub fn count_by_status(mut self, yes: bool) -> Self {
        self.classify = if yes {
            FailedLogins::by_status()
        } else {
            FailedLogins::explicit()
        };
        self
    }
}

impl<B> Clone for LoginLayer<B> {
    fn clone(&self) -> Self {
        Self {
            per_ip: self.per_ip.clone(),
            per_account: self.per_account.clone(),
            client_ip: self.client_ip.clone(),
            email: Arc::clone(&self.email),
            body_limit: self.body_limit,
            classify: self.classify,
        }
    }
}

impl<B> fmt::Debug for LoginLayer<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginLayer")
            .field("per_ip", &self.per_ip)
            .field("per_account", &self.per_account)
            .field("client_ip", &self.client_ip)
            .field("email", &self.email)
            .field("body_limit", &self.body_limit)
            .field("classify", &self.classify)
            .finish()
    }
}

impl<S, B: Backend> Layer<S> for LoginLayer<B> {
    type Service = Login<S, B>;

    fn layer(&self, inner: S) -> Self::Service {
        let per_account = RateLimitLayer::new(self.per_account.clone(), FromBody)
            .classify(self.classify)
            .layer(inner);
        let buffered = BufferBodyLayer::new(self.body_limit, Email::field(Arc::clone(&self.email)))
            .layer(per_account);
        RateLimitLayer::new(self.per_ip.clone(), self.client_ip.clone()).layer(buffered)
    }
}
