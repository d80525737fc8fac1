#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `loopctl simulate`, run as the real binary: formats, `--json` fields, exit codes, bad input.

use std::path::{Path, PathBuf};

use loopguard_tests::{loopctl, root};
use serde_json::{Value, json};

fn interventions(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8(stdout.to_vec())
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

fn simulate_json(files: &[&Path]) -> (Option<i32>, Vec<Value>, String) {
    let out = loopctl()
        .arg("simulate")
        .arg("--json")
        .args(files)
        .output()
        .expect("run loopctl");
    (
        out.status.code(),
        interventions(&out.stdout),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write transcript");
    path
}

#[test]
fn the_readme_example_intervenes_and_the_healthy_one_does_not() {
    let looping = root().join("examples/looping-openai.json");
    let (code, found, _) = simulate_json(&[&looping]);
    assert_eq!(code, Some(3));
    assert!(!found.is_empty());
    let healthy = root().join("examples/healthy-openai.json");
    let (code, found, stderr) = simulate_json(&[&healthy]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(found.is_empty(), "{found:?}");
    for example in [
        "examples/anthropic-loop.json",
        "examples/looping-events.jsonl",
    ] {
        let (code, found, stderr) = simulate_json(&[&root().join(example)]);
        assert_eq!(code, Some(3), "{example}: {stderr}");
        assert!(!found.is_empty(), "{example}");
    }
}

#[test]
fn json_lines_carry_every_documented_field() {
    let (_, found, _) = simulate_json(&[&root().join("tests/scenarios/catch-alternation.jsonl")]);
    let first = &found[0];
    for key in [
        "file",
        "session",
        "call",
        "turn",
        "event",
        "line",
        "tool",
        "action",
        "detector",
        "rule",
        "count",
        "message",
        "calls",
        "loop_start",
    ] {
        assert!(first.get(key).is_some(), "missing `{key}` in {first}");
    }
    // bash, read, bash, read, bash: the cycle is confirmed on the 5th call (the first of its
    // third turn) and started at the 1st.
    assert_eq!(first["call"], 5);
    assert_eq!(first["event"], 10);
    assert_eq!(first["turn"], 5);
    assert_eq!(first["tool"], "bash");
    assert_eq!(first["action"], "warn");
    assert_eq!(first["detector"], "cycle");
    assert_eq!(first["loop_start"]["call"], 1);
    assert!(first["rule"].as_str().unwrap().contains("ladders."));
    assert!(first["count"].as_u64().unwrap() >= 2);
    assert!(first["message"].as_str().unwrap().contains("bash"));
}

/// One conversation: the same shell command failing the same way five times.
fn looping_calls() -> Vec<(String, Value, String)> {
    (1..=5)
        .map(|i| {
            (
                format!("call_{i}"),
                json!({"command": "make deploy"}),
                "make: *** [deploy] Error 1".to_owned(),
            )
        })
        .collect()
}

fn openai_messages() -> Vec<Value> {
    let mut msgs = vec![json!({"role": "user", "content": "deploy it"})];
    for (id, args, out) in looping_calls() {
        msgs.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "bash", "arguments": args.to_string()}}
        ]}));
        msgs.push(json!({"role": "tool", "tool_call_id": id, "content": out}));
    }
    msgs
}

fn anthropic_messages() -> Vec<Value> {
    let mut msgs = vec![json!({"role": "user", "content": "deploy it"})];
    for (id, args, out) in looping_calls() {
        msgs.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "bash", "input": args}
        ]}));
        msgs.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": out}
        ]}));
    }
    msgs
}

fn events() -> String {
    let mut lines = vec![json!({"type": "user", "text": "deploy it"}).to_string()];
    for (id, args, out) in looping_calls() {
        lines
            .push(json!({"type": "call", "id": id, "tool": "bash", "arguments": args}).to_string());
        lines.push(json!({"type": "result", "id": id, "output": out}).to_string());
    }
    lines.join("\n")
}

