#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! Fuzzing, time-bounded: every parser that reads input loopguard did not write, fed mutated
//! inputs for `LOOPGUARD_FUZZ_SECONDS` seconds per target (3 by default; `.ci/run` gives each
//! 60). No input may panic, take longer than [`TIME_BOUND`], or allocate more than
//! [`MEMORY_BOUND`] at its peak (counted exactly by `allocation-counter`, per thread).
//!
//! Targets: the policy loader (parse, check, compile, and every diagnostic rendered as text and
//! JSON), the transcript reader (all three formats), the engine's snapshot restore (a session's
//! and a whole engine's, then events on what was restored), and the proxy's request parser,
//! response judge and SSE stream parser (`loopguard_proxy::fuzzing`).
//!
//! Inputs start from the seeds in `tests/fuzz/seeds/<target>/` and the project's shipped
//! policies, fixtures and example transcripts, and are mutated (bit flips, interesting bytes,
//! inserted tokens of the format, deletions, duplications, splices of two seeds). Every input
//! in `tests/fuzz/crashes/<target>/` is replayed first: a crash once found stays a test. A
//! failing input is written to `target/fuzz-crashes/<target>/`, named by its hash, with the
//! seed that reproduces the run (`LOOPGUARD_FUZZ_SEED`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest any one input may take: the slowest legitimate input (the alias-bomb fixture,
/// refused after a bounded expansion) takes about 0.1 s in a release build and 1.3 s in a
/// debug build on an idle core; the bound leaves room for a loaded 2-core machine.
const TIME_BOUND: Duration = Duration::from_secs(if cfg!(debug_assertions) { 10 } else { 2 });
/// Most memory any one input may hold at once.
const MEMORY_BOUND: usize = 256 << 20;
/// Largest input the mutator makes.
const MAX_INPUT: usize = 64 << 10;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn files(dir: &Path, ext: &[&str]) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .filter(|p| {
            ext.is_empty()
                || p.extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| ext.contains(&e))
        })
        .collect();
    paths.sort();
    paths
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .filter(|b| b.len() <= MAX_INPUT)
        .collect()
}

/// A small, fast, seedable generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const INTERESTING: &[u8] = b"\0\xff\x7f\x80\"'{}[]:,\n\r\t\\- *?(){}!/#&%$0123456789";

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], tokens: &[&str]) -> Vec<u8> {
    let mut input = seeds[rng.below(seeds.len())].clone();
    for _ in 0..=rng.below(4) {
        let len = input.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                input[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let i = rng.below(len + 1);
                let t = tokens[rng.below(tokens.len())].as_bytes();
                input.splice(i..i, t.iter().copied());
            }
            3 if len > 0 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(64)).min(len);
                input.drain(a..b);
            }
            4 if len > 0 => {
                // Duplicate a range, up to 64 times: deep nesting, long lines, many entries.
                let a = rng.below(len);
                let b = (a + 1 + rng.below(256)).min(len);
                let piece = input[a..b].to_vec();
                for _ in 0..=rng.below(64) {
                    input.splice(b..b, piece.iter().copied());
                }
            }
            5 => {
                let other = &seeds[rng.below(seeds.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                input.truncate(cut);
                input.extend_from_slice(&other[from..]);
            }
            6 if len > 0 => input.truncate(rng.below(len)),
            _ => {
                let i = rng.below(len + 1);
                let b = (rng.next() & 0xff) as u8;
                input.insert(i, b);
            }
        }
        input.truncate(MAX_INPUT);
    }
    input
}

struct Target {
    name: &'static str,
    seeds: Vec<Vec<u8>>,
    tokens: &'static [&'static str],
    run: fn(&[u8]),
}

fn seconds() -> f64 {
    std::env::var("LOOPGUARD_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0)
}

fn save(target: &str, input: &[u8]) -> PathBuf {
    let dir = root().join("target").join("fuzz-crashes").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{:016x}", loopguard_hash::fnv1a(input)));
    std::fs::write(&path, input).unwrap();
    path
}

/// Runs one input under the bounds; the reason it broke one, if it did.
fn check(t: &Target, input: &[u8]) -> Option<String> {
    let started = Instant::now();
    let mut info = None;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        info = Some(allocation_counter::measure(|| (t.run)(input)));
    }));
    let elapsed = started.elapsed();
    if let Err(e) = outcome {
        let msg = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        return Some(format!("panicked: {msg}"));
    }
    if elapsed > TIME_BOUND {
        return Some(format!("took {elapsed:?} (bound {TIME_BOUND:?})"));
    }
    let peak = info.map_or(0, |i| i.bytes_max as usize);
    (peak > MEMORY_BOUND).then(|| format!("held {peak} bytes at once (bound {MEMORY_BOUND})"))
}

