#![warn(missing_docs)]
#![allow(clippy::expect_used)] // benchmark support code: a broken setup should stop the run

//! Shared inputs for the benchmarks and the allocation checks: realistic tool calls with
//! ~200-byte arguments, a 64 KiB tool output, streamed text, and a long synthetic transcript.

use loopguard_engine::{Arguments, Call, Engine, Event, Text, ToolResult, UserMessage};
use serde_json::{Value, json};

/// Distinct calls (more than the default window) so that cycling through them never loops.
pub fn distinct_calls(n: usize) -> Vec<(String, Value)> {
    let tools = [
        "read_file",
        "bash",
        "grep",
        "str_replace_editor",
        "web_search",
        "list_directory",
    ];
    (0..n)
        .map(|i| {
            let tool = tools[i % tools.len()].to_owned();
            let args = json!({
                "path": format!("src/module_{i:03}/handlers/request_validation.rs"),
                "command": format!("cargo test -p service_{i} -- --nocapture validation::"),
                "pattern": format!("fn validate_{i}\\("),
                "offset": i * 40,
                "limit": 200,
                "request_id": format!("req-{i:08x}"),
            });
            (tool, args)
        })
        .collect()
}

/// Size in bytes of the arguments as JSON text.
pub fn args_len(args: &Value) -> usize {
    args.to_string().len()
}

/// A tool output of `len` bytes that looks like a build log.
pub fn big_output(len: usize) -> String {
    let mut out = String::with_capacity(len + 128);
    let mut i = 0u64;
    while out.len() < len {
        out.push_str(&format!(
            "2026-11-22T10:{:02}:{:02}Z [pid {}] compiling crate_{} v0.{}.0 ({} ms)\n",
            (i / 60) % 60,
            i % 60,
            4000 + i % 97,
            i,
            i % 9,
            (i * 37) % 1000
        ));
        i += 1;
    }
    out.truncate(len);
    out
}

/// A tool output of `len` bytes that mixes what coding agents read most: source lines, grep
/// hits, doc comments, prose, test names and a directory listing. Few of its words start a
/// mask (a listing's sizes and times, line numbers, counters in names), unlike
/// [`big_output`]'s build log, where every line holds four.
pub fn mixed_output(len: usize) -> String {
    let mut out = String::with_capacity(len + 160);
    let mut i = 0u64;
    while out.len() < len {
        let line = match i % 8 {
            0 => format!(
                "src/handlers/request_{}.rs:{}:    let body = parse_body(&request, limits.max_body)?;\n",
                i % 17,
                40 + i % 300
            ),
            1 => format!(
                "    /// Validates the request before it reaches the store; see `validate_{}` for the rules.\n",
                i % 23
            ),
            2 => "    if let Some(user) = session.user() { return Err(Error::Forbidden(user.id.clone())); }\n"
                .to_owned(),
            3 => format!("test handlers::tests::rejects_empty_body_{} ... ok\n", i % 41),
            4 => "The handler validates the request and then calls the store, which answers with the saved record.\n"
                .to_owned(),
            5 => format!(
                "-rw-r--r--  1 dev dev {:5} Mar  3 10:{:02} module_{}.py\n",
                100 + (i * 37) % 9000,
                i % 60,
                i % 13
            ),
            6 => "    for (key, value) in headers.iter().filter(|(k, _)| !k.starts_with(\"x-\")) {\n"
                .to_owned(),
            _ => format!(
                "        total += value.len() * {};  // bytes kept per header\n",
                i % 7 + 1
            ),
        };
        out.push_str(&line);
        i += 1;
    }
    out.truncate(len);
    out
}

/// An owned event for replaying long synthetic transcripts.
#[derive(Debug, Clone)]
pub enum Owned {
    /// A tool call.
    Call {
        /// The call's id.
        id: String,
        /// The tool.
        tool: String,
        /// Its arguments.
        args: Value,
        /// Event time (ms).
        t: u64,
    },
    /// A tool's result.
    Result {
        /// The id of the call it answers.
        id: String,
        /// The output.
        output: String,
        /// Whether it failed.
        error: bool,
        /// Event time (ms).
        t: u64,
    },
    /// Assistant text.
    Text {
        /// The text.
        text: String,
        /// Event time (ms).
        t: u64,
    },
    /// A person's message.
    User {
        /// The text.
        text: String,
        /// Event time (ms).
        t: u64,
    },
}

