#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `RedisStore` against a real `redis-server` started for each test on a free loopback port.
//!
//! Most tests turn the background thread off and call `flush_now`, so that what each host has
//! exchanged with Redis is exact and no assertion depends on timing; the background thread has
//! tests of its own that wait for an outcome (with a deadline), never for a fixed time.

mod support;

use std::time::Duration;

use loopguard_store::{
    Availability, Backend, ConfigError, GroupStore, RedisConfig, RedisStore, WorkerId,
};
use redis::Commands;
use support::{RedisServer, eventually};

const FP: u64 = 0x00c0_ffee_0000_0001;
const OTHER: u64 = 0x00c0_ffee_0000_0002;

/// A host that flushes only when told to.
fn manual(server: &RedisServer) -> RedisStore {
    let mut config = RedisConfig::new(server.url());
    config.background_flush = false;
    RedisStore::connect(config).expect("valid config")
}

fn keys(server: &RedisServer, pattern: &str) -> Vec<String> {
    let mut keys: Vec<String> = server.connection().keys(pattern).expect("KEYS");
    keys.sort();
    keys
}

fn w(name: &str) -> WorkerId {
    WorkerId::new(name)
}

#[test]
fn a_fresh_store_is_live_once_connected() {
    let server = RedisServer::start();
    let host = manual(&server);
    let status = host.status();
    assert_eq!(status.backend, Backend::Redis);
    assert!(status.reachable, "{status:?}");
    assert_eq!(status.availability, Availability::Live);
    assert_eq!(status.errors, 0);
    assert_eq!(status.staleness_bound, Duration::from_millis(400));
    let tally = host.record("g", w("a"), FP, 0);
    assert_eq!((tally.count, tally.workers), (1, 1));
    assert_eq!(tally.availability, Availability::Live);
}

#[test]
fn two_hosts_see_each_others_counts_after_a_flush() {
    let server = RedisServer::start();
    let (a, b) = (manual(&server), manual(&server));
    // Six calls on each host: neither reaches a threshold of ten alone.
    for t in 0..6 {
        assert!(a.record("swarm", w("worker-a"), FP, t).count <= 6);
        assert!(b.record("swarm", w("worker-b"), FP, t).count <= 6);
    }
    a.flush_now().expect("flush a");
    let report = b.flush_now().expect("flush b");
    assert_eq!(report.fingerprints, 1);
    // B flushed second: its read-back already holds both hosts' records.
    assert_eq!(b.tally("swarm", FP).count, 12);
    assert_eq!(b.tally("swarm", FP).workers, 2);
    // A read back before B's records arrived; its next record answers from that (a lower
    // bound) until its next flush brings the global total.
    let stale = a.record("swarm", w("worker-a"), FP, 7);
    assert_eq!((stale.count, stale.workers), (7, 1));
    a.flush_now().expect("flush a again");
    let live = a.record("swarm", w("worker-a"), FP, 8);
    assert_eq!((live.count, live.workers), (14, 2));
    // The total in Redis is exact.
    let key = format!("loopguard:{{swarm}}:c:{FP:016x}");
    let total: u64 = server.connection().get(&key).expect("GET");
    assert_eq!(total, 13, "the 14th record is still pending on A");
}

#[test]
fn distinct_workers_are_counted_once_across_hosts() {
    let server = RedisServer::start();
    let (a, b) = (manual(&server), manual(&server));
    // The same worker reaching both hosts (no sticky sessions) is one worker.
    a.record("g", w("w1"), FP, 0);
    b.record("g", w("w1"), FP, 1);
    a.flush_now().expect("flush");
    b.flush_now().expect("flush");
    assert_eq!(b.tally("g", FP).workers, 1);
    // Recording it again on B does not make it two.
    assert_eq!(b.record("g", w("w1"), FP, 2).workers, 1);
    b.flush_now().expect("flush");
    assert_eq!(b.tally("g", FP).workers, 1);
    // A second worker does.
    b.record("g", w("w2"), FP, 3);
    b.flush_now().expect("flush");
    assert_eq!(b.tally("g", FP).workers, 2);
    a.record("g", w("w1"), FP, 4);
    a.flush_now().expect("flush");
    let tally = a.tally("g", FP);
    assert_eq!((tally.count, tally.workers), (5, 2));
    // Other fingerprints and groups are separate.
    assert_eq!(a.record("g", w("w1"), OTHER, 5).count, 1);
    assert_eq!(a.record("h", w("w1"), FP, 5).count, 1);
}

