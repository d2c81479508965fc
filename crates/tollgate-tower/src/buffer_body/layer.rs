use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::KeyHasher;
use tower_layer::Layer;

use super::extractor::Email;
use super::service::BufferBody;

/// How long a body may take to arrive by default: 10 seconds. A login
/// form or a webhook payload of a few KiB takes milliseconds even on a
/// poor mobile link; ten seconds leaves room for that and still frees a
/// connection held open by a client that trickles its body.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Applies [`BufferBody`]: reads the body up to `limit` bytes and records
/// the key an extractor finds in it. See the [module docs](super).
///
/// Cheap to clone; clones share the extractor.
#[must_use]
pub struct BufferBodyLayer<E> {
    limit: usize,
    read_timeout: Option<Duration>,
    extractor: Arc<E>,
}

impl<E> BufferBodyLayer<E> {
    /// Buffers bodies of up to `limit` bytes, arriving within
    /// [`DEFAULT_READ_TIMEOUT`], and finds the key with `extractor` (a
    /// [`BodyExtractor`](super::BodyExtractor)).
    pub fn new(limit: usize, extractor: E) -> Self {
        Self {
            limit,
            read_timeout: Some(DEFAULT_READ_TIMEOUT),
            extractor: Arc::new(extractor),
        }
    }

    /// How long the whole body may take to arrive (default
    /// [`DEFAULT_READ_TIMEOUT`], 10 s); a slower one is answered
    /// `408 Request Timeout` and never reaches the service. `None` waits
    /// for ever: only behind a proxy that enforces its own body timeout
    /// (nginx's `client_body_timeout`).
    ///
    /// The deadline is a tokio timer: the service must run on a tokio
    /// runtime with timers enabled, as hyper, axum and tonic servers do.
    pub fn read_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.read_timeout = timeout;
        self
    }
}

impl BufferBodyLayer<Email> {
    /// The email in JSON or form field `field`, in bodies of up to `limit`
    /// bytes, hashed by `hasher`.
    pub fn email(field: &str, limit: usize, hasher: KeyHasher) -> Self {
        Self::new(limit, Email::field(field, hasher))
    }
}

impl<E> Clone for BufferBodyLayer<E> {
    fn clone(&self) -> Self {
        Self {
            limit: self.limit,
            read_timeout: self.read_timeout,
            extractor: Arc::clone(&self.extractor),
        }
    }
}

impl<E> fmt::Debug for BufferBodyLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferBodyLayer")
            .field("limit", &self.limit)
            .field("read_timeout", &self.read_timeout)
            .field("extractor", &std::any::type_name::<E>())
            .finish()
    }
}

impl<S, E> Layer<S> for BufferBodyLayer<E> {
    type Service = BufferBody<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        BufferBody::new(
            inner,
            self.limit,
            self.read_timeout,
            Arc::clone(&self.extractor),
        )
    }
}
