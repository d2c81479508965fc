//! The start-up durability check: is the counter's Redis "redis-durable"?
//!
//! A rate-limit counter that Redis may evict or lose on restart silently
//! hands out fresh quotas. The backend asks each server that holds the
//! counters or can come to (each master of a cluster and its replicas; a
//! Sentinel master and the replicas its sentinels know: a replica promoted
//! by a failover keeps its own settings) for `appendonly` and
//! `maxmemory-policy` with `CONFIG GET`:
//!
//! * `appendonly yes`: the counters survive a restart;
//! * `maxmemory-policy noeviction`: writes fail rather than evict keys.
//!   Every tollgate key has a TTL, so the `volatile-*` policies evict them
//!   first, and `allkeys-*` may too.
//!
//! Where `CONFIG` is renamed or denied by an ACL the setting is reported as
//! unknown (and so are a cluster's replicas when `CLUSTER NODES`, which
//! lists them, is); in [`Durability::Strict`] mode an unknown setting
//! refuses the start like a bad one (grant the backend's user
//! `+config|get`, and on a cluster `+cluster|nodes`, to prove the servers
//! instead).

use std::collections::HashMap;
use std::fmt;

use redis::Value;

/// What the backend does with the durability check at start-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Durability {
    /// Check, log the report (`warn` for problems, `info` otherwise) and
    /// start anyway (the default).
    #[default]
    Report,
    /// Check and refuse to start unless every server is shown to be durable.
    Strict,
    /// Do not check.
    Skip,
}

/// A setting as read from one server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Setting {
    /// The server's value.
    Known(String),
    /// The server would not say (`CONFIG` renamed or denied); the reason.
    Unknown(String),
}

impl Setting {
    fn is(&self, want: &str) -> Option<bool> {
        match self {
            Self::Known(v) => Some(v.eq_ignore_ascii_case(want)),
            Self::Unknown(_) => None,
        }
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Known(v) => f.write_str(v),
            Self::Unknown(why) => write!(f, "unknown ({why})"),
        }
    }
}

/// A server's role when it was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeRole {
    /// It holds the counters now.
    Master,
    /// A replica: it becomes the master after a failover.
    Replica,
    /// `ROLE` failed (denied by an ACL, renamed).
    Unknown,
}

impl fmt::Display for NodeRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Master => "master",
            Self::Replica => "replica",
            Self::Unknown => "unknown",
        })
    }
}

impl NodeRole {
    fn of(reply: Result<Value, redis::RedisError>) -> Self {
        match reply
            .ok()
            .as_ref()
            .and_then(crate::conn::role_of)
            .as_deref()
        {
            Some("master") => Self::Master,
            Some("slave" | "replica") => Self::Replica,
            _ => Self::Unknown,
        }
    }
}

/// The durability settings of one server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct NodeReport {
    /// The server (`host:port`); `replicas` for a cluster's replicas when
    /// they could not be listed (`CLUSTER NODES` refused), whose settings
    /// are then unknown.
    pub node: String,
    /// Its role when checked.
    pub role: NodeRole,
    /// `appendonly`: `yes` is required.
    pub appendonly: Setting,
    /// `appendfsync`, for information (`everysec` loses at most about a
    /// second of decisions on a crash, `always` none).
    pub appendfsync: Setting,
    /// `maxmemory-policy`: `noeviction` is required.
    pub maxmemory_policy: Setting,
}

impl NodeReport {
    /// What is wrong with this server (empty when it is durable).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let node = match self.role {
            NodeRole::Replica => format!("{} (replica)", self.node),
            _ => self.node.clone(),
        };
        let node = &node;
        match self.appendonly.is("yes") {
            Some(true) => {}
            Some(false) => out.push(format!(
                "{}: appendonly is not yes: counters are lost on restart",
                node
            )),
            None => out.push(format!("{}: appendonly {}", node, self.appendonly)),
        }
        match self.maxmemory_policy.is("noeviction") {
            Some(true) => {}
            Some(false) => out.push(format!(
                "{}: maxmemory-policy is {}, not noeviction: rate-limit keys (all with a TTL) may be evicted",
                node, self.maxmemory_policy
            )),
            None => out.push(format!("{}: maxmemory-policy {}", node, self.maxmemory_policy)),
        }
        out
    }
}

