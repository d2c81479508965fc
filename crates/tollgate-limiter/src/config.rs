//! Layered configuration: limits are data, not code.
//!
//! A limiter's settings come from, in increasing precedence:
//!
//! 1. the platform defaults (a TOML file or string shipped by the platform),
//! 2. the deployment's TOML file,
//! 3. environment variables `TOLLGATE_…`, nested with `__`
//!    (`TOLLGATE_LIMITERS__LOGIN_IP__LIMIT=20`).
//!
//! Layering is done by [`figment`]; durations are human (`"15m"`, `"50ms"`,
//! parsed by [`humantime`]) and rates read `"60/min"`, `"10/s"`, `"5/15m"`.
//!
//! ```toml
//! [defaults]
//! prefix = "tollgate"
//! fail_mode = "closed"
//! timeout = "50ms"
//!
//! [limiters.login_ip]
//! strategy = "sliding_window"
//! limit = 20
//! window = "15m"
//!
//! [limiters.api_keys]
//! strategy = "token_bucket"
//! capacity = 100
//! refill = "60/min"
//! fail_mode = "open"
//!
//! [limiters.plan]
//! strategy = "calendar"   # a quota per calendar day, week or month
//! limit = 10000
//! period = "month"        # "day" | "week" (ISO, from Monday) | "month"
//! time_zone = "Europe/Berlin"  # IANA name; default "UTC"
//! ```
//!
//! A `[redis]` section says where the Redis backend connects and how
//! ([`RedisConfig`]; `tollgate_redis::RedisBackend::from_config` applies
//! it), layered and validated like the rest:
//!
//! ```toml
//! [redis]
//! url = "redis://127.0.0.1:6379"
//! response_timeout = "500ms"
//! ```
//!
//! A concurrency limit caps the requests of one key in flight at once
//! (see [`Concurrency`]); `mode = "shadow"` decides and records but never
//! refuses (see [`shadow`](crate::shadow)), and a top-level `shadow = true`
//! (`TOLLGATE_SHADOW=true`) puts every limiter in shadow mode:
//!
//! ```toml
//! [limiters.exports]
//! strategy = "concurrency"
//! max_in_flight = 4
//! lease = "2m"
//!
//! [limiters.search]
//! strategy = "token_bucket"
//! capacity = 20
//! refill = "10/s"
//! mode = "shadow"
//! ```
//!
//! Everything is validated when loaded: an unknown field, an unknown
//! strategy, a section name the environment cannot reach (see below), a
//! zero capacity or window, a count above 2^53 − 1
//! ([`MAX_COUNT`](crate::policy::MAX_COUNT)), a field that does not belong to the
//! strategy, a progressive delay's `forget_after` no longer than its
//! longest delay (each such block would end with the free attempts back),
//! a default cost or a `min_cost` (the least any call is charged,
//! default 1) that is 0 or that the limit (or the candidate's) can never
//! grant: each fails with an error naming the limiter and the field.
//!
//! # What the loader decides, and why
//!
//! A rate limit that does not say what the operator thinks is a silent
//! outage of protection, so the loader refuses rather than guesses:
//!
//! * **Unknown fields are errors**, in every section and at every depth
//!   (a composite's parts, a candidate, `[adaptive.*]`, `[redis]`): a
//!   `capcity` or a `TOLLGATE_LIMITERS__API__CAPACTY` fails the load,
//!   naming the key, instead of leaving the capacity unset.
//! * **Every `TOLLGATE_` variable is configuration**, except the
//!   workspace's own others ([`NOT_CONFIGURATION`]): a misspelt section
//!   (`TOLLGATE_LIMITER__…`) fails the load.
//! * **Names the environment can reach.** Variables are read lower-cased
//!   and split at `.`, so a limiter or adaptive name holding an upper-case
//!   letter or a `.` is refused: `TOLLGATE_ADAPTIVE__CRAWLER__…` beside
//!   `[adaptive.Crawler]` loaded as a second section. (Code may name a
//!   limiter as it likes; this is a rule of configuration.)
//! * **Values are typed, not coerced.** A number given as a string
//!   (`capacity = "10"`) or a string given as a number is an error; values
//!   from the environment are read as TOML values, so
//!   `TOLLGATE_DEFAULTS__PREFIX=2024` is a number: quote it
//!   (`TOLLGATE_DEFAULTS__PREFIX='"2024"'`). Durations and the period of a
//!   rate are humantime's: `m` is a minute and `M` a month.
//! * **`cost` is what a request takes when its caller names none.** A
//!   limiter's `cost` (at least 1, grantable by the policy and the
//!   candidate) is charged by [`Limiter::check`](crate::Limiter::check)
//!   and by a tower layer without a cost of its own; `min_cost` is the
//!   least any call is charged, whatever cost it names.
//! * **A relative path is relative to the file it is written in.**
//!   `tls_ca_file = "certs/ca.pem"` in `/etc/svc/limits.toml` is
//!   `/etc/svc/certs/ca.pem`, as in nginx or systemd configuration, and
//!   loads as that absolute path, wherever the service is started. A path
//!   from an environment variable or a [`toml_str`](ConfigBuilder::toml_str)
//!   layer has no such file: it is kept as written, relative to the working
//!   directory (see [`RedisConfig`]).
//! * **A layer changes fields, not a limiter's kind.** A later layer that
//!   sets another `strategy` keeps the earlier layers' fields of the old
//!   one, which are then refused (`capacity: belongs to token_bucket`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::magic::{Magic as _, RelativePathBuf};
use serde::{Deserialize, Serialize};

use crate::aimd::{AimdConfig, RawAimdConfig};
use crate::backend::Backend;
use crate::breaker::BreakerConfig;
use crate::composite::Composite;
use crate::limiter::{DEFAULT_TIMEOUT, FailMode, Limiter, LimiterBuilder, check_timeout};
use crate::policy::{
    Calendar, Concurrency, Period, Policy, PolicyError, ProgressiveDelay, SlidingWindow, Strategy,
    TokenBucket, Zone,
};
use crate::shadow::Mode;

mod redis;

pub use redis::{DURABILITY_MODES, RedisConfig};

/// The environment prefix.
pub const ENV_PREFIX: &str = "TOLLGATE_";

/// The `TOLLGATE_` variables of this workspace that are not configuration,
/// lower-cased and without the prefix: [`ConfigBuilder::env`] skips them.
/// `TOLLGATE_KEY_SECRET` is the key hasher's secret; the others are the
/// test kit's (`TOLLGATE_REDIS_SERVER`, `TOLLGATE_VALKEY_SERVER`: the
/// server binaries, exported on a developer's machine) and its soak
/// tests'. Loaded as configuration, each failed the load as an unknown
/// field.
pub const NOT_CONFIGURATION: [&str; 6] = [
    "key_secret",
    "redis_server",
    "valkey_server",
    "redis_child",
    "failover_cycles",
    "soak_cycles",
];

/// Why a configuration layer could not be read or parsed
/// ([`ConfigError::Parse`]): the message names the source (a file, an
/// environment variable), the key path and the reason.
///
/// Opaque, so that the parser behind it (figment, a 0.x crate) is not part
/// of this crate's API: its next version does not make a new major
/// version of tollgate.
///
/// ```compile_fail
/// // The parser's own error type is not reachable through `ConfigError`.
/// fn parser_error(e: tollgate_limiter::ConfigError) -> Option<Box<figment::Error>> {
///     match e {
///         tollgate_limiter::ConfigError::Parse(inner) => Some(inner),
///         _ => None,
///     }
/// }
/// ```
#[derive(Debug)]
pub struct ParseError(Box<figment::Error>);

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl ParseError {
    pub(crate) fn new(e: figment::Error) -> Self {
        Self(Box::new(e))
    }
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A layer could not be read or parsed (unknown field, wrong type,
    /// unreadable file); the message names the key path.
    #[error("invalid tollgate configuration: {0}")]
    Parse(#[source] ParseError),
    /// A value is present but not acceptable.
    #[error("invalid tollgate configuration: {path}.{field}: {reason}")]
    Invalid {
        /// `limiters.<name>`, `adaptive.<name>`, `defaults` or `redis`.
        path: String,
        /// The field, as spelled in configuration.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A consumer asked for a limiter that the configuration lacks.
    #[error("invalid tollgate configuration: no limiter named {0:?} (add [limiters.{0}])")]
    Missing(String),
    /// A consumer asked for an adaptive limiter that the configuration lacks.
    #[error("invalid tollgate configuration: no adaptive limiter named {0:?} (add [adaptive.{0}])")]
    MissingAdaptive(String),
}

impl ConfigError {
    pub(crate) fn invalid(limiter: &str, field: &'static str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            path: format!("limiters.{limiter}"),
            field,
            reason: reason.into(),
        }
    }
}

/// Settings that apply to every limiter unless it sets its own.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    prefix: Option<String>,
    fail_mode: Option<String>,
    timeout: Option<String>,
    breaker_threshold: Option<u32>,
    breaker_backoff: Option<String>,
    breaker_max_backoff: Option<String>,
}

/// One limiter as written in configuration: every field optional, so that
/// layers can each set a few.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimiter {
    strategy: Option<String>,
    // token bucket
    capacity: Option<u64>,
    refill: Option<String>,
    // sliding window (and calendar: limit)
    limit: Option<u64>,
    window: Option<String>,
    penalise_refused: Option<bool>,
    // calendar
    period: Option<String>,
    time_zone: Option<String>,
    // composite: the policies, each a table of the fields above
    policies: Option<Vec<RawLimiter>>,
    // progressive delay
    free_attempts: Option<u64>,
    base_delay: Option<String>,
    factor: Option<u64>,
    max_delay: Option<String>,
    forget_after: Option<String>,
    // concurrency
    max_in_flight: Option<u64>,
    lease: Option<String>,
    // common
    mode: Option<String>,
    /// A candidate policy evaluated beside the enforced one: a table of
    /// policy fields.
    candidate: Option<Box<RawLimiter>>,
    cost: Option<u64>,
    min_cost: Option<u64>,
    fail_mode: Option<String>,
    timeout: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    /// Every limiter in shadow mode, whatever its own `mode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shadow: Option<bool>,
    #[serde(default)]
    defaults: RawDefaults,
    #[serde(default)]
    limiters: BTreeMap<String, RawLimiter>,
    /// Adaptive (AIMD) limiters, checked by [`AimdConfig`].
    #[serde(default)]
    adaptive: BTreeMap<String, RawAimdConfig>,
    /// How to reach Redis, checked by [`RedisConfig`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redis: Option<redis::RawRedis>,
}

