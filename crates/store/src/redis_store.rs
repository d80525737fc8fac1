//! Group counters shared by several hosts through Redis: see [`RedisStore`].

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
    /// Timeout of connecting and of each read and write (default one second).
    pub io_timeout: Duration,
    /// Longest wait between reconnection attempts (default five seconds).
    pub max_backoff: Duration,
    /// When Redis has been unreachable for longer than the staleness bound — or has not been
    /// reached within it since the store started — flag answers [`Availability::Unavailable`]
    /// (the engine then blocks) instead of answering from local state (default false: fail
    /// open).
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
/// ones. Every [`flush_interval`](RedisConfig::flush_interval) the background thread moves all
/// pending deltas in flight and sends them in **one pipelined `MULTI`/`EXEC` transaction**; the
/// replies carry the new global totals of exactly the fingerprints it touched, which replace the
/// cached ones. [`tally`](GroupStore::tally) never goes to Redis either: it answers what `record`
/// would, without the record. Keys, for group `G` and fingerprint `F` (16 hex digits), with the
/// default prefix:
///
/// | key | type | holds |
/// | --- | --- | --- |
/// | `loopguard:{G}:c:F` | string | the group-wide count of `F` (`INCRBY` delta → new total) |
/// | `loopguard:{G}:w:F` | set | the workers that produced `F`, as 16 hex digits of their [`WorkerId`] (`SADD` → `SCARD`) |
/// | `loopguard:{G}:i` | sorted set | the group's fingerprints, scored by last flush (unix ms) |
///
/// Each flush sets `PEXPIRE ttl` on every key it touches and trims index members older than the
/// TTL, so a fingerprint nobody repeats for `ttl` disappears from Redis, and an abandoned group
/// entirely. The braces make `G` a hash tag, so a group's keys share one cluster slot.
/// [`clear_group`](GroupStore::clear_group) drops the group locally at once and, on the next
/// flush, reads the index and deletes every key of the group before applying newer deltas.
///
/// # Staleness
///
/// A host sees its own records immediately. A record made on another host is in this host's
/// answers once that host has flushed it (within one interval) and this host has flushed a delta
/// of the same fingerprint since (within one more interval, when this host is recording the
/// fingerprint — which is when the answer matters): the bound is
/// [`RedisConfig::staleness_bound`], twice the flush interval (plus a round trip). Counts and
/// distinct-worker counts lag rather than overshoot. They can overshoot in three cases only: for
/// one flush after another host cleared the group, or after Redis lost its data (a restart
/// without persistence), the cached total still holds what was deleted; and a transaction whose
/// reply is lost after the server applied it is retried and counts twice (a connection failure
/// at the exact wrong moment).
///
/// # When Redis is unreachable
///
/// The store keeps counting locally and answering from local state
/// ([`Availability::LocalOnly`]); undelivered deltas accumulate (bounded like the cache) and are
/// sent on reconnection. Each failed connect or flush increments [`StoreStatus::errors`]; the
/// transitions between reachable and unreachable are logged through `tracing` (warn, then info).
/// Reconnection is retried with exponential backoff from the flush interval up to
/// [`max_backoff`](RedisConfig::max_backoff). With [`fail_closed`](RedisConfig::fail_closed),
/// once the last successful exchange is older than the staleness bound, answers are flagged
/// [`Availability::Unavailable`] and the engine blocks the call. A Redis restart without
/// persistence loses what was flushed before it; hosts then start over from their pending
/// deltas.
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
    clears: Mutex<Vec<String>>,
    /// The connection and its backoff; held for the whole of a flush, so flushes never overlap.
    link: Mutex<Link>,
    started: Instant,
    reachable: AtomicBool,
    /// Milliseconds from `started` to the last successful exchange; `u64::MAX` before the first.
    last_sync_ms: AtomicU64,
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
    flushes: AtomicU64,
    reconnects: AtomicU64,
    evicted_groups: AtomicU64,
    evicted_fingerprints: AtomicU64,
    dropped_deltas: AtomicU64,
}

struct Link {
    client: redis::Client,
    connection: Option<redis::Connection>,
    ever_connected: bool,
    backoff: Duration,
    next_attempt: Option<Instant>,
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
    last_seen_ms: u64,
}

