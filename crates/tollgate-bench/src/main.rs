//! `tollgate-bench`: the load tool.
//!
//! Measures decisions per second and latency percentiles of a backend at a
//! given concurrency and key spread. For the Redis backend it measures its
//! peers in the same run, on the same server, alternating rounds, and
//! prints the ratio library / peer, in wall-clock throughput and in
//! decisions per second of redis-server CPU (read from `INFO cpu` around
//! every round). The peers (`--peers`, any of them):
//!
//! * `bare`: the same script as the library (same KEYS, same ARGV) sent by
//!   a bare redis client: what the library adds around its script;
//! * `gcra`: a bare redis client sending the smallest correct token bucket
//!   (`lua/minimal_gcra.lua`: server TIME, one GET, one SET with PX, one
//!   integer reply, as the library's script answers): what the library's
//!   script costs over the least a token bucket needs.
//!
//! ```text
//! cargo run --release -p tollgate-bench -- --backend redis --spawn-server \
//!     --concurrency 50 --keys 10000 --duration 8s --rounds 4 --peers bare,gcra
//! ```
//!
//! Besides the human-readable lines, every path prints one `result` line
//! (`result path=<name> decisions=<n> seconds=<wall> server_cpu=<s>
//! client_cpu=<s> errors=<n>`) that scripts/bench-peers.sh sums over runs.
//! `client_cpu` is this process's CPU: the client side of a path, as its
//! peers' in the same process.
//!
//! Only loopback servers are targets: `--url` must point at 127.0.0.0/8 or
//! localhost, and every run is bounded by `--duration` (at most 60 s).

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use redis::aio::MultiplexedConnection;
use tollgate_limiter::{
    Backend, ConfigError, Key, Limiter, Op, Policy, Request, SlidingWindow, Strategy, TokenBucket,
};
use tollgate_memory::MemoryBackend;
use tollgate_redis::{Durability, RedisBackend, encoding, scripts};
use tollgate_testkit::redis_server::RedisServer;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    Memory,
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StrategyKind {
    TokenBucket,
    SlidingWindow,
}

/// A peer measured against the library on the same server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Peer {
    /// The library's own script through a bare redis client.
    Bare,
    /// The minimal GCRA script through a bare redis client.
    Gcra,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Self::Bare => "bare",
            Self::Gcra => "gcra",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PathKind {
    Limiter,
    Backend,
}

#[derive(Debug, Parser)]
#[command(about = "Load tool for tollgate backends (loopback only, bounded runs)")]
struct Args {
    /// Which backend to measure.
    #[arg(long, value_enum, default_value = "redis")]
    backend: BackendKind,
    /// The Redis server (loopback only).
    #[arg(long, default_value = "redis://127.0.0.1:6379", env = "REDIS_URL")]
    url: String,
    /// Start a throwaway redis-server on a free loopback port instead.
    #[arg(long)]
    spawn_server: bool,
    /// Concurrent tasks issuing decisions.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Distinct keys, chosen at random per decision (1 = one hot key).
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Measuring time per path (split over the rounds), e.g. `5s`.
    #[arg(long, default_value = "4s", value_parser = parse_duration)]
    duration: Duration,
    /// Rounds per path, alternating the library and its peers.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Strategy of the limiter.
    #[arg(long, value_enum, default_value = "token-bucket")]
    strategy: StrategyKind,
    /// Pool size of the Redis backend.
    #[arg(long, default_value_t = 1)]
    pool_size: u32,
    /// Hold a pooled connection for the whole call (classic pool).
    #[arg(long)]
    exclusive_checkout: bool,
    /// PING on every checkout.
    #[arg(long)]
    test_on_check_out: bool,
    /// What the library path calls: the `Limiter` (timeout, breaker: what
    /// consumers use) or `Backend::decide` directly.
    #[arg(long, value_enum, default_value = "limiter")]
    path: PathKind,
    /// The peers measured against the library, in this order within a
    /// round (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "bare")]
    peers: Vec<Peer>,
    /// Measure no peer (same as an empty `--peers`).
    #[arg(long)]
    no_bare: bool,
    /// Run the peers before the library in every round (the opposite
    /// order: two runs, one each way, cancel an order effect).
    #[arg(long)]
    peers_first: bool,
    /// Lease mode: the `Limiter` takes this many units per round trip and
    /// spends them locally (1 = off).
    #[arg(long, default_value_t = 1)]
    lease: u64,
    /// Local denials: a key refused by the backend is answered locally
    /// (refused) until its retry time, at most this long, e.g. `1s`.
    #[arg(long, value_parser = parse_duration)]
    local_denials: Option<Duration>,
    /// The limiter's per-decision timeout (default: the library's, 50 ms;
    /// above zero, at most 60 s).
    #[arg(long, value_parser = parse_timeout)]
    timeout: Option<Duration>,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} in {s:?}"))?;
    // Runs stay bounded.
    if d.is_zero() || d > Duration::from_secs(60) {
        return Err("must be above zero and at most 60s".into());
    }
    Ok(d)
}

