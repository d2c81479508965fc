//! Infrastructure failures.

use std::time::Duration;

use crate::policy::PolicyError;

/// A boxed backend error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a limiter could not decide.
///
/// A refusal is not an error (see [`Decision`](crate::Decision)); these are
/// the cases where no verdict came from the backend, settled by the
/// limiter's [`FailMode`](crate::FailMode).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The backend answered with an error.
    #[error("rate-limit backend failed")]
    Backend(#[source] BoxError),
    /// The backend did not answer in time.
    #[error("rate-limit backend did not answer within {0:?}")]
    Timeout(Duration),
    /// Recent decisions failed; the backend is not asked until it has had
    /// time to recover.
    #[error("rate-limit backend circuit breaker is open")]
    BreakerOpen,
    /// The request asked for more than the policy can ever grant, or an
    /// override of another strategy than the limiter's.
    /// Boxed: the rare case keeps `Error`, and every [`Verdict`](crate::Verdict)
    /// that can carry one, small.
    #[error("invalid rate-limit request")]
    Policy(#[source] Box<PolicyError>),
}

impl From<PolicyError> for Error {
    fn from(e: PolicyError) -> Self {
        Self::Policy(Box::new(e))
    }
}

impl Error {
    /// Whether the error comes from the backend being unavailable (as
    /// opposed to a request that can never pass).
    pub fn is_unavailable(&self) -> bool {
        !matches!(self, Error::Policy(_))
    }
}
