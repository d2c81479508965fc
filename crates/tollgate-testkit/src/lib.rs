//! Test support for tollgate.
//!
//! * [`conformance`]: the backend conformance suite. Every backend runs it
//!   (through [`conformance_tests!`]) and must agree with the core's
//!   reference model decision by decision.
//! * [`demo`]: runs an example binary the way a user does.
//! * [`ha`]: a Redis Sentinel topology (master, replica, three sentinels)
//!   and a Redis Cluster with replicas, for failover tests.
//! * [`redis_server`]: throwaway `redis-server` or `valkey-server`
//!   processes (and a 3-master cluster) on free loopback ports, plain or
//!   TLS only with a throwaway CA, for tests against a real Redis;
//!   [`on_every_server!`] runs a test on both.
//! * [`relay`]: a TCP relay under test control (silence, retarget), for
//!   network faults between a client and a server.
//!
//! # Examples
//!
//! A backend of your own runs the whole suite with one macro call in an
//! integration test (`tests/conformance.rs`), given an `async` setup that
//! returns the backend and the mock clock it takes its time from; here the
//! crate's own memory backend (a dev-dependency):
//!
//! ```ignore
//! use tollgate_limiter::MockClock;
//! use tollgate_memory::MemoryBackend;
//!
//! tollgate_testkit::conformance_tests!(async {
//!     let clock = MockClock::new();
//!     (MemoryBackend::with_clock(clock.clone()), clock)
//! });
//! ```
//!
//! A relay between a client and a server (a `redis-server` in the fault
//! tests; an echo server here) passes bytes until the test cuts it:
//!
//! ```
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use tokio::net::{TcpListener, TcpStream};
//! use tollgate_testkit::relay::Relay;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let server = TcpListener::bind("127.0.0.1:0").await?;
//! let target = server.local_addr()?;
//! tokio::spawn(async move {
//!     while let Ok((mut conn, _)) = server.accept().await {
//!         tokio::spawn(async move {
//!             let (mut from, mut to) = conn.split();
//!             tokio::io::copy(&mut from, &mut to).await
//!         });
//!     }
//! });
//!
//! let relay = Relay::start(target);
//! let mut client = TcpStream::connect(relay.addr()).await?;
//! client.write_all(b"PING").await?;
//! let mut echoed = [0; 4];
//! client.read_exact(&mut echoed).await?;
//! assert_eq!(&echoed, b"PING");
//! assert_eq!(relay.accepted(), 1);
//! # Ok(())
//! # }
//! ```

pub mod conformance;
pub mod demo;
pub mod ha;
pub mod redis_server;
pub mod relay;