#[test]
fn keys_follow_the_documented_layout_and_expire() {
    let server = RedisServer::start();
    let mut config = RedisConfig::new(server.url());
    config.background_flush = false;
    config.key_prefix = "test:lg:".to_owned();
    config.ttl = Duration::from_secs(60);
    let host = RedisStore::connect(config).expect("valid config");
    host.record("swarm", w("a"), FP, 0);
    host.flush_now().expect("flush");
    let fp = format!("{FP:016x}");
    assert_eq!(
        keys(&server, "*"),
        [
            "test:lg:{swarm}:a".to_owned(),
            format!("test:lg:{{swarm}}:c:{fp}"),
            "test:lg:{swarm}:i".to_owned(),
            format!("test:lg:{{swarm}}:w:{fp}"),
        ]
    );
    let mut con = server.connection();
    let workers: Vec<String> = con
        .smembers(format!("test:lg:{{swarm}}:w:{fp}"))
        .expect("SMEMBERS");
    assert_eq!(workers, [w("a").to_string()]);
    // The marker of applied batches lives twice the TTL: it must outlast any batch a host may
    // still send again.
    let markers: Vec<(String, f64)> = con
        .zrange_withscores("test:lg:{swarm}:a", 0, -1)
        .expect("ZRANGE");
    assert_eq!(markers.len(), 1, "{markers:?}");
    for key in keys(&server, "*") {
        let ttl: i64 = con.pttl(&key).expect("PTTL");
        let max = if key.ends_with(":a") { 120_000 } else { 60_000 };
        assert!(ttl > 0 && ttl <= max, "{key} has PTTL {ttl}");
    }
}

#[test]
fn clearing_a_group_deletes_its_keys_only() {
    let server = RedisServer::start();
    let (a, b) = (manual(&server), manual(&server));
    a.record("done", w("a"), FP, 0);
    a.record("done", w("a"), OTHER, 0);
    b.record("done", w("b"), FP, 0);
    a.record("busy", w("a"), FP, 0);
    a.flush_now().expect("flush");
    b.flush_now().expect("flush");
    // Two fingerprints (a count and a worker set each), the index, the marker.
    assert_eq!(keys(&server, "loopguard:{done}:*").len(), 6);

    a.clear_group("done");
    // Locally at once.
    assert_eq!(a.tally("done", FP).count, 0);
    // In Redis on the next flush.
    let report = a.flush_now().expect("flush");
    assert_eq!(report.groups_cleared, 1);
    assert!(keys(&server, "loopguard:{done}:*").is_empty());
    assert_eq!(keys(&server, "loopguard:{busy}:*").len(), 4);

    // The other host starts over after its next flush.
    b.record("done", w("b"), FP, 10);
    b.flush_now().expect("flush");
    assert_eq!(b.tally("done", FP).count, 1);
}

#[test]
fn records_after_a_clear_survive_it() {
    // Regression guard for ordering: deletes go before the deltas recorded after the clear.
    let server = RedisServer::start();
    let host = manual(&server);
    host.record("g", w("a"), FP, 0);
    host.flush_now().expect("flush");
    host.clear_group("g");
    host.record("g", w("b"), FP, 1);
    host.flush_now().expect("flush");
    let tally = host.tally("g", FP);
    assert_eq!((tally.count, tally.workers), (1, 1));
    let total: u64 = server
        .connection()
        .get(format!("loopguard:{{g}}:c:{FP:016x}"))
        .expect("GET");
    assert_eq!(total, 1);
}

