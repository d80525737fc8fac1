#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! The group (swarm) scope across hosts: two engines, as two hosts behind a load balancer would
//! run them, sharing group counters through a real `redis-server` started on a free loopback
//! port (the store's own harness; it fails the test if the server cannot start, it never skips).
//!
//! The stores flush only when told to (`flush_now`), so what each host knows is exact and no
//! assertion depends on timing.

// The store's own harness (not every helper is used here).
#[allow(dead_code)]
#[path = "../../crates/store/tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use loopguard_engine::store::{Availability, Backend, RedisConfig, RedisStore};
use loopguard_engine::{Action, Arguments, Call, Engine, Event, ToolResult, Verdict};
use loopguard_rules::Policy;
use serde_json::{Value, json};
use support::{RedisServer, eventually};

/// A host: an engine with the default policy whose group counters live in Redis.
struct Host {
    engine: Engine,
    store: Arc<RedisStore>,
}

impl Host {
    fn new(server: &RedisServer, fail_closed: bool) -> Host {
        let mut config = RedisConfig::new(server.url());
        config.background_flush = false;
        config.fail_closed = fail_closed;
        config.flush_interval = Duration::from_millis(20);
        Host::with(config)
    }

    fn with(config: RedisConfig) -> Host {
        let store = Arc::new(RedisStore::connect(config).expect("valid config"));
        let policy = Policy::builtin_default().policy.expect("default policy");
        let engine = Engine::builder(&policy)
            .store(Arc::clone(&store) as _)
            .build()
            .expect("the default policy names no plugins");
        Host { engine, store }
    }

    /// One failing `npm install` by `worker` (its own session), and its result.
    fn install(&self, worker: &str, n: u64) -> Verdict {
        self.engine.join_group(worker, "swarm", worker);
        let id = format!("{worker}-{n}");
        let args = npm();
        let v = self.engine.observe(&Event::Call(Call {
            session: worker,
            call_id: &id,
            tool: "bash",
            arguments: Arguments::Json(&args),
            time_ms: n * 1000,
        }));
        if v.action < Action::Block {
            self.engine.observe(&Event::Result(ToolResult {
                session: worker,
                call_id: &id,
                output: "npm error code ETARGET\nnpm error notarget No matching version found for left-pad@9.9.9.",
                is_error: true,
                exit_code: Some(1),
                time_ms: n * 1000 + 500,
            }));
        }
        v
    }

    fn flush(&self) {
        self.store.flush_now().expect("flush");
    }
}

fn npm() -> Value {
    json!({"command": "npm install left-pad@9.9.9"})
}

#[test]
fn workers_on_two_hosts_trip_the_group_detector_that_neither_sees_alone() {
    let server = RedisServer::start();
    let (a, b) = (Host::new(&server, false), Host::new(&server, false));
    // Host A: three workers run the failing install twice each (6 calls); host B: two workers
    // (4 calls). No session loops on its own (a shell command is flagged at its 3rd repeat), and
    // neither host reaches the group threshold of 10 alone.
    let mut n = 0;
    for _ in 0..2 {
        for w in ["a1", "a2", "a3"] {
            n += 1;
            assert!(a.install(w, n).is_allow(), "host A, {w}");
        }
        for w in ["b1", "b2"] {
            n += 1;
            assert!(b.install(w, n).is_allow(), "host B, {w}");
        }
    }
    // Before any flush, host B knows only its own 4 calls: a 5th worker's call is fine.
    assert!(b.install("b3", 20).is_allow(), "B alone: 5 calls");
    // After a flush each way, B's read-back holds both hosts' calls (11).
    a.flush();
    b.flush();
    let v = b.install("b4", 21);
    assert_eq!(v.action, Action::Warn, "{v:?}");
    assert_eq!(v.detector.as_deref(), Some("group_loop"));
    assert_eq!(v.count, 12);
    // Seven workers made the call; the store's worker count is a lower bound (B's newest
    // worker is not flushed yet).
    assert!(
        v.message.contains(
            "The whole swarm is stuck on this approach: 6 workers have made this bash call 12 times"
        ),
        "{}",
        v.message
    );
    // Host A answers from what it knows (a lower bound: its own 7 calls) until a flush of its
    // new record brings back the totals; then it tells its own workers too.
    assert!(a.install("a4", 22).is_allow());
    a.flush();
    let v = a.install("a5", 23);
    assert_eq!(v.detector.as_deref(), Some("group_loop"), "{v:?}");
    assert!(v.count >= 12, "{v:?}");
    let status = a.engine.store_status();
    assert_eq!(status.backend, Backend::Redis);
    assert_eq!(status.errors, 0);
    // The swarm completed: clearing on one host clears the shared counts.
    a.engine.clear_group("swarm");
    a.flush();
    b.flush();
    assert!(b.install("b5", 30).is_allow());
}