/// A `--timeout`: bounded like a run; whether the limiter takes it
/// (above zero) is the limiter's rule, checked by `try_build`.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} in {s:?}"))?;
    if d > Duration::from_secs(60) {
        return Err("must be at most 60s".into());
    }
    Ok(d)
}

fn is_loopback(url: &str) -> bool {
    let rest = url.split("://").nth(1).unwrap_or("");
    let host_port = rest.rsplit('@').next().unwrap_or("");
    let host = host_port.split(['/', '?']).next().unwrap_or("");
    let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
    host == "localhost" || host.starts_with("127.") || host == "[::1]"
}

/// Latencies and counts of one path.
#[derive(Debug, Default)]
struct Stats {
    decisions: u64,
    errors: u64,
    elapsed: Duration,
    /// Seconds of redis-server CPU (user + system) spent during the rounds.
    server_cpu: f64,
    /// Seconds of this process's CPU (user + system, every thread) spent
    /// during the rounds: what the client side of a path costs.
    client_cpu: f64,
    latencies_us: Vec<u32>,
}

impl Stats {
    fn merge(&mut self, other: Stats) {
        self.decisions += other.decisions;
        self.errors += other.errors;
        self.elapsed += other.elapsed;
        self.server_cpu += other.server_cpu;
        self.client_cpu += other.client_cpu;
        self.latencies_us.extend(other.latencies_us);
    }

    fn rate(&self) -> f64 {
        self.decisions as f64 / self.elapsed.as_secs_f64()
    }

    /// Decisions per second of redis-server CPU (0 when not measured).
    fn per_server_cpu(&self) -> f64 {
        if self.server_cpu > 0.0 {
            self.decisions as f64 / self.server_cpu
        } else {
            0.0
        }
    }

    /// Decisions per second of this process's CPU (0 when not measured).
    fn per_client_cpu(&self) -> f64 {
        if self.client_cpu > 0.0 {
            self.decisions as f64 / self.client_cpu
        } else {
            0.0
        }
    }

    fn percentile(&mut self, p: f64) -> u32 {
        if self.latencies_us.is_empty() {
            return 0;
        }
        self.latencies_us.sort_unstable();
        let i = ((self.latencies_us.len() - 1) as f64 * p).round() as usize;
        self.latencies_us[i]
    }

    fn line(&mut self, name: &str) -> String {
        let mut line = format!(
            "{name:<8} {:>10.0} decisions/s   p50 {:>5} µs   p99 {:>5} µs   errors {}",
            self.rate(),
            self.percentile(0.50),
            self.percentile(0.99),
            self.errors
        );
        if self.server_cpu > 0.0 {
            line += &format!(
                "   {:>8.0} decisions per server-CPU second",
                self.per_server_cpu()
            );
        }
        if self.client_cpu > 0.0 {
            line += &format!("   {:>8.0} per client-CPU second", self.per_client_cpu());
        }
        line
    }

    /// The machine-readable line scripts/bench-peers.sh sums over runs.
    fn result(&self, name: &str) -> String {
        format!(
            "result path={name} decisions={} seconds={:.6} server_cpu={:.6} client_cpu={:.6} errors={}",
            self.decisions,
            self.elapsed.as_secs_f64(),
            self.server_cpu,
            self.client_cpu,
            self.errors
        )
    }
}