#[test]
fn killed_server_store_keeps_answering_from_local_state() {
    let mut server = RedisServer::start();
    let host = manual(&server);
    for t in 0..3 {
        host.record("g", w("a"), FP, t);
    }
    host.flush_now().expect("flush");
    server.kill();

    // Still answering, still counting: 3 flushed + 2 local.
    host.record("g", w("a"), FP, 3);
    let tally = host.record("g", w("b"), FP, 4);
    // Workers: a and b both recorded since the last flush.
    assert_eq!((tally.count, tally.workers), (5, 2));
    let error = host.flush_now().expect_err("the server is gone");
    assert!(
        error.to_string().starts_with("redis flush failed"),
        "{error}"
    );

    let status = host.status();
    assert!(!status.reachable);
    assert!(status.errors >= 1, "{status:?}");
    assert!(status.last_error.is_some());
    assert_eq!(status.availability, Availability::LocalOnly);
    assert_eq!(status.pending, 1);
    let tally = host.record("g", w("a"), FP, 5);
    assert_eq!(tally.count, 6);
    assert_eq!(tally.availability, Availability::LocalOnly);
    assert!(!tally.is_unavailable(), "fail-open by default");

    // Every attempt counts.
    let before = host.status().errors;
    assert!(host.flush_now().is_err());
    assert_eq!(host.status().errors, before + 1);
}

#[test]
fn fail_closed_flags_answers_once_stale_and_recovers_after_restart() {
    let mut server = RedisServer::start();
    let mut config = RedisConfig::new(server.url());
    config.background_flush = false;
    config.fail_closed = true;
    config.flush_interval = Duration::from_millis(20);
    let host = RedisStore::connect(config).expect("valid config");
    host.record("g", w("a"), FP, 0);
    host.flush_now().expect("flush");
    server.kill();
    assert!(host.flush_now().is_err());

    // Within the staleness bound (40 ms) it may still say LocalOnly; past it, Unavailable.
    eventually("the store is stale for longer than its bound", || {
        host.status()
            .since_last_sync
            .is_some_and(|d| d > Duration::from_millis(40))
    });
    let tally = host.record("g", w("a"), FP, 1);
    assert!(tally.is_unavailable(), "{tally:?}");
    assert_eq!(tally.count, 2, "the record is still counted locally");
    assert_eq!(host.status().availability, Availability::Unavailable);
    host.record("g", w("b"), FP, 2);

    server.restart();
    host.flush_now().expect("reconnected");
    let status = host.status();
    assert!(status.reachable);
    assert_eq!(status.availability, Availability::Live);
    assert_eq!(status.reconnects, 1);
    assert_eq!(status.pending, 0);
    // The restarted server had lost everything; it now holds what was recorded while it was
    // down, and the host's answers follow it.
    let total: u64 = server
        .connection()
        .get(format!("loopguard:{{g}}:c:{FP:016x}"))
        .expect("GET");
    assert_eq!(total, 2);
    let tally = host.record("g", w("a"), FP, 3);
    assert_eq!((tally.count, tally.workers), (3, 2));
    assert_eq!(tally.availability, Availability::Live);
}

#[test]
fn background_thread_flushes_on_its_own() {
    let server = RedisServer::start();
    let mut config = RedisConfig::new(server.url());
    config.flush_interval = Duration::from_millis(20);
    let host = RedisStore::connect(config).expect("valid config");
    for t in 0..4 {
        host.record("g", w("a"), FP, t);
    }
    let key = format!("loopguard:{{g}}:c:{FP:016x}");
    let mut con = server.connection();
    eventually("the background thread flushed 4 records", || {
        con.get::<_, Option<u64>>(&key).ok().flatten() == Some(4)
    });
    eventually("the host has no pending delta", || {
        host.status().pending == 0
    });
    assert!(host.status().flushes >= 1);
}

