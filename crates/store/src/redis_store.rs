//! Group counters shared by several hosts through Redis: see [`RedisStore`].

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{Cmd, Value};

use crate::bounded::{
    FingerprintMap, add_worker, after_eviction, count_u32, evict_lowest, groups_per_shard, lock,
    name_rank, shard_count, shard_of,
};
use crate::{
    Availability, Backend, Fingerprint, GroupStore, GroupTally, MemoryConfig, StoreStatus, WorkerId,
};

/// How to reach Redis and how to behave around it.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]` (default `redis://127.0.0.1:6379/`).
    pub url: String,
    /// Prefix of every key (default `loopguard:`), so that several deployments can share a
    /// server.
    pub key_prefix: String,
    /// How often local deltas are sent and global totals read back (default 200 ms).
    pub flush_interval: Duration,
    /// Keys expire when not refreshed for this long, wall-clock time (default one hour). The local
    /// cache forgets a fingerprint's global total after the same time without a record (event
    /// time), so that it does not answer from a total Redis has already dropped.
    pub ttl: Duration,
    /// Timeout of connecting and of each read and write (default one second): the longest a
    /// server that stops answering can hold the flush thread. Answers do not wait for it: they
    /// stop being live once the staleness bound has passed since the last successful exchange.
    pub io_timeout: Duration,
    /// Longest wait between reconnection attempts of a fail-open store (default five seconds).
    /// A fail-closed store retries every flush interval.
    pub max_backoff: Duration,
    /// When the last successful exchange with Redis started longer ago than the staleness
    /// bound — or none has succeeded within it since the store started — flag answers
    /// [`Availability::Unavailable`] (the engine then blocks) instead of answering from local
    /// state (default false: fail open).
    pub fail_closed: bool,
    /// Flush from a background thread (default true). When false, nothing is sent until the host
    /// calls [`RedisStore::flush_now`] — for tests, and hosts that drive flushes themselves.
    pub background_flush: bool,
    /// Bounds of the local cache and of pending deltas (groups, fingerprints per group, workers
    /// per fingerprint per flush). Its `idle_ttl_ms` is not used: `ttl` is.
    pub local: MemoryConfig,
}

impl RedisConfig {
    /// The defaults, with this server URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }

    /// How old another host's records can be when they are left out of an answer while Redis is
    /// reachable: twice the flush interval (plus a round trip). Also how long Redis may be
    /// unreachable before a fail-closed store flags its answers.
    pub fn staleness_bound(&self) -> Duration {
        self.flush_interval.saturating_mul(2)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("flush_interval", self.flush_interval),
            ("ttl", self.ttl),
            ("io_timeout", self.io_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::Zero { field: name });
            }
        }
        if self.ttl.as_millis() > u128::from(u64::MAX) {
            return Err(ConfigError::TtlTooLong);
        }
        Ok(())
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379/".to_owned(),
            key_prefix: "loopguard:".to_owned(),
            flush_interval: Duration::from_millis(200),
            ttl: Duration::from_secs(3600),
            io_timeout: Duration::from_secs(1),
            max_backoff: Duration::from_secs(5),
            fail_closed: false,
            background_flush: true,
            local: MemoryConfig::default(),
        }
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact(&self.url))
            .field("key_prefix", &self.key_prefix)
            .field("flush_interval", &self.flush_interval)
            .field("ttl", &self.ttl)
            .field("io_timeout", &self.io_timeout)
            .field("max_backoff", &self.max_backoff)
            .field("fail_closed", &self.fail_closed)
            .field("background_flush", &self.background_flush)
            .field("local", &self.local)
            .finish()
    }
}

/// The URL with any credentials masked, for debug output.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Why a [`RedisStore`] could not be created. (An unreachable server is not an error: the store
/// starts on local state and keeps trying.)
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The URL could not be parsed.
    #[error("invalid redis url: {0}")]
    Url(#[source] redis::RedisError),
    /// A duration that must be positive is zero.
    #[error("redis store setting `{field}` must be greater than zero")]
    Zero {
        /// The setting.
        field: &'static str,
    },
    /// The TTL does not fit in 64-bit milliseconds.
    #[error("redis store setting `ttl` is too long")]
    TtlTooLong,
    /// The background thread could not be started.
    #[error("could not start the redis flush thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Why a flush did not reach Redis. The deltas stay pending and go with the next flush.
#[derive(Debug, thiserror::Error)]
#[error("redis flush failed: {source}")]
pub struct FlushError {
    #[source]
    source: redis::RedisError,
}

/// What a successful flush did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushReport {
    /// Fingerprints whose deltas were sent and whose totals were read back.
    pub fingerprints: usize,
    /// Groups whose keys were deleted.
    pub groups_cleared: usize,
}

