#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `MemoryStore`: counts, distinct workers, clearing, bounds, concurrency.

use std::sync::Arc;

use loopguard_store::{
    Availability, Backend, GroupStore, GroupTally, MemoryConfig, MemoryStore, WorkerId,
};

const FP: u64 = 0xfeed_0000_0000_0001;

fn w(name: &str) -> WorkerId {
    WorkerId::new(name)
}

fn small(max_groups: usize, max_fingerprints: usize, max_workers: usize) -> MemoryStore {
    MemoryStore::new(MemoryConfig {
        max_groups,
        max_fingerprints_per_group: max_fingerprints,
        max_workers_per_fingerprint: max_workers,
        idle_ttl_ms: None,
    })
}

#[test]
fn counts_every_record_and_each_worker_once() {
    let store = MemoryStore::default();
    let expected = [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3)];
    let workers = ["a", "a", "b", "a", "c"];
    for (t, (name, (count, distinct))) in workers.iter().zip(expected).enumerate() {
        let tally = store.record("swarm", w(name), FP, t as u64);
        assert_eq!(
            tally,
            GroupTally {
                count,
                workers: distinct,
                availability: Availability::Live
            }
        );
    }
    assert_eq!(store.tally("swarm", FP).count, 5);
}

#[test]
fn groups_and_fingerprints_are_independent() {
    let store = MemoryStore::default();
    store.record("one", w("a"), FP, 0);
    store.record("one", w("a"), FP, 1);
    assert_eq!(store.record("two", w("a"), FP, 2).count, 1);
    assert_eq!(store.record("one", w("a"), FP + 1, 3).count, 1);
    assert_eq!(store.tally("one", FP).count, 2);
    assert_eq!(store.tally("nobody", FP), GroupTally::EMPTY);
}

#[test]
fn tally_records_nothing() {
    let store = MemoryStore::default();
    store.record("g", w("a"), FP, 0);
    for _ in 0..3 {
        assert_eq!(store.tally("g", FP).count, 1);
    }
}

#[test]
fn clear_group_forgets_only_that_group() {
    let store = MemoryStore::default();
    store.record("done", w("a"), FP, 0);
    store.record("done", w("b"), FP, 1);
    store.record("busy", w("a"), FP, 2);
    store.clear_group("done");
    assert_eq!(store.tally("done", FP), GroupTally::EMPTY);
    assert_eq!(store.tally("busy", FP).count, 1);
    assert_eq!(store.record("done", w("a"), FP, 3).count, 1);
    assert_eq!(store.status().groups, 2);
    store.clear_group("never-existed");
}

#[test]
fn fingerprint_cap_evicts_the_least_recently_seen() {
    let store = small(64, 4, 8);
    let hot = 1_000;
    for fp in 0..20u64 {
        // The loop in progress is repeated between every new fingerprint.
        store.record("g", w("a"), hot, fp * 10);
        store.record("g", w("a"), fp, fp * 10 + 1);
    }
    assert_eq!(
        store.tally("g", hot).count,
        20,
        "the hot fingerprint survives"
    );
    let held = (0..20).filter(|&fp| store.tally("g", fp).count > 0).count();
    assert!((1..=3).contains(&held), "{held} cold fingerprints held");
    assert_eq!(store.tally("g", 19).count, 1, "the newest is held");
    assert_eq!(store.tally("g", 0).count, 0, "the oldest is gone");
    let status = store.status();
    assert!(status.evicted_fingerprints > 0);
    let snapshot = store.snapshot();
    assert!(snapshot.groups()[0].fingerprints.len() <= 4);
}

#[test]
fn group_cap_evicts_the_least_recently_seen() {
    let store = small(8, 16, 8);
    for i in 0..100u64 {
        store.record("long-running", w("a"), FP, i * 10);
        store.record(&format!("short-{i}"), w("a"), FP, i * 10 + 1);
    }
    let status = store.status();
    assert!(status.groups <= 8, "{} groups held", status.groups);
    assert!(status.evicted_groups >= 92 - 8);
    assert_eq!(store.tally("long-running", FP).count, 100);
    assert_eq!(store.tally("short-99", FP).count, 1);
    assert_eq!(store.tally("short-0", FP).count, 0);
}

