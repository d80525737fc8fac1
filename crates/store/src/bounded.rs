//! The pieces both backends share: sharding, the fingerprint map, bounded worker lists and
//! eviction of the least recently seen entries.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash};

use loopguard_hash::FingerprintHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// At most this many shards (independent locks) per store.
const MAX_SHARDS: usize = 16;
/// A store is split into shards only when each shard still holds at least this many groups.
const MIN_GROUPS_PER_SHARD: usize = 64;

/// How many shards a store capped at `max_groups` groups uses: 16 when there are groups enough to
/// give each shard 64, fewer otherwise, at least one. Each shard holds `max_groups / shards`
/// groups, so the total never exceeds `max_groups`.
pub(crate) fn shard_count(max_groups: usize) -> usize {
    (max_groups / MIN_GROUPS_PER_SHARD).clamp(1, MAX_SHARDS)
}

/// The groups one shard may hold.
pub(crate) fn groups_per_shard(max_groups: usize, shards: usize) -> usize {
    (max_groups / shards.max(1)).max(1)
}

/// The shard of `group`: a stable hash, so a group always lands on the same shard.
pub(crate) fn shard_of(group: &str, shards: usize) -> usize {
    let shards = shards.max(1) as u64;
    (loopguard_hash::xxh3(group.as_bytes()) % shards) as usize
}

/// Locks a shard. Nothing in this crate panics while holding a lock, but a host's panic elsewhere
/// on the same thread must not disable the store: a poisoned lock is taken over as is.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A map keyed by fingerprint: fingerprints are already well-mixed 64-bit hashes, so one
/// multiply and a fold hash them (SipHash would cost more than the rest of `record`).
pub(crate) type FingerprintMap<V> = HashMap<u64, V, BuildHasherDefault<FingerprintHasher>>;

/// Adds `worker` to a list of distinct workers holding at most `cap`; true when it was added.
/// Lists are short (a handful of workers), so a linear scan beats any set.
pub(crate) fn add_worker(workers: &mut Vec<u64>, worker: u64, cap: usize) -> bool {
    if workers.len() >= cap || workers.contains(&worker) {
        return false;
    }
    workers.push(worker);
    true
}

/// Saturating conversion of a worker count.
pub(crate) fn count_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Removes entries from `map` until at most `keep` remain, lowest `rank` first, and returns how
/// many it removed. Ranks are "last seen" times (possibly biased to protect some entries) paired
/// with a stable hash of the key, so that ties are broken the same way in every process — a
/// replay, or a store restored from a snapshot, evicts exactly what the original did. Costs O(n)
/// plus one allocation of n ranks; callers evict down to three quarters of a cap, so the cost is
/// amortized over the quarter of inserts that follow.
pub(crate) fn evict_lowest<K, V, S, R>(
    map: &mut HashMap<K, V, S>,
    keep: usize,
    rank: impl Fn(&K, &V) -> R,
) -> usize
where
    K: Eq + Hash,
    S: BuildHasher,
    R: Ord + Copy,
{
    let len = map.len();
    if len <= keep {
        return 0;
    }
    let remove = len - keep;
    let mut ranks: Vec<R> = map.iter().map(|(k, v)| rank(k, v)).collect();
    let (_, &mut cutoff, _) = ranks.select_nth_unstable(remove - 1);
    let below = ranks.iter().filter(|&&r| r < cutoff).count();
    let mut equal_to_remove = remove - below;
    map.retain(|k, v| {
        let r = rank(k, v);
        if r < cutoff {
            false
        } else if r == cutoff && equal_to_remove > 0 {
            equal_to_remove -= 1;
            false
        } else {
            true
        }
    });
    len - map.len()
}

/// The tie-breaker of a group's eviction rank: a stable hash of its name.
pub(crate) fn name_rank(name: &str) -> u64 {
    loopguard_hash::xxh3(name.as_bytes())
}

/// How many entries remain after an eviction triggered by reaching `cap`: three quarters of it
/// (so that evictions are rare), and never more than `cap - 1` (so that there is room).
pub(crate) fn after_eviction(cap: usize) -> usize {
    (cap - cap / 4).min(cap.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evict_lowest_removes_exactly_the_lowest() {
        let mut map: HashMap<u32, u64> = (0..10).map(|i| (i, u64::from(i % 5))).collect();
        assert_eq!(evict_lowest(&mut map, 7, |_, &v| v), 3);
        assert_eq!(map.len(), 7);
        // The two zeros go first, then one of the two ones.
        assert_eq!(map.values().filter(|&&v| v == 0).count(), 0);
        assert_eq!(map.values().filter(|&&v| v == 1).count(), 1);
        assert_eq!(evict_lowest(&mut map, 7, |_, &v| v), 0);
    }

    #[test]
    fn ties_are_broken_by_key_in_every_map() {
        // Two maps with different hash seeds and insertion orders evict the same keys.
        let a: HashMap<u64, u64> = (0..50).map(|k| (k, k % 3)).collect();
        let mut b: HashMap<u64, u64> = (0..50).rev().map(|k| (k, k % 3)).collect();
        let mut a = a;
        evict_lowest(&mut a, 20, |&k, &v| (v, k));
        evict_lowest(&mut b, 20, |&k, &v| (v, k));
        let (mut ka, mut kb): (Vec<_>, Vec<_>) = (a.into_keys().collect(), b.into_keys().collect());
        ka.sort_unstable();
        kb.sort_unstable();
        assert_eq!(ka, kb);
    }

    #[test]
    fn eviction_always_makes_room() {
        for cap in 1..20 {
            assert!(after_eviction(cap) < cap, "cap {cap}");
        }
        assert_eq!(after_eviction(1024), 768);
    }

    #[test]
    fn shards_never_exceed_the_cap() {
        for max in [1, 2, 63, 64, 65, 127, 128, 1000, 1024, 5000] {
            let shards = shard_count(max);
            assert!(
                shards * groups_per_shard(max, shards) <= max.max(1),
                "max {max}"
            );
        }
    }

    #[test]
    fn workers_are_distinct_and_capped() {
        let mut w = Vec::new();
        assert!(add_worker(&mut w, 1, 2));
        assert!(!add_worker(&mut w, 1, 2));
        assert!(add_worker(&mut w, 2, 2));
        assert!(!add_worker(&mut w, 3, 2));
        assert_eq!(w, [1, 2]);
    }
}
