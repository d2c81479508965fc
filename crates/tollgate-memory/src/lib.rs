//! In-process backend for [tollgate](https://docs.rs/tollgate): the same
//! semantics as the Redis backend, in memory.
//!
//! It is the embedded default (a single process needs no Redis) and the test
//! double: an application written against the Redis backend switches to
//! [`MemoryBackend`] in its unit tests by changing one constructor, once
//! the code that builds its limiters is generic over the backend
//! (`fn app<B: Backend + Clone>(.., backend: B)`, as in the `tollgate`
//! README; there is no type-erased backend). It runs
//! the core's [reference model](tollgate_limiter::model) directly, passes the
//! same conformance suite as the Redis backend, takes a [`MockClock`] for
//! tests, and can inject failures and delays to exercise fail modes.
//!
//! Keys are spread over lock-guarded shards. A token bucket's charge, the
//! common case, takes its shard's lock shared and swaps the key's arrival
//! time in one atomic word, as `governor` does; every other operation takes
//! the shard exclusively and runs the model's step. A key whose state has
//! become equal to a fresh key's is dropped when an exclusive operation
//! touches it, and each shard sweeps its expired keys whenever it has
//! doubled since the last sweep, so memory stays bounded by the keys that
//! are live. A key and its limiter's name of up to 21 bytes together (a
//! short name and an IPv4 address, say) are kept inline: a million such
//! live keys take about 86 MB.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tollgate_limiter::{Key, Limiter, TokenBucket};
//! use tollgate_memory::MemoryBackend;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::new(
//!     "api",
//!     TokenBucket::new(2, 1, Duration::from_secs(1))?,
//!     MemoryBackend::new(),
//! );
//! let key = Key::new("client-1");
//! assert!(limiter.check(&key).await.is_allowed());
//! assert!(limiter.check(&key).await.is_allowed());
//! assert!(!limiter.check(&key).await.is_allowed());
//! # Ok(())
//! # }
//! ```
//!
//! [`MockClock`]: tollgate_limiter::MockClock

use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use hashbrown::{DefaultHashBuilder, HashTable};
use tollgate_limiter::model::{Op, Receipt, Slot, State, TokenBucketState, charge_bucket};
use tollgate_limiter::time::micros;
use tollgate_limiter::{
    Backend, Clock, Decision, Key, Policy, Request, Scope, SystemClock, Timestamp,
};

const SHARDS: usize = 64;
const MIN_SWEEP: usize = 1024;

/// Why the memory backend failed: on purpose, or under an override that
/// is no policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// A failure injected with [`MemoryBackend::fail_next`] or
    /// [`MemoryBackend::set_failing`].
    #[error("injected failure")]
    Injected,
    /// The override in force for the key lies across the concurrency
    /// boundary from the limiter's configured policy (a concurrency
    /// override of a rate limiter, or a rate override of a concurrency
    /// limiter, set through [`Backend::set_override`] directly): no policy
    /// (see [`tollgate_limiter::model::in_force`]). Only the decisions it
    /// governs fail, until it is cleared.
    #[error("the override in force lies across the concurrency boundary: no policy")]
    InvalidPolicy,
}

/// An injected failure is `reason="error"` in the metrics, an override that
/// is no policy `reason="invalid_policy"` (which the limiter's breaker does
/// not count).
impl tollgate_limiter::BackendError for MemoryError {
    fn reason(&self) -> tollgate_limiter::ErrorReason {
        match self {
            Self::Injected => tollgate_limiter::ErrorReason::Error,
            Self::InvalidPolicy => tollgate_limiter::ErrorReason::InvalidPolicy,
        }
    }
}

/// The in-memory backend.
///
/// Cheap to clone; clones share counters, overrides and fault settings.
pub struct MemoryBackend<C = MonotonicClock> {
    shared: Arc<Shared<C>>,
}

/// A shard (its lock and its tables, 88 bytes) on a pair of cache lines
/// of its own. Unaligned, most shards straddled two lines, so a decision
/// touched two lines where one does, and threads deciding keys of
/// neighbouring shards shared a line their locks write. 128 bytes, as
/// the adjacent-line prefetcher fetches lines in pairs.
#[repr(align(128))]
struct Padded<T>(T);

struct Shared<C> {
    clock: C,
    hasher: DefaultHashBuilder,
    shards: Box<[Padded<RwLock<Shard>>]>,
    has_overrides: AtomicBool,
    /// When every override stored since the map was last swept has
    /// expired (`u64::MAX` once one never does): from then on, the first
    /// decision to look sweeps them, and decisions leave the override path.
    overrides_until: AtomicU64,
    overrides: RwLock<std::collections::HashMap<String, Overrides>>,
    faults: Faults,
}

#[derive(Default)]
struct Faults {
    armed: AtomicBool,
    failing: AtomicBool,
    fail_next: AtomicU64,
    delay_us: AtomicU64,
    calls: AtomicU64,
}

/// One limiter's runtime overrides, looked up by `&str` and `&Key` so the
/// decision path allocates nothing.
#[derive(Default)]
struct Overrides {
    limiter: Option<Stored>,
    keys: std::collections::HashMap<Key, Stored>,
    /// Expired key overrides are swept when `keys` reaches this size.
    sweep_at: usize,
}

/// An override and, if it expires, when (on the backend's clock).
#[derive(Clone, Copy)]
struct Stored {
    policy: Policy,
    until: Option<Timestamp>,
}

impl Stored {
    /// `policy`, forgotten `ttl` after `now`.
    fn expiring(policy: Policy, now: Timestamp, ttl: Duration) -> Self {
        Self {
            policy,
            until: Some(now.saturating_add(micros(ttl))),
        }
    }

    fn live(&self, now: Timestamp) -> Option<Policy> {
        self.until.is_none_or(|t| now < t).then_some(self.policy)
    }
}

