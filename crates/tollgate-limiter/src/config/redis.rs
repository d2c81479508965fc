//! The `[redis]` section: where the Redis backend connects and how.
//!
//! The core does not depend on Redis: it reads and validates the section
//! into a plain [`RedisConfig`], and the Redis backend applies it
//! (`tollgate_redis::RedisBackend::from_config`). URLs are passed through
//! as written, so any form the backend's builder accepts works here.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use figment::value::magic::RelativePathBuf;
use serde::{Deserialize, Serialize};

use super::{ConfigError, opt_duration};

/// The values `redis.durability` accepts.
pub const DURABILITY_MODES: [&str; 3] = ["report", "strict", "skip"];

/// The largest `redis.pool_size`: far above any useful one (a single
/// connection is the fastest measured, see `docs/benchmarks.md`), and
/// below what a server accepts (`maxclients`, 10000 by default) from a few
/// workers. Every connection is opened at start-up (or a slot made for it).
const MAX_POOL_SIZE: u32 = 1024;

/// `redis.cluster` as written: `true`/`false`, a list of node URLs, or
/// one string of comma-separated node URLs (handy in an environment
/// variable).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub(super) enum RawCluster {
    Enabled(bool),
    Nodes(Vec<String>),
    Text(String),
}

/// `[redis]` as written: every field optional, so layers can each set a
/// few.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRedis {
    url: Option<String>,
    cluster: Option<RawCluster>,
    pool_size: Option<u32>,
    exclusive_checkout: Option<bool>,
    test_on_check_out: Option<bool>,
    pool_timeout: Option<String>,
    connect_timeout: Option<String>,
    response_timeout: Option<String>,
    override_cache_ttl: Option<String>,
    durability: Option<String>,
    // Each remembers the file it was written in, if any (see `tls_file`).
    tls_ca_file: Option<RelativePathBuf>,
    tls_client_cert_file: Option<RelativePathBuf>,
    tls_client_key_file: Option<RelativePathBuf>,
}

