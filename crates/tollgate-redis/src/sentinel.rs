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
//! address, and checks the `ROLE` of the server they name. The sentinels
//! are asked together, and the master of the newest configuration they
//! know (the highest `config-epoch`) is taken, not the first answer: see
//! [`Sentinels`]. The backend's periodic master check (see [`crate::conn`])
//! asks them the same way.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisConnectionInfo, ServerErrorKind};
use tokio::sync::Mutex;

use crate::RedisError;
use crate::conn::Timeouts;
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

/// The sentinels of one master, shared by every slot's keeper and the
/// backend's master check.
///
/// Every question about the master goes to all the sentinels at once
/// (`SENTINEL MASTER <name>`), each within one [`Timeouts::bound`]
/// (connected, then answered), and the answer is the master of the newest
/// configuration among those given: the highest `config-epoch`. A
/// sentinel that has not heard of a failover (cut off from the others, or
/// within the hello period, about 2 s, before it hears) names the old
/// master with the epoch before; one that took part in it, or heard of
/// it, names the new master with a higher one. The first answer was taken
/// before, in the URL's order: a stale sentinel asked first sent new
/// connections to an old master that still said `master` (one cut off
/// from the sentinels, not dead), where decisions counted a second time.
///
/// A question is over once more than half the sentinels of the URL have
/// named a master, or every sentinel has answered or failed, or the bound
/// has passed. More than half, because two majorities meet: while fewer
/// than half are stale, the newest configuration is among the answers
/// (list every sentinel of the deployment in the URL). So a silent
/// sentinel, or one that cannot be reached, costs nothing while a
/// majority answers without it, and at most the bound otherwise (where
/// the answers are taken as they are: a lone sentinel's still finds the
/// master). The sentinels asked late are not waited for; their questions
/// run out on their own (the bound), keeping the connection for the next.
///
/// A lookup then checks the master's `ROLE`, within one more bound: so a
/// lookup takes at most two.
#[derive(Clone)]
pub(crate) struct Sentinels {
    /// One per sentinel, in the URL's order.
    asked: Arc<[Asked]>,
    /// Held by the periodic master check while it asks: a check that
    /// finds it held is skipped, not queued.
    checking: Arc<Mutex<()>>,
    target: Arc<Target>,
    timeouts: Timeouts,
}

/// One sentinel.
struct Asked {
    /// The sentinel, with its credentials and TLS.
    sentinel: redis::Client,
    /// Kept, not dialled for each question (every lookup and every check
    /// asks every sentinel); dropped when it fails or runs out of time.
    conn: std::sync::Mutex<Option<MultiplexedConnection>>,
    /// `SENTINEL MASTER` was denied by the sentinel's ACL (a user set up
    /// for an earlier release, which asked `SENTINEL MASTERS` and
    /// `GET-MASTER-ADDR-BY-NAME`): it is asked `SENTINEL MASTERS` instead,
    /// which says the same of every master, without a refusal in its
    /// `ACL LOG` at every question.
    every_master: AtomicBool,
}

/// What one sentinel says of the master.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Said {
    master: Master,
    /// The `config-epoch` of the sentinel's configuration of the master:
    /// each failover raises it.
    epoch: u64,
}

/// A Sentinel master's address (`host`, `port`).
pub(crate) type Master = (String, u16);

/// The master of the newest configuration the sentinels that answered
/// know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Named {
    /// The masters named with the highest epoch: one, unless sentinels
    /// disagree within an epoch (a misconfigured sentinel, or two naming
    /// one server differently), the most named first.
    pub(crate) masters: Vec<Master>,
    /// The sentinels that named the first one (asked for its replicas).
    sentinels: Vec<usize>,
}

