#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! Hostile files given to the real `loopctl` binary: devices, FIFOs, files over the limits,
//! huge lines, files that are not policies. Every one ends in a clear error and a non-zero exit,
//! never a hang, a panic or the file's contents on the screen. The large inputs are generated
//! here at run time.

use std::path::{Path, PathBuf};
use std::time::Duration;

use loopguard_tests::loopctl_clean;

/// Long enough for a slow debug build, far shorter than reading `/dev/zero` until memory runs
/// out or waiting on a FIFO forever.
const PATIENCE: Duration = Duration::from_secs(60);

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Run {
    let out = loopctl_clean()
        .args(args)
        .timeout(PATIENCE)
        .output()
        .expect("run loopctl");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// A FIFO nobody writes to: opening it for reading the ordinary way blocks forever.
#[cfg(unix)]
fn fifo(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let ok = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .expect("run mkfifo")
        .success();
    assert!(ok, "mkfifo {}", path.display());
    path
}

/// The devices that never end, where this system has them.
fn endless_devices() -> Vec<&'static str> {
    ["/dev/zero", "/dev/urandom"]
        .into_iter()
        .filter(|d| Path::new(d).exists())
        .collect()
}

const EVENTS: &str = "{\"type\":\"call\",\"id\":\"a\",\"tool\":\"ls\"}\n";

#[cfg(unix)]
#[test]
fn devices_and_fifos_are_refused_wherever_loopctl_reads_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = fifo(dir.path(), "pipe.yaml");
    let transcript = write(dir.path(), "t.jsonl", EVENTS);
    let mut specials: Vec<&str> = endless_devices();
    specials.push(s(&pipe));
    for special in specials {
        // `validate PATH`: the file cannot be read.
        let r = run(&["validate", special]);
        assert_eq!(r.code, Some(2), "validate {special}: {}", r.stderr);
        assert!(r.stderr.contains("not a regular file"), "{}", r.stderr);

        // `--rules` of simulate and test.
        let r = run(&["simulate", "--rules", special, s(&transcript)]);
        assert_eq!(r.code, Some(2), "simulate --rules {special}: {}", r.stderr);
        assert!(r.stderr.contains("not a regular file"), "{}", r.stderr);
        let r = run(&["test", "--rules", special, s(&transcript)]);
        assert_eq!(r.code, Some(2), "test --rules {special}: {}", r.stderr);

        // Transcripts and cases.
        let r = run(&["simulate", special]);
        assert_eq!(r.code, Some(2), "simulate {special}: {}", r.stderr);
        assert!(r.stderr.contains("not a regular file"), "{}", r.stderr);
        let r = run(&["test", special]);
        assert_eq!(r.code, Some(2), "test {special}: {}", r.stderr);
        assert!(r.stderr.contains("not a regular file"), "{}", r.stderr);

        // `extends:` inside a policy: an invalid policy, with the reason.
        let policy = write(
            dir.path(),
            "extends.yaml",
            &format!("version: 1\nextends: {special}\n"),
        );
        let r = run(&["validate", s(&policy)]);
        assert_eq!(r.code, Some(1), "extends: {special}: {}", r.stderr);
        assert!(r.stderr.contains("missing-extends"), "{}", r.stderr);
        assert!(r.stderr.contains("not a regular file"), "{}", r.stderr);
    }
}

#[test]
fn files_over_the_limits_are_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    // Sparse files: over the limit without writing the bytes.
    let policy = dir.path().join("big.yaml");
    std::fs::File::create(&policy)
        .unwrap()
        .set_len((1 << 20) + 1)
        .unwrap();
    let r = run(&["validate", s(&policy)]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("larger than the 1048576-byte limit for policy files"),
        "{}",
        r.stderr
    );
    let parent = write(dir.path(), "child.yaml", "version: 1\nextends: big.yaml\n");
    let r = run(&["validate", s(&parent)]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("1048576-byte limit"), "{}", r.stderr);

    let transcript = dir.path().join("big.jsonl");
    std::fs::File::create(&transcript)
        .unwrap()
        .set_len((64 << 20) + 1)
        .unwrap();
    let r = run(&["simulate", s(&transcript)]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("larger than the 67108864-byte limit for transcripts"),
        "{}",
        r.stderr
    );
}

