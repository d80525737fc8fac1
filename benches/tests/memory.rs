#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code

//! Allocation and memory targets, counted exactly by `allocation-counter`'s global allocator:
//! no allocation per call event in steady state, and the state a session keeps.
//!
//! Run: `cargo test -p loopguard-benches --test memory -- --nocapture`

use loopguard_benches::{big_output, default_engine, distinct_calls};
use loopguard_engine::{Arguments, Call, Event, ToolResult};

/// Both checks run in one test: the counters are process-wide and tests run on threads.
#[test]
fn steady_state_allocations_and_session_memory() {
    let engine = default_engine();
    let calls = distinct_calls(64);
    let ids: Vec<String> = (0..calls.len()).map(|i| format!("call_{i}")).collect();
    // The same arguments as raw text too (what a proxy holds), some with escapes.
    let texts: Vec<String> = calls
        .iter()
        .enumerate()
        .map(|(i, (_, a))| {
            let mut a = a.clone();
            if i % 2 == 0 {
                a["pattern"] = format!("fn \"quoted\"\n\tvalidate_{i}").into();
            }
            a.to_string()
        })
        .collect();
    // Short outputs, and build logs of 1 KiB and 64 KiB.
    let outputs: Vec<String> = (0..calls.len())
        .map(|i| match i % 8 {
            3 => big_output(1024),
            7 => big_output(64 * 1024),
            _ => format!("ok: {i} lines\n"),
        })
        .collect();
    let mut t = 0u64;
    let mut feed = |session: &str, rounds: usize, with_results: bool| {
        for _ in 0..rounds {
            for (i, (tool, args)) in calls.iter().enumerate() {
                t += 1000;
                engine.observe(&Event::Call(Call {
                    session,
                    call_id: &ids[i],
                    tool,
                    arguments: if i % 2 == 0 {
                        Arguments::Raw(&texts[i])
                    } else {
                        Arguments::Json(args)
                    },
                    time_ms: t,
                }));
                if with_results {
                    engine.observe(&Event::Result(ToolResult {
                        session,
                        call_id: &ids[i],
                        output: &outputs[i],
                        is_error: false,
                        exit_code: Some(0),
                        time_ms: t + 1,
                    }));
                }
            }
        }
    };

    // Warm up, then count allocations over many steady-state events.
    feed("steady", 4, true);
    let allocs = allocation_counter::measure(|| feed("steady", 10, true)).count_total;
    let events = 10 * calls.len() * 2;
    println!("steady state: {allocs} allocations over {events} call+result events");
    assert_eq!(
        allocs, 0,
        "call and result events (raw or parsed arguments, outputs up to 64 KiB) allocate \
         nothing in steady state"
    );

    // State kept per session after a full default window of calls and results, averaged over
    // many sessions so the engine's session table growth is counted at its amortized share.
    const SESSIONS: usize = 256;
    let names: Vec<String> = (0..SESSIONS).map(|i| format!("measured-{i}")).collect();
    let total = allocation_counter::measure(|| {
        for name in &names {
            feed(name, 1, true);
        }
    })
    .bytes_current;
    let per_session = total / SESSIONS as i64;
    println!("per session after a full window (64 calls + results): {per_session} bytes");
    assert!(
        per_session <= 1536,
        "a session keeps at most 1.5 KiB, kept {per_session} bytes"
    );
}