#[test]
fn a_killed_redis_leaves_the_engine_answering_and_fail_closed_refuses_group_calls() {
    let mut server = RedisServer::start();
    let open = Host::new(&server, false);
    // A fail-closed store is live only while its last sync is within the staleness bound: this
    // one syncs when told to, so its bound (500 ms) must cover the test's steps between syncs.
    let mut config = RedisConfig::new(server.url());
    config.background_flush = false;
    config.fail_closed = true;
    config.flush_interval = Duration::from_millis(250);
    let closed = Host::with(config);
    assert!(open.install("w1", 1).is_allow());
    closed.flush();
    assert!(closed.install("w2", 2).is_allow());
    open.flush();
    closed.flush();
    server.kill();
    assert!(open.store.flush_now().is_err());
    assert!(closed.store.flush_now().is_err());

    // Fail open (the default): verdicts keep coming from local state, and the session's own
    // detectors still work; the store says so in its status.
    assert!(open.install("w1", 3).is_allow());
    let third = open.install("w1", 4);
    assert_eq!(third.action, Action::Warn, "{third:?}");
    assert_eq!(third.detector.as_deref(), Some("exact_repeat"));
    let status = open.engine.store_status();
    assert!(!status.reachable);
    assert!(status.errors >= 1, "{status:?}");
    assert_eq!(status.availability, Availability::LocalOnly);

    // Fail closed: once Redis has been gone for longer than the staleness bound, calls of group
    // workers are refused; sessions outside a group are not affected.
    eventually(
        "the fail-closed store is stale for longer than its bound",
        || {
            closed.store.flush_now().is_err()
                && closed.engine.store_status().availability == Availability::Unavailable
        },
    );
    let refused = closed.install("w2", 5);
    assert_eq!(refused.action, Action::Block, "{refused:?}");
    assert_eq!(refused.detector.as_deref(), Some("group_store"));
    assert!(
        refused.message.contains("unreachable"),
        "{}",
        refused.message
    );
    let args = npm();
    let solo = closed.engine.observe(&Event::Call(Call {
        session: "solo",
        call_id: "s1",
        tool: "bash",
        arguments: Arguments::Json(&args),
        time_ms: 6000,
    }));
    assert!(solo.is_allow());

    // Redis is back: the store reconnects and group calls go through again.
    server.restart();
    closed.flush();
    assert_eq!(
        closed.engine.store_status().availability,
        Availability::Live
    );
    assert!(closed.install("w3", 7).is_allow());
}

