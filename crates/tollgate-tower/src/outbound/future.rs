//! The response future of [`Adaptive`](super::Adaptive).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;
use tollgate_limiter::aimd::Outcome;
use tower_service::Service;

use super::layer::Classify;

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A call's scope at its limiter.
pub(crate) trait Gate: Send {
    /// Waits for a token of the scope.
    fn token(&self) -> BoxFuture<()>;

    /// Whether this worker knows the scope to be held (a `Retry-After`).
    fn held(&self) -> bool;

    /// Reports the source's answer. On a tokio runtime the report runs as
    /// a task of its own, started at the first poll: a caller that gives
    /// up once the source has answered (a timeout around the client) does
    /// not lose what the source said (see `AimdLimiter::feedback`).
    fn report(&self, outcome: Outcome) -> BoxFuture<()>;
}

pin_project! {
    /// The response future of [`Adaptive`](super::Adaptive): waits for a
    /// token, waits for the inner service to be ready, calls it, reports
    /// the response, returns it.
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        // `None` for a call without a scope.
        gate: Option<Box<dyn Gate>>,
        classify: Classify,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        Waiting {
            token: BoxFuture<()>,
            call: Option<(S, Req)>,
        },
        // The token is granted: the service is made ready, then called.
        Ready {
            call: Option<(S, Req)>,
        },
        Inner {
            #[pin]
            fut: S::Future,
        },
        Reporting {
            report: BoxFuture<()>,
            result: Option<Result<S::Response, S::Error>>,
        },
    }
}

impl<S: Service<Req>, Req> ResponseFuture<S, Req> {
    pub(crate) fn waiting(service: S, req: Req, gate: Box<dyn Gate>, classify: Classify) -> Self {
        Self {
            state: State::Waiting {
                token: gate.token(),
                call: Some((service, req)),
            },
            gate: Some(gate),
            classify,
        }
    }

    /// A call without a scope: not limited, not reported.
    pub(crate) fn unlimited(fut: S::Future) -> Self {
        Self {
            state: State::Inner { fut },
            gate: None,
            classify: |_, _| Outcome::Failed,
        }
    }
}

impl<S, Req, ResBody> Future for ResponseFuture<S, Req>
where
    S: Service<Req, Response = Response<ResBody>> + Clone,
{
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Waiting { token, call } => {
                    ready!(token.as_mut().poll(cx));
                    let call = call.take().expect("polled after completion");
                    this.state.set(State::Ready { call: Some(call) });
                }
                StateProj::Ready { call } => {
                    let (service, _) = call.as_mut().expect("polled after completion");
                    let ready = ready!(service.poll_ready(cx));
                    let (mut service, req) = call.take().expect("polled after completion");
                    // Not sent: it says nothing about the rate.
                    ready?;
                    let gate = this.gate.as_ref().expect("a waiting call has a gate");
                    // The source asked for a hold since the token was
                    // granted (another call's answer, while this one
                    // waited for the client or its caller held it
                    // unpolled): it waits the hold out for a new token, and
                    // what the ready client reserved goes back meanwhile.
                    if gate.held() {
                        let unready = service.clone();
                        drop(service);
                        this.state.set(State::Waiting {
                            token: gate.token(),
                            call: Some((unready, req)),
                        });
                        continue;
                    }
                    let fut = service.call(req);
                    this.state.set(State::Inner { fut });
                }
                StateProj::Inner { fut } => {
                    let result = ready!(fut.poll(cx));
                    let outcome = match &result {
                        Ok(response) => (this.classify)(response.status(), response.headers()),
                        // A transport error says nothing about the rate.
                        Err(_) => Outcome::Failed,
                    };
                    // Polled at once, in this poll: the report starts (a
                    // refusal's hold is known to this worker) before the
                    // calls waiting for the client this call leaves run.
                    let report = match this.gate.as_ref() {
                        Some(gate) if outcome != Outcome::Failed => gate.report(outcome),
                        _ => return Poll::Ready(result),
                    };
                    this.state.set(State::Reporting {
                        report,
                        result: Some(result),
                    });
                }
                StateProj::Reporting { report, result } => {
                    ready!(report.as_mut().poll(cx));
                    return Poll::Ready(result.take().expect("polled after completion"));
                }
            }
        }
    }
}

impl<S: Service<Req>, Req> fmt::Debug for ResponseFuture<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