impl Overrides {
    /// Sets or clears the override of exactly `scope`.
    fn set(&mut self, scope: Scope<'_>, stored: Option<Stored>, now: Timestamp) {
        match (scope, stored) {
            (Scope::Limiter(_), s) => self.limiter = s,
            (Scope::Key(_, key), Some(s)) => {
                if self.keys.len() >= self.sweep_at.max(MIN_SWEEP) {
                    self.keys.retain(|_, s| s.live(now).is_some());
                    self.sweep_at = self.keys.len() * 2;
                }
                self.keys.insert(key.clone(), s);
            }
            (Scope::Key(_, key), None) => {
                self.keys.remove(key);
            }
        }
    }

    /// What is stored for exactly `scope`, live or not.
    fn stored(&self, scope: Scope<'_>) -> Option<Stored> {
        match scope {
            Scope::Limiter(_) => self.limiter,
            Scope::Key(_, key) => self.keys.get(key).copied(),
        }
    }

    fn is_empty(&self) -> bool {
        self.limiter.is_none() && self.keys.is_empty()
    }
}

/// One shard's keys: each in one of two tables, by the kind of its state.
struct Shard {
    /// Token buckets, charged under the shared lock.
    buckets: HashTable<Bucket>,
    /// Every other slot.
    others: HashTable<Other>,
    sweep_at: usize,
}

/// A key in the token-bucket state `{ tat, born }` whose expiry is `tat`
/// (as every admitted charge leaves it) and whose life saw no refund (see
/// [`Bucket::of`]): 32 bytes, as governor's entries.
///
/// Only `tat` changes under the shared lock, by compare-and-swap; `born`
/// (read only under the exclusive lock, by reservations) changes with it
/// when a charge starts a new life: that charge swaps `tat` to [`BUSY`],
/// stores `born`, then the new `tat`. A charge that finds `BUSY` is
/// decided under the exclusive lock, which waits for the shared one to be
/// released, so no exclusive holder ever sees `BUSY` or a half-made life.
struct Bucket {
    key: StoreKey,
    tat: AtomicU64,
    born: AtomicU64,
}

/// A key in any other state.
struct Other {
    key: StoreKey,
    slot: Slot,
}

/// `tat` while a new life's `born` is being stored: never an arrival time
/// (those stay below 2^53 microseconds).
const BUSY: u64 = u64::MAX;

impl Bucket {
    /// An [`Op::Acquire`] of `cost` under the shared lock: the model's
    /// decision ([`charge_bucket`]), the arrival time swapped when it
    /// admits; `None` when it must be decided under the exclusive lock.
    /// Always inline, as [`Located::charge_shared`].
    #[inline(always)]
    fn charge(
        &self,
        now: Timestamp,
        p: &tollgate_limiter::TokenBucket,
        cost: u64,
    ) -> Option<Decision> {
        let mut tat = self.tat.load(Ordering::Acquire);
        loop {
            if tat == BUSY {
                return None;
            }
            let (decision, next) = charge_bucket(tat, now, p, cost);
            // A refusal writes nothing: decided at the load.
            let Some(next) = next else {
                return Some(decision);
            };
            if tat > now {
                // The same life: only the arrival time moves.
                match self
                    .tat
                    .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => return Some(decision),
                    Err(seen) => tat = seen,
                }
                continue;
            }
            // A new life: `born` changes with the arrival time (unnamed
            // until its first reservation, see TokenBucketState::born).
            match self
                .tat
                .compare_exchange(tat, BUSY, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => {
                    self.born.store(0, Ordering::Relaxed);
                    self.tat.store(next, Ordering::Release);
                    return Some(decision);
                }
                Err(seen) => tat = seen,
            }
        }
    }

    fn new(key: StoreKey, (tat, born): (Timestamp, Timestamp)) -> Self {
        Self {
            key,
            tat: AtomicU64::new(tat),
            born: AtomicU64::new(born),
        }
    }

    /// The slot this bucket stands for (under the exclusive lock).
    fn slot(&mut self) -> Slot {
        let tat = *self.tat.get_mut();
        Slot {
            state: State::TokenBucket(TokenBucketState {
                tat,
                born: *self.born.get_mut(),
                ..TokenBucketState::default()
            }),
            expires_at: tat,
            settled: Default::default(),
        }
    }

    /// `slot`'s `(tat, born)` if a [`Bucket`] can hold it: not once a
    /// refund was made in its life (rare, and the count would cost every
    /// bucket 8 bytes): that life is kept as an [`Other`], until a new one
    /// begins; nor once it remembered a settle (until a later settle finds
    /// them all past, or the key is dropped).
    fn of(slot: &Slot) -> Option<(Timestamp, Timestamp)> {
        match &slot.state {
            State::TokenBucket(s)
                if slot.expires_at == s.tat && s.refunded == 0 && slot.settled.is_empty() =>
            {
                Some((s.tat, s.born))
            }
            _ => None,
        }
    }
}

/// Bytes a [`StoreKey`] holds inline: the limiter's name and the key
/// together (a short name and an IPv4 address or an id), while the stored
/// key stays 24 bytes.
const INLINE: usize = 21;

/// A stored key: the limiter's name and the key, kept exactly, so that a
/// lookup compares them whole and a rehash splits them, whatever bytes
/// either holds. Inline when they fit, which is most keys: a lookup then
/// compares bytes next to the bucket's state instead of following a
/// pointer (a cache miss on large tables), and a new key allocates nothing.
enum StoreKey {
    /// `bytes[..name]`, the name; `bytes[name..len]`, the key.
    Inline {
        name: u8,
        len: u8,
        bytes: [u8; INLINE],
    },
    /// The name's length in 8 bytes, the name, the key: one allocation.
    Heap(Box<[u8]>),
}

impl StoreKey {
    /// The limiter's name and the key, as bytes.
    fn parts(&self) -> (&[u8], &[u8]) {
        match self {
            Self::Inline { name, len, bytes } => {
                bytes[..usize::from(*len)].split_at(usize::from(*name))
            }
            Self::Heap(stored) => {
                let (len, rest) = stored.split_at(8);
                let len = u64::from_le_bytes(len.try_into().expect("8 bytes"));
                // A length this process wrote: it fits.
                rest.split_at(usize::try_from(len).unwrap_or(usize::MAX))
            }
        }
    }
}

