//! Building a backend from the configuration's `[redis]` section.

use tollgate_limiter::{Config, ConfigError};

use crate::{Durability, RedisBackend, RedisBackendBuilder, RedisError};

/// An error about `redis.<field>`.
fn invalid(field: &'static str, reason: impl Into<String>) -> RedisError {
    RedisError::Config(ConfigError::Invalid {
        path: "redis".into(),
        field,
        reason: reason.into(),
    })
}

/// Why a URL the redis client refused is unusable, naming the node of a
/// list (by position: a URL may hold a password). The client's error was
/// shown as `redis command failed: Redis URL did not parse -
/// InvalidClientConfig`, though no command had been sent.
fn unparsable(urls: &[String], e: &redis::RedisError) -> String {
    let reason = |e: &redis::RedisError| {
        format!(
            "invalid redis URL: {} (expected redis://[[user]:password@]host[:port][/db], \
             rediss://…, unix:///path or redis+sentinel://host[:port][,…]/<master-name>)",
            e.to_string().replace(" - InvalidClientConfig", "")
        )
    };
    if urls.len() > 1 {
        for (i, url) in urls.iter().enumerate() {
            if let Err(e) = redis::IntoConnectionInfo::into_connection_info(url.as_str()) {
                return format!("node {} of {}: {}", i + 1, urls.len(), reason(&e));
            }
        }
    }
    reason(e)
}

impl RedisBackend {
    /// A builder set up from configuration: the `[redis]` section
    /// ([`RedisConfig`](tollgate_limiter::RedisConfig)) and
    /// `defaults.prefix`. Settings the section leaves out keep the
    /// builder's defaults; the builder can still be adjusted before
    /// [`build`](RedisBackendBuilder::build).
    ///
    /// Checks what can be checked without the network, so a bad setting
    /// stops the start-up with [`RedisError::Config`] naming the field
    /// (`redis.url: missing`, an unparsable URL, an unreadable
    /// `tls_ca_file`, a cluster, `rediss://` or `rediss+sentinel://` URL
    /// this build has no feature for). A `tls_ca_file` is the only CA
    /// trusted for `rediss://`, a cluster's `rediss://` nodes, and with
    /// `rediss+sentinel://` for the sentinels and the servers they name.
    /// `tls_client_cert_file` and `tls_client_key_file` are the client
    /// certificate presented to each of them
    /// ([`tls_client_cert`](RedisBackendBuilder::tls_client_cert)); a file
    /// that cannot be read, holds no PEM certificate or key, or a key that
    /// is not the certificate's, is an error naming the field and the path,
    /// and so is a client certificate with a URL that is not TLS.
    /// URLs are passed to the builder as written.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tollgate_limiter::Config;
    /// use tollgate_redis::RedisBackend;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = Config::builder()
    ///     .toml_str("[redis]\nurl = \"redis://127.0.0.1:6379\"\nresponse_timeout = \"250ms\"")
    ///     .env() // TOLLGATE_REDIS__URL=rediss://… in production
    ///     .load()?;
    /// let backend = RedisBackend::from_config(&config).await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder_from_config(config: &Config) -> Result<RedisBackendBuilder, RedisError> {
        let r = config.redis().cloned().unwrap_or_default();
        let url_field = if r.cluster && r.urls.len() > 1 {
            "cluster"
        } else {
            "url"
        };
        let mut b = match (r.cluster, r.urls.as_slice()) {
            (_, []) => {
                return Err(invalid(
                    "url",
                    "missing: set redis.url (TOLLGATE_REDIS__URL), or list a cluster's nodes in \
                     redis.cluster",
                ));
            }
            (false, [url]) => RedisBackend::builder(url.clone()),
            (false, _) => return Err(invalid("url", "several URLs need cluster = true")),
            (true, urls) => cluster_builder(urls)?,
        };
        b = b.prefix(config.prefix());
        if let Some(v) = r.pool_size {
            b = b.pool_size(v);
        }
        if let Some(v) = r.exclusive_checkout {
            b = b.exclusive_checkout(v);
        }
        if let Some(v) = r.test_on_check_out {
            b = b.test_on_check_out(v);
        }
        if let Some(v) = r.pool_timeout {
            b = b.pool_timeout(v);
        }
        if let Some(v) = r.connect_timeout {
            b = b.connect_timeout(v);
        }
        if let Some(v) = r.response_timeout {
            b = b.response_timeout(v);
        }
        if let Some(v) = r.override_cache_ttl {
            b = b.override_cache_ttl(v);
        }
        if let Some(mode) = &r.durability {
            b = b.durability(match mode.as_str() {
                "report" => Durability::Report,
                "strict" => Durability::Strict,
                "skip" => Durability::Skip,
                other => return Err(invalid("durability", format!("unknown mode {other:?}"))),
            });
        }
        if let Some(path) = &r.tls_ca_file {
            b = tls_ca_file(b, path)?;
        }
        // The core checked that both or neither are set.
        if let (Some(cert), Some(key)) = (&r.tls_client_cert_file, &r.tls_client_key_file) {
            b = tls_client_files(b, cert, key)?;
        }
        // Parse the URLs now (no I/O), so a typo stops the start-up here
        // rather than at the first connection.
        b.check()
            .and_then(|()| b.connector().map(drop))
            .map_err(|e| match e {
                // The files were checked above: what is left is a URL
                // that is not TLS, named by the setting that needs TLS.
                RedisError::InvalidClientCert(why) => invalid("tls_client_cert_file", why),
                RedisError::Redis(e) if e.kind() == redis::ErrorKind::InvalidClientConfig => {
                    invalid(url_field, unparsable(&r.urls, &e))
                }
                e => invalid(url_field, tollgate_limiter::error::chain(&e)),
            })?;
        Ok(b)
    }

    /// Connects with [`builder_from_config`](Self::builder_from_config)'s
    /// settings: what a service calls at start-up.
    pub async fn from_config(config: &Config) -> Result<RedisBackend, RedisError> {
        Self::builder_from_config(config)?.build().await
    }
}

