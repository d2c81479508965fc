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

/// Reports a call's outcome to the limiter, for the call's scope.
pub(crate) type Report = Box<dyn FnOnce(Outcome) -> BoxFuture<()> + Send>;

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
            call: Option<(S, Req, Report)>,
        },
        // The token is granted: the service is made ready, then called.
        Ready {
            call: Option<(S, Req, Report)>,
        },
        Inner {
            #[pin]
            fut: S::Future,
            report: Option<Report>,
        },
        Reporting {
            report: BoxFuture<()>,
            result: Option<Result<S::Response, S::Error>>,
        },
    }
}

impl<S: Service<Req>, Req> ResponseFuture<S, Req> {
    pub(crate) fn waiting(
        token: BoxFuture<()>,
        service: S,
        req: Req,
        report: Report,
        classify: Classify,
    ) -> Self {
        Self {
            state: State::Waiting {
                token,
                call: Some((service, req, report)),
            },
            classify,
        }
    }

    /// A call without a scope: not limited, not reported.
    pub(crate) fn unlimited(fut: S::Future) -> Self {
        Self {
            state: State::Inner { fut, report: None },
            classify: |_, _| Outcome::Failed,
        }
    }
}

/// Runs a report as a task of its own, the response waiting for it: a
/// caller that gives up once the source has answered (a timeout around
/// the client) must not lose what the source said. A refusal half-reported
/// would be worse than lost: the cut's gate, taken locally before the
/// backend is asked, keeps this worker from cutting again for a reaction
/// window.
fn spawned(report: BoxFuture<()>) -> BoxFuture<()> {
    let task = tokio::spawn(report);
    Box::pin(async move {
        let _ = task.await;
    })
}

impl<S, Req, ResBody> Future for ResponseFuture<S, Req>
where
    S: Service<Req, Response = Response<ResBody>>,
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
                    let (service, _, _) = call.as_mut().expect("polled after completion");
                    let ready = ready!(service.poll_ready(cx));
                    let (mut service, req, report) = call.take().expect("polled after completion");
                    // Not sent: it says nothing about the rate.
                    ready?;
                    let fut = service.call(req);
                    this.state.set(State::Inner {
                        fut,
                        report: Some(report),
                    });
                }
                StateProj::Inner { fut, report } => {
                    let result = ready!(fut.poll(cx));
                    let outcome = match &result {
                        Ok(response) => (this.classify)(response.status(), response.headers()),
                        // A transport error says nothing about the rate.
                        Err(_) => Outcome::Failed,
                    };
                    let report = match (report.take(), outcome) {
                        (Some(report), outcome) if outcome != Outcome::Failed => {
                            spawned(report(outcome))
                        }
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
