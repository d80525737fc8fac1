#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `loopctl validate` and `loopctl schema`, run as the real binary.

use std::path::{Path, PathBuf};

use loopguard_tests::{loopctl, root};

fn fixtures() -> Vec<PathBuf> {
    let dir = root().join("tests/fixtures/policies");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// The `# expect: <code> <line>:<col>` header of a fixture.
fn expectation(path: &Path) -> (String, u64, u64) {
    let text = std::fs::read_to_string(path).expect("read fixture");
    let first = text.lines().next().expect("header line");
    let rest = first
        .strip_prefix("# expect: ")
        .expect("fixture starts with `# expect:`");
    let (code, at) = rest.split_once(' ').expect("code and position");
    let (line, col) = at.split_once(':').expect("line:col");
    (
        code.to_owned(),
        line.parse().expect("line"),
        col.parse().expect("col"),
    )
}

#[test]
fn shipped_policies_are_valid_without_warnings() {
    loopctl()
        .current_dir(root())
        .args(["validate", "--deny-warnings", "rules/"])
        .assert()
        .success();
}

#[test]
fn every_broken_policy_reports_its_diagnostic_at_the_right_place() {
    let bless = std::env::var_os("LOOPGUARD_BLESS").is_some();
    let mut blessed = Vec::new();
    let files = fixtures();
    assert!(files.len() >= 30, "the fixture suite is present");
    for file in files {
        let (code, line, col) = expectation(&file);
        let rel = file.strip_prefix(root()).expect("under root").to_path_buf();
        let out = loopctl()
            .current_dir(root())
            .args(["validate", "--deny-warnings", "--error-format", "json"])
            .arg(&rel)
            .output()
            .expect("run loopctl");
        assert_eq!(
            out.status.code(),
            Some(1),
            "{} must be invalid",
            rel.display()
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json report");
        let diags = report["diagnostics"].as_array().expect("diagnostics");
        let found = diags.iter().any(|d| {
            d["code"] == code.as_str() && (line == 0 || (d["line"] == line && d["column"] == col))
        });
        assert!(
            found,
            "{}: expected `{code}` at {line}:{col}, got {diags:#?}",
            rel.display()
        );

        // The human rendering is compared with the reviewed snapshot beside the fixture.
        let human = loopctl()
            .current_dir(root())
            .args(["validate", "--deny-warnings"])
            .arg(&rel)
            .output()
            .expect("run loopctl");
        let rendered = String::from_utf8(human.stderr).expect("utf-8");
        let snapshot = file.with_extension("expected");
        let expected = std::fs::read_to_string(&snapshot).ok();
        if bless {
            // Blessing writes what changed and says so; it compares nothing.
            if expected.as_deref() != Some(rendered.as_str()) {
                std::fs::write(&snapshot, &rendered).expect("write snapshot");
                blessed.push(snapshot.display().to_string());
            }
            continue;
        }
        let expected =
            expected.unwrap_or_else(|| panic!("missing snapshot {}", snapshot.display()));
        assert_eq!(
            rendered,
            expected,
            "rendered diagnostics of {} changed",
            rel.display()
        );
    }
    if bless {
        println!(
            "blessed {} snapshot(s); review the diff: {blessed:?}",
            blessed.len()
        );
    }
}

#[test]
fn all_errors_are_reported_together() {
    let out = loopctl()
        .current_dir(root())
        .args([
            "validate",
            "--error-format",
            "json",
            "tests/fixtures/policies/many-errors.yaml",
        ])
        .output()
        .expect("run");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let codes: Vec<&str> = report["diagnostics"]
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|d| d["code"].as_str())
        .collect();
    for code in ["unknown-key", "unknown-value", "inverted-range"] {
        assert!(codes.contains(&code), "{code} missing from {codes:?}");
    }
}

#[test]
fn exit_codes_distinguish_invalid_from_cannot_run() {
    loopctl()
        .args(["validate", "no/such/policy.yaml"])
        .assert()
        .code(2);
    let dir = root().join("tests/fixtures/policies");
    // One missing file among valid ones: the others are still checked, and it cannot run.
    loopctl()
        .current_dir(root())
        .args(["validate", "rules/default.yaml", "no/such.yaml"])
        .assert()
        .code(2);
    loopctl()
        .arg("validate")
        .arg(dir.join("unknown-key.yaml"))
        .assert()
        .code(1);
    // Warnings pass unless denied.
    loopctl()
        .arg("validate")
        .arg(dir.join("threshold-one.yaml"))
        .assert()
        .code(0);
    loopctl()
        .arg("validate")
        .arg("--deny-warnings")
        .arg(dir.join("threshold-one.yaml"))
        .assert()
        .code(1);
    loopctl()
        .args(["validate", "--error-format", "xml", "rules/"])
        .assert()
        .code(2);
}

#[test]
fn schema_validates_every_shipped_policy_and_rejects_a_typo() {
    let out = loopctl().arg("schema").output().expect("run");
    assert!(out.status.success());
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).expect("schema is JSON");
    let validator = jsonschema::draft7::new(&schema).expect("schema compiles");
    let mut checked = 0;
    for entry in std::fs::read_dir(root().join("rules")).expect("rules dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
        let doc: serde_json::Value = serde_saphyr::from_str(&text).expect("yaml");
        let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{}: {errors:?}", path.display());
        checked += 1;
    }
    assert!(checked >= 6, "all shipped policies checked");
    let typo = serde_json::json!({"version": 1, "detectors": {"exact_repeat": {"treshold": 3}}});
    assert!(!validator.is_valid(&typo));
    let bad_action = serde_json::json!({"version": 1, "ladders": {"x": [{"action": "stop"}]}});
    assert!(!validator.is_valid(&bad_action));
}

