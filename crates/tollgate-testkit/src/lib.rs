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

pub mod conformance;
pub mod demo;
pub mod ha;
pub mod redis_server;
pub mod relay;
