//! A TCP relay under test control, to put a network fault between a client
//! and a server: a connection that stays open but stops answering (a
//! partition, a dead host), and a failover behind the same address.
//!
//! The relay listens on `127.0.0.1` (a free port) and forwards each
//! connection to the target it had when the connection was accepted.
//!
//! * [`silence`](Relay::silence): every open connection, and every new one,
//!   stays open but forwards nothing (bytes already sent wait, as in a
//!   network that drops packets until it heals; nothing is closed, so the
//!   client sees no error, only silence).
//! * [`retarget`](Relay::retarget): new connections go to another server,
//!   and forward; the connections already open keep their state (silent
//!   ones stay silent): the old path is still dead, the new one works.
//! * [`resume`](Relay::resume): every connection forwards again.
//! * [`count`](Relay::count): counts what clients send that contains a
//!   pattern (a command's name: a server that keeps no count of it, a
//!   sentinel, is asked through the relay).
//!
//! Plain tokio; dropping the relay closes the listener and every
//! connection. It needs a Tokio runtime.
//!
//! # Examples
//!
//! ```no_run
//! use tollgate_testkit::redis_server::RedisServer;
//! use tollgate_testkit::relay::Relay;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (Some(a), Some(b)) = (RedisServer::start(), RedisServer::start()) else { return };
//! let relay = Relay::start(a.addr());
//! let url = relay.url(); // give this to the client
//! relay.silence(); // the client's connections go quiet
//! relay.retarget(b.addr()); // new connections reach `b`
//! # let _ = url;
//! # }
//! ```

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinSet};

/// A TCP relay on `127.0.0.1`; see the [module docs](self).
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    control: Arc<Control>,
    task: AbortHandle,
}

/// What the accept loop reads for each new connection.
#[derive(Debug)]
struct Control {
    target: Mutex<SocketAddr>,
    /// One "silent" switch per generation of connections; the last is the
    /// current one (new connections join it). [`Relay::retarget`] starts a
    /// new generation, so the old connections keep their own switch.
    generations: Mutex<Vec<watch::Sender<bool>>>,
    /// Connections accepted so far.
    accepted: AtomicUsize,
    /// What [`Relay::count`] looks for in what clients send.
    needle: Mutex<Option<Vec<u8>>>,
    /// How many times it was seen.
    seen: AtomicUsize,
}

impl Control {
    fn current(&self) -> watch::Receiver<bool> {
        lock(&self.generations)
            .last()
            .expect("there is always a generation")
            .subscribe()
    }

    /// Counts the needle in bytes a client sent.
    fn tap(&self, bytes: &[u8]) {
        if let Some(needle) = &*lock(&self.needle) {
            let n = bytes.windows(needle.len()).filter(|w| w == needle).count();
            self.seen.fetch_add(n, Ordering::Relaxed);
        }
    }
}

impl Relay {
    /// Listens on a free loopback port and relays to `target`.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, or if no loopback port can be bound.
    pub fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("local addr");
        let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio runtime");
        let control = Arc::new(Control {
            target: Mutex::new(target),
            generations: Mutex::new(vec![watch::channel(false).0]),
            accepted: AtomicUsize::new(0),
            needle: Mutex::new(None),
            seen: AtomicUsize::new(0),
        });
        let task = tokio::spawn(accept(listener, control.clone())).abort_handle();
        Self {
            addr,
            control,
            task,
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:<port>` of the relay.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// How many connections the relay has accepted, silent or not: how
    /// often a client dialled this address.
    pub fn accepted(&self) -> usize {
        self.control.accepted.load(Ordering::Relaxed)
    }

    /// From now on, counts the times clients send `needle` (a command's
    /// name, as it is on the wire: `b"GET-MASTER-ADDR-BY-NAME"`), on every
    /// connection; [`counted`](Self::counted) says how many so far. One
    /// split across two reads is missed: a client sends a small command in
    /// one write.
    ///
    /// # Panics
    ///
    /// With an empty `needle`.
    pub fn count(&self, needle: &[u8]) {
        assert!(!needle.is_empty(), "an empty needle");
        *lock(&self.control.needle) = Some(needle.to_vec());
        self.control.seen.store(0, Ordering::Relaxed);
    }

    /// How many times clients sent what [`count`](Self::count) looks for.
    pub fn counted(&self) -> usize {
        self.control.seen.load(Ordering::Relaxed)
    }

    /// Every open connection, and every new one until the next
    /// [`retarget`](Self::retarget) or [`resume`](Self::resume), stays
    /// open and forwards nothing.
    pub fn silence(&self) {
        for g in lock(&self.control.generations).iter() {
            g.send_replace(true);
        }
    }

    /// New connections go to `target`, and forward; the open ones keep
    /// their target and their silence.
    pub fn retarget(&self, target: SocketAddr) {
        *lock(&self.control.target) = target;
        lock(&self.control.generations).push(watch::channel(false).0);
    }

    /// Every connection forwards again.
    pub fn resume(&self) {
        for g in lock(&self.control.generations).iter() {
            g.send_replace(false);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The accept loop owns the connections' tasks: they end with it.
        self.task.abort();
    }
}

async fn accept(listener: tokio::net::TcpListener, control: Arc<Control>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        control.accepted.fetch_add(1, Ordering::Relaxed);
        let target = *lock(&control.target);
        let silent = control.current();
        let tap = control.clone();
        connections.spawn(async move {
            let Ok(server) = TcpStream::connect(target).await else {
                return; // dropping `client` closes it, like a refused connect
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (client_rx, client_tx) = client.into_split();
            let (server_rx, server_tx) = server.into_split();
            tokio::join!(
                pipe(client_rx, server_tx, silent.clone(), Some(&tap)),
                pipe(server_rx, client_tx, silent, None),
            );
        });
        // Reap finished connections so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
}

/// Copies `from` to `to`, holding the bytes while the switch says silent;
/// `tap` counts what a client sends (see [`Relay::count`]).
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut silent: watch::Receiver<bool>,
    tap: Option<&Control>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if silent.wait_for(|s| !s).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if let Some(tap) = tap {
            tap.tap(&buf[..n]);
        }
        // Silenced while reading: the bytes wait for the network to heal.
        if silent.wait_for(|s| !s).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