#[derive(Default)]
struct LocalEntry {
    /// Group-wide totals as of the last flush that touched this fingerprint.
    global_count: u64,
    global_workers: u32,
    /// Sent, reply not yet applied.
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

/// The deltas of one group moved in flight by a flush.
struct GroupBatch {
    group: String,
    epoch: u64,
    fingerprints: Vec<FingerprintDelta>,
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
            }),
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

    fn since_last_sync(&self) -> Option<Duration> {
        let at = self.last_sync_ms.load(Ordering::Acquire);
        (at != u64::MAX).then(|| {
            self.started
                .elapsed()
                .saturating_sub(Duration::from_millis(at))
        })
    }

    /// What answers are flagged with now. Reads the clock only while Redis is unreachable.
    fn availability(&self) -> Availability {
        if self.reachable.load(Ordering::Acquire) {
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
        // Nothing is ever sent on the channel: it is closed when the store is dropped.
        while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(self.config.flush_interval) {
            let _ = self.flush(&mut lock(&self.link), false);
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
                }
                Err(source) => {
                    self.failed(link, &source);
                    return Err(FlushError { source });
                }
            }
        }
        let clears = std::mem::take(&mut *lock(&self.clears));
        let batch = self.take_pending();
        let result = match link.connection.as_mut() {
            Some(connection) => self.exchange(connection, &clears, &batch),
            None => Ok(Vec::new()),
        };
        match result {
            Ok(totals) => {
                self.apply(&batch, &totals);
                self.succeeded(link);
                Ok(FlushReport {
                    fingerprints: batch.iter().map(|g| g.fingerprints.len()).sum(),
                    groups_cleared: clears.len(),
                })
            }
            Err(source) => {
                self.requeue(clears, batch);
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

    fn succeeded(&self, link: &mut Link) {
        let now_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        let first = self.last_sync_ms.swap(now_ms, Ordering::AcqRel) == u64::MAX;
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
            link.backoff = link
                .backoff
                .saturating_mul(2)
                .min(self.config.max_backoff.max(self.config.flush_interval));
            tracing::debug!(%error, "loopguard group store: redis still unreachable");
        }
        link.next_attempt = Some(Instant::now() + link.backoff);
    }

    /// Moves every pending delta in flight.
    fn take_pending(&self) -> Vec<GroupBatch> {
        let mut batch = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            for (name, group) in &mut shard.groups {
                if group.dirty.is_empty() {
                    continue;
                }
                let LocalGroup {
                    entries,
                    dirty,
                    epoch,
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
                    batch.push(GroupBatch {
                        group: name.to_string(),
                        epoch: *epoch,
                        fingerprints,
                    });
                }
            }
        }
        batch
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

    /// The round trips of a flush: one pipelined transaction, preceded by a read of the index of
    /// each cleared group when there are any. Returns `(count, workers)` per fingerprint sent, in
    /// batch order.
    fn exchange(
        &self,
        connection: &mut redis::Connection,
        clears: &[String],
        batch: &[GroupBatch],
    ) -> redis::RedisResult<Vec<(i64, i64)>> {
        if clears.is_empty() && batch.is_empty() {
            redis::cmd("PING").query::<String>(connection)?;
            return Ok(Vec::new());
        }
        let mut doomed: Vec<String> = Vec::new();
        if !clears.is_empty() {
            let mut read = redis::pipe();
            for group in clears {
                read.cmd("ZRANGE").arg(self.key(group, "i")).arg(0).arg(-1);
            }
            let members: Vec<Vec<String>> = read.query(connection)?;
            for (group, fingerprints) in clears.iter().zip(members) {
                doomed.push(self.key(group, "i"));
                for fp in fingerprints {
                    doomed.push(format!("{}{{{group}}}:c:{fp}", self.config.key_prefix));
                    doomed.push(format!("{}{{{group}}}:w:{fp}", self.config.key_prefix));
                }
            }
        }
        let ttl_ms = self.ttl_ms;
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut pipe = redis::pipe();
        pipe.atomic();
        if !doomed.is_empty() {
            pipe.cmd("DEL").arg(&doomed).ignore();
        }
        for group in batch {
            let index = self.key(&group.group, "i");
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(&index);
            for delta in &group.fingerprints {
                let count_key = self.fingerprint_key(&group.group, 'c', delta.fingerprint);
                let workers_key = self.fingerprint_key(&group.group, 'w', delta.fingerprint);
                pipe.cmd("INCRBY").arg(&count_key).arg(delta.count);
                pipe.cmd("PEXPIRE").arg(&count_key).arg(ttl_ms).ignore();
                if !delta.workers.is_empty() {
                    let members: Vec<String> =
                        delta.workers.iter().map(|w| format!("{w:016x}")).collect();
                    pipe.cmd("SADD").arg(&workers_key).arg(members).ignore();
                    pipe.cmd("PEXPIRE").arg(&workers_key).arg(ttl_ms).ignore();
                }
                pipe.cmd("SCARD").arg(&workers_key);
                zadd.arg(now_ms).arg(format!("{:016x}", delta.fingerprint));
            }
            pipe.add_command(zadd).ignore();
            pipe.cmd("ZREMRANGEBYSCORE")
                .arg(&index)
                .arg("-inf")
                .arg(now_ms.saturating_sub(ttl_ms))
                .ignore();
            pipe.cmd("PEXPIRE").arg(&index).arg(ttl_ms).ignore();
        }
        if doomed.is_empty() && batch.is_empty() {
            return Ok(Vec::new());
        }
        let replies: Vec<i64> = pipe.query(connection)?;
        let expected: usize = batch.iter().map(|g| g.fingerprints.len()).sum();
        if replies.len() != expected * 2 {
            return Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "unexpected number of replies to a loopguard flush",
            )));
        }
        Ok(replies.chunks_exact(2).map(|r| (r[0], r[1])).collect())
    }

    /// Replaces cached totals with the ones Redis returned.
    fn apply(&self, batch: &[GroupBatch], totals: &[(i64, i64)]) {
        let mut totals = totals.iter();
        for group in batch {
            let mut shard = lock(self.shard(&group.group));
            let mut live = shard
                .groups
                .get_mut(group.group.as_str())
                .filter(|g| g.epoch == group.epoch);
            for delta in &group.fingerprints {
                let Some(&(count, workers)) = totals.next() else {
                    return;
                };
                let Some(entry) = live
                    .as_deref_mut()
                    .and_then(|g| g.entries.get_mut(&delta.fingerprint))
                else {
                    continue;
                };
                entry.global_count = u64::try_from(count).unwrap_or(0);
                entry.global_workers = u32::try_from(workers).unwrap_or(u32::MAX);
                entry.inflight_count = entry.inflight_count.saturating_sub(delta.count);
                entry.inflight_workers = 0;
            }
        }
    }

    /// Puts the deltas and clears of a failed flush back, to go with the next one.
    fn requeue(&self, clears: Vec<String>, batch: Vec<GroupBatch>) {
        if !clears.is_empty() {
            let mut queued = lock(&self.clears);
            let newer = std::mem::replace(&mut *queued, clears);
            for group in newer {
                if !queued.contains(&group) {
                    queued.push(group);
                }
            }
        }
        let cap = self.config.local.max_workers_per_fingerprint;
        for group in batch {
            let mut shard = lock(self.shard(&group.group));
            let live = shard
                .groups
                .get_mut(group.group.as_str())
                .filter(|g| g.epoch == group.epoch);
            let Some(live) = live else {
                let lost: u64 = group.fingerprints.iter().map(|d| d.count).sum();
                self.dropped_deltas.fetch_add(lost, Ordering::Relaxed);
                continue;
            };
            for delta in group.fingerprints {
                let Some(entry) = live.entries.get_mut(&delta.fingerprint) else {
                    self.dropped_deltas
                        .fetch_add(delta.count, Ordering::Relaxed);
                    continue;
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
        }
    }
}

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
        lock(shared.shard(group)).groups.remove(group);
        let mut clears = lock(&shared.clears);
        if !clears.iter().any(|g| g == group) {
            if clears.len() >= shared.config.local.max_groups {
                // Redis has been unreachable for a long time; the oldest clear is left to the TTL.
                clears.remove(0);
            }
            clears.push(group.to_owned());
        }
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
            reachable: shared.reachable.load(Ordering::Acquire),
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
        }
    }
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
