//! The response future of [`ConcurrencyLimit`](super::ConcurrencyLimit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tollgate_limiter::{Backend, KeptPermit, Key, Permit, Verdict};
use tower_service::Service;

use super::body::PermitBody;
use super::service::Shared;
use crate::inbound::future::{Answer, Pass, answer, respond_allowed};
use crate::respond::Respond;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

pin_project! {
    /// The response future of [`ConcurrencyLimit`](super::ConcurrencyLimit):
    /// takes a slot, then calls the inner service (holding the slot until
    /// its response body ends) or answers the refusal.
    pub struct ResponseFuture<S, Req, B, K, R>
    where
        S: Service<Req>,
        B: Backend,
        R: Respond<http::Response<PermitBody<ResBody<S, Req>, B>>>,
        S::Response: HasBody,
    {
        #[pin]
        state: State<S, Req, B, R::Response>,
        shared: Arc<Shared<B, K, R>>,
        pass: Pass,
    }
}

/// The body type of an `http::Response` (to name the inner body in the
/// future's bounds).
pub trait HasBody: sealed::Sealed {
    /// The body.
    type Body;
}

impl<Bd> HasBody for http::Response<Bd> {
    type Body = Bd;
}

mod sealed {
    pub trait Sealed {}
    impl<Bd> Sealed for http::Response<Bd> {}
}

type ResBody<S, Req> = <<S as Service<Req>>::Response as HasBody>::Body;

pin_project! {
    #[project = StateProj]
    enum State<S, Req, B, Out>
    where
        S: Service<Req>,
        B: Backend,
    {
        Holding {
            hold: BoxFuture<(Verdict, Option<Permit<B>>)>,
            service: Option<S>,
            req: Option<Req>,
        },
        Inner {
            #[pin]
            fut: S::Future,
            // Dropped with the future (an error, a panic, a caller gone):
            // the slot is given back. Renewed meanwhile (see PermitBody).
            permit: Option<KeptPermit<B>>,
        },
        Rejected {
            response: Option<Out>,
        },
    }
}

impl<S, Req, B, K, R, ResB> ResponseFuture<S, Req, B, K, R>
where
    S: Service<Req, Response = http::Response<ResB>>,
    B: Backend,
    R: Respond<http::Response<PermitBody<ResB, B>>>,
{
    pub(crate) fn holding(key: Key, service: S, req: Req, shared: Arc<Shared<B, K, R>>) -> Self {
        let limiter = shared.limiter.clone();
        let hold: BoxFuture<(Verdict, Option<Permit<B>>)> =
            Box::pin(async move { limiter.hold(&key).await });
        Self {
            state: State::Holding {
                hold,
                service: Some(service),
                req: Some(req),
            },
            shared,
            pass: Pass::Bare,
        }
    }

    /// Handed on holding no slot, answered as `pass` says.
    pub(crate) fn passed(fut: S::Future, pass: Pass, shared: Arc<Shared<B, K, R>>) -> Self {
        Self {
            state: State::Inner { fut, permit: None },
            shared,
            pass,
        }
    }

    pub(crate) fn rejected(response: R::Response, shared: Arc<Shared<B, K, R>>) -> Self {
        Self {
            state: State::Rejected {
                response: Some(response),
            },
            shared,
            pass: Pass::Bare,
        }
    }
}

impl<S, Req, B, K, R, ResB> Future for ResponseFuture<S, Req, B, K, R>
where
    S: Service<Req, Response = http::Response<ResB>>,
    B: Backend,
    R: Respond<http::Response<PermitBody<ResB, B>>>,
{
    type Output = Result<R::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Holding { hold, service, req } => {
                    let (verdict, permit) = ready!(hold.as_mut().poll(cx));
                    let shared = &**this.shared;
                    // The key only feeds the debug log.
                    let key = permit
                        .as_ref()
                        .map_or_else(|| Key::new("-"), |p| p.key().clone());
                    match answer(&shared.responder, &shared.limiter, &key, verdict) {
                        Answer::Pass(pass) => {
                            *this.pass = pass;
                            let mut service = service.take().expect("polled after completion");
                            let req = req.take().expect("polled after completion");
                            this.state.set(State::Inner {
                                fut: service.call(req),
                                permit: permit.map(Permit::keep_alive),
                            });
                        }
                        Answer::Refuse(response) => this.state.set(State::Rejected {
                            response: Some(response),
                        }),
                    }
                }
                StateProj::Inner { fut, permit } => {
                    let response = ready!(fut.poll(cx))?;
                    let response = response.map(|b| PermitBody::new(b, permit.take()));
                    let shared = &**this.shared;
                    return Poll::Ready(Ok(respond_allowed(
                        &shared.responder,
                        response,
                        Some(&shared.limiter),
                        this.pass,
                    )));
                }
                StateProj::Rejected { response } => {
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(response));
                }
            }
        }
    }
}

impl<S, Req, B, K, R> fmt::Debug for ResponseFuture<S, Req, B, K, R>
where
    S: Service<Req>,
    B: Backend,
    R: Respond<http::Response<PermitBody<ResBody<S, Req>, B>>>,
    S::Response: HasBody,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Holding { .. } => "Holding",
            State::Inner { .. } => "Inner",
            State::Rejected { .. } => "Rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