/// The validated `[redis]` section. A field left out (`None`) keeps the
/// backend's default.
///
/// ```toml
/// [redis]
/// url = "rediss://limiter:secret@redis.internal:6380/0"
/// cluster = false            # true: `url` is one node of a cluster;
///                            # or a list of node URLs
/// connect_timeout = "500ms"
/// response_timeout = "500ms"
/// pool_size = 1
/// durability = "strict"      # report (default), strict or skip
/// tls_ca_file = "/etc/ssl/redis-ca.pem"
/// tls_client_cert_file = "/etc/tollgate/redis-client.crt"   # mutual TLS: both
/// tls_client_key_file = "/etc/tollgate/redis-client.key"    # or neither
/// ```
///
/// A relative TLS file path written in a configuration file is relative to
/// that file's directory: `tls_ca_file = "certs/ca.pem"` in
/// `/etc/svc/limits.toml` loads as `/etc/svc/certs/ca.pem`, wherever the
/// service is started (see [`tls_ca_file`](Self::tls_ca_file)).
///
/// Its `Debug` output hides any password in the URLs.
#[derive(Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RedisConfig {
    /// The server's URL, or a cluster's node URLs; empty when the
    /// configuration names none (a caller may then supply one, e.g. the
    /// CLI's `--redis-url`).
    pub urls: Vec<String>,
    /// Whether [`urls`](Self::urls) are nodes of a Redis Cluster.
    pub cluster: bool,
    /// The number of multiplexed connections (1 to 1024).
    pub pool_size: Option<u32>,
    /// Whether a call holds a connection for its whole round trip.
    pub exclusive_checkout: Option<bool>,
    /// Whether every checkout sends a `PING`.
    pub test_on_check_out: Option<bool>,
    /// With exclusive checkout: how long a call waits for a connection.
    pub pool_timeout: Option<Duration>,
    /// How long one connection attempt may take.
    pub connect_timeout: Option<Duration>,
    /// How long a connection may leave a request unanswered before it is
    /// replaced.
    pub response_timeout: Option<Duration>,
    /// How long the client caches what it read of a limiter's overrides:
    /// the limiter-wide override and whether any key has one (the bound on
    /// how late another worker's limiter-wide override, or a limiter's first
    /// per-key override, reaches this one; see the Redis backend's docs).
    pub override_cache_ttl: Option<Duration>,
    /// The durability check at start-up: one of [`DURABILITY_MODES`].
    pub durability: Option<String>,
    /// A PEM file of the only CA trusted for `rediss://` servers (with
    /// `rediss+sentinel://`: the sentinels and the servers they name).
    ///
    /// Relative paths, here and in the two fields below: loaded from a
    /// configuration file, one is joined to the file's directory and made
    /// absolute; from an environment variable or a
    /// [`toml_str`](crate::ConfigBuilder::toml_str) layer it is kept as
    /// written, and so read relative to the working directory of the
    /// process when the backend opens it. A path set in code is used as
    /// it is.
    pub tls_ca_file: Option<PathBuf>,
    /// A PEM file of the client certificate (then any intermediates)
    /// presented on every TLS connection (mutual TLS); set with
    /// [`tls_client_key_file`](Self::tls_client_key_file) or not at all.
    pub tls_client_cert_file: Option<PathBuf>,
    /// A PEM file of the private key of
    /// [`tls_client_cert_file`](Self::tls_client_cert_file); readable by
    /// the service only.
    pub tls_client_key_file: Option<PathBuf>,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts: Vec<&str> = self
            .urls
            .iter()
            .map(|u| u.rsplit('@').next().unwrap_or(u))
            .collect();
        f.debug_struct("RedisConfig")
            .field("hosts", &hosts)
            .field("cluster", &self.cluster)
            .field("pool_size", &self.pool_size)
            .field("exclusive_checkout", &self.exclusive_checkout)
            .field("test_on_check_out", &self.test_on_check_out)
            .field("pool_timeout", &self.pool_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("override_cache_ttl", &self.override_cache_ttl)
            .field("durability", &self.durability)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_client_cert_file", &self.tls_client_cert_file)
            .field("tls_client_key_file", &self.tls_client_key_file)
            .finish()
    }
}

/// An error about `redis.<field>`.
pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        path: "redis".into(),
        field,
        reason: reason.into(),
    }
}