/// The result of the durability check: one entry per server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct DurabilityReport {
    /// Every server checked, with its role: every node of a cluster; a
    /// Sentinel master and its replicas.
    pub nodes: Vec<NodeReport>,
}

impl DurabilityReport {
    /// Whether every server is shown to be durable (an unknown setting is
    /// not).
    pub fn is_durable(&self) -> bool {
        !self.nodes.is_empty() && self.nodes.iter().all(|n| n.problems().is_empty())
    }

    /// Whether a server is known to be evicting or non-persistent (as
    /// opposed to merely unknown).
    pub fn is_known_bad(&self) -> bool {
        self.nodes.iter().any(|n| {
            n.appendonly.is("yes") == Some(false)
                || n.maxmemory_policy.is("noeviction") == Some(false)
        })
    }

    /// Every problem found.
    pub fn problems(&self) -> Vec<String> {
        self.nodes.iter().flat_map(NodeReport::problems).collect()
    }

    pub(crate) fn log(&self) {
        let problems = self.problems();
        if problems.is_empty() {
            tracing::info!(
                nodes = self.nodes.len(),
                "redis is durable (appendonly yes, noeviction)"
            );
        } else {
            for p in &problems {
                tracing::warn!(problem = %p, "redis durability check");
            }
        }
    }
}

impl fmt::Display for DurabilityReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let problems = self.problems();
        if problems.is_empty() {
            return write!(f, "{} server(s) durable", self.nodes.len());
        }
        f.write_str(&problems.join("; "))
    }
}

const SETTINGS: [&str; 3] = ["appendonly", "appendfsync", "maxmemory-policy"];

fn setting(name: &str, reply: Result<Value, redis::RedisError>) -> Setting {
    let value = reply.and_then(|v| match v {
        Value::ServerError(e) => Err(e.into()),
        v => redis::from_redis_value::<HashMap<String, String>>(v).map_err(Into::into),
    });
    match value {
        Ok(mut m) => m.remove(name).map_or_else(
            || Setting::Unknown("no such setting".into()),
            Setting::Known,
        ),
        Err(e) => Setting::Unknown(e.to_string()),
    }
}

/// A node none of whose settings could be read, for the reason `why`.
fn unknown_node(node: String, role: NodeRole, why: String) -> NodeReport {
    let why = Setting::Unknown(why);
    node_report(node, role, vec![why.clone(), why.clone(), why])
}

fn node_report(node: String, role: NodeRole, mut settings: Vec<Setting>) -> NodeReport {
    let maxmemory_policy = settings.pop().unwrap_or(Setting::Unknown("missing".into()));
    let appendfsync = settings.pop().unwrap_or(Setting::Unknown("missing".into()));
    let appendonly = settings.pop().unwrap_or(Setting::Unknown("missing".into()));
    NodeReport {
        node,
        role,
        appendonly,
        appendfsync,
        maxmemory_policy,
    }
}

/// Reads the role and settings of one server over `conn`.
pub(crate) async fn check_node<C: redis::aio::ConnectionLike>(
    node: String,
    conn: &mut C,
) -> NodeReport {
    let role = NodeRole::of(redis::cmd("ROLE").query_async(conn).await);
    let mut settings = Vec::new();
    for name in SETTINGS {
        let reply = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query_async(conn)
            .await;
        settings.push(setting(name, reply));
    }
    node_report(node, role, settings)
}

/// Connects to `client`'s server under the timeouts and reads its role and
/// settings; one that cannot be reached is reported with unknown settings.
pub(crate) async fn check_client(client: &redis::Client, t: crate::conn::Timeouts) -> NodeReport {
    let node = client.get_connection_info().addr().to_string();
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(t.connect))
        .set_response_timeout(Some(t.response));
    match client
        .get_multiplexed_async_connection_with_config(&config)
        .await
    {
        Ok(mut c) => check_node(node, &mut c).await,
        Err(e) => unknown_node(node, NodeRole::Unknown, format!("unreachable: {e}")),
    }
}

