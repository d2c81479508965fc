//! The Redis backend's failures.

use std::time::Duration;

use tollgate_limiter::ErrorReason;

use crate::durability::DurabilityReport;
use crate::encoding::EncodingError;

/// Why the Redis backend could not answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisError {
    /// Redis (or the connection to it) returned an error.
    #[error("redis command failed")]
    Redis(#[source] redis::RedisError),
    /// Redis is up and answering, but refuses the command for a condition
    /// of its own (out of memory, a failed save, too few replicas, a
    /// script keeping it busy): the backend is unavailable until the
    /// condition clears, and the connection stays (nothing is wrong with
    /// it). The message names the condition; the source is the server's
    /// reply.
    #[error("{0}")]
    Refused(Refusal, #[source] redis::RedisError),
    /// No connection could be had from the pool in time (exclusive
    /// checkout).
    #[error("no redis connection available within {0:?}")]
    PoolTimeout(Duration),
    /// The connection is being replaced (it stopped answering, or Redis
    /// cannot be reached yet): the call failed at once rather than wait on
    /// a dead connection.
    #[error("no healthy redis connection: reconnecting in the background")]
    Disconnected,
    /// A script answered something it never answers: a version mismatch.
    #[error("unexpected reply from a tollgate script: {0}")]
    Protocol(String),
    /// A policy that cannot be encoded, or a stored override that cannot be
    /// decoded.
    #[error("policy encoding")]
    Encoding(#[from] EncodingError),
    /// A caller time ([`RedisBackendBuilder::caller_time`](crate::RedisBackendBuilder::caller_time),
    /// µs since the epoch) past [`MAX_CALLER_TIME`](crate::MAX_CALLER_TIME):
    /// the scripts' numbers derived from it would no longer be exact.
    #[error("caller time {0} µs is past the scripts' exact range (MAX_CALLER_TIME)")]
    CallerTimeOutOfRange(u64),
    /// A limiter name that would break the key layout (it holds `{` or
    /// `}`, which would move the Redis Cluster hash tag).
    #[error("invalid limiter name {0:?}: braces are reserved for the hash tag")]
    InvalidLimiterName(String),
    /// A Redis URL that cannot be used (the reason names the part that is
    /// wrong, never a password).
    #[error("invalid redis URL: {0}")]
    InvalidUrl(String),
    /// A TLS client certificate that cannot be used: PEM holding no
    /// certificate or no usable private key, a key that is not the
    /// certificate's, or a URL that is not TLS. The message names the
    /// setting (`tls_client_cert`), never the key.
    #[error("invalid TLS client certificate: {0}")]
    InvalidClientCert(String),
    /// The builder was asked for something this build cannot do (a
    /// `rediss://` URL without the `tls` feature, a cluster without the
    /// `cluster` feature).
    #[error("unsupported configuration: {0}")]
    Unsupported(&'static str),
    /// The configuration's `[redis]` section cannot be used; the message
    /// names the field (`redis.url: missing`).
    #[error(transparent)]
    Config(tollgate_limiter::ConfigError),
    /// Strict durability was asked for and the server is not shown to be
    /// durable.
    #[error("redis is not durable: {0}")]
    NotDurable(Box<DurabilityReport>),
}

impl RedisError {
    /// The condition under which Redis refused the command, if that is
    /// what happened.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Self::Refused(r, _) => Some(*r),
            _ => None,
        }
    }
}

/// A refusal is labelled by its condition in the metrics
/// (`reason="out_of_memory"`, ...), a policy that cannot be encoded or a
/// stored override that is no policy `reason="invalid_policy"` (which the
/// limiter's breaker does not count: Redis answered), anything else
/// `reason="error"`.
impl tollgate_limiter::BackendError for RedisError {
    fn reason(&self) -> ErrorReason {
        match self {
            Self::Refused(r, _) => r.reason(),
            Self::Encoding(_) => ErrorReason::InvalidPolicy,
            _ => ErrorReason::Error,
        }
    }
}

/// What every script's error starts with when the policy in force (a key's
/// override, which the script reads itself) is no policy (see
/// `lua/common.lua`, `decode`).
const SCRIPT_REFUSED_POLICY: &str = "tollgate: invalid policy encoding";

impl From<redis::RedisError> for RedisError {
    fn from(e: redis::RedisError) -> Self {
        if let Some(detail) = e.detail()
            && let Some(at) = detail.find(SCRIPT_REFUSED_POLICY)
        {
            let why = detail[at..].split(" script:").next().unwrap_or_default();
            return Self::Encoding(EncodingError::Refused(why.trim_end().to_owned()));
        }
        match Refusal::of(&e) {
            Some(r) => Self::Refused(r, e),
            None => Self::Redis(e),
        }
    }
}

/// Why a running Redis refuses commands ([`RedisError::Refused`]).
///
/// Each is a condition of the server, not of the connection or of the
/// request: the limiter's fail mode answers (and its breaker counts the
/// failures) until an operator or the server clears it; see
/// `docs/redis.md`, "When Redis refuses".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// `-OOM`: used memory is above `maxmemory`, and the policy
    /// (`noeviction`, which tollgate requires) refuses writes.
    OutOfMemory,
    /// `-MISCONF`: the last RDB save failed and `stop-writes-on-bgsave-error`
    /// is `yes`; writes are refused until a save succeeds.
    PersistenceFailed,
    /// `-NOREPLICAS`: fewer replicas are connected (within
    /// `min-replicas-max-lag`) than `min-replicas-to-write` asks for.
    NotEnoughReplicas,
    /// `-BUSY`: a script or function has run longer than
    /// `busy-reply-threshold` (`lua-time-limit`); every command is refused
    /// until it ends or is killed (`SCRIPT KILL`, `FUNCTION KILL`).
    Busy,
    /// `-LOADING`: the server is loading its dataset (a restart).
    Loading,
}