/// Group counters shared by several hosts through Redis.
///
/// # Why a synchronous client and a thread
///
/// The engine is a synchronous library with a hot path that must never wait for the network, so
/// the network lives on one background thread per store, which the `redis` crate's blocking
/// client serves well: no async runtime enters the dependency tree of every host (tokio would
/// bring its own threads and a reactor for what is one TCP connection used five times a second),
/// and the crate is built with no default features, so no TLS stack, cluster, or scripting
/// helpers either. A host that needs TLS (`rediss://`) turns on one of the `redis` crate's TLS
/// features in its own manifest.
///
/// # Protocol
///
/// [`record`](GroupStore::record) adds to a local *pending* delta and answers at once from the
/// local cache: the group-wide totals read at the last flush, plus deltas in flight, plus pending
/// ones. Every [`flush_interval`](RedisConfig::flush_interval) the background thread moves the
/// pending deltas of each group into a *batch* and sends all batches in **one pipeline**: one
/// call per group of a Lua script, which applies the group's batch atomically and replies with
/// the new global totals of exactly the fingerprints it touched, which replace the cached ones.
/// [`tally`](GroupStore::tally) never goes to Redis either: it answers what `record` would,
/// without the record. Keys, for group `G` and fingerprint `F` (16 hex digits), with the default
/// prefix:
///
/// | key | type | holds |
/// | --- | --- | --- |
/// | `loopguard:{G}:c:F` | string | the group-wide count of `F` (`INCRBY` delta → new total) |
/// | `loopguard:{G}:w:F` | set | the workers that produced `F`, as 16 hex digits of their [`WorkerId`] (`SADD` → `SCARD`) |
/// | `loopguard:{G}:i` | sorted set | the group's fingerprints, scored by last flush (unix ms) |
/// | `loopguard:{G}:a` | sorted set | the hosts that flushed the group, scored by the sequence number of the last batch applied |
///
/// Each flush sets `PEXPIRE ttl` on every key it writes (twice the TTL on the `a` marker) and
/// trims index members older than the TTL, so a fingerprint nobody repeats for `ttl` disappears
/// from Redis, and an abandoned group entirely. The braces make `G` a hash tag, so a group's keys
/// share one cluster slot. [`clear_group`](GroupStore::clear_group) drops the group locally at
/// once and, on the next flush, a second script deletes every key of the group before newer
/// deltas are applied.
///
/// # Each delta is applied once
///
/// A batch carries this store's random host id and a sequence number that increases with each
/// batch. The script applies it only if the group's `a` marker holds an older number for the
/// host, and records the new one in the same atomic step; otherwise it only reads the totals
/// back. A batch whose reply does not come back (a timeout, a lost connection, an error reply) is
/// kept *outstanding* and sent again, unchanged, with every flush until Redis answers for it, so
/// a batch Redis applied but could not acknowledge is not applied twice. While a group has a
/// batch outstanding its new deltas wait, so that batches of a group are applied in order. A
/// batch still outstanding after `ttl` (Redis unreachable that long) is given up and counted in
/// [`StoreStatus::dropped_deltas`]: markers of hosts silent for twice the TTL are trimmed, and
/// past that point Redis may no longer know it applied the batch.
///
/// # Keys of the wrong type
///
/// Another program may write under the prefix: a string where a set is kept, text where a count
/// is. Such a key is never written, expired or deleted by the store: the script checks the type
/// (and that a count is an integer) of every key before it writes anything, and answers for each
/// fingerprint. A fingerprint whose count or worker set has the wrong type is skipped; a group
/// whose index or marker has the wrong type is skipped whole. The skipped deltas go back to
/// pending on this host (still in its answers, counted once) and are offered again with every
/// flush, so that they are applied once as soon as the key is removed; everything else in the
/// flush is applied normally. Each skip counts in [`StoreStatus::wrong_type_skips`], names the key
/// in [`StoreStatus::last_error`], and the first one for each key is logged (`tracing` warn, with
/// the key; info when it is usable again). A clear deletes the group's keys of the right type only.
///
/// # Staleness
///
/// A host sees its own records immediately. A record made on another host is in this host's
/// answers once that host has flushed it (within one interval) and this host has flushed a delta
/// of the same fingerprint since (within one more interval, when this host is recording the
/// fingerprint — which is when the answer matters): the bound is
/// [`RedisConfig::staleness_bound`], twice the flush interval (plus a round trip). Counts and
/// distinct-worker counts lag rather than overshoot. They can overshoot for one flush after
/// another host cleared the group, or after Redis lost its data (a restart without persistence):
/// the cached total still holds what was deleted.
///
/// # When Redis is unreachable
///
/// Answers are [`Availability::Live`] only while the last exchange succeeded **and started
/// within the staleness bound**. This is judged by the clock on every answer, not by the flush
/// thread, so a server that stops answering without closing the connection (a frozen process,
/// a dead network path) is noticed once the bound has passed even while the flush thread still
/// waits for a reply (for at most [`io_timeout`](RedisConfig::io_timeout), the read and write
/// timeout of the connection). Otherwise the store keeps counting locally and answering from
/// local state ([`Availability::LocalOnly`]); undelivered deltas accumulate (bounded like the
/// cache) and are sent on reconnection. Each failed connect or flush increments
/// [`StoreStatus::errors`]; the transitions between reachable and unreachable are logged through
/// `tracing` (warn, then info). Reconnection is retried with exponential backoff from the flush
/// interval up to [`max_backoff`](RedisConfig::max_backoff). With
/// [`fail_closed`](RedisConfig::fail_closed), once the last successful exchange started longer
/// ago than the staleness bound, answers are flagged [`Availability::Unavailable`] and the engine
/// blocks the call; reconnection is then retried every flush interval, so that answers are live
/// again within the staleness bound once Redis is back. A Redis restart without persistence
/// loses what was flushed before it; hosts then start over from their pending deltas.
///
/// # Shutting down
///
/// Dropping the store stops its background thread after a last flush (if connected).
pub struct RedisStore {
    shared: Arc<Shared>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("config", &self.shared.config)
            .field("background_flush", &self.thread.is_some())
            .finish_non_exhaustive()
    }
}

struct Shared {
    config: RedisConfig,
    ttl_ms: u64,
    shards: Box<[Mutex<LocalShard>]>,
    groups_per_shard: usize,
    next_epoch: AtomicU64,
    /// Groups cleared locally whose keys are still to be deleted in Redis.
    clears: Mutex<Vec<Clear>>,
    /// The connection and its backoff; held for the whole of a flush, so flushes never overlap.
    link: Mutex<Link>,
    /// This store's name in the groups' markers of applied batches: 16 hex digits, random.
    host: String,
    started: Instant,
    /// Whether the last exchange succeeded.
    reachable: AtomicBool,
    /// Milliseconds from `started` to the start of the last successful exchange; `u64::MAX`
    /// before the first.
    last_sync_ms: AtomicU64,
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
    flushes: AtomicU64,
    reconnects: AtomicU64,
    evicted_groups: AtomicU64,
    evicted_fingerprints: AtomicU64,
    dropped_deltas: AtomicU64,
    wrong_type_skips: AtomicU64,
}

/// Everything only a flush touches.
struct Link {
    client: redis::Client,
    connection: Option<redis::Connection>,
    ever_connected: bool,
    backoff: Duration,
    next_attempt: Option<Instant>,
    /// The scripts as loaded on this connection; `None` until the first flush with work loads
    /// them.
    scripts: Option<Scripts>,
    /// Batches sent and not acknowledged yet, oldest first: each is sent again, unchanged, with
    /// every flush until Redis answers for it. At most one per group incarnation.
    outstanding: Vec<GroupBatch>,
    /// The sequence number of the newest batch.
    last_seq: u64,
    /// Keys found with the wrong type and not seen usable since, so that each is warned about
    /// once.
    wrong_keys: HashSet<String>,
}

#[derive(Default)]
struct LocalShard {
    groups: HashMap<Box<str>, LocalGroup>,
}

struct LocalGroup {
    /// Distinguishes this incarnation of the group from one created after a clear or eviction,
    /// so that replies to an older flush are not applied to it.
    epoch: u64,
    entries: FingerprintMap<LocalEntry>,
    /// Fingerprints with a pending delta (exactly those with `pending_count > 0`).
    dirty: Vec<u64>,
    /// Whether a batch of this incarnation is outstanding; its new deltas wait until Redis has
    /// answered for it.
    outstanding: bool,
    last_seen_ms: u64,
}

#[derive(Default)]
struct LocalEntry {
    /// Group-wide totals as of the last flush that touched this fingerprint.
    global_count: u64,
    global_workers: u32,
    /// In the group's outstanding batch: sent, not yet acknowledged.
    inflight_count: u64,
    inflight_workers: u32,
    /// Not yet sent; workers new to this flush window (capacity kept between flushes).
    pending_count: u64,
    pending_workers: Vec<u64>,
    last_seen_ms: u64,
}

