//! Redis backend for [tollgate](https://docs.rs/tollgate): every decision is
//! one atomic Lua script in Redis.
//!
//! [`RedisBackend`] implements [`tollgate_limiter::Backend`]. Each decision is a
//! single `EVALSHA` of the strategy's script (`lua/<strategy>.lua`: token
//! bucket, sliding window, progressive delay, calendar, composite,
//! concurrency; reloaded transparently after a `SCRIPT FLUSH` or a
//! restart): it reads the key's
//! state, applies the policy in force, writes the new state and answers the
//! verdict. No read-modify-write crosses the network, so any number of
//! workers share one exact counter.
//!
//! * **Semantics**: the scripts compute the core's
//!   [reference model](tollgate_limiter::model) in integer microseconds, in the
//!   same order; the conformance suite checks them against it decision by
//!   decision.
//! * **Time**: the Redis server's `TIME` by default, so workers with skewed
//!   clocks agree; [`RedisBackendBuilder::caller_time`] takes it from a
//!   [`Clock`] instead (a [`MockClock`](tollgate_limiter::MockClock) in tests,
//!   replays).
//! * **Keys**: `<prefix>:<limiter>:{<key>}` (a STRING for a token bucket,
//!   written with its TTL in one `SET … PX`; a HASH for the other
//!   strategies, see `docs/redis.md`), plus `…:log` (the
//!   sliding-window log), `…:log1` to `…:log4` (a composite's windows' logs,
//!   see `lua/composite.lua`), `…:slots` (a concurrency limit's slots, a
//!   ZSET, see `lua/concurrency.lua`) and `…:override` (a per-key override), all in the
//!   key's hash slot; `<prefix>:<limiter>:override` holds a limiter-wide
//!   override, and `<prefix>:<limiter>:keyed{<prefix>:<limiter>:override}`
//!   marks a limiter that has per-key overrides. Every key's TTL is the time
//!   until its state equals a fresh key's, rounded up to a millisecond; a key
//!   that becomes fresh is deleted.
//!   An override lives until cleared, or for the TTL it was set with
//!   ([`Backend::set_expiring_override`]).
//! * **Overrides** are stored in Redis. A limiter-wide override is read by
//!   the client and cached for at most
//!   [`RedisBackendBuilder::override_cache_ttl`] (default 1 s): the worker
//!   that sets it sees it at once, the others within that TTL (while its
//!   server answers: a failed read decides with what was read last). Under
//!   steady traffic the entry is read again before it expires, beside the
//!   decisions: none waits for that read. A per-key
//!   override is read by the script itself, only on a limiter the client
//!   knows to have per-key overrides (a marker
//!   the backend sets with the first one and never removes, read and cached
//!   with the limiter-wide override). So a limiter's first per-key override
//!   reaches other workers within that TTL too, and every later per-key
//!   change (a clear included) on their next decision (see
//!   `docs/redis.md`).
//! * **Connections**: multiplexed connections managed by redis-rs's
//!   `ConnectionManager` (see [`RedisBackendBuilder::pool_size`]); Redis
//!   Cluster through the redis crate's cluster client with the feature
//!   `cluster`; Redis Sentinel with a
//!   `redis+sentinel://host:port[,host:port...]/<master-name>` URL (see
//!   [`RedisBackend::builder`]); `rediss://` and `rediss+sentinel://` URLs
//!   with the feature `tls`, with a private CA
//!   ([`RedisBackendBuilder::tls_root_cert`]) and a client certificate for
//!   servers that demand one
//!   ([`RedisBackendBuilder::tls_client_cert`], mutual TLS).
//!   Credentials go in the URL (`redis://user:password@host:6379`).
//! * **Failover**: a connection that reaches a replica (`ROLE`, or a
//!   `READONLY` reply) is replaced like a dead one; with Sentinel the new
//!   one goes to the master the sentinels name. What a failover costs and
//!   can lose is measured in `docs/redis.md`.
//! * **Failure domains**: a cluster backend has [`CLUSTER_DOMAINS`] ranges
//!   of hash slots ([`Backend::failure_domains`]), and a limiter keeps a
//!   circuit breaker per range: a master that fails answers its own keys
//!   from the fail mode, not the limiter's keys on the other masters.
//! * **Health** is the backend's job, not its callers': connects and
//!   replies are bounded ([`RedisBackendBuilder::connect_timeout`],
//!   [`RedisBackendBuilder::response_timeout`]), and a connection that stops
//!   answering is checked and replaced in the background, even when every
//!   caller gave up on it long before (a limiter's per-decision timeout).
//! * **Configuration**: [`RedisBackend::from_config`] connects as the
//!   configuration's `[redis]` section says (URL, cluster, timeouts, pool,
//!   durability, TLS CA and client certificate), so a service moves
//!   between environments without code.
//! * **Durability**: at start-up the backend checks `appendonly` and
//!   `maxmemory-policy` and logs a [`DurabilityReport`]; with
//!   [`Durability::Strict`] it refuses to start on a server it cannot show
//!   to be durable.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate_limiter::{Key, Limiter, SlidingWindow};
//! use tollgate_redis::{Durability, RedisBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = RedisBackend::builder("redis://127.0.0.1:6379")
//!     .prefix("myapp")
//!     .durability(Durability::Strict)
//!     .build()
//!     .await?;
//! let login = Limiter::new("login-ip", SlidingWindow::new(20, Duration::from_secs(900))?, backend);
//! let verdict = login.check(&Key::new("203.0.113.7")).await;
//! if !verdict.is_allowed() {
//!     // answer 429
//! }
//! # Ok(())
//! # }
//! ```

// On docs.rs (`--cfg docsrs`, nightly): items behind a feature say which.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod conn;
pub mod durability;
pub mod encoding;
mod error;
pub mod scripts;
mod sentinel;
mod tls;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{Cmd, Value};
use tokio::time::Instant;
use tollgate_limiter::model::{Mark, Receipt, across_concurrency_boundary};
use tollgate_limiter::strategy::token_bucket::TokenBucket;
use tollgate_limiter::{
    Backend, Calendar, Clock, Decision, Key, Op, Period, Policy, Request, Scope, Strategy,
    SystemClock, Zone,
};

pub use durability::{Durability, DurabilityReport, NodeReport, NodeRole, Setting};
pub use error::{RedisError, Refusal};

/// The Redis client this backend is built on. Its error type is the source
/// of [`RedisError::Redis`] and [`RedisError::Refused`] (and converts into
/// [`RedisError`]), so its major version (1) is part of this crate's API;
/// re-exported so that code matching on those errors names the same
/// version.
pub use redis;

use conn::Conn;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tollgate";

/// The default [`RedisBackendBuilder::connect_timeout`]: 500 ms, a hundred
/// times a healthy TCP + TLS + handshake on a LAN, and short enough that a
/// reconnection blocked by a silent network notices the path is back
/// within half a second.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// The default [`RedisBackendBuilder::response_timeout`]: 500 ms (the redis
/// crate's own default), far above a healthy reply (well under a
/// millisecond on a LAN, a few ms for an `fsync`) and ten times the
/// limiter's default per-decision timeout, so only a connection that has
/// really stopped answering is replaced.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

/// The Redis backend.
///
/// Cheap to clone; clones share the connections (and so the counters,
/// which live in Redis anyway).
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    prefix: String,
    clock: Option<Arc<dyn Clock>>,
    min_ttl_ms: u64,
    override_cache_ttl: Duration,
    /// What this client knows of each limiter's overrides, and when it read
    /// it (see [`RedisBackendBuilder::override_cache_ttl`]).
    override_cache: Mutex<HashMap<String, Cached>>,
}

/// A limiter's overrides as this client last read them.
struct Cached {
    /// When the read was sent: the entry is no younger than what it holds.
    read_at: Instant,
    overrides: LimiterOverrides,
    /// A caller is reading them again (see `RedisBackend::limiter_overrides`).
    refreshing: bool,
    /// The policy the limiter's last call was configured with, and its
    /// script form (`encoding::script_arg`): formatted once, not on every
    /// decision.
    configured: Option<(Policy, Arc<str>)>,
}

impl Cached {
    /// The script form of `policy`, if it is the configured policy this
    /// entry keeps.
    fn configured_arg(&self, policy: &Policy) -> Option<Arc<str>> {
        self.configured
            .as_ref()
            .and_then(|(p, a)| (p == policy).then(|| Arc::clone(a)))
    }
}

/// What a client reads of a limiter's overrides, in one `MGET`.
#[derive(Clone, Default)]
struct LimiterOverrides {
    /// The limiter-wide override, sent as the policy.
    wide: Option<Wide>,
    /// Whether the limiter has per-key overrides (its marker is set): only
    /// then does a call send the key's override key.
    keyed: bool,
}

/// A limiter-wide override as this client read it, decoded once per read.
#[derive(Clone)]
struct Wide {
    /// Decoded, or why it does not decode: then every decision fails (the
    /// limiter's fail mode answers, and its breaker does not count it:
    /// `ErrorReason::InvalidPolicy`) until it is fixed or removed, as
    /// [`Backend::get_override`] fails. Sent as stored, a value the script
    /// can read but no constructor accepts (a zero window) was enforced.
    policy: Result<Policy, encoding::EncodingError>,
    /// Its script form, when it has one (`encoding::script_arg`).
    arg: Option<Arc<str>>,
    /// When an override set for a time expires (by this client's clock,
    /// from the time it had left when read, counted from before the read):
    /// from then on the entry holds none, even while its refreshes fail,
    /// so an expired override is never enforced for longer than it was
    /// set, whatever the override's master does.
    until: Option<Instant>,
}

impl Wide {
    fn new(stored: &str, until: Option<Instant>) -> Self {
        let policy = encoding::decode(stored);
        let arg = policy
            .as_ref()
            .ok()
            .and_then(|p| encoding::script_arg(p).ok())
            .map(Arc::from);
        Self { policy, arg, until }
    }

    /// Whether it is still in force (see `until`).
    fn live(&self) -> bool {
        self.until.is_none_or(|until| Instant::now() < until)
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix)
            .field("cluster", &self.inner.conn.is_cluster())
            .field("caller_time", &self.inner.clock.is_some())
            .finish_non_exhaustive()
    }
}

/// The latest caller time ([`RedisBackendBuilder::caller_time`], µs since
/// the epoch: 2092-09-21 UTC) a decision is made at; a later one fails with
/// [`RedisError::CallerTimeOutOfRange`].
///
/// The scripts compute in Lua numbers, exact below 2^53
/// ([`encoding::MAX_EXACT`]). The largest they derive from now is a
/// token bucket's: its arrival time, up to two full refills ahead (each
/// at most [`MAX_SPAN_MICROS`](tollgate_limiter::policy::MAX_SPAN_MICROS)),
/// plus, in a reservation's mark and its settle, up to twice a life's
/// refunds ([`MAX_REFUNDED`](tollgate_limiter::strategy::token_bucket::MAX_REFUNDED)).
/// Past this time they would round, and the decisions differ from the
/// model's (the memory backend's). The server's `TIME` (the default) is
/// far below it.
pub const MAX_CALLER_TIME: u64 = encoding::MAX_EXACT
    - 2 * tollgate_limiter::policy::MAX_SPAN_MICROS
    - 2 * tollgate_limiter::strategy::token_bucket::MAX_REFUNDED;

/// Builds a [`RedisBackend`].
#[must_use]
pub struct RedisBackendBuilder {
    urls: Vec<String>,
    cluster: bool,
    prefix: String,
    pool_size: u32,
    exclusive_checkout: bool,
    test_on_check_out: bool,
    pool_timeout: Duration,
    connect_timeout: Duration,
    response_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    min_ttl: Duration,
    durability: Durability,
    override_cache_ttl: Duration,
    /// The CA and the client certificate for TLS connections.
    tls: tls::TlsSettings,
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // URLs may hold a password: show only where they point.
        // A Sentinel URL's query may hold the sentinels' password.
        let hosts: Vec<&str> = self
            .urls
            .iter()
            .map(|u| u.rsplit('@').next().unwrap_or(u))
            .map(|u| u.split('?').next().unwrap_or(u))
            .collect();
        f.debug_struct("RedisBackendBuilder")
            .field("hosts", &hosts)
            .field("cluster", &self.cluster)
            .field("prefix", &self.prefix)
            .field("pool_size", &self.pool_size)
            .field("exclusive_checkout", &self.exclusive_checkout)
            .field("test_on_check_out", &self.test_on_check_out)
            .field("pool_timeout", &self.pool_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("caller_time", &self.clock.is_some())
            .field("min_ttl", &self.min_ttl)
            .field("durability", &self.durability)
            .field("override_cache_ttl", &self.override_cache_ttl)
            .field("tls_root_cert", &self.tls.root_cert.is_some())
            // Never the key.
            .field("tls_client_cert", &self.tls.client.is_some())
            .finish()
    }
}

