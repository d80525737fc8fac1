//! The embedded default: group counters in process memory.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::bounded::{
    FingerprintMap, add_worker, after_eviction, count_u32, evict_lowest, groups_per_shard, lock,
    name_rank, shard_count, shard_of,
};
use crate::snapshot::{GroupSnapshot, SnapshotError, SnapshotFingerprint, SnapshotGroup};
use crate::{Availability, Backend, Fingerprint, GroupStore, GroupTally, StoreStatus, WorkerId};

/// The bounds of a [`MemoryStore`] (and of the local cache of a `RedisStore`).
///
/// Memory use is at most about `max_groups × max_fingerprints_per_group ×
/// (64 + 8 × max_workers_per_fingerprint)` bytes — about 190 MiB with the defaults, reached only
/// if a thousand swarms each produce a thousand distinct calls from sixteen workers; a swarm of
/// ten workers repeating a few hundred calls takes a few tens of KiB.
///
/// When a cap is reached, the least recently seen quarter of the entries is evicted (by event
/// time: groups by their last record, fingerprints by theirs), so a fingerprint that is being
/// repeated — a loop in progress — is the last to go. Evictions are counted in
/// [`StoreStatus::evicted_groups`] and [`StoreStatus::evicted_fingerprints`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Groups held at once (default 1024). The store is split into up to 16 shards with
    /// independent locks and each shard holds `max_groups / shards` groups, so eviction can start
    /// in one shard a little before the store as a whole is full.
    pub max_groups: usize,
    /// Distinct fingerprints held per group (default 1024).
    pub max_fingerprints_per_group: usize,
    /// Distinct workers remembered per fingerprint (default 16). The distinct-worker count of a
    /// fingerprint saturates there; the group detector needs two.
    pub max_workers_per_fingerprint: usize,
    /// A fingerprint not seen for this long (event time, milliseconds) starts over from zero, and
    /// a group idle for this long is forgotten (default one hour; `None`: never).
    pub idle_ttl_ms: Option<u64>,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            max_groups: 1024,
            max_fingerprints_per_group: 1024,
            max_workers_per_fingerprint: 16,
            idle_ttl_ms: Some(3_600_000),
        }
    }
}

impl MemoryConfig {
    /// The same bounds with every cap at least 1.
    pub(crate) fn sanitized(mut self) -> Self {
        self.max_groups = self.max_groups.max(1);
        self.max_fingerprints_per_group = self.max_fingerprints_per_group.max(1);
        self.max_workers_per_fingerprint = self.max_workers_per_fingerprint.max(1);
        self
    }
}

/// Group counters in process memory: the embedded default store.
///
/// Thread-safe: groups are spread over up to 16 shards, each behind its own mutex, so sessions
/// of different groups rarely contend. [`record`](GroupStore::record) takes one lock, does two
/// hash lookups and allocates nothing once the group and fingerprint exist. Bounded as described
/// in [`MemoryConfig`]. Its contents can be [snapshotted](Self::snapshot) and
/// [restored](Self::restore).
#[derive(Debug)]
pub struct MemoryStore {
    config: MemoryConfig,
    shards: Box<[Mutex<Shard>]>,
    groups_per_shard: usize,
    evicted_groups: AtomicU64,
    evicted_fingerprints: AtomicU64,
}

#[derive(Debug, Default)]
struct Shard {
    groups: HashMap<Box<str>, Group>,
}

#[derive(Debug, Default)]
struct Group {
    fingerprints: FingerprintMap<Entry>,
    last_seen_ms: u64,
}

#[derive(Debug)]
struct Entry {
    count: u64,
    last_seen_ms: u64,
    workers: Vec<u64>,
}

/// What [`MemoryStore::restore`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Groups restored.
    pub groups: usize,
    /// Fingerprints restored.
    pub fingerprints: usize,
    /// Groups and fingerprints left out because the snapshot holds more than this store's caps.
    pub evicted: usize,
}