#[test]
fn every_format_replays_the_same_conversation_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    let openai = openai_messages();
    let files = [
        write(
            dir.path(),
            "array.json",
            &serde_json::to_string_pretty(&openai).unwrap(),
        ),
        write(
            dir.path(),
            "lines.jsonl",
            &openai
                .iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        write(
            dir.path(),
            "body.json",
            &json!({"model": "gpt-x", "temperature": 0, "messages": openai}).to_string(),
        ),
        write(
            dir.path(),
            "anthropic.json",
            &json!({"model": "claude", "system": "s", "messages": anthropic_messages()})
                .to_string(),
        ),
        write(dir.path(), "events.jsonl", &events()),
    ];
    let key = |v: &Value| {
        (
            v["call"].clone(),
            v["turn"].clone(),
            v["action"].clone(),
            v["detector"].clone(),
            v["count"].clone(),
            v["loop_start"].clone(),
        )
    };
    let mut runs = Vec::new();
    for f in &files {
        let (code, found, stderr) = simulate_json(&[f]);
        assert_eq!(code, Some(3), "{}: {stderr}", f.display());
        runs.push(found.iter().map(key).collect::<Vec<_>>());
    }
    for (f, run) in files.iter().zip(&runs).skip(1) {
        assert_eq!(run, &runs[0], "{} differs from array.json", f.display());
    }
    // The first intervention is the 3rd identical shell call.
    assert_eq!(runs[0][0].0, 3);
}

#[test]
fn raw_arguments_that_are_not_json_are_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let msgs: Vec<Value> = (1..=4)
        .flat_map(|i| {
            let id = format!("c{i}");
            [
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": id, "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls -la"}}
                ]}),
                json!({"role": "tool", "tool_call_id": id, "content": "error: bad arguments"}),
            ]
        })
        .collect();
    let f = write(dir.path(), "raw.json", &Value::Array(msgs).to_string());
    let (code, found, stderr) = simulate_json(&[&f]);
    assert_eq!(code, Some(3), "{stderr}");
    assert_eq!(found[0]["tool"], "bash");
}

#[test]
fn bad_input_names_file_and_line_and_the_other_files_still_run() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(
        dir.path(),
        "bad.jsonl",
        "{\"type\": \"user\", \"text\": \"hi\"}\n// fine\n{\"type\": \"call\", \"tool\": \"ls\", \"argument\": {}}\n",
    );
    let good = root().join("tests/scenarios/catch-alternation.jsonl");
    let out = loopctl()
        .arg("simulate")
        .arg("--json")
        .arg(&bad)
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:3", bad.display()))
            && stderr.contains("unknown key `argument`"),
        "{stderr}"
    );
    assert!(
        !interventions(&out.stdout).is_empty(),
        "the good file was replayed"
    );

    let broken = write(
        dir.path(),
        "broken.json",
        "[{\"role\": \"user\", \"content\": \"x\"},\n {\"role\": ",
    );
    let out = loopctl().arg("simulate").arg(&broken).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:2:", broken.display())),
        "{stderr}"
    );

    let binary = dir.path().join("binary.json");
    std::fs::write(&binary, [0xff, 0xfe, 0x00, 0x01]).unwrap();
    let out = loopctl().arg("simulate").arg(&binary).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not UTF-8"));
}

