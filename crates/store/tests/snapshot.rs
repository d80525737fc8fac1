#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! Snapshots of `MemoryStore`: round trips, versions, corrupted input.

use loopguard_store::format::VersionError;
use loopguard_store::{
    GROUP_SNAPSHOT, GroupSnapshot, GroupStore, MemoryConfig, MemoryStore, SnapshotError,
    SnapshotFingerprint, SnapshotGroup, WorkerId,
};
use proptest::prelude::*;

fn w(name: &str) -> WorkerId {
    WorkerId::new(name)
}

fn sample() -> MemoryStore {
    let store = MemoryStore::default();
    store.record("swarm-b", w("x"), 7, 10);
    store.record("swarm-a", w("x"), 0xffff_ffff_ffff_ffff, 20);
    store.record("swarm-a", w("y"), 0xffff_ffff_ffff_ffff, 30);
    store.record("swarm-a", w("x"), 3, 40);
    store
}

#[test]
fn round_trip_through_json_restores_every_count() {
    let store = sample();
    let snapshot = store.snapshot();
    let json = snapshot.to_json();
    let read = GroupSnapshot::from_json(&json).expect("valid snapshot");
    assert_eq!(read, snapshot);

    let restored = MemoryStore::default();
    let report = restored.restore(&read).expect("restores");
    assert_eq!(
        (report.groups, report.fingerprints, report.evicted),
        (2, 3, 0)
    );
    assert_eq!(restored.snapshot(), snapshot);
    let tally = restored.record("swarm-a", w("x"), u64::MAX, 50);
    assert_eq!((tally.count, tally.workers), (3, 2));
}

#[test]
fn json_is_versioned_sorted_and_uses_hex_for_64_bit_values() {
    let json = sample().snapshot().to_json();
    let x = w("x").to_string();
    let y = w("y").to_string();
    assert_eq!(
        json,
        format!(
            r#"{{"version":1,"groups":[{{"group":"swarm-a","last_seen_ms":40,"fingerprints":[{{"fingerprint":"0000000000000003","count":1,"workers":["{x}"],"last_seen_ms":40}},{{"fingerprint":"ffffffffffffffff","count":2,"workers":["{x}","{y}"],"last_seen_ms":30}}]}},{{"group":"swarm-b","last_seen_ms":10,"fingerprints":[{{"fingerprint":"0000000000000007","count":1,"workers":["{x}"],"last_seen_ms":10}}]}}]}}"#
        )
    );
    assert_eq!(GROUP_SNAPSHOT.current, 1);
    assert!(GROUP_SNAPSHOT.is_consistent());
}

