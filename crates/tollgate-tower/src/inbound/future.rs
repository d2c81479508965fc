//! The response future of [`RateLimit`](super::RateLimit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tollgate_limiter::{Backend, Decision, KeptPermit, Key, Limiter, Policy, Reservation, Verdict};
use tower_service::Service;
use tracing::Instrument;

use super::hooks::{Classify, Outcome};
use super::service::Post;
use crate::respond::{Quota, Refusal, Respond, ShadowRefusal};
use crate::telemetry;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// One request's claim on a limiter.
pub(crate) struct Ticket<B: Backend> {
    pub(crate) limiter: Limiter<B>,
    pub(crate) key: Key,
    pub(crate) cost: u64,
    /// What a reserving request holds until its response settles it
    /// (boxed: it is most of a ticket's size, and only a reserving layer
    /// has one).
    pub(crate) reservation: Option<Box<Reservation<B>>>,
    /// The slot a request under a concurrency limit holds until its
    /// response, its lease renewed meanwhile (a client sending its body
    /// slowly decides how long that is); boxed, as the reservation.
    pub(crate) permit: Option<Box<KeptPermit<B>>>,
}

/// How the cost is asked for before the request is handed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Taken now.
    Upfront,
    /// Looked at now, charged after the response.
    Peek,
    /// Reserved now, settled from the response.
    Reserve,
    /// A concurrency slot held now, given back with the response (or the
    /// request's drop).
    Hold,
}

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): asks the
    /// limiter, then calls the inner service or answers the refusal.
    pub struct ResponseFuture<S, Req, B, R, V>
    where
        S: Service<Req>,
        R: Respond<S::Response>,
        B: Backend,
    {
        #[pin]
        state: State<S, Req, B, R::Response>,
        ticket: Option<Ticket<B>>,
        pass: Pass,
        post: Arc<Post<R, V>>,
        // How the cost was asked for: only peek mode charges after.
        mode: Mode,
        // Charged after its response (peek mode): until that response
        // comes, dropping the future charges the ticket (see `drop`).
        charge_if_dropped: bool,
    }

    impl<S, Req, B, R, V> PinnedDrop for ResponseFuture<S, Req, B, R, V>
    where
        S: Service<Req>,
        R: Respond<S::Response>,
        B: Backend,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // Handed on (only then is the ticket kept) and never answered:
            // the client went away mid-request. Charged as a counted
            // response is, or dropping each connection before its answer
            // would make every request free. Best effort off a runtime.
            if *this.charge_if_dropped
                && let Some(ticket) = this.ticket.take()
                && tokio::runtime::Handle::try_current().is_ok()
            {
                drop(settle(&ticket, Outcome::Count));
            }
        }
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, B, Out>
    where
        S: Service<Req>,
        B: Backend,
    {
        Checking {
            check: BoxFuture<(Verdict, Ticket<B>)>,
            service: Option<S>,
            req: Option<Req>,
        },
        Inner {
            #[pin]
            fut: S::Future,
        },
        Settling {
            settle: BoxFuture<Option<Decision>>,
            response: Option<S::Response>,
        },
        Rejected {
            response: Option<Out>,
        },
    }
}

impl<S, Req, B, R, V> ResponseFuture<S, Req, B, R, V>
where
    S: Service<Req>,
    R: Respond<S::Response>,
    B: Backend,
{
    pub(crate) fn checking(
        ticket: Ticket<B>,
        mode: Mode,
        service: S,
        req: Req,
        post: Arc<Post<R, V>>,
    ) -> Self {
        Self {
            state: State::Checking {
                check: check(ticket, mode),
                service: Some(service),
                req: Some(req),
            },
            ticket: None,
            pass: Pass::Bare,
            post,
            mode,
            charge_if_dropped: mode == Mode::Peek,
        }
    }

    /// The limiter answered at once (`verdict`): `service`, polled ready,
    /// is called now if the request passes.
    pub(crate) fn decided(
        verdict: Verdict,
        ticket: Ticket<B>,
        service: &mut S,
        req: Req,
        post: Arc<Post<R, V>>,
    ) -> Self {
        match answer(&post.responder, &ticket.limiter, &ticket.key, verdict) {
            Answer::Pass(pass) => Self {
                state: State::Inner {
                    fut: service.call(req),
                },
                ticket: Some(ticket),
                pass,
                post,
                mode: Mode::Upfront,
                charge_if_dropped: false,
            },
            Answer::Refuse(response) => Self::rejected(response, post),
        }
    }

    /// Handed on without a decision (no key), answered as `pass` says.
    pub(crate) fn pass(fut: S::Future, pass: Pass, post: Arc<Post<R, V>>) -> Self {
        Self {
            state: State::Inner { fut },
            ticket: None,
            pass,
            post,
            mode: Mode::Upfront,
            charge_if_dropped: false,
        }
    }

    pub(crate) fn rejected(response: R::Response, post: Arc<Post<R, V>>) -> Self {
        Self {
            state: State::Rejected {
                response: Some(response),
            },
            ticket: None,
            pass: Pass::Bare,
            post,
            mode: Mode::Upfront,
            charge_if_dropped: false,
        }
    }
}

