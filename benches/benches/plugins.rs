//! What detector plugins cost per event, through the engine (default policy, every built-in
//! detector on, a warm session): no plugin as the baseline, the no-op plugin (the cost of the
//! boundary itself: building the view, the serialized call, the window copy), the similarity
//! plugin on ~200-byte and 4 KiB arguments, and the results plugin on 64 KiB outputs.
//!
//! Run: `cargo bench -p loopguard-benches --bench plugins`
//!
//! The plugins are built first (release profile, the one benches use) with the same cargo.

#![allow(clippy::expect_used, clippy::panic)] // benchmark setup: a broken setup should stop the run

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use loopguard_benches::{args_len, big_output, distinct_calls};
use loopguard_engine::plugins::host::PluginHost;
use loopguard_engine::{Arguments, Call, Engine, Event, LoadedPlugin, ToolResult};
use serde_json::{Value, json};

const NOOP: &str = "loopguard-plugin-noop";
const SIMILARITY: &str = "loopguard-plugin-similarity";
const RESULTS: &str = "loopguard-plugin-results";

/// Builds the plugins with the bench's own profile; returns where their libraries are.
fn built_plugins() -> PathBuf {
    loopguard_tests::build(&[NOOP, SIMILARITY, RESULTS], !cfg!(debug_assertions))
}

/// The default policy's engine running the given plugins (default configuration).
fn engine(dir: &Path, packages: &[&str]) -> Engine {
    let policy = loopguard_rules::Policy::builtin_default()
        .policy
        .expect("the embedded default policy is valid");
    let plugins = packages
        .iter()
        .map(|p| {
            let file = format!(
                "{}{}{}",
                std::env::consts::DLL_PREFIX,
                p.replace('-', "_"),
                std::env::consts::DLL_SUFFIX
            );
            let plugin = PluginHost::load(&dir.join(file), &Value::Null)
                .unwrap_or_else(|e| panic!("loading {p}: {e}"));
            LoadedPlugin::new(plugin)
        })
        .collect();
    Engine::builder(&policy)
        .plugins(plugins)
        .build()
        .expect("plugins given")
}

/// Pseudo-random lowercase words: unrelated texts for different seeds.
fn words(seed: u64, bytes: usize) -> String {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = String::with_capacity(bytes + 16);
    while out.len() < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = 2 + (x % 8) as usize;
        for k in 0..len {
            out.push(char::from(b'a' + ((x >> (5 * k)) % 26) as u8));
        }
        out.push(if x.is_multiple_of(11) { '\n' } else { ' ' });
    }
    out.truncate(bytes);
    out
}

/// Text of about `bytes` bytes drawn from one of 64 disjoint blocks of CJK characters: texts of
/// different seeds share no character, so no two calls look alike to any string metric.
fn block_text(seed: u64, bytes: usize) -> String {
    let base = 0x4e00 + (seed % 64) as u32 * 64;
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = String::with_capacity(bytes + 4);
    while out.len() + 3 <= bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(char::from_u32(base + (x % 64) as u32).unwrap_or('?'));
    }
    out
}

/// 64 distinct calls with ~4 KiB of arguments each (a file write), unlike one another.
fn big_calls() -> Vec<(String, Value)> {
    (0..64)
        .map(|i| {
            let args = json!({
                "path": block_text(i + 1, 30),
                "content": block_text(i + 1, 4000),
            });
            ("write_file".to_owned(), args)
        })
        .collect()
}

/// Measures one call event in steady state (the session's window full of other calls).
fn bench_calls(
    c: &mut Criterion,
    name: &str,
    engine: &Engine,
    calls: &[(String, Value)],
    raw: bool,
) {
    let texts: Vec<String> = calls.iter().map(|(_, a)| a.to_string()).collect();
    let ids: Vec<String> = (0..calls.len()).map(|i| format!("call_{i}")).collect();
    let mut t = 0u64;
    let mut i = 0usize;
    let observe = |i: usize, t: u64| {
        let k = i % calls.len();
        let arguments = if raw {
            Arguments::Raw(&texts[k])
        } else {
            Arguments::Json(&calls[k].1)
        };
        engine.observe(&Event::Call(Call {
            session: "bench",
            call_id: &ids[k],
            tool: &calls[k].0,
            arguments,
            time_ms: t,
        }))
    };
    let mut flagged = 0;
    for _ in 0..4 * calls.len() {
        t += 1000;
        flagged += usize::from(!observe(i, t).is_allow());
        i += 1;
    }
    assert_eq!(flagged, 0, "{name}: the warm-up calls must not loop");
    c.bench_function(name, |b| {
        b.iter(|| {
            t += 1000;
            let v = observe(i, t);
            i += 1;
            black_box(v)
        })
    });
}