#[test]
fn distinct_workers_saturate_at_the_cap() {
    let store = small(64, 16, 3);
    for i in 0..10 {
        store.record("g", w(&format!("worker-{i}")), FP, i);
    }
    let tally = store.tally("g", FP);
    assert_eq!((tally.count, tally.workers), (10, 3));
}

#[test]
fn caps_of_zero_are_raised_to_one() {
    let store = small(0, 0, 0);
    let tally = store.record("g", w("a"), FP, 0);
    assert_eq!((tally.count, tally.workers), (1, 1));
    assert_eq!(store.config().max_groups, 1);
    store.record("h", w("a"), FP, 1);
    assert_eq!(store.status().groups, 1);
}

#[test]
fn an_idle_fingerprint_starts_over_after_the_ttl() {
    let store = MemoryStore::new(MemoryConfig {
        idle_ttl_ms: Some(1_000),
        ..MemoryConfig::default()
    });
    store.record("g", w("a"), FP, 0);
    store.record("g", w("b"), FP, 900);
    store.record("g", w("a"), FP + 1, 1_500);
    // 1 000 ms after its last record: still counted.
    assert_eq!(store.record("g", w("a"), FP, 1_900).count, 3);
    // More than 1 000 ms: starts over, workers too.
    let tally = store.record("g", w("a"), FP, 2_901);
    assert_eq!((tally.count, tally.workers), (1, 1));
    // A whole group idle past the TTL is forgotten.
    let tally = store.record("g", w("a"), FP + 1, 10_000);
    assert_eq!(tally.count, 1);
}

#[test]
fn events_out_of_order_do_not_move_time_back() {
    let store = MemoryStore::new(MemoryConfig {
        idle_ttl_ms: Some(1_000),
        ..MemoryConfig::default()
    });
    store.record("g", w("a"), FP, 5_000);
    // An older event from a slower worker is counted, and does not make the entry look idle.
    assert_eq!(store.record("g", w("b"), FP, 100).count, 2);
    assert_eq!(store.record("g", w("a"), FP, 5_500).count, 3);
}

#[test]
fn status_reports_a_healthy_memory_backend() {
    let store = MemoryStore::default();
    store.record("g", w("a"), FP, 0);
    let status = store.status();
    assert_eq!(status.backend, Backend::Memory);
    assert!(status.reachable);
    assert_eq!(status.availability, Availability::Live);
    assert_eq!((status.errors, status.pending, status.groups), (0, 0, 1));
}

#[test]
fn concurrent_records_add_up() {
    let store: Arc<dyn GroupStore> = Arc::new(MemoryStore::default());
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let worker = w(&format!("worker-{i}"));
                for t in 0..1_000 {
                    store.record("swarm", worker, FP, t);
                    store.record(&format!("own-{i}"), worker, FP, t);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("no panic");
    }
    let tally = store.tally("swarm", FP);
    assert_eq!((tally.count, tally.workers), (8_000, 8));
    for i in 0..8 {
        assert_eq!(store.tally(&format!("own-{i}"), FP).count, 1_000);
    }
}

#[test]
fn worker_ids_are_stable_hashes() {
    // XXH3-64 of "worker-a", seed 0: every host and process must agree on it.
    assert_eq!(w("worker-a"), w("worker-a"));
    assert_ne!(w("worker-a"), w("worker-b"));
    assert_eq!(
        w("").raw(),
        0x2d06_8005_38d3_94c2,
        "XXH3-64 of the empty input"
    );
    assert_eq!(WorkerId::from_raw(42).raw(), 42);
    assert_eq!(WorkerId::from_raw(255).to_string(), "00000000000000ff");
}

#[test]
fn record_allocates_nothing_in_steady_state() {
    let store = MemoryStore::default();
    let (a, b) = (w("a"), w("b"));
    store.record("swarm", a, FP, 0);
    store.record("swarm", b, FP, 0);
    let allocations = allocation_counter::measure(|| {
        for t in 1..1_000 {
            std::hint::black_box(store.record("swarm", a, FP, t));
            std::hint::black_box(store.record("swarm", b, FP, t));
        }
    })
    .count_total;
    assert_eq!(allocations, 0);
}
