//! State stores for loopguard's group (swarm) scope.
//!
//! A *group* is a swarm of workers (agent sessions) on one task. The group detector asks, for each
//! call fingerprint a worker produces, how often the whole swarm has produced it and by how many
//! different workers — "ten calls from at least two workers" is a swarm stuck on one approach even
//! when every worker looks innocent alone. This crate keeps those counters behind one trait,
//! [`GroupStore`], with two backends:
//!
//! - [`MemoryStore`], the embedded default: in-process, bounded, thread-safe, and
//!   [snapshotted](GroupSnapshot) as versioned serde data.
//! - `RedisStore` (feature `redis`, on by default): several hosts behind a load balancer share the
//!   counters through a Redis server that operators already run.
//!
//! # Key design decision
//!
//! **Recording never waits for the network.** [`GroupStore::record`] is on the engine's hot
//! path, so it only updates in-process state under a short per-shard lock and answers from it.
//! The Redis backend aggregates local deltas and a background thread exchanges them with the
//! server in one pipelined round trip per flush interval, bringing back the global totals of the
//! fingerprints it touched. Answers are therefore *lower bounds with bounded staleness*: a host
//! always sees its own records at once and other hosts' records within the staleness bound
//! (`RedisConfig::staleness_bound`, twice the flush interval). When Redis is down the
//! store keeps counting locally, says so in [`StoreStatus`], and — if configured to fail closed —
//! flags its answers [`Availability::Unavailable`] so that the engine can refuse the call.
//!
//! Both backends bound their memory: a cap on groups, on fingerprints per group and on workers
//! tracked per fingerprint, with the least recently seen entries evicted first (see
//! [`MemoryConfig`]).
//!
//! # Example
//!
//! ```
//! use loopguard_store::{GroupStore, MemoryConfig, MemoryStore, WorkerId};
//!
//! let store = MemoryStore::new(MemoryConfig::default());
//! let (alice, bob) = (WorkerId::new("worker-a"), WorkerId::new("worker-b"));
//! let fingerprint = 0x5eed_u64;
//! store.record("swarm-1", alice, fingerprint, 1_000);
//! store.record("swarm-1", alice, fingerprint, 2_000);
//! let tally = store.record("swarm-1", bob, fingerprint, 3_000);
//! assert_eq!((tally.count, tally.workers), (3, 2));
//!
//! // The swarm completed: forget it.
//! store.clear_group("swarm-1");
//! assert_eq!(store.tally("swarm-1", fingerprint).count, 0);
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod bounded;
pub mod format;
mod memory;
#[cfg(feature = "redis")]
mod redis_store;
mod snapshot;

use std::fmt;
use std::time::Duration;

pub use memory::{MemoryConfig, MemoryStore, RestoreReport};
#[cfg(feature = "redis")]
pub use redis_store::{ConfigError, FlushError, FlushReport, RedisConfig, RedisStore};
pub use snapshot::{
    GROUP_SNAPSHOT, GroupSnapshot, InvalidSnapshot, SnapshotError, SnapshotFingerprint,
    SnapshotGroup,
};

/// A call fingerprint as the engine computes it: a 64-bit hash of a tool call's canonical form.
pub type Fingerprint = u64;

/// A worker (one agent session of a swarm), identified by a stable 64-bit hash of its name.
///
/// The hash is XXH3-64 with seed 0, so every host and every process derives the same id from the
/// same name — which is what lets two hosts agree that they saw the same worker, and lets a
/// snapshot be restored elsewhere. Compute it once per session, not per event.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkerId(u64);

impl WorkerId {
    /// The id of the worker called `name`.
    pub fn new(name: &str) -> Self {
        Self(loopguard_hash::xxh3(name.as_bytes()))
    }

