//! The response future of [`BufferBody`](super::BufferBody).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::extractor::{BodyExtractor, BodyKey};
use crate::respond::ResponseBody;
use crate::respond::http_responder::problem;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Buffered = Result<(Parts, Bytes), StatusCode>;

pin_project! {
    /// The response future of [`BufferBody`](super::BufferBody).
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        Buffering {
            buffer: BoxFuture<Buffered>,
            service: Option<S>,
        },
        Inner {
            #[pin]
            fut: S::Future,
        },
        Rejected {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn buffering(buffer: BoxFuture<Buffered>, service: S) -> Self {
        Self {
            state: State::Buffering {
                buffer,
                service: Some(service),
            },
        }
    }

    pub(crate) fn rejected(response: Response<Bytes>) -> Self {
        Self {
            state: State::Rejected {
                response: Some(response),
            },
        }
    }
}

/// Reads at most `limit` bytes of `body` within `deadline`, then records
/// the key the extractor finds in them.
pub(crate) fn buffer<B, E>(
    mut parts: Parts,
    body: B,
    limit: usize,
    deadline: Option<Duration>,
    extractor: Arc<E>,
) -> BoxFuture<Buffered>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: BodyExtractor + Send + Sync + 'static,
{
    Box::pin(async move {
        let collect = Limited::new(body, limit).collect();
        let collected = match deadline {
            // The whole body within the deadline, not each chunk: a client
            // trickling a byte a second must not hold the buffer for ever.
            Some(d) => match tokio::time::timeout(d, collect).await {
                Ok(collected) => collected,
                Err(_elapsed) => return Err(StatusCode::REQUEST_TIMEOUT),
            },
            None => collect.await,
        };
        let bytes = match collected {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<LengthLimitError>() => return Err(StatusCode::PAYLOAD_TOO_LARGE),
            Err(_) => return Err(StatusCode::BAD_REQUEST),
        };
        // A key set before (by another `BufferBody`) is not this body's:
        // without one, the request goes on keyless.
        match extractor.extract(&parts, &bytes) {
            Some(key) => parts.extensions.insert(BodyKey(key)),
            None => parts.extensions.remove::<BodyKey>(),
        };
        Ok((parts, bytes))
    })
}

pub(crate) fn refusal(status: StatusCode) -> Response<Bytes> {
    let detail = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "The request body is larger than this endpoint accepts.",
        StatusCode::REQUEST_TIMEOUT => "The request body did not arrive in time.",
        _ => "The request body could not be read.",
    };
    let mut res = Response::new(problem(status, "about:blank", detail, None));
    *res.status_mut() = status;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/problem+json"),
    );
    res
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: From<Bytes>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Buffering { buffer, service } => {
                    match ready!(buffer.as_mut().poll(cx)) {
                        Ok((parts, bytes)) => {
                            let mut service = service.take().expect("polled after completion");
                            let req = Request::from_parts(parts, ReqBody::from(bytes));
                            this.state.set(State::Inner {
                                fut: service.call(req),
                            });
                        }
                        Err(status) => {
                            tracing::debug!(%status, "request body refused");
                            this.state.set(State::Rejected {
                                response: Some(refusal(status)),
                            });
                        }
                    }
                }
                StateProj::Inner { fut } => {
                    let res = ready!(fut.poll(cx))?;
                    return Poll::Ready(Ok(res.map(ResponseBody::inner)));
                }
                StateProj::Rejected { response } => {
                    let res = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(res.map(ResponseBody::full)));
                }
            }
        }
    }
}

impl<S, ReqBody> fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Buffering { .. } => "Buffering",
            State::Inner { .. } => "Inner",
            State::Rejected { .. } => "Rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