#[test]
fn a_wrong_type_key_in_redis_does_not_multiply_counts_into_a_false_swarm_loop() {
    let server = RedisServer::start();
    let host = Host::new(&server, false);
    // Another program wrote a string where loopguard keeps the index of another group, whose
    // deltas travel in the same flushes.
    let mut con = server.connection();
    redis::cmd("SET")
        .arg("loopguard:{intruded}:i")
        .arg("not an index")
        .query::<()>(&mut con)
        .expect("SET");
    host.engine.join_group("x", "intruded", "x");
    // Four workers of the swarm run the failing install once each, flushes run again and again
    // in between: far from the group threshold of 10, and it must stay so.
    for (n, worker) in (1..).zip(["a1", "a2", "a3", "a4"]) {
        let v = host.install(worker, n);
        assert!(v.is_allow(), "{worker}: {v:?}");
        let args = npm();
        host.engine.observe(&Event::Call(Call {
            session: "x",
            call_id: &format!("x-{n}"),
            tool: "bash",
            arguments: Arguments::Json(&args),
            time_ms: n * 1000,
        }));
        for _ in 0..5 {
            let _ = host.store.flush_now();
        }
    }
    let v = host.install("a5", 5);
    assert!(v.is_allow(), "5 calls, not a swarm loop: {v:?}");
    let status = host.engine.store_status();
    assert_eq!(status.errors, 0, "{status:?}");
    assert!(status.wrong_type_skips >= 1, "{status:?}");
    let counts: Vec<String> = redis::cmd("KEYS")
        .arg("loopguard:{swarm}:c:*")
        .query(&mut con)
        .expect("KEYS");
    assert_eq!(counts.len(), 1, "{counts:?}");
    let total: u64 = redis::cmd("GET")
        .arg(&counts[0])
        .query(&mut con)
        .expect("GET");
    assert_eq!(total, 4, "four calls flushed, each once");
}

#[test]
fn a_frozen_redis_makes_fail_closed_refuse_during_the_freeze_and_allow_right_after() {
    let server = RedisServer::start();
    let mut config = RedisConfig::new(server.url());
    config.fail_closed = true;
    config.flush_interval = Duration::from_millis(100);
    let host = Host::with(config);
    let bound = host.store.config().staleness_bound();
    assert!(host.install("w1", 1).is_allow());
    eventually("the store is live", || {
        host.engine.store_status().availability == Availability::Live
    });

    server.pause();
    std::thread::sleep(bound + Duration::from_millis(20));
    let refused = host.install("w2", 2);
    assert_eq!(refused.action, Action::Block, "{refused:?}");
    assert_eq!(refused.detector.as_deref(), Some("group_store"));
    // Still refused while the freeze lasts, past the flush thread's one-second I/O timeout.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(host.install("w3", 3).action, Action::Block);

    server.resume();
    let thawed = std::time::Instant::now();
    eventually("the store is live again", || {
        host.engine.store_status().availability == Availability::Live
    });
    let recovered = thawed.elapsed();
    assert!(
        recovered <= bound + Duration::from_millis(300),
        "calls refused for {recovered:?} after Redis thawed"
    );
    assert!(host.install("w4", 4).is_allow());
}

// --- `loopctl simulate --group`, the real binary ------------------------------------------------

mod cli {
    use std::path::{Path, PathBuf};

    use loopguard_tests::{loopctl, root};
    use serde_json::Value;

    const WORKERS: [&str; 3] = [
        "examples/swarm-worker-1.jsonl",
        "examples/swarm-worker-2.jsonl",
        "examples/swarm-worker-3.jsonl",
    ];