fn fuzz(t: Target) {
    assert!(!t.seeds.is_empty(), "{}: no seeds", t.name);
    // Crashes found before are replayed every run.
    for input in files(&root().join("tests/fuzz/crashes").join(t.name), &[]) {
        if let Some(why) = check(&t, &input) {
            let path = save(t.name, &input);
            panic!(
                "{}: a recorded crash input still fails ({why}): {}",
                t.name,
                path.display()
            );
        }
    }
    for input in &t.seeds {
        if let Some(why) = check(&t, input) {
            let path = save(t.name, input);
            panic!("{}: a seed fails ({why}): {}", t.name, path.display());
        }
    }
    let seed = std::env::var("LOOPGUARD_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    let mut rng = Rng(seed);
    // A watchdog: an input that never returns is written out and the process stopped, so a
    // hang fails the run instead of blocking it.
    let current = Arc::new(Mutex::new((Instant::now(), Vec::<u8>::new())));
    let done = Arc::new(AtomicBool::new(false));
    {
        let (current, done, name) = (Arc::clone(&current), Arc::clone(&done), t.name);
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let (since, input) = current.lock().unwrap().clone();
                if since.elapsed() > TIME_BOUND * 10 && !done.load(Ordering::Relaxed) {
                    let path = save(name, &input);
                    let _ = writeln!(
                        std::io::stderr(),
                        "{name}: an input hung for {:?} (seed {seed}): {}",
                        since.elapsed(),
                        path.display()
                    );
                    std::process::abort();
                }
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs_f64(seconds());
    let mut runs = 0u64;
    while Instant::now() < deadline {
        let input = mutate(&mut rng, &t.seeds, t.tokens);
        *current.lock().unwrap() = (Instant::now(), input.clone());
        if let Some(why) = check(&t, &input) {
            done.store(true, Ordering::Relaxed);
            let path = save(t.name, &input);
            panic!(
                "{}: {why} after {runs} inputs (LOOPGUARD_FUZZ_SEED={seed}); the input: {}\n\
                 (add it to tests/fuzz/crashes/{}/ once fixed)",
                t.name,
                path.display(),
                t.name
            );
        }
        runs += 1;
    }
    done.store(true, Ordering::Relaxed);
    println!(
        "{}: {runs} inputs in {:.0} s (seed {seed})",
        t.name,
        seconds()
    );
    assert!(runs > 0);
}

// --- targets -----------------------------------------------------------------------------------

fn load_policy(input: &[u8]) {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    let loaded = loopguard_rules::Policy::load_text(Path::new("fuzz.yaml"), text.to_owned());
    for d in &loaded.diagnostics {
        let _ = loaded.sources.render(d);
        let _ = loaded.sources.to_json(d);
    }
    if let Some(policy) = loaded.policy {
        let config = policy.resolve(Some("fuzz"), Some("gpt-4o"));
        let _ = loopguard_engine::Engine::new(config);
    }
}

#[test]
fn fuzz_the_policy_loader() {
    let mut seeds = files(&root().join("tests/fuzz/seeds/policy"), &[]);
    seeds.extend(files(&root().join("rules"), &["yaml"]));
    seeds.extend(files(&root().join("tests/fixtures/policies"), &["yaml"]));
    fuzz(Target {
        name: "policy",
        seeds,
        tokens: &[
            "version: 1\n",
            "extends: ",
            "builtin:default",
            "detectors:\n  ",
            "exact_repeat: ",
            "{ threshold: 3 }",
            "regex: ",
            "'(a+)+$'",
            "\\w{20}",
            "\"*a*a*a*a*\"",
            "&a ",
            "*a",
            "<<: ",
            "!!binary ",
            "categories:",
            "tools: [",
            "ladders:",
            "overrides:",
            "\u{FEFF}",
            "{count}",
            "{tool}",
            "\t",
            "---\n",
            "- ",
            ": ",
            "~",
            "1e309",
            "-9223372036854775809",
        ],
        run: load_policy,
    });
}

#[test]
fn fuzz_the_transcript_reader() {
    let mut seeds = files(&root().join("tests/fuzz/seeds/transcript"), &[]);
    seeds.extend(files(&root().join("examples"), &["json", "jsonl"]));
    fuzz(Target {
        name: "transcript",
        seeds,
        tokens: &[
            "{\"role\": \"user\", \"content\": \"x\"}",
            "\"tool_calls\": [",
            "\"tool_use\"",
            "\"tool_result\"",
            "\"type\": \"call\"",
            "\"type\": \"result\"",
            "\"arguments\": ",
            "\"time\": ",
            "1e400",
            "-1",
            "null",
            "[",
            "]",
            "{",
            "}",
            "\"\\ud800\"",
            "\n",
            "\"function_call\": {",
            "\"name\": ",
            "\"session\": ",
            "\"call_id\": ",
            "\"parts\": [",
            "\"functionCall\": {",
            "\"functionResponse\": {",
            "\"message\": {",
            "\"type\": \"assistant\"",
            "\"type\": \"function_call_output\"",
            "\"payload\": ",
            "\"timestamp\": \"2025-06-01T12:34:56.789+02:00\"",
            "\"record_type\": \"state\"",
            "\"candidates\": [",
            "\"finishReason\": \"STOP\"",
        ],
        run: |input| {
            if let Ok(text) = std::str::from_utf8(input) {
                let _ = loopguard_transcript::parse(text);
            }
        },
    });
}

const JSON_TOKENS: &[&str] = &[
    "\"messages\": [",
    "{\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"content\": \"x\"}",
    "\"tool_calls\": [{\"id\": \"c\", \"type\": \"function\", \"function\": {\"name\": \"bash\", \"arguments\": \"{}\"}}]",
    "\"content\": [",
    "\"stream\": true",
    "!/set(tool-loop-detection=false)",
    "!/unset(",
    "\"choices\": [",
    "\"delta\": {",
    "\"index\": 18446744073709551615",
    "null",
    "1e999",
    "\"\\u0000\"",
    "[",
    "]",
    "{",
    "}",
    ",",
    "\"finish_reason\": \"tool_calls\"",
    "\"tool_use\"",
    "\"tool_result\"",
    "\"tool_use_id\": \"c\"",
    "\"input\": [",
    "\"type\": \"function_call\"",
    "\"type\": \"function_call_output\"",
    "\"call_id\": \"c\"",
    "\"previous_response_id\": \"r\"",
    "\"output\": [",
    "\"content\": [{\"type\": \"tool_use\", \"id\": \"c\", \"name\": \"bash\", \"input\": {}}]",
];

/// The wire formats the proxy parses.
/// The built-in default policy, resolved once.
fn default_config() -> &'static loopguard_rules::Config {
    static CONFIG: std::sync::OnceLock<loopguard_rules::Config> = std::sync::OnceLock::new();
    CONFIG.get_or_init(|| {
        loopguard_rules::Policy::builtin_default()
            .policy
            .expect("the default policy")
            .resolve(None, None)
    })
}

/// One round of a session: a call, its result, a turn of text and a user message.
struct Round<'a> {
    tool: &'a str,
    command: &'a str,
    output: &'a str,
    is_error: bool,
    user: &'a str,
}

