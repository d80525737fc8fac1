#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! Detector plugins end to end: the workspace's plugin crates built as shared libraries, loaded
//! through policies by the engine (feature `plugins`) and by the real `loopctl` binary.

use std::path::{Path, PathBuf};

use loopguard_engine::{Action, Arguments, Call, Engine, Event, ToolResult, Verdict};
use loopguard_rules::Policy;
use loopguard_tests::{loopctl, plugin_path, root};
use serde_json::{Value, json};

// --- helpers ------------------------------------------------------------------------------------

/// A YAML string holding a path (double-quoted JSON is valid YAML).
fn quoted(path: &Path) -> String {
    serde_json::to_string(&path.display().to_string()).unwrap()
}

/// One `plugins:` entry for a built plugin package, with extra indented lines.
fn entry(package: &str, extra: &str) -> String {
    format!("  - path: {}\n{extra}", quoted(&plugin_path(package)))
}

fn policy(plugins: &str) -> Policy {
    let text = format!("version: 1\nplugins:\n{plugins}");
    let loaded = Policy::load_text(Path::new("inline.yaml"), text);
    assert!(!loaded.has_errors(), "{:?}", loaded.diagnostics);
    loaded.policy.unwrap()
}

fn engine(plugins: &str) -> Engine {
    Engine::builder(&policy(plugins))
        .build()
        .unwrap_or_else(|e| panic!("loading the plugins: {e}"))
}

fn call(engine: &Engine, id: &str, tool: &str, args: Value) -> Verdict {
    let t = id
        .trim_start_matches(|c: char| !c.is_ascii_digit())
        .parse::<u64>()
        .unwrap_or(0);
    engine.observe(&Event::Call(Call {
        session: "s1",
        call_id: id,
        tool,
        arguments: Arguments::Json(&args),
        time_ms: t * 1000,
    }))
}

fn result(engine: &Engine, id: &str, output: &str, is_error: bool) -> Verdict {
    let t = id
        .trim_start_matches(|c: char| !c.is_ascii_digit())
        .parse::<u64>()
        .unwrap_or(0);
    engine.observe(&Event::Result(ToolResult {
        session: "s1",
        call_id: id,
        output,
        is_error,
        exit_code: None,
        time_ms: t * 1000 + 500,
    }))
}

const QUERIES: [&str; 4] = [
    "def parse_config",
    "def parse_configs",
    "def  parse_config(",
    "def parse_conf",
];

/// The same failure of the index, whatever the query.
const INDEX_DOWN: &str = "Error: search index is rebuilding, query rejected";

/// `search` with typo-level changes, each failing the same way, with a successful read of a
/// different note between them (so no built-in detector sees a loop: no two calls are the
/// same, no failures in a row, no cycle of identical steps). Returns the verdicts on the
/// searches' results.
fn near_identical_searches(engine: &Engine) -> Vec<Verdict> {
    QUERIES
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let id = format!("c{}", 2 * i + 1);
            call(engine, &id, "search", json!({ "query": q }));
            let r = result(engine, &id, INDEX_DOWN, true);
            let read = format!("c{}", 2 * i + 2);
            call(
                engine,
                &read,
                "read_file",
                json!({ "path": format!("notes/{i}.md") }),
            );
            result(
                engine,
                &read,
                &format!("note {i}: plans for week {i}"),
                false,
            );
            r
        })
        .collect()
}

const DB: [(&str, u16); 3] = [
    ("db-1.internal", 5432),
    ("db-2.internal", 5433),
    ("db-3.internal", 6432),
];

/// Three connection attempts to different hosts, refused alike. Returns the result verdicts.
fn same_error_from_varied_calls(engine: &Engine) -> Vec<Verdict> {
    DB.iter()
        .enumerate()
        .map(|(i, (host, port))| {
            let id = format!("c{}", i + 1);
            let v = call(
                engine,
                &id,
                "connect_db",
                json!({"host": host, "port": port}),
            );
            assert!(v.is_allow(), "{v:?}");
            result(
                engine,
                &id,
                &format!(
                    "error: could not connect to postgres at {host}:{port}: connection refused"
                ),
                true,
            )
        })
        .collect()
}

