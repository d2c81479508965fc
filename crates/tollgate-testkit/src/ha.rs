//! High-availability topologies on loopback ports, for failover tests:
//! a Redis Sentinel setup ([`RedisSentinel`]: a master, a replica, three
//! sentinels) and a Redis Cluster with a replica per master
//! ([`RedisCluster::start_with_replicas`]); and a cluster's topology
//! changes: a node killed and restarted, a slot migrated to another
//! master ([`RedisCluster::start_migration`]).
//!
//! With [`RedisSentinelBuilder::tls`] the Sentinel setup speaks TLS only
//! (no plain port, one throwaway CA), for `rediss+sentinel://`.
//!
//! Every process is a [`RedisServer`] (the sentinels are `redis-server
//! --sentinel`, the same binary as the `redis-sentinel` command), so they
//! are killed when the topology is dropped, or when the test process ends.
//! The timings are short, so that a failover takes a couple of seconds and
//! not the production defaults' half a minute.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate_testkit::ha::RedisSentinel;
//!
//! let Some(mut ha) = RedisSentinel::start() else { return };
//! let url = ha.url(); // redis+sentinel://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>/tollgate
//! let old = ha.kill_master();
//! let new = ha.wait_promoted(old, Duration::from_secs(30)).expect("a failover");
//! # let _ = (url, new);
//! ```

use std::time::{Duration, Instant};

use std::path::PathBuf;

use crate::redis_server::{
    RedisCluster, RedisServer, RedisServerBuilder, Server, TlsCerts, available, make_certs,
    temp_dir, tls_args,
};

/// How long a topology may take to settle (sentinels discovering each
/// other, replicas syncing) before the start panics.
const SETTLE: Duration = Duration::from_secs(30);

/// Settings of a [`RedisSentinel`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisSentinelBuilder {
    server: RedisServerBuilder,
    master_name: String,
    down_after: Duration,
    failover_timeout: Duration,
    tls: bool,
    tls_auth_clients: bool,
}

impl Default for RedisSentinelBuilder {
    fn default() -> Self {
        Self {
            server: RedisServerBuilder::default(),
            master_name: "tollgate".into(),
            down_after: Duration::from_millis(500),
            failover_timeout: Duration::from_secs(2),
            tls: false,
            tls_auth_clients: false,
        }
    }
}

impl RedisSentinelBuilder {
    /// The settings of the master and its replica (default: the
    /// [`RedisServer`] defaults).
    pub fn server(mut self, server: RedisServerBuilder) -> Self {
        self.server = server;
        self
    }

    /// `sentinel down-after-milliseconds` (default 500 ms; production
    /// defaults to 30 s).
    pub fn down_after(mut self, d: Duration) -> Self {
        self.down_after = d;
        self
    }

    /// `sentinel failover-timeout` (default 2 s; production defaults to
    /// 3 min).
    pub fn failover_timeout(mut self, d: Duration) -> Self {
        self.failover_timeout = d;
        self
    }

    /// TLS only, everywhere: the master, the replica and the sentinels
    /// listen with TLS and no plain port (`port 0`), replicate and monitor
    /// over TLS (`tls-replication yes`), all with one throwaway CA
    /// ([`TlsCerts::ca_cert_pem`]) whose certificate names 127.0.0.1
    /// and localhost; [`url`](RedisSentinel::url) is then a
    /// `rediss+sentinel://` URL.
    pub fn tls(mut self, yes: bool) -> Self {
        self.tls = yes;
        self
    }

    /// With [`tls`](Self::tls): the master, the replica and the sentinels
    /// all demand a client certificate signed by the throwaway CA
    /// (`tls-auth-clients yes`, Redis's default on a TLS port; see
    /// [`TlsCerts::client_cert_file`]). They present their own
    /// certificate to each other.
    pub fn tls_auth_clients(mut self, yes: bool) -> Self {
        self.tls_auth_clients = yes;
        self
    }