fn play(engine: &loopguard_engine::Engine, session: &str, id: &str, time_ms: u64, r: &Round<'_>) {
    use loopguard_engine::{Arguments, Call, Event, Text, ToolResult, UserMessage};
    let args = serde_json::json!({ "command": r.command });
    let _ = engine.observe(&Event::Call(Call {
        session,
        call_id: id,
        tool: r.tool,
        arguments: Arguments::Json(&args),
        time_ms,
    }));
    let _ = engine.observe(&Event::Result(ToolResult {
        session,
        call_id: id,
        output: r.output,
        is_error: r.is_error,
        exit_code: None,
        time_ms: time_ms.saturating_add(10),
    }));
    let _ = engine.observe(&Event::Text(Text {
        session,
        text: "Let me think about this once more before I act, and try again.",
        chunk: false,
        end_of_turn: true,
        reasoning: false,
        narration: false,
        time_ms: time_ms.saturating_add(20),
    }));
    let _ = engine.observe(&Event::User(UserMessage {
        session,
        text: r.user,
        injected: false,
        time_ms: time_ms.saturating_add(30),
    }));
}

/// What every restored session is then given: the same failing call twice, each followed by
/// text and a short rejecting reply, near the end of time; then a snapshot of it.
fn after_restore(engine: &loopguard_engine::Engine, session: &str) {
    let round = Round {
        tool: "bash",
        command: "cargo test",
        output: "error[E0425]: cannot find value `x` in this scope",
        is_error: true,
        user: "find: src: No such file or directory",
    };
    for (i, id) in ["f1", "f2"].iter().enumerate() {
        play(engine, session, id, u64::MAX / 2 + i as u64, &round);
    }
    let _ = engine.snapshot_session(session);
}

fn restore_snapshot(input: &[u8]) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(input) else {
        return;
    };
    // As one session's snapshot, then as a whole engine's.
    type Restore = fn(&loopguard_engine::Engine, &serde_json::Value) -> bool;
    let restores: [Restore; 2] = [
        |e, v| e.restore_session("s", v).is_ok(),
        |e, v| e.restore(v).is_ok(),
    ];
    for restore in restores {
        let engine = loopguard_engine::Engine::new(default_config().clone());
        if restore(&engine, &value) {
            after_restore(&engine, "s");
            let _ = engine.snapshot();
        }
    }
}

