//! Connections: a bb8-redis pool of multiplexed connections, or (feature
//! `cluster`) the redis crate's cluster client.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{Cmd, FromRedisValue, RedisResult, ScriptInvocation};

use crate::error::RedisError;

/// bb8-redis's manager, plus a "broken" flag that a failed call sets so the
/// pool drops the connection (bb8-redis never reports one broken, and a
/// PING on every checkout would halve throughput).
#[derive(Debug)]
pub(crate) struct Manager {
    inner: bb8_redis::RedisConnectionManager,
}

impl Manager {
    pub(crate) fn new(inner: bb8_redis::RedisConnectionManager) -> Self {
        Self { inner }
    }
}

/// A pooled multiplexed connection. Clones share the connection (requests
/// from several tasks are pipelined on it) and its broken flag.
#[derive(Clone)]
pub(crate) struct Pooled {
    conn: MultiplexedConnection,
    broken: Arc<AtomicBool>,
}

impl bb8::ManageConnection for Manager {
    type Connection = Pooled;
    type Error = redis::RedisError;

    async fn connect(&self) -> Result<Pooled, redis::RedisError> {
        Ok(Pooled {
            conn: self.inner.connect().await?,
            broken: Arc::default(),
        })
    }

    async fn is_valid(&self, conn: &mut Pooled) -> Result<(), redis::RedisError> {
        self.inner.is_valid(&mut conn.conn).await
    }

    fn has_broken(&self, conn: &mut Pooled) -> bool {
        conn.broken.load(Ordering::Relaxed)
    }
}

/// Whether an error means the connection itself is gone (as opposed to a
/// command error on a healthy connection).
fn breaks(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
}

pub(crate) enum Conn {
    Pool {
        pool: bb8::Pool<Manager>,
        /// Hold the checkout for the whole call (a classic pool) instead of
        /// sharing multiplexed connections.
        exclusive: bool,
        timeout: Duration,
        /// One multiplexed connection per slot, cloned for each call (calls
        /// pipeline on it) and taken again from the pool once it breaks:
        /// the hot path never waits on the pool.
        slots: Box<[Mutex<Option<Pooled>>]>,
        next: AtomicUsize,
    },
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    pub(crate) fn pool(
        pool: bb8::Pool<Manager>,
        exclusive: bool,
        timeout: Duration,
        size: u32,
    ) -> Self {
        Self::Pool {
            pool,
            exclusive,
            timeout,
            slots: (0..size.max(1)).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        match self {
            Self::Pool { .. } => false,
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => true,
        }
    }

    async fn checkout(
        pool: &bb8::Pool<Manager>,
        timeout: Duration,
    ) -> Result<bb8::PooledConnection<'_, Manager>, RedisError> {
        // A connection flagged broken is dropped (has_broken) when its guard
        // is; try the next one. Bounded: the pool may be full of dead ones
        // right after a Redis restart.
        let tries = pool.state().connections + 1;
        for _ in 0..tries {
            let guard = pool.get().await.map_err(|e| match e {
                bb8::RunError::User(e) => RedisError::Redis(e),
                bb8::RunError::TimedOut => RedisError::PoolTimeout(timeout),
            })?;
            if !guard.broken.load(Ordering::Relaxed) {
                return Ok(guard);
            }
        }
        Err(RedisError::PoolTimeout(timeout))
    }

    /// A healthy multiplexed connection, round robin over the slots.
    async fn shared(&self) -> Result<Pooled, RedisError> {
        let (pool, timeout, slots, next) = match self {
            Self::Pool {
                pool,
                timeout,
                slots,
                next,
                ..
            } => (pool, timeout, slots, next),
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => return Err(RedisError::Unsupported("not a single server")),
        };
        let slot = &slots[next.fetch_add(1, Ordering::Relaxed) % slots.len()];
        if let Some(c) = lock(slot)
            .as_ref()
            .filter(|c| !c.broken.load(Ordering::Relaxed))
        {
            return Ok(c.clone());
        }
        let c = Pooled::clone(&*Self::checkout(pool, *timeout).await?);
        *lock(slot) = Some(c.clone());
        Ok(c)
    }

    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, RedisError> {
        match self {
            Self::Pool {
                pool,
                exclusive: true,
                timeout,
                ..
            } => {
                let mut guard = Self::checkout(pool, *timeout).await?;
                let r = inv.invoke_async(&mut guard.conn).await;
                flag(&guard, &r);
                Ok(r?)
            }
            Self::Pool { .. } => {
                let mut c = self.shared().await?;
                let r = inv.invoke_async(&mut c.conn).await;
                flag(&c, &r);
                Ok(r?)
            }
            #[cfg(feature = "cluster")]
            Self::Cluster(c) => Ok(inv.invoke_async(&mut c.clone()).await?),
        }
    }

    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, RedisError> {
        match self {
            Self::Pool { .. } => {
                let mut c = self.shared().await?;
                let r = cmd.query_async(&mut c.conn).await;
                flag(&c, &r);
                Ok(r?)
            }
            #[cfg(feature = "cluster")]
            Self::Cluster(c) => Ok(cmd.query_async(&mut c.clone()).await?),
        }
    }

    /// One connection for the durability check of a single server.
    pub(crate) async fn single(&self) -> Result<MultiplexedConnection, RedisError> {
        Ok(self.shared().await?.conn)
    }
}

fn flag<T>(c: &Pooled, r: &RedisResult<T>) {
    if let Err(e) = r
        && breaks(e)
    {
        c.broken.store(true, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