/// The hash of a key's parts: [`Lookup`]'s, computed again from a stored
/// key when a table grows. The key goes through the seeded hasher, so a
/// client choosing keys cannot choose collisions; the limiter's name, which
/// is configuration, is folded in by [`name_mix`], where a second pass of
/// the hasher cost about 30 instructions per decision (callgrind). Names
/// that fold alike only share hashes: `matches` compares them whole.
#[inline]
fn hash_parts(hasher: &DefaultHashBuilder, limiter: &[u8], key: &[u8]) -> u64 {
    hasher.hash_one(Bytes(key)) ^ name_mix(limiter)
}

/// The shard of a key's hash: bits 51-56, which hashbrown uses for
/// nothing (a table places a key by the low bits of its hash and tags it
/// with the top 7). Picked by the top 6, as until 2026-12, every key of a
/// shard had one of two tags, so a probe compared about half the keys of
/// each group it read, each comparison a read of a stored key: 1.4 a
/// lookup, and 10 % of a decision's instructions on 10k keys.
#[inline]
fn shard_index(hash: u64) -> usize {
    (hash >> 51) as usize % SHARDS
}

/// Bytes hashed as they are, without the length prefix of `[u8]`'s or the
/// terminator of `str`'s `Hash` (each another multiply in foldhash).
struct Bytes<'a>(&'a [u8]);

impl Hash for Bytes<'_> {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.0);
    }
}

/// A limiter's name as a well-spread word: every byte read (overlapping
/// words up to 16 bytes, whole ones past that), the length added, and one
/// multiply to spread them.
#[inline]
fn name_mix(name: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let n = name.len();
    let word8 = |at: usize| u64::from_le_bytes(name[at..at + 8].try_into().unwrap());
    let word4 = |at: usize| u64::from(u32::from_le_bytes(name[at..at + 4].try_into().unwrap()));
    let folded = match n {
        0..=3 => name.iter().fold(0, |w, &b| w << 8 | u64::from(b)),
        4..=7 => word4(0) | word4(n - 4) << 32,
        // A multiply between the two: a byte both words hold cannot cancel.
        8..=16 => word8(0).wrapping_mul(K).rotate_left(29) ^ word8(n - 8),
        _ => name.chunks(8).fold(0, |acc, c| {
            let w = c.iter().fold(0, |w, &b| w << 8 | u64::from(b));
            (acc ^ w).wrapping_mul(K).rotate_left(31)
        }),
    };
    (folded ^ n as u64).wrapping_mul(K)
}

/// A borrowed key, hashing and comparing without allocating.
struct Lookup<'a> {
    limiter: &'a str,
    key: &'a str,
}

impl Lookup<'_> {
    #[inline]
    fn matches(&self, k: &StoreKey) -> bool {
        let (limiter, key) = (self.limiter.as_bytes(), self.key.as_bytes());
        let (l, n) = (limiter.len(), key.len());
        match k {
            StoreKey::Inline { name, len, bytes } => {
                usize::from(*name) == l
                    && usize::from(*len) == l + n
                    && same_bytes(&bytes[l..l + n], key)
                    && same_bytes(&bytes[..l], limiter)
            }
            StoreKey::Heap(stored) => {
                stored.len() == 8 + l + n
                    && stored[..8] == (l as u64).to_le_bytes()
                    && same_bytes(&stored[8 + l..], key)
                    && same_bytes(&stored[8..8 + l], limiter)
            }
        }
    }

    fn to_owned(&self) -> StoreKey {
        let (limiter, key) = (self.limiter.as_bytes(), self.key.as_bytes());
        let len = limiter.len() + key.len();
        if len <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..limiter.len()].copy_from_slice(limiter);
            bytes[limiter.len()..len].copy_from_slice(key);
            // Both below INLINE: they fit a byte.
            return StoreKey::Inline {
                name: limiter.len() as u8,
                len: len as u8,
                bytes,
            };
        }
        let mut s = Vec::with_capacity(8 + len);
        s.extend_from_slice(&(limiter.len() as u64).to_le_bytes());
        s.extend_from_slice(limiter);
        s.extend_from_slice(key);
        StoreKey::Heap(s.into())
    }
}

/// Whether `a` and `b` hold the same bytes: short slices (limiter names,
/// IPs, ids) compared in two overlapping words, inline, where a slice `==`
/// calls `memcmp`.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word8 = |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().unwrap());
    let word4 = |s: &[u8], at: usize| u32::from_ne_bytes(s[at..at + 4].try_into().unwrap());
    match n {
        // The first and the last word cover every byte.
        8..=16 => word8(a, 0) == word8(b, 0) && word8(a, n - 8) == word8(b, n - 8),
        4..=7 => word4(a, 0) == word4(b, 0) && word4(a, n - 4) == word4(b, n - 4),
        0..=3 => a.iter().zip(b).all(|(x, y)| x == y),
        _ => a == b,
    }
}

/// A monotonic clock that reads in wall-clock microseconds: the system time
/// when it was created plus the time elapsed since, measured with the CPU's
/// timestamp counter (through [`quanta`]) where it is reliable.
///
/// Reading it costs a few nanoseconds, against some tens for the system
/// clock, and it never steps back; it does not follow later adjustments of
/// the system clock, which an in-process counter does not need.
#[derive(Clone)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    anchor_raw: u64,
    anchor: Timestamp,
    /// Microseconds a raw tick, in units of 2^-64: a reading is then one
    /// multiply, where quanta's nanoseconds and a division by 1,000 were
    /// two and shifts (16 instructions of a decision, callgrind).
    micros_per_tick: u64,
}

/// Raw ticks over which [`MonotonicClock::new`] asks quanta for its scale:
/// enough that a nanosecond of rounding is 2^-40 of it (0.01 µs an hour).
const SCALE_TICKS: u64 = 1 << 40;

