//! Connections, and their health.
//!
//! A backend holds `pool_size` slots; each slot holds one connection that
//! every call shares (multiplexed: concurrent calls are pipelined on it).
//! For one server the connection is a redis-rs [`ConnectionManager`], for
//! Redis Cluster the cluster client's connection; both are set up with the
//! builder's connect and response timeouts.
//!
//! `ConnectionManager` reconnects by itself when its socket is closed (a
//! restart), but not when the server stops answering: redis-rs classes a
//! response timeout as "retry immediately", not "reconnect", and the timeout
//! only fires inside the caller's future. A limiter gives up on a call after
//! tens of milliseconds, long before that, and drops the future: a silent
//! connection (a partition, a stopped host, a failover behind the same
//! address) would then serve every caller, forever.
//!
//! So the backend owns health, not its callers. Each slot has a keeper task.
//! A call that fails at the connection level (including a response
//! timeout), or that is dropped before its reply came back, only tells the
//! keeper (a [`Notify`]: a burst of suspicions makes one check, and nothing
//! depends on the caller surviving). The keeper sends its own `PING` under
//! the timeouts; when that gets no answer it takes the connection out of
//! the slot (callers then fail at once, and the limiter's fail mode
//! answers) and connects afresh, starting an attempt at most every
//! [`RETRY`], until a new connection answers.
//!
//! Failovers. A one-server connection must reach a master: the keeper's
//! check is `ROLE`, not `PING`, and a reply only a replica gives
//! (`READONLY`: a write that reached a replica; `MASTERDOWN`: a replica
//! cut off from its master that serves no stale data) makes the keeper
//! check too; where an ACL denies `ROLE`, that reply is what tells, and
//! fails the check. So a connection that followed an address to a demoted
//! master (a restart behind the same address, a DNS or virtual-IP
//! failover) is replaced like a dead one. With
//! Redis Sentinel every new connection first asks the sentinels where the
//! master is (see [`crate::sentinel`]), so the replacement reaches the
//! promoted replica; a connection a call found closed is taken out at
//! once and replaced, not checked: its manager would reconnect by itself to
//! the address it had, where the old master, restarted after a failover,
//! says `master` until the sentinels demote it (it is put back only when no
//! sentinel answers and its address still says `master`: the sentinels
//! down must not leave a healthy master with no connection). And every
//! [`MASTER_CHECK`], one task per backend asks the sentinels which master
//! they name (a frozen master that continued after its failover, while
//! this worker was idle, says `master` too, and no call fails on it): when
//! they name another that says it is one, it rings the keeper of every
//! slot whose connection is to another master, which replaces it. One
//! check per backend, not per slot: the answer is the same for every
//! slot. It runs beside the keepers, not in them: a keeper with a
//! suspicion (a failed call, a replica's reply) never waits behind a check
//! stuck on a silent sentinel, and lookups and checks take no turns (each
//! asks every sentinel at once, and takes the newest configuration's
//! master: see [`crate::sentinel`]).
//! A cluster connection follows the cluster's own topology changes
//! (redis-rs refreshes its slot map on `MOVED`, `READONLY` and a
//! connection that drops); its check asks the masters for
//! a `PING` and needs one answer, not all: one dead master must not take
//! the other masters' slots down with it.
//!
//! A cluster master that goes silent instead (a stopped process, a network
//! that forwards nothing: the sockets stay open, nothing answers) is
//! different: redis-rs takes a timeout as "retry on the same node", never
//! as a reason to refresh its slot map, and has no periodic refresh. After
//! the cluster promotes the replica, the connection would send those
//! slots to the silent node for ever. So the check also asks whether
//! *every* master in the connection's slot map answers. When one does not,
//! it asks a master that answers for the cluster's slot map (`CLUSTER
//! SLOTS`): while the silent node is still one of the cluster's masters
//! there is nothing to learn (its slots fail, the others are served); once
//! every master of the cluster answers through the connection, or is one
//! it has no connection to, its slot map is stale, and the keeper builds a
//! new connection from the cluster client and swaps it in, the old one
//! serving meanwhile, at most once per [`REBUILD`]. The new connection
//! learns the slot map from the nodes that answer. Not rebuilding earlier
//! matters: a connection built while the silent node still owns slots
//! sends them to its replica, which redirects them (`MOVED`) to the silent
//! node, and each redirection makes redis-rs refresh its slot map, holding
//! every request while it tries to reconnect to the silent node.
//!
//! A master that answers a new connection but not the one the connection
//! holds (its network path died under it: a NAT or firewall that lost its
//! state, a load balancer failed over) is still a master of the cluster,
//! and the cluster client would wait on that socket for ever. So a master
//! silent through the connection is asked again on a connection of its
//! own; when it answers there (a frozen process does not, nor one that
//! refuses every connection: `-LOADING` its data set), and every other
//! master answers too, the keeper rebuilds the connection as above. It is
//! asked beside the connection, not after it, so that a check waits out a
//! frozen master's silence once (asked after, the rebuild that follows its
//! promotion came up to a check later); and one silent there too is not
//! asked so again for [`ANEW`] (not a connection dialled to a frozen
//! process at every check of its failover). Every master is asked at
//! once: one after the other, a path that died under many masters (one
//! NAT in front of them) held the rebuild for a bound per master.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisFuture, RedisResult, ServerErrorKind, Value,
};
use tokio::sync::{Notify, Semaphore};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::error::RedisError;

/// The least time between two connection attempts of one slot's keeper.
/// Short, because it adds to the recovery time once Redis is reachable
/// again; an attempt on a silent path already takes the connect timeout.
pub(crate) const RETRY: Duration = Duration::from_millis(250);

/// The least time between two rebuilds of one slot's cluster connection
/// (see the module docs): a flood of timeouts must not become a flood of
/// reconnections.
#[cfg(feature = "cluster")]
pub(crate) const REBUILD: Duration = Duration::from_secs(1);