/// A layer whose errors name a key as configuration spells it
/// (`limiters.api.capacity`, not figment's `default.limiters.api.capacity`,
/// whose `default` read as a `[default]` section), and, from the
/// environment, the variable too (`limiters.api.capacity
/// (TOLLGATE_LIMITERS__API__CAPACITY)`).
pub(crate) struct Keys<P> {
    inner: P,
    env: bool,
}

impl<P> Keys<P> {
    pub(crate) fn file(inner: P) -> Self {
        Self { inner, env: false }
    }

    fn env(inner: P) -> Self {
        Self { inner, env: true }
    }
}

impl<P: figment::Provider> figment::Provider for Keys<P> {
    fn metadata(&self) -> figment::Metadata {
        let env = self.env;
        self.inner
            .metadata()
            .interpolater(move |_: &figment::Profile, keys: &[&str]| {
                // A `RelativePathBuf` (the `[redis]` TLS files) is read as
                // a pseudo-structure: an error in it named figment's
                // field too (`redis.tls_ca_file.___figment_relative_path`).
                let keys: Vec<&str> = keys
                    .iter()
                    .copied()
                    .filter(|k| !RelativePathBuf::FIELDS.contains(k))
                    .collect();
                let path = keys.join(".");
                match env {
                    true => format!(
                        "{path} ({ENV_PREFIX}{})",
                        keys.join("__").to_ascii_uppercase()
                    ),
                    false => path,
                }
            })
    }

    fn data(
        &self,
    ) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        self.inner.data()
    }

    fn profile(&self) -> Option<figment::Profile> {
        self.inner.profile()
    }
}

/// Gathers configuration layers; [`load`](Self::load) merges and validates
/// them.
#[derive(Debug, Clone)]
#[must_use]
pub struct ConfigBuilder {
    figment: Figment,
}

impl ConfigBuilder {
    /// Adds a TOML string layer (e.g. platform defaults built into a
    /// binary with `include_str!`).
    pub fn toml_str(mut self, toml: &str) -> Self {
        self.figment = self.figment.merge(Keys::file(Toml::string(toml)));
        self
    }

    /// Adds a TOML file layer that must exist.
    pub fn file(mut self, path: impl AsRef<Path>) -> Self {
        let path: PathBuf = path.as_ref().into();
        self.figment = self.figment.merge(Keys::file(Toml::file_exact(path)));
        self
    }

    /// Adds a TOML file layer that is skipped when the file does not exist.
    pub fn optional_file(mut self, path: impl AsRef<Path>) -> Self {
        if path.as_ref().exists() {
            self = self.file(path);
        }
        self
    }

    /// Adds the `TOLLGATE_*` environment variables, except the
    /// workspace's own variables that are not configuration fields
    /// ([`NOT_CONFIGURATION`]: `TOLLGATE_KEY_SECRET`, which is
    /// [`KeyHasher`](crate::KeyHasher)'s, and the test kit's). Any other
    /// `TOLLGATE_` variable is configuration: one that names no field
    /// (`TOLLGATE_LIMITER__API__CAPACITY`) fails the load.
    pub fn env(mut self) -> Self {
        let env = Env::prefixed(ENV_PREFIX).ignore(&NOT_CONFIGURATION);
        self.figment = self.figment.merge(Keys::env(env.split("__")));
        self
    }

    /// Adds a layer that sets `redis.url`: a URL given outside the
    /// configuration files (a `REDIS_URL` variable, a command-line flag),
    /// winning over the layers added before it.
    pub fn redis_url(mut self, url: impl Into<String>) -> Self {
        self.figment = self
            .figment
            .merge(Serialized::default("redis.url", url.into()));
        self
    }

    /// Adds a layer that sets the top-level `shadow` switch: with `true`,
    /// every limiter is in [shadow mode](crate::shadow) whatever its own
    /// `mode` says (a dry run of a whole deployment). Later layers (the
    /// environment's `TOLLGATE_SHADOW`) may still change it.
    pub fn shadow(mut self, yes: bool) -> Self {
        self.figment = self.figment.merge(Serialized::default("shadow", yes));
        self
    }

    /// Merges the layers and validates every limiter.
    pub fn load(self) -> Result<Config, ConfigError> {
        let raw: RawConfig = self
            .figment
            .extract()
            .map_err(|e| ConfigError::Parse(ParseError::new(e)))?;
        Config::from_raw(raw)
    }
}

/// Everything a limiter needs besides its backend.
///
/// Made by [`Config`] from the configuration's layers; it gains a field
/// with each new per-limiter setting, so it is read, not built.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LimiterConfig {
    /// The limiter's name.
    pub name: String,
    /// Its policy.
    pub policy: Policy,
    /// The cost of one request unless the consumer says otherwise (see
    /// [`LimiterBuilder::cost`](crate::LimiterBuilder::cost)).
    pub cost: u64,
    /// The least cost any charging call takes (see
    /// [`LimiterBuilder::min_cost`](crate::LimiterBuilder::min_cost)).
    pub min_cost: u64,
    /// Its fail mode.
    pub fail_mode: FailMode,
    /// Its per-decision timeout.
    pub timeout: Duration,
    /// Its circuit breaker.
    pub breaker: BreakerConfig,
    /// Enforce (default) or shadow: the limiter's `mode`, or shadow for
    /// every limiter under the top-level `shadow = true`.
    pub mode: Mode,
    /// A candidate policy evaluated beside the enforced one (see
    /// [`LimiterBuilder::candidate`](crate::LimiterBuilder::candidate)):
    /// the `[limiters.<name>.candidate]` table.
    pub candidate: Option<Policy>,
}

impl LimiterConfig {
    /// A limiter built from this configuration.
    ///
    /// # Panics
    ///
    /// If a field was changed since loading to a setting
    /// [`LimiterBuilder::try_build`] refuses; as loaded, it builds.
    #[track_caller]
    pub fn build<B: Backend>(&self, backend: B) -> Limiter<B> {
        self.builder(backend).build()
    }

    /// The builder [`build`](Self::build) builds with, every configured
    /// setting applied: for the settings only code gives
    /// ([`local_denials`](LimiterBuilder::local_denials),
    /// [`lease`](LimiterBuilder::lease),
    /// [`local_capacity`](LimiterBuilder::local_capacity)), then
    /// [`try_build`](LimiterBuilder::try_build). Loading checked it, with
    /// `()` for a backend.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_limiter::Config;
    /// use tollgate_memory::MemoryBackend;
    ///
    /// let config = Config::builder()
    ///     .toml_str("[limiters.api]\nstrategy = \"token_bucket\"\ncapacity = 100\nrefill = \"10/s\"")
    ///     .load()?;
    /// let api = config
    ///     .limiter("api")?
    ///     .builder(MemoryBackend::new())
    ///     .local_denials(Duration::from_secs(1))
    ///     .try_build()?;
    /// assert_eq!(api.name(), "api");
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder<B>(&self, backend: B) -> LimiterBuilder<B> {
        let b = LimiterBuilder::new(self.name.clone(), self.policy, backend)
            .fail_mode(self.fail_mode)
            .timeout(self.timeout)
            .breaker(self.breaker)
            .cost(self.cost)
            .min_cost(self.min_cost)
            .mode(self.mode);
        match self.candidate {
            Some(c) => b.candidate(c),
            None => b,
        }
    }
}

/// A validated configuration.
///
/// # Examples
///
/// ```
/// use tollgate_limiter::Config;
///
/// let config = Config::builder()
///     .toml_str(r#"
///         [limiters.login_ip]
///         strategy = "sliding_window"
///         limit = 20
///         window = "15m"
///     "#)
///     .load()?;
/// assert_eq!(config.limiter("login_ip")?.policy.limit(), 20);
///
/// let err = Config::builder()
///     .toml_str("[limiters.api]\nstrategy = \"token_bucket\"\ncapacity = 0\nrefill = \"1/s\"")
///     .load()
///     .unwrap_err();
/// assert!(err.to_string().contains("limiters.api.capacity"));
/// # Ok::<(), tollgate_limiter::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    prefix: String,
    limiters: BTreeMap<String, LimiterConfig>,
    adaptive: BTreeMap<String, AimdConfig>,
    redis: Option<RedisConfig>,
}

