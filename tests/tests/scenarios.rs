#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! Scenario transcripts replayed through the real `loopctl simulate`.
//!
//! Each file in `tests/scenarios/` is an event-JSONL transcript whose `//` header says which policy
//! to use and what must (not) happen:
//!
//! - `// scenario: <text>` — what the transcript shows;
//! - `// rules: rules/nudge.yaml` — the policy (default: the built-in default policy);
//! - `// expect-none` — no intervention at all;
//! - `// expect-first: <conds>` — the first intervention meets every condition;
//! - `// expect-some: <conds>` — some intervention meets every condition;
//! - `// expect-no: <conds>` — no intervention meets every condition;
//! - `// note: <text>` — shown with a failure (why an expectation is disputed, or known to fail).
//!
//! A condition is `field=value`, `field>=n`, `field<=n` or `field~text` (contains), on the fields
//! of `simulate --json`: `call`, `turn`, `event`, `count`, `action`, `detector`, `message`, ….
//!
//! The header is strict: any other `//` line, a directive after the first event, a condition on
//! an unknown field, an `ok-*` file without `expect-none`, or a `catch-*` file whose
//! `expect-first` does not pin the call (or turn) range, the action and the detector fails.

use std::path::{Path, PathBuf};

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

/// The fields of a `simulate --json` record a condition may test.
const FIELDS: &[&str] = &[
    "file", "session", "call", "turn", "event", "line", "kind", "tool", "action", "detector",
    "rule", "count", "message",
];

/// A condition split into field, operator and wanted value.
fn parse_condition(cond: &str) -> Result<(&str, &str, &str), String> {
    let (field, op, want) = ["<=", ">=", "=", "~"]
        .iter()
        .find_map(|op| cond.split_once(op).map(|(f, w)| (f, *op, w)))
        .ok_or_else(|| format!("bad condition `{cond}`: expected field=value, >=, <= or ~"))?;
    if !FIELDS.contains(&field) {
        return Err(format!(
            "unknown field `{field}` in `{cond}`; known: {}",
            FIELDS.join(", ")
        ));
    }
    if matches!(op, "<=" | ">=") && want.parse::<f64>().is_err() {
        return Err(format!("`{cond}` compares with a number"));
    }
    Ok((field, op, want))
}

