#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! Scenario transcripts replayed through the real `loopctl simulate`.
//!
//! Each file in `tests/scenarios/` is an event-JSONL transcript whose `//` header says which policy
//! to use and what must (not) happen:
//!
//! - `// rules: rules/nudge.yaml` — the policy (default: the built-in default policy);
//! - `// expect-none` — no intervention at all;
//! - `// expect-first: <conds>` — the first intervention meets every condition;
//! - `// expect-some: <conds>` — some intervention meets every condition;
//! - `// expect-no: <conds>` — no intervention meets every condition.
//!
//! A condition is `field=value`, `field>=n`, `field<=n` or `field~text` (contains), on the fields
//! of `simulate --json`: `call`, `turn`, `event`, `count`, `action`, `detector`, `message`, ….

use std::path::PathBuf;

use loopguard_tests::{loopctl, root};
use serde_json::Value;

fn scenario_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in ["tests/scenarios", "tests/scenarios/presets"] {
        for entry in std::fs::read_dir(root().join(dir)).expect("scenario dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "jsonl") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn holds(intervention: &Value, cond: &str) -> bool {
    let (field, op, want) = ["<=", ">=", "=", "~"]
        .iter()
        .find_map(|op| cond.split_once(op).map(|(f, w)| (f, *op, w)))
        .unwrap_or_else(|| panic!("bad condition `{cond}`"));
    let got = &intervention[field];
    match op {
        "=" => match got {
            Value::Number(n) => n.as_f64() == want.parse::<f64>().ok(),
            Value::String(s) => s == want,
            Value::Null => want == "null",
            other => serde_json::from_str::<Value>(want).is_ok_and(|w| &w == other),
        },
        "~" => got.as_str().is_some_and(|s| s.contains(want)),
        _ => {
            let (Some(got), Ok(want)) = (got.as_f64(), want.parse::<f64>()) else {
                return false;
            };
            if op == "<=" { got <= want } else { got >= want }
        }
    }
}

fn meets(intervention: &Value, conds: &str) -> bool {
    conds.split_whitespace().all(|c| holds(intervention, c))
}

#[test]
fn scenarios_behave_as_their_headers_say() {
    let files = scenario_files();
    assert!(
        files.len() >= 25,
        "scenario suite present, found {}",
        files.len()
    );
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read scenario");
        let header: Vec<&str> = text
            .lines()
            .take_while(|l| l.starts_with("//"))
            .map(|l| l.trim_start_matches("//").trim())
            .collect();
        let mut cmd = loopctl();
        cmd.arg("simulate").arg("--json");
        if let Some(rules) = header.iter().find_map(|h| h.strip_prefix("rules: ")) {
            cmd.arg("--rules").arg(rules);
        }
        let rel = file.strip_prefix(root()).expect("under root");
        let out = cmd.arg(rel).output().expect("run loopctl simulate");
        let stdout = String::from_utf8(out.stdout).expect("utf-8");
        let interventions: Vec<Value> = stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect();
        let expected_code = if header.contains(&"expect-none") {
            0
        } else {
            3
        };
        let mut problems = Vec::new();
        if out.status.code() != Some(expected_code) {
            problems.push(format!(
                "exit code {:?}, expected {expected_code}; stderr: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        for h in &header {
            if *h == "expect-none" && !interventions.is_empty() {
                problems.push("expected no intervention".to_owned());
            } else if let Some(conds) = h.strip_prefix("expect-first: ") {
                if !interventions.first().is_some_and(|i| meets(i, conds)) {
                    problems.push(format!("first intervention does not meet `{conds}`"));
                }
            } else if let Some(conds) = h.strip_prefix("expect-some: ") {
                if !interventions.iter().any(|i| meets(i, conds)) {
                    problems.push(format!("no intervention meets `{conds}`"));
                }
            } else if let Some(conds) = h.strip_prefix("expect-no: ")
                && interventions.iter().any(|i| meets(i, conds))
            {
                problems.push(format!("an intervention meets `{conds}`"));
            }
        }
        if !problems.is_empty() {
            failures.push(format!(
                "{}:\n  {}\n  interventions:\n    {}",
                rel.display(),
                problems.join("\n  "),
                interventions
                    .iter()
                    .map(Value::to_string)
                    .collect::<Vec<_>>()
                    .join("\n    ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} scenario(s) failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