/// Asks the limiter: takes the cost now (`upfront`), or only looks whether
/// the cost fits, the charge waiting for the response.
fn check<B: Backend>(mut ticket: Ticket<B>, mode: Mode) -> BoxFuture<(Verdict, Ticket<B>)> {
    let span =
        tracing::debug_span!("rate_limit", limiter = ticket.limiter.name(), key = %ticket.key);
    let check = async move {
        let verdict = if mode == Mode::Reserve {
            let (verdict, reservation) = ticket.limiter.reserve(&ticket.key, ticket.cost).await;
            ticket.reservation = Some(Box::new(reservation));
            verdict
        } else if mode == Mode::Hold {
            // A slot, given back when the response comes or the request
            // is dropped (with the ticket), not one only its lease frees.
            let (verdict, permit) = ticket.limiter.hold(&ticket.key).await;
            ticket.permit = permit.map(|p| Box::new(p.keep_alive()));
            verdict
        } else if mode == Mode::Upfront {
            ticket.limiter.check_cost(&ticket.key, ticket.cost).await
        } else {
            // Look for the request's whole cost, not one unit: a key
            // with fewer units left than the cost would otherwise pass
            // every check and have every charge refused, unbounded.
            // A cost that can never pass is refused as `check_cost`
            // refuses it.
            let looked = ticket.limiter.peek_cost(&ticket.key, ticket.cost).await;
            match looked {
                // A window that penalises refusals records every refused
                // request, and a look records nothing: the refusal is
                // charged, as the upfront layer charges it (refused again,
                // and recorded). Should the charge pass after all, the
                // request is still refused: stricter, never laxer.
                //
                // In a task of its own, as the charges after a response: a
                // client gone once the look answered (the request future
                // dropped) would otherwise escape the record an upfront
                // layer makes in its one call.
                Verdict::Decided(d) if d.is_denied() && penalises(ticket.limiter.policy()) => {
                    let (limiter, key) = (ticket.limiter.clone(), ticket.key.clone());
                    let cost = ticket.cost;
                    let charge = async move { limiter.check_cost(&key, cost).await };
                    match tokio::spawn(charge).await {
                        Ok(Verdict::Decided(charged)) if charged.is_denied() => {
                            Verdict::Decided(charged)
                        }
                        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                        _ => Verdict::Decided(d),
                    }
                }
                looked => looked,
            }
        };
        (verdict, ticket)
    };
    // Not wrapped in a span nobody listens to (the usual case in production).
    if span.is_disabled() {
        Box::pin(check)
    } else {
        Box::pin(check.instrument(span))
    }
}

/// Whether `policy` records refused requests (a sliding window that
/// penalises them). The configured policy: an override that turns the
/// penalty on is recorded only by the requests the backend decides as
/// charges.
fn penalises(policy: &Policy) -> bool {
    matches!(policy, Policy::SlidingWindow(w) if w.penalises_refused())
}

/// Charges (or forgets) after the response, per the classifier.
///
/// The charge runs as its own task: a client that drops the connection
/// while it is in flight (hyper then drops this future) must not escape
/// the count, or failed logins could be made free.
fn settle<B: Backend>(ticket: &Ticket<B>, outcome: Outcome) -> Option<BoxFuture<Option<Decision>>> {
    let (limiter, key, cost) = (ticket.limiter.clone(), ticket.key.clone(), ticket.cost);
    let charge: BoxFuture<Option<Decision>> = match outcome {
        Outcome::Ignore => return None,
        Outcome::Count => {
            Box::pin(async move { limiter.check_cost(&key, cost).await.decision().copied() })
        }
        Outcome::Reset => Box::pin(async move { limiter.reset(&key).await.ok() }),
    };
    Some(in_task(charge))
}