impl Named {
    /// The newest of the sentinels' answers (`(sentinel, said)`); `None`
    /// when there is none.
    fn of(said: &[(usize, Said)]) -> Option<Self> {
        let epoch = said.iter().map(|(_, s)| s.epoch).max()?;
        // (master, how many named it, the first in the URL that did): a
        // tie goes by the URL's order, not by which answered first.
        let mut masters: Vec<(&Master, usize, usize)> = Vec::new();
        for (i, s) in said.iter().filter(|(_, s)| s.epoch == epoch) {
            match masters.iter_mut().find(|(m, ..)| **m == s.master) {
                Some(m) => (m.1, m.2) = (m.1 + 1, m.2.min(*i)),
                None => masters.push((&s.master, 1, *i)),
            }
        }
        masters.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)));
        let first = masters[0].0;
        let mut sentinels: Vec<usize> = said
            .iter()
            .filter(|(_, s)| s.epoch == epoch && s.master == *first)
            .map(|(i, _)| *i)
            .collect();
        sentinels.sort_unstable();
        Some(Self {
            masters: masters.into_iter().map(|(m, ..)| m.clone()).collect(),
            sentinels,
        })
    }

    /// Whether `master` is one the newest configuration names.
    pub(crate) fn names(&self, master: &Master) -> bool {
        self.masters.contains(master)
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
    /// `timeouts`: each question to a sentinel, and each check of a
    /// server one names, is bounded by their sum. `tls`: the CA trusted
    /// (else the system and Mozilla roots) and the client certificate
    /// presented with `rediss+sentinel://`; unused without TLS.
    pub(crate) fn new(
        url: &SentinelUrl,
        timeouts: Timeouts,
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
        let asked = (0..url.sentinels.len())
            .map(|i| {
                Ok(Asked {
                    sentinel: target.sentinel(i)?,
                    conn: std::sync::Mutex::new(None),
                    every_master: AtomicBool::new(false),
                })
            })
            .collect::<redis::RedisResult<Arc<[Asked]>>>()?;
        Ok(Self {
            asked,
            checking: Arc::new(Mutex::new(())),
            target: Arc::new(target),
            timeouts,
        })
    }

    /// Asks every sentinel at once for the master (see [`Sentinels`]) and
    /// answers the newest configuration's. Dropped, it leaves the
    /// questions under way to run out on their own.
    pub(crate) async fn named(&self) -> redis::RedisResult<Named> {
        let n = self.asked.len();
        let (tx, mut rx) = tokio::sync::mpsc::channel(n.max(1));
        for i in 0..n {
            let (me, tx) = (self.clone(), tx.clone());
            // Not aborted when this question is over: a late answer keeps
            // its connection for the next (a dial abandoned at every
            // question would be one at every question).
            tokio::spawn(async move {
                let said = tokio::time::timeout(me.timeouts.bound(), me.ask(i)).await;
                if said.is_err() {
                    // Perhaps the connection went silent: the next
                    // question dials afresh.
                    *lock(&me.asked[i].conn) = None;
                }
                let _ = tx
                    .send((i, said.unwrap_or_else(|_| Err(timed_out()))))
                    .await;
            });
        }
        drop(tx);
        let (mut said, mut error) = (Vec::new(), None::<redis::RedisError>);
        while let Some((i, answer)) = rx.recv().await {
            match answer {
                Ok(s) => said.push((i, s)),
                // A sentinel's reply (an ACL's refusal, a master it does
                // not know) says more than another's silence.
                Err(e) if error.is_none() || e.code().is_some() => error = Some(e),
                Err(_) => {}
            }
            if said.len() > n / 2 {
                break;
            }
        }
        Named::of(&said).ok_or_else(|| error.unwrap_or_else(timed_out))
    }

    /// Asks sentinel `i` what it says of the master, on its kept
    /// connection; on a new one, once, when the kept one has failed (the
    /// sentinel restarted, an idle connection closed by a proxy).
    async fn ask(&self, i: usize) -> redis::RedisResult<Said> {
        let asked = &self.asked[i];
        let kept = lock(&asked.conn).clone();
        if let Some(conn) = kept {
            match self.ask_on(asked, conn).await {
                Err(e) if broken(&e) && !e.is_timeout() => {}
                said => return said,
            }
        }
        let conn = asked
            .sentinel
            .get_multiplexed_async_connection_with_config(&self.config())
            .await?;
        *lock(&asked.conn) = Some(conn.clone());
        self.ask_on(asked, conn).await
    }

    /// Asks `asked` what it says of the master on `conn`, and drops its
    /// kept connection if that one failed.
    async fn ask_on(
        &self,
        asked: &Asked,
        mut conn: MultiplexedConnection,
    ) -> redis::RedisResult<Said> {
        let name = &self.target.url.master;
        let said = if asked.every_master.load(Ordering::Relaxed) {
            from_every_master(&mut conn, name).await
        } else {
            let one = redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(name)
                .query_async::<HashMap<String, String>>(&mut conn)
                .await;
            match one {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) => {
                    asked.every_master.store(true, Ordering::Relaxed);
                    from_every_master(&mut conn, name).await
                }
                one => one.and_then(said_of),
            }
        };
        // Kept unless the connection failed: a reply (an ACL's refusal
        // too) leaves it usable.
        if said.as_ref().is_err_and(broken) {
            *lock(&asked.conn) = None;
        }
        said
    }

    /// The settings of every connection to a sentinel or to a server one
    /// names.
    fn config(&self) -> redis::AsyncConnectionConfig {
        redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeouts.connect))
            .set_response_timeout(Some(self.timeouts.response))
    }

    /// A client for the master the sentinels name now: the newest
    /// configuration's, checked with `ROLE` (see
    /// [`says_master`](Self::says_master)). A master of an older
    /// configuration is never taken instead, even when the newest one does
    /// not answer: that one may be an old master cut off from the
    /// sentinels, still saying `master`.
    pub(crate) async fn master(&self) -> redis::RedisResult<redis::Client> {
        let named = self.named().await?;
        for (host, port) in &named.masters {
            if self.says_master(host.clone(), *port).await {
                return self.target.server(host.clone(), *port);
            }
        }
        let (host, port) = &named.masters[0];
        Err(std::io::Error::other(format!(
            "the master the sentinels name, {host}:{port}, does not say it is one"
        ))
        .into())
    }

    /// [`named`](Self::named) for the periodic master check: `None` when a
    /// check is already under way (skipped, not queued).
    pub(crate) async fn check_named(&self) -> Option<redis::RedisResult<Named>> {
        let _checking = self.checking.try_lock().ok()?;
        Some(self.named().await)
    }

    /// Whether the server at `host:port`, which a sentinel named the
    /// master, says it is one (`ROLE`), within one bound: not when it says
    /// another role or does not answer in time; when it answers but may
    /// not be asked (`ROLE` denied by an ACL), the sentinel is believed.
    pub(crate) async fn says_master(&self, host: String, port: u16) -> bool {
        let config = self.config();
        let ask = async {
            let mut conn = self
                .target
                .server(host, port)?
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            redis::cmd("ROLE")
                .query_async::<redis::Value>(&mut conn)
                .await
        };
        match tokio::time::timeout(self.timeouts.bound(), ask).await {
            Ok(Ok(role)) => crate::conn::role_of(&role).as_deref() == Some("master"),
            Ok(Err(e)) => e.code().is_some(),
            Err(_) => false,
        }
    }

    /// Clients for the replicas the sentinels know and do not mark down
    /// (`SENTINEL SLAVES`, asked of a sentinel that named the newest
    /// configuration's master), reached as the master is (credentials,
    /// TLS): the servers that can become the master. None is not an error
    /// (a master without a replica, or right after a failover). Their
    /// `ROLE` is not checked here: the durability check that asks for
    /// them reports a replica it cannot reach.
    pub(crate) async fn replicas(&self) -> redis::RedisResult<Vec<redis::Client>> {
        let named = self.named().await?;
        let mut error = None;
        for i in named.sentinels {
            let ask = async {
                let kept = lock(&self.asked[i].conn).clone();
                let mut conn = match kept {
                    Some(conn) => conn,
                    None => {
                        self.asked[i]
                            .sentinel
                            .get_multiplexed_async_connection_with_config(&self.config())
                            .await?
                    }
                };
                // SLAVES, as redis-rs asks: older servers, and ACL rules
                // written for it, know no other name.
                redis::cmd("SENTINEL")
                    .arg("SLAVES")
                    .arg(&self.target.url.master)
                    .query_async::<Vec<HashMap<String, String>>>(&mut conn)
                    .await
            };
            match tokio::time::timeout(self.timeouts.bound(), ask).await {
                Ok(Ok(replicas)) => {
                    return replicas
                        .into_iter()
                        .filter_map(replica_addr)
                        .map(|(host, port)| self.target.server(host, port))
                        .collect();
                }
                Ok(Err(e)) => error = Some(e),
                Err(_) => {
                    error.get_or_insert_with(timed_out);
                }
            }
        }
        Err(error.unwrap_or_else(timed_out))
    }
}