fn holds(intervention: &Value, (field, op, want): (&str, &str, &str)) -> bool {
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

/// A header directive.
enum Directive<'a> {
    Scenario,
    Rules(&'a str),
    Note(&'a str),
    None,
    First(Vec<(&'a str, &'a str, &'a str)>),
    Some(Vec<(&'a str, &'a str, &'a str)>),
    No(Vec<(&'a str, &'a str, &'a str)>),
}

fn conditions(text: &str) -> Result<Vec<(&str, &str, &str)>, String> {
    let conds: Vec<_> = text
        .split_whitespace()
        .map(parse_condition)
        .collect::<Result<_, _>>()?;
    if conds.is_empty() {
        return Err("a directive without conditions".into());
    }
    Ok(conds)
}

fn directive(line: &str) -> Result<Directive<'_>, String> {
    let d = line.trim_start_matches("//").trim();
    if d == "expect-none" {
        return Ok(Directive::None);
    }
    let Some((name, rest)) = d.split_once(": ") else {
        return Err(format!("unknown header line `{line}`"));
    };
    Ok(match name {
        "scenario" => Directive::Scenario,
        "rules" => Directive::Rules(rest.trim()),
        "note" => Directive::Note(rest.trim()),
        "expect-first" => Directive::First(conditions(rest)?),
        "expect-some" => Directive::Some(conditions(rest)?),
        "expect-no" => Directive::No(conditions(rest)?),
        _ => return Err(format!("unknown header directive `{name}` in `{line}`")),
    })
}

/// The header of a scenario file, or what is wrong with it.
fn header<'a>(file: &Path, text: &'a str) -> Result<Vec<Directive<'a>>, String> {
    let mut directives = Vec::new();
    let mut in_header = true;
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        if !t.starts_with("//") {
            in_header = false;
            continue;
        }
        if !in_header {
            return Err(format!(
                "line {}: `{t}` comes after the first event; directives belong in the header",
                n + 1
            ));
        }
        directives.push(directive(t).map_err(|e| format!("line {}: {e}", n + 1))?);
    }
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let none = directives.iter().any(|d| matches!(d, Directive::None));
    let expects = directives
        .iter()
        .filter(|d| {
            matches!(
                d,
                Directive::None | Directive::First(_) | Directive::Some(_) | Directive::No(_)
            )
        })
        .count();
    if expects == 0 {
        return Err("the header expects nothing".into());
    }
    if none && expects > 1 {
        return Err("`expect-none` with other expectations".into());
    }
    if name.starts_with("ok-") && !none {
        return Err("an `ok-*` scenario must say `expect-none`".into());
    }
    if name.starts_with("catch-") {
        // A catch scenario pins where the first intervention lands, what it does and who found it.
        let pinned = directives.iter().any(|d| match d {
            Directive::First(conds) => {
                let has =
                    |field: &str, op: &str| conds.iter().any(|(f, o, _)| *f == field && *o == op);
                let range = ["call", "turn"]
                    .iter()
                    .any(|f| has(f, "=") || (has(f, ">=") && has(f, "<=")));
                range && has("action", "=") && has("detector", "=")
            }
            _ => false,
        });
        if !pinned {
            return Err(
                "a `catch-*` scenario needs `expect-first:` with the call (or turn) range \
                 (`call>=a call<=b` or `call=n`), `action=` and `detector=`"
                    .into(),
            );
        }
    }
    Ok(directives)
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
        let rel = file.strip_prefix(root()).expect("under root");
        let text = std::fs::read_to_string(file).expect("read scenario");
        let header = match header(file, &text) {
            Ok(h) => h,
            Err(e) => {
                failures.push(format!("{}: bad header: {e}", rel.display()));
                continue;
            }
        };
        let mut cmd = loopctl();
        cmd.arg("simulate").arg("--json");
        for d in &header {
            if let Directive::Rules(rules) = d {
                cmd.arg("--rules").arg(rules);
            }
        }
        let out = cmd.arg(rel).output().expect("run loopctl simulate");
        let stdout = String::from_utf8(out.stdout).expect("utf-8");
        let interventions: Vec<Value> = stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect();
        let none = header.iter().any(|d| matches!(d, Directive::None));
        let expected_code = if none { 0 } else { 3 };
        let mut problems = Vec::new();
        if out.status.code() != Some(expected_code) {
            problems.push(format!(
                "exit code {:?}, expected {expected_code}; stderr: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let meets = |i: &Value, conds: &[(&str, &str, &str)]| conds.iter().all(|c| holds(i, *c));
        let shown = |conds: &[(&str, &str, &str)]| {
            conds
                .iter()
                .map(|(f, o, w)| format!("{f}{o}{w}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        for d in &header {
            let problem = match d {
                Directive::None if !interventions.is_empty() => {
                    "expected no intervention".to_owned()
                }
                Directive::First(conds)
                    if !interventions.first().is_some_and(|i| meets(i, conds)) =>
                {
                    format!("first intervention does not meet `{}`", shown(conds))
                }
                Directive::Some(conds) if !interventions.iter().any(|i| meets(i, conds)) => {
                    format!("no intervention meets `{}`", shown(conds))
                }
                Directive::No(conds) if interventions.iter().any(|i| meets(i, conds)) => {
                    format!("an intervention meets `{}`", shown(conds))
                }
                _ => continue,
            };
            problems.push(problem);
        }
        if !problems.is_empty() {
            for d in &header {
                if let Directive::Note(note) = d {
                    problems.push(format!("note: {note}"));
                }
            }
            failures.push(format!(
                "{}:\n  {}\n  interventions:\n    {}",
                rel.display(),
                problems.join("\n  "),
                interventions
                    .iter()
                    .map(|i| {
                        format!(
                            "call {} turn {} {} {} {} ×{} {}",
                            i["call"],
                            i["turn"],
                            i["kind"],
                            i["action"],
                            i["detector"],
                            i["count"],
                            i["rule"]
                        )
                    })
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

#[test]
fn a_header_line_the_runner_does_not_know_fails() {
    // Regression: an unknown `//` directive (a typo such as `expect-frist`) used to be skipped,
    // so the scenario silently checked nothing.
    let file = Path::new("catch-x.jsonl");
    let event = "{\"type\": \"call\", \"tool\": \"ls\"}\n";
    let bad = |header: &str| header_error(file, &format!("{header}{event}"));
    assert!(bad("// expect-frist: call=3\n").contains("unknown header directive"));
    assert!(bad("// expect first call=3\n").contains("unknown header line"));
    assert!(bad("// expect-first: cal=3 action=warn detector=x\n").contains("unknown field"));
    assert!(bad("// expect-first: call<=x\n").contains("number"));
    assert!(bad("// scenario: nothing expected\n").contains("expects nothing"));
    // A catch scenario must pin range, action and detector.
    assert!(bad("// expect-first: call<=4\n").contains("catch-*"));
    assert!(bad("// expect-first: call<=4 action=warn detector=cycle\n").contains("catch-*"));
    assert!(bad("// expect-first: call>=3 call<=4 detector=cycle\n").contains("catch-*"));
    // A directive after the first event is not part of the header.
    let late = format!("// expect-first: call=3 action=warn detector=x\n{event}// expect-none\n");
    assert!(header_error(file, &late).contains("after the first event"));
    // `ok-*` scenarios expect nothing to happen.
    let ok = Path::new("ok-x.jsonl");
    assert!(header_error(ok, &format!("// expect-no: call<=3\n{event}")).contains("ok-*"));
    assert!(header(ok, &format!("// scenario: fine\n// expect-none\n{event}")).is_ok());
    assert!(
        header(
            file,
            &format!("// expect-first: call>=3 call<=4 action=warn detector=cycle\n{event}")
        )
        .is_ok()
    );
    assert!(
        header(
            file,
            &format!("// expect-first: turn=1 action=warn detector=chanting\n{event}")
        )
        .is_ok()
    );
}

fn header_error(file: &Path, text: &str) -> String {
    match header(file, text) {
        Ok(_) => panic!("header accepted: {text}"),
        Err(e) => e,
    }
}