#[test]
fn background_thread_reconnects_after_a_restart() {
    let mut server = RedisServer::start();
    let mut config = RedisConfig::new(server.url());
    config.flush_interval = Duration::from_millis(20);
    config.max_backoff = Duration::from_millis(100);
    let host = RedisStore::connect(config).expect("valid config");
    host.record("g", w("a"), FP, 0);
    eventually("the first record is flushed", || host.status().pending == 0);

    server.kill();
    eventually("the store notices", || !host.status().reachable);
    assert!(host.status().errors >= 1);
    for t in 1..=3 {
        assert_eq!(host.record("g", w("a"), FP, t).count, t + 1);
    }

    server.restart();
    eventually("the store reconnects", || host.status().reachable);
    let key = format!("loopguard:{{g}}:c:{FP:016x}");
    let mut con = server.connection();
    eventually("the records made while down reach the new server", || {
        con.get::<_, Option<u64>>(&key).ok().flatten() == Some(3)
    });
    assert!(host.status().reconnects >= 1);
}

#[test]
fn dropping_the_store_flushes_what_is_pending() {
    let server = RedisServer::start();
    let mut config = RedisConfig::new(server.url());
    config.flush_interval = Duration::from_secs(3600);
    let host = RedisStore::connect(config).expect("valid config");
    host.record("g", w("a"), FP, 0);
    host.record("g", w("a"), FP, 1);
    drop(host);
    let total: Option<u64> = server
        .connection()
        .get(format!("loopguard:{{g}}:c:{FP:016x}"))
        .expect("GET");
    assert_eq!(total, Some(2));
}

#[test]
fn unreachable_at_startup_is_not_an_error() {
    // A port that accepts connections but never answers (held by this test, so no other test's
    // server can take it): the first exchange times out.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = silent.local_addr().expect("bound").port();
    let mut config = RedisConfig::new(format!("redis://127.0.0.1:{port}/"));
    config.background_flush = false;
    config.io_timeout = Duration::from_millis(200);
    let host = RedisStore::connect(config).expect("an unreachable server is not a config error");
    let status = host.status();
    assert!(!status.reachable);
    assert_eq!(status.errors, 1);
    assert_eq!(status.since_last_sync, None);
    let tally = host.record("g", w("a"), FP, 0);
    assert_eq!(
        (tally.count, tally.availability),
        (1, Availability::LocalOnly)
    );
    drop(silent);
}

#[test]
fn invalid_configuration_is_refused() {
    let error = RedisStore::connect(RedisConfig::new("not a url")).expect_err("bad url");
    assert!(matches!(error, ConfigError::Url(_)), "{error:?}");
    assert!(
        error.to_string().starts_with("invalid redis url"),
        "{error}"
    );

    let mut config = RedisConfig::new("redis://127.0.0.1:1/");
    config.ttl = Duration::ZERO;
    let error = RedisStore::connect(config).expect_err("zero ttl");
    assert_eq!(
        error.to_string(),
        "redis store setting `ttl` must be greater than zero"
    );
}

#[test]
fn record_allocates_nothing_in_steady_state() {
    let server = RedisServer::start();
    let host = manual(&server);
    // Warm up: the group, the fingerprint, the dirty list and the worker list exist, and a flush
    // has emptied (not freed) them.
    host.record("g", w("a"), FP, 0);
    host.flush_now().expect("flush");
    host.record("g", w("a"), FP, 1);
    let allocations = allocation_counter::measure(|| {
        for t in 2..1000 {
            std::hint::black_box(host.record("g", w("a"), FP, t));
        }
    })
    .count_total;
    assert_eq!(allocations, 0);
}

// --- Regressions: wrong-type keys, deltas applied twice, a frozen server -----------------------