/// Each master's reply to `cmd`.
#[cfg(feature = "cluster")]
pub(crate) async fn on_all_masters(
    conn: &mut redis::cluster_async::ClusterConnection,
    cmd: redis::Cmd,
) -> Result<Vec<(String, Value)>, crate::RedisError> {
    use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
    let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    match conn.route_command(cmd, routing).await? {
        Value::Map(nodes) => Ok(nodes
            .into_iter()
            .map(|(node, v)| Ok((redis::from_redis_value::<String>(node)?, v)))
            .collect::<redis::RedisResult<Vec<_>>>()?),
        other => Err(crate::RedisError::Protocol(format!(
            "a command to all nodes: {other:?}"
        ))),
    }
}

/// Reads the role and settings of every node of a cluster: the masters
/// through the cluster client, the replicas (which it does not route to)
/// and the masters it has no connection to (frozen or unreachable when
/// it connected: reported unknown) each over a connection of its own,
/// made like `node`; a master it has a connection to that does not
/// answer fails the check (timed out), and one listed without an address
/// (`noaddr`) is reported unknown under its node id. Replicas that
/// cannot be listed (`CLUSTER NODES` refused) are one `replicas` entry
/// with unknown settings.
#[cfg(feature = "cluster")]
pub(crate) async fn check_cluster(
    conn: &mut redis::cluster_async::ClusterConnection,
    node: &redis::ConnectionInfo,
    t: crate::conn::Timeouts,
) -> Result<DurabilityReport, crate::RedisError> {
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    let mut by_node: std::collections::BTreeMap<String, (NodeRole, Vec<Setting>)> =
        Default::default();
    for (node, v) in on_all_masters(conn, redis::cmd("ROLE")).await? {
        by_node.insert(node, (NodeRole::of(Ok(v)), Vec::new()));
    }
    for name in SETTINGS {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(name);
        for (node, v) in on_all_masters(conn, cmd).await? {
            let entry = by_node
                .entry(node)
                .or_insert((NodeRole::Unknown, Vec::new()));
            entry.1.push(setting(name, Ok(v)));
        }
    }
    let mut nodes: Vec<NodeReport> = by_node
        .into_iter()
        .map(|(n, (role, s))| node_report(n, role, s))
        .collect();
    let random = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
    let topology = conn
        .route_command(redis::cmd("CLUSTER").arg("NODES").clone(), random)
        .await?;
    let topology: String = match topology {
        // Refused (an ACL without `+cluster|nodes`, a renamed command):
        // the replicas are unknown, as a refused `CONFIG GET` is, so
        // report mode starts and strict mode refuses.
        Value::ServerError(e) => {
            let why = format!(
                "the replicas could not be listed: {}",
                redis::RedisError::from(e)
            );
            nodes.push(unknown_node("replicas".into(), NodeRole::Replica, why));
            return Ok(DurabilityReport { nodes });
        }
        v => redis::from_redis_value(v).map_err(redis::RedisError::from)?,
    };
    // A master the client holds no connection to (frozen or unreachable
    // when it connected) is not among the replies above (one it holds a
    // connection to that stops answering fails the check: timed out); it
    // still holds its slots' counters, and
    // serves them again when it answers: reported, unreachable, never
    // left out (strict mode must not start on what it could not show).
    let reported: Vec<String> = nodes.iter().map(|n| n.node.clone()).collect();
    for listed in to_read(&topology, &reported) {
        let Some((host, port)) = listed.at else {
            let why = "listed without an address (noaddr): it cannot be asked".to_owned();
            nodes.push(unknown_node(listed.id, NodeRole::Unknown, why));
            continue;
        };
        let Some(at) = crate::conn::node_at(node.clone(), host, port) else {
            continue;
        };
        let client = redis::Client::open(at)?;
        nodes.push(check_client(&client, t).await);
    }
    Ok(DurabilityReport { nodes })
}