impl RedisBackendBuilder {
    fn new(urls: Vec<String>, cluster: bool) -> Self {
        Self {
            urls,
            cluster,
            prefix: DEFAULT_PREFIX.to_owned(),
            pool_size: 1,
            exclusive_checkout: false,
            test_on_check_out: false,
            pool_timeout: Duration::from_secs(1),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            clock: None,
            min_ttl: Duration::ZERO,
            durability: Durability::default(),
            override_cache_ttl: Duration::from_secs(1),
            tls: tls::TlsSettings::default(),
        }
    }

    /// Trusts only this CA certificate (PEM) for `rediss://` servers (and,
    /// with `rediss+sentinel://`, for the sentinels and every server they
    /// name), instead of the system and Mozilla roots (feature `tls`).
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_cert = Some(pem.into());
        self
    }

    /// Presents this client certificate (mutual TLS) on every TLS
    /// connection: to a `rediss://` server, a cluster's `rediss://` nodes,
    /// and with `rediss+sentinel://` to the sentinels and every server they
    /// name. For servers that ask clients for one (`tls-auth-clients yes`,
    /// Redis's default on a TLS port) or accept one as an ACL user's
    /// identity.
    ///
    /// `cert_pem` holds the client's certificate first, then any
    /// intermediates; `key_pem` its private key, unencrypted: PKCS#8
    /// (`BEGIN PRIVATE KEY`), PKCS#1 RSA (`BEGIN RSA PRIVATE KEY`) or SEC1
    /// EC (`BEGIN EC PRIVATE KEY`), RSA, ECDSA P-256/P-384 or Ed25519.
    ///
    /// Checked by [`build`](Self::build) and
    /// [`build_lazy`](Self::build_lazy), before any connection, with
    /// [`RedisError::InvalidClientCert`]: PEM that holds no certificate or
    /// no usable key, a key that is not the certificate's, or a URL that is
    /// not TLS (a certificate that would never be sent). A build without
    /// the feature `tls` refuses it ([`RedisError::Unsupported`]), as it
    /// refuses `rediss://`.
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some(tls::ClientCert {
            cert: cert_pem.into(),
            key: key_pem.into(),
        });
        self
    }

    /// The first part of every key (default `"tollgate"`): not empty,
    /// without braces (they would move the hash tag) or `:` (prefix `a`
    /// with limiter `b:c` would share keys with prefix `a:b` and limiter
    /// `c`), the configuration's rule for `defaults.prefix`;
    /// [`build`](Self::build) refuses another, naming that field.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The number of multiplexed connections (default 1).
    ///
    /// A call does not hold a connection for its round trip: it clones a
    /// slot's multiplexed connection, and concurrent decisions are pipelined
    /// on it. Each connection has its own keeper, which replaces it when it
    /// stops answering. On one Redis server a single connection is the fastest
    /// measured here (Redis reads and answers whole batches per syscall; see
    /// `docs/benchmarks.md`); add connections when the client has many
    /// cores and one connection's I/O task becomes the bottleneck.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// Holds a pooled connection for the whole call, like a classic pool
    /// (default `false`). Then at most [`pool_size`](Self::pool_size)
    /// decisions are in flight and the others wait for a connection: size
    /// the pool to the concurrency.
    pub fn exclusive_checkout(mut self, yes: bool) -> Self {
        self.exclusive_checkout = yes;
        self
    }

    /// Sends a `PING` on every checkout (default `false`: it costs a round
    /// trip per decision; a connection that fails or stops answering is
    /// replaced in the background instead).
    pub fn test_on_check_out(mut self, yes: bool) -> Self {
        self.test_on_check_out = yes;
        self
    }

    /// With [`exclusive_checkout`](Self::exclusive_checkout): how long a
    /// call waits for a free connection (default 1 s; a limiter's own
    /// timeout is usually shorter). Shared connections are never waited
    /// for: a slot without a healthy connection fails the call at once
    /// ([`RedisError::Disconnected`]).
    pub fn pool_timeout(mut self, timeout: Duration) -> Self {
        self.pool_timeout = timeout;
        self
    }

    /// How long one connection attempt may take, TCP, TLS and handshake
    /// (default [`DEFAULT_CONNECT_TIMEOUT`], 500 ms).
    ///
    /// While Redis cannot be reached, each slot's keeper starts an attempt
    /// every 250 ms at most; one that hangs (a silent network) is given up
    /// after this long, so it also bounds how late a reconnection can notice
    /// that the path is back.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a connection may leave a request unanswered before it
    /// counts as dead and is replaced (default
    /// [`DEFAULT_RESPONSE_TIMEOUT`], 500 ms).
    ///
    /// This is not the per-decision timeout (the [`Limiter`]'s, tens of
    /// milliseconds, which answers a slow call from the fail mode): it is the
    /// backend's own judgement of the connection, made by a `PING` of its
    /// own whenever a call failed or was given up, so it holds whether or not
    /// the caller waited. Keep it well above the slowest healthy reply (a
    /// busy server, an `fsync`), or healthy connections are replaced under
    /// load. It also bounds every call: a limiter whose timeout is longer
    /// than this waits at most this long for a reply. A limiter whose
    /// timeout is shorter (the default) ends the call first; its decisions
    /// then arm no response timer (see `Backend::decide_within`), one timer
    /// a decision instead of two (a one-server or Sentinel backend; a
    /// cluster's client keeps its own).
    ///
    /// [`Limiter`]: tollgate_limiter::Limiter
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Takes "now" from `clock` instead of the Redis server's `TIME`: for
    /// tests (a [`MockClock`](tollgate_limiter::MockClock)) and replays.
    ///
    /// Workers whose clocks disagree would then disagree on limits: keep the
    /// server's time in production. A decision at a time past
    /// [`MAX_CALLER_TIME`] fails ([`RedisError::CallerTimeOutOfRange`]).
    pub fn caller_time(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The least TTL given to a written key (default zero).
    ///
    /// The scripts store each key's expiry and honour it in the caller's
    /// time, but Redis drops keys in real time: a test whose mock clock
    /// stands still while real time passes needs this floor so that Redis
    /// does not drop a key its clock still counts. Leave it at zero in
    /// production: it lets keys outlive their state.
    pub fn min_ttl(mut self, ttl: Duration) -> Self {
        self.min_ttl = ttl;
        self
    }

    /// What to do with the durability check (default
    /// [`Durability::Report`]).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// How long what this client read of a limiter's overrides may be used
    /// before it is read again (default 1 s).
    ///
    /// The client reads a limiter's override and whether the limiter has
    /// per-key overrides (one `MGET`, once per TTL per limiter), sends the
    /// override with each decision instead of the configured policy, and
    /// has a token bucket's script read the key's override only when there
    /// are per-key overrides: the common decision reads one key, not two.
    /// It bounds how long other workers keep deciding under a limiter-wide
    /// override that was changed or expired, and how long they take to see
    /// a limiter's first per-key override (later per-key changes, clears
    /// included, apply on their next decision). This backend's own
    /// [`set_override`](Backend::set_override) and
    /// [`set_expiring_override`](Backend::set_expiring_override) apply at
    /// once. When an entry expires, one decision reads it again while the
    /// others use the entry they have until that read is back (at most one
    /// more TTL). Zero reads it on every decision (one more round trip
    /// each).
    pub fn override_cache_ttl(mut self, ttl: Duration) -> Self {
        self.override_cache_ttl = ttl;
        self
    }

    /// Connects, loads the scripts and runs the durability check.
    ///
    /// Fails when Redis cannot be reached; see
    /// [`build_lazy`](Self::build_lazy) for a service that must start
    /// whatever the state of Redis.
    pub async fn build(self) -> Result<RedisBackend, RedisError> {
        self.check()?;
        let conn = Conn::connect(self.connector()?, self.timeouts(), self.usage()).await?;
        let durability = self.durability;
        let backend = self.backend(conn);
        for code in scripts::ALL {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(code);
            let _: Value = backend.inner.conn.query(&load).await?;
        }
        match durability {
            Durability::Skip => {}
            mode => {
                let report = backend.check_durability().await?;
                report.log();
                if mode == Durability::Strict && !report.is_durable() {
                    return Err(RedisError::NotDurable(Box::new(report)));
                }
            }
        }
        Ok(backend)
    }

    /// Builds a backend without waiting for the network: the connections
    /// are made in the background (and made again, every 250 ms at most,
    /// while Redis is down); until one answers, decisions fail at once
    /// ([`RedisError::Disconnected`]) so the limiter's fail mode answers.
    /// Scripts load on first use. The durability check does not run: call
    /// [`RedisBackend::check_durability`] once Redis is up.
    ///
    /// For services that must start even when Redis is not there yet (a
    /// fail-open API-key limit). Works for a single server and a cluster.
    /// Call it within a Tokio runtime.
    pub fn build_lazy(self) -> Result<RedisBackend, RedisError> {
        self.check()?;
        let conn = Conn::lazy(&self.connector()?, self.timeouts(), self.usage());
        Ok(self.backend(conn))
    }

    fn check(&self) -> Result<(), RedisError> {
        // The configuration's rule (`defaults.prefix`): a ':' made prefix
        // `a` with limiter `b:c` and prefix `a:b` with limiter `c` share
        // every key.
        if let Err(rule) = tollgate_limiter::config::check_prefix(&self.prefix) {
            return Err(RedisError::Config(tollgate_limiter::ConfigError::Invalid {
                path: "defaults".into(),
                field: "prefix",
                reason: format!("{:?} {rule}", self.prefix),
            }));
        }
        if self.cluster && self.urls.iter().any(|u| sentinel::is_sentinel_url(u)) {
            return Err(RedisError::InvalidUrl(
                "a redis+sentinel:// URL is not a cluster node".into(),
            ));
        }
        if self.urls.iter().any(|u| u.starts_with("rediss://")) {
            #[cfg(not(feature = "tls"))]
            return Err(RedisError::Unsupported("rediss:// needs the `tls` feature"));
        }
        if let Some(client) = &self.tls.client {
            #[cfg(not(feature = "tls"))]
            {
                let _ = client;
                return Err(RedisError::Unsupported(
                    "tls_client_cert (a TLS client certificate) needs the `tls` feature",
                ));
            }
            #[cfg(feature = "tls")]
            {
                if let Some(plain) = self.urls.iter().find(|u| !is_tls_url(u)) {
                    let scheme = plain.split("://").next().unwrap_or_default();
                    return Err(RedisError::InvalidClientCert(format!(
                        "tls_client_cert is set but a URL is {scheme}://, not TLS: the \
                         certificate would never be sent (use rediss:// or rediss+sentinel://)"
                    )));
                }
                tls::check_client_cert(&client.cert, &client.key).map_err(|(part, why)| {
                    RedisError::InvalidClientCert(match part {
                        tls::Part::Cert => format!("tls_client_cert's certificate PEM {why}"),
                        tls::Part::Key => format!("tls_client_cert's private key PEM {why}"),
                    })
                })?;
            }
        }
        if self.urls.iter().any(|u| is_tls_url(u)) {
            #[cfg(feature = "tls")]
            {
                // Several rustls providers may be compiled in; pick ring.
                let _ = rustls::crypto::ring::default_provider().install_default();
            }
        }
        Ok(())
    }

    fn timeouts(&self) -> conn::Timeouts {
        conn::Timeouts {
            connect: self.connect_timeout,
            response: self.response_timeout,
        }
    }

    fn usage(&self) -> conn::Usage {
        conn::Usage {
            size: self.pool_size,
            exclusive: self.exclusive_checkout.then_some(self.pool_timeout),
            ping_on_checkout: self.test_on_check_out,
        }
    }

    fn connector(&self) -> Result<conn::Connector, RedisError> {
        if self.cluster {
            return self.cluster_connector();
        }
        let url = self.urls.first().ok_or(RedisError::Unsupported("no URL"))?;
        if sentinel::is_sentinel_url(url) {
            let parsed = sentinel::parse(url)?;
            let t = self.timeouts();
            return Ok(conn::Connector::Sentinel {
                sentinel: sentinel::Sentinels::new(&parsed, t, self.tls.clone())?,
                config: conn::manager_config(self.timeouts()),
            });
        }
        let client = redis::Client::open(self.connection_info(url)?)?;
        Ok(conn::Connector::single(client, self.timeouts()))
    }

    fn backend(self, conn: Conn) -> RedisBackend {
        RedisBackend {
            inner: Arc::new(Inner {
                conn,
                prefix: self.prefix,
                clock: self.clock,
                min_ttl_ms: u64::try_from(self.min_ttl.as_millis()).unwrap_or(u64::MAX),
                override_cache_ttl: self.override_cache_ttl,
                override_cache: Mutex::default(),
            }),
        }
    }

    fn connection_info(&self, url: &str) -> Result<redis::ConnectionInfo, RedisError> {
        #[cfg(feature = "tls")]
        if let Some(certs) = self.tls.certificates() {
            return Ok(redis::Client::build_with_tls(url, certs)?
                .get_connection_info()
                .clone());
        }
        Ok(redis::IntoConnectionInfo::into_connection_info(url)?)
    }

    #[cfg(feature = "cluster")]
    fn cluster_connector(&self) -> Result<conn::Connector, RedisError> {
        #[allow(unused_mut)]
        let mut builder =
            redis::cluster::ClusterClientBuilder::new(self.urls.iter().map(String::as_str))
                .connection_timeout(self.connect_timeout)
                .response_timeout(self.response_timeout);
        #[cfg(feature = "tls")]
        if let Some(certs) = self.tls.certificates() {
            builder = builder.certs(certs);
        }
        let first = self.urls.first().ok_or(RedisError::Unsupported("no URL"))?;
        Ok(conn::Connector::Cluster {
            client: builder.build()?,
            connect_timeout: self.connect_timeout,
            node: Box::new(self.connection_info(first)?),
        })
    }

    #[cfg(not(feature = "cluster"))]
    fn cluster_connector(&self) -> Result<conn::Connector, RedisError> {
        Err(RedisError::Unsupported(
            "Redis Cluster needs the `cluster` feature",
        ))
    }
}

