//! The Redis backend's public types are `Send + Sync` and its futures
//! `Send`: checked at compile time (no server needed), so a field that
//! loses one fails this build rather than a user's.

use std::future::Future;

use tollgate_limiter::Limiter;
use tollgate_redis::{DurabilityReport, RedisBackend, RedisBackendBuilder, RedisError};

fn send_sync<T: Send + Sync>() {}

fn send<F: Future + Send>(_: F) {}

#[test]
fn shared_types_are_send_and_sync() {
    send_sync::<RedisBackend>();
    send_sync::<RedisBackendBuilder>();
    send_sync::<Limiter<RedisBackend>>();
    send_sync::<RedisError>();
    send_sync::<DurabilityReport>();
}

#[test]
fn builder_futures_are_send() {
    // Built, never polled: nothing connects.
    send(RedisBackend::builder("redis://127.0.0.1:1").build());
    send(RedisBackend::connect("redis://127.0.0.1:1"));
}
