use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::extractor::Email;
use super::service::BufferBody;

/// Applies [`BufferBody`]: reads the body up to `limit` bytes and records
/// the key an extractor finds in it. See the [module docs](super).
///
/// Cheap to clone; clones share the extractor.
#[must_use]
pub struct BufferBodyLayer<E> {
    limit: usize,
    extractor: Arc<E>,
}

impl<E> BufferBodyLayer<E> {
    /// Buffers bodies of up to `limit` bytes and finds the key with
    /// `extractor` (a [`BodyExtractor`](super::BodyExtractor)).
    pub fn new(limit: usize, extractor: E) -> Self {
        Self {
            limit,
            extractor: Arc::new(extractor),
        }
    }
}

impl BufferBodyLayer<Email> {
    /// The email in JSON or form field `field`, in bodies of up to `limit`
    /// bytes.
    pub fn email(field: &str, limit: usize) -> Self {
        Self::new(limit, Email::field(field))
    }
}

impl<E> Clone for BufferBodyLayer<E> {
    fn clone(&self) -> Self {
        Self {
            limit: self.limit,
            extractor: Arc::clone(&self.extractor),
        }
    }
}

impl<E> fmt::Debug for BufferBodyLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferBodyLayer")
            .field("limit", &self.limit)
            .field("extractor", &std::any::type_name::<E>())
            .finish()
    }
}

impl<S, E> Layer<S> for BufferBodyLayer<E> {
    type Service = BufferBody<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        BufferBody::new(inner, self.limit, Arc::clone(&self.extractor))
    }
}