#[test]
fn a_missing_file_cannot_run_and_a_bad_policy_is_invalid() {
    let out = loopctl()
        .args(["simulate", "no/such/file.jsonl"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no/such/file.jsonl"));

    let out = loopctl()
        .args([
            "simulate",
            "--rules",
            "tests/fixtures/policies/unknown-key.yaml",
        ])
        .arg("examples/healthy-openai.json")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown-key.yaml"));

    let out = loopctl()
        .args([
            "simulate",
            "--rules",
            "no/such/policy.yaml",
            "examples/healthy-openai.json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_default_policy_is_built_in() {
    let dir = tempfile::tempdir().unwrap();
    let out = loopctl()
        .current_dir(dir.path())
        .arg("simulate")
        .arg(root().join("examples/looping-events.jsonl"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("policy `default`"), "{stdout}");
}

#[test]
fn blocked_results_are_not_replayed_and_a_terminated_session_stops() {
    let out = loopctl()
        .args(["simulate", "examples/looping-openai.json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("not replayed: the host did not run it"),
        "{stdout}"
    );
    assert!(stdout.contains("terminated; its"), "{stdout}");
    // Nothing after the terminate verdict is shown as a replayed call.
    let after = stdout.split("TERMINATE").nth(1).unwrap();
    assert!(!after.contains("  call "), "{after}");
}

#[test]
fn the_event_schema_accepts_every_shipped_event_transcript_and_rejects_typos() {
    let out = loopctl().args(["schema", "--events"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let schema: Value = serde_json::from_slice(&out.stdout).unwrap();
    let validator = jsonschema::draft7::new(&schema).expect("a valid draft-07 schema");
    let mut checked = 0;
    for dir in ["tests/scenarios", "tests/scenarios/presets", "examples"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "jsonl") {
                continue;
            }
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let t = line.trim();
                if t.is_empty() || t.starts_with("//") {
                    continue;
                }
                let v: Value = serde_json::from_str(t).unwrap();
                assert!(validator.is_valid(&v), "{}: {t}", path.display());
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "checked {checked} events");
    assert!(!validator.is_valid(&json!({"type": "call", "tool": "ls", "argument": {}})));
    assert!(!validator.is_valid(&json!({"type": "cal", "tool": "ls"})));
}

/// A small deterministic generator, so a failure reproduces.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(text: &str, rng: &mut XorShift) -> String {
    let mut bytes = text.as_bytes().to_vec();
    const NOISE: &[u8] = b"{}[]\":,\\\n 0123456789-.eEtruefalsnl\xff\xc3";
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(bytes.len() + 1);
        match rng.below(5) {
            0 => {
                let end = (at + rng.below(40)).min(bytes.len());
                bytes.drain(at..end);
            }
            1 => {
                for _ in 0..1 + rng.below(6) {
                    bytes.insert(at.min(bytes.len()), NOISE[rng.below(NOISE.len())]);
                }
            }
            2 => bytes.truncate(at),
            3 => {
                let end = (at + rng.below(200)).min(bytes.len());
                let copy = bytes[at..end].to_vec();
                let to = rng.below(bytes.len() + 1);
                bytes.splice(to..to, copy);
            }
            _ => {
                if let Some(b) = bytes.get_mut(at) {
                    *b = NOISE[rng.below(NOISE.len())];
                }
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
fn no_transcript_however_malformed_makes_simulate_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut seeds: Vec<(String, String)> = Vec::new();
    for f in [
        "examples/looping-openai.json",
        "examples/anthropic-loop.json",
        "examples/looping-events.jsonl",
    ] {
        seeds.push((
            f.to_owned(),
            std::fs::read_to_string(root().join(f)).unwrap(),
        ));
    }
    seeds.push((
        "lines".into(),
        openai_messages()
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
    ));
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut files = Vec::new();
    for i in 0..300 {
        let (_, seed) = &seeds[i % seeds.len()];
        let text = mutate(seed, &mut rng);
        files.push(write(dir.path(), &format!("m{i:03}.json"), &text));
    }
    for chunk in files.chunks(100) {
        let out = loopctl()
            .arg("simulate")
            .arg("--json")
            .args(chunk)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            matches!(out.status.code(), Some(0 | 1 | 3)),
            "exit {:?}: {stderr}",
            out.status.code()
        );
        // Every file that failed is named with its line.
        for line in stderr.lines().filter(|l| l.starts_with("error: ")) {
            let rest = line.trim_start_matches("error: ");
            assert!(rest.starts_with(dir.path().to_str().unwrap()), "{line}");
        }
    }
}

#[test]
fn loopguard_environment_variables_are_the_server_tier() {
    let example = "examples/looping-events.jsonl";
    let run = |vars: &[(&str, &str)]| {
        let mut cmd = loopctl();
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd.args(["simulate", "--json", example]).output().unwrap()
    };
    let off = run(&[("LOOPGUARD_ENABLED", "false")]);
    assert_eq!(
        off.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&off.stderr)
    );
    assert!(off.stdout.is_empty());

    let on = run(&[]);
    let first_default = &interventions(&on.stdout)[0];
    assert_eq!(first_default["action"], "warn");
    let brk = run(&[("LOOPGUARD_MODE", "break")]);
    let found = interventions(&brk.stdout);
    assert!(
        found[0]["rule"].as_str().unwrap().contains("ladders.break"),
        "{found:?}"
    );
    // `break` refuses at the first detection: the third identical failing call.
    assert_eq!(found[0]["action"], "block", "{found:?}");
    assert_eq!(found[0]["kind"], "call", "{found:?}");
    assert_eq!(found[0]["call"], 3, "{found:?}");

    let strict = run(&[("LOOPGUARD_MAX_REPEATS", "2")]);
    let found = interventions(&strict.stdout);
    assert!(
        found
            .iter()
            .any(|i| i["detector"] == "exact_repeat" && i["count"] == 2),
        "{found:?}"
    );

    let bad = run(&[
        ("LOOPGUARD_TTL_SECONDS", "soon"),
        ("LOOPGUARD_MODE", "explode"),
    ]);
    assert_eq!(bad.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("LOOPGUARD_TTL_SECONDS") && stderr.contains("LOOPGUARD_MODE"),
        "{stderr}"
    );

    let nudge = loopctl()
        .env("LOOPGUARD_RULES", "rules/nudge.yaml")
        .args(["simulate", example])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&nudge.stdout).contains("policy `nudge`"));
    let missing = loopctl()
        .env("LOOPGUARD_RULES", "rules/nope.yaml")
        .args(["simulate", example])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
}

/// A failing build repeated until it is blocked, then failing variations until the error
/// cascade stops the run; call ids as `ids` says: `unique`, `missing` or `reused`.
fn blocked_then_cascade(ids: &str) -> String {
    let mut lines = Vec::new();
    let mut n = 0;
    let mut exchange = |command: String, output: String| {
        n += 1;
        let id = match ids {
            "unique" => Some(format!("c{n}")),
            "reused" => Some("call_0".to_owned()),
            _ => None,
        };
        let mut call = json!({"type": "call", "tool": "bash", "arguments": {"command": command}});
        let mut result = json!({"type": "result", "output": output, "error": true});
        if let Some(id) = id {
            call["id"] = json!(id);
            result["id"] = json!(id);
        }
        lines.push(call.to_string());
        lines.push(result.to_string());
    };
    for _ in 0..4 {
        exchange("make".into(), "make: *** [all] Error 2".into());
    }
    for k in 0..12 {
        exchange(
            format!("make target{k}"),
            format!("make: *** No rule to make target `target{k}'. Stop."),
        );
    }
    lines.join("\n") + "\n"
}

/// Once a call was blocked, every later result of its session used to be dropped when call
/// ids were missing or reused (results were matched to blocked calls by id alone), so a later
/// `terminate` that needs those results silently disappeared. Results now answer the oldest
/// unanswered call with their id.
#[test]
fn a_later_terminate_is_not_lost_when_call_ids_are_missing_or_reused() {
    let dir = tempfile::tempdir().unwrap();
    let verdicts = |ids: &str| -> Vec<(u64, String)> {
        let file = write(
            dir.path(),
            &format!("{ids}.jsonl"),
            &blocked_then_cascade(ids),
        );
        let (code, records, stderr) = simulate_json(&[&file]);
        assert_eq!(code, Some(3), "{stderr}");
        records
            .iter()
            .map(|r| {
                (
                    r["event"].as_u64().unwrap(),
                    r["action"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let unique = verdicts("unique");
    assert!(
        unique.iter().any(|(_, a)| a == "block") && unique.last().unwrap().1 == "terminate",
        "{unique:?}"
    );
    assert_eq!(verdicts("missing"), unique, "ids missing");
    assert_eq!(verdicts("reused"), unique, "ids reused");
}
