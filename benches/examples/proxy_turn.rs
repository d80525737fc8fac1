//! A driver for instruction-count profiles of the proxy's own work on a turn: the proxy
//! bench's agent sessions (a 20-message history ending in a tool result, a new file read every
//! turn), each request body read and judged and the model's answer (one tool call) judged and
//! rewritten as a served request's are, in process and with no network
//! (`loopguard_proxy::fuzzing::exchange`). Kinds: `request` (the request only), `plain` (the
//! answer as JSON), `stream` (the answer as SSE, its arguments in 8-byte fragments, fed to the
//! proxy event by event).
//!
//! Run: `valgrind --tool=callgrind --toggle-collect='*proxy_turn::measured*'
//! target/release/examples/proxy_turn stream 1000` and divide by `N`. Without valgrind it
//! prints the time per turn.

use std::hint::black_box;
use std::time::Instant;

use loopguard_benches::agent::{call, completion, opening, result, stream as sse_events};
use loopguard_proxy::wire::Wire;
use serde_json::{Value, json};

/// The model's answer with call `n`: a completion, or its SSE events.
fn answer(n: u64, stream: bool) -> Vec<Vec<u8>> {
    let call = call(n);
    if stream {
        sse_events(&call)
            .into_iter()
            .map(String::into_bytes)
            .collect()
    } else {
        vec![completion(&call).to_string().into_bytes()]
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "stream".to_owned());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000);
    // Eight sessions taking turns, as the bench's clients do.
    let mut sessions: Vec<(Vec<Value>, u64)> = (0..8)
        .map(|s| {
            let mut m = opening(&format!("session {s}"));
            for k in 1..=9 {
                m.push(json!({"role": "assistant", "content": null, "tool_calls": [call(k)]}));
                m.push(result(k));
            }
            (m, 9)
        })
        .collect();
    // The first turn builds the proxy's state (the policy compiled, its regexes built).
    if let Some((m, _)) = sessions.first() {
        let body =
            serde_json::to_vec(&json!({"model": "bench", "messages": m})).unwrap_or_default();
        loopguard_proxy::fuzzing::request(Wire::Chat, &body);
    }
    let start = Instant::now();
    let bytes = turns(&mut sessions, n, &kind);
    println!(
        "{:.1} µs per {kind} turn, {} bytes out on average (bodies built in the loop)",
        start.elapsed().as_secs_f64() * 1e6 / n as f64,
        bytes / n.max(1) as usize
    );
}

/// `n` turns of the sessions, one after another; returns the bytes the client would get.
#[inline(never)]
fn turns(sessions: &mut [(Vec<Value>, u64)], n: u64, kind: &str) -> usize {
    let mut bytes = 0;
    let stream = kind == "stream";
    for i in 0..n {
        let (messages, last) = &mut sessions[(i % 8) as usize];
        let body =
            serde_json::to_vec(&json!({"model": "bench", "stream": stream, "messages": messages}))
                .unwrap_or_default();
        let answer = if kind == "request" {
            Vec::new()
        } else {
            answer(*last + 1, stream)
        };
        bytes += measured(&body, &answer, stream);
        *last += 1;
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call(*last)]}));
        messages.push(result(*last));
        messages.drain(2..4);
    }
    bytes
}

/// One turn (what the profile counts): the request alone when there is no answer.
#[inline(never)]
fn measured(body: &[u8], answer: &[Vec<u8>], stream: bool) -> usize {
    if answer.is_empty() {
        loopguard_proxy::fuzzing::request(Wire::Chat, black_box(body));
        return 0;
    }
    loopguard_proxy::fuzzing::exchange(Wire::Chat, black_box(body), answer, stream).len()
}