/// What a sentinel says of the master `name` in its `SENTINEL MASTERS`
/// (every master it monitors).
async fn from_every_master(
    conn: &mut MultiplexedConnection,
    name: &str,
) -> redis::RedisResult<Said> {
    let every: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
        .arg("MASTERS")
        .query_async(conn)
        .await?;
    let one = every
        .into_iter()
        .find(|m| m.get("name").map(String::as_str) == Some(name));
    match one {
        Some(one) => said_of(one),
        // As `SENTINEL MASTER` answers.
        None => Err(redis::RedisError::from((
            ErrorKind::MasterNameNotFoundBySentinel,
            "No such master with that name",
        ))),
    }
}

/// The master's address and configuration epoch in a sentinel's
/// description of it (`SENTINEL MASTER`).
fn said_of(mut m: HashMap<String, String>) -> redis::RedisResult<Said> {
    let bad = |what: &'static str| redis::RedisError::from((ErrorKind::Parse, what));
    let port = m.get("port").and_then(|p| p.parse().ok());
    let port = port.ok_or_else(|| bad("a sentinel described the master without a port"))?;
    let host = m.remove("ip");
    let host = host.ok_or_else(|| bad("a sentinel described the master without an ip"))?;
    // Every sentinel since 2.8 reports it; one that did not would count
    // as the oldest configuration.
    let epoch = m.get("config-epoch").and_then(|e| e.parse().ok());
    Ok(Said {
        master: (host, port),
        epoch: epoch.unwrap_or(0),
    })
}

