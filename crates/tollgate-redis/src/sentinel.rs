//! Redis Sentinel: `redis+sentinel://` and `rediss+sentinel://` URLs, and
//! finding the master.
//!
//! ```text
//! redis+sentinel://[user:password@]host[:port][,host[:port]...]/<master-name>[/<db>][?sentinel_username=..&sentinel_password=..]
//! rediss+sentinel://...   (the same, with TLS; feature `tls`)
//! ```
//!
//! The hosts are sentinels (port 26379 when omitted); `<master-name>` is
//! the name they monitor (`sentinel monitor <name> ...`). The credentials
//! before `@` are for the Redis master (and its replicas, which become
//! masters), like those of a `redis://` URL; sentinels that require a
//! password of their own take it in the query. Percent-encode reserved
//! characters in passwords.
//!
//! The redis crate has no URL form for Sentinel; this one is the
//! `redis+<transport>://` convention of its `redis+unix://` and the
//! comma-separated host list of other clients (lettuce, go-redis).
//!
//! `rediss+sentinel://` is TLS to the sentinels and to every server they
//! name (the master, a promoted replica, the replicas the durability check
//! reads), each certificate verified as for `rediss://`: against the system
//! and Mozilla roots, or only the CA given with
//! [`tls_root_cert`](crate::RedisBackendBuilder::tls_root_cert); each is
//! presented the client certificate given with
//! [`tls_client_cert`](crate::RedisBackendBuilder::tls_client_cert). The name
//! checked for a server is the address the sentinels answer with (an IP,
//! unless they announce host names), so its certificate must carry it.
//! There is no unverified mode; without the feature `tls` the URL is
//! refused ([`RedisError::Unsupported`]), never tried in plain text.
//!
//! Every connection the backend makes (at start-up, and whenever a
//! connection is replaced) first asks the sentinels for the master's
//! address through the redis crate's [`SentinelClient`], which checks the
//! `ROLE` of the server it returns. The sentinels are asked one at a time,
//! each within a bound derived from the backend's timeouts; the one that
//! answered is asked first next time (see [`Sentinels`]). The backend's
//! periodic master check (see [`crate::conn`]) asks them on clients and
//! connections of its own, so that no lookup waits behind it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use std::collections::HashMap;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo, TlsMode};
use tokio::sync::Mutex;

use crate::RedisError;
use crate::tls::TlsSettings;

/// The scheme of a Sentinel URL.
pub(crate) const SCHEME: &str = "redis+sentinel://";

/// The scheme of a Sentinel URL with TLS to the sentinels and the servers.
pub(crate) const TLS_SCHEME: &str = "rediss+sentinel://";

/// The sentinels' default port.
const DEFAULT_PORT: u16 = 26379;

/// Whether `url` names sentinels rather than a server.
pub(crate) fn is_sentinel_url(url: &str) -> bool {
    let lower = url
        .get(..TLS_SCHEME.len())
        .unwrap_or(url)
        .to_ascii_lowercase();
    lower.starts_with(SCHEME) || lower.starts_with(TLS_SCHEME)
}

/// A parsed `redis+sentinel://` URL.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    pub(crate) sentinels: Vec<(String, u16)>,
    pub(crate) master: String,
    pub(crate) db: i64,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) sentinel_username: Option<String>,
    pub(crate) sentinel_password: Option<String>,
    /// `rediss+sentinel://`: TLS to the sentinels and to every server they
    /// name.
    pub(crate) tls: bool,
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the passwords.
        f.debug_struct("SentinelUrl")
            .field("sentinels", &self.sentinels)
            .field("master", &self.master)
            .field("db", &self.db)
            .field("username", &self.username)
            .field("sentinel_username", &self.sentinel_username)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

fn invalid(why: &str) -> RedisError {
    RedisError::InvalidUrl(format!(
        "{why} (expected {SCHEME}[user:password@]host[:port][,host[:port]...]/<master-name>[/<db>], \
         or {TLS_SCHEME}...)"
    ))
}