/// Whether `url` is TLS: `rediss://`, or `rediss+sentinel://`.
fn is_tls_url(url: &str) -> bool {
    url.starts_with("rediss://") || sentinel::parse(url).is_ok_and(|p| p.tls)
}

/// `<scheme>h1:p1,h2:p2/<master_name>`.
fn sentinel_url<I, S>(scheme: &str, sentinels: I, master_name: &str) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let hosts: Vec<String> = sentinels
        .into_iter()
        .map(|s| s.as_ref().to_owned())
        .collect();
    format!("{scheme}{}/{master_name}", hosts.join(","))
}

impl RedisBackend {
    /// Starts building a backend for one Redis server (`redis://` or
    /// `rediss://`, with `user:password@` for ACL users), or for the master
    /// of a Redis Sentinel setup:
    ///
    /// ```text
    /// redis+sentinel://[user:password@]host[:port][,host[:port]...]/<master-name>[/<db>]
    /// ```
    ///
    /// The hosts are the sentinels (port 26379 by default), the
    /// credentials are the master's; sentinels with a password of their
    /// own take `?sentinel_password=..` (and `sentinel_username=..`). Every
    /// connection, at start-up and whenever one is replaced, asks the
    /// sentinels where the master is now, so decisions follow a failover.
    /// `rediss+sentinel://` (feature `tls`) is TLS to the sentinels and to
    /// every server they name, verified as with `rediss://`.
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder::new(vec![url.into()], false)
    }

    /// Starts building a backend for the master `master_name` of a Redis
    /// Sentinel setup, from the sentinels' `host:port` addresses (no
    /// credentials; use a `redis+sentinel://` URL with
    /// [`builder`](Self::builder) for those).
    pub fn sentinel_builder<I, S>(sentinels: I, master_name: &str) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::builder(sentinel_url(sentinel::SCHEME, sentinels, master_name))
    }

    /// Like [`sentinel_builder`](Self::sentinel_builder), with TLS to the
    /// sentinels and to the master (the `rediss+sentinel://` URL):
    /// certificates verified as with `rediss://`, against the system and
    /// Mozilla roots or only the CA given with
    /// [`tls_root_cert`](RedisBackendBuilder::tls_root_cert). Without the
    /// feature `tls`, `build` fails with [`RedisError::Unsupported`].
    pub fn sentinel_tls_builder<I, S>(sentinels: I, master_name: &str) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::builder(sentinel_url(sentinel::TLS_SCHEME, sentinels, master_name))
    }

    /// Starts building a backend for a Redis Cluster, from one or more of
    /// its nodes (feature `cluster`).
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster_builder<I, S>(urls: I) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisBackendBuilder::new(urls.into_iter().map(Into::into).collect(), true)
    }

    /// A backend for one server with the default settings.
    pub async fn connect(url: impl Into<String>) -> Result<Self, RedisError> {
        Self::builder(url).build().await
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The Redis key holding `key`'s state for `limiter`:
    /// `<prefix>:<limiter>:{<key>}`.
    pub fn state_key(&self, limiter: &str, key: &Key) -> String {
        // Built by hand: `format!` cost ~2 % of a client's CPU under load
        // (perf, the load tool), this a third of it.
        let (prefix, key) = (self.inner.prefix.as_str(), key.as_str());
        let mut s = String::with_capacity(prefix.len() + limiter.len() + key.len() + 4);
        for part in [prefix, ":", limiter, ":{", key, "}"] {
            s.push_str(part);
        }
        s
    }

    fn limiter_override_key(&self, limiter: &str) -> String {
        format!("{}:{limiter}:override", self.inner.prefix)
    }

    /// The marker that `limiter` has per-key overrides:
    /// `<prefix>:<limiter>:keyed{<prefix>:<limiter>:override}`, whose hash
    /// tag is the limiter-wide override's key (which holds no braces), so
    /// both are in one slot and read with one `MGET`, in a cluster too.
    fn keyed_marker_key(&self, limiter: &str) -> String {
        format!(
            "{}:{limiter}:keyed{{{}}}",
            self.inner.prefix,
            self.limiter_override_key(limiter)
        )
    }

    fn override_key(&self, scope: Scope<'_>) -> Result<String, RedisError> {
        check_limiter(scope.limiter())?;
        Ok(match scope {
            Scope::Limiter(l) => self.limiter_override_key(l),
            Scope::Key(l, k) => self.state_key(l, k) + ":override",
        })
    }

    /// Runs the durability check now (it also runs at start-up unless
    /// [`Durability::Skip`]).
    ///
    /// It covers every server that holds the counters or can come to: each
    /// master of a cluster and its replicas; with Sentinel the master and
    /// the replicas the sentinels know.
    pub async fn check_durability(&self) -> Result<DurabilityReport, RedisError> {
        if let conn::Connector::Sentinel { sentinel, .. } = self.inner.conn.connector() {
            // The master the sentinels name, on a connection of its own: a
            // slot's connection may still reach the one before a failover
            // (until the keepers move it), whose settings were reported
            // under the new master's name.
            let t = self.inner.conn.timeouts();
            let master = sentinel.master().await?;
            let mut nodes = vec![durability::check_client(&master, t).await];
            for replica in sentinel.replicas().await? {
                nodes.push(durability::check_client(&replica, t).await);
            }
            return Ok(DurabilityReport { nodes });
        }
        match self.inner.conn.link()? {
            // The link, not its manager: each call under the response
            // timeout.
            mut link @ conn::Link::Single(_) => Ok(DurabilityReport {
                nodes: vec![durability::check_node("redis".into(), &mut link).await],
            }),
            #[cfg(feature = "cluster")]
            conn::Link::Cluster(mut c) => {
                let conn::Connector::Cluster { node, .. } = self.inner.conn.connector() else {
                    unreachable!("a cluster link comes from a cluster connector")
                };
                durability::check_cluster(&mut c, node, self.inner.conn.timeouts()).await
            }
        }
    }

    /// Sets the per-key-override marker of every limiter that has per-key
    /// overrides stored, and answers their names (sorted).
    ///
    /// Needed once when upgrading from a version before the marker: the
    /// per-key overrides it stored have none, and a token-bucket limiter
    /// ignores them until it is set (see docs/redis.md, "Upgrading"). It
    /// walks the keyspace (`SCAN`, on every master of a cluster), so it is
    /// an operator's command (`tollgate override mark`), not a service's.
    /// Setting a marker that is already set changes nothing.
    pub async fn mark_keyed_overrides(&self) -> Result<Vec<String>, RedisError> {
        let pattern = format!("{}:*:{{*}}:override", glob_escape(&self.inner.prefix));
        let keys = self.scan_masters(&pattern).await?;
        let limiters: std::collections::BTreeSet<String> = keys
            .iter()
            .filter_map(|k| match self.override_of(k)? {
                (limiter, Some(_)) => Some(limiter.to_owned()),
                (_, None) => None,
            })
            .collect();
        for l in &limiters {
            let mut mark = redis::cmd("SET");
            mark.arg(self.keyed_marker_key(l)).arg("1");
            let _: Value = self.inner.conn.query(&mark).await?;
            if let Some(c) = lock(&self.inner.override_cache).get_mut(l.as_str()) {
                c.overrides.keyed = true;
            }
        }
        Ok(limiters.into_iter().collect())
    }

    /// Every override stored under this backend's prefix, or under one
    /// limiter's: limiter-wide and per key, each with the time it has left
    /// when it was set for a time; sorted by limiter, the limiter-wide one
    /// first, then by key. A value that is no policy (written by hand, or
    /// by another tool) is listed with why, so that it can be cleared.
    ///
    /// It walks the keyspace (`SCAN`, on every master of a cluster), then
    /// reads each override: an operator's command (`tollgate override
    /// list`), not a service's. An override set or cleared meanwhile may or
    /// may not be listed.
    pub async fn list_overrides(
        &self,
        limiter: Option<&str>,
    ) -> Result<Vec<StoredOverride>, RedisError> {
        let prefix = glob_escape(&self.inner.prefix);
        let pattern = match limiter {
            Some(l) => {
                check_limiter(l)?;
                format!("{prefix}:{}:*override", glob_escape(l))
            }
            None => format!("{prefix}:*override"),
        };
        let mut found: Vec<(String, Option<String>, String)> = self
            .scan_masters(&pattern)
            .await?
            .into_iter()
            .filter_map(|k| {
                let (l, key) = self.override_of(&k)?;
                let keep = limiter.is_none_or(|want| want == l);
                keep.then(|| (l.to_owned(), key.map(str::to_owned), k.clone()))
            })
            .collect();
        found.sort();
        found.dedup();
        // Read 64 at a time: one after the other, thousands of overrides
        // (an AIMD controller's scopes) took longer than a CLI's timeout.
        use futures_util::{StreamExt, TryStreamExt};
        let read = futures_util::stream::iter(found)
            .map(
                |(limiter, key, at): (String, Option<String>, String)| async move {
                    let stored = self.read_stored_override(&at).await?;
                    Ok::<_, RedisError>(stored.map(|(policy, ttl)| StoredOverride {
                        limiter,
                        key,
                        policy,
                        ttl,
                    }))
                },
            )
            .buffered(64);
        let listed: Vec<Option<StoredOverride>> = read.try_collect().await?;
        Ok(listed.into_iter().flatten().collect())
    }

    /// The override stored at Redis key `at` and its time left; `None`
    /// when it is gone (cleared or expired since it was found). A value
    /// that is no policy, or no string (`WRONGTYPE`), is answered with why.
    async fn read_stored_override(
        &self,
        at: &str,
    ) -> Result<Option<(Result<Policy, String>, Option<Duration>)>, RedisError> {
        let (value, pttl) = self.get_with_pttl(at).await?;
        let policy = match value {
            Ok(Value::Nil) => return Ok(None),
            Ok(v) => match redis::from_redis_value::<String>(v) {
                Ok(text) => encoding::decode(&text).map_err(|e| format!("{text:?}: {e}")),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        let ttl = pttl
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis);
        Ok(Some((policy, ttl)))
    }

    /// `GET` and `PTTL` of `at` in one round trip (see
    /// [`read_with_pttl`](Self::read_with_pttl)), for an operator's look.
    async fn get_with_pttl(
        &self,
        at: &str,
    ) -> Result<(redis::RedisResult<Value>, Option<i64>), RedisError> {
        let mut get = redis::cmd("GET");
        get.arg(at);
        self.read_with_pttl(get, at).await
    }

    /// `read` and the `PTTL` of `at` in one round trip (the keys in one
    /// slot): `read`'s reply as it came (an error of its own, `WRONGTYPE`,
    /// fails neither), and what `PTTL` answered when it answered a number
    /// (a user not granted `+pttl`, the documented ACL before it was added,
    /// gets none). Not in a transaction (no `MULTI` to grant): a write
    /// between the two can pair a value with its successor's time left.
    async fn read_with_pttl(
        &self,
        read: redis::Cmd,
        at: &str,
    ) -> Result<(redis::RedisResult<Value>, Option<i64>), RedisError> {
        let mut pipe = redis::pipe();
        pipe.add_command(read).cmd("PTTL").arg(at).ignore_errors();
        let replies: Vec<redis::RedisResult<Value>> = self.inner.conn.pipeline(&pipe).await?;
        let mut replies = replies.into_iter();
        match (replies.next(), replies.next(), replies.next()) {
            (Some(value), Some(pttl), None) => {
                let pttl = match pttl {
                    Ok(Value::Int(ms)) => Some(ms),
                    _ => None,
                };
                Ok((value, pttl))
            }
            _ => Err(RedisError::Protocol(
                "a read and PTTL: not two replies".into(),
            )),
        }
    }

    /// The limiter and key (`None`: limiter-wide) whose override is stored
    /// at Redis key `at`, if it is one: `<prefix>:<limiter>:override` or
    /// `<prefix>:<limiter>:{<key>}:override`. Limiter names hold neither
    /// `:` nor `{`, keys no braces: another key of the prefix (a state, a
    /// marker, a candidate's) never parses as one.
    fn override_of<'a>(&self, at: &'a str) -> Option<(&'a str, Option<&'a str>)> {
        let rest = at
            .strip_prefix(self.inner.prefix.as_str())?
            .strip_prefix(':')?;
        let plain = |l: &str| !l.is_empty() && !l.contains([':', '{', '}']);
        if let Some(l) = rest.strip_suffix(":override").filter(|l| plain(l)) {
            return Some((l, None));
        }
        let (l, key) = rest.split_once(":{")?;
        let key = key.strip_suffix("}:override")?;
        (plain(l) && !key.contains(['{', '}'])).then_some((l, Some(key)))
    }

    /// Every key matching `pattern`, on the server or on every master of a
    /// cluster (a key may be answered twice; callers dedupe).
    async fn scan_masters(&self, pattern: &str) -> Result<Vec<String>, RedisError> {
        let keys = match self.inner.conn.link()? {
            link @ conn::Link::Single(_) => {
                scan(pattern, |cmd| {
                    let mut c = link.clone();
                    async move { cmd.query_async(&mut c).await }
                })
                .await?
            }
            #[cfg(feature = "cluster")]
            conn::Link::Cluster(mut c) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let mut keys = Vec::new();
                for (node, _) in durability::on_all_masters(&mut c, redis::cmd("PING")).await? {
                    let (host, port) = node
                        .rsplit_once(':')
                        // An IPv6 node is named `[addr]:port`.
                        .and_then(|(h, p)| {
                            Some((h.trim_matches(['[', ']']).to_owned(), p.parse().ok()?))
                        })
                        .ok_or_else(|| RedisError::Protocol(format!("cluster node {node:?}")))?;
                    let at =
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                    let on_node = scan(pattern, |cmd| {
                        let (mut c, at) = (c.clone(), at.clone());
                        async move { c.route_command(cmd, at).await }
                    });
                    keys.extend(on_node.await?);
                }
                keys
            }
        };
        Ok(keys)
    }

    /// What this client read of `limiter`'s overrides within the TTL.
    fn cached_overrides(&self, limiter: &str) -> Option<LimiterOverrides> {
        let cache = lock(&self.inner.override_cache);
        let c = cache.get(limiter)?;
        (c.read_at.elapsed() < self.inner.override_cache_ttl).then(|| c.overrides.clone())
    }

    /// The limiter-wide override to send as the policy, and whether the
    /// limiter has per-key overrides, from the short client cache (see
    /// [`RedisBackendBuilder::override_cache_ttl`]); with the script form
    /// of `policy` when the cache holds it.
    ///
    /// An entry in the last quarter of its TTL is read again in a task of
    /// its own, and every decision goes on with it meanwhile: under steady
    /// traffic no decision waits for the `MGET`, so a decision's latency
    /// never carries that round trip, nor, in a cluster whose override
    /// master is silent, the response timeout, which the limiter's own
    /// timeout (50 ms by default, against 500 ms) cut short, failing the
    /// decision. An entry found expired (no decision came in that quarter)
    /// is read again by the caller that found it while the others go on
    /// with what they have: so the bounds stay the TTL plus one round trip.
    /// A refresh that is dropped (its caller gave up) hands the turn to the
    /// next caller; one that fails leaves the entry as it was, read again a
    /// TTL later: in a cluster the override's master may be silent while
    /// the key's answers, and nobody can change an override its master does
    /// not take (the entry is what it last said). Time does change it: a
    /// limiter-wide override set for a time ends when its time is up
    /// (`Wide::until`), read again or not.
    async fn limiter_overrides(
        &self,
        limiter: &str,
        policy: &Policy,
    ) -> Result<(LimiterOverrides, Option<Arc<str>>), RedisError> {
        let ttl = self.inner.override_cache_ttl;
        let (configured, stale) = {
            let mut cache = lock(&self.inner.override_cache);
            match cache.get_mut(limiter) {
                None => (None, None),
                Some(c) => {
                    let age = c.read_at.elapsed();
                    let current = (c.overrides.clone(), c.configured_arg(policy));
                    if age < ttl - ttl / 4 || c.refreshing {
                        return Ok(current);
                    }
                    c.refreshing = true;
                    // A caller polling this outside a runtime (the
                    // connections run on the one they were made on) reads
                    // it itself.
                    if age < ttl
                        && let Ok(runtime) = tokio::runtime::Handle::try_current()
                    {
                        // The turn moves into the task: a task dropped
                        // before it ran (a runtime shutting down) gives it
                        // back.
                        let turn = self.refresh_turn(limiter);
                        let (policy, configured) = (*policy, c.configured.clone());
                        let stale = current.clone();
                        runtime.spawn(async move {
                            let _ = turn.read(&policy, configured, Some(stale)).await;
                        });
                        return Ok(current);
                    }
                    (c.configured.clone(), Some(current))
                }
            }
        };
        // No await since the flag was set: the turn is given back however
        // this ends. Boxed: a read once a TTL made every decision's future
        // 2.8 KB larger.
        Box::pin(self.refresh_turn(limiter).read(policy, configured, stale)).await
    }

    /// The turn to refresh `limiter`'s entry, whose `refreshing` flag the
    /// caller has just set (or which has no entry yet).
    fn refresh_turn(&self, limiter: &str) -> Refresh {
        Refresh {
            backend: self.clone(),
            limiter: limiter.to_owned(),
        }
    }

    /// The script form of `policy`, the configured policy of `limiter`,
    /// kept in its cache entry for the next calls.
    fn configured_arg(&self, limiter: &str, policy: &Policy) -> Result<Arc<str>, RedisError> {
        let arg: Arc<str> = encoding::script_arg(policy)?.into();
        if let Some(c) = lock(&self.inner.override_cache).get_mut(limiter) {
            c.configured = Some((*policy, Arc::clone(&arg)));
        }
        Ok(arg)
    }

    async fn decide_inner(&self, req: Request<'_>) -> Result<Decision, RedisError> {
        Ok(self.run(req, false, false).await?.0)
    }

    /// Runs the script of the policy in force; `reserve` makes an acquire
    /// a reservation, whose reply carries the marks.
    ///
    /// `caller_bound`: the caller gives up on the decision no later than
    /// the response timeout (see `Backend::decide_within`), so the scripts'
    /// calls arm no response timer.
    async fn run(
        &self,
        req: Request<'_>,
        reserve: bool,
        caller_bound: bool,
    ) -> Result<(Decision, Marks), RedisError> {
        let mut call = self.call(req, reserve).await?;
        let mut strategy = call.strategy;
        // The policy in force may be an override of another strategy: the
        // script then names the one to run; or of a calendar period or zone
        // we sent no bounds for, or the server's clock may be beyond them:
        // the script then names the specs and its time. Overrides changing
        // under our feet can bounce us at most a few times.
        for _ in 0..4 {
            let cmd = call.command(strategy);
            let reply: Value = self
                .inner
                .conn
                .eval_within(&cmd, scripts::source(strategy), caller_bound)
                .await?;
            match call.reply(reply, strategy)? {
                Reply::Decision(d, marks) => return Ok((d, marks)),
                // The scripts refuse a key's override across the
                // concurrency boundary themselves (lua/common.lua,
                // policy_in_force); never followed, whatever answered.
                Reply::Redirect(s) if across_concurrency_boundary(req.policy.strategy(), s) => {
                    return Err(across_boundary_error());
                }
                Reply::Redirect(s) => strategy = s,
                Reply::Bounds { now, specs } => {
                    for spec in specs {
                        let c = calendar_of_spec(&spec)?;
                        call.calendars.insert_as(spec, &c, now);
                    }
                }
            }
        }
        Err(RedisError::Protocol(
            "the policy in force kept changing (strategy or calendar bounds)".into(),
        ))
    }

    /// What one decision sends, whatever the script; `reserve` makes an
    /// acquire a reservation.
    async fn call(&self, req: Request<'_>, reserve: bool) -> Result<Call, RedisError> {
        check_limiter(req.limiter)?;
        // The policy sent: the limiter-wide override this client knows (read
        // and cached, see `limiter_overrides`), else the configured one.
        // A per-key override is read by the script.
        let (overrides, configured) = self.limiter_overrides(req.limiter, req.policy).await?;
        let in_force = overrides.wide.filter(Wide::live);
        let wide = in_force.is_some();
        let (policy, sent) = match in_force {
            // Stored in version 1, sent in the script's form.
            Some(w) => match (w.policy?, w.arg) {
                (p, Some(a)) => (a, Some(p)),
                // Decoded, but with no script form: the error.
                (p, None) => (encoding::script_arg(&p)?.into(), Some(p)),
            },
            None => match configured {
                Some(a) => (a, None),
                None => (self.configured_arg(req.limiter, req.policy)?, None),
            },
        };
        // The token bucket whose encoding ARGV[2] is, when it is one: the
        // policy the script's one-integer reply is decided under.
        let bucket = match (wide, &sent) {
            (false, _) => token_bucket(req.policy),
            (true, Some(p)) => token_bucket(p),
            (true, None) => None,
        };
        let sent = sent.as_ref().unwrap_or(req.policy);
        // A limiter-wide override across the concurrency boundary from the
        // configured policy is no policy (model::in_force): the scripts
        // compare a key's override with the policy sent, which is thus
        // always on the configured policy's side.
        if across_concurrency_boundary(req.policy.strategy(), sent.strategy()) {
            return Err(across_boundary_error());
        }
        let mut op = op_arg(req.op);
        if reserve {
            op.to_mut().insert(0, 'r');
        }
        // Caller time is read once, so a redirected call decides at the
        // same instant.
        let now = self.inner.clock.as_ref().map(|c| c.now());
        if let Some(t) = now.filter(|&t| t > MAX_CALLER_TIME) {
            return Err(RedisError::CallerTimeOutOfRange(t));
        }
        // Calendar quotas: the window bounds around this client's clock
        // (the script picks by its own; see lua/common.lua, ARGV[5]), for
        // the policy sent: a limiter-wide override's, not the configured
        // one's (without them, the script answers with the specs it lacks,
        // and every decision costs two round trips). The clock is read,
        // and the parts listed, only for a policy that has a calendar
        // quota (`parts()` allocates).
        let mut calendars = CalendarBounds::default();
        if matches!(sent, Policy::Calendar(_) | Policy::Composite(_)) {
            let client_now = now.unwrap_or_else(|| SystemClock.now());
            for p in sent.parts() {
                if let Policy::Calendar(c) = p {
                    calendars.insert(&c, client_now);
                }
            }
        }
        Ok(Call {
            state: self.state_key(req.limiter, req.key),
            now,
            acquire: match req.op {
                Op::Acquire(c) if !reserve => Some(c.min(encoding::MAX_EXACT)),
                _ => None,
            },
            bucket,
            op,
            policy,
            strategy: sent.strategy(),
            keyed: overrides.keyed,
            min_ttl_ms: self.inner.min_ttl_ms,
            calendars,
        })
    }

    /// The enforced decision and the candidate's in one round trip: the two
    /// scripts pipelined. Both keys carry the key's hash tag, so a cluster
    /// sends the pipeline to one node. A script not loaded yet (it did
    /// nothing), a policy in force of another strategy than the configured
    /// one (an override: the script charged nothing and named the one to
    /// run), or calendar bounds the script lacked, is sent again on its own.
    async fn decide_pair(
        &self,
        req: Request<'_>,
        candidate: Request<'_>,
    ) -> Result<(Decision, Option<Decision>), RedisError> {
        let (a, b) = match (
            self.call(req, false).await,
            self.call(candidate, false).await,
        ) {
            (Ok(a), Ok(b)) => (a, b),
            // A candidate that cannot be sent never fails the decision.
            (Ok(_), Err(_)) => return Ok((self.decide_inner(req).await?, None)),
            (Err(e), _) => return Err(e),
        };
        let (sa, sb) = (a.strategy, b.strategy);
        let (ia, ib) = (a.invocation(sa), b.invocation(sb));
        let mut pipe = redis::pipe();
        // Each reply on its own: a script that failed (not loaded yet) did
        // nothing, and only it is sent again.
        pipe.invoke_script(&ia).invoke_script(&ib).ignore_errors();
        let replies: Vec<redis::RedisResult<Value>> = self.inner.conn.pipeline(&pipe).await?;
        let mut replies = replies.into_iter();
        let mut next = |call: &Call, strategy| match replies.next() {
            Some(Ok(v)) => Some(call.reply(v, strategy)),
            Some(Err(e))
                if e.kind() != redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                Some(Err(RedisError::from(e)))
            }
            _ => None,
        };
        let (ra, rb) = (next(&a, sa), next(&b, sb));
        let enforced = match ra {
            Some(Ok(Reply::Decision(d, _))) => d,
            Some(Err(e)) => return Err(e),
            // Not loaded, a redirect or missing bounds: the single call
            // handles them.
            _ => self.decide_inner(req).await?,
        };
        let beside = match rb {
            Some(Ok(Reply::Decision(d, _))) => Some(d),
            Some(Err(_)) => None,
            _ => self.decide_inner(candidate).await.ok(),
        };
        Ok((enforced, beside))
    }
}