/// Whether an error means the connection itself failed.
fn broken(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_unrecoverable_error()
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Target {
    /// A client for a server the sentinels name: the URL's credentials
    /// and database, and TLS verified as for the sentinels.
    fn server(&self, host: String, port: u16) -> redis::RedisResult<redis::Client> {
        let url = &self.url;
        let redis = credentials(url.username.as_deref(), url.password.as_deref()).set_db(url.db);
        self.reach(host, port, redis)
    }

    /// A client for sentinel `i`: the sentinels' credentials, and TLS
    /// verified (never `TlsMode::Insecure`) with `rediss+sentinel://`.
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

    fn said(port: u16, epoch: u64) -> Said {
        Said {
            master: ("10.0.0.1".to_owned(), port),
            epoch,
        }
    }

    /// The newest configuration wins, whatever the order of the answers:
    /// a stale sentinel answering first does not name the master.
    #[test]
    fn the_newest_configuration_names_the_master() {
        let stale_first = [(0, said(1, 3)), (1, said(2, 4)), (2, said(2, 4))];
        let named = Named::of(&stale_first).unwrap();
        assert_eq!(named.masters, [("10.0.0.1".to_owned(), 2)]);
        assert_eq!(named.sentinels, [1, 2]);
        assert!(named.names(&("10.0.0.1".to_owned(), 2)));
        assert!(!named.names(&("10.0.0.1".to_owned(), 1)));
        // One epoch, two masters (a misconfigured sentinel): both, the
        // most named first, then in the URL's order.
        let split = [(2, said(8, 0)), (0, said(7, 0)), (1, said(8, 0))];
        let named = Named::of(&split).unwrap();
        assert_eq!(
            named.masters,
            [("10.0.0.1".to_owned(), 8), ("10.0.0.1".to_owned(), 7)]
        );
        assert_eq!(named.sentinels, [1, 2]);
        let tie = [(2, said(8, 0)), (1, said(7, 0))];
        let named = Named::of(&tie).unwrap();
        assert_eq!(named.masters[0], ("10.0.0.1".to_owned(), 7));
        assert_eq!(Named::of(&[]), None);
    }

    #[test]
    fn reads_a_sentinels_description_of_the_master() {
        let m = |fields: &[(&str, &str)]| -> HashMap<String, String> {
            fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let full = m(&[
            ("name", "tollgate"),
            ("ip", "127.0.0.1"),
            ("port", "6380"),
            ("flags", "master"),
            ("config-epoch", "12"),
        ]);
        assert_eq!(
            said_of(full).unwrap(),
            Said {
                master: ("127.0.0.1".to_owned(), 6380),
                epoch: 12
            }
        );
        let no_epoch = m(&[("ip", "h"), ("port", "1")]);
        assert_eq!(said_of(no_epoch).unwrap().epoch, 0);
        assert!(said_of(m(&[("ip", "h")])).is_err());
        assert!(said_of(m(&[("port", "1")])).is_err());
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