fn temp_policy(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("policy.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The fixture policy, with its relative debug-build paths replaced by the libraries built now.
fn fixture_policy(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(root().join("tests/fixtures/plugins/plugins.yaml")).unwrap();
    let mut text = text;
    for package in ["loopguard-plugin-similarity", "loopguard-plugin-results"] {
        let file = format!(
            "libloopguard_plugin_{}.so",
            &package["loopguard-plugin-".len()..]
        );
        let written = format!("../../../target/debug/{file}");
        assert!(text.contains(&written), "the fixture names {written}");
        text = text.replace(&written, &quoted(&plugin_path(package)));
    }
    temp_policy(dir, &text)
}

fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

// --- the engine ---------------------------------------------------------------------------------

#[test]
fn similarity_catches_near_identical_arguments_that_the_built_in_detectors_miss() {
    // (`error_cascade`, one tool failing again and again, catches the 4th failure on its own.)
    let without = near_identical_searches(&Engine::builder(&policy("  []\n")).build().unwrap());
    assert!(without[..3].iter().all(Verdict::is_allow), "{without:?}");

    let similarity = entry("loopguard-plugin-similarity", "");
    let fresh = engine(&similarity);
    let engine = engine(&similarity);
    let verdicts = near_identical_searches(&engine);
    assert!(verdicts[..2].iter().all(Verdict::is_allow), "{verdicts:?}");
    // The third failing search, judged when its result arrives.
    let hit = &verdicts[2];
    assert_eq!(hit.action, Action::Warn, "{hit:?}");
    assert_eq!(hit.detector.as_deref(), Some("similarity"));
    assert_eq!(hit.rule.as_deref(), Some("ladders.default[0]"));
    assert_eq!(hit.count, 3, "{hit:?}");
    assert!(hit.message.contains("search("), "{}", hit.message);
    assert_eq!(hit.calls.len(), 1, "the call the event is about");
    assert_eq!(hit.calls[0].call_id, "c5");

    // The loop goes on: the same ladder climbs, as for a built-in detector (decided on a
    // result, the refusal is announced for the next search).
    let next = &verdicts[3];
    assert_eq!(next.detector.as_deref(), Some("similarity"), "{next:?}");
    assert!(next.message.contains("will be refused"), "{}", next.message);

    // Near-identical searches with new results each time are work, not a loop.
    let engine2 = fresh;
    for (i, q) in QUERIES.iter().enumerate() {
        let id = format!("c{}", i + 1);
        assert!(call(&engine2, &id, "search", json!({ "query": q })).is_allow());
        let r = result(&engine2, &id, &format!("1 result: notes/{q}-{i}.md"), false);
        assert!(r.is_allow(), "{r:?}");
    }
}

#[test]
fn results_catches_the_same_error_from_varied_calls() {
    let without =
        same_error_from_varied_calls(&Engine::builder(&policy("  []\n")).build().unwrap());
    assert!(without.iter().all(Verdict::is_allow), "{without:?}");

    let engine = engine(&entry("loopguard-plugin-results", ""));
    let verdicts = same_error_from_varied_calls(&engine);
    assert!(verdicts[..2].iter().all(Verdict::is_allow), "{verdicts:?}");
    let hit = &verdicts[2];
    assert_eq!(hit.action, Action::Warn, "{hit:?}");
    assert_eq!(hit.detector.as_deref(), Some("results"));
    assert_eq!(hit.count, 3);
    assert!(hit.message.contains("connect_db"), "{}", hit.message);
}

#[test]
fn the_policy_names_the_plugin_and_chooses_its_ladder() {
    let engine = engine(&entry(
        "loopguard-plugin-similarity",
        "    name: near-duplicate\n    ladder: break\n",
    ));
    assert_eq!(engine.plugins()[0].name(), "near-duplicate");
    assert_eq!(engine.plugins()[0].plugin().name(), "similarity");
    let hit = near_identical_searches(&engine).swap_remove(2);
    // `break` refuses at the first detection; decided on a result, the refusal is the next
    // search's, and this verdict announces it.
    assert_eq!(hit.action, Action::Warn, "{hit:?}");
    assert!(hit.message.contains("will be refused"), "{}", hit.message);
    assert_eq!(hit.detector.as_deref(), Some("near-duplicate"));
    assert_eq!(hit.rule.as_deref(), Some("ladders.break[0]"));
}

// A plugin that panics must not take the host down; it is skipped from then on, the verdict of
// the event on which it panicked says so once, and every other detector keeps working.
#[test]
fn a_panicking_plugin_is_poisoned_and_the_engine_keeps_working() {
    let engine = engine(&format!(
        "{}{}",
        entry("loopguard-plugin-panicky", ""),
        entry("loopguard-plugin-similarity", "")
    ));
    let first = call(&engine, "c0", "read_file", json!({"path": "README.md"}));
    let verdicts = near_identical_searches(&engine);
    assert!(first.is_allow(), "{first:?}");
    assert_eq!(first.notes.len(), 1, "{first:?}");
    let note = &first.notes[0];
    assert_eq!(note.code, "plugin_poisoned");
    assert_eq!(note.plugin, "panicky");
    assert!(note.message.contains("panicked"), "{}", note.message);
    assert!(engine.plugins()[0].is_poisoned());
    assert!(
        verdicts.iter().all(|v| v.notes.is_empty()),
        "the note comes once: {verdicts:?}"
    );
    // The other plugin still runs...
    assert_eq!(verdicts[2].detector.as_deref(), Some("similarity"));
    // ...and so do the built-in detectors.
    let bash: Vec<Verdict> = (10..13)
        .map(|i| {
            call(
                &engine,
                &format!("c{i}"),
                "bash",
                json!({"command": "cargo build"}),
            )
        })
        .collect();
    assert_eq!(
        bash[2].detector.as_deref(),
        Some("exact_repeat"),
        "{bash:?}"
    );
}

// A status outside the ABI is an error for that event, not a crash and not a detection.
#[test]
fn an_unknown_status_is_ignored_and_noted_once() {
    let engine = engine(&entry("loopguard-plugin-bad-status", ""));
    let v1 = call(&engine, "c1", "bash", json!({"command": "ls"}));
    assert!(v1.is_allow());
    assert_eq!(v1.notes.len(), 1, "{v1:?}");
    assert_eq!(v1.notes[0].code, "plugin_error");
    assert!(
        v1.notes[0].message.contains("77"),
        "{}",
        v1.notes[0].message
    );
    let v2 = call(&engine, "c2", "bash", json!({"command": "pwd"}));
    assert!(v2.is_allow() && v2.notes.is_empty(), "{v2:?}");
    assert_eq!(engine.plugins()[0].errors(), 2);
    assert!(!engine.plugins()[0].is_poisoned());
}

#[test]
fn the_noop_plugin_changes_no_verdict() {
    let plain = Engine::builder(&policy("  []\n")).build().unwrap();
    let with_noop = engine(&entry("loopguard-plugin-noop", ""));
    assert!(plain.rules().plugins().is_empty());
    assert_eq!(with_noop.rules().plugins().len(), 1);
    let script = [
        (
            "bash",
            json!({"command": "cargo test"}),
            "error: 3 tests failed",
            true,
        ),
        (
            "read_file",
            json!({"path": "src/lib.rs"}),
            "fn main() {}",
            false,
        ),
        (
            "bash",
            json!({"command": "cargo test"}),
            "error: 3 tests failed",
            true,
        ),
        (
            "bash",
            json!({"command": "cargo  test"}),
            "error: 3 tests failed",
            true,
        ),
        (
            "bash",
            json!({"command": "cargo test"}),
            "error: 3 tests failed",
            true,
        ),
        (
            "bash",
            json!({"command": "cargo test"}),
            "error: 3 tests failed",
            true,
        ),
    ];
    for (i, (tool, args, out, err)) in script.iter().enumerate() {
        let id = format!("c{}", i + 1);
        let a = call(&plain, &id, tool, args.clone());
        let b = call(&with_noop, &id, tool, args.clone());
        assert_eq!(a, b, "call {id}");
        assert_eq!(
            result(&plain, &id, out, *err),
            result(&with_noop, &id, out, *err)
        );
    }
}

#[test]
fn the_wrong_abi_is_refused_naming_the_file_and_both_versions() {
    let p = policy(&entry("loopguard-plugin-wrong-abi", ""));
    let errors = loopguard_engine::load_plugins(&p).unwrap_err();
    assert_eq!(errors.len(), 1);
    let msg = errors[0].to_string();
    assert!(msg.contains("libloopguard_plugin_wrong_abi"), "{msg}");
    assert!(msg.contains("9999"), "{msg}");
    assert!(msg.contains("version 1"), "{msg}");
    let d = errors[0].diagnostic();
    assert_eq!(d.code, "plugin-abi-mismatch");
    assert!(
        d.message.contains("9999") && d.message.contains("version 1"),
        "{}",
        d.message
    );
    assert_eq!(d.span.map(|s| (s.line, s.column)), Some((3, 11)));
}

#[test]
fn every_plugin_that_fails_to_load_is_reported() {
    let p = policy(&format!(
        "{}{}{}",
        entry(
            "loopguard-plugin-similarity",
            "    config: { threshold: high }\n"
        ),
        "  - path: no/such/libplugin.so\n",
        entry(
            "loopguard-plugin-results",
            "    config: { min_count: 50, window: 10 }\n"
        ),
    ));
    let errors = loopguard_engine::load_plugins(&p).unwrap_err();
    let codes: Vec<&str> = errors.iter().map(|e| e.diagnostic().code).collect();
    assert_eq!(
        codes,
        ["plugin-config", "plugin-not-found", "plugin-config"]
    );
    let lines: Vec<u32> = errors
        .iter()
        .map(|e| e.diagnostic().span.unwrap().line)
        .collect();
    assert_eq!(
        lines,
        [4, 5, 7],
        "config errors point at `config`, others at `path`"
    );
}

// --- loopctl ------------------------------------------------------------------------------------

#[test]
fn validate_loads_the_plugins_of_a_valid_policy() {
    let dir = tempfile::tempdir().unwrap();
    let ok = fixture_policy(dir.path());
    loopctl().arg("validate").arg(&ok).assert().success();

    let disabled = temp_policy(
        dir.path(),
        "version: 1\nplugins:\n  - path: missing/libnothing.so\n    enabled: false\n",
    );
    loopctl().arg("validate").arg(&disabled).assert().success();
}

#[test]
fn validate_reports_each_plugin_that_does_not_load_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "version: 1\nplugins:\n  - path: missing/libnothing.so\n{}{}",
        entry("loopguard-plugin-wrong-abi", ""),
        entry(
            "loopguard-plugin-similarity",
            "    config:\n      threshold: high\n"
        ),
    );
    let path = temp_policy(dir.path(), &text);
    let out = loopctl()
        .args(["validate", "--error-format", "json"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["valid"], false);
    assert_eq!(report["errors"], 3);
    let found: Vec<(String, u64, u64)> = report["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            assert!(d["file"].as_str().unwrap().ends_with("policy.yaml"), "{d}");
            (
                d["code"].as_str().unwrap().to_owned(),
                d["line"].as_u64().unwrap(),
                d["column"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            ("plugin-not-found".to_owned(), 3, 11),
            ("plugin-abi-mismatch".to_owned(), 4, 11),
            ("plugin-config".to_owned(), 7, 7),
        ]
    );
    let messages = report["diagnostics"].to_string();
    assert!(
        messages.contains("9999") && messages.contains("version 1"),
        "{messages}"
    );

    // The human report points at the file, line and column, and underlines the entry.
    let out = loopctl().arg("validate").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("policy.yaml:3:11"), "{stderr}");
    assert!(
        stderr.contains("plugin library `missing/libnothing.so` not found"),
        "{stderr}"
    );
    assert!(stderr.contains("3 errors"), "{stderr}");
}

#[test]
fn plugins_describes_each_library() {
    let similarity = plugin_path("loopguard-plugin-similarity");
    let out = loopctl().arg("plugins").arg(&similarity).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("similarity "), "{stdout}");
    assert!(stdout.contains("ABI version:   1"), "{stdout}");
    assert!(stdout.contains("thread-safe:"), "{stdout}");
    assert!(stdout.contains("\"threshold\""), "{stdout}");

    let noop = plugin_path("loopguard-plugin-noop");
    let out = loopctl()
        .args(["plugins", "--json"])
        .arg(&similarity)
        .arg(&noop)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let found = json_lines(&out.stdout);
    assert_eq!(found.len(), 2);
    assert_eq!(found[0]["name"], "similarity");
    assert_eq!(found[0]["abi_version"], 1);
    assert!(found[0]["config_schema"]["properties"]["threshold"].is_object());
    assert_eq!(found[1]["name"], "noop");
    assert_eq!(found[1]["thread_safe"], false);
    assert_eq!(found[1]["version"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn plugins_exits_2_for_a_file_that_is_not_a_plugin_and_describes_the_others() {
    let out = loopctl()
        .arg("plugins")
        .arg(plugin_path("loopguard-plugin-wrong-abi"))
        .arg("no/such/libplugin.so")
        .arg(plugin_path("loopguard-plugin-noop"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("libloopguard_plugin_wrong_abi"), "{stderr}");
    assert!(
        stderr.contains("9999") && stderr.contains("version 1"),
        "{stderr}"
    );
    assert!(stderr.contains("no/such/libplugin.so"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("noop "));
}

#[test]
fn simulate_shows_plugin_detections_where_the_built_in_detectors_stay_silent() {
    let dir = tempfile::tempdir().unwrap();
    let rules = fixture_policy(dir.path());
    let searches = root().join("tests/fixtures/plugins/near-identical-searches.jsonl");
    let errors = root().join("tests/fixtures/plugins/same-error-varied-calls.jsonl");

    // The built-in detectors alone see nothing.
    for transcript in [&searches, &errors] {
        let out = loopctl()
            .args(["simulate", "--json"])
            .arg(transcript)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout.is_empty());
    }

    let out = loopctl()
        .args(["simulate", "--json", "--rules"])
        .arg(&rules)
        .arg(&searches)
        .arg(&errors)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found = json_lines(&out.stdout);
    let first: Vec<(&str, &str, u64)> = found
        .iter()
        .map(|r| {
            (
                r["detector"].as_str().unwrap(),
                r["kind"].as_str().unwrap(),
                r["line"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        first,
        [("similarity", "result", 15), ("results", "result", 10)]
    );
    assert_eq!(found[0]["action"], "warn");
    assert_eq!(found[0]["tool"], "search");
    assert_eq!(found[1]["tool"], "connect_db");

    // The timeline names the plugins and shows their detections.
    let out = loopctl()
        .args(["simulate", "--rules"])
        .arg(&rules)
        .arg(&searches)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("plugins `similarity`, `results`"),
        "{stdout}"
    );
    assert!(stdout.contains("WARN  similarity ×"), "{stdout}");
}

#[test]
fn simulate_says_when_a_plugin_panicked_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let rules = temp_policy(
        dir.path(),
        &format!(
            "version: 1\nplugins:\n{}{}",
            entry("loopguard-plugin-panicky", ""),
            entry("loopguard-plugin-similarity", "")
        ),
    );
    let searches = root().join("tests/fixtures/plugins/near-identical-searches.jsonl");
    let out = loopctl()
        .args(["simulate", "--json", "--rules"])
        .arg(&rules)
        .arg(&searches)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found = json_lines(&out.stdout);
    assert_eq!(found[0]["note"], "plugin_poisoned", "{found:?}");
    assert_eq!(found[0]["plugin"], "panicky");
    assert_eq!(
        found[0]["event"], 1,
        "the user message is the first event it saw"
    );
    assert_eq!(found.iter().filter(|r| r.get("note").is_some()).count(), 1);
    assert!(
        found.iter().any(|r| r["detector"] == "similarity"),
        "{found:?}"
    );

    let out = loopctl()
        .args(["simulate", "--rules"])
        .arg(&rules)
        .arg(&searches)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("⚠ plugin_poisoned: plugin `panicky` panicked"),
        "{stdout}"
    );
}

#[test]
fn simulate_refuses_a_policy_whose_plugin_does_not_load() {
    let dir = tempfile::tempdir().unwrap();
    let rules = temp_policy(
        dir.path(),
        "version: 1\nplugins:\n  - path: libmissing.so\n",
    );
    let out = loopctl()
        .args(["simulate", "--rules"])
        .arg(&rules)
        .arg(root().join("tests/fixtures/plugins/near-identical-searches.jsonl"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("policy.yaml:3:11"), "{stderr}");
    assert!(
        stderr.contains("plugin library `libmissing.so` not found"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

// --- which files are loaded ---------------------------------------------------------------------

/// A copy of the built `noop` plugin in `dir`, with Unix mode `mode`.
#[cfg(unix)]
fn noop_copy(dir: &Path, mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("libnoop_copy.so");
    std::fs::copy(plugin_path("loopguard-plugin-noop"), &path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The one load error of a policy naming `path`, as a diagnostic code and message.
fn load_error(path: &Path) -> (String, String) {
    let p = policy(&format!("  - path: {}\n", quoted(path)));
    let errors = loopguard_engine::load_plugins(&p).unwrap_err();
    assert_eq!(errors.len(), 1);
    let d = errors[0].diagnostic();
    (d.code.to_owned(), d.message)
}

#[cfg(unix)]
#[test]
fn a_world_writable_library_is_refused_naming_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let lib = noop_copy(dir.path(), 0o666);
    let (code, message) = load_error(&lib);
    assert_eq!(code, "plugin-refused");
    assert!(
        message.contains("libnoop_copy.so") && message.contains("world-writable"),
        "{message}"
    );
    // Group-writable is refused too.
    set_mode(&lib, 0o664);
    let (_, message) = load_error(&lib);
    assert!(message.contains("group-writable"), "{message}");
    // `loopctl validate` says the same, at the entry's line.
    set_mode(&lib, 0o646);
    let policy = temp_policy(
        dir.path(),
        &format!("version: 1\nplugins:\n  - path: {}\n", quoted(&lib)),
    );
    let out = loopctl().arg("validate").arg(&policy).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("policy.yaml:3:11") && stderr.contains("world-writable"),
        "{stderr}"
    );
}

#[cfg(unix)]
#[test]
fn a_library_in_a_world_writable_directory_is_refused_naming_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("shared");
    std::fs::create_dir(&open).unwrap();
    let lib = noop_copy(&open, 0o755);
    // World-writable with the sticky bit (like /tmp) is refused all the same.
    for mode in [0o777, 0o1777, 0o775] {
        set_mode(&open, mode);
        let (code, message) = load_error(&lib);
        assert_eq!(code, "plugin-refused", "mode {mode:o}");
        assert!(
            message.contains("its directory") && message.contains("shared"),
            "{message}"
        );
    }
    set_mode(&open, 0o755);
}

#[cfg(unix)]
#[test]
fn a_fifo_plugin_path_is_refused_without_being_opened() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("libplugin.so");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success();
    assert!(made, "mkfifo");
    // Opening a FIFO without a writer blocks: returning at all shows it was not opened.
    let (code, message) = load_error(&fifo);
    assert_eq!(code, "plugin-refused");
    assert!(
        message.contains("libplugin.so") && message.contains("FIFO"),
        "{message}"
    );
    let out = loopctl()
        .arg("plugins")
        .arg(&fifo)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("FIFO"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(unix)]
#[test]
fn a_symlink_is_resolved_and_its_target_checked() {
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("shared");
    std::fs::create_dir(&open).unwrap();
    let lib = noop_copy(&open, 0o755);
    let link = dir.path().join("libnoop_link.so");
    std::os::unix::fs::symlink(&lib, &link).unwrap();
    // A safe target through a link loads...
    let p = policy(&format!("  - path: {}\n", quoted(&link)));
    let loaded = loopguard_engine::load_plugins(&p).unwrap();
    assert_eq!(loaded[0].plugin().path(), lib.canonicalize().unwrap());
    // ...an unsafe one is refused, naming the target.
    set_mode(&lib, 0o666);
    let (code, message) = load_error(&link);
    assert_eq!(code, "plugin-refused");
    assert!(
        message.contains("libnoop_link.so") && message.contains("libnoop_copy.so"),
        "{message}"
    );
}

#[test]
fn the_built_plugins_still_load() {
    let p = policy(&format!(
        "{}{}",
        entry("loopguard-plugin-noop", ""),
        entry("loopguard-plugin-similarity", "")
    ));
    assert_eq!(loopguard_engine::load_plugins(&p).unwrap().len(), 2);
    #[cfg(unix)]
    {
        let dir = tempfile::tempdir().unwrap();
        let lib = noop_copy(dir.path(), 0o755);
        assert!(
            loopguard_engine::load_plugins(&policy(&format!("  - path: {}\n", quoted(&lib))))
                .is_ok()
        );
    }
}

#[test]
fn validate_no_plugins_checks_a_policy_without_loading_its_plugins() {
    let dir = tempfile::tempdir().unwrap();
    // A "plugin" that is not a library: loading it fails, so a clean `--no-plugins` run shows
    // it was never handed to the loader.
    let not_a_library = dir.path().join("libnot_a_plugin.so");
    std::fs::write(&not_a_library, "not a shared library").unwrap();
    let path = temp_policy(
        dir.path(),
        &format!(
            "version: 1\nplugins:\n  - path: {}\n  - path: missing/libnothing.so\n",
            quoted(&not_a_library)
        ),
    );
    let out = loopctl()
        .args(["validate", "--no-plugins", "--error-format", "json"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["errors"], 0, "{report}");

    // Policy errors are still reported with --no-plugins.
    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        format!(
            "version: 1\nwindow: {{ size: 1 }}\nplugins:\n  - path: {}\n",
            quoted(&not_a_library)
        ),
    )
    .unwrap();
    let out = loopctl()
        .args(["validate", "--no-plugins"])
        .arg(&broken)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("window.size") && !stderr.contains("loadable"),
        "{stderr}"
    );

    // Without the flag, the plugins are loaded and their failures reported.
    let out = loopctl()
        .args(["validate", "--error-format", "json"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let codes: Vec<&str> = report["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["code"].as_str().unwrap())
        .collect();
    assert_eq!(
        codes,
        ["plugin-not-loadable", "plugin-not-found"],
        "{report}"
    );

    // The help says what loading a plugin means.
    let help = loopctl().args(["validate", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("Loading a plugin runs") && help.contains("--no-plugins"),
        "{help}"
    );
}

// --- one session's plugin work and another's ----------------------------------------------------

#[test]
fn a_slow_plugin_event_of_one_session_does_not_block_another_session() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "    config: {{ block_session: slow, dir: {} }}\n",
        quoted(dir.path())
    );
    let engine = std::sync::Arc::new(engine(&entry("loopguard-plugin-slow", &config)));
    // A session that the plugin serves from another shard than `slow` (the plugin declares 16).
    let shard = |s: &str| loopguard_plugin_sdk::session_shard(s, 16);
    let fast = (0..)
        .map(|i| format!("fast-{i}"))
        .find(|s| shard(s) != shard("slow"))
        .unwrap();

    let held = std::thread::spawn({
        let engine = std::sync::Arc::clone(&engine);
        move || {
            engine.observe(&Event::Call(Call {
                session: "slow",
                call_id: "s1",
                tool: "search",
                arguments: Arguments::Raw("{}"),
                time_ms: 1,
            }))
        }
    });
    // The slow event is inside the plugin once it has written `entered`.
    let entered = dir.path().join("entered");
    let start = std::time::Instant::now();
    while !entered.exists() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "the slow event never reached the plugin"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // Meanwhile another session's events go through the same plugin and the same engine.
    for i in 0..5u64 {
        let id = format!("f{i}");
        let args = format!(r#"{{"path":"notes/{i}.md"}}"#);
        engine.observe(&Event::Call(Call {
            session: &fast,
            call_id: &id,
            tool: "read",
            arguments: Arguments::Raw(&args),
            time_ms: i * 1000,
        }));
        engine.observe(&Event::Result(ToolResult {
            session: &fast,
            call_id: &id,
            output: &args,
            is_error: false,
            exit_code: None,
            time_ms: i * 1000 + 1,
        }));
    }
    assert_eq!(
        engine.with_session(&fast, |s| s.settings().is_empty()),
        Some(true)
    );
    assert!(
        !held.is_finished(),
        "the slow session's event is still held in the plugin while the other session went on"
    );
    std::fs::write(dir.path().join("release"), b"").unwrap();
    assert_eq!(held.join().unwrap().action, Action::Allow);
}
