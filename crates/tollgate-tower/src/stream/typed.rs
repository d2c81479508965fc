use std::time::Duration;

use tollgate_limiter::Decision;

use crate::respond::{Quota, Refusal, Respond};

/// A responder for services that are not HTTP or gRPC: the inner
/// service's response becomes `Ok(response)`, a refusal `Err(Refused)`.
///
/// The layered service's response is then `Result<Res, Refused>`: a
/// refusal is a value the caller matches on (drop the event, requeue it
/// after `retry_after`), not a service error.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{Key, Limiter, SlidingWindow};
/// use tollgate_memory::MemoryBackend;
/// use tollgate_tower::RateLimitLayer;
/// use tollgate_tower::stream::{Refused, Typed};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// struct Event { channel: String }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::new("channel", SlidingWindow::new(1, Duration::from_secs(60))?, MemoryBackend::new());
/// let handler = ServiceBuilder::new()
///     .layer(RateLimitLayer::new(limiter, |e: &Event| Some(Key::new(&e.channel))).responder(Typed))
///     .service(service_fn(|e: Event| async move {
///         Ok::<_, std::convert::Infallible>(format!("handled {}", e.channel))
///     }));
///
/// let event = || Event { channel: "town-square".into() };
/// assert_eq!(handler.clone().oneshot(event()).await?, Ok("handled town-square".to_string()));
/// let refused = handler.clone().oneshot(event()).await?.unwrap_err();
/// assert!(matches!(refused, Refused::Limited { .. }));
/// assert!(refused.retry_after().unwrap() > Duration::from_secs(59));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Typed;

/// Why a [`Typed`] layer refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// The key is over its limit.
    Limited {
        /// The limiter's name.
        limiter: String,
        /// The backend's decision (retry-after, remaining, limit).
        decision: Decision,
    },
    /// The backend failed and the limiter is fail-closed.
    Unavailable {
        /// The limiter's name.
        limiter: String,
        /// When to try again.
        retry_after: Duration,
    },
    /// The request had no key.
    MissingKey {
        /// The limiter's name.
        limiter: String,
    },
    /// The request costs more than the limit can ever grant.
    TooCostly {
        /// The limiter's name.
        limiter: String,
    },
}

impl Refused {
    /// The limiter that refused.
    pub fn limiter(&self) -> &str {
        match self {
            Self::Limited { limiter, .. }
            | Self::Unavailable { limiter, .. }
            | Self::MissingKey { limiter }
            | Self::TooCostly { limiter } => limiter,
        }
    }

    /// How long to wait before trying again; `None` when waiting will not
    /// help (no key, a cost above the limit).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Limited { decision, .. } => Some(decision.retry_after()),
            Self::Unavailable { retry_after, .. } => Some(*retry_after),
            Self::MissingKey { .. } | Self::TooCostly { .. } => None,
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Limited { limiter, decision } => write!(
                f,
                "rate limited by {limiter:?}; retry after {:?}",
                decision.retry_after()
            ),
            Self::Unavailable {
                limiter,
                retry_after,
            } => write!(
                f,
                "rate limiter {limiter:?} unavailable; retry after {retry_after:?}"
            ),
            Self::MissingKey { limiter } => write!(f, "no rate-limit key for {limiter:?}"),
            Self::TooCostly { limiter } => {
                write!(f, "cost above what {limiter:?} can ever grant")
            }
        }
    }
}

impl std::error::Error for Refused {}

impl<Res> Respond<Res> for Typed {
    type Response = Result<Res, Refused>;

    fn allowed(&self, response: Res, _: Option<&Quota<'_>>) -> Self::Response {
        Ok(response)
    }

    fn refused(&self, refusal: &Refusal<'_>) -> Self::Response {
        Err(match refusal {
            Refusal::Limited(q) => Refused::Limited {
                limiter: q.name.to_owned(),
                decision: *q.decision,
            },
            Refusal::Unavailable {
                limiter,
                retry_after,
            } => Refused::Unavailable {
                limiter: (*limiter).to_owned(),
                retry_after: *retry_after,
            },
            Refusal::MissingKey { limiter } => Refused::MissingKey {
                limiter: (*limiter).to_owned(),
            },
            Refusal::TooCostly { limiter } => Refused::TooCostly {
                limiter: (*limiter).to_owned(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tollgate_limiter::{Key, Limiter, SlidingWindow};
    use tollgate_memory::MemoryBackend;
    use tower::{ServiceExt, service_fn};
    use tower_layer::Layer;

    use super::*;
    use crate::RateLimitLayer;

    #[tokio::test]
    async fn unavailable_and_missing_key_are_typed() {
        let backend = MemoryBackend::new();
        let limiter = Limiter::new(
            "jobs",
            SlidingWindow::new(5, Duration::from_secs(60)).unwrap(),
            backend.clone(),
        );
        let svc = RateLimitLayer::new(limiter, |job: &Option<&'static str>| job.map(Key::new))
            .responder(Typed)
            .layer(service_fn(|_: Option<&'static str>| async {
                Ok::<_, Infallible>("done")
            }));
        assert_eq!(svc.clone().oneshot(Some("a")).await.unwrap(), Ok("done"));
        let missing = svc.clone().oneshot(None).await.unwrap().unwrap_err();
        assert_eq!(
            missing,
            Refused::MissingKey {
                limiter: "jobs".into()
            }
        );
        assert_eq!(missing.retry_after(), None);
        backend.set_failing(true);
        let down = svc.clone().oneshot(Some("a")).await.unwrap().unwrap_err();
        assert!(matches!(down, Refused::Unavailable { .. }), "{down:?}");
        assert_eq!(down.limiter(), "jobs");
        assert!(down.retry_after().unwrap() > Duration::ZERO);
        assert!(down.to_string().contains("unavailable"));
    }
}