/// Snapshots of sessions that saw every kind of event, as seeds: one session's, and the whole
/// engine's.
fn snapshot_seeds() -> Vec<Vec<u8>> {
    let engine = loopguard_engine::Engine::new(default_config().clone());
    let s = "s";
    for i in 0..8u64 {
        let command = format!("echo 'x' > f{} && cargo test", i % 3);
        let output =
            "Traceback (most recent call last):\n  File \"t.py\", line 3\nValueError: bad 'x'\n"
                .repeat(1 + i as usize % 3);
        let round = Round {
            tool: if i % 4 == 3 { "write_file" } else { "bash" },
            command: &command,
            output: &output,
            is_error: i % 2 == 0,
            user: "Determine the single next command to run and reply in the JSON format.",
        };
        play(&engine, s, &format!("c{i}"), i * 1000, &round);
    }
    let mut seeds = vec![
        serde_json::to_vec(&engine.snapshot_session(s).expect("a session")).unwrap(),
        serde_json::to_vec(&engine.snapshot()).unwrap(),
    ];
    // The same as version 1, which restore migrates.
    let mut old = engine.snapshot_session(s).expect("a session");
    old["version"] = serde_json::json!(1);
    seeds.push(serde_json::to_vec(&old).unwrap());
    seeds
}

#[test]
fn fuzz_the_snapshot_restore() {
    fuzz(Target {
        name: "snapshot",
        seeds: snapshot_seeds(),
        tokens: &[
            "\"version\": 1",
            "\"version\": 2",
            "\"flags\": 65535",
            "\"seq\": 4294967295",
            "\"monologue\": 4294967295",
            "\"ended_by_person\": 4294967295",
            "\"same_replies\": 4294967295",
            "\"sketch\": \"ffffffffffffffff\"",
            "\"last_user\": \"0000000000000001\"",
            "\"window\": []",
            "\"files\": [{\"target\": 1, \"content\": 2, \"seq\": 1}]",
            "\"time\": 4294967295",
            "\"epoch_ms\": 18446744073709551615",
            "\"sessions\": {}",
            "null",
            "-1",
            "1e400",
        ],
        run: restore_snapshot,
    });
}

const WIRES: [loopguard_proxy::Wire; 4] = [
    loopguard_proxy::Wire::Chat,
    loopguard_proxy::Wire::Messages,
    loopguard_proxy::Wire::Responses,
    loopguard_proxy::Wire::Gemini,
];

#[test]
fn fuzz_the_proxy_request_parser() {
    fuzz(Target {
        name: "request",
        seeds: files(&root().join("tests/fuzz/seeds/request"), &[]),
        tokens: JSON_TOKENS,
        // Every input is read as each wire format's request.
        run: |input| {
            for wire in WIRES {
                loopguard_proxy::fuzzing::request(wire, input);
            }
        },
    });
}

#[test]
fn fuzz_the_proxy_response_judge() {
    fuzz(Target {
        name: "response",
        seeds: files(&root().join("tests/fuzz/seeds/response"), &[]),
        tokens: JSON_TOKENS,
        run: |input| {
            for wire in WIRES {
                loopguard_proxy::fuzzing::response(wire, input);
            }
        },
    });
}

#[test]
fn fuzz_the_proxy_sse_parser() {
    fuzz(Target {
        name: "sse",
        seeds: files(&root().join("tests/fuzz/seeds/sse"), &[]),
        tokens: &[
            "data: ",
            "\n\n",
            "\r\n",
            "event: ",
            ": ping\n",
            "data: [DONE]\n\n",
            "id: 1\n",
            "retry: 10\n",
            "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}",
            "{\"choices\":[{\"index\":1,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\"}}]}}]}",
            "{\"error\": {\"message\": \"x\"}}",
            "event: content_block_start\n",
            "{\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"bash\",\"input\":{}}}",
            "{\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\"}}",
            "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"}}",
            "{\"type\":\"response.output_item.added\",\"output_index\":2,\"item\":{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"bash\"}}",
            "{\"type\":\"response.function_call_arguments.delta\",\"output_index\":2,\"delta\":\"{\"}",
            "{\"type\":\"response.completed\",\"response\":{\"output\":[]}}",
            "{\"candidates\":[{\"content\":{\"role\":\"model\",\"parts\":[{\"text\":\"x\"}]}}]}",
            "{\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":{\"name\":\"bash\",\"args\":{}}}]},\"finishReason\":\"STOP\"}]}",
        ],
        run: |input| {
            // Fed whole and in small pieces: a parser must not depend on how reads split.
            for wire in WIRES {
                loopguard_proxy::fuzzing::stream(wire, input, input.len());
                loopguard_proxy::fuzzing::stream(wire, input, 7);
            }
        },
    });
}
