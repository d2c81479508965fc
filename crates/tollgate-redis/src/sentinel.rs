//! Redis Sentinel: `redis+sentinel://` URLs, and finding the master.
//!
//! ```text
//! redis+sentinel://[user:password@]host[:port][,host[:port]...]/<master-name>[/<db>][?sentinel_username=..&sentinel_password=..]
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
//! Every connection the backend makes (at start-up, and whenever a
//! connection is replaced) first asks the sentinels for the master's
//! address through the redis crate's [`redis::sentinel::Sentinel`], which
//! checks the `ROLE` of the server it returns. The sentinels are asked one
//! at a time, each within a bound derived from the backend's timeouts; the
//! one that answered is asked first next time (see [`Sentinels`]).

use std::sync::Arc;
use std::time::Duration;

use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};
use tokio::sync::Mutex;

use crate::RedisError;

/// The scheme of a Sentinel URL.
pub(crate) const SCHEME: &str = "redis+sentinel://";

/// The sentinels' default port.
const DEFAULT_PORT: u16 = 26379;

/// Whether `url` names sentinels rather than a server.
pub(crate) fn is_sentinel_url(url: &str) -> bool {
    let lower = url
        .get(..SCHEME.len() + 1)
        .unwrap_or(url)
        .to_ascii_lowercase();
    lower.starts_with(SCHEME) || lower.starts_with("rediss+sentinel://")
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
            .finish_non_exhaustive()
    }
}

fn invalid(why: &str) -> RedisError {
    RedisError::InvalidUrl(format!(
        "{why} (expected {SCHEME}[user:password@]host[:port][,host[:port]...]/<master-name>[/<db>])"
    ))
}

/// Parses a Sentinel URL. Errors name the part that is wrong, never a
/// password.
pub(crate) fn parse(url: &str) -> Result<SentinelUrl, RedisError> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| invalid("no scheme"))?;
    if scheme.eq_ignore_ascii_case("rediss+sentinel") {
        return Err(RedisError::Unsupported(
            "rediss+sentinel:// (TLS to sentinels) is not supported yet",
        ));
    }
    if !scheme.eq_ignore_ascii_case("redis+sentinel") {
        return Err(invalid("not a redis+sentinel:// URL"));
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
/// Each sentinel is a redis-rs [`Sentinel`] of its own, asked alone under
/// a bound of its own, so that one that does not answer (a network gone
/// silent) costs a lookup that bound, not the whole lookup. One redis-rs
/// `Sentinel` of several sentinels asks them with its own timeouts (1 s to
/// connect, 500 ms for a reply), whatever the backend's, and takes their
/// answers in list order: a silent first sentinel held every lookup about
/// a second (1.5 s on a connection it had open), and made every lookup
/// fail when the backend's timeouts bounded the lookup to less.
#[derive(Clone)]
pub(crate) struct Sentinels {
    state: Arc<Mutex<State>>,
    master: String,
    node: SentinelNodeConnectionInfo,
    /// Bounds one sentinel's part of a lookup (a connection and its
    /// replies to the sentinel, then to the server it names).
    per_sentinel: Duration,
}

/// The sentinels' clients, and which one to ask first.
struct State {
    /// The URL's sentinels, to build a client anew.
    infos: Vec<ConnectionInfo>,
    /// One client per sentinel (each caches its connection).
    clients: Vec<Sentinel>,
    /// The sentinel that answered last: the next lookup asks it first, and
    /// then the others in the URL's order.
    first: usize,
}

impl State {
    /// The order in which to ask the sentinels.
    fn order(&self) -> impl Iterator<Item = usize> + use<> {
        let first = self.first;
        std::iter::once(first).chain((0..self.infos.len()).filter(move |&i| i != first))
    }
}

impl Sentinels {
    pub(crate) fn new(url: &SentinelUrl, per_sentinel: Duration) -> Result<Self, RedisError> {
        let mut to_sentinel = RedisConnectionInfo::default();
        if let Some(u) = &url.sentinel_username {
            to_sentinel = to_sentinel.set_username(u);
        }
        if let Some(p) = &url.sentinel_password {
            to_sentinel = to_sentinel.set_password(p);
        }
        let infos = url
            .sentinels
            .iter()
            .map(|(host, port)| {
                Ok(ConnectionAddr::Tcp(host.clone(), *port)
                    .into_connection_info()?
                    .set_redis_settings(to_sentinel.clone()))
            })
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let clients = infos
            .iter()
            .map(|info| Sentinel::build(vec![info.clone()]))
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let mut to_master = RedisConnectionInfo::default().set_db(url.db);
        if let Some(u) = &url.username {
            to_master = to_master.set_username(u);
        }
        if let Some(p) = &url.password {
            to_master = to_master.set_password(p);
        }
        Ok(Self {
            state: Arc::new(Mutex::new(State {
                infos,
                clients,
                first: 0,
            })),
            master: url.master.clone(),
            node: SentinelNodeConnectionInfo::default().set_redis_connection_info(to_master),
            per_sentinel,
        })
    }

    /// Asks the sentinels one at a time, each within `per_sentinel`, until
    /// one answers; that one is asked first next time. A sentinel that ran
    /// out of time loses its client (and the connection it holds, which
    /// may be the silent one): the next time it is asked, it is connected
    /// afresh. Lookups take turns: one that waits for another starts with
    /// the sentinel that answered it.
    async fn ask<T>(
        &self,
        query: for<'a> fn(&'a mut Sentinel, &'a Self) -> redis::RedisFuture<'a, T>,
    ) -> redis::RedisResult<T> {
        let mut state = self.state.lock().await;
        let mut error = None;
        for i in state.order() {
            match tokio::time::timeout(self.per_sentinel, query(&mut state.clients[i], self)).await
            {
                Ok(Ok(answer)) => {
                    state.first = i;
                    return Ok(answer);
                }
                Ok(Err(e)) => error = Some(e),
                Err(_) => {
                    state.clients[i] = Sentinel::build(vec![state.infos[i].clone()])?;
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
        self.ask(|s, me| Box::pin(s.async_master_for(&me.master, Some(&me.node))))
            .await
    }

    /// Clients for the replicas the sentinels know (each checked with
    /// `ROLE`): the servers that can become the master. None is not an
    /// error (a master without a replica, or right after a failover).
    pub(crate) async fn replicas(&self) -> redis::RedisResult<Vec<redis::Client>> {
        self.ask(|s, me| {
            Box::pin(async move {
                match s
                    .async_get_replica_clients(&me.master, Some(&me.node))
                    .await
                {
                    Err(e) if e.kind() == redis::ErrorKind::NoValidReplicasFoundBySentinel => {
                        Ok(Vec::new())
                    }
                    other => other,
                }
            })
        })
        .await
    }
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
        assert!(matches!(
            parse("rediss+sentinel://h/m"),
            Err(RedisError::Unsupported(_))
        ));
    }
}