    /// The monitored master's name (default `tollgate`).
    pub fn master_name(mut self, name: &str) -> Self {
        self.master_name = name.into();
        self
    }

    /// Starts the master, its replica and three sentinels with a quorum of
    /// two, and returns once the sentinels know each other and the replica
    /// (a failover needs both); `None` when Redis is not installed (outside
    /// CI).
    pub fn start(self) -> Option<RedisSentinel> {
        if !available() {
            return None;
        }
        let certs = self.tls.then(|| {
            let dir = temp_dir("redis-sentinel-ca");
            make_certs(&dir);
            dir
        });
        let server = match &certs {
            Some(dir) => self
                .server
                .clone()
                .tls_only(true)
                .tls_auth_clients(self.tls_auth_clients)
                .certs(dir)
                .arg("tls-replication", "yes"),
            None => self.server.clone(),
        };
        let master = server.clone().start()?;
        let replica = server
            .raw_args(["--replicaof", "127.0.0.1", &master.port().to_string()])
            .start()?;
        let deadline = Instant::now() + SETTLE;
        while !replica
            .cli(&["info", "replication"])
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "the replica did not sync");
            std::thread::sleep(Duration::from_millis(20));
        }
        let sentinels = (0..3)
            .map(|_| self.sentinel(master.port(), certs.as_deref()))
            .collect();
        let ha = RedisSentinel {
            certs,
            master_name: self.master_name.clone(),
            servers: vec![master, replica],
            sentinels,
            settings: self,
        };
        while !ha.settled() {
            assert!(
                Instant::now() < deadline,
                "the sentinels did not discover each other and the replica"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(ha)
    }

    fn sentinel(&self, master_port: u16, certs: Option<&std::path::Path>) -> RedisServer {
        let dir = temp_dir("redis-sentinel");
        let name = &self.master_name;
        let conf = dir.join("sentinel.conf");
        // Sentinel rewrites its file (it records what it learns there).
        std::fs::write(
            &conf,
            format!(
                "sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {name} {}\n\
                 sentinel failover-timeout {name} {}\n\
                 sentinel parallel-syncs {name} 1\n",
                self.down_after.as_millis(),
                self.failover_timeout.as_millis()
            ),
        )
        .expect("write sentinel.conf");
        let mut s = RedisServer {
            server: Server::Redis,
            port: 0,
            tls_port: None,
            tls_only: certs.is_some(),
            certs: certs.map(ToOwned::to_owned),
            dir,
            config: Some(conf),
            args: Vec::new(),
            process: None,
            own_session: false,
        };
        let started = s.spawn_on_free_port(false, |s, port| {
            let mut args = vec!["--sentinel".to_owned()];
            if let Some(certs) = certs {
                // TLS to clients, and to the servers and other sentinels.
                args.extend(tls_args(certs, port, self.tls_auth_clients));
                args.extend(["--tls-replication".into(), "yes".into()]);
            }
            s.tls_port = certs.map(|_| port);
            s.args = args;
        });
        match started {
            Ok(()) => s,
            Err(e) => panic!("could not start a sentinel: {e}"),
        }
    }
}

/// A Redis Sentinel topology on `127.0.0.1`: a master, one replica and
/// three sentinels (quorum 2) watching it; every process is killed on drop.
#[derive(Debug)]
pub struct RedisSentinel {
    /// The CA and certificate of a TLS topology, removed on drop.
    certs: Option<PathBuf>,
    master_name: String,
    /// The first master, then its replica. Their roles change with a
    /// failover; the sentinels say which is the master now.
    servers: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
    /// What it was started with, for [`start_sentinel`](Self::start_sentinel).
    settings: RedisSentinelBuilder,
}

impl RedisSentinel {
    /// A topology with the default settings (see [`RedisSentinelBuilder`]).
    pub fn start() -> Option<Self> {
        Self::builder().start()
    }

    /// Settings for a new topology.
    pub fn builder() -> RedisSentinelBuilder {
        RedisSentinelBuilder::default()
    }