#[cfg(feature = "cluster")]
fn cluster_builder(urls: &[String]) -> Result<RedisBackendBuilder, RedisError> {
    Ok(RedisBackend::cluster_builder(urls.iter().cloned()))
}

#[cfg(not(feature = "cluster"))]
fn cluster_builder(_: &[String]) -> Result<RedisBackendBuilder, RedisError> {
    Err(invalid(
        "cluster",
        "Redis Cluster needs tollgate-redis's `cluster` feature",
    ))
}

#[cfg(feature = "tls")]
fn tls_ca_file(
    b: RedisBackendBuilder,
    path: &std::path::Path,
) -> Result<RedisBackendBuilder, RedisError> {
    Ok(b.tls_root_cert(read("tls_ca_file", path)?))
}

/// Reads `field`'s file: an error names the field and the path.
#[cfg(feature = "tls")]
fn read(field: &'static str, path: &std::path::Path) -> Result<Vec<u8>, RedisError> {
    std::fs::read(path).map_err(|e| invalid(field, format!("{}: {e}", path.display())))
}

#[cfg(feature = "tls")]
fn tls_client_files(
    b: RedisBackendBuilder,
    cert_path: &std::path::Path,
    key_path: &std::path::Path,
) -> Result<RedisBackendBuilder, RedisError> {
    let cert = read("tls_client_cert_file", cert_path)?;
    let key = read("tls_client_key_file", key_path)?;
    crate::tls::check_client_cert(&cert, &key).map_err(|(part, why)| match part {
        crate::tls::Part::Cert => invalid(
            "tls_client_cert_file",
            format!("{}: {why}", cert_path.display()),
        ),
        crate::tls::Part::Key => invalid(
            "tls_client_key_file",
            format!("{}: {why}", key_path.display()),
        ),
    })?;
    Ok(b.tls_client_cert(cert, key))
}

#[cfg(not(feature = "tls"))]
fn tls_client_files(
    _: RedisBackendBuilder,
    _: &std::path::Path,
    _: &std::path::Path,
) -> Result<RedisBackendBuilder, RedisError> {
    Err(invalid(
        "tls_client_cert_file",
        "TLS needs tollgate-redis's `tls` feature",
    ))
}