impl LocalEntry {
    fn tally(&self, availability: Availability) -> GroupTally {
        let workers = self
            .global_workers
            .max(self.inflight_workers)
            .max(count_u32(self.pending_workers.len()));
        GroupTally {
            count: self
                .global_count
                .saturating_add(self.inflight_count)
                .saturating_add(self.pending_count),
            workers,
            availability,
        }
    }

    fn is_dirty(&self) -> bool {
        self.pending_count > 0 || self.inflight_count > 0
    }
}

/// Eviction rank: least recently seen first, entries with undelivered deltas last.
fn rank(dirty: bool, last_seen_ms: u64) -> u64 {
    const DIRTY: u64 = 1 << 63;
    if dirty {
        last_seen_ms | DIRTY
    } else {
        last_seen_ms & !DIRTY
    }
}

impl LocalGroup {
    fn new(epoch: u64) -> Self {
        Self {
            epoch,
            entries: FingerprintMap::default(),
            dirty: Vec::new(),
            outstanding: false,
            last_seen_ms: 0,
        }
    }

    fn record(
        &mut self,
        shared: &Shared,
        worker: u64,
        fingerprint: u64,
        at_ms: u64,
        availability: Availability,
    ) -> GroupTally {
        self.last_seen_ms = self.last_seen_ms.max(at_ms);
        let limits = &shared.config.local;
        if self.entries.len() >= limits.max_fingerprints_per_group
            && !self.entries.contains_key(&fingerprint)
        {
            let pending_before: u64 = self.entries.values().map(|e| e.pending_count).sum();
            let keep = after_eviction(limits.max_fingerprints_per_group);
            let n = evict_lowest(&mut self.entries, keep, |&fp, e| {
                (rank(e.is_dirty(), e.last_seen_ms), fp)
            });
            let pending_after: u64 = self.entries.values().map(|e| e.pending_count).sum();
            let entries = &self.entries;
            self.dirty.retain(|fp| entries.contains_key(fp));
            shared
                .evicted_fingerprints
                .fetch_add(n as u64, Ordering::Relaxed);
            shared.dropped_deltas.fetch_add(
                pending_before.saturating_sub(pending_after),
                Ordering::Relaxed,
            );
        }
        let entry = self.entries.entry(fingerprint).or_default();
        if at_ms.saturating_sub(entry.last_seen_ms) > shared.ttl_ms {
            // Redis has expired this fingerprint by now: do not answer from its old total.
            entry.global_count = 0;
            entry.global_workers = 0;
        }
        entry.last_seen_ms = entry.last_seen_ms.max(at_ms);
        if entry.pending_count == 0 {
            self.dirty.push(fingerprint);
        }
        entry.pending_count = entry.pending_count.saturating_add(1);
        add_worker(
            &mut entry.pending_workers,
            worker,
            limits.max_workers_per_fingerprint,
        );
        entry.tally(availability)
    }
}

/// The deltas of one group moved in flight by a flush. Sent again unchanged, under the same
/// sequence number, until Redis has answered for it.
struct GroupBatch {
    group: String,
    epoch: u64,
    /// Increasing for this host, and close to the unix time (ms) the batch was made, so that
    /// markers of hosts gone for longer than the TTL can be trimmed.
    seq: u64,
    made: Instant,
    fingerprints: Vec<FingerprintDelta>,
}

/// A group cleared locally, to be deleted in Redis.
struct Clear {
    group: String,
    /// Batches of incarnations older than this (earlier epochs) were recorded before the clear.
    before_epoch: u64,
}

struct FingerprintDelta {
    fingerprint: u64,
    count: u64,
    workers: Vec<u64>,
}