/// Parses a Sentinel URL. Errors name the part that is wrong, never a
/// password.
pub(crate) fn parse(url: &str) -> Result<SentinelUrl, RedisError> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| invalid("no scheme"))?;
    let tls = scheme.eq_ignore_ascii_case("rediss+sentinel");
    if !tls && !scheme.eq_ignore_ascii_case("redis+sentinel") {
        return Err(invalid("not a redis+sentinel:// URL"));
    }
    // Refused before anything else is read: never plain text instead.
    #[cfg(not(feature = "tls"))]
    if tls {
        return Err(needs_tls());
    }
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (username, password) = match userinfo {
        None => (None, None),
        Some(u) => {
            let (user, pass) = match u.split_once(':') {
                Some((user, pass)) => (user, Some(pass)),
                None => (u, None),
            };
            let user = decode(user).ok_or_else(|| invalid("bad percent-encoding in the user"))?;
            let pass = pass
                .map(|p| decode(p).ok_or_else(|| invalid("bad percent-encoding in the password")))
                .transpose()?;
            ((!user.is_empty()).then_some(user), pass)
        }
    };
    let mut sentinels = Vec::new();
    for host in hosts.split(',').map(str::trim) {
        if host.is_empty() {
            return Err(invalid("an empty sentinel address"));
        }
        let (name, port) = match host.rsplit_once(':') {
            // `[::1]:26379`, `host:26379`; a bare IPv6 address needs brackets.
            Some((name, port)) if !name.is_empty() && !port.contains(']') => {
                let port = port
                    .parse()
                    .map_err(|_| invalid(&format!("bad port in sentinel address {host:?}")))?;
                (name, port)
            }
            _ => (host, DEFAULT_PORT),
        };
        let name = name.trim_start_matches('[').trim_end_matches(']');
        sentinels.push((name.to_owned(), port));
    }
    let mut parts = path.split('/').filter(|p| !p.is_empty());
    let master = parts
        .next()
        .map(decode)
        .ok_or_else(|| invalid("no master name"))?
        .ok_or_else(|| invalid("bad percent-encoding in the master name"))?;
    let db = match parts.next() {
        None => 0,
        Some(d) => d
            .parse()
            .map_err(|_| invalid(&format!("bad database number {d:?}")))?,
    };
    if parts.next().is_some() {
        return Err(invalid("extra path segments"));
    }
    let mut sentinel_username = None;
    let mut sentinel_password = None;
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        if pair.is_empty() {
            continue;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = decode(v).ok_or_else(|| invalid(&format!("bad percent-encoding in {k}")))?;
        match k {
            "sentinel_username" => sentinel_username = Some(v),
            "sentinel_password" => sentinel_password = Some(v),
            _ => return Err(invalid(&format!("unknown parameter {k:?}"))),
        }
    }
    Ok(SentinelUrl {
        sentinels,
        master,
        db,
        username,
        password,
        sentinel_username,
        sentinel_password,
        tls,
    })
}

/// Percent-decoding; `None` on a bad escape or invalid UTF-8.
fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The sentinels of one master, shared by every slot's keeper.
///
/// Each sentinel is a redis-rs [`SentinelClient`] of its own, asked alone
/// under a bound of its own, so that one that does not answer (a network
/// gone silent) costs a lookup that bound, not the whole lookup. One
/// redis-rs client of several sentinels asks them with its own timeouts
/// (1 s to connect, 500 ms for a reply), whatever the backend's, and takes
/// their answers in list order: a silent first sentinel held every lookup
/// about a second (1.5 s on a connection it had open), and made every
/// lookup fail when the backend's timeouts bounded the lookup to less.
///
/// Lookups take turns (one lock); the periodic master check
/// ([`check_master_addr`](Self::check_master_addr)) has clients and a lock
/// of its own, so that a check waiting on a silent sentinel never holds up
/// a lookup for a connection that failed. Both learn from each other which
/// sentinel answered last.
///
/// A [`SentinelClient`] rather than a bare `Sentinel`: only its builder
/// hands the CA to the connections to the servers the sentinels name (a
/// bare `Sentinel` checks their `ROLE` against the default roots only).
#[derive(Clone)]
pub(crate) struct Sentinels {
    /// The lookups' clients: [`master`](Self::master),
    /// [`replicas`](Self::replicas), [`master_addr`](Self::master_addr).
    lookups: Arc<Mutex<State>>,
    /// The periodic master check's clients.
    checks: Arc<Mutex<State>>,
    /// The sentinel that answered last: the next lookup or check asks it
    /// first, and then the others in the URL's order.
    first: Arc<AtomicUsize>,
    target: Arc<Target>,
    /// Bounds one sentinel's part of a lookup (a connection and its
    /// replies to the sentinel, then to the server it names).
    per_sentinel: Duration,
}