/// A small xorshift: key choice must cost nothing next to a decision.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Runs `concurrency` tasks calling `op(key index)` until `duration` is up.
async fn drive<F, Fut>(concurrency: usize, keys: u64, duration: Duration, op: F) -> Stats
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let op = Arc::clone(&op);
            tokio::spawn(async move {
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1);
                let mut s = Stats::default();
                while Instant::now() < deadline {
                    let k = if keys <= 1 { 0 } else { next(&mut rng) % keys };
                    let t = Instant::now();
                    let ok = op(k).await;
                    s.latencies_us
                        .push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
                    if ok {
                        s.decisions += 1;
                    } else {
                        s.errors += 1;
                    }
                }
                s
            })
        })
        .collect();
    let mut total = Stats::default();
    for t in tasks {
        total.merge(t.await.expect("task panicked"));
    }
    total.elapsed = start.elapsed();
    total
}

fn policy(kind: StrategyKind) -> Policy {
    match kind {
        // Large enough that most decisions pass and write.
        StrategyKind::TokenBucket => TokenBucket::new(1_000, 1_000, Duration::from_secs(1))
            .unwrap()
            .into(),
        StrategyKind::SlidingWindow => SlidingWindow::new(100, Duration::from_secs(1))
            .unwrap()
            .into(),
    }
}

fn key_names(keys: u64) -> Arc<Vec<Key>> {
    Arc::new(
        (0..keys.max(1))
            .map(|i| Key::new(format!("client-{i}")))
            .collect(),
    )
}

async fn library<B: Backend + Clone>(
    args: &Args,
    backend: B,
    duration: Duration,
) -> Result<Stats, String> {
    let names = key_names(args.keys);
    if args.path == PathKind::Backend {
        let policy = policy(args.strategy);
        return Ok(drive(args.concurrency, args.keys, duration, move |k| {
            let backend = backend.clone();
            let names = Arc::clone(&names);
            async move {
                let req = Request {
                    limiter: "bench",
                    key: &names[k as usize],
                    policy: &policy,
                    op: Op::Acquire(1),
                };
                backend.decide(req).await.is_ok()
            }
        })
        .await);
    }
    // What a user calls: `check`; a verdict without a decision is a
    // backend failure.
    let limiter = limiter(args, backend)?;
    Ok(drive(args.concurrency, args.keys, duration, move |k| {
        let limiter = limiter.clone();
        let names = Arc::clone(&names);
        async move { limiter.check(&names[k as usize]).await.decision().is_some() }
    })
    .await)
}

/// The limiter of the library path over `backend`: default settings
/// (breaker, fail-closed) but for the flags; a flag the limiter refuses is
/// an error naming the flag.
fn limiter<B: Backend>(args: &Args, backend: B) -> Result<Limiter<B>, String> {
    let mut builder = Limiter::builder("bench", policy(args.strategy), backend);
    if args.lease > 1 {
        builder = builder.lease(args.lease, Duration::from_secs(1));
    }
    if let Some(ttl) = args.local_denials {
        builder = builder.local_denials(ttl);
    }
    if let Some(timeout) = args.timeout {
        builder = builder.timeout(timeout);
    }
    builder.try_build().map_err(|e| match e {
        ConfigError::Invalid { field, reason, .. } => {
            let flag = match field {
                "lease" => "--lease",
                "timeout" => "--timeout",
                _ => field,
            };
            format!("{flag}: {reason}")
        }
        e => e.to_string(),
    })
}

/// The same EVALSHA a decision sends (same keys, same arguments, built the
/// same way), on one shared multiplexed connection of a bare redis client.
async fn bare(args: &Args, conn: MultiplexedConnection, duration: Duration) -> Stats {
    let policy = policy(args.strategy);
    let script = Arc::new(redis::Script::new(scripts::source(policy.strategy())));
    let encoded = Arc::new(encoding::script_arg(&policy).unwrap());
    let names = key_names(args.keys);
    let window = policy.strategy() == Strategy::SlidingWindow;
    let bucket = match &policy {
        Policy::TokenBucket(b) => Some(encoding::bucket_args(b)),
        _ => None,
    };
    drive(args.concurrency, args.keys, duration, move |k| {
        let (script, encoded, names) = (
            Arc::clone(&script),
            Arc::clone(&encoded),
            Arc::clone(&names),
        );
        let mut conn = conn.clone();
        async move {
            // The keys and arguments of `lua/common.lua`: state (no key
            // override: a limiter without per-key overrides, as here),
            // then a sliding window's log; operation, policy (the others
            // at their defaults are not sent). The token bucket's script
            // takes its own: the bucket's interval and tau, alone (see
            // `lua/token_bucket.lua`).
            let state = format!("bench-bare:bench:{{{}}}", names[k as usize].as_str());
            let mut inv = script.prepare_invoke();
            inv.key(&state);
            if window {
                inv.key(format!("{state}:log"));
            }
            match bucket {
                Some([interval, tau]) => inv.arg(interval).arg(tau),
                None => inv.arg(1).arg(encoded.as_str()),
            };
            inv.invoke_async::<redis::Value>(&mut conn).await.is_ok()
        }
    })
    .await
}

