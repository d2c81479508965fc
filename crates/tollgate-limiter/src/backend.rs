//! The `Backend` trait: where counters live.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::Decision;
use crate::error::BackendError;
use crate::key::Key;
use crate::model::{Op, Receipt};
use crate::policy::Policy;

/// One decision asked of a backend.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The limiter's name: the namespace of its keys.
    pub limiter: &'a str,
    /// Who the limit is counted for.
    pub key: &'a Key,
    /// The limiter's configured policy. A runtime override stored in the
    /// backend (see [`Backend::set_override`]) takes precedence.
    pub policy: &'a Policy,
    /// What to do.
    pub op: Op,
}

/// Which runtime override to set or read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Every key of the limiter.
    Limiter(&'a str),
    /// One key of the limiter; wins over a limiter-wide override.
    Key(&'a str, &'a Key),
}

impl Scope<'_> {
    /// The limiter's name.
    pub fn limiter(&self) -> &str {
        match self {
            Scope::Limiter(l) | Scope::Key(l, _) => l,
        }
    }
}

/// Storage for rate-limit counters, deciding atomically.
///
/// Backends are interchangeable: an application written against the Redis
/// backend switches to the memory backend in its unit tests by changing one
/// constructor. Every backend implements the [reference model](crate::model)
/// exactly and passes the conformance suite in `tollgate-testkit`.
///
/// Implementations are cheap to clone (state behind an `Arc`), and clones
/// share their counters.
pub trait Backend: Send + Sync + 'static {
    /// The backend's own failure type; its
    /// [`reason`](BackendError::reason) labels the backend-errors metric.
    type Error: BackendError;

    /// Decides one request atomically: reads the key's state, applies the
    /// effective policy (key override, else limiter override, else
    /// `req.policy`), stores the new state and returns the verdict.
    fn decide(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send;

    /// [`decide`](Self::decide) for a caller that gives up on the answer
    /// at most `within` after it first polls the future (it drops it then),
    /// as a [`Limiter`](crate::Limiter) does at its timeout. A backend whose
    /// calls carry a timeout of their own, at least `within` long, may leave
    /// it out here: it could never end the call first, and every decision
    /// would arm two timers where one does. The default is `decide`.
    fn decide_within(
        &self,
        req: Request<'_>,
        within: Duration,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send {
        let _ = within;
        self.decide(req)
    }

    /// Decides `req` now, without waiting, if this backend can (an
    /// in-process one): `Some` is exactly the decision
    /// [`decide`](Self::decide) would answer, `None` means ask `decide`,
    /// which is also how a failure is answered. The limiter asks this
    /// first on its short path, so an in-process backend's answer costs no
    /// future. The default answers `None`.
    ///
    /// A decision, not a `Result`: a failure is left to `decide`, so the
    /// short path has one kind of answer to handle, and a backend's error
    /// type never widens it.
    #[inline]
    fn decide_now(&self, req: &Request<'_>) -> Option<Decision> {
        let _ = req;
        None
    }

    /// Reserves an estimate atomically: `req.op` is the
    /// [`Op::Acquire`] of the estimate, decided exactly as
    /// [`decide`](Self::decide) would, and the answer carries the
    /// [`Receipt`] that a later [`Op::Settle`] needs to refund what was not
    /// used (see [reservations](crate::strategy::reservation)).
    ///
    /// The default implementation decides and answers a receipt without
    /// marks: settling it can charge an excess but refunds nothing, the
    /// safe side. tollgate's memory and Redis backends override it.
    ///
    /// A settle carries its receipt's [`id`](Receipt::id) (the caller's,
    /// not the backend's): a backend remembers it, as the model's
    /// [`Slot::settled`](crate::model::Slot::settled) does, and applies a
    /// replay of it as a peek.
    fn reserve(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<(Decision, Receipt), Self::Error>> + Send {
        async move {
            let units = match req.op {
                Op::Acquire(c) => c.max(1),
                _ => 0,
            };
            let d = self.decide(req).await?;
            let receipt = match d.is_allowed() {
                true => Receipt::unmarked(units),
                false => Receipt::NONE,
            };
            Ok((d, receipt))
        }
    }

    /// Decides `req` and, beside it, `candidate`: the same key and
    /// operation under a [candidate policy](crate::LimiterBuilder::candidate),
    /// in another limiter namespace (its own state, never the enforced
    /// one's). The candidate's answer is `None` when it could not be
    /// decided: a candidate never fails the enforced decision.
    ///
    /// Backends that can should decide both in one round trip (the Redis
    /// backend pipelines the two scripts; both keys share the key's hash
    /// tag, so one cluster node answers). The default decides one after the
    /// other.
    fn decide_with_candidate(
        &self,
        req: Request<'_>,
        candidate: Request<'_>,
    ) -> impl Future<Output = Result<(Decision, Option<Decision>), Self::Error>> + Send {
        async move {
            let enforced = self.decide(req).await?;
            Ok((enforced, self.decide(candidate).await.ok()))
        }
    }

    /// Sets (`Some`) or clears (`None`) a runtime override. Every worker
    /// sharing the backend sees it on its next decision.
    fn set_override(
        &self,
        scope: Scope<'_>,
        policy: Option<&Policy>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Sets a runtime override that the backend forgets `ttl` after this
    /// call (unless set again), as if cleared; for overrides that describe
    /// transient state (the [AIMD](crate::aimd) controller's adapted rates),
    /// so that every key the backend holds expires.
    ///
    /// The default implementation keeps the override without expiry:
    /// backends that can expire keys (tollgate's memory and Redis backends
    /// do) override it.
    fn set_expiring_override(
        &self,
        scope: Scope<'_>,
        policy: &Policy,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = ttl;
        self.set_override(scope, Some(policy))
    }

    /// Sets the override of exactly `scope` to `policy`, forgotten `ttl`
    /// after this call (as [`set_expiring_override`](Self::set_expiring_override)),
    /// only if the override stored for it now is `current` (`None`: none
    /// stored, or an expired one); answers whether it was set. A
    /// compare-and-set: the comparison and the write are one atomic step,
    /// so a change read, computed from and written back (the
    /// [AIMD](crate::aimd) controller's step up) is never written over a
    /// change another worker made in between.
    ///
    /// The default implementation reads, compares and writes in three
    /// calls, which a concurrent write can fall between: backends that can
    /// do it atomically (tollgate's memory and Redis backends do) override
    /// it.
    fn replace_override(
        &self,
        scope: Scope<'_>,
        current: Option<&Policy>,
        policy: &Policy,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        async move {
            if self.get_override(scope).await?.as_ref() != current {
                return Ok(false);
            }
            self.set_expiring_override(scope, policy, ttl).await?;
            Ok(true)
        }
    }

    /// The override set for exactly `scope`, if any.
    fn get_override(
        &self,
        scope: Scope<'_>,
    ) -> impl Future<Output = Result<Option<Policy>, Self::Error>> + Send;

    /// The override set for exactly `scope`, if any, with the time it has
    /// left when it was set to expire
    /// ([`set_expiring_override`](Backend::set_expiring_override)); `None`
    /// for one kept until cleared. For operators' tools: decisions never
    /// ask it.
    ///
    /// The default implementation knows of no expiry: backends that
    /// override `set_expiring_override` override this too.
    fn get_override_and_ttl(
        &self,
        scope: Scope<'_>,
    ) -> impl Future<Output = Result<Option<(Policy, Option<Duration>)>, Self::Error>> + Send {
        async move { Ok(self.get_override(scope).await?.map(|p| (p, None))) }
    }

    /// How many failure domains this backend has: parts that fail apart
    /// (the masters of a Redis Cluster), each given a circuit breaker of its
    /// own by every limiter, so that one part's failures do not answer the
    /// others' keys from the fail mode. Asked once, when a limiter is
    /// built; the default is one domain, the whole backend.
    fn failure_domains(&self) -> usize {
        1
    }

    /// The failure domain (below [`failure_domains`](Self::failure_domains))
    /// of the data `scope` names: a [`Scope::Key`] for the calls on a key
    /// (decisions, reservations, the key's override), a [`Scope::Limiter`]
    /// for the limiter-wide override. Asked on every decision's path, so it
    /// must be cheap and must not allocate; a domain out of range counts as
    /// domain 0. The default is domain 0.
    #[inline]
    fn failure_domain(&self, scope: Scope<'_>) -> usize {
        let _ = scope;
        0
    }
}

impl<B: Backend> Backend for Arc<B> {
    type Error = B::Error;

    fn decide(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send {
        (**self).decide(req)
    }

    fn decide_within(
        &self,
        req: Request<'_>,
        within: Duration,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send {
        (**self).decide_within(req, within)
    }

    #[inline]
    fn decide_now(&self, req: &Request<'_>) -> Option<Decision> {
        (**self).decide_now(req)
    }

    fn reserve(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<(Decision, Receipt), Self::Error>> + Send {
        (**self).reserve(req)
    }

    fn decide_with_candidate(
        &self,
        req: Request<'_>,
        candidate: Request<'_>,
    ) -> impl Future<Output = Result<(Decision, Option<Decision>), Self::Error>> + Send {
        (**self).decide_with_candidate(req, candidate)
    }

    fn set_override(
        &self,
        scope: Scope<'_>,
        policy: Option<&Policy>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        (**self).set_override(scope, policy)
    }

    fn set_expiring_override(
        &self,
        scope: Scope<'_>,
        policy: &Policy,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        (**self).set_expiring_override(scope, policy, ttl)
    }

    fn replace_override(
        &self,
        scope: Scope<'_>,
        current: Option<&Policy>,
        policy: &Policy,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        (**self).replace_override(scope, current, policy, ttl)
    }

    fn get_override(
        &self,
        scope: Scope<'_>,
    ) -> impl Future<Output = Result<Option<Policy>, Self::Error>> + Send {
        (**self).get_override(scope)
    }

    fn get_override_and_ttl(
        &self,
        scope: Scope<'_>,
    ) -> impl Future<Output = Result<Option<(Policy, Option<Duration>)>, Self::Error>> + Send {
        (**self).get_override_and_ttl(scope)
    }

    fn failure_domains(&self) -> usize {
        (**self).failure_domains()
    }

    #[inline]
    fn failure_domain(&self, scope: Scope<'_>) -> usize {
        (**self).failure_domain(scope)
    }
}