/// The sentinels' clients.
struct State {
    /// One client per sentinel, in the URL's order (each caches its
    /// connection).
    clients: Vec<SentinelClient>,
    /// Per sentinel, where `SENTINEL GET-MASTER-ADDR-BY-NAME` is asked
    /// (the master check's question, every second).
    asked: Vec<Asked>,
}

/// One sentinel, for `SENTINEL GET-MASTER-ADDR-BY-NAME`.
struct Asked {
    /// The sentinel alone: dialled directly, not through its
    /// [`SentinelClient`], which would first check its `ROLE` on a
    /// connection of its own.
    sentinel: redis::Client,
    /// Kept, not dialled for each question; dropped when it fails or runs
    /// out of time.
    conn: Option<MultiplexedConnection>,
}

impl State {
    fn new(target: &Target) -> redis::RedisResult<Self> {
        let n = target.url.sentinels.len();
        Ok(Self {
            clients: (0..n)
                .map(|i| target.client(i))
                .collect::<redis::RedisResult<_>>()?,
            asked: (0..n)
                .map(|i| {
                    let sentinel = target.sentinel(i)?;
                    Ok(Asked {
                        sentinel,
                        conn: None,
                    })
                })
                .collect::<redis::RedisResult<_>>()?,
        })
    }
}

/// How to reach the sentinels and the servers they name.
struct Target {
    url: SentinelUrl,
    /// With `rediss+sentinel://`: the only CA trusted and the client
    /// certificate presented, as with `rediss://`
    /// ([`tls_root_cert`](crate::RedisBackendBuilder::tls_root_cert),
    /// [`tls_client_cert`](crate::RedisBackendBuilder::tls_client_cert)),
    /// to the sentinels and to every server they name alike.
    // Without the feature no TLS URL gets this far (see `needs_tls`).
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    tls: TlsSettings,
}

impl Sentinels {
    /// `tls`: the CA trusted (else the system and Mozilla roots) and the
    /// client certificate presented with `rediss+sentinel://`; unused
    /// without TLS.
    pub(crate) fn new(
        url: &SentinelUrl,
        per_sentinel: Duration,
        tls: TlsSettings,
    ) -> Result<Self, RedisError> {
        #[cfg(not(feature = "tls"))]
        if url.tls {
            return Err(needs_tls());
        }
        let target = Target {
            url: url.clone(),
            tls,
        };
        Ok(Self {
            lookups: Arc::new(Mutex::new(State::new(&target)?)),
            checks: Arc::new(Mutex::new(State::new(&target)?)),
            first: Arc::new(AtomicUsize::new(0)),
            target: Arc::new(target),
            per_sentinel,
        })
    }

