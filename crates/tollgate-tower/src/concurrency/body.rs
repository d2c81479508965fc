//! A response body that holds a concurrency slot until it ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tollgate_limiter::{Backend, KeptPermit};

pin_project! {
    /// The inner response's body, holding the request's slot
    /// ([`KeptPermit`]: its lease renewed, as a client reading slowly
    /// decides how long the body lasts) until the body ends: its last
    /// frame, an error, or the body dropped. Made by
    /// [`ConcurrencyLimit`](super::ConcurrencyLimit).
    pub struct PermitBody<Bd, B: Backend> {
        #[pin]
        inner: Bd,
        permit: Option<KeptPermit<B>>,
    }
}

impl<Bd, B: Backend> PermitBody<Bd, B> {
    pub(crate) fn new(inner: Bd, permit: Option<KeptPermit<B>>) -> Self {
        Self { inner, permit }
    }

    /// Whether the body still holds its slot.
    pub fn holds_slot(&self) -> bool {
        self.permit.is_some()
    }
}

impl<Bd: Body, B: Backend> Body for PermitBody<Bd, B> {
    type Data = Bd::Data;
    type Error = Bd::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = this.inner.poll_frame(cx);
        if matches!(&frame, Poll::Ready(None | Some(Err(_)))) {
            // The response has ended: give the slot back now.
            this.permit.take();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<Bd: Default, B: Backend> Default for PermitBody<Bd, B> {
    fn default() -> Self {
        Self::new(Bd::default(), None)
    }
}

impl<Bd: fmt::Debug, B: Backend> fmt::Debug for PermitBody<Bd, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitBody")
            .field("inner", &self.inner)
            .field("permit", &self.permit)
            .finish()
    }
}