/// Runs `charge` as a task of its own (see [`settle`]); the future
/// answers what it decided, or `None` if the task could not finish.
fn in_task(
    charge: impl Future<Output = Option<Decision>> + Send + 'static,
) -> BoxFuture<Option<Decision>> {
    let task = tokio::spawn(charge);
    Box::pin(async move { task.await.ok().flatten() })
}

/// Settles a reservation with the real cost the response reported, in a
/// task of its own (as [`settle`]). An empty reservation (fail-open without
/// the backend) settles nothing.
fn settle_reservation<B: Backend>(
    reservation: Box<Reservation<B>>,
    actual: u64,
) -> BoxFuture<Option<Decision>> {
    in_task(async move { reservation.settle(actual).await.ok().flatten() })
}

/// Gives a reservation back whole (the response says the request was not
/// to be counted), in a task of its own (as [`settle`]).
fn refund_reservation<B: Backend>(reservation: Box<Reservation<B>>) -> BoxFuture<Option<Decision>> {
    in_task(async move { reservation.refund().await.ok().flatten() })
}

impl<S, Req, B, R, V> Future for ResponseFuture<S, Req, B, R, V>
where
    S: Service<Req>,
    R: Respond<S::Response>,
    V: Classify<S::Response>,
    B: Backend,
{
    type Output = Result<R::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking {
                    check,
                    service,
                    req,
                } => {
                    let (verdict, ticket) = ready!(check.as_mut().poll(cx));
                    let refused =
                        match answer(&this.post.responder, &ticket.limiter, &ticket.key, verdict) {
                            Answer::Pass(pass) => {
                                *this.pass = pass;
                                None
                            }
                            Answer::Refuse(response) => Some(response),
                        };
                    match refused {
                        None => {
                            let mut service = service.take().expect("polled after completion");
                            let req = req.take().expect("polled after completion");
                            *this.ticket = Some(ticket);
                            this.state.set(State::Inner {
                                fut: service.call(req),
                            });
                        }
                        Some(response) => this.state.set(State::Rejected {
                            response: Some(response),
                        }),
                    }
                }
                StateProj::Inner { fut } => {
                    let result = ready!(fut.poll(cx));
                    // Answered: charged (or not) by the classifier below.
                    *this.charge_if_dropped = false;
                    // The request is over: its concurrency slot goes back
                    // now (the response body is not followed: that is
                    // `ConcurrencyLimit`'s work).
                    if let Some(ticket) = this.ticket.as_mut() {
                        ticket.permit = None;
                    }
                    // A reserving request holds its reservation (empty if
                    // it passed without the backend) until settled here.
                    let held = this.ticket.as_mut().and_then(|t| t.reservation.take());
                    let response = match result {
                        Ok(response) => response,
                        Err(e) => {
                            if let Some(reservation) = held {
                                if this.post.classify.on_error() == Outcome::Ignore {
                                    // Recorded even though the error is
                                    // answered at once.
                                    drop(refund_reservation(reservation));
                                }
                            } else if *this.mode == Mode::Peek {
                                // Charged by outcome: an `Err` (a timeout
                                // layer inside this one) is an outcome
                                // too, or every request an attacker makes
                                // slow enough to time out goes uncounted.
                                // In a task of its own (see `settle`).
                                let outcome = this.post.classify.on_error();
                                drop(this.ticket.as_ref().and_then(|t| settle(t, outcome)));
                            }
                            return Poll::Ready(Err(e));
                        }
                    };
                    if let Some(reservation) = held {
                        let settle = match this.post.classify.classify(&response) {
                            Outcome::Reset => {
                                this.ticket.as_ref().and_then(|t| settle(t, Outcome::Reset))
                            }
                            Outcome::Ignore => Some(refund_reservation(reservation)),
                            // No usage reported: the estimate stays charged.
                            Outcome::Count => this
                                .post
                                .classify
                                .usage(&response)
                                .map(|actual| settle_reservation(reservation, actual)),
                        };
                        if let Some(settle) = settle {
                            this.state.set(State::Settling {
                                settle,
                                response: Some(response),
                            });
                            continue;
                        }
                    } else if *this.mode == Mode::Peek {
                        let outcome = this.post.classify.classify(&response);
                        let settle = this.ticket.as_ref().and_then(|t| settle(t, outcome));
                        if let Some(settle) = settle {
                            this.state.set(State::Settling {
                                settle,
                                response: Some(response),
                            });
                            continue;
                        }
                    }
                    return Poll::Ready(Ok(respond_allowed(
                        &this.post.responder,
                        response,
                        this.ticket.as_ref().map(|t| &t.limiter),
                        this.pass,
                    )));
                }
                StateProj::Settling { settle, response } => {
                    // A failed charge keeps the check's figures; a shadowed
                    // response stays shadowed.
                    if let Some(d) = ready!(settle.as_mut().poll(cx))
                        && !matches!(this.pass, Pass::Shadow(_))
                    {
                        *this.pass = Pass::Quota(d);
                    }
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(respond_allowed(
                        &this.post.responder,
                        response,
                        this.ticket.as_ref().map(|t| &t.limiter),
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

/// What a verdict makes of a request.
pub(crate) enum Answer<Out> {
    /// Call the inner service, and answer its response as this says.
    Pass(Pass),
    /// Answer this instead.
    Refuse(Out),
}

/// What an allowed response is answered with, kept in the response future
/// until the response comes (so kept small: every layer's future holds
/// one, and futures are moved as they nest).
pub(crate) enum Pass {
    /// No decision to report (a fail-open limiter whose backend failed, a
    /// request without a key let through).
    Bare,
    /// The decision's quota.
    Quota(Decision),
    /// What enforcement would have refused (boxed: rare, and larger than
    /// a decision).
    Shadow(Box<ShadowRefusal>),
}

impl Pass {
    /// A request without a key that a limiter in shadow mode lets pass:
    /// enforcement would have refused it, with no decision to tell.
    pub(crate) fn shadow_missing_key(limiter: &str) -> Self {
        Self::Shadow(Box::new(ShadowRefusal {
            limiter: limiter.to_owned(),
            retry_after: std::time::Duration::ZERO,
            decision: None,
        }))
    }
}

/// Turns a limiter's verdict into the layer's answer (shared by
/// [`RateLimit`](super::RateLimit) and
/// [`ConcurrencyLimit`](crate::concurrency::ConcurrencyLimit)).
pub(crate) fn answer<B: Backend, Res, R: Respond<Res>>(
    responder: &R,
    limiter: &Limiter<B>,
    key: &Key,
    verdict: Verdict,
) -> Answer<R::Response> {
    let name = limiter.name();
    match verdict {
        Verdict::Decided(d) if d.is_allowed() => Answer::Pass(Pass::Quota(d)),
        Verdict::Decided(d) => {
            telemetry::denied(name, key, &d);
            let quota = Quota::new(name, limiter.policy(), &d);
            Answer::Refuse(responder.refused(&Refusal::Limited(quota)))
        }
        Verdict::FailedOpen(e) => {
            telemetry::backend_failed(name, false, &e);
            Answer::Pass(Pass::Bare)
        }
        // Shadow mode: what would have been refused passes.
        Verdict::Shadowed(denied) => {
            telemetry::shadowed(name, key, &denied);
            Answer::Pass(Pass::Shadow(Box::new(ShadowRefusal {
                limiter: name.to_owned(),
                retry_after: denied.retry_after,
                decision: denied.decision,
            })))
        }
        // Not a backend failure: this request can never pass.
        Verdict::FailedClosed(e, _) if !e.is_unavailable() => {
            telemetry::denied_cost(name, &e);
            Answer::Refuse(responder.refused(&Refusal::TooCostly { limiter: name }))
        }
        Verdict::FailedClosed(e, retry_after) => {
            telemetry::backend_failed(name, true, &e);
            let refusal = Refusal::Unavailable {
                limiter: name,
                retry_after,
            };
            Answer::Refuse(responder.refused(&refusal))
        }
    }
}

/// An allowed request's response, as `pass` says (shared by
/// [`RateLimit`](super::RateLimit) and
/// [`ConcurrencyLimit`](crate::concurrency::ConcurrencyLimit)); `limiter`
/// is the one that decided, if one did.
pub(crate) fn respond_allowed<B: Backend, Res, R: Respond<Res>>(
    responder: &R,
    response: Res,
    limiter: Option<&Limiter<B>>,
    pass: &Pass,
) -> R::Response {
    match (pass, limiter) {
        (Pass::Shadow(shadow), _) => responder.shadowed(response, shadow),
        (Pass::Quota(d), Some(l)) => {
            let quota = Quota::new(l.name(), l.policy(), d);
            responder.allowed(response, Some(&quota))
        }
        _ => responder.allowed(response, None),
    }
}

impl<S, Req, B, R, V> fmt::Debug for ResponseFuture<S, Req, B, R, V>
where
    S: Service<Req>,
    R: Respond<S::Response>,
    B: Backend,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Checking { .. } => "Checking",
            State::Inner { .. } => "Inner",
            State::Settling { .. } => "Settling",
            State::Rejected { .. } => "Rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