impl Config {
    /// An empty builder.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder {
            figment: Figment::from(Serialized::defaults(RawConfig::default())),
        }
    }

    /// The key prefix in the backend (default `tollgate`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The configuration of limiter `name`.
    pub fn limiter(&self, name: &str) -> Result<&LimiterConfig, ConfigError> {
        self.limiters
            .get(name)
            .ok_or_else(|| ConfigError::Missing(name.to_owned()))
    }

    /// The settings of adaptive limiter `name` (`[adaptive.<name>]`).
    pub fn adaptive(&self, name: &str) -> Result<&AimdConfig, ConfigError> {
        self.adaptive
            .get(name)
            .ok_or_else(|| ConfigError::MissingAdaptive(name.to_owned()))
    }

    /// The `[redis]` section, if the configuration has one.
    pub fn redis(&self) -> Option<&RedisConfig> {
        self.redis.as_ref()
    }

    /// Every configured limiter, by name.
    pub fn limiters(&self) -> impl Iterator<Item = &LimiterConfig> {
        self.limiters.values()
    }

    fn from_raw(raw: RawConfig) -> Result<Self, ConfigError> {
        let d = &raw.defaults;
        let dflt = |field: &'static str, reason: String| ConfigError::Invalid {
            path: "defaults".into(),
            field,
            reason,
        };
        let prefix = d.prefix.clone().unwrap_or_else(|| "tollgate".into());
        check_prefix(&prefix).map_err(|e| dflt("prefix", e.into()))?;
        let fail_mode = match &d.fail_mode {
            Some(s) => s.parse().map_err(|e| dflt("fail_mode", e))?,
            None => FailMode::default(),
        };
        let timeout = opt_duration(d.timeout.as_deref())
            .map_err(|e| dflt("timeout", e))?
            .unwrap_or(DEFAULT_TIMEOUT);
        check_timeout(timeout).map_err(|(f, r)| dflt(f, r))?;
        let base = BreakerConfig::default();
        let backoff = opt_duration(d.breaker_backoff.as_deref())
            .map_err(|e| dflt("breaker_backoff", e))?
            .unwrap_or(base.backoff);
        let breaker = BreakerConfig {
            threshold: d.breaker_threshold.unwrap_or(base.threshold),
            backoff,
            // Not given: the default, or the first back-off if that is
            // longer.
            max_backoff: opt_duration(d.breaker_max_backoff.as_deref())
                .map_err(|e| dflt("breaker_max_backoff", e))?
                .unwrap_or(base.max_backoff.max(backoff)),
        };
        if let Some((field, reason)) = breaker.misread() {
            return Err(dflt(field, reason));
        }
        for (section, names) in [
            ("limiters", raw.limiters.keys().collect::<Vec<_>>()),
            ("adaptive", raw.adaptive.keys().collect()),
        ] {
            if let Some((name, reason)) = names
                .into_iter()
                .find_map(|n| reachable_from_env(section, n).err().map(|r| (n, r)))
            {
                return Err(ConfigError::Invalid {
                    path: format!("{section}.{name}"),
                    field: "name",
                    reason,
                });
            }
        }
        let mut limiters = BTreeMap::new();
        for (name, l) in raw.limiters {
            let mut cfg = validate(&name, &l, fail_mode, timeout, breaker)?;
            if raw.shadow == Some(true) {
                cfg.mode = Mode::Shadow;
            }
            limiters.insert(name, cfg);
        }
        // Each limiter name in the backend has one owner: an adaptive
        // limiter keeps its state under several (see `aimd`).
        let mut owners: BTreeMap<String, String> = limiters
            .keys()
            .map(|n| (n.clone(), format!("limiters.{n}")))
            .collect();
        for name in raw.adaptive.keys() {
            let path = format!("adaptive.{name}");
            let bad = |reason: String| ConfigError::Invalid {
                path: path.clone(),
                field: "name",
                reason,
            };
            check_name(name).map_err(|(_, rule)| bad(rule))?;
            for state in crate::aimd::state_names(name) {
                if let Some(owner) = owners.insert(state.clone(), path.clone()) {
                    return Err(bad(format!(
                        "its state would share the limiter name {state:?} with {owner} (an \
                         adaptive limiter <name> keeps its state under <name>, <name>-cut, \
                         <name>-grow, <name>-hold and <name>-seen): rename one of them"
                    )));
                }
            }
        }
        let adaptive = raw
            .adaptive
            .into_iter()
            .map(|(name, raw)| {
                raw.into_config(&format!("adaptive.{name}"))
                    .map(|c| (name, c))
            })
            .collect::<Result<_, _>>()?;
        let redis = raw.redis.map(redis::RawRedis::validate).transpose()?;
        Ok(Self {
            prefix,
            limiters,
            adaptive,
            redis,
        })
    }
}

/// Whether `prefix` can prefix a backend's keys (`<prefix>:<limiter>:{<key>}`):
/// not empty, without white space at either end or control characters,
/// without `{` or `}` (the hash tag) nor `:`, so that one
/// prefix never reads as another's followed by a limiter name (`a` and
/// limiter `b:c`, `a:b` and limiter `c`; limiter names have no `:`
/// either). The error is the rule, for the caller to name its field.
///
/// # Examples
///
/// ```
/// assert!(tollgate_limiter::config::check_prefix("tollgate").is_ok());
/// assert!(tollgate_limiter::config::check_prefix("svc:eu").is_err());
/// ```
pub fn check_prefix(prefix: &str) -> Result<(), &'static str> {
    match unusable_in_a_key(prefix) {
        true => Err(
            "must be non-empty, without '{', '}' or ':', white space at either end or \
             control characters",
        ),
        false => Ok(()),
    }
}

/// Whether `part` cannot be a prefix or limiter name of a key: empty,
/// holding the hash tag's braces or the separator `:`, or white space at
/// either end or a control character (a `"tollgate "` from a template or
/// an env file is another keyspace, whose workers count apart).
fn unusable_in_a_key(part: &str) -> bool {
    part.is_empty()
        || part.contains(['{', '}', ':'])
        || part.trim() != part
        || part.chars().any(char::is_control)
}

/// Whether `name` can name a limiter in the backend: not empty, without
/// the hash tag's braces, nor `:` (which separates the key's parts, and
/// `<name>:candidate` is a candidate's namespace), nor white space at
/// either end or control characters. The one rule for limiters, built or
/// configured, and adaptive limiters.
pub(crate) fn check_name(name: &str) -> Result<(), FieldError> {
    match unusable_in_a_key(name) {
        true => Err((
            "name",
            "limiter names must be non-empty, without '{', '}' or ':', white space at either \
             end or control characters"
                .into(),
        )),
        false => Ok(()),
    }
}

/// Whether the environment can address section `<section>.<name>`:
/// `TOLLGATE_` variables are read lower-cased and split at `.`, so a name
/// with an upper-case letter or a dot would be a section no variable can
/// override, and `TOLLGATE_<SECTION>__<NAME>__…` would configure another
/// one, silently (an adaptive section needs no field). A rule of
/// configuration only: code may name a limiter as it likes.
fn reachable_from_env(section: &str, name: &str) -> Result<(), String> {
    if name.contains('.') {
        return Err(
            "must not hold '.': TOLLGATE_ variables are split at '.', so none could \
             override this section"
                .into(),
        );
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        let lower = name.to_ascii_lowercase();
        return Err(format!(
            "must be lower-case: TOLLGATE_ variables are read lower-cased, so \
             TOLLGATE_{}__{}__… would configure another section, {section}.{lower}",
            section.to_ascii_uppercase(),
            name.to_ascii_uppercase(),
        ));
    }
    Ok(())
}

fn validate(
    name: &str,
    l: &RawLimiter,
    fail_mode: FailMode,
    timeout: Duration,
    breaker: BreakerConfig,
) -> Result<LimiterConfig, ConfigError> {
    let err = |field, reason: String| ConfigError::invalid(name, field, reason);
    let policy = limiter_policy(l).map_err(|(f, r)| err(f, r))?;
    let candidate = match &l.candidate {
        Some(c) => Some(candidate_policy(c).map_err(|(f, r)| err(f, r))?),
        None => None,
    };
    // Checked with the builder's other rules, below.
    let cost = l.cost.unwrap_or(1);
    let fail_mode = match &l.fail_mode {
        Some(s) => s.parse().map_err(|e| err("fail_mode", e))?,
        None => fail_mode,
    };
    let timeout = opt_duration(l.timeout.as_deref())
        .map_err(|e| err("timeout", e))?
        .unwrap_or(timeout);
    let mode = match &l.mode {
        Some(s) => s.parse().map_err(|e| err("mode", e))?,
        None => Mode::default(),
    };
    let config = LimiterConfig {
        name: name.to_owned(),
        policy,
        cost,
        min_cost: l.min_cost.unwrap_or(1),
        fail_mode,
        timeout,
        breaker,
        mode,
        candidate,
    };
    // Every other rule is the builder's: checked on the builder that
    // `LimiterConfig::build` uses, so configuration loads exactly what
    // builds.
    config.builder(()).check().map_err(|(f, r)| err(f, r))?;
    Ok(config)
}

/// A candidate's policy: policy fields only; errors name the field under
/// `candidate`. (That neither side is a concurrency limit is the
/// builder's rule.)
fn candidate_policy(c: &RawLimiter) -> Result<Policy, FieldError> {
    let nested = [
        ("cost", c.cost.is_some()),
        ("min_cost", c.min_cost.is_some()),
        ("fail_mode", c.fail_mode.is_some()),
        ("timeout", c.timeout.is_some()),
        ("mode", c.mode.is_some()),
        ("candidate", c.candidate.is_some()),
    ];
    if let Some((field, _)) = nested.iter().find(|(_, set)| *set) {
        return Err((
            "candidate",
            format!("candidate.{field}: set it on the limiter, not on its candidate"),
        ));
    }
    limiter_policy(c).map_err(|(f, r)| ("candidate", format!("candidate.{f}: {r}")))
}