impl RawRedis {
    pub(super) fn validate(self) -> Result<RedisConfig, ConfigError> {
        let url = match self.url {
            Some(u) if u.trim().is_empty() => return Err(invalid("url", "is empty")),
            u => u.map(|u| u.trim().to_owned()),
        };
        // A quoted boolean would read as one node URL, "true".
        if let Some(RawCluster::Text(t)) = &self.cluster
            && ["true", "false"].contains(&t.trim().to_ascii_lowercase().as_str())
        {
            return Err(invalid(
                "cluster",
                format!(
                    "{t:?} is a string: write cluster = {} without quotes, or list the \
                     nodes' URLs",
                    t.trim().to_ascii_lowercase()
                ),
            ));
        }
        let (urls, cluster) = match (self.cluster, url) {
            (None | Some(RawCluster::Enabled(false)), url) => (url.into_iter().collect(), false),
            (Some(RawCluster::Enabled(true)), url) => (url.into_iter().collect(), true),
            (Some(RawCluster::Nodes(_) | RawCluster::Text(_)), Some(_)) => {
                return Err(invalid(
                    "cluster",
                    "a node list and redis.url both given: list every node here, or give one \
                     node in redis.url with cluster = true",
                ));
            }
            (Some(RawCluster::Nodes(nodes)), None) => (nodes, true),
            (Some(RawCluster::Text(text)), None) => {
                (text.split(',').map(str::to_owned).collect(), true)
            }
        };
        let urls: Vec<String> = urls.iter().map(|u| u.trim().to_owned()).collect();
        if cluster && urls.iter().any(String::is_empty) {
            return Err(invalid("cluster", "a node URL is empty"));
        }
        if let Some(n) = self.pool_size
            && !(1..=MAX_POOL_SIZE).contains(&n)
        {
            return Err(invalid(
                "pool_size",
                format!("{n}: must be from 1 to {MAX_POOL_SIZE}"),
            ));
        }
        let positive = |field: &'static str, v: Option<String>| {
            let d = opt_duration(v.as_deref()).map_err(|e| invalid(field, e))?;
            if d.is_some_and(|d| d.is_zero()) {
                return Err(invalid(field, "must be above zero"));
            }
            Ok(d)
        };
        let durability = match self.durability {
            None => None,
            Some(d) => {
                let d = d.trim().to_ascii_lowercase();
                if !DURABILITY_MODES.contains(&d.as_str()) {
                    return Err(invalid(
                        "durability",
                        format!("unknown mode {d:?}; expected report, strict or skip"),
                    ));
                }
                Some(d)
            }
        };
        let tls_ca_file = tls_file("tls_ca_file", self.tls_ca_file)?;
        let tls_client_cert_file = tls_file("tls_client_cert_file", self.tls_client_cert_file)?;
        let tls_client_key_file = tls_file("tls_client_key_file", self.tls_client_key_file)?;
        // One without the other is a half-configured mutual TLS: name the
        // missing one.
        match (&tls_client_cert_file, &tls_client_key_file) {
            (Some(_), None) => {
                return Err(invalid(
                    "tls_client_key_file",
                    "missing: tls_client_cert_file is set, and a client certificate needs its \
                     private key",
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "tls_client_cert_file",
                    "missing: tls_client_key_file is set, and a private key needs its \
                     certificate",
                ));
            }
            _ => {}
        }
        Ok(RedisConfig {
            urls,
            cluster,
            pool_size: self.pool_size,
            exclusive_checkout: self.exclusive_checkout,
            test_on_check_out: self.test_on_check_out,
            pool_timeout: positive("pool_timeout", self.pool_timeout)?,
            connect_timeout: positive("connect_timeout", self.connect_timeout)?,
            response_timeout: positive("response_timeout", self.response_timeout)?,
            // Zero is meaningful: read the override on every decision.
            override_cache_ttl: opt_duration(self.override_cache_ttl.as_deref())
                .map_err(|e| invalid("override_cache_ttl", e))?,
            durability,
            tls_ca_file,
            tls_client_cert_file,
            tls_client_key_file,
        })
    }
}

/// `redis.<field>`, a TLS file, as it is to be opened: written in a
/// configuration file (figment's metadata, which [`RelativePathBuf`]
/// keeps, names it), joined to the file's directory and made absolute
/// (a relative file path was read against the working directory of now,
/// which the process may leave before the backend opens the TLS file);
/// from anywhere else, as written.
fn tls_file(
    field: &'static str,
    path: Option<RelativePathBuf>,
) -> Result<Option<PathBuf>, ConfigError> {
    let Some(path) = path else { return Ok(None) };
    if path.original().as_os_str().is_empty() {
        return Err(invalid(field, "is empty"));
    }
    if path.metadata_path().is_none() {
        return Ok(Some(path.original().to_owned()));
    }
    let resolved = path.relative();
    // `absolute` fails only without a working directory (removed under
    // the process): the joined path is still right for now.
    Ok(Some(std::path::absolute(&resolved).unwrap_or(resolved)))
}

