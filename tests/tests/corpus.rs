#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! The project's own labelled corpus (`tests/corpus/`) as a gate: every case passes with the
//! built-in default policy, through the real `loopctl test` and the real `loopctl simulate`.
//!
//! The corpus covers the families of loops and of healthy runs the progress model is about
//! (see docs/progress.md); each family has loops and healthy runs, so a change
//! that trades one for the other fails here.

use std::collections::BTreeMap;
use std::path::PathBuf;

use loopguard_tests::{loopctl_clean as command, plugin_path, root};
use serde_json::Value;

fn corpus() -> PathBuf {
    root().join("tests/corpus")
}

fn cases() -> Vec<(PathBuf, Value)> {
    let dir = corpus();
    let mut found: Vec<(PathBuf, Value)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, v)
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// The families of the corpus: each is the file name's prefix and holds loops and healthy
/// runs (the productive-alternation, progress-edits and batch-edits families are healthy by
/// definition, their loops live under `alternation`).
const FAMILIES: &[(&str, bool, bool)] = &[
    ("volatile-results", true, true),
    ("conversational", true, true),
    ("same-failure", true, true),
    ("alternation", true, false),
    ("productive-alternation", false, true),
    ("text", true, true),
    ("narration", true, true),
    ("progress-edits", false, true),
    ("batch-edits", false, true),
    ("host-injected", true, true),
    ("stagnation", true, true),
    ("polling", true, true),
    ("bookkeeping", true, true),
    ("text-calls", true, true),
    ("idle", true, true),
    ("screen", true, true),
    ("terminal-echo", true, true),
];

#[test]
fn the_corpus_is_large_balanced_and_covers_every_family() {
    let cases = cases();
    assert!(cases.len() >= 60, "{} cases", cases.len());
    let loops = cases
        .iter()
        .filter(|(_, v)| v["expect"]["loop"] == true)
        .count();
    assert_eq!(
        loops * 2,
        cases.len(),
        "loops and healthy runs in equal measure"
    );
    let mut seen: BTreeMap<&str, (bool, bool)> = BTreeMap::new();
    for (path, v) in &cases {
        let name = path.file_stem().unwrap().to_str().unwrap();
        let family = FAMILIES
            .iter()
            .filter(|(f, ..)| name.starts_with(&format!("{f}-")))
            .max_by_key(|(f, ..)| f.len())
            .unwrap_or_else(|| panic!("{name}: no known family"))
            .0;
        let e = seen.entry(family).or_default();
        if v["expect"]["loop"] == true {
            e.0 = true;
        } else {
            e.1 = true;
        }
    }
    for (family, loop_cases, healthy) in FAMILIES {
        assert_eq!(
            seen.get(family).copied(),
            Some((*loop_cases, *healthy)),
            "family `{family}`: (loops, healthy runs) present"
        );
    }
}

/// The gate: `loopctl test tests/corpus` passes every case with the default policy.
#[test]
fn every_corpus_case_passes_with_the_default_policy() {
    let out = command()
        .args(["test", "--json"])
        .arg(corpus())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let records: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let failed: Vec<String> = records
        .iter()
        .filter(|r| r.get("outcome").is_some_and(|o| o != "pass"))
        .map(|r| {
            format!(
                "{}: {} (expected {}, first intervention {})",
                r["file"], r["outcome"], r["expect"], r["first"]
            )
        })
        .collect();
    assert!(failed.is_empty(), "failing cases:\n{}", failed.join("\n"));
    let totals = &records.last().unwrap()["totals"];
    assert_eq!(totals["cases"], cases().len());
    assert_eq!(totals["hard_false_alarms"], 0);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The same cases through `simulate --json`: the first intervention lands where each case
/// says (or nowhere), counted by calls or by assistant turns.
#[test]
fn simulate_agrees_with_every_corpus_label() {
    let mut wrong = Vec::new();
    for (path, case) in cases() {
        let out = command()
            .args(["simulate", "--json"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            matches!(out.status.code(), Some(0 | 3)),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let first = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|r| r.get("action").is_some());
        let expect = &case["expect"];
        let unit = if expect["unit"] == "assistant_turn" {
            "turn"
        } else {
            "call"
        };
        let ok = match (&first, expect["loop"].as_bool().unwrap()) {
            (None, false) => true,
            (Some(_), false) | (None, true) => false,
            (Some(f), true) => {
                let at = f[unit].as_u64().unwrap_or(0);
                at >= expect["earliest"].as_u64().unwrap()
                    && expect["latest"].as_u64().is_none_or(|l| at <= l)
            }
        };
        if !ok {
            wrong.push(format!(
                "{}: expected {expect}, got {first:?}",
                path.display()
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The `similarity` and `results` plugins, switched on over the default policy, raise no false
/// alarm on the corpus and miss nothing it catches.
#[test]
fn the_heavier_plugins_add_no_false_alarm_over_the_default_policy() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("with-plugins.yaml");
    std::fs::write(
        &policy,
        format!(
            "version: 1\nname: with-plugins\nextends: {}\nplugins:\n  - path: {}\n  - path: {}\n",
            root().join("rules/default.yaml").display(),
            plugin_path("loopguard-plugin-similarity").display(),
            plugin_path("loopguard-plugin-results").display(),
        ),
    )
    .unwrap();
    let out = command()
        .args(["test", "--rules"])
        .arg(&policy)
        .arg(corpus())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