/// The error of a decision under an override across the concurrency
/// boundary: the scripts' own message (`ErrorReason::InvalidPolicy`).
fn across_boundary_error() -> RedisError {
    RedisError::from(encoding::EncodingError::Refused(
        "tollgate: invalid policy encoding (an override across the concurrency boundary)".into(),
    ))
}

/// An override as stored, listed by [`RedisBackend::list_overrides`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StoredOverride {
    /// The limiter it overrides.
    pub limiter: String,
    /// The key it is set for, as the store holds it (an IP, or a hashed
    /// API key or email: `#s:…`, `#e:…`); `None` for the limiter-wide one.
    pub key: Option<String>,
    /// The override, or why the stored value is no policy.
    pub policy: Result<Policy, String>,
    /// The time it has left, for one set for a time.
    pub ttl: Option<Duration>,
}

/// An expiry for `SET … PX`, in milliseconds rounded up: a part of a
/// millisecond is a whole one, so a ttl above zero is never `PX 0`,
/// which Redis refuses.
fn px_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
}

/// `s` with the glob characters of `SCAN … MATCH` escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Every key matching `pattern` on one server, by `SCAN` through `send`
/// (a key may be answered twice; callers dedupe).
async fn scan<F, Fut>(pattern: &str, send: F) -> Result<Vec<String>, RedisError>
where
    F: Fn(redis::Cmd) -> Fut,
    Fut: Future<Output = redis::RedisResult<Value>>,
{
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        let (next, batch): (u64, Vec<String>) =
            redis::from_redis_value(send(cmd).await?).map_err(redis::RedisError::from)?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// A caller's turn to read a limiter's overrides again: dropped before the
/// read came back (an error, or the caller gave up), it gives the turn to
/// the next caller, so no entry is left refreshing with nobody at it.
struct Refresh {
    backend: RedisBackend,
    limiter: String,
}

impl Refresh {
    /// Reads the limiter's overrides and stores them as its entry, keeping
    /// `configured` (the script form of its configured policy) in it. With
    /// `stale` (the entry there is), a failed read answers it instead of
    /// the error, and is tried again a TTL later: a silent master makes
    /// each read wait out the response timeout.
    async fn read(
        self,
        policy: &Policy,
        configured: Option<(Policy, Arc<str>)>,
        stale: Option<(LimiterOverrides, Option<Arc<str>>)>,
    ) -> Result<(LimiterOverrides, Option<Arc<str>>), RedisError> {
        let backend = &self.backend;
        let limiter = self.limiter.as_str();
        // Read before the query: the entry is no younger than what it holds.
        let now = Instant::now();
        let wide_key = backend.limiter_override_key(limiter);
        // With the time the limiter-wide override has left (both keys share
        // a slot). A write between the two pairs an override with its
        // successor's time left, until the next read. A user not granted
        // `+pttl` reads no time left, so its override ends when a refresh
        // reads it gone, as it did before.
        let mut mget = redis::cmd("MGET");
        mget.arg(&wide_key).arg(backend.keyed_marker_key(limiter));
        let read = backend
            .read_with_pttl(mget, &wide_key)
            .await
            .and_then(|(values, pttl)| {
                let values: (Option<String>, Option<String>) =
                    redis::from_redis_value(values?).map_err(redis::RedisError::from)?;
                let until = match pttl {
                    Some(ms) if ms >= 0 => Some(now + Duration::from_millis(ms.unsigned_abs())),
                    // Gone since the MGET: it ends now.
                    Some(-2) => Some(now),
                    _ => None,
                };
                Ok((values, until))
            });
        let ((wide, marker), until) = match (read, stale) {
            (Ok(read), _) => read,
            (Err(_), Some(stale)) => {
                if let Some(c) = lock(&backend.inner.override_cache).get_mut(limiter) {
                    c.read_at = Instant::now();
                }
                return Ok(stale);
            }
            (Err(e), None) => return Err(e),
        };
        let v = LimiterOverrides {
            wide: wide.as_deref().map(|w| Wide::new(w, until)),
            keyed: marker.is_some(),
        };
        let fresh = Cached {
            read_at: now,
            overrides: v.clone(),
            refreshing: false,
            configured,
        };
        let arg = fresh.configured_arg(policy);
        lock(&backend.inner.override_cache).insert(limiter.to_owned(), fresh);
        Ok((v, arg))
    }
}

impl Drop for Refresh {
    fn drop(&mut self) {
        if let Some(c) = lock(&self.backend.inner.override_cache).get_mut(&self.limiter) {
            c.refreshing = false;
        }
    }
}

/// One decision's keys and arguments (see `lua/common.lua`).
struct Call {
    state: String,
    now: Option<u64>,
    /// The cost of a plain acquire (as sent), the one operation the token
    /// bucket's one-integer reply answers.
    acquire: Option<u64>,
    /// The token bucket ARGV[2] encodes, if it does (and decodes).
    bucket: Option<TokenBucket>,
    op: Cow<'static, str>,
    /// ARGV[2]: the limiter-wide override known to the client, else the
    /// configured policy.
    policy: Arc<str>,
    /// The strategy of `policy`: the script to run first.
    strategy: Strategy,
    /// Whether the limiter has per-key overrides (see `LimiterOverrides`).
    keyed: bool,
    min_ttl_ms: u64,
    /// ARGV[5]: calendar bounds, grown when the script asks for more.
    calendars: CalendarBounds,
}

impl Call {
    /// What a script's reply says. The token bucket's plain acquire under
    /// the policy sent answers one integer, the debt in µs before the
    /// decision: `d` when admitted, `-d - 1` when refused (see
    /// `lua/token_bucket.lua`); the decision is the reference model's from
    /// that debt, and must agree with the script's verdict.
    fn reply(&self, v: Value, strategy: Strategy) -> Result<Reply, RedisError> {
        let r = match v {
            Value::Array(items) => return parse_reply(&items, strategy),
            Value::Int(r) => r,
            other => return Err(RedisError::Protocol(format!("reply: {other:?}"))),
        };
        let (Strategy::TokenBucket, Some(p), Some(cost)) = (strategy, self.bucket, self.acquire)
        else {
            return Err(RedisError::Protocol(format!(
                "an integer reply ({r}) to a call that is not a plain acquire of the token bucket sent"
            )));
        };
        let admitted = r >= 0;
        let debt = if admitted { r } else { -(r + 1) };
        let debt = u64::try_from(debt).map_err(|_| RedisError::Protocol(format!("reply {r}")))?;
        // The model's charge from that debt (a clock at 0, the arrival
        // time `debt`), its window included.
        let (decision, _) = tollgate_limiter::model::charge_bucket(debt, 0, &p, cost);
        if decision.is_allowed() != admitted {
            return Err(RedisError::Protocol(format!(
                "reply {r}: the script's verdict is not the model's"
            )));
        }
        Ok(Reply::Decision(decision, Marks::default()))
    }

    /// The invocation of `strategy`'s script: the keys it uses, and the
    /// arguments without the trailing ones at their defaults (a token
    /// bucket's production call is one key and two arguments).
    fn invocation(&self, strategy: Strategy) -> redis::ScriptInvocation<'static> {
        let mut inv = scripts::for_strategy(strategy).prepare_invoke();
        self.each_key(strategy, |k| {
            inv.key(k);
        });
        self.each_arg(strategy, |a| {
            inv.arg(a);
        });
        inv
    }

    /// The `EVALSHA` of [`invocation`](Self::invocation), built at once:
    /// one buffer, where an invocation allocates each key and argument
    /// apart, then copies them into its command (13.6 → 8.3 allocations
    /// a decision in all, and 9,597 → 8,308 instructions in the backend;
    /// callgrind, the load tool's hot key). The caller
    /// sends the script itself when the server does not hold it (see
    /// `Conn::eval`).
    fn command(&self, strategy: Strategy) -> Cmd {
        let script = scripts::for_strategy(strategy);
        let keys = self.key_suffixes(strategy).count();
        // Room for what a production call sends (the further keys are the
        // state's and a suffix; the optional arguments are rare): no
        // growing on the way.
        let bytes = 64 + keys * (self.state.len() + 8) + self.op.len() + self.policy.len();
        // At most six arguments (see `each_arg`).
        let mut cmd = Cmd::with_capacity(3 + keys + 6, bytes);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        self.each_key(strategy, |k| {
            cmd.arg(k);
        });
        self.each_arg(strategy, |a| {
            cmd.arg(a);
        });
        cmd
    }

    /// The script's keys under `strategy`, in order, as suffixes of the
    /// state key (`""` for the state itself): one list, which both the
    /// key count and the keys sent come from.
    fn key_suffixes(&self, strategy: Strategy) -> impl Iterator<Item = &'static str> {
        // The key's override, only when the limiter has per-key overrides:
        // a call reads one key less, and names only keys that live and
        // move together, which a cluster slot in migration still serves
        // (see lua/common.lua). The scripts find their own further keys
        // from the end.
        let key_override = self.keyed.then_some(":override");
        let own: &'static [&'static str] = match strategy {
            Strategy::SlidingWindow => &[":log"],
            // The parts' logs (see lua/composite.lua).
            Strategy::Composite => &[":log1", ":log2", ":log3", ":log4"],
            // The slots (see lua/concurrency.lua).
            Strategy::Concurrency => &[":slots"],
            Strategy::TokenBucket | Strategy::ProgressiveDelay | Strategy::Calendar => &[],
        };
        std::iter::once("")
            .chain(key_override)
            .chain(own.iter().copied())
    }

    /// The script's keys under `strategy`, in order.
    fn each_key(&self, strategy: Strategy, mut key: impl FnMut(&str)) {
        for suffix in self.key_suffixes(strategy) {
            if suffix.is_empty() {
                key(&self.state);
            } else {
                key(&format!("{}{suffix}", self.state));
            }
        }
    }

    /// `strategy`'s script's arguments, in order: `lua/common.lua`'s, or
    /// the token bucket's own (see `lua/token_bucket.lua`): the bucket's
    /// interval and tau where the others take the policy's encoding, which
    /// is sent last, only when the policy sent is no token bucket (a key's
    /// override redirected the call). Those at their defaults are left off
    /// from the end (in production all: a check sends the token bucket's
    /// two numbers alone, another script the operation and the policy).
    fn each_arg(&self, strategy: Strategy, mut arg: impl FnMut(Arg<'_>)) {
        let now = self.now.map(|n| n.to_string()).unwrap_or_default();
        let calendars;
        // Each argument, and whether it is at its default.
        let args: [(Arg<'_>, bool); 6] = if strategy == Strategy::TokenBucket {
            let bucket = self.bucket.as_ref().map(encoding::bucket_args);
            let [interval, tau] = bucket.unwrap_or([0, 0]);
            [
                (Arg::Number(interval), false),
                (Arg::Number(tau), false),
                (Arg::Text(&self.op), self.op == "1"),
                (Arg::Text(&now), self.now.is_none()),
                (Arg::Number(self.min_ttl_ms), self.min_ttl_ms == 0),
                (Arg::Text(&self.policy), bucket.is_some()),
            ]
        } else {
            calendars = self.calendars.arg();
            [
                (Arg::Text(&self.op), false),
                (Arg::Text(&self.policy), false),
                (Arg::Text(&now), self.now.is_none()),
                (Arg::Number(self.min_ttl_ms), self.min_ttl_ms == 0),
                (Arg::Text(&calendars), self.calendars.is_empty()),
                (Arg::Text(""), true),
            ]
        };
        let sent = args
            .iter()
            .rposition(|&(_, default)| !default)
            .map_or(0, |i| i + 1);
        for &(a, _) in &args[..sent] {
            arg(a);
        }
    }
}

/// A script's argument: sent as written, or a number redis formats into
/// the command (no string of its own).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Arg<'a> {
    Text(&'a str),
    Number(u64),
}

impl redis::ToRedisArgs for Arg<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        match self {
            Self::Text(a) => a.write_redis_args(out),
            Self::Number(n) => n.write_redis_args(out),
        }
    }
}