/// How long a cluster keeper waits, after a master silent through its
/// connection was silent on a connection of its own too, before asking one
/// anew again (see the module docs).
#[cfg(feature = "cluster")]
pub(crate) const ANEW: Duration = Duration::from_secs(5);

/// How often a Sentinel backend asks the sentinels whether they still name
/// its connections' master, with no call failing: a master frozen while
/// this worker was idle, failed over, then continued answers as a master
/// until the sentinels demote it (8 s later).
pub(crate) const MASTER_CHECK: Duration = Duration::from_secs(1);

/// A Sentinel master's address (`host`, `port`).
type Master = crate::sentinel::Master;

/// The timeouts every connection is made with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
}

impl Timeouts {
    /// The most one question on a new connection may take: connected,
    /// then answered.
    pub(crate) fn bound(self) -> Duration {
        self.connect.saturating_add(self.response)
    }
}

/// Makes a fresh connection for a slot.
#[derive(Clone)]
pub(crate) enum Connector {
    Single {
        client: redis::Client,
        config: ConnectionManagerConfig,
    },
    #[cfg(feature = "cluster")]
    Cluster {
        client: redis::cluster::ClusterClient,
        /// The whole connect (several nodes) is bounded by a multiple.
        connect_timeout: Duration,
        /// How to reach a node other than through the cluster client (the
        /// first URL's credentials and TLS): the durability check reads
        /// the replicas, which the client does not route to.
        node: Box<redis::ConnectionInfo>,
    },
    /// The master a Redis Sentinel names, asked anew on every connect.
    Sentinel {
        sentinel: crate::sentinel::Sentinels,
        config: ConnectionManagerConfig,
    },
}

impl Connector {
    /// One server, through a redis-rs connection manager with these
    /// timeouts.
    pub(crate) fn single(client: redis::Client, t: Timeouts) -> Self {
        Self::Single {
            client,
            config: manager_config(t),
        }
    }

    /// A connection that may not have connected yet (a manager connects on
    /// first use); the keeper's `PING` tells. With Sentinel, the master's
    /// address too.
    async fn connect(&self, t: Timeouts) -> RedisResult<(Link, Option<Master>)> {
        match self {
            Self::Single { client, config } => Ok((
                Link::single(
                    ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?,
                    t,
                ),
                None,
            )),
            Self::Sentinel { sentinel, config } => {
                // A manager follows its address on reconnection; after a
                // failover that address is a replica, and the keeper's
                // `ROLE` check sends us back here.
                let client = sentinel.master().await?;
                let master = match client.get_connection_info().addr() {
                    redis::ConnectionAddr::Tcp(host, port)
                    | redis::ConnectionAddr::TcpTls { host, port, .. } => {
                        Some((host.clone(), *port))
                    }
                    _ => None,
                };
                let link = ConnectionManager::new_lazy_with_config(client, config.clone())?;
                Ok((Link::single(link, t), master))
            }
            #[cfg(feature = "cluster")]
            Self::Cluster {
                client,
                connect_timeout,
                ..
            } => {
                // The cluster client connects to several nodes, each under
                // the connect timeout; bound the whole.
                match tokio::time::timeout(
                    connect_timeout.saturating_mul(3),
                    client.get_async_connection(),
                )
                .await
                {
                    Ok(c) => Ok((Link::Cluster(c?), None)),
                    Err(_) => Err(timed_out()),
                }
            }
        }
    }
}

/// The configuration of every one-server connection manager.
pub(crate) fn manager_config(t: Timeouts) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(t.connect))
        // The response timeout is the link's (`Link::Single`): left out of
        // a call whose caller gives up sooner, one timer instead of two.
        .set_response_timeout(None)
        // One attempt per (re)connection: the keeper paces the retries,
        // and a caller never waits behind a chain of back-offs.
        .set_number_of_retries(0)
}

