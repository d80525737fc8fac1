//! The engine's hot path, measured.
//!
//! Run: `cargo bench -p loopguard-benches --bench observe`

#![allow(clippy::expect_used)]

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use loopguard_benches::{
    args_len, big_output, default_engine, distinct_calls, replay, synthetic_transcript,
};
use loopguard_engine::{Arguments, Call, Event, Text, ToolResult};

fn call_event(c: &mut Criterion) {
    let engine = default_engine();
    let calls = distinct_calls(64);
    let mean_len: usize = calls.iter().map(|(_, a)| args_len(a)).sum::<usize>() / calls.len();
    assert!(
        (150..=260).contains(&mean_len),
        "arguments are ~200 bytes, got {mean_len}"
    );
    let ids: Vec<String> = (0..calls.len()).map(|i| format!("call_{i}")).collect();
    // Warm the session so the window is full: steady state.
    let mut t = 0u64;
    for _ in 0..4 {
        for (i, (tool, args)) in calls.iter().enumerate() {
            t += 1000;
            engine.observe(&Event::Call(Call {
                session: "bench",
                call_id: &ids[i],
                tool,
                arguments: Arguments::Json(args),
                time_ms: t,
            }));
        }
    }
    let mut i = 0usize;
    c.bench_function("observe/call_event_default_policy_200B_args", |b| {
        b.iter(|| {
            let (tool, args) = &calls[i % calls.len()];
            t += 1000;
            let v = engine.observe(&Event::Call(Call {
                session: "bench",
                call_id: &ids[i % calls.len()],
                tool,
                arguments: Arguments::Json(args),
                time_ms: t,
            }));
            i += 1;
            black_box(v)
        })
    });
}

fn result_event(c: &mut Criterion) {
    let engine = default_engine();
    let output = big_output(64 * 1024);
    let calls = distinct_calls(64);
    let mut group = c.benchmark_group("observe");
    group.throughput(Throughput::Bytes(output.len() as u64));
    let mut i = 0usize;
    let mut t = 0u64;
    group.bench_function("result_event_64KiB_output", |b| {
        b.iter_batched(
            || {
                // Each result answers a fresh call, as in a real loop.
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
                (id, t)
            },
            |(id, t)| {
                black_box(engine.observe(&Event::Result(ToolResult {
                    session: "bench",
                    call_id: &id,
                    output: &output,
                    is_error: false,
                    exit_code: Some(0),
                    time_ms: t + 10,
                })))
            },
            BatchSize::SmallInput,
        )
    });
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
    group.bench_function("replay_100k_events", |b| {
        b.iter(|| {
            let engine = default_engine();
            black_box(replay(&engine, &events))
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    call_event,
    result_event,
    text_chunk,
    simulate_throughput
);
criterion_main!(benches);