impl MonotonicClock {
    /// A clock anchored at the system time now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let anchor_raw = clock.raw();
        // quanta's scale (nanoseconds for `SCALE_TICKS` ticks; as many
        // as ticks when its source counts nanoseconds), made a fraction
        // of 2^64 microseconds a tick. Below 2^64: a tick is far below a
        // microsecond (at most 1 ns for nanosecond sources).
        let nanos = u128::from(clock.delta_as_nanos(0, SCALE_TICKS));
        let per_tick = (nanos << 64) / (u128::from(SCALE_TICKS) * 1_000);
        Self {
            clock,
            anchor_raw,
            anchor: SystemClock.now(),
            micros_per_tick: u64::try_from(per_tick).unwrap_or(u64::MAX),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MonotonicClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MonotonicClock")
            .field("anchor", &self.anchor)
            .finish()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> Timestamp {
        // A reading before the anchor (another core's counter) counts as
        // the anchor, as quanta's `delta_as_nanos` answers 0 for it.
        let ticks = self.clock.raw().saturating_sub(self.anchor_raw);
        let micros = (u128::from(ticks) * u128::from(self.micros_per_tick)) >> 64;
        // A product of two factors below 2^64, shifted by 64: it fits.
        self.anchor + micros as u64
    }
}

impl MemoryBackend<MonotonicClock> {
    /// A backend on a [`MonotonicClock`].
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::new())
    }
}

impl Default for MemoryBackend<MonotonicClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C> Clone for MemoryBackend<C> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C: Clock> fmt::Debug for MemoryBackend<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("keys", &self.len())
            .field("clock", &std::any::type_name::<C>())
            .finish()
    }
}

impl<C: Clock> MemoryBackend<C> {
    /// A backend that takes its time from `clock` (a
    /// [`MockClock`](tollgate_limiter::MockClock) in tests).
    pub fn with_clock(clock: C) -> Self {
        let shards = (0..SHARDS)
            .map(|_| {
                Padded(RwLock::new(Shard {
                    buckets: HashTable::new(),
                    others: HashTable::new(),
                    sweep_at: MIN_SWEEP,
                }))
            })
            .collect();
        Self {
            shared: Arc::new(Shared {
                clock,
                hasher: DefaultHashBuilder::default(),
                shards,
                has_overrides: AtomicBool::new(false),
                overrides_until: AtomicU64::new(0),
                overrides: RwLock::new(Default::default()),
                faults: Faults::default(),
            }),
        }
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.shared.clock
    }

    #[inline]
    fn decide_at_once(&self, req: &Request<'_>) -> Result<Decision, MemoryError> {
        self.locate(req, |at, policy| at.decide(policy, &req.op))
    }

    /// Runs `f` on `req`'s slot under the policy in force (see
    /// [`Located::with_slot`]).
    fn with_slot<T>(
        &self,
        req: &Request<'_>,
        f: impl FnOnce(&mut Slot, Timestamp, &Policy) -> T,
    ) -> Result<T, MemoryError> {
        self.locate(req, |at, policy| at.with_slot(policy, f))
    }

