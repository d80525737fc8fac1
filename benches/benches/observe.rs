//! The engine's hot path, measured.
//!
//! Run: `cargo bench -p loopguard-benches --bench observe`
//!
//! The Redis figure needs `redis-server` on the PATH (the bench starts its own on a free
//! loopback port); without it that one benchmark is skipped with a message.

#![allow(clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use loopguard_benches::{
    args_len, big_output, default_engine, distinct_calls, mixed_output, replay,
    synthetic_transcript,
};
use loopguard_engine::store::{RedisConfig, RedisStore};
use loopguard_engine::{Arguments, Call, Engine, Event, Settings, Text, ToolResult};

fn call_event(c: &mut Criterion) {
    let calls = distinct_calls(64);
    let mean_len: usize = calls.iter().map(|(_, a)| args_len(a)).sum::<usize>() / calls.len();
    assert!(
        (150..=260).contains(&mean_len),
        "arguments are ~200 bytes, got {mean_len}"
    );
    let texts: Vec<String> = calls.iter().map(|(_, a)| a.to_string()).collect();
    let ids: Vec<String> = (0..calls.len()).map(|i| format!("call_{i}")).collect();
    // Parsed arguments (a host holding `serde_json::Value`s) and the same arguments as the
    // model's raw text (what the proxy and most hosts hold).
    for raw in [false, true] {
        let engine = default_engine();
        let args = |i: usize| {
            if raw {
                Arguments::Raw(&texts[i])
            } else {
                Arguments::Json(&calls[i].1)
            }
        };
        // Warm the session so the window is full: steady state.
        let mut t = 0u64;
        for _ in 0..4 {
            for (i, (tool, _)) in calls.iter().enumerate() {
                t += 1000;
                engine.observe(&Event::Call(Call {
                    session: "bench",
                    call_id: &ids[i],
                    tool,
                    arguments: args(i),
                    time_ms: t,
                }));
            }
        }
        let mut i = 0usize;
        let name = if raw {
            "observe/call_event_default_policy_200B_raw_args"
        } else {
            "observe/call_event_default_policy_200B_args"
        };
        c.bench_function(name, |b| {
            b.iter(|| {
                let k = i % calls.len();
                t += 1000;
                let v = engine.observe(&Event::Call(Call {
                    session: "bench",
                    call_id: &ids[k],
                    tool: &calls[k].0,
                    arguments: args(k),
                    time_ms: t,
                }));
                i += 1;
                black_box(v)
            })
        });
    }
}

fn result_event(c: &mut Criterion) {
    let calls = distinct_calls(64);
    let mut group = c.benchmark_group("observe");
    // The build log (every line four masks), then a mix of source, prose and listings.
    for (size, name, make) in [
        (
            1024,
            "result_event_1KiB_output",
            big_output as fn(usize) -> String,
        ),
        (64 * 1024, "result_event_64KiB_output", big_output),
        (64 * 1024, "result_event_64KiB_mixed_output", mixed_output),
    ] {
        let engine = default_engine();
        let output = make(size);
        group.throughput(Throughput::Bytes(output.len() as u64));
        let ids: Vec<String> = (0..calls.len()).map(|k| format!("r{k}")).collect();
        let mut i = 0usize;
        let mut t = 0u64;
        // Each result answers the call made just before it, as in a real loop, so it always finds
        // its call in the window and the whole output is masked and hashed. Only the result is
        // timed (one `Instant` pair per event, ~25 ns of the figure).
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (tool, args) = &calls[i % calls.len()];
                    let id = &ids[i % ids.len()];
                    t += 1000;
                    engine.observe(&Event::Call(Call {
                        session: "bench",
                        call_id: id,
                        tool,
                        arguments: Arguments::Json(args),
                        time_ms: t,
                    }));
                    i += 1;
                    let start = Instant::now();
                    black_box(engine.observe(&Event::Result(ToolResult {
                        session: "bench",
                        call_id: id,
                        output: &output,
                        is_error: false,
                        exit_code: Some(0),
                        time_ms: t + 10,
                    })));
                    total += start.elapsed();
                }
                total
            })
        });
    }
    group.finish();
}

