#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `loopctl simulate`, run as the real binary, on one looping conversation recorded in every
//! shape agents write (tests/fixtures/formats/, synthetic): OpenAI chat completions, an OpenAI
//! Responses request body, a Codex rollout (current and older form), Gemini contents, a Gemini
//! request and response record, a Gemini CLI session file and a Claude Code session. Each must
//! show the same interventions as the chat shape, at the same events.

use serde_json::Value;

use loopguard_tests::{loopctl, root};

/// The fields of an intervention that do not depend on the shape: everything but the file and
/// the line the event was read from.
fn interventions(file: &str) -> (Option<i32>, Vec<Value>) {
    let out = loopctl()
        .args(["simulate", "--json"])
        .arg(root().join("tests/fixtures/formats").join(file))
        .output()
        .expect("run loopctl");
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let found = stdout
        .lines()
        .map(|l| {
            let mut v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{file}: not JSON: {l}: {e}"));
            let obj = v.as_object_mut().expect("an object");
            obj.remove("file");
            obj.remove("line");
            v
        })
        .collect();
    (out.status.code(), found)
}

#[test]
fn every_shape_of_one_looping_conversation_gets_the_same_interventions() {
    let (code, chat) = interventions("loop-openai-chat.json");
    assert_eq!(code, Some(3), "the chat shape must intervene");
    assert!(
        chat.iter()
            .any(|i| i["action"] == "block" || i["action"] == "terminate"),
        "{chat:#?}"
    );
    for file in [
        "loop-responses.json",
        "loop-codex-rollout.jsonl",
        "loop-codex-rollout-legacy.jsonl",
        "loop-gemini.json",
        "loop-gemini-record.json",
        "loop-gemini-cli.json",
        "loop-claude-code.jsonl",
    ] {
        let (code, found) = interventions(file);
        assert_eq!(code, Some(3), "{file}");
        assert_eq!(found, chat, "{file}");
    }
}

/// `loopctl test` judges cases in the new shapes: an expect block beside a Gemini body's
/// `contents`, and a sidecar beside a Claude Code session.
#[test]
fn cases_in_the_new_shapes_are_judged() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fixtures = root().join("tests/fixtures/formats");
    let expect = serde_json::json!({"loop": true, "unit": "call", "earliest": 3, "latest": 5});
    let mut body: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures.join("loop-gemini.json")).expect("fixture"),
    )
    .expect("JSON");
    body["expect"] = expect.clone();
    std::fs::write(dir.path().join("gemini.json"), body.to_string()).expect("write");
    std::fs::copy(
        fixtures.join("loop-claude-code.jsonl"),
        dir.path().join("claude.jsonl"),
    )
    .expect("copy");
    std::fs::write(
        dir.path().join("claude.expect.json"),
        serde_json::json!({ "expect": expect }).to_string(),
    )
    .expect("write");
    let out = loopctl()
        .args(["test", "--json"])
        .arg(dir.path())
        .output()
        .expect("run loopctl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let passed = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["outcome"] == "pass" && v["at"] == 4)
        .count();
    assert_eq!(passed, 2, "{stdout}");
}

#[test]
fn the_timeline_names_each_shape() {
    for (file, format) in [
        ("loop-openai-chat.json", "chat messages"),
        ("loop-responses.json", "chat messages"),
        ("loop-gemini.json", "Gemini contents"),
        ("loop-gemini-record.json", "Gemini contents"),
        ("loop-codex-rollout-legacy.jsonl", "chat messages"),
        ("loop-gemini-cli.json", "Gemini CLI session"),
        ("loop-claude-code.jsonl", "Claude Code session"),
    ] {
        let out = loopctl()
            .args(["simulate", "-q"])
            .arg(root().join("tests/fixtures/formats").join(file))
            .output()
            .expect("run loopctl");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(&format!("({format}, ")), "{file}: {stdout}");
    }
}

/// Writes `text` to `name` in `dir` and runs `loopctl simulate` on it, which must refuse it
/// (exit 1) and replay nothing; returns what it said.
fn refused(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    let out = loopctl()
        .args(["simulate", "--json"])
        .arg(&path)
        .output()
        .expect("run loopctl");
    assert_eq!(out.status.code(), Some(1), "{name}");
    assert!(out.stdout.is_empty(), "{name}: nothing replayed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_malformed_line_of_a_new_shape_is_named_and_nothing_is_replayed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let session =
        std::fs::read_to_string(root().join("tests/fixtures/formats/loop-claude-code.jsonl"))
            .expect("fixture");
    let mut lines: Vec<&str> = session.lines().collect();
    lines.insert(
        4,
        r#"{"type":"assistant","sessionId":"s1","message":"oops"}"#,
    );
    let stderr = refused(dir.path(), "broken.jsonl", &lines.join("\n"));
    assert!(
        stderr.contains("broken.jsonl:5: `message` must be a JSON object"),
        "{stderr}"
    );
}

/// Simulates `text` (written as `name`) with a policy that forgets calls after a minute; the
/// exit code.
fn simulate_with_a_minute_ttl(dir: &std::path::Path, name: &str, text: &str) -> Option<i32> {
    let policy = dir.join("ttl.yaml");
    std::fs::write(&policy, "version: 1\ntime: { ttl_seconds: 60 }\n").expect("write");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    let out = loopctl()
        .args(["simulate", "--json", "--rules"])
        .arg(&policy)
        .arg(&path)
        .output()
        .expect("run loopctl");
    out.status.code()
}

/// Claude Code and Codex lines carry their wall-clock time: a `ttl` acts on replay as it did
/// live. The loop, 1.5 s a step, is caught; the same loop ten minutes a step is not a loop
/// under a one-minute ttl.
#[test]
fn recorded_timestamps_drive_time_based_settings() {
    let dir = tempfile::tempdir().expect("temp dir");
    for file in ["loop-claude-code.jsonl", "loop-codex-rollout.jsonl"] {
        let text = std::fs::read_to_string(root().join("tests/fixtures/formats").join(file))
            .expect("fixture");
        assert_eq!(
            simulate_with_a_minute_ttl(dir.path(), file, &text),
            Some(3),
            "{file}"
        );
        // Every stamp ten minutes after the previous: "2026-01-01T00:00:01.500Z" becomes
        // "2026-01-0DTHH:MM:00.000Z" for the line's number.
        let slow: String = text
            .lines()
            .enumerate()
            .map(|(n, line)| match line.find("\"2026-01-01T") {
                Some(at) => {
                    let minutes = n * 10;
                    let stamp = format!(
                        "\"2026-01-{:02}T{:02}:{:02}:00.000Z\"",
                        1 + minutes / 1440,
                        minutes / 60 % 24,
                        minutes % 60
                    );
                    format!("{}{stamp}{}", &line[..at], &line[at + 26..])
                }
                None => line.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        assert_ne!(slow, text);
        assert_eq!(
            simulate_with_a_minute_ttl(dir.path(), file, &slow),
            Some(0),
            "{file}: {slow}"
        );
    }
}

/// A timestamp that is not RFC 3339 is named with its line; nothing is replayed.
#[test]
fn a_garbage_timestamp_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let text =
        std::fs::read_to_string(root().join("tests/fixtures/formats/loop-claude-code.jsonl"))
            .expect("fixture")
            .replacen(
                "2026-01-01T00:00:03.000Z",
                "2026-01-01T00:00:03.000Z and then some",
                1,
            );
    let stderr = refused(dir.path(), "garbage.jsonl", &text);
    assert!(
        stderr.contains("garbage.jsonl:4: `timestamp`") && stderr.contains("RFC 3339"),
        "{stderr}"
    );
}
