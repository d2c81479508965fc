use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::extractor::BodyExtractor;
use super::future::{ResponseFuture, buffer, refusal};

/// Buffers the request body up to a bound, records the key found in it as
/// a [`BodyKey`](super::BodyKey) and hands the request on with the same
/// bytes. Made by [`BufferBodyLayer`](super::BufferBodyLayer).
pub struct BufferBody<S, E> {
    inner: S,
    limit: usize,
    read_timeout: Option<Duration>,
    extractor: Arc<E>,
}

impl<S, E> BufferBody<S, E> {
    pub(crate) fn new(
        inner: S,
        limit: usize,
        read_timeout: Option<Duration>,
        extractor: Arc<E>,
    ) -> Self {
        Self {
            inner,
            limit,
            read_timeout,
            extractor,
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

impl<S: Clone, E> Clone for BufferBody<S, E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limit: self.limit,
            read_timeout: self.read_timeout,
            extractor: Arc::clone(&self.extractor),
        }
    }
}

impl<S: fmt::Debug, E> fmt::Debug for BufferBody<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferBody")
            .field("inner", &self.inner)
            .field("limit", &self.limit)
            .field("read_timeout", &self.read_timeout)
            .field("extractor", &std::any::type_name::<E>())
            .finish()
    }
}

impl<S, E, ReqBody, ResBody> Service<Request<ReqBody>> for BufferBody<S, E>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    E: BodyExtractor + Send + Sync + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<crate::respond::ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.limit as u64) {
            return ResponseFuture::rejected(refusal(http::StatusCode::PAYLOAD_TOO_LARGE));
        }
        let clone = self.inner.clone();
        let inner = mem::replace(&mut self.inner, clone);
        let (parts, body) = req.into_parts();
        ResponseFuture::buffering(
            buffer(
                parts,
                body,
                self.limit,
                self.read_timeout,
                Arc::clone(&self.extractor),
            ),
            inner,
        )
    }
}
