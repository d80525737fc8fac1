#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! Per-tool control through the real `loopctl`: a policy that `extends` the shipped default
//! switches a tool off, exempts another from chosen detectors and moves a third into another
//! category; `validate --tool` explains the result and `simulate` shows it.

use std::path::{Path, PathBuf};

use loopguard_tests::{loopctl_clean as command, root};
use serde_json::{Value, json};

/// A child of `rules/default.yaml` (named by absolute path, as an operator's own policy
/// directory would) with a `tools` section.
fn child_policy(dir: &Path) -> PathBuf {
    let path = dir.join("child.yaml");
    let parent = root().join("rules/default.yaml");
    std::fs::write(
        &path,
        format!(
            "version: 1\nname: child\nextends: {}\ntools:\n  gdb_next: {{ enabled: false }}\n  job_status: {{ exempt: [exact_repeat, no_progress, fuzzy_repeat] }}\n  grep: {{ category: shell }}\n",
            parent.display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn validate_explains_where_each_tool_lands() {
    let dir = tempfile::tempdir().unwrap();
    let policy = child_policy(dir.path());
    let out = command()
        .arg("validate")
        .arg(&policy)
        .args([
            "--tool",
            "grep",
            "--tool",
            "gdb_next",
            "--tool",
            "job_status",
        ])
        .args(["--tool", "Read", "--tool", "frobnicate"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |tool: &str| {
        text.lines()
            .find(|l| l.contains(&format!("tool `{tool}`:")))
            .unwrap_or_else(|| panic!("no line for {tool}: {text}"))
            .to_owned()
    };
    // The child's assignment wins over the parent's pattern, and says so.
    assert!(
        line("grep").contains(
            "category `shell` (named by `tools.grep.category`, over pattern `grep` of category `exploration`)"
        ),
        "{text}"
    );
    assert!(
        line("gdb_next").contains("ignored (`tools.gdb_next.enabled: false`)"),
        "{text}"
    );
    assert!(
        line("job_status").contains("exempt from exact_repeat, no_progress, fuzzy_repeat"),
        "{text}"
    );
    // Tool names compare without case in the default policy.
    assert!(
        line("Read").contains("category `exploration` (matches pattern `read`)"),
        "{text}"
    );
    assert!(
        line("frobnicate").contains("the `default` category"),
        "{text}"
    );

    let json = command()
        .arg("validate")
        .arg(&policy)
        .args(["--error-format", "json", "--tool", "grep"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&json.stdout).unwrap();
    let grep = &report["tools"][0];
    assert_eq!(grep["tool"], "grep");
    assert_eq!(grep["category"], "shell");
    assert_eq!(grep["reason"], "tools");
    assert_eq!(grep["watched"], true);
}

/// One transcript, replayed under the default policy and the child.
#[test]
fn simulate_follows_the_tools_section() {
    let dir = tempfile::tempdir().unwrap();
    let policy = child_policy(dir.path());
    let mut lines = Vec::new();
    // One session per tool, so a session stopped for one tool does not hide the others.
    let mut call = |tool: &str, args: Value, output: &str| {
        let id = format!("c{}", lines.len());
        lines.push(
            json!({"type": "call", "session": tool, "id": id, "tool": tool, "arguments": args})
                .to_string(),
        );
        lines.push(
            json!({"type": "result", "session": tool, "id": id, "output": output}).to_string(),
        );
    };
    for _ in 0..6 {
        call("gdb_next", json!({}), "main.c:12: x = step(x);");
    }
    for _ in 0..6 {
        call("job_status", json!({"id": 7}), "running");
    }
    for _ in 0..3 {
        call(
            "grep",
            json!({"pattern": "TODO", "path": "src"}),
            "src/a.rs:3: TODO",
        );
    }
    let transcript = dir.path().join("run.jsonl");
    std::fs::write(&transcript, lines.join("\n") + "\n").unwrap();
    let run = |rules: Option<&Path>| -> Vec<Value> {
        let mut cmd = command();
        cmd.args(["simulate", "--json"]);
        if let Some(r) = rules {
            cmd.arg("--rules").arg(r);
        }
        let out = cmd.arg(&transcript).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|v: &Value| v.get("action").is_some())
            .collect()
    };
    let tools = |found: &[Value]| -> Vec<String> {
        let mut t: Vec<String> = found
            .iter()
            .map(|v| v["tool"].as_str().unwrap_or("").to_owned())
            .collect();
        t.dedup();
        t
    };
    let default = run(None);
    assert!(
        tools(&default).contains(&"gdb_next".to_owned()),
        "{default:?}"
    );
    let grep = default.iter().find(|v| v["tool"] == "grep").unwrap();
    assert!(
        grep["rule"]
            .as_str()
            .unwrap()
            .starts_with("categories.exploration/"),
        "{grep}"
    );
    assert!(
        tools(&default).contains(&"job_status".to_owned()),
        "{default:?}"
    );
    let child = run(Some(&policy));
    let flagged = tools(&child);
    assert!(!flagged.contains(&"gdb_next".to_owned()), "{child:?}");
    assert!(!flagged.contains(&"job_status".to_owned()), "{child:?}");
    // grep now counts as a shell command: the 3rd identical run is flagged when it is made,
    // under the shell category's rules.
    let grep = child
        .iter()
        .find(|v| v["tool"] == "grep")
        .unwrap_or_else(|| panic!("{child:?}"));
    assert_eq!(grep["call"], 15, "{grep}");
    assert!(
        grep["rule"]
            .as_str()
            .unwrap()
            .starts_with("categories.shell/"),
        "{grep}"
    );
}