/// A limiter's (or a candidate's) policy: a composite or a single one.
fn limiter_policy(l: &RawLimiter) -> Result<Policy, FieldError> {
    let err = |field: &'static str, reason: String| (field, reason);
    Ok(match (l.strategy.as_deref(), &l.policies) {
        (Some("composite") | None, Some(parts)) => composite_policy(l, parts)?,
        (Some("composite"), None) => {
            return Err(err(
                "policies",
                "missing (a composite lists its policies)".into(),
            ));
        }
        (_, Some(_)) => {
            return Err(err(
                "policies",
                "belongs to composite (set strategy = \"composite\" or leave it out)".into(),
            ));
        }
        (_, None) => single_policy(l)?,
    })
}

/// A policy error: the field, as spelled in configuration, and why.
pub(crate) type FieldError = (&'static str, String);

/// The policy of a limiter (or a composite's part) with one strategy.
fn single_policy(l: &RawLimiter) -> Result<Policy, FieldError> {
    let err = |field: &'static str, reason: String| (field, reason);
    let strategy = match l.strategy.as_deref() {
        Some("token_bucket") => Strategy::TokenBucket,
        Some("sliding_window") => Strategy::SlidingWindow,
        Some("progressive_delay") => Strategy::ProgressiveDelay,
        Some("composite") => Strategy::Composite,
        Some("calendar") => Strategy::Calendar,
        Some("concurrency") => Strategy::Concurrency,
        Some(other) => {
            return Err(err(
                "strategy",
                format!(
                    "unknown strategy {other:?}; expected token_bucket, sliding_window, \
                     progressive_delay, calendar, composite or concurrency"
                ),
            ));
        }
        None => return Err(err("strategy", "missing".into())),
    };
    // Each strategy's own fields; any other strategy's field is a mistake
    // worth reporting (a `window` on a token bucket does nothing).
    let present: [(&'static str, bool, Strategy); 14] = [
        ("capacity", l.capacity.is_some(), Strategy::TokenBucket),
        ("refill", l.refill.is_some(), Strategy::TokenBucket),
        ("limit", l.limit.is_some(), Strategy::SlidingWindow),
        ("window", l.window.is_some(), Strategy::SlidingWindow),
        (
            "penalise_refused",
            l.penalise_refused.is_some(),
            Strategy::SlidingWindow,
        ),
        (
            "free_attempts",
            l.free_attempts.is_some(),
            Strategy::ProgressiveDelay,
        ),
        (
            "base_delay",
            l.base_delay.is_some(),
            Strategy::ProgressiveDelay,
        ),
        ("factor", l.factor.is_some(), Strategy::ProgressiveDelay),
        (
            "max_delay",
            l.max_delay.is_some(),
            Strategy::ProgressiveDelay,
        ),
        (
            "forget_after",
            l.forget_after.is_some(),
            Strategy::ProgressiveDelay,
        ),
        ("period", l.period.is_some(), Strategy::Calendar),
        ("time_zone", l.time_zone.is_some(), Strategy::Calendar),
        (
            "max_in_flight",
            l.max_in_flight.is_some(),
            Strategy::Concurrency,
        ),
        ("lease", l.lease.is_some(), Strategy::Concurrency),
    ];
    // A calendar quota shares `limit` with the sliding window.
    let belongs = |field: &str, s: Strategy| {
        s == strategy || (field == "limit" && strategy == Strategy::Calendar)
    };
    if let Some((field, _, s)) = present.iter().find(|(f, set, s)| *set && !belongs(f, *s)) {
        return Err(err(field, format!("belongs to {s}, not to {strategy}")));
    }
    let req = |field: &'static str, v: Option<u64>| v.ok_or_else(|| err(field, "missing".into()));
    let dur = |field: &'static str, v: &Option<String>| -> Result<Duration, FieldError> {
        let d = opt_duration(v.as_deref())
            .map_err(|e| err(field, e))?
            .ok_or_else(|| err(field, "missing".into()))?;
        whole_micros(d).map_err(|e| err(field, e))
    };
    Ok(match strategy {
        Strategy::Composite => return Err(err("policies", "missing".into())),
        Strategy::TokenBucket => {
            let capacity = req("capacity", l.capacity)?;
            let (refill, period) = match &l.refill {
                Some(r) => parse_rate(r).map_err(|e| err("refill", e))?,
                None => return Err(err("refill", "missing (e.g. \"60/min\")".into())),
            };
            TokenBucket::new(capacity, refill, period)
                .map_err(|e| match e.field {
                    // The rate's period is written in `refill`.
                    "period" => ("refill", format!("its period {}", e.reason)),
                    _ => (e.field, e.reason),
                })?
                .into()
        }
        Strategy::SlidingWindow => {
            SlidingWindow::new(req("limit", l.limit)?, dur("window", &l.window)?)
                .map_err(|e| (e.field, e.reason))?
                .penalise_refused(l.penalise_refused.unwrap_or(false))
                .into()
        }
        Strategy::Calendar => {
            let period: Period = match &l.period {
                Some(p) => p.parse().map_err(|e: PolicyError| (e.field, e.reason))?,
                None => return Err(err("period", "missing (day, week or month)".into())),
            };
            let zone = match &l.time_zone {
                Some(z) => Zone::get(z).map_err(|e| (e.field, e.reason))?,
                None => Zone::utc(),
            };
            Calendar::in_zone(req("limit", l.limit)?, period, zone)
                .map_err(|e| (e.field, e.reason))?
                .into()
        }
        Strategy::ProgressiveDelay => {
            let p = ProgressiveDelay::new(
                req("free_attempts", l.free_attempts)?,
                dur("base_delay", &l.base_delay)?,
                l.factor.unwrap_or(2),
                dur("max_delay", &l.max_delay)?,
                dur("forget_after", &l.forget_after)?,
            )
            .map_err(|e| (e.field, e.reason))?;
            if p.forgets_by_its_longest_block() {
                let longest = p.delay_micros(u64::MAX);
                return Err(err(
                    "forget_after",
                    format!(
                        "must be longer than the longest delay ({}): a block ending when \
                         the failures are forgotten gives the free attempts back",
                        humantime::format_duration(Duration::from_micros(longest))
                    ),
                ));
            }
            p.into()
        }
        Strategy::Concurrency => Concurrency::new(
            req("max_in_flight", l.max_in_flight)?,
            dur("lease", &l.lease)?,
        )
        .map_err(|e| (e.field, e.reason))?
        .into(),
    })
}

/// A composite's policy: each part a single policy without the limiter's
/// own settings; errors name the part (`policies[1].capacity: …`).
fn composite_policy(l: &RawLimiter, parts: &[RawLimiter]) -> Result<Policy, FieldError> {
    let present = [
        ("capacity", l.capacity.is_some()),
        ("refill", l.refill.is_some()),
        ("limit", l.limit.is_some()),
        ("window", l.window.is_some()),
        ("penalise_refused", l.penalise_refused.is_some()),
        ("free_attempts", l.free_attempts.is_some()),
        ("base_delay", l.base_delay.is_some()),
        ("factor", l.factor.is_some()),
        ("max_delay", l.max_delay.is_some()),
        ("forget_after", l.forget_after.is_some()),
        ("period", l.period.is_some()),
        ("time_zone", l.time_zone.is_some()),
        ("max_in_flight", l.max_in_flight.is_some()),
        ("lease", l.lease.is_some()),
    ];
    if let Some((field, _)) = present.iter().find(|(_, set)| *set) {
        return Err((
            field,
            "belongs to one of the composite's policies, not to the composite".into(),
        ));
    }
    let mut policies = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let nested = [
            ("policies", part.policies.is_some()),
            ("cost", part.cost.is_some()),
            ("min_cost", part.min_cost.is_some()),
            ("fail_mode", part.fail_mode.is_some()),
            ("timeout", part.timeout.is_some()),
            ("mode", part.mode.is_some()),
            ("candidate", part.candidate.is_some()),
        ];
        if let Some((field, _)) = nested.iter().find(|(_, set)| *set) {
            return Err((
                "policies",
                format!("policies[{i}].{field}: set it on the limiter, not on one policy"),
            ));
        }
        if part.strategy.as_deref() == Some("composite") {
            return Err((
                "policies",
                format!("policies[{i}].strategy: a composite cannot nest a composite"),
            ));
        }
        let p = single_policy(part)
            .map_err(|(f, r)| ("policies", format!("policies[{i}].{f}: {r}")))?;
        policies.push(p);
    }
    Ok(Composite::new(policies)
        .map_err(|e| (e.field, e.reason))?
        .into())
}

/// `d` if it is a whole number of microseconds, the unit every policy
/// counts in: a finer one was truncated, silently (`"1/1500ns"` refilled a
/// token every microsecond).
pub(crate) fn whole_micros(d: Duration) -> Result<Duration, String> {
    if !d.subsec_nanos().is_multiple_of(1_000) {
        return Err(format!(
            "{} is not a whole number of microseconds (policies count in µs)",
            humantime::format_duration(d)
        ));
    }
    Ok(d)
}

fn opt_duration(s: Option<&str>) -> Result<Option<Duration>, String> {
    s.map(|s| {
        humantime::parse_duration(s.trim())
            .map_err(|e| format!("{e} in {s:?} (e.g. \"15m\", \"50ms\")"))
    })
    .transpose()
}