/// One shared connection.
#[derive(Clone)]
pub(crate) enum Link {
    /// One server (or Sentinel's master): see [`Single`].
    Single(Single),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

/// A one-server connection manager, made with no response timeout: its
/// calls wait under the link's own (`tokio::time::timeout`, a timeout error
/// as redis-rs's own), unless the caller bounds the wait itself
/// (`caller_bound`, see [`Conn::eval`]). Under a limiter, whose timeout
/// (50 ms by default) ends the wait long before the response timeout
/// (500 ms), the response timeout was a second timer armed and cancelled
/// on every decision for nothing: ~5 % of the client's CPU a decision.
/// A call that finds the manager reconnecting waits for the connection
/// within its timeout; a new connection's first check is given the connect
/// timeout besides (see [`open`]).
#[derive(Clone)]
pub(crate) struct Single {
    pub(crate) manager: ConnectionManager,
    /// How long a call waits for its reply: the builder's response timeout
    /// (and the connect timeout besides for a new connection's first check).
    response: Duration,
    /// The caller gives up on this call no later than `response` after it
    /// is sent: the link arms no timer of its own.
    caller_bound: bool,
}

impl Single {
    /// The timeout this link's calls wait under: none when the caller
    /// bounds them.
    fn wait(&self) -> Option<Duration> {
        (!self.caller_bound).then_some(self.response)
    }
}

/// `call` under `wait` (a timeout error as redis-rs's own), or as it is.
fn timed<'a, T: Send + 'a>(wait: Option<Duration>, call: RedisFuture<'a, T>) -> RedisFuture<'a, T> {
    let Some(t) = wait else {
        return call;
    };
    Box::pin(async move {
        tokio::time::timeout(t, call)
            .await
            .unwrap_or_else(|_| Err(timed_out()))
    })
}

impl Link {
    fn single(manager: ConnectionManager, t: Timeouts) -> Self {
        Self::Single(Single {
            manager,
            response: t.response,
            caller_bound: false,
        })
    }

    /// This link with `f` applied to a one-server link's timeouts (a
    /// cluster's client keeps its own).
    fn with_timeouts(mut self, f: impl FnOnce(&mut Single)) -> Self {
        match &mut self {
            Self::Single(s) => f(s),
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => {}
        }
        self
    }

    /// This link with its calls waiting `wait` at most.
    fn waiting(self, wait: Duration) -> Self {
        self.with_timeouts(|s| s.response = wait)
    }

    /// This link for calls whose caller gives up on them no later than the
    /// response timeout would (`yes`: no timer of the link's own), or not.
    fn caller_bound(self, yes: bool) -> Self {
        self.with_timeouts(|s| s.caller_bound = yes)
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(s) => {
                let wait = s.wait();
                timed(wait, s.manager.req_packed_command(cmd))
            }
            #[cfg(feature = "cluster")]
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(s) => {
                let wait = s.wait();
                timed(wait, s.manager.req_packed_commands(pipeline, offset, count))
            }
            #[cfg(feature = "cluster")]
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(s) => s.manager.get_db(),
            #[cfg(feature = "cluster")]
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// A slot: its connection (none while the keeper replaces it) and the
/// keeper's doorbell.
#[derive(Default)]
struct Slot {
    /// The connection, and how many times it was set (so that a call can
    /// take out the connection it used, not its replacement).
    link: Mutex<(Option<Link>, u64)>,
    suspect: Notify,
    /// A call was answered as only a replica answers (`READONLY`,
    /// `MASTERDOWN`) since the keeper's last check: the connection reached
    /// a replica, which tells when `ROLE` is denied.
    replica: AtomicBool,
    /// Whether the connection is to the master the sentinels name.
    sentinel: bool,
    /// That master's address, when the connection was made.
    master: Mutex<Option<Master>>,
    /// The master the sentinels named instead, when the backend's master
    /// check found it (with a ring of the keeper).
    named: Mutex<Option<Master>>,
    /// A call found such a connection closed, and took it out of the slot:
    /// its manager would reconnect by itself, to the address it had, where
    /// the old master, restarted after a failover, says `master` until the
    /// sentinels demote it. Kept for the keeper, which puts it back only
    /// when no sentinel names another master (none answers: silent, down)
    /// and its address still says `master`.
    closed: Mutex<Option<Link>>,
}

impl Slot {
    fn get(&self) -> Option<Link> {
        lock(&self.link).0.clone()
    }

    /// The connection, with its generation (for [`close`](Self::close)).
    fn checkout(&self) -> Option<(Link, u64)> {
        let link = lock(&self.link);
        Some((link.0.clone()?, link.1))
    }

    fn set(&self, link: Option<Link>) {
        let mut slot = lock(&self.link);
        *slot = (link, slot.1.wrapping_add(1));
    }

    /// Takes out the connection of `generation`, unless it was replaced.
    fn close(&self, generation: u64) {
        let mut slot = lock(&self.link);
        if slot.1 == generation {
            let link = slot.0.take();
            slot.1 = generation.wrapping_add(1);
            *lock(&self.closed) = link;
        }
    }
}

/// Whether an error means the connection itself failed (it is gone, or it
/// did not answer in time) or reached a replica (see [`from_replica`]: a
/// failover happened behind it), as opposed to a command error on a
/// healthy connection.
fn breaks(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || e.code().is_some_and(from_replica)
}

/// Whether an error reply's `code` is one only a replica gives: `READONLY`
/// (a write), `MASTERDOWN` (any command, on a replica cut off from its
/// master with `replica-serve-stale-data no`).
fn from_replica(code: &str) -> bool {
    matches!(code, "READONLY" | "MASTERDOWN")
}

fn timed_out() -> redis::RedisError {
    std::io::Error::from(std::io::ErrorKind::TimedOut).into()
}

/// Whether `link` answers within the timeouts, and reaches a master: a
/// one-server link's `ROLE` must say `master`; a cluster link needs one
/// master to answer a `PING` (the cluster client tracks each node itself).
/// A reply that is a server error (`LOADING`, `ROLE` denied by an ACL)
/// still proves the connection alive; but with `ROLE` denied, a one-server
/// link answered as only a replica answers since the last check (`replica`)
/// reached a replica, and fails the check.
async fn answers(link: &mut Link, t: Timeouts, replica: bool) -> Result<(), redis::RedisError> {
    let check = async {
        match link {
            Link::Single(_) => {
                let role = match redis::cmd("ROLE").query_async::<Value>(&mut *link).await {
                    Ok(role) => role,
                    Err(e) if replica && !breaks(&e) => {
                        return Err(std::io::Error::other(format!(
                            "connected to a replica (a replica's reply; ROLE: {e})"
                        ))
                        .into());
                    }
                    Err(e) => return Err(e),
                };
                match role_of(&role) {
                    Some(r) if r != "master" => Err(std::io::Error::other(format!(
                        "connected to a {r}, not a master (a failover?)"
                    ))
                    .into()),
                    _ => Ok(()),
                }
            }
            #[cfg(feature = "cluster")]
            Link::Cluster(c) => {
                use redis::cluster_routing::{
                    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo,
                };
                let any = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::OneSucceeded),
                ));
                c.route_command(redis::cmd("PING"), any).await.map(drop)
            }
        }
    };
    // The link's own timeouts bound this already; the outer bound keeps the
    // keeper from hanging on a client that retries internally.
    match tokio::time::timeout(t.bound(), check).await {
        Err(_) => Err(timed_out()),
        Ok(Err(e)) if breaks(&e) => Err(e),
        Ok(_) => Ok(()),
    }
}

/// What a cluster connection's check found (see the module docs).
#[cfg(feature = "cluster")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum View {
    /// Every master in its slot map answers.
    Whole,
    /// A master of the cluster does not answer: nothing to learn until the
    /// cluster fails it over.
    Silent,
    /// A master in its slot map does not answer and is no master of the
    /// cluster any more: the slot map is stale.
    Stale,
    /// A master does not answer through the connection but answers a new
    /// one (and every other answers): the connection's path to it died (a
    /// NAT or firewall that lost its state, a load balancer failed over),
    /// and the cluster client would wait on it for ever.
    DeadPath,
}