    fn simulate(args: &[&str], files: &[PathBuf]) -> (Option<i32>, String, String) {
        let out = loopctl()
            .arg("simulate")
            .args(args)
            .args(files)
            .output()
            .expect("run loopctl");
        (
            out.status.code(),
            String::from_utf8(out.stdout).expect("utf-8"),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn records(stdout: &str) -> Vec<Value> {
        stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
            .collect()
    }

    fn workers() -> Vec<PathBuf> {
        WORKERS.iter().map(|w| root().join(w)).collect()
    }

    #[test]
    fn each_worker_alone_stays_quiet() {
        for file in workers() {
            let (code, out, err) = simulate(&["--json"], std::slice::from_ref(&file));
            assert_eq!(code, Some(0), "{}: {out}{err}", file.display());
            assert!(out.is_empty(), "{out}");
        }
        // Without --group, several files are still replayed each on its own engine.
        let (code, out, err) = simulate(&["--json"], &workers());
        assert_eq!(code, Some(0), "{out}{err}");
    }

    #[test]
    fn the_swarm_together_trips_the_group_detector_for_every_worker() {
        let (code, out, err) = simulate(&["--json", "--group", "swarm"], &workers());
        assert_eq!(code, Some(3), "{err}");
        let found = records(&out);
        assert_eq!(found.len(), 3, "{out}");
        for (i, r) in found.iter().enumerate() {
            let n = i + 1;
            assert_eq!(r["detector"], "group_loop", "{r}");
            assert_eq!(r["action"], "warn", "{r}");
            assert_eq!(r["rule"], "ladders.group[0]", "{r}");
            assert_eq!(r["group"], "swarm");
            assert_eq!(r["worker"], format!("swarm-worker-{n}"));
            assert_eq!(r["file"], format!("{}", root().join(WORKERS[i]).display()));
            assert_eq!(r["session"], "main");
            assert_eq!(r["count"], 9 + n, "{r}");
            assert_eq!(r["call"], 7, "each worker's own call number");
            assert_eq!(r["tool"], "bash");
            let message = r["message"].as_str().unwrap();
            assert!(
                message.starts_with("The whole swarm is stuck on this approach: 3 workers"),
                "{message}"
            );
        }
        // The human timeline names the worker of every line.
        let (code, out, _) = simulate(&["--group", "swarm"], &workers());
        assert_eq!(code, Some(3));
        assert!(
            out.contains("3 workers of group `swarm`, events merged by time"),
            "{out}"
        );
        assert!(
            out.contains("  swarm-worker-2  call   1  turn   1  line    6  bash "),
            "{out}"
        );
        assert!(
            out.contains(
                "! WARN  group_loop ×10  ladders.group[0]  (swarm-worker-1, event 15, line 19)"
            ),
            "{out}"
        );
        assert!(
            out.ends_with("3 interventions in 3 transcripts (group `swarm`)\n"),
            "{out}"
        );
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn events_merge_by_time_then_file_order() {
        let dir = tempfile::tempdir().unwrap();
        let policy = write(
            dir.path(),
            "swarm.yaml",
            "version: 1\ngroup: { threshold: 2, min_workers: 2 }\n",
        );
        let call = |id: &str, t: u32| {
            format!(
                r#"{{"type": "call", "id": "{id}", "tool": "deploy", "arguments": {{"env": "prod"}}, "time": {t}}}"#
            )
        };
        // Same name in two directories: the workers are named by their paths.
        let late = write(dir.path(), "b/worker.jsonl", &call("b1", 5));
        let early = write(
            dir.path(),
            "a/worker.jsonl",
            &format!("{}\n", call("a1", 5)),
        );
        let rules = policy.to_str().unwrap();
        // Equal times: file order decides, so the second file's call is the swarm's second.
        let (code, out, err) = simulate(
            &["--json", "--rules", rules, "--group", "g"],
            &[late.clone(), early.clone()],
        );
        assert_eq!(code, Some(3), "{err}");
        let found = records(&out);
        assert_eq!(found.len(), 1, "{out}");
        assert_eq!(found[0]["worker"], early.display().to_string());
        // An earlier time goes first whatever the file order.
        let earlier = write(dir.path(), "c/first.jsonl", &call("c1", 1));
        let (_, out, _) = simulate(
            &["--json", "--rules", rules, "--group", "g"],
            &[late.clone(), earlier],
        );
        let found = records(&out);
        assert_eq!(found[0]["worker"], "worker", "{out}");
    }

    #[test]
    fn a_bad_transcript_stops_a_group_replay() {
        let dir = tempfile::tempdir().unwrap();
        let bad = write(dir.path(), "bad.jsonl", "{\"type\": \"call\", \"id\": 1}\n");
        let mut files = workers();
        files.push(bad.clone());
        let (code, out, err) = simulate(&["--json", "--group", "swarm"], &files);
        assert_eq!(code, Some(1), "{out}");
        assert!(out.is_empty(), "nothing is replayed: {out}");
        assert!(err.contains(&bad.display().to_string()), "{err}");
        files.pop();
        files.push(dir.path().join("missing.jsonl"));
        let (code, _, err) = simulate(&["--group", "swarm"], &files);
        assert_eq!(code, Some(2), "{err}");
    }
}