    /// Runs `f` with where and when `req` is decided, and the policy in
    /// force. A closure, not a returned value: the override (a whole
    /// `Policy`, rare) stays in this frame instead of being moved. An
    /// override across the concurrency boundary is no policy
    /// ([`MemoryError::InvalidPolicy`]): `f` is not run.
    #[inline(always)]
    fn locate<T>(
        &self,
        req: &Request<'_>,
        f: impl FnOnce(Located<'_>, &Policy) -> T,
    ) -> Result<T, MemoryError> {
        let now = self.shared.clock.now();
        // The configured policy by reference: an override is the only
        // copy made.
        let overridden = self.override_of(req, now)?;
        let policy = overridden.as_ref().unwrap_or(req.policy);
        Ok(self.locate_at(req, now, policy, f))
    }

    /// [`locate`](Self::locate) under `policy`, at `now`.
    #[inline(always)]
    fn locate_at<T>(
        &self,
        req: &Request<'_>,
        now: Timestamp,
        policy: &Policy,
        f: impl FnOnce(Located<'_>, &Policy) -> T,
    ) -> T {
        let lookup = Lookup {
            limiter: req.limiter,
            key: req.key.as_str(),
        };
        let (hash, shard) = self.shard_of(&lookup);
        let at = Located {
            now,
            lookup: &lookup,
            hash,
            shard,
            hasher: &self.shared.hasher,
        };
        f(at, policy)
    }

    /// The key's hash and its shard.
    #[inline]
    fn shard_of(&self, lookup: &Lookup<'_>) -> (u64, &RwLock<Shard>) {
        let hash = hash_parts(
            &self.shared.hasher,
            lookup.limiter.as_bytes(),
            lookup.key.as_bytes(),
        );
        (hash, &self.shared.shards[shard_index(hash)].0)
    }

    /// The override in force for the request's key (its own, else its
    /// limiter's), if any: `None` means the request's policy rules. An
    /// override across the concurrency boundary is no policy
    /// ([`tollgate_limiter::model::in_force`]): [`MemoryError::InvalidPolicy`].
    #[inline]
    fn override_of(
        &self,
        req: &Request<'_>,
        now: Timestamp,
    ) -> Result<Option<Policy>, MemoryError> {
        if !self.shared.has_overrides.load(Ordering::Acquire) {
            return Ok(None);
        }
        self.override_slow(req, now)
    }

    #[cold]
    fn override_slow(
        &self,
        req: &Request<'_>,
        now: Timestamp,
    ) -> Result<Option<Policy>, MemoryError> {
        if now >= self.shared.overrides_until.load(Ordering::Acquire) {
            // Every override has expired (an AIMD controller's, once it
            // stopped): dropped, decisions leave this path, where each
            // reads the shared map's lock.
            self.sweep_overrides(now);
        }
        let overrides = self
            .shared
            .overrides
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let Some(o) = overrides.get(req.limiter) else {
            return Ok(None);
        };
        let get = |s: Option<&Stored>| s.and_then(|s| s.live(now));
        let (key, wide) = (get(o.keys.get(req.key)), get(o.limiter.as_ref()));
        match tollgate_limiter::model::in_force(req.policy, key.as_ref(), wide.as_ref()) {
            Some(_) => Ok(key.or(wide)),
            None => Err(MemoryError::InvalidPolicy),
        }
    }

    /// Sets or clears the override of exactly `scope`.
    fn store_override(&self, scope: Scope<'_>, stored: Option<Stored>) {
        self.store_override_if(scope, stored, |_| true);
    }

    /// Sets or clears the override of exactly `scope` if `expected`,
    /// shown the limiter's overrides, holds; answers whether it did. Under
    /// the map's write lock: nothing is stored between the look and the
    /// write (a compare-and-set).
    fn store_override_if(
        &self,
        scope: Scope<'_>,
        stored: Option<Stored>,
        expected: impl FnOnce(Option<&Overrides>) -> bool,
    ) -> bool {
        let now = self.shared.clock.now();
        let mut overrides = self
            .shared
            .overrides
            .write()
            .unwrap_or_else(|e| e.into_inner());
        if !expected(overrides.get(scope.limiter())) {
            return false;
        }
        let limiter = overrides.entry(scope.limiter().to_owned()).or_default();
        limiter.set(scope, stored, now);
        if limiter.is_empty() {
            overrides.remove(scope.limiter());
        }
        if let Some(s) = stored {
            let until = s.until.unwrap_or(Timestamp::MAX);
            self.shared
                .overrides_until
                .fetch_max(until, Ordering::AcqRel);
        }
        self.shared
            .has_overrides
            .store(!overrides.is_empty(), Ordering::Release);
        true
    }

    /// Drops the expired overrides; decisions leave the override path if
    /// none is left.
    fn sweep_overrides(&self, now: Timestamp) {
        let mut overrides = self
            .shared
            .overrides
            .write()
            .unwrap_or_else(|e| e.into_inner());
        for o in overrides.values_mut() {
            o.keys.retain(|_, s| s.live(now).is_some());
            o.limiter = o.limiter.filter(|s| s.live(now).is_some());
        }
        overrides.retain(|_, o| !o.is_empty());
        // Under the lock, as `store_override` sets them.
        let until = overrides
            .values()
            .flat_map(|o| o.limiter.iter().chain(o.keys.values()))
            .map(|s| s.until.unwrap_or(Timestamp::MAX))
            .max()
            .unwrap_or(0);
        self.shared.overrides_until.store(until, Ordering::Release);
        self.shared
            .has_overrides
            .store(!overrides.is_empty(), Ordering::Release);
    }

    /// The number of keys held (live or not yet swept).
    pub fn len(&self) -> usize {
        self.shared.shards.iter().map(|s| read(&s.0).len()).sum()
    }

    /// How many events the sliding-window log of `key` of `limiter`
    /// holds (0 for a key not held or of another strategy): lets a test see
    /// that a flood keeps the log bounded by the limit.
    pub fn log_len(&self, limiter: &str, key: &Key) -> usize {
        let lookup = Lookup {
            limiter,
            key: key.as_str(),
        };
        let (hash, shard) = self.shard_of(&lookup);
        let shard = read(shard);
        match shard.others.find(hash, |o| lookup.matches(&o.key)) {
            Some(Other {
                slot:
                    Slot {
                        state: State::SlidingWindow(s),
                        ..
                    },
                ..
            }) => s.events.len(),
            _ => 0,
        }
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired key and override now (normally done as shards
    /// and override maps grow, and by the first decision that finds every
    /// override expired).
    pub fn sweep(&self) {
        let now = self.shared.clock.now();
        for s in &self.shared.shards {
            write(&s.0).sweep(now);
        }
        self.sweep_overrides(now);
    }

    /// Makes the next `n` calls fail with [`MemoryError::Injected`].
    pub fn fail_next(&self, n: u64) {
        self.shared.faults.fail_next.store(n, Ordering::SeqCst);
        self.rearm();
    }

    /// Makes every call fail (`true`) until set back to `false`.
    pub fn set_failing(&self, failing: bool) {
        self.shared.faults.failing.store(failing, Ordering::SeqCst);
        self.rearm();
    }

    /// Delays every call by `delay` (on tokio's clock), to exercise
    /// timeouts. `Duration::ZERO` removes the delay.
    pub fn set_delay(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.faults.delay_us.store(us, Ordering::SeqCst);
        self.rearm();
    }

    /// Removes every injected fault.
    pub fn clear_faults(&self) {
        let f = &self.shared.faults;
        f.failing.store(false, Ordering::SeqCst);
        f.fail_next.store(0, Ordering::SeqCst);
        f.delay_us.store(0, Ordering::SeqCst);
        self.rearm();
    }

    /// Calls made while a fault was set (whether or not they failed): lets a
    /// test see that a breaker stopped calling the backend.
    pub fn faulty_calls(&self) -> u64 {
        self.shared.faults.calls.load(Ordering::SeqCst)
    }

    fn rearm(&self) {
        let f = &self.shared.faults;
        let armed = f.failing.load(Ordering::SeqCst)
            || f.fail_next.load(Ordering::SeqCst) > 0
            || f.delay_us.load(Ordering::SeqCst) > 0;
        f.armed.store(armed, Ordering::SeqCst);
    }

    /// Applies injected faults: the delay to wait, or the failure.
    fn inject(&self) -> Result<Duration, MemoryError> {
        let f = &self.shared.faults;
        if !f.armed.load(Ordering::Relaxed) {
            return Ok(Duration::ZERO);
        }
        f.calls.fetch_add(1, Ordering::SeqCst);
        let delay = Duration::from_micros(f.delay_us.load(Ordering::SeqCst));
        if f.failing.load(Ordering::SeqCst) {
            return Err(MemoryError::Injected);
        }
        let took = f
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if let Ok(n) = took {
            // The last one spent: no fault may be left set.
            if n == 1 {
                self.rearm();
            }
            return Err(MemoryError::Injected);
        }
        Ok(delay)
    }
}

impl Shard {
    /// Holds `key`'s live `slot` in the table that fits its state (a
    /// [`Bucket`] when it can be one); `rehash` hashes stored keys again
    /// when the table grows.
    fn keep(&mut self, hash: u64, key: StoreKey, slot: Slot, rehash: impl Fn(&StoreKey) -> u64) {
        match Bucket::of(&slot) {
            Some(state) => {
                let bucket = Bucket::new(key, state);
                self.buckets.insert_unique(hash, bucket, |b| rehash(&b.key));
            }
            None => {
                let other = Other { key, slot };
                self.others.insert_unique(hash, other, |o| rehash(&o.key));
            }
        }
    }

    fn len(&self) -> usize {
        self.buckets.len() + self.others.len()
    }

    fn sweep_if_due(&mut self, now: Timestamp) {
        if self.len() >= self.sweep_at {
            self.sweep(now);
        }
    }

    fn sweep(&mut self, now: Timestamp) {
        self.buckets.retain(|b| *b.tat.get_mut() > now);
        self.others.retain(|o| o.slot.is_live(now));
        self.sweep_at = (self.len() * 2).max(MIN_SWEEP);
    }
}

/// The future of a memory decision: the verdict itself, or (only with an
/// injected delay) a boxed wait. Small, so the common path moves little.
#[must_use = "futures do nothing unless polled"]
enum Decide {
    Ready(Option<Result<Decision, MemoryError>>),
    Delayed(Pin<Box<dyn Future<Output = Result<Decision, MemoryError>> + Send>>),
}

impl Future for Decide {
    type Output = Result<Decision, MemoryError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut *self {
            Decide::Ready(r) => Poll::Ready(r.take().expect("polled after completion")),
            Decide::Delayed(f) => f.as_mut().poll(cx),
        }
    }
}

// A panic while a shard is held cannot leave an entry half-updated in a
// way that breaks the model's invariants worse than losing the key, so
// both keep serving a poisoned lock.
fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

/// Where and when a request is decided: the clock's now, the key, its
/// hash and its shard (small: the fast path passes it in registers).
#[derive(Clone, Copy)]
struct Located<'a> {
    now: Timestamp,
    lookup: &'a Lookup<'a>,
    hash: u64,
    shard: &'a RwLock<Shard>,
    /// For a table that grows: stored keys are hashed again.
    hasher: &'a DefaultHashBuilder,
}

impl Located<'_> {
    /// A token bucket's charge under the shard's shared lock, if the key
    /// is held as a [`Bucket`]. Always inline: called out of line, its
    /// decision comes back through memory and is moved again, in loads
    /// that wait for the stores just made (0.6x-0.7x of governor, against
    /// 1.0x, when an unrelated change tipped the compiler's choice).
    #[inline(always)]
    fn charge_shared(&self, p: &tollgate_limiter::TokenBucket, cost: u64) -> Option<Decision> {
        let shard = read(self.shard);
        let bucket = shard
            .buckets
            .find(self.hash, |b| self.lookup.matches(&b.key))?;
        bucket.charge(self.now, p, cost)
    }

    /// `op` under `policy`: a token bucket's acquire under the shared
    /// lock when it can be, anything else in its slot.
    #[inline(always)]
    fn decide(self, policy: &Policy, op: &Op) -> Decision {
        // Matched by reference: an `Op` is large (a settle's receipt).
        if let (Policy::TokenBucket(p), &Op::Acquire(cost)) = (policy, op)
            && let Some(d) = self.charge_shared(p, cost)
        {
            return d;
        }
        self.with_slot(policy, |slot, now, policy| slot.apply(now, policy, *op))
    }

    /// Runs `f` on the key's slot (a fresh one if the key is not held)
    /// under `policy`, under the shard's exclusive lock, then keeps the
    /// slot, in the table that fits its state, only if it still holds
    /// state.
    #[inline(never)]
    fn with_slot<T>(
        self,
        policy: &Policy,
        f: impl FnOnce(&mut Slot, Timestamp, &Policy) -> T,
    ) -> T {
        let (now, hash) = (self.now, self.hash);
        let rehash = |k: &StoreKey| {
            let (limiter, key) = k.parts();
            hash_parts(self.hasher, limiter, key)
        };
        let mut guard = write(self.shard);
        let shard = &mut *guard;
        if let Ok(mut entry) = shard
            .buckets
            .find_entry(hash, |b| self.lookup.matches(&b.key))
        {
            let mut slot = entry.get_mut().slot();
            let decision = f(&mut slot, now, policy);
            match Bucket::of(&slot) {
                // The key is as good as fresh: keep nothing.
                _ if !slot.is_live(now) => drop(entry.remove()),
                Some((tat, born)) => {
                    let b = entry.get_mut();
                    *b.tat.get_mut() = tat;
                    *b.born.get_mut() = born;
                }
                None => {
                    let (b, _) = entry.remove();
                    shard.keep(hash, b.key, slot, rehash);
                }
            }
            return decision;
        }
        if let Ok(mut entry) = shard
            .others
            .find_entry(hash, |o| self.lookup.matches(&o.key))
        {
            let slot = &mut entry.get_mut().slot;
            let decision = f(slot, now, policy);
            let live = slot.is_live(now);
            match Bucket::of(slot) {
                _ if !live => drop(entry.remove()),
                Some(_) => {
                    let (o, _) = entry.remove();
                    shard.keep(hash, o.key, o.slot, rehash);
                }
                None => {}
            }
            return decision;
        }
        let mut slot = Slot::fresh(policy);
        let decision = f(&mut slot, now, policy);
        if slot.is_live(now) {
            shard.keep(hash, self.lookup.to_owned(), slot, rehash);
            shard.sweep_if_due(now);
        }
        decision
    }
}

impl<C: Clock> Backend for MemoryBackend<C> {
    type Error = MemoryError;

