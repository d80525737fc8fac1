//! A driver for instruction-count profiles of the proxy's request path: `N` turns of the proxy
//! bench's agent sessions (a 20-message history ending in a tool result, a new file read every
//! turn), each request body read, judged and made ready for the upstream as a served request is,
//! in process and with no network (`loopguard_proxy::fuzzing::request`).
//!
//! Run: `valgrind --tool=callgrind --toggle-collect='*proxy_request::measured*'
//! target/release/examples/proxy_request 1000` and divide by `N`. Without valgrind it prints the
//! time per request.

use std::hint::black_box;
use std::time::Instant;

use loopguard_proxy::wire::Wire;
use serde_json::{Value, json};

/// A name made of the letters g..z (no digits or hex for the masks to take).
fn word(mut n: u64) -> String {
    let mut w = String::new();
    loop {
        w.push(char::from(b'g' + (n % 20) as u8));
        n /= 20;
        if n == 0 {
            return w;
        }
    }
}

fn call(n: u64) -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [{
        "id": format!("call_{n}"), "type": "function", "function": {
            "name": "read_file",
            "arguments": json!({"path": format!("src/{}/handlers.rs", word(n))}).to_string(),
    }}]})
}

fn result(n: u64) -> Value {
    let w = word(n);
    let body: String = (0..12)
        .map(|k| format!("    let {w}_{} = {w}::load(&ctx)?;\n", word(k)))
        .collect();
    json!({"role": "tool", "tool_call_id": format!("call_{n}"),
        "content": format!("pub fn {w}(ctx: &Context) -> Result<()> {{\n{body}    Ok(())\n}}\n")})
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    // Eight sessions taking turns, as the bench's clients do.
    let sessions: Vec<Vec<Value>> = (0..8)
        .map(|s| {
            let mut m = vec![
                json!({"role": "system", "content": "You are a coding agent. Use the tools to read, edit and test the code. Keep going until the task is done."}),
                json!({"role": "user", "content": format!("Find where request handlers load their context (session {s}).")}),
            ];
            for k in 1..=9 {
                m.push(call(k));
                m.push(result(k));
            }
            m
        })
        .collect();
    let mut sessions: Vec<(Vec<Value>, u64)> = sessions.into_iter().map(|m| (m, 9)).collect();
    // The first request builds the proxy's state (the policy compiled, its regexes built).
    if let Some((m, _)) = sessions.first() {
        let body =
            serde_json::to_vec(&json!({"model": "bench", "messages": m})).unwrap_or_default();
        loopguard_proxy::fuzzing::request(Wire::Chat, &body);
    }
    let start = Instant::now();
    let bytes = turns(&mut sessions, n);
    println!(
        "{:.1} µs per request of {} bytes on average (body building included)",
        start.elapsed().as_secs_f64() * 1e6 / n as f64,
        bytes / n.max(1) as usize
    );
}

/// `n` turns of the sessions, one after another; returns the bytes of the bodies.
#[inline(never)]
fn turns(sessions: &mut [(Vec<Value>, u64)], n: u64) -> usize {
    let mut bytes = 0;
    for i in 0..n {
        let (messages, last) = &mut sessions[(i % 8) as usize];
        let body =
            serde_json::to_vec(&json!({"model": "bench", "stream": false, "messages": messages}))
                .unwrap_or_default();
        bytes += body.len();
        measured(&body);
        *last += 1;
        messages.push(call(*last));
        messages.push(result(*last));
        messages.drain(2..4);
    }
    bytes
}

/// One request (what the profile counts).
#[inline(never)]
fn measured(body: &[u8]) {
    loopguard_proxy::fuzzing::request(Wire::Chat, black_box(body));
}