#[test]
fn serde_embedding_checks_the_version_too() {
    // A host that embeds the snapshot in its own serde data gets the same checks.
    let err = serde_json::from_str::<GroupSnapshot>(r#"{"version":9,"groups":[]}"#)
        .expect_err("newer version");
    assert!(
        err.to_string()
            .starts_with("group snapshot format version 9 is newer than this build reads"),
        "{err}"
    );
    let ok: GroupSnapshot = serde_json::from_str(r#"{"version":1,"groups":[]}"#).expect("valid");
    assert!(ok.groups().is_empty());
}

#[test]
fn restore_replaces_what_was_there() {
    let store = sample();
    let other = MemoryStore::default();
    other.record("stale", w("z"), 1, 0);
    other.restore(&store.snapshot()).expect("restores");
    assert_eq!(other.tally("stale", 1).count, 0);
    assert_eq!(other.status().groups, 2);
}

#[test]
fn restore_into_smaller_caps_keeps_the_most_recent() {
    let store = MemoryStore::default();
    for fp in 0..10u64 {
        for i in 0..5 {
            store.record("g", w(&format!("worker-{i}")), fp, fp * 100 + i);
        }
    }
    let small = MemoryStore::new(MemoryConfig {
        max_fingerprints_per_group: 4,
        max_workers_per_fingerprint: 2,
        ..MemoryConfig::default()
    });
    let report = small.restore(&store.snapshot()).expect("restores");
    assert_eq!((report.fingerprints, report.evicted), (4, 6));
    assert_eq!(small.tally("g", 9).count, 5);
    assert_eq!(small.tally("g", 9).workers, 2);
    assert_eq!(small.tally("g", 0).count, 0);
}

fn error_of(json: &str) -> SnapshotError {
    GroupSnapshot::from_json(json).expect_err("must be refused")
}

#[test]
fn a_newer_version_is_refused_with_a_clear_error() {
    let err = error_of(r#"{"version":2,"groups":[],"shiny_new_field":true}"#);
    assert!(
        matches!(
            err,
            SnapshotError::Version(VersionError::TooNew {
                found: 2,
                supported: 1,
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "group snapshot format version 2 is newer than this build reads (up to 1); restore it \
         with the loopguard version that wrote it or a newer one"
    );
}

#[test]
fn an_older_version_than_any_reader_is_refused() {
    let err = error_of(r#"{"version":0,"groups":[]}"#);
    assert!(
        matches!(
            err,
            SnapshotError::Version(VersionError::TooOld {
                found: 0,
                oldest: 1,
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "group snapshot format version 0 is too old to migrate (this build reads versions 1 and \
         later)"
    );
}

#[test]
fn a_snapshot_without_version_is_refused() {
    let err = error_of(r#"{"groups":[]}"#);
    assert!(
        matches!(err, SnapshotError::Version(VersionError::Missing { .. })),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "group snapshot has no `version` field");
}

#[test]
fn corrupted_snapshots_are_refused_with_the_place_and_reason() {
    let a = w("a").to_string();
    let b = w("b").to_string();
    let fp = |count: u64, workers: &str| {
        format!(
            r#"{{"fingerprint":"00000000000000aa","count":{count},"workers":[{workers}],"last_seen_ms":1}}"#
        )
    };
    let group = |name: &str, fps: &str| {
        format!(r#"{{"group":"{name}","last_seen_ms":1,"fingerprints":[{fps}]}}"#)
    };
    let snap = |groups: &str| format!(r#"{{"version":1,"groups":[{groups}]}}"#);
    let cases = [
        (
            snap(&group("g", &fp(0, &format!(r#""{a}""#)))),
            "invalid group snapshot: group `g`, fingerprint `00000000000000aa`: its count is 0",
        ),
        (
            snap(&group("g", &fp(1, &format!(r#""{a}","{b}""#)))),
            "invalid group snapshot: group `g`, fingerprint `00000000000000aa`: it lists 2 \
             workers but was only counted 1 times",
        ),
        (
            snap(&group("g", &fp(3, ""))),
            "invalid group snapshot: group `g`, fingerprint `00000000000000aa`: it has no worker",
        ),
        (
            snap(&group("g", &fp(3, &format!(r#""{a}","{a}""#)))),
            &*format!(
                "invalid group snapshot: group `g`, fingerprint `00000000000000aa`: worker `{a}` \
                 appears twice"
            ),
        ),
        (
            snap(&group(
                "g",
                &format!(
                    "{},{}",
                    fp(1, &format!(r#""{a}""#)),
                    fp(2, &format!(r#""{a}""#))
                ),
            )),
            "invalid group snapshot: group `g`, fingerprint `00000000000000aa`: the fingerprint \
             appears twice",
        ),
        (
            snap(&format!("{},{}", group("g", ""), group("g", ""))),
            "invalid group snapshot: group `g`: the group appears twice",
        ),
        (
            snap(&group("", "")),
            "invalid group snapshot: group ``: a group has an empty name",
        ),
    ];
    for (json, expected) in cases {
        let err = error_of(&json);
        assert!(matches!(err, SnapshotError::Invalid(_)), "{err:?}");
        assert_eq!(err.to_string(), expected, "for {json}");
    }
}

#[test]
fn malformed_snapshots_are_refused_with_serdes_message() {
    let cases = [
        (r#"{"version":1,"groups":["#, "EOF while parsing"),
        (
            r#"{"version":"one","groups":[]}"#,
            "`version` must be a whole number, found `\"one\"`",
        ),
        (r#"{"version":1}"#, "missing field `groups`"),
        (
            r#"{"version":1,"groups":[],"extra":1}"#,
            "unknown field `extra`",
        ),
        (
            r#"{"version":1,"groups":[{"group":"g","last_seen_ms":0,"fingerprints":[{"fingerprint":"12","count":1,"workers":[],"last_seen_ms":0}]}]}"#,
            "expected 16 hex digits, found `12`",
        ),
        (
            r#"{"version":1,"groups":[{"group":"g","last_seen_ms":0,"fingerprints":[{"fingerprint":12,"count":1,"workers":[],"last_seen_ms":0}]}]}"#,
            "invalid type: integer `12`",
        ),
        ("[]", "expected a JSON object with a `version` field"),
    ];
    for (json, expected) in cases {
        let err = error_of(json);
        assert!(
            matches!(
                err,
                SnapshotError::Malformed(_)
                    | SnapshotError::Version(
                        VersionError::NotANumber { .. } | VersionError::NotAnObject { .. }
                    )
            ),
            "{json}: {err:?}"
        );
        let message = err.to_string();
        assert!(
            message.starts_with("malformed group snapshot: "),
            "{message}"
        );
        assert!(message.contains(expected), "{json}: {message}");
    }
}

#[test]
fn a_snapshot_built_by_hand_is_validated() {
    let bad = SnapshotGroup {
        group: "g".to_owned(),
        last_seen_ms: 0,
        fingerprints: vec![SnapshotFingerprint {
            fingerprint: 1,
            count: 0,
            workers: vec![w("a")],
            last_seen_ms: 0,
        }],
    };
    assert!(matches!(
        GroupSnapshot::new(vec![bad]),
        Err(SnapshotError::Invalid(_))
    ));
}

#[derive(Clone, Debug)]
struct Event {
    group: u8,
    worker: u8,
    fingerprint: u8,
    gap_ms: u16,
    /// A late event from a slower worker: its time is `gap_ms` before the latest one.
    late: bool,
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    prop::collection::vec(
        (
            0..3u8,
            0..4u8,
            0..6u8,
            0..2_000u16,
            prop::bool::weighted(0.1),
        )
            .prop_map(|(group, worker, fingerprint, gap_ms, late)| Event {
                group,
                worker,
                fingerprint,
                gap_ms,
                late,
            }),
        0..200,
    )
}

fn replay(store: &MemoryStore, events: &[Event], mut t: u64) -> (Vec<(u64, u32)>, u64) {
    let mut tallies = Vec::with_capacity(events.len());
    for e in events {
        let at = if e.late {
            t.saturating_sub(u64::from(e.gap_ms))
        } else {
            t += u64::from(e.gap_ms);
            t
        };
        let tally = store.record(
            &format!("group-{}", e.group),
            WorkerId::from_raw(u64::from(e.worker)),
            u64::from(e.fingerprint),
            at,
        );
        tallies.push((tally.count, tally.workers));
    }
    (tallies, t)
}

proptest! {
    /// Observe N events, snapshot, restore into a new store, observe the rest: every answer is
    /// the one an uninterrupted store gives. Small caps and a short TTL put eviction and expiry
    /// in play, and late events (out of order) too.
    #[test]
    fn snapshot_restore_is_invisible(
        events in events(),
        split in 0usize..200,
        (max_groups, max_fingerprints_per_group, max_workers_per_fingerprint) in
            (1usize..4, 1usize..6, 1usize..4),
    ) {
        let config = MemoryConfig {
            max_groups,
            max_fingerprints_per_group,
            max_workers_per_fingerprint,
            idle_ttl_ms: Some(5_000),
        };
        let split = split.min(events.len());
        let uninterrupted = MemoryStore::new(config.clone());
        let (expected, _) = replay(&uninterrupted, &events, 0);

        let first = MemoryStore::new(config.clone());
        let (mut got, t) = replay(&first, &events[..split], 0);
        let json = first.snapshot().to_json();
        let second = MemoryStore::new(config);
        second.restore(&GroupSnapshot::from_json(&json).expect("own snapshot reads back"))
            .expect("own snapshot restores");
        prop_assert_eq!(second.snapshot(), first.snapshot());
        let (rest, _) = replay(&second, &events[split..], t);
        got.extend(rest);
        prop_assert_eq!(got, expected);
    }
}