    #[inline]
    fn decide_now(&self, req: &Request<'_>) -> Option<Decision> {
        // With a fault set, `decide` injects it (and counts the call).
        if self.shared.faults.armed.load(Ordering::Relaxed) {
            return None;
        }
        if self.shared.has_overrides.load(Ordering::Acquire) {
            // An override that is no policy is answered by `decide`.
            return self.decide_at_once(req).ok();
        }
        // No override anywhere: the configured policy rules, and the
        // decision is built where the caller reads it. Through
        // `decide_at_once`'s `Result`, it was moved once more, in loads
        // that straddle the stores just made (see `Decision::copied`):
        // 0.6x-0.7x of governor, against 1.0x.
        let now = self.shared.clock.now();
        Some(self.locate_at(req, now, req.policy, |at, policy| {
            at.decide(policy, &req.op)
        }))
    }

    fn decide(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<Decision, MemoryError>> + Send {
        // Decide at once (not when polled) unless a delay is injected: the
        // common path costs no more than the map lookup, and allocates
        // nothing.
        match self.inject() {
            Ok(delay) if delay.is_zero() => Decide::Ready(Some(self.decide_at_once(&req))),
            Err(e) => Decide::Ready(Some(Err(e))),
            Ok(delay) => {
                let backend = self.clone();
                let (limiter, key, policy, op) =
                    (req.limiter.to_owned(), req.key.clone(), *req.policy, req.op);
                Decide::Delayed(Box::pin(async move {
                    tokio::time::sleep(delay).await;
                    backend.decide_at_once(&Request {
                        limiter: &limiter,
                        key: &key,
                        policy: &policy,
                        op,
                    })
                }))
            }
        }
    }

    async fn reserve(&self, req: Request<'_>) -> Result<(Decision, Receipt), MemoryError> {
        let delay = self.inject()?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let units = match req.op {
            Op::Acquire(c) => c,
            // Not a reservation: decided as asked, nothing to refund.
            op => {
                let d = self.decide_at_once(&Request { op, ..req })?;
                return Ok((d, Receipt::NONE));
            }
        };
        self.with_slot(&req, |slot, now, policy| slot.reserve(now, policy, units))
    }

    async fn set_override(
        &self,
        scope: Scope<'_>,
        policy: Option<&Policy>,
    ) -> Result<(), MemoryError> {
        self.inject()?;
        let stored = policy.map(|&policy| Stored {
            policy,
            until: None,
        });
        self.store_override(scope, stored);
        Ok(())
    }

    async fn set_expiring_override(
        &self,
        scope: Scope<'_>,
        policy: &Policy,
        ttl: Duration,
    ) -> Result<(), MemoryError> {
        self.inject()?;
        let stored = Stored::expiring(*policy, self.shared.clock.now(), ttl);
        self.store_override(scope, Some(stored));
        Ok(())
    }

    async fn replace_override(
        &self,
        scope: Scope<'_>,
        current: Option<&Policy>,
        policy: &Policy,
        ttl: Duration,
    ) -> Result<bool, MemoryError> {
        self.inject()?;
        let now = self.shared.clock.now();
        let stored = Stored::expiring(*policy, now, ttl);
        Ok(self.store_override_if(scope, Some(stored), |o| {
            o.and_then(|o| o.stored(scope)?.live(now)).as_ref() == current
        }))
    }

    async fn get_override(&self, scope: Scope<'_>) -> Result<Option<Policy>, MemoryError> {
        Ok(self.get_override_and_ttl(scope).await?.map(|(p, _)| p))
    }

    async fn get_override_and_ttl(
        &self,
        scope: Scope<'_>,
    ) -> Result<Option<(Policy, Option<Duration>)>, MemoryError> {
        self.inject()?;
        let overrides = self
            .shared
            .overrides
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let now = self.shared.clock.now();
        let Some(s) = overrides.get(scope.limiter()).and_then(|o| o.stored(scope)) else {
            return Ok(None);
        };
        Ok(s.live(now).map(|p| {
            let left = s.until.map(|t| Duration::from_micros(t - now));
            (p, left)
        }))
    }
}

#[cfg(test)]
mod tests {
    use tollgate_limiter::{MockClock, TokenBucket};