    /// `redis+sentinel://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>/<master name>`
    /// (`rediss+sentinel://` with [`RedisSentinelBuilder::tls`]).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        let scheme = if self.certs.is_some() {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        format!("{scheme}://{}/{}", hosts.join(","), self.master_name)
    }

    /// The monitored master's name.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The data servers: the first master, then its replica.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The data servers, to stop, kill or restart one.
    pub fn servers_mut(&mut self) -> &mut [RedisServer] {
        &mut self.servers
    }

    /// The sentinels.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The master's port as the first answering sentinel names it.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let out = s.cli(&["sentinel", "get-master-addr-by-name", &self.master_name]);
            out.lines().nth(1)?.trim().parse().ok()
        })
    }

    /// Starts one more sentinel, apart from the topology's three and with
    /// their settings, that monitors the server on `port` under the
    /// master's name; it is killed when dropped. It meets the topology
    /// only through that server (the replicas that server lists, the other
    /// sentinels' hello messages on it). Given a server the topology no
    /// longer knows (an old master cut off after a failover: see the
    /// Sentinel tests of `tollgate-redis`), it is a sentinel cut off with
    /// that server: it names it, with the configuration epoch a sentinel
    /// starts with (0), whatever the topology has done since.
    pub fn start_sentinel(&self, port: u16) -> RedisServer {
        self.settings.sentinel(port, self.certs.as_deref())
    }

    /// Kills the current master (`SIGKILL`, a crash) and returns its port.
    pub fn kill_master(&mut self) -> u16 {
        let master = self.master_mut();
        master.kill();
        master.port()
    }

    /// Freezes the current master ([`RedisServer::pause`], `SIGSTOP`: a
    /// hung host; its sockets stay open, the kernel still accepts and
    /// acknowledges, nothing answers) and returns its port. The sentinels
    /// fail it over as they would a dead one. [`server`](Self::server)
    /// reaches it to [`resume`](RedisServer::resume) it (it comes back
    /// believing it is the master, until the sentinels demote it); drop
    /// kills it either way.
    pub fn pause_master(&mut self) -> u16 {
        let master = self.master_mut();
        master.pause();
        master.port()
    }

    /// The data server on `port`.
    pub fn server(&self, port: u16) -> Option<&RedisServer> {
        self.servers.iter().find(|s| s.port() == port)
    }

    /// The data server the sentinels name as the master.
    fn master_mut(&mut self) -> &mut RedisServer {
        let port = self.master_port().expect("the sentinels name a master");
        self.servers
            .iter_mut()
            .find(|s| s.port() == port)
            .expect("the master is one of ours")
    }

    /// Waits until the sentinels name a master other than `old` and that
    /// server says it is one; its port, or `None` after `timeout`.
    pub fn wait_promoted(&self, old: u16, timeout: Duration) -> Option<u16> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(port) = self.master_port()
                && port != old
                && self
                    .server(port)
                    .is_some_and(|s| s.cli(&["role"]).starts_with("master"))
            {
                return Some(port);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Waits until every sentinel names `port` the master (after a
    /// failover, the sentinels that did not lead it learn of it from the
    /// leader's hello messages, every 2 s: until then a client asking one
    /// of them is sent to the old master); `false` after `timeout`.
    pub fn wait_sentinels_agree(&self, port: u16, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let named = |s: &RedisServer| {
                let out = s.cli(&["sentinel", "get-master-addr-by-name", &self.master_name]);
                out.lines()
                    .nth(1)
                    .and_then(|l| l.trim().parse::<u16>().ok())
            };
            if self.sentinels.iter().all(|s| named(s) == Some(port)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Whether every sentinel knows the two others and the replica.
    fn settled(&self) -> bool {
        self.sentinels.iter().all(|s| {
            let out = s.cli(&["sentinel", "master", &self.master_name]);
            let fields: Vec<&str> = out.lines().collect();
            let field = |name: &str| {
                fields
                    .iter()
                    .position(|l| *l == name)
                    .and_then(|i| fields.get(i + 1).copied())
            };
            field("num-other-sentinels") == Some("2") && field("num-slaves") == Some("1")
        })
    }
}

impl TlsCerts for RedisSentinel {
    fn certs_dir(&self) -> Option<&std::path::Path> {
        self.certs.as_deref()
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        if let Some(dir) = &self.certs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Waits until `server` is a replica in sync with its master (after a
/// restart, a failed-over master rejoins as one); whether it did within
/// `timeout`.
pub fn wait_synced(server: &RedisServer, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let info = server.cli(&["info", "replication"]);
        if info.contains("role:slave") && info.contains("master_link_status:up") {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

impl RedisCluster {
    /// Three masters with one replica each, `cluster-node-timeout 1000`
    /// (a failover takes a couple of seconds) and
    /// `cluster-require-full-coverage no` (the masters that are up keep
    /// serving their slots while another one is down); `None` when Redis
    /// is not installed (outside CI). Over TLS:
    /// `RedisCluster::builder().tls(true).replicas(1).start()`.
    pub fn start_with_replicas() -> Option<Self> {
        Self::builder().replicas(1).start()
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, asked of a running node).
    pub fn keyslot(&self, key: &str) -> u16 {
        self.ask(&["cluster", "keyslot", key])
            .trim()
            .parse()
            .expect("CLUSTER KEYSLOT answers a number")
    }

    /// The index in [`nodes`](Self::nodes) of the master serving `slot`,
    /// as a running node (not paused) sees it.
    pub fn master_of(&self, slot: u16) -> Option<usize> {
        self.masters_of(slot..=slot)[0]
    }

    /// [`master_of`](Self::master_of) for each slot of `slots`, read at
    /// once (one `CLUSTER NODES`).
    pub fn masters_of(&self, slots: std::ops::RangeInclusive<u16>) -> Vec<Option<usize>> {
        let nodes = self.ask(&["cluster", "nodes"]);
        let masters: Vec<(usize, Vec<(u16, u16)>)> = nodes
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let flags = f.get(2)?;
                if !flags.contains("master") || flags.contains("fail") {
                    return None;
                }
                let ranges = f.iter().skip(8).filter_map(|range| {
                    let mut ends = range.split('-').map(|n| n.parse::<u16>().ok());
                    match (ends.next().flatten(), ends.next()) {
                        (Some(a), None) => Some((a, a)),
                        (Some(a), Some(Some(b))) => Some((a, b)),
                        _ => None,
                    }
                });
                let addr = f.get(1)?.split('@').next()?;
                let port = addr.rsplit(':').next()?.parse::<u16>().ok()?;
                let i = self.nodes.iter().position(|n| n.port() == port)?;
                Some((i, ranges.collect()))
            })
            .collect();
        slots
            .map(|slot| {
                let serves = |r: &Vec<(u16, u16)>| r.iter().any(|&(a, b)| (a..=b).contains(&slot));
                masters.iter().find(|(_, r)| serves(r)).map(|&(i, _)| i)
            })
            .collect()
    }

    /// Kills node `i` (`SIGKILL`, a crash).
    pub fn kill_node(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Starts node `i` again, on its port and data directory (its
    /// `nodes.conf`): it rejoins the cluster, as a replica if it was failed
    /// over meanwhile.
    pub fn restart_node(&mut self, i: usize) {
        self.nodes[i].restart();
    }

    /// Freezes node `i` (`SIGSTOP`, see [`RedisServer::pause`]): its
    /// sockets stay open and nothing answers, so the other nodes fail it
    /// over after `cluster-node-timeout`. The helpers here stop asking it
    /// until [`resume_node`](Self::resume_node).
    pub fn pause_node(&self, i: usize) {
        self.nodes[i].pause();
    }

    /// Continues node `i` after [`pause_node`](Self::pause_node)
    /// (`SIGCONT`): it learns the cluster's newer epoch and, if it was
    /// failed over meanwhile, rejoins as a replica.
    pub fn resume_node(&self, i: usize) {
        self.nodes[i].resume();
    }

    /// Waits until a running master other than node `old` serves `slot`
    /// and every running node says the cluster is ok (paused nodes are
    /// not asked); its index, or `None` after `timeout`.
    pub fn wait_promoted(&self, slot: u16, old: usize, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(i) = self.master_of(slot)
                && i != old
                && answers(&self.nodes[i])
                && self
                    .nodes
                    .iter()
                    .filter(|n| answers(n))
                    .all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok"))
            {
                return Some(i);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Starts moving `slot` from its master to node `to`, as a resharding
    /// does (`CLUSTER SETSLOT <slot> IMPORTING` on `to`, then `MIGRATING`
    /// on the master): until [`finish_migration`](Self::finish_migration),
    /// the master answers `-ASK` for the slot's keys it does not hold (new
    /// ones, moved ones), and `to` serves them only after `ASKING`. Returns
    /// the master's index.
    pub fn start_migration(&self, slot: u16, to: usize) -> usize {
        let from = self.master_of(slot).expect("a master serves the slot");
        assert_ne!(from, to, "slot {slot} is on node {to} already");
        let n = slot.to_string();
        let steps = [(to, "importing", from), (from, "migrating", to)];
        for (at, state, other) in steps {
            let out = self.nodes[at].cli(&["cluster", "setslot", &n, state, &self.id(other)]);
            assert_eq!(out.trim(), "OK", "CLUSTER SETSLOT {n} {state}: {out}");
        }
        from
    }

    /// Moves every key `slot` holds on node `from` to node `to`, in one
    /// `MIGRATE` (so the keys of one hash tag move together); how many.
    pub fn migrate_keys(&self, slot: u16, from: usize, to: usize) -> usize {
        let listed = self.nodes[from].cli(&["cluster", "getkeysinslot", &slot.to_string(), "1000"]);
        let keys: Vec<&str> = listed.lines().filter(|k| !k.is_empty()).collect();
        if keys.is_empty() {
            return 0;
        }
        let port = self.nodes[to].port().to_string();
        let mut args = vec!["migrate", "127.0.0.1", &port, "", "0", "5000", "keys"];
        args.extend(&keys);
        let out = self.nodes[from].cli(&args);
        assert_eq!(out.trim(), "OK", "MIGRATE {keys:?}: {out}");
        keys.len()
    }

    /// Ends a migration: every running master gives `slot` to node `to`
    /// (`CLUSTER SETSLOT <slot> NODE`, `to` first, as `redis-cli --cluster`
    /// does), so the old master answers `-MOVED`. Move the keys first
    /// ([`migrate_keys`](Self::migrate_keys)).
    pub fn finish_migration(&self, slot: u16, to: usize) {
        let (n, id) = (slot.to_string(), self.id(to));
        let others = (0..self.nodes.len()).filter(|&i| i != to);
        for i in std::iter::once(to).chain(others) {
            let node = &self.nodes[i];
            if answers(node) && node.cli(&["role"]).starts_with("master") {
                let out = node.cli(&["cluster", "setslot", &n, "node", &id]);
                assert_eq!(out.trim(), "OK", "CLUSTER SETSLOT {n} NODE: {out}");
            }
        }
    }

    /// Node `i`'s cluster id (`CLUSTER MYID`).
    fn id(&self, i: usize) -> String {
        self.nodes[i].cli(&["cluster", "myid"]).trim().to_owned()
    }

    /// `redis-cli <args>` on the first running node.
    fn ask(&self, args: &[&str]) -> String {
        let node = self
            .nodes
            .iter()
            .find(|n| answers(n))
            .expect("a running node");
        node.cli(args)
    }
}

/// Whether `redis-cli` can ask the node: it runs, and is not paused.
fn answers(node: &RedisServer) -> bool {
    node.is_running() && !node.is_paused()
}