#[cfg(not(feature = "tls"))]
fn tls_ca_file(
    _: RedisBackendBuilder,
    _: &std::path::Path,
) -> Result<RedisBackendBuilder, RedisError> {
    Err(invalid(
        "tls_ca_file",
        "TLS needs tollgate-redis's `tls` feature",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder(toml: &str) -> Result<RedisBackendBuilder, String> {
        let config = Config::builder().toml_str(toml).load().unwrap();
        RedisBackend::builder_from_config(&config).map_err(|e| e.to_string())
    }

    #[test]
    fn settings_reach_the_builder() {
        let b = builder(
            "[defaults]\nprefix = 'svc'\n[redis]\nurl = 'redis://u:pw@h:1/2'\npool_size = 3\n\
             connect_timeout = '1s'\nresponse_timeout = '2s'\ndurability = 'strict'\n\
             exclusive_checkout = true\npool_timeout = '3s'\noverride_cache_ttl = '4s'",
        )
        .unwrap();
        let shown = format!("{b:?}");
        for want in [
            "\"h:1/2\"",
            "prefix: \"svc\"",
            "pool_size: 3",
            "exclusive_checkout: true",
            "pool_timeout: 3s",
            "connect_timeout: 1s",
            "response_timeout: 2s",
            "durability: Strict",
            "override_cache_ttl: 4s",
            "cluster: false",
        ] {
            assert!(shown.contains(want), "{want} in {shown}");
        }
        assert!(!shown.contains("pw"), "{shown}");
        let b = builder("[redis]\ncluster = ['redis://a:1', 'redis://b:2']").unwrap();
        assert!(format!("{b:?}").contains("cluster: true"));
    }

    #[test]
    fn errors_name_the_field() {
        for (toml, field) in [
            ("", "redis.url: missing"),
            ("[redis]\npool_size = 2", "redis.url: missing"),
            ("[redis]\ncluster = true", "redis.url: missing"),
            ("[redis]\nurl = 'http://h:1'", "redis.url"),
            ("[redis]\nurl = 'not a url'", "redis.url"),
            ("[redis]\ncluster = 'redis://a:1,nonsense'", "redis.cluster"),
            (
                "[redis]\nurl = 'rediss://h:1'\ntls_ca_file = '/nonexistent/ca.pem'",
                "redis.tls_ca_file",
            ),
        ] {
            let e = builder(toml).unwrap_err();
            assert!(e.contains(field), "{toml}: {e}");
        }
    }

    /// A URL that does not parse said `redis.url: redis command failed:
    /// Redis URL did not parse - InvalidClientConfig`: no command had been
    /// sent, and with a cluster list the bad node was not named. The
    /// message says what is wrong and which node, never the password.
    #[test]
    fn an_unparsable_url_says_so_and_names_the_node() {
        for (toml, want) in [
            (
                "[redis]\nurl = 'redis://u:s3cret@host:notaport'",
                "redis.url: invalid redis URL",
            ),
            (
                "[redis]\nurl = 'http://u:s3cret@h:1'",
                "redis.url: invalid redis URL",
            ),
            (
                "[redis]\nurl = 'redis://u:s3cret@h:1/notadb'",
                "redis.url: invalid redis URL",
            ),
            (
                "[redis]\ncluster = ['redis://u:s3cret@a:1', 'redis://u:s3cret@b:x']",
                "redis.cluster: node 2 of 2: invalid redis URL",
            ),
            (
                "[redis]\ncluster = 'redis://a:1,nonsense'",
                "redis.cluster: node 2 of 2: invalid redis URL",
            ),
        ] {
            let e = builder(toml)
                .map(|_| "built".to_owned())
                .unwrap_or_else(|e| e);
            assert!(
                e.contains(want) && !e.contains("command failed") && !e.contains("s3cret"),
                "{toml}: {e}"
            );
        }
    }

    /// A huge timeout (humantime reads up to 584 billion years) is
    /// refused at start-up or means "no limit"; it never panics. A Sentinel
    /// URL's lookup bound, 3 x (connect + response), overflowed `Duration`
    /// and panicked in `builder_from_config`.
    #[test]
    fn a_huge_timeout_never_panics() {
        for url in ["redis://h:1", "redis+sentinel://s1:26379,s2:26379/mymaster"] {
            for field in ["connect_timeout", "response_timeout"] {
                let toml = format!("[redis]\nurl = '{url}'\n{field} = '300000000000y'");
                let r = std::panic::catch_unwind(|| builder(&toml).map(drop));
                assert!(r.is_ok(), "{toml}: panicked");
                if let Ok(Err(e)) = r {
                    assert!(e.contains(&format!("redis.{field}")), "{toml}: {e}");
                }
            }
        }
    }
}