impl RedisStore {
    /// A store talking to the server at `config.url`. Tries to connect once, within
    /// `io_timeout`, so that a healthy deployment starts [`Availability::Live`]; an unreachable
    /// server is not an error (see [`status`](GroupStore::status)). Starts the background flush
    /// thread unless `background_flush` is false.
    pub fn connect(config: RedisConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let client = redis::Client::open(config.url.as_str()).map_err(ConfigError::Url)?;
        let mut config = config;
        config.local = config.local.sanitized();
        let shards = shard_count(config.local.max_groups);
        let shared = Arc::new(Shared {
            ttl_ms: u64::try_from(config.ttl.as_millis()).unwrap_or(u64::MAX),
            groups_per_shard: groups_per_shard(config.local.max_groups, shards),
            shards: (0..shards).map(|_| Mutex::default()).collect(),
            next_epoch: AtomicU64::new(0),
            clears: Mutex::default(),
            link: Mutex::new(Link {
                client,
                connection: None,
                ever_connected: false,
                backoff: config.flush_interval,
                next_attempt: None,
                scripts: None,
                outstanding: Vec::new(),
                last_seq: 0,
                wrong_keys: HashSet::new(),
            }),
            host: format!("{:016x}", host_id()),
            started: Instant::now(),
            reachable: AtomicBool::new(false),
            last_sync_ms: AtomicU64::new(u64::MAX),
            errors: AtomicU64::new(0),
            last_error: Mutex::default(),
            flushes: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            evicted_groups: AtomicU64::new(0),
            evicted_fingerprints: AtomicU64::new(0),
            dropped_deltas: AtomicU64::new(0),
            wrong_type_skips: AtomicU64::new(0),
            config,
        });
        // A first exchange (a PING, as nothing is pending), so that `status` is true from the
        // start. Failure is recorded and retried by the flush thread.
        let _ = shared.flush(&mut lock(&shared.link), true);
        let (stop, thread) = if shared.config.background_flush {
            let (stop, stopped) = mpsc::channel();
            let worker = Arc::clone(&shared);
            let thread = std::thread::Builder::new()
                .name("loopguard-redis-flush".to_owned())
                .spawn(move || worker.run(&stopped))
                .map_err(ConfigError::Thread)?;
            (Some(stop), Some(thread))
        } else {
            (None, None)
        };
        Ok(Self {
            shared,
            stop,
            thread,
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &RedisConfig {
        &self.shared.config
    }

    /// Flushes now, from the calling thread: sends pending deltas and queued clears, reads back
    /// totals (or PINGs when there is nothing to send). Ignores the reconnection backoff. Waits
    /// for a flush in progress on the background thread first. For tests and for hosts that
    /// drive flushes themselves.
    pub fn flush_now(&self) -> Result<FlushReport, FlushError> {
        self.shared.flush(&mut lock(&self.shared.link), true)
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        // Closing the channel wakes the thread, which flushes a last time if connected and exits.
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Shared {
    fn shard(&self, group: &str) -> &Mutex<LocalShard> {
        &self.shards[shard_of(group, self.shards.len())]
    }

    /// Time since the start of the last exchange that succeeded: everything other hosts had
    /// flushed before that instant is in this host's totals.
    fn since_last_sync(&self) -> Option<Duration> {
        let at = self.last_sync_ms.load(Ordering::Acquire);
        (at != u64::MAX).then(|| {
            self.started
                .elapsed()
                .saturating_sub(Duration::from_millis(at))
        })
    }

    /// Whether the last exchange succeeded and started within the staleness bound. Judged by the
    /// clock, not by the flush thread, so that a server that stops answering (a frozen process,
    /// a dead network path) is noticed even while the flush thread still waits for its reply.
    fn in_sync(&self) -> bool {
        self.reachable.load(Ordering::Acquire)
            && self
                .since_last_sync()
                .is_some_and(|age| age <= self.config.staleness_bound())
    }

    /// What answers are flagged with now.
    fn availability(&self) -> Availability {
        if self.in_sync() {
            return Availability::Live;
        }
        if !self.config.fail_closed {
            return Availability::LocalOnly;
        }
        let stale_for = self
            .since_last_sync()
            .unwrap_or_else(|| self.started.elapsed());
        if stale_for > self.config.staleness_bound() {
            Availability::Unavailable
        } else {
            Availability::LocalOnly
        }
    }

    fn run(&self, stop: &mpsc::Receiver<()>) {
        // Flushes start on a fixed schedule, so that the time between two syncs stays one interval
        // whatever a flush takes (a flush that overruns is followed by the next one at once).
        let interval = self.config.flush_interval;
        let mut next = Instant::now() + interval;
        // Nothing is ever sent on the channel: it is closed when the store is dropped.
        while let Err(RecvTimeoutError::Timeout) =
            stop.recv_timeout(next.saturating_duration_since(Instant::now()))
        {
            let _ = self.flush(&mut lock(&self.link), false);
            next = (next + interval).max(Instant::now());
        }
        let mut link = lock(&self.link);
        if link.connection.is_some() {
            let _ = self.flush(&mut link, false);
        }
    }

    /// One exchange with Redis. `force` ignores the reconnection backoff.
    fn flush(&self, link: &mut Link, force: bool) -> Result<FlushReport, FlushError> {
        if link.connection.is_none() {
            if !force && link.next_attempt.is_some_and(|at| Instant::now() < at) {
                return Ok(FlushReport::default());
            }
            match self.open(link) {
                Ok(connection) => {
                    if link.ever_connected {
                        self.reconnects.fetch_add(1, Ordering::Relaxed);
                    }
                    link.ever_connected = true;
                    link.connection = Some(connection);
                    // A new connection may reach a server that has never seen the scripts.
                    link.scripts = None;
                }
                Err(source) => {
                    self.failed(link, &source);
                    return Err(FlushError { source });
                }
            }
        }
        let clears = std::mem::take(&mut *lock(&self.clears));
        self.forget_cleared(&mut link.outstanding, &clears);
        self.give_up_overdue(&mut link.outstanding);
        let batches = self.take_pending(&mut link.last_seq);
        link.outstanding.extend(batches);
        let started_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        let Link {
            connection,
            scripts,
            outstanding,
            ..
        } = &mut *link;
        let result = match connection.as_mut() {
            Some(connection) => self.exchange(connection, scripts, &clears, outstanding),
            None => Err(unexpected("no connection to redis")),
        };
        match result {
            Ok(replies) => self.settle(link, clears, &replies, started_ms),
            Err(source) => {
                // Whether any of it was applied is unknown: the batches stay outstanding, to be
                // sent again unchanged, and Redis applies each at most once.
                self.requeue_clears(clears);
                self.failed(link, &source);
                Err(FlushError { source })
            }
        }
    }

    fn open(&self, link: &Link) -> redis::RedisResult<redis::Connection> {
        let timeout = self.config.io_timeout;
        let connection = link.client.get_connection_with_timeout(timeout)?;
        connection.set_read_timeout(Some(timeout))?;
        connection.set_write_timeout(Some(timeout))?;
        Ok(connection)
    }

    fn succeeded(&self, link: &mut Link, started_ms: u64) {
        let first = self.last_sync_ms.swap(started_ms, Ordering::AcqRel) == u64::MAX;
        self.flushes.fetch_add(1, Ordering::Relaxed);
        link.backoff = self.config.flush_interval;
        link.next_attempt = None;
        if !self.reachable.swap(true, Ordering::AcqRel) {
            if first {
                tracing::debug!(
                    prefix = %self.config.key_prefix,
                    "loopguard group store: connected to redis"
                );
            } else {
                tracing::info!(
                    prefix = %self.config.key_prefix,
                    "loopguard group store: redis reachable again, sharing group counters"
                );
            }
        }
    }

    fn failed(&self, link: &mut Link, error: &redis::RedisError) {
        link.connection = None;
        self.errors.fetch_add(1, Ordering::Relaxed);
        *lock(&self.last_error) = Some(error.to_string());
        let was_reachable = self.reachable.swap(false, Ordering::AcqRel);
        if was_reachable {
            link.backoff = self.config.flush_interval;
            tracing::warn!(
                %error,
                "loopguard group store: redis unreachable, counting on local state until it is back"
            );
        } else {
            link.backoff = if self.config.fail_closed {
                // Every moment spent noticing that Redis is back is a moment of refused calls.
                self.config.flush_interval
            } else {
                link.backoff
                    .saturating_mul(2)
                    .min(self.config.max_backoff.max(self.config.flush_interval))
            };
            tracing::debug!(%error, "loopguard group store: redis still unreachable");
        }
        link.next_attempt = Some(Instant::now() + link.backoff);
    }

    /// A flush that reached Redis but got an error back for some of its scripts (out of memory,
    /// a read-only replica): the connection stays, but this is not a sync.
    fn refused(&self, error: &redis::RedisError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        *lock(&self.last_error) = Some(error.to_string());
        tracing::debug!(%error, "loopguard group store: redis refused part of a flush");
    }

    /// Moves the pending deltas of every group without an outstanding batch in flight, one new
    /// batch per group.
    fn take_pending(&self, last_seq: &mut u64) -> Vec<GroupBatch> {
        let mut batch = Vec::new();
        let made = Instant::now();
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            for (name, group) in &mut shard.groups {
                if group.dirty.is_empty() || group.outstanding {
                    continue;
                }
                let LocalGroup {
                    entries,
                    dirty,
                    epoch,
                    outstanding,
                    ..
                } = group;
                let mut fingerprints = Vec::with_capacity(dirty.len());
                for fingerprint in dirty.drain(..) {
                    let Some(entry) = entries.get_mut(&fingerprint) else {
                        continue;
                    };
                    if entry.pending_count == 0 {
                        continue;
                    }
                    fingerprints.push(FingerprintDelta {
                        fingerprint,
                        count: entry.pending_count,
                        workers: entry.pending_workers.clone(),
                    });
                    entry.inflight_count = entry.inflight_count.saturating_add(entry.pending_count);
                    entry.inflight_workers = entry
                        .inflight_workers
                        .max(count_u32(entry.pending_workers.len()));
                    entry.pending_count = 0;
                    entry.pending_workers.clear();
                }
                if !fingerprints.is_empty() {
                    *last_seq = last_seq.saturating_add(1).max(unix_ms());
                    *outstanding = true;
                    batch.push(GroupBatch {
                        group: name.to_string(),
                        epoch: *epoch,
                        seq: *last_seq,
                        made,
                        fingerprints,
                    });
                }
            }
        }
        batch
    }

    /// Drops the outstanding batches of group incarnations cleared since: the clear deletes
    /// whatever of them Redis applied.
    fn forget_cleared(&self, outstanding: &mut Vec<GroupBatch>, clears: &[Clear]) {
        if clears.is_empty() {
            return;
        }
        outstanding.retain(|b| {
            !clears
                .iter()
                .any(|c| c.group == b.group && b.epoch < c.before_epoch)
        });
    }

    /// Gives up batches outstanding for longer than the TTL (Redis unreachable or refusing them
    /// that long): past it, Redis may have forgotten that it applied them, and would apply them
    /// again.
    fn give_up_overdue(&self, outstanding: &mut Vec<GroupBatch>) {
        let ttl = self.config.ttl;
        if outstanding.iter().all(|b| b.made.elapsed() <= ttl) {
            return;
        }
        let (overdue, kept): (Vec<_>, Vec<_>) = std::mem::take(outstanding)
            .into_iter()
            .partition(|b| b.made.elapsed() > ttl);
        *outstanding = kept;
        for batch in overdue {
            let lost: u64 = batch.fingerprints.iter().map(|d| d.count).sum();
            self.dropped_deltas.fetch_add(lost, Ordering::Relaxed);
            let mut shard = lock(self.shard(&batch.group));
            let Some(live) = shard
                .groups
                .get_mut(batch.group.as_str())
                .filter(|g| g.epoch == batch.epoch)
            else {
                continue;
            };
            live.outstanding = false;
            for delta in &batch.fingerprints {
                if let Some(entry) = live.entries.get_mut(&delta.fingerprint) {
                    entry.inflight_count = entry.inflight_count.saturating_sub(delta.count);
                    entry.inflight_workers = 0;
                }
            }
        }
    }

    fn key(&self, group: &str, kind: &str) -> String {
        format!("{}{{{group}}}:{kind}", self.config.key_prefix)
    }

    fn fingerprint_key(&self, group: &str, kind: char, fingerprint: u64) -> String {
        format!(
            "{}{{{group}}}:{kind}:{fingerprint:016x}",
            self.config.key_prefix
        )
    }

    /// The commands of a flush: one script call per cleared group, then one per outstanding
    /// batch, in that order.
    fn commands(&self, scripts: &Scripts, clears: &[Clear], batches: &[GroupBatch]) -> Vec<Cmd> {
        let now_ms = unix_ms();
        // Lua numbers are doubles: keep every number the scripts compute with exact.
        let ttl_ms = self.ttl_ms.min(MAX_TTL_MS);
        let index_cutoff = now_ms.saturating_sub(ttl_ms);
        let marker_ttl = ttl_ms.saturating_mul(2);
        let marker_cutoff = now_ms.saturating_sub(marker_ttl);
        let mut commands = Vec::with_capacity(clears.len() + batches.len());
        for clear in clears {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&scripts.clear)
                .arg(2)
                .arg(self.key(&clear.group, "i"))
                .arg(self.key(&clear.group, "a"))
                .arg(format!("{}{{{}}}:", self.config.key_prefix, clear.group));
            commands.push(cmd);
        }
        for batch in batches {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&scripts.apply)
                .arg(2 + 2 * batch.fingerprints.len())
                .arg(self.key(&batch.group, "i"))
                .arg(self.key(&batch.group, "a"));
            for delta in &batch.fingerprints {
                cmd.arg(self.fingerprint_key(&batch.group, 'c', delta.fingerprint))
                    .arg(self.fingerprint_key(&batch.group, 'w', delta.fingerprint));
            }
            cmd.arg(&self.host)
                .arg(batch.seq)
                .arg(now_ms)
                .arg(ttl_ms)
                .arg(index_cutoff)
                .arg(marker_ttl)
                .arg(marker_cutoff);
            for delta in &batch.fingerprints {
                cmd.arg(format!("{:016x}", delta.fingerprint))
                    .arg(delta.count)
                    .arg(delta.workers.len());
                for worker in &delta.workers {
                    cmd.arg(format!("{worker:016x}"));
                }
            }
            commands.push(cmd);
        }
        commands
    }

    /// The round trip of a flush: the script calls in one pipeline (not a transaction: each
    /// script is atomic on its own and answers for its own group), or a PING when there is
    /// nothing to send. Returns one reply per command, errors included.
    fn exchange(
        &self,
        connection: &mut redis::Connection,
        scripts: &mut Option<Scripts>,
        clears: &[Clear],
        batches: &[GroupBatch],
    ) -> redis::RedisResult<Vec<Value>> {
        if clears.is_empty() && batches.is_empty() {
            redis::cmd("PING").query::<String>(connection)?;
            return Ok(Vec::new());
        }
        let loaded = match scripts {
            Some(loaded) => loaded,
            None => scripts.insert(Scripts::load(connection)?),
        };
        let commands = self.commands(loaded, clears, batches);
        let mut replies = pipeline(connection, commands.iter())?;
        // The server lost its script cache (a restart, `SCRIPT FLUSH`): those scripts did not run.
        let missing: Vec<usize> = replies
            .iter()
            .enumerate()
            .filter(|(_, r)| is_noscript(r))
            .map(|(i, _)| i)
            .collect();
        if !missing.is_empty() {
            *scripts = Some(Scripts::load(connection)?);
            let again = pipeline(connection, missing.iter().filter_map(|&i| commands.get(i)))?;
            for (i, reply) in missing.into_iter().zip(again) {
                if let Some(slot) = replies.get_mut(i) {
                    *slot = reply;
                }
            }
        }
        if replies.len() != commands.len() {
            return Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "unexpected number of replies to a loopguard flush",
            )));
        }
        Ok(replies)
    }

    /// Applies the replies of an exchange: acknowledged batches leave the outstanding list and
    /// their totals replace the cached ones; a batch answered with an error stays outstanding.
    fn settle(
        &self,
        link: &mut Link,
        clears: Vec<Clear>,
        replies: &[Value],
        started_ms: u64,
    ) -> Result<FlushReport, FlushError> {
        let mut report = FlushReport::default();
        let mut refusal: Option<redis::RedisError> = None;
        let mut wrong_type: Vec<String> = Vec::new();
        let mut usable: Vec<String> = Vec::new();
        let (clear_replies, batch_replies) = replies.split_at(clears.len().min(replies.len()));
        let mut clear_replies = clear_replies.iter();
        let mut unsent = Vec::new();
        for clear in clears {
            let Some(reply) = clear_replies.next() else {
                unsent.push(clear);
                continue;
            };
            match parse_clear(reply) {
                Ok(skipped) => {
                    report.groups_cleared += 1;
                    wrong_type.extend(skipped);
                }
                Err(error) => {
                    unsent.push(clear);
                    refusal = Some(error);
                }
            }
        }
        self.requeue_clears(unsent);
        let batches = std::mem::take(&mut link.outstanding);
        let mut replies = batch_replies.iter();
        for batch in batches {
            let Some(reply) = replies.next() else {
                link.outstanding.push(batch);
                continue;
            };
            match parse_apply(reply, batch.fingerprints.len()) {
                Ok(outcome) => {
                    report.fingerprints += self.settle_batch(
                        batch,
                        &outcome,
                        &mut wrong_type,
                        (!link.wrong_keys.is_empty()).then_some(&mut usable),
                    );
                }
                Err(error) => {
                    link.outstanding.push(batch);
                    refusal = Some(error);
                }
            }
        }
        for key in usable {
            if link.wrong_keys.remove(&key) {
                tracing::info!(
                    %key,
                    "loopguard group store: redis key holds the expected type again, sharing its counts"
                );
            }
        }
        for key in wrong_type {
            self.wrong_type_skips.fetch_add(1, Ordering::Relaxed);
            let message = format!(
                "redis key `{key}` holds a value of the wrong type; loopguard leaves it alone and \
                 keeps its deltas on this host until it is removed"
            );
            if link.wrong_keys.len() < MAX_WRONG_KEYS_LOGGED && link.wrong_keys.insert(key.clone())
            {
                tracing::warn!(%key, "loopguard group store: {message}");
            } else {
                tracing::debug!(%key, "loopguard group store: {message}");
            }
            *lock(&self.last_error) = Some(message);
        }
        if let Some(source) = refusal {
            self.refused(&source);
            return Err(FlushError { source });
        }
        self.succeeded(link, started_ms);
        Ok(report)
    }

    /// Settles one acknowledged batch. Returns how many fingerprints' totals were read back;
    /// adds the keys found with the wrong type to `wrong_type`, and, when given `usable`, the
    /// keys written or read successfully.
    fn settle_batch(
        &self,
        batch: GroupBatch,
        outcome: &Outcome,
        wrong_type: &mut Vec<String>,
        mut usable: Option<&mut Vec<String>>,
    ) -> usize {
        let cap = self.config.local.max_workers_per_fingerprint;
        let mut shard = lock(self.shard(&batch.group));
        let mut live = shard
            .groups
            .get_mut(batch.group.as_str())
            .filter(|g| g.epoch == batch.epoch);
        if let Some(live) = live.as_deref_mut() {
            live.outstanding = false;
        }
        let totals = match outcome {
            Outcome::GroupSkipped { index } => {
                wrong_type.push(self.key(&batch.group, if *index { "i" } else { "a" }));
                for delta in batch.fingerprints {
                    self.hold_back(live.as_deref_mut(), delta, cap);
                }
                return 0;
            }
            Outcome::Applied(totals) | Outcome::Replayed(totals) => totals,
        };
        let replayed = matches!(outcome, Outcome::Replayed(_));
        let mut read = 0;
        for (delta, &(count, workers)) in batch.fingerprints.into_iter().zip(totals) {
            if count < 0 && !replayed {
                let kind = if count == WRONG_WORKERS { 'w' } else { 'c' };
                wrong_type.push(self.fingerprint_key(&batch.group, kind, delta.fingerprint));
                self.hold_back(live.as_deref_mut(), delta, cap);
                continue;
            }
            if count >= 0 {
                read += 1;
                if let Some(usable) = usable.as_deref_mut() {
                    for kind in ['c', 'w'] {
                        usable.push(self.fingerprint_key(&batch.group, kind, delta.fingerprint));
                    }
                }
            }
            let Some(entry) = live
                .as_deref_mut()
                .and_then(|g| g.entries.get_mut(&delta.fingerprint))
            else {
                continue;
            };
            entry.global_count = if count >= 0 {
                u64::try_from(count).unwrap_or(0)
            } else {
                // Applied by an earlier exchange whose reply was lost, and no longer readable:
                // this host's own delta is all that is known to be in it.
                entry.global_count.saturating_add(delta.count)
            };
            if count >= 0 {
                entry.global_workers = u32::try_from(workers).unwrap_or(u32::MAX);
            }
            entry.inflight_count = entry.inflight_count.saturating_sub(delta.count);
            entry.inflight_workers = 0;
        }
        if let (Some(usable), true) = (usable, read > 0) {
            usable.push(self.key(&batch.group, "i"));
            usable.push(self.key(&batch.group, "a"));
        }
        read
    }

    /// Puts a delta Redis did not apply back among the pending ones, to go with a later batch
    /// (under a new sequence number: this one is never applied).
    fn hold_back(&self, live: Option<&mut LocalGroup>, delta: FingerprintDelta, cap: usize) {
        let Some(live) = live else {
            self.dropped_deltas
                .fetch_add(delta.count, Ordering::Relaxed);
            return;
        };
        let Some(entry) = live.entries.get_mut(&delta.fingerprint) else {
            self.dropped_deltas
                .fetch_add(delta.count, Ordering::Relaxed);
            return;
        };
        if entry.pending_count == 0 {
            live.dirty.push(delta.fingerprint);
        }
        entry.pending_count = entry.pending_count.saturating_add(delta.count);
        entry.inflight_count = entry.inflight_count.saturating_sub(delta.count);
        entry.inflight_workers = 0;
        for worker in delta.workers {
            add_worker(&mut entry.pending_workers, worker, cap);
        }
    }

    /// Puts clears that were not confirmed back, to go with the next flush.
    fn requeue_clears(&self, clears: Vec<Clear>) {
        if clears.is_empty() {
            return;
        }
        let mut queued = lock(&self.clears);
        let newer = std::mem::replace(&mut *queued, clears);
        for clear in newer {
            queue_clear(&mut queued, clear, usize::MAX);
        }
    }
}