/// Checks a cluster connection's masters against the cluster's own view;
/// `node` is how to reach a node on a connection of its own, to ask a
/// master silent through the connection again (`anew`, else it is taken
/// for silent). Also says whether a master asked anew did not answer.
#[cfg(feature = "cluster")]
async fn view(
    c: &mut redis::cluster_async::ClusterConnection,
    t: Timeouts,
    node: &redis::ConnectionInfo,
    anew: bool,
) -> (View, bool) {
    use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
    let masters =
        |policy| RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, Some(policy)));
    // The client retries a timeout on the same node: bound each step.
    let bound = t.bound();
    let ping = c.route_command(redis::cmd("PING"), masters(ResponsePolicy::AllSucceeded));
    if let Ok(Ok(_)) = tokio::time::timeout(bound, ping).await {
        return (View::Whole, false);
    }
    let slots = redis::cmd("CLUSTER").arg("SLOTS").clone();
    let slots = c.route_command(slots, masters(ResponsePolicy::OneSucceeded));
    let Ok(Ok(slots)) = tokio::time::timeout(bound, slots).await else {
        return (View::Silent, false);
    };
    // Every master at once: each silent one costs the check a bound, and
    // one after the other, a path that died under many (one NAT in front
    // of them) held the rebuild for as many bounds.
    let mut asks = tokio::task::JoinSet::new();
    for (host, port) in masters_of(&slots) {
        let node = anew.then(|| node.clone());
        asks.spawn(ask(c.clone(), host, port, t, node));
    }
    let (mut dead_path, mut silent, mut silent_anew) = (false, false, false);
    while let Some(asked) = asks.join_next().await {
        match asked {
            Ok(Asked::Answers) => {}
            Ok(Asked::DeadPath) => dead_path = true,
            Ok(Asked::Silent { anew }) => {
                silent = true;
                silent_anew |= anew;
            }
            Err(_) => silent = true,
        }
    }
    if silent {
        return (View::Silent, silent_anew);
    }
    let view = if dead_path {
        View::DeadPath
    } else {
        View::Stale
    };
    (view, false)
}

/// What a master of the cluster's slot map said to a check (see [`view`]).
#[cfg(feature = "cluster")]
enum Asked {
    /// Through the connection, or it is one the connection does not know.
    Answers,
    /// Silent through the connection; a new connection answers.
    DeadPath,
    /// Silent, or refusing (`-BUSY`); `anew`: asked on a connection of its
    /// own, and silent there too.
    Silent { anew: bool },
}

/// Asks the master at `host:port` for a `PING` through the connection
/// `c`, and, with `node` (how to reach a node), on a connection of its own
/// beside it.
#[cfg(feature = "cluster")]
async fn ask(
    mut c: redis::cluster_async::ClusterConnection,
    host: String,
    port: u16,
    t: Timeouts,
    node: Option<redis::ConnectionInfo>,
) -> Asked {
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    let bound = t.bound();
    let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: host.clone(),
        port,
    });
    // Asked anew beside the connection, not after it: a check waits out a
    // frozen master once, not twice (and the rebuild after its promotion
    // comes no later than without this question).
    let fresh = node.map(|node| tokio::spawn(answers_anew(node, host, port, t)));
    let through = tokio::time::timeout(bound, c.route_command(redis::cmd("PING"), at)).await;
    let answered = match &through {
        Ok(Ok(_)) => true,
        // A master the connection does not know: stale too (redis-rs
        // also starts reconnecting it to the URLs' nodes, which the
        // rebuild makes moot).
        Ok(Err(e)) if e.kind() == ErrorKind::ClusterConnectionNotFound => true,
        // A reply (`-BUSY`, `NOPERM`): the path works, the server
        // refuses; a new connection would change nothing. (Not
        // `-LOADING`: the cluster client waits on it and asks again,
        // past the bound; `answers_anew` tells it from a dead path.)
        Ok(Err(e)) if e.code().is_some() => {
            fresh.inspect(|f| f.abort());
            return Asked::Silent { anew: false };
        }
        _ => false,
    };
    if answered {
        fresh.inspect(|f| f.abort());
        return Asked::Answers;
    }
    // Silent through the connection only: a new one answers.
    let Some(fresh) = fresh else {
        return Asked::Silent { anew: false };
    };
    if fresh.await.unwrap_or(false) {
        Asked::DeadPath
    } else {
        Asked::Silent { anew: true }
    }
}

/// How to reach the cluster node at `host:port` as `node` is reached
/// (its TLS, its credentials); `None` for an address that is no TCP one.
#[cfg(feature = "cluster")]
pub(crate) fn node_at(
    node: redis::ConnectionInfo,
    host: String,
    port: u16,
) -> Option<redis::ConnectionInfo> {
    let mut addr = node.addr().clone();
    match &mut addr {
        redis::ConnectionAddr::Tcp(h, p) => (*h, *p) = (host, port),
        redis::ConnectionAddr::TcpTls {
            host: h, port: p, ..
        } => (*h, *p) = (host, port),
        _ => return None,
    }
    Some(node.set_addr(addr))
}