    use super::*;

    fn key_overrides(b: &MemoryBackend<MockClock>) -> usize {
        let overrides = b.shared.overrides.read().unwrap();
        overrides.values().map(|o| o.keys.len()).sum()
    }

    #[test]
    fn the_monotonic_clock_reads_quantas_elapsed_time() {
        // One multiply by a scale taken from quanta reads what quanta's
        // nanoseconds, divided by 1,000, read: within a microsecond.
        let c = MonotonicClock::new();
        let quanta = || c.anchor + c.clock.delta_as_nanos(c.anchor_raw, c.clock.raw()) / 1_000;
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(20));
            let (before, now, after) = (quanta(), c.now(), quanta());
            assert!(
                before <= now + 1 && now <= after + 1,
                "{now} outside {before}..={after}"
            );
        }
        // And it runs with the system clock it was anchored to.
        let drift = c.now().abs_diff(SystemClock.now());
        assert!(drift < 50_000, "{drift} µs from the system clock");
    }

    #[test]
    fn the_keys_of_a_shard_carry_many_table_tags() {
        // hashbrown tags each key with the top 7 bits of its hash and
        // compares the keys whose tag matches: a shard picked by those
        // bits leaves its table few tags, and a lookup many comparisons.
        let b = MemoryBackend::new();
        let mut tags = vec![std::collections::HashSet::new(); SHARDS];
        for i in 0..SHARDS * 256 {
            let key = format!("user-{i}");
            let hash = hash_parts(&b.shared.hasher, b"api", key.as_bytes());
            tags[shard_index(hash)].insert(hash >> 57);
        }
        // 256 keys a shard on average draw ~112 of the 128 tags.
        let fewest = tags.iter().map(|t| t.len()).min().unwrap();
        assert!(fewest >= 64, "a shard's keys carry only {fewest} tags");
    }

    #[test]
    fn a_bucket_is_its_key_and_two_words() {
        // governor's entry is 32 bytes, and its key's bytes are on the heap.
        assert_eq!(std::mem::size_of::<Bucket>(), 40);
    }

