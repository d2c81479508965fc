//! Slow, stalled and oversized bodies against [`BufferBody`].

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use tollgate_limiter::{Key, Limiter, SlidingWindow};
use tollgate_memory::MemoryBackend;
use tower::{Layer, ServiceExt, service_fn};

use super::{BodyKey, BufferBodyLayer, DEFAULT_READ_TIMEOUT, FromBody};
use crate::RateLimitLayer;

/// A request body sent chunk by chunk, that may stall (never end) after
/// its last chunk, as a client that stops sending does.
enum TestBody {
    Chunks {
        chunks: VecDeque<Bytes>,
        stall: bool,
    },
    Full(Option<Bytes>),
    /// A body whose read fails (a connection reset mid-body).
    Broken,
}

impl TestBody {
    fn chunks(chunks: impl IntoIterator<Item = Vec<u8>>, stall: bool) -> Self {
        Self::Chunks {
            chunks: chunks.into_iter().map(Bytes::from).collect(),
            stall,
        }
    }
}

impl From<Bytes> for TestBody {
    fn from(b: Bytes) -> Self {
        Self::Full(Some(b))
    }
}

impl Body for TestBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            Self::Chunks { chunks, stall } => match chunks.pop_front() {
                Some(c) => Poll::Ready(Some(Ok(Frame::data(c)))),
                // Stalled: nothing will ever wake this body again.
                None if *stall => Poll::Pending,
                None => Poll::Ready(None),
            },
            Self::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Self::Broken => Poll::Ready(Some(Err(std::io::ErrorKind::ConnectionReset.into()))),
        }
    }
}

fn any_key(_: &Parts, _: &[u8]) -> Option<Key> {
    Some(Key::new("k"))
}

type Extract = fn(&Parts, &[u8]) -> Option<Key>;

/// A handler that counts its calls and echoes the body's length.
fn handler(
    calls: &Arc<AtomicUsize>,
) -> impl tower_service::Service<
    Request<TestBody>,
    Response = Response<String>,
    Error = Infallible,
    Future: Send,
> + Clone
+ Send
+ use<> {
    let calls = Arc::clone(calls);
    service_fn(move |req: Request<TestBody>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let len = match req.into_body() {
            TestBody::Full(b) => b.map_or(0, |b| b.len()),
            TestBody::Chunks { .. } | TestBody::Broken => usize::MAX,
        };
        async move { Ok::<_, Infallible>(Response::new(len.to_string())) }
    })
}

fn req(body: TestBody) -> Request<TestBody> {
    Request::post("/").body(body).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_stalled_body_is_refused_with_408_at_the_default_deadline() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = BufferBodyLayer::new(1024, any_key as Extract).layer(handler(&calls));
    let start = tokio::time::Instant::now();
    let stalled = svc.oneshot(req(TestBody::chunks([b"{\"email\":".to_vec()], true)));
    // Without a deadline the stalled body would be waited for for ever.
    let res = tokio::time::timeout(Duration::from_secs(3600), stalled)
        .await
        .expect("the read deadline answers")
        .unwrap();
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(start.elapsed(), DEFAULT_READ_TIMEOUT);
    assert_eq!(DEFAULT_READ_TIMEOUT, Duration::from_secs(10));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(
        res.headers()[http::header::CONTENT_TYPE],
        "application/problem+json"
    );
}

#[tokio::test(start_paused = true)]
async fn the_deadline_is_configurable_and_can_be_turned_off() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = BufferBodyLayer::new(1024, any_key as Extract);

    let svc = layer
        .clone()
        .read_timeout(Some(Duration::from_secs(1)))
        .layer(handler(&calls));
    let start = tokio::time::Instant::now();
    let res = svc
        .oneshot(req(TestBody::chunks([b"x".to_vec()], true)))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(start.elapsed(), Duration::from_secs(1));

    // Without a deadline, a stalled body is still waited for an hour on.
    let svc = layer.read_timeout(None).layer(handler(&calls));
    let waiting = svc.oneshot(req(TestBody::chunks([b"x".to_vec()], true)));
    assert!(
        tokio::time::timeout(Duration::from_secs(3600), waiting)
            .await
            .is_err()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_body_in_time_passes_intact() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = BufferBodyLayer::new(1024, any_key as Extract).layer(handler(&calls));
    let res = svc
        .oneshot(req(TestBody::chunks(
            [b"abc".to_vec(), b"defg".to_vec()],
            false,
        )))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A limiter behind a `BufferBodyLayer`, over a healthy memory backend.
fn limited(
    extract: Extract,
    calls: &Arc<AtomicUsize>,
) -> impl tower_service::Service<
    Request<TestBody>,
    Response = Response<crate::ResponseBody<crate::ResponseBody<String>>>,
    Error = Infallible,
> {
    let limiter = Limiter::new(
        "body",
        SlidingWindow::new(1000, Duration::from_secs(60)).unwrap(),
        MemoryBackend::new(),
    );
    BufferBodyLayer::new(1024, extract)
        .layer(RateLimitLayer::new(limiter, FromBody).layer(handler(calls)))
}

#[tokio::test]
async fn a_body_that_fails_to_read_is_refused_with_400() {
    let calls = Arc::new(AtomicUsize::new(0));
    let res = limited(any_key, &calls)
        .oneshot(req(TestBody::Broken))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// A `BodyKey` another layer put on the request (an outer
/// `BufferBodyLayer` with its own extractor) is not this body's key: a
/// body in which this layer finds none reaches the limiter keyless, and
/// the missing-key policy (reject, by default) decides.
#[tokio::test]
async fn a_body_without_a_key_does_not_keep_a_key_set_before() {
    fn no_key(_: &Parts, _: &[u8]) -> Option<Key> {
        None
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let mut r = req(TestBody::from(Bytes::from_static(b"{}")));
    r.extensions_mut().insert(BodyKey(Key::new("outer")));
    let res = limited(no_key, &calls).oneshot(r).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

proptest::proptest! {
    /// Whatever the body (its size, its chunks, a lying `Content-Length`,
    /// a stall), nothing panics, and a request never reaches the handler
    /// behind a fail-closed limiter whose backend is down: it is refused
    /// for its body (413, 408) or by the limiter (503).
    #[test]
    fn no_body_bypasses_a_fail_closed_limiter(
        chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..40), 0..6),
        limit in 0usize..100,
        declared in proptest::option::of(0u64..200),
        stall in proptest::bool::ANY,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let total: usize = chunks.iter().map(Vec::len).sum();
        let status = rt.block_on(async {
            let backend = MemoryBackend::new();
            backend.set_failing(true);
            let limiter = Limiter::new(
                "body",
                SlidingWindow::new(1000, Duration::from_secs(60)).unwrap(),
                backend,
            );
            let calls = Arc::new(AtomicUsize::new(0));
            let svc = BufferBodyLayer::new(limit, any_key as Extract)
                .layer(RateLimitLayer::new(limiter, FromBody).layer(handler(&calls)));
            let mut r = req(TestBody::chunks(chunks, stall));
            if let Some(n) = declared {
                r.headers_mut().insert(http::header::CONTENT_LENGTH, n.into());
            }
            let status = svc.oneshot(r).await.unwrap().status();
            assert_eq!(calls.load(Ordering::SeqCst), 0);
            status
        });
        let want = if declared.is_some_and(|n| n > limit as u64) || total > limit {
            StatusCode::PAYLOAD_TOO_LARGE
        } else if stall {
            StatusCode::REQUEST_TIMEOUT
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        proptest::prop_assert_eq!(status, want);
    }
}