#[test]
fn the_rule_reference_is_generated_from_the_declarations() {
    let readme =
        std::fs::read_to_string(root().join("docs/reference.md")).expect("docs/reference.md");
    let start = "<!-- reference:start -->\n";
    let end = "<!-- reference:end -->";
    let from = readme.find(start).expect("start marker") + start.len();
    let to = readme.find(end).expect("end marker");
    let generated = loopguard_rules::generate::reference_markdown();
    assert!(
        readme[from..to] == generated,
        "docs/reference.md is stale: run `loopctl schema --reference` and paste it between the markers"
    );
}

#[test]
fn extends_builtin_names_a_shipped_policy_from_any_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mine = dir.path().join("mine.yaml");
    std::fs::write(
        &mine,
        "version: 1\nname: mine\nextends: builtin:default\ndetectors:\n  exact_repeat: { threshold: 4 }\n",
    )
    .unwrap();
    loopctl()
        .current_dir(dir.path())
        .args(["validate", "mine.yaml"])
        .assert()
        .code(0);
    // The built-in strict policy extends the built-in default in turn.
    std::fs::write(&mine, "version: 1\nname: mine\nextends: builtin:strict\n").unwrap();
    loopctl()
        .current_dir(dir.path())
        .args(["validate", "mine.yaml"])
        .assert()
        .code(0);
    // It replays like the shipped file would.
    let example = loopguard_tests::root().join("examples/looping-openai.json");
    loopctl()
        .current_dir(dir.path())
        .args(["simulate", "--rules", "mine.yaml"])
        .arg(&example)
        .assert()
        .code(3);
    std::fs::write(&mine, "version: 1\nname: mine\nextends: builtin:nope\n").unwrap();
    let assert = loopctl()
        .current_dir(dir.path())
        .args(["validate", "mine.yaml"])
        .assert()
        .code(1);
    let output = assert.get_output();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(out.contains("no built-in policy `nope`"), "{out}");
    assert!(out.contains("builtin:default"), "{out}");
}