#[test]
fn a_wrong_type_key_holds_back_only_its_own_deltas_and_counts_are_never_multiplied() {
    let server = RedisServer::start();
    let (host, other) = (manual(&server), manual(&server));
    let mut con = server.connection();
    let fp = format!("{FP:016x}");
    let count =
        |con: &mut redis::Connection, key: &str| -> Option<u64> { con.get(key).expect("GET") };
    // Another program wrote strings where loopguard keeps a worker set (one fingerprint of the
    // group) and the index of another group.
    let foreign_set = format!("loopguard:{{g}}:w:{OTHER:016x}");
    let _: () = con.set(&foreign_set, "not a set").expect("SET");
    let _: () = con
        .set("loopguard:{intruded}:i", "not an index")
        .expect("SET");

    // Three real calls of FP, one of OTHER, one in the intruded group; flushed again and again.
    for (t, name) in ["w1", "w2", "w3"].into_iter().enumerate() {
        host.record("g", w(name), FP, t as u64);
    }
    host.record("g", w("w1"), OTHER, 3);
    host.record("intruded", w("w1"), FP, 4);
    for _ in 0..5 {
        // Each flush is checked below, through the counts and the error counter.
        let _ = host.flush_now();
    }

    // Three calls read as three, here, in Redis and on another host.
    let tally = host.tally("g", FP);
    assert_eq!((tally.count, tally.workers), (3, 3));
    assert_eq!(count(&mut con, &format!("loopguard:{{g}}:c:{fp}")), Some(3));
    other.record("g", w("w4"), FP, 5);
    other.flush_now().expect("flush");
    let tally = other.tally("g", FP);
    assert_eq!((tally.count, tally.workers), (4, 4));

    // The held-back deltas still count on this host, once; nothing was written next to the
    // foreign keys, which are left as they were.
    assert_eq!(host.tally("g", OTHER).count, 1);
    assert_eq!(host.tally("intruded", FP).count, 1);
    assert_eq!(
        count(&mut con, &format!("loopguard:{{g}}:c:{OTHER:016x}")),
        None
    );
    assert_eq!(
        keys(&server, "loopguard:{intruded}:*"),
        ["loopguard:{intruded}:i"]
    );
    let foreign: String = con.get(&foreign_set).expect("GET");
    assert_eq!(foreign, "not a set");
    let status = host.status();
    assert_eq!(status.errors, 0, "{status:?}");
    assert_eq!(status.availability, Availability::Live);
    assert_eq!(status.wrong_type_skips, 10, "two keys, five flushes");
    assert_eq!(status.pending, 2);
    assert!(
        status
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("loopguard:{") && e.contains("wrong type")),
        "{status:?}"
    );

    // Once the foreign keys are removed, the held-back deltas are applied, exactly once.
    let _: () = con
        .del(&[foreign_set.as_str(), "loopguard:{intruded}:i"])
        .expect("DEL");
    host.flush_now().expect("flush");
    host.flush_now().expect("flush");
    assert_eq!(
        count(&mut con, &format!("loopguard:{{g}}:c:{OTHER:016x}")),
        Some(1)
    );
    assert_eq!(
        count(&mut con, &format!("loopguard:{{intruded}}:c:{fp}")),
        Some(1)
    );
    assert_eq!(host.tally("g", OTHER).count, 1);
    assert_eq!(host.status().pending, 0);
    assert_eq!(host.status().wrong_type_skips, 10);
}

#[test]
fn a_count_key_holding_text_is_skipped_and_a_clear_leaves_foreign_keys_alone() {
    let server = RedisServer::start();
    let host = manual(&server);
    let mut con = server.connection();
    let text_count = format!("loopguard:{{g}}:c:{OTHER:016x}");
    let _: () = con.set(&text_count, "twelve").expect("SET");
    host.record("g", w("a"), FP, 0);
    host.record("g", w("a"), OTHER, 0);
    host.flush_now().expect("flush");
    assert_eq!(host.status().wrong_type_skips, 1);
    assert_eq!(host.tally("g", OTHER).count, 1);
    // The index names OTHER only if it was written: it was not.
    let indexed: Vec<String> = con.zrange("loopguard:{g}:i", 0, -1).expect("ZRANGE");
    assert_eq!(indexed, [format!("{FP:016x}")]);

    // A clear deletes the group's own keys and leaves the foreign one alone.
    let _: () = con
        .zadd("loopguard:{g}:i", format!("{OTHER:016x}"), 1)
        .expect("ZADD");
    host.clear_group("g");
    let report = host.flush_now().expect("flush");
    assert_eq!(report.groups_cleared, 1);
    assert_eq!(
        keys(&server, "loopguard:{g}:*"),
        std::slice::from_ref(&text_count)
    );
    let text: String = con.get(&text_count).expect("GET");
    assert_eq!(text, "twelve");
}