impl MemoryStore {
    /// An empty store with these bounds (caps below 1 are raised to 1).
    pub fn new(config: MemoryConfig) -> Self {
        let config = config.sanitized();
        let shards = shard_count(config.max_groups);
        Self {
            groups_per_shard: groups_per_shard(config.max_groups, shards),
            shards: (0..shards).map(|_| Mutex::default()).collect(),
            config,
            evicted_groups: AtomicU64::new(0),
            evicted_fingerprints: AtomicU64::new(0),
        }
    }

    /// The bounds in force.
    pub fn config(&self) -> &MemoryConfig {
        &self.config
    }

    fn shard(&self, group: &str) -> &Mutex<Shard> {
        let i = shard_of(group, self.shards.len());
        // `shard_of` is below the shard count, and there is at least one shard.
        &self.shards[i]
    }

    /// Every group's state, sorted, in the current snapshot format.
    pub fn snapshot(&self) -> GroupSnapshot {
        let mut groups = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for (name, group) in &shard.groups {
                let fingerprints = group
                    .fingerprints
                    .iter()
                    .map(|(&fingerprint, e)| SnapshotFingerprint {
                        fingerprint,
                        count: e.count,
                        workers: e.workers.iter().copied().map(WorkerId::from_raw).collect(),
                        last_seen_ms: e.last_seen_ms,
                    })
                    .collect();
                groups.push(SnapshotGroup {
                    group: name.to_string(),
                    last_seen_ms: group.last_seen_ms,
                    fingerprints,
                });
            }
        }
        // What the store holds is valid by construction (distinct non-empty names, counts of at
        // least one, distinct workers no more numerous than the count), so it is not re-checked.
        GroupSnapshot::from_store(groups)
    }

    /// Replaces the whole contents of the store with `snapshot` (validated first: an invalid
    /// snapshot changes nothing). If the snapshot holds more than this store's caps, the least
    /// recently seen entries are left out, as if they had been evicted.
    pub fn restore(&self, snapshot: &GroupSnapshot) -> Result<RestoreReport, SnapshotError> {
        snapshot.validate()?;
        let mut shards: Vec<Shard> = (0..self.shards.len()).map(|_| Shard::default()).collect();
        let mut report = RestoreReport::default();
        let per_group = self.config.max_fingerprints_per_group;
        let per_fingerprint = self.config.max_workers_per_fingerprint;
        for g in snapshot.groups() {
            let mut group = Group {
                last_seen_ms: g.last_seen_ms,
                ..Group::default()
            };
            for f in &g.fingerprints {
                let mut workers: Vec<u64> = f.workers.iter().map(|w| w.raw()).collect();
                workers.truncate(per_fingerprint);
                group.last_seen_ms = group.last_seen_ms.max(f.last_seen_ms);
                group.fingerprints.insert(
                    f.fingerprint,
                    Entry {
                        count: f.count,
                        last_seen_ms: f.last_seen_ms,
                        workers,
                    },
                );
            }
            report.evicted += evict_lowest(&mut group.fingerprints, per_group, |&fp, e| {
                (e.last_seen_ms, fp)
            });
            let i = shard_of(&g.group, shards.len());
            if let Some(shard) = shards.get_mut(i) {
                shard.groups.insert(g.group.as_str().into(), group);
            }
        }
        for shard in &mut shards {
            report.evicted += evict_lowest(&mut shard.groups, self.groups_per_shard, |name, g| {
                (g.last_seen_ms, name_rank(name))
            });
            report.groups += shard.groups.len();
            report.fingerprints += shard
                .groups
                .values()
                .map(|g| g.fingerprints.len())
                .sum::<usize>();
        }
        for (slot, fresh) in self.shards.iter().zip(shards) {
            *lock(slot) = fresh;
        }
        Ok(report)
    }
}