#[cfg(test)]
// figment's Jail closures return its large error type; that is its API.
#[allow(clippy::result_large_err)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::Config;

    fn load(toml: &str) -> Result<Config, ConfigError> {
        Config::builder().toml_str(toml).load()
    }

    fn section(toml: &str) -> RedisConfig {
        load(toml)
            .unwrap()
            .redis()
            .cloned()
            .expect("a [redis] section")
    }

    fn err(toml: &str) -> String {
        load(toml).unwrap_err().to_string()
    }

    #[test]
    fn absent_section_is_none() {
        assert!(load("").unwrap().redis().is_none());
    }

    #[test]
    fn every_field_loads() {
        let r = section(
            r#"
            [redis]
            url = "rediss://u:p@h:6380/2"
            pool_size = 3
            exclusive_checkout = true
            test_on_check_out = true
            pool_timeout = "2s"
            connect_timeout = "250ms"
            response_timeout = "1s"
            override_cache_ttl = "0s"
            durability = "Strict"
            tls_ca_file = "/etc/ca.pem"
            tls_client_cert_file = "/etc/client.crt"
            tls_client_key_file = "/etc/client.key"
            "#,
        );
        assert_eq!(r.urls, ["rediss://u:p@h:6380/2"]);
        assert!(!r.cluster);
        assert_eq!(r.pool_size, Some(3));
        assert_eq!(r.exclusive_checkout, Some(true));
        assert_eq!(r.test_on_check_out, Some(true));
        assert_eq!(r.pool_timeout, Some(Duration::from_secs(2)));
        assert_eq!(r.connect_timeout, Some(Duration::from_millis(250)));
        assert_eq!(r.response_timeout, Some(Duration::from_secs(1)));
        assert_eq!(r.override_cache_ttl, Some(Duration::ZERO));
        assert_eq!(r.durability.as_deref(), Some("strict"));
        assert_eq!(r.tls_ca_file, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(
            r.tls_client_cert_file,
            Some(PathBuf::from("/etc/client.crt"))
        );
        assert_eq!(
            r.tls_client_key_file,
            Some(PathBuf::from("/etc/client.key"))
        );
        let shown = format!("{r:?}");
        assert!(
            !shown.contains(":p@") && shown.contains("h:6380"),
            "{shown}"
        );
    }

    #[test]
    fn cluster_forms() {
        let r = section("[redis]\nurl = 'redis://a:1'\ncluster = true");
        assert_eq!((r.urls, r.cluster), (vec!["redis://a:1".to_owned()], true));
        let r = section("[redis]\ncluster = ['redis://a:1', 'redis://b:2']");
        assert_eq!(r.urls, ["redis://a:1", "redis://b:2"]);
        assert!(r.cluster);
        let r = section("[redis]\ncluster = 'redis://a:1, redis://b:2'");
        assert_eq!(r.urls, ["redis://a:1", "redis://b:2"]);
        let r = section("[redis]\nurl = 'redis://a:1'\ncluster = false");
        assert!(!r.cluster);
        // Sentinel and other forms are the backend's business: passed through.
        let r = section("[redis]\nurl = 'redis+sentinel://s1:26379/mymaster'");
        assert_eq!(r.urls, ["redis+sentinel://s1:26379/mymaster"]);
    }

    #[test]
    fn errors_name_the_field() {
        for (toml, field) in [
            ("url = ''", "redis.url"),
            (
                "url = 'redis://a'\ncluster = ['redis://b']",
                "redis.cluster",
            ),
            ("cluster = ['redis://b', ' ']", "redis.cluster"),
            ("cluster = 3", "redis.cluster"),
            ("pool_size = 0", "redis.pool_size"),
            ("pool_size = -1", "redis.pool_size"),
            // Loaded: `build` then opened connections until the server
            // refused, and `build_lazy` allocated 2^32 slots.
            ("pool_size = 4294967295", "redis.pool_size"),
            ("connect_timeout = '0s'", "redis.connect_timeout"),
            ("response_timeout = 'soon'", "redis.response_timeout"),
            ("response_timeout = 5", "redis.response_timeout"),
            ("pool_timeout = '0ms'", "redis.pool_timeout"),
            ("override_cache_ttl = 'x'", "redis.override_cache_ttl"),
            ("durability = 'maybe'", "redis.durability"),
            ("tls_ca_file = ''", "redis.tls_ca_file"),
            ("tls_ca_file = 5", "key \"redis.tls_ca_file\""),
            ("tls_ca_file = ['a']", "key \"redis.tls_ca_file\""),
            (
                "tls_client_cert_file = ''\ntls_client_key_file = 'k'",
                "redis.tls_client_cert_file: is empty",
            ),
            (
                "tls_client_cert_file = 'c'\ntls_client_key_file = ''",
                "redis.tls_client_key_file: is empty",
            ),
            (
                "tls_client_cert_file = '/etc/client.crt'",
                "redis.tls_client_key_file: missing",
            ),
            (
                "tls_client_key_file = '/etc/client.key'",
                "redis.tls_client_cert_file: missing",
            ),
            ("ulr = 'redis://a'", "redis.ulr"),
        ] {
            let e = err(&format!("[redis]\n{toml}"));
            assert!(e.contains(field), "{toml}: {e}");
        }
    }

    /// `cluster = "true"` (quoted, as durations are) was read as a list of
    /// one node URL, `true`: cluster mode on, and the start-up error named
    /// `redis.url`, a field not set (`cluster = "false"` turned cluster
    /// mode on). Refused at load, naming `redis.cluster`.
    #[test]
    fn a_quoted_boolean_cluster_is_refused() {
        for text in ["true", "false", " False "] {
            let e = load(&format!("[redis]\ncluster = '{text}'"))
                .map(|c| format!("loaded: {:?}", c.redis()))
                .unwrap_or_else(|e| e.to_string());
            assert!(
                e.contains("redis.cluster") && e.contains("without quotes"),
                "{text}: {e}"
            );
        }
        let e = err("[redis]\nurl = 'redis://a:1'\ncluster = 'true'");
        assert!(e.contains("without quotes"), "{e}");
        // The environment reads `true` as a boolean: it loads.
        figment::Jail::expect_with(|jail| {
            jail.set_env("TOLLGATE_REDIS__URL", "redis://a:1");
            jail.set_env("TOLLGATE_REDIS__CLUSTER", "true");
            let c = Config::builder().env().load().map_err(|e| e.to_string())?;
            assert!(c.redis().unwrap().cluster);
            Ok(())
        });
    }

    #[test]
    fn env_overrides_the_file() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "deploy.toml",
                "[redis]\nurl = 'redis://file:6379'\nresponse_timeout = '1s'\npool_size = 2",
            )?;
            jail.set_env("TOLLGATE_REDIS__URL", "redis://u:p@env:6380/1");
            jail.set_env("TOLLGATE_REDIS__RESPONSE_TIMEOUT", "250ms");
            jail.set_env("TOLLGATE_REDIS__DURABILITY", "skip");
            let c = Config::builder()
                .file("deploy.toml")
                .env()
                .load()
                .map_err(|e| e.to_string())?;
            let r = c.redis().unwrap();
            assert_eq!(r.urls, ["redis://u:p@env:6380/1"]);
            assert_eq!(r.response_timeout, Some(Duration::from_millis(250)));
            assert_eq!(r.pool_size, Some(2));
            assert_eq!(r.durability.as_deref(), Some("skip"));
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.set_env("TOLLGATE_REDIS__TLS_CLIENT_CERT_FILE", "/run/c.crt");
            jail.set_env("TOLLGATE_REDIS__TLS_CLIENT_KEY_FILE", "/run/c.key");
            let c = Config::builder().env().load().map_err(|e| e.to_string())?;
            let r = c.redis().unwrap();
            assert_eq!(r.tls_client_cert_file, Some(PathBuf::from("/run/c.crt")));
            assert_eq!(r.tls_client_key_file, Some(PathBuf::from("/run/c.key")));
            // One alone, from the environment too.
            jail.set_env("TOLLGATE_REDIS__TLS_CLIENT_KEY_FILE", "");
            let e = Config::builder().env().load().unwrap_err().to_string();
            assert!(e.contains("redis.tls_client_key_file"), "{e}");
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.set_env("TOLLGATE_REDIS__CLUSTER", "redis://a:1,redis://b:2");
            let c = Config::builder().env().load().map_err(|e| e.to_string())?;
            let r = c.redis().unwrap();
            assert_eq!((r.urls.len(), r.cluster), (2, true));
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.set_env("TOLLGATE_REDIS__URL", "redis://a:1");
            jail.set_env("TOLLGATE_REDIS__CLUSTER", "true");
            jail.set_env("TOLLGATE_REDIS__POOL_SIZE", "4");
            let c = Config::builder().env().load().map_err(|e| e.to_string())?;
            let r = c.redis().unwrap();
            assert!(r.cluster);
            assert_eq!(r.pool_size, Some(4));
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.set_env("TOLLGATE_REDIS__CONNECT_TIMEOUT", "0s");
            let e = Config::builder().env().load().unwrap_err().to_string();
            assert!(e.contains("redis.connect_timeout"), "{e}");
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            // A path that is not a string names the variable as it is set.
            jail.set_env("TOLLGATE_REDIS__TLS_CA_FILE", "5");
            let e = Config::builder().env().load().unwrap_err().to_string();
            assert!(
                e.contains("\"redis.tls_ca_file (TOLLGATE_REDIS__TLS_CA_FILE)\""),
                "{e}"
            );
            Ok(())
        });
    }

    /// A relative TLS path written in a configuration file is relative to
    /// the file, not to the working directory: the same
    /// `/etc/svc/limits.toml` loaded with `tls_ca_file = "certs/ca.pem"`
    /// read `./certs/ca.pem`, so it worked or not depending on where the
    /// service was started. It loads as an absolute path next to the
    /// file, which still opens after the process changes directory.
    #[test]
    fn a_relative_tls_path_in_a_file_is_relative_to_the_file() {
        figment::Jail::expect_with(|jail| {
            jail.create_dir("etc/svc/certs")?;
            jail.create_dir("elsewhere/deeper")?;
            jail.create_file("etc/svc/certs/ca.pem", "the CA")?;
            jail.create_file("etc/client.crt", "the certificate")?;
            jail.create_file(
                "etc/svc/limits.toml",
                "[redis]\ntls_ca_file = 'certs/ca.pem'\n\
                 tls_client_cert_file = '../client.crt'\ntls_client_key_file = '/run/c.key'",
            )?;
            let file = jail.directory().join("etc/svc/limits.toml");
            for (cwd, path) in [
                (".", PathBuf::from("etc/svc/limits.toml")),
                ("elsewhere", file),
                ("elsewhere", PathBuf::from("../etc/svc/limits.toml")),
                ("etc/svc", PathBuf::from("limits.toml")),
            ] {
                jail.change_dir(jail.directory().join(cwd))?;
                let c = Config::builder()
                    .file(&path)
                    .load()
                    .map_err(|e| e.to_string())?;
                // Opened from another directory than the one it was
                // loaded in.
                jail.change_dir(jail.directory().join("elsewhere/deeper"))?;
                let r = c.redis().unwrap();
                let (ca, cert) = (
                    r.tls_ca_file.clone().unwrap(),
                    r.tls_client_cert_file.clone().unwrap(),
                );
                assert!(
                    ca.is_absolute() && cert.is_absolute(),
                    "{cwd} {path:?}: {r:?}"
                );
                assert_eq!(std::fs::read_to_string(&ca).unwrap(), "the CA", "{ca:?}");
                assert_eq!(
                    std::fs::read_to_string(&cert).unwrap(),
                    "the certificate",
                    "{cert:?}"
                );
                assert_eq!(r.tls_client_key_file, Some(PathBuf::from("/run/c.key")));
            }
            Ok(())
        });
    }

    /// From an environment variable or a TOML string given in code, a
    /// relative path has no file to be relative to: it is kept as
    /// written, relative to the working directory. A variable overriding
    /// a file's path is read the variable's way; the file's other paths
    /// stay relative to the file.
    #[test]
    fn a_relative_tls_path_from_elsewhere_stays_as_written() {
        let r = section("[redis]\ntls_ca_file = 'certs/ca.pem'");
        assert_eq!(r.tls_ca_file, Some(PathBuf::from("certs/ca.pem")));
        figment::Jail::expect_with(|jail| {
            jail.create_dir("conf")?;
            jail.create_file(
                "conf/limits.toml",
                "[redis]\ntls_ca_file = 'ca.pem'\ntls_client_cert_file = 'c.crt'",
            )?;
            jail.set_env("TOLLGATE_REDIS__TLS_CA_FILE", "certs/ca.pem");
            jail.set_env("TOLLGATE_REDIS__TLS_CLIENT_KEY_FILE", "c.key");
            let c = Config::builder()
                .file("conf/limits.toml")
                .env()
                .load()
                .map_err(|e| e.to_string())?;
            let r = c.redis().unwrap();
            let conf = std::env::current_dir().unwrap().join("conf");
            assert_eq!(r.tls_ca_file, Some(PathBuf::from("certs/ca.pem")));
            assert_eq!(r.tls_client_cert_file, Some(conf.join("c.crt")));
            assert_eq!(r.tls_client_key_file, Some(PathBuf::from("c.key")));
            Ok(())
        });
    }

    #[test]
    fn a_url_layer_wins_over_earlier_layers_only() {
        let base = "[redis]\nurl = 'redis://file:1'\npool_size = 2";
        let c = Config::builder()
            .toml_str(base)
            .redis_url("redis://flag:2")
            .load()
            .unwrap();
        let r = c.redis().unwrap();
        assert_eq!(
            (r.urls.as_slice(), r.pool_size),
            (&["redis://flag:2".to_owned()][..], Some(2))
        );
        let c = Config::builder()
            .redis_url("redis://flag:2")
            .toml_str(base)
            .load()
            .unwrap();
        assert_eq!(c.redis().unwrap().urls, ["redis://file:1"]);
        let c = Config::builder()
            .redis_url("redis://only:3")
            .load()
            .unwrap();
        assert_eq!(c.redis().unwrap().urls, ["redis://only:3"]);
    }

    /// A TOML value of any shape: strings that look like durations, URLs,
    /// modes or nothing, numbers, booleans and lists.
    fn value() -> impl Strategy<Value = String> {
        let word = prop_oneof![
            Just(String::new()),
            Just("0s".to_owned()),
            Just("500ms".to_owned()),
            Just("redis://127.0.0.1:6379".to_owned()),
            Just("strict".to_owned()),
            "[a-z0-9:/.@, +-]{0,24}",
        ];
        prop_oneof![
            word.clone().prop_map(|w| format!("\"{w}\"")),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<bool>().prop_map(|b| b.to_string()),
            prop::collection::vec(word, 0..3).prop_map(|ws| {
                let items: Vec<String> = ws.iter().map(|w| format!("\"{w}\"")).collect();
                format!("[{}]", items.join(", "))
            }),
        ]
    }

    const FIELDS: [&str; 14] = [
        "url",
        "cluster",
        "pool_size",
        "exclusive_checkout",
        "test_on_check_out",
        "pool_timeout",
        "connect_timeout",
        "response_timeout",
        "override_cache_ttl",
        "durability",
        "tls_ca_file",
        "tls_client_cert_file",
        "tls_client_key_file",
        "unknown_knob",
    ];

    proptest! {
        /// Any values in `[redis]`: never a panic; either a configuration
        /// or an error that names a `redis.` field.
        #[test]
        fn any_section_loads_or_names_a_redis_field(
            fields in prop::collection::btree_map(0..FIELDS.len(), value(), 0..6)
        ) {
            let mut toml = String::from("[redis]\n");
            for (i, v) in &fields {
                toml.push_str(&format!("{} = {v}\n", FIELDS[*i]));
            }
            match load(&toml) {
                Ok(c) => prop_assert!(c.redis().is_some()),
                Err(e) => {
                    let e = e.to_string();
                    prop_assert!(e.contains("redis."), "{toml}: {e}");
                }
            }
        }
    }
}