/// Whether the node at `host:port`, reached like `node` on a connection
/// of its own, answers a `PING` within the timeouts, as it would serve a
/// new connection: `PONG`, or `NOPERM` (an ACL that denies `PING`). A
/// frozen node does not: its kernel accepts the connection, and nothing
/// answers. Nor does one that refuses every connection (`-LOADING` its
/// data set, `-BUSY`, `-MASTERDOWN`, a handshake refused): the cluster
/// client waits on such a reply and asks again (`-LOADING`), so the
/// `PING` through the connection timed out too, and a new connection
/// would change nothing.
#[cfg(feature = "cluster")]
async fn answers_anew(node: redis::ConnectionInfo, host: String, port: u16, t: Timeouts) -> bool {
    let Some(node) = node_at(node, host, port) else {
        return false;
    };
    let Ok(client) = redis::Client::open(node) else {
        return false;
    };
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(t.connect))
        .set_response_timeout(Some(t.response));
    let ping = async {
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("PING").query_async::<Value>(&mut conn).await
    };
    match tokio::time::timeout(t.bound(), ping).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm),
        Err(_) => false,
    }
}

/// The masters (`host`, `port`) of a `CLUSTER SLOTS` reply: the first node
/// of each slot range, once each, without those whose address is unknown.
#[cfg(feature = "cluster")]
fn masters_of(reply: &Value) -> Vec<(String, u16)> {
    let mut masters = Vec::new();
    let Value::Array(ranges) = reply else {
        return masters;
    };
    for range in ranges {
        let Value::Array(fields) = range else {
            continue;
        };
        let Some(Value::Array(node)) = fields.get(2) else {
            continue;
        };
        let host = match node.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => continue,
        };
        let port = match node.get(1) {
            Some(Value::Int(p)) => u16::try_from(*p).ok(),
            _ => None,
        };
        if let Some(port) = port
            && !host.is_empty()
            && host != "?"
            && !masters.contains(&(host.clone(), port))
        {
            masters.push((host, port));
        }
    }
    masters
}

/// `cmd`, an `EVALSHA`, as the `EVAL` of the script's source `code`: the
/// same keys and arguments, so that a client routes it, and follows a
/// redirection, as it does the `EVALSHA`; the server that runs it holds
/// the script for the next `EVALSHA` (and [`pin`] has it loaded, so that
/// it keeps it).
///
/// Not a `SCRIPT LOAD` then the `EVALSHA` again: a cluster client sends a
/// `SCRIPT LOAD` to the masters of its slot map only, never to a node it
/// reaches by `-ASK` (a node added for a resharding, which holds no
/// script: every key of a slot migrating to it failed `NOSCRIPT` until the
/// migration ended). Hence the grant of `EVAL` (docs/redis.md, "ACL").
fn eval_of(cmd: &Cmd, code: &str) -> Cmd {
    let mut eval = redis::cmd("EVAL");
    eval.arg(code);
    for arg in cmd.args_iter().skip(2) {
        if let redis::Arg::Simple(a) = arg {
            eval.arg(a);
        }
    }
    eval
}

/// Loads the script `code` (`SCRIPT LOAD`) in the background on `link`,
/// after a server that did not hold it was sent it by `EVAL`: a server
/// may evict the scripts it was sent by `EVAL` (Valkey 8.1+, Redis 7.4+:
/// the least recently used beyond 500, when other clients run scripts of
/// their own), not those it loaded; every decision would then pay
/// `NOSCRIPT` and the script again. A cluster client sends it to the
/// masters it knows (a node it reaches by `-ASK` keeps the `EVAL`'s).
/// Best effort: a failure, or no runtime to run it on, leaves it as it was.
fn pin(link: &Link, code: &'static str) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    // Under the link's own timeout: not the caller's, gone by then.
    let mut link = link.clone().caller_bound(false);
    runtime.spawn(async move {
        let mut load = redis::cmd("SCRIPT");
        let _: RedisResult<()> = load.arg("LOAD").arg(code).exec_async(&mut link).await;
    });
}

/// `cmd` sent again to a server that did not hold its script, as an
/// `EVAL` of `code`, the script then loaded in the background; where
/// `EVAL` is denied, the script loaded (`SCRIPT LOAD`), then `cmd` again.
async fn reload<T: FromRedisValue>(
    link: &mut Link,
    cmd: &Cmd,
    code: &'static str,
) -> RedisResult<T> {
    match eval_of(cmd, code).query_async(&mut *link).await {
        // A user not granted `EVAL` (the least set before it was needed):
        // the script loaded, then the call again. (Not a command the
        // script runs that is denied: the script would run twice.)
        Err(e)
            if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
                && e.detail().is_some_and(|d| d.contains("'eval'")) =>
        {
            let mut load = redis::cmd("SCRIPT");
            match load.arg("LOAD").arg(code).exec_async(&mut *link).await {
                Ok(()) => cmd.query_async(link).await,
                Err(e) => Err(e),
            }
        }
        r => {
            if r.is_ok() {
                pin(link, code);
            }
            r
        }
    }
}

/// A new connection that answers (with Sentinel, and the master's
/// address).
async fn open(connector: &Connector, t: Timeouts) -> RedisResult<(Link, Option<Master>)> {
    let (link, master) = connector.connect(t).await?;
    // Its first call connects, then asks: the connect and the response
    // timeouts, as when the manager held the response timeout.
    answers(&mut link.clone().waiting(t.bound()), t, false).await?;
    Ok((link, master))
}

/// Whether the sentinels name another master than the slot's connection's
/// (`false` too when they cannot be asked): a lookup, for a keeper.
async fn moved(slot: &Slot, connector: &Connector) -> bool {
    let Connector::Sentinel { sentinel, .. } = connector else {
        return false;
    };
    let Some(at) = lock(&slot.master).clone() else {
        return false;
    };
    match sentinel.named().await {
        Ok(named) if !named.names(&at) => trusted(sentinel, &named).await.is_some(),
        _ => false,
    }
}