/// A server of a `CLUSTER NODES` reply that the check reads on a
/// connection of its own.
#[cfg(feature = "cluster")]
#[derive(Debug, PartialEq, Eq)]
struct Listed {
    /// How the report names it: its address (`host:port`), or its node id
    /// when it has none.
    id: String,
    /// Where it is asked; `None` for a master listed without an address
    /// (`noaddr`), which cannot be asked and is reported unknown.
    at: Option<(String, u16)>,
}

/// The servers of a `CLUSTER NODES` reply that the check reads on a
/// connection of its own: the replicas, then the masters not `reported`
/// (read through the cluster client). The client names a node as
/// `CLUSTER SLOTS` does: by its hostname where the cluster prefers them
/// (`cluster-preferred-endpoint-type`), which `CLUSTER NODES` lists after
/// the address.
#[cfg(feature = "cluster")]
fn to_read(cluster_nodes: &str, reported: &[String]) -> Vec<Listed> {
    let seen = |name: Option<&str>, port: u16| {
        name.is_some_and(|name| reported.iter().any(|r| *r == format!("{name}:{port}")))
    };
    let at = |(host, port): (String, u16)| Listed {
        id: format!("{host}:{port}"),
        at: Some((host, port)),
    };
    let (mut unseen, mut noaddr) = (Vec::new(), Vec::new());
    for master in masters_listed(cluster_nodes) {
        match master {
            Ok((host, hostname, port)) => {
                if !seen(Some(&host), port) && !seen(hostname.as_deref(), port) {
                    unseen.push(at((host, port)));
                }
            }
            Err(id) => noaddr.push(Listed { id, at: None }),
        }
    }
    replicas_in(cluster_nodes)
        .into_iter()
        .map(at)
        .chain(unseen)
        .chain(noaddr)
        .collect()
}

/// A master's address as `CLUSTER NODES` lists it: `host`, its hostname
/// if the cluster names one, `port`.
#[cfg(feature = "cluster")]
type MasterAt = (String, Option<String>, u16);

/// The masters a `CLUSTER NODES` reply lists that own slots, failed or not
/// (no other node serves their slots): `Ok((host, hostname, port))`, or
/// `Err(node id)` for one listed without an address (`noaddr`), which
/// cannot be asked.
#[cfg(feature = "cluster")]
fn masters_listed(cluster_nodes: &str) -> Vec<Result<MasterAt, String>> {
    cluster_nodes
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (addr, flags) = (f.get(1)?, f.get(2)?.split(',').collect::<Vec<_>>());
            if !flags.contains(&"master") || f.len() <= 8 {
                return None;
            }
            if flags.contains(&"noaddr") {
                return Some(Err(f[0].to_owned()));
            }
            // `ip:port@cport[,hostname]`
            let ip_port = addr.split(['@', ',']).next()?;
            let hostname = addr.split_once(',').map(|(_, h)| h.to_owned());
            let hostname = hostname.filter(|h| !h.is_empty());
            let (host, port) = ip_port.rsplit_once(':')?;
            Some(Ok((host.to_owned(), hostname, port.parse().ok()?)))
        })
        .collect()
}