fn token_bucket(p: &Policy) -> Option<TokenBucket> {
    match p {
        Policy::TokenBucket(b) => Some(*b),
        _ => None,
    }
}

/// ARGV[1], the operation (see `lua/common.lua`). A cost above 2^53 is
/// sent as 2^53: no encodable policy's limit reaches it (see
/// [`encoding`]), so the script answers it as impossible either way.
fn op_arg(op: Op) -> Cow<'static, str> {
    let n = |c: u64| c.min(encoding::MAX_EXACT);
    Cow::Owned(match op {
        // The common call: nothing formatted.
        Op::Acquire(1) => return Cow::Borrowed("1"),
        Op::Acquire(c) => n(c).to_string(),
        Op::Peek(c) => format!("?{}", n(c)),
        Op::Penalise(c) => format!("!{}", n(c)),
        Op::Reset => "-1".to_owned(),
        Op::Settle { receipt, actual } => {
            let (units, actual) = settle_pair(receipt.units, actual);
            let mut arg = format!("s{units}:{actual}");
            for mark in receipt.marks {
                match mark {
                    // The interval only where there is one: a receipt
                    // without it settles as before (at the interval in
                    // force).
                    Some(m) if m.per > 0 => {
                        arg.push_str(&format!(":{},{},{}", m.born, m.at, m.per))
                    }
                    Some(m) => arg.push_str(&format!(":{},{}", m.born, m.at)),
                    None => arg.push_str(":-"),
                }
            }
            // The settle's identity, which the script remembers to refuse
            // a replay (none: settled every time).
            if receipt.id != 0 {
                arg.push_str(&format!("@{}", receipt.id));
            }
            arg
        }
        Op::Hold(id) => format!("h{id}"),
        Op::Release(id) => format!("x{id}"),
        Op::Withdraw(id) => format!("w{id}"),
    })
}