/// The first master of `named` (the newest configuration the sentinels
/// know) that says it is one, as a lookup checks: a sentinel that names a
/// replica (misconfigured) does not take away a connection that no lookup
/// would replace.
async fn trusted(
    sentinel: &crate::sentinel::Sentinels,
    named: &crate::sentinel::Named,
) -> Option<Master> {
    for m in &named.masters {
        if sentinel.says_master(m.0.clone(), m.1).await {
            return Some(m.clone());
        }
    }
    None
}

/// A Sentinel backend's master check (see the module docs): every
/// [`MASTER_CHECK`], asks the sentinels which master they name, and rings
/// the keeper of every slot whose connection is to another one.
async fn check_master(slots: Box<[Arc<Slot>]>, sentinel: crate::sentinel::Sentinels) {
    loop {
        tokio::time::sleep(MASTER_CHECK).await;
        let masters: Vec<Option<Master>> = slots
            .iter()
            .map(|s| s.get().and(lock(&s.master).clone()))
            .collect();
        // No connection to compare (all being replaced): nothing to ask.
        if masters.iter().all(Option::is_none) {
            continue;
        }
        let Some(Ok(named)) = sentinel.check_named().await else {
            continue;
        };
        let elsewhere = |m: &Option<Master>| m.as_ref().is_some_and(|m| !named.names(m));
        if !masters.iter().any(elsewhere) {
            continue;
        }
        let Some(master) = trusted(&sentinel, &named).await else {
            continue;
        };
        for (slot, at) in slots.iter().zip(&masters) {
            if elsewhere(at) {
                *lock(&slot.named) = Some(master.clone());
                slot.suspect.notify_one();
            }
        }
    }
}

/// The role in a `ROLE` reply (`master`, `slave`, `sentinel`).
pub(crate) fn role_of(reply: &Value) -> Option<String> {
    match reply {
        Value::Array(items) => match items.first() {
            Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Some(Value::SimpleString(s)) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// A slot's keeper: checks the connection when told to suspect it, and
/// replaces it when it does not answer. Runs until the backend is dropped.
async fn keep(slot: Arc<Slot>, connector: Connector, t: Timeouts) {
    #[cfg(feature = "cluster")]
    let mut follow = Follow::default();
    // When the last connection attempt started: attempts start at most
    // every RETRY, across replacements too (a replica's reply with `ROLE`
    // denied replaces a connection that may reach the replica again).
    let mut attempted: Option<Instant> = None;
    loop {
        slot.suspect.notified().await;
        // The master check found the sentinels naming another master than
        // the connection's (unless it was replaced since).
        let named = lock(&slot.named).take();
        let at = lock(&slot.master).clone();
        let elsewhere = match (named, at) {
            (Some(named), Some(at)) if named != at => Some(
                std::io::Error::other(format!(
                    "the sentinels name {}:{} the master, not {}:{}",
                    named.0, named.1, at.0, at.1
                ))
                .into(),
            ),
            _ => None,
        };
        let replica = slot.replica.swap(false, Ordering::Relaxed);
        let mut closed = lock(&slot.closed).take();
        let error = match slot.get() {
            Some(_) if elsewhere.is_some() => elsewhere,
            None if closed.is_some() => Some(
                std::io::Error::other("the connection closed; asking the sentinels again").into(),
            ),
            Some(mut link) => match answers(&mut link, t, replica).await {
                Ok(()) => {
                    #[cfg(feature = "cluster")]
                    if let Link::Cluster(c) = &mut link {
                        follow.check(&slot, &connector, c, t).await;
                    }
                    continue;
                }
                Err(e) => Some(e),
            },
            None => None,
        };
        if let Some(e) = &error {
            tracing::warn!(
                error = e as &dyn std::error::Error,
                "tollgate: a redis connection stopped answering; replacing it"
            );
        }
        // Callers fail at once instead of waiting on a dead connection.
        slot.set(None);
        let mut failures = 0u32;
        loop {
            if let Some(at) = attempted {
                tokio::time::sleep_until(at + RETRY).await;
            }
            let started = Instant::now();
            attempted = Some(started);
            match open(&connector, t).await {
                Ok((link, master)) => {
                    *lock(&slot.master) = master;
                    slot.set(Some(link));
                    if error.is_some() || failures > 0 {
                        tracing::info!(failures, "tollgate: redis connection restored");
                    }
                    break;
                }
                Err(e) => {
                    // A closed connection the sentinels cannot replace:
                    // kept when none names another master (none answers)
                    // and its address still says `master`, rather than
                    // no connection until the sentinels return.
                    if let Some(link) = &mut closed
                        && !moved(&slot, &connector).await
                        && answers(link, t, false).await.is_ok()
                    {
                        slot.set(closed.take());
                        tracing::info!(
                            error = &e as &dyn std::error::Error,
                            "tollgate: no sentinel names another redis master; \
                             keeping the connection to its master"
                        );
                        break;
                    }
                    // One line when the outage starts, not one per attempt.
                    if failures == 0 && error.is_none() {
                        tracing::warn!(
                            error = &e as &dyn std::error::Error,
                            "tollgate: cannot connect to redis; retrying in the background"
                        );
                    }
                    failures += 1;
                }
            }
        }
    }
}

/// A cluster keeper's state for a master that stopped answering (see the
/// module docs).
#[cfg(feature = "cluster")]
struct Follow {
    /// When the connection was last rebuilt.
    rebuilt: Option<Instant>,
    /// When a master silent through the connection was last asked on a
    /// connection of its own and did not answer there either (a frozen
    /// process): none is asked so again for [`ANEW`].
    silent_anew: Option<Instant>,
    /// The last check's finding: logged when it changes, not at each check.
    last: View,
}

#[cfg(feature = "cluster")]
impl Default for Follow {
    fn default() -> Self {
        Self {
            rebuilt: None,
            silent_anew: None,
            last: View::Whole,
        }
    }
}

#[cfg(feature = "cluster")]
impl Follow {
    /// Replaces the slot's connection `c` when its slot map is stale, or
    /// its path to a master died, at most once per [`REBUILD`].
    async fn check(
        &mut self,
        slot: &Slot,
        connector: &Connector,
        c: &mut redis::cluster_async::ClusterConnection,
        t: Timeouts,
    ) {
        let Connector::Cluster { node, .. } = connector else {
            return;
        };
        let anew = self.silent_anew.is_none_or(|at| at.elapsed() >= ANEW);
        let (now, silent_anew) = view(c, t, node, anew).await;
        if silent_anew {
            self.silent_anew = Some(Instant::now());
        }
        let last = std::mem::replace(&mut self.last, now);
        match now {
            View::Whole if last != View::Whole => {
                tracing::info!("tollgate: every redis cluster master answers again");
            }
            View::Silent if last == View::Whole => tracing::warn!(
                "tollgate: a redis cluster master does not answer; \
                 its slots fail until the cluster fails it over"
            ),
            View::Stale | View::DeadPath
                if self.rebuilt.is_none_or(|at| at.elapsed() >= REBUILD) =>
            {
                match now {
                    _ if last == now => {}
                    View::Stale => tracing::warn!(
                        "tollgate: a redis cluster master that does not answer was failed \
                         over; reconnecting to learn the new topology"
                    ),
                    _ => tracing::warn!(
                        "tollgate: a redis cluster master answers a new connection but not \
                         this one (its network path died); reconnecting"
                    ),
                }
                self.rebuilt = Some(Instant::now());
                // A failed attempt keeps the old connection: the masters
                // that answer go on serving through it.
                if let Ok((link, _)) = open(connector, t).await {
                    slot.set(Some(link));
                }
            }
            _ => {}
        }
    }
}

/// The checkout of a slot for one call. Dropped before
/// [`settle`](Self::settle) (the caller gave up, its reply unseen), it asks
/// the keeper to check the connection.
struct Watch<'a> {
    slot: &'a Slot,
    /// The generation of the slot's connection the call used.
    generation: u64,
    armed: bool,
    /// Exclusive mode: the slot's index, returned to the idle list.
    exclusive: Option<(&'a Exclusive, usize)>,
}

impl Watch<'_> {
    fn settle<T>(mut self, r: &RedisResult<T>) {
        self.armed = false;
        if let Err(e) = r
            && breaks(e)
        {
            if e.code().is_some_and(from_replica) {
                self.slot.replica.store(true, Ordering::Relaxed);
            }
            if e.is_connection_dropped() && self.slot.sentinel {
                self.slot.close(self.generation);
            }
            self.slot.suspect.notify_one();
        }
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.slot.suspect.notify_one();
        }
        if let Some((ex, i)) = self.exclusive {
            lock(&ex.idle).push(i);
            ex.permits.add_permits(1);
        }
    }
}

/// Exclusive (classic pool) mode: one call per connection at a time.
struct Exclusive {
    permits: Semaphore,
    idle: Mutex<Vec<usize>>,
    wait: Duration,
}

impl Exclusive {
    /// Waits (at most `wait`) for a slot no call holds, and takes it: its
    /// index, given back by the watch's drop.
    async fn take(&self) -> Result<usize, RedisError> {
        let permit = tokio::time::timeout(self.wait, self.permits.acquire())
            .await
            .map_err(|_| RedisError::PoolTimeout(self.wait))?
            .map_err(|_| RedisError::PoolTimeout(self.wait))?;
        permit.forget();
        Ok(lock(&self.idle).pop().unwrap_or(0))
    }
}

/// The backend's connections.
pub(crate) struct Conn {
    slots: Box<[Arc<Slot>]>,
    next: AtomicUsize,
    exclusive: Option<Exclusive>,
    ping_on_checkout: bool,
    timeouts: Timeouts,
    cluster: bool,
    /// The slots' keepers, and a Sentinel backend's master check.
    keepers: Vec<AbortHandle>,
    connector: Connector,
}

/// How the slots are used.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    pub(crate) size: u32,
    /// `Some(wait)`: hold a connection for the whole call, waiting at most
    /// this long for one.
    pub(crate) exclusive: Option<Duration>,
    pub(crate) ping_on_checkout: bool,
}