/// A diagnostic at a column past 65,535 (a 70 KB single-line policy) used to panic miette's
/// renderer; the snippet now shows a window of the line, and the true line and column.
#[test]
fn a_diagnostic_past_column_65535_renders_a_window_of_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!("version: 1\ndescription: {} : bad: [\n", "x".repeat(70_000));
    let policy = write(dir.path(), "long-line.yaml", &text);
    let r = run(&["validate", s(&policy)]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("long-line.yaml:2:70015]"), "{}", r.stderr);
    assert!(r.stderr.contains("yaml-syntax"), "{}", r.stderr);
    let widest = r.stderr.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(widest < 200, "a line of {widest} characters was printed");

    // The same column in JSON, and an error on the line after a long one.
    let r = run(&["validate", "--error-format", "json", s(&policy)]);
    let report: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(report["diagnostics"][0]["line"], 2);
    assert_eq!(report["diagnostics"][0]["column"], 70015);
    let text = format!(
        "version: 1\ndescription: \"{}\"\nwindow: {{ size: x }}\n",
        "é".repeat(70_000)
    );
    let policy = write(dir.path(), "after-long-line.yaml", &text);
    let r = run(&["validate", s(&policy)]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("after-long-line.yaml:3:"), "{}", r.stderr);
    let widest = r.stderr.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(widest < 200, "a line of {widest} characters was printed");
}

/// `extends:` (or `--rules`, or `validate PATH`) naming a file that is not a policy used to put
/// the file's contents in the diagnostic's snippet: the process environment for
/// `/proc/self/environ`, with every API key in it.
#[test]
fn a_file_that_is_not_a_policy_is_never_quoted_in_diagnostics() {
    const SECRET: &str = "sk-secret-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let env_file = write(
        dir.path(),
        "secrets.env",
        &format!("OPENAI_API_KEY={SECRET}\nOTHER=1\n"),
    );
    let yaml_secrets = write(
        dir.path(),
        "secrets.yaml",
        &format!("api_key: {SECRET}\nregion: eu\n"),
    );
    let broken_secrets = write(
        dir.path(),
        "broken.yaml",
        &format!("token: [{SECRET}\n  : {{{SECRET}\n"),
    );
    let transcript = write(dir.path(), "t.jsonl", EVENTS);
    let mut targets = vec![
        s(&env_file).to_owned(),
        s(&yaml_secrets).to_owned(),
        s(&broken_secrets).to_owned(),
    ];
    if Path::new("/proc/self/environ").exists() {
        targets.push("/proc/self/environ".to_owned());
    }
    for target in &targets {
        let policy = write(
            dir.path(),
            "extends.yaml",
            &format!("version: 1\nextends: {target}\n"),
        );
        let runs = [
            vec!["validate", s(&policy)],
            vec!["validate", target.as_str()],
            vec!["simulate", "--rules", target.as_str(), s(&transcript)],
            vec!["simulate", "--rules", s(&policy), s(&transcript)],
        ];
        for args in runs {
            let out = loopctl_clean()
                .args(&args)
                .env("LOOPGUARD_TEST_API_KEY", SECRET)
                .timeout(PATIENCE)
                .output()
                .expect("run loopctl");
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(
                !stdout.contains(SECRET) && !stderr.contains(SECRET),
                "{args:?} printed the secret:\n{stdout}\n{stderr}"
            );
            assert!(stderr.contains("is not quoted"), "{args:?}: {stderr}");
        }
    }
}

/// A 150,000-character glob (`*a*a*a…`) in a 200 KB policy panicked inside `globset`.
#[test]
fn a_150000_character_glob_is_refused_with_the_limit_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "version: 1\ncategories:\n  x:\n    tools: [\"{}\"]\n  y:\n    tools: [\"{}\"]\n",
        "*a".repeat(75_000),
        "*b".repeat(25_000)
    );
    assert!(text.len() > 200_000);
    let policy = write(dir.path(), "long-glob.yaml", &text);
    let r = run(&["validate", s(&policy)]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("too-complex"), "{}", r.stderr);
    assert!(r.stderr.contains("1024 bytes"), "{}", r.stderr);
    let r = run(&[
        "simulate",
        "--rules",
        s(&policy),
        s(&write(dir.path(), "t.jsonl", EVENTS)),
    ]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
}

/// 1,000 `\w{20}N` regexes (26 KB) each fit the per-regex limit but took 38 s and 1.2 GB to
/// validate together; the policy's total budget refuses them after a few.
/// `loopctl validate --error-format json` on a policy it must refuse: the diagnostics, and how
/// long it took.
fn refused(policy: &Path) -> (Vec<serde_json::Value>, Duration) {
    let started = std::time::Instant::now();
    let r = run(&["validate", "--error-format", "json", s(policy)]);
    let took = started.elapsed();
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    let report: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let diags = report["diagnostics"].as_array().unwrap().clone();
    (diags, took)
}