/// Adds a clear to the queue, merged with one already queued for the same group; drops the
/// oldest when the queue holds `cap` (its group's keys are then left to the TTL).
fn queue_clear(queue: &mut Vec<Clear>, clear: Clear, cap: usize) {
    if let Some(queued) = queue.iter_mut().find(|c| c.group == clear.group) {
        queued.before_epoch = queued.before_epoch.max(clear.before_epoch);
        return;
    }
    if queue.len() >= cap {
        queue.remove(0);
    }
    queue.push(clear);
}

/// Runs `commands` in one pipeline and returns every reply, errors included.
fn pipeline<'a>(
    connection: &mut redis::Connection,
    commands: impl Iterator<Item = &'a Cmd>,
) -> redis::RedisResult<Vec<Value>> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for command in commands {
        pipe.add_command(command.clone());
    }
    pipe.query(connection)
}

fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::NoScript))
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What the apply script did with one batch.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Applied now; `(count, workers)` per fingerprint, or a negative code for a fingerprint
    /// skipped because one of its keys has the wrong type.
    Applied(Vec<(i64, i64)>),
    /// Applied by an earlier exchange; the current totals, `-1` for a count no longer readable.
    Replayed(Vec<(i64, i64)>),
    /// Not applied: the group's index (`index`) or its marker has the wrong type.
    GroupSkipped { index: bool },
}