/// A settle's units and actual cost as the scripts are sent them, both
/// at most 2^53 (exact Lua numbers). The scripts read only their
/// difference, so that is what is kept exact: an excess (`actual >
/// units`) at most `MAX_COUNT` (above every limit), a refund at most 2^53
/// (what any count holds), the other number moved where the pair would
/// pass 2^53. Clamping each to 2^53 alone cut the excess of a usage
/// figure above 2^53 to `2^53 - units`, below a limit near `MAX_COUNT`
/// (where the model charges the limit), and the refund of a reservation
/// of more than 2^53 failures to `2^53 - actual`.
fn settle_pair(units: u64, actual: u64) -> (u64, u64) {
    let exact = encoding::MAX_EXACT;
    if actual > units {
        let excess = (actual - units).min(tollgate_limiter::policy::MAX_COUNT);
        let units = units.min(exact - excess);
        (units, units + excess)
    } else {
        let refund = (units - actual).min(exact);
        let actual = actual.min(exact - refund);
        (actual + refund, actual)
    }
}

/// Where a reservation's units sit, per part (see `lua/common.lua`).
type Marks = [Option<Mark>; tollgate_limiter::composite::MAX_PARTS];

enum Reply {
    Decision(Decision, Marks),
    Redirect(Strategy),
    /// The script needs calendar bounds for `specs` around its time `now`.
    Bounds {
        now: u64,
        specs: Vec<String>,
    },
}

/// The calendar bounds sent in ARGV[5], one entry per spec.
#[derive(Debug, Default)]
struct CalendarBounds {
    entries: Vec<(String, [u64; 4])>,
}

impl CalendarBounds {
    /// Whether no bounds are known ([`arg`](Self::arg) is empty).
    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds (or replaces) `c`'s bounds around `now`.
    fn insert(&mut self, c: &Calendar, now: u64) {
        self.insert_as(c.spec(), c, now);
    }

    /// [`insert`](Self::insert) under `spec`, as the script spelt it: a
    /// stored override written by hand may name its zone otherwise than
    /// the canonical name (`europe/berlin`), and the script looks its
    /// bounds up by its own spelling.
    fn insert_as(&mut self, spec: String, c: &Calendar, now: u64) {
        let bounds = c.bounds(now);
        match self.entries.iter_mut().find(|(s, _)| *s == spec) {
            Some(e) => e.1 = bounds,
            None => self.entries.push((spec, bounds)),
        }
    }

    fn arg(&self) -> String {
        let mut out = String::new();
        for (spec, [a, b, c, d]) in &self.entries {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&format!("{spec},{a},{b},{c},{d}"));
        }
        out
    }
}

/// The calendar a script's `<period>:<zone>` spec names (the limit plays
/// no part in the bounds). The client sends only specs it made, so one it
/// cannot read is a key's stored override's (which the script reads).
fn calendar_of_spec(spec: &str) -> Result<Calendar, RedisError> {
    let bad = || {
        RedisError::from(encoding::EncodingError::Refused(format!(
            "a calendar quota of spec {spec:?}"
        )))
    };
    // ARGV[5] separates its entries with spaces and their fields with
    // commas: bounds sent under a spec holding one (a zone written by hand
    // with a space, which `Zone::get` trims) are split apart, the script
    // never finds them and asks again until the client gives up.
    if spec.contains([' ', ',']) {
        return Err(bad());
    }
    let (letter, zone) = spec.split_once(':').ok_or_else(bad)?;
    let mut chars = letter.chars();
    let period = match (chars.next().and_then(Period::from_letter), chars.next()) {
        (Some(p), None) => p,
        _ => return Err(bad()),
    };
    let zone = Zone::get(zone).map_err(|_| bad())?;
    Calendar::in_zone(1, period, zone).map_err(|_| bad())
}