    /// A worker id the host already has as a number.
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The id as a number.
    pub const fn raw(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkerId({:016x})", self.0)
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// How far an answer of the store can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Availability {
    /// The store is healthy: the answer includes everything the store knows within its
    /// staleness bound (always the case for [`MemoryStore`]).
    Live,
    /// The shared backend is unreachable; the answer comes from this host's local state only
    /// (this host's records plus the last totals it read). The store keeps working.
    LocalOnly,
    /// The shared backend has been unreachable for longer than the staleness bound and the store
    /// is configured to fail closed. The record was still counted locally, but the answer must
    /// not be trusted: the engine turns this into a `block` verdict.
    Unavailable,
}

/// What [`GroupStore::record`] and [`GroupStore::tally`] answer for one fingerprint of a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupTally {
    /// How many times the group's workers produced the fingerprint (a lower bound for a shared
    /// store: other hosts' unflushed records are not in it yet).
    pub count: u64,
    /// How many distinct workers produced it (a lower bound, and saturating at
    /// [`MemoryConfig::max_workers_per_fingerprint`]).
    pub workers: u32,
    /// Whether the answer can be trusted.
    pub availability: Availability,
}

impl GroupTally {
    /// A tally of nothing, from a healthy store.
    pub const EMPTY: Self = Self {
        count: 0,
        workers: 0,
        availability: Availability::Live,
    };

    /// True when the store fails closed and cannot currently vouch for the answer; the engine
    /// refuses the call (`block`) instead of trusting `count`.
    pub fn is_unavailable(&self) -> bool {
        self.availability == Availability::Unavailable
    }
}

/// Which backend a [`StoreStatus`] describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// [`MemoryStore`].
    Memory,
    /// `RedisStore`.
    Redis,
}

/// Health and bookkeeping of a store, for hosts to log, export as metrics, or show in `status`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStatus {
    /// The backend.
    pub backend: Backend,
    /// Whether the shared backend answered the last exchange and that exchange started within
    /// the staleness bound (always true for memory): a server that stops answering is
    /// unreachable once the bound has passed, even while a request to it is still waiting.
    pub reachable: bool,
    /// What a `record` would be flagged with right now.
    pub availability: Availability,
    /// Failed attempts to reach the shared backend (connects and flushes) since the store started.
    pub errors: u64,
    /// The most recent such failure, if any.
    pub last_error: Option<String>,
    /// Time since the last successful exchange with the shared backend (`None` for memory, or
    /// before the first success).
    pub since_last_sync: Option<Duration>,
    /// The staleness bound the store promises while reachable (zero for memory).
    pub staleness_bound: Duration,
    /// Successful flushes.
    pub flushes: u64,
    /// Connections (re-)established after the first.
    pub reconnects: u64,
    /// Groups held in process memory.
    pub groups: usize,
    /// Fingerprints with local deltas not yet acknowledged by the shared backend.
    pub pending: usize,
    /// Groups evicted because the group cap was reached.
    pub evicted_groups: u64,
    /// Fingerprints evicted because a group's fingerprint cap was reached.
    pub evicted_fingerprints: u64,
    /// Local counts that could not be delivered to the shared backend because their entry was
    /// evicted or their group cleared while the backend was unreachable.
    pub dropped_deltas: u64,
    /// Deltas a flush held back because a key of the shared backend holds a value of the wrong
    /// type (another program wrote it): the key is left alone and named in the log and in
    /// `last_error`, and its deltas stay on this host until the key is removed (zero for memory).
    pub wrong_type_skips: u64,
}

/// The counters of the group (swarm) scope.
///
/// Implementations are shared between threads (`Send + Sync`) and called concurrently by every
/// session of every group. [`record`](Self::record) is the hot path: it must not block on I/O and
/// should not allocate in steady state.
pub trait GroupStore: Send + Sync + fmt::Debug {
    /// Records that `worker` of `group` produced `fingerprint` at event time `at_ms` (the host's
    /// event time in milliseconds, as everywhere in loopguard), and answers the group-wide tally
    /// of that fingerprint including this record.
    fn record(
        &self,
        group: &str,
        worker: WorkerId,
        fingerprint: Fingerprint,
        at_ms: u64,
    ) -> GroupTally;

    /// The current tally of `fingerprint` in `group`, without recording anything.
    fn tally(&self, group: &str, fingerprint: Fingerprint) -> GroupTally;

    /// Forgets everything about `group` (the swarm completed). A shared backend deletes the
    /// group's keys on its next exchange with the server.
    fn clear_group(&self, group: &str);

    /// Health and bookkeeping.
    fn status(&self) -> StoreStatus;
}