    #[test]
    fn a_stored_key_splits_back_exactly() {
        let hasher = DefaultHashBuilder::default();
        // Inline and on the heap, at the boundary between them.
        let long = "k".repeat(INLINE);
        for (limiter, key) in [
            ("a\0b", "c"),
            ("a", "\0bc"),
            ("", "k"),
            ("bench", "user-1"),
            ("", &long[..INLINE]),
            ("a", &long[1..]),
            ("a", &long[..]),
            ("", ""),
        ] {
            let lookup = Lookup { limiter, key };
            let stored = lookup.to_owned();
            assert!(lookup.matches(&stored));
            let (l, k) = stored.parts();
            assert_eq!((l, k), (limiter.as_bytes(), key.as_bytes()));
            let again = hash_parts(&hasher, l, k);
            assert_eq!(
                again,
                hash_parts(&hasher, limiter.as_bytes(), key.as_bytes())
            );
        }
        let other = Lookup {
            limiter: "a",
            key: "\0bc",
        };
        assert!(
            !other.matches(
                &Lookup {
                    limiter: "a\0b",
                    key: "c"
                }
                .to_owned()
            )
        );
        // The same bytes split elsewhere, or one byte longer, inline and not.
        for (a, b) in [
            (("ab", "c"), ("a", "bc")),
            (("a", &long[1..]), ("a", &long[2..])),
            (("a", &long[1..]), ("a", &long[..])),
            (("a", &long[..]), ("a", &long[1..])),
            (("a", &long[..]), ("ak", &long[1..])),
        ] {
            let (l, k) = a;
            let stored = Lookup { limiter: l, key: k }.to_owned();
            let (limiter, key) = b;
            assert!(!Lookup { limiter, key }.matches(&stored), "{a:?} as {b:?}");
        }
        // A bucket is its key and two words: kept small, for the tables.
        assert_eq!(std::mem::size_of::<StoreKey>(), 24);
    }

    #[test]
    fn every_byte_of_a_limiters_name_moves_its_keys_hashes() {
        // Names that fold alike would still be told apart by `matches`,
        // but share hashes: every key of one would probe past the other's.
        let hasher = DefaultHashBuilder::default();
        for n in 0..40u8 {
            let name: Vec<u8> = (0..n).map(|i| b'a' + i % 26).collect();
            let base = hash_parts(&hasher, &name, b"client-1");
            for i in 0..usize::from(n) {
                for bit in [0x01, 0x20, 0x80] {
                    let mut other = name.clone();
                    other[i] ^= bit;
                    assert_ne!(
                        hash_parts(&hasher, &other, b"client-1"),
                        base,
                        "length {n}, byte {i}, bit {bit:#x}"
                    );
                }
            }
            let longer = [name.as_slice(), b"x"].concat();
            assert_ne!(
                hash_parts(&hasher, &longer, b"client-1"),
                base,
                "length {n}"
            );
        }
    }

    #[test]
    fn same_bytes_sees_every_byte() {
        for n in 0..40u8 {
            let a: Vec<u8> = (0..n).collect();
            assert!(same_bytes(&a, &a.clone()));
            for i in 0..usize::from(n) {
                let mut b = a.clone();
                b[i] ^= 0x80;
                assert!(!same_bytes(&a, &b), "length {n}, byte {i}");
            }
            assert!(!same_bytes(&a, &a[..a.len().saturating_sub(1)]) || n == 0);
        }
    }

    /// Once every override has expired (an AIMD controller's, after it
    /// stopped), decisions leave the override path without anyone calling
    /// `sweep`: on it, every decision of every thread reads the shared
    /// override map's lock.
    #[tokio::test]
    async fn decisions_leave_the_override_path_once_every_override_expired() {
        let clock = MockClock::new();
        let b = MemoryBackend::with_clock(clock.clone());
        let p = Policy::from(TokenBucket::new(5, 1, Duration::from_secs(1)).unwrap());
        let k = Key::new("k");
        let ttl = Duration::from_secs(1);
        b.set_expiring_override(Scope::Limiter("l"), &p, ttl)
            .await
            .unwrap();
        b.set_expiring_override(Scope::Key("l", &k), &p, 2 * ttl)
            .await
            .unwrap();
        let req = Request {
            limiter: "l",
            key: &k,
            policy: &p,
            op: Op::Acquire(1),
        };
        let on_path = || b.shared.has_overrides.load(Ordering::SeqCst);
        clock.advance(ttl);
        assert!(b.decide_now(&req).is_some());
        assert!(on_path(), "the key's override is live");
        clock.advance(ttl);
        assert!(b.decide_now(&req).is_some());
        assert!(!on_path(), "every override has expired");
        // A new one puts decisions back on the path.
        b.set_override(Scope::Limiter("l"), Some(&p)).await.unwrap();
        assert!(on_path());
    }

    #[tokio::test]
    async fn expired_overrides_are_reclaimed() {
        let clock = MockClock::new();
        let b = MemoryBackend::with_clock(clock.clone());
        let p = Policy::from(TokenBucket::new(5, 1, Duration::from_secs(1)).unwrap());
        let set = |i: usize| {
            let b = b.clone();
            async move {
                let k = Key::new(format!("scope-{i}"));
                let ttl = Duration::from_secs(1);
                b.set_expiring_override(Scope::Key("aimd", &k), &p, ttl)
                    .await
                    .unwrap();
            }
        };
        // Writes sweep as the map doubles: a stream of expiring overrides
        // keeps only the live ones and a bounded backlog.
        for round in 0..10 {
            for i in 0..5000 {
                set(round * 5000 + i).await;
            }
            clock.advance(Duration::from_secs(1));
            assert!(
                key_overrides(&b) <= 2 * 5000 + MIN_SWEEP,
                "{}",
                key_overrides(&b)
            );
        }
        b.sweep();
        assert_eq!(key_overrides(&b), 0);
        assert!(b.shared.overrides.read().unwrap().is_empty());
        // None left: decisions no longer look for one (a read of the shared
        // override map's lock on every decision of every thread).
        assert!(!b.shared.has_overrides.load(Ordering::SeqCst));
    }
}