/// The smallest correct token bucket (see `lua/minimal_gcra.lua`).
const MINIMAL_GCRA: &str = include_str!("../lua/minimal_gcra.lua");

/// A bare client sending the minimal GCRA script, for the same bucket as
/// the library's token bucket (the `gcra` peer). Refusals count as
/// decisions, as the library's do.
async fn gcra(args: &Args, conn: MultiplexedConnection, duration: Duration) -> Stats {
    let Policy::TokenBucket(bucket) = policy(StrategyKind::TokenBucket) else {
        unreachable!("a token bucket")
    };
    let interval = bucket.period().as_micros() as u64 / bucket.refill();
    let tau = bucket.capacity() * interval;
    let script = Arc::new(redis::Script::new(MINIMAL_GCRA));
    let names = key_names(args.keys);
    drive(args.concurrency, args.keys, duration, move |k| {
        let (script, names) = (Arc::clone(&script), Arc::clone(&names));
        let mut conn = conn.clone();
        async move {
            let key = format!("bench-gcra:{{{}}}", names[k as usize].as_str());
            script
                .key(key)
                .arg(interval)
                .arg(tau)
                .invoke_async::<i64>(&mut conn)
                .await
                .is_ok()
        }
    })
    .await
}

/// redis-server's CPU time so far (user + system, all its threads), in
/// seconds, from `INFO cpu`.
async fn server_cpu(conn: &mut MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .expect("INFO cpu");
    info.lines()
        .filter_map(|l| {
            let (name, value) = l.trim().split_once(':')?;
            matches!(name, "used_cpu_user" | "used_cpu_sys").then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// This process's CPU time so far (user + system, every thread), in
/// seconds, from `/proc/self/stat` (in the kernel's fixed 100 Hz ticks:
/// 10 ms resolution, against rounds of seconds); 0 where it cannot be read.
fn client_cpu() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // The fields after the command's closing parenthesis, from the third:
    // utime and stime are the 14th and 15th.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    ticks as f64 / 100.0
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
        .expect("tokio runtime");
    // Reported after the runtime has returned: a spawned redis-server is
    // stopped by its destructor first.
    if let Err(e) = rt.block_on(run(args)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), String> {
    let slice = args.duration / args.rounds.max(1);
    let mut peers = if args.no_bare {
        Vec::new()
    } else {
        args.peers.clone()
    };
    peers.dedup();
    // Flags the limiter refuses are refused before a server is started
    // (an exit leaves no destructor to stop it).
    if let Err(e) = limiter(&args, MemoryBackend::new()) {
        refuse(&e);
    }
    if peers.contains(&Peer::Gcra) && args.strategy != StrategyKind::TokenBucket {
        eprintln!("--peers gcra: the minimal script is a token bucket (--strategy token-bucket)");
        std::process::exit(2);
    }
    println!(
        "backend {:?} via {:?}, strategy {:?}, concurrency {}, keys {}, {} round(s) of {:?} per path",
        args.backend, args.path, args.strategy, args.concurrency, args.keys, args.rounds, slice
    );
    if args.backend == BackendKind::Memory {
        let mut s = Stats::default();
        for _ in 0..args.rounds.max(1) {
            s.merge(library_or_exit(&args, MemoryBackend::new(), slice).await);
        }
        println!("{}", s.line("library"));
        return Ok(());
    }

    let _server;
    let url = if args.spawn_server {
        // In a session of its own, as a production server runs apart from
        // its clients: in ours it would share our scheduler group's CPU, and
        // the path spending more client CPU would take it from the server
        // (docs/benchmarks.md, "Where the server runs").
        let server = RedisServer::builder()
            .own_session(true)
            .start()
            .ok_or("--spawn-server: redis-server is not installed")?;
        let url = server.url();
        _server = server;
        url
    } else {
        if !is_loopback(&args.url) {
            eprintln!(
                "refusing {}: the load tool only targets loopback servers",
                args.url
            );
            std::process::exit(2);
        }
        args.url.clone()
    };
    println!(
        "pool_size {}, exclusive_checkout {}, test_on_check_out {}",
        args.pool_size, args.exclusive_checkout, args.test_on_check_out
    );
    let names: Vec<_> = peers.iter().map(|p| p.name()).collect();
    println!(
        "peers [{}], {} first in every round",
        names.join(", "),
        if args.peers_first { "peers" } else { "library" }
    );
    let backend = RedisBackend::builder(&url)
        .prefix("bench-lib")
        .pool_size(args.pool_size)
        .exclusive_checkout(args.exclusive_checkout)
        .test_on_check_out(args.test_on_check_out)
        .durability(Durability::Skip)
        .build()
        .await
        .map_err(|e| format!("connect the library's backend to {url}: {e}"))?;
    let client = redis::Client::open(url.as_str()).map_err(|e| format!("--url {url}: {e}"))?;
    let connect = || async {
        client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("connect a bare client to {url}: {e}"))
    };
    let conn = connect().await?;
    // Its own connection: reading the server's CPU is not measured.
    let mut probe = connect().await?;
    // Warm up every path (connections, script cache).
    let _ = library_or_exit(&args, backend.clone(), Duration::from_millis(200)).await;
    for &peer in &peers {
        let _ = measure_peer(&args, peer, conn.clone(), Duration::from_millis(200)).await;
    }
    let mut lib = Stats::default();
    let mut raw: Vec<Stats> = peers.iter().map(|_| Stats::default()).collect();
    for _ in 0..args.rounds.max(1) {
        if !args.peers_first {
            lib.merge(round(&mut probe, library_or_exit(&args, backend.clone(), slice)).await);
        }
        for (i, &peer) in peers.iter().enumerate() {
            raw[i].merge(round(&mut probe, measure_peer(&args, peer, conn.clone(), slice)).await);
        }
        if args.peers_first {
            lib.merge(round(&mut probe, library_or_exit(&args, backend.clone(), slice)).await);
        }
    }
    println!("{}", lib.line("library"));
    for (stats, peer) in raw.iter_mut().zip(&peers) {
        println!("{}", stats.line(peer.name()));
    }
    for (stats, peer) in raw.iter().zip(&peers) {
        println!(
            "ratio library/{}: {:.3}   per server-CPU second: {:.3}   per client-CPU second: {:.3}",
            peer.name(),
            lib.rate() / stats.rate(),
            lib.per_server_cpu() / stats.per_server_cpu(),
            lib.per_client_cpu() / stats.per_client_cpu()
        );
    }
    println!("{}", lib.result("library"));
    for (stats, peer) in raw.iter().zip(&peers) {
        println!("{}", stats.result(peer.name()));
    }
    Ok(())
}

/// [`library`], exiting on a flag the limiter refuses.
async fn library_or_exit<B: Backend + Clone>(args: &Args, backend: B, duration: Duration) -> Stats {
    library(args, backend, duration)
        .await
        .unwrap_or_else(|e| refuse(&e))
}

/// Reports a refused flag, as clap reports a usage error (exit 2).
fn refuse(e: &str) -> ! {
    eprintln!("error: {e}");
    std::process::exit(2)
}

/// One round of one path, with the server and client CPU it cost.
async fn round(probe: &mut MultiplexedConnection, path: impl Future<Output = Stats>) -> Stats {
    let before = server_cpu(probe).await;
    let client_before = client_cpu();
    let mut stats = path.await;
    stats.client_cpu = client_cpu() - client_before;
    stats.server_cpu = server_cpu(probe).await - before;
    stats
}

async fn measure_peer(
    args: &Args,
    peer: Peer,
    conn: MultiplexedConnection,
    duration: Duration,
) -> Stats {
    match peer {
        Peer::Bare => bare(args, conn, duration).await,
        Peer::Gcra => gcra(args, conn, duration).await,
    }
}
