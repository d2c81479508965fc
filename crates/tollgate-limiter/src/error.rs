//! Infrastructure failures.

use std::time::Duration;

use crate::policy::PolicyError;

/// A boxed backend error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `e` and its causes ([`source`](std::error::Error::source)) on one line,
/// joined with `: `, for a log line or a program's last words. A cause whose
/// text the line already holds is left out: some errors repeat their
/// source in their own message.
///
/// ```
/// let e = tollgate_limiter::Error::Backend(std::io::Error::other("connection refused").into());
/// assert_eq!(
///     tollgate_limiter::error::chain(&e),
///     "rate-limit backend failed: connection refused"
/// );
/// ```
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    for cause in std::iter::successors(e.source(), |&c| c.source()) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

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

/// A backend's own failure type (the bound of
/// [`Backend::Error`](crate::Backend::Error)): a standard error that can
/// say why the backend gave no answer.
///
/// The reason is the `reason` label of the metric
/// `tollgate_backend_errors_total` (see [`metrics`](crate::metrics)), so
/// that a server refusing commands for a condition of its own (out of
/// memory, a failed save) can be told, and alerted on, apart from a
/// broken connection. A backend without such conditions implements it
/// with the default: `impl BackendError for MyError {}`.
pub trait BackendError: std::error::Error + Send + Sync + 'static {
    /// Why the backend gave no answer; the default is
    /// [`ErrorReason::Error`] (any failure).
    fn reason(&self) -> ErrorReason {
        ErrorReason::Error
    }
}

/// Why a backend gave no answer, as the metrics name it
/// ([`BackendError::reason`]).
///
/// A small fixed set, never a string from the server, so the number of
/// series stays bounded. The conditions are a server's refusal to run a
/// command while it is up and answering; they are named as Redis names
/// them, but a backend of any kind may report them. All but
/// [`InvalidPolicy`](Self::InvalidPolicy) count towards the limiter's
/// circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorReason {
    /// Any failure without a more specific reason (a broken connection,
    /// an unexpected reply): `error`.
    Error = 0,
    /// The server is out of memory and refuses writes: `out_of_memory`.
    OutOfMemory = 1,
    /// The server cannot persist to disk and refuses writes:
    /// `persistence_failed`.
    PersistenceFailed = 2,
    /// The server has fewer replicas than it needs to accept writes:
    /// `not_enough_replicas`.
    NotEnoughReplicas = 3,
    /// The server is busy (a long script) and refuses every command:
    /// `busy`.
    Busy = 4,
    /// The server is loading its dataset (a restart) and refuses every
    /// command: `loading`.
    Loading = 5,
    /// The backend answered, but the policy in force is none it can use
    /// (a stored override that is no policy: written by hand, or by
    /// another tool): `invalid_policy`. The fail mode answers the
    /// decision, and the breaker does not count it, since the backend is
    /// healthy: the override of one key does not stop the limiter's other
    /// keys from being decided.
    InvalidPolicy = 6,
}

impl ErrorReason {
    /// Every reason, in the order of their discriminants.
    pub const ALL: [ErrorReason; 7] = [
        Self::Error,
        Self::OutOfMemory,
        Self::PersistenceFailed,
        Self::NotEnoughReplicas,
        Self::Busy,
        Self::Loading,
        Self::InvalidPolicy,
    ];

    /// The `reason` label: `error`, `out_of_memory`, `persistence_failed`,
    /// `not_enough_replicas`, `busy`, `loading` or `invalid_policy`.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::OutOfMemory => "out_of_memory",
            Self::PersistenceFailed => "persistence_failed",
            Self::NotEnoughReplicas => "not_enough_replicas",
            Self::Busy => "busy",
            Self::Loading => "loading",
            Self::InvalidPolicy => "invalid_policy",
        }
    }
}

impl std::fmt::Display for ErrorReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}
