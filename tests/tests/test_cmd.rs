#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! `loopctl test`, run as the real binary on small case files generated in a temp directory:
//! outcomes, sidecars, directories, tags, `--json`, gates, exit codes, bad input, the schema.
//!
//! The cases run under a policy written here (only `exact_repeat`, threshold 3; warn from the
//! 1st detection, block from the 3rd), so five identical calls give: warn at call 3, warn at
//! call 4, block at call 5.

use std::path::PathBuf;

use loopguard_tests::{LOOPGUARD_ENV, loopctl, root};
use serde_json::{Value, json};

const POLICY: &str = r#"version: 1
name: cases
description: identical calls only; warn from the 3rd, refuse from the 5th
window:
  size: 20
escalation:
  ladder: steps
ladders:
  steps:
    - repeat: 1
      action: warn
      message: "{tool} repeated {count} times"
    - repeat: 3
      action: block
      message: "Refused: {tool} repeated {count} times"
detectors:
  exact_repeat: { threshold: 3 }
  fuzzy_repeat: { enabled: false }
  cycle: { enabled: false }
  interleaved: { enabled: false }
  no_progress: { enabled: false }
  same_outcome: { enabled: false }
  error_cascade: { enabled: false }
  test_fix: { enabled: false }
  monologue: { enabled: false }
  text_repeat: { enabled: false }
  chanting: { enabled: false }
  unknown_tool: { enabled: false }
"#;

/// A temp directory holding the policy and the cases of one test.
struct Cases {
    dir: tempfile::TempDir,
}

impl Cases {
    fn new() -> Cases {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("policy.yaml"), POLICY).unwrap();
        Cases { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A case file: the `bash` commands as one call per assistant message (each answered by
    /// the same output), with an embedded expect block and tags.
    fn case(&self, name: &str, commands: &[&str], expect: Value, tags: &[&str]) -> PathBuf {
        let doc = json!({
            "id": name.trim_end_matches(".json"),
            "description": "generated",
            "messages": messages(commands),
            "expect": expect,
            "tags": tags,
        });
        self.write(name, &serde_json::to_string_pretty(&doc).unwrap())
    }

    /// `loopctl test --rules policy.yaml ARGS…`, without the caller's LOOPGUARD_* variables.
    fn run(&self, args: &[&str]) -> Run {
        let mut cmd = loopctl();
        for var in LOOPGUARD_ENV {
            cmd.env_remove(var);
        }
        let out = cmd
            .arg("test")
            .arg("--rules")
            .arg(self.path("policy.yaml"))
            .args(args)
            .output()
            .unwrap();
        Run {
            code: out.status.code(),
            stdout: String::from_utf8(out.stdout).unwrap(),
            stderr: String::from_utf8(out.stderr).unwrap(),
        }
    }

    fn dir(&self) -> &str {
        self.dir.path().to_str().unwrap()
    }
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The `--json` records: the cases, then the totals.
    fn records(&self) -> (Vec<Value>, Value) {
        let mut all: Vec<Value> = self
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
            .collect();
        let totals = all.pop().expect("a totals record");
        assert!(totals["totals"].is_object(), "{totals}");
        (all, totals)
    }

    /// The human line of the case whose file name is `name`.
    fn line(&self, name: &str) -> &str {
        self.stdout
            .lines()
            .find(|l| l.contains(&format!("/{name} ")))
            .unwrap_or_else(|| panic!("no line for {name}:\n{}", self.stdout))
    }
}

/// OpenAI chat messages: a user message, then one `bash` call per command, each answered.
fn messages(commands: &[&str]) -> Vec<Value> {
    let mut out = vec![json!({"role": "user", "content": "go"})];
    for (i, command) in commands.iter().enumerate() {
        let id = format!("call_{}", i + 1);
        out.push(
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": id, "type": "function",
                "function": {"name": "bash", "arguments": json!({"command": command}).to_string()}
            }]}),
        );
        out.push(json!({"role": "tool", "tool_call_id": id, "content": "same output"}));
    }
    out
}

fn looped(earliest: u64, latest: Option<u64>) -> Value {
    json!({"loop": true, "unit": "call", "earliest": earliest, "latest": latest, "kinds": ["exact_repeat"]})
}