    /// Asks the sentinels one at a time through `state`'s clients, each
    /// within `per_sentinel`, until one answers; that one is asked first
    /// next time. A sentinel that ran out of time loses its client (and
    /// the connection it holds, which may be the silent one): the next
    /// time it is asked, it is connected afresh. Lookups take turns (the
    /// caller holds `state`'s lock): one that waits for another starts
    /// with the sentinel that answered it.
    async fn ask<T>(
        &self,
        state: &mut State,
        query: for<'a> fn(
            &'a mut SentinelClient,
            &'a mut Asked,
            &'a Self,
        ) -> redis::RedisFuture<'a, T>,
    ) -> redis::RedisResult<T> {
        let (first, n) = (self.first.load(Ordering::Relaxed), state.clients.len());
        let order = std::iter::once(first).chain((0..n).filter(|&i| i != first));
        let mut error = None;
        for i in order {
            let asked = query(&mut state.clients[i], &mut state.asked[i], self);
            match tokio::time::timeout(self.per_sentinel, asked).await {
                Ok(Ok(answer)) => {
                    self.first.store(i, Ordering::Relaxed);
                    return Ok(answer);
                }
                Ok(Err(e)) => error = Some(e),
                Err(_) => {
                    state.clients[i] = self.target.client(i)?;
                    state.asked[i].conn = None;
                    // A sentinel's answer (a master not found, a server
                    // that is not a master) says more than another's
                    // silence.
                    error.get_or_insert_with(timed_out);
                }
            }
        }
        Err(error.unwrap_or_else(timed_out))
    }

    /// A client for the master the sentinels name now (checked with
    /// `ROLE`).
    pub(crate) async fn master(&self) -> redis::RedisResult<redis::Client> {
        let mut state = self.lookups.lock().await;
        self.ask(&mut state, |s, _, _| Box::pin(s.async_get_client()))
            .await
    }

    /// The master's address as the sentinels name it now
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`, no connection to the master):
    /// a lookup, taking its turn with the others.
    pub(crate) async fn master_addr(&self) -> redis::RedisResult<(String, u16)> {
        let mut state = self.lookups.lock().await;
        self.ask(&mut state, Self::named).await
    }

    /// [`master_addr`](Self::master_addr) for the periodic master check,
    /// on its own clients: it never waits for a lookup, nor a lookup for
    /// it. `None` when a check is already under way (skipped, not queued).
    pub(crate) async fn check_master_addr(&self) -> Option<redis::RedisResult<(String, u16)>> {
        let mut state = self.checks.try_lock().ok()?;
        Some(self.ask(&mut state, Self::named).await)
    }

    /// Asks a sentinel for the master's address on its kept connection
    /// (see [`Asked`]).
    fn named<'a>(
        _: &'a mut SentinelClient,
        asked: &'a mut Asked,
        me: &'a Self,
    ) -> redis::RedisFuture<'a, (String, u16)> {
        Box::pin(async move {
            let mut conn = match asked.conn.take() {
                Some(conn) => conn,
                None => asked.sentinel.get_multiplexed_async_connection().await?,
            };
            let named = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&me.target.url.master)
                .query_async::<(String, u16)>(&mut conn)
                .await;
            // Kept unless the connection failed: a reply (an ACL's
            // refusal too) leaves it usable.
            if !named.as_ref().is_err_and(|e| {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_timeout()
                    || e.is_unrecoverable_error()
            }) {
                asked.conn = Some(conn);
            }
            named
        })
    }

    /// A sentinel named a master that is none
    /// ([`says_master`](Self::says_master)): the one asked first (the one
    /// that answered last: that one) gives its place to the next in the
    /// URL's order, so that a stale sentinel does not answer every check
    /// while a right one answers.
    pub(crate) fn pass_over_first(&self) {
        let n = self.target.url.sentinels.len();
        let next = |first| Some((first + 1) % n);
        // Always `Ok`: `next` never refuses.
        let _ = self
            .first
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, next);
    }

    /// Whether the server at `host:port`, which a sentinel named the
    /// master, says it is one (`ROLE`), as a lookup checks what a sentinel
    /// names: not when it says another role or does not answer in time;
    /// when it answers but may not be asked (`ROLE` denied by an ACL), the
    /// sentinel is believed.
    pub(crate) async fn says_master(&self, host: String, port: u16) -> bool {
        let bound = self.per_sentinel;
        let ask = async {
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(bound))
                .set_response_timeout(Some(bound));
            let mut conn = self
                .target
                .server(host, port)?
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            redis::cmd("ROLE")
                .query_async::<redis::Value>(&mut conn)
                .await
        };
        match tokio::time::timeout(bound, ask).await {
            Ok(Ok(role)) => crate::conn::role_of(&role).as_deref() == Some("master"),
            Ok(Err(e)) => e.code().is_some(),
            Err(_) => false,
        }
    }

    /// Clients for the replicas the sentinels know and do not mark down
    /// (`SENTINEL SLAVES`), reached as the master is (credentials, TLS):
    /// the servers that can become the master. None is not an error (a
    /// master without a replica, or right after a failover). Their `ROLE`
    /// is not checked here: the durability check that asks for them
    /// reports a replica it cannot reach.
    pub(crate) async fn replicas(&self) -> redis::RedisResult<Vec<redis::Client>> {
        let mut state = self.lookups.lock().await;
        self.ask(&mut state, |s, _, me| {
            Box::pin(async move {
                let sentinel = s.async_get_sentinel_client().await?;
                let mut conn = sentinel.get_multiplexed_async_connection().await?;
                // SLAVES, as redis-rs asks: older servers, and ACL rules
                // written for it, know no other name.
                let replicas: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
                    .arg("SLAVES")
                    .arg(&me.target.url.master)
                    .query_async(&mut conn)
                    .await?;
                replicas
                    .into_iter()
                    .filter_map(replica_addr)
                    .map(|(host, port)| me.target.server(host, port))
                    .collect()
            })
        })
        .await
    }
}

impl Target {
    /// A client for sentinel `i`: TLS to it and to the servers it names
    /// with `rediss+sentinel://`, verified (never `TlsMode::Insecure`).
    fn client(&self, i: usize) -> redis::RedisResult<SentinelClient> {
        let url = &self.url;
        let (host, port) = url.sentinels[i].clone();
        let addr = if url.tls {
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host, port)
        };
        let mut b = SentinelClientBuilder::new([addr], &url.master, SentinelServerType::Master)?
            .set_client_to_redis_db(url.db);
        if let Some(u) = &url.username {
            b = b.set_client_to_redis_username(u);
        }
        if let Some(p) = &url.password {
            b = b.set_client_to_redis_password(p);
        }
        if let Some(u) = &url.sentinel_username {
            b = b.set_client_to_sentinel_username(u);
        }
        if let Some(p) = &url.sentinel_password {
            b = b.set_client_to_sentinel_password(p);
        }
        if url.tls {
            b = b
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            #[cfg(feature = "tls")]
            if let Some(certs) = self.tls.certificates() {
                b = b
                    .set_client_to_redis_certificates(certs.clone())
                    .set_client_to_sentinel_certificates(certs);
            }
        }
        b.build()
    }

    /// A client for a server the sentinels name, as [`client`](Self::client)
    /// reaches the master: the URL's credentials and database, and TLS
    /// verified the same way.
    fn server(&self, host: String, port: u16) -> redis::RedisResult<redis::Client> {
        let url = &self.url;
        let redis = credentials(url.username.as_deref(), url.password.as_deref()).set_db(url.db);
        self.reach(host, port, redis)
    }

    /// A client for sentinel `i` alone, as [`client`](Self::client) reaches
    /// it: the sentinels' credentials, and TLS verified the same way.
    fn sentinel(&self, i: usize) -> redis::RedisResult<redis::Client> {
        let url = &self.url;
        let (host, port) = url.sentinels[i].clone();
        let redis = credentials(
            url.sentinel_username.as_deref(),
            url.sentinel_password.as_deref(),
        );
        self.reach(host, port, redis)
    }

    /// A client for `host:port` with `redis`'s settings, with TLS verified
    /// (with the given CA and client certificate) for a TLS URL.
    fn reach(
        &self,
        host: String,
        port: u16,
        redis: RedisConnectionInfo,
    ) -> redis::RedisResult<redis::Client> {
        if !self.url.tls {
            return redis::Client::open(
                ConnectionAddr::Tcp(host, port)
                    .into_connection_info()?
                    .set_redis_settings(redis),
            );
        }
        let info = ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }
        .into_connection_info()?
        .set_redis_settings(redis);
        #[cfg(feature = "tls")]
        if let Some(certs) = self.tls.certificates() {
            return redis::Client::build_with_tls(info, certs);
        }
        redis::Client::open(info)
    }
}