/// The code of a fingerprint whose worker set has the wrong type (its count key: -1).
const WRONG_WORKERS: i64 = -2;

fn unexpected(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, what))
}

fn server_error(reply: &Value) -> Option<redis::RedisError> {
    match reply {
        Value::ServerError(error) => Some(redis::RedisError::from(error.clone())),
        _ => None,
    }
}

fn parse_apply(reply: &Value, fingerprints: usize) -> redis::RedisResult<Outcome> {
    if let Some(error) = server_error(reply) {
        return Err(error);
    }
    let Value::Array(items) = reply else {
        return Err(unexpected(
            "a loopguard apply script did not return an array",
        ));
    };
    let ints: Option<Vec<i64>> = items
        .iter()
        .map(|v| match v {
            Value::Int(n) => Some(*n),
            _ => None,
        })
        .collect();
    let Some(ints) = ints else {
        return Err(unexpected(
            "a loopguard apply script returned a non-integer",
        ));
    };
    match ints.split_first() {
        Some((&2, &[reason])) => Ok(Outcome::GroupSkipped { index: reason == 1 }),
        Some((&status @ (0 | 1), rest)) if rest.len() == fingerprints * 2 => {
            let totals = rest.chunks_exact(2).map(|p| (p[0], p[1])).collect();
            Ok(if status == 0 {
                Outcome::Applied(totals)
            } else {
                Outcome::Replayed(totals)
            })
        }
        _ => Err(unexpected("unexpected reply from a loopguard apply script")),
    }
}