#[test]
fn a_flush_applied_after_its_reply_was_lost_is_not_applied_again() {
    let server = RedisServer::start();
    let mut config = RedisConfig::new(server.url());
    config.background_flush = false;
    config.io_timeout = Duration::from_millis(300);
    let host = RedisStore::connect(config).expect("valid config");
    let key = format!("loopguard:{{g}}:c:{FP:016x}");
    host.record("g", w("a"), FP, 0);
    host.flush_now().expect("flush");
    for t in 1..4 {
        host.record("g", w("a"), FP, t);
    }
    // The request reaches a frozen server: the host gives up waiting for the reply.
    server.pause();
    assert!(host.flush_now().is_err(), "a frozen server times out");
    server.resume();
    // The server then reads the request and applies it; nobody is there for the reply.
    let mut con = server.connection();
    eventually("the server applies the request it had buffered", || {
        con.get::<_, Option<u64>>(&key).ok().flatten() == Some(4)
    });
    // The host sends the same batch again, more than once: Redis applies it once.
    host.record("g", w("b"), FP, 4);
    for _ in 0..3 {
        host.flush_now().expect("flush");
    }
    let total: u64 = con.get(&key).expect("GET");
    assert_eq!(total, 5);
    let tally = host.tally("g", FP);
    assert_eq!((tally.count, tally.workers), (5, 2));
    assert_eq!(host.status().pending, 0);
}

#[test]
fn a_frozen_server_is_unavailable_within_the_bound_and_live_within_the_bound_after_it_thaws() {
    let server = RedisServer::start();
    let mut config = RedisConfig::new(server.url());
    config.fail_closed = true;
    config.flush_interval = Duration::from_millis(100);
    // The defaults otherwise: a one-second I/O timeout (longer than the bound, so the flush
    // thread is still waiting when the bound passes) and a five-second backoff cap.
    let host = RedisStore::connect(config).expect("valid config");
    let bound = host.config().staleness_bound();
    host.record("g", w("a"), FP, 0);
    eventually("the record is flushed and the store live", || {
        let status = host.status();
        status.pending == 0 && status.availability == Availability::Live
    });

    server.pause();
    let frozen = std::time::Instant::now();
    // The last sync started before the freeze: once the bound has passed, answers are flagged,
    // whatever the flush thread is doing.
    std::thread::sleep(bound + Duration::from_millis(20));
    let tally = host.record("g", w("a"), FP, 1);
    assert!(
        tally.is_unavailable(),
        "{tally:?} after {:?}",
        frozen.elapsed()
    );
    assert_eq!(tally.count, 2, "still counted locally");
    let status = host.status();
    assert!(!status.reachable, "{status:?}");
    assert_eq!(status.availability, Availability::Unavailable);

    // A long freeze: the flush thread times out and retries, and the store stays unavailable.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(host.record("g", w("a"), FP, 2).is_unavailable());
    assert!(host.status().errors >= 1);

    server.resume();
    let thawed = std::time::Instant::now();
    eventually("the store is live again", || {
        host.status().availability == Availability::Live
    });
    let recovered = thawed.elapsed();
    // Within the bound, plus scheduling slack for a busy test machine; the five-second backoff
    // cap does not apply to a fail-closed store.
    assert!(
        recovered <= bound + Duration::from_millis(300),
        "live again only {recovered:?} after the server thawed"
    );
    let tally = host.record("g", w("a"), FP, 3);
    assert_eq!(tally.availability, Availability::Live);
    let key = format!("loopguard:{{g}}:c:{FP:016x}");
    let mut con = server.connection();
    eventually("every record reaches Redis once", || {
        con.get::<_, Option<u64>>(&key).ok().flatten() == Some(4)
    });
}