fn call_events(c: &mut Criterion) {
    let dir = built_plugins();
    let calls = distinct_calls(64);
    let mean: usize = calls.iter().map(|(_, a)| args_len(a)).sum::<usize>() / calls.len();
    assert!(
        (150..=260).contains(&mean),
        "~200-byte arguments, got {mean}"
    );
    let big = big_calls();
    let big_mean: usize = big.iter().map(|(_, a)| args_len(a)).sum::<usize>() / big.len();
    assert!(
        (4000..=4300).contains(&big_mean),
        "~4 KiB arguments, got {big_mean}"
    );

    bench_calls(
        c,
        "plugins/call_200B/none",
        &engine(&dir, &[]),
        &calls,
        false,
    );
    bench_calls(
        c,
        "plugins/call_200B/noop",
        &engine(&dir, &[NOOP]),
        &calls,
        false,
    );
    bench_calls(
        c,
        "plugins/call_200B_raw_args/none",
        &engine(&dir, &[]),
        &calls,
        true,
    );
    bench_calls(
        c,
        "plugins/call_200B_raw_args/noop",
        &engine(&dir, &[NOOP]),
        &calls,
        true,
    );
    bench_calls(
        c,
        "plugins/call_200B/similarity",
        &engine(&dir, &[SIMILARITY]),
        &calls,
        false,
    );
    bench_calls(c, "plugins/call_4KiB/none", &engine(&dir, &[]), &big, false);
    bench_calls(
        c,
        "plugins/call_4KiB/similarity",
        &engine(&dir, &[SIMILARITY]),
        &big,
        false,
    );
}

/// Measures a result event answering a fresh call; outputs differ from one another.
fn bench_results(c: &mut Criterion, name: &str, engine: &Engine, outputs: &[String]) {
    let calls = distinct_calls(64);
    let mut group = c.benchmark_group("plugins");
    group.throughput(Throughput::Bytes(outputs[0].len() as u64));
    let mut i = 0usize;
    let mut t = 0u64;
    let mut flagged = 0usize;
    let mut setup = || {
        let (tool, args) = &calls[i % calls.len()];
        let id = format!("r{i}");
        t += 1000;
        engine.observe(&Event::Call(Call {
            session: "bench",
            call_id: &id,
            tool,
            arguments: Arguments::Json(args),
            time_ms: t,
        }));
        i += 1;
        (id, t, i % outputs.len())
    };
    let result = |(id, t, k): (String, u64, usize)| {
        engine.observe(&Event::Result(ToolResult {
            session: "bench",
            call_id: &id,
            output: &outputs[k],
            is_error: false,
            exit_code: None,
            time_ms: t + 500,
        }))
    };
    for _ in 0..2 * calls.len() {
        let input = setup();
        flagged += usize::from(!result(input).is_allow());
    }
    assert_eq!(flagged, 0, "{name}: the warm-up results must not loop");
    // One call, then its result: with larger batches the calls of a batch push one another out
    // of the window before their results arrive, and those results are not even looked at.
    group.bench_function(name, |b| {
        b.iter_batched(
            &mut setup,
            |input| black_box(result(input)),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn result_events(c: &mut Criterion) {
    let dir = built_plugins();
    // Build logs (timestamps, pids, counters: noise both sides mask) whose verb differs from one
    // output to the next, so that no two look alike to the results plugin either.
    let outputs: Vec<String> = (0..16)
        .map(|v| {
            let verb = format!(
                "{}ing",
                words(1000 + v, 40).split_whitespace().next().unwrap_or("x")
            );
            let mut out = big_output(64 * 1024 + 1024).replace("compiling", &verb);
            out.truncate(64 * 1024);
            out
        })
        .collect();
    bench_results(c, "result_64KiB/none", &engine(&dir, &[]), &outputs);
    bench_results(c, "result_64KiB/noop", &engine(&dir, &[NOOP]), &outputs);
    bench_results(
        c,
        "result_64KiB/results",
        &engine(&dir, &[RESULTS]),
        &outputs,
    );
}

criterion_group!(benches, call_events, result_events);
criterion_main!(benches);