/// The keys a clear left in place because they have the wrong type.
fn parse_clear(reply: &Value) -> redis::RedisResult<Vec<String>> {
    if let Some(error) = server_error(reply) {
        return Err(error);
    }
    let Value::Array(items) = reply else {
        return Err(unexpected(
            "a loopguard clear script did not return an array",
        ));
    };
    Ok(items
        .iter()
        .skip(1)
        .filter_map(|v| match v {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        })
        .collect())
}

/// The SHA1 digests under which the server holds the scripts.
struct Scripts {
    apply: String,
    clear: String,
}

impl Scripts {
    fn load(connection: &mut redis::Connection) -> redis::RedisResult<Self> {
        let (apply, clear) = redis::pipe()
            .cmd("SCRIPT")
            .arg("LOAD")
            .arg(APPLY_SCRIPT)
            .cmd("SCRIPT")
            .arg("LOAD")
            .arg(CLEAR_SCRIPT)
            .query(connection)?;
        Ok(Self { apply, clear })
    }
}

/// At most this many wrong-type keys are remembered, so that each is warned about once.
const MAX_WRONG_KEYS_LOGGED: usize = 1024;

/// TTLs are capped below 2^50 ms (35,000 years) so that the scripts' arithmetic stays exact.
const MAX_TTL_MS: u64 = 1 << 50;

/// Applies one group's batch, at most once per (host, sequence number).
///
/// KEYS: the group's index, its marker, then the count key and the worker-set key of each
/// fingerprint. ARGV: the host id, the batch's sequence number, now (unix ms), the TTL (ms), the
/// index cutoff (unix ms), the marker's TTL and cutoff, then per fingerprint: its 16 hex digits,
/// its count, the number of workers, the workers.
///
/// Replies `{0, count, workers, …}` when it applied the batch now, `{1, count, workers, …}`
/// when the marker shows it was applied before (totals only, `-1` for an unreadable count), and
/// `{2, 1}` / `{2, 2}` when the index / the marker has the wrong type (nothing written). In an
/// applied batch, a fingerprint whose count key (`-1`) or worker set (`-2`) has the wrong type
/// or content is neither written nor read. Every key is checked before it is written, and the
/// only write that could still fail (`INCRBY` of a count that would overflow) is caught, so the
/// script never stops half way.
const APPLY_SCRIPT: &str = r"
local function usable(key, kind)
  local t = redis.call('TYPE', key)['ok']
  return t == 'none' or t == kind
end
local index, marker = KEYS[1], KEYS[2]
if not usable(index, 'zset') then return {2, 1} end
if not usable(marker, 'zset') then return {2, 2} end
local host, seq = ARGV[1], tonumber(ARGV[2])
local now, ttl, index_cutoff = ARGV[3], ARGV[4], ARGV[5]
local seen = redis.call('ZSCORE', marker, host)
local fresh = (not seen) or tonumber(seen) < seq
local out = {1}
if fresh then
  out[1] = 0
  redis.call('ZADD', marker, ARGV[2], host)
  redis.call('ZREMRANGEBYSCORE', marker, '-inf', ARGV[7])
  redis.call('PEXPIRE', marker, ARGV[6])