impl Conn {
    /// Connects every slot now; fails if one cannot connect.
    pub(crate) async fn connect(
        connector: Connector,
        t: Timeouts,
        usage: Usage,
    ) -> Result<Self, RedisError> {
        let mut links = Vec::new();
        for _ in 0..usage.size.max(1) {
            links.push(Some(open(&connector, t).await?));
        }
        Ok(Self::start(&connector, t, usage, links))
    }

    /// Starts with no connection: the keepers connect in the background.
    /// Needs a Tokio runtime.
    pub(crate) fn lazy(connector: &Connector, t: Timeouts, usage: Usage) -> Self {
        let links = (0..usage.size.max(1)).map(|_| None).collect();
        Self::start(connector, t, usage, links)
    }

    fn start(
        connector: &Connector,
        t: Timeouts,
        usage: Usage,
        links: Vec<Option<(Link, Option<Master>)>>,
    ) -> Self {
        let cluster = match connector {
            Connector::Single { .. } | Connector::Sentinel { .. } => false,
            #[cfg(feature = "cluster")]
            Connector::Cluster { .. } => true,
        };
        let slots: Box<[Arc<Slot>]> = links
            .into_iter()
            .map(|link| {
                let slot = Arc::new(Slot {
                    sentinel: matches!(connector, Connector::Sentinel { .. }),
                    ..Slot::default()
                });
                match link {
                    Some((link, master)) => {
                        *lock(&slot.master) = master;
                        slot.set(Some(link));
                    }
                    // Connect now, without waiting for a caller.
                    None => slot.suspect.notify_one(),
                }
                slot
            })
            .collect();
        let mut keepers: Vec<AbortHandle> = slots
            .iter()
            .map(|s| tokio::spawn(keep(s.clone(), connector.clone(), t)).abort_handle())
            .collect();
        if let Connector::Sentinel { sentinel, .. } = connector {
            let check = check_master(slots.clone(), sentinel.clone());
            keepers.push(tokio::spawn(check).abort_handle());
        }
        let exclusive = usage.exclusive.map(|wait| Exclusive {
            permits: Semaphore::new(slots.len()),
            idle: Mutex::new((0..slots.len()).collect()),
            wait,
        });
        Self {
            slots,
            next: AtomicUsize::new(0),
            exclusive,
            ping_on_checkout: usage.ping_on_checkout,
            timeouts: t,
            cluster,
            keepers,
            connector: connector.clone(),
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// How this backend connects (the durability check asks Sentinel for
    /// the replicas).
    pub(crate) fn connector(&self) -> &Connector {
        &self.connector
    }

    pub(crate) fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// A slot's connection for one call: round robin, or (exclusive mode)
    /// an idle slot.
    async fn checkout(&self) -> Result<(Link, Watch<'_>), RedisError> {
        // The rare paths (exclusive checkout, a ping on checkout) are
        // boxed: inline, they made every call's future 1.6 KB larger, moved
        // and polled on every decision.
        let (i, exclusive) = match &self.exclusive {
            // One slot (the default): no shared counter to bump.
            None if self.slots.len() == 1 => (0, None),
            None => (
                self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len(),
                None,
            ),
            Some(ex) => {
                let i = Box::pin(ex.take()).await?;
                (i, Some((ex, i)))
            }
        };
        let slot = &self.slots[i];
        let mut watch = Watch {
            slot,
            generation: 0,
            armed: true,
            exclusive,
        };
        let (mut link, generation) = slot.checkout().ok_or(RedisError::Disconnected)?;
        watch.generation = generation;
        if self.ping_on_checkout
            && let Err(e) = Box::pin(answers(&mut link, self.timeouts, false)).await
        {
            watch.settle::<()>(&Err(e));
            return Err(RedisError::Disconnected);
        }
        Ok((link, watch))
    }

    /// Runs the script whose source is `code` by its `EVALSHA` `cmd`; a
    /// server that does not hold it (restarted, failed over, added to a
    /// cluster, `SCRIPT FLUSH`) is sent the call again as an `EVAL` of the
    /// source (see [`eval_of`]), and then loaded in the background (see
    /// [`pin`]); where `EVAL` is denied, the script is loaded (`SCRIPT
    /// LOAD`), then called again.
    pub(crate) async fn eval<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        code: &'static str,
    ) -> Result<T, RedisError> {
        self.eval_within(cmd, code, false).await
    }

    /// [`eval`](Self::eval) for a caller that gives up on it no later than
    /// the response timeout would (`caller_bound`, as a limiter at its
    /// timeout: see `Backend::decide_within`): then no response timer is
    /// armed for it. The caller's giving up is a dropped call, which rings
    /// the keeper as a timed-out one does.
    pub(crate) async fn eval_within<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        code: &'static str,
        caller_bound: bool,
    ) -> Result<T, RedisError> {
        let (link, watch) = self.checkout().await?;
        let mut link = link.caller_bound(caller_bound);
        let r = match cmd.query_async(&mut link).await {
            // Boxed: a server without the script is rare.
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                Box::pin(reload(&mut link, cmd, code)).await
            }
            r => r,
        };
        watch.settle(&r);
        Ok(r?)
    }

    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, RedisError> {
        let (mut link, watch) = self.checkout().await?;
        let r = cmd.query_async(&mut link).await;
        watch.settle(&r);
        Ok(r?)
    }

    /// Sends a pipeline in one round trip.
    pub(crate) async fn pipeline<T: FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, RedisError> {
        let (mut link, watch) = self.checkout().await?;
        let r = pipe.query_async::<Value>(&mut link).await;
        // A pipeline that ignores errors answers each command's error as
        // its item: a replica's reply among them says what it says of a
        // call.
        let replica = match &r {
            Ok(Value::Array(items)) => items.iter().find_map(|v| match v {
                Value::ServerError(e) if from_replica(e.code()) => {
                    Some(redis::RedisError::from(e.clone()))
                }
                _ => None,
            }),
            _ => None,
        };
        match replica {
            Some(e) => watch.settle::<()>(&Err(e)),
            None => watch.settle(&r),
        }
        Ok(redis::from_redis_value(r?).map_err(redis::RedisError::from)?)
    }

    /// A connection for the durability check.
    pub(crate) fn link(&self) -> Result<Link, RedisError> {
        self.slots[0].get().ok_or(RedisError::Disconnected)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        for k in &self.keepers {
            k.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(all(test, feature = "cluster"))]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.into()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    fn range(start: i64, end: i64, nodes: Vec<Value>) -> Value {
        let mut fields = vec![Value::Int(start), Value::Int(end)];
        fields.extend(nodes);
        Value::Array(fields)
    }

    #[test]
    fn masters_of_cluster_slots() {
        let reply = Value::Array(vec![
            range(
                0,
                5460,
                vec![node("10.0.0.1", 6379), node("10.0.0.4", 6379)],
            ),
            range(5461, 6000, vec![node("10.0.0.2", 6380)]),
            // A master owning two ranges is listed once.
            range(6001, 10922, vec![node("10.0.0.2", 6380)]),
            // An unknown endpoint cannot be asked.
            range(10923, 16383, vec![node("", 6379)]),
        ]);
        assert_eq!(
            masters_of(&reply),
            [("10.0.0.1".to_owned(), 6379), ("10.0.0.2".to_owned(), 6380)]
        );
        assert!(masters_of(&Value::Nil).is_empty());
    }
}