/// A transcript of `n` events: mostly healthy work with occasional loops, several sessions.
pub fn synthetic_transcript(n: usize) -> Vec<(String, Owned)> {
    let calls = distinct_calls(200);
    let mut out = Vec::with_capacity(n);
    let mut i = 0usize;
    while out.len() < n {
        let session = format!("s{}", i % 8);
        let t = (i as u64) * 500;
        let (tool, args) = if i % 50 < 5 {
            calls[7].clone()
        } else {
            calls[(i * 7) % calls.len()].clone()
        };
        let id = format!("c{i}");
        out.push((
            session.clone(),
            Owned::Call {
                id: id.clone(),
                tool,
                args,
                t,
            },
        ));
        out.push((
            session.clone(),
            Owned::Result {
                id,
                output: format!("ok: {} lines", i % 13),
                error: i.is_multiple_of(11),
                t: t + 100,
            },
        ));
        if i.is_multiple_of(10) {
            out.push((
                session.clone(),
                Owned::Text {
                    text: "Working on it; next I will read the handler.".into(),
                    t: t + 200,
                },
            ));
        }
        if i.is_multiple_of(97) {
            out.push((
                session,
                Owned::User {
                    text: "continue".into(),
                    t: t + 300,
                },
            ));
        }
        i += 1;
    }
    out.truncate(n);
    out
}

/// Replays owned events through an engine; returns how many verdicts were not `allow`.
pub fn replay(engine: &Engine, events: &[(String, Owned)]) -> usize {
    let mut flagged = 0;
    for (session, ev) in events {
        let verdict = match ev {
            Owned::Call { id, tool, args, t } => engine.observe(&Event::Call(Call {
                session,
                call_id: id,
                tool,
                arguments: Arguments::Json(args),
                time_ms: *t,
            })),
            Owned::Result {
                id,
                output,
                error,
                t,
            } => engine.observe(&Event::Result(ToolResult {
                session,
                call_id: id,
                output,
                is_error: *error,
                exit_code: None,
                time_ms: *t,
            })),
            Owned::Text { text, t } => engine.observe(&Event::Text(Text {
                session,
                text,
                chunk: false,
                end_of_turn: true,
                reasoning: false,
                narration: false,
                time_ms: *t,
            })),
            Owned::User { text, t } => engine.observe(&Event::User(UserMessage {
                session,
                text,
                injected: false,
                time_ms: *t,
            })),
        };
        if !verdict.is_allow() {
            flagged += 1;
        }
    }
    flagged
}

/// The default policy, as shipped.
pub fn default_engine() -> Engine {
    let policy = loopguard_rules::Policy::builtin_default()
        .policy
        .expect("the embedded default policy is valid");
    Engine::builder(&policy)
        .build()
        .expect("the default policy names no plugins")
}

/// The coding agent of the proxy bench and the `proxy_turn` profile driver: each turn reads a
/// file not read before, so a session never loops.
pub mod agent {
    use serde_json::{Value, json};

    /// A name made of the letters g..z only: the engine masks digits and hex ids in results,
    /// and the calls and results must stay distinct after masking.
    pub fn word(mut n: u64) -> String {
        let mut w = String::new();
        loop {
            w.push(char::from(b'g' + (n % 20) as u8));
            n /= 20;
            if n == 0 {
                return w;
            }
        }
    }

    /// Call `n` of a conversation (a chat `tool_calls` entry): a read of a file not read
    /// before.
    pub fn call(n: u64) -> Value {
        json!({"id": format!("call_{n}"), "type": "function", "function": {
            "name": "read_file",
            "arguments": json!({"path": format!("src/{}/handlers.rs", word(n))}).to_string(),
        }})
    }

    /// The result of call `n` (a chat `tool` message): ~500 bytes of source, different for
    /// every call.
    pub fn result(n: u64) -> Value {
        let w = word(n);
        let body: String = (0..12)
            .map(|k| format!("    let {w}_{} = {w}::load(&ctx)?;\n", word(k)))
            .collect();
        json!({"role": "tool", "tool_call_id": format!("call_{n}"),
            "content": format!("pub fn {w}(ctx: &Context) -> Result<()> {{\n{body}    Ok(())\n}}\n")})
    }

    /// The model's whole answer with `call`, as a chat completion.
    pub fn completion(call: &Value) -> Value {
        json!({
            "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "bench",
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": null, "tool_calls": [call]}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        })
    }

    /// The same answer as SSE events, one frame each: a short text, then the call with its
    /// arguments in 8-byte fragments.
    pub fn stream(call: &Value) -> Vec<String> {
        let chunk = |delta: Value, finish: Value| {
            format!(
                "data: {}\n\n",
                json!({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
                    "model": "bench", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            )
        };
        let args = call["function"]["arguments"].as_str().unwrap_or_default();
        let mut out = vec![
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(
                json!({"content": format!("Reading {}.", word(args.len() as u64))}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""}}]}),
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
        out.push("data: [DONE]\n\n".to_owned());
        out
    }

    /// A session's opening: the system prompt and the task.
    pub fn opening(session: &str) -> Vec<Value> {
        vec![
            json!({"role": "system", "content": "You are a coding agent. Use the tools to read, edit and test the code. Keep going until the task is done."}),
            json!({"role": "user", "content": format!("Find where request handlers load their context ({session}).")}),
        ]
    }
}