end
local a = 8
for i = 3, #KEYS, 2 do
  local count_key, workers_key = KEYS[i], KEYS[i + 1]
  local fp, delta, n = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  local first = a + 3
  a = first + n
  if not usable(count_key, 'string') then
    out[#out + 1] = -1
    out[#out + 1] = 0
  elseif not usable(workers_key, 'set') then
    out[#out + 1] = -2
    out[#out + 1] = 0
  elseif fresh then
    local total = redis.pcall('INCRBY', count_key, delta)
    if type(total) ~= 'number' then
      out[#out + 1] = -1
      out[#out + 1] = 0
    else
      redis.call('PEXPIRE', count_key, ttl)
      for s = first, a - 1, 512 do
        redis.call('SADD', workers_key, unpack(ARGV, s, math.min(s + 511, a - 1)))
      end
      if n > 0 then redis.call('PEXPIRE', workers_key, ttl) end
      redis.call('ZADD', index, now, fp)
      out[#out + 1] = total
      out[#out + 1] = redis.call('SCARD', workers_key)
    end
  else
    local total = tonumber(redis.call('GET', count_key) or '0') or -1
    out[#out + 1] = total
    out[#out + 1] = redis.call('SCARD', workers_key)
  end
end
if fresh then
  redis.call('ZREMRANGEBYSCORE', index, '-inf', index_cutoff)
  redis.call('PEXPIRE', index, ttl)
end
return out
";

/// Deletes one group's keys: those of every fingerprint in its index, the index and the marker.
/// A key of the wrong type (a count that is not an integer included) is left in place and named
/// in the reply.
///
/// KEYS: the group's index and marker. ARGV: the prefix of the group's fingerprint keys.
/// Replies `{deleted, wrong-type key, …}`.
const CLEAR_SCRIPT: &str = r"
local deleted, wrong = 0, {}
local function drop(key, kind)
  local t = redis.call('TYPE', key)['ok']
  if t == 'string' and not string.match(redis.call('GET', key), '^-?%d+$') then
    t = 'text'
  end
  if t == kind then
    deleted = deleted + redis.call('DEL', key)
  elseif t ~= 'none' then
    wrong[#wrong + 1] = key
  end
end
if redis.call('TYPE', KEYS[1])['ok'] == 'zset' then
  for _, fp in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    drop(ARGV[1] .. 'c:' .. fp, 'string')
    drop(ARGV[1] .. 'w:' .. fp, 'set')
  end
end
drop(KEYS[1], 'zset')
drop(KEYS[2], 'zset')
local out = {deleted}
for _, key in ipairs(wrong) do out[#out + 1] = key end
return out
";

impl GroupStore for RedisStore {
    fn record(
        &self,
        group: &str,
        worker: WorkerId,
        fingerprint: Fingerprint,
        at_ms: u64,
    ) -> GroupTally {
        let shared = &*self.shared;
        let availability = shared.availability();
        let mut shard = lock(shared.shard(group));
        if let Some(g) = shard.groups.get_mut(group) {
            return g.record(shared, worker.raw(), fingerprint, at_ms, availability);
        }
        if shard.groups.len() >= shared.groups_per_shard {
            let pending_before: u64 = pending_in(&shard);
            let keep = after_eviction(shared.groups_per_shard);
            let n = evict_lowest(&mut shard.groups, keep, |name, g| {
                (rank(!g.dirty.is_empty(), g.last_seen_ms), name_rank(name))
            });
            shared.evicted_groups.fetch_add(n as u64, Ordering::Relaxed);
            shared.dropped_deltas.fetch_add(
                pending_before.saturating_sub(pending_in(&shard)),
                Ordering::Relaxed,
            );
        }
        let epoch = shared.next_epoch.fetch_add(1, Ordering::Relaxed);
        shard
            .groups
            .entry(group.into())
            .or_insert_with(|| LocalGroup::new(epoch))
            .record(shared, worker.raw(), fingerprint, at_ms, availability)
    }

    fn tally(&self, group: &str, fingerprint: Fingerprint) -> GroupTally {
        let shared = &*self.shared;
        let availability = shared.availability();
        let shard = lock(shared.shard(group));
        shard
            .groups
            .get(group)
            .and_then(|g| g.entries.get(&fingerprint))
            .map_or(
                GroupTally {
                    availability,
                    ..GroupTally::EMPTY
                },
                |e| e.tally(availability),
            )
    }

    fn clear_group(&self, group: &str) {
        let shared = &*self.shared;
        let before_epoch = {
            // Under the shard's lock, so that an incarnation created after the removal has a
            // later epoch.
            let mut shard = lock(shared.shard(group));
            shard.groups.remove(group);
            shared.next_epoch.fetch_add(1, Ordering::Relaxed)
        };
        let clear = Clear {
            group: group.to_owned(),
            before_epoch,
        };
        // When Redis has been unreachable for a long time, the oldest clear is left to the TTL.
        queue_clear(
            &mut lock(&shared.clears),
            clear,
            shared.config.local.max_groups,
        );
    }

    fn status(&self) -> StoreStatus {
        let shared = &*self.shared;
        let (mut groups, mut pending) = (0, 0);
        for shard in shared.shards.iter() {
            let shard = lock(shard);
            groups += shard.groups.len();
            pending += shard
                .groups
                .values()
                .flat_map(|g| g.entries.values())
                .filter(|e| e.is_dirty())
                .count();
        }
        StoreStatus {
            backend: Backend::Redis,
            reachable: shared.in_sync(),
            availability: shared.availability(),
            errors: shared.errors.load(Ordering::Relaxed),
            last_error: lock(&shared.last_error).clone(),
            since_last_sync: shared.since_last_sync(),
            staleness_bound: shared.config.staleness_bound(),
            flushes: shared.flushes.load(Ordering::Relaxed),
            reconnects: shared.reconnects.load(Ordering::Relaxed),
            groups,
            pending,
            evicted_groups: shared.evicted_groups.load(Ordering::Relaxed),
            evicted_fingerprints: shared.evicted_fingerprints.load(Ordering::Relaxed),
            dropped_deltas: shared.dropped_deltas.load(Ordering::Relaxed),
            wrong_type_skips: shared.wrong_type_skips.load(Ordering::Relaxed),
        }
    }
}

/// A random id for this store: std's hasher keys are random per process and per instance.
fn host_id() -> u64 {
    static STORES: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one((
        std::process::id(),
        SystemTime::now(),
        STORES.fetch_add(1, Ordering::Relaxed),
    ))
}

/// Undelivered counts held by a shard.
fn pending_in(shard: &LocalShard) -> u64 {
    shard
        .groups
        .values()
        .flat_map(|g| g.entries.values())
        .map(|e| e.pending_count)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_credentials() {
        let config = RedisConfig::new("redis://user:s3cret@example.invalid:6379/0");
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(
            debug.contains("redis://***@example.invalid:6379/0"),
            "{debug}"
        );
    }

    #[test]
    fn dirty_entries_are_evicted_last() {
        assert!(rank(true, 0) > rank(false, u64::MAX >> 1));
        assert!(rank(false, 1) > rank(false, 0));
    }

    #[test]
    fn script_replies_are_read_strictly() {
        let ints = |v: &[i64]| Value::Array(v.iter().map(|&n| Value::Int(n)).collect());
        assert_eq!(
            parse_apply(&ints(&[0, 3, 2, -2, 0]), 2).ok(),
            Some(Outcome::Applied(vec![(3, 2), (WRONG_WORKERS, 0)]))
        );
        assert_eq!(
            parse_apply(&ints(&[1, -1, 1]), 1).ok(),
            Some(Outcome::Replayed(vec![(-1, 1)]))
        );
        assert_eq!(
            parse_apply(&ints(&[2, 1]), 5).ok(),
            Some(Outcome::GroupSkipped { index: true })
        );
        // A reply that does not match the batch is an error: the batch stays outstanding.
        assert!(parse_apply(&ints(&[0, 3]), 1).is_err());
        assert!(parse_apply(&ints(&[7, 3, 1]), 1).is_err());
        assert!(parse_apply(&Value::Nil, 0).is_err());
        assert!(parse_clear(&Value::Okay).is_err());
        let cleared = Value::Array(vec![Value::Int(4), Value::BulkString(b"k".to_vec())]);
        assert_eq!(parse_clear(&cleared).ok(), Some(vec!["k".to_owned()]));
    }

    #[test]
    fn zero_durations_are_refused() {
        let config = RedisConfig {
            flush_interval: Duration::ZERO,
            ..RedisConfig::default()
        };
        assert!(matches!(
            RedisStore::connect(config),
            Err(ConfigError::Zero {
                field: "flush_interval"
            })
        ));
    }
}