/// The replicas (`host`, `port`) a `CLUSTER NODES` reply lists, except
/// those the cluster agrees have failed (`fail`: down, it cannot be
/// promoted; a later check reads it once it is back) or without an
/// address. One marked `fail?` is read: only the node asked suspects it
/// (a partition between those two), and the cluster may promote it, so
/// its settings matter as any replica's; if the check cannot reach it
/// either, it is reported unreachable (unknown).
#[cfg(feature = "cluster")]
fn replicas_in(cluster_nodes: &str) -> Vec<(String, u16)> {
    cluster_nodes
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (addr, flags) = (f.nth(1)?, f.next()?);
            let flags: Vec<&str> = flags.split(',').collect();
            let replica = flags.contains(&"slave") || flags.contains(&"replica");
            // Not `fail?`: only the node asked suspects it, and the
            // cluster may still promote it.
            if !replica || flags.iter().any(|g| matches!(*g, "fail" | "noaddr")) {
                return None;
            }
            // `ip:port@cport[,hostname]`
            let ip_port = addr.split(['@', ',']).next()?;
            let (host, port) = ip_port.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(aof: &str, policy: Setting) -> NodeReport {
        NodeReport {
            node: "n".into(),
            role: NodeRole::Master,
            appendonly: Setting::Known(aof.into()),
            appendfsync: Setting::Known("everysec".into()),
            maxmemory_policy: policy,
        }
    }

    #[test]
    fn judges_settings() {
        let good = DurabilityReport {
            nodes: vec![node("yes", Setting::Known("noeviction".into()))],
        };
        assert!(good.is_durable() && !good.is_known_bad());
        let lru = DurabilityReport {
            nodes: vec![node("yes", Setting::Known("volatile-lru".into()))],
        };
        assert!(!lru.is_durable() && lru.is_known_bad());
        assert!(lru.to_string().contains("volatile-lru"));
        let unknown = DurabilityReport {
            nodes: vec![node("yes", Setting::Unknown("NOPERM".into()))],
        };
        assert!(!unknown.is_durable() && !unknown.is_known_bad());
        assert!(!DurabilityReport::default().is_durable());
        let replica = NodeReport {
            role: NodeRole::Replica,
            ..node("no", Setting::Known("noeviction".into()))
        };
        assert!(replica.problems()[0].starts_with("n (replica): appendonly"));
    }

    /// A master listed without an address (`noaddr`) still owns its
    /// slots: it is reported (unknown: it cannot be asked), not left out.
    /// A replica only the node asked suspects (`fail?`, not agreed failed)
    /// can still be promoted: it is read; one agreed failed (`fail`) is
    /// not.
    #[cfg(feature = "cluster")]
    #[test]
    fn reads_a_noaddr_master_and_a_suspected_replica() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
e5 :0@0 master,noaddr - 0 0 2 disconnected 5461-10922
f6 127.0.0.1:7002@17002 master - 0 0 3 connected 10923-16383
b2 127.0.0.1:7003@17003 slave,fail? a1 0 1 4 connected
c3 127.0.0.1:7004@17004 slave,fail f6 0 1 4 disconnected
d4 127.0.0.1:7005@17005 slave f6 0 1 4 connected
";
        let reported = ["127.0.0.1:7000".to_owned(), "127.0.0.1:7002".to_owned()];
        let at = |port: u16| Listed {
            id: format!("127.0.0.1:{port}"),
            at: Some(("127.0.0.1".to_owned(), port)),
        };
        let noaddr = Listed {
            id: "e5".to_owned(),
            at: None,
        };
        assert_eq!(to_read(nodes, &reported), [at(7003), at(7005), noaddr]);
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn finds_replicas_in_cluster_nodes() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7003@17003,host.example slave a1 0 1 4 connected
c3 127.0.0.1:7004@17004 slave,fail a1 0 1 4 disconnected
d4 10.0.0.5:7005@17005 replica x 0 1 4 connected
";
        assert_eq!(
            replicas_in(nodes),
            [
                ("127.0.0.1".to_owned(), 7003),
                ("10.0.0.5".to_owned(), 7005)
            ]
        );
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
e5 127.0.0.1:7001@17001,db-1 master,fail - 0 0 2 disconnected 5461-10922
f6 127.0.0.1:7002@17002 master - 0 0 3 connected
b2 127.0.0.1:7003@17003 slave a1 0 1 4 connected
";
        // Failed or not, a master with slots; not one without.
        assert_eq!(
            masters_listed(nodes),
            [
                Ok(("127.0.0.1".to_owned(), None, 7000)),
                Ok(("127.0.0.1".to_owned(), Some("db-1".to_owned()), 7001))
            ]
        );
    }
}