/// Parses a rate such as `"60/min"`, `"10/s"` or `"5/15m"` into
/// (count, period). A period that is not a whole number of microseconds
/// (`"1/1500ns"`) is refused: policies count in microseconds.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// assert_eq!(tollgate_limiter::parse_rate("60/min"), Ok((60, Duration::from_secs(60))));
/// assert_eq!(tollgate_limiter::parse_rate("5/15m"), Ok((5, Duration::from_secs(900))));
/// ```
pub fn parse_rate(s: &str) -> Result<(u64, Duration), String> {
    let (count, per) = s
        .split_once('/')
        .ok_or_else(|| format!("expected <count>/<period> such as \"60/min\", found {s:?}"))?;
    let count: u64 = count
        .trim()
        .parse()
        .map_err(|_| format!("{:?} is not a whole number in rate {s:?}", count.trim()))?;
    let per = per.trim();
    // "min" means one minute: humantime wants a number in front.
    let period = if per.starts_with(|c: char| c.is_ascii_digit()) {
        humantime::parse_duration(per)
    } else {
        humantime::parse_duration(&format!("1{per}"))
    }
    .map_err(|e| format!("{e} in rate {s:?}"))?;
    let period = whole_micros(period).map_err(|e| format!("its period {e}, in rate {s:?}"))?;
    Ok((count, period))
}