impl Group {
    fn record(
        &mut self,
        config: &MemoryConfig,
        evicted: &AtomicU64,
        worker: u64,
        fingerprint: u64,
        at_ms: u64,
    ) -> GroupTally {
        if let Some(ttl) = config.idle_ttl_ms
            && at_ms.saturating_sub(self.last_seen_ms) > ttl
        {
            // Idle longer than the TTL: every fingerprint has expired.
            self.fingerprints.clear();
        }
        self.last_seen_ms = self.last_seen_ms.max(at_ms);
        let entry = match self.fingerprints.get_mut(&fingerprint) {
            Some(entry) => {
                if let Some(ttl) = config.idle_ttl_ms
                    && at_ms.saturating_sub(entry.last_seen_ms) > ttl
                {
                    entry.count = 0;
                    entry.workers.clear();
                }
                entry
            }
            None => {
                if self.fingerprints.len() >= config.max_fingerprints_per_group {
                    let keep = after_eviction(config.max_fingerprints_per_group);
                    let n =
                        evict_lowest(&mut self.fingerprints, keep, |&fp, e| (e.last_seen_ms, fp));
                    evicted.fetch_add(n as u64, Ordering::Relaxed);
                }
                self.fingerprints.entry(fingerprint).or_insert(Entry {
                    count: 0,
                    last_seen_ms: at_ms,
                    workers: Vec::new(),
                })
            }
        };
        entry.count = entry.count.saturating_add(1);
        entry.last_seen_ms = entry.last_seen_ms.max(at_ms);
        add_worker(
            &mut entry.workers,
            worker,
            config.max_workers_per_fingerprint,
        );
        GroupTally {
            count: entry.count,
            workers: count_u32(entry.workers.len()),
            availability: Availability::Live,
        }
    }
}

impl GroupStore for MemoryStore {
    fn record(
        &self,
        group: &str,
        worker: WorkerId,
        fingerprint: Fingerprint,
        at_ms: u64,
    ) -> GroupTally {
        let mut shard = lock(self.shard(group));
        let evicted = &self.evicted_fingerprints;
        if let Some(g) = shard.groups.get_mut(group) {
            return g.record(&self.config, evicted, worker.raw(), fingerprint, at_ms);
        }
        if shard.groups.len() >= self.groups_per_shard {
            let keep = after_eviction(self.groups_per_shard);
            let n = evict_lowest(&mut shard.groups, keep, |name, g| {
                (g.last_seen_ms, name_rank(name))
            });
            self.evicted_groups.fetch_add(n as u64, Ordering::Relaxed);
        }
        shard.groups.entry(group.into()).or_default().record(
            &self.config,
            evicted,
            worker.raw(),
            fingerprint,
            at_ms,
        )
    }

    fn tally(&self, group: &str, fingerprint: Fingerprint) -> GroupTally {
        let shard = lock(self.shard(group));
        shard
            .groups
            .get(group)
            .and_then(|g| g.fingerprints.get(&fingerprint))
            .map_or(GroupTally::EMPTY, |e| GroupTally {
                count: e.count,
                workers: count_u32(e.workers.len()),
                availability: Availability::Live,
            })
    }

    fn clear_group(&self, group: &str) {
        lock(self.shard(group)).groups.remove(group);
    }

    fn status(&self) -> StoreStatus {
        let groups = self.shards.iter().map(|s| lock(s).groups.len()).sum();
        StoreStatus {
            backend: Backend::Memory,
            reachable: true,
            availability: Availability::Live,
            errors: 0,
            last_error: None,
            since_last_sync: None,
            staleness_bound: std::time::Duration::ZERO,
            flushes: 0,
            reconnects: 0,
            groups,
            pending: 0,
            evicted_groups: self.evicted_groups.load(Ordering::Relaxed),
            evicted_fingerprints: self.evicted_fingerprints.load(Ordering::Relaxed),
            dropped_deltas: 0,
            wrong_type_skips: 0,
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(MemoryConfig::default())
    }
}
