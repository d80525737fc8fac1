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

fn tool_call(n: u64) -> Value {
    json!({"id": format!("call_{n}"), "type": "function", "function": {
        "name": "read_file",
        "arguments": json!({"path": format!("src/{}/handlers.rs", word(n))}).to_string(),
    }})
}

fn result(n: u64) -> Value {
    let w = word(n);
    let body: String = (0..12)
        .map(|k| format!("    let {w}_{} = {w}::load(&ctx)?;\n", word(k)))
        .collect();
    json!({"role": "tool", "tool_call_id": format!("call_{n}"),
        "content": format!("pub fn {w}(ctx: &Context) -> Result<()> {{\n{body}    Ok(())\n}}\n")})
}

/// The model's answer with call `n`: a completion, or its SSE events.
fn answer(n: u64, stream: bool) -> Vec<Vec<u8>> {
    let call = tool_call(n);
    if !stream {
        return vec![
            json!({
                "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "bench",
                "choices": [{"index": 0, "finish_reason": "tool_calls",
                    "message": {"role": "assistant", "content": null, "tool_calls": [call]}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            })
            .to_string()
            .into_bytes(),
        ];
    }
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
                "model": "bench", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
        .into_bytes()
    };
    let args = call["function"]["arguments"].as_str().unwrap_or_default();
    let mut out = vec![
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"content": "Reading the next handler."}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                "function": {"name": "read_file", "arguments": ""}}]}),
            Value::Null,
        ),
    ];
    for piece in args.as_bytes().chunks(8) {
        out.push(chunk(
            json!({"tool_calls": [{"index": 0, "function":
                {"arguments": String::from_utf8_lossy(piece)}}]}),
            Value::Null,
        ));
    }
    out.push(chunk(json!({}), json!("tool_calls")));
    out.push(b"data: [DONE]\n\n".to_vec());
    out
}

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "stream".to_owned());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000);
    // Eight sessions taking turns, as the bench's clients do.
    let mut sessions: Vec<(Vec<Value>, u64)> = (0..8)
        .map(|s| {
            let mut m = vec![
                json!({"role": "system", "content": "You are a coding agent. Use the tools to read, edit and test the code. Keep going until the task is done."}),
                json!({"role": "user", "content": format!("Find where request handlers load their context (session {s}).")}),
            ];
            for k in 1..=9 {
                m.push(json!({"role": "assistant", "content": null, "tool_calls": [tool_call(k)]}));
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
        messages
            .push(json!({"role": "assistant", "content": null, "tool_calls": [tool_call(*last)]}));
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