#[test]
fn a_thousand_large_regexes_exhaust_the_policy_budget_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("version: 1\nresults:\n  error_patterns:\n");
    for i in 0..1000 {
        text.push_str(&format!("    - '\\w{{20}}{i}'\n"));
    }
    let policy = write(dir.path(), "many-regexes.yaml", &text);
    let (diags, took) = refused(&policy);
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0]["code"], "too-complex");
    assert!(
        diags[0]["label"]
            .as_str()
            .unwrap()
            .contains("4194304-byte limit"),
        "{diags:?}"
    );
    // A sanity bound only (a debug build on a slow machine): it used to take 38 s.
    assert!(took < Duration::from_secs(20), "validation took {took:?}");
}

/// Each tool name of a category was compared with every earlier pattern of the other
/// categories by compiling one of the two into a glob automaton: 300 names beside the default
/// policy's categories took 4.4 s to validate in a debug build (the fuzzer found a policy
/// that took 6 s). Plain names are now compared as strings, each glob is compiled once, and a
/// policy holds at most 512 globs.
#[test]
fn long_tool_lists_beside_other_categories_validate_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..3000).map(|i| format!("tool_{i}")).collect();
    let text = format!(
        "version: 1\nextends: builtin:default\ncategories:\n  mine:\n    tools: [{}, read_file]\n",
        names.join(", ")
    );
    let policy = write(dir.path(), "long-lists.yaml", &text);
    let (diags, took) = refused(&policy);
    // `read_file` is in the default policy's `exploration` category too.
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0]["code"], "tool-in-two-categories");

    let globs: Vec<String> = (0..600).map(|i| format!("\"mcp__s{i}__*\"")).collect();
    let text = format!(
        "version: 1\ncategories:\n  mcp:\n    tools: [{}]\n  other:\n    tools: [{}]\n",
        globs.join(", "),
        names.join(", ")
    );
    let policy = write(dir.path(), "many-globs.yaml", &text);
    let (diags, took_globs) = refused(&policy);
    let took = took + took_globs;
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert!(
        diags[0]["label"].as_str().unwrap().contains("512 globs"),
        "{diags:?}"
    );
    // A sanity bound only (a debug build on a slow machine).
    assert!(took < Duration::from_secs(20), "validation took {took:?}");
}

/// `simulate` recounted lines from the start of the file for every chat message (4.6 MB took
/// 46 s) and looked sessions up in a list (100,000 one-event sessions took 83 s). The bound
/// here is a sanity check only, generous for a debug build: both now take a few seconds.
#[test]
fn simulate_is_linear_in_messages_and_in_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let mut sessions = String::new();
    for i in 0..100_000 {
        sessions.push_str(&format!(
            "{{\"type\":\"call\",\"session\":\"s{i}\",\"id\":\"a\",\"tool\":\"ls\"}}\n"
        ));
    }
    let sessions = write(dir.path(), "sessions.jsonl", &sessions);

    // 20,000 exchanges (about 5 MB), one message per line, ending in a loop.
    let mut messages = Vec::new();
    let exchange = |i: usize, path: &str| {
        [
            format!(
                "{{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{{\"id\":\"c{i}\",\"type\":\"function\",\"function\":{{\"name\":\"read_file\",\"arguments\":\"{{\\\"path\\\":\\\"{path}\\\"}}\"}}}}]}}"
            ),
            format!(
                "{{\"role\":\"tool\",\"tool_call_id\":\"c{i}\",\"content\":\"{}\"}}",
                "x".repeat(150)
            ),
        ]
    };
    for i in 0..20_000 {
        messages.extend(exchange(i, &format!("src/f{i}.rs")));
    }
    for i in 20_000..20_004 {
        messages.extend(exchange(i, "src/same.rs"));
    }
    let chat = write(
        dir.path(),
        "chat.json",
        &format!("[\n{}\n]\n", messages.join(",\n")),
    );
    assert!(std::fs::metadata(&chat).unwrap().len() > 4_600_000);

    let started = std::time::Instant::now();
    let r = run(&["simulate", "--quiet", s(&sessions)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = run(&["simulate", "--json", s(&chat)]);
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    let took = started.elapsed();
    // Lines are still right at the end of the file: one event per message, message N (from
    // 1) on line N + 1; the first intervention is on the result of the third identical read.
    let first: serde_json::Value = serde_json::from_str(r.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(first["event"], 2 * 20_003, "{first}");
    assert_eq!(first["line"], 2 * 20_003 + 1, "{first}");
    assert!(took < Duration::from_secs(40), "took {took:?}");
}