fn parse_reply(v: &[Value], strategy: Strategy) -> Result<Reply, RedisError> {
    let int = |i: usize| -> Result<i64, RedisError> {
        match v.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            other => Err(RedisError::Protocol(format!("item {i}: {other:?}"))),
        }
    };
    let uint = |i: usize| -> Result<u64, RedisError> {
        u64::try_from(int(i)?).map_err(|_| RedisError::Protocol(format!("item {i} is negative")))
    };
    let text = |i: usize| -> Result<String, RedisError> {
        match v.get(i) {
            Some(Value::BulkString(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
            other => Err(RedisError::Protocol(format!("item {i}: {other:?}"))),
        }
    };
    if int(0)? == -2 {
        let now = text(1)?
            .parse()
            .map_err(|_| RedisError::Protocol("calendar bounds: bad time".into()))?;
        let specs = (2..v.len()).map(text).collect::<Result<_, _>>()?;
        return Ok(Reply::Bounds { now, specs });
    }
    if int(0)? == -1 {
        let letter = match v.get(1) {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            other => return Err(RedisError::Protocol(format!("redirect: {other:?}"))),
        };
        return scripts::strategy_of(&letter)
            .map(Reply::Redirect)
            .ok_or_else(|| RedisError::Protocol(format!("unknown strategy {letter:?}")));
    }
    // A composite names its binding part; a reservation appends a mark
    // (born, at, the interval a token bucket's units were charged at) per
    // part.
    let base = match strategy {
        Strategy::Composite => 7,
        _ => 6,
    };
    let max = base + 3 * tollgate_limiter::composite::MAX_PARTS;
    if v.len() < base || v.len() > max || !(v.len() - base).is_multiple_of(3) {
        return Err(RedisError::Protocol(format!("{} items", v.len())));
    }
    let mut marks: Marks = Default::default();
    for (i, m) in marks.iter_mut().enumerate() {
        let at = base + 3 * i;
        // A part without a mark would answer -1, -1, 0 (every strategy's
        // scripts mark their parts today).
        if at + 2 < v.len() && int(at)? >= 0 {
            *m = Some(Mark {
                born: uint(at)?,
                at: uint(at + 1)?,
                per: uint(at + 2)?,
            });
        }
    }
    let (limit, remaining, retry, reset) = (uint(1)?, uint(2)?, uint(3)?, uint(4)?);
    // Only the verdicts a script answers: another is not read as a
    // refusal (a 429 where the fail mode should answer).
    let decision = match int(0)? {
        2 => Decision::impossible(limit, remaining, reset),
        verdict @ (0 | 1) => Decision::from_micros(verdict == 1, limit, remaining, retry, reset),
        verdict => return Err(RedisError::Protocol(format!("verdict {verdict}"))),
    };
    let decision = decision.with_window(Duration::from_micros(uint(5)?));
    let decision = match strategy {
        Strategy::Composite => match usize::try_from(uint(6)?) {
            Ok(part) if part < tollgate_limiter::composite::MAX_PARTS => decision.with_part(part),
            _ => return Err(RedisError::Protocol(format!("binding part {:?}", v.get(6)))),
        },
        _ => decision,
    };
    Ok(Reply::Decision(decision, marks))
}

fn check_limiter(name: &str) -> Result<(), RedisError> {
    if name.contains(['{', '}']) {
        return Err(RedisError::InvalidLimiterName(name.to_owned()));
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl RedisBackend {
    /// Stores (`SET`, with `PX` when it expires) or deletes an override. A
    /// per-key override sets its limiter's marker first (see
    /// `keyed_marker_key`), so no override is ever stored without it; the
    /// marker stays (see `docs/redis.md`).
    async fn write_override(
        &self,
        scope: Scope<'_>,
        policy: Option<&Policy>,
        ttl: Option<Duration>,
    ) -> Result<(), RedisError> {
        let key = self.override_key(scope)?;
        let encoded = policy.map(encoding::encode).transpose()?;
        let mut cmd = match &encoded {
            Some(_) => redis::cmd("SET"),
            None => redis::cmd("DEL"),
        };
        cmd.arg(&key);
        if let Some(enc) = &encoded {
            cmd.arg(enc);
            if let Some(ttl) = ttl {
                cmd.arg("PX").arg(px_millis(ttl));
            }
        }
        if encoded.is_some() {
            self.mark_keyed(scope).await?;
        }
        let sent = Instant::now();
        let _: Value = self.inner.conn.query(&cmd).await?;
        self.wrote_override(scope, encoded.as_deref(), ttl.map(|t| sent + t));
        Ok(())
    }

    /// Sets the marker that `scope`'s limiter has per-key overrides before
    /// a key's override is stored, unless this client read it within the
    /// TTL (tollgate never removes it): an AIMD controller's stream of
    /// rate changes pays one round trip each.
    async fn mark_keyed(&self, scope: Scope<'_>) -> Result<(), RedisError> {
        if let Scope::Key(l, _) = scope
            && !self.cached_overrides(l).is_some_and(|o| o.keyed)
        {
            let mut mark = redis::cmd("SET");
            mark.arg(self.keyed_marker_key(l)).arg("1");
            let _: Value = self.inner.conn.query(&mark).await?;
        }
        Ok(())
    }

    /// Records in the cache that this client stored `encoded` (or cleared
    /// it, `None`) as `scope`'s override: this worker sees its own change
    /// at once. The cached entry keeps the time it was read, so what other
    /// workers changed since is still read again within the TTL; without
    /// one, the next decision reads Redis.
    fn wrote_override(&self, scope: Scope<'_>, encoded: Option<&str>, until: Option<Instant>) {
        if let Some(Cached { overrides: o, .. }) =
            lock(&self.inner.override_cache).get_mut(scope.limiter())
        {
            match scope {
                Scope::Limiter(_) => o.wide = encoded.map(|e| Wide::new(e, until)),
                Scope::Key(..) => o.keyed |= encoded.is_some(),
            }
        }
    }
}

impl Backend for RedisBackend {
    type Error = RedisError;

    fn decide(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<Decision, RedisError>> + Send {
        // Boxed: the limiter holds and moves the backend's future in its
        // own (its state, its timeout); inline, this one's 1.2 KB made a
        // 3.6 KB `Limiter::check` future, copied on every move. An
        // allocation costs less than the copies, next to a round trip.
        Box::pin(self.decide_inner(req))
    }

    /// A caller that gives up no later than the response timeout (a
    /// limiter, 50 ms against 500 ms by default) is left to bound the
    /// script's call: no response timer of the connection's own, one timer
    /// a decision instead of two (a cluster's client keeps its own).
    fn decide_within(
        &self,
        req: Request<'_>,
        within: Duration,
    ) -> impl Future<Output = Result<Decision, RedisError>> + Send {
        let caller_bound = within <= self.inner.conn.timeouts().response;
        // Boxed, as `decide`.
        Box::pin(async move { Ok(self.run(req, false, caller_bound).await?.0) })
    }

    async fn reserve(&self, req: Request<'_>) -> Result<(Decision, Receipt), RedisError> {
        let Op::Acquire(units) = req.op else {
            // Not a reservation: decided as asked, nothing to refund.
            return Ok((self.decide_inner(req).await?, Receipt::NONE));
        };
        let (d, marks) = self.run(req, true, false).await?;
        // The units asked for, as the model's receipt has them: a cost
        // above 2^53 travels as 2^53 (`op_arg`), and its settle sends the
        // units the same way, so only what `Reservation::units` reports
        // differed between the backends.
        let receipt = match d.is_allowed() {
            true => Receipt {
                units: units.max(1),
                marks,
                id: 0,
            },
            false => Receipt::NONE,
        };
        Ok((d, receipt))
    }

    fn decide_with_candidate(
        &self,
        req: Request<'_>,
        candidate: Request<'_>,
    ) -> impl Future<Output = Result<(Decision, Option<Decision>), RedisError>> + Send {
        // Boxed: inline, its state (two calls, a pipeline, two fallbacks)
        // would size every decision's future, candidate or not, and a
        // limiter's future is moved whole (memcpy, ~3 % of a client's CPU
        // under load when it was 7.9 KB).
        Box::pin(self.decide_pair(req, candidate))
    }

    async fn set_override(
        &self,
        scope: Scope<'_>,
        policy: Option<&Policy>,
    ) -> Result<(), RedisError> {
        self.write_override(scope, policy, None).await
    }

    async fn set_expiring_override(
        &self,
        scope: Scope<'_>,
        policy: &Policy,
        ttl: Duration,
    ) -> Result<(), RedisError> {
        self.write_override(scope, Some(policy), Some(ttl)).await
    }

    /// One script (`lua/replace_override.lua`) compares the stored
    /// override with `current`, encoded, and writes `policy` with its TTL
    /// (`SET … PX`) only if they are equal. A stored value that differs
    /// only in its spelling (one [`encoding::decode`] reads as `current`:
    /// a version 2, a leading zero) is compared again as spelled: the
    /// override read is the one stored.
    async fn replace_override(
        &self,
        scope: Scope<'_>,
        current: Option<&Policy>,
        policy: &Policy,
        ttl: Duration,
    ) -> Result<bool, RedisError> {
        let key = self.override_key(scope)?;
        let mut expected = current.map(encoding::encode).transpose()?;
        let encoded = encoding::encode(policy)?;
        let ms = px_millis(ttl);
        self.mark_keyed(scope).await?;
        for respelled in [false, true] {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(scripts::REPLACE_OVERRIDE.get_hash())
                .arg(1)
                .arg(&key)
                .arg(if expected.is_some() { "1" } else { "0" })
                .arg(expected.as_deref().unwrap_or(""))
                .arg(&encoded)
                .arg(ms.max(1));
            let sent = Instant::now();
            let reply: Value = self
                .inner
                .conn
                .eval(&cmd, scripts::REPLACE_OVERRIDE_CODE)
                .await?;
            match reply {
                Value::Int(1) => {
                    self.wrote_override(scope, Some(&encoded), Some(sent + ttl));
                    return Ok(true);
                }
                Value::Int(_) => return Ok(false),
                // The stored value, unlike `expected`: once, if it is
                // another spelling of `current`, compared again as it is.
                stored if !respelled => {
                    let stored = redis::from_redis_value::<String>(stored).ok();
                    match stored {
                        Some(s) if encoding::decode(&s).ok().as_ref() == current => {
                            expected = Some(s);
                        }
                        _ => return Ok(false),
                    }
                }
                _ => return Ok(false),
            }
        }
        Ok(false)
    }

    async fn get_override(&self, scope: Scope<'_>) -> Result<Option<Policy>, RedisError> {
        let key = self.override_key(scope)?;
        let v: Option<String> = self.inner.conn.query(redis::cmd("GET").arg(&key)).await?;
        Ok(v.as_deref().map(encoding::decode).transpose()?)
    }

    /// `GET` and `PTTL` in one round trip (see `get_with_pttl`).
    async fn get_override_and_ttl(
        &self,
        scope: Scope<'_>,
    ) -> Result<Option<(Policy, Option<Duration>)>, RedisError> {
        let key = self.override_key(scope)?;
        let (value, pttl) = self.get_with_pttl(&key).await?;
        let value: Option<String> =
            redis::from_redis_value(value?).map_err(redis::RedisError::from)?;
        let Some(policy) = value.as_deref().map(encoding::decode).transpose()? else {
            return Ok(None);
        };
        match pttl {
            // -2: gone (expired or cleared) since the GET.
            Some(-2) => Ok(None),
            Some(ms) if ms >= 0 => Ok(Some((
                policy,
                Some(Duration::from_millis(ms.unsigned_abs())),
            ))),
            // -1: no expiry; or the time could not be read.
            _ => Ok(Some((policy, None))),
        }
    }

    /// [`CLUSTER_DOMAINS`] for a cluster; one for a single server or
    /// Sentinel (one master: it fails as a whole).
    fn failure_domains(&self) -> usize {
        match self.inner.conn.is_cluster() {
            true => CLUSTER_DOMAINS,
            false => 1,
        }
    }

    /// In a cluster, the one of the [`CLUSTER_DOMAINS`] ranges of
    /// contiguous hash slots that holds the scope's keys: a key's hash tag,
    /// or the limiter-wide override's key, hashed as the cluster client
    /// routes it, without building the key.
    #[inline]
    fn failure_domain(&self, scope: Scope<'_>) -> usize {
        if !self.inner.conn.is_cluster() {
            return 0;
        }
        cluster_domain(&self.inner.prefix, scope)
    }
}

/// A cluster backend's failure domains: the 16 384 hash slots in 16
/// contiguous ranges of 1 024, each with a circuit breaker of its own in
/// every limiter.
///
/// Contiguous, because a cluster gives each master contiguous ranges
/// (`redis-cli --cluster create` splits the slots evenly, in order, and
/// a failover hands a master's ranges to its replica unchanged): a range
/// lies on one master, except the few that hold a boundary between two
/// (at most two ranges per master, so when one master fails at most 2 of
/// 16 ranges, an eighth of the keys, share its breaker from another
/// master). Fixed, because a breaker must stay with its keys when the
/// slot map changes. Not more: each open range probes on its own (about
/// `CLUSTER_DOMAINS / masters` probes per back-off for a dead master, and
/// as many for a dead cluster) and needs its own run of failures to open.
pub const CLUSTER_DOMAINS: usize = 16;

/// The Redis Cluster hash slots.
const SLOTS: u16 = 16_384;

/// The failure domain of `scope`'s keys in a cluster: the range of its
/// hash slot, computed as the cluster client routes (CRC16/XMODEM of the
/// hash tag) without building the key.
fn cluster_domain(prefix: &str, scope: Scope<'_>) -> usize {
    let slot = match scope {
        // `<prefix>:<limiter>:{<key>}` and every key beside it: the hash
        // tag is the key, never empty and brace-free (`Key`'s invariant;
        // prefix and limiter names hold no brace).
        Scope::Key(_, key) => hash_slot(&[key.as_str()]),
        // `<prefix>:<limiter>:override`, braces nowhere: the whole key.
        Scope::Limiter(limiter) => hash_slot(&[prefix, ":", limiter, ":override"]),
    };
    usize::from(slot) * CLUSTER_DOMAINS / usize::from(SLOTS)
}

/// The hash slot of the key `parts` concatenate, which has no hash tag
/// (or is one).
#[cfg(feature = "cluster")]
fn hash_slot(parts: &[&str]) -> u16 {
    let mut crc = crc16::State::<crc16::XMODEM>::new();
    for p in parts {
        crc.update(p.as_bytes());
    }
    crc.get() % SLOTS
}

/// Without the feature there is no cluster: never asked.
#[cfg(not(feature = "cluster"))]
fn hash_slot(_: &[&str]) -> u16 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_limiter::strategy::token_bucket::TokenBucketState;

    /// A settle's numbers stay exact Lua integers, and an excess is sent
    /// exactly (at most MAX_COUNT), however large the usage figure.
    #[test]
    fn a_settle_sends_its_excess_exactly() {
        let max = tollgate_limiter::policy::MAX_COUNT;
        let exact = encoding::MAX_EXACT;
        assert_eq!(settle_pair(5, 3), (5, 3));
        assert_eq!(settle_pair(5, 9), (5, 9));
        assert_eq!(settle_pair(u64::MAX, 0), (exact, 0));
        assert_eq!(settle_pair(u64::MAX, 5), (exact, 0));
        assert_eq!(settle_pair(exact + 3, exact), (exact, exact - 3));
        assert_eq!(settle_pair(7, 7), (7, 7));
        assert_eq!(settle_pair(u64::MAX, u64::MAX), (exact, exact));
        assert_eq!(settle_pair(2, u64::MAX), (1, exact));
        assert_eq!(settle_pair(2, exact + 1), (1, exact));
        assert_eq!(settle_pair(2, exact), (2, exact));
        assert_eq!(settle_pair(1 << 52, (1 << 52) + max), (1, exact));
        for (units, actual) in [(2, u64::MAX), (7, 1 << 53), (1 << 52, u64::MAX)] {
            let (u, a) = settle_pair(units, actual);
            assert!(u >= 1 && a <= exact && a > u);
            assert_eq!(a - u, (actual - units).min(max));
        }
        for (units, actual) in [(u64::MAX, 5), (exact + 9, 1), (1 << 52, 3)] {
            let (u, a) = settle_pair(units, actual);
            assert!(u <= exact && a < u);
            assert_eq!(u - a, (units - actual).min(exact));
        }
    }

    /// A prefix with ':' (`a:b` with limiter `c` and `a` with limiter
    /// `b:c` share every key), braces, or none is refused before any
    /// connection, naming the configuration's field. `a:b` was accepted.
    #[tokio::test]
    async fn a_prefix_that_could_read_as_another_is_refused() {
        for prefix in ["a:b", "a{b}", ""] {
            let e = RedisBackend::builder("redis://127.0.0.1:1")
                .prefix(prefix)
                .build_lazy()
                .unwrap_err();
            assert!(
                matches!(e, RedisError::Config(_)) && e.to_string().contains("defaults.prefix"),
                "{prefix:?}: {e}"
            );
        }
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn a_cluster_domain_is_the_range_of_the_slot_redis_computes() {
        let key = |k: &str| cluster_domain("p", Scope::Key("l", &Key::new(k)));
        // `CLUSTER KEYSLOT foo` is 12182, `bar` 5061, `hello` 866: ranges
        // of 1024 slots.
        assert_eq!([key("foo"), key("bar"), key("hello")], [11, 4, 0]);
        // The limiter-wide override's key, hashed whole in parts, lands
        // where the same bytes as one key do.
        for (prefix, limiter) in [("p", "l"), ("tollgate", "login"), ("t", "api-keys")] {
            let whole = format!("{prefix}:{limiter}:override");
            assert_eq!(
                cluster_domain(prefix, Scope::Limiter(limiter)),
                cluster_domain("other", Scope::Key("x", &Key::new(&whole))),
                "{whole}"
            );
        }
    }

    #[test]
    fn builder_debug_hides_credentials() {
        let b = RedisBackend::builder("redis://limiter:s3cret@127.0.0.1:6379/0");
        let shown = format!("{b:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("127.0.0.1:6379"), "{shown}");
    }

    #[test]
    fn sentinel_urls_are_checked_at_build_and_never_shown_with_passwords() {
        let b = RedisBackend::builder("redis+sentinel://u:s3cret@a:1,b:2/m?sentinel_password=hush");
        let shown = format!("{b:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("hush"),
            "{shown}"
        );
        assert!(shown.contains("a:1,b:2/m"), "{shown}");
        let err = RedisBackend::builder("redis+sentinel://u:s3cret@a:1,b:2")
            .build_lazy()
            .expect_err("no master name");
        assert!(matches!(err, RedisError::InvalidUrl(_)), "{err:?}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
        let b = RedisBackend::sentinel_builder(["a:1", "b:2"], "m");
        assert!(format!("{b:?}").contains("redis+sentinel://a:1,b:2/m"));
        let b = RedisBackend::sentinel_tls_builder(["a:1", "b:2"], "m");
        assert!(format!("{b:?}").contains("rediss+sentinel://a:1,b:2/m"));
    }

    /// A client certificate is only ever sent over TLS: with a plain URL
    /// (a server, a cluster node, sentinels) it is a configuration error
    /// naming the setting, before any connection; the key is never shown.
    #[test]
    fn a_client_certificate_needs_tls_urls() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _enter = rt.enter();
        let key = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n";
        for b in [
            RedisBackend::builder("redis://127.0.0.1:1"),
            RedisBackend::builder("redis+sentinel://127.0.0.1:1/m"),
            RedisBackend::cluster_builder(["rediss://127.0.0.1:1", "redis://127.0.0.1:2"]),
        ] {
            let b = b.tls_client_cert("cert", key);
            assert!(format!("{b:?}").contains("tls_client_cert: true"));
            assert!(!format!("{b:?}").contains("c2VjcmV0"));
            let e = b.build_lazy().expect_err("a plain URL");
            assert!(matches!(e, RedisError::InvalidClientCert(_)), "{e:?}");
            let e = e.to_string();
            assert!(
                e.contains("tls_client_cert") && e.contains("not TLS"),
                "{e}"
            );
        }
        // Over TLS, the PEM is checked before any connection.
        let e = RedisBackend::builder("rediss+sentinel://127.0.0.1:1/m")
            .tls_client_cert("not PEM", key)
            .build_lazy()
            .expect_err("no certificate");
        assert!(
            e.to_string()
                .contains("tls_client_cert's certificate PEM holds no PEM"),
            "{e}"
        );
        assert!(!e.to_string().contains("c2VjcmV0"), "{e}");
    }

    /// A call as `RedisBackend::call` builds it, for the one-integer reply.
    fn call_of(policy: &Policy, op: Op) -> Call {
        Call {
            state: "s".into(),
            now: None,
            acquire: match op {
                Op::Acquire(c) => Some(c),
                _ => None,
            },
            bucket: token_bucket(policy),
            op: op_arg(op),
            policy: encoding::script_arg(policy).unwrap().into(),
            strategy: policy.strategy(),
            keyed: false,
            min_ttl_ms: 0,
            calendars: CalendarBounds::default(),
        }
    }

    #[test]
    fn a_call_names_the_keys_override_only_on_a_limiter_with_per_key_overrides() {
        // A cluster slot in migration answers -TRYAGAIN to a call naming a
        // key it holds and one it does not (an absent override): a limiter
        // nobody overrides per key names only keys that live together, and
        // the scripts find their own further keys from the end of KEYS.
        let mut call = call_of(
            &Policy::from(TokenBucket::per_second(1, 1).unwrap()),
            Op::Acquire(1),
        );
        let own: [(Strategy, &[&str]); 6] = [
            (Strategy::TokenBucket, &[]),
            (Strategy::ProgressiveDelay, &[]),
            (Strategy::Calendar, &[]),
            (Strategy::SlidingWindow, &[":log"]),
            (Strategy::Concurrency, &[":slots"]),
            (Strategy::Composite, &[":log1", ":log2", ":log3", ":log4"]),
        ];
        for keyed in [false, true] {
            call.keyed = keyed;
            for (strategy, further) in own {
                let mut expect = vec![""];
                if keyed {
                    expect.push(":override");
                }
                expect.extend_from_slice(further);
                let suffixes: Vec<_> = call.key_suffixes(strategy).collect();
                assert_eq!(suffixes, expect, "{strategy:?}, keyed {keyed}");
                // The EVALSHA's key count and the keys sent agree.
                let cmd = call.command(strategy);
                let sent: Vec<_> = cmd.args_iter().collect();
                assert_eq!(
                    sent[2],
                    redis::Arg::Simple(expect.len().to_string().as_bytes())
                );
                let mut keys = Vec::new();
                call.each_key(strategy, |k| keys.push(k.to_owned()));
                let named: Vec<_> = expect.iter().map(|s| format!("s{s}")).collect();
                assert_eq!(keys, named, "{strategy:?}, keyed {keyed}");
            }
        }
    }

    #[test]
    fn the_arguments_at_their_defaults_are_left_off_from_the_end() {
        let sent = |call: &Call, strategy| {
            let mut out = Vec::new();
            call.each_arg(strategy, |a| {
                out.push(match a {
                    Arg::Text(t) => t.to_owned(),
                    Arg::Number(n) => n.to_string(),
                })
            });
            out
        };
        // 10 tokens, one every 100 ms: interval 100,000 µs, tau 1 s.
        let bucket = Policy::from(TokenBucket::new(10, 10, Duration::from_secs(1)).unwrap());
        let encoded = encoding::script_arg(&bucket).unwrap();
        let mut check = call_of(&bucket, Op::Acquire(1));
        // A check: the token bucket's two numbers alone.
        assert_eq!(sent(&check, Strategy::TokenBucket), ["100000", "1000000"]);
        // Redirected to another strategy's script: the operation and the
        // encoding.
        assert_eq!(
            sent(&check, Strategy::SlidingWindow),
            ["1", encoded.as_str()]
        );
        // A caller's clock: the operation, then now.
        check.now = Some(7);
        assert_eq!(
            sent(&check, Strategy::TokenBucket),
            ["100000", "1000000", "1", "7"]
        );
        // A TTL floor without a caller's clock: now sent empty.
        check.now = None;
        check.min_ttl_ms = 5;
        assert_eq!(
            sent(&check, Strategy::TokenBucket),
            ["100000", "1000000", "1", "", "5"]
        );
        assert_eq!(
            sent(&check, Strategy::SlidingWindow),
            ["1", encoded.as_str(), "", "5"]
        );
        // Another operation: sent after the numbers.
        let peek = call_of(&bucket, Op::Peek(2));
        assert_eq!(
            sent(&peek, Strategy::TokenBucket),
            ["100000", "1000000", "?2"]
        );
        // No token bucket sent (a key's override redirected a window's call
        // here): zeros, then everything up to the encoding.
        let window =
            Policy::from(tollgate_limiter::SlidingWindow::new(5, Duration::from_secs(1)).unwrap());
        let redirected = call_of(&window, Op::Acquire(1));
        let window_encoded = encoding::script_arg(&window).unwrap();
        assert_eq!(
            sent(&redirected, Strategy::TokenBucket),
            ["0", "0", "1", "", "0", window_encoded.as_str()]
        );
    }

    #[test]
    fn a_decisions_future_is_a_pointer() {
        // A limiter holds and moves the backend's futures inside its own:
        // these stay boxed, so they do not size (and slow) every check.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _enter = rt.enter();
        let backend = RedisBackend::builder("redis://127.0.0.1:1")
            .build_lazy()
            .unwrap();
        let policy = Policy::TokenBucket(TokenBucket::per_second(10, 10).unwrap());
        let key = Key::new("k");
        let req = || Request {
            limiter: "l",
            key: &key,
            policy: &policy,
            op: Op::Acquire(1),
        };
        let pointer = size_of::<Box<()>>();
        assert_eq!(size_of_val(&backend.decide(req())), pointer);
        assert_eq!(
            size_of_val(&backend.decide_with_candidate(req(), req())),
            pointer
        );
    }

    #[test]
    fn an_integer_reply_is_the_models_decision_from_the_debt() {
        // 10 tokens, one per 100 ms: tau 1 s, t 100,000 µs.
        let p = TokenBucket::new(10, 10, Duration::from_secs(1)).unwrap();
        let policy = Policy::TokenBucket(p);
        let decide = |r: i64, cost: u64| match call_of(&policy, Op::Acquire(cost))
            .reply(Value::Int(r), Strategy::TokenBucket)
        {
            Ok(Reply::Decision(d, marks)) => {
                assert_eq!(marks, Marks::default());
                Ok(d)
            }
            Ok(_) => panic!("not a decision"),
            Err(e) => Err(e),
        };
        let model = |debt: u64, cost: u64| {
            TokenBucketState {
                tat: debt,
                ..TokenBucketState::default()
            }
            .acquire(0, &p, cost)
            .with_window(policy.window())
        };
        // Admitted on a full bucket, and with 250 ms of debt.
        let d = decide(0, 1).unwrap();
        assert!(d.is_allowed());
        assert_eq!((d.limit(), d.remaining()), (10, 9));
        assert_eq!(d, model(0, 1));
        let d = decide(250_000, 3).unwrap();
        assert_eq!((d.is_allowed(), d.remaining()), (true, 4));
        assert_eq!(d, model(250_000, 3));
        // Refused: a debt of 950 ms leaves no room for a token; it is back
        // in 50 ms.
        let d = decide(-950_001, 1).unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), Duration::from_millis(50));
        assert_eq!(d, model(950_000, 1));
        // A cost above the capacity is impossible, whatever the debt.
        let d = decide(-1, 11).unwrap();
        assert_eq!(d, model(0, 11));
        assert!(!d.is_allowed());
        // The script's verdict and the model's disagree: an error, never a
        // guess (an admission the model refuses, and the other way round).
        for (r, cost) in [(950_000, 1), (-1, 1), (0, 11)] {
            assert!(
                matches!(decide(r, cost), Err(RedisError::Protocol(_))),
                "{r} {cost}"
            );
        }
    }

    #[test]
    fn an_integer_reply_needs_a_plain_acquire_of_the_token_bucket_sent() {
        let bucket = Policy::TokenBucket(TokenBucket::per_second(10, 10).unwrap());
        let window = Policy::SlidingWindow(
            tollgate_limiter::strategy::sliding_window::SlidingWindow::new(
                10,
                Duration::from_secs(1),
            )
            .unwrap(),
        );
        let mut undecodable = call_of(&bucket, Op::Acquire(1));
        undecodable.bucket = None;
        for (call, strategy) in [
            (call_of(&bucket, Op::Peek(1)), Strategy::TokenBucket),
            (call_of(&bucket, Op::Reset), Strategy::TokenBucket),
            (call_of(&window, Op::Acquire(1)), Strategy::SlidingWindow),
            (call_of(&bucket, Op::Acquire(1)), Strategy::SlidingWindow),
            (undecodable, Strategy::TokenBucket),
        ] {
            let r = call.reply(Value::Int(0), strategy);
            assert!(matches!(r, Err(RedisError::Protocol(_))), "{}", call.op);
        }
        // Neither a table nor an integer.
        let r = call_of(&bucket, Op::Acquire(1)).reply(Value::Nil, Strategy::TokenBucket);
        assert!(matches!(r, Err(RedisError::Protocol(_))));
    }

    #[test]
    fn a_reservation_reads_its_marks_and_a_settle_sends_them() {
        let ints = |v: &[i64]| v.iter().map(|&n| Value::Int(n)).collect::<Vec<_>>();
        let Ok(Reply::Decision(d, marks)) =
            parse_reply(&ints(&[1, 5, 4, 0, 7, 9, 11, 22, 5]), Strategy::TokenBucket)
        else {
            panic!("a decision")
        };
        assert!(d.is_allowed());
        let mark = |born, at, per| Some(Mark { born, at, per });
        assert_eq!(marks[0], mark(11, 22, 5));
        assert_eq!(marks[1], None);
        // A composite: 7 items, then a mark per part.
        let reply = ints(&[1, 5, 4, 0, 7, 9, 1, 1, 2, 5, 3, 4, 0]);
        let Ok(Reply::Decision(d, marks)) = parse_reply(&reply, Strategy::Composite) else {
            panic!("a decision")
        };
        assert_eq!(d.part(), 1);
        assert_eq!(marks[..2], [mark(1, 2, 5), mark(3, 4, 0)]);
        // Part of a mark, or more parts than a composite holds, is a
        // protocol error.
        let too_many = ints(&[1; 7 + 3 * (tollgate_limiter::composite::MAX_PARTS + 1)]);
        for bad in [&reply[..12], &reply[..11], &too_many[..]] {
            assert!(matches!(
                parse_reply(bad, Strategy::Composite),
                Err(RedisError::Protocol(_))
            ));
        }
        let mut receipt = Receipt::unmarked(9);
        receipt.marks[1] = mark(3, 4, 0);
        assert_eq!(op_arg(Op::Settle { receipt, actual: 2 }), "s9:2:-:3,4:-:-");
        receipt.marks[0] = mark(1, 2, 5);
        assert_eq!(
            op_arg(Op::Settle { receipt, actual: 2 }),
            "s9:2:1,2,5:3,4:-:-"
        );
        // Every digit of a 64-bit id: the script keeps it a string.
        receipt.id = u64::MAX;
        assert_eq!(
            op_arg(Op::Settle { receipt, actual: 2 }),
            "s9:2:1,2,5:3,4:-:-@18446744073709551615"
        );
    }

    #[test]
    fn replies_are_checked() {
        let ok = [
            Value::Int(1),
            Value::Int(5),
            Value::Int(4),
            Value::Int(0),
            Value::Int(7),
            Value::Int(9),
        ];
        let Ok(Reply::Decision(d, _)) = parse_reply(&ok, Strategy::TokenBucket) else {
            panic!("a decision")
        };
        let w = Duration::from_micros(9);
        assert_eq!(d, Decision::from_micros(true, 5, 4, 0, 7).with_window(w));
        let mut never = ok.clone();
        never[0] = Value::Int(2);
        let Ok(Reply::Decision(d, _)) = parse_reply(&never, Strategy::TokenBucket) else {
            panic!("a decision")
        };
        assert_eq!(d, Decision::impossible(5, 4, 7).with_window(w));
        let redirect = [Value::Int(-1), Value::BulkString(b"w".to_vec())];
        assert!(matches!(
            parse_reply(&redirect, Strategy::TokenBucket),
            Ok(Reply::Redirect(Strategy::SlidingWindow))
        ));
        for bad in [
            &[Value::Int(1)][..],
            &ok[..5],
            &[Value::Int(-1), Value::BulkString(b"z".to_vec())],
        ] {
            assert!(matches!(
                parse_reply(bad, Strategy::TokenBucket),
                Err(RedisError::Protocol(_))
            ));
        }
    }

    /// A verdict no script of this release answers (another release's,
    /// or a value that is not a reply of ours) is a protocol error, which
    /// the limiter's fail mode answers, not a refusal: read as one, a
    /// fail-open limiter refused, and a fail-closed one answered 429 for
    /// a limit where it is an infrastructure failure (503). The same for a
    /// composite's binding part beyond the parts a composite can have.
    #[test]
    fn an_unexpected_verdict_or_part_is_an_error() {
        let reply = |verdict: i64| {
            vec![
                Value::Int(verdict),
                Value::Int(5),
                Value::Int(4),
                Value::Int(0),
                Value::Int(7),
                Value::Int(9),
            ]
        };
        for verdict in [3, -3, i64::MAX, i64::MIN] {
            let r = parse_reply(&reply(verdict), Strategy::SlidingWindow);
            assert!(
                matches!(r, Err(RedisError::Protocol(_))),
                "verdict {verdict}: {:?}",
                r.map(|r| match r {
                    Reply::Decision(d, _) => format!("{d:?}"),
                    _ => "not a decision".into(),
                })
            );
        }
        let composite = |part: i64| {
            let mut r = reply(1);
            r.push(Value::Int(part));
            r
        };
        let max = tollgate_limiter::composite::MAX_PARTS as i64;
        assert!(matches!(
            parse_reply(&composite(max - 1), Strategy::Composite),
            Ok(Reply::Decision(d, _)) if d.part() == 3
        ));
        let r = parse_reply(&composite(max), Strategy::Composite);
        assert!(
            matches!(r, Err(RedisError::Protocol(_))),
            "part {max}: {:?}",
            r.map(|r| match r {
                Reply::Decision(d, _) => format!("{d:?}"),
                _ => "not a decision".into(),
            })
        );
    }
}