fn no_loop() -> Value {
    json!({"loop": false, "unit": "call", "earliest": null, "latest": null})
}

const FIVE: &[&str] = &["ls", "ls", "ls", "ls", "ls"];
const THREE: &[&str] = &["ls", "ls", "ls"];
const DISTINCT: &[&str] = &["ls a", "ls b", "ls c", "ls d", "ls e"];

/// One case of every outcome.
fn every_outcome(cases: &Cases) {
    cases.case("pass.json", FIVE, looped(3, Some(4)), &[]);
    cases.case("early.json", FIVE, looped(4, Some(5)), &[]);
    cases.case("late.json", FIVE, looped(1, Some(2)), &[]);
    cases.case("missed.json", DISTINCT, looped(3, None), &[]);
    cases.case("quiet.json", DISTINCT, no_loop(), &[]);
    cases.case("false-alarm.json", THREE, no_loop(), &[]);
    cases.case("hard.json", FIVE, no_loop(), &[]);
}

#[test]
fn every_outcome_is_judged_from_the_first_intervention() {
    let cases = Cases::new();
    every_outcome(&cases);
    let run = cases.run(&["--json", cases.dir()]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    let (records, totals) = run.records();
    let outcome = |name: &str| {
        records
            .iter()
            .find(|r| r["file"].as_str().unwrap().ends_with(name))
            .unwrap_or_else(|| panic!("no record for {name}"))["outcome"]
            .clone()
    };
    assert_eq!(outcome("/pass.json"), "pass");
    assert_eq!(outcome("/early.json"), "early");
    assert_eq!(outcome("/late.json"), "late");
    assert_eq!(outcome("/missed.json"), "missed");
    assert_eq!(outcome("/quiet.json"), "pass");
    assert_eq!(outcome("/false-alarm.json"), "false_alarm");
    assert_eq!(outcome("/hard.json"), "hard_false_alarm");
    let t = &totals["totals"];
    assert_eq!(t["cases"], 7);
    assert_eq!(t["passed"], 2);
    assert_eq!(t["failed"], 5);
    assert_eq!(
        (t["loops"].clone(), t["caught"].clone()),
        (json!(4), json!(1))
    );
    assert_eq!(t["recall"], 0.25);
    assert_eq!(
        (t["early"].clone(), t["late"].clone(), t["missed"].clone()),
        (json!(1), json!(1), json!(1))
    );
    assert_eq!(t["non_loops"], 3);
    assert_eq!(t["false_alarms"], 2, "hard ones count as false alarms too");
    assert_eq!(t["hard_false_alarms"], 1);

    let human = cases.run(&[cases.dir()]);
    assert_eq!(human.code, Some(3));
    for (name, label) in [
        ("pass.json", "PASS "),
        ("early.json", "EARLY "),
        ("late.json", "LATE "),
        ("missed.json", "MISSED "),
        ("quiet.json", "PASS "),
        ("false-alarm.json", "FALSE ALARM "),
        ("hard.json", "HARD FALSE ALARM "),
    ] {
        assert!(human.line(name).starts_with(label), "{}", human.line(name));
    }
    assert!(
        human
            .line("pass.json")
            .contains("expected call 3–4, got call 3 warn exact_repeat (ladders.steps[0])"),
        "{}",
        human.line("pass.json")
    );
    assert!(
        human
            .line("missed.json")
            .contains("expected call ≥ 3, got nothing")
    );
    assert!(
        human
            .line("quiet.json")
            .contains("expected no loop, got nothing")
    );
    assert!(
        human.stdout.contains("7 cases: 2 passed, 5 failed"),
        "{}",
        human.stdout
    );
    assert!(
        human
            .stdout
            .contains("loops caught: 1/4 (25.0% recall); early 1, late 1, missed 1")
    );
    assert!(human.stdout.contains("false alarms: 2/3 non-loops, 1 hard"));
}

#[test]
fn a_hard_false_alarm_is_any_block_not_only_the_first_intervention() {
    let cases = Cases::new();
    let hard = cases.case("hard.json", FIVE, no_loop(), &[]);
    let run = cases.run(&["--json", hard.to_str().unwrap()]);
    let (records, _) = run.records();
    let r = &records[0];
    assert_eq!(r["outcome"], "hard_false_alarm");
    assert_eq!(r["first"]["action"], "warn");
    assert_eq!(r["first"]["call"], 3);
    assert_eq!(r["hard"]["action"], "block");
    assert_eq!(r["hard"]["call"], 5);
    assert_eq!(r["interventions"], 3);
    let human = cases.run(&[hard.to_str().unwrap()]);
    assert!(
        human.line("hard.json").contains(
            "got call 3 warn exact_repeat (ladders.steps[0]); then call 5 block exact_repeat"
        ),
        "{}",
        human.stdout
    );
}

#[test]
fn positions_count_calls_or_assistant_turns() {
    let cases = Cases::new();
    // A text-only assistant message first: call 3 is the 4th assistant message.
    let mut msgs = messages(THREE);
    msgs.insert(
        1,
        json!({"role": "assistant", "content": "Let me look around."}),
    );
    for (name, expect) in [
        (
            "by-turn.json",
            json!({"loop": true, "unit": "assistant_turn", "earliest": 4, "latest": 4}),
        ),
        (
            "by-call.json",
            json!({"loop": true, "unit": "call", "earliest": 4, "latest": 4}),
        ),
    ] {
        let doc = json!({"messages": msgs, "expect": expect});
        cases.write(name, &doc.to_string());
    }
    let run = cases.run(&["--json", cases.dir()]);
    let (records, _) = run.records();
    assert_eq!(
        records[0]["file"].as_str().unwrap(),
        cases.path("by-call.json").to_str().unwrap()
    );
    assert_eq!(records[0]["outcome"], "early");
    assert_eq!(records[0]["at"], 3);
    assert_eq!(records[1]["outcome"], "pass");
    assert_eq!(records[1]["at"], 4);
    assert_eq!(records[1]["first"]["call"], 3);
    assert_eq!(records[1]["first"]["turn"], 4);
    let human = cases.run(&[cases.dir()]);
    assert!(
        human
            .line("by-turn.json")
            .contains("expected turn 4, got turn 4 warn"),
        "{}",
        human.stdout
    );
}

#[test]
fn sidecar_expect_files_serve_event_transcripts_and_message_arrays() {
    let cases = Cases::new();
    let events: String = (1..=4)
        .map(|i| {
            format!(
                "{{\"type\":\"call\",\"id\":\"c{i}\",\"tool\":\"bash\",\"arguments\":{{\"command\":\"make\"}}}}\n{{\"type\":\"result\",\"id\":\"c{i}\",\"output\":\"error\"}}\n"
            )
        })
        .collect();
    cases.write("events.jsonl", &events);
    cases.write(
        "events.expect.json",
        &json!({"expect": looped(3, Some(3)), "tags": ["events"], "description": "make, 4 times"})
            .to_string(),
    );
    cases.write(
        "array.json",
        &serde_json::to_string(&messages(DISTINCT)).unwrap(),
    );
    cases.write(
        "array.expect.json",
        &json!({"expect": no_loop()}).to_string(),
    );
    let run = cases.run(&["--json", cases.dir()]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let (records, totals) = run.records();
    assert_eq!(records.len(), 2, "sidecars are not cases: {records:?}");
    assert_eq!(records[0]["outcome"], "pass");
    assert!(records[0]["file"].as_str().unwrap().ends_with("array.json"));
    assert_eq!(records[1]["outcome"], "pass");
    assert_eq!(records[1]["tags"], json!(["events"]));
    assert_eq!(records[1]["first"]["kind"], "call");
    assert_eq!(totals["totals"]["cases"], 2);

    // Naming a sidecar (as a shell glob does) runs its transcript, once.
    let run = cases.run(&[
        "--json",
        cases.path("events.expect.json").to_str().unwrap(),
        cases.path("events.jsonl").to_str().unwrap(),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.records().0.len(), 1);
}

#[test]
fn a_directory_runs_its_json_files_sorted_without_recursing() {
    let cases = Cases::new();
    cases.case("b.json", DISTINCT, no_loop(), &[]);
    cases.case("a.json", FIVE, looped(3, None), &[]);
    cases.write("README.md", "not a case");
    cases.write("notes.txt", "not a case");
    cases.case("nested/c.json", FIVE, no_loop(), &[]);
    let run = cases.run(&["--json", cases.dir()]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let (records, _) = run.records();
    let names: Vec<&str> = records
        .iter()
        .map(|r| r["file"].as_str().unwrap().rsplit('/').next().unwrap())
        .collect();
    assert_eq!(names, ["a.json", "b.json"]);
    // Named directly, the nested directory runs too, and paths run in the order given.
    let run = cases.run(&[
        "--json",
        cases.path("nested").to_str().unwrap(),
        cases.dir(),
    ]);
    let (records, _) = run.records();
    assert_eq!(records.len(), 3);
    assert!(
        records[0]["file"]
            .as_str()
            .unwrap()
            .ends_with("nested/c.json")
    );
}

#[test]
fn exclude_tag_leaves_cases_out_and_says_how_many() {
    let cases = Cases::new();
    cases.case("kept.json", FIVE, looped(3, Some(4)), &["core"]);
    cases.case("disputed.json", FIVE, no_loop(), &["disputed", "core"]);
    cases.case("boundary.json", THREE, no_loop(), &["threshold_boundary"]);
    let all = cases.run(&[cases.dir()]);
    assert_eq!(all.code, Some(3));
    let run = cases.run(&[
        "--exclude-tag",
        "disputed",
        "--exclude-tag",
        "threshold_boundary",
        cases.dir(),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stdout);
    assert!(!run.stdout.contains("disputed.json"), "{}", run.stdout);
    assert!(
        run.stdout.contains(
            "1 case: 1 passed, 0 failed; 2 left out by --exclude-tag disputed, threshold_boundary"
        ),
        "{}",
        run.stdout
    );
    let json = cases.run(&["--json", "--exclude-tag", "disputed", cases.dir()]);
    let (records, totals) = json.records();
    assert_eq!(records.len(), 2);
    assert_eq!(totals["totals"]["excluded"], 1);
    assert_eq!(totals["totals"]["cases"], 2);
}

#[test]
fn json_prints_one_record_per_case_then_the_totals() {
    let cases = Cases::new();
    cases.case("pass.json", FIVE, looped(3, Some(4)), &["t1"]);
    let run = cases.run(&["--json", "--min-recall", "0.5", cases.dir()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout.lines().count(), 2);
    let (records, totals) = run.records();
    let r = &records[0];
    for key in [
        "file",
        "id",
        "tags",
        "outcome",
        "expect",
        "at",
        "first",
        "hard",
        "interventions",
    ] {
        assert!(r.get(key).is_some(), "missing `{key}` in {r}");
    }
    assert_eq!(r["id"], "pass");
    assert_eq!(
        r["expect"],
        json!({"loop": true, "unit": "call", "earliest": 3, "latest": 4})
    );
    assert_eq!(r["at"], 3);
    assert_eq!(r["hard"], Value::Null);
    // `first` is the intervention as `simulate --json` prints it, without the file.
    let first = &r["first"];
    for key in [
        "session",
        "call",
        "turn",
        "event",
        "line",
        "kind",
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
    assert!(first.get("file").is_none());
    assert_eq!(first["loop_start"], json!({"call": 1}));
    for key in [
        "cases",
        "passed",
        "failed",
        "excluded",
        "errors",
        "loops",
        "caught",
        "recall",
        "early",
        "late",
        "missed",
        "non_loops",
        "false_alarms",
        "hard_false_alarms",
    ] {
        assert!(
            totals["totals"].get(key).is_some(),
            "missing totals.{key} in {totals}"
        );
    }
    assert_eq!(
        totals["gates"],
        json!([
            {"gate": "min_recall", "limit": 0.5, "value": 1.0, "met": true},
            {"gate": "max_hard_false_alarms", "limit": 0, "value": 0, "met": true}
        ])
    );
    assert_eq!(totals["exit"], 0);
}

#[test]
fn the_first_intervention_is_the_one_simulate_reports_under_the_same_settings() {
    let cases = Cases::new();
    for example in [
        "looping-openai.json",
        "looping-events.jsonl",
        "anthropic-loop.json",
    ] {
        let text = std::fs::read_to_string(root().join("examples").join(example)).unwrap();
        let copy = cases.write(example, &text);
        let stem = example.split('.').next().unwrap();
        cases.write(
            &format!("{stem}.expect.json"),
            &json!({"expect": looped(1, None)}).to_string(),
        );
        for vars in [
            &[][..],
            &[("LOOPGUARD_MODE", "break")][..],
            &[("LOOPGUARD_MAX_REPEATS", "2")][..],
        ] {
            let run = |args: &[&str]| {
                let mut cmd = loopctl();
                for var in LOOPGUARD_ENV {
                    cmd.env_remove(var);
                }
                cmd.envs(vars.iter().copied());
                cmd.args(args).arg(&copy).output().unwrap()
            };
            let simulated = run(&["simulate", "--json"]);
            let first_line = String::from_utf8(simulated.stdout).unwrap();
            let mut expected: Value =
                serde_json::from_str(first_line.lines().next().expect("simulate intervenes"))
                    .unwrap();
            expected.as_object_mut().unwrap().remove("file");
            let tested = run(&["test", "--json"]);
            let stdout = String::from_utf8(tested.stdout).unwrap();
            let record: Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
            assert_eq!(record["first"], expected, "{example} with {vars:?}");
        }
    }
    // The policy comes from LOOPGUARD_RULES when --rules is not given, as in simulate.
    let case = cases.case("five.json", FIVE, looped(3, Some(3)), &[]);
    let mut cmd = loopctl();
    for var in LOOPGUARD_ENV {
        cmd.env_remove(var);
    }
    let out = cmd
        .env("LOOPGUARD_RULES", cases.path("policy.yaml"))
        .args(["test", "--json"])
        .arg(&case)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("\"rule\":\"ladders.steps[0]\""), "{stdout}");
    let off = Cases::new();
    let case = off.case("five.json", FIVE, looped(3, Some(3)), &[]);
    let mut cmd = loopctl();
    let out = cmd
        .env("LOOPGUARD_ENABLED", "false")
        .args(["test"])
        .arg(&case)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stdout).contains("MISSED "));
}

#[test]
fn gates_decide_the_exit_code() {
    let cases = Cases::new();
    every_outcome(&cases);
    let dir = cases.dir();
    // Recall 1/4, 2 false alarms (1 hard).
    let code = |args: &[&str]| {
        let mut all = args.to_vec();
        all.push(dir);
        cases.run(&all).code
    };
    assert_eq!(code(&[]), Some(3), "no gate: every case must pass");
    assert_eq!(
        code(&["--min-recall", "0.25", "--max-hard-false-alarms", "1"]),
        Some(0)
    );
    assert_eq!(
        code(&["--min-recall", "25%", "--max-hard-false-alarms", "1"]),
        Some(0)
    );
    assert_eq!(
        code(&["--min-recall", "0.3", "--max-hard-false-alarms", "1"]),
        Some(3)
    );
    assert_eq!(
        code(&["--min-recall", "30%", "--max-hard-false-alarms", "1"]),
        Some(3)
    );
    assert_eq!(
        code(&["--max-false-alarms", "2", "--max-hard-false-alarms", "1"]),
        Some(0)
    );
    assert_eq!(
        code(&["--max-false-alarms", "1", "--max-hard-false-alarms", "1"]),
        Some(3)
    );
    // With a gate, hard false alarms are gated at 0 unless raised.
    assert_eq!(code(&["--min-recall", "0"]), Some(3));
    assert_eq!(code(&["--max-hard-false-alarms", "1"]), Some(0));
    assert_eq!(code(&["--max-hard-false-alarms", "0"]), Some(3));
    let run = cases.run(&["--min-recall", "0.3", "--max-false-alarms", "5", dir]);
    assert!(
        run.stdout
            .contains("FAILED --min-recall 25.0% (limit 30.0%)"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("ok     --max-false-alarms 2 (limit 5)"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("FAILED --max-hard-false-alarms 1 (limit 0)"),
        "{}",
        run.stdout
    );
    // No gate and every case passing: 0.
    let good = Cases::new();
    good.case("pass.json", FIVE, looped(3, Some(4)), &[]);
    good.case("quiet.json", DISTINCT, no_loop(), &[]);
    assert_eq!(good.run(&[good.dir()]).code, Some(0));
}

#[test]
fn min_recall_takes_a_fraction_or_a_percentage_and_refuses_a_bare_90() {
    let cases = Cases::new();
    cases.case("pass.json", FIVE, looped(3, Some(4)), &[]);
    let run = cases.run(&["--min-recall", "90", cases.dir()]);
    assert_eq!(run.code, Some(2), "a usage error");
    assert!(run.stderr.contains("write `90%`"), "{}", run.stderr);
    assert_eq!(
        cases.run(&["--min-recall", "150%", cases.dir()]).code,
        Some(2)
    );
    assert_eq!(
        cases.run(&["--min-recall", "100%", cases.dir()]).code,
        Some(0)
    );
}

#[test]
fn bad_cases_name_their_file_and_the_other_cases_still_run() {
    let cases = Cases::new();
    cases.case("good.json", FIVE, looped(3, Some(4)), &[]);
    cases.case(
        "bad-expect.json",
        FIVE,
        json!({"loop": true, "unit": "call", "earliest": "3"}),
        &[],
    );
    cases.case(
        "no-range.json",
        FIVE,
        json!({"loop": false, "earliest": 3}),
        &[],
    );
    cases.write(
        "no-expect.json",
        &json!({"messages": messages(FIVE)}).to_string(),
    );
    cases.write("broken.json", "{\"messages\": [\n{\"role\": \"user\", \"content\": \"hi\"},\n]\n, \"expect\": {\"loop\": false}}");
    cases.write("events-only.jsonl", "{\"type\":\"call\",\"tool\":\"ls\"}\n");
    cases.case("both.json", FIVE, no_loop(), &[]);
    cases.write(
        "both.expect.json",
        &json!({"expect": no_loop()}).to_string(),
    );
    cases.write("typo.jsonl", "{\"type\":\"call\",\"tool\":\"ls\"}\n");
    cases.write(
        "typo.expect.json",
        &json!({"expect": no_loop(), "tag": ["x"]}).to_string(),
    );
    cases.write(
        "bad-tags.json",
        &json!({"messages": messages(FIVE), "expect": no_loop(), "tags": "x"}).to_string(),
    );
    cases.write(
        "orphan.expect.json",
        &json!({"expect": no_loop()}).to_string(),
    );
    let run = cases.run(&[cases.dir()]);
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(run.line("good.json").starts_with("PASS "), "{}", run.stdout);
    let err = |needle: &str, file: &str| {
        let line = run
            .stderr
            .lines()
            .find(|l| l.contains(&format!("/{file}:")))
            .unwrap_or_else(|| panic!("no error for {file}:\n{}", run.stderr));
        assert!(line.starts_with("error: "), "{line}");
        assert!(line.contains(needle), "{line}");
    };
    err(
        "`expect.earliest` must be a positive integer or null",
        "bad-expect.json",
    );
    err("`loop: false` takes no position", "no-range.json");
    err("no `expect` block", "no-expect.json");
    err("no-expect.expect.json", "no-expect.json");
    err("invalid JSON", "broken.json");
    err("no `expect` block", "events-only.jsonl");
    err("has an `expect` block and a sidecar", "both.json");
    err("unknown key `tag` in a sidecar", "typo.expect.json");
    err("`tags` must be an array of strings", "bad-tags.json");
    err(
        "a sidecar expect file without its transcript",
        "orphan.expect.json",
    );
    assert!(
        run.stdout
            .contains("1 case: 1 passed, 0 failed; 9 files are bad input or unreadable"),
        "{}",
        run.stdout
    );

    // In JSON, each bad file is a record too.
    let run = cases.run(&["--json", cases.dir()]);
    assert_eq!(run.code, Some(1));
    let (records, totals) = run.records();
    let errors: Vec<&Value> = records.iter().filter(|r| r["outcome"] == "error").collect();
    assert_eq!(errors.len(), 9, "{records:?}");
    assert!(
        errors
            .iter()
            .all(|r| r["error"].is_string() && r["exit"] == 1)
    );
    assert_eq!(totals["totals"]["errors"], 9);
    assert_eq!(totals["exit"], 1);
}

#[test]
fn an_unreadable_path_cannot_run_and_the_rest_still_runs() {
    let cases = Cases::new();
    cases.case("good.json", FIVE, looped(3, Some(4)), &[]);
    let missing = cases.path("no/such/dir");
    let run = cases.run(&[missing.to_str().unwrap(), cases.dir()]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("no/such/dir"), "{}", run.stderr);
    assert!(run.line("good.json").starts_with("PASS "));
    // A bad case and an unreadable path: "could not run" wins.
    cases.write(
        "no-expect.json",
        &json!({"messages": messages(FIVE)}).to_string(),
    );
    assert_eq!(
        cases.run(&[missing.to_str().unwrap(), cases.dir()]).code,
        Some(2)
    );
    // Nothing to run at all is bad input.
    let empty = tempfile::tempdir().unwrap();
    let run = cases.run(&[empty.path().to_str().unwrap()]);
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("no test cases"), "{}", run.stderr);
}

#[test]
fn a_bad_policy_is_invalid_and_a_missing_one_cannot_run() {
    let cases = Cases::new();
    let case = cases.case("good.json", FIVE, looped(3, Some(4)), &[]);
    let out = loopctl()
        .args([
            "test",
            "--rules",
            "tests/fixtures/policies/unknown-key.yaml",
        ])
        .arg(&case)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown-key.yaml"));
    let out = loopctl()
        .args(["test", "--rules", "no/such/policy.yaml"])
        .arg(&case)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_case_schema_accepts_cases_and_sidecars_and_rejects_mistakes() {
    let out = loopctl().args(["schema", "--test-case"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let schema: Value = serde_json::from_slice(&out.stdout).unwrap();
    let validator = jsonschema::draft7::new(&schema).expect("a valid draft-07 schema");
    let msgs = messages(THREE);
    let valid = [
        json!({"id": "x", "source": "a:b", "description": "d", "messages": msgs, "expect": looped(3, Some(4)), "tags": ["disputed"]}),
        json!({"messages": msgs, "expect": looped(3, None), "model": "gpt-4o"}),
        json!({"messages": msgs, "expect": no_loop()}),
        json!({"messages": msgs, "expect": {"loop": true, "unit": "assistant_turn", "earliest": 2, "latest": 2}}),
        json!({"expect": looped(3, Some(3)), "tags": ["events"], "description": "a sidecar"}),
        json!({"expect": {"loop": false}}),
    ];
    for v in &valid {
        assert!(validator.is_valid(v), "rejected: {v}");
    }
    let invalid = [
        json!({"messages": msgs}),
        json!({"messages": msgs, "expect": {"unit": "call", "earliest": 3}}),
        json!({"messages": msgs, "expect": {"loop": true, "unit": "call"}}),
        json!({"messages": msgs, "expect": {"loop": true, "unit": "step", "earliest": 3}}),
        json!({"messages": msgs, "expect": {"loop": true, "unit": "call", "earliest": 0}}),
        json!({"messages": msgs, "expect": {"loop": false, "earliest": 3}}),
        json!({"messages": msgs, "expect": no_loop(), "tags": "x"}),
        json!({"expect": no_loop(), "tag": ["x"]}),
    ];
    for v in &invalid {
        assert!(!validator.is_valid(v), "accepted: {v}");
    }
    // What the schema accepts, `loopctl test` accepts: the generated cases of these tests.
    let cases = Cases::new();
    every_outcome(&cases);
    for entry in std::fs::read_dir(cases.dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            assert!(validator.is_valid(&v), "{}", path.display());
        }
    }
    assert_eq!(
        cases
            .run(&[
                "--max-hard-false-alarms",
                "9",
                "--max-false-alarms",
                "9",
                cases.dir()
            ])
            .code,
        Some(0)
    );
}
