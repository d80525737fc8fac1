//! A driver for instruction-count profiles of the hot path: warms a session as the `observe`
//! bench does, then observes ten rounds of `N` events of one kind (for the result kinds, each
//! result answers a call made just before it, as in the bench).
//!
//! Run (counting only `Engine::observe`; divide by `10 N + 256` events, the warm-up included):
//! `valgrind --tool=callgrind --toggle-collect='*Engine::observe*'
//! target/release/examples/hot_path raw-call 1000`
//! (kinds: `json-call`, `raw-call`, `result-1k`, `result-64k`, and `result-mixed-1k`,
//! `result-mixed-64k` for outputs of source, prose and listings rather than a build log, and
//! `result-file=PATH` for the text of a file as every result). Without valgrind it prints the
//! fastest and the median round's time per event (for the result kinds, of the results only):
//! a quick before/after check on a busy machine, where the fastest round is the least disturbed.

use std::hint::black_box;
use std::time::{Duration, Instant};

use loopguard_benches::{big_output, default_engine, distinct_calls, mixed_output};
use loopguard_engine::{Arguments, Call, Event, ToolResult};

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "raw-call".to_owned());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let engine = default_engine();
    let calls = distinct_calls(64);
    let texts: Vec<String> = calls.iter().map(|(_, a)| a.to_string()).collect();
    let ids: Vec<String> = (0..calls.len()).map(|i| format!("call_{i}")).collect();
    let output = match kind.as_str() {
        "result-1k" => big_output(1024),
        "result-64k" => big_output(64 * 1024),
        "result-mixed-1k" => mixed_output(1024),
        "result-mixed-64k" => mixed_output(64 * 1024),
        k => match k.strip_prefix("result-file=") {
            Some(path) => std::fs::read_to_string(path).unwrap_or_else(|e| {
                eprintln!("hot_path: cannot read {path}: {e}");
                std::process::exit(2)
            }),
            None => String::new(),
        },
    };
    let raw = kind == "raw-call";
    let results = kind.starts_with("result");
    let mut t = 0u64;
    // One call, and its result if the kind has results; returns the time the result took.
    let mut step = |i: usize| {
        let k = i % calls.len();
        t += 1000;
        let call = engine.observe(&Event::Call(Call {
            session: "bench",
            call_id: &ids[k],
            tool: &calls[k].0,
            arguments: if raw {
                Arguments::Raw(&texts[k])
            } else {
                Arguments::Json(&calls[k].1)
            },
            time_ms: t,
        }));
        black_box(call);
        let mut took = Duration::ZERO;
        if results {
            let start = Instant::now();
            black_box(engine.observe(&Event::Result(ToolResult {
                session: "bench",
                call_id: &ids[k],
                output: &output,
                is_error: false,
                exit_code: Some(0),
                time_ms: t + 10,
            })));
            took = start.elapsed();
        }
        took
    };
    for i in 0..4 * calls.len() {
        step(i);
    }
    let mut rounds = Vec::new();
    for _ in 0..10 {
        let start = Instant::now();
        let mut timed = Duration::ZERO;
        for i in 0..n {
            timed += step(i);
        }
        let total = if results { timed } else { start.elapsed() };
        rounds.push(total.as_secs_f64() * 1e9 / n.max(1) as f64);
    }
    rounds.sort_by(f64::total_cmp);
    println!(
        "{kind}: fastest {:.0} ns, median {:.0} ns per event",
        rounds[0],
        rounds[rounds.len() / 2]
    );
}
