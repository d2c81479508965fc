//! The Redis backend's failures.

use std::time::Duration;

use crate::durability::DurabilityReport;
use crate::encoding::EncodingError;

/// Why the Redis backend could not answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisError {
    /// Redis (or the connection to it) returned an error.
    #[error("redis command failed")]
    Redis(#[source] redis::RedisError),
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
    /// A limiter name that would break the key layout (it holds `{` or
    /// `}`, which would move the Redis Cluster hash tag).
    #[error("invalid limiter name {0:?}: braces are reserved for the hash tag")]
    InvalidLimiterName(String),
    /// A Redis URL that cannot be used (the reason names the part that is
    /// wrong, never a password).
    #[error("invalid redis URL: {0}")]
    InvalidUrl(String),
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

impl From<redis::RedisError> for RedisError {
    fn from(e: redis::RedisError) -> Self {
        Self::Redis(e)
    }
}