#[cfg(test)]
// figment's Jail closures return its large error type; that is its API.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    fn load(toml: &str) -> Result<Config, ConfigError> {
        Config::builder().toml_str(toml).load()
    }

    fn err(toml: &str) -> String {
        load(toml).unwrap_err().to_string()
    }

    #[test]
    fn composite_loads_from_a_list_of_policies() {
        let c = load(
            r#"
            [limiters.api]
            strategy = "composite"
            policies = [
                { strategy = "token_bucket", capacity = 10, refill = "10/s" },
                { strategy = "sliding_window", limit = 1000, window = "1d" },
            ]
            cost = 2
            "#,
        )
        .unwrap();
        let l = c.limiter("api").unwrap();
        let Policy::Composite(p) = l.policy else {
            panic!("{:?}", l.policy)
        };
        assert_eq!(p.len(), 2);
        assert_eq!(l.policy.max_cost(), Some(10));
        // `strategy` may be left out when `policies` is given.
        let c = load(
            "[[limiters.api.policies]]\nstrategy = \"sliding_window\"\nlimit = 3\nwindow = \"1s\"",
        )
        .unwrap();
        assert_eq!(
            c.limiter("api").unwrap().policy.strategy(),
            Strategy::Composite
        );
    }

    #[test]
    fn composite_errors_name_the_part_and_field() {
        let e = err(r#"
            [limiters.api]
            policies = [
                { strategy = "token_bucket", capacity = 10, refill = "10/s" },
                { strategy = "progressive_delay", free_attempts = 1, base_delay = "1s", max_delay = "2s", forget_after = "1m" },
            ]"#);
        assert!(e.contains("limiters.api.policies: policies[1]"), "{e}");
        let e = err(r#"
            [limiters.api]
            policies = [{ strategy = "token_bucket", capacity = 0, refill = "10/s" }]"#);
        assert!(
            e.contains("limiters.api.policies: policies[0].capacity"),
            "{e}"
        );
        let e = err(r#"
            [limiters.api]
            policies = [{ strategy = "sliding_window", limit = 1, window = "1s", penalise_refused = true }]"#);
        assert!(e.contains("penalises refusals"), "{e}");
        let e = err(r#"
            [limiters.api]
            strategy = "token_bucket"
            capacity = 1
            refill = "1/s"
            policies = [{ strategy = "token_bucket", capacity = 1, refill = "1/s" }]"#);
        assert!(e.contains("limiters.api.policies"), "{e}");
        let e = err("[limiters.api]\nstrategy = \"composite\"");
        assert!(e.contains("limiters.api.policies: missing"), "{e}");
        let e = err(r#"
            [limiters.api]
            limit = 3
            policies = [{ strategy = "token_bucket", capacity = 1, refill = "1/s" }]"#);
        assert!(e.contains("limiters.api.limit"), "{e}");
        let e = err(r#"
            [limiters.api]
            policies = [{ strategy = "token_bucket", capacity = 5, refill = "1/s" }]
            cost = 6"#);
        assert!(e.contains("limiters.api.cost"), "{e}");
    }

    #[test]
    fn calendar_quotas_load_and_name_bad_fields() {
        let c = load(
            r#"
            [limiters.plan]
            strategy = "calendar"
            limit = 10000
            period = "month"
            time_zone = "Europe/Berlin"

            [limiters.daily]
            strategy = "calendar"
            limit = 100
            period = "day"

            [limiters.api]
            policies = [
                { strategy = "token_bucket", capacity = 10, refill = "10/s" },
                { strategy = "calendar", limit = 10000, period = "month", time_zone = "Europe/Berlin" },
            ]
            "#,
        )
        .unwrap();
        let Policy::Calendar(plan) = c.limiter("plan").unwrap().policy else {
            panic!()
        };
        assert_eq!(
            (plan.limit(), plan.period(), plan.zone().name()),
            (10_000, Period::Month, "Europe/Berlin")
        );
        let Policy::Calendar(daily) = c.limiter("daily").unwrap().policy else {
            panic!()
        };
        assert_eq!(daily.zone().name(), "UTC", "UTC unless told otherwise");
        assert_eq!(c.limiter("api").unwrap().policy.max_cost(), Some(10));
        let cal = |extra: &str| {
            err(&format!(
                "[limiters.plan]\nstrategy = \"calendar\"\nlimit = 5\n{extra}"
            ))
        };
        let e = cal("period = \"month\"\ntime_zone = \"Europe/Berlln\"");
        assert!(e.contains("limiters.plan.time_zone"), "{e}");
        assert!(e.contains("Europe/Berlln"), "{e}");
        let e = cal("period = \"fortnight\"");
        assert!(e.contains("limiters.plan.period"), "{e}");
        let e = cal("");
        assert!(e.contains("limiters.plan.period: missing"), "{e}");
        let e = cal("period = \"day\"\nwindow = \"1d\"");
        assert!(
            e.contains("limiters.plan.window: belongs to sliding_window"),
            "{e}"
        );
        let e = err(
            "[limiters.w]\nstrategy = \"sliding_window\"\nlimit = 1\nwindow = \"1s\"\nperiod = \"day\"",
        );
        assert!(e.contains("limiters.w.period: belongs to calendar"), "{e}");
        let e = err(r#"
            [limiters.api]
            policies = [{ strategy = "calendar", limit = 5, period = "week", time_zone = "Nowhere" }]"#);
        assert!(
            e.contains("limiters.api.policies: policies[0].time_zone"),
            "{e}"
        );
        let e = cal("period = \"day\"\ncost = 6");
        assert!(e.contains("limiters.plan.cost"), "{e}");
    }

    #[test]
    fn calendar_from_the_environment() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("TOLLGATE_LIMITERS__PLAN__STRATEGY", "calendar");
            jail.set_env("TOLLGATE_LIMITERS__PLAN__LIMIT", "10000");
            jail.set_env("TOLLGATE_LIMITERS__PLAN__PERIOD", "week");
            jail.set_env("TOLLGATE_LIMITERS__PLAN__TIME_ZONE", "America/New_York");
            let c = Config::builder().env().load().unwrap();
            let Policy::Calendar(p) = c.limiter("plan").unwrap().policy else {
                panic!()
            };
            assert_eq!(p.period(), Period::Week);
            assert_eq!(p.zone().name(), "America/New_York");
            jail.set_env("TOLLGATE_LIMITERS__PLAN__TIME_ZONE", "Europe/Atlantis");
            let e = Config::builder().env().load().unwrap_err().to_string();
            assert!(e.contains("limiters.plan.time_zone"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn composite_from_the_environment() {
        figment::Jail::expect_with(|jail| {
            jail.set_env(
                "TOLLGATE_LIMITERS__API__POLICIES",
                r#"[{strategy="token_bucket",capacity=5,refill="1/s"},{strategy="sliding_window",limit=3,window="1m"}]"#,
            );
            let c = Config::builder().env().load().unwrap();
            assert_eq!(c.limiter("api").unwrap().policy.max_cost(), Some(3));
            Ok(())
        });
    }

    #[test]
    fn full_example_loads() {
        let c = load(
            r#"
            [defaults]
            fail_mode = "closed"
            timeout = "20ms"
            [limiters.login_ip]
            strategy = "sliding_window"
            limit = 20
            window = "15m"
            penalise_refused = true
            [limiters.login_account]
            strategy = "progressive_delay"
            free_attempts = 5
            base_delay = "1s"
            max_delay = "15m"
            forget_after = "1h"
            [limiters.api]
            strategy = "token_bucket"
            capacity = 100
            refill = "60/min"
            fail_mode = "open"
            timeout = "5ms"
            "#,
        )
        .unwrap();
        let api = c.limiter("api").unwrap();
        assert_eq!(api.fail_mode, FailMode::Open);
        assert_eq!(api.timeout, Duration::from_millis(5));
        match api.policy {
            Policy::TokenBucket(tb) => assert_eq!(tb.interval(), Duration::from_secs(1)),
            _ => panic!("wrong strategy"),
        }
        let ip = c.limiter("login_ip").unwrap();
        assert_eq!(ip.timeout, Duration::from_millis(20));
        assert_eq!(ip.fail_mode, FailMode::Closed);
        assert_eq!(ip.policy.window(), Duration::from_secs(900));
        assert_eq!(c.limiters().count(), 3);
        assert_eq!(c.prefix(), "tollgate");
    }

    #[test]
    fn zero_capacity_names_limiter_and_field() {
        let e = err("[limiters.api]\nstrategy='token_bucket'\ncapacity=0\nrefill='1/s'");
        assert!(e.contains("limiters.api.capacity"), "{e}");
    }

    #[test]
    fn zero_window_names_limiter_and_field() {
        let e = err("[limiters.hooks]\nstrategy='sliding_window'\nlimit=5\nwindow='0s'");
        assert!(e.contains("limiters.hooks.window"), "{e}");
    }

    #[test]
    fn unknown_strategy_is_refused() {
        let e = err("[limiters.x]\nstrategy='leaky_bucket'");
        assert!(
            e.contains("limiters.x.strategy") && e.contains("leaky_bucket"),
            "{e}"
        );
    }

    #[test]
    fn unknown_field_is_refused() {
        let e = err("[limiters.x]\nstrategy='sliding_window'\nlimit=5\nwindow='1m'\nwindwo='2m'");
        assert!(e.contains("windwo") && e.contains("limiters.x"), "{e}");
        let e = err("[defaults]\nfailmode='open'");
        assert!(e.contains("failmode"), "{e}");
    }

    #[test]
    fn cost_above_limit_is_refused() {
        let e = err("[limiters.llm]\nstrategy='token_bucket'\ncapacity=10\nrefill='1/s'\ncost=11");
        assert!(e.contains("limiters.llm.cost"), "{e}");
    }

    #[test]
    fn min_cost_is_validated_and_applied() {
        let tb = "[limiters.llm]\nstrategy='token_bucket'\ncapacity=10\nrefill='1/s'\n";
        let e = err(&format!("{tb}min_cost=0"));
        assert!(e.contains("limiters.llm.min_cost"), "{e}");
        let e = err(&format!("{tb}min_cost=11"));
        assert!(e.contains("limiters.llm.min_cost"), "{e}");
        let c = Config::builder()
            .toml_str(&format!("{tb}min_cost=4"))
            .load()
            .unwrap();
        assert_eq!(c.limiter("llm").unwrap().min_cost, 4);
        let c = Config::builder().toml_str(tb).load().unwrap();
        assert_eq!(c.limiter("llm").unwrap().min_cost, 1);
    }

    #[test]
    fn field_of_another_strategy_is_refused() {
        let e = err("[limiters.x]\nstrategy='token_bucket'\ncapacity=1\nrefill='1/s'\nwindow='1m'");
        assert!(
            e.contains("limiters.x.window") && e.contains("sliding_window"),
            "{e}"
        );
    }

    #[test]
    fn missing_and_malformed_values_are_named() {
        let e = err("[limiters.x]\nstrategy='sliding_window'\nlimit=5");
        assert!(e.contains("limiters.x.window: missing"), "{e}");
        let e = err("[limiters.x]\nstrategy='sliding_window'\nlimit=5\nwindow='soon'");
        assert!(e.contains("limiters.x.window"), "{e}");
        let e = err("[limiters.x]\nstrategy='token_bucket'\ncapacity=5\nrefill='fast'");
        assert!(e.contains("limiters.x.refill"), "{e}");
        let e = err("[limiters.x]\nstrategy='token_bucket'\ncapacity='many'\nrefill='1/s'");
        assert!(
            e.contains("limiters.x.capacity") || e.contains("capacity"),
            "{e}"
        );
        let e = err(
            "[limiters.x]\nstrategy='token_bucket'\ncapacity=5\nrefill='1/s'\nfail_mode='ajar'",
        );
        assert!(e.contains("limiters.x.fail_mode"), "{e}");
        let e = err("[defaults]\ntimeout='forever'");
        assert!(e.contains("defaults.timeout"), "{e}");
    }

    /// A zero default timeout is the default's mistake: it was reported
    /// as the first limiter's (`limiters.api.timeout`, a field that
    /// limiter does not set), and loaded when no limiter inherited it.
    #[test]
    fn a_zero_default_timeout_names_the_default() {
        let tb = "[limiters.api]\nstrategy='token_bucket'\ncapacity=1\nrefill='1/s'";
        let e = err(&format!("[defaults]\ntimeout='0s'\n{tb}"));
        assert!(e.contains("defaults.timeout"), "{e}");
        let e = err("[defaults]\ntimeout='0s'");
        assert!(e.contains("defaults.timeout"), "{e}");
    }

    #[test]
    fn missing_limiter_is_named() {
        let c = load("").unwrap();
        let e = c.limiter("nope").unwrap_err().to_string();
        assert!(e.contains("\"nope\""), "{e}");
    }

    #[test]
    fn adaptive_sections_load_and_name_their_errors() {
        let c = load("[adaptive.crawler]\nmax_rate = '20/s'\nreaction_window = '2s'").unwrap();
        let a = c.adaptive("crawler").unwrap();
        assert_eq!(a.max_rate, 20.0);
        assert_eq!(a.reaction_window, Duration::from_secs(2));
        assert!(c.adaptive("other").is_err());
        let e = err("[adaptive.crawler]\nburst = 0");
        assert!(e.contains("adaptive.crawler.burst"), "{e}");
        let e = err("[adaptive.crawler]\nbrust = 2");
        assert!(e.contains("brust") && e.contains("adaptive.crawler"), "{e}");
    }

    /// Keys are `<prefix>:<limiter>:{<key>}`: a ':' in either would let
    /// prefix `a` with limiter `b:c` and prefix `a:b` with limiter `c`
    /// share every key, so both are refused at load, naming the field
    /// (the backend builder and the CLI's `--prefix` take the same rule).
    #[test]
    fn neither_prefix_nor_limiter_name_takes_a_colon() {
        let tb = "strategy='token_bucket'\ncapacity=1\nrefill='1/s'";
        let e = err(&format!("[defaults]\nprefix='a:b'\n[limiters.c]\n{tb}"));
        assert!(e.contains("defaults.prefix"), "{e}");
        let e = err(&format!("[defaults]\nprefix='a'\n[limiters.\"b:c\"]\n{tb}"));
        assert!(e.contains("limiters.b:c.name"), "{e}");
        assert!(load(&format!("[defaults]\nprefix='a-b'\n[limiters.b-c]\n{tb}")).is_ok());
    }

    /// An adaptive limiter's name follows the limiters' rule, and none of
    /// the limiter names it keeps its state under (`<name>`, `<name>-cut`,
    /// `-grow`, `-hold`, `-seen`) may be another section's: they loaded,
    /// and the two shared their counters and per-key overrides in the
    /// backend (the crawler's adapted rate became the plain limiter's).
    #[test]
    fn adaptive_names_are_checked_and_never_shared() {
        for name in ["\"a{b}\"", "\"a:b\"", "\"\""] {
            let e = err(&format!("[adaptive.{name}]\nmax_rate = '2/s'"));
            assert!(e.contains(".name"), "{name}: {e}");
        }
        let tb = "strategy='token_bucket'\ncapacity=1\nrefill='1/s'";
        for limiter in ["crawler", "crawler-cut", "crawler-seen"] {
            let e = err(&format!("[limiters.{limiter}]\n{tb}\n[adaptive.crawler]"));
            assert!(
                e.contains("adaptive.crawler.name") && e.contains(&format!("limiters.{limiter}")),
                "{e}"
            );
        }
        let e = err("[adaptive.crawler]\n[adaptive.crawler-hold]");
        assert!(e.contains("adaptive.crawler"), "{e}");
        assert!(load(&format!("[limiters.crawl]\n{tb}\n[adaptive.crawler]")).is_ok());
    }

    /// A count the Redis scripts cannot hold exactly (2^53 and above) is
    /// refused at load, naming the field. It loaded, and then every
    /// decision of the Redis backend failed (the policy does not encode),
    /// so the fail mode answered every request.
    #[test]
    fn counts_beyond_exact_lua_integers_are_refused_at_load() {
        let big = "9007199254740992";
        let pd = "base_delay='1s'\nmax_delay='1m'\nforget_after='1h'";
        for (toml, field) in [
            (
                format!("[limiters.x]\nstrategy='sliding_window'\nlimit={big}\nwindow='1m'"),
                "limiters.x.limit",
            ),
            (
                format!("[limiters.x]\nstrategy='calendar'\nlimit={big}\nperiod='day'"),
                "limiters.x.limit",
            ),
            (
                format!("[limiters.x]\nstrategy='progressive_delay'\nfree_attempts={big}\n{pd}"),
                "limiters.x.free_attempts",
            ),
            (
                format!(
                    "[limiters.x]\npolicies=[{{strategy='sliding_window',limit={big},window='1m'}}]"
                ),
                "limiters.x.policies: policies[0].limit",
            ),
        ] {
            let e = err(&toml);
            assert!(e.contains(field) && e.contains("2^53"), "{toml}: {e}");
        }
        let top =
            load("[limiters.x]\nstrategy='sliding_window'\nlimit=9007199254740991\nwindow='1m'");
        assert_eq!(
            top.unwrap().limiter("x").unwrap().policy.limit(),
            (1 << 53) - 1
        );
        figment::Jail::expect_with(|jail| {
            jail.set_env("TOLLGATE_LIMITERS__X__STRATEGY", "calendar");
            jail.set_env("TOLLGATE_LIMITERS__X__PERIOD", "month");
            jail.set_env("TOLLGATE_LIMITERS__X__LIMIT", u64::MAX.to_string());
            let e = Config::builder().env().load().unwrap_err().to_string();
            assert!(e.contains("limiters.x.limit"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn a_refill_period_out_of_range_names_the_refill() {
        // A token bucket has no `period` field (that is a calendar's): the
        // period of its rate is part of `refill`.
        let tb = "[limiters.api]\nstrategy='token_bucket'\ncapacity=10\n";
        for refill in ["5/0s", "1/20y"] {
            let e = err(&format!("{tb}refill='{refill}'"));
            assert!(e.contains("limiters.api.refill"), "{refill}: {e}");
        }
        let e = err(r#"
            [limiters.api]
            policies = [{ strategy = "token_bucket", capacity = 1, refill = "1/0s" }]"#);
        assert!(e.contains("policies[0].refill"), "{e}");
    }

    /// A breaker's back-offs that would mean something else than they say
    /// are refused at load, naming the field.
    #[test]
    fn breaker_back_offs_mean_what_they_say() {
        let tb = "[limiters.api]\nstrategy='token_bucket'\ncapacity=10\nrefill='10/s'\n";
        let e = err(&format!("[defaults]\nbreaker_backoff='0s'\n{tb}"));
        assert!(e.contains("defaults.breaker_backoff"), "{e}");
        let e = err(&format!(
            "[defaults]\nbreaker_backoff='2s'\nbreaker_max_backoff='1s'\n{tb}"
        ));
        assert!(e.contains("defaults.breaker_max_backoff"), "{e}");
        // Not given, the longest back-off is at least the first.
        let c = load(&format!("[defaults]\nbreaker_backoff='2s'\n{tb}")).unwrap();
        let b = c.limiter("api").unwrap().breaker;
        let two = Duration::from_secs(2);
        assert_eq!((b.backoff, b.max_backoff), (two, two));
        // Equal, or a threshold of 0 (the breaker off), load.
        let ok = format!("[defaults]\nbreaker_backoff='2s'\nbreaker_max_backoff='2s'\n{tb}");
        assert!(Config::builder().toml_str(&ok).load().is_ok());
        let off = format!("[defaults]\nbreaker_threshold=0\n{tb}");
        assert!(Config::builder().toml_str(&off).load().is_ok());
        // An adaptive limiter's breaker: the same rules.
        let e = err("[adaptive.crawler]\nbreaker_backoff = '0s'");
        assert!(e.contains("adaptive.crawler.breaker_backoff"), "{e}");
        let e = err("[adaptive.crawler]\nbreaker_backoff = '3s'\nbreaker_max_backoff = '2s'");
        assert!(e.contains("adaptive.crawler.breaker_max_backoff"), "{e}");
        let c = load("[adaptive.crawler]\nbreaker_backoff = '3s'").unwrap();
        let b = c.adaptive("crawler").unwrap().breaker;
        assert_eq!(b.max_backoff, Duration::from_secs(3));
    }

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("10/s").unwrap(), (10, Duration::from_secs(1)));
        assert_eq!(
            parse_rate(" 60 / min ").unwrap(),
            (60, Duration::from_secs(60))
        );
        assert_eq!(
            parse_rate("1000/h").unwrap(),
            (1000, Duration::from_secs(3600))
        );
        assert!(parse_rate("60").is_err());
        assert!(parse_rate("x/s").is_err());
        assert!(parse_rate("1/fortnight").is_err());
        assert_eq!(
            parse_rate("3/2500us").unwrap(),
            (3, Duration::from_micros(2_500))
        );
    }

    /// A rate period or a span finer than a microsecond was truncated at
    /// load (`"1/1500ns"` refilled every microsecond, `"1500ns"` windows
    /// lasted one): refused, naming the field.
    #[test]
    fn spans_finer_than_a_microsecond_are_refused_at_load() {
        for (toml, field) in [
            (
                "[limiters.x]\nstrategy='token_bucket'\ncapacity=1\nrefill='1/1500ns'",
                "limiters.x.refill",
            ),
            (
                "[limiters.x]\nstrategy='token_bucket'\ncapacity=1\nrefill='1/1.0000005s'",
                "limiters.x.refill",
            ),
            (
                "[limiters.x]\nstrategy='sliding_window'\nlimit=1\nwindow='1500ns'",
                "limiters.x.window",
            ),
        ] {
            let e = err(toml);
            assert!(
                e.contains(field) && e.contains("microseconds"),
                "{toml}: {e}"
            );
        }
        assert!(
            load("[limiters.x]\nstrategy='token_bucket'\ncapacity=1\nrefill='1/1500us'").is_ok()
        );
    }

    #[test]
    fn layers_override_in_order_and_env_wins() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "deploy.toml",
                "[limiters.api]\ncapacity = 50\n[defaults]\ntimeout = '30ms'",
            )?;
            jail.set_env("TOLLGATE_LIMITERS__API__CAPACITY", "75");
            jail.set_env("TOLLGATE_DEFAULTS__FAIL_MODE", "open");
            let c = Config::builder()
                .toml_str("[limiters.api]\nstrategy='token_bucket'\ncapacity=10\nrefill='1/s'")
                .file("deploy.toml")
                .optional_file("absent.toml")
                .env()
                .load()
                .map_err(|e| e.to_string())?;
            let api = c.limiter("api").map_err(|e| e.to_string())?;
            assert_eq!(api.policy.limit(), 75);
            assert_eq!(api.timeout, Duration::from_millis(30));
            assert_eq!(api.fail_mode, FailMode::Open);
            Ok(())
        });
    }

    /// The workspace's own `TOLLGATE_` variables that are not
    /// configuration (the testkit's server binaries, which
    /// `scripts/install-test-deps.sh` asks to export, and the soak tests'
    /// cycle counts) are skipped like `TOLLGATE_KEY_SECRET`: with one
    /// exported, every `.env()` load (the CLI, each example) failed with
    /// `unknown field: found \`valkey_server\``. A misspelt section is
    /// still an error.
    #[test]
    fn the_workspace_s_other_variables_are_not_configuration() {
        figment::Jail::expect_with(|jail| {
            for var in [
                "TOLLGATE_REDIS_SERVER",
                "TOLLGATE_VALKEY_SERVER",
                "TOLLGATE_FAILOVER_CYCLES",
                "TOLLGATE_SOAK_CYCLES",
                "TOLLGATE_REDIS_CHILD",
            ] {
                jail.set_env(var, "/usr/local/bin/x");
            }
            let c = Config::builder()
                .toml_str("[limiters.api]\nstrategy='token_bucket'\ncapacity=10\nrefill='1/s'")
                .env()
                .load()
                .map_err(|e| e.to_string())?;
            assert_eq!(
                c.limiter("api").map_err(|e| e.to_string())?.policy.limit(),
                10
            );
            jail.set_env("TOLLGATE_LIMITER__API__CAPACITY", "5");
            let e = Config::builder().env().load().unwrap_err().to_string();
            assert!(e.contains("limiter"), "{e}");
            Ok(())
        });
    }

    /// `TOLLGATE_` variables are read lower-cased and split at `.`, so
    /// the environment cannot reach a section named with an upper-case
    /// letter or a dot: `TOLLGATE_ADAPTIVE__CRAWLER__MAX_RATE` beside
    /// `[adaptive.Crawler]` loaded as a second section, `crawler`, and the
    /// override the operator set was silently not `Crawler`'s. Such names
    /// are refused at load, naming the section.
    #[test]
    fn a_section_the_environment_cannot_reach_is_refused() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("TOLLGATE_ADAPTIVE__CRAWLER__MAX_RATE", "50");
            let e = Config::builder()
                .toml_str("[adaptive.Crawler]\nmax_rate = 20")
                .env()
                .load()
                .map(|c| {
                    format!(
                        "loaded: Crawler {:?}, crawler {:?}",
                        c.adaptive("Crawler").map(|a| a.max_rate).ok(),
                        c.adaptive("crawler").map(|a| a.max_rate).ok()
                    )
                })
                .unwrap_or_else(|e| e.to_string());
            assert!(e.contains("adaptive.Crawler.name"), "{e}");
            Ok(())
        });
        let tb = "strategy='token_bucket'\ncapacity=1\nrefill='1/s'";
        for name in ["loginIP", "API", "\"a.b\""] {
            let e = err(&format!("[limiters.{name}]\n{tb}"));
            let shown = name.trim_matches('"');
            assert!(
                e.contains(&format!("limiters.{shown}.name")) && e.contains("TOLLGATE_"),
                "{name}: {e}"
            );
            let e = err(&format!("[adaptive.{name}]"));
            assert!(e.contains(&format!("adaptive.{shown}.name")), "{name}: {e}");
        }
        // What the environment can reach loads, from a file or from it.
        assert!(
            load(&format!(
                "[limiters.login_ip-2]\n{tb}\n[adaptive.crawler_1]"
            ))
            .is_ok()
        );
    }

    /// A parse error names the key as configuration spells it, and where
    /// it was written: an `[adaptive.*]` error named a Rust source line
    /// (`in crates/tollgate-limiter/src/aimd.rs:356:48`) instead of the
    /// file, every key carried figment's profile (`default.limiters…`,
    /// read as a `[default]` section), and a variable was shown as
    /// `LIMITERS.API.CAPACTY` rather than as the variable set.
    #[test]
    fn parse_errors_name_the_key_and_where_it_was_written() {
        figment::Jail::expect_with(|jail| {
            let tb = "[limiters.api]\nstrategy='token_bucket'\ncapacity=10\nrefill='1/s'\n";
            jail.create_file("base.toml", tb)?;
            jail.create_file("typo.toml", "[limiters.api]\ncapcity = 5")?;
            jail.create_file("crawler.toml", "[adaptive.crawler]\nmax_rat = 5")?;
            let load = |file: &str| {
                Config::builder()
                    .file("base.toml")
                    .file(file)
                    .env()
                    .load()
                    .unwrap_err()
                    .to_string()
            };
            let e = load("typo.toml");
            assert!(
                e.contains("\"limiters.api.capcity\"") && e.contains("typo.toml"),
                "{e}"
            );
            let e = load("crawler.toml");
            assert!(
                e.contains("\"adaptive.crawler.max_rat\"")
                    && e.contains("crawler.toml")
                    && !e.contains(".rs"),
                "{e}"
            );
            jail.set_env("TOLLGATE_LIMITERS__API__CAPACTY", "5");
            let e = load("base.toml");
            assert!(
                e.contains("limiters.api.capacty") && e.contains("TOLLGATE_LIMITERS__API__CAPACTY"),
                "{e}"
            );
            Ok(())
        });
    }

    /// A prefix or a limiter name with white space at either end, or a
    /// control character, loaded as written: `prefix = "tollgate "` (a
    /// trailing space from a template or an env file) is another
    /// keyspace, so the workers that have it and those that do not count
    /// apart, each allowing the whole limit. Refused, naming the field.
    #[test]
    fn prefixes_and_names_with_stray_white_space_are_refused() {
        let tb = "strategy='token_bucket'\ncapacity=1\nrefill='1/s'";
        for prefix in ["tollgate ", " tollgate", "a\nb", "a\tb"] {
            let toml = format!("[defaults]\nprefix = {prefix:?}\n[limiters.api]\n{tb}");
            let e = load(&toml)
                .map(|c| format!("loaded: prefix {:?}", c.prefix()))
                .unwrap_or_else(|e| e.to_string());
            assert!(e.contains("defaults.prefix"), "{prefix:?}: {e}");
        }
        for name in ["api ", " api", "a\nb"] {
            let e = load(&format!("[limiters.{name:?}]\n{tb}"))
                .map(|_| "loaded".to_owned())
                .unwrap_or_else(|e| e.to_string());
            assert!(e.contains(".name"), "{name:?}: {e}");
            let e = load(&format!("[adaptive.{name:?}]"))
                .map(|_| "loaded".to_owned())
                .unwrap_or_else(|e| e.to_string());
            assert!(e.contains(".name"), "{name:?}: {e}");
        }
        // Inner spaces and any other character are a name like another.
        assert!(
            load(&format!(
                "[defaults]\nprefix = 'svc eu'\n[limiters.\"api v2\"]\n{tb}"
            ))
            .is_ok()
        );
        let built = LimiterBuilder::new(
            "api ".to_owned(),
            Policy::from(TokenBucket::new(1, 1, Duration::from_secs(1)).unwrap()),
            (),
        )
        .check();
        assert_eq!(built.map_err(|(f, _)| f), Err("name"));
    }

    #[test]
    fn bad_env_value_names_the_field() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("TOLLGATE_LIMITERS__API__CAPACITY", "0");
            let e = Config::builder()
                .toml_str("[limiters.api]\nstrategy='token_bucket'\ncapacity=10\nrefill='1/s'")
                .env()
                .load()
                .unwrap_err()
                .to_string();
            assert!(e.contains("limiters.api.capacity"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn missing_file_is_an_error() {
        let e = Config::builder()
            .file("/nonexistent/tollgate.toml")
            .load()
            .unwrap_err();
        assert!(e.to_string().contains("tollgate.toml"), "{e}");
    }

    #[test]
    fn concurrency_loads_and_names_its_fields() {
        let c = load("[limiters.exports]\nstrategy='concurrency'\nmax_in_flight=4\nlease='2m'")
            .unwrap();
        let l = c.limiter("exports").unwrap();
        assert_eq!(
            l.policy,
            Policy::from(Concurrency::new(4, Duration::from_secs(120)).unwrap())
        );
        let e = err("[limiters.x]\nstrategy='concurrency'\nmax_in_flight=0\nlease='1m'");
        assert!(e.contains("limiters.x.max_in_flight"), "{e}");
        let e = err("[limiters.x]\nstrategy='concurrency'\nmax_in_flight=2");
        assert!(e.contains("limiters.x.lease: missing"), "{e}");
        let e = err("[limiters.x]\nstrategy='concurrency'\nmax_in_flight=2\nlease='1m'\nlimit=3");
        assert!(
            e.contains("limiters.x.limit") && e.contains("sliding_window"),
            "{e}"
        );
        let e = err("[limiters.x]\nstrategy='token_bucket'\ncapacity=1\nrefill='1/s'\nlease='1m'");
        assert!(
            e.contains("limiters.x.lease") && e.contains("concurrency"),
            "{e}"
        );
        // A cost is not a number of slots: any cost loads.
        assert!(
            load("[limiters.x]\nstrategy='concurrency'\nmax_in_flight=1\nlease='1s'\ncost=5")
                .is_ok()
        );
    }

    #[test]
    fn mode_defaults_to_enforce_and_the_top_level_switch_shadows_all() {
        let tb = "[limiters.a]\nstrategy='token_bucket'\ncapacity=1\nrefill='1/s'\n\
                  [limiters.b]\nstrategy='token_bucket'\ncapacity=1\nrefill='1/s'\nmode='shadow'\n";
        let c = load(tb).unwrap();
        assert_eq!(c.limiter("a").unwrap().mode, Mode::Enforce);
        assert_eq!(c.limiter("b").unwrap().mode, Mode::Shadow);
        let e = err("[limiters.a]\nstrategy='token_bucket'\ncapacity=1\nrefill='1/s'\nmode='dry'");
        assert!(e.contains("limiters.a.mode"), "{e}");
        let all = Config::builder().toml_str(tb).shadow(true).load().unwrap();
        assert!(all.limiters().all(|l| l.mode == Mode::Shadow));
        let all = load(&format!("shadow = true\n{tb}")).unwrap();
        assert_eq!(all.limiter("a").unwrap().mode, Mode::Shadow);
        figment::Jail::expect_with(|jail| {
            jail.set_env("TOLLGATE_SHADOW", "true");
            let c = Config::builder().toml_str(tb).env().load().unwrap();
            assert_eq!(c.limiter("a").unwrap().mode, Mode::Shadow);
            Ok(())
        });
    }

    #[test]
    fn a_candidate_loads_as_a_policy_table_and_names_its_fields() {
        let c = load(
            r#"
            [limiters.api]
            strategy = "token_bucket"
            capacity = 100
            refill = "60/min"
            [limiters.api.candidate]
            strategy = "sliding_window"
            limit = 50
            window = "1m"
            "#,
        )
        .unwrap();
        let l = c.limiter("api").unwrap();
        assert_eq!(
            l.candidate,
            Some(Policy::from(
                SlidingWindow::new(50, Duration::from_secs(60)).unwrap()
            ))
        );
        assert_eq!(l.policy.strategy(), Strategy::TokenBucket);
        let base = "[limiters.api]\nstrategy='token_bucket'\ncapacity=1\nrefill='1/s'\n";
        let e = err(&format!(
            "{base}[limiters.api.candidate]\nstrategy='sliding_window'\nlimit=0\nwindow='1m'"
        ));
        assert!(e.contains("limiters.api.candidate: candidate.limit"), "{e}");
        let e = err(&format!(
            "{base}[limiters.api.candidate]\nstrategy='token_bucket'\ncapacity=1\nrefill='1/s'\ncost=2"
        ));
        assert!(e.contains("candidate.cost"), "{e}");
        let e = err(&format!(
            "{base}[limiters.api.candidate]\nstrategy='concurrency'\nmax_in_flight=1\nlease='1s'"
        ));
        assert!(e.contains("concurrency"), "{e}");
        assert_eq!(load(base).unwrap().limiter("api").unwrap().candidate, None);
    }

    /// A progressive delay whose failures are forgotten no later than its
    /// longest block ends is refused: such a block ended with the account
    /// fresh, its free attempts back, so `max_delay` never held. With the
    /// login flow (a blocked account records nothing), 5 free attempts,
    /// 1 s doubling to 15 min: 127 guesses in 4 hours with `forget_after`
    /// of 10 or 15 min, 30 with 1 h.
    #[test]
    fn a_delay_forgotten_before_its_longest_block_ends_is_refused() {
        let pd = "[limiters.login]\nstrategy='progressive_delay'\nfree_attempts=5\n\
                  base_delay='1s'\nmax_delay='15m'\n";
        for forget_after in ["1s", "10m", "15m"] {
            let e = load(&format!("{pd}forget_after='{forget_after}'"))
                .map(|c| format!("loaded: {:?}", c.limiter("login").unwrap().policy))
                .unwrap_or_else(|e| e.to_string());
            assert!(
                e.contains("limiters.login.forget_after"),
                "{forget_after}: {e}"
            );
        }
        assert!(load(&format!("{pd}forget_after='16m'")).is_ok());
    }

    /// A candidate that can never grant the limiter's cost (or its
    /// minimum cost) is refused at start-up, as the enforced policy is: it
    /// loaded, and counted every request as one it would refuse, so the
    /// rollout it measures for would refuse them all once enforced.
    #[test]
    fn a_candidate_that_can_never_grant_the_cost_is_refused() {
        let base = "[limiters.api]\nstrategy='token_bucket'\ncapacity=10\nrefill='1/s'\n";
        let small = "[limiters.api.candidate]\nstrategy='token_bucket'\ncapacity=4\nrefill='1/s'";
        for setting in ["cost=5", "min_cost=5"] {
            let e = load(&format!("{base}{setting}\n{small}"))
                .map(|c| format!("loaded: {:?}", c.limiter("api").unwrap().candidate))
                .unwrap_or_else(|e| e.to_string());
            assert!(
                e.contains("limiters.api.candidate: candidate.cost"),
                "{setting}: {e}"
            );
        }
        // A cost the candidate can grant loads.
        assert!(load(&format!("{base}cost=4\n{small}")).is_ok());
    }
}