/// Connection settings with these credentials.
fn credentials(username: Option<&str>, password: Option<&str>) -> RedisConnectionInfo {
    let mut redis = RedisConnectionInfo::default();
    if let Some(u) = username {
        redis = redis.set_username(u);
    }
    if let Some(p) = password {
        redis = redis.set_password(p);
    }
    redis
}

/// A replica's address, unless the sentinel marks it down or disconnected
/// (the killed master after a failover is one).
fn replica_addr(mut info: HashMap<String, String>) -> Option<(String, u16)> {
    let flags = info.get("flags")?;
    if ["s_down", "o_down", "disconnected"]
        .iter()
        .any(|f| flags.contains(f))
    {
        return None;
    }
    let port = info.get("port")?.parse().ok()?;
    Some((info.remove("ip")?, port))
}

#[cfg(not(feature = "tls"))]
fn needs_tls() -> RedisError {
    RedisError::Unsupported("rediss+sentinel:// (TLS to sentinels) needs the `tls` feature")
}

fn timed_out() -> redis::RedisError {
    std::io::Error::from(std::io::ErrorKind::TimedOut).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let u = parse("redis+sentinel://a:1,b,[::1]:3/mymaster").unwrap();
        assert_eq!(
            u.sentinels,
            [
                ("a".to_owned(), 1),
                ("b".to_owned(), DEFAULT_PORT),
                ("::1".to_owned(), 3)
            ]
        );
        assert_eq!((u.master.as_str(), u.db), ("mymaster", 0));
        assert_eq!((u.username, u.password), (None, None));

        let u = parse(
            "redis+sentinel://lim:p%40ss@h:26379/m/2?sentinel_username=s&sentinel_password=q%26",
        )
        .unwrap();
        assert_eq!(u.username.as_deref(), Some("lim"));
        assert_eq!(u.password.as_deref(), Some("p@ss"));
        assert_eq!(u.db, 2);
        assert_eq!(u.sentinel_username.as_deref(), Some("s"));
        assert_eq!(u.sentinel_password.as_deref(), Some("q&"));
        assert!(!format!("{u:?}").contains("p@ss"));

        let u = parse("REDIS+SENTINEL://:secret@h/m").unwrap();
        assert_eq!((u.username, u.password.as_deref()), (None, Some("secret")));
        assert!(is_sentinel_url("Redis+Sentinel://h/m"));
        assert!(!is_sentinel_url("redis://h"));
    }

    #[test]
    fn rejects_bad_urls_without_showing_passwords() {
        for bad in [
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://h:x/m",
            "redis+sentinel://h,,k/m",
            "redis+sentinel://h/m/zero",
            "redis+sentinel://h/m/0/extra",
            "redis+sentinel://u:s3cret@h/m?what=1",
            "redis+sentinel://u:s3cret%zz@h/m",
            "redis://h/m",
        ] {
            let e = parse(bad).expect_err(bad).to_string();
            assert!(!e.contains("s3cret"), "{e}");
            assert!(e.contains("redis+sentinel://"), "{bad}: {e}");
        }
    }

    /// `rediss+sentinel://` is TLS to the sentinels and the servers; a
    /// build without the `tls` feature refuses it rather than go plain.
    #[test]
    fn tls_urls() {
        assert!(is_sentinel_url("Rediss+Sentinel://h/m"));
        #[cfg(feature = "tls")]
        {
            let u = parse("rediss+sentinel://u:p@a:1,b/m/3?sentinel_password=q").unwrap();
            assert!(u.tls);
            assert_eq!(u.sentinels.len(), 2);
            assert_eq!((u.master.as_str(), u.db), ("m", 3));
            assert!(!parse("redis+sentinel://a:1/m").unwrap().tls);
        }
        // This crate's tests build it with `tls` (a dev-dependency on
        // itself): this branch runs only in a build without it.
        #[cfg(not(feature = "tls"))]
        assert!(matches!(
            parse("rediss+sentinel://h/m"),
            Err(RedisError::Unsupported(_))
        ));
    }
}