impl Refusal {
    /// The condition as the limiter's metrics name it (the `reason` label
    /// of `tollgate_backend_errors_total`).
    pub fn reason(self) -> ErrorReason {
        match self {
            Self::OutOfMemory => ErrorReason::OutOfMemory,
            Self::PersistenceFailed => ErrorReason::PersistenceFailed,
            Self::NotEnoughReplicas => ErrorReason::NotEnoughReplicas,
            Self::Busy => ErrorReason::Busy,
            Self::Loading => ErrorReason::Loading,
        }
    }

    /// The condition a server error reply names, by its code; or, for the
    /// `ERR Error running script` wrapping of Redis before 7.0, by the
    /// server's own message inside it.
    pub(crate) fn of(e: &redis::RedisError) -> Option<Self> {
        let by_code = match e.code()? {
            "OOM" => Some(Self::OutOfMemory),
            "MISCONF" => Some(Self::PersistenceFailed),
            "NOREPLICAS" => Some(Self::NotEnoughReplicas),
            "BUSY" => Some(Self::Busy),
            "LOADING" => Some(Self::Loading),
            _ => None,
        };
        by_code.or_else(|| {
            let detail = e.detail()?;
            [
                (
                    "command not allowed when used memory > 'maxmemory'",
                    Self::OutOfMemory,
                ),
                ("MISCONF ", Self::PersistenceFailed),
                ("Not enough good replicas to write", Self::NotEnoughReplicas),
            ]
            .into_iter()
            .find_map(|(text, r)| detail.contains(text).then_some(r))
        })
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::OutOfMemory => {
                "Redis out of memory (used memory > maxmemory, noeviction): writes refused"
            }
            Self::PersistenceFailed => {
                "Redis cannot persist to disk (an RDB save failed, \
                 stop-writes-on-bgsave-error yes): writes refused"
            }
            Self::NotEnoughReplicas => {
                "Redis has not enough replicas for min-replicas-to-write: writes refused"
            }
            Self::Busy => {
                "Redis is busy running a script (busy-reply-threshold passed): \
                 every command refused until it ends or SCRIPT KILL"
            }
            Self::Loading => "Redis is loading its dataset: commands refused until it is done",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(line: &str) -> redis::RedisError {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(e)) => e.into(),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn a_refusal_is_named_by_its_code_or_the_older_script_wrapping() {
        for (line, want) in [
            (
                "OOM command not allowed when used memory > 'maxmemory'. script: 1, on @user_script:9.",
                Some(Refusal::OutOfMemory),
            ),
            (
                "MISCONF Redis is configured to save RDB snapshots, but ...",
                Some(Refusal::PersistenceFailed),
            ),
            (
                "NOREPLICAS Not enough good replicas to write.",
                Some(Refusal::NotEnoughReplicas),
            ),
            (
                "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
                Some(Refusal::Busy),
            ),
            (
                "LOADING Redis is loading the dataset in memory",
                Some(Refusal::Loading),
            ),
            // Redis 6.2 raises a script's failed call as ERR, the reply
            // inside.
            (
                "ERR Error running script (call to f_1): @user_script:9: @user_script: 9: \
                 -OOM command not allowed when used memory > 'maxmemory'.",
                Some(Refusal::OutOfMemory),
            ),
            ("ERR unknown command 'FOO'", None),
            ("NOSCRIPT No matching script.", None),
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                None,
            ),
        ] {
            let e = RedisError::from(reply(line));
            assert_eq!(e.refusal(), want, "{line}");
            // The metrics' reason label: the condition, else `error`.
            let label = tollgate_limiter::BackendError::reason(&e).label();
            let want_label = match want {
                Some(Refusal::OutOfMemory) => "out_of_memory",
                Some(Refusal::PersistenceFailed) => "persistence_failed",
                Some(Refusal::NotEnoughReplicas) => "not_enough_replicas",
                Some(Refusal::Busy) => "busy",
                Some(Refusal::Loading) => "loading",
                _ => "error",
            };
            assert_eq!(label, want_label, "{line}");
            if let Some(r) = want {
                assert_eq!(e.to_string(), r.to_string());
                assert!(matches!(e, RedisError::Refused(..)));
            } else {
                assert!(matches!(e, RedisError::Redis(_)), "{e:?}");
            }
        }
        assert!(
            Refusal::OutOfMemory
                .to_string()
                .starts_with("Redis out of memory")
        );
    }
}