fn text_chunk(c: &mut Criterion) {
    let engine = default_engine();
    let chunks: Vec<String> = (0..256)
        .map(|i| format!("Looking at module {i}, the handler validates the request and then calls the store. "))
        .collect();
    let mut i = 0usize;
    let mut t = 0u64;
    c.bench_function("observe/streamed_text_chunk", |b| {
        b.iter(|| {
            t += 10;
            let end = i % 64 == 63;
            let v = engine.observe(&Event::Text(Text {
                session: "bench",
                text: &chunks[i % chunks.len()],
                chunk: true,
                end_of_turn: end,
                reasoning: false,
                narration: false,
                time_ms: t,
            }));
            i += 1;
            black_box(v)
        })
    });
}

fn simulate_throughput(c: &mut Criterion) {
    let events = synthetic_transcript(100_000);
    let mut group = c.benchmark_group("simulate");
    group.sample_size(10);
    group.throughput(Throughput::Elements(events.len() as u64));
    // A fresh engine per replay, built (and dropped) outside the timed part.
    group.bench_function("replay_100k_events", |b| {
        b.iter_batched_ref(
            default_engine,
            |engine| black_box(replay(engine, &events)),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

/// Call events of a warmed-up session, cycling through 64 distinct ~200-byte calls.
fn bench_calls(c: &mut Criterion, name: &str, engine: &Engine, session: &str) {
    let calls = distinct_calls(64);
    let ids: Vec<String> = (0..calls.len()).map(|i| format!("call_{i}")).collect();
    let mut t = 0u64;
    let mut i = 0usize;
    let mut next = |engine: &Engine| {
        let (tool, args) = &calls[i % calls.len()];
        t += 1000;
        let v = engine.observe(&Event::Call(Call {
            session,
            call_id: &ids[i % calls.len()],
            tool,
            arguments: Arguments::Json(args),
            time_ms: t,
        }));
        i += 1;
        v
    };
    for _ in 0..4 * calls.len() {
        next(engine);
    }
    c.bench_function(name, |b| b.iter(|| black_box(next(engine))));
}

/// A session whose settings turn detection off: the event is looked up and allowed.
fn disabled_session(c: &mut Criterion) {
    let engine = default_engine();
    let off = Settings {
        enabled: Some(false),
        ..Settings::default()
    };
    engine.set_session_settings("bench", off);
    bench_calls(c, "observe/call_event_disabled_session", &engine, "bench");
}

/// A worker of a group: every call is also counted in the in-memory group store (one worker,
/// so the group detector never fires: the figure is the cost of counting).
fn group_memory_store(c: &mut Criterion) {
    let engine = default_engine();
    engine.join_group("bench", "swarm", "worker-1");
    bench_calls(c, "observe/call_event_group_memory_store", &engine, "bench");
}

/// The same with the counters in Redis: recording stays in process, a background thread
/// exchanges deltas with the server every 200 ms.
fn group_redis_store(c: &mut Criterion) {
    let Some(server) = RedisServer::start() else {
        eprintln!(
            "observe/call_event_group_redis_store skipped: redis-server could not be started"
        );
        return;
    };
    let store = RedisStore::connect(RedisConfig::new(server.url())).expect("valid config");
    let policy = loopguard_rules::Policy::builtin_default()
        .policy
        .expect("the embedded default policy is valid");
    let engine = Engine::builder(&policy)
        .store(std::sync::Arc::new(store))
        .build()
        .expect("the default policy names no plugins");
    engine.join_group("bench", "swarm", "worker-1");
    bench_calls(c, "observe/call_event_group_redis_store", &engine, "bench");
    let status = engine.store_status();
    assert!(
        status.reachable && status.errors == 0,
        "Redis was not reachable during the bench: {status:?}"
    );
}

/// A `redis-server` on a free loopback port, without persistence, killed when dropped.
struct RedisServer {
    port: u16,
    child: std::process::Child,
}

impl RedisServer {
    fn start() -> Option<RedisServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .ok()?
            .port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let server = RedisServer { port, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(server)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

criterion_group!(
    benches,
    call_event,
    result_event,
    text_chunk,
    simulate_throughput,
    disabled_session,
    group_memory_store,
    group_redis_store
);
criterion_main!(benches);
